//! Tools end to end: real HTTP tool servers and a real MCP server (rmcp's server side).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::fakes::serve_router;
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
    let base = serve_router(app).await;
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

pub(crate) async fn finished(app: &TestApp, body: Value) -> Value {
    let r = app.client.post(app.url("/tasks?wait=true&timeout=30")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

pub(crate) async fn tool_results(app: &TestApp, id: &str) -> Vec<Value> {
    tool_results_in(&app.db.pool, id).await
}

/// The tool results of task `id`, from the database in `pool`.
pub(crate) async fn tool_results_in(pool: &sqlx::PgPool, id: &str) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT message FROM task_message_log WHERE task_id = $1::uuid AND message->>'role' = 'tool' ORDER BY seq",
    )
    .bind(id)
    .fetch_all(pool)
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
    use std::sync::{Arc, Mutex};

    use rmcp::handler::server::router::tool::ToolRouter;
    use rmcp::handler::server::wrapper::Parameters;
    use rmcp::model::{ServerCapabilities, ServerConfig};
    use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler};

    #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
    pub struct Query {
        pub topic: String,
    }

    /// What the server saw: each HTTP request's headers and body, and where `spawn` posts.
    #[derive(Debug, Default)]
    pub struct Seen {
        pub requests: Mutex<Vec<(axum::http::HeaderMap, String)>>,
        pub app_base: Mutex<String>,
    }

    #[derive(Debug, Clone)]
    pub struct Docs {
        tool_router: ToolRouter<Self>,
        seen: Arc<Seen>,
    }

    #[tool_router]
    impl Docs {
        pub fn new(seen: Arc<Seen>) -> Self {
            Docs { tool_router: Self::tool_router(), seen }
        }

        /// Calls back into subagentd's `POST /tasks`, forwarding the depth header its own
        /// request came with (as a well-behaved tool server does).
        #[tool(description = "Start a sub-task")]
        async fn spawn(&self, Parameters(Query { topic }): Parameters<Query>) -> String {
            let depth = self.seen.requests.lock().unwrap().last().and_then(|(h, _)| h.get("subagent-depth").cloned());
            let base = self.seen.app_base.lock().unwrap().clone();
            let mut r = reqwest::Client::new()
                .post(format!("{base}/tasks"))
                .json(&serde_json::json!({"prompt": topic, "model": "mock/m"}));
            if let Some(d) = depth {
                r = r.header("subagent-depth", d.to_str().unwrap().to_string());
            }
            let r = r.send().await.unwrap();
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap();
            format!("POST /tasks answered {status} {}", body["code"])
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

/// A real MCP server (rmcp's server side) with `lookup` (read-only), `edit` and `spawn`; its URL.
pub(crate) async fn mcp_server() -> String {
    mcp_server_seeing().await.0
}

/// The same, with what it sees.
async fn mcp_server_seeing() -> (String, std::sync::Arc<mcp_server::Seen>) {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::StreamableHttpService;
    let seen = std::sync::Arc::new(mcp_server::Seen::default());
    let s = seen.clone();
    let service: StreamableHttpService<mcp_server::Docs, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(mcp_server::Docs::new(s.clone())),
        Default::default(),
        Default::default(),
    );
    let s = seen.clone();
    let record = axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
        let s = s.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
            s.requests.lock().unwrap().push((parts.headers.clone(), String::from_utf8_lossy(&bytes).into_owned()));
            next.run(axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes))).await
        }
    });
    let router = Router::new().nest_service("/mcp", service).layer(record);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", l.local_addr().unwrap());
    let l = axum::serve::ListenerExt::tap_io(l, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(l, router).await.unwrap() });
    (url, seen)
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

#[tokio::test]
async fn mcp_calls_carry_depth_trace_and_idempotency_reuse_one_session_and_cannot_recurse() {
    let (url, seen) = mcp_server_seeing().await;
    let app = app_allowing_loopback(|_| {}).await;
    *seen.app_base.lock().unwrap() = app.base.clone();
    let r = app.client.put(app.url("/tool-sources/docs")).json(&json!({"url": url})).send().await.unwrap();
    assert_eq!(r.status(), 201);
    seen.requests.lock().unwrap().clear();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r = app
        .client
        .post(app.url("/tasks?wait=true&timeout=30"))
        .header("traceparent", tp)
        .json(&json!({"prompt": r#"[mock:tool_turns=2] [mock:tool=docs__spawn] [mock:args={"topic":"nested"}]"#, "model": "mock/m"}))
        .send()
        .await
        .unwrap();
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["status"], "completed", "{t}");
    let results = tool_results(&app, t["id"].as_str().unwrap()).await;
    assert_eq!(results.len(), 2);
    for r in &results {
        assert_eq!(r["content"], "POST /tasks answered 422 \"recursion_refused\"", "one level deep through MCP: {r}");
    }
    assert_eq!(app.task_count().await, 1, "no nested task was created");
    let requests = seen.requests.lock().unwrap().clone();
    assert!(requests.iter().all(|(h, _)| h["subagent-depth"] == "1"), "every request of the session carries the depth");
    let bodies: Vec<Value> = requests.iter().filter_map(|(_, b)| serde_json::from_str(b).ok()).collect();
    let method = |m: &str| bodies.iter().filter(|b| b["method"] == m).count();
    assert_eq!(method("initialize"), 1, "one session for both calls: {bodies:?}");
    assert_eq!(method("tools/call"), 2);
    for (i, call) in bodies.iter().filter(|b| b["method"] == "tools/call").enumerate() {
        let meta = &call["params"]["_meta"];
        assert_eq!(meta["idempotencyKey"], format!("{}:call_{}_1", t["id"].as_str().unwrap(), i + 1), "{call}");
        let child = meta["traceparent"].as_str().unwrap();
        assert!(child.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "the task's trace: {child}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_source_that_cannot_be_reached_is_one_plain_sentence_to_the_model_and_its_last_error() {
    let (url, _seen) = mcp_server_seeing().await;
    let app = app_allowing_loopback(|_| {}).await;
    let r = app.client.put(app.url("/tool-sources/docs")).json(&json!({"url": url})).send().await.unwrap();
    assert_eq!(r.status(), 201);
    // The server goes away: point the source at a port nobody listens on, keeping its tools.
    let dead = format!(
        "http://127.0.0.1:{}/mcp",
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    );
    sqlx::query("UPDATE tool_sources SET url = $1, tools = replace(tools::text, $2, $1)::jsonb")
        .bind(&dead)
        .bind(&url)
        .execute(&app.db.pool)
        .await
        .unwrap();
    let t = finished(
        &app,
        json!({"prompt": r#"[mock:tool_turns=1] [mock:tool=docs__lookup] [mock:args={"topic":"x"}]"#, "model": "mock/m", "subagent_type": "research"}),
    )
    .await;
    assert_eq!(t["status"], "completed", "the run goes on");
    let r = tool_results(&app, t["id"].as_str().unwrap()).await;
    let said = r[0]["content"].as_str().unwrap();
    assert_eq!(
        said,
        "The tool `docs__lookup` could not be run: its tool server could not be reached. You may try it again later, or go on without it."
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let src = loop {
        let src: Value = app.client.get(app.url("/tool-sources/docs")).send().await.unwrap().json().await.unwrap();
        if !src["last_error"].is_null() {
            break src;
        }
        assert!(tokio::time::Instant::now() < deadline, "last_error not set by the failed call: {src}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let e = src["last_error"].as_str().unwrap();
    assert!(e.starts_with("tools/call at ") && e.contains("MCP handshake"), "the full chain is kept: {e}");
    app.stop().await;
}

#[tokio::test]
async fn discovered_names_providers_would_refuse_are_left_out_and_named_not_shortened() {
    let url = mcp_server().await;
    let app = app_allowing_loopback(|_| {}).await;
    // 57 + 2 + len(tool): `lookup` makes 65 characters (too long), `edit` 63 and `spawn` 64.
    let source = "s".repeat(57);
    let r =
        app.client.put(app.url(&format!("/tool-sources/{source}"))).json(&json!({"url": url})).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let src: Value = r.json().await.unwrap();
    let mut names: Vec<&str> = src["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, [format!("{source}__edit"), format!("{source}__spawn")]);
    let e = src["last_error"].as_str().unwrap();
    assert!(e.contains(&format!("{source}__lookup")) && e.contains("64"), "{e}");
    let refreshed: Value = app
        .client
        .post(app.url(&format!("/tool-sources/{source}/refresh")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(refreshed["last_error"], src["last_error"], "a refresh says it again");
    assert_eq!(refreshed["tools"].as_array().unwrap().len(), 2);
    app.stop().await;
}

/// Calls per second to a local MCP server through the tool runner (sequential, and 8 at once).
/// A measurement for BENCHMARKS.md, not an assertion: `cargo test --release --test api
/// mcp_calls_per_second -- --ignored --nocapture`.
#[tokio::test]
#[ignore]
async fn mcp_calls_per_second() {
    use subagentd::engine::ToolRunner;
    use subagentd::tools::{Caller, Policy, Target, TaskTools, ToolDef};
    let url = mcp_server().await;
    let mut cfg = test_config("postgres://unused");
    cfg.tool_allow = "*, 127.0.0.1/32".into();
    let tools = std::sync::Arc::new(TaskTools {
        caller: Caller::from_config(&cfg).unwrap(),
        defs: vec![ToolDef {
            name: "docs__lookup".into(),
            description: String::new(),
            parameters: json!({"type": "object"}).into(),
            policy: Policy::Auto,
            target: Target::Mcp { source: "docs".into(), url, tool: "lookup".into(), timeout_ms: 10_000 },
        }],
        task_id: uuid::Uuid::now_v7(),
        tenant_secret: None,
        traceparent: None,
        mcp_headers: Default::default(),
        on_source_error: None,
        web: None,
        workspace: None,
        environment: None,
    });
    let call = |i: usize| subagentd::llm::ToolCall {
        id: format!("c{i}"),
        name: "docs__lookup".into(),
        arguments: json!({"topic": format!("t{i}")}),
    };
    assert!(!tools.run(&call(0)).await.is_error);
    let n = 300;
    let t0 = std::time::Instant::now();
    for i in 0..n {
        assert!(!tools.run(&call(i)).await.is_error);
    }
    let seq = n as f64 / t0.elapsed().as_secs_f64();
    let t0 = std::time::Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..8 {
        let tools = tools.clone();
        set.spawn(async move {
            for i in 0..n / 8 {
                assert!(!tools.run(&call(w * 1000 + i)).await.is_error);
            }
        });
    }
    while set.join_next().await.is_some() {}
    let par = (n / 8 * 8) as f64 / t0.elapsed().as_secs_f64();
    println!("MCP calls/s: sequential {seq:.0}, 8 at once {par:.0}");
}
