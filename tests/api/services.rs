//! The long-running services of a worker process, one pass each (their test hook), against a
//! real database.

use std::sync::Arc;
use std::time::Duration;

use subagentd::engine::{StopCause, StopSignal};
use subagentd::hub::Hub;
use subagentd::jobs::claim::ClaimLoop;
use subagentd::jobs::heartbeat::Heartbeat;
use subagentd::jobs::rescuer::Rescuer;
use subagentd::jobs::retention::{Purged, Retention};
use subagentd::jobs::webhooks::WebhookSender;
use subagentd::jobs::worker::Worker;
use subagentd::llm::Providers;
use subagentd::store::Fence;
use uuid::Uuid;

use crate::helpers::*;

/// A task row in `status`, written straight to the table (with its tenant's row).
pub(crate) async fn task(db: &TestDb, status: &str, extra: &str) -> Uuid {
    sqlx::query("INSERT INTO tenants (name) VALUES ('default') ON CONFLICT DO NOTHING")
        .execute(&db.pool)
        .await
        .unwrap();
    let id = Uuid::now_v7();
    let finished =
        if matches!(status, "scheduled" | "queued" | "running" | "requires_action") { "NULL" } else { "now()" };
    sqlx::query(&format!(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, finished_at, history_at)
         VALUES ($1, 'default', $2, 'general', 'p [mock:reply=ok]', 'mock/m', '{{\"max_turns\": 3}}', {finished},
                 coalesce({finished}::timestamptz, 'infinity'))"
    ))
    .bind(id)
    .bind(status)
    .execute(&db.pool)
    .await
    .unwrap();
    // The months an `extra` may move a finished task back into.
    sqlx::query("SELECT subagentd_month_partition('tasks', (now() - make_interval(months => k))::date) FROM generate_series(1, 3) k")
        .execute(&db.pool)
        .await
        .unwrap();
    if !extra.is_empty() {
        sqlx::query(&format!("UPDATE tasks SET {extra} WHERE id = $1")).bind(id).execute(&db.pool).await.unwrap();
    }
    id
}

pub(crate) async fn status(db: &TestDb, id: Uuid) -> String {
    sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1").bind(id).fetch_one(&db.pool).await.unwrap()
}

#[tokio::test]
async fn a_rescuer_pass_requeues_an_expired_lease_and_fails_a_task_out_of_attempts() {
    let db = test_db().await;
    let expired = "lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second', attempt = 1";
    let (again, lost) = (task(&db, "running", expired).await, task(&db, "running", expired).await);
    sqlx::query("UPDATE tasks SET attempt = 3 WHERE id = $1").bind(lost).execute(&db.pool).await.unwrap();
    let live =
        task(&db, "running", "lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour'").await;
    let r = Rescuer {
        pool: db.pool.clone(),
        hub: Hub::new(),
        max_attempts: 3,
        every: Duration::from_secs(1),
        grace: Duration::ZERO,
    };
    assert_eq!(r.pass().await.unwrap(), 2);
    assert_eq!(
        (status(&db, again).await, status(&db, lost).await, status(&db, live).await),
        ("queued".into(), "failed".into(), "running".into())
    );
    assert_eq!(r.pass().await.unwrap(), 0, "nothing left to rescue");
    assert_events_typed(&db.pool).await;
}

#[tokio::test]
async fn a_retention_pass_purges_what_is_past_retention_and_keeps_the_rest() {
    let db = test_db().await;
    let old =
        task(&db, "completed", "finished_at = now() - interval '40 days', history_at = now() - interval '40 days'")
            .await;
    let new = task(&db, "completed", "").await;
    // Queued for 40 days (an open task): its rows are as old, and kept (moved to today's partition).
    let open = task(&db, "queued", "").await;
    sqlx::query("SELECT subagentd_partition('task_events', (now() AT TIME ZONE 'UTC' - interval '40 days')::date)")
        .execute(&db.pool)
        .await
        .unwrap();
    for (id, age) in [(old, "40 days"), (new, "0 days"), (open, "40 days")] {
        sqlx::query(
            "INSERT INTO task_events (task_id, seq, kind, created_at) VALUES ($1, 1, 'created', now() - $2::interval)",
        )
        .bind(id)
        .bind(age)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let r =
        Retention { pool: db.pool.clone(), days: 30, ledger_days: 0, mcp_idle_days: 30, every: Duration::from_secs(1) };
    // The day partition 40 days old is dropped whole (task_messages had none that old).
    assert_eq!(r.pass().await.unwrap(), Purged { partitions: 1, ledger_partitions: 0, sessions: 0 });
    let mut left: Vec<Uuid> =
        sqlx::query_scalar("SELECT task_id FROM task_event_log").fetch_all(&db.pool).await.unwrap();
    left.sort();
    let mut want = vec![new, open];
    want.sort();
    assert_eq!(left, want);
    let gone: Option<String> =
        sqlx::query_scalar("SELECT relname::text FROM pg_class WHERE relname = 'task_events_p' || to_char((now() AT TIME ZONE 'UTC' - interval '40 days')::date, 'YYYYMMDD')")
            .fetch_optional(&db.pool)
            .await
            .unwrap();
    assert_eq!(gone, None, "the partition itself is gone, not emptied");
}

#[tokio::test]
async fn the_running_retention_job_forgets_per_minute_counts_past_their_hours_and_keeps_the_recent() {
    let db = test_db().await;
    // Finishes are kept two hours, web fetch counts one: 90 minutes old is past one and not the other.
    for (age, tenant) in [("3 hours", "old"), ("90 minutes", "mid"), ("10 minutes", "new")] {
        sqlx::query(
            "INSERT INTO finished_minutes (minute, tenant, status, backend, tasks)
             VALUES (date_trunc('minute', now() - $1::interval), $2, 'completed', 1, 4)",
        )
        .bind(age)
        .bind(tenant)
        .execute(&db.pool)
        .await
        .unwrap();
        sqlx::query("INSERT INTO web_fetch_minutes (tenant, minute, n) VALUES ($2, date_trunc('minute', now() - $1::interval), 4)")
            .bind(age)
            .bind(tenant)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    // The job as the service starts it (every window off: the minutes go whatever the windows).
    let stop = tokio_util::sync::CancellationToken::new();
    let job = Retention {
        pool: db.pool.clone(),
        days: 0,
        ledger_days: 0,
        mcp_idle_days: 0,
        every: Duration::from_millis(100),
    }
    .start(stop.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut left = vec![];
        for table in ["finished_minutes", "web_fetch_minutes"] {
            let q = format!("SELECT tenant FROM {table} ORDER BY tenant");
            left.push(sqlx::query_scalar::<_, String>(&q).fetch_all(&db.pool).await.unwrap());
        }
        if left == [vec!["mid", "new"], vec!["new"]] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "old minutes left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    job.await.unwrap();
}

#[tokio::test]
async fn a_heartbeat_pass_renews_held_leases_and_stops_runs_that_lost_theirs_or_were_cancelled() {
    let db = test_db().await;
    let (lease, other) = (Uuid::new_v4(), Uuid::new_v4());
    let soon = "lease_expires_at = now() + interval '1 second'";
    let held = task(&db, "running", &format!("lease_token = '{lease}', {soon}")).await;
    let taken = task(&db, "running", &format!("lease_token = '{other}', {soon}")).await;
    let cancelled = task(&db, "running", &format!("lease_token = '{lease}', cancel_requested = true, {soon}")).await;
    let hub = Hub::new();
    let signals: Vec<StopSignal> = (0..3).map(|_| StopSignal::new()).collect();
    for (id, s) in [held, taken, cancelled].into_iter().zip(&signals) {
        hub.register_run(Fence { id, lease }, s.clone());
    }
    let hb = Heartbeat { pool: db.pool.clone(), hub, lease: Duration::from_secs(600), every: Duration::from_secs(1) };
    assert_eq!(hb.pass().await.unwrap(), 2);
    assert_eq!(signals[0].cause(), None);
    assert_eq!(signals[1].cause(), Some(StopCause::LeaseLost));
    assert_eq!(signals[2].cause(), Some(StopCause::Cancelled));
    let renewed: bool =
        sqlx::query_scalar("SELECT lease_expires_at > now() + interval '5 minutes' FROM tasks WHERE id = $1")
            .bind(held)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(renewed);
}

/// Fences are `(id, lease_token)` with no status: they rely on a task holding a lease token only
/// while it runs, which the database enforces.
#[tokio::test]
async fn a_task_holds_a_lease_token_only_while_it_runs() {
    let db = test_db().await;
    let lease = Uuid::new_v4();
    let id = task(&db, "running", &format!("lease_token = '{lease}'")).await;
    for status in ["completed", "queued", "requires_action", "cancelled"] {
        let e = sqlx::query("UPDATE tasks SET status = $2 WHERE id = $1")
            .bind(id)
            .bind(status)
            .execute(&db.pool)
            .await
            .unwrap_err();
        let code = e.as_database_error().and_then(|d| d.code()).map(|c| c.to_string());
        assert_eq!(code.as_deref(), Some("23514"), "{status}: {e}");
    }
    let queued = task(&db, "queued", "").await;
    let e = sqlx::query("UPDATE tasks SET lease_token = gen_random_uuid() WHERE id = $1")
        .bind(queued)
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("tasks_lease_only_while_running"), "{e}");
    // Leaving 'running' the way the service does (the lease cleared with it) is allowed, and the
    // old lease's fenced writes then match nothing.
    sqlx::query("UPDATE tasks SET status = 'completed', lease_token = NULL, finished_at = now(), history_at = now() WHERE id = $1")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    let appended = subagentd::store::events::append(
        &db.pool,
        Fence { id, lease },
        &[subagentd::kinds::Event::Checkpoint(Default::default())],
    )
    .await
    .unwrap();
    assert!(!appended);
}

#[tokio::test]
async fn a_claim_pass_takes_queued_work_for_the_free_places_and_runs_it() {
    let db = test_db().await;
    let cfg = Arc::new(test_config(&db.url));
    let caller = subagentd::tools::Caller::from_config(&cfg).unwrap();
    let ws = Arc::new(subagentd::workspace::Workspaces::from_config(&cfg).unwrap());
    let worker = Worker::new(db.pool.clone(), Hub::new(), Providers::with_builtin(), caller, cfg, ws);
    let ids = [task(&db, "queued", "").await, task(&db, "queued", "").await];
    let claims = ClaimLoop::new(worker.clone());
    assert_eq!(claims.pass(8).await, 2);
    assert_eq!(claims.pass(8).await, 0);
    worker.drain(Duration::from_secs(10)).await;
    for id in ids {
        assert_eq!(status(&db, id).await, "completed");
    }
}

#[tokio::test]
async fn a_webhook_pass_attempts_the_due_deliveries_and_records_each_attempt() {
    let db = test_db().await;
    let id = task(&db, "completed", "webhook_url = 'http://127.0.0.1:9/hook'").await;
    sqlx::query("INSERT INTO webhook_deliveries (task_id, event) VALUES ($1, 'task.finished')")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    let caller = subagentd::tools::Caller::from_config(&test_config(&db.url)).unwrap();
    let w = WebhookSender { pool: db.pool.clone(), hub: Hub::new(), caller };
    assert_eq!(w.pass().await.unwrap(), 1);
    let (attempts, err): (i32, Option<String>) =
        sqlx::query_as("SELECT attempts, last_error FROM webhook_deliveries WHERE task_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(attempts, 1);
    assert!(err.is_some_and(|e| e.contains("allow-list") || e.contains("127.0.0.1")), "refused by the allow-list");
    assert_eq!(w.pass().await.unwrap(), 0, "the next attempt waits for its backoff");
}
