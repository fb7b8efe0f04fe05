//! The worker side of `tasks`: claim, heartbeat, checkpoint, finish, release, rescue.
//! Every write by a worker is one statement fenced on `(id, lease_token)`.

use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::calls::CallRow;
use super::tasks::{query_tasks, task_from, StopReason, TaskRow, TaskStatus};
pub use super::Fence;
use super::StoreError;
use crate::kinds::{event, Event, EventKind, FailureCode};

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
    let served = sqlx::query!(
        r#"WITH RECURSIVE qt AS (
            (SELECT tenant FROM task_queue WHERE status = 'queued' ORDER BY tenant LIMIT 1)
            UNION ALL
            SELECT (SELECT t.tenant FROM task_queue t WHERE t.status = 'queued' AND t.tenant > qt.tenant ORDER BY t.tenant LIMIT 1)
            FROM qt WHERE qt.tenant IS NOT NULL
         )
         SELECT tn.name, coalesce(tn.max_running, $1) AS max_running FROM tenants tn
         WHERE tn.name IN (SELECT tenant FROM qt WHERE tenant IS NOT NULL)
         FOR UPDATE OF tn SKIP LOCKED"#,
        default_max_running
    )
    .fetch_all(&mut *tx)
    .await?;
    if served.is_empty() {
        tx.commit().await?;
        return Ok(vec![]);
    }
    // … then count and claim in a second statement, whose snapshot sees every claim committed
    // before the locks were ours: the running limit holds exactly, across replicas.
    let names: Vec<&str> = served.iter().map(|s| s.name.as_str()).collect();
    let limits: Vec<Option<i32>> = served.iter().map(|s| s.max_running).collect();
    let rows = query_tasks!(
        unhooked "u",
        (r#"WITH lim AS (
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
         SELECT "#),
        (" FROM u ORDER BY id"),
        limit,
        lease_secs,
        worker,
        &names as _,
        &limits as _
    )
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
    sqlx::query!("VACUUM (SKIP_LOCKED, TRUNCATE false, PROCESS_TOAST false) task_queue").execute(pool).await?;
    Ok(())
}

/// What a heartbeat found of one lease it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    Ok(sqlx::query_as!(
        Beat,
        r#"WITH h AS (
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
         SELECT id AS "id!", cancel_requested AS "cancel_requested!", true AS "renewed!" FROM u
         UNION ALL
         SELECT t.id, false, false FROM task_queue t JOIN h ON t.id = h.id AND t.lease_token = h.lease
         WHERE t.id = ANY($1) AND t.id NOT IN (SELECT id FROM l)"#,
        &ids,
        &leases,
        lease_secs
    )
    .fetch_all(pool)
    .await?)
}

/// One message of a task's saved conversation, as `GET /tasks/{id}/messages` shows it.
#[derive(Debug, Clone, serde::Serialize)]
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
    Ok(sqlx::query_as!(
        MessageRow,
        r#"SELECT seq AS "seq!", turn AS "turn!", message AS "message!", created_at AS "created_at!"
         FROM task_message_log WHERE task_id = $1 AND created_at >= $2 ORDER BY seq"#,
        id,
        since - super::CLOCK_MARGIN
    )
    .fetch_all(pool)
    .await?)
}

/// The saved conversation of a task, in order; none unless it is whole (from its first message,
/// without a gap): retention drops a task's days one at a time, so a conversation that crossed
/// midnight can be half gone for a day.
pub async fn messages(pool: &PgPool, id: Uuid) -> Result<Vec<Value>, StoreError> {
    let rows = sqlx::query!(
        r#"SELECT seq AS "seq!", message AS "message!" FROM task_message_log WHERE task_id = $1 ORDER BY seq"#,
        id
    )
    .fetch_all(pool)
    .await?;
    if rows.iter().enumerate().any(|(i, r)| r.seq != i as i32 + 1) {
        return Ok(vec![]);
    }
    Ok(rows.into_iter().map(|r| r.message).collect())
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
    let done = query_tasks!(
        view,
        ("SELECT "),
        (" FROM task_rows WHERE id = $1
           AND EXISTS (SELECT 1 FROM llm_calls WHERE call_key = $2 AND created_at = subagentd_uuid_time($2))"),
        f.id,
        call.call_key
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(match (done, fin) {
        (None, _) => Committed::LeaseLost,
        (Some(r), Some(_)) => Committed::Finished(whole.then(|| Box::new(r))),
        (Some(_), None) => Committed::Applied,
    })
}

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
        commit_turns_on(conn, &[self]).await.map(|mut c| c.pop().unwrap_or(Committed::LeaseLost))
    }

    /// The row the commit's statement takes for this write, whose messages are `stored`.
    fn row<'a>(&'a self, stored: &'a StoredMessages<'a>) -> TurnRow<'a> {
        let (c, fin) = (&self.call, self.fin.as_ref());
        let ending = fin.map(Finish::events).unwrap_or_default();
        let ev = super::events::pack(self.events.iter().chain(&ending));
        TurnRow {
            task: self.fence.id,
            lease: self.fence.lease,
            turns: self.turn,
            call_key: c.call_key,
            call_turn: c.turn,
            attempt: c.attempt,
            try_no: c.try_no,
            provider: &c.provider,
            model: &c.model,
            outcome: c.outcome.as_str(),
            error: c.error.as_deref(),
            input_tokens: c.input_tokens,
            output_tokens: c.output_tokens,
            cached_tokens: c.cached_tokens,
            cache_write_tokens: c.cache_write_tokens,
            web_searches: c.web_searches,
            cost_usd: c.cost_usd,
            latency_ms: c.latency_ms,
            http_status: c.http_status,
            usage_estimated: c.usage_estimated,
            reserved_usd: c.reserved_usd,
            reserved_tokens: c.reserved_tokens,
            status: fin.map(|f| f.status.as_str()),
            stop_reason: fin.and_then(|f| f.stop_reason.map(StopReason::as_str)),
            summary: fin.and_then(|f| f.summary.as_deref()),
            output: fin.and_then(|f| f.output.as_ref()),
            error_code: fin.and_then(|f| f.error_code.map(FailureCode::as_str)),
            error_message: fin.and_then(|f| f.error_message.as_deref()),
            want_task: fin.is_some_and(|f| f.return_task),
            messages: stored.rows(),
            text_hashes: stored.hashes.clone(),
            texts: stored.texts.clone(),
            event_kind: ev.kind.map(EventKind::as_str),
            event_data: ev.data,
            earlier: ev.earlier,
            events: ev.n,
        }
    }
}

/// One write as `commit_turns`' statement takes it: a value of the composite type
/// `subagentd_turn` (migration 0039), whose attributes are these fields, by name and in order
/// (`queries::a_turn_row_is_the_type_the_statement_takes` checks both against the database). The
/// statement names each attribute it reads, checked against the type when it compiles.
#[derive(Debug)]
struct TurnRow<'a> {
    task: Uuid,
    lease: Uuid,
    turns: Option<i32>,
    call_key: Uuid,
    call_turn: i32,
    attempt: i32,
    try_no: i32,
    provider: &'a str,
    model: &'a str,
    outcome: &'a str,
    error: Option<&'a str>,
    input_tokens: i64,
    output_tokens: i64,
    cached_tokens: i64,
    cache_write_tokens: i64,
    web_searches: i64,
    cost_usd: Option<rust_decimal::Decimal>,
    latency_ms: i32,
    http_status: Option<i32>,
    usage_estimated: bool,
    reserved_usd: rust_decimal::Decimal,
    reserved_tokens: i64,
    status: Option<&'a str>,
    stop_reason: Option<&'a str>,
    summary: Option<&'a str>,
    output: Option<&'a Value>,
    error_code: Option<&'a str>,
    error_message: Option<&'a str>,
    want_task: bool,
    messages: Vec<&'a Value>,
    text_hashes: Vec<Vec<u8>>,
    texts: Vec<&'a str>,
    event_kind: Option<&'static str>,
    event_data: Option<String>,
    earlier: Option<super::events::Earlier>,
    events: i32,
}

impl sqlx::Type<sqlx::Postgres> for TurnRow<'_> {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        sqlx::postgres::PgTypeInfo::with_name("subagentd_turn")
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for TurnRow<'_> {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        // Every field, in order: a field added to the struct does not compile until it is here.
        let TurnRow {
            task,
            lease,
            turns,
            call_key,
            call_turn,
            attempt,
            try_no,
            provider,
            model,
            outcome,
            error,
            input_tokens,
            output_tokens,
            cached_tokens,
            cache_write_tokens,
            web_searches,
            cost_usd,
            latency_ms,
            http_status,
            usage_estimated,
            reserved_usd,
            reserved_tokens,
            status,
            stop_reason,
            summary,
            output,
            error_code,
            error_message,
            want_task,
            messages,
            text_hashes,
            texts,
            event_kind,
            event_data,
            earlier,
            events,
        } = self;
        let mut r = sqlx::postgres::types::PgRecordEncoder::new(buf);
        r.encode(task)?.encode(lease)?.encode(turns)?.encode(call_key)?.encode(call_turn)?.encode(attempt)?;
        r.encode(try_no)?.encode(provider)?.encode(model)?.encode(outcome)?.encode(error)?;
        r.encode(input_tokens)?.encode(output_tokens)?.encode(cached_tokens)?.encode(cache_write_tokens)?;
        r.encode(web_searches)?.encode(cost_usd)?.encode(latency_ms)?.encode(http_status)?;
        r.encode(usage_estimated)?.encode(reserved_usd)?.encode(reserved_tokens)?;
        r.encode(status)?.encode(stop_reason)?.encode(summary)?.encode(output)?.encode(error_code)?;
        r.encode(error_message)?.encode(want_task)?;
        r.encode(messages)?.encode(text_hashes)?.encode(texts)?;
        r.encode(event_kind)?.encode(event_data)?.encode(earlier)?.encode(events)?;
        r.finish();
        Ok(sqlx::encode::IsNull::No)
    }
}

impl sqlx::postgres::PgHasArrayType for TurnRow<'_> {
    fn array_type_info() -> sqlx::postgres::PgTypeInfo {
        sqlx::postgres::PgTypeInfo::with_name("_subagentd_turn")
    }
}

/// The write as `commit_turns`' statement reads it: `to_jsonb` of the `subagentd_turn` it is sent
/// as. For `queries::a_turn_row_is_the_type_the_statement_takes`, which checks each field of
/// `TurnRow` arrives as the attribute of its name.
#[doc(hidden)]
pub async fn turn_as_read(pool: &PgPool, w: &TurnWrite) -> Result<Value, StoreError> {
    let stored = StoredMessages::of(&w.messages);
    let row = w.row(&stored);
    Ok(sqlx::query_scalar!(r#"SELECT to_jsonb($1::subagentd_turn) AS "row!""#, row as _).fetch_one(pool).await?)
}

/// Commit the turns of several runs in one statement (a group commit, or one turn alone: see
/// `TurnWrite`): each fenced on its own lease, and written only once however often it is sent,
/// with one transaction and one rollup upsert per (tenant, model, agent, key) for all. The answer
/// is each write's result, in order: a write whose lease is gone is `LeaseLost` and changes
/// nothing, and does not stop the others. An error fails the whole statement and writes nothing
/// (the caller commits each alone then).
pub async fn commit_turns(pool: &PgPool, writes: &[&TurnWrite]) -> Result<Vec<Committed>, StoreError> {
    let mut conn = pool.acquire().await?;
    commit_turns_on(&mut conn, writes).await
}

/// `commit_turns` on one connection.
async fn commit_turns_on(conn: &mut sqlx::PgConnection, writes: &[&TurnWrite]) -> Result<Vec<Committed>, StoreError> {
    let stored: Vec<StoredMessages> = writes.iter().map(|w| StoredMessages::of(&w.messages)).collect();
    let rows: Vec<TurnRow> = writes.iter().zip(&stored).map(|(w, s)| w.row(s)).collect();
    // Each applied write's place in `writes` (from 1), and its task when one was asked for.
    let applied: Vec<(i64, Option<TaskRow>)> = if rows.iter().any(|r| r.want_task) {
        commit_turns_sql!(tasks, rows)
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .map(|r| {
                let i = r.b_i;
                (i, Some(task_from!(r)))
            })
            .collect()
    } else {
        commit_turns_sql!(index, rows).fetch_all(&mut *conn).await?.into_iter().map(|i| (i, None)).collect()
    };
    let mut done: Vec<Option<Committed>> = (0..writes.len()).map(|_| None).collect();
    for (i, task) in applied {
        let Some(w) = usize::try_from(i - 1).ok().filter(|&i| i < writes.len()) else { continue };
        done[w] = Some(match &writes[w].fin {
            None => Committed::Applied,
            Some(f) => Committed::Finished(task.filter(|_| f.return_task).map(Box::new)),
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

/// `commit_turns`' statement over `$rows` (`TurnRow`s), answering with each applied write's place
/// (`index`: `b_i` alone) or with its task as well (`tasks`, a record for `task_from!`). The writes
/// are taken in task order, the order their rows are locked in. A task's messages are written
/// after it was (a run's, or a retention move's, now()): the bound on `created_at` spares the
/// probe of every older day's partition. A run's messages are one row: the last, and the ones
/// before it (migration 0034); its events too (migration 0033). The texts its system messages name
/// go to `message_texts` once each, in hash order, so two statements that both bring new ones
/// insert them in one order. When a run's tenant has tasks waiting for budget, the workers are told
/// (NOTIFY), and wake those that now fit.
macro_rules! commit_turns_sql {
    ($answer:ident, $rows:expr) => {
        commit_turns_sql!(@answer $answer, $rows, r#"WITH b AS (
            SELECT * FROM unnest($1::subagentd_turn[]) WITH ORDINALITY ORDER BY task
         ), u AS (
            UPDATE tasks t SET turns = coalesce(b.turns, t.turns), last_call_key = b.call_key,
                input_tokens = t.input_tokens + b.input_tokens, output_tokens = t.output_tokens + b.output_tokens,
                cached_tokens = t.cached_tokens + b.cached_tokens,
                cache_write_tokens = t.cache_write_tokens + b.cache_write_tokens,
                cost_usd = t.cost_usd + coalesce(b.cost_usd, 0),
                unpriced_calls = t.unpriced_calls + (b.cost_usd IS NULL AND b.outcome = 'ok')::int,
                estimated_calls = t.estimated_calls + b.usage_estimated::int,
                reserved_usd = CASE WHEN b.status IS NULL THEN greatest(t.reserved_usd - b.reserved_usd, 0) ELSE 0 END,
                reserved_tokens = CASE WHEN b.status IS NULL THEN greatest(t.reserved_tokens - b.reserved_tokens, 0) ELSE 0 END,
                last_event_seq = t.last_event_seq + b.events,
                status = coalesce(b.status, t.status),
                stop_reason = CASE WHEN b.status IS NULL THEN t.stop_reason ELSE b.stop_reason END,
                summary = CASE WHEN b.status IS NULL THEN t.summary ELSE b.summary END,
                output = CASE WHEN b.status IS NULL THEN t.output ELSE b.output END,
                answered_model = CASE WHEN b.status IS NOT NULL AND b.outcome = 'ok'
                    THEN b.provider || '/' || b.model ELSE t.answered_model END,
                error_code = CASE WHEN b.status IS NULL THEN t.error_code ELSE b.error_code END,
                error_message = CASE WHEN b.status IS NULL THEN t.error_message ELSE b.error_message END,
                finished_at = CASE WHEN b.status IS NULL THEN t.finished_at ELSE now() END,
                history_at = CASE WHEN b.status IS NULL THEN t.history_at ELSE now() END,
                lease_token = CASE WHEN b.status IS NULL THEN t.lease_token END,
                lease_expires_at = CASE WHEN b.status IS NULL THEN t.lease_expires_at END
            FROM b
            WHERE t.id = b.task AND t.lease_token = b.lease AND t.history_at = 'infinity'
              AND t.last_call_key IS DISTINCT FROM b.call_key
              -- The tasks by their key (an index scan whatever the plan guesses of `b`'s size).
              AND t.id = ANY(ARRAY(SELECT task FROM b))
            RETURNING "#, r#", b.ordinality AS b_i
         ), ub AS (
            SELECT u.id AS task_id, u.tenant, u.subagent_type, coalesce(u.api_key, '') AS api_key, u.created_at,
                   u.last_event_seq, b.* FROM u JOIN b ON b.ordinality = u.b_i
         ), c AS (
            INSERT INTO llm_calls (call_key, task_id, tenant, turn, attempt, try, provider, model, input_tokens,
                output_tokens, cached_tokens, cache_write_tokens, cost_usd, latency_ms, http_status, outcome, error,
                usage_estimated, web_searches, created_at)
            SELECT call_key, task_id, tenant, call_turn, attempt, try_no, provider, model, input_tokens, output_tokens,
                cached_tokens, cache_write_tokens, cost_usd, latency_ms, http_status, outcome, error, usage_estimated,
                web_searches, subagentd_uuid_time(call_key)
            FROM ub
         ), r AS (
            INSERT INTO usage_daily AS d (day, tenant, model, agent_type, api_key, shard, calls, ok, failed, input_tokens,
                output_tokens, cached_tokens, cache_write_tokens, cost_usd, estimated_calls)
            SELECT (now() AT TIME ZONE 'UTC')::date, tenant, provider || '/' || model, subagent_type, api_key,
                pg_backend_pid() % 16, count(*), count(*) FILTER (WHERE outcome = 'ok'),
                count(*) FILTER (WHERE outcome <> 'ok'), sum(input_tokens), sum(output_tokens), sum(cached_tokens),
                sum(cache_write_tokens), coalesce(sum(cost_usd), 0), count(*) FILTER (WHERE usage_estimated)
            FROM ub GROUP BY tenant, provider || '/' || model, subagent_type, api_key
            ORDER BY 2, 3, 4, 5
            ON CONFLICT (tenant, day, model, agent_type, api_key, shard) DO UPDATE SET calls = d.calls + EXCLUDED.calls,
                ok = d.ok + EXCLUDED.ok, failed = d.failed + EXCLUDED.failed,
                input_tokens = d.input_tokens + EXCLUDED.input_tokens, output_tokens = d.output_tokens + EXCLUDED.output_tokens,
                cached_tokens = d.cached_tokens + EXCLUDED.cached_tokens,
                cache_write_tokens = d.cache_write_tokens + EXCLUDED.cache_write_tokens,
                cost_usd = d.cost_usd + EXCLUDED.cost_usd, estimated_calls = d.estimated_calls + EXCLUDED.estimated_calls
         ), m AS (
            INSERT INTO task_messages (task_id, seq, turn, message, earlier)
            SELECT task_id, (SELECT coalesce(max(seq), 0) FROM task_messages x
                             WHERE x.task_id = ub.task_id AND x.created_at >= ub.created_at - subagentd_clock_margin())
                            + cardinality(messages),
                   call_turn, messages[cardinality(messages)],
                   CASE WHEN cardinality(messages) > 1 THEN to_jsonb(messages[1:cardinality(messages) - 1]) END
            FROM ub WHERE cardinality(messages) > 0
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data, data_text, earlier)
            SELECT task_id, last_event_seq, event_kind, NULL, event_data::json, earlier::json FROM ub
            WHERE event_kind IS NOT NULL
         ), mt AS (
            INSERT INTO message_texts (hash, content)
            SELECT s.h, s.c FROM ub, unnest(ub.text_hashes, ub.texts) AS s(h, c) ORDER BY s.h
            ON CONFLICT DO NOTHING
         ), w AS (
            SELECT pg_notify('subagentd_budget', t.tenant) FROM (SELECT DISTINCT tenant FROM u) t
            WHERE EXISTS (SELECT 1 FROM task_queue q WHERE q.tenant = t.tenant AND q.waiting_for IS NOT NULL
                          AND q.status = 'queued')
         )
         SELECT b_i AS "b_i!""#)
    };
    // The updated rows carry what the statement reads of them, or the whole task for the answer.
    (@answer index, $rows:expr, $head:tt, $rest:tt) => {
        sqlx::query_scalar!(
            $head + "t.id, t.tenant, t.subagent_type, t.api_key, t.created_at, t.last_event_seq" + $rest
                + " FROM u, (SELECT count(*) FROM w) AS woken",
            $rows as _
        )
    };
    (@answer tasks, $rows:expr, $head:tt, $rest:tt) => {
        query_tasks!(record "u", ($head + "t.*" + $rest + ", "), (" FROM u, (SELECT count(*) FROM w) AS woken"), $rows as _)
    };
}
use commit_turns_sql;

/// A statement's messages as they are stored (migration 0035): a system message names its text
/// by SHA-256 (`text_sha256`), and the texts so named go to `message_texts` once each. Read back
/// through `task_message_log`, which puts them back.
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

/// What a fenced write of a run did.
#[derive(Debug)]
pub enum Committed {
    Applied,
    /// Applied, and it ended the task; the task as written if `Finish::return_task` asked.
    Finished(Option<Box<TaskRow>>),
    /// The lease is no longer held: nothing was written.
    LeaseLost,
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

/// `finish`'s statement, answering `one` (`1`) or `task` (the whole task, `query_tasks!`): the
/// end written under the lease with its events, and the budget waiters told.
macro_rules! finish_sql {
    ($answer:ident, $($arg:expr),+) => {
        finish_sql!(@answer $answer, r#"WITH u AS (
            UPDATE tasks SET status = $3, stop_reason = $4, summary = $5, error_code = $6, error_message = $7,
                output = $10::jsonb, finished_at = now(), history_at = now(), lease_token = NULL, lease_expires_at = NULL,
                reserved_usd = 0, reserved_tokens = 0, last_event_seq = last_event_seq + $12
            WHERE id = $1 AND lease_token = $2 AND history_at = 'infinity'
            RETURNING *
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data, data_text, earlier)
            SELECT id, u.last_event_seq, $8, NULL, $9::json, $11::json FROM u WHERE $8::text IS NOT NULL
         ), w AS (
            SELECT pg_notify('subagentd_budget', u.tenant) FROM u
            WHERE EXISTS (SELECT 1 FROM task_queue q WHERE q.tenant = u.tenant AND q.waiting_for IS NOT NULL
                          AND q.status = 'queued')
         )
         SELECT "#, $($arg),+)
    };
    (@answer one, $body:tt, $($arg:expr),+) => {
        sqlx::query_scalar!($body + r#"1 AS "one!" FROM u, (SELECT count(*) FROM w) AS woken"#, $($arg),+)
    };
    (@answer task, $body:tt, $($arg:expr),+) => {
        query_tasks!("u", ($body), (" FROM u, (SELECT count(*) FROM w) AS woken"), $($arg),+)
    };
}

/// Write the terminal state and its `finished` event (`LeaseLost`, and nothing written, if the
/// lease is no longer held).
pub async fn finish(pool: &PgPool, f: Fence, fin: &Finish) -> Result<Committed, StoreError> {
    let events = fin.events();
    let ev = super::events::pack(&events);
    macro_rules! finish_with {
        ($answer:ident) => {
            finish_sql!(
                $answer,
                f.id,
                f.lease,
                fin.status.as_str(),
                fin.stop_reason.map(StopReason::as_str),
                fin.summary,
                fin.error_code.map(FailureCode::as_str),
                fin.error_message,
                ev.kind.map(EventKind::as_str),
                ev.data as _,
                fin.output,
                ev.earlier as _,
                ev.n
            )
            .fetch_optional(pool)
            .await?
        };
    }
    Ok(if fin.return_task {
        finish_with!(task).map_or(Committed::LeaseLost, |t| Committed::Finished(Some(Box::new(t))))
    } else {
        finish_with!(one).map_or(Committed::LeaseLost, |_| Committed::Finished(None))
    })
}

/// Give a task back to the queue without counting the attempt (graceful drain).
pub async fn release(pool: &PgPool, f: Fence) -> Result<bool, StoreError> {
    let n = sqlx::query_scalar!(
        r#"WITH u AS (
            UPDATE task_queue SET status = 'queued', attempt = attempt - 1, lease_token = NULL, lease_expires_at = NULL,
                worker_id = NULL, reserved_usd = 0, reserved_tokens = 0, last_event_seq = last_event_seq + 1
            WHERE id = $1 AND lease_token = $2
            RETURNING id, last_event_seq
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data) SELECT id, last_event_seq, 'released', '{}' FROM u
         )
         SELECT count(*)::int AS "n!" FROM u"#,
        f.id,
        f.lease
    )
    .fetch_one(pool)
    .await?;
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
    let n = sqlx::query_scalar!(
        r#"WITH u AS (
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
         SELECT count(*)::int AS "n!" FROM u"#,
        f.id,
        f.lease,
        w.need_usd,
        w.need_tokens,
        w.want_usd,
        w.want_tokens,
        w.deadline,
        w.limit
    )
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
    let ids = sqlx::query_scalar!(
        "SELECT id FROM task_queue WHERE status = 'running'
           AND ((lease_expires_at < now() AND now() > pg_postmaster_start_time() + make_interval(secs => $1::float8))
                OR worker_id IN (SELECT subagentd_dead_workers($1)))
         ORDER BY lease_expires_at LIMIT 500 FOR UPDATE SKIP LOCKED",
        grace_secs
    )
    .fetch_all(&mut *tx)
    .await?;
    if ids.is_empty() {
        return Ok(vec![]);
    }
    // The calls these tasks had in flight, in the ledger: `interrupted`, usage estimated from the
    // reservation (the prompt as the call's `llm_call_started` event estimated it, the rest of the
    // reserved tokens as output; the reserved cost), added to the task and the rollup.
    sqlx::query!(
        r#"WITH est AS (
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
         estimated_calls = d.estimated_calls + EXCLUDED.estimated_calls"#,
        &ids
    )
    .execute(&mut *tx)
    .await?;
    let rows = sqlx::query!(
        r#"WITH u AS (
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
         SELECT id AS "id!", status AS "status!: TaskStatus" FROM u"#,
        max_attempts,
        &ids
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|r| (r.id, r.status))
    .collect();
    tx.commit().await?;
    Ok(rows)
}
