//! Events (JSON pages and Server-Sent Events), completion webhooks, metrics, trace context.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::fakes::serve_router;
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
    assert_events_typed(&app.db.pool).await;
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
        "SELECT kind, created_at FROM task_event_log WHERE task_id = $1 AND kind IN ('checkpoint', 'finished') ORDER BY seq",
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
    let url = format!("{}/hook", serve_router(app).await);
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
    let base = serve_router(tool).await;
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
    let otlp = serve_router(collector).await;

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
    wait_until_ok(&client, &format!("{base}/readyz"), Duration::from_secs(20)).await;
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
    // The provider call's span, named as the GenAI conventions say (`chat <model>`).
    assert!(all.windows(6).any(|w| w == b"chat m"), "an llm_call span was exported");
}

/// An attribute of an exported span, as OTLP carries it.
fn attr<'a>(
    span: &'a opentelemetry_proto::tonic::trace::v1::Span,
    key: &str,
) -> Option<&'a opentelemetry_proto::tonic::common::v1::any_value::Value> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref())
}

#[tokio::test]
async fn exported_spans_follow_the_genai_conventions_and_failures_are_errors() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode as Code};
    use prost::Message;

    let bodies: Exports = Arc::default();
    let b2 = bodies.clone();
    let collector = Router::new().route(
        "/v1/traces",
        post(move |body: axum::body::Bytes| {
            let b2 = b2.clone();
            async move {
                b2.lock().unwrap().push((String::new(), body.to_vec()));
                StatusCode::OK
            }
        }),
    );
    let otlp = serve_router(collector).await;
    let db = test_db().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut svc = spawn_binary(
        &["serve"],
        &db.url,
        &[
            ("SUBAGENTD_OTLP_ENDPOINT", otlp.as_str()),
            ("SUBAGENTD_LISTEN", &format!("127.0.0.1:{port}")),
            ("SUBAGENTD_TOOL_ALLOW", "*, 127.0.0.1/32"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    wait_until_ok(&client, &format!("{base}/readyz"), Duration::from_secs(20)).await;
    let dead_tool = format!(
        "http://127.0.0.1:{}/t",
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    );
    let run = |body: Value| {
        let client = client.clone();
        let base = base.clone();
        async move {
            let r = client.post(format!("{base}/tasks?wait=true")).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }
    };
    // No traceparent: the task gets a trace of its own. Its tool fails.
    let ok = run(json!({"prompt": "[mock:tool_turns=1] [mock:tool=t]", "model": "mock/m",
                        "tools": [{"name": "t", "parameters": {"type": "object"}, "policy": "auto", "endpoint": dead_tool}]}))
    .await;
    assert_eq!(ok["status"], "completed");
    let trace = ok["trace_id"].as_str().expect("a trace id without a caller's traceparent").to_string();
    assert_eq!(trace.len(), 32);
    let failed = run(json!({"prompt": "[mock:fail=400]", "model": "mock/m"})).await;
    assert_eq!(failed["status"], "failed");
    unsafe { libc::kill(svc.child.id() as i32, libc::SIGTERM) };
    while svc.child.try_wait().unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spans: Vec<_> = bodies
        .lock()
        .unwrap()
        .iter()
        .flat_map(|(_, b)| ExportTraceServiceRequest::decode(b.as_slice()).unwrap().resource_spans)
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .collect();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let of_task = |t: &str| spans.iter().filter(move |s| hex(&s.trace_id) == t).collect::<Vec<_>>();

    let mine = of_task(&trace);
    let chat = mine
        .iter()
        .find(|s| s.name == "chat m")
        .unwrap_or_else(|| panic!("no chat span: {:?}", mine.iter().map(|s| &s.name).collect::<Vec<_>>()));
    assert_eq!(chat.kind, SpanKind::Client as i32);
    assert_eq!(attr(chat, "gen_ai.operation.name"), Some(&V::StringValue("chat".into())));
    assert_eq!(attr(chat, "gen_ai.provider.name"), Some(&V::StringValue("mock".into())));
    assert_eq!(attr(chat, "gen_ai.response.model"), Some(&V::StringValue("m".into())));
    for key in ["gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.request.max_tokens"] {
        assert!(
            matches!(attr(chat, key), Some(V::IntValue(n)) if *n > 0),
            "{key} is an integer: {:?}",
            attr(chat, key)
        );
    }
    let Some(V::ArrayValue(reasons)) = attr(chat, "gen_ai.response.finish_reasons") else { panic!("finish reasons") };
    assert!(!reasons.values.is_empty());
    let tool = mine.iter().find(|s| s.name == "execute_tool t").expect("a tool span");
    assert_eq!(tool.kind, SpanKind::Client as i32);
    assert_eq!(attr(tool, "gen_ai.operation.name"), Some(&V::StringValue("execute_tool".into())));
    assert_eq!(tool.status.as_ref().map(|s| s.code), Some(Code::Error as i32), "a tool error is an error");
    assert_eq!(attr(tool, "error.type"), Some(&V::StringValue("tool_error".into())));

    let theirs = of_task(failed["trace_id"].as_str().unwrap());
    let run_span = theirs.iter().find(|s| s.name == "run").expect("a run span");
    assert_eq!(run_span.status.as_ref().map(|s| s.code), Some(Code::Error as i32), "a failed run is an error");
    let call = theirs.iter().find(|s| s.name == "chat m").expect("the failed call's span");
    assert_eq!(call.status.as_ref().map(|s| s.code), Some(Code::Error as i32));
    assert_eq!(attr(call, "error.type"), Some(&V::StringValue("provider_rejected".into())));
}

/// `/metrics` of `base`, read by a Prometheus text-format parser.
async fn scrape(client: &reqwest::Client, base: &str) -> prometheus_parse::Scrape {
    let text = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
}

fn sample<'a>(
    s: &'a prometheus_parse::Scrape,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'a prometheus_parse::Value> {
    s.samples
        .iter()
        .find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| &x.value)
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text_with_help_for_every_family_and_zeros_from_the_start() {
    use prometheus_parse::Value as P;
    let db = test_db().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _svc = spawn_binary(&["serve"], &db.url, &[("SUBAGENTD_LISTEN", &format!("127.0.0.1:{port}"))]);
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    wait_until_ok(&client, &format!("{base}/readyz"), Duration::from_secs(20)).await;
    let s = scrape(&client, &base).await;
    // Every family has its HELP line, whether or not anything happened yet.
    let families = subagentd::telemetry::COUNTERS
        .iter()
        .chain(subagentd::telemetry::GAUGES)
        .chain(subagentd::telemetry::HISTOGRAMS);
    for (name, help) in families {
        let documented = s.docs.get(*name).map(String::as_str);
        if *name == "subagentd_http_request_duration_seconds" && documented.is_none() {
            continue; // (its first series comes with the first request it times: after this one)
        }
        assert_eq!(documented, Some(*help), "HELP of {name}");
    }
    // A fresh process: counters and histograms alerts watch are there, at zero.
    for (name, labels) in [
        ("subagentd_budget_refusals_total", vec![("limit", "usd_per_day"), ("stage", "admission")]),
        ("subagentd_rescued_total", vec![("to", "failed")]),
        ("subagentd_llm_errors_total", vec![("provider", "mock")]),
        ("subagentd_llm_retries_total", vec![("provider", "mock")]),
        ("subagentd_tasks_finished_total", vec![("status", "failed")]),
        ("subagentd_pauses_total", vec![]),
    ] {
        assert_eq!(sample(&s, name, &labels), Some(&P::Counter(0.0)), "{name} {labels:?}");
    }
    for name in ["subagentd_waiters", "subagentd_active_runs", "subagentd_budget_waiting"] {
        assert_eq!(sample(&s, name, &[]), Some(&P::Gauge(0.0)), "{name}");
    }
    let Some(P::Histogram(buckets)) = sample(&s, "subagentd_queue_wait_seconds", &[]) else {
        panic!("queue wait histogram: {:?}", sample(&s, "subagentd_queue_wait_seconds", &[]))
    };
    assert!(buckets.iter().all(|b| b.count == 0.0) && buckets.len() > 5);
    assert!(matches!(sample(&s, "subagentd_tasks", &[("status", "requires_action")]), Some(P::Gauge(_))));

    // Then they count.
    let r = client
        .post(format!("{base}/tasks?wait=true"))
        .json(&json!({"prompt": "x", "model": "mock/m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let s = scrape(&client, &base).await;
    assert_eq!(sample(&s, "subagentd_tasks_finished_total", &[("status", "completed")]), Some(&P::Counter(1.0)));
    assert!(matches!(
        sample(&s, "subagentd_llm_calls_total", &[("provider", "mock"), ("model", "mock/m")]),
        Some(P::Counter(n)) if *n >= 1.0
    ));
    assert!(s.docs.contains_key("subagentd_http_request_duration_seconds"));
}

#[tokio::test]
async fn a_finished_tasks_stream_ends_for_good_with_204_and_a_live_one_says_when_to_reconnect() {
    let db = test_db().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _svc = spawn_binary(
        &["serve"],
        &db.url,
        &[("SUBAGENTD_LISTEN", &format!("127.0.0.1:{port}")), ("SUBAGENTD_TOOL_ALLOW", "*, 127.0.0.1/32")],
    );
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    wait_until_ok(&client, &format!("{base}/readyz"), Duration::from_secs(20)).await;
    let tool =
        json!({"name": "t", "parameters": {"type": "object"}, "policy": "auto", "endpoint": "http://127.0.0.1:9/t"});
    let t: Value = client
        .post(format!("{base}/tasks"))
        .json(&json!({"prompt": "x [mock:tool_turns=2] [mock:delay_ms=200]", "model": "mock/m", "tools": [tool]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = format!("{base}/tasks/{}/events", t["id"].as_str().unwrap());
    let sse = |last: Option<String>| {
        let mut r = client.get(&url).header("accept", "text/event-stream");
        if let Some(l) = last {
            r = r.header("last-event-id", l);
        }
        r.send()
    };
    // Live: a retry hint first, then the events in the order they happened, to the end.
    let r = sse(None).await.unwrap();
    assert_eq!(r.status(), 200);
    let body =
        tokio::time::timeout(Duration::from_secs(20), r.text()).await.expect("the stream ends with the task").unwrap();
    assert!(
        body.starts_with("retry:") && body.lines().next().unwrap().trim_start_matches("retry:").trim() == "3000",
        "{body}"
    );
    let kinds: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("event:")).map(str::trim).collect();
    assert_eq!(kinds.last(), Some(&"finished"), "{body}");
    for turn in 0..2 {
        let finished = kinds.iter().enumerate().filter(|(_, k)| **k == "llm_call_finished").nth(turn).unwrap().0;
        let tools = kinds.iter().enumerate().filter(|(_, k)| **k == "tool_calls_started").nth(turn).unwrap().0;
        assert!(finished < tools, "turn {turn}: the call's end comes before its tools' start: {kinds:?}");
    }
    let last: String =
        body.lines().filter_map(|l| l.strip_prefix("id:")).map(str::trim).next_back().unwrap().to_string();
    // The reconnect an EventSource makes after the end: 204, which tells it to stop.
    let r = sse(Some(last.clone())).await.unwrap();
    assert_eq!(r.status(), 204);
    let r = client.get(format!("{url}?after={last}")).header("accept", "text/event-stream").send().await.unwrap();
    assert_eq!(r.status(), 204);
    // Earlier positions still replay what is left, then end.
    let r = sse(Some("1".into())).await.unwrap();
    assert_eq!(r.status(), 200);
    let rest = r.text().await.unwrap();
    let ids: Vec<&str> = rest.lines().filter_map(|l| l.strip_prefix("id:")).map(str::trim).collect();
    assert_eq!(ids.first(), Some(&"2"), "{rest}");
    assert!(rest.contains("finished"), "{rest}");
}
