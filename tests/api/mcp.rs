//! The MCP door, driven by the official SDKs' clients against the real binary: the Python SDK
//! (`mcp==1.30.*`, `tests/sdk/mcp_client.py`) for every scenario, the TypeScript SDK
//! (`@modelcontextprotocol/sdk`, `tests/sdk/mcp_client.mjs`) for a plain call; raw JSON-RPC for
//! what no client sends on purpose (a bad Origin, bad envelopes, a retry of one request id).
//!
//! Needs the SDKs: `SUBAGENTD_PYTHON` (a Python with `mcp` and `a2a-sdk`; `.ci/run` makes a
//! virtual environment) and `SUBAGENTD_NODE_MODULES` (a folder with `node_modules` holding
//! `@modelcontextprotocol/sdk`; `.ci/run` installs it). Without them each test prints a notice
//! and passes — unless `SUBAGENTD_REQUIRE_SDKS=1` (set by `.ci/run`), which makes that a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::fakes::serve_router;
use crate::helpers::*;

pub const ADMIN: &str = "mcp-admin-token";

/// The Python that has the SDKs, if any (else the test is skipped, or fails under CI).
pub fn python() -> Option<PathBuf> {
    match std::env::var("SUBAGENTD_PYTHON") {
        Ok(p) => Some(PathBuf::from(p)),
        Err(_) => {
            skipped(
                "SUBAGENTD_REQUIRE_SDKS",
                "the MCP and A2A doors' tests with the official Python SDKs, and the Python client's",
                "SUBAGENTD_PYTHON is not set",
                "set it to a Python with tests/sdk/requirements.txt installed (bash .ci/run does)",
            );
            None
        }
    }
}

/// The `node_modules` folder that has the TypeScript SDKs, and `node`.
pub fn node_modules() -> Option<PathBuf> {
    match std::env::var("SUBAGENTD_NODE_MODULES") {
        Ok(p) => Some(PathBuf::from(p)),
        Err(_) => {
            skipped(
                "SUBAGENTD_REQUIRE_SDKS",
                "the MCP door's tests with the official TypeScript SDK, and the TypeScript client's",
                "SUBAGENTD_NODE_MODULES is not set",
                "set it to a folder where tests/sdk/package.json is installed (bash .ci/run does)",
            );
            None
        }
    }
}

pub fn sdk_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk").join(name)
}

/// Run a scenario of `script` with `args`; its JSON facts (asserting it passed).
pub async fn run_script(program: PathBuf, script: &str, args: Vec<String>, env: Vec<(String, String)>) -> Value {
    let script = sdk_script(script);
    let out = tokio::task::spawn_blocking(move || {
        let mut c = Command::new(program);
        c.arg(script).args(&args);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("run the SDK client")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the SDK client failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Run `script` with Node from the folder that has the SDKs (ES modules resolve from where the
/// script is, not from NODE_PATH): a copy of it is put there.
pub async fn run_node(modules: &Path, script: &str, args: Vec<String>) -> Value {
    let copy = modules.join(format!("subagentd-{}-{script}", std::process::id()));
    std::fs::copy(sdk_script(script), &copy).unwrap();
    let name = copy.file_name().unwrap().to_string_lossy().to_string();
    let out = {
        let (modules, copy) = (modules.to_path_buf(), copy.clone());
        tokio::task::spawn_blocking(move || {
            Command::new("node").current_dir(&modules).arg(&copy).args(&args).output().expect("run node")
        })
        .await
        .unwrap()
    };
    let _ = std::fs::remove_file(&copy);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{name} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// A replica of the service, the real binary.
pub struct Replica {
    pub base: String,
    pub _proc: Proc,
}

pub async fn replica(db: &TestDb, env: &[(&str, &str)]) -> Replica {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut all = vec![
        ("SUBAGENTD_LISTEN", listen.as_str()),
        ("SUBAGENTD_ADMIN_TOKEN", ADMIN),
        ("SUBAGENTD_AUTH", "keys"),
        ("SUBAGENTD_TOOL_ALLOW", "*, 127.0.0.1/32"),
    ];
    all.extend_from_slice(env);
    let proc = spawn_binary(&["serve"], &db.url, &all);
    let base = format!("http://{listen}");
    wait_until_ok(&reqwest::Client::new(), &format!("{base}/readyz"), Duration::from_secs(30)).await;
    Replica { base, _proc: proc }
}

pub async fn key(base: &str, tenant: &str) -> String {
    let r = reqwest::Client::new()
        .post(format!("{base}/admin/keys"))
        .bearer_auth(ADMIN)
        .json(&json!({"tenant": tenant}))
        .send()
        .await
        .unwrap();
    r.json::<Value>().await.unwrap()["key"].as_str().unwrap().to_string()
}

fn args(scenario: &str, url: &str, key: &str, more: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![scenario.into(), "--url".into(), url.into(), "--key".into(), key.into()];
    v.extend(more.iter().map(|s| s.to_string()));
    v
}

pub async fn py(scenario: &str, url: &str, key: &str, more: &[&str]) -> Option<Value> {
    let p = python()?;
    Some(run_script(p, "mcp_client.py", args(scenario, url, key, more), vec![]).await)
}

pub async fn scalar<T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin>(
    db: &TestDb,
    sql: &str,
    id: &str,
) -> T {
    sqlx::query_scalar(sql).bind(uuid::Uuid::parse_str(id).unwrap()).fetch_one(&db.pool).await.unwrap()
}

#[tokio::test]
async fn the_python_sdk_lists_the_tools_calls_task_follows_long_runs_and_runs_mcp_tasks() {
    if python().is_none() {
        return;
    }
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m"), ("SUBAGENTD_MCP_WAIT_SECONDS", "2")]).await;
    let (a, b) = (key(&r.base, "a").await, key(&r.base, "b").await);
    // A custom agent of tenant a's: in the tool's enum, with its description.
    let c = reqwest::Client::new();
    let put = c
        .put(format!("{}/agents/triager", r.base))
        .bearer_auth(&a)
        .json(&json!({"description": "Sorts incoming tickets", "system_prompt": "You triage."}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success());
    let url = format!("{}/mcp", r.base);
    let listed = py("list_tools", &url, &a, &[]).await.unwrap();
    assert_eq!(listed["protocol"], "2025-11-25");
    let types: Vec<&str> = listed["types"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(types, vec!["general", "research", "explore", "plan", "triager"]);
    assert!(listed["description"].as_str().unwrap().contains("triager: Sorts incoming tickets"));

    let plain = py("plain_call", &url, &a, &[]).await.unwrap();
    let id = plain["task_id"].as_str().unwrap();
    // The same run as the REST door shows it: the tenant's, in the ledger.
    let tenant: String = scalar(&db, "SELECT tenant FROM tasks WHERE id = $1", id).await;
    assert_eq!(tenant, "a");
    let calls: i64 = scalar(&db, "SELECT count(*) FROM llm_calls WHERE task_id = $1", id).await;
    assert_eq!(calls, 1);
    // The refusals started nothing: one task only so far.
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(n, 1, "an unknown type, a long description, a missing field: no task");

    let long = py("long_call", &url, &a, &[]).await.unwrap();
    assert_eq!(long["progress"][0], 1.0);
    // The run's text as it streams, as progress messages.
    let live = py("live_progress", &url, &a, &[]).await.unwrap();
    assert!(live["notifications"].as_u64().unwrap() >= 2, "{live}");
    let bg = py("task_augmented", &url, &a, &[]).await.unwrap();
    let status: String = scalar(&db, "SELECT status FROM tasks WHERE id = $1", bg["task_id"].as_str().unwrap()).await;
    assert_eq!(status, "completed");

    // Another tenant: not found, by every method.
    py("isolation", &url, &b, &["--key2", &b, "--task-id", id]).await.unwrap();
    // From inside a sub-agent: no `task` tool, and a call of it refused.
    py("depth", &url, &a, &[]).await.unwrap();
    // A client of the older revision.
    py("old_version", &url, &a, &[]).await.unwrap();
}

#[tokio::test]
async fn the_python_sdk_cancels_a_run_mid_call_and_the_provider_call_is_stopped() {
    if python().is_none() {
        return;
    }
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let out = py("cancel", &format!("{}/mcp", r.base), &a, &[]).await.unwrap();
    let id = out["task_id"].as_str().unwrap();
    let status: String = scalar(&db, "SELECT status FROM tasks WHERE id = $1", id).await;
    assert_eq!(status, "cancelled");
    // The provider call in flight was dropped, and is in the ledger as interrupted.
    let outcome: String = scalar(&db, "SELECT outcome FROM llm_calls WHERE task_id = $1", id).await;
    assert_eq!(outcome, "interrupted");
}

/// A tool server that records its calls and answers `deployed`.
pub async fn deploy_tool() -> (std::sync::Arc<std::sync::Mutex<usize>>, String) {
    use axum::routing::post;
    let calls = std::sync::Arc::new(std::sync::Mutex::new(0usize));
    let c = calls.clone();
    let app = axum::Router::new().route(
        "/deploy",
        post(move || {
            let c = c.clone();
            async move {
                *c.lock().unwrap() += 1;
                axum::Json(json!({"content": "deployed"}))
            }
        }),
    );
    (calls, format!("{}/deploy", serve_router(app).await))
}

/// Tenant `tenant` with the catalog tool `deploy` (at `endpoint`) and every call needing approval.
pub async fn approvals(base: &str, tenant: &str, key: &str, endpoint: &str) {
    let c = reqwest::Client::new();
    let r = c
        .put(format!("{base}/tools/deploy"))
        .bearer_auth(key)
        .json(&json!({"description": "Deploys", "parameters": {"type": "object"}, "policy": "propose", "endpoint": endpoint}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let r = c
        .put(format!("{base}/admin/tenants/{tenant}"))
        .bearer_auth(ADMIN)
        .json(&json!({"approval": "all"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
}

#[tokio::test]
async fn an_approval_is_asked_through_elicitation_and_stored_as_answered_or_declined() {
    if python().is_none() {
        return;
    }
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let (calls, endpoint) = deploy_tool().await;
    approvals(&r.base, "a", &a, &endpoint).await;
    let url = format!("{}/mcp", r.base);
    let approved = py("elicit", &url, &a, &["--answer", "approve"]).await.unwrap();
    assert!(approved["asked"][0]["message"].as_str().unwrap().contains("deploy"));
    assert_eq!(*calls.lock().unwrap(), 1, "approved: the call ran");
    let id = approved["task_id"].as_str().unwrap();
    let (decision, by): (String, String) =
        sqlx::query_as("SELECT decision, answered_by FROM task_actions WHERE task_id = $1")
            .bind(uuid::Uuid::parse_str(id).unwrap())
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(decision, "approve");
    assert!(by.starts_with("key:sk_"), "answered by the key that carried the answer: {by}");
    let declined = py("elicit", &url, &a, &["--answer", "decline"]).await.unwrap();
    assert_eq!(*calls.lock().unwrap(), 1, "declined: the call did not run");
    let decision: String =
        scalar(&db, "SELECT decision FROM task_actions WHERE task_id = $1", declined["task_id"].as_str().unwrap())
            .await;
    assert_eq!(decision, "deny");
    // A task-augmented call that pauses: tasks/result blocks, asks through the same stream (with
    // the related task), and then answers the result.
    let bg = py("result_elicit", &url, &a, &[]).await.unwrap();
    assert_eq!(*calls.lock().unwrap(), 2, "approved through tasks/result: the call ran");
    let decision: String =
        scalar(&db, "SELECT decision FROM task_actions WHERE task_id = $1", bg["task_id"].as_str().unwrap()).await;
    assert_eq!(decision, "approve");
}

#[tokio::test]
async fn a_session_is_served_by_whichever_replica_its_requests_reach() {
    if python().is_none() {
        return;
    }
    let db = test_db().await;
    let env = [("SUBAGENTD_DEFAULT_MODEL", "mock/m")];
    let (one, two) = (replica(&db, &env).await, replica(&db, &env).await);
    let a = key(&one.base, "a").await;
    let (_calls, endpoint) = deploy_tool().await;
    approvals(&one.base, "a", &a, &endpoint).await;
    let urls = format!("{}/mcp,{}/mcp", one.base, two.base);
    py("replicas", &format!("{}/mcp", one.base), &a, &["--urls", &urls]).await.unwrap();
}

#[tokio::test]
async fn the_typescript_sdk_makes_a_plain_call() {
    let Some(modules) = node_modules() else { return };
    let db = test_db().await;
    let r =
        replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m"), ("SUBAGENTD_PUBLIC_URL", "https://agents.example.com")])
            .await;
    let a = key(&r.base, "a").await;
    let url = format!("{}/mcp", r.base);
    let out = run_node(&modules, "mcp_client.mjs", vec!["plain".into(), url.clone(), a.clone()]).await;
    assert_eq!(out["text"], "hello from typescript");
    assert_eq!(out["status"], "completed");
    // A call the client gives up on: the SDK sends notifications/cancelled, and the task stops —
    // its provider call dropped, in the ledger as interrupted.
    let out = run_node(&modules, "mcp_client.mjs", vec!["abort".into(), url, a]).await;
    assert_eq!(out["aborted"], true);
    let id: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM tasks WHERE description = 'given up on'").fetch_one(&db.pool).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let s: String = scalar(&db, "SELECT status FROM tasks WHERE id = $1", &id.to_string()).await;
        if s == "cancelled" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the given-up call's task is {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let outcome: String = scalar(&db, "SELECT outcome FROM llm_calls WHERE task_id = $1", &id.to_string()).await;
    assert_eq!(outcome, "interrupted");
}

pub async fn admin_put(base: &str, tenant: &str, body: Value) {
    put_tenant_limits(base, ADMIN, tenant, &body).await;
}

#[tokio::test]
async fn refusals_per_agent_tools_and_task_pages_through_the_python_sdk() {
    if python().is_none() {
        return;
    }
    let db = test_db().await;
    // No default model: the model rule refuses a call that names none.
    let r = replica(&db, &[("SUBAGENTD_MCP_TOOL_PER_AGENT", "true")]).await;
    let (a, b, c) = (key(&r.base, "a").await, key(&r.base, "b").await, key(&r.base, "c").await);
    admin_put(&r.base, "a", json!({"usd_per_day": 1.5})).await;
    sqlx::query(
        "INSERT INTO usage_daily (day, tenant, model, agent_type, calls, ok, cost_usd)
         VALUES ((now() AT TIME ZONE 'UTC')::date, 'a', 'mock/m', 'general', 3, 3, 1.5)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    admin_put(&r.base, "b", json!({"max_queued": 0})).await;
    let url = format!("{}/mcp", r.base);
    py("refusals", &url, &a, &["--key2", &b]).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(n, 0, "no refusal started a task");
    let per = py("per_agent", &url, &c, &[]).await.unwrap();
    let agent: String =
        scalar(&db, "SELECT subagent_type FROM tasks WHERE id = $1", per["task_id"].as_str().unwrap()).await;
    assert_eq!(agent, "plan", "agent_plan runs the plan type");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(n, 1, "the call from inside a sub-agent started nothing");
    // tasks/list pages through all of c's tasks (50 a page), each once, and no other tenant's.
    let http = reqwest::Client::new();
    for i in 0..119 {
        let r = http
            .post(format!("{}/tasks", r.base))
            .bearer_auth(&c)
            .json(&json!({"prompt": format!("p{i}"), "model": "mock/m"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let listed = py("list_paging", &url, &c, &[]).await.unwrap();
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 120);
    assert_eq!(listed["pages"], 3);
    // The rate limit is HTTP 429 with Retry-After, as at the REST door.
    admin_put(&r.base, "c", json!({"requests_per_second": 0.5, "request_burst": 1})).await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    let mut limited = None;
    for _ in 0..3 {
        let resp = post(&r.base, &c, None, &[], init.clone()).await;
        if resp.status() == 429 {
            limited = Some(resp);
            break;
        }
    }
    let limited = limited.expect("a 429 within three requests at 0.5 a second");
    assert!(limited.headers().contains_key("retry-after"));
}

/// A raw JSON-RPC POST to `/mcp`.
pub async fn post(
    base: &str,
    key: &str,
    session: Option<&str>,
    headers: &[(&str, &str)],
    body: Value,
) -> reqwest::Response {
    let mut r = reqwest::Client::new()
        .post(format!("{base}/mcp"))
        .bearer_auth(key)
        .header("accept", "application/json, text/event-stream")
        .json(&body);
    if let Some(s) = session {
        r = r.header("mcp-session-id", s);
    }
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap()
}

#[tokio::test]
async fn the_door_checks_origin_version_and_envelopes_and_a_retried_request_starts_one_task() {
    let db = test_db().await;
    let r =
        replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m"), ("SUBAGENTD_PUBLIC_URL", "https://agents.example.com")])
            .await;
    let a = key(&r.base, "a").await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    // A deployed client behind a proxy: its Host and Origin are the public name's.
    let ok = post(
        &r.base,
        &a,
        None,
        &[("host", "agents.example.com"), ("origin", "https://agents.example.com")],
        init.clone(),
    )
    .await;
    assert_eq!(ok.status(), 200);
    let sid = ok.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let evil = post(&r.base, &a, None, &[("origin", "https://evil.example.com")], init.clone()).await;
    assert_eq!(evil.status(), 403);
    // No key: 401 with a challenge, as at the REST door.
    let anon = reqwest::Client::new().post(format!("{}/mcp", r.base)).json(&init).send().await.unwrap();
    assert_eq!(anon.status(), 401);
    assert!(anon.headers().contains_key("www-authenticate"));
    // Versions and sessions.
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
    assert_eq!(
        post(&r.base, &a, Some(&sid), &[("mcp-protocol-version", "1999-01-01")], ping.clone()).await.status(),
        400
    );
    assert_eq!(post(&r.base, &a, None, &[], ping.clone()).await.status(), 400, "no session");
    assert_eq!(post(&r.base, &a, Some("nosuch"), &[], ping.clone()).await.status(), 404);
    let b = key(&r.base, "b").await;
    assert_eq!(post(&r.base, &b, Some(&sid), &[], ping.clone()).await.status(), 404, "another tenant's session");
    let pong: Value = post(&r.base, &a, Some(&sid), &[], ping).await.json().await.unwrap();
    assert_eq!(pong["result"], json!({}));
    // Bad envelopes: the JSON-RPC errors the spec names, never a 500, nothing started.
    for (body, status, code) in [
        ("{not json", 400, -32700),
        (r#"[{"jsonrpc":"2.0","id":3,"method":"ping"}]"#, 400, -32600),
        (r#"{"jsonrpc":"2.0","id":3,"method":"no/such"}"#, 200, -32601),
        (r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"nosuch"}}"#, 200, -32602),
    ] {
        let resp = reqwest::Client::new()
            .post(format!("{}/mcp", r.base))
            .bearer_auth(&a)
            .header("mcp-session-id", &sid)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{body}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{body}: {v}");
    }
    let big = "x".repeat(2 * 1024 * 1024);
    let resp =
        post(&r.base, &a, Some(&sid), &[], json!({"jsonrpc": "2.0", "id": 4, "method": "ping", "params": {"x": big}}))
            .await;
    assert_eq!(resp.status(), 413);
    // The same request id again in the session: the same task, not a second one.
    let call = json!({"jsonrpc": "2.0", "id": "retry-me", "method": "tools/call", "params": {"name": "task",
        "arguments": {"subagent_type": "general", "description": "once", "prompt": "p [mock:reply=once]"}}});
    let first: Value = post(&r.base, &a, Some(&sid), &[], call.clone()).await.json().await.unwrap();
    let again: Value = post(&r.base, &a, Some(&sid), &[], call).await.json().await.unwrap();
    let id = first["result"]["structuredContent"]["task_id"].clone();
    assert_eq!(again["result"]["structuredContent"]["task_id"], id);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(n, 1);
    // notifications/cancelled reaches the request's task.
    let slow = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "task", "task": {"ttl": 60000},
        "arguments": {"subagent_type": "general", "description": "slow", "prompt": "p [mock:delay_ms=30000]"}}});
    let created: Value = post(&r.base, &a, Some(&sid), &[], slow).await.json().await.unwrap();
    let task_id = created["result"]["task"]["taskId"].as_str().unwrap().to_string();
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}});
    assert_eq!(post(&r.base, &a, Some(&sid), &[], cancel).await.status(), 202);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let s: String = scalar(&db, "SELECT status FROM tasks WHERE id = $1", &task_id).await;
        if s == "cancelled" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the cancelled request's task is {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Ending the session.
    let end = reqwest::Client::new().delete(format!("{}/mcp", r.base)).bearer_auth(&a).header("mcp-session-id", &sid);
    assert_eq!(end.send().await.unwrap().status(), 204);
}

/// A session of the MCP door in raw JSON-RPC (what the tests send by hand), with the Host and
/// Origin a deployed client sends: initialized when opened.
pub struct RawMcp<'a> {
    app: &'a TestApp,
    host: String,
    sid: String,
}

impl<'a> RawMcp<'a> {
    pub async fn open(app: &'a TestApp) -> RawMcp<'a> {
        let host = app.base.trim_start_matches("http://").to_string();
        let mut s = RawMcp { app, host, sid: String::new() };
        let r = s
            .call(1, "initialize", json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}))
            .await;
        assert_eq!(r.status(), 200);
        s.sid = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
        s
    }

    /// `method` with `params`, as request `id` of this session.
    pub async fn call(&self, id: u64, method: &str, params: Value) -> reqwest::Response {
        let mut r = self
            .app
            .client
            .post(self.app.url("/mcp"))
            .header("accept", "application/json, text/event-stream")
            .header("host", &self.host)
            .header("origin", &self.app.base)
            .header("mcp-protocol-version", "2025-11-25");
        if !self.sid.is_empty() {
            r = r.header("mcp-session-id", &self.sid);
        }
        r.json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).send().await.unwrap()
    }

    /// The `task` tool called with `args`.
    pub async fn task(&self, id: u64, args: Value) -> reqwest::Response {
        self.call(id, "tools/call", json!({"name": "task", "arguments": args})).await
    }
}
