-- Tenants and their limits (NULL: the configured default applies; no default: unlimited).
CREATE TABLE tenants (
    name                     text PRIMARY KEY,
    usd_per_day              numeric(20, 10),
    usd_per_month            numeric(20, 10),
    tokens_per_day           bigint,
    max_running              integer,
    max_queued               integer,
    max_task_cost_usd        numeric(20, 10),
    max_task_tokens          bigint,
    max_task_turns           integer,
    max_task_timeout_seconds integer,
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now()
);
INSERT INTO tenants (name) SELECT DISTINCT tenant FROM tasks ON CONFLICT DO NOTHING;

-- API keys: only a short prefix is stored in clear, for lookup; the key itself as SHA-256.
CREATE TABLE api_keys (
    id         uuid PRIMARY KEY,
    tenant     text        NOT NULL REFERENCES tenants (name),
    prefix     text        NOT NULL UNIQUE,
    key_hash   text        NOT NULL,
    name       text,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

-- Per-task limits and the worst-case cost of the provider call in flight (reserved before
-- the call, settled after; a task that stops holding a lease holds no reservation).
ALTER TABLE tasks
    ADD COLUMN max_cost_usd    numeric(20, 10),
    ADD COLUMN max_tokens      bigint,
    ADD COLUMN reserved_usd    numeric(20, 10) NOT NULL DEFAULT 0,
    ADD COLUMN reserved_tokens bigint          NOT NULL DEFAULT 0;

CREATE INDEX tasks_tenant_queued_idx ON tasks (tenant, id) WHERE status = 'queued';
CREATE INDEX tasks_tenant_running_idx ON tasks (tenant) WHERE status = 'running';

-- Daily usage rollup, maintained with every ledger row (same statement): dashboards and
-- spend budgets read it, never the ledger.
CREATE TABLE usage_daily (
    day           date            NOT NULL,
    tenant        text            NOT NULL,
    model         text            NOT NULL,
    agent_type    text            NOT NULL,
    calls         bigint          NOT NULL DEFAULT 0,
    ok            bigint          NOT NULL DEFAULT 0,
    failed        bigint          NOT NULL DEFAULT 0,
    input_tokens  bigint          NOT NULL DEFAULT 0,
    output_tokens bigint          NOT NULL DEFAULT 0,
    cached_tokens bigint          NOT NULL DEFAULT 0,
    cost_usd      numeric(20, 10) NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, day, model, agent_type)
);
INSERT INTO usage_daily (day, tenant, model, agent_type, calls, ok, failed, input_tokens, output_tokens, cached_tokens, cost_usd)
SELECT (c.created_at AT TIME ZONE 'UTC')::date, c.tenant, c.provider || '/' || c.model, t.subagent_type, count(*),
       count(*) FILTER (WHERE c.outcome = 'ok'), count(*) FILTER (WHERE c.outcome <> 'ok'),
       sum(c.input_tokens), sum(c.output_tokens), sum(c.cached_tokens), coalesce(sum(c.cost_usd), 0)
FROM llm_calls c JOIN tasks t ON t.id = c.task_id GROUP BY 1, 2, 3, 4;

CREATE VIEW v_usage_daily AS
SELECT day, tenant, model, agent_type, calls, ok, failed, input_tokens, output_tokens, cached_tokens,
       input_tokens + output_tokens AS total_tokens, cost_usd
FROM usage_daily;

CREATE VIEW v_task_outcomes AS
SELECT (finished_at AT TIME ZONE 'UTC')::date AS day, tenant, status, coalesce(stop_reason, error_code, '') AS reason,
       count(*) AS tasks
FROM tasks WHERE finished_at IS NOT NULL
GROUP BY 1, 2, 3, 4;

CREATE VIEW v_task_latency AS
SELECT (finished_at AT TIME ZONE 'UTC')::date AS day, tenant, count(*) AS tasks,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000) AS queue_wait_p50_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000) AS queue_wait_p95_ms,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at) * 1000) AS run_p50_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at) * 1000) AS run_p95_ms
FROM tasks WHERE finished_at IS NOT NULL AND started_at IS NOT NULL
GROUP BY 1, 2;

-- Reserve the worst-case cost of one provider call against the task's and the tenant's
-- limits, atomically, and append the call's start event. A tenant with spend limits is locked
-- (its row) while its spend is checked, so concurrent runs of one tenant (on any replica)
-- reserve one at a time; a tenant without them takes no lock. Returns 'ok', 'lease_lost', or
-- the name of the limit that refused the call.
CREATE FUNCTION budget_reserve(p_task uuid, p_lease uuid, p_usd numeric, p_tokens bigint,
                               d_usd_day numeric, d_usd_month numeric, d_tokens_day bigint, p_event jsonb)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    t record;
    l record;
    today date := (now() AT TIME ZONE 'UTC')::date;
    spent_day numeric;
    spent_month numeric;
    tokens_day bigint;
    held_usd numeric;
    held_tokens bigint;
    s integer;
BEGIN
    SELECT id, tenant, cost_usd, reserved_usd, input_tokens, output_tokens, reserved_tokens, max_cost_usd, max_tokens
      INTO t FROM tasks WHERE id = p_task AND lease_token = p_lease AND status = 'running';
    IF NOT FOUND THEN RETURN 'lease_lost'; END IF;
    IF t.max_cost_usd IS NOT NULL AND t.cost_usd + t.reserved_usd + p_usd > t.max_cost_usd THEN
        RETURN 'max_cost_usd';
    END IF;
    IF t.max_tokens IS NOT NULL AND t.input_tokens + t.output_tokens + t.reserved_tokens + p_tokens > t.max_tokens THEN
        RETURN 'max_tokens';
    END IF;
    SELECT coalesce(usd_per_day, d_usd_day) AS usd_day, coalesce(usd_per_month, d_usd_month) AS usd_month,
           coalesce(tokens_per_day, d_tokens_day) AS tok_day
      INTO l FROM tenants WHERE name = t.tenant;
    IF FOUND AND (l.usd_day IS NOT NULL OR l.usd_month IS NOT NULL OR l.tok_day IS NOT NULL) THEN
        PERFORM 1 FROM tenants WHERE name = t.tenant FOR UPDATE;
        SELECT coalesce(sum(cost_usd) FILTER (WHERE day = today), 0), coalesce(sum(cost_usd), 0),
               coalesce(sum(input_tokens + output_tokens) FILTER (WHERE day = today), 0)
          INTO spent_day, spent_month, tokens_day
          FROM usage_daily WHERE tenant = t.tenant AND day >= date_trunc('month', today)::date;
        SELECT coalesce(sum(reserved_usd), 0), coalesce(sum(reserved_tokens), 0) INTO held_usd, held_tokens
          FROM tasks WHERE tenant = t.tenant AND status = 'running';
        IF l.usd_day IS NOT NULL AND spent_day + held_usd + p_usd > l.usd_day THEN RETURN 'usd_per_day'; END IF;
        IF l.usd_month IS NOT NULL AND spent_month + held_usd + p_usd > l.usd_month THEN RETURN 'usd_per_month'; END IF;
        IF l.tok_day IS NOT NULL AND tokens_day + held_tokens + p_tokens > l.tok_day THEN RETURN 'tokens_per_day'; END IF;
    END IF;
    UPDATE tasks SET reserved_usd = reserved_usd + p_usd, reserved_tokens = reserved_tokens + p_tokens,
                     last_event_seq = last_event_seq + (p_event IS NOT NULL)::int
     WHERE id = p_task AND lease_token = p_lease AND status = 'running' RETURNING last_event_seq INTO s;
    -- Fenced again: the lease may have changed hands while this waited for the tenant lock.
    IF NOT FOUND THEN RETURN 'lease_lost'; END IF;
    IF p_event IS NOT NULL THEN
        INSERT INTO task_events (task_id, seq, kind, data) VALUES (p_task, s, 'llm_call_started', p_event);
    END IF;
    RETURN 'ok';
END $$;
