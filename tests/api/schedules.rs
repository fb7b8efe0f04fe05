//! Runs at a time, runs on a schedule, and urgent runs first: a delayed task waits `scheduled`
//! and runs at its time on whichever replica; it can be cancelled meanwhile; a schedule ticking
//! every second across three replicas makes one task a tick; pause and resume; refusals named;
//! within a tenant, high before normal before low.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::*;

const ADMIN: &str = "schedules-admin";

async fn app() -> TestApp {
    spawn_app_with(|c| c.admin_token = Some(ADMIN.into()), true).await
}

async fn set_limits(app: &TestApp, tenant: &str, body: Value) {
    put_tenant_limits(&app.base, ADMIN, tenant, &body).await;
    // The replica that takes the PUT forgets its cached limits at once.
}

fn ts(v: &Value) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap()).unwrap().with_timezone(&chrono::Utc)
}

#[tokio::test]
async fn a_delayed_task_waits_scheduled_and_runs_at_its_time_on_another_replica() {
    // The API replica runs nothing; a worker process queues the task at its time and runs it.
    let app = spawn_app_with(|_| {}, false).await;
    let _worker = spawn_binary(&["worker"], &app.db.url, &[]);
    let t = app.submit(json!({"prompt": "later [mock:reply=on time]", "model": "mock/m", "delay_seconds": 3})).await;
    assert_eq!(t["status"], "scheduled", "{t}");
    let id = t["id"].as_str().unwrap();
    let run_at = ts(&t["run_at"]);
    // Listed as scheduled; not before its time.
    let listed = app.get_json("/tasks?status=scheduled").await;
    assert!(listed["tasks"].as_array().unwrap().iter().any(|x| x["id"] == id), "{listed}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(app.get_task(id).await["status"], "scheduled", "not before its time");
    let done = app.poll_until_terminal(id, Duration::from_secs(20)).await;
    assert_eq!((done["status"].as_str(), done["summary"].as_str()), (Some("completed"), Some("on time")), "{done}");
    let started = ts(&done["started_at"]);
    assert!(started >= run_at, "started {started} before its time {run_at}");
    assert!(started - run_at < chrono::TimeDelta::seconds(2), "queued within a second or so: {started} vs {run_at}");
    // Its queue wait counts from its start time, not from its submission 3 s before: in the
    // API and in the dashboards' view.
    let queue_ms = done["queue_ms"].as_i64().unwrap();
    assert!((0..3000).contains(&queue_ms), "queue_ms {queue_ms} counts the scheduled wait: {done}");
    let p50: f64 =
        sqlx::query_scalar("SELECT queue_wait_p50_ms FROM v_task_latency").fetch_one(&app.db.pool).await.unwrap();
    assert!((0.0..3000.0).contains(&p50), "v_task_latency's queue wait {p50} ms counts the scheduled wait");
    let events = app.get_json(&format!("/tasks/{id}/events")).await;
    let kinds: Vec<&str> = events["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(&kinds[..3], ["created", "queued", "claimed"], "{kinds:?}");
    assert_events_typed(&app.db.pool).await;
    app.stop().await;
}

#[tokio::test]
async fn a_scheduled_task_can_be_cancelled_counts_against_max_scheduled_and_a_past_time_runs_now() {
    let app = app().await;
    let far = (chrono::Utc::now() + chrono::TimeDelta::hours(1)).to_rfc3339();
    let t = app.submit(json!({"prompt": "p", "model": "mock/m", "run_at": far})).await;
    assert_eq!(t["status"], "scheduled");
    let id = t["id"].as_str().unwrap().to_string();
    let r = app.post_json(&format!("/tasks/{id}/cancel"), json!({})).await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let t = app.get_task(&id).await;
    assert_eq!((t["status"].as_str(), t["stop_reason"].as_str()), (Some("cancelled"), Some("cancelled")), "{t}");
    let calls: i64 = sqlx::query_scalar("SELECT count(*) FROM llm_calls").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(calls, 0, "it never ran");
    // A bulk cancel takes scheduled tasks too, unless a status filter says otherwise.
    let a = app.submit(json!({"prompt": "p", "model": "mock/m", "run_at": far})).await;
    let b = app.submit(json!({"prompt": "p", "model": "mock/m", "run_at": far})).await;
    let r: Value = app.post_json("/tasks/cancel", json!({"status": ["queued"]})).await.json().await.unwrap();
    assert_eq!(r["cancelled"], json!([]), "{r}");
    let r: Value = app.post_json("/tasks/cancel", json!({})).await.json().await.unwrap();
    let mut cancelled: Vec<&str> = r["cancelled"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    cancelled.sort();
    let mut want = vec![a["id"].as_str().unwrap(), b["id"].as_str().unwrap()];
    want.sort();
    assert_eq!(cancelled, want);
    // The tenant's cap on waiting tasks.
    set_limits(&app, "default", json!({"max_scheduled": 1, "max_queued": 0})).await;
    app.submit(json!({"prompt": "p", "model": "mock/m", "delay_seconds": 3600})).await;
    let r = app.post_task(json!({"prompt": "p", "model": "mock/m", "delay_seconds": 3600})).await;
    let p = assert_problem(r, 429, "scheduled_limit_reached").await;
    assert_eq!(p["limit"], "max_scheduled");
    // A time past is now: queued (here refused by max_queued 0 — it counts against the queue).
    let past = (chrono::Utc::now() - chrono::TimeDelta::minutes(5)).to_rfc3339();
    let r = app.post_task(json!({"prompt": "p", "model": "mock/m", "run_at": past})).await;
    assert_problem(r, 429, "queue_limit_reached").await;
    set_limits(&app, "default", json!({})).await;
    let t = app.submit(json!({"prompt": "p [mock:reply=now]", "model": "mock/m", "run_at": past})).await;
    assert_ne!(t["status"], "scheduled");
    // Bad times are named.
    for (body, field) in [
        (json!({"prompt": "p", "model": "mock/m", "run_at": "tomorrow"}), "run_at"),
        (json!({"prompt": "p", "model": "mock/m", "delay_seconds": -1}), "delay_seconds"),
        (json!({"prompt": "p", "model": "mock/m", "delay_seconds": 5, "run_at": far}), "run_at"),
        (json!({"prompt": "p", "model": "mock/m", "priority": "urgent"}), "priority"),
    ] {
        let p = assert_problem(app.post_task(body.clone()).await, 422, "validation_failed").await;
        assert!(p.to_string().contains(field), "{body}: {p}");
    }
    assert_events_typed(&app.db.pool).await;
    app.stop().await;
}

#[tokio::test]
async fn within_a_tenant_high_runs_before_normal_before_low() {
    let app = app().await;
    set_limits(&app, "default", json!({"max_running": 1})).await;
    // The one slot is taken; then low, normal and high arrive, in that order.
    let busy = app.submit(json!({"prompt": "busy [mock:delay_ms=1500]", "model": "mock/m"})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut ids = vec![];
    for p in ["low", "normal", "high", "low", "high"] {
        let t =
            app.submit(json!({"prompt": format!("{p} [mock:delay_ms=100]"), "model": "mock/m", "priority": p})).await;
        assert_eq!(t["priority"], p);
        ids.push((p, t["id"].as_str().unwrap().to_string()));
    }
    app.poll_until_terminal(busy["id"].as_str().unwrap(), Duration::from_secs(20)).await;
    let mut started = vec![];
    for (p, id) in &ids {
        let t = app.poll_until_terminal(id, Duration::from_secs(30)).await;
        started.push((ts(&t["started_at"]), *p, id.clone()));
    }
    started.sort();
    let order: Vec<&str> = started.iter().map(|s| s.1).collect();
    assert_eq!(order, ["high", "high", "normal", "low", "low"], "{started:?}");
    // Then arrival order: of two of one priority, the older first.
    let lows: Vec<&String> = started.iter().filter(|s| s.1 == "low").map(|s| &s.2).collect();
    assert!(lows[0] < lows[1], "the older low first");
    app.stop().await;
}

async fn put_schedule(app: &TestApp, name: &str, body: Value) -> reqwest::Response {
    app.client.put(app.url(&format!("/schedules/{name}"))).json(&body).send().await.unwrap()
}

#[tokio::test]
async fn a_schedule_ticking_every_second_across_three_replicas_makes_one_task_a_tick() {
    // The API replica runs nothing: three worker processes tick and run.
    let app = spawn_app_with(|_| {}, false).await;
    let workers: Vec<Proc> = (0..3).map(|_| spawn_binary(&["worker"], &app.db.url, &[])).collect();
    workers_up(&app.db.pool, 3, Duration::from_secs(30)).await;
    let r = put_schedule(
        &app,
        "every-second",
        json!({"cron": "* * * * * *", "task": {"prompt": "tick [mock:reply=tock]", "model": "mock/m", "metadata": {"kind": "tick"}}}),
    )
    .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let s: Value = r.json().await.unwrap();
    let first = ts(&s["next_run_at"]);
    // Ten ticks' time, and a little.
    let until = first + chrono::TimeDelta::seconds(9);
    while chrono::Utc::now() < until + chrono::TimeDelta::milliseconds(1500) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let paused: Value = app.post_json("/schedules/every-second/pause", json!({})).await.json().await.unwrap();
    assert_eq!(paused["paused"], true);
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT metadata->>'tick', metadata->>'kind' FROM tasks WHERE metadata->>'schedule' = 'every-second'
         AND (metadata->>'tick')::timestamptz BETWEEN $1 AND $2 ORDER BY 1",
    )
    .bind(first)
    .bind(until)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    let ticks: Vec<chrono::DateTime<chrono::Utc>> = rows.iter().map(|r| ts(&Value::String(r.0.clone()))).collect();
    let want: Vec<chrono::DateTime<chrono::Utc>> = (0..10).map(|i| first + chrono::TimeDelta::seconds(i)).collect();
    assert_eq!(ticks, want, "one task a tick, none twice, none missed");
    assert!(rows.iter().all(|r| r.1 == "tick"), "the body's metadata kept");
    let s: Value = app.get_json("/schedules/every-second").await;
    assert!(s["last_task_id"].is_string() && s["last_error"].is_null(), "{s}");
    // Paused: no more ticks.
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&app.db.pool).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&app.db.pool).await.unwrap();
    assert!(m <= n + 1, "paused, it ticks no more ({n} then {m})");
    // Resumed: it ticks again, from now on.
    let resumed: Value = app.post_json("/schedules/every-second/resume", json!({})).await.json().await.unwrap();
    assert_eq!(resumed["paused"], false);
    assert!(ts(&resumed["next_run_at"]) > chrono::Utc::now() - chrono::TimeDelta::seconds(1));
    let ticked = Instant::now();
    let mut k = m;
    while k < m + 2 && ticked.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        k = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&app.db.pool).await.unwrap();
    }
    assert!(k >= m + 2, "resumed, it ticks again ({m} then {k})");
    let listed = app.get_json("/schedules").await;
    assert_eq!(listed["schedules"].as_array().unwrap().len(), 1);
    assert_eq!(app.client.delete(app.url("/schedules/every-second")).send().await.unwrap().status(), 204);
    assert_eq!(app.client.get(app.url("/schedules/every-second")).send().await.unwrap().status(), 404);
    drop(workers);
    app.stop().await;
}

#[tokio::test]
async fn a_schedule_is_checked_as_a_submission_and_a_refused_tick_is_its_last_error() {
    let app = app().await;
    for (body, field) in [
        (json!({"cron": "61 * * * *", "task": {"prompt": "p", "model": "mock/m"}}), "cron"),
        (json!({"cron": "* * *", "task": {"prompt": "p", "model": "mock/m"}}), "cron"),
        (
            json!({"cron": "@hourly", "timezone": "Mars/Olympus", "task": {"prompt": "p", "model": "mock/m"}}),
            "timezone",
        ),
        (json!({"cron": "@hourly", "task": {"prompt": "p", "model": "nosuch/m"}}), "task.model"),
        (json!({"cron": "@hourly", "task": {"prompt": "", "model": "mock/m"}}), "task.prompt"),
        (json!({"cron": "@hourly", "task": {"prompt": "p", "model": "mock/m", "colour": "blue"}}), "task.colour"),
        (json!({"cron": "@hourly", "task": {"prompt": "p", "model": "mock/m", "delay_seconds": 5}}), "task.run_at"),
    ] {
        let p = assert_problem(put_schedule(&app, "bad", body.clone()).await, 422, "validation_failed").await;
        assert!(p.to_string().contains(field), "{body}: {p}");
    }
    assert_eq!(app.client.get(app.url("/schedules/bad")).send().await.unwrap().status(), 404, "nothing written");
    // From inside a sub-agent (its tool forwarding Subagent-Depth): its ticks would start tasks
    // at depth 0, so neither setting one nor resuming one is allowed there.
    let ok = json!({"cron": "@hourly", "task": {"prompt": "p", "model": "mock/m"}});
    let r = app.client.put(app.url("/schedules/deep")).header("subagent-depth", "1").json(&ok).send().await.unwrap();
    assert_problem(r, 422, "recursion_refused").await;
    assert_eq!(app.client.get(app.url("/schedules/deep")).send().await.unwrap().status(), 404, "nothing written");
    let paused = json!({"cron": "@hourly", "paused": true, "task": {"prompt": "p", "model": "mock/m"}});
    assert_eq!(put_schedule(&app, "deep", paused).await.status(), 201);
    let r = app.client.post(app.url("/schedules/deep/resume")).header("subagent-depth", "1").send().await.unwrap();
    assert_problem(r, 422, "recursion_refused").await;
    assert_eq!(app.get_json("/schedules/deep").await["paused"], true);
    // A tick the queue refuses: its error, and the schedule goes on.
    set_limits(&app, "default", json!({"max_queued": 0})).await;
    let r =
        put_schedule(&app, "refused", json!({"cron": "* * * * * *", "task": {"prompt": "p", "model": "mock/m"}})).await;
    assert_eq!(r.status(), 201);
    let started = Instant::now();
    let s = loop {
        let s = app.get_json("/schedules/refused").await;
        if s["last_error"].is_string() {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no tick: {s}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(s["last_error"].as_str().unwrap().starts_with("queue_limit_reached"), "{s}");
    assert!(ts(&s["next_run_at"]) > ts(&s["last_run_at"]), "not retried: it moved on");
    assert_eq!(app.task_count().await, 0);
    app.stop().await;
}
