-- The queue apart from the history (#47). `tasks` is partitioned by `history_at`, the time a task
-- ended (`finished_at`), or 'infinity' while it is open:
--   * `task_queue`, the partition FROM ('infinity') TO (MAXVALUE), holds the scheduled, queued,
--     running and paused tasks. It is small (what is open), kept at fillfactor 50 so a turn's
--     counters are HOT updates, and the claim, leases, heartbeats, the rescuer and the timers
--     read only it;
--   * `tasks_pYYYYMM`, one per UTC month, hold the finished tasks by the month they ended.
-- Every statement that ends a task sets `finished_at` and `history_at` together (a CHECK says
-- they agree), so PostgreSQL moves the row out of the queue in that same statement: there is no
-- second write to forget and no moment when the task is in both or neither.
--
-- Months, not days: task rows are kept for ever (no window drops them), and a read by id alone
-- cannot be pruned by the end time, so what the granularity decides is how many partitions every
-- such read visits: 12 a year, not 365.
--
-- What a partitioned table cannot keep:
--   * the unique (tenant, idempotency_key) index (a unique index must hold the partition key).
--     Keys move to `task_keys`, whose primary key is (tenant, key): the submission inserts the
--     key and the task in one statement, so a key still names one task;
--   * `id` alone as the primary key: it is (id, history_at). Ids are UUIDv7 made by the service
--     and a row is in one partition at a time, so an id is still one task;
--   * foreign keys to `tasks`: `parent_task_id` (a child is only made by its running parent) and
--     `task_diffs.task_id` (a diff is only written under its task's lease, and tasks are never
--     deleted) had them; nothing else referenced tasks since migration 0006.

-- The month partition of `parent` holding `month`, made as a table and attached (SHARE UPDATE
-- EXCLUSIVE on the parent). False when it was already attached.
CREATE FUNCTION subagentd_month_partition(parent text, month date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    m date := date_trunc('month', month)::date;
    part text := parent || '_p' || to_char(m, 'YYYYMM');
BEGIN
    IF to_regclass(part) IS NOT NULL
       AND EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(part)) THEN
        RETURN false;
    END IF;
    IF to_regclass(part) IS NULL THEN
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMPRESSION)',
                       part, parent);
    END IF;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', parent, part,
                   m::timestamp AT TIME ZONE 'UTC', (m + interval '1 month')::timestamp AT TIME ZONE 'UTC');
    RETURN true;
END $$;

-- As in 0028, plus the months of `tasks` those days fall in.
CREATE OR REPLACE FUNCTION subagentd_ensure_partitions(ahead integer) RETURNS date
LANGUAGE plpgsql SET lock_timeout = '1s' AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    parent text;
    d date;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('subagentd_partitions'));
    FOREACH parent IN ARRAY ARRAY['task_events', 'task_messages'] LOOP
        FOR d IN SELECT generate_series(today - 1, today + ahead, interval '1 day')::date LOOP
            PERFORM subagentd_partition(parent, d);
        END LOOP;
    END LOOP;
    FOR d IN SELECT DISTINCT date_trunc('month', g)::date
             FROM generate_series(today - 1, today + ahead, interval '1 day') g LOOP
        PERFORM subagentd_month_partition('tasks', d);
    END LOOP;
    RETURN today + ahead;
END $$;

-- The dashboards' views read `tasks`: kept as they are, made again over the new table.
CREATE TEMP TABLE saved_views ON COMMIT DROP AS
    SELECT c.relname::text AS name, pg_get_viewdef(c.oid) AS def FROM pg_class c
    WHERE c.relkind = 'v' AND c.relnamespace = current_schema()::regnamespace
      AND c.relname IN ('v_task_outcomes', 'v_task_latency');
DROP VIEW IF EXISTS v_task_outcomes, v_task_latency;

ALTER TABLE tasks RENAME TO tasks_0028;

CREATE TABLE tasks (
    LIKE tasks_0028 INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMPRESSION,
    history_at timestamptz NOT NULL DEFAULT 'infinity',
    CONSTRAINT tasks_history_at_check CHECK (history_at = coalesce(finished_at, 'infinity'))
) PARTITION BY RANGE (history_at);

CREATE TABLE task_queue PARTITION OF tasks FOR VALUES FROM ('infinity') TO (MAXVALUE) WITH (fillfactor = 50);

DO $$
DECLARE
    first date;
    m date;
BEGIN
    SELECT (min(finished_at) AT TIME ZONE 'UTC')::date INTO first FROM tasks_0028;
    IF first IS NOT NULL THEN
        FOR m IN SELECT generate_series(date_trunc('month', first), now() AT TIME ZONE 'UTC', interval '1 month')::date LOOP
            PERFORM subagentd_month_partition('tasks', m);
        END LOOP;
    END IF;
    PERFORM subagentd_ensure_partitions(7);
END $$;

INSERT INTO tasks SELECT t.*, coalesce(t.finished_at, 'infinity') FROM tasks_0028 t;

-- A key names its task for 24 hours (store::tasks); older keys are free already.
CREATE TABLE task_keys (
    tenant     text        NOT NULL,
    key        text        NOT NULL,
    task_id    uuid        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, key)
);
CREATE INDEX task_keys_created_idx ON task_keys (created_at);
INSERT INTO task_keys
    SELECT tenant, idempotency_key, id, created_at FROM tasks_0028
    WHERE idempotency_key IS NOT NULL AND created_at >= now() - interval '24 hours';

DROP TABLE tasks_0028 CASCADE;

-- The indexes as they were (each partial one is empty where its states do not live), without
-- the unique key index (task_keys).
ALTER TABLE tasks ADD PRIMARY KEY (id, history_at);
CREATE INDEX tasks_finished_idx ON tasks (finished_at, tenant) WHERE finished_at IS NOT NULL;
CREATE INDEX tasks_metadata_idx ON tasks USING gin (metadata jsonb_path_ops) WHERE metadata <> '{}'::jsonb;
CREATE INDEX tasks_parent_idx ON tasks (parent_task_id) WHERE parent_task_id IS NOT NULL;
CREATE INDEX tasks_queued_idx ON tasks (id) WHERE status = 'queued';
CREATE INDEX tasks_requires_action_idx ON tasks (tenant, id) WHERE status = 'requires_action';
CREATE INDEX tasks_running_lease_idx ON tasks (lease_expires_at) WHERE status = 'running';
CREATE INDEX tasks_running_worker_idx ON tasks (worker_id) WHERE status = 'running';
CREATE INDEX tasks_scheduled_due_idx ON tasks (run_at) WHERE status = 'scheduled';
CREATE INDEX tasks_status_id_idx ON tasks (status, id)
    WHERE status = ANY (ARRAY['requires_action', 'incomplete', 'failed', 'cancelled']);
CREATE INDEX tasks_tenant_id_idx ON tasks (tenant, id DESC);
CREATE INDEX tasks_tenant_queued_prio_idx ON tasks (tenant, priority DESC, id) WHERE status = 'queued';
CREATE INDEX tasks_tenant_running_idx ON tasks (tenant) WHERE status = 'running';
CREATE INDEX tasks_tenant_scheduled_idx ON tasks (tenant) WHERE status = 'scheduled';
CREATE INDEX tasks_tenant_status_id_idx ON tasks (tenant, status, id)
    WHERE status = ANY (ARRAY['incomplete', 'failed', 'cancelled']);
CREATE INDEX tasks_waiting_idx ON tasks (tenant, id) WHERE waiting_for IS NOT NULL;

-- The budget functions (0008, 0013) read and write only open tasks: they name the queue, where
-- they find them without visiting the history's partitions.
DO $$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT p.oid FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace
               AND p.proname IN ('budget_reserve', 'budget_rooms', 'budget_wake', 'budget_reserve_call') LOOP
        EXECUTE regexp_replace(pg_get_functiondef(f.oid), '\mtasks\M', 'task_queue', 'g');
    END LOOP;
END $$;

DO $$
DECLARE
    v record;
BEGIN
    FOR v IN SELECT * FROM saved_views LOOP
        EXECUTE format('CREATE VIEW %I AS %s', v.name, v.def);
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'subagentd_dashboards') THEN
        FOR v IN SELECT * FROM saved_views LOOP
            EXECUTE format('GRANT SELECT ON %I TO subagentd_dashboards', v.name);
        END LOOP;
    END IF;
END $$;

-- Autovacuum never analyzes a partitioned parent: its statistics are made here once.
ANALYZE tasks;
