//! Fault tests with real processes: kill -9, SIGTERM, cut database connections, cancel
//! mid-call. Figures they print go to RELIABILITY.md.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::chaos::ChaosProxy;
use crate::fakes::*;
use crate::helpers::*;

async fn all_terminal(app: &TestApp, ids: &[Uuid], within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let open: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tasks WHERE id = ANY($1) AND status IN ('queued', 'running')")
                .bind(ids)
                .fetch_one(&app.db.pool)
                .await
                .unwrap();
        if open == 0 {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The durability invariants over a set of finished tasks.
async fn assert_invariants(app: &TestApp, ids: &[Uuid]) {
    let not_completed: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT id, status FROM tasks WHERE id = ANY($1) AND status <> 'completed'")
            .bind(ids)
            .fetch_all(&app.db.pool)
            .await
            .unwrap();
    assert!(not_completed.is_empty(), "tasks not completed: {not_completed:?}");
    let finished_twice: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT task_id, count(*) FROM task_event_log WHERE kind = 'finished' AND task_id = ANY($1)
         GROUP BY task_id HAVING count(*) <> 1",
    )
    .bind(ids)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    assert!(finished_twice.is_empty(), "finished more or less than once: {finished_twice:?}");
    let billed_twice: Vec<(Uuid, i32, i64)> = sqlx::query_as(
        "SELECT task_id, turn, count(*) FROM llm_calls WHERE outcome = 'ok' AND task_id = ANY($1)
         GROUP BY task_id, turn HAVING count(*) > 1",
    )
    .bind(ids)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    assert!(billed_twice.is_empty(), "a completed turn was billed twice: {billed_twice:?}");
    let mismatched: Vec<(Uuid,)> = sqlx::query_as(
        "SELECT t.id FROM tasks t LEFT JOIN (
            SELECT task_id, sum(input_tokens) i, sum(output_tokens) o, count(*) FILTER (WHERE outcome = 'ok') turns
            FROM llm_calls GROUP BY task_id) l ON l.task_id = t.id
         WHERE t.id = ANY($1) AND (t.input_tokens <> coalesce(l.i, 0) OR t.output_tokens <> coalesce(l.o, 0)
               OR t.turns <> coalesce(l.turns, 0))",
    )
    .bind(ids)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    assert!(mismatched.is_empty(), "task usage differs from the ledger: {mismatched:?}");
    // Each ended task is one row, moved out of the queue (#47): none lost or left behind mid-move.
    let placed: Vec<(Uuid, i64, bool)> = sqlx::query_as(
        "SELECT id, count(*), bool_or(tableoid = 'task_queue'::regclass) FROM tasks WHERE id = ANY($1) GROUP BY id",
    )
    .bind(ids)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(placed.len(), ids.len(), "tasks missing");
    let misplaced: Vec<_> = placed.iter().filter(|(_, n, queued)| *n != 1 || *queued).collect();
    assert!(misplaced.is_empty(), "tasks in two places or still queued: {misplaced:?}");
}

async fn submit_many(app: &TestApp, n: usize, prompt: &str) -> Vec<Uuid> {
    let mut ids = vec![];
    for i in 0..n {
        let t = app.submit(json!({"prompt": format!("job {i} {prompt}"), "model": "mock/m", "max_turns": 20})).await;
        ids.push(t["id"].as_str().unwrap().parse().unwrap());
    }
    ids
}

fn worker_id(p: &Proc) -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "host".into());
    format!("{host}-{}", p.child.id())
}

const FAST_LEASE: &[(&str, &str)] = &[
    ("SUBAGENTD_LEASE_SECONDS", "2"),
    ("SUBAGENTD_HEARTBEAT_SECONDS", "1"),
    ("SUBAGENTD_MAX_ATTEMPTS", "50"),
    ("SUBAGENTD_CLAIM_BATCH", "8"),
];

/// A slow tool on loopback that counts the idempotency keys it sees.
async fn slow_tool() -> (Arc<Mutex<HashMap<String, u32>>>, String) {
    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let s2 = seen.clone();
    let app = axum::Router::new().route(
        "/slow",
        axum::routing::post(move |h: axum::http::HeaderMap| {
            let s2 = s2.clone();
            async move {
                let key = h.get("idempotency-key").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
                // Counted on arrival: a call whose worker died mid-call still counts.
                *s2.lock().unwrap().entry(key).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(150)).await;
                axum::Json(json!({"content": "ok"}))
            }
        }),
    );
    let url = format!("{}/slow", serve_router(app).await);
    (seen, url)
}

#[tokio::test]
async fn kill_dash_nine_at_random_points_loses_nothing_and_bills_nothing_twice() {
    let (tool_calls, tool_url) = slow_tool().await;
    let app = spawn_app_with(|c| c.tool_allow = "*, 127.0.0.1/32".into(), false).await; // the API; workers are real processes
    let env: Vec<(&str, &str)> = [FAST_LEASE, &[("SUBAGENTD_TOOL_ALLOW", "*, 127.0.0.1/32")]].concat();
    let mut workers: Vec<Proc> = (0..3).map(|_| spawn_binary(&["worker"], &app.db.url, &env)).collect();
    tokio::time::sleep(Duration::from_millis(800)).await;
    // Each task: 4 turns with a 150 ms tool call each (kills land mid-LLM-call, mid-tool-call,
    // between turns and during finish), then an answer.
    let mut ids = vec![];
    for i in 0..60 {
        let t = app
            .submit(json!({"prompt": format!("job {i} [mock:tool_turns=4] [mock:tool=slow] [mock:delay_ms=120]"), "model": "mock/m",
                           "max_turns": 20, "tools": [{"name": "slow", "parameters": {"type": "object"}, "policy": "auto", "endpoint": tool_url}]}))
            .await;
        ids.push(t["id"].as_str().unwrap().parse::<Uuid>().unwrap());
    }

    let mut kills: Vec<(Instant, chrono::DateTime<chrono::Utc>, String)> = vec![];
    for _ in 0..24 {
        let pause = rand::thread_rng().gen_range(100..500);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let i = rand::thread_rng().gen_range(0..workers.len());
        let victim = &mut workers[i];
        let id = worker_id(victim);
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(victim.child.id() as i32, libc::SIGKILL) };
        let _ = victim.child.wait();
        kills.push((Instant::now(), chrono::Utc::now(), id));
        workers[i] = spawn_binary(&["worker"], &app.db.url, &env);
    }
    assert!(all_terminal(&app, &ids, Duration::from_secs(120)).await, "tasks left unfinished after the kills");
    assert_invariants(&app, &ids).await;

    // Figures: how many attempts the kills cost, and the longest kill → re-claim gap.
    let claims: Vec<(Uuid, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT task_id, data->>'worker', created_at FROM task_event_log WHERE kind = 'claimed' AND task_id = ANY($1) ORDER BY created_at",
    )
    .bind(&ids)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    let mut by_task: HashMap<Uuid, Vec<(String, chrono::DateTime<chrono::Utc>)>> = HashMap::new();
    for (t, w, at) in claims {
        by_task.entry(t).or_default().push((w, at));
    }
    let mut max_gap = chrono::Duration::zero();
    let mut interrupted = 0;
    for (_, _, w) in &kills {
        let at = kills.iter().find(|k| &k.2 == w).unwrap().1;
        for claims in by_task.values() {
            if let Some(pos) = claims.iter().position(|(cw, ca)| cw == w && *ca <= at) {
                if let Some((_, next)) = claims.get(pos + 1) {
                    if *next > at {
                        interrupted += 1;
                        max_gap = max_gap.max(*next - at);
                    }
                }
            }
        }
    }
    let attempts: i64 = sqlx::query_scalar("SELECT sum(attempt)::bigint FROM tasks WHERE id = ANY($1)")
        .bind(&ids)
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    let repeated_calls: i64 =
        sqlx::query_scalar("SELECT count(*) FROM llm_calls WHERE task_id = ANY($1) AND attempt > 1")
            .bind(&ids)
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    let (tool_total, tool_repeated) = {
        let seen = tool_calls.lock().unwrap();
        (seen.values().sum::<u32>(), seen.values().filter(|n| **n > 1).count())
    };
    println!(
        "RELIABILITY kill-9: tasks={} kills={} interrupted_runs={} attempts={} calls_by_later_attempts={} \
         tool_calls={tool_total} tool_calls_repeated_with_same_key={tool_repeated} duplicates=0 lost=0 max_kill_to_reclaim_ms={}",
        ids.len(),
        kills.len(),
        interrupted,
        attempts,
        repeated_calls,
        max_gap.num_milliseconds()
    );
    assert!(interrupted > 0, "the kills should have interrupted some runs");
    app.stop().await;
}

#[tokio::test]
async fn sigterm_drains_and_released_tasks_finish_on_the_other_process() {
    let app = spawn_app_with(|_| {}, false).await;
    let env: Vec<(&str, &str)> = [FAST_LEASE, &[("SUBAGENTD_DRAIN_GRACE_SECONDS", "1")]].concat();
    let mut a = spawn_binary(&["worker"], &app.db.url, &env);
    workers_up(&app.db.pool, 1, Duration::from_secs(30)).await;
    let ids = submit_many(&app, 20, "[mock:tool_turns=8] [mock:delay_ms=300]").await;
    // Let A take the work, then start B and drain A.
    let taken = Instant::now();
    while taken.elapsed() < Duration::from_secs(30) {
        let running: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE id = ANY($1) AND status = 'running'")
            .bind(&ids)
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
        if running > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _b = spawn_binary(&["worker"], &app.db.url, FAST_LEASE);
    let sent = Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGTERM) };
    let status = a.child.wait().unwrap();
    let drained_in = sent.elapsed();
    assert!(status.success(), "a drained worker exits cleanly: {status}");
    assert!(all_terminal(&app, &ids, Duration::from_secs(60)).await);
    assert_invariants(&app, &ids).await;
    // Each claim counts an attempt and a release takes it back, so a released task ends on its
    // first attempt, plus one for each time a starved worker's lease expired and it was rescued
    // (a 2 s lease on a loaded machine: a rescue counts, a release does not).
    let released: Vec<(Uuid, i32, i64)> = sqlx::query_as(
        "SELECT t.id, t.attempt, (SELECT count(*) FROM task_event_log e WHERE e.task_id = t.id AND e.kind = 'rescued')
         FROM tasks t WHERE t.id = ANY($1)
         AND EXISTS (SELECT 1 FROM task_event_log e WHERE e.task_id = t.id AND e.kind = 'released')",
    )
    .bind(&ids)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    assert!(!released.is_empty(), "the drain should have released running tasks");
    assert!(
        released.iter().all(|r| i64::from(r.1) == 1 + r.2),
        "a release does not count an attempt (id, attempt, rescues): {released:?}"
    );
    println!(
        "RELIABILITY sigterm: tasks={} released={} drain_ms={}",
        ids.len(),
        released.len(),
        drained_in.as_millis()
    );
    app.stop().await;
}

#[tokio::test]
async fn cutting_the_database_connections_under_load_loses_no_task() {
    let db = test_db().await;
    let url = url::Url::parse(&db.url).unwrap();
    let upstream = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
    let proxy = ChaosProxy::start(upstream).await;
    let mut via = url.clone();
    via.set_port(Some(proxy.port)).unwrap();
    let pool = subagentd::db::connect(via.as_str(), 8).await.unwrap();
    let cfg = std::sync::Arc::new({
        let mut c = test_config(via.as_str());
        c.lease_seconds = 10;
        c
    });
    let service = subagentd::service::Service::start(
        cfg,
        pool,
        subagentd::llm::Providers::with_builtin(),
        std::sync::Arc::new(subagentd::engine::definitions::FileAgents::default()),
        subagentd::service::Roles { api: true, workers: true },
    )
    .await
    .unwrap();
    let app = TestApp {
        base: format!("http://{}", service.addr.unwrap()),
        db,
        client: reqwest::Client::new(),
        service: Some(service),
    };
    let ids = submit_many(&app, 30, "[mock:tool_turns=3] [mock:delay_ms=200]").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    proxy.cut();
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503, "not ready while the database is unreachable");
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.restore();
    assert!(all_terminal(&app, &ids, Duration::from_secs(60)).await, "tasks stuck after the database returned");
    assert_invariants(&app, &ids).await;
    assert_eq!(app.client.get(app.url("/readyz")).send().await.unwrap().status(), 200);
    app.stop().await;
}

#[tokio::test]
async fn cancel_during_an_llm_call_drops_the_provider_request() {
    let (fake, base) = serve("/v1/chat/completions").await;
    let file: subagentd::config::FileConfig =
        toml::from_str(&format!("[providers.slow]\nkind = \"openai\"\nbase_url = \"{base}/v1\"\n")).unwrap();
    let providers = subagentd::llm::Providers::from_config(&file, &|_| None).unwrap();
    let app = spawn_app_opts(|_| {}, AppOptions { providers, ..AppOptions::default() }).await;
    fake.push(Answer::json(openai_text("never seen", 1, 1, 0)).after(Duration::from_secs(20)));
    let t = app.submit(json!({"prompt": "x", "model": "slow/gpt-4o"})).await;
    let id = t["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake.seen().is_empty() {
        assert!(Instant::now() < deadline, "the provider was never called");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked = Instant::now();
    let r = app.client.post(app.url(&format!("/tasks/{id}/cancel"))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let done = app.poll_until_terminal(&id, Duration::from_secs(10)).await;
    assert_eq!(done["status"], "cancelled");
    while *fake.dropped.lock().unwrap() == 0 {
        assert!(Instant::now() < deadline + Duration::from_secs(5), "the provider request was not dropped");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("RELIABILITY cancel: cancel_to_connection_closed_ms={}", asked.elapsed().as_millis());
    let _: Value = done;
    app.stop().await;
}

#[tokio::test]
async fn bulk_cancel_stops_the_matching_tasks_of_the_caller_only() {
    let app = spawn_app_with(|_| {}, false).await;
    let a = app.submit(json!({"prompt": "x", "model": "mock/m", "metadata": {"batch": "a", "n": 1}})).await;
    let b = app.submit(json!({"prompt": "x", "model": "mock/m", "metadata": {"batch": "b"}})).await;
    let r = app.client.post(app.url("/tasks/cancel")).json(&json!({"metadata": {"batch": "a"}})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["cancelled"], json!([a["id"]]));
    assert_eq!(app.get_task(a["id"].as_str().unwrap()).await["status"], "cancelled");
    assert_eq!(app.get_task(b["id"].as_str().unwrap()).await["status"], "queued");
    let r = app.client.post(app.url("/tasks/cancel")).json(&json!({"status": ["completed"]})).send().await.unwrap();
    assert_problem(r, 422, "validation_failed").await;
    app.stop().await;
}

#[tokio::test]
async fn a_task_past_its_time_limit_ends_incomplete_with_timeout() {
    let app = spawn_app().await;
    let t = app.submit(json!({"prompt": "x [mock:tool_turns=50] [mock:delay_ms=200]", "model": "mock/m", "max_turns": 50, "timeout_seconds": 0.5})).await;
    let done = app.poll_until_terminal(t["id"].as_str().unwrap(), Duration::from_secs(20)).await;
    assert_eq!(done["status"], "incomplete");
    assert_eq!(done["stop_reason"], "timeout");
    assert!(done["turns"].as_i64().unwrap() < 50);
    let r = app.post_task(json!({"prompt": "x", "model": "mock/m", "timeout_seconds": -1})).await;
    assert_problem(r, 422, "validation_failed").await;
    app.stop().await;
}

#[tokio::test]
async fn retention_purges_old_conversations_and_events_but_keeps_tasks_and_the_ledger() {
    // The service's own passes are off: this test runs them.
    let app = spawn_app_without_retention().await;
    let t = app.post_json("/tasks?wait=true", json!({"prompt": "x", "model": "mock/m"})).await;
    let t: Value = t.json().await.unwrap();
    let id: Uuid = t["id"].as_str().unwrap().parse().unwrap();
    sqlx::query("SELECT subagentd_month_partition('tasks', (now() - interval '40 days')::date)")
        .execute(&app.db.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE tasks SET finished_at = now() - interval '40 days', history_at = now() - interval '40 days' WHERE id = $1")
        .bind(id)
        .execute(&app.db.pool)
        .await
        .unwrap();
    let fresh = app.post_json("/tasks?wait=true", json!({"prompt": "y", "model": "mock/m"})).await;
    let fresh: Value = fresh.json().await.unwrap();
    // Its conversation and events were written 40 days ago: they sit in that day's partitions,
    // which retention drops whole.
    for table in ["task_messages", "task_events"] {
        sqlx::query("SELECT subagentd_partition($1, (now() AT TIME ZONE 'UTC' - interval '40 days')::date)")
            .bind(table)
            .execute(&app.db.pool)
            .await
            .unwrap();
        sqlx::query(&format!("UPDATE {table} SET created_at = now() - interval '40 days' WHERE task_id = $1"))
            .bind(id)
            .execute(&app.db.pool)
            .await
            .unwrap();
        let dropped = subagentd::store::partitions::drop_expired(&app.db.pool, table, 30).await.unwrap();
        assert_eq!(dropped.len(), 1, "{table}: {dropped:?}");
    }
    let count = |sql: &'static str, id: Uuid| {
        let pool = app.db.pool.clone();
        async move { sqlx::query_scalar::<_, i64>(sql).bind(id).fetch_one(&pool).await.unwrap() }
    };
    assert_eq!(count("SELECT count(*) FROM task_message_log WHERE task_id = $1", id).await, 0);
    assert_eq!(count("SELECT count(*) FROM task_event_log WHERE task_id = $1", id).await, 0);
    assert_eq!(count("SELECT count(*) FROM llm_calls WHERE task_id = $1", id).await, 1);
    assert_eq!(count("SELECT count(*) FROM tasks WHERE id = $1", id).await, 1);
    let fresh_id: Uuid = fresh["id"].as_str().unwrap().parse().unwrap();
    assert!(count("SELECT count(*) FROM task_message_log WHERE task_id = $1", fresh_id).await > 0);

    // The ledger has its own, longer retention; the rollups keep its sums.
    let rollup_before: i64 =
        sqlx::query_scalar("SELECT sum(calls)::bigint FROM usage_daily").fetch_one(&app.db.pool).await.unwrap();
    // Its call made 500 days ago: filed under that day (a row's time is its key's).
    sqlx::query("SELECT subagentd_partition('llm_calls', (now() AT TIME ZONE 'UTC' - interval '500 days')::date)")
        .execute(&app.db.pool)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE llm_calls SET (call_key, created_at) =
             (SELECT k, subagentd_uuid_time(k) FROM (SELECT subagentd_uuidv7(now() - interval '500 days') AS k) g)
         WHERE task_id = $1",
    )
    .bind(id)
    .execute(&app.db.pool)
    .await
    .unwrap();
    let dropped = subagentd::store::partitions::drop_expired(&app.db.pool, "llm_calls", 400).await.unwrap();
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert_eq!(count("SELECT count(*) FROM llm_calls WHERE task_id = $1", id).await, 0);
    let rollup_after: i64 =
        sqlx::query_scalar("SELECT sum(calls)::bigint FROM usage_daily").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(rollup_before, rollup_after);
    app.stop().await;
}

/// A turn the database refuses for what it holds (a NUL in its text was one, before tool results
/// were made storable) fails its task at once, naming why: never rescued to do the work again
/// and end `worker_lost` minutes later. The refusal is made here by a trigger that refuses any
/// conversation row holding a marker, with the code PostgreSQL gives a NUL in JSON (22P05).
#[tokio::test]
async fn a_turn_the_database_refuses_fails_its_task_at_once_naming_why_and_its_waiter_hears_it() {
    let app = crate::helpers::spawn_app().await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_marked() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN
                  IF NEW::text LIKE '%refuse-this-turn%' THEN
                    RAISE EXCEPTION 'unsupported Unicode escape sequence' USING ERRCODE = '22P05';
                  END IF;
                  RETURN NEW;
                END $$;
         CREATE TRIGGER refuse_marked BEFORE INSERT ON task_messages FOR EACH ROW EXECUTE FUNCTION refuse_marked();",
    )
    .execute(&app.db.pool)
    .await
    .unwrap();
    // The run's last turn (its end's commit), then a turn in the middle (a checkpoint).
    for prompt in ["refuse-this-turn", "refuse-this-turn [mock:tool_turns=2]"] {
        let r = app
            .client
            .post(app.url("/tasks?wait=true&timeout=120"))
            .json(&serde_json::json!({"prompt": prompt, "model": "mock/m"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "the waiter is answered when the task ends, not before");
        let t: serde_json::Value = r.json().await.unwrap();
        assert_eq!(t["status"], "failed", "{prompt}: {t}");
        assert_eq!(t["error"]["code"], "checkpoint_failed", "{prompt}: {t}");
        let message = t["error"]["message"].as_str().unwrap();
        assert!(message.contains("could not be stored") && message.contains("unsupported Unicode"), "{message}");
        assert_eq!(t["attempt"], 1, "{prompt}: not tried again: {t}");
        let id = t["id"].as_str().unwrap();
        let ev: serde_json::Value =
            app.client.get(app.url(&format!("/tasks/{id}/events"))).send().await.unwrap().json().await.unwrap();
        let kinds: Vec<&str> = ev["events"].as_array().unwrap().iter().filter_map(|e| e["kind"].as_str()).collect();
        assert!(!kinds.contains(&"rescued") && kinds.last() == Some(&"finished"), "{kinds:?}");
    }
    // A task whose turns hold no marker runs as ever.
    let r = app
        .client
        .post(app.url("/tasks?wait=true&timeout=60"))
        .json(&serde_json::json!({"prompt": "fine [mock:tool_turns=1]", "model": "mock/m"}))
        .send()
        .await
        .unwrap();
    let t: serde_json::Value = r.json().await.unwrap();
    assert_eq!(t["status"], "completed", "{t}");
}
