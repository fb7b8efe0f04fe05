//! The worker side of `tasks`: claim, heartbeat, checkpoint, finish, release, rescue.
//! Every write by a worker is one statement fenced on `(id, lease_token)`.

use serde_json::Value;
use sqlx::{FromRow, PgPool, Row};
use uuid::Uuid;

use super::calls::CallRow;
use super::tasks::{StopReason, TaskRow, TaskStatus, COLS, COL_NAMES, OPTIONS_READ, WEBHOOK};
pub use super::Fence;
use super::StoreError;
use super::DB_CLOCK_MARGIN;
use crate::kinds::{event, Event, FailureCode};

/// Claim up to `limit` queued tasks, fairly across tenants and within each tenant's running
/// limit: each slot goes to the tenant that would then have the fewest tasks running (each
/// tenant's highest priority first, then its oldest), a tenant at its limit is skipped, and
/// a tenant another claimer is serving right now is skipped too (its row is the lock that
/// keeps the running limit exact across replicas).
pub async fn claim(
    pool: &PgPool,
    limit: i64,
    lease_secs: f64,
    worker: &str,
    default_max_running: Option<i32>,
) -> Result<Vec<TaskRow>, StoreError> {
    // A queued task cancelled under the claim has left the queue: claimed again, it is not seen.
    super::on_move(pool, || claim_once(pool, limit, lease_secs, worker, default_max_running)).await
}

/// The claim's second statement: count, pick and claim (`claim_once`).
static CLAIM: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH lim AS (
            SELECT * FROM unnest($4::text[], $5::int[]) AS l(tenant, max_running)
         ), busy AS MATERIALIZED (
            -- Materialized: counted once per tenant, not once per candidate row (inlined, this
            -- count ran for each of a batch's rows: 1.2 s for 1,000 claims with 4,000 running).
            SELECT tenant, max_running,
                (SELECT count(*) FROM task_queue r WHERE r.tenant = lim.tenant AND r.status = 'running') AS running
            FROM lim
         ), room AS (
            SELECT tenant, running,
                CASE WHEN max_running IS NULL THEN $1 ELSE greatest(max_running - running, 0) END AS free
            FROM busy
         ), pick AS (
            -- Within a tenant: higher priority first, then arrival (tasks_tenant_queued_prio_idx).
            SELECT c.id, room.running + row_number() OVER (PARTITION BY room.tenant ORDER BY c.priority DESC, c.id) AS load
            FROM room, LATERAL (
                SELECT id, priority FROM task_queue q
                WHERE q.status = 'queued' AND q.tenant = room.tenant AND q.waiting_for IS NULL
                ORDER BY q.priority DESC, q.id LIMIT least(room.free, $1) FOR UPDATE SKIP LOCKED
            ) c
         ), chosen AS (
            -- The least busy tenant first: each pick goes to whoever would then run the fewest.
            SELECT id FROM pick ORDER BY load, id LIMIT $1
         ), u AS (
            UPDATE task_queue t SET status = 'running', attempt = t.attempt + 1, lease_token = gen_random_uuid(),
                lease_expires_at = now() + make_interval(secs => $2), started_at = coalesce(t.started_at, now()),
                worker_id = $3, last_event_seq = t.last_event_seq + 1
            FROM chosen WHERE t.id = chosen.id
            RETURNING t.*
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data)
            SELECT id, last_event_seq, 'claimed', jsonb_build_object('attempt', attempt, 'worker', worker_id) FROM u
         )
         SELECT {COLS} FROM u ORDER BY id"
    )
});

async fn claim_once(
    pool: &PgPool,
    limit: i64,
    lease_secs: f64,
    worker: &str,
    default_max_running: Option<i32>,
) -> Result<Vec<TaskRow>, StoreError> {
    let mut tx = pool.begin().await?;
    // Planned as PostgreSQL chooses: the claim reads only the queue, whose planning does not grow
    // with the history. A generic plan forced here (as before the queue had a table of its own)
    // was made once per connection from the queue's statistics of that moment: after an ANALYZE
    // of an empty queue it kept seq scans while the queue grew, 0.4 -> 12 ms a tenant walk (#47).
    // First lock the tenants to serve (skipping those another claimer holds) …
    let served: Vec<(String, Option<i32>)> = sqlx::query_as(
        "WITH RECURSIVE qt AS (
            (SELECT tenant FROM task_queue WHERE status = 'queued' ORDER BY tenant LIMIT 1)
            UNION ALL
            SELECT (SELECT t.tenant FROM task_queue t WHERE t.status = 'queued' AND t.tenant > qt.tenant ORDER BY t.tenant LIMIT 1)
            FROM qt WHERE qt.tenant IS NOT NULL
         )
         SELECT tn.name, coalesce(tn.max_running, $1) FROM tenants tn
         WHERE tn.name IN (SELECT tenant FROM qt WHERE tenant IS NOT NULL)
         FOR UPDATE OF tn SKIP LOCKED",
    )
    .bind(default_max_running)
    .fetch_all(&mut *tx)
    .await?;
    if served.is_empty() {
        tx.commit().await?;
        return Ok(vec![]);
    }
    // … then count and claim in a second statement, whose snapshot sees every claim committed
    // before the locks were ours: the running limit holds exactly, across replicas.
    let names: Vec<String> = served.iter().map(|s| s.0.clone()).collect();
    let limits: Vec<Option<i32>> = served.iter().map(|s| s.1).collect();
    let rows: Vec<TaskRow> = sqlx::query_as(&CLAIM)
        .bind(limit)
        .bind(lease_secs)
        .bind(worker)
        .bind(&names)
        .bind(&limits)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(rows)
}

/// Vacuum the queue (`task_queue`), unless another process is vacuuming it now. Every claim and
/// every end leaves a dead row version there, whose index entries each claim's tenant walk and
/// pick pass until they are cleared. Autovacuum comes to a table at most once an
/// `autovacuum_naptime` (a minute), and later while its workers are busy with the history's
/// partitions: measured at a million tasks of history, the walk then read 1,711 buffers a call
/// against 166 on an empty database. The queue is small (what is open), so a pass is cheap.
/// Never truncated (that takes an exclusive lock the claim would wait for, and the queue reuses
/// its free pages); its TOAST table is left to autovacuum.
pub async fn vacuum_queue(pool: &PgPool) -> Result<(), StoreError> {
    sqlx::query("VACUUM (SKIP_LOCKED, TRUNCATE false, PROCESS_TOAST false) task_queue").execute(pool).await?;
    Ok(())
}

/// What a heartbeat found of one lease it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct Beat {
    pub id: Uuid,
    /// A cancel was requested (known only for a renewed lease).
    pub cancel_requested: bool,
    /// Renewed now. False for a task whose row a write holds locked at this moment (its run's own
    /// turn commit, say): it is still held, and renewed by the next beat. The heartbeat never
    /// queues behind a run's write, nor holds up the runs behind it.
    pub renewed: bool,
}

/// Renew the leases this worker holds. Returns, per task still held, whether a cancel was
/// requested and whether it was renewed; a task missing from the answer has lost its lease.
pub async fn heartbeat(pool: &PgPool, held: &[Fence], lease_secs: f64) -> Result<Vec<Beat>, StoreError> {
    // One of these runs ending under the beat moves its row: beaten again, it is missing (lost
    // to this beat, which is right: it has ended).
    super::on_move(pool, || heartbeat_once(pool, held, lease_secs)).await
}

async fn heartbeat_once(pool: &PgPool, held: &[Fence], lease_secs: f64) -> Result<Vec<Beat>, StoreError> {
    let mut held = held.to_vec();
    held.sort_by_key(|f| f.id);
    let ids: Vec<Uuid> = held.iter().map(|f| f.id).collect();
    let leases: Vec<Uuid> = held.iter().map(|f| f.lease).collect();
    Ok(sqlx::query_as(
        "WITH h AS (
            SELECT * FROM unnest($1::uuid[], $2::uuid[]) AS h(id, lease)
         ), l AS (
            SELECT t.id FROM task_queue t JOIN h ON t.id = h.id AND t.lease_token = h.lease
            WHERE t.id = ANY($1)
            ORDER BY t.id FOR UPDATE OF t SKIP LOCKED
         ), u AS (
            UPDATE task_queue t SET lease_expires_at = now() + make_interval(secs => $3)
            FROM l WHERE t.id = l.id AND t.id = ANY($1)
            RETURNING t.id, t.cancel_requested
         )
         SELECT id, cancel_requested, true AS renewed FROM u
         UNION ALL
         SELECT t.id, false, false FROM task_queue t JOIN h ON t.id = h.id AND t.lease_token = h.lease
         WHERE t.id = ANY($1) AND t.id NOT IN (SELECT id FROM l)",
    )
    .bind(&ids)
    .bind(&leases)
    .bind(lease_secs)
    .fetch_all(pool)
    .await?)
}

/// One message of a task's saved conversation, as `GET /tasks/{id}/messages` shows it.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct MessageRow {
    pub seq: i32,
    pub turn: i32,
    pub message: Value,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// A task's saved conversation with each message's place and time. `since`: the task's
/// creation (its messages are written after it), so the read visits only the days since.
pub async fn conversation(
    pool: &PgPool,
    id: Uuid,
    since: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<MessageRow>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "SELECT seq, turn, message, created_at FROM task_message_log
         WHERE task_id = $1 AND created_at >= $2 - {DB_CLOCK_MARGIN} ORDER BY seq"
    ))
    .bind(id)
    .bind(since)
    .fetch_all(pool)
    .await?)
}

/// The saved conversation of a task, in order; none unless it is whole (from its first message,
/// without a gap): retention drops a task's days one at a time, so a conversation that crossed
/// midnight can be half gone for a day.
pub async fn messages(pool: &PgPool, id: Uuid) -> Result<Vec<Value>, StoreError> {
    let rows: Vec<(i32, Value)> =
        sqlx::query_as("SELECT seq, message FROM task_message_log WHERE task_id = $1 ORDER BY seq")
            .bind(id)
            .fetch_all(pool)
            .await?;
    if rows.iter().enumerate().any(|(i, (seq, _))| *seq != i as i32 + 1) {
        return Ok(vec![]);
    }
    Ok(rows.into_iter().map(|(_, m)| m).collect())
}

/// A turn's write that was not applied now: either the lease is gone (`LeaseLost`), or this is a
/// retry of a commit whose answer was lost (its ledger row is there: it was applied then).
async fn settle_unapplied(
    conn: &mut sqlx::PgConnection,
    f: Fence,
    call: &CallRow,
    fin: Option<&Finish>,
) -> Result<Committed, StoreError> {
    let whole = fin.is_some_and(|f| f.return_task);
    let sql = format!(
        "SELECT {COLS}, {WEBHOOK} FROM tasks WHERE id = $1
         AND EXISTS (SELECT 1 FROM llm_calls WHERE call_key = $2 AND created_at = subagentd_uuid_time($2))"
    );
    let done: Option<TaskRow> = sqlx::query_as(&sql).bind(f.id).bind(call.call_key).fetch_optional(&mut *conn).await?;
    Ok(match (done, fin) {
        (None, _) => Committed::LeaseLost,
        (Some(r), Some(_)) => Committed::Finished(whole.then(|| Box::new(r))),
        (Some(_), None) => Committed::Applied,
    })
}

/// A settlement's CTE: when the run's tenant has tasks waiting for budget, tell the workers
/// (NOTIFY), which wake those that now fit. (An index probe on an index that is mostly empty.)
const WAKE_WAITERS: &str = "w AS (
            SELECT pg_notify('subagentd_budget', u.tenant) FROM u
            WHERE EXISTS (SELECT 1 FROM task_queue q WHERE q.tenant = u.tenant AND q.waiting_for IS NOT NULL
                          AND q.status = 'queued')
         )";

/// A rollup upsert's update: the new row's figures added to the existing one's.
const ROLLUP_ADD: &str = "calls = d.calls + EXCLUDED.calls, ok = d.ok + EXCLUDED.ok, failed = d.failed + EXCLUDED.failed,
                input_tokens = d.input_tokens + EXCLUDED.input_tokens, output_tokens = d.output_tokens + EXCLUDED.output_tokens,
                cached_tokens = d.cached_tokens + EXCLUDED.cached_tokens,
                cache_write_tokens = d.cache_write_tokens + EXCLUDED.cache_write_tokens,
                cost_usd = d.cost_usd + EXCLUDED.cost_usd, estimated_calls = d.estimated_calls + EXCLUDED.estimated_calls";

/// One run's turn, for `commit_turns`: the task's totals, the call's ledger row, the turn's
/// messages and events. `turn` is `None` for a failed call that completes no turn. With `fin`,
/// the same statement also ends the task (the run's last turn): one commit, not two.
#[derive(Debug, Clone)]
pub struct TurnWrite {
    pub fence: Fence,
    pub turn: Option<i32>,
    pub call: CallRow,
    pub messages: Vec<Value>,
    pub events: Vec<Event>,
    pub fin: Option<Finish>,
}

impl TurnWrite {
    /// Commit this turn by itself (on `conn`, which may be in a transaction): false (nothing
    /// written) if the lease is no longer held; true if written, now or by an earlier try whose
    /// answer was lost with its connection.
    pub async fn commit_alone(&self, conn: &mut sqlx::PgConnection) -> Result<Committed, StoreError> {
        commit_turn(conn, self).await
    }

    /// The events of the run's end, when this write ends the task (written after its own).
    fn ending(&self) -> Vec<Event> {
        self.fin.as_ref().map(Finish::events).unwrap_or_default()
    }
}

/// Commit the turns of several runs in one statement (a group commit, or one turn alone: see
/// `TurnWrite`): each fenced on its own lease, and written only once however often it is sent, with one transaction and one rollup upsert per
/// (tenant, model, agent, key) for all. The answer is each write's result, in order: a write
/// whose lease is gone is `LeaseLost` and changes nothing, and does not stop the others. An
/// error fails the whole statement and writes nothing (the caller commits each alone then).
pub async fn commit_turns(pool: &PgPool, writes: &[&TurnWrite]) -> Result<Vec<Committed>, StoreError> {
    let mut conn = pool.acquire().await?;
    commit_turns_on(&mut conn, writes).await
}

/// `commit_turns` on one connection.
async fn commit_turns_on(conn: &mut sqlx::PgConnection, writes: &[&TurnWrite]) -> Result<Vec<Committed>, StoreError> {
    if let [one] = writes {
        return Ok(vec![commit_turn(conn, one).await?]);
    }
    let whole = writes.iter().any(|w| w.fin.as_ref().is_some_and(|f| f.return_task));
    let n = writes.len();
    let (mut ids, mut leases, mut keys) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut turns, mut cturns, mut attempts, mut tries) = (vec![], vec![], vec![], vec![]);
    let (mut providers, mut models, mut outcomes, mut errors) = (vec![], vec![], vec![], vec![]);
    let (mut inp, mut out, mut cached, mut cwrite, mut rtok) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut cost, mut rusd, mut latency, mut http, mut est) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut status, mut stop, mut summary, mut ecode, mut emsg) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut output, mut nev, mut wants, mut ws) = (vec![], vec![], vec![], vec![]);
    let mut m_of = vec![];
    let mut rows = super::events::Rows::default();
    let endings: Vec<Vec<Event>> = writes.iter().map(|w| w.ending()).collect();
    for (i, (w, ending)) in writes.iter().zip(&endings).enumerate() {
        let (c, fin) = (&w.call, w.fin.as_ref());
        let i = i as i64 + 1;
        ids.push(w.fence.id);
        leases.push(w.fence.lease);
        keys.push(c.call_key);
        turns.push(w.turn);
        cturns.push(c.turn);
        attempts.push(c.attempt);
        tries.push(c.try_no);
        providers.push(c.provider.as_str());
        models.push(c.model.as_str());
        outcomes.push(c.outcome.as_str());
        errors.push(c.error.as_deref());
        inp.push(c.input_tokens);
        out.push(c.output_tokens);
        cached.push(c.cached_tokens);
        cwrite.push(c.cache_write_tokens);
        ws.push(c.web_searches);
        rtok.push(c.reserved_tokens);
        cost.push(c.cost_usd);
        rusd.push(c.reserved_usd);
        latency.push(c.latency_ms);
        http.push(c.http_status);
        est.push(c.usage_estimated);
        status.push(fin.map(|f| f.status.as_str()));
        stop.push(fin.and_then(|f| f.stop_reason.map(StopReason::as_str)));
        summary.push(fin.and_then(|f| f.summary.as_deref()));
        ecode.push(fin.and_then(|f| f.error_code.map(FailureCode::as_str)));
        emsg.push(fin.and_then(|f| f.error_message.as_deref()));
        output.push(fin.and_then(|f| f.output.clone()));
        wants.push(fin.is_some_and(|f| f.return_task));
        for _ in &w.messages {
            m_of.push(i);
        }
        nev.push((w.events.len() + ending.len()) as i32);
        rows.push(i, w.events.iter().chain(ending));
    }
    let stored = StoredMessages::of(writes.iter().flat_map(|w| &w.messages));
    let sql: &str = &COMMIT_TURNS[usize::from(whole)];
    let rows = sqlx::query(sql)
        .bind(&ids) // 1
        .bind(&leases) // 2
        .bind(&turns) // 3
        .bind(&cturns) // 4
        .bind(&attempts) // 5
        .bind(&tries) // 6
        .bind(&providers) // 7
        .bind(&inp) // 8
        .bind(&out) // 9
        .bind(&cached) // 10
        .bind(&cost) // 11
        .bind(&latency) // 12
        .bind(&http) // 13
        .bind(&outcomes) // 14
        .bind(&errors) // 15
        .bind(&models) // 16
        .bind(&keys) // 17
        .bind(&rusd) // 18
        .bind(&rtok) // 19
        .bind(&status) // 20
        .bind(&stop) // 21
        .bind(&summary) // 22
        .bind(&ecode) // 23
        .bind(&emsg) // 24
        .bind(&est) // 25
        .bind(&output) // 26
        .bind(&cwrite) // 27
        .bind(&nev) // 28
        .bind(&wants) // 29
        .bind(&ws) // 30
        .bind(&m_of) // 31
        .bind(stored.rows()) // 32
        .bind(&rows.of) // 33
        .bind(&rows.kinds) // 34
        .bind(&rows.datas) // 35
        .bind(&rows.earlier) // 36
        .bind(&stored.hashes) // 37
        .bind(&stored.texts) // 38
        .fetch_all(&mut *conn)
        .await?;
    let mut done: Vec<Option<Committed>> = (0..n).map(|_| None).collect();
    for r in &rows {
        let i: i64 = r.try_get("b_i")?;
        let Some(w) = usize::try_from(i - 1).ok().and_then(|i| writes.get(i).map(|w| (i, w))) else { continue };
        done[w.0] = Some(match &w.1.fin {
            None => Committed::Applied,
            Some(f) => Committed::finished(f.return_task.then_some(r))?,
        });
    }
    // Those not written now: a lease gone, or a write already made by an earlier try whose
    // answer was lost (rare): settled one by one.
    for (i, d) in done.iter_mut().enumerate() {
        if d.is_none() {
            *d = Some(settle_unapplied(conn, writes[i].fence, &writes[i].call, writes[i].fin.as_ref()).await?);
        }
    }
    Ok(done.into_iter().map(|d| d.unwrap_or(Committed::LeaseLost)).collect())
}

/// `commit_turns`' statement; `whole`: the one that also answers with the whole task of each
/// write that asks for it (NULLs for the others).
/// The types and names of a write's columns in `commit_turns`' statement (parameters $1 to $30).
const TYPES: [&str; 30] = [
    "uuid", "uuid", "int", "int", "int", "int", "text", "int8", "int8", "int8", "numeric", "int", "int", "text",
    "text", "text", "uuid", "numeric", "int8", "text", "text", "text", "text", "text", "bool", "jsonb", "int8", "int",
    "bool", "int8",
];
const NAMES: [&str; 30] = [
    "b_id",
    "b_lease",
    "b_turn",
    "b_cturn",
    "b_attempt",
    "b_try",
    "b_provider",
    "b_in",
    "b_out",
    "b_cached",
    "b_cost",
    "b_latency",
    "b_http",
    "b_outcome",
    "b_error",
    "b_model",
    "b_key",
    "b_rusd",
    "b_rtok",
    "b_status",
    "b_stop",
    "b_summary",
    "b_ecode",
    "b_emsg",
    "b_est",
    "b_output",
    "b_cw",
    "b_nev",
    "b_want",
    "b_ws",
];

fn commit_turns_sql(whole: bool) -> String {
    let hook = WEBHOOK.strip_suffix(" AS webhook").unwrap_or(WEBHOOK);
    let whole_cols = if whole {
        let cols: Vec<String> = COL_NAMES
            .split(',')
            .map(str::trim)
            .map(|c| {
                let read = if c == "options" { OPTIONS_READ } else { c };
                format!("CASE WHEN b_want THEN {read} END AS {c}")
            })
            .collect();
        format!(", {}, CASE WHEN b_want THEN {hook} END AS webhook", cols.join(", "))
    } else {
        String::new()
    };
    let answer = if whole { format!(", {COL_NAMES}, webhook") } else { String::new() };
    let params: Vec<String> = TYPES.iter().enumerate().map(|(i, t)| format!("${}::{t}[]", i + 1)).collect();
    let source = format!(
        "SELECT * FROM unnest({}) WITH ORDINALITY AS b({}, b_i) ORDER BY b_id",
        params.join(", "),
        NAMES.join(", ")
    );
    format!(
        "WITH b AS (
            {source}
         ), u AS (
            UPDATE tasks SET turns = coalesce(b_turn, turns), last_call_key = b_key,
                input_tokens = input_tokens + b_in, output_tokens = output_tokens + b_out,
                cached_tokens = cached_tokens + b_cached, cache_write_tokens = cache_write_tokens + b_cw,
                cost_usd = cost_usd + coalesce(b_cost, 0),
                unpriced_calls = unpriced_calls + (b_cost IS NULL AND b_outcome = 'ok')::int,
                estimated_calls = estimated_calls + b_est::int,
                reserved_usd = CASE WHEN b_status IS NULL THEN greatest(reserved_usd - b_rusd, 0) ELSE 0 END,
                reserved_tokens = CASE WHEN b_status IS NULL THEN greatest(reserved_tokens - b_rtok, 0) ELSE 0 END,
                last_event_seq = last_event_seq + b_nev,
                status = coalesce(b_status, status),
                stop_reason = CASE WHEN b_status IS NULL THEN stop_reason ELSE b_stop END,
                summary = CASE WHEN b_status IS NULL THEN summary ELSE b_summary END,
                output = CASE WHEN b_status IS NULL THEN output ELSE b_output END,
                answered_model = CASE WHEN b_status IS NOT NULL AND b_outcome = 'ok'
                    THEN b_provider || '/' || b_model ELSE answered_model END,
                error_code = CASE WHEN b_status IS NULL THEN error_code ELSE b_ecode END,
                error_message = CASE WHEN b_status IS NULL THEN error_message ELSE b_emsg END,
                finished_at = CASE WHEN b_status IS NULL THEN finished_at ELSE now() END,
                history_at = CASE WHEN b_status IS NULL THEN history_at ELSE now() END,
                lease_token = CASE WHEN b_status IS NULL THEN lease_token END,
                lease_expires_at = CASE WHEN b_status IS NULL THEN lease_expires_at END
            FROM b
            WHERE id = b_id AND lease_token = b_lease AND history_at = 'infinity' AND id = ANY($1)
              AND last_call_key IS DISTINCT FROM b_key
            RETURNING b.*, tasks.tenant AS u_tenant, tasks.subagent_type AS u_agent, tasks.created_at AS u_created,
                coalesce(tasks.api_key, '') AS u_api_key, tasks.last_event_seq AS u_seq{whole_cols}
         ), c AS (
            INSERT INTO llm_calls (call_key, task_id, tenant, turn, attempt, try, provider, model, input_tokens,
                output_tokens, cached_tokens, cache_write_tokens, cost_usd, latency_ms, http_status, outcome, error,
                usage_estimated, web_searches, created_at)
            SELECT b_key, b_id, u_tenant, b_cturn, b_attempt, b_try, b_provider, b_model, b_in, b_out, b_cached, b_cw,
                b_cost, b_latency, b_http, b_outcome, b_error, b_est, b_ws, subagentd_uuid_time(b_key) FROM u
         ), r AS (
            INSERT INTO usage_daily AS d (day, tenant, model, agent_type, api_key, shard, calls, ok, failed, input_tokens,
                output_tokens, cached_tokens, cache_write_tokens, cost_usd, estimated_calls)
            SELECT (now() AT TIME ZONE 'UTC')::date, u_tenant, b_provider || '/' || b_model, u_agent, u_api_key,
                pg_backend_pid() % 16, count(*), count(*) FILTER (WHERE b_outcome = 'ok'),
                count(*) FILTER (WHERE b_outcome <> 'ok'), sum(b_in), sum(b_out), sum(b_cached), sum(b_cw),
                coalesce(sum(b_cost), 0), count(*) FILTER (WHERE b_est)
            FROM u GROUP BY u_tenant, b_provider || '/' || b_model, u_agent, u_api_key
            ORDER BY 2, 3, 4, 5
            ON CONFLICT (tenant, day, model, agent_type, api_key, shard) DO UPDATE SET {ROLLUP_ADD}
         ), m AS (
            INSERT INTO task_messages (task_id, seq, turn, message, earlier)
            -- A task's messages are written after it was (a run's, or a retention move's, now()):
            -- the bound on created_at spares the probe of every older day's partition. A run's
            -- messages are one row: the last, and the ones before it (migration 0034).
            SELECT b_id, (SELECT coalesce(max(seq), 0) FROM task_messages
                          WHERE task_id = b_id AND created_at >= u_created - {DB_CLOCK_MARGIN}) + cardinality(x.msgs),
                   b_cturn, {last_and_earlier}
            FROM u JOIN (SELECT mi, array_agg(msg ORDER BY ord) AS msgs
                         FROM unnest($31::int8[], $32::jsonb[]) WITH ORDINALITY AS y(mi, msg, ord) GROUP BY mi) x
                 ON x.mi = u.b_i
         ), e AS ({events}
         ), mt AS ({texts}
         ), w AS (
            SELECT pg_notify('subagentd_budget', t.u_tenant) FROM (SELECT DISTINCT u_tenant FROM u) t
            WHERE EXISTS (SELECT 1 FROM task_queue q WHERE q.tenant = t.u_tenant AND q.waiting_for IS NOT NULL
                          AND q.status = 'queued')
         )
         SELECT b_i{answer} FROM u, (SELECT count(*) FROM w) AS woken",
        events = super::events::insert_batched(33),
        last_and_earlier = message_row("x.msgs"),
        texts = texts_insert(37, 38),
    )
}

/// Built once each: a run's checkpoint may wait for a connection, and thousands do at once.
static COMMIT_TURNS: std::sync::LazyLock<[String; 2]> =
    std::sync::LazyLock::new(|| [commit_turns_sql(false), commit_turns_sql(true)]);

/// One write's own statement (`commit_alone`, and a batch of one): the batched statement's
/// window functions, grouping and array subscripts cost a lone write measurably more
/// (issue 42's wait-mode benchmark: a lone finish 1.2–1.65 ms against 1.0–1.3 ms).
async fn commit_turn(conn: &mut sqlx::PgConnection, w: &TurnWrite) -> Result<Committed, StoreError> {
    let (call, fin) = (&w.call, w.fin.as_ref());
    let ending = w.ending();
    let ev = super::events::pack(w.events.iter().chain(&ending));
    let whole = fin.is_some_and(|f| f.return_task);
    let sql: &str = if whole { &COMMIT_TURN_ENDING } else { &COMMIT_TURN };
    let stored = StoredMessages::of(&w.messages);
    let row = sqlx::query(sql)
        .bind(w.fence.id) // 1
        .bind(w.fence.lease) // 2
        .bind(w.turn) // 3
        .bind(call.turn) // 4
        .bind(call.attempt) // 5
        .bind(call.try_no) // 6
        .bind(&call.provider) // 7
        .bind(call.input_tokens) // 8
        .bind(call.output_tokens) // 9
        .bind(call.cached_tokens) // 10
        .bind(call.cost_usd) // 11
        .bind(call.latency_ms) // 12
        .bind(call.http_status) // 13
        .bind(call.outcome.as_str()) // 14
        .bind(&call.error) // 15
        .bind(stored.rows()) // 16
        .bind(ev.kind) // 17
        .bind(ev.data) // 18
        .bind(&call.model) // 19
        .bind(call.call_key) // 20
        .bind(call.reserved_usd) // 21
        .bind(call.reserved_tokens) // 22
        .bind(fin.map(|f| f.status.as_str())) // 23
        .bind(fin.and_then(|f| f.stop_reason.map(StopReason::as_str))) // 24
        .bind(fin.and_then(|f| f.summary.as_deref())) // 25
        .bind(fin.and_then(|f| f.error_code.map(FailureCode::as_str))) // 26
        .bind(fin.and_then(|f| f.error_message.as_deref())) // 27
        .bind(call.usage_estimated) // 28
        .bind(fin.and_then(|f| f.output.as_ref())) // 29
        .bind(call.cache_write_tokens) // 30
        .bind(call.web_searches) // 31
        .bind(ev.earlier) // 32
        .bind(ev.n) // 33
        .bind(&stored.hashes) // 34
        .bind(&stored.texts) // 35
        .fetch_optional(&mut *conn)
        .await?;
    match (row, fin) {
        (Some(r), Some(_)) => Committed::finished(whole.then_some(&r)),
        (Some(_), None) => Ok(Committed::Applied),
        (None, _) => settle_unapplied(conn, w.fence, call, fin).await,
    }
}

/// `commit_turn`'s statement; `whole`: the one that also answers with the whole task.
fn commit_turn_sql(whole: bool) -> String {
    format!(
        "WITH u AS (
            UPDATE tasks SET turns = coalesce($3, turns), last_call_key = $20,
                input_tokens = input_tokens + $8, output_tokens = output_tokens + $9,
                cached_tokens = cached_tokens + $10, cache_write_tokens = cache_write_tokens + $30,
                cost_usd = cost_usd + coalesce($11, 0),
                unpriced_calls = unpriced_calls + ($11 IS NULL AND $14 = 'ok')::int,
                estimated_calls = estimated_calls + $28::bool::int,
                reserved_usd = CASE WHEN $23::text IS NULL THEN greatest(reserved_usd - $21, 0) ELSE 0 END,
                reserved_tokens = CASE WHEN $23::text IS NULL THEN greatest(reserved_tokens - $22, 0) ELSE 0 END,
                last_event_seq = last_event_seq + $33,
                status = coalesce($23, status),
                stop_reason = CASE WHEN $23::text IS NULL THEN stop_reason ELSE $24 END,
                summary = CASE WHEN $23::text IS NULL THEN summary ELSE $25 END,
                output = CASE WHEN $23::text IS NULL THEN output ELSE $29::jsonb END,
                answered_model = CASE WHEN $23::text IS NOT NULL AND $14 = 'ok'
                    THEN $7 || '/' || $19 ELSE answered_model END,
                error_code = CASE WHEN $23::text IS NULL THEN error_code ELSE $26 END,
                error_message = CASE WHEN $23::text IS NULL THEN error_message ELSE $27 END,
                finished_at = CASE WHEN $23::text IS NULL THEN finished_at ELSE now() END,
                history_at = CASE WHEN $23::text IS NULL THEN history_at ELSE now() END,
                lease_token = CASE WHEN $23::text IS NULL THEN lease_token END,
                lease_expires_at = CASE WHEN $23::text IS NULL THEN lease_expires_at END
            WHERE id = $1 AND lease_token = $2 AND history_at = 'infinity'
              AND last_call_key IS DISTINCT FROM $20
            RETURNING {returning}
         ), c AS (
            INSERT INTO llm_calls (call_key, task_id, tenant, turn, attempt, try, provider, model, input_tokens,
                output_tokens, cached_tokens, cache_write_tokens, cost_usd, latency_ms, http_status, outcome, error,
                usage_estimated, web_searches, created_at)
            SELECT $20, $1, tenant, $4, $5, $6, $7, $19, $8, $9, $10, $30, $11, $12, $13, $14, $15, $28, $31, subagentd_uuid_time($20) FROM u
         ), r AS (
            INSERT INTO usage_daily AS d (day, tenant, model, agent_type, api_key, shard, calls, ok, failed, input_tokens,
                output_tokens, cached_tokens, cache_write_tokens, cost_usd, estimated_calls)
            SELECT (now() AT TIME ZONE 'UTC')::date, tenant, $7 || '/' || $19, subagent_type, coalesce(api_key, ''),
                pg_backend_pid() % 16, 1, ($14 = 'ok')::int, ($14 <> 'ok')::int, $8, $9, $10, $30, coalesce($11, 0),
                $28::bool::int FROM u
            ON CONFLICT (tenant, day, model, agent_type, api_key, shard) DO UPDATE SET {ROLLUP_ADD}
         ), m AS (
            INSERT INTO task_messages (task_id, seq, turn, message, earlier)
            SELECT $1, (SELECT coalesce(max(seq), 0) FROM task_messages
                        WHERE task_id = $1 AND created_at >= u.created_at - {DB_CLOCK_MARGIN}) + cardinality($16::jsonb[]),
                   $4, {last_and_earlier}
            FROM u WHERE cardinality($16::jsonb[]) > 0
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data, data_text, earlier)
            SELECT $1, u.last_event_seq, $17, NULL, $18::json, $32::json FROM u WHERE $17::text IS NOT NULL
         ), mt AS ({texts}
         ), {WAKE_WAITERS}
         SELECT {answer} FROM u, (SELECT count(*) FROM w) AS woken",
        // The whole task only for the commit that ends it (for its waiters).
        returning = if whole {
            format!("{COLS}, {WEBHOOK}, last_event_seq")
        } else {
            "tenant, subagent_type, api_key, last_event_seq, created_at".into()
        },
        answer = if whole { format!("{COL_NAMES}, webhook") } else { "1".into() },
        last_and_earlier = message_row("$16::jsonb[]"),
        texts = texts_insert(34, 35),
    )
}

/// A statement's messages as they are stored (migration 0035): a system message names its text
/// by SHA-256 (`text_sha256`), and the texts so named go to `message_texts` once each, in hash
/// order, so two statements that both bring new ones insert them in one order (and neither
/// waits on the other for long). Read back through `task_message_log`, which puts them back.
struct StoredMessages<'a> {
    sent: Vec<&'a Value>,
    /// The stored form of each message that differs from the one sent.
    named: Vec<Option<Value>>,
    hashes: Vec<Vec<u8>>,
    texts: Vec<&'a str>,
}

impl<'a> StoredMessages<'a> {
    fn of(msgs: impl IntoIterator<Item = &'a Value>) -> StoredMessages<'a> {
        use sha2::{Digest, Sha256};
        let sent: Vec<&Value> = msgs.into_iter().collect();
        let mut texts = std::collections::BTreeMap::new();
        let named = sent
            .iter()
            .map(|m| match m.as_object().map(|o| (o.len(), o.get("role"), o.get("content"))) {
                // Only `{"role": "system", "content": "..."}`, which the view rebuilds exactly.
                Some((2, Some(Value::String(role)), Some(Value::String(text)))) if role == "system" => {
                    let hash = Sha256::digest(text.as_bytes()).to_vec();
                    let named = serde_json::json!({"role": "system", "text_sha256": hex::encode(&hash)});
                    texts.insert(hash, text.as_str());
                    Some(named)
                }
                _ => None,
            })
            .collect();
        let (hashes, texts) = texts.into_iter().unzip();
        StoredMessages { sent, named, hashes, texts }
    }

    /// The messages to write, in order.
    fn rows(&self) -> Vec<&Value> {
        self.sent.iter().zip(&self.named).map(|(s, n)| n.as_ref().unwrap_or(s)).collect()
    }
}

/// The statement that stores the texts a write's system messages name ($h, $t: `bytea[]`,
/// `text[]`), when the write applies (`u` has a row); a text already stored is left as it is.
fn texts_insert(h: usize, t: usize) -> String {
    format!(
        "INSERT INTO message_texts (hash, content)
            SELECT s.h, s.c FROM unnest(${h}::bytea[], ${t}::text[]) AS s(h, c) WHERE EXISTS (SELECT 1 FROM u)
            ON CONFLICT DO NOTHING"
    )
}

/// A statement's messages (`msgs`, a `jsonb[]` expression) as the `message` and `earlier` of the
/// one row it writes (migration 0034): the last, and the ones before it as a JSON array.
fn message_row(msgs: &str) -> String {
    format!(
        "({msgs})[cardinality({msgs})],
         CASE WHEN cardinality({msgs}) > 1 THEN to_jsonb(({msgs})[1:cardinality({msgs}) - 1]) END"
    )
}

static COMMIT_TURN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| commit_turn_sql(false));
static COMMIT_TURN_ENDING: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| commit_turn_sql(true));

/// What a fenced write of a run did.
#[derive(Debug)]
pub enum Committed {
    Applied,
    /// Applied, and it ended the task; the task as written if `Finish::return_task` asked.
    Finished(Option<Box<TaskRow>>),
    /// The lease is no longer held: nothing was written.
    LeaseLost,
}

impl Committed {
    fn finished(row: Option<&sqlx::postgres::PgRow>) -> Result<Committed, StoreError> {
        Ok(Committed::Finished(row.map(TaskRow::from_row).transpose()?.map(Box::new)))
    }
}

/// How a run ended, as written to the task.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub status: TaskStatus,
    pub stop_reason: Option<StopReason>,
    pub summary: Option<String>,
    /// The final answer's value (with an `output_schema`).
    pub output: Option<Value>,
    pub error_code: Option<FailureCode>,
    pub error_message: Option<String>,
    /// Read the finished task back (for waiters in this process; only then, as it costs a
    /// decode and its memory at every finish).
    pub return_task: bool,
}

impl Finish {
    /// The events that end a task: `cancelled` for a cancel, then `finished`.
    pub fn events(&self) -> Vec<Event> {
        let mut out = vec![];
        if self.status == TaskStatus::Cancelled {
            out.push(Event::Cancelled(event::Empty {}));
        }
        out.push(Event::Finished(event::Finished { status: self.status, stop_reason: self.stop_reason }));
        out
    }
}

/// `finish`'s statement; `whole`: the one that also answers with the whole task.
fn finish_sql(whole: bool) -> String {
    let (returning, answer) = if whole {
        (format!("{COLS}, {WEBHOOK}, last_event_seq"), format!("{COL_NAMES}, webhook"))
    } else {
        ("id, tenant, last_event_seq".to_string(), "1".to_string())
    };
    format!(
        "WITH u AS (
            UPDATE tasks SET status = $3, stop_reason = $4, summary = $5, error_code = $6, error_message = $7,
                output = $10::jsonb, finished_at = now(), history_at = now(), lease_token = NULL, lease_expires_at = NULL,
                reserved_usd = 0, reserved_tokens = 0, last_event_seq = last_event_seq + $12
            WHERE id = $1 AND lease_token = $2 AND history_at = 'infinity'
            RETURNING {returning}
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data, data_text, earlier)
            SELECT id, u.last_event_seq, $8, NULL, $9::json, $11::json FROM u WHERE $8::text IS NOT NULL
         ), {WAKE_WAITERS}
         SELECT {answer} FROM u, (SELECT count(*) FROM w) AS woken"
    )
}

static FINISH: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| finish_sql(false));
static FINISH_ENDING: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| finish_sql(true));

/// Write the terminal state and its `finished` event (`LeaseLost`, and nothing written, if the
/// lease is no longer held).
pub async fn finish(pool: &PgPool, f: Fence, fin: &Finish) -> Result<Committed, StoreError> {
    let sql: &str = if fin.return_task { &FINISH_ENDING } else { &FINISH };
    let events = fin.events();
    let ev = super::events::pack(&events);
    let row = sqlx::query(sql)
        .bind(f.id)
        .bind(f.lease)
        .bind(fin.status)
        .bind(fin.stop_reason)
        .bind(&fin.summary)
        .bind(fin.error_code)
        .bind(&fin.error_message)
        .bind(ev.kind)
        .bind(ev.data)
        .bind(&fin.output)
        .bind(ev.earlier)
        .bind(ev.n)
        .fetch_optional(pool)
        .await?;
    match row {
        Some(r) => Committed::finished(fin.return_task.then_some(&r)),
        None => Ok(Committed::LeaseLost),
    }
}

/// Give a task back to the queue without counting the attempt (graceful drain).
pub async fn release(pool: &PgPool, f: Fence) -> Result<bool, StoreError> {
    let sql = "WITH u AS (
            UPDATE task_queue SET status = 'queued', attempt = attempt - 1, lease_token = NULL, lease_expires_at = NULL,
                worker_id = NULL, reserved_usd = 0, reserved_tokens = 0, last_event_seq = last_event_seq + 1
            WHERE id = $1 AND lease_token = $2
            RETURNING id, last_event_seq
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data) SELECT id, last_event_seq, 'released', '{}' FROM u
         )
         SELECT count(*)::int FROM u";
    let n: i32 = sqlx::query_scalar(sql).bind(f.id).bind(f.lease).fetch_one(pool).await?;
    Ok(n == 1)
}

/// What a run waits for when its call's reservation must wait for others' to settle.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetWaitRow {
    pub limit: String,
    pub need_usd: rust_decimal::Decimal,
    pub need_tokens: i64,
    pub want_usd: rust_decimal::Decimal,
    pub want_tokens: i64,
    /// The task's time limit: a wait past it ends the task.
    pub deadline: Option<chrono::DateTime<chrono::Utc>>,
}

/// Give a task back to the queue to wait for budget (not counting the attempt), with its
/// `budget_wait` event. False (nothing written) if the lease is no longer held.
pub async fn wait_for_budget(pool: &PgPool, f: Fence, w: &BudgetWaitRow) -> Result<bool, StoreError> {
    let sql = "WITH u AS (
            UPDATE task_queue SET status = 'queued', attempt = attempt - 1, lease_token = NULL, lease_expires_at = NULL,
                worker_id = NULL, reserved_usd = 0, reserved_tokens = 0, last_event_seq = last_event_seq + 1,
                waiting_for = 'budget', waiting_since = now(), wait_need_usd = $3, wait_need_tokens = $4,
                wait_want_usd = $5, wait_want_tokens = $6, wait_deadline = $7
            WHERE id = $1 AND lease_token = $2
            RETURNING id, last_event_seq
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data)
            SELECT id, last_event_seq, 'budget_wait', jsonb_build_object('limit', $8::text, 'need_usd', $3::numeric,
                'need_tokens', $4::bigint, 'want_usd', $5::numeric, 'want_tokens', $6::bigint) FROM u
         )
         SELECT count(*)::int FROM u";
    let n: i32 = sqlx::query_scalar(sql)
        .bind(f.id)
        .bind(f.lease)
        .bind(w.need_usd)
        .bind(w.need_tokens)
        .bind(w.want_usd)
        .bind(w.want_tokens)
        .bind(w.deadline)
        .bind(&w.limit)
        .fetch_one(pool)
        .await?;
    Ok(n == 1)
}

/// Rescue running tasks whose worker is gone: its lease expired, or its worker's database
/// session is gone (a dead process; see `workers`). For `grace_secs` after the database
/// started, neither rule applies to workers that were there before it: a restart dropped their
/// sessions and stopped their heartbeats, and they are given that long to come back.
/// A call the lost worker had in flight (a reservation not yet settled) is recorded first: the
/// provider may have billed it, so it goes in the ledger as `interrupted`, its usage estimated
/// from what was reserved (the prompt as estimated, and the output bound), and its reservation
/// becomes that spend. Then each task is queued again (or failed, out of attempts; or cancelled,
/// if that was asked), with its `rescued` event. All in one transaction.
pub async fn rescue(pool: &PgPool, max_attempts: i32, grace_secs: f64) -> Result<Vec<(Uuid, TaskStatus)>, StoreError> {
    super::on_move(pool, || rescue_once(pool, max_attempts, grace_secs)).await
}

async fn rescue_once(pool: &PgPool, max_attempts: i32, grace_secs: f64) -> Result<Vec<(Uuid, TaskStatus)>, StoreError> {
    let mut tx = pool.begin().await?;
    let ids: Vec<Uuid> = sqlx::query_scalar(&format!(
        "SELECT id FROM task_queue WHERE status = 'running'
           AND ((lease_expires_at < now() AND now() > pg_postmaster_start_time() + make_interval(secs => $1::float8))
                OR worker_id IN ({}))
         ORDER BY lease_expires_at LIMIT 500 FOR UPDATE SKIP LOCKED",
        super::workers::dead_sql("$1")
    ))
    .bind(grace_secs)
    .fetch_all(&mut *tx)
    .await?;
    if ids.is_empty() {
        return Ok(vec![]);
    }
    sqlx::query(RECORD_INTERRUPTED).bind(&ids).execute(&mut *tx).await?;
    let sql = "WITH u AS (
            UPDATE tasks t SET
                status = CASE WHEN t.cancel_requested THEN 'cancelled'
                              WHEN t.attempt >= $1 THEN 'failed' ELSE 'queued' END,
                stop_reason = CASE WHEN t.cancel_requested THEN 'cancelled' ELSE t.stop_reason END,
                error_code = CASE WHEN NOT t.cancel_requested AND t.attempt >= $1 THEN 'worker_lost' ELSE t.error_code END,
                error_message = CASE WHEN NOT t.cancel_requested AND t.attempt >= $1
                    THEN 'the worker running this task stopped responding ' || t.attempt || ' time(s)'
                    ELSE t.error_message END,
                finished_at = CASE WHEN t.cancel_requested OR t.attempt >= $1 THEN now() ELSE NULL END,
                history_at = CASE WHEN t.cancel_requested OR t.attempt >= $1 THEN now() ELSE 'infinity' END,
                lease_token = NULL, lease_expires_at = NULL, worker_id = NULL,
                reserved_usd = 0, reserved_tokens = 0, last_event_seq = t.last_event_seq + 1
            WHERE t.id = ANY($2) AND t.history_at = 'infinity'
            RETURNING t.id, t.status, t.last_event_seq, t.attempt
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data)
            SELECT id, last_event_seq, 'rescued', jsonb_build_object('status', status, 'attempt', attempt) FROM u
         )
         SELECT id, status FROM u";
    let rows: Vec<(Uuid, TaskStatus)> = sqlx::query_as(sql).bind(max_attempts).bind(&ids).fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(rows)
}

/// The calls rescued tasks ($1) had in flight, in the ledger: `interrupted`, usage estimated
/// from the reservation (the prompt as the call's `llm_call_started` event estimated it, the rest
/// of the reserved tokens as output; the reserved cost), added to the task and the rollup.
const RECORD_INTERRUPTED: &str = "WITH est AS (
        SELECT t.id, t.tenant, t.attempt, t.subagent_type, coalesce(t.api_key, '') AS api_key,
               split_part(t.model, '/', 1) AS provider, substr(t.model, strpos(t.model, '/') + 1) AS model,
               t.reserved_usd, t.reserved_tokens,
               least(coalesce((e.data->>'prompt_tokens')::bigint, 0), t.reserved_tokens) AS inp,
               coalesce((e.data->>'turn')::int, t.turns + 1) AS turn, coalesce((e.data->>'try')::int, 1) AS try,
               coalesce((extract(epoch FROM now() - e.created_at) * 1000)::int, 0) AS latency_ms
        FROM task_queue t
        LEFT JOIN LATERAL (SELECT data, created_at FROM task_event_log
                           WHERE task_id = t.id AND kind = 'llm_call_started'
                           ORDER BY row_seq DESC, seq DESC LIMIT 1) e ON true
        WHERE t.id = ANY($1) AND t.reserved_tokens > 0
     ), c AS (
        INSERT INTO llm_calls (call_key, task_id, tenant, turn, attempt, try, provider, model, input_tokens,
            output_tokens, cached_tokens, cost_usd, latency_ms, http_status, outcome, error, usage_estimated, created_at)
        SELECT k, id, tenant, turn, attempt, try, provider, model, inp, reserved_tokens - inp, 0,
               CASE WHEN reserved_usd > 0 THEN reserved_usd END, latency_ms, NULL, 'interrupted',
               'the worker was lost while the call was in flight: usage estimated from its reservation', true,
               subagentd_uuid_time(k)
        -- A key of its own for each row (the volatile call keeps the subquery apart), and its time.
        FROM (SELECT subagentd_uuidv7(now()) AS k, est.* FROM est) est
     ), u AS (
        UPDATE task_queue t SET input_tokens = t.input_tokens + est.inp,
            output_tokens = t.output_tokens + est.reserved_tokens - est.inp,
            cost_usd = t.cost_usd + est.reserved_usd, estimated_calls = t.estimated_calls + 1
        FROM est WHERE t.id = est.id
     )
     INSERT INTO usage_daily AS d (day, tenant, model, agent_type, api_key, shard, calls, ok, failed, input_tokens,
         output_tokens, cached_tokens, cost_usd, estimated_calls)
     SELECT (now() AT TIME ZONE 'UTC')::date, tenant, provider || '/' || model, subagent_type, api_key,
            pg_backend_pid() % 16, count(*), 0, count(*), sum(inp), sum(reserved_tokens - inp), 0, sum(reserved_usd),
            count(*)
     FROM est GROUP BY tenant, provider, model, subagent_type, api_key
     ON CONFLICT (tenant, day, model, agent_type, api_key, shard) DO UPDATE SET calls = d.calls + EXCLUDED.calls,
         failed = d.failed + EXCLUDED.failed, input_tokens = d.input_tokens + EXCLUDED.input_tokens,
         output_tokens = d.output_tokens + EXCLUDED.output_tokens, cost_usd = d.cost_usd + EXCLUDED.cost_usd,
         estimated_calls = d.estimated_calls + EXCLUDED.estimated_calls";
