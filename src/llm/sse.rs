//! A Server-Sent Events decoder for streamed provider answers: bytes in, events out, across
//! chunk boundaries (an event may be split anywhere, a chunk may hold several).

/// One event: its `event:` name (if any) and its `data:` lines joined by newlines.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

#[derive(Debug, Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
}

impl SseDecoder {
    /// Feed a chunk; returns the events it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(chunk);
        let mut out = vec![];
        while let Some((end, sep)) = find_blank_line(&self.buf) {
            let raw: Vec<u8> = self.buf.drain(..end + sep).collect();
            if let Some(e) = parse_event(&String::from_utf8_lossy(&raw[..end])) {
                out.push(e);
            }
        }
        out
    }

    /// The last event, when the stream ends without a blank line after it.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let raw = std::mem::take(&mut self.buf);
        parse_event(&String::from_utf8_lossy(&raw))
    }
}

/// Where the first event ends: the index of its blank line and that separator's length.
fn find_blank_line(b: &[u8]) -> Option<(usize, usize)> {
    (0..b.len()).find_map(|i| {
        if b[i..].starts_with(b"\r\n\r\n") {
            Some((i, 4))
        } else if b[i..].starts_with(b"\n\n") || b[i..].starts_with(b"\r\r") {
            Some((i, 2))
        } else {
            None
        }
    })
}

fn parse_event(text: &str) -> Option<SseEvent> {
    let mut e = SseEvent::default();
    let mut has_data = false;
    for line in text.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() || line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => e.event = Some(value.to_string()),
            "data" => {
                if has_data {
                    e.data.push('\n');
                }
                e.data.push_str(value);
                has_data = true;
            }
            _ => {}
        }
    }
    (has_data || e.event.is_some()).then_some(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_come_out_whole_and_in_order() {
        let mut d = SseDecoder::default();
        assert!(d.push(b"event: message_start\nda").is_empty());
        let got = d.push(b"ta: {\"a\":1}\n\n: a comment\n\ndata: one\ndata: two\r\n\r\ndata: [DONE]");
        assert_eq!(
            got,
            vec![
                SseEvent { event: Some("message_start".into()), data: "{\"a\":1}".into() },
                SseEvent { event: None, data: "one\ntwo".into() },
            ]
        );
        assert_eq!(d.finish(), Some(SseEvent { event: None, data: "[DONE]".into() }));
    }
}
