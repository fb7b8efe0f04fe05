-- Statements shared by more than one query, as functions, so that every query can be a literal
-- the compiler checks (sqlx's macros take no string built at run time).

-- The ids of workers whose database session is gone: dead. After a restart of the database every
-- session is gone at once; that is not the death of the workers, which register again as they
-- reconnect: a registration older than the server counts as dead only `grace` seconds after the
-- server started.
CREATE FUNCTION subagentd_dead_workers(grace float8) RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT w.id FROM workers w
    WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                      WHERE a.pid = w.backend_pid AND a.backend_start = w.backend_start)
      AND (w.backend_start >= pg_postmaster_start_time()
           OR now() > pg_postmaster_start_time() + make_interval(secs => grace))
$$;

-- A task as the service reads it (the service's `TaskRow`): its options from `task_options` where
-- the row names them by hash (migration 0036), and its `task.finished` delivery as views show it.
-- The statements that write a task and answer with it in the same statement read these two from
-- the rows they wrote, the same way (`query_tasks!` in src/store/tasks.rs).
CREATE VIEW task_rows AS
SELECT t.id, t.tenant, t.status, t.stop_reason, t.subagent_type, t.description, t.prompt, t.model,
       CASE WHEN t.options_sha256 IS NULL THEN t.options
            ELSE (SELECT o.options FROM task_options o WHERE o.hash = t.options_sha256) END AS options,
       t.summary, t.output, t.error_code, t.error_message, t.turns, t.input_tokens, t.output_tokens, t.cached_tokens,
       t.cache_write_tokens, t.cost_usd, t.unpriced_calls, t.estimated_calls, t.attempt, t.lease_token,
       t.lease_expires_at, t.worker_id, t.cancel_requested, t.idempotency_key, t.request_hash, t.metadata,
       t.created_at, t.started_at, t.finished_at, t.parent_task_id, t.max_cost_usd, t.max_tokens, t.traceparent,
       t.webhook_url, t.waiting_for, t.api_key, t.pauses, t.paused_ms, t.answered_model, t.run_at, t.priority,
       (SELECT jsonb_build_object('status', d.status, 'attempts', d.attempts, 'last_error', d.last_error,
                                  'delivered_at', d.delivered_at)
        FROM webhook_deliveries d
        WHERE d.task_id = t.id AND d.event = 'task.finished' AND d.push_config = '') AS webhook,
       t.workspace_version, t.diff_stats
FROM tasks t;

-- How far a worker's clock may be from the database's, for the bounds that spare reads of older
-- days' partitions (the service's `CLOCK_MARGIN`; inlined by the planner as a constant).
CREATE FUNCTION subagentd_clock_margin() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '5 minutes' $$;

-- One run's turn as the statement that commits it takes it (the service's `TurnRow`, field for
-- field and in order): the task's totals, the call's ledger row, the turn's messages and events,
-- and the run's end when the turn ends the task. The statement takes an array of them, one per
-- run: a turn alone, or a group commit.
CREATE TYPE subagentd_turn AS (
    task uuid,
    lease uuid,
    -- The task's turns after this write (NULL: a failed call that completes no turn).
    turns int,
    call_key uuid,
    call_turn int,
    attempt int,
    try_no int,
    provider text,
    model text,
    outcome text,
    error text,
    input_tokens int8,
    output_tokens int8,
    cached_tokens int8,
    cache_write_tokens int8,
    web_searches int8,
    cost_usd numeric,
    latency_ms int,
    http_status int,
    usage_estimated bool,
    reserved_usd numeric,
    reserved_tokens int8,
    -- The run's end (NULL while it goes on), and whether the answer should carry the task.
    status text,
    stop_reason text,
    summary text,
    output jsonb,
    error_code text,
    error_message text,
    want_task bool,
    -- The turn's messages as stored (migration 0035), and the texts their system messages name.
    messages jsonb[],
    text_hashes bytea[],
    texts text[],
    -- Its events as one row (migration 0033): the last event's kind and data, the ones before it,
    -- and how many there are.
    event_kind text,
    event_data text,
    earlier text,
    events int
);
