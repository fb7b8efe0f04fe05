//! The lifecycle room on its own, without HTTP: the rules every front door gets by calling it
//! (the depth rule, idempotency), cancel from each state, answers taken all or none, and every
//! kind of end waking a waiter — against the test database, with no LISTEN connection, so a
//! waiter is woken by the room itself.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use subagentd::cache::TtlCache;
use subagentd::engine::definitions::FileAgents;
use subagentd::engine::{StopCause, StopSignal};
use subagentd::hub::Hub;
use subagentd::kinds::Answerer;
use subagentd::llm::Providers;
use subagentd::store::committer::Committer;
use subagentd::store::runs::Finish;
use subagentd::store::tasks::{StopReason, TaskStatus};
use subagentd::store::Fence;
use subagentd::tasks::answer::ActionAnswer;
use subagentd::tasks::end::{self, End};
use subagentd::tasks::{Lifecycle, Parts, Scope, Submission, TaskError, TaskRequest};
use uuid::Uuid;

use crate::helpers::*;

/// The room, with the hub and pool it was made of (a test reaches below the room through them).
#[derive(Clone)]
struct Room {
    room: Lifecycle,
    hub: Arc<Hub>,
    pool: sqlx::PgPool,
}

impl std::ops::Deref for Room {
    type Target = Lifecycle;
    fn deref(&self) -> &Lifecycle {
        &self.room
    }
}

fn room(db: &TestDb) -> Room {
    let cfg = test_config(&db.url);
    let hub = Hub::new();
    let parts = Parts {
        pool: db.pool.clone(),
        tool_caller: subagentd::tools::Caller::from_config(&cfg).unwrap(),
        workspaces: Arc::new(subagentd::workspace::Workspaces::from_config(&cfg).unwrap()),
        cfg: Arc::new(cfg),
        providers: Arc::new(Providers::with_builtin()),
        file_agents: Arc::new(FileAgents::default()),
        hub: hub.clone(),
        limits_cache: Arc::new(TtlCache::new(Duration::from_secs(5))),
        tools_cache: Arc::new(TtlCache::new(Duration::from_secs(5))),
        shutdown: Default::default(),
        guard: subagentd::tasks::guard::Guard::new(),
    };
    Room { room: Lifecycle::new(parts, None), hub, pool: db.pool.clone() }
}

fn request(prompt: &str) -> TaskRequest {
    serde_json::from_value(json!({"prompt": prompt, "model": "mock/m"})).unwrap()
}

const ACME: &str = "acme";

fn acme() -> Scope {
    Scope::Tenant(ACME.into())
}

/// A task of tenant `acme` in `status`, written straight to the table.
async fn task(db: &TestDb, status: TaskStatus, extra: &str) -> Uuid {
    sqlx::query("INSERT INTO tenants (name) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(ACME)
        .execute(&db.pool)
        .await
        .unwrap();
    let id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, finished_at, history_at)
         VALUES ($1, $2, $3, 'general', 'p', 'mock/m', '{\"max_turns\": 3}',
                 CASE WHEN $3 IN ('queued', 'running', 'requires_action') THEN NULL ELSE now() END,
                 CASE WHEN $3 IN ('queued', 'running', 'requires_action') THEN 'infinity' ELSE now() END)",
    )
    .bind(id)
    .bind(ACME)
    .bind(status)
    .execute(&db.pool)
    .await
    .unwrap();
    if !extra.is_empty() {
        sqlx::query(&format!("UPDATE tasks SET {extra} WHERE id = $1")).bind(id).execute(&db.pool).await.unwrap();
    }
    id
}

async fn status_of(db: &TestDb, id: Uuid) -> TaskStatus {
    sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1").bind(id).fetch_one(&db.pool).await.unwrap()
}

#[tokio::test]
async fn a_submission_from_inside_a_sub_agent_is_refused_and_writes_nothing() {
    let db = test_db().await;
    let room = room(&db);
    for depth in ["1", " 2 "] {
        let s = Submission { depth: Some(depth.into()), ..Submission::new(ACME, request("deeper")) };
        let e = room.create(s, None).await.unwrap_err();
        assert!(matches!(e, TaskError::RecursionRefused { depth: 1 | 2 }), "{e:?}");
        assert_eq!(e.code(), "recursion_refused");
    }
    let s = Submission { depth: Some("deep".into()), ..Submission::new(ACME, request("x")) };
    let e = room.create(s, None).await.unwrap_err();
    assert!(matches!(&e, TaskError::BadParam { field, .. } if field == "Subagent-Depth"), "{e:?}");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(count, 0, "nothing written");
    // Depth 0 is the caller's own request, not a sub-agent's.
    let s = Submission { depth: Some("0".into()), ..Submission::new(ACME, request("top")) };
    let c = room.create(s, None).await.unwrap();
    assert!(c.created);
    assert_eq!(c.task.status, TaskStatus::Queued);
}

#[tokio::test]
async fn a_submission_with_no_model_anywhere_is_refused() {
    let db = test_db().await;
    let room = room(&db);
    let request: TaskRequest = serde_json::from_value(json!({"prompt": "which model?"})).unwrap();
    let e = room.create(Submission::new(ACME, request), None).await.unwrap_err();
    assert!(matches!(e, TaskError::ModelRequired), "{e:?}");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(count, 0);
}

#[tokio::test]
async fn the_same_key_and_body_replay_the_task_and_another_body_is_a_conflict() {
    let db = test_db().await;
    let room = room(&db);
    let keyed = |prompt: &str| Submission {
        idempotency_key: Some("order-42".into()),
        ..Submission::new(ACME, request(prompt))
    };
    let first = room.create(keyed("once"), None).await.unwrap();
    assert!(first.created);
    let again = room.create(keyed("once"), None).await.unwrap();
    assert!(!again.created, "a replay creates nothing");
    assert_eq!(again.task.id, first.task.id);
    let e = room.create(keyed("twice"), None).await.unwrap_err();
    assert!(matches!(e, TaskError::IdempotencyConflict { task_id } if task_id == first.task.id), "{e:?}");
    // Another tenant's key is its own.
    let other = Submission { idempotency_key: Some("order-42".into()), ..Submission::new("globex", request("twice")) };
    assert!(room.create(other, None).await.unwrap().created);
    let bad = Submission { idempotency_key: Some(" ".into()), ..Submission::new(ACME, request("x")) };
    let e = room.create(bad, None).await.unwrap_err();
    assert!(matches!(&e, TaskError::BadParam { field, .. } if field == "Idempotency-Key"), "{e:?}");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(count, 2);
}

#[tokio::test]
async fn cancel_ends_a_queued_or_paused_task_tells_a_running_one_and_leaves_an_ended_one() {
    let db = test_db().await;
    let room = room(&db);
    let queued = task(&db, TaskStatus::Queued, "").await;
    let paused = task(&db, TaskStatus::RequiresAction, "pauses = 1, paused_at = now()").await;
    let lease = Uuid::new_v4();
    let running = task(&db, TaskStatus::Running, &format!("lease_token = '{lease}', attempt = 1")).await;
    let done = task(&db, TaskStatus::Completed, "stop_reason = 'final_answer', summary = 's'").await;
    // The running task's run is in this process: the room's cancel reaches it at once.
    let stop = StopSignal::new();
    room.hub.register_run(Fence { id: running, lease }, stop.clone());
    for id in [queued, paused] {
        let t = room.cancel(&acme(), id).await.unwrap();
        assert_eq!((t.status, t.stop_reason), (TaskStatus::Cancelled, Some(StopReason::Cancelled)));
    }
    let t = room.cancel(&acme(), running).await.unwrap();
    assert_eq!(t.status, TaskStatus::Running, "its worker ends it");
    assert_eq!(stop.cause(), Some(StopCause::Cancelled));
    let t = room.cancel(&acme(), done).await.unwrap();
    assert_eq!((t.status, t.summary.as_deref()), (TaskStatus::Completed, Some("s")), "unchanged");
    // Another tenant's task is not found, and not touched.
    let fresh = task(&db, TaskStatus::Queued, "").await;
    let e = room.cancel(&Scope::Tenant("globex".into()), fresh).await.unwrap_err();
    assert!(matches!(e, TaskError::NotFound), "{e:?}");
    assert_eq!(status_of(&db, fresh).await, TaskStatus::Queued);
    // In bulk: the open ones, by what they were.
    let more = task(&db, TaskStatus::Queued, "").await;
    let body = serde_json::from_value(json!({})).unwrap();
    let mut hit = room.cancel_many(ACME, body).await.unwrap();
    hit.cancelled.sort();
    assert_eq!(hit.cancelled, vec![fresh, more]);
    assert!(hit.cancel_requested.is_empty(), "the running one was told already");
}

/// A paused task of `acme` waiting on an approval and an output.
async fn paused(db: &TestDb) -> (Uuid, Uuid, Uuid) {
    let id = task(db, TaskStatus::RequiresAction, "pauses = 1, paused_at = now(), attempt = 1").await;
    let (approval, output) = (Uuid::now_v7(), Uuid::now_v7());
    for (a, kind, call) in [(approval, "approval", "call_1"), (output, "output", "call_2")] {
        sqlx::query(
            "INSERT INTO task_actions (id, task_id, tenant, pause, turn, tool_call_id, kind, name, arguments, expires_at)
             VALUES ($1, $2, $3, 1, 1, $4, $5, 'tool', '{}', now() + interval '1 hour')",
        )
        .bind(a)
        .bind(id)
        .bind(ACME)
        .bind(call)
        .bind(kind)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    (id, approval, output)
}

async fn unanswered(db: &TestDb, task: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM task_actions WHERE task_id = $1 AND answered_at IS NULL")
        .bind(task)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn answers_are_taken_all_or_none_and_the_last_one_queues_the_run_again() {
    let db = test_db().await;
    let room = room(&db);
    let (id, approval, output) = paused(&db).await;
    let by = Answerer::Key("sk_test".into());
    let refused = [
        // One good answer and one for an action the task does not have.
        vec![ActionAnswer::approve(approval, None), ActionAnswer::approve(Uuid::now_v7(), None)],
        // A decision for an output.
        vec![ActionAnswer::approve(approval, None), ActionAnswer::deny(output, None)],
        // Neither a decision nor an output.
        vec![ActionAnswer { id: approval, decision: None, message: None, output: None }],
    ];
    let codes = ["unknown_action", "wrong_action_kind", "validation_failed"];
    for (answers, code) in refused.into_iter().zip(codes) {
        let e = room.answer(&acme(), &by, id, answers).await.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert_eq!(unanswered(&db, id).await, 2, "nothing written for {code}");
    }
    let t = room.answer(&acme(), &by, id, vec![ActionAnswer::approve(approval, None)]).await.unwrap();
    assert_eq!(t.status, TaskStatus::RequiresAction, "still waiting on the output");
    let t = room.answer(&acme(), &by, id, vec![ActionAnswer::output(output, json!("42"))]).await.unwrap();
    assert_eq!(t.status, TaskStatus::Queued, "the last answer queues it again");
    let who: Vec<String> = sqlx::query_scalar("SELECT answered_by FROM task_actions WHERE task_id = $1")
        .bind(id)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(who, vec!["key:sk_test", "key:sk_test"]);
    // The same answer again is accepted; another is a conflict; a task that is not paused says so.
    let e = room.answer(&acme(), &by, id, vec![ActionAnswer::deny(approval, None)]).await.unwrap_err();
    assert_eq!(e.code(), "action_already_answered");
    let other = task(&db, TaskStatus::Queued, "").await;
    let e = room.answer(&acme(), &by, other, vec![ActionAnswer::approve(approval, None)]).await.unwrap_err();
    assert!(matches!(e, TaskError::NotPaused { status: TaskStatus::Queued }), "{e:?}");
}

/// Whether `waiter` was woken (it keeps the wake-up until asked: no waiting, no timing), and
/// the task it was handed, if the end handed it one.
fn woken(waiter: &subagentd::hub::Waiter<'_>) -> Option<Option<subagentd::store::tasks::TaskRow>> {
    futures_util::FutureExt::now_or_never(waiter.notified())
}

#[tokio::test]
async fn every_kind_of_end_wakes_a_waiter() {
    let db = test_db().await;
    let room = room(&db);
    let committer = Committer::start(db.pool.clone());

    // A run's end: its waiter here is handed the task as the end's commit wrote it.
    let lease = Uuid::new_v4();
    let run = task(&db, TaskStatus::Running, &format!("lease_token = '{lease}', attempt = 1")).await;
    let waiter = room.hub.waiter(run);
    let finish = Finish {
        status: TaskStatus::Completed,
        stop_reason: Some(StopReason::FinalAnswer),
        summary: Some("done".into()),
        output: None,
        error_code: None,
        error_message: None,
        return_task: false,
    };
    let ending = End::Run { fence: Fence { id: run, lease }, last_turn: None, finish, committer: &committer };
    end::finish(&room.pool, &room.hub, ending).await.unwrap();
    let handed = woken(&waiter).expect("woken").expect("handed the task");
    assert_eq!((handed.status, handed.summary.as_deref()), (TaskStatus::Completed, Some("done")));

    // A cancel.
    let queued = task(&db, TaskStatus::Queued, "").await;
    let waiter = room.hub.waiter(queued);
    room.cancel(&acme(), queued).await.unwrap();
    assert!(woken(&waiter).is_some(), "a cancel wakes");
    assert_eq!(room.get(&acme(), queued).await.unwrap().status, TaskStatus::Cancelled);

    // A rescue that finds the run's worker lost, out of attempts.
    let extra = "lease_token = gen_random_uuid(), attempt = 3, lease_expires_at = now() - interval '1 minute'";
    let lost = task(&db, TaskStatus::Running, extra).await;
    let waiter = room.hub.waiter(lost);
    end::finish(&room.pool, &room.hub, End::Rescue { max_attempts: 3, grace_secs: 0.0 }).await.unwrap();
    assert!(woken(&waiter).is_some(), "a rescue that ends the task wakes");
    let t = room.get(&acme(), lost).await.unwrap();
    assert_eq!((t.status, t.error.unwrap()["code"].clone()), (TaskStatus::Failed, json!("worker_lost")));

    // A budget wait past its task's time limit.
    let extra = "waiting_for = 'budget', wait_deadline = now() - interval '1 second'";
    let waiting = task(&db, TaskStatus::Queued, extra).await;
    let waiter = room.hub.waiter(waiting);
    end::finish(&room.pool, &room.hub, End::WaitsTimedOut).await.unwrap();
    assert!(woken(&waiter).is_some(), "a budget wait's end wakes");
    let t = room.get(&acme(), waiting).await.unwrap();
    assert_eq!((t.status, t.stop_reason), (TaskStatus::Incomplete, Some(StopReason::Timeout)));

    // And a join, the waiters' way in: woken by the end it waits for.
    let queued = task(&db, TaskStatus::Queued, "").await;
    let r = room.clone();
    let join = tokio::spawn(async move { r.join(&acme(), queued, Duration::from_secs(30)).await.unwrap() });
    while room.hub.waiter_count() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    room.cancel(&acme(), queued).await.unwrap();
    let j = join.await.unwrap();
    assert_eq!((j.settled, j.task.status), (true, TaskStatus::Cancelled));
}

#[tokio::test]
async fn streams_of_one_task_each_get_every_event_once_in_order_from_wherever_they_start() {
    use futures_util::StreamExt;
    let app = spawn_app().await;
    let t = app.submit(json!({"prompt": "turns [mock:tool_turns=4] [mock:delay_ms=150]", "model": "mock/m"})).await;
    let id: Uuid = t["id"].as_str().unwrap().parse().unwrap();
    let room = app.service.as_ref().unwrap().tasks.as_ref().unwrap();
    let scope = Scope::Tenant("default".into());
    // Three streams at once, a fourth joining late from the start, a fifth from the middle.
    let mut feeds = vec![];
    for _ in 0..3 {
        feeds.push(room.follow(&scope, id, None).await.unwrap().unwrap().boxed());
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    feeds.push(room.follow(&scope, id, Some(0)).await.unwrap().unwrap().boxed());
    feeds.push(room.follow(&scope, id, Some(3)).await.unwrap().unwrap().boxed());
    let mut seen = vec![];
    for f in feeds {
        let seqs: Vec<i32> = f.filter_map(|i| async move { i.event() }).map(|e| e.seq).collect().await;
        seen.push(seqs);
    }
    let last = *seen[0].last().unwrap();
    let all: Vec<i32> = (1..=last).collect();
    for (i, s) in seen.iter().enumerate().take(4) {
        assert_eq!(s, &all, "stream {i}");
    }
    assert_eq!(seen[4], (4..=last).collect::<Vec<i32>>(), "from the middle");
    let kinds: i64 = sqlx::query_scalar("SELECT count(*) FROM task_event_log WHERE task_id = $1 AND kind = 'finished'")
        .bind(id)
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(kinds, 1);
}
