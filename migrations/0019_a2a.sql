-- The A2A door (`/a2a`): a task's A2A context and the caller's messages, and the push
-- notification configs of a task, delivered by the webhook sender.

-- A task started at the A2A door: its `contextId` (a conversation: a message with only a
-- contextId continues the context's latest task) and the caller's messages (its history).
-- Written before the task (the submission's id is known first), so a crash between the two
-- leaves a row with no task, never a task without its context; retention removes such rows.
CREATE TABLE a2a_tasks (
    task_id    uuid        PRIMARY KEY,
    tenant     text        NOT NULL,
    context_id text        NOT NULL,
    messages   jsonb       NOT NULL DEFAULT '[]',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX a2a_tasks_context_idx ON a2a_tasks (tenant, context_id, task_id DESC);

-- Push notification configs (several per task): where, with which token and credentials.
CREATE TABLE a2a_push_configs (
    task_id          uuid        NOT NULL,
    id               text        NOT NULL,
    tenant           text        NOT NULL,
    url              text        NOT NULL,
    token            text,
    auth_scheme      text,
    auth_credentials text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, id)
);

-- A delivery is to the task's webhook (`push_config` empty) or to one of its push configs.
ALTER TABLE webhook_deliveries ADD COLUMN push_config text NOT NULL DEFAULT '';
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_task_id_event_seq_key;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_target_key UNIQUE (task_id, event, seq, push_config);
