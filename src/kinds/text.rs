//! Text the store can always hold. PostgreSQL's `text`, `json` and `jsonb` refuse a NUL
//! character (`\u0000`): a string that reaches a checkpoint, an event or a summary with one in
//! it would fail its statement. Everything that comes from outside the service on its way into
//! a run — a tool's result (a command's output, a file, a page, an HTTP or MCP tool's answer, a
//! caller's output), the model's own text and arguments — is made storable here first, NUL
//! shown as U+FFFD (`�`), as a byte that is not UTF-8 already is where bytes become text
//! (`String::from_utf8_lossy`).

use serde_json::Value;

/// What stands in for a NUL (and, by `from_utf8_lossy`, for bytes that are not UTF-8).
pub const REPLACEMENT: char = '\u{FFFD}';

/// Replace every NUL in `s` with `REPLACEMENT`; how many there were.
pub fn storable(s: &mut String) -> usize {
    let n = s.bytes().filter(|b| *b == 0).count();
    if n > 0 {
        *s = s.replace('\0', "\u{FFFD}");
    }
    n
}

/// `storable` over every string of `v`, object keys too; how many NULs were replaced.
pub fn storable_value(v: &mut Value) -> usize {
    match v {
        Value::String(s) => storable(s),
        Value::Array(items) => items.iter_mut().map(storable_value).sum(),
        Value::Object(map) => {
            let mut n = 0;
            if map.keys().any(|k| k.contains('\0')) {
                let old = std::mem::take(map);
                for (mut k, v) in old {
                    n += storable(&mut k);
                    map.insert(k, v);
                }
            }
            n + map.values_mut().map(storable_value).sum::<usize>()
        }
        _ => 0,
    }
}

/// Does any string of `v`, or any key, hold a NUL?
pub fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// The note a tool result ends with when it held bytes that are not text: `None` when it held
/// none. `nuls`: the NULs just replaced; a `REPLACEMENT` already there stood for bytes that were
/// not UTF-8 (or was in the text itself: the note then says no more than is true).
pub fn note(content: &str, nuls: usize) -> Option<String> {
    let shown = content.chars().filter(|c| *c == REPLACEMENT).count();
    (nuls > 0 || shown > 0).then(|| {
        format!(
            "[note: this result held bytes that are not text (NUL or invalid UTF-8): each is shown as \
             \u{FFFD} ({shown} in all)]"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_is_replaced_everywhere_and_counted() {
        let mut s = "a\0b\0".to_string();
        assert_eq!(storable(&mut s), 2);
        assert_eq!(s, "a\u{FFFD}b\u{FFFD}");
        let mut clean = "plain".to_string();
        assert_eq!(storable(&mut clean), 0);
        let mut v = serde_json::json!({"k\0": ["x\0", {"y": "\0"}], "n": 1});
        assert!(has_nul(&v));
        assert_eq!(storable_value(&mut v), 3);
        assert!(!has_nul(&v));
        assert_eq!(v, serde_json::json!({"k\u{FFFD}": ["x\u{FFFD}", {"y": "\u{FFFD}"}], "n": 1}));
        assert!(!serde_json::to_string(&v).unwrap().contains("\\u0000"));
    }

    #[test]
    fn the_note_is_there_only_for_bytes_that_are_not_text() {
        assert_eq!(note("all text", 0), None);
        let bad = String::from_utf8_lossy(b"a\xff\xfeb").into_owned();
        assert!(note(&bad, 0).is_some_and(|n| n.contains("(2 in all)")), "{bad}");
        let mut nul = "x\0y".to_string();
        let n = storable(&mut nul);
        assert!(note(&nul, n).is_some_and(|n| n.contains("(1 in all)")));
    }
}
