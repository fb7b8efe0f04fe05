-- Runs at a time, runs on a schedule, and urgent runs first (issue 36).

-- A task with a start time ahead waits as `scheduled` (not terminal: no finished_at), holding no
-- reservation and counting against no running or queue limit, until it is queued at `run_at`.
DO $$
DECLARE c record;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = 'tasks'::regclass AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%status%'
               AND conname IN ('tasks_status_check', 'tasks_finished_check')
    LOOP
        EXECUTE format('ALTER TABLE tasks DROP CONSTRAINT %I', c.conname);
    END LOOP;
END $$;
ALTER TABLE tasks ADD CONSTRAINT tasks_status_check
    CHECK (status IN ('scheduled', 'queued', 'running', 'requires_action', 'completed', 'incomplete', 'failed',
                      'cancelled'));
ALTER TABLE tasks ADD CONSTRAINT tasks_finished_check
    CHECK ((status IN ('scheduled', 'queued', 'running', 'requires_action')) = (finished_at IS NULL));

-- When a scheduled task is queued; its priority within its tenant (2 high, 1 normal, 0 low).
ALTER TABLE tasks
    ADD COLUMN run_at   timestamptz,
    ADD COLUMN priority smallint NOT NULL DEFAULT 1 CHECK (priority BETWEEN 0 AND 2);
CREATE INDEX tasks_scheduled_due_idx ON tasks (run_at) WHERE status = 'scheduled';
CREATE INDEX tasks_tenant_scheduled_idx ON tasks (tenant) WHERE status = 'scheduled';

-- The claim takes a tenant's queued tasks by priority, then arrival.
CREATE INDEX tasks_tenant_queued_prio_idx ON tasks (tenant, priority DESC, id) WHERE status = 'queued';
DROP INDEX IF EXISTS tasks_tenant_queued_idx;

-- A tenant's cap on waiting scheduled tasks, and its default priority.
ALTER TABLE tenants
    ADD COLUMN max_scheduled integer CHECK (max_scheduled >= 0),
    ADD COLUMN priority text CHECK (priority IN ('high', 'normal', 'low'));

-- Schedules: a cron expression in a time zone, and the task body each tick submits. Each tick
-- makes one task across every replica (its idempotency key is the schedule's and the tick's).
CREATE TABLE schedules (
    tenant       text        NOT NULL,
    name         text        NOT NULL,
    cron         text        NOT NULL,
    timezone     text        NOT NULL DEFAULT 'UTC',
    task         jsonb       NOT NULL,
    paused       boolean     NOT NULL DEFAULT false,
    next_run_at  timestamptz,
    last_run_at  timestamptz,
    last_task_id uuid,
    last_error   text,
    -- A replica taking a tick holds it until then (another takes it after, should it die).
    ticking_until timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name)
);
CREATE INDEX schedules_due_idx ON schedules (next_run_at) WHERE NOT paused;
