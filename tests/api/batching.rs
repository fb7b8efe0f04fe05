//! Group commit (`jobs::committer`, issue 20): the writes of runs that are ready at the same
//! moment go to PostgreSQL as one statement, each still fenced on its own lease. Against a real
//! database, at the store's level and through the committer's queues.

use std::time::Duration;

use rust_decimal::Decimal;
use serde_json::{json, Value};
use subagentd::engine::{StopCause, StopSignal};
use subagentd::hub::Hub;
use subagentd::jobs::heartbeat::Heartbeat;
use subagentd::kinds::{event, Event};
use subagentd::store::budget::{reserve_many, CallAsk, Reserve, ReserveWrite, SpendDefaults};
use subagentd::store::calls::{CallOutcome, CallRow};
use subagentd::store::committer::Committer;
use subagentd::store::runs::{commit_turns, Committed, Finish, TurnWrite};
use subagentd::store::tasks::{StopReason, TaskStatus};
use subagentd::store::Fence;
use uuid::Uuid;

use crate::helpers::*;
use crate::services::{status, task};

/// A running task held under `lease`.
async fn held(db: &TestDb, lease: Uuid) -> Fence {
    let id =
        task(db, "running", &format!("lease_token = '{lease}', lease_expires_at = now() + interval '1 hour'")).await;
    Fence { id, lease }
}

/// Turn 1 of a run: one call of `input` tokens at $0.01, two messages, one event.
fn turn(fence: Fence, input: i64, message: Value) -> TurnWrite {
    let call = CallRow {
        call_key: Uuid::now_v7(),
        turn: 1,
        attempt: 1,
        try_no: 1,
        provider: "mock".into(),
        model: "m".into(),
        input_tokens: input,
        output_tokens: 5,
        cost_usd: Some(Decimal::new(1, 2)),
        outcome: CallOutcome::Ok,
        ..CallRow::default()
    };
    let messages = vec![json!({"role": "assistant", "content": "calling"}), message];
    TurnWrite {
        fence,
        turn: Some(1),
        call,
        messages,
        events: vec![Event::LlmCallFinished(event::LlmCallFinished { turn: 1, ..Default::default() })],
        fin: None,
    }
}

async fn scalar(db: &TestDb, sql: &str, id: Uuid) -> i64 {
    sqlx::query_scalar(sql).bind(id).fetch_one(&db.pool).await.unwrap()
}

async fn calls_of(db: &TestDb, id: Uuid) -> i64 {
    scalar(db, "SELECT count(*) FROM llm_calls WHERE task_id = $1", id).await
}

async fn rollup(db: &TestDb) -> (i64, i64) {
    sqlx::query_as("SELECT coalesce(sum(calls), 0)::int8, coalesce(sum(input_tokens), 0)::int8 FROM usage_daily")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn turns_committed_together_are_each_fenced_on_their_own_lease_and_a_retry_writes_nothing_twice() {
    let db = test_db().await;
    let lease = Uuid::new_v4();
    let (a, b) = (held(&db, lease).await, held(&db, lease).await);
    let c = held(&db, Uuid::new_v4()).await;
    let mut ending = turn(b, 200, json!({"role": "user", "content": "b"}));
    ending.fin = Some(Finish {
        status: TaskStatus::Completed,
        stop_reason: Some(StopReason::FinalAnswer),
        summary: Some("done".into()),
        output: None,
        error_code: None,
        error_message: None,
        return_task: true,
    });
    let writes = [
        turn(a, 100, json!({"role": "user", "content": "a"})),
        ending,
        // Under a lease that is not c's: fenced off.
        turn(Fence { id: c.id, lease }, 400, json!({"role": "user", "content": "c"})),
    ];
    let refs: Vec<&TurnWrite> = writes.iter().collect();
    for attempt in 0..2 {
        // The second time is a retry after a lost answer: the same results, nothing written again.
        let r = commit_turns(&db.pool, &refs).await.unwrap();
        assert_eq!(r.len(), 3, "attempt {attempt}");
        assert!(matches!(r[0], Committed::Applied), "{:?}", r[0]);
        match &r[1] {
            Committed::Finished(Some(row)) => {
                assert_eq!((row.id, row.status, row.summary.as_deref()), (b.id, TaskStatus::Completed, Some("done")))
            }
            other => panic!("b: {other:?}"),
        }
        assert!(matches!(r[2], Committed::LeaseLost), "{:?}", r[2]);
        assert_eq!((calls_of(&db, a.id).await, calls_of(&db, b.id).await, calls_of(&db, c.id).await), (1, 1, 0));
        assert_eq!(rollup(&db).await, (2, 300), "one rollup for both, nothing for the fenced one");
    }
    // Each run's messages and events in its own sequence, after what it had.
    let seqs = |table: &'static str| {
        let pool = db.pool.clone();
        move |id: Uuid| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i32>(&format!("SELECT seq FROM {table} WHERE task_id = $1 ORDER BY seq"))
                    .bind(id)
                    .fetch_all(&pool)
                    .await
                    .unwrap()
            }
        }
    };
    assert_eq!(seqs("task_message_log")(a.id).await, vec![1, 2]);
    assert_eq!(seqs("task_event_log")(a.id).await, vec![1]);
    // b's turn event, then its end's `finished`.
    assert_eq!(seqs("task_event_log")(b.id).await, vec![1, 2]);
    // ... in one row each: the statement's events, and its messages (migrations 0033, 0034).
    assert_eq!(seqs("task_events")(b.id).await, vec![2], "b's two events, one row");
    assert_eq!(seqs("task_messages")(a.id).await, vec![2], "a's two messages, one row");
    assert_eq!(scalar(&db, "SELECT last_event_seq::int8 FROM tasks WHERE id = $1", b.id).await, 2);
    assert!(seqs("task_event_log")(c.id).await.is_empty());
    assert_eq!(
        (status(&db, a.id).await, status(&db, b.id).await, status(&db, c.id).await),
        ("running".into(), "completed".into(), "running".into())
    );
    assert_eq!(scalar(&db, "SELECT turns::int8 FROM tasks WHERE id = $1", c.id).await, 0);
}

#[tokio::test]
async fn a_batch_postgres_refuses_writes_nothing_and_then_every_other_write_lands_alone() {
    let db = test_db().await;
    let lease = Uuid::new_v4();
    let (a, b, c) = (held(&db, lease).await, held(&db, lease).await, held(&db, lease).await);
    // PostgreSQL's jsonb refuses a NUL character: this write can never be made.
    let poison = || turn(b, 100, json!({"role": "user", "content": "nul \u{0000} here"}));
    let good = |f: Fence| turn(f, 100, json!({"role": "user", "content": "fine"}));
    let writes = [good(a), poison(), good(c)];
    assert!(commit_turns(&db.pool, &writes.iter().collect::<Vec<_>>()).await.is_err());
    assert_eq!((calls_of(&db, a.id).await, calls_of(&db, c.id).await), (0, 0), "a failed batch writes nothing");
    // Through the committer: queued together (all three are sent before its lanes first run, on
    // this single-threaded runtime), the batch fails, and each write is made alone.
    let committer = Committer::start(db.pool.clone());
    let (ra, rb, rc) =
        tokio::join!(committer.turns.write(good(a)), committer.turns.write(poison()), committer.turns.write(good(c)));
    assert!(matches!(ra, Ok(Committed::Applied)), "{ra:?}");
    assert!(rb.is_err(), "{rb:?}");
    assert!(matches!(rc, Ok(Committed::Applied)), "{rc:?}");
    assert_eq!((calls_of(&db, a.id).await, calls_of(&db, b.id).await, calls_of(&db, c.id).await), (1, 0, 1));
    assert_eq!(rollup(&db).await, (2, 200));
}

#[tokio::test]
async fn reservations_made_together_each_see_the_ones_before_them_and_answer_in_the_order_asked() {
    let db = test_db().await;
    let lease = Uuid::new_v4();
    let (first, second) = (held(&db, lease).await, held(&db, lease).await);
    let gone = held(&db, Uuid::new_v4()).await;
    sqlx::query("UPDATE tenants SET usd_per_day = 1.0 WHERE name = 'default'").execute(&db.pool).await.unwrap();
    // A call of $0.10 prompt and 600 output tokens at $0.001 holds $0.70: the day's $1.00 has
    // room for one of them at a time.
    let ask = CallAsk {
        prompt_usd: Decimal::new(1, 1),
        prompt_tokens: 1000,
        out_usd: Decimal::new(1, 3),
        max_out: 600,
        floor: 256,
    };
    let w = |f: Fence| ReserveWrite {
        fence: f,
        tenant: "default".into(),
        ask,
        defaults: SpendDefaults::default(),
        event: Some(Event::LlmCallStarted(event::LlmCallStarted { turn: 1, ..Default::default() })),
    };
    // Asked out of order: they are made in task order, the order the locks are taken in.
    let items = [w(Fence { id: gone.id, lease }), w(second), w(first)];
    let r = reserve_many(&db.pool, &items.iter().collect::<Vec<_>>()).await.unwrap();
    assert_eq!(r[0], Reserve::LeaseLost);
    assert!(matches!(r[1], Reserve::Wait { ref limit, .. } if limit == "usd_per_day"), "{:?}", r[1]);
    assert_eq!(r[2], Reserve::Granted { max_tokens: 600, usd: Decimal::new(70, 2), tokens: 1600 });
    let held_usd: Decimal = sqlx::query_scalar("SELECT sum(reserved_usd) FROM tasks WHERE tenant = 'default'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(held_usd, Decimal::new(70, 2));
    assert_eq!(scalar(&db, "SELECT count(*) FROM task_event_log WHERE task_id = $1", first.id).await, 1);
    assert_eq!(scalar(&db, "SELECT count(*) FROM task_event_log WHERE task_id = $1", second.id).await, 0);
}

#[tokio::test]
async fn a_heartbeat_does_not_wait_for_a_row_a_write_holds_and_renews_it_on_the_next_beat() {
    let db = test_db().await;
    let lease = Uuid::new_v4();
    let soon = format!("lease_token = '{lease}', lease_expires_at = now() + interval '1 second'");
    let (busy, free) = (task(&db, "running", &soon).await, task(&db, "running", &soon).await);
    let hub = Hub::new();
    let signals = [StopSignal::new(), StopSignal::new()];
    for (id, s) in [busy, free].into_iter().zip(&signals) {
        hub.register_run(Fence { id, lease }, s.clone());
    }
    let hb = Heartbeat { pool: db.pool.clone(), hub, lease: Duration::from_secs(600), every: Duration::from_secs(1) };
    // A run's write holds `busy`'s row (as a batch does while it commits).
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE").bind(busy).execute(&mut *tx).await.unwrap();
    let renewed = tokio::time::timeout(Duration::from_secs(5), hb.pass()).await.expect("the beat waited").unwrap();
    assert_eq!(renewed, 1);
    assert_eq!((signals[0].cause(), signals[1].cause()), (None, None), "a held row is not a lost lease");
    tx.commit().await.unwrap();
    assert_eq!(hb.pass().await.unwrap(), 2);
    let later = "SELECT count(*) FROM tasks WHERE id = $1 AND lease_expires_at > now() + interval '5 minutes'";
    assert_eq!(scalar(&db, later, busy).await, 1);
    // A lease that is really gone still stops its run.
    sqlx::query("UPDATE tasks SET lease_token = gen_random_uuid() WHERE id = $1")
        .bind(free)
        .execute(&db.pool)
        .await
        .unwrap();
    hb.pass().await.unwrap();
    assert_eq!(signals[1].cause(), Some(StopCause::LeaseLost));
}

/// What a run's turns leave behind, less what differs between two tasks by nature (ids, keys,
/// clocks): the task row, its ledger rows, messages and events.
async fn written(db: &TestDb, id: Uuid) -> Value {
    let sql = "SELECT jsonb_build_object(
        'task', (SELECT to_jsonb(t) - 'id' - 'created_at' - 'started_at' - 'finished_at' - 'history_at' - 'last_call_key' - 'lease_token'
                 - 'lease_expires_at' FROM tasks t WHERE id = $1),
        'calls', (SELECT jsonb_agg(to_jsonb(c) - 'id' - 'call_key' - 'task_id' - 'created_at' ORDER BY c.turn)
                  FROM llm_calls c WHERE task_id = $1),
        'messages', (SELECT jsonb_agg(jsonb_build_array(seq, turn, message) ORDER BY seq)
                     FROM task_message_log WHERE task_id = $1),
        'events', (SELECT jsonb_agg(jsonb_build_array(seq, kind, data) ORDER BY seq)
                   FROM task_event_log WHERE task_id = $1))";
    sqlx::query_scalar(sql).bind(id).fetch_one(&db.pool).await.unwrap()
}

/// A lone write has a statement of its own (`commit_alone`) beside the batched one: both write
/// the same, for a turn and for the turn that ends the task, with every figure set.
#[tokio::test]
async fn a_turn_committed_alone_writes_what_the_same_turn_in_a_batch_writes() {
    let db = test_db().await;
    let lease = Uuid::new_v4();
    let (alone, batched, other) = (held(&db, lease).await, held(&db, lease).await, held(&db, lease).await);
    let full = |f: Fence, turn_no: i32, fin: Option<Finish>| {
        let mut w = turn(f, 100, json!({"role": "user", "content": "fine"}));
        w.turn = Some(turn_no);
        w.call = CallRow {
            call_key: Uuid::now_v7(),
            turn: turn_no,
            cached_tokens: 7,
            cache_write_tokens: 3,
            web_searches: 2,
            latency_ms: 120,
            http_status: Some(200),
            usage_estimated: turn_no == 2,
            reserved_usd: Decimal::new(5, 2),
            reserved_tokens: 900,
            ..w.call
        };
        w.fin = fin;
        w
    };
    let fin = || Finish {
        status: TaskStatus::Completed,
        stop_reason: Some(StopReason::FinalAnswer),
        summary: Some("done".into()),
        output: Some(json!({"n": 1})),
        error_code: None,
        error_message: None,
        return_task: true,
    };
    let mut conn = db.pool.acquire().await.unwrap();
    for (n, f) in [(1, None), (2, Some(fin()))] {
        let one = full(alone, n, f.clone());
        let alone_done = one.commit_alone(&mut conn).await.unwrap();
        let two = [full(batched, n, f), full(other, n, None)];
        let batch_done = commit_turns(&db.pool, &two.iter().collect::<Vec<_>>()).await.unwrap();
        match (&alone_done, &batch_done[0]) {
            (Committed::Applied, Committed::Applied) => assert_eq!(n, 1),
            (Committed::Finished(Some(a)), Committed::Finished(Some(b))) => {
                assert_eq!((a.status, &a.summary, a.turns), (b.status, &b.summary, b.turns))
            }
            other => panic!("turn {n}: {other:?}"),
        }
    }
    assert_eq!(written(&db, alone.id).await, written(&db, batched.id).await);
    assert_eq!(status(&db, alone.id).await, "completed");
}
