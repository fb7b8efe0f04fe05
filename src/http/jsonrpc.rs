//! JSON-RPC 2.0 as the MCP and A2A doors use it: one message per POST (no batches: MCP has
//! none since 2025-06-18, A2A never had them), the error codes the spec names, and the messages
//! this server sends.

use serde_json::{json, Map, Value};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;

/// A JSON-RPC error: its code and message, and data if any.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError { code, message: message.into(), data: None }
    }

    pub fn params(message: impl Into<String>) -> Self {
        RpcError::new(INVALID_PARAMS, message)
    }

    pub fn internal() -> Self {
        RpcError::new(INTERNAL_ERROR, "internal error; it has been logged")
    }

    pub fn with(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
}

/// A message a client sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// The client's answer to a request of ours (an elicitation).
    Response {
        id: Value,
        result: Option<Value>,
        error: Option<Value>,
    },
}

/// One JSON-RPC message, or why it is not one.
pub fn parse(body: &[u8]) -> Result<Incoming, RpcError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| RpcError::new(PARSE_ERROR, format!("parse error: {e}")))?;
    let Value::Object(mut m) = v else {
        let what =
            if v.is_array() { "batches are not supported: send one message per request" } else { "not an object" };
        return Err(RpcError::new(INVALID_REQUEST, format!("invalid request: {what}")));
    };
    if m.get("jsonrpc") != Some(&json!("2.0")) {
        return Err(RpcError::new(INVALID_REQUEST, "invalid request: `jsonrpc` must be \"2.0\""));
    }
    let id = m.remove("id");
    if let Some(id) = &id {
        // A whole number written with a fraction (`7.0`) is an integer, as JSON Schema counts it
        // (within i64 and u64; an integer beyond them arrives as a float too, and is refused).
        let whole =
            id.as_f64().is_some_and(|f| f.fract() == 0.0 && (-9.223372036854775e18..1.844674407370955e19).contains(&f));
        if !(id.is_string() || id.is_i64() || id.is_u64() || whole) {
            return Err(RpcError::new(INVALID_REQUEST, "invalid request: `id` must be a string or an integer"));
        }
    }
    let params = match m.remove("params") {
        None => Value::Object(Map::new()),
        Some(p @ Value::Object(_)) => p,
        Some(_) => return Err(RpcError::new(INVALID_REQUEST, "invalid request: `params` must be an object")),
    };
    match (m.remove("method"), id) {
        (Some(Value::String(method)), Some(id)) => Ok(Incoming::Request { id, method, params }),
        (Some(Value::String(method)), None) => Ok(Incoming::Notification { method, params }),
        (Some(_), _) => Err(RpcError::new(INVALID_REQUEST, "invalid request: `method` must be a string")),
        (None, Some(id)) if m.contains_key("result") || m.contains_key("error") => {
            let error = m.remove("error");
            let well_formed =
                |e: &Value| e.get("code").is_some_and(Value::is_i64) && e.get("message").is_some_and(Value::is_string);
            if error.as_ref().is_some_and(|e| !well_formed(e)) {
                return Err(RpcError::new(
                    INVALID_REQUEST,
                    "invalid response: `error` must have an integer `code` and a `message`",
                ));
            }
            Ok(Incoming::Response { id, result: m.remove("result"), error })
        }
        (None, _) => Err(RpcError::new(INVALID_REQUEST, "invalid request: no `method`")),
    }
}

/// The id of a message that is not a valid request, where it can be read (an error then names
/// the request it answers).
pub fn id_of(body: &[u8]) -> Option<Value> {
    let v: Value = serde_json::from_slice(body).ok()?;
    v.get("id").filter(|id| id.is_string() || id.is_i64() || id.is_u64()).cloned()
}

pub fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

pub fn error(id: Option<&Value>, e: &RpcError) -> Value {
    let mut err = json!({"code": e.code, "message": e.message});
    if let Some(d) = &e.data {
        err["data"] = d.clone();
    }
    json!({"jsonrpc": "2.0", "id": id.cloned().unwrap_or(Value::Null), "error": err})
}

pub fn request(id: &str, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

pub fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_notifications_and_responses_are_told_apart_and_bad_envelopes_named() {
        let r = parse(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).unwrap();
        assert_eq!(r, Incoming::Request { id: json!(7), method: "ping".into(), params: json!({}) });
        let n = parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert!(matches!(n, Incoming::Notification { .. }));
        let a = parse(br#"{"jsonrpc":"2.0","id":"e1","result":{"action":"accept"}}"#).unwrap();
        assert!(matches!(a, Incoming::Response { result: Some(_), .. }));
        for (body, code) in [
            (&b"{nope"[..], PARSE_ERROR),
            (br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, INVALID_REQUEST),
            (br#"{"id":1,"method":"ping"}"#, INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#, INVALID_REQUEST),
            (br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":[1]}"#, INVALID_REQUEST),
        ] {
            assert_eq!(parse(body).unwrap_err().code, code, "{}", String::from_utf8_lossy(body));
        }
    }
}
