//! The A2A door as clients of both versions reach it: one card for 0.3 and 1.0 (with caching
//! headers), 0.3's JSON-RPC (no `A2A-Version`) mapped onto the same room operations as 1.0, and
//! 1.0 params as protobuf JSON (proto field names, unknown fields ignored, never echoed). Raw
//! HTTP against the real binary; the 0.3 clients themselves (a2a-sdk 0.3, ADK) are in
//! `a2a_clients.rs`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::a2a::rpc;
use crate::helpers::*;
use crate::mcp::{key, replica};

const V1: (&str, &str) = ("a2a-version", "1.0");

/// `rpc`'s answer as JSON.
async fn rpc_json(base: &str, path: &str, key: Option<&str>, headers: &[(&str, &str)], body: &str) -> Value {
    rpc(base, path, key, headers, body).await.json().await.unwrap()
}

fn call(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
}

fn msg03(id: &str, text: &str) -> Value {
    json!({"kind": "message", "messageId": id, "role": "user", "parts": [{"kind": "text", "text": text}]})
}

/// The JSON `data:` lines of an SSE body.
fn events(body: &str) -> Vec<Value> {
    body.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| serde_json::from_str(d.trim()).unwrap()).collect()
}

#[tokio::test]
async fn one_card_serves_both_versions_and_caches() {
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let c = reqwest::Client::new();
    let url = format!("{}/.well-known/agent-card.json", r.base);
    let get = |etag: Option<String>| {
        let mut q = c.get(&url).header("host", "agents.example.com").header("x-forwarded-proto", "https");
        if let Some(e) = etag {
            q = q.header("if-none-match", e);
        }
        q.send()
    };
    let first = get(None).await.unwrap();
    assert_eq!(first.status(), 200);
    let etag = first.headers()["etag"].to_str().unwrap().to_string();
    assert!(etag.starts_with('"') && etag.len() > 10, "{etag}");
    assert_eq!(first.headers()["cache-control"], "public, max-age=300");
    assert!(first.headers()["vary"].to_str().unwrap().contains("Host"));
    let card: Value = first.json().await.unwrap();
    // 1.0's interfaces and 0.3's fields side by side.
    assert_eq!(card["supportedInterfaces"][0]["protocolVersion"], "1.0");
    assert_eq!(card["url"], "https://agents.example.com/a2a");
    assert_eq!(card["preferredTransport"], "JSONRPC");
    assert_eq!(card["protocolVersion"], "0.3.0");
    assert_eq!(
        card["additionalInterfaces"],
        json!([{"url": "https://agents.example.com/a2a", "transport": "JSONRPC"},
               {"url": "https://agents.example.com/a2a", "transport": "HTTP+JSON"}])
    );
    assert_eq!(card["securitySchemes"]["bearer"]["type"], "http");
    assert_eq!(card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"], "Bearer");
    assert_eq!(card["security"], json!([{"bearer": []}]));
    // The same card again: 304, no body; a changed one (another host) is not.
    let again = get(Some(etag.clone())).await.unwrap();
    assert_eq!(again.status(), 304);
    assert_eq!(again.headers()["etag"].to_str().unwrap(), etag);
    assert!(again.headers().contains_key("last-modified"));
    assert!(again.bytes().await.unwrap().is_empty());
    let list = get(Some(format!("\"other\", W/{etag}"))).await.unwrap();
    assert_eq!(list.status(), 304, "a list naming it, weak or not");
    let elsewhere =
        c.get(&url).header("host", "other.example.com").header("if-none-match", &etag).send().await.unwrap();
    assert_eq!(elsewhere.status(), 200);
    // A Last-Modified, the same for the same bytes; If-Modified-Since at it is 304, before it 200,
    // and an If-None-Match that does not match wins over an If-Modified-Since that would.
    let modified = get(None).await.unwrap().headers()["last-modified"].to_str().unwrap().to_string();
    let at = chrono::DateTime::parse_from_rfc2822(&modified).expect("an HTTP date");
    assert!(modified.ends_with(" GMT") && at <= chrono::Utc::now(), "{modified}");
    assert_eq!(get(None).await.unwrap().headers()["last-modified"].to_str().unwrap(), modified);
    let since = |d: String, tag: Option<&str>| {
        let mut q = c.get(&url).header("host", "agents.example.com").header("x-forwarded-proto", "https");
        q = q.header("if-modified-since", d);
        if let Some(t) = tag {
            q = q.header("if-none-match", t);
        }
        q.send()
    };
    assert_eq!(since(modified.clone(), None).await.unwrap().status(), 304);
    let before = (at - chrono::Duration::seconds(1)).format("%a, %d %b %Y %H:%M:%S GMT").to_string();
    assert_eq!(since(before, None).await.unwrap().status(), 200);
    assert_eq!(since(modified, Some("\"other\"")).await.unwrap().status(), 200);
    let agent = c.get(format!("{}/a2a/agents/explore/.well-known/agent-card.json", r.base)).send().await.unwrap();
    assert_eq!(agent.status(), 200);
    assert!(agent.headers().contains_key("etag"));
}

#[tokio::test]
async fn proto_field_names_are_read_and_unknown_fields_are_never_stored_or_echoed() {
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    // A message with proto names and fields no A2A object has.
    let sent = call(
        "SendMessage",
        json!({"message": {"message_id": "p1", "role": "ROLE_USER", "context_id": "ctx-p", "bogus": {"x": 1},
                           "parts": [{"text": "hi [mock:reply=read]", "weird": true}],
                           "metadata": {"max_turns": 3}},
               "configuration": {"history_length": 10, "return_immediately": false, "frob": 1}}),
    );
    let v: Value = rpc_json(&r.base, "/a2a", Some(&a), &[V1], &sent).await;
    let task = &v["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{v}");
    assert_eq!(task["contextId"], "ctx-p");
    let id = task["id"].as_str().unwrap().to_string();
    let first = &task["history"][0];
    assert_eq!(first["messageId"], "p1");
    assert!(first.get("bogus").is_none() && first["parts"][0].get("weird").is_none(), "{first}");
    // Stored without them: ListTasks and GetTask show none.
    let listed: Value =
        rpc_json(&r.base, "/a2a", Some(&a), &[V1], &call("ListTasks", json!({"page_size": 10, "history_length": 5})))
            .await;
    let shown = listed["result"]["tasks"][0]["history"][0].to_string();
    assert!(!shown.contains("bogus") && !shown.contains("weird"), "{shown}");
    let stored: String = sqlx::query_scalar("SELECT messages::text FROM a2a_tasks").fetch_one(&db.pool).await.unwrap();
    assert!(!stored.contains("bogus") && !stored.contains("weird"), "{stored}");
    // CreateTaskPushNotificationConfig by its proto names (the TCK sends task_id).
    let push =
        call("CreateTaskPushNotificationConfig", json!({"task_id": id, "id": "c1", "url": "http://127.0.0.1:9/h"}));
    let v: Value = rpc_json(&r.base, "/a2a", Some(&a), &[V1], &push).await;
    assert_eq!(v["result"]["taskId"], id.as_str(), "{v}");
    let got = call("GetTaskPushNotificationConfig", json!({"task_id": id, "id": "c1"}));
    let v: Value = rpc_json(&r.base, "/a2a", Some(&a), &[V1], &got).await;
    assert_eq!(v["result"]["url"], "http://127.0.0.1:9/h", "{v}");
    // The card's JSON-RPC URL with a trailing slash, as HTTP clients join it, is the same door.
    let slash: Value = rpc_json(&r.base, "/a2a/", Some(&a), &[V1], &call("GetTask", json!({"id": id}))).await;
    assert_eq!(slash["result"]["id"], id.as_str(), "{slash}");
    // A body that is not JSON: ContentTypeNotSupported (415 over HTTP+JSON).
    let typed = reqwest::Client::new()
        .post(format!("{}/a2a", r.base))
        .bearer_auth(&a)
        .header("a2a-version", "1.0")
        .header("content-type", "text/plain")
        .body(call("GetTask", json!({"id": id})))
        .send()
        .await
        .unwrap();
    assert_eq!(typed.json::<Value>().await.unwrap()["error"]["code"], -32005);
    let typed = reqwest::Client::new()
        .post(format!("{}/a2a/v1/message:send", r.base))
        .bearer_auth(&a)
        .header("a2a-version", "1.0")
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(typed.status(), 415);
    // Task options in metadata keep their names, and an unknown one is still refused.
    let bad = call(
        "SendMessage",
        json!({"message": {"messageId": "p2", "role": "ROLE_USER", "parts": [{"text": "x"}],
                                                     "metadata": {"max_turnz": 3}}}),
    );
    let v: Value = rpc_json(&r.base, "/a2a", Some(&a), &[V1], &bad).await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
}

#[tokio::test]
async fn a_03_request_is_served_in_03_for_the_same_tasks_under_the_same_rules() {
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    // message/send, blocking: the task, kind-tagged, lowercase state, parts with their kind.
    let v: Value = rpc(
        &r.base,
        "/a2a",
        Some(&a),
        &[],
        &call("message/send", json!({"message": msg03("o1", "hi [mock:reply=from 0.3]")})),
    )
    .await
    .json()
    .await
    .unwrap();
    let t = &v["result"];
    assert_eq!((t["kind"].as_str(), t["status"]["state"].as_str()), (Some("task"), Some("completed")), "{v}");
    assert_eq!(t["artifacts"][0]["parts"][0], json!({"kind": "text", "text": "from 0.3"}));
    assert_eq!(t["history"][0]["kind"], "message");
    assert_eq!(t["history"][0]["role"], "user");
    assert_eq!(t["status"]["message"]["role"], "agent");
    let done = t["id"].as_str().unwrap().to_string();
    // The same task through 1.0.
    let v1: Value = rpc_json(&r.base, "/a2a", Some(&a), &[V1], &call("GetTask", json!({"id": done}))).await;
    assert_eq!(v1["result"]["status"]["state"], "TASK_STATE_COMPLETED");
    // Not blocking: at once; tasks/get follows it; tasks/cancel cancels it.
    let slow = json!({"message": msg03("o2", "slow [mock:delay_ms=30000]"), "configuration": {"blocking": false}});
    let v: Value = rpc_json(&r.base, "/a2a", Some(&a), &[], &call("message/send", slow)).await;
    let id = v["result"]["id"].as_str().unwrap().to_string();
    assert!(["submitted", "working"].contains(&v["result"]["status"]["state"].as_str().unwrap()), "{v}");
    let got: Value =
        rpc_json(&r.base, "/a2a", Some(&a), &[], &call("tasks/get", json!({"id": id, "historyLength": 1}))).await;
    assert_eq!(got["result"]["kind"], "task");
    let cancelled: Value = rpc_json(&r.base, "/a2a", Some(&a), &[], &call("tasks/cancel", json!({"id": id}))).await;
    assert_eq!(cancelled["result"]["status"]["state"], "canceled", "{cancelled}");
    // Errors: 0.3's shape, in an HTTP 200; none makes a task.
    let count = || sqlx::query_scalar::<_, i64>("SELECT count(*) FROM tasks").fetch_one(&db.pool);
    let tasks_before = count().await.unwrap();
    for (body, code) in [
        (call("tasks/cancel", json!({"id": done})), -32002),
        (call("tasks/get", json!({"id": "nosuch"})), -32001),
        (call("tasks/list", json!({})), -32601),
        ("{not json".to_string(), -32700),
        (
            call(
                "message/send",
                json!({"message": {"kind": "message", "messageId": "o3", "role": "user",
            "parts": [{"kind": "file", "file": {"bytes": "iVBORw0KGgo=", "mimeType": "image/png"}}]}}),
            ),
            -32005,
        ),
        // A part of no 0.3 kind, or of none at all, is invalid even where it carries a `text`.
        (
            call(
                "message/send",
                json!({"message": {"kind": "message", "messageId": "o3b", "role": "user",
            "parts": [{"type": "unsupported_type", "text": "This should be rejected"}]}}),
            ),
            -32602,
        ),
        (
            call(
                "message/send",
                json!({"message": {"kind": "message", "messageId": "o3c", "role": "user",
            "parts": [{"kind": "image", "text": "x"}]}}),
            ),
            -32602,
        ),
    ] {
        let resp = rpc(&r.base, "/a2a", Some(&a), &[], &body).await;
        assert_eq!(resp.status(), 200, "{body}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{body}: {v}");
        assert!(!v["error"]["data"].is_array(), "0.3 errors carry no ErrorInfo list: {v}");
    }
    assert_eq!(count().await.unwrap(), tasks_before, "a refused send made a task");
    // The rules hold: from inside a sub-agent, refused; no key, 401.
    let deep = rpc(
        &r.base,
        "/a2a",
        Some(&a),
        &[("subagent-depth", "1")],
        &call("message/send", json!({"message": msg03("o4", "x")})),
    )
    .await;
    assert_eq!(deep.json::<Value>().await.unwrap()["error"]["code"], -32004);
    let anon = rpc(&r.base, "/a2a", None, &[], &call("message/send", json!({"message": msg03("o5", "x")}))).await;
    assert_eq!(anon.status(), 401);
    // message/stream: the task, then status updates, the last one final.
    let resp = rpc(
        &r.base,
        "/a2a",
        Some(&a),
        &[],
        &call("message/stream", json!({"message": msg03("o6", "go [mock:tool_turns=1] [mock:reply=streamed]")})),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let evs = events(&resp.text().await.unwrap());
    let kinds: Vec<&str> = evs.iter().map(|e| e["result"]["kind"].as_str().unwrap_or("?")).collect();
    assert_eq!(kinds.first(), Some(&"task"), "{kinds:?}");
    let last = &evs.last().unwrap()["result"];
    assert_eq!(
        (last["kind"].as_str(), last["final"].as_bool(), last["status"]["state"].as_str()),
        (Some("status-update"), Some(true), Some("completed")),
        "{evs:?}"
    );
    assert!(evs.iter().any(|e| e["result"]["kind"] == "artifact-update"), "{kinds:?}");
    assert_eq!(evs.iter().filter(|e| e["result"]["final"] == true).count(), 1);
    // Push configs, nested as 0.3 nests them; one set without an id is the task's `default` one.
    let set = call(
        "tasks/pushNotificationConfig/set",
        json!({"taskId": done,
        "pushNotificationConfig": {"url": "http://127.0.0.1:9/h", "authentication": {"schemes": ["Bearer"], "credentials": "k"}}}),
    );
    let v: Value = rpc_json(&r.base, "/a2a", Some(&a), &[], &set).await;
    assert_eq!(
        v["result"],
        json!({"taskId": done, "pushNotificationConfig": {"id": "default", "url": "http://127.0.0.1:9/h",
        "authentication": {"schemes": ["Bearer"]}}}),
        "{v}"
    );
    let got: Value =
        rpc_json(&r.base, "/a2a", Some(&a), &[], &call("tasks/pushNotificationConfig/get", json!({"id": done}))).await;
    assert_eq!(got["result"]["pushNotificationConfig"]["url"], "http://127.0.0.1:9/h", "{got}");
    let list: Value =
        rpc_json(&r.base, "/a2a", Some(&a), &[], &call("tasks/pushNotificationConfig/list", json!({"id": done}))).await;
    assert_eq!(list["result"].as_array().unwrap().len(), 1, "{list}");
    let del = call("tasks/pushNotificationConfig/delete", json!({"id": done, "pushNotificationConfigId": "default"}));
    let v: Value = rpc_json(&r.base, "/a2a", Some(&a), &[], &del).await;
    assert_eq!(v["result"], Value::Null, "{v}");
    assert!(v.get("error").is_none());
    let card: Value =
        rpc_json(&r.base, "/a2a", Some(&a), &[], &call("agent/getAuthenticatedExtendedCard", json!({}))).await;
    assert_eq!(card["result"]["protocolVersion"], "0.3.0", "{card}");
    // A push config given with message/send is the task's `default` one too.
    let with_push = json!({"message": msg03("o7", "p [mock:reply=x]"),
                           "configuration": {"pushNotificationConfig": {"url": "http://127.0.0.1:9/h"}}});
    let v: Value = rpc_json(&r.base, "/a2a", Some(&a), &[], &call("message/send", with_push)).await;
    let pushed = v["result"]["id"].as_str().unwrap().to_string();
    let got: Value =
        rpc_json(&r.base, "/a2a", Some(&a), &[], &call("tasks/pushNotificationConfig/get", json!({"id": pushed})))
            .await;
    assert_eq!(got["result"]["pushNotificationConfig"]["id"], "default", "{got}");
    // Resubscribing to an ended task: its last state on the stream; to an unknown one, the error
    // on the stream.
    let resp = rpc(&r.base, "/a2a", Some(&a), &[], &call("tasks/resubscribe", json!({"id": done}))).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let evs = events(&resp.text().await.unwrap());
    assert_eq!(evs.len(), 2, "{evs:?}");
    assert_eq!((evs[0]["result"]["kind"].as_str(), evs[1]["result"]["final"].as_bool()), (Some("task"), Some(true)));
    let resp = rpc(&r.base, "/a2a", Some(&a), &[], &call("tasks/resubscribe", json!({"id": "nosuch"}))).await;
    assert_eq!((resp.status().as_u16(), resp.headers()["content-type"].to_str().unwrap()), (200, "text/event-stream"));
    let evs = events(&resp.text().await.unwrap());
    assert_eq!(evs[0]["error"]["code"], -32001, "{evs:?}");
    // An invalid request that names its id is answered with it.
    let v: Value =
        rpc_json(&r.base, "/a2a", Some(&a), &[], r#"{"jsonrpc":"1.0","id":"x-1","method":"tasks/get"}"#).await;
    assert_eq!((v["error"]["code"].as_i64(), v["id"].as_str()), (Some(-32600), Some("x-1")), "{v}");
    // One messageId, one task, whichever version retries it.
    let again: Value = rpc(
        &r.base,
        "/a2a",
        Some(&a),
        &[],
        &call("message/send", json!({"message": msg03("o1", "hi [mock:reply=from 0.3]")})),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(again["result"]["id"], done.as_str());
    tokio::time::sleep(Duration::from_millis(10)).await;
}

#[tokio::test]
async fn a_03_request_over_http_json_reads_and_answers_the_03_protobuf_shapes() {
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let c = reqwest::Client::new();
    let post = |path: &str, body: Value| c.post(format!("{}/a2a/v1/{path}", r.base)).bearer_auth(&a).json(&body).send();
    // message:send, 0.3's protobuf JSON (proto field names too): `content`, a file by URI, a data part.
    let sent: Value = post(
        "message:send",
        json!({"message": {"message_id": "r1", "role": "ROLE_USER", "content": [
            {"text": "hi [mock:reply=over rest]"}, {"data": {"data": {"k": 1}}}]}}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let t = &sent["task"];
    assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    assert_eq!(t["artifacts"][0]["parts"][0]["text"], "over rest");
    assert_eq!(t["history"][0]["content"][1], json!({"data": {"data": {"k": 1}}}), "{t}");
    assert!(t["history"][0].get("parts").is_none());
    let id = t["id"].as_str().unwrap().to_string();
    // Not blocking, then cancelled: CANCELLED as 0.3's protobuf spells it.
    let slow: Value = post(
        "message:send",
        json!({"message": {"messageId": "r2", "role": "ROLE_USER", "content": [{"text": "slow [mock:delay_ms=30000]"}]},
               "configuration": {"blocking": false}}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let slow_id = slow["task"]["id"].as_str().unwrap().to_string();
    let cancelled: Value = c
        .post(format!("{}/a2a/v1/tasks/{slow_id}:cancel", r.base))
        .bearer_auth(&a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(cancelled["status"]["state"], "TASK_STATE_CANCELLED", "{cancelled}");
    let got: Value = c
        .get(format!("{}/a2a/v1/tasks/{id}?history_length=1", r.base))
        .bearer_auth(&a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["id"], id.as_str(), "{got}");
    // A push config, named as 0.3 names it.
    let made: Value = post(
        &format!("tasks/{id}/pushNotificationConfigs"),
        json!({"parent": format!("tasks/{id}"), "configId": "c1",
               "config": {"pushNotificationConfig": {"url": "http://127.0.0.1:9/h"}}}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(made["name"], format!("tasks/{id}/pushNotificationConfigs/c1"), "{made}");
    // An empty `authentication` (protobuf's JSON of an unset message) is the same as none.
    let empty = post(
        &format!("tasks/{id}/pushNotificationConfigs"),
        json!({"parent": format!("tasks/{id}"), "configId": "c2",
               "config": {"pushNotificationConfig": {"url": "http://127.0.0.1:9/h", "authentication": {}}}}),
    )
    .await
    .unwrap();
    assert_eq!(empty.status(), 200, "an empty authentication is none");
    let listed: Value = c
        .get(format!("{}/a2a/v1/tasks/{id}/pushNotificationConfigs", r.base))
        .bearer_auth(&a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["configs"][0]["pushNotificationConfig"]["url"], "http://127.0.0.1:9/h", "{listed}");
    // A stream: the protobuf's StreamResponse, the last status update final.
    let resp = post(
        "message:stream",
        json!({"message": {"messageId": "r3", "role": "ROLE_USER", "content": [{"text": "go [mock:reply=streamed]"}]}}),
    )
    .await
    .unwrap();
    let evs = events(&resp.text().await.unwrap());
    assert!(evs[0].get("task").is_some(), "{evs:?}");
    let last = evs.last().unwrap();
    assert_eq!(last["statusUpdate"]["final"], true, "{evs:?}");
    assert_eq!(last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED");
    // 0.3 has no task list; errors are google.rpc.Status bodies as for 1.0.
    let list = c.get(format!("{}/a2a/v1/tasks", r.base)).bearer_auth(&a).send().await.unwrap();
    assert_eq!(list.status(), 404);
    let missing = c.get(format!("{}/a2a/v1/tasks/nosuch", r.base)).bearer_auth(&a).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.json::<Value>().await.unwrap()["error"]["details"][0]["reason"], "TASK_NOT_FOUND");
}
