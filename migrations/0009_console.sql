-- The ops console: who submitted a task (the API key, as a rollup dimension: the ledger is purged
-- after its retention and cannot be re-aggregated later), console sessions, and the indexes the
-- console's reads need on large tables.

-- The key a task was submitted with (its public prefix; NULL: single-user mode or an admin).
ALTER TABLE tasks ADD COLUMN api_key text;

ALTER TABLE usage_daily ADD COLUMN api_key text NOT NULL DEFAULT '';
ALTER TABLE usage_daily DROP CONSTRAINT usage_daily_pkey;
ALTER TABLE usage_daily ADD PRIMARY KEY (tenant, day, model, agent_type, api_key, shard);
-- Every tenant's rollup for a day or a month (the overview, admin usage).
CREATE INDEX usage_daily_day_idx ON usage_daily (day);

DROP VIEW v_usage_daily;
CREATE VIEW v_usage_daily AS
SELECT day, tenant, model, agent_type, api_key, sum(calls)::bigint AS calls, sum(ok)::bigint AS ok,
       sum(failed)::bigint AS failed, sum(input_tokens)::bigint AS input_tokens,
       sum(output_tokens)::bigint AS output_tokens, sum(cached_tokens)::bigint AS cached_tokens,
       sum(input_tokens + output_tokens)::bigint AS total_tokens, sum(cost_usd)::numeric(20, 10) AS cost_usd,
       sum(estimated_calls)::bigint AS estimated_calls
FROM usage_daily
GROUP BY day, tenant, model, agent_type, api_key;

-- A browser's session: an API key or the admin token exchanged once for a cookie. Only the
-- hash of the cookie's value is stored; writes also need the CSRF token.
CREATE TABLE console_sessions (
    id_hash    text PRIMARY KEY,
    tenant     text,                 -- NULL for the admin (every tenant)
    admin      boolean     NOT NULL DEFAULT false,
    csrf       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX console_sessions_expiry_idx ON console_sessions (expires_at);

-- The task list's filters, newest first, on a table of millions: by status (a tenant's, or every
-- tenant's for the admin), and by model. The metadata filter (containment) uses a GIN index.
CREATE INDEX tasks_tenant_status_id_idx ON tasks (tenant, status, id);
CREATE INDEX tasks_status_id_idx ON tasks (status, id);
CREATE INDEX tasks_tenant_model_id_idx ON tasks (tenant, model, id);
CREATE INDEX tasks_metadata_idx ON tasks USING gin (metadata jsonb_path_ops);
