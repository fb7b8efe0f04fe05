//! What the HTTP providers share: sending a request and reading its answer (streamed or whole)
//! within the first-byte and idle timeouts, status and `Retry-After` handling, and turning
//! transport failures and refusals into `LlmError`s.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::Value;

use super::sse::{SseDecoder, SseEvent};
use super::{LlmError, LlmErrorKind};

/// A provider asking for longer than this is asked again after this long (the retry deadline
/// then decides).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

fn capped_secs(v: f64) -> Option<Duration> {
    (v.is_finite() && v >= 0.0).then(|| Duration::try_from_secs_f64(v).unwrap_or(MAX_RETRY_AFTER).min(MAX_RETRY_AFTER))
}

/// `Retry-After` (seconds or an HTTP date) or `retry-after-ms`.
pub fn retry_after(h: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = h.get("retry-after-ms").and_then(|v| v.to_str().ok()).and_then(|s| s.trim().parse::<f64>().ok()) {
        if let Some(d) = capped_secs(ms / 1000.0) {
            return Some(d);
        }
    }
    let v = h.get("retry-after")?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return capped_secs(secs);
    }
    let when = chrono::DateTime::parse_from_rfc2822(v).ok()?;
    let delta = when.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(delta.to_std().unwrap_or(Duration::ZERO).min(MAX_RETRY_AFTER))
}

pub fn transport_error(e: reqwest::Error) -> LlmError {
    if e.is_timeout() {
        LlmError::new(LlmErrorKind::Timeout, format!("request timed out: {e}"))
    } else if e.is_connect() {
        LlmError::new(LlmErrorKind::Connection, format!("connection failed: {}", root_cause(&e)))
    } else {
        // A reset or a connection closed mid-answer: what a restarting server looks like.
        LlmError::new(LlmErrorKind::Connection, format!("connection lost: {}", root_cause(&e)))
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(s) = cur.source() {
        cur = s;
    }
    cur.to_string()
}

/// How long a call may wait: for the first byte of its answer (the server's prompt processing),
/// and between two chunks of it (a stalled stream). There is no limit on the whole answer: a
/// slow model may generate for minutes; the task's time limit bounds the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub first_byte: Duration,
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { first_byte: Duration::from_secs(120), idle: Duration::from_secs(60) }
    }
}

type ByteStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// An answer's body, chunk by chunk: the first within the first-byte timeout, each next within
/// the idle timeout.
struct Chunks {
    inner: ByteStream,
    by: tokio::time::Instant,
    started: bool,
    t: Timeouts,
}

impl Chunks {
    fn no_first_byte(t: Timeouts) -> LlmError {
        LlmError::new(
            LlmErrorKind::Timeout,
            format!("no answer within {} s (first-byte timeout)", t.first_byte.as_secs()),
        )
    }

    async fn next(&mut self) -> Result<Option<bytes::Bytes>, LlmError> {
        use futures_util::StreamExt;
        match tokio::time::timeout_at(self.by, self.inner.next()).await {
            Err(_) if self.started => Err(LlmError::new(
                LlmErrorKind::Timeout,
                format!("the answer stalled: nothing for {} s (idle timeout)", self.t.idle.as_secs()),
            )),
            Err(_) => Err(Chunks::no_first_byte(self.t)),
            Ok(None) => Ok(None),
            Ok(Some(Err(e))) => Err(transport_error(e)),
            Ok(Some(Ok(b))) => {
                self.started = true;
                self.by = tokio::time::Instant::now() + self.t.idle;
                Ok(Some(b))
            }
        }
    }
}

/// A provider's answer: a whole JSON body, or a stream already fed to the caller — whole
/// (`on_event` said so), or ended by the server without the caller's end marker.
pub enum Answer {
    Json(u16, Value),
    Streamed { status: u16, whole: bool },
}

/// The provider said the prompt does not fit its context window.
fn says_context_exceeded(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "context length",
        "context_length",
        "context size",
        "context window",
        "maximum context",
        "prompt is too long",
        "exceed context limit",
        "exceeds the available context",
        "too many tokens",
    ]
    .iter()
    .any(|p| m.contains(p))
}

/// The error a non-2xx answer describes.
fn status_error(status: u16, bytes: &[u8], ra: Option<Duration>, max_tokens: Option<u32>) -> LlmError {
    let msg = serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.pointer("/message"))
                .or_else(|| v.get("error").filter(|e| e.is_string()))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes[..bytes.len().min(500)]).into_owned());
    if matches!(status, 400 | 413 | 422) && says_context_exceeded(&msg) {
        let mt = max_tokens.map_or("unset".to_string(), |n| n.to_string());
        let mut e = LlmError::new(
            LlmErrorKind::ContextExceeded,
            format!(
                "the prompt plus max_tokens ({mt}) do not fit the model's context window: lower \
                 `max_output_tokens` for this model (config or agent definition), shorten the task, or give \
                 the server a larger context (the server said: {msg})"
            ),
        );
        e.http_status = Some(status);
        return e;
    }
    let mut e = LlmError::from_status(status, msg, ra);
    // An "overloaded" answer in any status is the provider telling us to come back.
    if e.message.to_ascii_lowercase().contains("overloaded") && status >= 500 {
        e.kind = LlmErrorKind::Overloaded;
    }
    e
}

/// Send `body` and read the answer within `t`. A streamed answer (`text/event-stream`) is fed
/// to `on_event` as it arrives, until it returns true (the answer is complete); any other
/// answer is read whole (a server may ignore `stream`). Dropping the future drops the
/// connection: a cancel stops the call at once.
pub async fn exchange(
    req: reqwest::RequestBuilder,
    body: &(impl serde::Serialize + Sync + ?Sized),
    t: Timeouts,
    max_tokens: Option<u32>,
    on_event: &mut (dyn FnMut(SseEvent) -> Result<bool, LlmError> + Send),
) -> Result<Answer, LlmError> {
    let first_by = tokio::time::Instant::now() + t.first_byte;
    let resp = tokio::time::timeout_at(first_by, req.json(body).send())
        .await
        .map_err(|_| Chunks::no_first_byte(t))?
        .map_err(transport_error)?;
    let status = resp.status().as_u16();
    let ra = retry_after(resp.headers());
    let streamed = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/event-stream"));
    let mut chunks = Chunks { inner: Box::pin(resp.bytes_stream()), by: first_by, started: false, t };
    if !(200..300).contains(&status) || !streamed {
        let mut bytes: Vec<u8> = vec![];
        while let Some(b) = chunks.next().await? {
            bytes.extend_from_slice(&b);
        }
        if !(200..300).contains(&status) {
            return Err(status_error(status, &bytes, ra, max_tokens));
        }
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
            let mut err = LlmError::new(LlmErrorKind::Protocol, format!("malformed JSON from provider: {e}"));
            err.http_status = Some(status);
            err
        })?;
        return Ok(Answer::Json(status, v));
    }
    let mut decoder = SseDecoder::default();
    while let Some(b) = chunks.next().await? {
        for e in decoder.push(&b) {
            if on_event(e)? {
                return Ok(Answer::Streamed { status, whole: true });
            }
        }
    }
    let whole = match decoder.finish() {
        Some(e) => on_event(e)?,
        None => false,
    };
    Ok(Answer::Streamed { status, whole })
}

/// A stream that ended before the answer did: the connection was lost.
pub fn cut_stream() -> LlmError {
    LlmError::new(LlmErrorKind::Connection, "the stream ended before the answer was complete")
}

pub fn protocol(status: u16, what: impl Into<String>) -> LlmError {
    let mut e = LlmError::new(LlmErrorKind::Protocol, what);
    e.http_status = Some(status);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_overflow_is_named_as_such_with_the_max_tokens_sent() {
        let body = br#"{"error": {"message": "This model's maximum context length is 512 tokens. However, you requested 4298 tokens", "code": "context_length_exceeded"}}"#;
        let e = status_error(400, body, None, Some(4096));
        assert_eq!((e.kind, e.code().as_str()), (LlmErrorKind::ContextExceeded, "context_exceeded"));
        assert!(e.message.contains("max_tokens (4096)") && e.message.contains("maximum context length is 512"), "{e}");
        let llama = br#"{"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error"}}"#;
        assert_eq!(status_error(400, llama, None, Some(64)).kind, LlmErrorKind::ContextExceeded);
        let other = br#"{"error": {"message": "Invalid model"}}"#;
        assert_eq!(status_error(400, other, None, None).kind, LlmErrorKind::Client);
    }

    #[test]
    fn retry_after_reads_seconds_milliseconds_and_dates() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(150)));
        let mut h = HeaderMap::new();
        h.insert("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
        h.insert("retry-after", "soon".parse().unwrap());
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", "1e20".parse().unwrap());
        assert_eq!(retry_after(&h), Some(MAX_RETRY_AFTER), "absurd values are capped, not a panic");
    }
}
