//! The real provider adapters against fake OpenAI and Anthropic servers, end to end.

use std::time::Duration;

use serde_json::{json, Value};
use subagentd::config::FileConfig;
use subagentd::llm::Providers;

use crate::fakes::*;
use crate::helpers::*;

/// Providers `oai` (OpenAI-compatible) and `ant` (Anthropic) pointing at the fakes.
pub(crate) fn providers(oai: &str, ant: &str, extra: &str) -> Providers {
    let file: FileConfig = toml::from_str(&format!(
        r#"
        [providers.oai]
        kind = "openai"
        base_url = "{oai}/v1"
        api_key_env = "FAKE_OAI_KEY"
        timeout_seconds = 1
        shipped_prices = true
        [providers.ant]
        kind = "anthropic"
        base_url = "{ant}"
        api_key_env = "FAKE_ANT_KEY"
        shipped_prices = true
        # These tests pin the plain wire format; tests/api/caching.rs pins the cached one.
        prompt_caching = false
        [retry]
        max_attempts = 3
        base_ms = 5
        cap_ms = 20
        deadline_seconds = 20
        {extra}
        "#
    ))
    .unwrap();
    Providers::from_config(&file, &|v| match v {
        "FAKE_OAI_KEY" => Some("sk-oai-test".into()),
        "FAKE_ANT_KEY" => Some("sk-ant-test".into()),
        _ => None,
    })
    .unwrap()
}

struct Setup {
    app: TestApp,
    oai: Fake,
    ant: Fake,
}

async fn setup() -> Setup {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let (ant, ant_url) = serve("/v1/messages").await;
    let app =
        spawn_app_opts(|_| {}, AppOptions { providers: providers(&oai_url, &ant_url, ""), ..AppOptions::default() })
            .await;
    Setup { app, oai, ant }
}

async fn run(app: &TestApp, body: Value) -> Value {
    let r = app.client.post(app.url("/tasks?wait=true&timeout=30")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200, "task did not finish");
    r.json().await.unwrap()
}

async fn ledger(app: &TestApp, id: &str) -> Vec<(String, Option<i32>, i64, i64, i64, i32)> {
    sqlx::query_as(
        "SELECT outcome, http_status, input_tokens, output_tokens, cached_tokens, try FROM llm_calls
         WHERE task_id = $1::uuid ORDER BY id",
    )
    .bind(id)
    .fetch_all(&app.db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn openai_tool_call_round_trip_with_usage_and_cost() {
    let s = setup().await;
    s.oai.push(Answer::json(openai_tool_call("call_9", "lookup", r#"{"q":"moons"}"#)));
    s.oai.push(Answer::json(openai_text("Jupiter has 95 moons.", 120, 8, 100)));
    let t = run(&s.app, json!({"prompt": "How many moons?", "model": "oai/gpt-4o"})).await;
    assert_eq!(t["status"], "completed");
    assert_eq!(t["summary"], "Jupiter has 95 moons.");
    assert_eq!(
        t["usage"],
        json!({"input_tokens": 170, "output_tokens": 18, "cached_tokens": 100, "total_tokens": 188})
    );
    // gpt-4o: 70 uncached at $2.5/M + 100 cached at $1.25/M + 18 output at $10/M.
    assert_eq!(t["cost_usd"], json!(0.00048));
    assert_eq!(t["cost_complete"], true);

    let seen = s.oai.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].headers["authorization"], "Bearer sk-oai-test");
    assert_eq!(seen[0].body["model"], "gpt-4o");
    let first: Vec<&str> =
        seen[0].body["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(first, ["system", "user"]);
    let m = &seen[1].body["messages"];
    assert_eq!(m[2]["tool_calls"][0]["id"], "call_9");
    assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], r#"{"q":"moons"}"#);
    assert_eq!(m[3]["role"], "tool");
    assert_eq!(m[3]["tool_call_id"], "call_9");
    assert!(m[3]["content"].as_str().unwrap().contains("not available"), "unoffered tool refused: {}", m[3]);
    let rows = ledger(&s.app, t["id"].as_str().unwrap()).await;
    assert_eq!(rows, [("ok".into(), Some(200), 50, 10, 0, 1), ("ok".into(), Some(200), 120, 8, 100, 1)]);
    s.app.stop().await;
}

#[tokio::test]
async fn anthropic_tool_use_round_trip_with_cache_usage() {
    let s = setup().await;
    s.ant.push(Answer::json(anthropic_tool_use("toolu_1", "search", json!({"q": "x"}))));
    s.ant.push(Answer::json(anthropic_text("Found it.", 30, 5, 200)));
    let t = run(
        &s.app,
        json!({"prompt": "Find x", "model": "ant/claude-sonnet-4-5", "parent_context": "We are in repo y."}),
    )
    .await;
    assert_eq!(t["status"], "completed");
    assert_eq!(t["summary"], "Found it.");
    assert_eq!(t["usage"]["input_tokens"], 40 + 230);
    assert_eq!(t["usage"]["cached_tokens"], 200);

    let seen = s.ant.seen();
    assert_eq!(seen[0].headers["x-api-key"], "sk-ant-test");
    assert_eq!(seen[0].headers["anthropic-version"], "2023-06-01");
    let b0 = &seen[0].body;
    assert!(b0["max_tokens"].as_u64().unwrap() > 0);
    assert!(b0["system"].as_str().unwrap().ends_with("## Context from the parent agent\n\nWe are in repo y."));
    assert_eq!(b0["messages"], json!([{"role": "user", "content": "Find x"}]));
    let b1 = &seen[1].body["messages"];
    assert_eq!(
        b1[1]["content"][1],
        json!({"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "x"}})
    );
    assert_eq!(b1[2]["role"], "user");
    assert_eq!(b1[2]["content"][0]["type"], "tool_result");
    assert_eq!(b1[2]["content"][0]["tool_use_id"], "toolu_1");
    assert_eq!(b1[2]["content"][0]["is_error"], true);
    s.app.stop().await;
}

#[tokio::test]
async fn a_429_with_retry_after_is_retried_and_both_attempts_are_in_the_ledger() {
    let s = setup().await;
    s.oai.push(Answer::status(429, json!({"error": {"message": "Rate limit reached"}})).header("retry-after-ms", "50"));
    s.oai.push(Answer::json(openai_text("ok", 10, 2, 0)));
    let started = std::time::Instant::now();
    let t = run(&s.app, json!({"prompt": "x", "model": "oai/gpt-4o-mini"})).await;
    assert_eq!(t["status"], "completed");
    assert!(started.elapsed() >= Duration::from_millis(50), "Retry-After honoured");
    let rows = ledger(&s.app, t["id"].as_str().unwrap()).await;
    assert_eq!(
        rows.iter().map(|r| (r.0.as_str(), r.1, r.5)).collect::<Vec<_>>(),
        [("error", Some(429), 1), ("ok", Some(200), 2)]
    );
    s.app.stop().await;
}

#[tokio::test]
async fn anthropic_529_overloaded_is_retried() {
    let s = setup().await;
    s.ant.push(Answer::status(
        529,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ));
    s.ant.push(Answer::json(anthropic_text("fine", 10, 2, 0)));
    let t = run(&s.app, json!({"prompt": "x", "model": "ant/claude-haiku-4-5"})).await;
    assert_eq!(t["status"], "completed");
    assert_eq!(ledger(&s.app, t["id"].as_str().unwrap()).await.len(), 2);
    s.app.stop().await;
}

#[tokio::test]
async fn persistent_500s_fail_the_task_after_the_configured_attempts() {
    let s = setup().await;
    for _ in 0..3 {
        s.oai.push(Answer::status(500, json!({"error": {"message": "internal"}})));
    }
    let t = run(&s.app, json!({"prompt": "x", "model": "oai/gpt-4o"})).await;
    assert_eq!(t["status"], "failed");
    assert_eq!(t["error"]["code"], "provider_unavailable");
    assert!(t["error"]["message"].as_str().unwrap().contains("3 attempt(s)"), "{t}");
    assert_eq!(ledger(&s.app, t["id"].as_str().unwrap()).await.len(), 3);
    s.app.stop().await;
}

#[tokio::test]
async fn a_401_fails_fast_with_the_providers_message() {
    let s = setup().await;
    s.oai.push(Answer::status(401, json!({"error": {"message": "Incorrect API key provided"}})));
    let t = run(&s.app, json!({"prompt": "x", "model": "oai/gpt-4o"})).await;
    assert_eq!(t["status"], "failed");
    assert_eq!(t["error"]["code"], "provider_rejected");
    assert!(t["error"]["message"].as_str().unwrap().contains("Incorrect API key provided"), "{t}");
    assert_eq!(s.oai.seen().len(), 1);
    s.app.stop().await;
}

#[tokio::test]
async fn a_slow_provider_times_out_and_is_retried() {
    let s = setup().await;
    s.oai.push(Answer::json(openai_text("too late", 1, 1, 0)).after(Duration::from_secs(3)));
    s.oai.push(Answer::json(openai_text("on time", 1, 1, 0)));
    let t = run(&s.app, json!({"prompt": "x", "model": "oai/gpt-4o"})).await;
    assert_eq!(t["status"], "completed");
    assert_eq!(t["summary"], "on time");
    let rows = ledger(&s.app, t["id"].as_str().unwrap()).await;
    assert_eq!(rows[0].0, "error");
    assert_eq!(rows[0].1, None, "a timeout has no HTTP status");
    s.app.stop().await;
}

#[tokio::test]
async fn garbage_and_truncated_bodies_are_provider_protocol_errors() {
    let s = setup().await;
    s.oai.push(Answer::raw(200, "<html>gateway</html>"));
    let t = run(&s.app, json!({"prompt": "x", "model": "oai/gpt-4o"})).await;
    assert_eq!(t["status"], "failed");
    assert_eq!(t["error"]["code"], "provider_protocol");
    s.ant.push(Answer::raw(200, r#"{"id": "msg_1", "content": [{"type": "text", "te"#));
    let t = run(&s.app, json!({"prompt": "x", "model": "ant/claude-sonnet-4-5"})).await;
    assert_eq!(t["error"]["code"], "provider_protocol");
    s.ant.push(Answer::json(json!({"id": "msg_1", "content": []})));
    let t = run(&s.app, json!({"prompt": "x", "model": "ant/claude-sonnet-4-5"})).await;
    assert_eq!(t["error"]["code"], "provider_protocol", "no stop_reason or usage: {t}");
    s.app.stop().await;
}

#[tokio::test]
async fn a_model_without_a_price_has_no_cost_and_says_so() {
    let s = setup().await;
    s.oai.push(Answer::json(openai_text("hi", 10, 2, 0)));
    let t = run(&s.app, json!({"prompt": "x", "model": "oai/my-local-llama"})).await;
    assert_eq!(t["status"], "completed");
    assert_eq!(t["cost_complete"], false);
    assert_eq!(t["cost_usd"], json!(0.0));
    let cost: Option<rust_decimal::Decimal> =
        sqlx::query_scalar("SELECT cost_usd FROM llm_calls WHERE task_id = $1::uuid")
            .bind(t["id"].as_str().unwrap())
            .fetch_one(&s.app.db.pool)
            .await
            .unwrap();
    assert_eq!(cost, None);
    s.app.stop().await;
}

#[tokio::test]
async fn aliases_route_to_their_model() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let app = spawn_app_opts(
        |_| {},
        AppOptions {
            providers: providers(&oai_url, "http://127.0.0.1:9", "[aliases]\nfast = \"oai/gpt-4o-mini\"\n"),
            ..AppOptions::default()
        },
    )
    .await;
    oai.push(Answer::json(openai_text("hi", 1, 1, 0)));
    let t = run(&app, json!({"prompt": "x", "model": "fast"})).await;
    assert_eq!(t["model"], "oai/gpt-4o-mini");
    assert_eq!(oai.seen()[0].body["model"], "gpt-4o-mini");
    app.stop().await;
}

#[tokio::test]
async fn offered_tools_use_each_providers_schema() {
    use subagentd::llm::{ChatRequest, Message, ToolSpec};
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let (ant, ant_url) = serve("/v1/messages").await;
    let p = providers(&oai_url, &ant_url, "");
    let req = ChatRequest {
        model: "m".into(),
        messages: vec![Message::System { content: "s".into() }, Message::User { content: "u".into() }],
        tools: vec![ToolSpec {
            name: "get".into(),
            description: "reads".into(),
            parameters: json!({"type": "object"}).into(),
            server: None,
        }]
        .into(),
        max_tokens: Some(64),
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        ..ChatRequest::default()
    };
    oai.push(Answer::json(openai_text("ok", 1, 1, 0)));
    p.get("oai").unwrap().chat(&req).await.unwrap();
    assert_eq!(
        oai.seen()[0].body["tools"],
        json!([{"type": "function", "function": {"name": "get", "description": "reads", "parameters": {"type": "object"}}}])
    );
    assert_eq!(oai.seen()[0].body["max_tokens"], 64);
    assert_eq!(oai.seen()[0].headers["traceparent"], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    ant.push(Answer::json(anthropic_text("ok", 1, 1, 0)));
    p.get("ant").unwrap().chat(&req).await.unwrap();
    assert_eq!(
        ant.seen()[0].body["tools"],
        json!([{"name": "get", "description": "reads", "input_schema": {"type": "object"}}])
    );
    assert_eq!(ant.seen()[0].body["max_tokens"], 64);
    // Newer OpenAI models name the output limit `max_completion_tokens`, and only that.
    let (newer, newer_url) = serve("/v1/chat/completions").await;
    let extra = format!("[providers.newer]\nkind = \"openai\"\nbase_url = \"{newer_url}/v1\"\nmax_tokens_field = \"max_completion_tokens\"");
    let p = providers(&oai_url, &ant_url, &extra);
    newer.push(Answer::json(openai_text("ok", 1, 1, 0)));
    p.get("newer").unwrap().chat(&req).await.unwrap();
    let body = &newer.seen()[0].body;
    assert_eq!((body["max_completion_tokens"].clone(), body.get("max_tokens")), (json!(64), None));
}
