-- Prompt tokens written to a provider's cache (Anthropic bills them above the input rate): part
-- of input_tokens, like cache reads (cached_tokens), and counted on their own so that cost_usd
-- can be checked against them.
ALTER TABLE llm_calls ADD COLUMN cache_write_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN cache_write_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN cache_write_tokens bigint NOT NULL DEFAULT 0;

DROP VIEW v_usage_daily;
CREATE VIEW v_usage_daily AS
SELECT day, tenant, model, agent_type, api_key, sum(calls)::bigint AS calls, sum(ok)::bigint AS ok,
       sum(failed)::bigint AS failed, sum(input_tokens)::bigint AS input_tokens,
       sum(output_tokens)::bigint AS output_tokens, sum(cached_tokens)::bigint AS cached_tokens,
       sum(cache_write_tokens)::bigint AS cache_write_tokens,
       sum(input_tokens + output_tokens)::bigint AS total_tokens, sum(cost_usd)::numeric(20, 10) AS cost_usd,
       sum(estimated_calls)::bigint AS estimated_calls
FROM usage_daily
GROUP BY day, tenant, model, agent_type, api_key;
