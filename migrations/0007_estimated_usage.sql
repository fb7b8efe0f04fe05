-- Calls whose usage is an estimate: their answer never came (a cancel, a drain, a time limit,
-- a crash dropped the connection while the provider may already have billed them), or the
-- provider reported none. Counted on the row, the task and the daily rollup.
ALTER TABLE llm_calls ADD COLUMN usage_estimated boolean NOT NULL DEFAULT false;
ALTER TABLE tasks ADD COLUMN estimated_calls integer NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN estimated_calls bigint NOT NULL DEFAULT 0;

DROP VIEW v_usage_daily;
CREATE VIEW v_usage_daily AS
SELECT day, tenant, model, agent_type, sum(calls)::bigint AS calls, sum(ok)::bigint AS ok,
       sum(failed)::bigint AS failed, sum(input_tokens)::bigint AS input_tokens,
       sum(output_tokens)::bigint AS output_tokens, sum(cached_tokens)::bigint AS cached_tokens,
       sum(input_tokens + output_tokens)::bigint AS total_tokens, sum(cost_usd)::numeric(20, 10) AS cost_usd,
       sum(estimated_calls)::bigint AS estimated_calls
FROM usage_daily
GROUP BY day, tenant, model, agent_type;
