-- Environments (issue 63): the manifest digest a task's image resolved to at its first run, so
-- that every later attempt (another replica, a rescue, a resume) runs in the same image.
ALTER TABLE tasks ADD COLUMN environment_digest text;

-- The view every task read goes through, with the digest (appended: CREATE OR REPLACE keeps the
-- columns before it).
CREATE OR REPLACE VIEW task_rows AS
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
       t.workspace_version, t.diff_stats, t.environment_digest
FROM tasks t;
