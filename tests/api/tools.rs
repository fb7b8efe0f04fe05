//! Tools end to end: real HTTP tool servers and a real MCP server (rmcp's server side).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::helpers::*;

#[derive(Clone, Default)]
struct ToolServer {
    calls: Arc<Mutex<Vec<(HeaderMap, String)>>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    /// Where `callback` posts a task (the subagentd under test).
    app_base: Arc<Mutex<String>>,
}

async fn record(s: &ToolServer, h: HeaderMap, body: &str) -> Value {
    s.calls.lock().unwrap().push((h, body.to_string()));
    serde_json::from_str(body).unwrap()
}

async fn echo(State(s): State<ToolServer>, h: HeaderMap, body: String) -> Json<Value> {
    let v = record(&s, h, &body).await;
    Json(json!({"content": format!("echo {}", v["arguments"])}))
}

async fn slow(State(s): State<ToolServer>, h: HeaderMap, body: String) -> Json<Value> {
    let v = record(&s, h, &body).await;
    let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    s.max_in_flight.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    s.in_flight.fetch_sub(1, Ordering::SeqCst);
    Json(json!({"content": {"call": v["tool_call_id"]}}))
}

async fn sleepy(State(s): State<ToolServer>, h: HeaderMap, body: String) -> Json<Value> {
    record(&s, h, &body).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    Json(json!({"content": "late"}))
}

async fn fail(State(s): State<ToolServer>, h: HeaderMap, body: String) -> (axum::http::StatusCode, &'static str) {
    record(&s, h, &body).await;
    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "database on fire")
}

async fn garbage(State(s): State<ToolServer>, h: HeaderMap, body: String) -> &'static str {
    record(&s, h, &body).await;
    "this is not json"
}

async fn refuse(State(s): State<ToolServer>, h: HeaderMap, body: String) -> Json<Value> {
    record(&s, h, &body).await;
    Json(json!({"error": "no such customer"}))
}

async fn big(State(s): State<ToolServer>, h: HeaderMap, body: String) -> Json<Value> {
    record(&s, h, &body).await;
    Json(json!({"content": "x".repeat(5000)}))
}

/// A tool that calls back into subagentd, forwarding the depth header it was given.
async fn callback(State(s): State<ToolServer>, h: HeaderMap, body: String) -> Json<Value> {
    let depth = h.get("subagent-depth").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    record(&s, h, &body).await;
    let base = s.app_base.lock().unwrap().clone();
    let r = reqwest::Client::new()
        .post(format!("{base}/tasks"))
        .header("Subagent-Depth", depth)
        .json(&json!({"prompt": "nested", "model": "mock/m"}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    Json(json!({"content": format!("nested POST /tasks answered {status} {}", body["code"])}))
}

async fn tool_server() -> (ToolServer, String) {
    let s = ToolServer::default();
    let app = Router::new()
        .route("/echo", post(echo))
        .route("/slow", post(slow))
        .route("/sleepy", post(sleepy))
        .route("/fail", post(fail))
        .route("/garbage", post(garbage))
        .route("/refuse", post(refuse))
        .route("/big", post(big))
        .route("/callback", post(callback))
        .with_state(s.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (s, base)
}

/// An app whose allow-list admits loopback (the tool servers live there).
async fn app_allowing_loopback(tweak: impl FnOnce(&mut subagentd::config::Config)) -> TestApp {
    spawn_app_with(
        |c| {
            c.tool_allow = "*, 127.0.0.1/32".into();
            tweak(c)
        },
        true,
    )
    .await
}

async fn put_tool(app: &TestApp, name: &str, body: Value) -> reqwest::Response {
    app.client.put(app.url(&format!("/tools/{name}"))).json(&body).send().await.unwrap()
}

fn object_schema() -> Value {
    json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]})
}

async fn finished(app: &TestApp, body: Value) -> Value {
    let r = app.client.post(app.url("/tasks?wait=true&timeout=30")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

async fn tool_results(app: &TestApp, id: &str) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT message FROM task_messages WHERE task_id = $1::uuid AND message->>'role' = 'tool' ORDER BY seq",
    )
    .bind(id)
    .fetch_all(&app.db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_research_agent_never_sees_or_runs_a_propose_tool() {
    let (srv, base) = tool_server().await;
    let app = app_allowing_loopback(|_| {}).await;
    assert_eq!(
        put_tool(
            &app,
            "lookup",
            json!({"parameters": object_schema(), "policy": "auto", "endpoint": format!("{base}/echo")})
        )
        .await
        .status(),
        201
    );
    assert_eq!(
        put_tool(
            &app,
            "delete_all",
            json!({"parameters": {"type": "object"}, "policy": "propose", "endpoint": format!("{base}/echo")})
        )
        .await
        .status(),
        201
    );

    let t = finished(&app, json!({"prompt": "[mock:tool_turns=1] [mock:tool=delete_all] [mock:args={}]", "model": "mock/m", "subagent_type": "research"})).await;
    assert_eq!(t["tools"], json!(["lookup"]));
    assert_eq!(t["status"], "completed");
    assert!(srv.calls.lock().unwrap().is_empty(), "the propose tool was never called");
    let results = tool_results(&app, t["id"].as_str().unwrap()).await;
    assert_eq!(results[0]["is_error"], true);
    assert!(results[0]["content"].as_str().unwrap().contains("not available"));

    let g = finished(&app, json!({"prompt": "x", "model": "mock/m", "subagent_type": "general"})).await;
    assert_eq!(g["tools"], json!(["delete_all", "lookup"]));
    let narrowed = finished(&app, json!({"prompt": "x", "model": "mock/m", "allowed_tools": ["lookup"]})).await;
    assert_eq!(narrowed["tools"], json!(["lookup"]));
    app.stop().await;
}

#[tokio::test]
async fn an_http_tool_call_is_signed_and_carries_depth_and_idempotency_headers() {
    let (srv, base) = tool_server().await;
    let app = app_allowing_loopback(|_| {}).await;
    let secret: Value = app.client.post(app.url("/signing-secret")).send().await.unwrap().json().await.unwrap();
    let secret = secret["secret"].as_str().unwrap().to_string();
    put_tool(&app, "lookup", json!({"description": "Looks up", "parameters": object_schema(), "policy": "auto", "endpoint": format!("{base}/echo")})).await;
    let t =
        finished(&app, json!({"prompt": r#"[mock:tool_turns=1] [mock:args={"q":"moons"}]"#, "model": "mock/m"})).await;
    assert_eq!(t["status"], "completed");
    let calls = srv.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1);
    let (h, body) = &calls[0];
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["task_id"], t["id"]);
    assert_eq!(v["name"], "lookup");
    assert_eq!(v["arguments"], json!({"q": "moons"}));
    assert_eq!(h["subagent-depth"], "1");
    assert_eq!(
        h["idempotency-key"].to_str().unwrap(),
        format!("{}:{}", t["id"].as_str().unwrap(), v["tool_call_id"].as_str().unwrap())
    );
    // Verify as a tool server would: HMAC-SHA256(secret, "<timestamp>.<body>").
    let ts = h["subagent-timestamp"].to_str().unwrap();
    let expected = subagentd::tools::http::signature(&secret, ts.parse().unwrap(), body.as_bytes());
    assert_eq!(h["subagent-signature"].to_str().unwrap(), expected);
    let results = tool_results(&app, t["id"].as_str().unwrap()).await;
    assert_eq!(results[0]["content"], r#"echo {"q":"moons"}"#);
    // The secret is never shown again.
    let tools: Value = app.client.get(app.url("/tools")).send().await.unwrap().json().await.unwrap();
    assert!(!tools.to_string().contains(&secret));
    app.stop().await;
}

#[tokio::test]
async fn schema_violations_timeouts_errors_and_bad_json_become_tool_errors_and_the_run_goes_on() {
    let (srv, base) = tool_server().await;
    let app = app_allowing_loopback(|_| {}).await;
    put_tool(
        &app,
        "strict",
        json!({"parameters": object_schema(), "policy": "auto", "endpoint": format!("{base}/echo")}),
    )
    .await;
    put_tool(&app, "sleepy", json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": format!("{base}/sleepy"), "timeout_ms": 200})).await;
    put_tool(
        &app,
        "fail",
        json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": format!("{base}/fail")}),
    )
    .await;
    put_tool(
        &app,
        "garbage",
        json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": format!("{base}/garbage")}),
    )
    .await;
    put_tool(
        &app,
        "refuse",
        json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": format!("{base}/refuse")}),
    )
    .await;
    let cases = [
        ("strict", r#"{"q":5}"#, "/q"),
        ("sleepy", "{}", "timed out after 200 ms"),
        ("fail", "{}", "HTTP 500: database on fire"),
        ("garbage", "{}", "invalid JSON"),
        ("refuse", "{}", "reported an error: no such customer"),
    ];
    for (tool, args, expect) in cases {
        let t = finished(&app, json!({"prompt": format!("[mock:tool_turns=1] [mock:tool={tool}] [mock:args={args}] [mock:reply=ok]"), "model": "mock/m"})).await;
        assert_eq!(t["status"], "completed", "{tool}: the run goes on");
        let r = tool_results(&app, t["id"].as_str().unwrap()).await;
        assert_eq!(r[0]["is_error"], true, "{tool}");
        assert!(r[0]["content"].as_str().unwrap().contains(expect), "{tool}: {}", r[0]["content"]);
    }
    // The schema violation never reached the server.
    assert!(!srv.calls.lock().unwrap().iter().any(|(_, b)| b.contains("\"strict\"")));
    app.stop().await;
}

#[tokio::test]
async fn oversized_results_are_truncated_with_a_marker() {
    let (_srv, base) = tool_server().await;
    let app = app_allowing_loopback(|c| c.tool_result_max_bytes = 1000).await;
    put_tool(
        &app,
        "big",
        json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": format!("{base}/big")}),
    )
    .await;
    let t = finished(&app, json!({"prompt": "[mock:tool_turns=1] [mock:args={}]", "model": "mock/m"})).await;
    let r = tool_results(&app, t["id"].as_str().unwrap()).await;
    let c = r[0]["content"].as_str().unwrap();
    assert!(c.starts_with(&"x".repeat(1000)));
    assert!(c.ends_with("…[truncated: 4000 more bytes]"), "{}", &c[c.len() - 40..]);
    app.stop().await;
}

#[tokio::test]
async fn several_calls_in_one_turn_run_concurrently_and_keep_the_models_order() {
    let (srv, base) = tool_server().await;
    let app = app_allowing_loopback(|_| {}).await;
    put_tool(
        &app,
        "slow",
        json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": format!("{base}/slow")}),
    )
    .await;
    let t = finished(&app, json!({"prompt": "[mock:tool_turns=1] [mock:parallel=3]", "model": "mock/m"})).await;
    assert_eq!(srv.max_in_flight.load(Ordering::SeqCst), 3);
    let r = tool_results(&app, t["id"].as_str().unwrap()).await;
    let ids: Vec<&str> = r.iter().map(|m| m["tool_call_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["call_1_1", "call_1_2", "call_1_3"]);
    for m in &r {
        assert_eq!(m["content"], json!({"call": m["tool_call_id"]}).to_string());
    }
    app.stop().await;
}

#[tokio::test]
async fn a_tool_that_calls_back_into_post_tasks_is_refused_as_recursion() {
    let (srv, base) = tool_server().await;
    let app = app_allowing_loopback(|_| {}).await;
    *srv.app_base.lock().unwrap() = app.base.clone();
    put_tool(
        &app,
        "spawn",
        json!({"parameters": {"type": "object"}, "policy": "propose", "endpoint": format!("{base}/callback")}),
    )
    .await;
    let t = finished(&app, json!({"prompt": "[mock:tool_turns=1] [mock:args={}]", "model": "mock/m"})).await;
    let r = tool_results(&app, t["id"].as_str().unwrap()).await;
    assert_eq!(r[0]["content"], "nested POST /tasks answered 422 \"recursion_refused\"");
    assert_eq!(app.task_count().await, 1, "no nested task was created");
    app.stop().await;
}

#[tokio::test]
async fn the_allow_list_blocks_loopback_unless_configured() {
    let app = spawn_app_with(|_| {}, false).await; // default allow-list: "*"
    let r = put_tool(
        &app,
        "local",
        json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": "http://127.0.0.1:9/x"}),
    )
    .await;
    let p = assert_problem(r, 422, "validation_failed").await;
    assert_eq!(p["errors"][0]["field"], "endpoint");
    let r = put_tool(
        &app,
        "meta",
        json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": "http://169.254.169.254/latest"}),
    )
    .await;
    assert_problem(r, 422, "validation_failed").await;
    let r = app
        .post_task(json!({"prompt": "x", "model": "mock/m", "tools": [{"name": "t", "parameters": {"type": "object"}, "policy": "auto", "endpoint": "http://[::1]:9/"}]}))
        .await;
    let p = assert_problem(r, 422, "validation_failed").await;
    assert_eq!(p["errors"][0]["field"], "tools[0].endpoint");
    let r = app
        .client
        .put(app.url("/tool-sources/docs"))
        .json(&json!({"url": "http://127.0.0.1:9/mcp"}))
        .send()
        .await
        .unwrap();
    assert_problem(r, 422, "validation_failed").await;
    assert_eq!(app.task_count().await, 0);
    app.stop().await;
}

#[tokio::test]
async fn a_name_resolving_to_loopback_is_refused_at_call_time() {
    // `localhost` passes the `*` host check but resolves to 127.0.0.1, which is not allowed.
    let (srv, base) = tool_server().await;
    let port = base.rsplit(':').next().unwrap();
    let app = spawn_app_with(|_| {}, true).await;
    let r = app
        .post_task(json!({"prompt": "[mock:tool_turns=1] [mock:args={}]", "model": "mock/m",
                          "tools": [{"name": "t", "parameters": {"type": "object"}, "policy": "auto", "endpoint": format!("http://localhost:{port}/echo")}]}))
        .await;
    assert_eq!(r.status(), 201);
    let t: Value = r.json().await.unwrap();
    let done = app
        .client
        .get(app.url(&format!("/tasks/{}?wait=true&timeout=20", t["id"].as_str().unwrap())))
        .send()
        .await
        .unwrap();
    let done: Value = done.json().await.unwrap();
    let res = tool_results(&app, done["id"].as_str().unwrap()).await;
    assert!(res[0]["content"].as_str().unwrap().contains("could not be reached"), "{}", res[0]["content"]);
    assert!(srv.calls.lock().unwrap().is_empty());
    app.stop().await;
}

#[tokio::test]
async fn bad_tool_definitions_are_refused_naming_the_field() {
    let app = spawn_app_with(|c| c.tool_allow = "*, 127.0.0.1/32".into(), false).await;
    let ep = "http://127.0.0.1:9/x";
    let cases = [
        ("bad.name", json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": ep}), "name"),
        ("t", json!({"parameters": {"type": "string"}, "policy": "auto", "endpoint": ep}), "parameters"),
        (
            "t",
            json!({"parameters": {"type": "object", "properties": {"a": {"type": 7}}}, "policy": "auto", "endpoint": ep}),
            "parameters",
        ),
        ("t", json!({"parameters": {"type": "object"}, "policy": "sometimes", "endpoint": ep}), "policy"),
        ("t", json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": "ftp://x/"}), "endpoint"),
        (
            "t",
            json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": ep, "timeout_ms": 0}),
            "timeout_ms",
        ),
        ("t", json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": ep, "colour": 1}), "colour"),
    ];
    for (name, body, field) in cases {
        let r = put_tool(&app, name, body.clone()).await;
        let p = assert_problem(r, 422, "validation_failed").await;
        assert_eq!(p["errors"][0]["field"], field, "{body}: {p}");
    }
    let r = app.post_task(json!({"prompt": "x", "model": "mock/m", "allowed_tools": ["nope"]})).await;
    assert_eq!(assert_problem(r, 422, "validation_failed").await["errors"][0]["field"], "allowed_tools");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tools").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(n, 0);
    assert_problem(app.client.get(app.url("/tools/t")).send().await.unwrap(), 404, "not_found").await;
    app.stop().await;
}

mod mcp_server {
    use rmcp::handler::server::router::tool::ToolRouter;
    use rmcp::handler::server::wrapper::Parameters;
    use rmcp::model::{ServerCapabilities, ServerConfig};
    use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler};

    #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
    pub struct Query {
        pub topic: String,
    }

    #[derive(Debug, Clone)]
    pub struct Docs {
        tool_router: ToolRouter<Self>,
    }

    #[tool_router]
    impl Docs {
        pub fn new() -> Self {
            Docs { tool_router: Self::tool_router() }
        }

        #[tool(description = "Look up a documentation page", annotations(read_only_hint = true))]
        fn lookup(&self, Parameters(Query { topic }): Parameters<Query>) -> String {
            format!("the page about {topic}")
        }

        #[tool(description = "Edit a documentation page")]
        fn edit(&self, Parameters(Query { topic }): Parameters<Query>) -> String {
            format!("edited {topic}")
        }
    }

    #[tool_handler(router = self.tool_router)]
    impl ServerHandler for Docs {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }
    }
}

/// A real MCP server (rmcp's server side) with `lookup` (read-only) and `edit`; its URL.
pub(crate) async fn mcp_server() -> String {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::StreamableHttpService;
    let service: StreamableHttpService<mcp_server::Docs, LocalSessionManager> =
        StreamableHttpService::new(|| Ok(mcp_server::Docs::new()), Default::default(), Default::default());
    let router = Router::new().nest_service("/mcp", service);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, router).await.unwrap() });
    url
}

#[tokio::test]
async fn an_mcp_server_is_a_tool_source_with_policies_from_read_only_hints() {
    let url = mcp_server().await;
    let app = app_allowing_loopback(|_| {}).await;
    let r = app
        .client
        .put(app.url("/tool-sources/docs"))
        .json(&json!({"url": url, "headers": {"Authorization": "Bearer mcp-secret-token"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let src: Value = r.json().await.unwrap();
    assert_eq!(src["last_error"], Value::Null, "{src}");
    assert_eq!(src["headers"], json!(["Authorization"]));
    assert!(!src.to_string().contains("mcp-secret-token"), "header values are secret");
    let policies: Vec<(String, String)> = src["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().to_string(), t["policy"].as_str().unwrap().to_string()))
        .collect();
    assert!(policies.contains(&("docs__lookup".into(), "auto".into())), "{policies:?}");
    assert!(policies.contains(&("docs__edit".into(), "propose".into())), "{policies:?}");

    let t = finished(&app, json!({"prompt": r#"[mock:tool_turns=1] [mock:tool=docs__lookup] [mock:args={"topic":"leases"}]"#, "model": "mock/m", "subagent_type": "research"})).await;
    assert_eq!(t["tools"], json!(["docs__lookup"]));
    let r = tool_results(&app, t["id"].as_str().unwrap()).await;
    assert_eq!(r[0]["content"], "the page about leases", "{}", r[0]);
    assert_eq!(r[0].get("is_error"), None);

    let refreshed = app.client.post(app.url("/tool-sources/docs/refresh")).send().await.unwrap();
    assert_eq!(refreshed.status(), 200);
    assert_eq!(app.client.delete(app.url("/tool-sources/docs")).send().await.unwrap().status(), 204);
    let tools: Value = app.client.get(app.url("/tools")).send().await.unwrap().json().await.unwrap();
    assert_eq!(tools["tools"], json!([]));
    app.stop().await;
}
