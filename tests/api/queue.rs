//! The queue apart from the history (#47): `tasks` is partitioned by `history_at`; open tasks
//! live in `task_queue`, finished ones in the month partition of their end. Every way a task
//! ends moves its row in the statement that ends it; idempotency keys keep naming one task.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::helpers::*;
use crate::services::task;

/// Where each task is: (id, status, partition).
async fn placement(pool: &PgPool) -> Vec<(Uuid, String, String)> {
    sqlx::query_as("SELECT id, status, tableoid::regclass::text FROM tasks ORDER BY id").fetch_all(pool).await.unwrap()
}

fn open(status: &str) -> bool {
    matches!(status, "scheduled" | "queued" | "running" | "requires_action")
}

/// Watch `tasks` until told to stop: in every snapshot each task is one row, in the queue
/// exactly when it is open, and no task seen before is missing. Returns (snapshots, faults).
fn watch(pool: PgPool, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(u64, Vec<String>)> {
    tokio::spawn(async move {
        let (mut seen, mut faults, mut snapshots) = (std::collections::HashSet::new(), vec![], 0u64);
        while !stop.load(Ordering::Relaxed) {
            let rows = placement(&pool).await;
            snapshots += 1;
            let ids: std::collections::HashSet<Uuid> = rows.iter().map(|r| r.0).collect();
            if ids.len() != rows.len() {
                faults.push(format!("a task in two places: {rows:?}"));
            }
            for (id, status, table) in &rows {
                if open(status) != (table == "task_queue") {
                    faults.push(format!("{id} {status} in {table}"));
                }
            }
            if let Some(gone) = seen.iter().find(|id| !ids.contains(id)) {
                faults.push(format!("{gone} in neither the queue nor the history"));
            }
            seen.extend(ids);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        (snapshots, faults)
    })
}

#[tokio::test]
async fn every_way_a_task_ends_moves_it_out_of_the_queue_in_the_statement_that_ends_it() {
    let app = spawn_app().await;
    let pool = app.db.pool.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(pool.clone(), stop.clone());

    // Ended by its run: an answer (the turn's commit), a provider refusal (`finish`).
    let done = app.wait_task(json!({"prompt": "ok [mock:reply=fine]", "model": "mock/m"})).await;
    assert_eq!(done["status"], "completed");
    let failed = app.wait_task(json!({"prompt": "bad [mock:fail=400]", "model": "mock/m"})).await;
    assert_eq!(failed["status"], "failed");
    // Cancelled while scheduled (at once), and while running (its worker ends it).
    let far = (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339();
    let later = app.submit(json!({"prompt": "p", "model": "mock/m", "run_at": far})).await;
    let slow = app.submit(json!({"prompt": "slow [mock:delay_ms=5000]", "model": "mock/m"})).await;
    for t in [&later, &slow] {
        let id = t["id"].as_str().unwrap();
        if t == &slow {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while app.get_task(id).await["status"] != "running" {
                assert!(tokio::time::Instant::now() < deadline, "the slow task never ran");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let r = app.client.post(app.url(&format!("/tasks/{id}/cancel"))).send().await.unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        assert_eq!(app.poll_until_terminal(id, Duration::from_secs(10)).await["status"], "cancelled");
    }
    // Cancelled while paused; a budget wait past its time limit; a lost worker's last attempt.
    let paused = task(&app.db, "requires_action", "").await;
    let r = app.client.post(app.url(&format!("/tasks/{paused}/cancel"))).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let waiting = task(&app.db, "queued", "waiting_for = 'budget', wait_deadline = now() - interval '1 second'").await;
    // The service's own sweeps may get there first (they run every second): either way it ends
    // once, which the placement below checks.
    let ended = subagentd::store::budget::end_expired_waits(&pool).await.unwrap();
    assert!(ended.is_empty() || ended == vec![waiting], "{ended:?}");
    let lost = task(
        &app.db,
        "running",
        "lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 hour', attempt = 3, worker_id = 'gone'",
    )
    .await;
    let rescued = subagentd::store::runs::rescue(&pool, 3, 0.0).await.unwrap();
    assert!(rescued.is_empty() || rescued.iter().map(|r| r.0).collect::<Vec<_>>() == vec![lost], "{rescued:?}");

    stop.store(true, Ordering::Relaxed);
    let (snapshots, faults) = watcher.await.unwrap();
    assert!(faults.is_empty(), "{faults:?}");
    assert!(snapshots > 20, "the watcher looked {snapshots} times");

    let rows = placement(&pool).await;
    assert_eq!(rows.len(), 7, "{rows:?}");
    let month: String = sqlx::query_scalar("SELECT 'tasks_p' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMM')")
        .fetch_one(&pool)
        .await
        .unwrap();
    for (id, status, table) in &rows {
        assert!(!open(status), "{id} still {status}");
        assert_eq!(table, &month, "{id} ({status}) is in the month it ended");
    }
    let statuses: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(statuses, ["cancelled", "completed", "failed", "incomplete"].into());
    let status_of = |id: Uuid| rows.iter().find(|r| r.0 == id).map(|r| r.1.clone());
    assert_eq!(status_of(waiting).as_deref(), Some("incomplete"));
    assert_eq!(status_of(lost).as_deref(), Some("failed"));
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM task_queue").fetch_one(&pool).await.unwrap();
    assert_eq!(left, 0);

    // The overview's finishes per minute, counted as each end is written (a trigger, migration
    // 0032), give what its count over `tasks` gave: each of the seven ends once.
    let counted = finished_per_minute(&pool).await;
    assert_eq!(counted.iter().map(|c| c.2).sum::<i64>(), 7, "{counted:?}");
    assert_eq!(overview_finishes(&app).await, counted);
    app.stop().await;
}

/// The last hour's finishes by minute and outcome, counted over `tasks` as the overview did
/// before migration 0032.
async fn finished_per_minute(pool: &PgPool) -> Vec<(String, String, i64)> {
    sqlx::query_as(
        "SELECT to_char(date_trunc('minute', finished_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                status, count(*)
         FROM tasks WHERE finished_at > now() - interval '1 hour' GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// What `GET /overview` charts: (minute, outcome, tasks) for each outcome a minute has.
async fn overview_finishes(app: &TestApp) -> Vec<(String, String, i64)> {
    let o = app.get_json("/overview").await;
    let mut shown = vec![];
    for m in o["finished_per_minute"].as_array().unwrap() {
        for s in ["cancelled", "completed", "failed", "incomplete"] {
            if m[s] != 0 {
                shown.push((m["minute"].as_str().unwrap().to_string(), s.to_string(), m[s].as_i64().unwrap()));
            }
        }
    }
    shown
}

#[tokio::test]
async fn a_task_cannot_end_without_leaving_the_queue_nor_leave_it_open() {
    let db = test_db().await;
    let id = task(&db, "running", "lease_token = gen_random_uuid()").await;
    // Ended without its history time: the table refuses.
    let e = sqlx::query("UPDATE tasks SET status = 'completed', lease_token = NULL, finished_at = now() WHERE id = $1")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("tasks_history_at_check"), "{e}");
    // Ended in the queue itself: the queue's bound refuses.
    let e = sqlx::query(
        "UPDATE task_queue SET status = 'completed', lease_token = NULL, finished_at = now(), history_at = now() WHERE id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap_err();
    assert!(e.to_string().contains("partition constraint"), "{e}");
    // Moved to the history while open: refused too.
    let e =
        sqlx::query("UPDATE tasks SET history_at = now() WHERE id = $1").bind(id).execute(&db.pool).await.unwrap_err();
    assert!(e.to_string().contains("tasks_history_at_check"), "{e}");
    let rows = placement(&db.pool).await;
    assert_eq!(rows, vec![(id, "running".to_string(), "task_queue".to_string())]);
}

#[tokio::test]
async fn an_idempotency_key_names_one_task_for_24_hours_across_the_queue_and_the_history() {
    let app = spawn_app().await;
    let post = |body: serde_json::Value, key: &'static str| {
        let r = app.client.post(app.url("/tasks")).header("Idempotency-Key", key).json(&body);
        async move { r.send().await.unwrap() }
    };
    // Sent at once ten times: one task.
    let body = json!({"prompt": "once [mock:reply=one]", "model": "mock/m"});
    let answers = futures_util::future::join_all((0..10).map(|_| post(body.clone(), "k-1"))).await;
    let mut ids = std::collections::BTreeSet::new();
    for r in answers {
        assert!(matches!(r.status().as_u16(), 200 | 201), "{}", r.status());
        let t: serde_json::Value = r.json().await.unwrap();
        ids.insert(t["id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    let id = ids.into_iter().next().unwrap();
    // Finished (in the history now), the key still names it; another body is a conflict.
    app.poll_until_terminal(&id, Duration::from_secs(10)).await;
    let again: serde_json::Value = post(body.clone(), "k-1").await.json().await.unwrap();
    assert_eq!(again["id"], id.as_str());
    assert_eq!(post(json!({"prompt": "other", "model": "mock/m"}), "k-1").await.status(), 409);
    // After 24 hours the key is free: another body makes a new task, which the key now names.
    sqlx::query("UPDATE task_keys SET created_at = now() - interval '25 hours'").execute(&app.db.pool).await.unwrap();
    let r = post(json!({"prompt": "other [mock:reply=two]", "model": "mock/m"}), "k-1").await;
    assert_eq!(r.status(), 201);
    let fresh: serde_json::Value = r.json().await.unwrap();
    assert_ne!(fresh["id"], id.as_str());
    let again: serde_json::Value =
        post(json!({"prompt": "other [mock:reply=two]", "model": "mock/m"}), "k-1").await.json().await.unwrap();
    assert_eq!(again["id"], fresh["id"]);
    // Keys past their day are purged by the retention pass, whatever its windows.
    sqlx::query("UPDATE task_keys SET created_at = now() - interval '25 hours'").execute(&app.db.pool).await.unwrap();
    assert_eq!(subagentd::store::retention::purge_keys(&app.db.pool).await.unwrap(), 1);
    assert_eq!(app.task_count().await, 2);
    app.stop().await;
}

/// Every task row as text (all columns but the new `history_at` and `last_call_key`), in id order.
async fn tasks_digest(pool: &PgPool) -> Vec<String> {
    // Less the columns later migrations add (`options_sha256`, 0036; `environment_digest`, 0040;
    // `environment_definition`, 0042: NULL on the rows written before).
    sqlx::query_scalar(
        "SELECT (to_jsonb(t) - 'history_at' - 'last_call_key' - 'options_sha256' - 'environment_digest'
                 - 'environment_definition')::text
         FROM tasks t ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_database_from_the_release_before_keeps_every_task_and_key_and_its_queue_runs() {
    let db = test_db().await;
    let old = database_before(&db, 29).await;
    let pool = old.pool.clone();
    sqlx::query("INSERT INTO tenants (name) VALUES ('default')").execute(&pool).await.unwrap();
    let (ancient, recent, keyed, queued) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, finished_at, summary,
                            idempotency_key, request_hash, parent_task_id, created_at)
         VALUES ($1, 'default', 'completed', 'general', 'p', 'mock/m', '{}', now() - interval '75 days', 'old', 'k-old', 'h', NULL, now() - interval '76 days'),
                ($2, 'default', 'failed', 'general', 'p', 'mock/m', '{}', now() - interval '1 hour', NULL, NULL, NULL, $1, now() - interval '2 hours'),
                ($3, 'default', 'completed', 'general', 'p', 'mock/m', '{}', now(), 'kept', 'k-new', 'h', NULL, now()),
                ($4, 'default', 'queued', 'general', 'q [mock:reply=carried]', 'mock/m', '{\"max_turns\": 3}', NULL, NULL, NULL, NULL, NULL, now())",
    )
    .bind(ancient)
    .bind(recent)
    .bind(keyed)
    .bind(queued)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO task_diffs (task_id, tenant, diff) VALUES ($1, 'default', 'diff')")
        .bind(recent)
        .execute(&pool)
        .await
        .unwrap();
    let before = tasks_digest(&pool).await;
    assert_eq!(before.len(), 4);

    subagentd::db::MIGRATOR.run(&pool).await.unwrap();
    assert_eq!(tasks_digest(&pool).await, before, "every task row, unchanged");
    let rows = placement(&pool).await;
    let place = |id: Uuid| rows.iter().find(|r| r.0 == id).unwrap().2.clone();
    let month = |days: i64| format!("tasks_p{}", (chrono::Utc::now() - chrono::Duration::days(days)).format("%Y%m"));
    assert_eq!(place(ancient), month(75));
    assert_eq!((place(recent), place(keyed)), (month(0), month(0)));
    assert_eq!(place(queued), "task_queue");
    // Keys of the last 24 hours name their task still; older ones were free already.
    let keys: Vec<(String, Uuid)> =
        sqlx::query_as("SELECT key, task_id FROM task_keys ORDER BY key").fetch_all(&pool).await.unwrap();
    assert_eq!(keys, vec![("k-new".to_string(), keyed)]);
    // The dashboards' views read the new table.
    let (outcomes, latency): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM v_task_outcomes), (SELECT count(*) FROM v_task_latency)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(outcomes > 0 && latency == 0, "{outcomes} {latency}");
    let diffs: i64 = sqlx::query_scalar("SELECT count(*) FROM task_diffs").fetch_one(&pool).await.unwrap();
    assert_eq!(diffs, 1);

    // The queue carries on on the migrated database, and the kept key still answers.
    let service = old.serve().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let rows = placement(&pool).await;
        let q = rows.iter().find(|r| r.0 == queued).unwrap();
        if q.1 == "completed" {
            assert_eq!(q.2, month(0), "moved out of the queue as it ended");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the queued task never ran: {q:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let earlier = subagentd::store::tasks::by_idempotency_key(&pool, "default", "k-new").await.unwrap();
    assert_eq!(earlier.map(|t| t.id), Some(keyed));
    service.stop().await;
    old.drop().await;
}

#[tokio::test]
async fn a_task_ending_in_a_month_without_its_partition_still_ends() {
    let app = spawn_app().await;
    let pool = &app.db.pool;
    let reach = subagentd::store::partitions::reach(pool).await.unwrap();
    assert_eq!(reach, i64::from(subagentd::store::partitions::AHEAD_DAYS));
    // This month's partition gone (as an operator's mistake would have it): the gauge says so.
    let month: String = sqlx::query_scalar("SELECT 'tasks_p' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMM')")
        .fetch_one(pool)
        .await
        .unwrap();
    sqlx::query(&format!("ALTER TABLE tasks DETACH PARTITION {month}")).execute(pool).await.unwrap();
    sqlx::query(&format!("DROP TABLE {month}")).execute(pool).await.unwrap();
    assert_eq!(subagentd::store::partitions::reach(pool).await.unwrap(), -1);
    // A run's end moves its task into the month: the partition is made on demand, and it ends.
    let done = app.wait_task(json!({"prompt": "ok [mock:reply=fine]", "model": "mock/m"})).await;
    assert_eq!(done["status"], "completed");
    let rows = placement(pool).await;
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].1.as_str(), rows[0].2.as_str()), ("completed", month.as_str()));
    // Gone again: an HTTP cancel of a scheduled task, whose end moves it there, makes it too.
    sqlx::query(&format!("ALTER TABLE tasks DETACH PARTITION {month}")).execute(pool).await.unwrap();
    sqlx::query(&format!("DROP TABLE {month}")).execute(pool).await.unwrap();
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let t = app.submit(json!({"prompt": "later", "model": "mock/m", "run_at": later})).await;
    assert_eq!(t["status"], "scheduled", "{t}");
    let id = t["id"].as_str().unwrap();
    let r = app.client.post(app.url(&format!("/tasks/{id}/cancel"))).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let rows = placement(pool).await;
    let cancelled: Vec<_> = rows.iter().filter(|r| r.0.to_string() == id).collect();
    assert_eq!(cancelled.len(), 1);
    assert_eq!((cancelled[0].1.as_str(), cancelled[0].2.as_str()), ("cancelled", month.as_str()));
    app.stop().await;
}

/// How often the queue was vacuumed by a VACUUM statement (autovacuum apart), and its dead rows.
async fn queue_vacuums(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as("SELECT vacuum_count, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'task_queue'")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_service_vacuums_the_queue_every_few_seconds_and_not_when_told_not_to() {
    for secs in [1, 0] {
        let app = spawn_app_with(|c| c.queue_vacuum_seconds = secs, true).await;
        let pool = app.db.pool.clone();
        // Only the service's passes count: autovacuum is kept off the queue.
        sqlx::query("ALTER TABLE task_queue SET (autovacuum_enabled = false)").execute(&pool).await.unwrap();
        // Each run leaves dead row versions in the queue (its claim; its end moves the row out).
        for i in 0..3 {
            let done = app.wait_task(json!({"prompt": format!("ok {i} [mock:reply=fine]"), "model": "mock/m"})).await;
            assert_eq!(done["status"], "completed");
        }
        // Statistics arrive late (an idle connection reports its counts up to 10 s on): wait for
        // what each case expects, then check the rest.
        let done = |seen: (i64, i64)| if secs == 0 { seen.1 > 0 } else { seen.0 > 0 && seen.1 == 0 };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        let mut seen = queue_vacuums(&pool).await;
        while tokio::time::Instant::now() < deadline && !done(seen) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            seen = queue_vacuums(&pool).await;
        }
        if secs == 0 {
            assert!(seen.1 > 0, "the runs left no dead rows, so the test proves nothing: {seen:?}");
            assert_eq!(seen.0, 0, "vacuumed although --queue-vacuum-seconds is 0: {seen:?}");
        } else {
            assert!(done(seen), "the queue was not vacuumed clean within 15 s: {seen:?}");
        }
        app.stop().await;
    }
}
