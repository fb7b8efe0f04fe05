-- Runs that pause: a run whose turn has tool calls that need a decision (approval) or the
-- caller's output waits, durably, in `requires_action`, holding no worker, lease or reservation.

-- The status checks gain the paused state (it is not terminal: no finished_at).
DO $$
DECLARE c record;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = 'tasks'::regclass AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%status%'
    LOOP
        EXECUTE format('ALTER TABLE tasks DROP CONSTRAINT %I', c.conname);
    END LOOP;
END $$;
ALTER TABLE tasks ADD CONSTRAINT tasks_status_check
    CHECK (status IN ('queued', 'running', 'requires_action', 'completed', 'incomplete', 'failed', 'cancelled'));
ALTER TABLE tasks ADD CONSTRAINT tasks_finished_check
    CHECK ((status IN ('queued', 'running', 'requires_action')) = (finished_at IS NULL));

ALTER TABLE tasks
    ADD COLUMN pauses    integer     NOT NULL DEFAULT 0,  -- how many times the run paused
    ADD COLUMN paused_at timestamptz,                     -- while paused: since when
    ADD COLUMN paused_ms bigint      NOT NULL DEFAULT 0;  -- time spent paused (not counted by the time limit)
CREATE INDEX tasks_requires_action_idx ON tasks (tenant, id) WHERE status = 'requires_action';

-- A tenant's default approval mode (NULL: none).
ALTER TABLE tenants ADD COLUMN approval text CHECK (approval IN ('none', 'propose', 'all'));

-- A catalog tool with no endpoint is a caller tool: the caller runs it and submits its output.
ALTER TABLE tools ALTER COLUMN endpoint DROP NOT NULL;

-- What a paused run waits for, one row per tool call, each answered by its own id; the answer
-- is stored, with who gave it and when, before it is acknowledged.
CREATE TABLE task_actions (
    id           uuid PRIMARY KEY,
    task_id      uuid        NOT NULL,
    tenant       text        NOT NULL,
    pause        integer     NOT NULL,             -- which pause of the task
    turn         integer     NOT NULL,
    tool_call_id text        NOT NULL,
    kind         text        NOT NULL CHECK (kind IN ('approval', 'output')),
    name         text        NOT NULL,
    arguments    jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    answered_at  timestamptz,
    decision     text CHECK (decision IN ('approve', 'deny')),
    message      text,
    output       jsonb,
    answered_by  text,                             -- 'admin', 'key:<prefix>', 'tenant:<name>', or 'expired'
    UNIQUE (task_id, pause, tool_call_id)
);
CREATE INDEX task_actions_open_idx ON task_actions (expires_at) WHERE answered_at IS NULL;

-- Webhook deliveries, one row per event of a task (`task.finished`, `task.requires_action`),
-- instead of the task's own columns: a task may have several.
CREATE TABLE webhook_deliveries (
    id           bigserial PRIMARY KEY,
    task_id      uuid        NOT NULL,
    event        text        NOT NULL,
    seq          integer     NOT NULL DEFAULT 0,   -- the pause, for `task.requires_action`
    status       text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts     integer     NOT NULL DEFAULT 0,
    next_at      timestamptz NOT NULL DEFAULT now(),
    last_error   text,
    delivered_at timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (task_id, event, seq)
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_at) WHERE status = 'pending';

INSERT INTO webhook_deliveries (task_id, event, status, attempts, next_at, last_error, delivered_at)
SELECT id, 'task.finished', webhook_status, webhook_attempts, coalesce(webhook_next_at, now()), webhook_last_error,
       webhook_delivered_at
FROM tasks WHERE webhook_url IS NOT NULL AND webhook_status IS NOT NULL;

DROP INDEX IF EXISTS tasks_webhook_due_idx;
ALTER TABLE tasks
    DROP COLUMN webhook_status,
    DROP COLUMN webhook_attempts,
    DROP COLUMN webhook_next_at,
    DROP COLUMN webhook_last_error,
    DROP COLUMN webhook_delivered_at;
