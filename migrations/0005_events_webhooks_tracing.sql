-- W3C trace context of the request that created the task.
ALTER TABLE tasks ADD COLUMN traceparent text;

-- Completion webhooks: delivered by worker processes, retried with backoff.
ALTER TABLE tasks
    ADD COLUMN webhook_url          text,
    ADD COLUMN webhook_status       text CHECK (webhook_status IN ('pending', 'delivered', 'failed')),
    ADD COLUMN webhook_attempts     integer NOT NULL DEFAULT 0,
    ADD COLUMN webhook_next_at      timestamptz,
    ADD COLUMN webhook_last_error   text,
    ADD COLUMN webhook_delivered_at timestamptz;
CREATE INDEX tasks_webhook_due_idx ON tasks (webhook_next_at) WHERE webhook_status = 'pending';
