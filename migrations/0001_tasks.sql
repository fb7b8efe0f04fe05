-- The job store: one row per task, its conversation, its event log and the usage ledger.

CREATE TABLE tasks (
    id               uuid PRIMARY KEY,                 -- UUID v7: time-ordered, used for keyset pagination
    tenant           text        NOT NULL,
    status           text        NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'running', 'completed', 'incomplete', 'failed', 'cancelled')),
    stop_reason      text,
    subagent_type    text        NOT NULL,
    description      text,
    prompt           text        NOT NULL,
    model            text        NOT NULL,
    options          jsonb       NOT NULL DEFAULT '{}',  -- max_turns, system_prompt, parent_context, offered tools
    summary          text,
    error_code       text,
    error_message    text,
    turns            integer     NOT NULL DEFAULT 0,
    input_tokens     bigint      NOT NULL DEFAULT 0,
    output_tokens    bigint      NOT NULL DEFAULT 0,
    cached_tokens    bigint      NOT NULL DEFAULT 0,
    cost_usd         numeric(20, 10) NOT NULL DEFAULT 0,
    unpriced_calls   integer     NOT NULL DEFAULT 0,   -- calls whose model had no price: cost_usd is a lower bound
    attempt          integer     NOT NULL DEFAULT 0,   -- number of claims so far
    lease_token      uuid,
    lease_expires_at timestamptz,
    worker_id        text,
    cancel_requested boolean     NOT NULL DEFAULT false,
    idempotency_key  text,
    request_hash     text,
    metadata         jsonb       NOT NULL DEFAULT '{}',
    last_event_seq   integer     NOT NULL DEFAULT 0,   -- per-task event sequence; the row lock orders writers
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    CHECK ((status IN ('queued', 'running')) = (finished_at IS NULL))
);

-- The claim query: oldest queued first.
CREATE INDEX tasks_queued_idx ON tasks (id) WHERE status = 'queued';
-- The rescuer: expired leases of running tasks.
CREATE INDEX tasks_running_lease_idx ON tasks (lease_expires_at) WHERE status = 'running';
-- Listing by tenant, newest first (keyset on id).
CREATE INDEX tasks_tenant_id_idx ON tasks (tenant, id DESC);
-- Dashboards: outcomes and latency by finish time.
CREATE INDEX tasks_finished_idx ON tasks (finished_at, tenant) WHERE finished_at IS NOT NULL;
-- Idempotent submission per tenant.
CREATE UNIQUE INDEX tasks_idempotency_idx ON tasks (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- The usage ledger: one row per provider call attempt.
CREATE TABLE llm_calls (
    id            bigserial PRIMARY KEY,
    call_key      uuid        NOT NULL,   -- chosen by the worker: a retried write of the same call is a no-op
    task_id       uuid        NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    tenant        text        NOT NULL,
    turn          integer     NOT NULL,
    attempt       integer     NOT NULL,   -- the task attempt (claim) that made the call
    try           integer     NOT NULL DEFAULT 1,  -- retry number of this call within the turn
    provider      text        NOT NULL,
    model         text        NOT NULL,
    input_tokens  bigint      NOT NULL DEFAULT 0,
    output_tokens bigint      NOT NULL DEFAULT 0,
    cached_tokens bigint      NOT NULL DEFAULT 0,
    cost_usd      numeric(20, 10),        -- NULL when the model has no price
    latency_ms    integer     NOT NULL,
    http_status   integer,
    outcome       text        NOT NULL,   -- ok | error | cancelled
    error         text,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX llm_calls_task_idx ON llm_calls (task_id, id);
CREATE UNIQUE INDEX llm_calls_call_key_idx ON llm_calls (call_key);
CREATE INDEX llm_calls_tenant_time_idx ON llm_calls (tenant, created_at);

-- The run's conversation, checkpointed per turn.
CREATE TABLE task_messages (
    task_id    uuid        NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    seq        integer     NOT NULL,
    turn       integer     NOT NULL,
    message    jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, seq)
);

-- Append-only event log per task, ordered by seq.
CREATE TABLE task_events (
    task_id    uuid        NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    seq        integer     NOT NULL,
    kind       text        NOT NULL,
    data       jsonb       NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, seq)
);
