//! A2A 0.3 beside 1.0: a request that names no `A2A-Version` (or `0.3`) is a 0.3 client's. Its
//! method names, params and results are mapped here onto the 1.0 methods the door runs — one
//! mapping into the same room operations, so the same tasks and the same rules — and back:
//! `kind`-tagged objects, lowercase states, parts as `{kind, text | data | file}`, a status
//! update's `final` flag, push configs nested as 0.3 nests them, and JSON-RPC errors as 0.3
//! has them (code, message, data; in an HTTP 200).
//!
//! Read against the official Python SDK's own 0.3 compatibility layer (a2a-sdk 1.x,
//! `a2a/compat/v0_3`) and the 0.3 specification's JSON schema.

use serde_json::{json, Map, Value};

use super::super::jsonrpc::RpcError;
use super::errors::A2aError;

/// The 1.0 method a 0.3 method name stands for.
pub fn method(name: &str) -> Option<&'static str> {
    Some(match name {
        "message/send" => "SendMessage",
        "message/stream" => "SendStreamingMessage",
        "tasks/get" => "GetTask",
        "tasks/cancel" => "CancelTask",
        "tasks/resubscribe" => "SubscribeToTask",
        "tasks/pushNotificationConfig/set" => "CreateTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/get" => "GetTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/list" => "ListTaskPushNotificationConfigs",
        "tasks/pushNotificationConfig/delete" => "DeleteTaskPushNotificationConfig",
        "agent/getAuthenticatedExtendedCard" => "GetExtendedAgentCard",
        _ => return None,
    })
}

fn copy(from: &Map<String, Value>, to: &mut Map<String, Value>, keys: &[&str]) {
    for k in keys {
        if let Some(v) = from.get(*k).filter(|v| !v.is_null()) {
            to.insert((*k).to_string(), v.clone());
        }
    }
}

/// A 0.3 part as 1.0 has it. One whose `kind` is missing or none of 0.3's (text, data, file) is
/// only its `kind` (null where missing), which the door refuses as such: a 0.3 part is read by its
/// kind alone, never by which of 1.0's fields it happens to carry.
fn part_in(p: &Value) -> Value {
    let Some(o) = p.as_object() else { return p.clone() };
    let mut out = Map::new();
    copy(o, &mut out, &["metadata"]);
    match o.get("kind").and_then(Value::as_str) {
        Some("text") => copy(o, &mut out, &["text"]),
        Some("data") => copy(o, &mut out, &["data"]),
        Some("file") => {
            let f = o.get("file").and_then(Value::as_object).cloned().unwrap_or_default();
            if let Some(b) = f.get("bytes") {
                out.insert("raw".into(), b.clone());
            }
            if let Some(u) = f.get("uri") {
                out.insert("url".into(), u.clone());
            }
            if let Some(m) = f.get("mimeType") {
                out.insert("mediaType".into(), m.clone());
            }
            if let Some(n) = f.get("name") {
                out.insert("filename".into(), n.clone());
            }
        }
        _ => return json!({"kind": o.get("kind").cloned().unwrap_or(Value::Null)}),
    }
    Value::Object(out)
}

/// A 0.3 message as 1.0 has it (`role: user` is `ROLE_USER`).
fn message_in(m: &Value) -> Value {
    let Some(o) = m.as_object() else { return m.clone() };
    let mut out = Map::new();
    copy(o, &mut out, &["messageId", "contextId", "taskId", "metadata", "extensions", "referenceTaskIds"]);
    let role = match o.get("role").and_then(Value::as_str) {
        Some("user") => json!("ROLE_USER"),
        Some("agent") => json!("ROLE_AGENT"),
        _ => o.get("role").cloned().unwrap_or(Value::Null),
    };
    out.insert("role".into(), role);
    if let Some(parts) = o.get("parts").and_then(Value::as_array) {
        out.insert("parts".into(), Value::Array(parts.iter().map(part_in).collect()));
    }
    Value::Object(out)
}

/// The id of a push config a 0.3 client sets without one.
const DEFAULT_CONFIG: &str = "default";

/// A 0.3 `PushNotificationConfig` as 1.0's `TaskPushNotificationConfig` of `task`.
fn push_in(c: &Value, task: Option<&Value>) -> Value {
    let Some(o) = c.as_object() else { return c.clone() };
    let mut out = Map::new();
    copy(o, &mut out, &["id", "url", "token"]);
    if let Some(t) = task {
        out.insert("taskId".into(), t.clone());
    }
    // A 0.3 config given without an id (set, or with message/send) is the task's `default` one:
    // the one a get without an id, or with `default`, reads.
    if !out.contains_key("id") {
        out.insert("id".into(), json!(DEFAULT_CONFIG));
    }
    if let Some(a) = o.get("authentication").and_then(Value::as_object) {
        let mut auth = Map::new();
        if let Some(s) = a.get("schemes").and_then(Value::as_array).and_then(|s| s.first()) {
            auth.insert("scheme".into(), s.clone());
        }
        copy(a, &mut auth, &["credentials"]);
        out.insert("authentication".into(), Value::Object(auth));
    }
    Value::Object(out)
}

/// A 0.3 method's params as the 1.0 method's.
pub fn params_in(method: &str, p: Value) -> Value {
    let Some(o) = p.as_object() else { return p };
    let mut out = Map::new();
    match method {
        "SendMessage" | "SendStreamingMessage" => {
            copy(o, &mut out, &["metadata", "tenant"]);
            if let Some(m) = o.get("message") {
                out.insert("message".into(), message_in(m));
            }
            if let Some(c) = o.get("configuration").and_then(Value::as_object) {
                let mut conf = Map::new();
                copy(c, &mut conf, &["acceptedOutputModes", "historyLength"]);
                if c.get("blocking") == Some(&Value::Bool(false)) {
                    conf.insert("returnImmediately".into(), json!(true));
                }
                if let Some(push) = c.get("pushNotificationConfig") {
                    conf.insert("taskPushNotificationConfig".into(), push_in(push, None));
                }
                out.insert("configuration".into(), Value::Object(conf));
            }
        }
        "CreateTaskPushNotificationConfig" => {
            let config = o.get("pushNotificationConfig").cloned().unwrap_or_else(|| json!({}));
            return push_in(&config, Some(o.get("taskId").unwrap_or(&Value::Null)));
        }
        "GetTaskPushNotificationConfig" | "DeleteTaskPushNotificationConfig" => {
            let config = o.get("pushNotificationConfigId").filter(|c| !c.is_null()).cloned();
            out.insert("id".into(), config.unwrap_or_else(|| json!(DEFAULT_CONFIG)));
            out.insert("taskId".into(), o.get("id").cloned().unwrap_or(Value::Null));
        }
        "ListTaskPushNotificationConfigs" => {
            out.insert("taskId".into(), o.get("id").cloned().unwrap_or(Value::Null));
        }
        _ => copy(o, &mut out, &["id", "historyLength", "tenant"]),
    }
    Value::Object(out)
}

/// A 1.0 state's 0.3 name.
fn state_out(s: &str) -> String {
    s.strip_prefix("TASK_STATE_").unwrap_or(s).to_ascii_lowercase().replace('_', "-")
}

fn part_out(p: &Value) -> Value {
    let Some(o) = p.as_object() else { return p.clone() };
    let mut out = Map::new();
    if let Some(t) = o.get("text") {
        out.insert("kind".into(), json!("text"));
        out.insert("text".into(), t.clone());
    } else if let Some(d) = o.get("data") {
        out.insert("kind".into(), json!("data"));
        out.insert("data".into(), d.clone());
    } else {
        let mut file = Map::new();
        if let Some(b) = o.get("raw") {
            file.insert("bytes".into(), b.clone());
        }
        if let Some(u) = o.get("url") {
            file.insert("uri".into(), u.clone());
        }
        if let Some(m) = o.get("mediaType") {
            file.insert("mimeType".into(), m.clone());
        }
        if let Some(n) = o.get("filename") {
            file.insert("name".into(), n.clone());
        }
        out.insert("kind".into(), json!("file"));
        out.insert("file".into(), Value::Object(file));
    }
    copy(o, &mut out, &["metadata"]);
    Value::Object(out)
}

fn parts_out(o: &Map<String, Value>) -> Value {
    Value::Array(o.get("parts").and_then(Value::as_array).map(|p| p.iter().map(part_out).collect()).unwrap_or_default())
}

fn message_out(m: &Value) -> Value {
    let Some(o) = m.as_object() else { return m.clone() };
    let mut out = Map::new();
    out.insert("kind".into(), json!("message"));
    copy(o, &mut out, &["messageId", "contextId", "taskId", "metadata", "extensions", "referenceTaskIds"]);
    let role = if o.get("role").and_then(Value::as_str) == Some("ROLE_AGENT") { "agent" } else { "user" };
    out.insert("role".into(), json!(role));
    out.insert("parts".into(), parts_out(o));
    Value::Object(out)
}

fn artifact_out(a: &Value) -> Value {
    let Some(o) = a.as_object() else { return a.clone() };
    let mut out = Map::new();
    copy(o, &mut out, &["artifactId", "name", "description", "metadata", "extensions"]);
    out.insert("parts".into(), parts_out(o));
    Value::Object(out)
}

fn status_out(s: &Value) -> Value {
    let Some(o) = s.as_object() else { return s.clone() };
    let mut out = Map::new();
    out.insert("state".into(), json!(state_out(o.get("state").and_then(Value::as_str).unwrap_or(""))));
    copy(o, &mut out, &["timestamp"]);
    if let Some(m) = o.get("message") {
        out.insert("message".into(), message_out(m));
    }
    Value::Object(out)
}

fn task_out(t: &Value) -> Value {
    let Some(o) = t.as_object() else { return t.clone() };
    let mut out = Map::new();
    out.insert("kind".into(), json!("task"));
    copy(o, &mut out, &["id", "contextId", "metadata"]);
    if let Some(s) = o.get("status") {
        out.insert("status".into(), status_out(s));
    }
    if let Some(h) = o.get("history").and_then(Value::as_array) {
        out.insert("history".into(), Value::Array(h.iter().map(message_out).collect()));
    }
    if let Some(a) = o.get("artifacts").and_then(Value::as_array) {
        out.insert("artifacts".into(), Value::Array(a.iter().map(artifact_out).collect()));
    }
    Value::Object(out)
}

/// A 1.0 `TaskPushNotificationConfig` as 0.3's (the config nested under its task).
fn push_out(c: &Value) -> Value {
    let Some(o) = c.as_object() else { return c.clone() };
    let mut config = Map::new();
    copy(o, &mut config, &["id", "url", "token"]);
    if let Some(s) = o.get("authentication").and_then(|a| a.get("scheme")) {
        config.insert("authentication".into(), json!({"schemes": [s]}));
    }
    json!({"taskId": o.get("taskId").cloned().unwrap_or(Value::Null), "pushNotificationConfig": config})
}

/// The 0.3 methods answered on a stream: their errors come on it too.
pub fn streams(method: &str) -> bool {
    matches!(method, "message/stream" | "tasks/resubscribe")
}

/// A stream's item (1.0 `StreamResponse`) as 0.3's event: the object itself, `kind`-tagged; a
/// status update that ends the stream is `final`.
pub fn event_out(v: &Value) -> Value {
    if let Some(t) = v.get("task") {
        return task_out(t);
    }
    if let Some(m) = v.get("message") {
        return message_out(m);
    }
    if let Some(u) = v.get("statusUpdate").and_then(Value::as_object) {
        let mut out = Map::new();
        out.insert("kind".into(), json!("status-update"));
        copy(u, &mut out, &["taskId", "contextId", "metadata"]);
        let status = u.get("status").map(status_out).unwrap_or_else(|| json!({}));
        let last = ["completed", "failed", "canceled", "rejected", "input-required", "auth-required"]
            .contains(&status["state"].as_str().unwrap_or(""));
        out.insert("status".into(), status);
        out.insert("final".into(), json!(last));
        return Value::Object(out);
    }
    if let Some(u) = v.get("artifactUpdate").and_then(Value::as_object) {
        let mut out = Map::new();
        out.insert("kind".into(), json!("artifact-update"));
        copy(u, &mut out, &["taskId", "contextId", "append", "lastChunk", "metadata"]);
        if let Some(a) = u.get("artifact") {
            out.insert("artifact".into(), artifact_out(a));
        }
        return Value::Object(out);
    }
    v.clone()
}

/// A 1.0 method's result as the 0.3 method's.
pub fn result_out(method: &str, v: Value) -> Value {
    match method {
        "SendMessage" => event_out(&v),
        "GetTask" | "CancelTask" => task_out(&v),
        "CreateTaskPushNotificationConfig" | "GetTaskPushNotificationConfig" => push_out(&v),
        "ListTaskPushNotificationConfigs" => {
            Value::Array(v["configs"].as_array().map(|c| c.iter().map(push_out).collect()).unwrap_or_default())
        }
        "DeleteTaskPushNotificationConfig" => Value::Null,
        _ => v,
    }
}

/// An error as 0.3 has it: its code, message, and the details as `data` (no ErrorInfo list).
pub fn error(e: &A2aError) -> RpcError {
    let mut r = RpcError::new(e.kind.code(), e.message.clone());
    if e.metadata.as_object().is_some_and(|m| !m.is_empty()) {
        r = r.with(e.metadata.clone());
    }
    r
}

// A2A 0.3 over HTTP+JSON: its bodies are the 0.3 protobuf's JSON (a message's parts are
// `content`, a file part `{file: {fileWithUri | fileWithBytes, mimeType, name}}`, a data part
// `{data: {data}}`, push configs named `tasks/{id}/pushNotificationConfigs/{config}`), read as the
// official SDK's 0.3 layer reads them (`a2a/compat/v0_3/rest_handler.py`).

/// A 0.3 protobuf part as 1.0 has it.
fn rest_part_in(p: &Value) -> Value {
    let Some(o) = p.as_object() else { return p.clone() };
    let mut out = Map::new();
    copy(o, &mut out, &["text", "metadata"]);
    if let Some(f) = o.get("file").and_then(Value::as_object) {
        for (from, to) in
            [("fileWithUri", "url"), ("fileWithBytes", "raw"), ("mimeType", "mediaType"), ("name", "filename")]
        {
            if let Some(v) = f.get(from) {
                out.insert(to.into(), v.clone());
            }
        }
    }
    if let Some(d) = o.get("data") {
        out.insert("data".into(), d.get("data").cloned().unwrap_or(Value::Null));
    }
    Value::Object(out)
}

/// A 0.3 `SendMessageRequest` body as 1.0's params.
pub fn rest_send_in(body: Value) -> Value {
    let Some(o) = body.as_object() else { return body };
    let mut out = Map::new();
    copy(o, &mut out, &["metadata", "tenant"]);
    if let Some(m) = o.get("message").and_then(Value::as_object) {
        let mut msg = Map::new();
        copy(m, &mut msg, &["messageId", "contextId", "taskId", "role", "metadata", "extensions"]);
        let parts = m.get("content").and_then(Value::as_array).map(|c| c.iter().map(rest_part_in).collect());
        msg.insert("parts".into(), parts.map(Value::Array).unwrap_or(Value::Null));
        out.insert("message".into(), Value::Object(msg));
    }
    if let Some(c) = o.get("configuration").and_then(Value::as_object) {
        let mut conf = Map::new();
        copy(c, &mut conf, &["acceptedOutputModes", "historyLength"]);
        // A protobuf bool left out is false: a configuration without `blocking: true` does not
        // block (as the SDK's 0.3 layer reads it); no configuration at all blocks.
        if c.get("blocking") != Some(&Value::Bool(true)) {
            conf.insert("returnImmediately".into(), json!(true));
        }
        if let Some(push) = c.get("pushNotification") {
            conf.insert("taskPushNotificationConfig".into(), push_in(push, None));
        }
        out.insert("configuration".into(), Value::Object(conf));
    }
    Value::Object(out)
}

/// A 0.3 `CreateTaskPushNotificationConfigRequest` body as 1.0's config (its task is the path's).
pub fn rest_push_in(body: Value) -> Value {
    let config = body.pointer("/config/pushNotificationConfig").cloned().unwrap_or_else(|| json!({}));
    let mut c = push_in(&config, None);
    if let Some(id) = body.get("configId").and_then(Value::as_str).filter(|i| !i.is_empty()) {
        c["id"] = json!(id);
    }
    c
}

fn rest_part_out(p: &Value) -> Value {
    let Some(o) = p.as_object() else { return p.clone() };
    let mut out = Map::new();
    if let Some(t) = o.get("text") {
        out.insert("text".into(), t.clone());
    } else if let Some(d) = o.get("data") {
        out.insert("data".into(), json!({"data": d}));
    } else {
        let mut file = Map::new();
        for (from, to) in
            [("url", "fileWithUri"), ("raw", "fileWithBytes"), ("mediaType", "mimeType"), ("filename", "name")]
        {
            if let Some(v) = o.get(from) {
                file.insert(to.into(), v.clone());
            }
        }
        out.insert("file".into(), Value::Object(file));
    }
    copy(o, &mut out, &["metadata"]);
    Value::Object(out)
}

fn rest_parts(o: &Map<String, Value>) -> Value {
    Value::Array(
        o.get("parts").and_then(Value::as_array).map(|p| p.iter().map(rest_part_out).collect()).unwrap_or_default(),
    )
}

fn rest_message_out(m: &Value) -> Value {
    let Some(o) = m.as_object() else { return m.clone() };
    let mut out = Map::new();
    copy(o, &mut out, &["messageId", "contextId", "taskId", "role", "metadata", "extensions"]);
    out.insert("content".into(), rest_parts(o));
    Value::Object(out)
}

fn rest_status_out(s: &Value) -> Value {
    let Some(o) = s.as_object() else { return s.clone() };
    let mut out = Map::new();
    // 0.3's protobuf spells it CANCELLED.
    let state = o.get("state").and_then(Value::as_str).unwrap_or("");
    out.insert("state".into(), json!(if state == "TASK_STATE_CANCELED" { "TASK_STATE_CANCELLED" } else { state }));
    copy(o, &mut out, &["timestamp"]);
    if let Some(m) = o.get("message") {
        out.insert("message".into(), rest_message_out(m));
    }
    Value::Object(out)
}

fn rest_artifact_out(a: &Value) -> Value {
    let Some(o) = a.as_object() else { return a.clone() };
    let mut out = Map::new();
    copy(o, &mut out, &["artifactId", "name", "description", "metadata", "extensions"]);
    out.insert("parts".into(), rest_parts(o));
    Value::Object(out)
}

fn rest_task_out(t: &Value) -> Value {
    let Some(o) = t.as_object() else { return t.clone() };
    let mut out = Map::new();
    copy(o, &mut out, &["id", "contextId", "metadata"]);
    if let Some(s) = o.get("status") {
        out.insert("status".into(), rest_status_out(s));
    }
    for (k, f) in [("history", rest_message_out as fn(&Value) -> Value), ("artifacts", rest_artifact_out)] {
        if let Some(a) = o.get(k).and_then(Value::as_array) {
            out.insert(k.into(), Value::Array(a.iter().map(f).collect()));
        }
    }
    Value::Object(out)
}

fn rest_push_out(c: &Value) -> Value {
    let nested = push_out(c);
    let task = nested["taskId"].as_str().unwrap_or("").to_string();
    let id = nested["pushNotificationConfig"]["id"].as_str().unwrap_or("").to_string();
    json!({"name": format!("tasks/{task}/pushNotificationConfigs/{id}"), "pushNotificationConfig": nested["pushNotificationConfig"]})
}

/// A stream's item as 0.3's protobuf `StreamResponse`.
pub fn rest_event_out(v: &Value) -> Value {
    if let Some(t) = v.get("task") {
        return json!({"task": rest_task_out(t)});
    }
    if let Some(m) = v.get("message") {
        return json!({"message": rest_message_out(m)});
    }
    if let Some(u) = v.get("statusUpdate").and_then(Value::as_object) {
        let mut out = Map::new();
        copy(u, &mut out, &["taskId", "contextId", "metadata"]);
        let status = u.get("status").map(rest_status_out).unwrap_or_else(|| json!({}));
        let last = ["COMPLETED", "FAILED", "CANCELLED", "REJECTED", "INPUT_REQUIRED", "AUTH_REQUIRED"]
            .iter()
            .any(|s| status["state"].as_str() == Some(&format!("TASK_STATE_{s}")));
        out.insert("status".into(), status);
        out.insert("final".into(), json!(last));
        return json!({"statusUpdate": out});
    }
    if let Some(u) = v.get("artifactUpdate").and_then(Value::as_object) {
        let mut out = Map::new();
        copy(u, &mut out, &["taskId", "contextId", "append", "lastChunk", "metadata"]);
        if let Some(a) = u.get("artifact") {
            out.insert("artifact".into(), rest_artifact_out(a));
        }
        return json!({"artifactUpdate": out});
    }
    v.clone()
}

/// A 1.0 method's result as the 0.3 HTTP+JSON binding answers it.
pub fn rest_out(method: &str, v: Value) -> Value {
    match method {
        "SendMessage" => rest_event_out(&v),
        "GetTask" | "CancelTask" => rest_task_out(&v),
        "CreateTaskPushNotificationConfig" | "GetTaskPushNotificationConfig" => rest_push_out(&v),
        "ListTaskPushNotificationConfigs" => json!({
            "configs": v["configs"].as_array().map(|c| c.iter().map(rest_push_out).collect::<Vec<_>>()).unwrap_or_default(),
            "nextPageToken": v["nextPageToken"],
        }),
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_03_message_reads_as_10_and_a_10_task_shows_as_03() {
        let m = json!({"kind": "message", "messageId": "m1", "role": "user", "extra": 1, "parts": [
            {"kind": "text", "text": "hi"}, {"kind": "data", "data": {"a": 1}},
            {"kind": "file", "file": {"bytes": "aGk=", "mimeType": "text/plain", "name": "x.txt"}}]});
        let p = params_in("SendMessage", json!({"message": m, "configuration": {"blocking": false}}));
        assert_eq!(
            p,
            json!({"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}, {"data": {"a": 1}},
                {"raw": "aGk=", "mediaType": "text/plain", "filename": "x.txt"}]},
                "configuration": {"returnImmediately": true}})
        );
        let t = json!({"task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_INPUT_REQUIRED",
            "timestamp": "2026-01-01T00:00:00Z", "message": {"messageId": "a", "role": "ROLE_AGENT", "parts": [{"text": "?"}]}},
            "artifacts": [{"artifactId": "summary", "parts": [{"text": "s", "mediaType": "text/plain"}]}]}});
        let out = result_out("SendMessage", t);
        assert_eq!(out["kind"], "task");
        assert_eq!(out["status"]["state"], "input-required");
        assert_eq!(out["status"]["message"]["role"], "agent");
        assert_eq!(out["status"]["message"]["parts"][0], json!({"kind": "text", "text": "?"}));
        assert_eq!(out["artifacts"][0]["parts"][0], json!({"kind": "text", "text": "s"}));
        let u = event_out(&json!({"statusUpdate": {"taskId": "t", "contextId": "c",
            "status": {"state": "TASK_STATE_CANCELED"}}}));
        assert_eq!(
            (u["kind"].as_str(), u["final"].as_bool(), u["status"]["state"].as_str()),
            (Some("status-update"), Some(true), Some("canceled"))
        );
        let w = event_out(&json!({"statusUpdate": {"status": {"state": "TASK_STATE_WORKING"}}}));
        assert_eq!(w["final"], false);
    }

    #[test]
    fn push_configs_nest_as_03_nests_them() {
        let set = params_in(
            "CreateTaskPushNotificationConfig",
            json!({"taskId": "t", "pushNotificationConfig": {
            "url": "http://h/x", "authentication": {"schemes": ["Bearer"], "credentials": "k"}}}),
        );
        assert_eq!(
            set,
            json!({"taskId": "t", "id": "default", "url": "http://h/x",
                               "authentication": {"scheme": "Bearer", "credentials": "k"}})
        );
        let get = params_in("GetTaskPushNotificationConfig", json!({"id": "t", "pushNotificationConfigId": "c"}));
        assert_eq!(get, json!({"taskId": "t", "id": "c"}));
        let get = params_in("GetTaskPushNotificationConfig", json!({"id": "t"}));
        assert_eq!(get, json!({"taskId": "t", "id": "default"}));
        let shown = result_out(
            "ListTaskPushNotificationConfigs",
            json!({"configs": [
            {"id": "c", "taskId": "t", "url": "http://h/x", "authentication": {"scheme": "Bearer"}}]}),
        );
        assert_eq!(
            shown,
            json!([{"taskId": "t", "pushNotificationConfig": {"id": "c", "url": "http://h/x",
                                  "authentication": {"schemes": ["Bearer"]}}}])
        );
        assert_eq!(method("tasks/resubscribe"), Some("SubscribeToTask"));
        // Over HTTP+JSON, 0.3's protobuf shapes.
        let body = rest_send_in(json!({"message": {"messageId": "m", "role": "ROLE_USER", "content": [
            {"text": "hi"}, {"file": {"fileWithUri": "http://h/a.txt", "mimeType": "text/plain"}}, {"data": {"data": {"a": 1}}}]},
            "configuration": {"blocking": false, "pushNotification": {"url": "http://h/x"}}}));
        assert_eq!(
            body["message"]["parts"],
            json!([{"text": "hi"}, {"url": "http://h/a.txt", "mediaType": "text/plain"}, {"data": {"a": 1}}])
        );
        assert_eq!(
            body["configuration"],
            json!({"returnImmediately": true, "taskPushNotificationConfig": {"id": "default", "url": "http://h/x"}})
        );
        let t = rest_out(
            "GetTask",
            json!({"id": "t", "status": {"state": "TASK_STATE_CANCELED"},
            "artifacts": [{"artifactId": "summary", "parts": [{"text": "s", "mediaType": "text/plain"}]}]}),
        );
        assert_eq!(
            (t["status"]["state"].as_str(), t["artifacts"][0]["parts"][0]["text"].as_str()),
            (Some("TASK_STATE_CANCELLED"), Some("s"))
        );
        let c = rest_out("GetTaskPushNotificationConfig", json!({"id": "c", "taskId": "t", "url": "http://h/x"}));
        assert_eq!(c["name"], "tasks/t/pushNotificationConfigs/c");
        assert_eq!(method("tasks/list"), None);
    }
}
