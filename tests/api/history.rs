//! History by the day (#47): `task_events`, `task_messages`, the stored diffs (`task_diffs`) and the ledger (`llm_calls`) are
//! partitioned by the day their rows are written; the service keeps partitions ahead and makes one on demand when an insert
//! finds none; retention drops whole partitions while the claim and inserts go on; a database
//! from the release before keeps every row; a tenant's newest tasks are read through its own index; a statement's events
//! are one row, opened in order by every read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sqlx::PgPool;
use subagentd::store::partitions;
use uuid::Uuid;

use crate::helpers::*;

/// Today's UTC day as the partitions name it.
async fn day(pool: &PgPool, days_ago: i32) -> String {
    sqlx::query_scalar("SELECT to_char((now() AT TIME ZONE 'UTC')::date - $1, 'YYYYMMDD')")
        .bind(days_ago)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Detach and drop the given day's partition of every daily table, the ledger's too (as an
/// operator's mistake would).
async fn remove_day(pool: &PgPool, days_ago: i32) {
    let d = day(pool, days_ago).await;
    for parent in partitions::DAILY {
        sqlx::query(&format!("ALTER TABLE {parent} DETACH PARTITION {parent}_p{d}")).execute(pool).await.unwrap();
        sqlx::query(&format!("DROP TABLE {parent}_p{d}")).execute(pool).await.unwrap();
    }
}

#[tokio::test]
async fn partitions_are_made_ahead_and_an_insert_into_a_missing_day_still_succeeds() {
    let app = spawn_app().await;
    let pool = &app.db.pool;
    assert_eq!(partitions::reach(pool).await.unwrap(), i64::from(partitions::AHEAD_DAYS));
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("subagentd_history_partitions_ahead_days 7"), "{metrics}");
    let kinds: Vec<String> = sqlx::query_scalar(
        "SELECT relkind::text FROM pg_class WHERE relname IN ('task_events', 'task_messages') ORDER BY relname",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(kinds, ["p", "p"], "both are partitioned tables");
    let default: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_partitioned_table WHERE partdefid <> 0 AND partrelid IN ('task_events'::regclass, 'task_messages'::regclass)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(default, 0, "no DEFAULT partition");

    // Today's partitions gone: a submission (its first event) makes them again and succeeds.
    remove_day(pool, 0).await;
    assert_eq!(partitions::reach(pool).await.unwrap(), -1);
    let r = app.post_json("/tasks?wait=true", json!({"prompt": "x [mock:reply=one]", "model": "mock/m"})).await;
    assert_eq!(r.status(), 200);
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["summary"], "one");
    assert!(partitions::reach(pool).await.unwrap() >= 0);

    // Gone again while a run is under way: its checkpoint and its end (worker writes) make them.
    let t = app.submit(json!({"prompt": "y [mock:reply=two] [mock:delay_ms=1500]", "model": "mock/m"})).await;
    let id = t["id"].as_str().unwrap().to_string();
    let started = Instant::now();
    while app.get_task(&id).await["status"] != "running" {
        assert!(started.elapsed() < Duration::from_secs(20), "the task never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    remove_day(pool, 0).await;
    let done = app.poll_until_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["summary"], "two");
    let events = app.get_json(&format!("/tasks/{id}/events")).await;
    let kinds: Vec<&str> = events["events"].as_array().unwrap().iter().filter_map(|e| e["kind"].as_str()).collect();
    assert!(kinds.contains(&"finished"), "the end's event is stored: {kinds:?}");
    let messages: i64 = sqlx::query_scalar("SELECT count(*) FROM task_message_log WHERE task_id = $1::uuid")
        .bind(&id)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(messages >= 2, "the conversation is stored ({messages} messages)");
    let calls = app.get_json(&format!("/tasks/{id}/calls")).await;
    assert_eq!(calls["calls"].as_array().unwrap().len(), 1, "the call is in the ledger: {calls}");
    app.stop().await;
}

/// An old ledger: `days` partitions from 410 days ago, each with `rows` calls (keys of their day).
async fn old_ledger(pool: &PgPool, days: i32, rows: i32) {
    for ago in 410..410 + days {
        sqlx::query("SELECT subagentd_partition('llm_calls', (now() AT TIME ZONE 'UTC')::date - $1)")
            .bind(ago)
            .execute(pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO llm_calls (call_key, task_id, tenant, turn, attempt, try, provider, model, latency_ms, outcome, created_at)
             SELECT k, gen_random_uuid(), 'default', 1, 1, 1, 'mock', 'm', 1, 'ok', subagentd_uuid_time(k)
             FROM (SELECT subagentd_uuidv7(now() - make_interval(days => $1)) AS k FROM generate_series(1, $2)) g",
        )
        .bind(ago)
        .bind(rows)
        .execute(pool)
        .await
        .unwrap();
    }
}

/// Old history: `days` partitions from 40 days ago, each with `rows` events and messages of
/// finished tasks that exist nowhere else.
async fn old_history(pool: &PgPool, days: i32, rows: i32) {
    for ago in 40..40 + days {
        for parent in partitions::HISTORY {
            sqlx::query("SELECT subagentd_partition($1, (now() AT TIME ZONE 'UTC')::date - $2)")
                .bind(parent)
                .bind(ago)
                .execute(pool)
                .await
                .unwrap();
        }
        let at = format!("now() - interval '{ago} days'");
        sqlx::query(&format!(
            "INSERT INTO task_events (task_id, seq, kind, created_at) SELECT gen_random_uuid(), 1, 'created', {at} FROM generate_series(1, $1)"
        ))
        .bind(rows)
        .execute(pool)
        .await
        .unwrap();
        sqlx::query(&format!(
            "INSERT INTO task_messages (task_id, seq, turn, message, created_at) SELECT gen_random_uuid(), 1, 1, '{{}}', {at} FROM generate_series(1, $1)"
        ))
        .bind(rows)
        .execute(pool)
        .await
        .unwrap();
    }
}

async fn old_partitions(pool: &PgPool) -> Vec<String> {
    let mut names = vec![];
    let cutoff = chrono::Utc::now().date_naive() - chrono::Days::new(30);
    for parent in partitions::HISTORY {
        names.extend(
            partitions::partitions(pool, parent).await.unwrap().into_iter().filter(|p| p.day < cutoff).map(|p| p.name),
        );
    }
    names
}

#[tokio::test]
async fn retention_drops_partitions_while_the_claim_and_inserts_go_on() {
    // The service's own retention pass is off: this test runs the passes itself.
    let app = spawn_app_without_retention().await;
    let pool = app.db.pool.clone();
    old_history(&pool, 3, 2000).await;
    old_ledger(&pool, 3, 2000).await;
    assert_eq!(old_partitions(&pool).await.len(), 6);
    assert_eq!(partitions::reach(&pool).await.unwrap(), i64::from(partitions::AHEAD_DAYS), "old days do not count");
    let held_day = day(&pool, 41).await;

    // Tasks submitted and run all along, in wait mode, four at a time.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = vec![];
    for k in 0..4 {
        let (client, url, stop) = (app.client.clone(), app.url("/tasks?wait=true"), stop.clone());
        load.push(tokio::spawn(async move {
            let (mut ok, mut bad) = (0, vec![]);
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let r = client
                    .post(&url)
                    .json(&json!({"prompt": format!("{k}/{i} [mock:reply=ok]"), "model": "mock/m"}))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 200 => {
                        let v: Value = r.json().await.unwrap();
                        if v["status"] == "completed" {
                            ok += 1
                        } else {
                            bad.push(v.to_string())
                        }
                    }
                    Ok(r) => bad.push(format!("{} {}", r.status(), r.text().await.unwrap_or_default())),
                    Err(e) => bad.push(e.to_string()),
                }
            }
            (ok, bad)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A reader holds one old partition: its drop waits no longer than the lock timeout, and it
    // and the later days of its table are left for the next pass; the others go.
    // A partition a past pass detached but could not drop (a table of the name, attached to nothing).
    let orphan = day(&pool, 45).await;
    sqlx::query(&format!("CREATE TABLE task_messages_p{orphan} (LIKE task_messages)")).execute(&pool).await.unwrap();
    // What the window holds of the tasks finished so far: no pass may take any of it.
    let mark: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&pool).await.unwrap();
    let window = "SELECT (SELECT count(*) FROM task_events e JOIN tasks t ON t.id = e.task_id WHERE t.finished_at < $1)
                       + (SELECT count(*) FROM task_messages m JOIN tasks t ON t.id = m.task_id WHERE t.finished_at < $1)
                       + (SELECT count(*) FROM llm_calls c JOIN tasks t ON t.id = c.task_id WHERE t.finished_at < $1)";
    let held: i64 = sqlx::query_scalar(window).bind(mark).fetch_one(&pool).await.unwrap();
    assert!(held > 0, "tasks ran before the passes");

    let mut reader = pool.begin().await.unwrap();
    sqlx::query(&format!("SELECT count(*) FROM task_events_p{held_day}")).execute(&mut *reader).await.unwrap();
    let mut dropped = vec![];
    for parent in partitions::HISTORY {
        dropped.extend(partitions::drop_expired(&pool, parent, 30).await.unwrap());
    }
    let next_day = day(&pool, 40).await;
    assert_eq!(dropped.len(), 5, "the oldest events day, the left-over table and every messages day: {dropped:?}");
    assert!(dropped.contains(&format!("task_messages_p{orphan}")), "{dropped:?}");
    assert_eq!(old_partitions(&pool).await, [format!("task_events_p{held_day}"), format!("task_events_p{next_day}")]);
    reader.commit().await.unwrap();
    // The next pass finishes it (a detach the timeout interrupted is finalized) and the rest.
    assert_eq!(
        partitions::drop_expired(&pool, "task_events", 30).await.unwrap(),
        [format!("task_events_p{held_day}"), format!("task_events_p{next_day}")]
    );
    assert!(old_partitions(&pool).await.is_empty());
    // And the ledger's days past its 400-day window, whole, while the runs write theirs.
    let ledger = partitions::drop_expired(&pool, partitions::LEDGER, 400).await.unwrap();
    assert_eq!(ledger.len(), 3, "{ledger:?}");
    let old_calls: i64 =
        sqlx::query_scalar("SELECT count(*) FROM llm_calls WHERE created_at < now() - interval '400 days'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(old_calls, 0);

    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for l in load {
        let (ok, bad) = l.await.unwrap();
        assert!(bad.is_empty(), "every request during retention succeeded: {bad:?}");
        total += ok;
    }
    assert!(total > 0, "tasks ran throughout");
    // Nothing of the window was taken: the tasks finished before the passes have every row.
    let after: i64 = sqlx::query_scalar(window).bind(mark).fetch_one(&pool).await.unwrap();
    assert_eq!(after, held);
    let tasks: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'completed'").fetch_one(&pool).await.unwrap();
    assert_eq!(tasks, total);
    app.stop().await;
}

/// A digest of every row of a table, in order.
async fn digest(pool: &PgPool, cols: &str, table: &str) -> (i64, String) {
    sqlx::query_as(&format!(
        "SELECT count(*), coalesce(md5(string_agg(r::text, ',' ORDER BY r::text)), '') FROM (SELECT {cols} FROM {table}) r"
    ))
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_database_from_the_release_before_keeps_every_event_and_message_and_its_queue_runs() {
    let db = test_db().await;
    let old = database_before(&db, 28).await;
    let pool = old.pool.clone();
    sqlx::query("INSERT INTO tenants (name) VALUES ('default')").execute(&pool).await.unwrap();
    let (done, queued) = (Uuid::now_v7(), Uuid::now_v7());
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, finished_at, summary)
         VALUES ($1, 'default', 'completed', 'general', 'p', 'mock/m', '{}', now() - interval '45 days', 'old'),
                ($2, 'default', 'queued', 'general', 'q [mock:reply=carried]', 'mock/m', '{\"max_turns\": 3}', NULL, NULL)",
    )
    .bind(done)
    .bind(queued)
    .execute(&pool)
    .await
    .unwrap();
    for (ago, seq) in [(45, 1), (44, 2), (2, 3)] {
        let at = format!("now() - interval '{ago} days'");
        sqlx::query(&format!(
            "INSERT INTO task_events (task_id, seq, kind, data, created_at) VALUES ($1, $2, 'note', '{{\"n\": {seq}}}', {at})"
        ))
        .bind(done)
        .bind(seq)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(&format!(
            "INSERT INTO task_messages (task_id, seq, turn, message, created_at) VALUES ($1, $2, 1, '{{\"role\": \"user\", \"content\": \"{seq}\"}}', {at})"
        ))
        .bind(done)
        .bind(seq)
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query("INSERT INTO task_events (task_id, seq, kind) VALUES ($1, 1, 'created')")
        .bind(queued)
        .execute(&pool)
        .await
        .unwrap();
    let ev = "task_id, seq, kind, data, created_at";
    let msg = "task_id, seq, turn, message, created_at";
    let before = (digest(&pool, ev, "task_events").await, digest(&pool, msg, "task_messages").await);
    assert_eq!((before.0 .0, before.1 .0), (4, 3));

    subagentd::db::MIGRATOR.run(&pool).await.unwrap();
    let after = (digest(&pool, ev, "task_events").await, digest(&pool, msg, "task_messages").await);
    assert_eq!(after, before, "every event and message, unchanged");
    // A partition for each day the old rows were written on, and the days ahead.
    let days: Vec<String> =
        partitions::partitions(&pool, "task_events").await.unwrap().iter().map(|p| p.name.clone()).collect();
    for ago in [45, 44, 2, 0, -7] {
        assert!(days.contains(&format!("task_events_p{}", day(&pool, ago).await)), "{ago} days ago: {days:?}");
    }

    // The queue carries on: a service on the migrated database runs the queued task.
    let service = old.serve().await;
    let started = Instant::now();
    loop {
        let (status, result): (String, Option<String>) =
            sqlx::query_as("SELECT status, summary FROM tasks WHERE id = $1")
                .bind(queued)
                .fetch_one(&pool)
                .await
                .unwrap();
        if status == "completed" {
            assert_eq!(result.as_deref(), Some("carried"));
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the queued task never ran: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    service.stop().await;
    old.drop().await;
}

#[tokio::test]
async fn a_conversation_half_gone_is_not_resumed_from() {
    let db = test_db().await;
    let (whole, half) = (Uuid::now_v7(), Uuid::now_v7());
    for (id, seqs) in [(whole, vec![1, 2, 3]), (half, vec![3, 4])] {
        for seq in seqs {
            sqlx::query("INSERT INTO task_messages (task_id, seq, turn, message) VALUES ($1, $2, 1, '{\"role\": \"user\", \"content\": \"x\"}')")
                .bind(id)
                .bind(seq)
                .execute(&db.pool)
                .await
                .unwrap();
        }
    }
    assert_eq!(subagentd::store::runs::messages(&db.pool, whole).await.unwrap().len(), 3);
    // Its first day dropped, the rest kept a day longer: read as no longer stored.
    assert!(subagentd::store::runs::messages(&db.pool, half).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_ledger_from_the_release_before_keeps_every_row_and_its_days_go_whole() {
    let db = test_db().await;
    let old = database_before(&db, 30).await;
    let pool = old.pool.clone();
    sqlx::query("INSERT INTO tenants (name) VALUES ('default')").execute(&pool).await.unwrap();
    sqlx::query("SELECT subagentd_month_partition('tasks', (now() - interval '2 days')::date)")
        .execute(&pool)
        .await
        .unwrap();
    let (done, queued) = (Uuid::now_v7(), Uuid::now_v7());
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, created_at, finished_at, history_at, summary)
         VALUES ($1, 'default', 'completed', 'general', 'p', 'mock/m', '{}', now() - interval '301 days',
                 now() - interval '2 days', now() - interval '2 days', 'old')",
    )
    .bind(done)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options)
         VALUES ($1, 'default', 'queued', 'general', 'q [mock:reply=carried]', 'mock/m', '{\"max_turns\": 3}')",
    )
    .bind(queued)
    .execute(&pool)
    .await
    .unwrap();
    // Rows as the release before wrote them: random keys, the insert's own time.
    for (turn, ago) in [(1, 300), (2, 45), (3, 2)] {
        sqlx::query(&format!(
            "INSERT INTO llm_calls (call_key, task_id, tenant, turn, attempt, try, provider, model, input_tokens,
                 output_tokens, cost_usd, latency_ms, outcome, created_at)
             VALUES (gen_random_uuid(), $1, 'default', $2, 1, 1, 'mock', 'm', 10, 2, 0.001, 5, 'ok',
                     now() - interval '{ago} days')"
        ))
        .bind(done)
        .bind(turn)
        .execute(&pool)
        .await
        .unwrap();
    }
    let before = digest(&pool, "*", "llm_calls").await;
    assert_eq!(before.0, 3);

    subagentd::db::MIGRATOR.run(&pool).await.unwrap();
    assert_eq!(digest(&pool, "*", "llm_calls").await, before, "every ledger row, unchanged (ids, keys, times)");
    let kind: String = sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE relname = 'llm_calls'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(kind, "p");
    let days: Vec<String> =
        partitions::partitions(&pool, partitions::LEDGER).await.unwrap().iter().map(|p| p.name.clone()).collect();
    for ago in [300, 45, 2, 1, 0, -7] {
        assert!(days.contains(&format!("llm_calls_p{}", day(&pool, ago).await)), "{ago} days ago: {days:?}");
    }
    assert_eq!(partitions::reach(&pool).await.unwrap(), i64::from(partitions::AHEAD_DAYS));

    // A new row's time is its key's: a row filed under another time is refused, and a key
    // written twice (hence into one day) is one row.
    let key = Uuid::now_v7();
    let insert = "INSERT INTO llm_calls (call_key, task_id, tenant, turn, attempt, try, provider, model, latency_ms, outcome, created_at)
                  VALUES ($1, $2, 'default', 9, 1, 1, 'mock', 'm', 1, 'ok', $3)";
    let refusal = |r: Result<sqlx::postgres::PgQueryResult, sqlx::Error>| match r {
        Err(sqlx::Error::Database(d)) => (d.code().map(|c| c.to_string()), d.constraint().map(str::to_string)),
        other => panic!("expected a refusal: {other:?}"),
    };
    let at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT subagentd_uuid_time($1)").bind(key).fetch_one(&pool).await.unwrap();
    let other = at + chrono::Duration::milliseconds(1);
    assert_eq!(
        refusal(sqlx::query(insert).bind(key).bind(done).bind(other).execute(&pool).await),
        (Some("23514".into()), Some("llm_calls_created_at_check".into()))
    );
    sqlx::query(insert).bind(key).bind(done).bind(at).execute(&pool).await.unwrap();
    // (The day's partition's copy of llm_calls_call_key_idx refuses it.)
    let (code, index) = refusal(sqlx::query(insert).bind(key).bind(done).bind(at).execute(&pool).await);
    assert_eq!(code.as_deref(), Some("23505"));
    assert!(index.as_deref().is_some_and(|i| i.ends_with("_call_key_created_at_idx")), "{index:?}");
    sqlx::query("DELETE FROM llm_calls WHERE call_key = $1").bind(key).execute(&pool).await.unwrap();

    // The queue carries on, and the new call's row is filed under its key's time.
    let service = old.serve().await;
    let base = format!("http://{}", service.addr.unwrap());
    let started = Instant::now();
    while sqlx::query_scalar::<_, String>("SELECT status FROM tasks WHERE id = $1")
        .bind(queued)
        .fetch_one(&pool)
        .await
        .unwrap()
        != "completed"
    {
        assert!(started.elapsed() < Duration::from_secs(30), "the queued task never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (n, filed): (i64, bool) = sqlx::query_as(
        "SELECT count(*), bool_and(created_at = subagentd_uuid_time(call_key)) FROM llm_calls WHERE task_id = $1",
    )
    .bind(queued)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((n, filed), (1, true));
    // The old task's calls, as the API lists them: all three, its days visited from its creation.
    let calls: Value = reqwest::get(format!("{base}/tasks/{done}/calls")).await.unwrap().json().await.unwrap();
    let turns: Vec<i64> = calls["calls"].as_array().unwrap().iter().map(|c| c["turn"].as_i64().unwrap()).collect();
    assert_eq!(turns, [1, 2, 3], "{calls}");

    // Past a 100-day window the ledger's old days go whole; the task keeps its own.
    let dropped = partitions::drop_expired(&pool, partitions::LEDGER, 100).await.unwrap();
    assert_eq!(dropped, [format!("llm_calls_p{}", day(&pool, 300).await)]);
    let left: Vec<i32> = sqlx::query_scalar("SELECT turn FROM llm_calls WHERE task_id = $1 ORDER BY turn")
        .bind(done)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, [2, 3]);
    service.stop().await;
    old.drop().await;
}

#[tokio::test]
async fn stored_diffs_from_the_release_before_keep_every_row_go_by_the_day_and_stay_one_per_task() {
    let db = test_db().await;
    let old = database_before(&db, 31).await;
    let pool = old.pool.clone();
    sqlx::query("INSERT INTO tenants (name) VALUES ('default')").execute(&pool).await.unwrap();
    sqlx::query("SELECT subagentd_month_partition('tasks', (now() - interval '45 days')::date)")
        .execute(&pool)
        .await
        .unwrap();
    let (done, waiting, recent, running) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let lease = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, created_at, finished_at, history_at, summary)
         VALUES ($1, 'default', 'completed', 'general', 'p', 'mock/m', '{}', now() - interval '46 days', now() - interval '45 days',
                 now() - interval '45 days', 'old'),
                ($2, 'default', 'completed', 'general', 'p', 'mock/m', '{}', now(), now(), now(), 'new')",
    )
    .bind(done)
    .bind(recent)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, created_at)
         VALUES ($1, 'default', 'queued', 'general', 'p', 'mock/m', '{}', now() - interval '46 days')",
    )
    .bind(waiting)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, attempt, lease_token, lease_expires_at,
                            started_at, worker_id)
         VALUES ($1, 'default', 'running', 'general', 'p', 'mock/m', '{}', 1, $2, now() + interval '1 hour', now(), 'w')",
    )
    .bind(running)
    .bind(lease)
    .execute(&pool)
    .await
    .unwrap();
    // Diffs as the release before wrote them: one a finished task's of 45 days ago, one an open
    // task's as old (a copy saved, then the task requeued and not run since), one of today.
    sqlx::query(
        "INSERT INTO task_diffs (task_id, tenant, changes, deleted, diff, updated_at)
         VALUES ($1, 'default', '\\x1f8b00'::bytea, '{gone.txt}', 'diff --git a/x b/x', now() - interval '45 days'),
                ($2, 'default', '\\x1f8b01'::bytea, '{}', NULL, now() - interval '45 days'),
                ($3, 'default', NULL, '{}', 'diff --git a/y b/y', now())",
    )
    .bind(done)
    .bind(waiting)
    .bind(recent)
    .execute(&pool)
    .await
    .unwrap();
    let before = digest(&pool, "*", "task_diffs").await;
    assert_eq!(before.0, 3);

    subagentd::db::MIGRATOR.run(&pool).await.unwrap();
    assert_eq!(digest(&pool, "*", "task_diffs").await, before, "every stored diff, unchanged");
    // The tenant's kept bytes (migration 0038) count them: 3 + 18, 3, and 18 bytes.
    let kept = || async {
        let n: i64 = sqlx::query_scalar("SELECT kept_bytes FROM tenant_storage WHERE tenant = 'default'")
            .fetch_one(&pool)
            .await
            .unwrap();
        n
    };
    assert_eq!(kept().await, 42);
    let kind: String = sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE relname = 'task_diffs'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(kind, "p");
    let days: Vec<String> =
        partitions::partitions(&pool, partitions::DIFFS).await.unwrap().iter().map(|p| p.name.clone()).collect();
    for ago in [45, 1, 0, -7] {
        assert!(days.contains(&format!("task_diffs_p{}", day(&pool, ago).await)), "{ago} days ago: {days:?}");
    }
    assert_eq!(partitions::reach(&pool).await.unwrap(), i64::from(partitions::AHEAD_DAYS));

    // Past a 30-day window the old day goes whole: the finished task's diff with it, the open
    // task's moved to today first.
    let dropped = partitions::drop_expired(&pool, partitions::DIFFS, 30).await.unwrap();
    assert_eq!(dropped, [format!("task_diffs_p{}", day(&pool, 45).await)]);
    let left: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT task_id, tableoid::regclass::text FROM task_diffs ORDER BY task_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let today = format!("task_diffs_p{}", day(&pool, 0).await);
    assert_eq!(left, [(waiting, today.clone()), (recent, today.clone())]);
    assert_eq!(kept().await, 21, "the dropped day's 21 bytes left the tenant's kept bytes with it");
    // A running task's first write, not yet committed, and a second one: the second waits for
    // the first and then updates its row (without the lock it would insert a second row).
    use subagentd::store::{diffs, Fence};
    let fence = Fence { id: running, lease };
    let mut first = pool.begin().await.unwrap();
    assert!(diffs::save_changes(&mut first, fence, &[1], &["f1".to_string()]).await.unwrap());
    // Planned for the days since the task was made: yesterday's partition is not even locked.
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *first).await.unwrap();
    let locked: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
         WHERE l.pid = $1 AND c.relname LIKE 'task_diffs_p%' AND c.relkind = 'r' ORDER BY 1",
    )
    .bind(pid)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!locked.is_empty() && !locked.contains(&format!("task_diffs_p{}", day(&pool, 1).await)), "{locked:?}");
    let second = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            diffs::save_changes(&mut conn, fence, &[2], &["f2".to_string()]).await.unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!second.is_finished(), "the second write waits for the first's lock");
    first.commit().await.unwrap();
    assert!(second.await.unwrap(), "the lease holder's write applies");
    assert!(diffs::save_diff(&pool, fence, "diff --git a/z b/z", &json!({"files_changed": 1})).await.unwrap());
    let rows: Vec<(String, Option<String>, i32)> = sqlx::query_as(
        "SELECT tableoid::regclass::text, diff, cardinality(deleted) FROM task_diffs WHERE task_id = $1",
    )
    .bind(running)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows, [(today, Some("diff --git a/z b/z".to_string()), 1)], "one row per task");
    let saved = diffs::changes_of(&pool, running).await.unwrap().unwrap();
    assert_eq!(saved, (vec![2], vec!["f2".to_string()]), "the last write's changes and deleted paths");
    // Another lease writes nothing.
    let stale = Fence { id: running, lease: Uuid::new_v4() };
    let mut conn = pool.acquire().await.unwrap();
    assert!(!diffs::save_changes(&mut conn, stale, &[9], &[]).await.unwrap());
    assert!(!diffs::save_diff(&pool, stale, "stale", &json!({})).await.unwrap());
    let made: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT created_at FROM tasks WHERE id = $1").bind(running).fetch_one(&pool).await.unwrap();
    assert_eq!(diffs::diff_of(&pool, "default", running, made).await.unwrap(), Some(Some("diff --git a/z b/z".into())));
    // The moved diff of the task open for 46 days is read from its task's creation on.
    let made: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT created_at FROM tasks WHERE id = $1").bind(waiting).fetch_one(&pool).await.unwrap();
    assert_eq!(diffs::diff_of(&pool, "default", waiting, made).await.unwrap(), Some(None));
    drop(conn);
    old.drop().await;
}

#[tokio::test]
async fn the_last_hours_finishes_of_a_database_from_the_release_before_are_charted_after_it_migrates() {
    let db = test_db().await;
    let old = database_before(&db, 32).await;
    let pool = old.pool.clone();
    sqlx::query("INSERT INTO tenants (name) VALUES ('a'), ('b')").execute(&pool).await.unwrap();
    // One time for the three of the last hour, so that they share a minute.
    let at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT now() - interval '20 minutes'").fetch_one(&pool).await.unwrap();
    let earlier = at - chrono::Duration::minutes(100);
    for (tenant, status, when) in
        [("a", "completed", at), ("a", "failed", at), ("b", "completed", at), ("a", "completed", earlier)]
    {
        sqlx::query(
            "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, created_at, finished_at, history_at)
             VALUES ($1, $2, $3, 'general', 'p', 'mock/m', '{}', $4, $4, $4)",
        )
        .bind(Uuid::now_v7())
        .bind(tenant)
        .bind(status)
        .bind(when)
        .execute(&pool)
        .await
        .unwrap();
    }
    subagentd::db::MIGRATOR.run(&pool).await.unwrap();
    let minute_of = |status: &'static str| {
        let pool = pool.clone();
        async move {
            let q = "SELECT date_trunc('minute', finished_at) FROM tasks WHERE tenant = 'b' AND status = $1";
            sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>(q).bind(status).fetch_one(&pool).await.unwrap()
        }
    };
    let minute = minute_of("completed").await;
    let chart = |t: Option<&'static str>| {
        let pool = pool.clone();
        async move {
            let f = subagentd::store::overview::finished_last_hour(&pool, t).await.unwrap();
            f.into_iter().map(|f| (f.minute, f.status, f.tasks)).collect::<Vec<_>>()
        }
    };
    let (done, failed) = ("completed".to_string(), "failed".to_string());
    assert_eq!(chart(None).await, vec![(minute, done.clone(), 2), (minute, failed.clone(), 1)]);
    assert_eq!(chart(Some("a")).await, vec![(minute, done.clone(), 1), (minute, failed, 1)]);
    // And an end after the upgrade is counted as it is written.
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options) VALUES ($1, 'b', 'queued', 'general', 'p', 'mock/m', '{}')",
    )
    .bind(Uuid::now_v7())
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE tasks SET status = 'cancelled', finished_at = now(), history_at = now() WHERE tenant = 'b' AND status = 'queued'")
        .execute(&pool)
        .await
        .unwrap();
    let now = minute_of("cancelled").await;
    assert_eq!(chart(Some("b")).await, vec![(minute, done, 1), (now, "cancelled".to_string(), 1)]);
    old.drop().await;
}

/// Index tuples read so far through `tasks`' primary key and its `(tenant, id DESC)` index, over
/// every partition, as this backend's statistics show them once flushed.
async fn index_reads(pool: &PgPool) -> (i64, i64) {
    sqlx::query("SELECT pg_stat_force_next_flush()").execute(pool).await.unwrap();
    sqlx::query_as(
        "SELECT coalesce(sum(s.idx_tup_read) FILTER (WHERE p.relname = 'tasks_pkey'), 0)::int8,
                coalesce(sum(s.idx_tup_read) FILTER (WHERE p.relname = 'tasks_tenant_id_idx'), 0)::int8
         FROM pg_stat_user_indexes s JOIN pg_inherits i ON i.inhrelid = s.indexrelid JOIN pg_class p ON p.oid = i.inhparent",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_quiet_tenants_newest_tasks_are_read_through_its_own_index_not_past_the_busy_tenants_newer_ones() {
    let db = test_db().await;
    // One connection: the list and the statistics' flush are the same backend's.
    let pool = subagentd::db::connect(&db.url, 1).await.unwrap();
    sqlx::query("INSERT INTO tenants (name) VALUES ('quiet'), ('busy')").execute(&pool).await.unwrap();
    // 20,000 tasks of the quiet tenant, then 20,000 of the busy one, all newer (ids by time, as
    // the service makes them). PostgreSQL then costs the primary key read backwards, filtered on
    // the tenant, as the cheapest way to the quiet tenant's newest: it would pass all 20,000.
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, created_at, finished_at, history_at)
         SELECT (lpad(to_hex((extract(epoch FROM ts) * 1000)::int8), 12, '0') || '7' || substr(h, 1, 3) || '8'
                 || substr(h, 4, 15))::uuid,
                CASE WHEN g <= 20000 THEN 'quiet' ELSE 'busy' END, 'completed', 'general', 'p', 'mock/m', '{}', ts, ts, ts
         FROM (SELECT g, now() - interval '3 hours' + (g::float8 / 40000) * interval '2 hours' AS ts, md5(g::text) AS h
               FROM generate_series(1, 40000) g) s",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE tasks").execute(&pool).await.unwrap();
    let before = index_reads(&pool).await;
    let f = subagentd::store::tasks::ListFilter { limit: 11, ..Default::default() };
    let page = subagentd::store::tasks::list(&pool, Some("quiet"), &f).await.unwrap();
    let after = index_reads(&pool).await;
    assert_eq!(page.len(), 11);
    assert!(page.iter().all(|t| t.tenant == "quiet"));
    assert!(page.windows(2).all(|w| w[0].id > w[1].id), "newest first");
    let newest: Uuid = sqlx::query_scalar("SELECT id FROM tasks WHERE tenant = 'quiet' ORDER BY id DESC LIMIT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(page[0].id, newest);
    let (pkey, tenant) = (after.0 - before.0, after.1 - before.1);
    assert!(pkey < 100, "{pkey} primary key entries read (the busy tenant's newer tasks passed)");
    assert!((11..100).contains(&tenant), "{tenant} entries of the tenant's index read");
    pool.close().await;
}

/// A service and a task of it run to its end in wait mode, with one tool call (refused: no tool
/// is offered) and then an answer.
async fn a_task_with_a_refused_tool_call() -> (TestApp, Uuid) {
    let app = spawn_app().await;
    let t = app.post_json("/tasks?wait=true", json!({"prompt": "moons [mock:tool_turns=1]", "model": "mock/m"})).await;
    let t: Value = t.json().await.unwrap();
    assert_eq!(t["status"], "completed", "{t}");
    let id = Uuid::parse_str(t["id"].as_str().unwrap()).unwrap();
    (app, id)
}

/// The events one statement writes for a task are one stored row (migration 0033): the last in
/// the row's columns, the ones before it in `earlier`. A task whose tool call is refused writes
/// its 10 events in 6 rows; the JSON pages give every event once, in order, whatever seq they start
/// after (mid-row too) and however few they ask for; the stream gives the same; and the log view
/// has a row per event, as the table had before. Its messages likewise (migration 0034).
#[tokio::test]
async fn a_statements_events_are_one_row_and_every_read_opens_it_in_order() {
    let (app, id) = a_task_with_a_refused_tool_call().await;
    let pool = &app.db.pool;

    let (rows, merged): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(earlier) FROM task_events WHERE task_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    let log: Vec<(i32, String, Value, i32)> =
        sqlx::query_as("SELECT seq, kind, data, row_seq FROM task_event_log WHERE task_id = $1 ORDER BY seq")
            .bind(id)
            .fetch_all(pool)
            .await
            .unwrap();
    let n = log.len() as i32;
    assert_eq!(log.iter().map(|e| e.0).collect::<Vec<_>>(), (1..=n).collect::<Vec<_>>(), "seqs 1 to n, once each");
    assert_eq!(
        log.iter().map(|e| e.1.as_str()).collect::<Vec<_>>(),
        [
            "created",
            "claimed",
            "llm_call_started",
            "llm_call_finished",
            "tool_call_refused",
            "checkpoint",
            "llm_call_started",
            "llm_call_finished",
            "checkpoint",
            "finished"
        ]
    );
    assert!(rows < i64::from(n) && merged >= 2, "{n} events in {rows} rows, {merged} of them with earlier events");
    assert!(log.iter().all(|e| e.3 >= e.0), "a row's seq is its last event's");
    let last_of = |seq: i32| log.iter().find(|e| e.0 == seq).unwrap().3;
    assert_eq!(last_of(4), 6, "the first turn's events are one row");
    assert_eq!(last_of(8), 10, "the last turn's events are one row");

    // Every page, from every seq, of one and of two events: the events after it, in order.
    let page = |after: i32, limit: i32| {
        let app = &app;
        async move {
            let p = app.get_json(&format!("/tasks/{id}/events?after={after}&limit={limit}")).await;
            p["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (e["seq"].as_i64().unwrap() as i32, e["kind"].as_str().unwrap().to_string(), e["data"].clone())
                })
                .collect::<Vec<_>>()
        }
    };
    let want = |after: i32, limit: i32| {
        log.iter()
            .filter(|e| e.0 > after)
            .take(limit as usize)
            .map(|e| (e.0, e.1.clone(), e.2.clone()))
            .collect::<Vec<_>>()
    };
    for after in 0..=n {
        for limit in [1, 2] {
            assert_eq!(page(after, limit).await, want(after, limit), "after {after}, limit {limit}");
        }
    }
    assert_eq!(page(0, 1000).await, want(0, 1000));

    // The stream, resumed in the middle of the last row: the two events after it, then its end.
    let r = app
        .client
        .get(format!("{}/tasks/{id}/events", app.base))
        .header("accept", "text/event-stream")
        .header("last-event-id", "8")
        .send()
        .await
        .unwrap();
    let body = tokio::time::timeout(Duration::from_secs(10), r.text()).await.unwrap().unwrap();
    let ids: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("id: ")).collect();
    assert_eq!(ids, ["9", "10"], "{body}");
    assert_events_typed(pool).await;

    // The conversation likewise (migration 0034): the first turn's four messages in one row, the
    // answer in another; the API and the log view give the five in order, each with its turn.
    let (rows, merged): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(earlier) FROM task_messages WHERE task_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((rows, merged), (2, 1));
    let log: Vec<(i32, i32, Value)> =
        sqlx::query_as("SELECT seq, turn, message FROM task_message_log WHERE task_id = $1 ORDER BY seq")
            .bind(id)
            .fetch_all(pool)
            .await
            .unwrap();
    let roles: Vec<(i32, i32, &str)> = log.iter().map(|m| (m.0, m.1, m.2["role"].as_str().unwrap())).collect();
    assert_eq!(roles, [(1, 1, "system"), (2, 1, "user"), (3, 1, "assistant"), (4, 1, "tool"), (5, 2, "assistant")]);
    let api = app.get_json(&format!("/tasks/{id}/messages")).await;
    let api: Vec<(i64, i64, Value)> = api["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["seq"].as_i64().unwrap(), m["turn"].as_i64().unwrap(), m["message"].clone()))
        .collect();
    assert_eq!(api, log.iter().map(|m| (i64::from(m.0), i64::from(m.1), m.2.clone())).collect::<Vec<_>>());
    app.stop().await;
}

const GRANT: [&str; 3] = ["reserved_usd", "reserved_tokens", "max_tokens"];

/// A row's own event, when the service made it, is compact JSON text in `data_text` and `data` is
/// NULL (migration 0037); the events built in SQL (`created`, `claimed`, ...) stay in `data`. It
/// takes less room than the jsonb it replaces, and a row as the release before wrote it (its
/// event in `data`) reads the same through the API and the log view.
#[tokio::test]
async fn a_rows_own_event_is_stored_as_compact_text_and_a_row_written_before_reads_the_same() {
    let (app, id) = a_task_with_a_refused_tool_call().await;
    let pool = &app.db.pool;
    let rows: Vec<(String, bool, Option<String>)> = sqlx::query_as(
        "SELECT kind, data IS NOT NULL, data_text::text FROM task_events WHERE task_id = $1 ORDER BY seq",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(rows.iter().all(|(_, data, text)| *data != text.is_some()), "one or the other: {rows:?}");
    let texts: Vec<&String> = rows.iter().filter_map(|r| r.2.as_ref()).collect();
    assert!(texts.len() >= 4, "the run's own events as text: {rows:?}");
    let started: Vec<&String> =
        rows.iter().filter(|r| r.0 == "llm_call_started").filter_map(|r| r.2.as_ref()).collect();
    assert!(
        started.len() == 2
            && started.iter().all(|t| GRANT.iter().all(|k| t.matches(&format!("\"{k}\":")).count() == 1)),
        "the grant added, once: {rows:?}"
    );
    assert!(texts.iter().all(|t| !t.contains("\": ") && !t.contains(", \"")), "compact: {texts:?}");
    let (text_bytes, as_jsonb): (i64, i64) = sqlx::query_as(
        "SELECT sum(pg_column_size(data_text)), sum(pg_column_size(data_text::jsonb)) FROM task_events
         WHERE task_id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(text_bytes < as_jsonb, "{text_bytes} bytes as text, {as_jsonb} as jsonb");

    let read = || async {
        let page = app.get_json(&format!("/tasks/{id}/events?limit=1000")).await;
        let log: Vec<(i32, String, Value)> =
            sqlx::query_as("SELECT seq, kind, data FROM task_event_log WHERE task_id = $1 ORDER BY seq")
                .bind(id)
                .fetch_all(pool)
                .await
                .unwrap();
        (page["events"].clone(), log)
    };
    let now = read().await;
    assert_eq!(now.0.as_array().unwrap().len(), now.1.len());
    assert!(now.1.iter().all(|e| e.2.is_object()), "every event's data read: {:?}", now.1);
    sqlx::query("UPDATE task_events SET data = data_text::jsonb, data_text = NULL WHERE task_id = $1 AND data IS NULL")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(read().await, now, "rows as the release before wrote them read the same");
}

/// A run's system message is stored once for all the tasks that send it (migration 0035): the
/// message row names the text by its SHA-256, `message_texts` holds it once, and every read (the
/// log view, the API's conversation, a resume's) gives the message as it was sent. A task with
/// another prompt adds its own text; a row written before, with its text inline, reads as before.
#[tokio::test]
async fn a_system_prompt_is_stored_once_for_every_task_that_sends_it_and_read_back_whole() {
    let app = spawn_app().await;
    let pool = &app.db.pool;
    let prompt = "You are a careful test agent. Answer in one line.";
    let run = |system: &'static str| {
        let app = &app;
        async move {
            let t = app
                .post_json(
                    "/tasks?wait=true",
                    json!({"prompt": "moons [mock:tool_turns=1]", "model": "mock/m", "system_prompt": system}),
                )
                .await;
            let t: Value = t.json().await.unwrap();
            assert_eq!(t["status"], "completed", "{t}");
            Uuid::parse_str(t["id"].as_str().unwrap()).unwrap()
        }
    };
    let texts =
        || async { sqlx::query_scalar::<_, i64>("SELECT count(*) FROM message_texts").fetch_one(pool).await.unwrap() };
    let (a, b) = (run(prompt).await, run(prompt).await);
    assert_eq!(texts().await, 1, "two tasks with one system prompt store it once");
    let hash: Vec<u8> = sqlx::query_scalar("SELECT hash FROM message_texts").fetch_one(pool).await.unwrap();
    assert_eq!(hex::encode(&hash), sha256_hex(prompt));
    for id in [a, b] {
        // Stored: the first row's first message names the text and does not hold it.
        let first: Value = sqlx::query_scalar(
            "SELECT earlier->0 FROM task_messages WHERE task_id = $1 AND earlier IS NOT NULL ORDER BY seq LIMIT 1",
        )
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(first, json!({"role": "system", "text_sha256": sha256_hex(prompt)}));
        // Read: the message as sent, by the view and by the API.
        let log: Value = sqlx::query_scalar("SELECT message FROM task_message_log WHERE task_id = $1 AND seq = 1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(log, json!({"role": "system", "content": prompt}));
        let api = app.get_json(&format!("/tasks/{id}/messages")).await;
        assert_eq!(api["messages"][0]["message"], json!({"role": "system", "content": prompt}), "{api}");
        assert_eq!(api["messages"].as_array().unwrap().len(), 5, "{api}");
    }
    // A resume reads the conversation back, system message whole, and sends it again.
    let r = app
        .post_json(
            "/tasks?wait=true",
            json!({"prompt": "and the rings? [mock:tool_turns=0]", "model": "mock/m", "resume_from": a.to_string()}),
        )
        .await;
    let r: Value = r.json().await.unwrap();
    assert_eq!(r["status"], "completed", "{r}");
    let resumed = app.get_json(&format!("/tasks/{}/messages", r["id"].as_str().unwrap())).await;
    assert_eq!(resumed["messages"][0]["message"], json!({"role": "system", "content": prompt}), "{resumed}");
    assert_eq!(texts().await, 1, "the resumed conversation names the same text");

    run("Another prompt.").await;
    assert_eq!(texts().await, 2, "another prompt, another text");

    // A row from before the migration: its text inline, read as it is.
    let old = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO task_messages (task_id, seq, turn, message, earlier)
         VALUES ($1, 2, 1, '{\"role\": \"user\", \"content\": \"u\"}', '[{\"role\": \"system\", \"content\": \"inline\"}]')",
    )
    .bind(old)
    .execute(pool)
    .await
    .unwrap();
    let old: Vec<Value> = sqlx::query_scalar("SELECT message FROM task_message_log WHERE task_id = $1 ORDER BY seq")
        .bind(old)
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(old, [json!({"role": "system", "content": "inline"}), json!({"role": "user", "content": "u"})]);
    app.stop().await;
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// Heap tuples read from `table` (by scans and by index fetches) and its sequential scans, as
/// the backend's statistics say after a flush.
async fn tuples_read(pool: &PgPool, table: &str) -> (i64, i64) {
    sqlx::query("SELECT pg_stat_force_next_flush()").execute(pool).await.unwrap();
    sqlx::query_as(
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0), coalesce(seq_scan, 0)
         FROM pg_stat_user_tables WHERE relname = $1",
    )
    .bind(table)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// `webhook_deliveries` and `task_actions` are not partitioned (ARCHITECTURE.md, "History by the
/// day"): they have no window, and the reads that run all the time do not grow with the finished
/// rows: the webhook sender's look for due deliveries goes through a partial index of the pending
/// ones, the sweep for expired actions starts from the queue's waiting tasks. With 20,000 finished
/// rows of each beside one open one, each read touches the open row only.
#[tokio::test]
async fn the_webhook_sender_and_the_action_sweep_read_only_open_rows_however_many_are_done() {
    let db = test_db().await;
    // One connection: the reads and the statistics' flush are the same backend's.
    let pool = subagentd::db::connect(&db.url, 1).await.unwrap();
    // 20,000 finished tasks, and one waiting for an answer.
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, created_at, finished_at, history_at)
         SELECT subagentd_uuidv7(now() - interval '1 hour' + g * interval '1 ms'), 't', 'completed', 'general', 'p',
                'mock/m', '{}', now() - interval '1 hour', now() - interval '30 minutes', now() - interval '30 minutes'
         FROM generate_series(1, 20000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    let waiting = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, pauses, paused_at, attempt)
         VALUES ($1, 't', 'requires_action', 'general', 'p', 'mock/m', '{}', 1, now() - interval '2 minutes', 1)",
    )
    .bind(waiting)
    .execute(&pool)
    .await
    .unwrap();
    // Every finished task's delivery done but the newest's; every task's action answered but the
    // waiting one's, whose time has run out.
    sqlx::query(
        "WITH t AS (SELECT id, row_number() OVER (ORDER BY id) = 20000 AS open FROM tasks WHERE status = 'completed')
         INSERT INTO webhook_deliveries (task_id, event, status, attempts, delivered_at)
         SELECT id, 'task.finished', CASE WHEN open THEN 'pending' ELSE 'delivered' END, 1,
                CASE WHEN open THEN NULL ELSE now() END FROM t",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "WITH t AS (SELECT id, status = 'requires_action' AS open FROM tasks)
         INSERT INTO task_actions (id, task_id, tenant, pause, turn, tool_call_id, kind, name, arguments, expires_at,
                                   answered_at, decision, answered_by)
         SELECT gen_random_uuid(), id, 't', 1, 1, 'c1', 'approval', 'deploy', '{}', now() - interval '1 minute',
                CASE WHEN open THEN NULL ELSE now() END, CASE WHEN open THEN NULL ELSE 'approve' END,
                CASE WHEN open THEN NULL ELSE 'admin' END FROM t",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE webhook_deliveries, task_actions").execute(&pool).await.unwrap();

    let before = tuples_read(&pool, "webhook_deliveries").await;
    let due = subagentd::store::tasks::take_due_webhooks(&pool, 50, 30.0).await.unwrap();
    let after = tuples_read(&pool, "webhook_deliveries").await;
    assert_eq!(due.len(), 1, "the one pending delivery is due");
    assert_eq!(after.1 - before.1, 0, "no sequential scan of the deliveries");
    assert!(after.0 - before.0 < 10, "{} deliveries read for one due", after.0 - before.0);

    let before = tuples_read(&pool, "task_actions").await;
    let expired = subagentd::store::actions::expire(&pool).await.unwrap();
    let after = tuples_read(&pool, "task_actions").await;
    assert_eq!(expired, [waiting], "the waiting task's action ran out: answered, and the task queued");
    assert_eq!(after.1 - before.1, 0, "no sequential scan of the actions");
    assert!(after.0 - before.0 < 10, "{} actions read for one open", after.0 - before.0);
    pool.close().await;
}

/// A task's options are stored once for every task that has the same (migration 0036): the task
/// row names them by the SHA-256 of their `jsonb` text and holds none itself, `task_options` has
/// them once, and every read gives them back: the claim (a background task runs by its turn
/// limit), the task's view, a wait-mode answer. Other options, another row; a task row written
/// before, its options inline, reads as before.
#[tokio::test]
async fn a_tasks_options_are_stored_once_for_every_task_with_the_same_and_every_read_gives_them_back() {
    let app = spawn_app().await;
    let pool = &app.db.pool;
    let stored =
        || async { sqlx::query_scalar::<_, i64>("SELECT count(*) FROM task_options").fetch_one(pool).await.unwrap() };
    let body = json!({"prompt": "moons [mock:tool_turns=3]", "model": "mock/m", "max_turns": 2});
    let mut ids = vec![];
    for _ in 0..2 {
        let t = app.submit(body.clone()).await;
        assert_eq!(t["max_turns"], 2, "the insert's answer: {t}");
        let id = t["id"].as_str().unwrap().to_string();
        // Run in the background: the claim read the options, and the run stopped at their limit.
        let done = app.poll_until_terminal(&id, Duration::from_secs(30)).await;
        assert_eq!(
            (done["status"].as_str(), done["stop_reason"].as_str()),
            (Some("incomplete"), Some("max_turns")),
            "{done}"
        );
        assert_eq!(done["max_turns"], 2, "{done}");
        ids.push(Uuid::parse_str(&id).unwrap());
    }
    let waited = app.wait_task(body.clone()).await;
    assert_eq!((waited["stop_reason"].as_str(), &waited["max_turns"]), (Some("max_turns"), &json!(2)), "{waited}");
    ids.push(Uuid::parse_str(waited["id"].as_str().unwrap()).unwrap());
    assert_eq!(stored().await, 1, "three tasks with the same options store them once");
    let rows: Vec<(Option<Value>, Option<Vec<u8>>, bool)> = sqlx::query_as(
        "SELECT t.options, t.options_sha256, t.options_sha256 = sha256(convert_to(o.options::text, 'UTF8'))
         FROM tasks t LEFT JOIN task_options o ON o.hash = t.options_sha256 WHERE t.id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 3);
    for (inline, hash, matches) in rows {
        assert_eq!((inline, hash.map(|h| h.len()), matches), (None, Some(32), true), "named by hash, not held");
    }
    let list = app.get_json("/tasks?limit=10").await;
    let turns: Vec<&Value> = list["tasks"].as_array().unwrap().iter().map(|t| &t["max_turns"]).collect();
    assert_eq!(turns, [&json!(2); 3], "{list}");

    let other = app.wait_task(json!({"prompt": "x", "model": "mock/m", "max_turns": 3})).await;
    assert_eq!(other["max_turns"], 3, "{other}");
    assert_eq!(stored().await, 2, "other options, another row");

    // A row from before the migration: its options inline, read as they are.
    let old = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, created_at, finished_at, history_at)
         VALUES ($1, 'default', 'completed', 'general', 'p', 'mock/m', '{\"max_turns\": 7}', now(), now(), now())",
    )
    .bind(old)
    .execute(pool)
    .await
    .unwrap();
    assert_eq!(app.get_task(&old.to_string()).await["max_turns"], 7);
    app.stop().await;
}
