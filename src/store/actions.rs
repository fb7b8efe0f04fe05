//! `task_actions`: what a paused run waits for, one row per tool call, each answered by its own
//! id; and the task's moves into and out of `requires_action`. An answer is written (with who gave
//! it and when) before it is acknowledged; the last answer of a pause queues the task again.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{Fence, StoreError, CH_QUEUED};
use crate::kinds::{event, Answerer, Decision, Event, Gate, TaskStatus};

/// One action as stored and as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ActionRow {
    pub id: Uuid,
    #[serde(skip)]
    pub task_id: Uuid,
    #[serde(skip)]
    pub pause: i32,
    pub turn: i32,
    pub tool_call_id: String,
    pub kind: Gate,
    pub name: String,
    pub arguments: Value,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<Answerer>,
}

/// An action as read from `task_actions` (every statement that answers with `ActionRow`s),
/// for `sqlx::query_as!`: the statement's text after its columns, then its arguments.
macro_rules! actions_where {
    ($rest:literal, $($arg:expr),+) => {
        sqlx::query_as!(
            ActionRow,
            r#"SELECT id, task_id, pause, turn, tool_call_id, kind AS "kind: Gate", name, arguments, created_at,
                    expires_at, answered_at, decision AS "decision: Decision", message, output,
                    answered_by AS "answered_by: Answerer"
             FROM task_actions a "# + $rest,
            $($arg),+
        )
    };
}

/// A call to wait on.
#[derive(Debug, Clone)]
pub struct NewAction {
    pub tool_call_id: String,
    pub kind: Gate,
    pub name: String,
    pub arguments: Value,
}

/// Pause the run holding `f` (in `conn`'s transaction, after its last turn's checkpoint): the
/// task goes to `requires_action` with no lease or reservation, its actions are written, and so
/// are its `requires_action` event and, with a webhook, a `task.requires_action` delivery.
/// Returns the pause's number, or `None` if the lease is no longer held.
pub async fn pause(
    conn: &mut PgConnection,
    f: Fence,
    turn: i32,
    actions: &[NewAction],
    timeout_secs: f64,
) -> Result<Option<i32>, StoreError> {
    let ids: Vec<Uuid> = actions.iter().map(|_| Uuid::now_v7()).collect();
    let calls: Vec<&str> = actions.iter().map(|a| a.tool_call_id.as_str()).collect();
    let kinds: Vec<Gate> = actions.iter().map(|a| a.kind).collect();
    let names: Vec<&str> = actions.iter().map(|a| a.name.as_str()).collect();
    let args: Vec<&Value> = actions.iter().map(|a| &a.arguments).collect();
    let listed: Vec<Value> = actions
        .iter()
        .zip(&ids)
        .map(|(a, id)| serde_json::json!({"id": id, "tool_call_id": a.tool_call_id, "kind": a.kind, "name": a.name}))
        .collect();
    Ok(sqlx::query_scalar!(r#"WITH u AS (
            UPDATE task_queue SET status = 'requires_action', lease_token = NULL,
                lease_expires_at = NULL, worker_id = NULL, reserved_usd = 0, reserved_tokens = 0, pauses = pauses + 1,
                paused_at = now(), last_event_seq = last_event_seq + 1
            WHERE id = $1 AND lease_token = $2
            RETURNING id, tenant, pauses, last_event_seq, webhook_url
         ), a AS (
            INSERT INTO task_actions (id, task_id, tenant, pause, turn, tool_call_id, kind, name, arguments, expires_at)
            SELECT x.id, u.id, u.tenant, u.pauses, $3, x.call, x.kind, x.name, x.args,
                   now() + make_interval(secs => $4)
            FROM u, unnest($5::uuid[], $6::text[], $7::text[], $8::text[], $9::jsonb[]) AS x(id, call, kind, name, args)
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data)
            SELECT id, last_event_seq, 'requires_action', jsonb_build_object('turn', $3::int, 'pause', pauses, 'actions', $10::jsonb)
            FROM u
         ), w AS (
            INSERT INTO webhook_deliveries (task_id, event, seq, push_config)
            SELECT id, 'task.requires_action', pauses, '' FROM u WHERE webhook_url IS NOT NULL
            UNION ALL
            SELECT u.id, 'task.requires_action', u.pauses, c.id FROM u JOIN a2a_push_configs c ON c.task_id = u.id
         )
         SELECT pauses AS "pauses!" FROM u"#, f.id, f.lease, turn, timeout_secs, &ids, &calls as _, &kinds as _, &names as _, &args as _, Value::Array(listed))
    .fetch_optional(conn)
    .await?)
}

/// The actions of `task`'s pause `pause`.
pub async fn of_pause(pool: &PgPool, task: Uuid, pause: i32) -> Result<Vec<ActionRow>, StoreError> {
    Ok(actions_where!("WHERE task_id = $1 AND pause = $2 ORDER BY id", task, pause).fetch_all(pool).await?)
}

/// The unanswered actions of paused tasks, by task.
pub async fn pending_of(pool: &PgPool, tasks: &[Uuid]) -> Result<Vec<ActionRow>, StoreError> {
    if tasks.is_empty() {
        return Ok(vec![]);
    }
    Ok(actions_where!(
        "WHERE a.task_id = ANY($1) AND a.answered_at IS NULL
         AND a.pause = (SELECT pauses FROM tasks t WHERE t.id = a.task_id) ORDER BY a.task_id, a.id",
        tasks
    )
    .fetch_all(pool)
    .await?)
}

/// One answer to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub id: Uuid,
    pub decision: Option<Decision>,
    pub message: Option<String>,
    pub output: Option<Value>,
}

/// Why answers were not taken (nothing was written).
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    NoTask,
    NotPaused(TaskStatus),
    /// `index` in the request: no action of this task has that id.
    Unknown {
        index: usize,
        id: Uuid,
    },
    /// The answer is of the wrong kind for the action (a decision for an output, say).
    WrongKind {
        index: usize,
        id: Uuid,
        kind: Gate,
    },
    /// The action was answered differently already (or expired: `by` says).
    Conflict {
        index: usize,
        id: Uuid,
        by: Answerer,
    },
}

/// What answering did.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    /// Still waiting on these (their count); 0: the task is queued again.
    pub left: i64,
    pub tenant: String,
}

/// Answer actions of a paused task (of `tenant`, or any for the admin), all or none: with the
/// task's row locked, each answer is checked (its action exists, is of its kind, is not answered
/// otherwise — the same answer again is accepted and changes nothing), written with `by`, and
/// when none of the pause's actions is left, the task is queued again.
pub async fn answer(
    pool: &PgPool,
    tenant: Option<&str>,
    task: Uuid,
    answers: &[Answer],
    by: &Answerer,
) -> Result<Result<Answered, Refused>, StoreError> {
    super::on_move(pool, || answer_once(pool, tenant, task, answers, by)).await
}

async fn answer_once(
    pool: &PgPool,
    tenant: Option<&str>,
    task: Uuid,
    answers: &[Answer],
    by: &Answerer,
) -> Result<Result<Answered, Refused>, StoreError> {
    let mut tx = pool.begin().await?;
    let row = sqlx::query!(
        r#"SELECT tenant, status AS "status: TaskStatus", pauses FROM tasks
         WHERE id = $1 AND ($2::text IS NULL OR tenant = $2) FOR UPDATE"#,
        task,
        tenant
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some((owner, status, pause)) = row.map(|r| (r.tenant, r.status, r.pauses)) else {
        return Ok(Err(Refused::NoTask));
    };
    let all = actions_where!("WHERE task_id = $1", task).fetch_all(&mut *tx).await?;
    // A task that never paused has nothing to answer: that it is not waiting is the news, not
    // which id was sent.
    if all.is_empty() && status != TaskStatus::RequiresAction {
        return Ok(Err(Refused::NotPaused(status)));
    }
    let mut fresh = vec![];
    for (index, a) in answers.iter().enumerate() {
        let Some(action) = all.iter().find(|x| x.id == a.id) else {
            return Ok(Err(Refused::Unknown { index, id: a.id }));
        };
        let is_decision = a.decision.is_some();
        if is_decision != (action.kind == Gate::Approval) {
            return Ok(Err(Refused::WrongKind { index, id: a.id, kind: action.kind }));
        }
        if action.answered_at.is_some() {
            let same = action.answered_by != Some(Answerer::Expired)
                && action.decision == a.decision
                && action.output == a.output
                && (a.decision.is_none() || action.message == a.message);
            if same {
                continue;
            }
            let by = action.answered_by.clone().unwrap_or(Answerer::Expired);
            return Ok(Err(Refused::Conflict { index, id: a.id, by }));
        }
        fresh.push(a);
    }
    if !fresh.is_empty() && status != TaskStatus::RequiresAction {
        return Ok(Err(Refused::NotPaused(status)));
    }
    for a in &fresh {
        sqlx::query!(
            r#"UPDATE task_actions SET answered_at = now(), decision = $2, message = $3, output = $4, answered_by = $5
             WHERE id = $1 AND answered_at IS NULL"#,
            a.id,
            a.decision.map(Decision::as_str),
            a.message,
            a.output,
            by.to_string()
        )
        .execute(&mut *tx)
        .await?;
        let data = event::ActionAnswered { id: a.id, decision: a.decision, output: a.output.is_some(), by: by.clone() };
        answered_event(&mut tx, task, &Event::ActionAnswered(data)).await?;
    }
    let left: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM task_actions WHERE task_id = $1 AND pause = $2 AND answered_at IS NULL"#,
        task,
        pause
    )
    .fetch_one(&mut *tx)
    .await?;
    if left == 0 && !fresh.is_empty() {
        resume(&mut tx, task).await?;
    }
    tx.commit().await?;
    Ok(Ok(Answered { left, tenant: owner }))
}

/// The task's `action_answered` event (one per answer, so the story says who decided what).
async fn answered_event(conn: &mut PgConnection, task: Uuid, data: &Event) -> Result<(), StoreError> {
    sqlx::query!(
        r#"WITH u AS (UPDATE tasks SET last_event_seq = last_event_seq + 1 WHERE id = $1 RETURNING id, last_event_seq)
         INSERT INTO task_events (task_id, seq, kind, data) SELECT id, last_event_seq, 'action_answered', $2 FROM u"#,
        task,
        sqlx::types::Json(data) as _
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Queue a paused task whose actions are all answered again (its paused time counted apart,
/// and its attempt given back: the claim that resumes it continues the same attempt), with its
/// `actions_answered` event; tells the workers.
async fn resume(conn: &mut PgConnection, task: Uuid) -> Result<bool, StoreError> {
    let n = sqlx::query_scalar!(
        r#"WITH u AS (
            UPDATE task_queue SET status = 'queued', attempt = attempt - 1, paused_ms = paused_ms + (extract(epoch FROM now() - paused_at) * 1000)::bigint,
                paused_at = NULL, last_event_seq = last_event_seq + 1
            WHERE id = $1 AND status = 'requires_action'
              AND NOT EXISTS (SELECT 1 FROM task_actions a WHERE a.task_id = task_queue.id AND a.pause = task_queue.pauses
                              AND a.answered_at IS NULL)
            RETURNING id, pauses, last_event_seq
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data)
            SELECT id, last_event_seq, 'actions_answered', jsonb_build_object('pause', pauses) FROM u
         )
         SELECT count(pg_notify($2, '')) AS "n!" FROM u"#,
        task,
        CH_QUEUED
    )
    .fetch_one(conn)
    .await?;
    Ok(n > 0)
}

/// Answer the actions whose time ran out (an approval is denied, an output missing) and queue
/// the tasks they completed. Returns those tasks.
pub async fn expire(pool: &PgPool) -> Result<Vec<Uuid>, StoreError> {
    let mut tx = pool.begin().await?;
    // Tasks first, like `answer` (same lock order); one being answered right now is left for
    // the next sweep.
    let due: Vec<Uuid> = sqlx::query_scalar!(
        r#"SELECT id FROM task_queue WHERE status = 'requires_action' AND id IN
            (SELECT task_id FROM task_actions WHERE answered_at IS NULL AND expires_at < now())
         ORDER BY id FOR UPDATE SKIP LOCKED"#
    )
    .fetch_all(&mut *tx)
    .await?;
    if due.is_empty() {
        return Ok(vec![]);
    }
    let expired = sqlx::query!(
        r#"UPDATE task_actions SET answered_at = now(), answered_by = 'expired',
             decision = CASE WHEN kind = 'approval' THEN 'deny' END,
             message = CASE WHEN kind = 'approval' THEN 'no decision came in time' END
         WHERE task_id = ANY($1) AND answered_at IS NULL AND expires_at < now()
         RETURNING task_id, id, decision AS "decision: Decision""#,
        &due
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut tasks: Vec<Uuid> = vec![];
    for (task, id, decision) in expired.into_iter().map(|r| (r.task_id, r.id, r.decision)) {
        let data = event::ActionAnswered { id, decision, output: false, by: Answerer::Expired };
        answered_event(&mut tx, task, &Event::ActionAnswered(data)).await?;
        if !tasks.contains(&task) {
            tasks.push(task);
        }
    }
    let mut resumed = vec![];
    for t in tasks {
        if resume(&mut tx, t).await? {
            resumed.push(t);
        }
    }
    tx.commit().await?;
    Ok(resumed)
}

/// One action of `tenant`'s, by its id.
pub async fn get(pool: &PgPool, tenant: &str, id: Uuid) -> Result<Option<ActionRow>, StoreError> {
    Ok(actions_where!("WHERE id = $1 AND tenant = $2", id, tenant).fetch_optional(pool).await?)
}
