//! HTTP tools: `POST endpoint` with `{task_id, tool_call_id, name, arguments}`, signed with the
//! tenant's secret. Every failure becomes a tool error the model sees, never a crashed run.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use super::{TaskTools, ToolOutput};
use crate::llm::ToolCall;

/// Largest response body read from a tool, whatever the result cap.
const MAX_READ: usize = 4 * 1024 * 1024;

/// `v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>`.
pub fn signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1={}", hex::encode(mac.finalize().into_bytes()))
}

fn err(msg: String) -> ToolOutput {
    ToolOutput::text(msg, true)
}

pub async fn call(t: &TaskTools, endpoint: &str, timeout: Duration, call: &ToolCall) -> ToolOutput {
    if let Err(e) = t.caller.allow.check_url(endpoint) {
        return err(format!("tool {} cannot be called: {e}", call.name));
    }
    let body = json!({"task_id": t.task_id, "tool_call_id": call.id, "name": call.name, "arguments": call.arguments});
    let body = body.to_string().into_bytes();
    let ts = chrono::Utc::now().timestamp();
    let mut req = t
        .caller
        .client
        .post(endpoint)
        .timeout(timeout)
        .header("content-type", "application/json")
        .header("subagent-depth", "1")
        .header("idempotency-key", format!("{}:{}", t.task_id, call.id))
        .header("subagent-timestamp", ts.to_string());
    if let Some(secret) = &t.tenant_secret {
        req = req.header("subagent-signature", signature(secret, ts, &body));
    }
    if let Some(tp) = &t.traceparent {
        req = req.header("traceparent", tp);
    }
    let mut resp = match req.body(body).send().await {
        Ok(r) => r,
        Err(e) if e.is_timeout() => {
            return err(format!("tool {} timed out after {} ms", call.name, timeout.as_millis()))
        }
        Err(e) => return err(format!("tool {} could not be reached: {}", call.name, root_cause(&e))),
    };
    let status = resp.status();
    let mut buf: Vec<u8> = vec![];
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                buf.extend_from_slice(&c);
                if buf.len() > MAX_READ {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) if e.is_timeout() => {
                return err(format!("tool {} timed out after {} ms", call.name, timeout.as_millis()))
            }
            Err(e) => return err(format!("tool {} response could not be read: {e}", call.name)),
        }
    }
    let text = String::from_utf8_lossy(&buf);
    if !status.is_success() {
        let snippet: String = text.chars().take(300).collect();
        return err(format!("tool {} failed: HTTP {}: {snippet}", call.name, status.as_u16()));
    }
    if buf.len() > MAX_READ {
        return err(format!("tool {} answered more than {MAX_READ} bytes", call.name));
    }
    // Read from the text as decoded (a byte that is not UTF-8 shown as U+FFFD), not from the
    // bytes: a tool that writes one stray Latin-1 byte in a string still gets its answer through.
    let v: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return err(format!("tool {} answered invalid JSON ({e}); expected {{\"content\": ...}}", call.name)),
    };
    if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
        let msg = e.as_str().map(str::to_string).unwrap_or_else(|| e.to_string());
        return err(format!("tool {} reported an error: {msg}", call.name));
    }
    match v.get("content") {
        Some(Value::String(s)) => ToolOutput::text(s.clone(), false),
        Some(other) => ToolOutput::text(other.to_string(), false),
        None => err(format!("tool {} answered without `content` or `error`", call.name)),
    }
}

pub(super) fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    let mut msg = e.to_string();
    while let Some(s) = cur.source() {
        msg = s.to_string();
        cur = s;
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_over_timestamp_dot_body() {
        // Reference value from: printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac secret
        assert_eq!(
            signature("secret", 1_700_000_000, br#"{"a":1}"#),
            "v1=49f24e537407743fa4a0242bb63b94b9a47ee99cbbe071ccd8a22550ae411686"
        );
    }
}
