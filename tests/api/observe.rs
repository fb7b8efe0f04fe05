//! Events (JSON pages and Server-Sent Events), completion webhooks, metrics, trace context.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::helpers::*;

/// Read an SSE stream until `stop` says so; returns (id, event kind) pairs.
async fn read_sse(resp: reqwest::Response, stop: impl Fn(&[(i64, String)]) -> bool) -> Vec<(i64, String)> {
    let mut out = vec![];
    let mut buf = String::new();
    let mut body = resp.bytes_stream();
    while let Ok(Some(chunk)) = tokio::time::timeout(Duration::from_secs(20), body.next()).await {
        buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(i) = buf.find("\n\n") {
            let frame: String = buf.drain(..i + 2).collect();
            let id = frame.lines().find_map(|l| l.strip_prefix("id:")).map(|v| v.trim().parse::<i64>().unwrap());
            let kind = frame.lines().find_map(|l| l.strip_prefix("event:")).map(|v| v.trim().to_string());
            if let (Some(id), Some(kind)) = (id, kind) {
                out.push((id, kind));
            }
            if stop(&out) {
                return out;
            }
        }
    }
    out
}

#[tokio::test]
async fn events_page_as_json_and_stream_live_with_resume_and_no_gaps() {
    let app = spawn_app().await;
    let t = app.submit(json!({"prompt": "x [mock:tool_turns=2] [mock:delay_ms=150]", "model": "mock/m"})).await;
    let id = t["id"].as_str().unwrap().to_string();
    let url = app.url(&format!("/tasks/{id}/events"));

    // Live: read the first three events, then disconnect.
    let r = app.client.get(&url).header("accept", "text/event-stream").send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let first = read_sse(r, |e| e.len() >= 3).await;
    assert_eq!(first.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2, 3]);
    // Resume from Last-Event-ID: the rest, to the end, no gap and no repeat.
    let r =
        app.client.get(&url).header("accept", "text/event-stream").header("last-event-id", "3").send().await.unwrap();
    let rest = read_sse(r, |e| e.last().is_some_and(|l| l.1 == "finished")).await;
    let all: Vec<i64> = first.iter().chain(rest.iter()).map(|e| e.0).collect();
    assert_eq!(all, (1..=all.len() as i64).collect::<Vec<_>>(), "contiguous sequence");
    let kinds: Vec<&str> = first.iter().chain(rest.iter()).map(|e| e.1.as_str()).collect();
    for k in
        ["created", "claimed", "llm_call_started", "llm_call_finished", "tool_call_refused", "checkpoint", "finished"]
    {
        assert!(kinds.contains(&k), "missing {k}: {kinds:?}");
    }

    // JSON pages.
    let page: Value = app.client.get(format!("{url}?after=2&limit=3")).send().await.unwrap().json().await.unwrap();
    let seqs: Vec<i64> = page["events"].as_array().unwrap().iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, [3, 4, 5]);
    assert_eq!(page["next_after"], 5);
    let r = app.client.get(format!("{url}?after=-1")).send().await.unwrap();
    assert_problem(r, 400, "invalid_parameter").await;
    let r =
        app.client.get(&url).header("accept", "text/event-stream").header("last-event-id", "x").send().await.unwrap();
    assert_problem(r, 400, "invalid_parameter").await;
    app.stop().await;
}

/// The run's last turn and its end are one commit: its `checkpoint` and `finished` events, and
/// the task's `finished_at`, carry one transaction's timestamp; earlier turns commit apart.
#[tokio::test]
async fn the_last_turn_and_the_tasks_end_are_committed_together() {
    let app = spawn_app().await;
    let t = app.submit(json!({"prompt": "x [mock:tool_turns=1]", "model": "mock/m"})).await;
    let id = t["id"].as_str().unwrap().to_string();
    let done = app.poll_until_terminal(&id, Duration::from_secs(10)).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(done["turns"], 2);
    let at: Vec<(String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT kind, created_at FROM task_events WHERE task_id = $1 AND kind IN ('checkpoint', 'finished') ORDER BY seq",
    )
    .bind(uuid::Uuid::parse_str(&id).unwrap())
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    let kinds: Vec<&str> = at.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(kinds, ["checkpoint", "checkpoint", "finished"]);
    assert_ne!(at[0].1, at[1].1, "the first turn commits on its own");
    assert_eq!(at[1].1, at[2].1, "the last checkpoint and the finish share one transaction");
    let finished_at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT finished_at FROM tasks WHERE id = $1")
        .bind(uuid::Uuid::parse_str(&id).unwrap())
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(finished_at, at[2].1);
    app.stop().await;
}

#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<(HeaderMap, String)>>>,
    fail_first: Arc<Mutex<u32>>,
}

async fn receive(axum::extract::State(r): axum::extract::State<Receiver>, h: HeaderMap, body: String) -> StatusCode {
    r.got.lock().unwrap().push((h, body));
    let mut f = r.fail_first.lock().unwrap();
    if *f > 0 {
        *f -= 1;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    StatusCode::OK
}

async fn receiver(fail_first: u32) -> (Receiver, String) {
    let r = Receiver { fail_first: Arc::new(Mutex::new(fail_first)), ..Default::default() };
    let app = Router::new().route("/hook", post(receive)).with_state(r.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (r, url)
}

#[tokio::test]
async fn a_finished_task_is_posted_to_its_webhook_signed_and_retried() {
    let (rcv, url) = receiver(1).await;
    let app = spawn_app_with(|c| c.tool_allow = "*, 127.0.0.1/32".into(), true).await;
    let secret: Value = app.client.post(app.url("/signing-secret")).send().await.unwrap().json().await.unwrap();
    let t = app.submit(json!({"prompt": "x", "model": "mock/m", "webhook_url": url})).await;
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(t["webhook"]["status"], "pending");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let task = loop {
        let t = app.get_task(&id).await;
        if t["webhook"]["status"] == "delivered" {
            break t;
        }
        assert!(tokio::time::Instant::now() < deadline, "not delivered: {t}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(task["webhook"]["attempts"], 2, "the first attempt got a 503 and was retried");
    let got = rcv.got.lock().unwrap().clone();
    let (h, body) = got.last().unwrap();
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["event"], "task.finished");
    assert_eq!(v["task"]["id"], id.as_str());
    assert_eq!(v["task"]["status"], "completed");
    let ts: i64 = h["subagent-timestamp"].to_str().unwrap().parse().unwrap();
    let want = subagentd::tools::http::signature(secret["secret"].as_str().unwrap(), ts, body.as_bytes());
    assert_eq!(h["subagent-signature"].to_str().unwrap(), want);
    let r = app.post_task(json!({"prompt": "x", "model": "mock/m", "webhook_url": "http://10.0.0.1/hook"})).await;
    assert_eq!(assert_problem(r, 422, "validation_failed").await["errors"][0]["field"], "webhook_url");
    app.stop().await;
}

#[tokio::test]
async fn metrics_are_exposed_in_prometheus_format() {
    let app = spawn_app().await;
    app.client
        .post(app.url("/tasks?wait=true"))
        .json(&json!({"prompt": "x [mock:tool_turns=1]", "model": "mock/m"}))
        .send()
        .await
        .unwrap();
    app.submit(json!({"prompt": "y", "model": "mock/nope", "max_turns": 1})).await;
    let r = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    for name in [
        "subagentd_tasks{status=\"queued\"}",
        "subagentd_http_requests_total",
        "subagentd_http_request_duration_seconds_bucket",
        "subagentd_llm_calls_total",
        "subagentd_llm_call_duration_seconds_bucket",
        "subagentd_tokens_total",
        "subagentd_claims_total",
        "subagentd_queue_wait_seconds_bucket",
        "subagentd_run_duration_seconds_bucket",
        "subagentd_tasks_finished_total",
    ] {
        assert!(text.contains(name), "missing {name}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_traceparent_is_kept_and_continued_on_outbound_tool_calls() {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s2 = seen.clone();
    let tool = Router::new().route(
        "/t",
        post(move |h: HeaderMap| {
            let s2 = s2.clone();
            async move {
                s2.lock()
                    .unwrap()
                    .push(h.get("traceparent").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default());
                axum::Json(json!({"content": "ok"}))
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, tool).await.unwrap() });
    let app = spawn_app_with(|c| c.tool_allow = "*, 127.0.0.1/32".into(), true).await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r = app
        .client
        .post(app.url("/tasks?wait=true"))
        .header("traceparent", tp)
        .json(&json!({"prompt": "[mock:tool_turns=1]", "model": "mock/m",
                      "tools": [{"name": "t", "parameters": {"type": "object"}, "policy": "auto", "endpoint": format!("{base}/t")}]}))
        .send()
        .await
        .unwrap();
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert!(got[0].starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{got:?}");
    assert_ne!(got[0], tp, "a new span id");
    app.stop().await;
}

/// What the fake collector received: content type and body of each export.
type Exports = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

#[tokio::test]
async fn spans_are_exported_over_otlp_and_continue_the_callers_trace() {
    let bodies: Exports = Arc::default();
    let b2 = bodies.clone();
    let collector = Router::new().route(
        "/v1/traces",
        post(move |h: HeaderMap, body: axum::body::Bytes| {
            let b2 = b2.clone();
            async move {
                let ct = h.get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
                b2.lock().unwrap().push((ct, body.to_vec()));
                StatusCode::OK
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, collector).await.unwrap() });

    let db = test_db().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut svc = spawn_binary(
        &["serve"],
        &db.url,
        &[
            ("SUBAGENTD_OTLP_ENDPOINT", otlp.as_str()),
            ("SUBAGENTD_LISTEN", &format!("127.0.0.1:{port}")),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while client.get(format!("{base}/readyz")).send().await.map(|r| r.status() != 200).unwrap_or(true) {
        assert!(tokio::time::Instant::now() < deadline, "service did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let r = client
        .post(format!("{base}/tasks?wait=true"))
        .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
        .json(&json!({"prompt": "x", "model": "mock/m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // SIGTERM: the service drains and flushes its spans.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(svc.child.id() as i32, libc::SIGTERM) };
    // Wait without blocking the runtime: the collector runs on it.
    let status = loop {
        if let Some(s) = svc.child.try_wait().unwrap() {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
    let got = bodies.lock().unwrap().clone();
    assert!(!got.is_empty(), "no OTLP export arrived");
    assert!(
        got.iter().all(|(ct, _)| ct == "application/x-protobuf"),
        "{:?}",
        got.iter().map(|g| &g.0).collect::<Vec<_>>()
    );
    let raw: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&trace[i * 2..i * 2 + 2], 16).unwrap()).collect();
    let all: Vec<u8> = got.iter().flat_map(|g| g.1.clone()).collect();
    assert!(all.windows(16).any(|w| w == raw.as_slice()), "the run's spans continue the caller's trace id");
    assert!(all.windows(8).any(|w| w == b"llm_call"), "an llm_call span was exported");
}
