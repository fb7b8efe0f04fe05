//! The `tasks` table as the API sees it: insert, read, list, cancel.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde_json::Value;
use sqlx::{PgConnection, PgPool, Postgres};
use uuid::Uuid;

use super::budget::SpendDefaults;
use super::StoreError;
use crate::kinds::Event;
pub use crate::kinds::{StopReason, TaskStatus, WebhookEvent};

#[derive(Debug, Clone, Default, sqlx::FromRow)]
pub struct TaskRow {
    pub id: Uuid,
    pub tenant: String,
    pub status: TaskStatus,
    pub stop_reason: Option<StopReason>,
    pub subagent_type: String,
    pub description: Option<String>,
    pub prompt: String,
    pub model: String,
    pub options: Value,
    pub summary: Option<String>,
    /// The final answer's value (with an `output_schema`).
    pub output: Option<Value>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub turns: i32,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cached_tokens: i64,
    #[sqlx(default)]
    pub cache_write_tokens: i64,
    pub cost_usd: Decimal,
    pub unpriced_calls: i32,
    /// Calls whose usage is an estimate.
    pub estimated_calls: i32,
    pub attempt: i32,
    pub lease_token: Option<Uuid>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub worker_id: Option<String>,
    pub cancel_requested: bool,
    pub idempotency_key: Option<String>,
    pub request_hash: Option<String>,
    pub metadata: Value,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub parent_task_id: Option<Uuid>,
    pub max_cost_usd: Option<Decimal>,
    pub max_tokens: Option<i64>,
    pub traceparent: Option<String>,
    pub webhook_url: Option<String>,
    /// `budget` while a queued task waits for reservations to settle.
    pub waiting_for: Option<String>,
    /// The prefix of the API key it was submitted with.
    pub api_key: Option<String>,
    /// How many times the run paused, and the time spent paused (in ms).
    pub pauses: i32,
    pub paused_ms: i64,
    /// The model (`provider/model`) whose answer ended the run: its own, or a fallback.
    #[sqlx(default)]
    pub answered_model: Option<String>,
    /// When a scheduled task is (or was) queued.
    #[sqlx(default)]
    pub run_at: Option<DateTime<Utc>>,
    /// Its rank among its tenant's queued tasks (2 high, 1 normal, 0 low).
    #[sqlx(default)]
    pub priority: i16,
    /// Its `task.finished` delivery (`{status, attempts, last_error, delivered_at}`), where the
    /// statement read it (`WEBHOOK`).
    #[sqlx(default)]
    pub webhook: Option<Value>,
    /// The workspace version its run read: a commit, or an upload's content hash (recorded at
    /// the first start).
    #[sqlx(default)]
    pub workspace_version: Option<String>,
    /// Its diff's counts, once its run ended with a copy of its workspace (`task_diffs`).
    #[sqlx(default)]
    pub diff_stats: Option<Value>,
    /// The manifest digest its environment's image resolved to (recorded at the first start).
    #[sqlx(default)]
    pub environment_digest: Option<String>,
}

impl TaskRow {
    /// When the task joined the queue: its creation, or its start time when it was scheduled
    /// (the time it waited for that is not queueing).
    pub fn queued_since(&self) -> DateTime<Utc> {
        self.run_at.map_or(self.created_at, |at| at.max(self.created_at))
    }

    pub fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }
}

#[derive(Debug, Clone)]
pub struct NewTask {
    pub id: Uuid,
    pub tenant: String,
    pub subagent_type: String,
    pub description: Option<String>,
    pub prompt: String,
    pub model: String,
    pub options: Value,
    pub metadata: Value,
    pub idempotency_key: Option<String>,
    pub request_hash: Option<String>,
    pub parent_task_id: Option<Uuid>,
    pub max_cost_usd: Option<Decimal>,
    pub max_tokens: Option<i64>,
    pub traceparent: Option<String>,
    pub webhook_url: Option<String>,
    /// The prefix of the API key it is submitted with.
    pub api_key: Option<String>,
    /// Insert the task already claimed, to run in this process (wait mode's fast path).
    pub start: Option<StartHere>,
    /// A start time ahead: the task waits `scheduled` until then.
    pub run_at: Option<DateTime<Utc>>,
    /// Its rank among its tenant's queued tasks (`Priority::rank`).
    pub priority: i16,
}

/// The lease under which a task is inserted `running` instead of `queued`.
#[derive(Debug, Clone)]
pub struct StartHere {
    pub lease: Uuid,
    pub worker: String,
    pub lease_secs: f64,
    /// What the run's first provider call will reserve, to be written with the task.
    pub first_call: Option<FirstCall>,
}

/// A provider call's reservation: its worst-case cost and tokens, and its `llm_call_started`
/// event.
#[derive(Debug, Clone)]
pub struct FirstCall {
    pub usd: Decimal,
    pub tokens: i64,
    pub started: Event,
    /// The configured budgets of a tenant that sets none.
    pub defaults: SpendDefaults,
    /// The same call as `budget_reserve_call` asks for it (whole, when a tenant budget applies).
    pub ask: super::budget::CallAsk,
}

pub enum Inserted {
    /// A new task; `true` when its first call's reservation (`StartHere::first_call`) was
    /// written with it.
    New(TaskRow, bool),
    /// An earlier task with the same idempotency key.
    Existing(TaskRow),
}

/// A statement that answers with tasks, as `sqlx::query_as!(TaskRow, …)`: `$head` (the statement
/// up to its answer's columns), a task's columns (`TaskRow`'s), then `$tail` (from `FROM` on), then
/// the arguments. The pieces are literals joined by `+`, which the query macros take as one
/// statement (they take no string made at run time).
/// - `view`: the columns of `task_rows` (migration 0039), the view that reads tasks.
/// - `$t`: the rows of a CTE that returned a task's whole row (`RETURNING t.*`), read the way the
///   view reads a row of `tasks`: the same two expressions for its options and its webhook.
/// - `unhooked $t`: the same with no `webhook` (NULL), for the worker's reads.
/// - `record inserted $t`, as `sqlx::query!` (for a statement that answers with more than a task:
///   `task_from!` makes its task): `$t` is a CTE of rows inserted by the same statement, whose
///   options are the statement's own (`$7`: the row of `task_options` that stores them is not yet
///   visible to it), and whose delivery, written by the same statement, is `pending`.
macro_rules! query_tasks {
    (view, ($($head:tt)+), ($($tail:tt)+) $(, $arg:expr)* $(,)?) => {
        query_tasks!(@cols query_as [TaskRow,], ($($head)+), ("options"), ("webhook"), ($($tail)+) $(, $arg)*)
    };
    (record inserted $t:tt, ($($head:tt)+), ($($tail:tt)+) $(, $arg:expr)* $(,)?) => {
        query_tasks!(@cols query [], ($($head)+), ("$7::jsonb"),
            ("CASE WHEN " + $t + ".webhook_url IS NULL THEN NULL ELSE jsonb_build_object('status', 'pending', 'attempts', 0, 'last_error', NULL, 'delivered_at', NULL) END"),
            ($($tail)+) $(, $arg)*)
    };
    (unhooked $t:tt, ($($head:tt)+), ($($tail:tt)+) $(, $arg:expr)* $(,)?) => {
        query_tasks!(@cols query_as [TaskRow,], ($($head)+),
            ("CASE WHEN " + $t + ".options_sha256 IS NULL THEN " + $t + ".options ELSE (SELECT o.options FROM task_options o WHERE o.hash = " + $t + ".options_sha256) END"),
            ("NULL::jsonb"),
            ($($tail)+) $(, $arg)*)
    };
    (record $t:tt, ($($head:tt)+), ($($tail:tt)+) $(, $arg:expr)* $(,)?) => {
        query_tasks!(@cols query [], ($($head)+),
            ("CASE WHEN " + $t + ".options_sha256 IS NULL THEN " + $t + ".options ELSE (SELECT o.options FROM task_options o WHERE o.hash = " + $t + ".options_sha256) END"),
            ("(SELECT jsonb_build_object('status', d.status, 'attempts', d.attempts, 'last_error', d.last_error, 'delivered_at', d.delivered_at) FROM webhook_deliveries d WHERE d.task_id = " + $t + ".id AND d.event = 'task.finished' AND d.push_config = '')"),
            ($($tail)+) $(, $arg)*)
    };
    ($t:tt, ($($head:tt)+), ($($tail:tt)+) $(, $arg:expr)* $(,)?) => {
        query_tasks!(@cols query_as [TaskRow,], ($($head)+),
            ("CASE WHEN " + $t + ".options_sha256 IS NULL THEN " + $t + ".options ELSE (SELECT o.options FROM task_options o WHERE o.hash = " + $t + ".options_sha256) END"),
            ("(SELECT jsonb_build_object('status', d.status, 'attempts', d.attempts, 'last_error', d.last_error, 'delivered_at', d.delivered_at) FROM webhook_deliveries d WHERE d.task_id = " + $t + ".id AND d.event = 'task.finished' AND d.push_config = '')"),
            ($($tail)+) $(, $arg)*)
    };
    (@cols $mac:ident [$($pre:tt)*], ($($head:tt)+), ($($options:tt)+), ($($webhook:tt)+), ($($tail:tt)+) $(, $arg:expr)*) => {
        sqlx::$mac!(
            $($pre)*
            $($head)+ + r#"id AS "id!", tenant AS "tenant!", status AS "status!: crate::kinds::TaskStatus",
                stop_reason AS "stop_reason: crate::kinds::StopReason", subagent_type AS "subagent_type!", description,
                prompt AS "prompt!", model AS "model!", "# + $($options)+ + r#" AS "options!", summary, output,
                error_code, error_message, turns AS "turns!", input_tokens AS "input_tokens!",
                output_tokens AS "output_tokens!", cached_tokens AS "cached_tokens!",
                cache_write_tokens AS "cache_write_tokens!", cost_usd AS "cost_usd!", unpriced_calls AS "unpriced_calls!",
                estimated_calls AS "estimated_calls!", attempt AS "attempt!", lease_token, lease_expires_at, worker_id,
                cancel_requested AS "cancel_requested!", idempotency_key, request_hash, metadata AS "metadata!",
                created_at AS "created_at!", started_at, finished_at, parent_task_id, max_cost_usd, max_tokens,
                traceparent, webhook_url, waiting_for, api_key, pauses AS "pauses!", paused_ms AS "paused_ms!",
                answered_model, run_at, priority AS "priority!", "# + $($webhook)+ + r#" AS webhook, workspace_version,
                diff_stats, environment_digest"# + $($tail)+
            $(, $arg)*
        )
    };
}
pub(crate) use query_tasks;

/// The task of a record `query_tasks!(record …)` answered with (its other columns are the
/// caller's).
macro_rules! task_from {
    ($r:expr) => {{
        let r = $r;
        $crate::store::tasks::TaskRow {
            id: r.id,
            tenant: r.tenant,
            status: r.status,
            stop_reason: r.stop_reason,
            subagent_type: r.subagent_type,
            description: r.description,
            prompt: r.prompt,
            model: r.model,
            options: r.options,
            summary: r.summary,
            output: r.output,
            error_code: r.error_code,
            error_message: r.error_message,
            turns: r.turns,
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            cached_tokens: r.cached_tokens,
            cache_write_tokens: r.cache_write_tokens,
            cost_usd: r.cost_usd,
            unpriced_calls: r.unpriced_calls,
            estimated_calls: r.estimated_calls,
            attempt: r.attempt,
            lease_token: r.lease_token,
            lease_expires_at: r.lease_expires_at,
            worker_id: r.worker_id,
            cancel_requested: r.cancel_requested,
            idempotency_key: r.idempotency_key,
            request_hash: r.request_hash,
            metadata: r.metadata,
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            parent_task_id: r.parent_task_id,
            max_cost_usd: r.max_cost_usd,
            max_tokens: r.max_tokens,
            traceparent: r.traceparent,
            webhook_url: r.webhook_url,
            waiting_for: r.waiting_for,
            api_key: r.api_key,
            pauses: r.pauses,
            paused_ms: r.paused_ms,
            answered_model: r.answered_model,
            run_at: r.run_at,
            priority: r.priority,
            webhook: r.webhook,
            workspace_version: r.workspace_version,
            diff_stats: r.diff_stats,
            environment_digest: r.environment_digest,
        }
    }};
}
pub(crate) use task_from;

/// Insert a task with its `created` event, in one statement: queued, or with `t.start`
/// already claimed (attempt 1, with its `claimed` event). A task started so has its first
/// call's reservation written too (with its `llm_call_started` event) when only the task's own
/// limits apply to it: no spend budget applies to the tenant (its own or the configured
/// default), and the call fits the task's limits. Otherwise that reservation is left to
/// `budget_reserve`.
pub async fn insert(conn: &mut PgConnection, t: &NewTask) -> Result<Inserted, StoreError> {
    insert_once(conn, t, false).await
}

async fn insert_once(conn: &mut PgConnection, t: &NewTask, retried: bool) -> Result<Inserted, StoreError> {
    let row: Option<(TaskRow, bool)> = match &t.start {
        None => insert_queued(conn, t).await?,
        Some(s) => insert_started(conn, t, s).await?,
    };
    match row {
        Some((row, reserved)) => Ok(Inserted::New(row, reserved)),
        None if !retried => {
            // A key is remembered for 24 hours: an older task gives its key up.
            let freed = sqlx::query!(
                "DELETE FROM task_keys WHERE tenant = $1 AND key = $2 AND created_at < now() - interval '24 hours'",
                t.tenant,
                t.idempotency_key
            )
            .execute(&mut *conn)
            .await?;
            if freed.rows_affected() > 0 {
                return Box::pin(insert_once(conn, t, true)).await;
            }
            match existing(conn, t).await? {
                Some(row) => Ok(Inserted::Existing(row)),
                // The key was purged (past its 24 hours) between the insert and this read.
                None => Box::pin(insert_once(conn, t, true)).await,
            }
        }
        None => existing(conn, t).await?.map(Inserted::Existing).ok_or(StoreError::Db(sqlx::Error::RowNotFound)),
    }
}

// Both inserts share their first parameters ($1 to $15: the task as submitted) and their first
// CTEs:
// - `k` takes the task's idempotency key ($9) in the statement that inserts the task: a key names
//   one task (task_keys' primary key; `tasks` is partitioned and cannot hold that unique index).
//   The task is inserted when it has no key or took its key.
// - `o` stores the task's options ($7) once for every task that has the same (migration 0036): the
//   task row names them by the SHA-256 of their `jsonb` text.

/// A queued task ($17 its priority) and its `created` event; with a start time ahead ($18), a
/// scheduled one.
async fn insert_queued(conn: &mut PgConnection, t: &NewTask) -> Result<Option<(TaskRow, bool)>, StoreError> {
    let r = query_tasks!(
        record inserted "t",
        (r#"WITH k AS (
            INSERT INTO task_keys (tenant, key, task_id) SELECT $2, $9, $1 WHERE $9::text IS NOT NULL
            ON CONFLICT DO NOTHING RETURNING 1
         ), o AS (
            INSERT INTO task_options (hash, options)
            SELECT sha256(convert_to($7::jsonb::text, 'UTF8')), $7::jsonb WHERE ($9::text IS NULL OR EXISTS (SELECT 1 FROM k))
            ON CONFLICT DO NOTHING
         ), t AS (
            INSERT INTO tasks (id, tenant, subagent_type, description, prompt, model, options_sha256, metadata,
                               idempotency_key, request_hash, parent_task_id, max_cost_usd, max_tokens, traceparent,
                               webhook_url, last_event_seq, api_key, priority, options, status, run_at)
            SELECT $1, $2, $3, $4, $5, $6, sha256(convert_to($7::jsonb::text, 'UTF8')), $8, $9, $10, $11, $12, $13,
                   $14, $15, 1, $16, $17, NULL::jsonb,
                   CASE WHEN $18::timestamptz IS NULL THEN 'queued' ELSE 'scheduled' END, $18
            WHERE ($9::text IS NULL OR EXISTS (SELECT 1 FROM k))
            RETURNING *
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data)
            SELECT id, 1, 'created', jsonb_build_object('subagent_type', subagent_type, 'model', model) FROM t
         ), w AS (
            INSERT INTO webhook_deliveries (task_id, event) SELECT id, 'task.finished' FROM t WHERE webhook_url IS NOT NULL
         )
         SELECT "#),
        (" FROM t"),
        t.id,
        t.tenant,
        t.subagent_type,
        t.description,
        t.prompt,
        t.model,
        t.options,
        t.metadata,
        t.idempotency_key,
        t.request_hash,
        t.parent_task_id,
        t.max_cost_usd,
        t.max_tokens,
        t.traceparent,
        t.webhook_url,
        t.api_key,
        t.priority,
        t.run_at
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(r.map(|r| (task_from!(r), false)))
}

/// A task claimed by its insert ($16 lease, $17 worker, $18 lease seconds), with its `created`
/// and `claimed` events, and its first call's reservation ($19 USD, $20 tokens, $21 event) when
/// no tenant budget applies ($22 to $24: the configured defaults for a tenant that sets none)
/// and the call fits the task's own limits; `true` with it when that reservation was written.
/// The lease runs from the statement's clock, not the transaction's start, which may have waited
/// for the tenant's lock.
async fn insert_started(
    conn: &mut PgConnection,
    t: &NewTask,
    s: &StartHere,
) -> Result<Option<(TaskRow, bool)>, StoreError> {
    let first = s.first_call.as_ref();
    let r = query_tasks!(
        record inserted "t",
        (r#"WITH k AS (
            INSERT INTO task_keys (tenant, key, task_id) SELECT $2, $9, $1 WHERE $9::text IS NOT NULL
            ON CONFLICT DO NOTHING RETURNING 1
         ), o AS (
            INSERT INTO task_options (hash, options)
            SELECT sha256(convert_to($7::jsonb::text, 'UTF8')), $7::jsonb WHERE ($9::text IS NULL OR EXISTS (SELECT 1 FROM k))
            ON CONFLICT DO NOTHING
         ), pre AS (
            SELECT coalesce($19::numeric IS NOT NULL
                AND ($12::numeric IS NULL OR $19 <= $12) AND ($13::bigint IS NULL OR $20::bigint <= $13)
                AND (SELECT coalesce(usd_per_day, $22::numeric) IS NULL AND coalesce(usd_per_month, $23::numeric) IS NULL
                        AND coalesce(tokens_per_day, $24::bigint) IS NULL
                     FROM tenants WHERE name = $2), false) AS reserved
         ), t AS (
            INSERT INTO tasks (id, tenant, subagent_type, description, prompt, model, options_sha256, metadata,
                               idempotency_key, request_hash, parent_task_id, max_cost_usd, max_tokens, traceparent,
                               webhook_url, last_event_seq, api_key, priority, options, status, attempt, lease_token,
                               lease_expires_at, started_at, worker_id, reserved_usd, reserved_tokens)
            SELECT $1, $2, $3, $4, $5, $6, sha256(convert_to($7::jsonb::text, 'UTF8')), $8, $9, $10, $11, $12, $13,
                    $14, $15, CASE WHEN pre.reserved THEN 3 ELSE 2 END, $25, $26, NULL::jsonb,
                    'running', 1, $16::uuid, clock_timestamp() + make_interval(secs => $18::float8), now(), $17::text,
                    CASE WHEN pre.reserved THEN $19 ELSE 0 END,
                    CASE WHEN pre.reserved THEN $20 ELSE 0 END
            FROM pre WHERE ($9::text IS NULL OR EXISTS (SELECT 1 FROM k))
            RETURNING *
         ), w AS (
            INSERT INTO webhook_deliveries (task_id, event) SELECT id, 'task.finished' FROM t WHERE webhook_url IS NOT NULL
         ), e AS (
            -- One row (migration 0033): `claimed`, or the reserved call's `llm_call_started`, with
            -- the events before it in `earlier`.
            INSERT INTO task_events (task_id, seq, kind, data, data_text, earlier)
            SELECT id, CASE WHEN pre.reserved THEN 3 ELSE 2 END,
                   CASE WHEN pre.reserved THEN 'llm_call_started' ELSE 'claimed' END,
                   CASE WHEN pre.reserved THEN NULL ELSE c.claimed END,
                   CASE WHEN pre.reserved THEN $21::json END,
                   (jsonb_build_array(jsonb_build_array('created',
                                         jsonb_build_object('subagent_type', subagent_type, 'model', model)))
                   || CASE WHEN pre.reserved THEN jsonb_build_array(jsonb_build_array('claimed', c.claimed))
                           ELSE '[]'::jsonb END)::json
            FROM t, pre, LATERAL (SELECT jsonb_build_object('attempt', attempt, 'worker', worker_id) AS claimed) c
         )
         SELECT "#),
        (r#", pre.reserved AS "reserved!" FROM t, pre"#),
        t.id,
        t.tenant,
        t.subagent_type,
        t.description,
        t.prompt,
        t.model,
        t.options,
        t.metadata,
        t.idempotency_key,
        t.request_hash,
        t.parent_task_id,
        t.max_cost_usd,
        t.max_tokens,
        t.traceparent,
        t.webhook_url,
        s.lease,
        s.worker,
        s.lease_secs,
        first.map(|f| f.usd),
        first.map(|f| f.tokens),
        first.map(|f| serde_json::to_string(&f.started).expect("events serialise as JSON")) as _,
        first.and_then(|f| f.defaults.usd_per_day),
        first.and_then(|f| f.defaults.usd_per_month),
        first.and_then(|f| f.defaults.tokens_per_day),
        t.api_key,
        t.priority
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(r.map(|r| {
        let reserved = r.reserved;
        (task_from!(r), reserved)
    }))
}

/// The task the key names now (none if the key was purged in the meantime).
async fn existing(conn: &mut PgConnection, t: &NewTask) -> Result<Option<TaskRow>, StoreError> {
    Ok(query_tasks!(
        view,
        ("SELECT "),
        (" FROM task_rows WHERE tenant = $1 AND id = (SELECT task_id FROM task_keys WHERE tenant = $1 AND key = $2)"),
        t.tenant,
        t.idempotency_key
    )
    .fetch_optional(conn)
    .await?)
}

/// The task an idempotency key (still within its 24 hours) belongs to.
pub async fn by_idempotency_key(pool: &PgPool, tenant: &str, key: &str) -> Result<Option<TaskRow>, StoreError> {
    Ok(query_tasks!(
        view,
        ("SELECT "),
        (" FROM task_rows WHERE tenant = $1 AND id = (SELECT task_id FROM task_keys WHERE tenant = $1 AND key = $2
                                                     AND created_at >= now() - interval '24 hours')"),
        tenant,
        key
    )
    .fetch_optional(pool)
    .await?)
}

pub async fn get(pool: &PgPool, tenant: &str, id: Uuid) -> Result<Option<TaskRow>, StoreError> {
    get_in(pool, Some(tenant), id).await
}

/// A task of `tenant`, or of any tenant (`None`: the admin's reads).
pub async fn get_in(pool: &PgPool, tenant: Option<&str>, id: Uuid) -> Result<Option<TaskRow>, StoreError> {
    Ok(query_tasks!(
        view,
        ("SELECT "),
        (" FROM task_rows WHERE ($1::text IS NULL OR tenant = $1) AND id = $2"),
        tenant,
        id
    )
    .fetch_optional(pool)
    .await?)
}

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Any of these (none: every status).
    pub statuses: Vec<TaskStatus>,
    pub subagent_type: Option<String>,
    /// `provider/model`.
    pub model: Option<String>,
    /// JSON the task's metadata must contain (`@>`).
    pub metadata: Option<Value>,
    pub created_after: Option<DateTime<Utc>>,
    pub created_before: Option<DateTime<Utc>>,
    /// Only tasks whose status last changed at or after this time (their end, start or
    /// creation).
    pub changed_after: Option<DateTime<Utc>>,
    /// Only tasks of this A2A context (a task that has none is its own context, by its id).
    pub a2a_context: Option<String>,
    /// Keyset cursor: only tasks older than this id.
    pub before_id: Option<Uuid>,
    pub limit: i64,
}

/// How far a task's id (made by the replica that accepted it) may be from its `created_at`.
const ID_CLOCK_MARGIN: chrono::Duration = chrono::Duration::minutes(5);

/// The smallest UUID v7 of the millisecond `t` (v7 ids start with their creation time).
fn v7_floor(t: DateTime<Utc>) -> Uuid {
    let ms = t.timestamp_millis().max(0) as u64 & 0xFFFF_FFFF_FFFF;
    Uuid::from_u64_pair((ms << 16) | 0x7000, 0x8000_0000_0000_0000)
}

/// A task list's statement, made at run time from its filter (`matching`): the one place where
/// `tasks` is read by SQL no macro checks. Each of its shapes (every filter, alone and together;
/// one status, several, none; the tenant as a range, by equality, or any) runs against the real
/// schema in `queries::every_shape_of_a_task_list_reads_the_tasks_it_names`.
type Filtered<'a> = sqlx::QueryBuilder<'a, Postgres>;

/// Newest first (UUID v7 ids are time-ordered), keyset-paginated; `tenant = None`: every
/// tenant's (the admin's reads). Time bounds also bound the id, so that they use its indexes,
/// with a margin for ids made on a clock a little off the database's.
pub async fn list(pool: &PgPool, tenant: Option<&str>, f: &ListFilter) -> Result<Vec<TaskRow>, StoreError> {
    let mut q = Filtered::new("SELECT * FROM task_rows WHERE true");
    let range = by_tenant_index(tenant, f);
    matching(&mut q, tenant, f, range);
    if let Some(id) = f.before_id {
        q.push(" AND id < ").push_bind(id);
    }
    q.push(if range { " ORDER BY tenant, id DESC LIMIT " } else { " ORDER BY id DESC LIMIT " });
    q.push_bind(f.limit);
    Ok(q.build_query_as().fetch_all(pool).await?)
}

/// Whether a list's first page is read through each month's `(tenant, id DESC)` index by asking
/// for its order: one tenant's tasks, any status or one that includes `completed` (the others
/// have partial indexes), no cursor and no creation bounds. With `tenant = $1` and `ORDER BY id
/// DESC`, PostgreSQL may instead scan each month's primary key backwards and filter on the
/// tenant, which it costs as cheap (ids follow the rows' order on disk) but which passes every
/// newer task of the other tenants first: a quiet tenant's newest tasks took 20-30 ms at 10M
/// tasks of history with 80,000 of others' since (BENCHMARKS.md), and would take longer the
/// busier the others. Naming the tenant as a range (`>= $1 AND <= $1`, the same rows) and
/// ordering by it leaves that index the only order that needs no sort. A range on the index's
/// first column starts the scan at the tenant's newest, so an id bound (a cursor, a creation
/// bound) would be checked entry by entry rather than sought: those pages keep `tenant = $1`.
fn by_tenant_index(tenant: Option<&str>, f: &ListFilter) -> bool {
    tenant.is_some()
        && (f.statuses.is_empty() || f.statuses.contains(&TaskStatus::Completed))
        && f.before_id.is_none()
        && f.created_after.is_none()
        && f.created_before.is_none()
}

/// How many tasks match the filter, on every page (`before_id` and `limit` aside). Built as
/// `list`'s statement is; its shapes run in `queries::every_shape_of_a_task_list_reads_the_tasks_it_names`.
pub async fn count(pool: &PgPool, tenant: Option<&str>, f: &ListFilter) -> Result<i64, StoreError> {
    let mut q = Filtered::new("SELECT count(*) FROM tasks WHERE true");
    matching(&mut q, tenant, f, false);
    Ok(q.build_query_scalar().fetch_one(pool).await?)
}

/// The filter's conditions (but its page: `before_id`, `limit`); `range`: the tenant as a range
/// (`by_tenant_index`).
fn matching<'a>(q: &mut Filtered<'a>, tenant: Option<&'a str>, f: &'a ListFilter, range: bool) {
    match tenant {
        Some(tenant) if range => {
            q.push(" AND tenant >= ").push_bind(tenant).push(" AND tenant <= ").push_bind(tenant);
        }
        Some(tenant) => {
            q.push(" AND tenant = ").push_bind(tenant);
        }
        None => {}
    }
    // Literals (from a closed set), not parameters: the status indexes are partial (migration
    // 0015), and only a plan made for the status can use them.
    match f.statuses.as_slice() {
        [] => {}
        [s] => {
            q.push(format_args!(" AND status = '{}'", s.as_str()));
        }
        many => {
            let list: Vec<String> = many.iter().map(|s| format!("'{}'", s.as_str())).collect();
            q.push(format_args!(" AND status IN ({})", list.join(", ")));
        }
    }
    if let Some(s) = &f.subagent_type {
        q.push(" AND subagent_type = ").push_bind(s);
    }
    if let Some(m) = &f.model {
        q.push(" AND model = ").push_bind(m);
    }
    if let Some(m) = &f.metadata {
        // Tasks without metadata are not in its index (0015); a non-empty filter never
        // matches them, and saying so lets the planner use it.
        if m.as_object().is_some_and(|o| !o.is_empty()) {
            q.push(" AND metadata <> '{}'::jsonb");
        }
        q.push(" AND metadata @> ").push_bind(m);
    }
    if let Some(t) = f.created_after {
        q.push(" AND created_at > ").push_bind(t);
        q.push(" AND id >= ").push_bind(v7_floor(t - ID_CLOCK_MARGIN));
    }
    if let Some(t) = f.created_before {
        q.push(" AND created_at < ").push_bind(t);
        q.push(" AND id < ").push_bind(v7_floor(t + ID_CLOCK_MARGIN));
    }
    if let Some(t) = f.changed_after {
        q.push(" AND coalesce(finished_at, started_at, created_at) >= ").push_bind(t);
    }
    if let Some(c) = &f.a2a_context {
        q.push(" AND (id IN (SELECT a.task_id FROM a2a_tasks a WHERE a.context_id = ").push_bind(c.as_str());
        if let Some(tenant) = tenant {
            q.push(" AND a.tenant = ").push_bind(tenant);
        }
        q.push(") OR id::text = ").push_bind(c.as_str()).push(")");
    }
}

/// Which tasks a cancel applies to (always within one tenant).
#[derive(Debug, Clone, Default)]
pub struct CancelFilter {
    pub id: Option<Uuid>,
    /// Among `queued`, `running` and `requires_action`.
    pub statuses: Vec<TaskStatus>,
    /// JSON the task's metadata must contain (`@>`).
    pub metadata: Option<Value>,
}

/// Cancel matching tasks: a queued or paused one ends at once; a running one is flagged (its
/// worker, told by the caller, stops it). Terminal tasks are left as they are. Returns each
/// affected task with its status before the cancel. Its caller is `tasks::end`, which wakes
/// the waiters and tells the workers.
pub async fn cancel_matching(
    pool: &PgPool,
    tenant: &str,
    f: &CancelFilter,
) -> Result<Vec<(Uuid, TaskStatus)>, StoreError> {
    let statuses: Vec<&str> = f.statuses.iter().map(|s| s.as_str()).collect();
    // A task ending at this moment is seen ended when the statement runs again (`on_move`).
    super::on_move(pool, || async {
        Ok(sqlx::query!(
            r#"WITH old AS (
                SELECT id, status FROM task_queue
                WHERE tenant = $1 AND ($2::uuid IS NULL OR id = $2) AND status = ANY($3)
                  AND ($4::jsonb IS NULL OR metadata @> $4)
                  AND NOT (status = 'running' AND cancel_requested)
                ORDER BY id FOR UPDATE
             ), u AS (
                UPDATE tasks t SET
                    status = CASE WHEN old.status <> 'running' THEN 'cancelled' ELSE t.status END,
                    stop_reason = CASE WHEN old.status <> 'running' THEN 'cancelled' ELSE t.stop_reason END,
                    finished_at = CASE WHEN old.status <> 'running' THEN now() ELSE t.finished_at END,
                    history_at = CASE WHEN old.status <> 'running' THEN now() ELSE t.history_at END,
                    waiting_for = NULL, paused_at = NULL,
                    paused_ms = t.paused_ms + CASE WHEN t.paused_at IS NULL THEN 0
                        ELSE (extract(epoch FROM now() - t.paused_at) * 1000)::bigint END,
                    cancel_requested = true,
                    last_event_seq = t.last_event_seq + 1
                FROM old WHERE t.id = old.id AND t.history_at = 'infinity'
                RETURNING t.id, t.last_event_seq, old.status AS old_status
             ), e AS (
                INSERT INTO task_events (task_id, seq, kind, data)
                SELECT id, last_event_seq, CASE WHEN old_status <> 'running' THEN 'cancelled' ELSE 'cancel_requested' END, '{}'
                FROM u
             )
             SELECT id AS "id!", old_status AS "old_status!: TaskStatus" FROM u"#,
            tenant,
            f.id,
            &statuses as _,
            f.metadata
        )
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|r| (r.id, r.old_status))
        .collect())
    })
    .await
}

/// Tasks scheduled, queued and running, across tenants (partial-index scans).
pub async fn open_counts(pool: &PgPool) -> Result<Vec<(TaskStatus, i64)>, StoreError> {
    Ok(sqlx::query!(
        r#"SELECT 'scheduled' AS "status!: TaskStatus", count(*) AS "n!" FROM task_queue WHERE status = 'scheduled'
         UNION ALL SELECT 'queued', count(*) FROM task_queue WHERE status = 'queued'
         UNION ALL SELECT 'running', count(*) FROM task_queue WHERE status = 'running'
         UNION ALL SELECT 'requires_action', count(*) FROM task_queue WHERE status = 'requires_action'"#
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| (r.status, r.n))
    .collect())
}

/// A webhook delivery due now, taken for sending: its next attempt is pushed out by the lease,
/// so another replica does not send it at the same time.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: i64,
    pub task_id: Uuid,
    pub event: WebhookEvent,
    /// The pause a `task.requires_action` delivery is about.
    pub seq: i32,
    pub attempts: i32,
    /// Empty: to the task's `webhook_url`; else to the A2A push config of that id.
    pub push_config: String,
}

/// Deliveries that are due: a `task.finished` one once its task has finished. A task's
/// deliveries to one target go in order: each pause's `task.requires_action` after the one
/// before it is delivered (or given up), and `task.finished` after them all.
pub async fn take_due_webhooks(pool: &PgPool, limit: i64, lease_secs: f64) -> Result<Vec<Delivery>, StoreError> {
    Ok(sqlx::query_as!(Delivery, r#"WITH due AS (
            SELECT d.id FROM webhook_deliveries d JOIN tasks t ON t.id = d.task_id
            WHERE d.status = 'pending' AND d.next_at <= now() AND (d.event <> 'task.finished' OR t.finished_at IS NOT NULL)
              AND NOT EXISTS (SELECT 1 FROM webhook_deliveries p WHERE p.task_id = d.task_id AND p.status = 'pending'
                              AND p.push_config = d.push_config AND p.event = 'task.requires_action'
                              AND (d.event = 'task.finished' OR p.seq < d.seq))
            ORDER BY d.next_at LIMIT $1 FOR UPDATE OF d SKIP LOCKED
         )
         UPDATE webhook_deliveries d SET next_at = now() + make_interval(secs => $2) FROM due WHERE d.id = due.id
         RETURNING d.id, d.task_id, d.event AS "event: WebhookEvent", d.seq, d.attempts, d.push_config"#, limit, lease_secs)
    .fetch_all(pool)
    .await?)
}

/// A task of any tenant, by id, as views show it (for a webhook's body).
pub async fn get_any(pool: &PgPool, id: Uuid) -> Result<Option<TaskRow>, StoreError> {
    get_in(pool, None, id).await
}

/// Record a delivery attempt: delivered, retried after `retry_in`, or given up.
pub async fn webhook_attempted(
    pool: &PgPool,
    id: i64,
    outcome: Result<(), String>,
    retry_in: Option<std::time::Duration>,
) -> Result<(), StoreError> {
    match outcome {
        Ok(()) => {
            sqlx::query!(
                r#"UPDATE webhook_deliveries SET status = 'delivered', attempts = attempts + 1, delivered_at = now(),
                 last_error = NULL WHERE id = $1"#,
                id
            )
            .execute(pool)
            .await?
        }
        Err(e) => {
            sqlx::query!(
                r#"UPDATE webhook_deliveries SET attempts = attempts + 1, last_error = $2,
                 status = CASE WHEN $3::float8 IS NULL THEN 'failed' ELSE 'pending' END,
                 next_at = CASE WHEN $3::float8 IS NULL THEN next_at ELSE now() + make_interval(secs => $3) END
                 WHERE id = $1"#,
                id,
                e,
                retry_in.map(|d| d.as_secs_f64())
            )
            .execute(pool)
            .await?
        }
    };
    Ok(())
}

/// Queue the scheduled tasks whose time has come (at most `limit`), each with a `queued` event;
/// their ids. Any replica may run it: each task is queued once (`SKIP LOCKED`).
pub async fn queue_due(pool: &PgPool, limit: i64) -> Result<Vec<Uuid>, StoreError> {
    super::on_move(pool, || queue_due_once(pool, limit)).await
}

async fn queue_due_once(pool: &PgPool, limit: i64) -> Result<Vec<Uuid>, StoreError> {
    Ok(sqlx::query_scalar!(
        r#"WITH due AS (
            SELECT id FROM task_queue WHERE status = 'scheduled' AND run_at <= now()
            ORDER BY run_at LIMIT $1 FOR UPDATE SKIP LOCKED
         ), u AS (
            UPDATE task_queue t SET status = 'queued', last_event_seq = t.last_event_seq + 1
            FROM due WHERE t.id = due.id
            RETURNING t.id, t.last_event_seq, t.run_at
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data)
            SELECT id, last_event_seq, 'queued', jsonb_build_object('run_at', run_at) FROM u
         )
         SELECT id AS "id!" FROM u"#,
        limit
    )
    .fetch_all(pool)
    .await?)
}

/// When the next scheduled task is due, if any is.
pub async fn next_run_at(pool: &PgPool) -> Result<Option<DateTime<Utc>>, StoreError> {
    Ok(sqlx::query_scalar!(r#"SELECT min(run_at) FROM task_queue WHERE status = 'scheduled'"#).fetch_one(pool).await?)
}
