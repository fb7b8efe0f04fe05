//! Budgets that can be spent: a burst waits for reservations to settle instead of failing on
//! money it has, calls go ahead with fewer output tokens when that is all the budget affords,
//! and a run ends `incomplete` / `budget` only when not even its smallest call fits.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::*;

const ADMIN: &str = "budget-admin";

async fn set_limits(app: &TestApp, limits: Value) {
    put_tenant_limits(&app.base, ADMIN, "default", &limits).await;
}

/// A padded prompt, so that each call costs about $0.0006 at the mock's prices.
fn job(i: usize, extra: &str) -> String {
    format!("job {i}: summarise the incident log. {} [mock:tool_turns=2] {extra}", "Context line. ".repeat(90))
}

async fn sum_f64(app: &TestApp, sql: &str) -> f64 {
    sqlx::query_scalar::<_, Option<f64>>(sql).fetch_one(&app.db.pool).await.unwrap().unwrap_or(0.0)
}

/// Waits for budget, from the events: (number of waits, p50 and p99 of their length in ms).
async fn waits(app: &TestApp) -> (usize, f64, f64) {
    let mut ms: Vec<f64> = sqlx::query_scalar::<_, Option<f64>>(
        "SELECT extract(epoch FROM (SELECT min(c.created_at) FROM task_event_log c WHERE c.task_id = w.task_id
                 AND c.kind = 'claimed' AND c.seq > w.seq) - w.created_at)::float8 * 1000
         FROM task_event_log w WHERE w.kind = 'budget_wait'",
    )
    .fetch_all(&app.db.pool)
    .await
    .unwrap()
    .into_iter()
    .flatten()
    .collect();
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| if ms.is_empty() { 0.0 } else { ms[((ms.len() - 1) as f64 * p).round() as usize] };
    (ms.len(), pct(0.5), pct(0.99))
}

/// After a burst: every task is terminal, spend is within the limit and uses at least 95% of
/// it, what is left is less than any task's smallest call (so no run ended on money that was
/// only reserved), and no reservation outlives its run. Returns the share spent.
async fn assert_spent_well(app: &TestApp, ids: &[String], limit: f64, label: &str) -> f64 {
    let started = Instant::now();
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for id in ids {
        let t = app.poll_until_terminal(id, Duration::from_secs(120)).await;
        let key = format!("{}/{}", t["status"].as_str().unwrap(), t["stop_reason"].as_str().unwrap_or("-"));
        *outcomes.entry(key).or_default() += 1;
    }
    let spent = sum_f64(app, "SELECT sum(cost_usd)::float8 FROM llm_calls").await;
    let rollup = sum_f64(app, "SELECT sum(cost_usd)::float8 FROM usage_daily").await;
    let reserved = sum_f64(app, "SELECT sum(reserved_usd)::float8 FROM tasks").await;
    let (n, p50, p99) = waits(app).await;
    let share = spent / limit;
    println!(
        "BUDGET {label}: limit={limit} spent={spent:.6} share={:.1}% outcomes={outcomes:?} waits={n} wait_p50_ms={p50:.0} wait_p99_ms={p99:.0} drained_in_ms={}",
        share * 100.0,
        started.elapsed().as_millis()
    );
    assert!(spent <= limit + 1e-12, "spent {spent} over the limit {limit}");
    assert!(share >= 0.95, "only {:.1}% of the budget was spent", share * 100.0);
    assert!((spent - rollup).abs() < 1e-9);
    assert_eq!(reserved, 0.0, "no reservation outlives its run");
    assert!(outcomes.get("incomplete/budget").is_some_and(|n| *n > 0), "the budget stopped some runs: {outcomes:?}");
    assert!(n > 0, "a burst over the budget waits");
    // The smallest call of these tasks: a prompt of 2,500 to 3,000 characters by the third turn,
    // at 3 characters a token, and 256 output tokens, at $1 / $2 per million: $0.0013–0.0015.
    // Less than that is left, or a run ended on money that was only reserved.
    assert!(limit - spent < 0.0015, "{} left: a run ended on money that was only reserved", limit - spent);
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status IN ('queued', 'running')")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(open, 0);
    share
}

#[tokio::test]
async fn a_burst_spends_at_least_95_percent_of_the_budget_and_never_more_and_then_admission_is_402() {
    let limit = 0.05;
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into()), false).await;
    let mut ids = vec![];
    for i in 0..50 {
        ids.push(
            app.submit(json!({"prompt": job(i, ""), "model": "mock/m", "max_turns": 10})).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    set_limits(&app, json!({"usd_per_day": limit})).await;
    // One worker process runs all 50 at once, with the default output cap of 4,096 tokens: each
    // call reserves about $0.009, so the budget holds five or six calls in flight.
    let _worker = spawn_binary(&["worker"], &app.db.url, &[("SUBAGENTD_MAX_RUNNING", "64")]);
    assert_spent_well(&app, &ids, limit, "one worker").await;
    // The budget is spent: less than any call is left, and admission says so.
    let r = app.post_task(json!({"prompt": job(99, ""), "model": "mock/m"})).await;
    assert_eq!(assert_problem(r, 402, "budget_exhausted").await["limit"], "usd_per_day");
    app.stop().await;
}

#[tokio::test]
async fn the_same_holds_across_two_worker_processes_and_with_a_per_task_cap() {
    let limit = 0.05;
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into()), false).await;
    let mut ids = vec![];
    for i in 0..50 {
        let body = json!({"prompt": job(i, ""), "model": "mock/m", "max_turns": 10, "max_cost_usd": 0.003});
        ids.push(app.submit(body).await["id"].as_str().unwrap().to_string());
    }
    set_limits(&app, json!({"usd_per_day": limit})).await;
    let _a = spawn_binary(&["worker"], &app.db.url, &[("SUBAGENTD_MAX_RUNNING", "32")]);
    let _b = spawn_binary(&["worker"], &app.db.url, &[("SUBAGENTD_MAX_RUNNING", "32")]);
    assert_spent_well(&app, &ids, limit, "two workers, max_cost_usd 0.003").await;
    let over: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tasks WHERE cost_usd > 0.003").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(over, 0, "no task passed its own max_cost_usd");
    app.stop().await;
}

/// A tenant whose budget holds one whole call in flight, a task holding it for `hold_ms`, and a
/// second task that must wait for it; returns (app, the holder's id, the waiter's id).
async fn one_holds_one_waits(hold_ms: u64, waiter: Value) -> (TestApp, String, String) {
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into()), true).await;
    // A whole call reserves about $0.0089 (4,096 output tokens at $2 per million, and the prompt).
    set_limits(&app, json!({"usd_per_day": 0.012})).await;
    let holder = app.submit(json!({"prompt": format!("hold [mock:delay_ms={hold_ms}]"), "model": "mock/m"})).await;
    let holder = holder["id"].as_str().unwrap().to_string();
    // Its reservation is held before the second one asks.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held = sum_f64(&app, "SELECT sum(reserved_usd)::float8 FROM tasks").await;
        if held > 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the first task never reserved");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let w = app.submit(waiter).await["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let t = app.get_task(&w).await;
        if t["waiting_for"] == "budget" {
            assert_eq!(t["status"], "queued", "a waiting run holds no worker, lease or running place");
            break;
        }
        assert!(Instant::now() < deadline, "the second task never waited: {t}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (app, holder, w)
}

#[tokio::test]
async fn a_run_waits_for_budget_then_continues_when_the_reservation_settles() {
    let (app, holder, w) = one_holds_one_waits(1500, json!({"prompt": "next", "model": "mock/m"})).await;
    let t = app.poll_until_terminal(&w, Duration::from_secs(20)).await;
    assert_eq!((t["status"].as_str(), t["waiting_for"].as_str()), (Some("completed"), None), "{t}");
    assert_eq!(app.get_task(&holder).await["status"], "completed");
    let kinds: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM task_event_log WHERE task_id = $1::uuid ORDER BY seq")
            .bind(&w)
            .fetch_all(&app.db.pool)
            .await
            .unwrap();
    let at = kinds.iter().position(|k| k == "budget_wait").expect("a budget_wait event");
    assert_eq!(kinds[at + 1], "claimed", "woken and claimed again: {kinds:?}");
    assert_eq!(t["attempt"], 1, "a wait does not count as an attempt");
    let data: Value =
        sqlx::query_scalar("SELECT data FROM task_event_log WHERE task_id = $1::uuid AND kind = 'budget_wait'")
            .bind(&w)
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    assert_eq!(data["limit"], "usd_per_day");
    assert!(data["want_usd"].as_f64().unwrap() > 0.008, "it waits for the whole call: {data}");
    assert_events_typed(&app.db.pool).await;
    app.stop().await;
}

#[tokio::test]
async fn a_waiting_run_is_cancelled_at_once() {
    let (app, holder, w) = one_holds_one_waits(3000, json!({"prompt": "next", "model": "mock/m"})).await;
    let asked = Instant::now();
    let r = app.client.post(app.url(&format!("/tasks/{w}/cancel"))).send().await.unwrap();
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["status"], "cancelled", "{t}");
    assert!(asked.elapsed() < Duration::from_secs(1));
    let calls: i64 = sqlx::query_scalar("SELECT count(*) FROM llm_calls WHERE task_id = $1::uuid")
        .bind(&w)
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(calls, 0);
    assert_eq!(app.poll_until_terminal(&holder, Duration::from_secs(20)).await["status"], "completed");
    app.stop().await;
}

#[tokio::test]
async fn a_waiting_run_ends_at_its_time_limit() {
    let (app, _holder, w) =
        one_holds_one_waits(6000, json!({"prompt": "next", "model": "mock/m", "timeout_seconds": 1})).await;
    let t = app.poll_until_terminal(&w, Duration::from_secs(10)).await;
    assert_eq!((t["status"].as_str(), t["stop_reason"].as_str()), (Some("incomplete"), Some("timeout")), "{t}");
    assert!(t["summary"].as_str().unwrap().contains("waited for budget"), "{t}");
    assert!(t["run_ms"].as_i64().unwrap() < 5000, "ended by its limit, not by the holder's end: {t}");
    app.stop().await;
}

#[tokio::test]
async fn a_call_the_budget_cannot_afford_whole_goes_ahead_with_fewer_output_tokens() {
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into()), true).await;
    // $0.004 affords the prompt and about 1,600 output tokens, not 4,096.
    set_limits(&app, json!({"usd_per_day": 0.004})).await;
    let t = app.wait_task(json!({"prompt": "short", "model": "mock/m"})).await;
    assert_eq!(t["status"], "completed", "{t}");
    let started: Value =
        sqlx::query_scalar("SELECT data FROM task_event_log WHERE task_id = $1::uuid AND kind = 'llm_call_started'")
            .bind(t["id"].as_str().unwrap())
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    let granted = started["max_tokens"].as_u64().unwrap();
    assert!((256..4096).contains(&granted), "lowered to what is affordable: {started}");
    assert!(started["reserved_usd"].as_f64().unwrap() <= 0.004, "{started}");
    app.stop().await;
}
