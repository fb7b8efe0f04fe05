-- Per-tenant agent definitions (the API's; file definitions live on disk).
CREATE TABLE agent_definitions (
    tenant     text        NOT NULL,
    name       text        NOT NULL,
    definition jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name)
);

-- A task that continues another task's conversation (`resume_from`).
ALTER TABLE tasks ADD COLUMN parent_task_id uuid REFERENCES tasks (id);
CREATE INDEX tasks_parent_idx ON tasks (parent_task_id) WHERE parent_task_id IS NOT NULL;
