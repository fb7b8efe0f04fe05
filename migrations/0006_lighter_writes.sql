-- The daily rollup was one row per (tenant, day, model, agent type), updated by every ledger
-- write: under load every checkpoint of a tenant queued on that row's lock, held through the
-- commit. Spread it over shards, one per writing connection (backend pid modulo 16): readers
-- already sum, and the view now sums over the shards.
ALTER TABLE usage_daily ADD COLUMN shard smallint NOT NULL DEFAULT 0;
ALTER TABLE usage_daily DROP CONSTRAINT usage_daily_pkey;
ALTER TABLE usage_daily ADD PRIMARY KEY (tenant, day, model, agent_type, shard);

DROP VIEW v_usage_daily;
CREATE VIEW v_usage_daily AS
SELECT day, tenant, model, agent_type, sum(calls)::bigint AS calls, sum(ok)::bigint AS ok,
       sum(failed)::bigint AS failed, sum(input_tokens)::bigint AS input_tokens,
       sum(output_tokens)::bigint AS output_tokens, sum(cached_tokens)::bigint AS cached_tokens,
       sum(input_tokens + output_tokens)::bigint AS total_tokens, sum(cost_usd)::numeric(20, 10) AS cost_usd
FROM usage_daily
GROUP BY day, tenant, model, agent_type;

-- A task's row is updated about six times in its life; most of those updates (checkpoints,
-- reservations, event counters) touch no indexed column and can stay on the same page (HOT)
-- when the page has room.
ALTER TABLE tasks SET (fillfactor = 70);

-- The children of a task (ledger rows, messages, events) are only ever written by a statement
-- that inserts or updates the task itself, under its lease, and tasks are never deleted (the
-- purge removes children only). The foreign keys re-checked that with a lookup and a row lock
-- on `tasks` for every child row, about fifteen per task: a fifth of the database's work.
ALTER TABLE llm_calls DROP CONSTRAINT llm_calls_task_id_fkey;
ALTER TABLE task_messages DROP CONSTRAINT task_messages_task_id_fkey;
ALTER TABLE task_events DROP CONSTRAINT task_events_task_id_fkey;
