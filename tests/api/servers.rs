//! Real model servers' ways, faked as real HTTP servers: answers cut at the output limit,
//! streams that are slow or stall, tool calls written as text, servers that restart, context
//! overflows, local models without a price, and cancels mid-stream.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subagentd::config::FileConfig;
use subagentd::llm::Providers;

use crate::fakes::*;
use crate::helpers::*;

const FAST: Duration = Duration::from_millis(5);

/// `local` (OpenAI-compatible, not the official API) and `ant` (Anthropic, faking the official
/// one) at the fakes, with fast retries and `extra` TOML.
pub(crate) fn providers(oai: &str, ant: &str, extra: &str) -> Providers {
    let file: FileConfig = toml::from_str(&format!(
        r#"
        [providers.local]
        kind = "openai"
        base_url = "{oai}/v1"
        {extra}
        [providers.ant]
        kind = "anthropic"
        base_url = "{ant}"
        shipped_prices = true
        [retry]
        max_attempts = 2
        base_ms = 20
        cap_ms = 200
        deadline_seconds = 20
        "#
    ))
    .unwrap();
    Providers::from_config(&file, &|_| None).unwrap()
}

pub(crate) async fn app_with(p: Providers, tweak: impl FnOnce(&mut subagentd::config::Config)) -> TestApp {
    spawn_app_opts(
        |c| {
            c.tool_allow = "*, 127.0.0.1/32".into();
            tweak(c);
        },
        AppOptions { providers: p, ..AppOptions::default() },
    )
    .await
}

async fn finished(app: &TestApp, body: Value) -> Value {
    let r = app.post_json("/tasks?wait=true&timeout=60", body).await;
    assert_eq!(r.status(), 200, "task did not finish in time");
    r.json().await.unwrap()
}

async fn ledger(app: &TestApp, id: &str) -> Vec<(String, bool, i64, i64)> {
    sqlx::query_as(
        "SELECT outcome, usage_estimated, input_tokens, output_tokens FROM llm_calls WHERE task_id = $1::uuid ORDER BY id",
    )
    .bind(id)
    .fetch_all(&app.db.pool)
    .await
    .unwrap()
}

/// A tool endpoint that counts its calls.
async fn counting_tool() -> (Arc<Mutex<Vec<Value>>>, String) {
    let calls: Arc<Mutex<Vec<Value>>> = Arc::default();
    let c2 = calls.clone();
    let app = axum::Router::new().route(
        "/tool",
        axum::routing::post(move |axum::Json(b): axum::Json<Value>| {
            let c2 = c2.clone();
            async move {
                c2.lock().unwrap().push(b);
                axum::Json(json!({"content": "95 moons"}))
            }
        }),
    );
    let url = format!("{}/tool", serve_router(app).await);
    (calls, url)
}

fn lookup_tool(url: &str) -> Value {
    json!([{"name": "lookup", "description": "looks things up", "policy": "auto", "endpoint": url,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}])
}

fn user_messages(seen: &Seen) -> Vec<String> {
    seen.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].to_string())
        .collect()
}

#[tokio::test]
async fn a_cut_final_answer_with_turns_left_is_asked_again_shorter_and_then_completes() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let app = app_with(providers(&oai_url, "http://127.0.0.1:9", ""), |_| {}).await;
    oai.push(Answer::sse(
        &openai_stream("The moons of Jupiter are, in order: Metis, Adras", &[], "length", (40, 16)),
        FAST,
    ));
    oai.push(Answer::sse(&openai_stream("Jupiter has 95 moons.", &[], "stop", (80, 6)), FAST));
    let t = finished(&app, json!({"prompt": "List the moons", "model": "local/qwen2.5-0.5b", "max_turns": 3})).await;
    assert_eq!((t["status"].as_str(), t["stop_reason"].as_str()), (Some("completed"), Some("final_answer")), "{t}");
    assert_eq!(t["summary"], "Jupiter has 95 moons.");
    let seen = oai.seen();
    assert_eq!(seen[0].body["stream"], true);
    assert_eq!(seen[0].body["stream_options"]["include_usage"], true);
    let second = user_messages(&seen[1]);
    assert!(second.last().unwrap().contains("cut off at the output limit"), "{second:?}");
    assert_eq!(t["usage"]["input_tokens"], 120, "usage from the streams");
    let events = app.get_json(&format!("/tasks/{}/events", t["id"].as_str().unwrap())).await;
    assert!(events.to_string().contains("answer_cut"), "{events}");
    assert_events_typed(&app.db.pool).await;
    app.stop().await;
}

#[tokio::test]
async fn a_cut_final_answer_on_the_last_turn_ends_incomplete_max_tokens_with_the_partial_text() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let (ant, ant_url) = serve("/v1/messages").await;
    let app = app_with(providers(&oai_url, &ant_url, ""), |_| {}).await;
    ant.push(Answer::sse(&anthropic_stream("Step one: back up the dat", "max_tokens", (30, 16)), FAST));
    let t = finished(&app, json!({"prompt": "Plan", "model": "ant/claude-haiku-4-5", "max_turns": 1})).await;
    assert_eq!((t["status"].as_str(), t["stop_reason"].as_str()), (Some("incomplete"), Some("max_tokens")), "{t}");
    assert_eq!(t["summary"], "Step one: back up the dat");
    assert_eq!(t["usage"]["output_tokens"], 16);
    // The same through the OpenAI-compatible kind, answered as one JSON body.
    let mut cut = openai_text("Half of it", 10, 16, 0);
    cut["choices"][0]["finish_reason"] = json!("length");
    oai.push(Answer::json(cut));
    let t = finished(&app, json!({"prompt": "Plan", "model": "local/m", "max_turns": 1})).await;
    assert_eq!((t["stop_reason"].as_str(), t["summary"].as_str()), (Some("max_tokens"), Some("Half of it")));
    app.stop().await;
}

#[tokio::test]
async fn a_tool_call_cut_mid_arguments_is_never_run() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let (calls, tool) = counting_tool().await;
    let app = app_with(providers(&oai_url, "http://127.0.0.1:9", ""), |_| {}).await;
    oai.push(Answer::sse(
        &openai_stream("", &[("call_1", "lookup", r#"{"q": "the moons of Jup"#)], "length", (50, 16)),
        FAST,
    ));
    oai.push(Answer::sse(&openai_stream("I could not look it up.", &[], "stop", (90, 7)), FAST));
    let t = finished(&app, json!({"prompt": "Moons?", "model": "local/m", "tools": lookup_tool(&tool)})).await;
    assert_eq!(t["status"], "completed", "{t}");
    assert!(calls.lock().unwrap().is_empty(), "a cut call reached the tool");
    let m = &oai.seen()[1].body["messages"];
    let result = m.as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert!(result["content"].as_str().unwrap().contains("was cut off at the output limit"), "{result}");
    app.stop().await;
}

#[tokio::test]
async fn max_tokens_come_from_the_model_the_provider_or_the_definition_and_are_what_is_reserved() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let extra = "max_output_tokens = 700\n[providers.local.models.\"small\"]\nmax_output_tokens = 300\n";
    let app = app_with(providers(&oai_url, "http://127.0.0.1:9", extra), |_| {}).await;
    for _ in 0..3 {
        oai.push(Answer::sse(&openai_stream("ok", &[], "stop", (5, 1)), FAST));
    }
    finished(&app, json!({"prompt": "a", "model": "local/big"})).await;
    finished(&app, json!({"prompt": "b", "model": "local/small"})).await;
    let r = app
        .client
        .put(app.url("/agents/terse"))
        .header("content-type", "text/markdown")
        .body("---\nname: terse\nmodel: local/small\nmax_output_tokens: 64\n---\nBe terse.\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let t = finished(&app, json!({"prompt": "c", "subagent_type": "terse"})).await;
    let sent: Vec<u64> = oai.seen().iter().map(|s| s.body["max_tokens"].as_u64().unwrap()).collect();
    assert_eq!(sent, [700, 300, 64]);
    let events = app.get_json(&format!("/tasks/{}/events", t["id"].as_str().unwrap())).await;
    let started = events["events"].as_array().unwrap().iter().find(|e| e["kind"] == "llm_call_started").unwrap();
    let reserved = started["data"]["reserved_tokens"].as_u64().unwrap();
    assert!((64..200).contains(&reserved), "the reservation holds the definition's 64 output tokens: {reserved}");
    app.stop().await;
}

#[tokio::test]
async fn a_prompt_over_the_context_window_fails_saying_so() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let app = app_with(providers(&oai_url, "http://127.0.0.1:9", "max_output_tokens = 4096"), |_| {}).await;
    oai.push(Answer::status(
        400,
        json!({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                         "type": "exceed_context_size_error"}}),
    ));
    let t = finished(&app, json!({"prompt": "x", "model": "local/smollm2-135m"})).await;
    assert_eq!((t["status"].as_str(), t["error"]["code"].as_str()), (Some("failed"), Some("context_exceeded")), "{t}");
    let msg = t["error"]["message"].as_str().unwrap();
    assert!(msg.contains("max_tokens (4096)") && msg.contains("max_output_tokens"), "{msg}");
    assert_eq!(oai.seen().len(), 1, "not retried");
    app.stop().await;
}

#[tokio::test]
async fn a_tool_call_written_as_text_is_run_as_a_tool_call() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let (calls, tool) = counting_tool().await;
    let app = app_with(providers(&oai_url, "http://127.0.0.1:9", ""), |_| {}).await;
    let as_text = "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"q\": \"moons\"}}\n</tool_call>";
    oai.push(Answer::sse(&openai_stream(as_text, &[], "stop", (50, 20)), FAST));
    oai.push(Answer::sse(&openai_stream("Jupiter has 95 moons.", &[], "stop", (90, 7)), FAST));
    let t = finished(&app, json!({"prompt": "Moons?", "model": "local/m", "tools": lookup_tool(&tool)})).await;
    assert_eq!(t["summary"], "Jupiter has 95 moons.", "{t}");
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert_eq!(calls.lock().unwrap()[0]["arguments"], json!({"q": "moons"}));
    let m = &oai.seen()[1].body["messages"];
    assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "lookup");
    assert_eq!(m[3]["role"], "tool");
    // JSON that is not a call to an offered tool stays the answer.
    oai.push(Answer::sse(&openai_stream(r#"{"moons": 95}"#, &[], "stop", (50, 5)), FAST));
    let t = finished(&app, json!({"prompt": "As JSON", "model": "local/m", "tools": lookup_tool(&tool)})).await;
    assert_eq!(t["summary"], r#"{"moons": 95}"#);
    assert_eq!(calls.lock().unwrap().len(), 1);
    app.stop().await;
}

#[tokio::test]
async fn text_tool_calls_can_be_switched_off_per_provider() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let (calls, tool) = counting_tool().await;
    let app = app_with(providers(&oai_url, "http://127.0.0.1:9", "text_tool_calls = false"), |_| {}).await;
    let as_text = r#"{"name": "lookup", "arguments": {"q": "moons"}}"#;
    oai.push(Answer::sse(&openai_stream(as_text, &[], "stop", (50, 20)), FAST));
    let t = finished(&app, json!({"prompt": "Moons?", "model": "local/m", "tools": lookup_tool(&tool)})).await;
    assert_eq!(t["summary"], as_text);
    assert!(calls.lock().unwrap().is_empty());
    app.stop().await;
}

#[tokio::test]
async fn a_slow_stream_outlasts_a_short_first_byte_timeout_and_a_stalled_one_is_retried() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let extra = "first_byte_timeout_seconds = 1\nidle_timeout_seconds = 1";
    let app = app_with(providers(&oai_url, "http://127.0.0.1:9", extra), |_| {}).await;
    // Chunks 250 ms apart, each within the idle timeout: longer in all than both timeouts.
    let slow = openai_stream("A long answer, generated slowly on a CPU.", &[], "stop", (20, 12));
    let whole = Duration::from_millis(250) * slow.len() as u32;
    assert!(whole > Duration::from_secs(2));
    oai.push(Answer::sse(&slow, Duration::from_millis(250)));
    let started = Instant::now();
    let t = finished(&app, json!({"prompt": "x", "model": "local/m"})).await;
    assert_eq!(t["summary"], "A long answer, generated slowly on a CPU.");
    assert!(started.elapsed() >= whole, "the whole stream was read");
    // A stream that stops mid-answer is cut by the idle timeout, then retried.
    oai.push(Answer::sse(&openai_stream("Never finish", &[], "stop", (20, 3)), FAST).stall_after(2));
    oai.push(Answer::sse(&openai_stream("Second try.", &[], "stop", (20, 3)), FAST));
    let t = finished(&app, json!({"prompt": "y", "model": "local/m"})).await;
    assert_eq!(t["summary"], "Second try.");
    let rows = ledger(&app, t["id"].as_str().unwrap()).await;
    assert_eq!(rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["error", "ok"]);
    let err: String = sqlx::query_scalar("SELECT error FROM llm_calls WHERE task_id = $1::uuid ORDER BY id LIMIT 1")
        .bind(t["id"].as_str().unwrap())
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert!(err.contains("idle timeout"), "{err}");
    app.stop().await;
}

#[tokio::test]
async fn a_server_still_starting_or_loading_its_model_is_waited_for_past_the_attempt_count() {
    // Refuses connections for 1.5 s (max_attempts is 2: attempts alone would give up).
    let (oai, oai_url) = serve_later("/v1/chat/completions", Duration::from_millis(1500)).await;
    let app = app_with(providers(&oai_url, "http://127.0.0.1:9", ""), |_| {}).await;
    for _ in 0..4 {
        oai.push(Answer::status(
            503,
            json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}),
        ));
    }
    oai.push(Answer::sse(&openai_stream("Up now.", &[], "stop", (10, 2)), FAST));
    let t = finished(&app, json!({"prompt": "x", "model": "local/m"})).await;
    assert_eq!((t["status"].as_str(), t["summary"].as_str()), (Some("completed"), Some("Up now.")), "{t}");
    let rows = ledger(&app, t["id"].as_str().unwrap()).await;
    let errors = rows.iter().filter(|r| r.0 == "error").count();
    assert!(errors >= 5, "refusals and 503s were retried: {rows:?}");
    app.stop().await;
}

#[tokio::test]
async fn a_local_model_is_not_billed_at_the_official_price_and_usd_only_limits_refuse_it() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let app = app_with(providers(&oai_url, "http://127.0.0.1:9", ""), |c| c.admin_token = Some("adm".into())).await;
    oai.push(Answer::sse(&openai_stream("hi", &[], "stop", (100, 10)), FAST));
    let t = finished(&app, json!({"prompt": "x", "model": "local/gpt-4o"})).await;
    assert_eq!((t["cost_complete"].as_bool(), t["cost_usd"].as_f64()), (Some(false), Some(0.0)), "{t}");
    let put = |limits: Value| {
        let (c, url) = (app.client.clone(), app.url("/admin/tenants/default"));
        async move { assert!(c.put(url).bearer_auth("adm").json(&limits).send().await.unwrap().status().is_success()) }
    };
    put(json!({"usd_per_day": 5})).await;
    let r = app.post_task(json!({"prompt": "x", "model": "local/gpt-4o"})).await;
    let p = assert_problem(r, 422, "unpriced_model").await;
    assert_eq!(p["errors"][0]["field"], "model");
    assert_eq!(p["limits"], json!(["usd_per_day"]));
    // A task with a token limit is held by it.
    let r = app.post_task(json!({"prompt": "x", "model": "local/gpt-4o", "max_tokens": 1000})).await;
    assert_eq!(r.status(), 201);
    app.stop().await;
}

#[tokio::test]
async fn a_cancel_mid_stream_drops_the_call_and_records_it_with_its_streamed_output() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let app = app_with(providers(&oai_url, "http://127.0.0.1:9", ""), |_| {}).await;
    let long = "word ".repeat(400);
    oai.push(Answer::sse(&openai_stream(&long, &[], "stop", (50, 500)), Duration::from_millis(20)));
    let t = app.submit(json!({"prompt": "Write", "model": "local/m"})).await;
    let id = t["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let r = app.client.post(app.url(&format!("/tasks/{id}/cancel"))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let done = app.poll_until_terminal(&id, Duration::from_secs(10)).await;
    assert_eq!(done["status"], "cancelled");
    assert_eq!(done["usage_estimated"], true);
    let rows = ledger(&app, &id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (outcome, estimated, input, output) = rows[0].clone();
    assert_eq!((outcome.as_str(), estimated), ("interrupted", true));
    assert!(input > 0);
    // About 30 of the 400 words streamed before the cancel: far below the reserved 4,096.
    assert!((5..1000).contains(&output), "output as streamed so far: {output}");
    let kinds: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM task_event_log WHERE task_id = $1::uuid ORDER BY seq")
            .bind(&id)
            .fetch_all(&app.db.pool)
            .await
            .unwrap();
    let tail: Vec<&str> = kinds.iter().rev().take(2).rev().map(String::as_str).collect();
    assert_eq!(tail, ["cancelled", "finished"], "{kinds:?}");
    app.stop().await;
}

#[tokio::test]
async fn the_binary_logs_why_a_task_failed() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    oai.push(Answer::status(401, json!({"error": {"message": "Incorrect API key provided"}})));
    let p = providers(&oai_url, "http://127.0.0.1:9", "");
    let app = spawn_app_opts(|_| {}, AppOptions { workers: false, providers: p, ..AppOptions::default() }).await;
    let dir = std::env::temp_dir().join(format!("subagentd-logs-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("c.toml");
    std::fs::write(&cfg, format!("[providers.local]\nkind = \"openai\"\nbase_url = \"{oai_url}/v1\"\n")).unwrap();
    let log = dir.join("err.log");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_subagentd"));
    cmd.args(["worker"])
        .env("DATABASE_URL", &app.db.url)
        .env("SUBAGENTD_CONFIG", &cfg)
        .env("SUBAGENTD_POLL_INTERVAL_MS", "100")
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let worker = Proc { child: cmd.spawn().unwrap() };
    let t = app.submit(json!({"prompt": "x", "model": "local/m"})).await;
    let id = t["id"].as_str().unwrap().to_string();
    let done = app.poll_until_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!((done["status"].as_str(), done["error"]["code"].as_str()), (Some("failed"), Some("provider_rejected")));
    drop(worker);
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text.lines().find(|l| l.contains("task failed")).unwrap_or_else(|| panic!("no failure logged: {text}"));
    for part in ["WARN", id.as_str(), "provider_rejected", "Incorrect API key provided", "local/m", "127.0.0.1"] {
        assert!(line.contains(part), "{part:?} missing from {line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    app.stop().await;
}

#[tokio::test]
async fn calls_beyond_a_providers_max_connections_wait_their_turn_and_all_complete() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // A provider that takes 300 ms a call and counts the calls it is serving at once.
    let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n2, p2) = (now.clone(), peak.clone());
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let (now, peak) = (n2.clone(), p2.clone());
            async move {
                peak.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                axum::Json(openai_text("done", 10, 2, 0))
            }
        }),
    );
    let url = serve_router(app).await;
    let app = app_with(providers(&url, "http://127.0.0.1:9", "max_connections = 2"), |_| {}).await;

    let started = Instant::now();
    let ids: Vec<String> = futures_util::future::join_all(
        (0..6).map(|i| app.submit(json!({"prompt": format!("task {i}"), "model": "local/m"}))),
    )
    .await
    .into_iter()
    .map(|t| t["id"].as_str().unwrap().to_string())
    .collect();
    for id in &ids {
        assert_eq!(app.poll_until_terminal(id, Duration::from_secs(30)).await["status"], "completed");
    }
    assert_eq!(peak.load(Ordering::SeqCst), 2, "never more than max_connections calls at once");
    assert!(started.elapsed() >= Duration::from_millis(900), "six 300 ms calls, two at a time");
    app.stop().await;
}
