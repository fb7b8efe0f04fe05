//! The A2A door, driven by the official Python SDK's client (`a2a-sdk==1.3.*`,
//! `tests/sdk/a2a_client.py`) against the real binary, over both bindings; raw HTTP for what no
//! client sends on purpose (another version, a foreign Origin, bad envelopes, a call from
//! inside a sub-agent, a stream over the tenant's limit).
//!
//! The client reaches the service by a host name (`agents.example.com`): every request is sent
//! to the replica's port with that name's `Host` and `Origin`, as through a proxy, so the
//! card's URLs are the name's and the Origin check sees what a deployed client sends.
//!
//! Needs the SDK (`SUBAGENTD_PYTHON`, see `mcp.rs`); without it the SDK-driven tests print a
//! notice and pass, unless `SUBAGENTD_REQUIRE_SDKS=1` (set by `.ci/run`).

use std::time::Duration;

use serde_json::{json, Value};

use crate::fakes::{serve, Answer};
use crate::helpers::*;
use crate::mcp::{admin_put, approvals, deploy_tool, key, python, replica, run_script, scalar, Replica};

const BASE: &str = "http://agents.example.com";

/// Run a scenario of `a2a_client.py` against `r` with `key` over `binding`.
async fn sdk(r: &Replica, scenario: &str, key: &str, binding: &str, more: &[&str]) -> Value {
    let p = python().expect("checked by the caller");
    let mut args: Vec<String> = vec![
        scenario.into(),
        "--base".into(),
        BASE.into(),
        "--connect".into(),
        r.base.trim_start_matches("http://").into(),
        "--key".into(),
        key.into(),
        "--binding".into(),
        binding.into(),
    ];
    args.extend(more.iter().map(|s| s.to_string()));
    run_script(p, "a2a_client.py", args, vec![]).await
}

async fn tasks(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap()
}

#[tokio::test]
async fn the_python_sdk_sends_polls_streams_cancels_and_continues_over_both_bindings() {
    if python().is_none() {
        return;
    }
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let (a, b) = (key(&r.base, "a").await, key(&r.base, "b").await);
    // A custom agent of tenant a's: on the extended card, not on the public one.
    let put = reqwest::Client::new()
        .put(format!("{}/agents/triager", r.base))
        .bearer_auth(&a)
        .json(&json!({"description": "Sorts incoming tickets", "system_prompt": "You triage."}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success());
    for binding in ["JSONRPC", "HTTP+JSON"] {
        let facts = sdk(&r, "blocking", &a, binding, &[]).await;
        assert_eq!(
            facts["interfaces"],
            json!({"JSONRPC": format!("{BASE}/a2a"), "HTTP+JSON": format!("{BASE}/a2a/v1")})
        );
        assert_eq!(facts["skills"], json!(["general", "research", "explore", "plan"]));
        assert_eq!(facts["extended_skills"], json!(["general", "research", "explore", "plan", "triager"]));
        assert_eq!(
            facts["errors"],
            json!({"cancel_completed": "TaskNotCancelableError", "get_unknown": "TaskNotFoundError",
                   "message_to_ended": "UnsupportedOperationError"}),
            "{binding}"
        );
        let id = facts["task_id"].as_str().unwrap();
        // The same run as the REST door shows it: the tenant's, its options from the metadata,
        // in the ledger.
        let (tenant, meta, turns): (String, Value, Value) = sqlx::query_as(
            "SELECT tenant, metadata, coalesce(o.options, t.options) -> 'max_turns'
                 FROM tasks t LEFT JOIN task_options o ON o.hash = t.options_sha256 WHERE id = $1",
        )
        .bind(uuid::Uuid::parse_str(id).unwrap())
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!((tenant.as_str(), &meta, &turns), ("a", &json!({"batch": "a2a"}), &json!(3)));
        let calls: i64 = scalar(&db, "SELECT count(*) FROM llm_calls WHERE task_id = $1", id).await;
        assert_eq!(calls, 1);

        let polled = sdk(&r, "nonblocking", &a, binding, &[]).await;
        assert_eq!(polled["first"], "TASK_STATE_SUBMITTED", "returned at once, before it ran");

        let streamed = sdk(&r, "stream", &a, binding, &[]).await;
        assert_eq!(streamed["subscribe_ended"], "UnsupportedOperationError", "an ended task has no stream");
        let status: String =
            scalar(&db, "SELECT status FROM tasks WHERE id = $1", streamed["task_id"].as_str().unwrap()).await;
        assert_eq!(status, "completed");

        let cancelled = sdk(&r, "cancel", &a, binding, &[]).await;
        let id = cancelled["task_id"].as_str().unwrap();
        let status: String = scalar(&db, "SELECT status FROM tasks WHERE id = $1", id).await;
        assert_eq!(status, "cancelled");
        // The provider call in flight was dropped, and is in the ledger as interrupted.
        let outcome: String = scalar(&db, "SELECT outcome FROM llm_calls WHERE task_id = $1", id).await;
        assert_eq!(outcome, "interrupted");

        let ctx = sdk(&r, "context", &a, binding, &[]).await;
        let parent: Option<uuid::Uuid> =
            scalar(&db, "SELECT parent_task_id FROM tasks WHERE id = $1", ctx["second"].as_str().unwrap()).await;
        assert_eq!(parent.unwrap().to_string(), ctx["first"].as_str().unwrap(), "the context's latest task, resumed");
        let once: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE prompt = 'once [mock:reply=once]'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(once, if binding == "JSONRPC" { 1 } else { 2 }, "a retried message started no second task");

        let before = tasks(&db).await;
        let refused = sdk(&r, "refused", &a, binding, &[]).await;
        assert_eq!(
            refused,
            json!({"image": "ContentTypeNotSupportedError", "unknown_type": "InvalidParamsError",
                   "unknown_option": "InvalidParamsError", "unknown_model": "InvalidParamsError"})
        );
        assert_eq!(tasks(&db).await, before, "bad input started nothing");

        let agent = sdk(&r, "agent", &a, binding, &["--agent", "explore"]).await;
        assert_eq!(agent["subagent_type"], "explore");
        assert_eq!(agent["listed_types"], json!(["explore"]), "the agent's URL lists its own tasks");
        assert_eq!(
            agent["interfaces"],
            json!([format!("{BASE}/a2a/agents/explore"), format!("{BASE}/a2a/agents/explore/v1")])
        );

        // Another tenant: tenant a's task is not found by any method.
        let other =
            sdk(&r, "isolation", &b, binding, &["--key2", &b, "--task-id", facts["task_id"].as_str().unwrap()]).await;
        assert_eq!(
            other["found"],
            json!({"get": "not found", "cancel": "not found", "push": "not found", "answer": "not found"})
        );
    }
}

#[tokio::test]
async fn a_paused_run_is_input_required_and_a_message_answers_it() {
    if python().is_none() {
        return;
    }
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let (calls, endpoint) = deploy_tool().await;
    approvals(&r.base, "a", &a, &endpoint).await;
    let facts = sdk(&r, "pause", &a, "JSONRPC", &[]).await;
    assert_eq!(*calls.lock().unwrap(), 1, "approved: the call ran; denied: it did not");
    let (decision, by): (String, String) =
        sqlx::query_as("SELECT decision, answered_by FROM task_actions WHERE id = $1")
            .bind(uuid::Uuid::parse_str(facts["action_id"].as_str().unwrap()).unwrap())
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(decision, "approve");
    assert!(by.starts_with("key:sk_"), "answered by the key that carried the message: {by}");
    let (decision, message): (String, String) =
        sqlx::query_as("SELECT decision, message FROM task_actions WHERE task_id = $1")
            .bind(uuid::Uuid::parse_str(facts["denied_task_id"].as_str().unwrap()).unwrap())
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((decision.as_str(), message.as_str()), ("deny", "not today"));
    // Over HTTP+JSON too.
    sdk(&r, "pause", &a, "HTTP+JSON", &[]).await;
    assert_eq!(*calls.lock().unwrap(), 2);
}

#[tokio::test]
async fn push_notifications_are_delivered_signed_with_the_token_and_credentials() {
    if python().is_none() {
        return;
    }
    let (hook, hook_base) = serve("/hook").await;
    for _ in 0..8 {
        hook.push(Answer::json(json!({})));
    }
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let url = format!("{hook_base}/hook");
    // The tenant's signing secret (made now: a later one would be another).
    let secret: Value = reqwest::Client::new()
        .post(format!("{}/signing-secret", r.base))
        .bearer_auth(&a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let facts = sdk(&r, "push", &a, "HTTP+JSON", &["--hook", &url]).await;
    assert_eq!(facts["deleted"], "not found");
    let id = facts["task_id"].as_str().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let seen = loop {
        let seen = hook.seen();
        if !seen.is_empty() {
            break seen;
        }
        assert!(std::time::Instant::now() < deadline, "no push came");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let s = &seen[0];
    assert_eq!(s.headers["x-a2a-notification-token"], "tok-123");
    assert_eq!(s.headers["authorization"], "Bearer hook-secret");
    assert_eq!(s.headers["content-type"], "application/a2a+json");
    assert_eq!(s.body["task"]["id"], id);
    assert_eq!(s.body["task"]["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(s.body["task"]["artifacts"][0]["parts"][0]["text"], "pushed");
    // Signed like every webhook of the tenant's.
    let ts: i64 = s.headers["subagent-timestamp"].to_str().unwrap().parse().unwrap();
    let want = subagentd::tools::http::signature(secret["secret"].as_str().unwrap(), ts, &s.raw);
    assert_eq!(s.headers["subagent-signature"].to_str().unwrap(), want);
    // The deleted config got nothing, and the task's own webhook view is untouched.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(hook.seen().len(), 1, "only the config that was kept is pushed to");
    let r2: Value = reqwest::Client::new()
        .get(format!("{}/tasks/{id}", r.base))
        .bearer_auth(&a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r2["webhook"], Value::Null, "a push config is not the task's webhook");
}

#[tokio::test]
async fn an_admission_refusal_is_a_rejected_task_and_nothing_is_stored() {
    if python().is_none() {
        return;
    }
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    admin_put(&r.base, "a", json!({"usd_per_day": 1.5})).await;
    sqlx::query(
        "INSERT INTO usage_daily (day, tenant, model, agent_type, calls, ok, cost_usd)
         VALUES ((now() AT TIME ZONE 'UTC')::date, 'a', 'mock/m', 'general', 3, 3, 1.5)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    for binding in ["JSONRPC", "HTTP+JSON"] {
        let facts = sdk(&r, "rejected", &a, binding, &[]).await;
        assert!(facts["reason"].as_str().unwrap().starts_with("budget_exhausted"), "{facts}");
        assert_eq!(facts["stored"], "not found");
    }
    assert_eq!(tasks(&db).await, 0);
    let contexts: i64 = sqlx::query_scalar("SELECT count(*) FROM a2a_tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(contexts, 0, "a rejected task leaves no row behind");
}

/// A raw JSON-RPC POST to `path`.
pub async fn rpc(base: &str, path: &str, key: Option<&str>, headers: &[(&str, &str)], body: &str) -> reqwest::Response {
    let mut r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap()
}

const V1: (&str, &str) = ("a2a-version", "1.0");

fn send(text: &str, id: &str) -> String {
    json!({"jsonrpc": "2.0", "id": 7, "method": "SendMessage",
           "params": {"message": {"messageId": id, "role": "ROLE_USER", "parts": [{"text": text}]}}})
    .to_string()
}

#[tokio::test]
async fn the_door_checks_version_origin_tenant_depth_and_envelopes() {
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let c = reqwest::Client::new();
    // The card is public, its URLs the ones the client came by (through a proxy here).
    let card: Value = c
        .get(format!("{}/.well-known/agent-card.json", r.base))
        .header("host", "10.0.0.5:8080")
        .header("x-forwarded-host", "agents.example.com")
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(card["supportedInterfaces"][0]["url"], "https://agents.example.com/a2a");
    assert_eq!(card["supportedInterfaces"][1]["url"], "https://agents.example.com/a2a/v1");
    assert_eq!(card["securityRequirements"], json!([{"schemes": {"bearer": {"list": []}}}]));
    let missing = c.get(format!("{}/a2a/agents/nosuch/.well-known/agent-card.json", r.base)).send().await.unwrap();
    assert_eq!(missing.status(), 404);

    // 1.0, and 0.3 for a request that names none (issue 46): a version neither speaks is
    // refused, in 1.0's shape.
    for version in ["2.0", "0.2"] {
        let v: Value =
            rpc(&r.base, "/a2a", Some(&a), &[("a2a-version", version)], &send("x", "m0")).await.json().await.unwrap();
        assert_eq!((v["error"]["code"].as_i64(), v["id"].as_i64()), (Some(-32009), Some(7)), "{version}");
        assert_eq!(v["error"]["data"][0]["reason"], "VERSION_NOT_SUPPORTED");
        let rest = c
            .get(format!("{}/a2a/v1/tasks", r.base))
            .bearer_auth(&a)
            .header("a2a-version", version)
            .send()
            .await
            .unwrap();
        assert_eq!(rest.status(), 400);
        let v: Value = rest.json().await.unwrap();
        assert_eq!(v["error"]["status"], "FAILED_PRECONDITION");
        assert_eq!(v["error"]["details"][0]["reason"], "VERSION_NOT_SUPPORTED");
    }
    // With none named, a 1.0 method name is not a 0.3 one: the error says how to ask for 1.0.
    let old: Value = rpc(&r.base, "/a2a", Some(&a), &[], &send("x", "m0")).await.json().await.unwrap();
    assert_eq!(old["error"]["code"], -32601, "{old}");
    assert!(old["error"]["message"].as_str().unwrap().contains("A2A-Version: 1.0"), "{old}");
    let by_query = c.get(format!("{}/a2a/v1/tasks?A2A-Version=1.0", r.base)).bearer_auth(&a).send().await.unwrap();
    assert_eq!(by_query.status(), 200);

    // A deployed client's Host and Origin pass; another page's Origin does not; no key is 401.
    let own = rpc(
        &r.base,
        "/a2a",
        Some(&a),
        &[V1, ("host", "agents.example.com"), ("origin", "https://agents.example.com")],
        &send("hello [mock:reply=hi]", "m1"),
    )
    .await;
    assert_eq!(own.status(), 200);
    let v: Value = own.json().await.unwrap();
    assert_eq!(v["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{v}");
    let evil = rpc(&r.base, "/a2a", Some(&a), &[V1, ("origin", "https://evil.example.com")], &send("x", "m2")).await;
    assert_eq!(evil.status(), 403);
    let anon = rpc(&r.base, "/a2a", None, &[V1], &send("x", "m2")).await;
    assert_eq!(anon.status(), 401);
    assert!(anon.headers().contains_key("www-authenticate"));
    assert_eq!(anon.json::<Value>().await.unwrap()["error"]["code"], -32600);

    // Retried with the same messageId: the same task.
    let again: Value =
        rpc(&r.base, "/a2a", Some(&a), &[V1], &send("hello [mock:reply=hi]", "m1")).await.json().await.unwrap();
    assert_eq!(again["result"]["task"]["id"], v["result"]["task"]["id"]);
    assert_eq!(tasks(&db).await, 1);

    // Bad envelopes and bad params: the errors the spec names, HTTP 200, nothing started.
    let depth = rpc(&r.base, "/a2a", Some(&a), &[V1, ("subagent-depth", "1")], &send("x", "m3")).await;
    let depth: Value = depth.json().await.unwrap();
    assert_eq!(depth["error"]["code"], -32004);
    assert_eq!(depth["error"]["data"][0]["metadata"]["code"], "recursion_refused");
    let image = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m4",
        "role": "ROLE_USER", "parts": [{"raw": "iVBORw0KGgo=", "mediaType": "image/png"}]}}});
    let text_file = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m5",
        "role": "ROLE_USER", "parts": [{"raw": "c2F5IGhpIFttb2NrOnJlcGx5PWZpbGVd", "mediaType": "text/plain"}]}}});
    // A body that is not a JSON-RPC request: 400 as well.
    for (body, code) in [("{not json", -32700), (r#"[{"jsonrpc":"2.0","id":1,"method":"GetTask"}]"#, -32600)] {
        let resp = rpc(&r.base, "/a2a", Some(&a), &[V1], body).await;
        assert_eq!(resp.status(), 400, "{body}");
        assert_eq!(resp.json::<Value>().await.unwrap()["error"]["code"], code, "{body}");
    }
    for (body, code) in [
        (r#"{"jsonrpc":"2.0","id":1,"method":"message/send","params":{}}"#.to_string(), -32601),
        (r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{}}"#.to_string(), -32602),
        (r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x","tenant":"b"}}"#.to_string(), -32602),
        (r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"not-a-task"}}"#.to_string(), -32001),
        (image.to_string(), -32005),
        (send("x", "bad id with spaces"), -32602),
    ] {
        let resp = rpc(&r.base, "/a2a", Some(&a), &[V1], &body).await;
        assert_eq!(resp.status(), 200, "{body}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{body}: {v}");
    }
    assert_eq!(tasks(&db).await, 1, "nothing started");
    // A text file is text.
    let v: Value = rpc(&r.base, "/a2a", Some(&a), &[V1], &text_file.to_string()).await.json().await.unwrap();
    assert_eq!(v["result"]["task"]["artifacts"][0]["parts"][0]["text"], "file", "{v}");
    // HTTP+JSON: google.rpc.Status with the spec's statuses.
    let id = v["result"]["task"]["id"].as_str().unwrap().to_string();
    for (method, path, status, reason) in [
        ("GET", "/a2a/v1/tasks/nope".to_string(), 404, "TASK_NOT_FOUND"),
        ("POST", format!("/a2a/v1/tasks/{id}:frob"), 404, "METHOD_NOT_FOUND"),
        ("POST", format!("/a2a/v1/tasks/{id}:cancel"), 400, "TASK_NOT_CANCELABLE"),
        ("GET", "/a2a/v1/tasks?pageSize=500".to_string(), 400, "INVALID_PARAMS"),
        ("GET", "/a2a/v1/tasks?status=done".to_string(), 400, "INVALID_PARAMS"),
    ] {
        let req = c.request(method.parse().unwrap(), format!("{}{path}", r.base)).bearer_auth(&a).header(V1.0, V1.1);
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), status, "{method} {path}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["details"][0]["reason"], reason, "{method} {path}: {v}");
    }
    // A push config: created, then deleted with an empty object back (twice: idempotent).
    let cfg = c
        .post(format!("{}/a2a/v1/tasks/{id}/pushNotificationConfigs", r.base))
        .bearer_auth(&a)
        .header(V1.0, V1.1)
        .json(&json!({"id": "c1", "url": "http://127.0.0.1:9/hook"}))
        .send()
        .await
        .unwrap();
    assert_eq!(cfg.status(), 200);
    let bad = c
        .post(format!("{}/a2a/v1/tasks/{id}/pushNotificationConfigs", r.base))
        .bearer_auth(&a)
        .header(V1.0, V1.1)
        .json(&json!({"url": "http://10.1.2.3/hook"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400, "outside the allow-list");
    // An empty `authentication` is how protobuf's JSON writes an unset one: the same as none.
    let empty = c
        .post(format!("{}/a2a/v1/tasks/{id}/pushNotificationConfigs", r.base))
        .bearer_auth(&a)
        .header(V1.0, V1.1)
        .json(&json!({"id": "c2", "url": "http://127.0.0.1:9/hook", "authentication": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(empty.status(), 200, "an empty authentication is none");
    let empty: Value = empty.json().await.unwrap();
    assert_eq!(empty.get("authentication"), None, "{empty}");
    // So are an empty push config in a send's configuration, and a page size of 0 (the default).
    let sent = c
        .post(format!("{}/a2a/v1/message:send", r.base))
        .bearer_auth(&a)
        .header(V1.0, V1.1)
        .json(&json!({"message": {"messageId": "unset-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]},
                      "configuration": {"pushNotificationConfig": {}, "historyLength": 0}}))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200, "{}", sent.text().await.unwrap());
    for path in ["tasks?pageSize=0".to_string(), format!("tasks/{id}/pushNotificationConfigs?pageSize=0")] {
        let listed =
            c.get(format!("{}/a2a/v1/{path}", r.base)).bearer_auth(&a).header(V1.0, V1.1).send().await.unwrap();
        assert_eq!(listed.status(), 200, "{path}");
    }
    for _ in 0..2 {
        let del = c
            .delete(format!("{}/a2a/v1/tasks/{id}/pushNotificationConfigs/c1", r.base))
            .bearer_auth(&a)
            .header(V1.0, V1.1)
            .send()
            .await
            .unwrap();
        assert_eq!(del.status(), 200);
        assert_eq!(del.json::<Value>().await.unwrap(), json!({}));
    }
    // The rate limit: 429, as at the REST door.
    admin_put(&r.base, "a", json!({"requests_per_second": 0.5, "request_burst": 1})).await;
    let mut statuses = vec![];
    for _ in 0..3 {
        statuses.push(rpc(&r.base, "/a2a", Some(&a), &[V1], &send("x", "m9")).await.status().as_u16());
    }
    assert!(statuses.contains(&429), "{statuses:?}");
}

/// Every `live-output` text of a JSON-RPC `SendStreamingMessage` stream of `message`, read to
/// its end.
async fn streamed_text(base: &str, key: &str, message: Value, configuration: Value) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
                      "params": {"message": message, "configuration": configuration}});
    let r = rpc(base, "/a2a", Some(key), &[V1], &body.to_string()).await;
    assert_eq!(r.status(), 200);
    let sse = r.text().await.unwrap();
    let mut live = String::new();
    for data in sse.lines().filter_map(|l| l.strip_prefix("data:")) {
        let ev: Value = serde_json::from_str(data.trim()).unwrap();
        let up = &ev["result"]["artifactUpdate"];
        if up["artifact"]["artifactId"].as_str().is_some_and(|a| a.starts_with("live-output")) {
            live.push_str(up["artifact"]["parts"][0]["text"].as_str().unwrap());
        }
    }
    assert!(sse.contains("TASK_STATE_COMPLETED"), "{sse}");
    live
}

#[tokio::test]
async fn a_streamed_send_gives_the_runs_text_from_its_first_word_however_late_its_stream_follows() {
    // The run's text is never stored, so a stream that subscribed only once its request was done
    // (here: its push config's insert held 600 ms) would miss what a quick worker wrote first.
    let (hook, hook_base) = serve("/hook").await;
    for _ in 0..8 {
        hook.push(Answer::json(json!({})));
    }
    let db = test_db().await;
    hold_inserts(&db.pool, "a2a_push_configs", 0.6).await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let reply: String = (0..12).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ");
    let said = |id: &str| {
        json!({"messageId": id, "role": "ROLE_USER",
               "parts": [{"text": format!("go [mock:stream_ms=1] [mock:reply={reply}]")}]})
    };
    let push = json!({"taskPushNotificationConfig": {"url": format!("{hook_base}/hook")}});
    let t0 = std::time::Instant::now();
    let live = streamed_text(&r.base, &a, said("live-1"), push.clone()).await;
    assert!(t0.elapsed() >= Duration::from_millis(600), "the push config's insert was held");
    assert_eq!(live, reply, "the text from its first word");
    // A paused task's answer streams its run's text whole too (its push config held as well).
    let (calls, endpoint) = deploy_tool().await;
    approvals(&r.base, "a", &a, &endpoint).await;
    let paused = rpc(
        &r.base,
        "/a2a",
        Some(&a),
        &[V1],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "p1",
            "role": "ROLE_USER", "parts": [{"text": format!("deploy it [mock:tool_turns=1] [mock:stream_ms=1] [mock:reply={reply}]")}]}}})
        .to_string(),
    )
    .await
    .json::<Value>()
    .await
    .unwrap();
    let task = &paused["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{paused}");
    let action = task["status"]["message"]["parts"][1]["data"]["actions"][0]["id"].as_str().unwrap().to_string();
    let answer = json!({"messageId": "p2", "role": "ROLE_USER", "taskId": task["id"],
                        "parts": [{"data": {"actions": [{"id": action, "decision": "approve"}]}}]});
    let t0 = std::time::Instant::now();
    let live = streamed_text(&r.base, &a, answer, push).await;
    assert!(t0.elapsed() >= Duration::from_millis(600), "the push config's insert was held");
    assert_eq!(*calls.lock().unwrap(), 1);
    assert_eq!(live, reply, "the answered run's text from its first word");
}

#[tokio::test]
async fn a_stream_over_the_tenants_limit_is_refused_and_starts_nothing() {
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    admin_put(&r.base, "a", json!({"max_streams": 1})).await;
    let stream = |id: &str| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": {"message": {"messageId": id,
            "role": "ROLE_USER", "parts": [{"text": "slow [mock:delay_ms=20000]"}]}}})
        .to_string()
    };
    let open = rpc(&r.base, "/a2a", Some(&a), &[V1], &stream("s1")).await;
    assert_eq!(open.status(), 200);
    assert!(open.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let mut body = open.bytes_stream();
    use futures_util::StreamExt;
    let first = String::from_utf8(body.next().await.unwrap().unwrap().to_vec()).unwrap();
    assert!(first.contains("\"task\""), "{first}");
    let refused = rpc(&r.base, "/a2a", Some(&a), &[V1], &stream("s2")).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(tasks(&db).await, 1, "the refused stream started nothing");
    let rest = reqwest::Client::new()
        .post(format!("{}/a2a/v1/message:stream", r.base))
        .bearer_auth(&a)
        .header(V1.0, V1.1)
        .json(&json!({"message": {"messageId": "s3", "role": "ROLE_USER", "parts": [{"text": "x"}]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), 429);
    assert_eq!(rest.json::<Value>().await.unwrap()["error"]["status"], "RESOURCE_EXHAUSTED");
    drop(body);
}

#[tokio::test]
async fn data_parts_model_rule_budget_stops_busy_contexts_and_list_pages_through_the_python_sdk() {
    if python().is_none() {
        return;
    }
    let db = test_db().await;
    // No default model: a message that names none is refused by the model rule.
    let r = replica(&db, &[]).await;
    let a = key(&r.base, "a").await;
    let f = sdk(&r, "details", &a, "JSONRPC", &[]).await;
    assert_eq!(f["no_model"], "InvalidParamsError", "{f}");
    assert_eq!(f["context_running"], "UnsupportedOperationError", "{f}");
    // The data part joined the prompt as JSON.
    let prompt: String = scalar(&db, "SELECT prompt FROM tasks WHERE id = $1", f["data_task"].as_str().unwrap()).await;
    assert!(prompt.starts_with("file this ticket"), "{prompt}");
    assert!(prompt.contains(r#"{"tags":["urgent"],"ticket":42}"#) || prompt.contains(r#""ticket":42"#), "{prompt}");
    let (status, reason): (String, String) = sqlx::query_as("SELECT status, stop_reason FROM tasks WHERE id = $1")
        .bind(uuid::Uuid::parse_str(f["budget_task"].as_str().unwrap()).unwrap())
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("incomplete", "budget"));
    // Every task once, two a page; the refused and the busy-context messages stored nothing.
    assert_eq!(f["listed"].as_array().unwrap().len(), 3, "{f}");
    assert_eq!(f["pages"], 2);
    assert_eq!(tasks(&db).await, 3);
    // At or after the budget task's status time (the spec's "greater than or equal"): it and the
    // slow task, not the data task, which ended before.
    let mut after: Vec<&str> = f["after"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    after.sort();
    let mut want = vec![f["budget_task"].as_str().unwrap(), f["slow_task"].as_str().unwrap()];
    want.sort();
    assert_eq!(after, want, "{f}");
}

/// A raw JSON-RPC request to `agent`'s A2A door (A2A 1.0), with a deployed client's Origin.
pub async fn raw(app: &TestApp, agent: &str, body: Value) -> reqwest::Response {
    app.client
        .post(app.url(&format!("/a2a/agents/{agent}")))
        .header("a2a-version", "1.0")
        .header("origin", &app.base)
        .json(&body)
        .send()
        .await
        .unwrap()
}
