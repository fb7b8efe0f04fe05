//! Runs that pause: approval of `propose` calls and tools the caller runs itself. A pause is a
//! state in the database (no worker, lease or reservation held), each pending action is
//! answered by its own id, and the run continues on any replica.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::fakes::serve_router;
use crate::helpers::*;

const ADMIN: &str = "pause-admin";

/// A tool server that records every call (headers, body) and answers `done <arguments>`.
#[derive(Clone, Default)]
struct Tools {
    calls: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
}

async fn act(State(t): State<Tools>, h: HeaderMap, Json(body): Json<Value>) -> Json<Value> {
    let content = format!("done {}", body["arguments"]);
    t.calls.lock().unwrap().push((h, body));
    Json(json!({ "content": content }))
}

async fn tools() -> (Tools, String) {
    let t = Tools::default();
    let app = Router::new().route("/act", post(act)).with_state(t.clone());
    let base = format!("{}/act", serve_router(app).await);
    (t, base)
}

impl Tools {
    fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
    fn call_ids(&self) -> Vec<String> {
        self.calls.lock().unwrap().iter().map(|(_, b)| b["tool_call_id"].as_str().unwrap().to_string()).collect()
    }
}

async fn app(tweak: impl FnOnce(&mut subagentd::config::Config)) -> TestApp {
    spawn_app_with(
        |c| {
            c.tool_allow = "*, 127.0.0.1/32".into();
            c.admin_token = Some(ADMIN.into());
            tweak(c)
        },
        true,
    )
    .await
}

/// The catalog tool `deploy` (policy `propose`, an HTTP endpoint).
async fn put_deploy(app: &TestApp, endpoint: &str, key: Option<&str>) {
    let mut r = app.client.put(app.url("/tools/deploy"));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let r = r
        .json(&json!({"description": "Deploys a service", "parameters": {"type": "object"}, "policy": "propose", "endpoint": endpoint}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
}

/// An inline caller tool (no endpoint): the caller runs it.
fn ask_user() -> Value {
    json!({"name": "ask_user", "description": "Asks the user", "parameters": {"type": "object"}, "policy": "auto"})
}

/// `GET /tasks/{id}?wait=true`: returns when the task is terminal or requires action.
async fn wait_get(app: &TestApp, id: &str, key: Option<&str>) -> Value {
    let mut r = app.client.get(app.url(&format!("/tasks/{id}?wait=true&timeout=30")));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let r = r.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

async fn answer(app: &TestApp, id: &str, body: Value, key: Option<&str>) -> reqwest::Response {
    let mut r = app.client.post(app.url(&format!("/tasks/{id}/actions"))).json(&body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    r.send().await.unwrap()
}

/// The tool results the model was given, by tool call id.
async fn tool_results(app: &TestApp, id: &str) -> std::collections::BTreeMap<String, Value> {
    let rows: Vec<Value> = sqlx::query_scalar(
        "SELECT message FROM task_message_log WHERE task_id = $1::uuid AND message->>'role' = 'tool' ORDER BY seq",
    )
    .bind(id)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    rows.into_iter().map(|m| (m["tool_call_id"].as_str().unwrap().to_string(), m)).collect()
}

async fn event_kinds(app: &TestApp, id: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT kind FROM task_event_log WHERE task_id = $1::uuid ORDER BY seq")
        .bind(id)
        .fetch_all(&app.db.pool)
        .await
        .unwrap()
}

/// Poll until the task no longer requires action (an expiry is swept every 2 s), then wait.
async fn past_pause(app: &TestApp, id: &str, key: Option<&str>) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let t = wait_get(app, id, key).await;
        if t["status"] != "requires_action" {
            return t;
        }
        assert!(tokio::time::Instant::now() < deadline, "still paused: {t}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pending(t: &Value) -> Vec<Value> {
    t["pending_actions"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn two_parallel_propose_calls_are_answered_apart_the_approved_one_runs_once_and_the_denied_one_is_an_error() {
    let (srv, endpoint) = tools().await;
    let app = app(|_| {}).await;
    put_deploy(&app, &endpoint, None).await;
    // wait=true returns on requires_action: a foreground caller answers and waits again.
    let r = app
        .client
        .post(app.url("/tasks?wait=true&timeout=30"))
        .json(&json!({"prompt": r#"ship it [mock:tool_turns=1] [mock:tool=deploy] [mock:parallel=2] [mock:args={"svc":"web"}] [mock:reply=shipped]"#,
                      "model": "mock/m", "approval": "propose"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let t: Value = r.json().await.unwrap();
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(t["status"], "requires_action", "{t}");
    let acts = pending(&t);
    assert_eq!(acts.len(), 2, "{t}");
    assert_ne!(acts[0]["id"], acts[1]["id"], "each pending call has its own id");
    for (a, call) in acts.iter().zip(["call_1_1", "call_1_2"]) {
        assert_eq!(a["kind"], "approval");
        assert_eq!(a["name"], "deploy");
        assert_eq!(a["tool_call_id"], call);
        assert_eq!(a["arguments"], json!({"svc": "web"}));
        assert!(a["created_at"].is_string() && a["expires_at"].is_string(), "{a}");
    }
    // Paused is a state: no lease, worker or reservation.
    let (lease, worker, reserved): (Option<uuid::Uuid>, Option<String>, f64) =
        sqlx::query_as("SELECT lease_token, worker_id, reserved_usd::float8 FROM tasks WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    assert_eq!((lease, worker, reserved), (None, None, 0.0));
    // Listed by status.
    let listed = app.get_json("/tasks?status=requires_action").await;
    assert_eq!(listed["tasks"][0]["id"], id.as_str(), "{listed}");
    assert_eq!(srv.count(), 0, "nothing runs before a decision");

    // Approve one: still paused, one action left.
    let r = answer(&app, &id, json!([{"id": acts[0]["id"], "decision": "approve"}]), None).await;
    assert_eq!(r.status(), 200);
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["status"], "requires_action");
    assert_eq!(pending(&t).len(), 1);
    assert_eq!(pending(&t)[0]["id"], acts[1]["id"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(srv.count(), 0, "the run waits for the whole turn's answers");
    // The same answer again is accepted and changes nothing.
    let r = answer(&app, &id, json!([{"id": acts[0]["id"], "decision": "approve"}]), None).await;
    assert_eq!(r.status(), 200);

    // Deny the other, in a second request: the run goes on.
    let r =
        answer(&app, &id, json!([{"id": acts[1]["id"], "decision": "deny", "message": "not on a Friday"}]), None).await;
    assert_eq!(r.status(), 200);
    let t = wait_get(&app, &id, None).await;
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["summary"], "shipped");
    assert_eq!(srv.call_ids(), ["call_1_1"], "the approved call ran exactly once; the denied one never");
    let (h, _) = srv.calls.lock().unwrap()[0].clone();
    assert_eq!(h["idempotency-key"].to_str().unwrap(), format!("{id}:call_1_1"));
    let results = tool_results(&app, &id).await;
    assert_eq!(results["call_1_1"]["content"], r#"done {"svc":"web"}"#);
    assert_ne!(results["call_1_1"]["is_error"], true);
    assert_eq!(results["call_1_2"]["is_error"], true);
    let denied = results["call_1_2"]["content"].as_str().unwrap();
    assert!(denied.contains("denied") && denied.contains("not on a Friday"), "{denied}");

    // The answers are on the server, with who gave them and when.
    let stored: Vec<(String, Option<String>, Option<String>, bool)> = sqlx::query_as(
        "SELECT tool_call_id, decision, answered_by, answered_at IS NOT NULL FROM task_actions
         WHERE task_id = $1::uuid ORDER BY tool_call_id",
    )
    .bind(&id)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[0].1.as_deref(), Some("approve"));
    assert_eq!(stored[1].1.as_deref(), Some("deny"));
    assert!(stored.iter().all(|s| s.2.is_some() && s.3), "{stored:?}");

    // The story, in order: the pause, one event per answer, the resume, then the end.
    let kinds = event_kinds(&app, &id).await;
    let at = |k: &str| kinds.iter().position(|x| x == k).unwrap_or_else(|| panic!("no {k}: {kinds:?}"));
    assert!(at("requires_action") < at("action_answered"));
    assert_eq!(kinds.iter().filter(|k| *k == "action_answered").count(), 2, "{kinds:?}");
    assert!(at("action_answered") < at("actions_answered"));
    assert!(at("actions_answered") < kinds.iter().rposition(|k| k == "claimed").unwrap());
    assert_eq!(kinds.last().unwrap(), "finished");
    // A pause is not an attempt: two claims, one attempt each.
    assert_eq!(t["attempt"], 1, "{t}");
    let m = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    // (Counters are shared by the tests of this process: only their presence is asserted.)
    assert!(m.contains("subagentd_pauses_total "), "{m}");
    assert!(m.contains(r#"subagentd_actions_answered_total{answer="deny"} "#), "{m}");
    assert_events_typed(&app.db.pool).await;
    app.stop().await;
}

#[tokio::test]
async fn a_caller_tool_round_trip_while_a_parallel_http_tool_runs_without_waiting() {
    let (srv, endpoint) = tools().await;
    let app = app(|_| {}).await;
    let lookup = json!({"name": "lookup", "parameters": {"type": "object"}, "policy": "auto", "endpoint": endpoint});
    let t = app
        .wait_task(json!({"prompt": "[mock:tool_turns=1] [mock:tool=ask_user,lookup] [mock:reply=thanks]",
                          "model": "mock/m", "tools": [ask_user(), lookup]}))
        .await;
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(t["status"], "requires_action", "{t}");
    let acts = pending(&t);
    assert_eq!(acts.len(), 1, "only the caller tool waits: {t}");
    assert_eq!((acts[0]["kind"].as_str(), acts[0]["name"].as_str()), (Some("output"), Some("ask_user")));
    assert_eq!(srv.call_ids(), ["call_1_2"], "the HTTP tool ran in the same turn, before the pause");

    let r = answer(&app, &id, json!([{"id": acts[0]["id"], "output": {"colour": "blue"}}]), None).await;
    assert_eq!(r.status(), 200);
    let t = wait_get(&app, &id, None).await;
    assert_eq!(t["status"], "completed", "{t}");
    let results = tool_results(&app, &id).await;
    assert_ne!(results["call_1_1"]["is_error"], true);
    assert!(results["call_1_1"]["content"].to_string().contains("blue"), "{}", results["call_1_1"]);
    assert_eq!(results["call_1_2"]["content"], format!("done {}", json!({"turn": 1, "call": 2})));
    assert_eq!(srv.count(), 1, "the HTTP tool is not run again on resume");
    app.stop().await;
}

/// What answering must not change: the task's row and its actions.
async fn snapshot(app: &TestApp, id: &str) -> (Value, Vec<Value>) {
    let task: Value = sqlx::query_scalar(
        "SELECT jsonb_build_object('status', status, 'seq', last_event_seq, 'paused_at', paused_at) FROM tasks WHERE id = $1::uuid",
    )
    .bind(id)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    let actions: Vec<Value> =
        sqlx::query_scalar("SELECT to_jsonb(a) FROM task_actions a WHERE task_id = $1::uuid ORDER BY id")
            .bind(id)
            .fetch_all(&app.db.pool)
            .await
            .unwrap();
    (task, actions)
}

async fn new_key(app: &TestApp, tenant: &str) -> String {
    admin_key(app, ADMIN, tenant).await
}

/// A task of `key`'s tenant paused on `deploy` (approval) and `ask_user` (output).
async fn paused_task(app: &TestApp, key: &str, extra: Value) -> (String, Value, Value) {
    let mut body = json!({"prompt": "[mock:tool_turns=1] [mock:tool=deploy,ask_user]", "model": "mock/m",
                          "approval": "propose", "tools": [ask_user()]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let r = app.client.post(app.url("/tasks?wait=true&timeout=30")).bearer_auth(key).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["status"], "requires_action", "{t}");
    let acts = pending(&t);
    let approval = acts.iter().find(|a| a["kind"] == "approval").unwrap().clone();
    let output = acts.iter().find(|a| a["kind"] == "output").unwrap().clone();
    (t["id"].as_str().unwrap().to_string(), approval, output)
}

#[tokio::test]
async fn every_bad_answer_is_a_problem_and_changes_nothing() {
    let (srv, endpoint) = tools().await;
    let app = app(|c| c.tool_result_max_bytes = 1000).await;
    let acme = new_key(&app, "acme").await;
    put_deploy(&app, &endpoint, Some(&acme)).await;
    let globex = new_key(&app, "globex").await;
    let (id, approval, output) = paused_task(&app, &acme, json!({})).await;
    let before = snapshot(&app, &id).await;
    let stranger = uuid::Uuid::now_v7();
    let cases: Vec<(Value, Option<&str>, u16, &str)> = vec![
        // An unknown action id is named.
        (json!([{"id": stranger, "decision": "approve"}]), Some(&acme), 422, "unknown_action"),
        // All or none: a good answer next to a bad one is not taken either.
        (
            json!([{"id": approval["id"], "decision": "approve"}, {"id": stranger, "decision": "approve"}]),
            Some(&acme),
            422,
            "unknown_action",
        ),
        // The wrong kind of answer, both ways.
        (json!([{"id": output["id"], "decision": "approve"}]), Some(&acme), 422, "wrong_action_kind"),
        (json!([{"id": approval["id"], "output": "ok"}]), Some(&acme), 422, "wrong_action_kind"),
        // Not a decision; both a decision and an output; neither; nothing; not a list.
        (json!([{"id": approval["id"], "decision": "maybe"}]), Some(&acme), 422, "validation_failed"),
        (json!([{"id": approval["id"], "decision": "approve", "output": 1}]), Some(&acme), 422, "validation_failed"),
        (json!([{"id": approval["id"]}]), Some(&acme), 422, "validation_failed"),
        (json!([]), Some(&acme), 422, "validation_failed"),
        (json!({"id": approval["id"], "decision": "approve"}), Some(&acme), 422, "validation_failed"),
        (json!([{"id": "not-a-uuid", "decision": "approve"}]), Some(&acme), 422, "validation_failed"),
        // An output over the tool result cap, like any tool result.
        (json!([{"id": output["id"], "output": "x".repeat(1001)}]), Some(&acme), 422, "validation_failed"),
        // Another tenant's task does not exist for it.
        (json!([{"id": approval["id"], "decision": "approve"}]), Some(&globex), 404, "not_found"),
        // No key at all.
        (json!([{"id": approval["id"], "decision": "approve"}]), None, 401, "unauthorized"),
    ];
    for (body, key, status, code) in cases {
        let r = answer(&app, &id, body.clone(), key).await;
        let p = assert_problem(r, status, code).await;
        if code == "unknown_action" {
            assert_eq!(p["action_id"], json!(stranger), "{p}");
            assert!(p["detail"].as_str().unwrap().contains(&stranger.to_string()), "{p}");
        }
        assert_eq!(snapshot(&app, &id).await, before, "{body} changed something");
    }
    let r = app
        .client
        .post(app.url(&format!("/tasks/{stranger}/actions")))
        .bearer_auth(&acme)
        .json(&json!([{"id": stranger, "output": 1}]))
        .send()
        .await
        .unwrap();
    assert_problem(r, 404, "not_found").await;

    // A different answer to a decided action is a conflict; the same one is fine.
    assert_eq!(
        answer(&app, &id, json!([{"id": approval["id"], "decision": "deny", "message": "no"}]), Some(&acme))
            .await
            .status(),
        200
    );
    let decided = snapshot(&app, &id).await;
    assert_eq!(
        answer(&app, &id, json!([{"id": approval["id"], "decision": "deny", "message": "no"}]), Some(&acme))
            .await
            .status(),
        200
    );
    let r = answer(&app, &id, json!([{"id": approval["id"], "decision": "approve"}]), Some(&acme)).await;
    let p = assert_problem(r, 409, "action_already_answered").await;
    assert!(p["detail"].as_str().unwrap().contains("key:"), "says who answered: {p}");
    let r =
        answer(&app, &id, json!([{"id": approval["id"], "decision": "deny", "message": "other"}]), Some(&acme)).await;
    assert_problem(r, 409, "action_already_answered").await;
    assert_eq!(snapshot(&app, &id).await, decided);

    // After cancel: the task takes no answers.
    let r = app.client.post(app.url(&format!("/tasks/{id}/cancel"))).bearer_auth(&acme).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["status"], "cancelled", "a paused task is cancelled at once");
    let cancelled = snapshot(&app, &id).await;
    let r = answer(&app, &id, json!([{"id": output["id"], "output": "late"}]), Some(&acme)).await;
    assert_problem(r, 409, "task_not_paused").await;
    assert_eq!(snapshot(&app, &id).await, cancelled);

    // After expiry: the pause ended without the answers; a late one changes nothing.
    let (late, approval, output) = paused_task(&app, &acme, json!({"action_timeout_seconds": 1})).await;
    let t = past_pause(&app, &late, Some(&acme)).await;
    assert_eq!(t["status"], "completed", "{t}");
    let expired = snapshot(&app, &late).await;
    let r = answer(&app, &late, json!([{"id": approval["id"], "decision": "approve"}]), Some(&acme)).await;
    let p = assert_problem(r, 409, "action_already_answered").await;
    assert!(p["detail"].as_str().unwrap().contains("expired"), "{p}");
    let r = answer(&app, &late, json!([{"id": output["id"], "output": "late"}]), Some(&acme)).await;
    assert_problem(r, 409, "action_already_answered").await;
    assert_eq!(snapshot(&app, &late).await, expired);
    assert_eq!(srv.count(), 0, "no deploy ever ran");

    // The admin answers for any tenant, and is named as the one who did.
    let (third, approval, output) = paused_task(&app, &acme, json!({})).await;
    let r = app
        .client
        .post(app.url(&format!("/tasks/{third}/actions")))
        .bearer_auth(ADMIN)
        .json(&json!([{"id": approval["id"], "decision": "approve"}, {"id": output["id"], "output": "yes"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let by: Vec<String> = sqlx::query_scalar("SELECT answered_by FROM task_actions WHERE task_id = $1::uuid")
        .bind(&third)
        .fetch_all(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(by, ["admin", "admin"]);
    let t = wait_get(&app, &third, Some(&acme)).await;
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(srv.count(), 1);
    app.stop().await;
}

#[tokio::test]
async fn an_unanswered_pause_expires_into_tool_errors_and_paused_time_is_not_run_time() {
    let (srv, endpoint) = tools().await;
    let app = app(|c| c.max_action_timeout_seconds = 600).await;
    put_deploy(&app, &endpoint, None).await;
    let r = app.post_task(json!({"prompt": "x", "model": "mock/m", "action_timeout_seconds": 0})).await;
    assert_eq!(assert_problem(r, 422, "validation_failed").await["errors"][0]["field"], "action_timeout_seconds");
    // Above the configured cap, the cap applies.
    let t = app
        .wait_task(json!({"prompt": "[mock:tool_turns=1] [mock:tool=ask_user]", "model": "mock/m",
                          "tools": [ask_user()], "action_timeout_seconds": 100000}))
        .await;
    let a = &pending(&t)[0];
    let at = |k: &str| chrono::DateTime::parse_from_rfc3339(a[k].as_str().unwrap()).unwrap();
    assert_eq!((at("expires_at") - at("created_at")).num_seconds(), 600, "{a}");

    // Expiry: the approval is denied for want of a decision, the output is a tool error.
    let t = app
        .wait_task(json!({"prompt": "[mock:tool_turns=1] [mock:tool=deploy,ask_user]", "model": "mock/m",
                          "approval": "propose", "tools": [ask_user()], "action_timeout_seconds": 1}))
        .await;
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(t["status"], "requires_action");
    let t = past_pause(&app, &id, None).await;
    assert_eq!(t["status"], "completed", "the run goes on after the pause expires: {t}");
    let results = tool_results(&app, &id).await;
    assert_eq!(results["call_1_1"]["is_error"], true);
    assert!(results["call_1_1"]["content"].as_str().unwrap().contains("No decision came in time"));
    assert_eq!(results["call_1_2"]["is_error"], true);
    assert!(
        results["call_1_2"]["content"].as_str().unwrap().contains("did not come in time"),
        "{}",
        results["call_1_2"]
    );
    assert_eq!(srv.count(), 0);

    // A paused run's time does not count against timeout_seconds.
    let t = app
        .wait_task(json!({"prompt": "[mock:tool_turns=1] [mock:tool=ask_user]", "model": "mock/m",
                          "tools": [ask_user()], "timeout_seconds": 1}))
        .await;
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(t["status"], "requires_action");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let r = answer(&app, &id, json!([{"id": pending(&t)[0]["id"], "output": "ok"}]), None).await;
    assert_eq!(r.status(), 200);
    let t = wait_get(&app, &id, None).await;
    assert_eq!(t["status"], "completed", "2.5 s paused is not 2.5 s of a 1 s limit: {t}");
    assert_events_typed(&app.db.pool).await;
    app.stop().await;
}

#[tokio::test]
async fn cancel_reaches_a_paused_task_at_once_and_bulk_cancel_includes_paused_ones() {
    let app = app(|_| {}).await;
    let mut ids = vec![];
    for _ in 0..3 {
        let t = app
            .wait_task(json!({"prompt": "[mock:tool_turns=1] [mock:tool=ask_user]", "model": "mock/m",
                              "tools": [ask_user()], "metadata": {"batch": "b1"}}))
            .await;
        assert_eq!(t["status"], "requires_action");
        ids.push(t["id"].as_str().unwrap().to_string());
    }
    let r = app.client.post(app.url(&format!("/tasks/{}/cancel", ids[0]))).send().await.unwrap();
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["status"], "cancelled");
    assert!(t.get("pending_actions").is_none_or(Value::is_null), "a cancelled task waits for nothing: {t}");
    let r = app.post_json("/tasks/cancel", json!({"status": ["requires_action"], "metadata": {"batch": "b1"}})).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["cancelled"].as_array().unwrap().len(), 2, "{v}");
    for id in &ids {
        assert_eq!(app.get_task(id).await["status"], "cancelled");
        assert_eq!(event_kinds(&app, id).await.last().unwrap(), "cancelled");
    }
    assert_events_typed(&app.db.pool).await;
    app.stop().await;
}

#[derive(Clone, Default)]
struct Hooks {
    got: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
}

async fn hook(State(h): State<Hooks>, headers: HeaderMap, body: String) -> StatusCode {
    h.got.lock().unwrap().push((headers, serde_json::from_str(&body).unwrap()));
    StatusCode::OK
}

#[tokio::test]
async fn the_event_stream_stays_open_across_a_pause_and_the_webhook_hears_of_it() {
    let hooks = Hooks::default();
    let router = Router::new().route("/hook", post(hook)).with_state(hooks.clone());
    let hook_url = format!("{}/hook", serve_router(router).await);
    let app = app(|_| {}).await;
    let t = app
        .submit(json!({"prompt": "[mock:tool_turns=1] [mock:tool=ask_user]", "model": "mock/m",
                       "tools": [ask_user()], "webhook_url": hook_url}))
        .await;
    let id = t["id"].as_str().unwrap().to_string();
    let r = app
        .client
        .get(app.url(&format!("/tasks/{id}/events")))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    let mut buf = String::new();
    let mut kinds: Vec<String> = vec![];
    let mut answered = false;
    while let Ok(Some(chunk)) = tokio::time::timeout(Duration::from_secs(20), body.next()).await {
        buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(i) = buf.find("\n\n") {
            let frame: String = buf.drain(..i + 2).collect();
            if let Some(k) = frame.lines().find_map(|l| l.strip_prefix("event:")) {
                kinds.push(k.trim().to_string());
            }
        }
        if !answered && kinds.iter().any(|k| k == "requires_action") {
            // The stream is still open: answer, and read on to the end.
            let t = app.get_task(&id).await;
            let r = answer(&app, &id, json!([{"id": pending(&t)[0]["id"], "output": "42"}]), None).await;
            assert_eq!(r.status(), 200);
            answered = true;
        }
        if kinds.last().is_some_and(|k| k == "finished") {
            break;
        }
    }
    assert!(answered, "no requires_action event came: {kinds:?}");
    let at = |k: &str| kinds.iter().position(|x| x == k).unwrap_or_else(|| panic!("no {k}: {kinds:?}"));
    assert!(at("requires_action") < at("action_answered") && at("action_answered") < at("actions_answered"));
    assert_eq!(kinds.last().unwrap(), "finished", "{kinds:?}");

    // Two deliveries, each signed: the pause (with what it waits for), then the end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while hooks.got.lock().unwrap().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "deliveries: {:?}", hooks.got.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = hooks.got.lock().unwrap().clone();
    assert_eq!(got[0].1["event"], "task.requires_action");
    assert_eq!(got[0].1["pause"], 1);
    // The pause's actions, whatever the task has done since (here: answered before the send).
    assert_eq!(got[0].1["actions"][0]["name"], "ask_user");
    assert_eq!(got[0].1["actions"][0]["kind"], "output");
    assert_eq!(got[1].1["event"], "task.finished");
    assert_eq!(got[1].1["task"]["status"], "completed");
    for (h, _) in &got {
        assert!(h.contains_key("subagent-signature"));
    }
    let keys: Vec<&str> = got.iter().map(|(h, _)| h["idempotency-key"].to_str().unwrap()).collect();
    assert_ne!(keys[0], keys[1], "each delivery has its own idempotency key");
    // The sender records a delivery after its receiver answered, so the row may lag the receipt.
    let want: [(String, String, i32); 2] =
        [("task.requires_action".into(), "delivered".into(), 1), ("task.finished".into(), "delivered".into(), 1)];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let rows: Vec<(String, String, i32)> = sqlx::query_as(
            "SELECT event, status, attempts FROM webhook_deliveries WHERE task_id = $1::uuid ORDER BY delivered_at",
        )
        .bind(&id)
        .fetch_all(&app.db.pool)
        .await
        .unwrap();
        if rows == want || tokio::time::Instant::now() >= deadline {
            assert_eq!(rows, want);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.stop().await;
}

#[tokio::test]
async fn ten_paused_runs_hold_no_budget_and_the_tenant_spends_up_to_its_limit_on_others() {
    let app = app(|_| {}).await;
    let mut paused = vec![];
    for _ in 0..10 {
        let t = app
            .submit(
                json!({"prompt": "[mock:tool_turns=1] [mock:tool=ask_user]", "model": "mock/m", "tools": [ask_user()]}),
            )
            .await;
        paused.push(t["id"].as_str().unwrap().to_string());
    }
    for id in &paused {
        assert_eq!(wait_get(&app, id, None).await["status"], "requires_action");
    }
    let (reserved, running): (f64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(reserved_usd), 0)::float8, count(*) FILTER (WHERE status = 'running') FROM tasks",
    )
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert_eq!((reserved, running), (0.0, 0), "paused runs hold no reservation and no running slot");

    // A limit a little over what is spent, and a running cap: paused runs must not hold either.
    let spent: f64 = sqlx::query_scalar("SELECT coalesce(sum(cost_usd), 0)::float8 FROM llm_calls")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    let room = 0.01;
    let r = app
        .client
        .put(app.url("/admin/tenants/default"))
        .bearer_auth(ADMIN)
        .json(&json!({"usd_per_day": spent + room, "max_running": 4}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    // Each of these costs about $0.0015 (three calls of a 1,300-character prompt).
    let prompt = format!("{} [mock:tool_turns=2]", "Context line. ".repeat(90));
    let mut others = vec![];
    for _ in 0..10 {
        let r = app.post_task(json!({"prompt": prompt, "model": "mock/m", "max_turns": 10})).await;
        if r.status() == 402 {
            break;
        }
        assert_eq!(r.status(), 201);
        others.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string());
    }
    assert!(others.len() >= 6, "admission let only {} in", others.len());
    let mut outcomes = vec![];
    for id in &others {
        let t = app.poll_until_terminal(id, Duration::from_secs(60)).await;
        outcomes.push(format!("{}/{}", t["status"].as_str().unwrap(), t["stop_reason"].as_str().unwrap_or("-")));
    }
    let after: f64 = sqlx::query_scalar("SELECT coalesce(sum(cost_usd), 0)::float8 FROM llm_calls")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    let used = (after - spent) / room;
    println!("PAUSED BUDGET: room={room} used={:.1}% outcomes={outcomes:?}", used * 100.0);
    assert!(after <= spent + room + 1e-12, "over the limit");
    // What is left is less than these tasks' smallest call (a 2,500–3,000-character prompt and
    // 256 output tokens: $0.0013–0.0015), or a run ended on money a paused run was holding.
    assert!(spent + room - after < 0.0015, "only {:.1}% of the room was spent: {outcomes:?}", used * 100.0);
    assert!(outcomes.iter().filter(|o| o.starts_with("completed/")).count() >= 3, "{outcomes:?}");
    for id in &paused {
        assert_eq!(app.get_task(id).await["status"], "requires_action", "still paused, still answerable");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_paused_run_outlives_its_replica_killed_and_finishes_on_another_with_one_tool_call() {
    let (srv, endpoint) = tools().await;
    let db = test_db().await;
    let serve = |port: u16| {
        let listen = format!("127.0.0.1:{port}");
        let proc = spawn_binary(
            &["serve"],
            &db.url,
            &[("SUBAGENTD_LISTEN", &listen), ("SUBAGENTD_TOOL_ALLOW", "*, 127.0.0.1/32")],
        );
        (proc, format!("http://{listen}"))
    };
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let client = reqwest::Client::new();
    let ready = |base: String| {
        let client = client.clone();
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while client.get(format!("{base}/healthz")).send().await.map(|r| r.status() != 200).unwrap_or(true) {
                assert!(std::time::Instant::now() < deadline, "the binary did not start");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let (mut a, a_base) = serve(free());
    ready(a_base.clone()).await;
    let r = client
        .put(format!("{a_base}/tools/deploy"))
        .json(&json!({"parameters": {"type": "object"}, "policy": "propose", "endpoint": endpoint}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let t: Value = client
        .post(format!("{a_base}/tasks?wait=true&timeout=30"))
        .json(&json!({"prompt": "[mock:tool_turns=1] [mock:tool=deploy] [mock:reply=deployed]", "model": "mock/m", "approval": "propose"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(t["status"], "requires_action", "{t}");
    let id = t["id"].as_str().unwrap().to_string();
    let action = pending(&t)[0]["id"].clone();
    unsafe { libc::kill(a.child.id() as i32, libc::SIGKILL) };
    let _ = a.child.wait();

    let (_b, b_base) = serve(free());
    ready(b_base.clone()).await;
    let t: Value = client.get(format!("{b_base}/tasks/{id}")).send().await.unwrap().json().await.unwrap();
    assert_eq!(t["status"], "requires_action", "the pause survived the kill: {t}");
    assert_eq!(pending(&t)[0]["id"], action);
    let r = client
        .post(format!("{b_base}/tasks/{id}/actions"))
        .json(&json!([{"id": action, "decision": "approve"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let t: Value =
        client.get(format!("{b_base}/tasks/{id}?wait=true&timeout=30")).send().await.unwrap().json().await.unwrap();
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["summary"], "deployed");
    assert_eq!(srv.count(), 1, "the approved call ran once");
    let workers: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT data->>'worker' FROM task_event_log WHERE task_id = $1::uuid AND kind = 'claimed' ORDER BY seq",
    )
    .bind(&id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(workers.len(), 2, "claimed once by each replica: {workers:?}");
    assert_ne!(workers[0], workers[1], "finished on the other replica");
}

#[tokio::test]
async fn approval_comes_from_the_task_else_its_agent_definition_else_the_tenant() {
    let (srv, endpoint) = tools().await;
    let app = app(|_| {}).await;
    let lookup = json!({"name": "lookup", "parameters": {"type": "object"}, "policy": "auto", "endpoint": endpoint});
    let run = |body: Value| {
        let mut body = body;
        body["prompt"] = json!("[mock:tool_turns=1] [mock:tool=lookup]");
        body["model"] = json!("mock/m");
        body["tools"] = json!([lookup.clone()]);
        app.wait_task(body)
    };
    // Default: none — an `auto` tool runs unattended.
    assert_eq!(run(json!({})).await["status"], "completed");
    // The tenant's default `all`: every call waits for a decision …
    let r = app
        .client
        .put(app.url("/admin/tenants/default"))
        .bearer_auth(ADMIN)
        .json(&json!({"approval": "all"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let t = run(json!({})).await;
    assert_eq!(t["status"], "requires_action");
    assert_eq!(pending(&t)[0]["kind"], "approval");
    // … unless the task says otherwise, or its agent definition does.
    assert_eq!(run(json!({"approval": "none"})).await["status"], "completed");
    let r = app
        .client
        .put(app.url("/agents/unattended"))
        .json(&json!({"system_prompt": "You act.", "approval": "none"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    assert_eq!(run(json!({"subagent_type": "unattended"})).await["status"], "completed");
    assert_eq!(run(json!({"subagent_type": "unattended", "approval": "all"})).await["status"], "requires_action");
    // `propose` leaves an `auto` tool alone.
    assert_eq!(run(json!({"approval": "propose"})).await["status"], "completed");
    let r = app.post_task(json!({"prompt": "x", "model": "mock/m", "approval": "sometimes"})).await;
    assert_eq!(assert_problem(r, 422, "validation_failed").await["errors"][0]["field"], "approval");
    let r = app
        .client
        .put(app.url("/agents/x"))
        .json(&json!({"system_prompt": "s", "approval": "maybe"}))
        .send()
        .await
        .unwrap();
    assert_problem(r, 422, "validation_failed").await;
    assert_eq!(srv.count(), 4, "the four unattended runs called the tool; the paused ones did not");
    app.stop().await;
}
