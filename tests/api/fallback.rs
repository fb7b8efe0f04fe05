//! Fallback models against fake providers as real HTTP servers: a provider that answers 503
//! until the retry deadline, one that refuses connections, and one whose 429 asks to wait
//! longer than the run can each move the turn to the next model, which completes it — each try
//! a ledger row at its own model's price, an event naming both models, `answered_model` the one
//! that answered. A 400 never falls back; an unaffordable fallback ends the run with `budget`.
//! And the lists: the task's, else the agent definition's, else the tenant's, each checked.

use std::time::Duration;

use serde_json::{json, Value};
use subagentd::config::FileConfig;
use subagentd::llm::Providers;

use crate::fakes::*;
use crate::helpers::*;

const ADMIN: &str = "fallback-admin";

/// `down`, `busy` and `bad` at `failing` (each answers what the test scripts), `gone` at a port
/// that refuses connections, `good` at `ok`; a short retry deadline.
fn providers(failing: &str, ok: &str, busy: &str) -> Providers {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let file: FileConfig = toml::from_str(&format!(
        r#"
        [providers.down]
        kind = "openai"
        base_url = "{failing}/v1"
        [providers.busy]
        kind = "openai"
        base_url = "{busy}/v1"
        [providers.gone]
        kind = "openai"
        base_url = "http://127.0.0.1:{closed}/v1"
        [providers.good]
        kind = "openai"
        base_url = "{ok}/v1"
        [providers.notools]
        kind = "openai"
        base_url = "{ok}/v1"
        supports_tools = false
        [pricing."down/m"]
        input = 1.0
        output = 2.0
        [pricing."busy/m"]
        input = 1.0
        output = 2.0
        [pricing."gone/m"]
        input = 1.0
        output = 2.0
        [pricing."good/m"]
        input = 100.0
        output = 200.0
        [pricing."notools/m"]
        input = 1.0
        output = 2.0
        [retry]
        max_attempts = 2
        base_ms = 20
        cap_ms = 100
        deadline_seconds = 2
        "#
    ))
    .unwrap();
    Providers::from_config(&file, &|_| None).unwrap()
}

async fn app(failing: &str, ok: &str) -> TestApp {
    app_busy(failing, ok, "http://127.0.0.1:9").await
}

async fn app_busy(failing: &str, ok: &str, busy: &str) -> TestApp {
    spawn_app_opts(
        |c| {
            c.tool_allow = "*, 127.0.0.1/32".into();
            c.admin_token = Some(ADMIN.into());
        },
        AppOptions { providers: providers(failing, ok, busy), ..AppOptions::default() },
    )
    .await
}

fn answer(text: &str) -> Answer {
    Answer::json(openai_text(text, 100, 10, 0))
}

async fn ledger(app: &TestApp, id: &str) -> Vec<(String, String, i32, Option<i32>, Option<f64>)> {
    sqlx::query_as(
        "SELECT provider || '/' || model, outcome, try, http_status, cost_usd::float8 FROM llm_calls
         WHERE task_id = $1::uuid ORDER BY id",
    )
    .bind(id)
    .fetch_all(&app.db.pool)
    .await
    .unwrap()
}

async fn events(app: &TestApp, id: &str) -> Vec<Value> {
    let page = app.get_json(&format!("/tasks/{id}/events?limit=1000")).await;
    page["events"].as_array().unwrap().clone()
}

fn of_kind<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["kind"] == kind).collect()
}

async fn finished(app: &TestApp, body: Value) -> Value {
    let r = app.post_json("/tasks?wait=true&timeout=60", body).await;
    assert_eq!(r.status(), 200, "task did not finish in time");
    r.json().await.unwrap()
}

#[tokio::test]
async fn a_provider_down_until_the_deadline_unreachable_or_asking_too_long_a_wait_falls_back_and_completes() {
    let (failing, failing_base) = serve("/v1/chat/completions").await;
    let (good, good_base) = serve("/v1/chat/completions").await;
    let (busy, busy_base) = serve("/v1/chat/completions").await;
    let app = app_busy(&failing_base, &good_base, &busy_base).await;

    // 503 until the retry deadline (a restarting server is retried until then).
    for _ in 0..200 {
        failing.push(Answer::status(503, json!({"error": {"message": "loading"}})).after(Duration::from_millis(50)));
    }
    good.push(answer("served by good"));
    let t = finished(&app, json!({"prompt": "p", "model": "down/m", "fallback_models": ["good/m"]})).await;
    assert_eq!((t["status"].as_str(), t["summary"].as_str()), (Some("completed"), Some("served by good")), "{t}");
    assert_eq!(t["model"], "down/m");
    assert_eq!(t["answered_model"], "good/m");
    assert_eq!(t["fallback_models"], json!(["good/m"]));
    let id = t["id"].as_str().unwrap();
    let rows = ledger(&app, id).await;
    let (last, tries) = rows.split_last().unwrap();
    assert!(
        tries.len() >= 2 && tries.iter().all(|r| r.0 == "down/m" && r.1 == "error" && r.3 == Some(503)),
        "{rows:?}"
    );
    assert_eq!((last.0.as_str(), last.1.as_str(), last.2), ("good/m", "ok", tries.len() as i32 + 1));
    // At good's price: 100 in and 10 out at 100 and 200 per million.
    assert!((last.4.unwrap() - 0.012).abs() < 1e-9, "{last:?}");
    assert!((t["cost_usd"].as_f64().unwrap() - 0.012).abs() < 1e-9, "the task's cost is the calls': {t}");
    let ev = events(&app, id).await;
    let fb = of_kind(&ev, "model_fallback");
    assert_eq!(fb.len(), 1);
    assert_eq!(fb[0]["data"]["from"], "down/m");
    assert_eq!(fb[0]["data"]["to"], "good/m");
    assert_eq!(fb[0]["data"]["reason"], "unavailable");
    // The metric counts it by pair and reason (the recorder is the test process's: at least 1).
    let m = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let counted = m
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"subagentd_model_fallbacks_total{from="down/m",to="good/m",reason="unavailable"} "#)
        })
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(counted.is_some_and(|n| n >= 1.0), "{m}");

    // A provider that refuses connections.
    good.push(answer("served after a refusal"));
    let t = finished(&app, json!({"prompt": "p", "model": "gone/m", "fallback_models": ["good/m"]})).await;
    assert_eq!(t["summary"], "served after a refusal", "{t}");
    assert_eq!(t["answered_model"], "good/m");
    let rows = ledger(&app, t["id"].as_str().unwrap()).await;
    assert!(rows.iter().any(|r| r.0 == "gone/m" && r.1 == "error"), "{rows:?}");

    // A 429 whose Retry-After is longer than the run can wait: no waiting it out.
    busy.push(Answer::status(429, json!({"error": {"message": "slow down"}})).header("retry-after", "3600"));
    good.push(answer("served instead of waiting an hour"));
    let started = std::time::Instant::now();
    let t = finished(&app, json!({"prompt": "p", "model": "busy/m", "fallback_models": ["good/m"]})).await;
    assert_eq!(t["summary"], "served instead of waiting an hour", "{t}");
    assert!(started.elapsed() < Duration::from_secs(30), "it did not wait the hour");
    let rows = ledger(&app, t["id"].as_str().unwrap()).await;
    assert_eq!(rows.iter().filter(|r| r.0 == "busy/m").count(), 1, "one try, no retry: {rows:?}");
    assert_events_typed(&app.db.pool).await;
    app.stop().await;
}

#[tokio::test]
async fn a_client_error_does_not_fall_back_and_an_unaffordable_fallback_ends_the_run_with_budget() {
    let (failing, failing_base) = serve("/v1/chat/completions").await;
    let (good, good_base) = serve("/v1/chat/completions").await;
    let app = app(&failing_base, &good_base).await;
    failing.push(Answer::status(400, json!({"error": {"message": "bad request"}})));
    let t = finished(&app, json!({"prompt": "p", "model": "down/m", "fallback_models": ["good/m"]})).await;
    assert_eq!(t["status"], "failed", "{t}");
    assert_eq!(t["error"]["code"], "provider_rejected");
    assert!(good.seen().is_empty(), "the fallback was never asked");
    let ev = events(&app, t["id"].as_str().unwrap()).await;
    assert!(of_kind(&ev, "model_fallback").is_empty());

    // The fallback costs a hundred times more: the task's own limit affords the first model's
    // call, not the fallback's.
    for _ in 0..200 {
        failing.push(Answer::status(503, json!({"error": {"message": "loading"}})).after(Duration::from_millis(50)));
    }
    let t =
        finished(&app, json!({"prompt": "p", "model": "down/m", "fallback_models": ["good/m"], "max_cost_usd": 0.01}))
            .await;
    assert_eq!((t["status"].as_str(), t["stop_reason"].as_str()), (Some("incomplete"), Some("budget")), "{t}");
    assert!(good.seen().is_empty(), "the unaffordable fallback was never called");
    let ev = events(&app, t["id"].as_str().unwrap()).await;
    assert_eq!(of_kind(&ev, "model_fallback").len(), 1, "it moved, and its reservation was refused");
    app.stop().await;
}

#[tokio::test]
async fn a_fallback_whose_provider_cannot_serve_the_run_is_skipped_with_the_reason() {
    let (failing, failing_base) = serve("/v1/chat/completions").await;
    let (good, good_base) = serve("/v1/chat/completions").await;
    let app = app(&failing_base, &good_base).await;
    failing.push(Answer::status(429, json!({"error": {"message": "busy"}})).header("retry-after", "3600"));
    good.push(answer("good, with tools"));
    let tools = json!([{"name": "lookup", "description": "d", "endpoint": "http://127.0.0.1:9/x", "policy": "auto",
                        "parameters": {"type": "object"}}]);
    let t = finished(
        &app,
        json!({"prompt": "p", "model": "down/m", "tools": tools, "fallback_models": ["notools/m", "good/m"]}),
    )
    .await;
    assert_eq!(t["answered_model"], "good/m", "{t}");
    let ev = events(&app, t["id"].as_str().unwrap()).await;
    let skipped = of_kind(&ev, "model_fallback_skipped");
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0]["data"]["model"], "notools/m");
    assert!(skipped[0]["data"]["reason"].as_str().unwrap().contains("tools"), "{:?}", skipped[0]);
    assert_eq!(of_kind(&ev, "model_fallback")[0]["data"]["to"], "good/m");
    assert_events_typed(&app.db.pool).await;
    app.stop().await;
}

#[tokio::test]
async fn fallback_models_come_from_the_task_else_the_agent_else_the_tenant_and_bad_ones_are_named() {
    let (_f, failing_base) = serve("/v1/chat/completions").await;
    let (_g, good_base) = serve("/v1/chat/completions").await;
    let app = app(&failing_base, &good_base).await;
    let c = &app.client;
    // Bad lists: named, and nothing written.
    for (body, field) in [
        (json!({"prompt": "p", "model": "down/m", "fallback_models": ["nosuch/m"]}), "fallback_models"),
        (json!({"prompt": "p", "model": "down/m", "fallback_models": ["down/m"]}), "fallback_models"),
        (json!({"prompt": "p", "model": "down/m", "fallback_models": ["good/m", "good/m"]}), "fallback_models"),
        (json!({"prompt": "p", "model": "down/m", "fallback_models": "good/m"}), "fallback_models"),
        (json!({"prompt": "p", "model": "down/m", "fallback_on": ["sometimes"]}), "fallback_on"),
    ] {
        let r = app.post_task(body.clone()).await;
        let p = assert_problem(r, 422, "validation_failed").await;
        assert!(p.to_string().contains(field), "{body}: {p}");
    }
    assert_eq!(app.task_count().await, 0);
    // The tenant's list, then an agent's over it, then the task's over both.
    let r = c
        .put(app.url("/admin/tenants/default"))
        .bearer_auth(ADMIN)
        .json(&json!({"fallback_models": ["good/m"]}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let bad = c
        .put(app.url("/admin/tenants/default"))
        .bearer_auth(ADMIN)
        .json(&json!({"fallback_models": ["has space/m"]}))
        .send()
        .await
        .unwrap();
    assert_problem(bad, 422, "validation_failed").await;
    let t = app.submit(json!({"prompt": "p", "model": "down/m"})).await;
    assert_eq!(t["fallback_models"], json!(["good/m"]), "the tenant's");
    let r = c
        .put(app.url("/agents/careful"))
        .json(&json!({"system_prompt": "Be careful.", "fallback_models": ["gone/m", "good/m"], "fallback_on": ["unavailable", "context_length"]}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let t = app.submit(json!({"prompt": "p", "model": "down/m", "subagent_type": "careful"})).await;
    assert_eq!(t["fallback_models"], json!(["gone/m", "good/m"]), "the agent's");
    assert_eq!(t["fallback_on"], json!(["unavailable", "context_length"]));
    let t =
        app.submit(json!({"prompt": "p", "model": "down/m", "subagent_type": "careful", "fallback_models": []})).await;
    assert!(t.get("fallback_models").is_none_or(|f| f == &json!([])), "the task's own, none: {t}");
    // An agent file's front matter says the same.
    let md = "---\nname: steady\nfallback_models: gone/m, good/m\n---\nBe steady.\n";
    let r = c.put(app.url("/agents/steady")).header("content-type", "text/markdown").body(md).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let d: Value = c.get(app.url("/agents/steady")).send().await.unwrap().json().await.unwrap();
    assert_eq!(d["fallback_models"], json!(["gone/m", "good/m"]), "{d}");
    app.stop().await;
}
