//! What the HTTP providers share: the client, status and `Retry-After` handling, and
//! turning transport failures into `LlmError`s.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::Value;

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
    } else if e.is_decode() || e.is_body() {
        LlmError::new(LlmErrorKind::Protocol, format!("response body could not be read: {e}"))
    } else {
        LlmError::new(LlmErrorKind::Connection, format!("connection failed: {e}"))
    }
}

/// Send `body` and return the JSON answer, or the error the status and body describe.
pub async fn post_json(req: reqwest::RequestBuilder, body: &Value) -> Result<(u16, Value), LlmError> {
    let resp = req.json(body).send().await.map_err(transport_error)?;
    let status = resp.status().as_u16();
    let ra = retry_after(resp.headers());
    let bytes = resp.bytes().await.map_err(transport_error)?;
    if !(200..300).contains(&status) {
        let msg = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .or_else(|| v.pointer("/message"))
                    .or_else(|| v.get("error").filter(|e| e.is_string()))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes[..bytes.len().min(500)]).into_owned());
        let mut e = LlmError::from_status(status, msg, ra);
        // An "overloaded" answer in any status is the provider telling us to come back.
        if e.message.to_ascii_lowercase().contains("overloaded") && status >= 500 {
            e.kind = LlmErrorKind::Overloaded;
        }
        return Err(e);
    }
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
        let mut err = LlmError::new(LlmErrorKind::Protocol, format!("malformed JSON from provider: {e}"));
        err.http_status = Some(status);
        err
    })?;
    Ok((status, v))
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
