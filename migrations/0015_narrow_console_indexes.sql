-- The console's list indexes (0009) cost every task, not just the console: a task's status
-- changes two or three times, each change is a non-HOT update, and each one writes a new entry
-- into every index of the table. Together with the metadata index they took about 0.6 ms of
-- PostgreSQL time per task (BENCHMARKS.md). Narrowed to the rows that need them:
-- - status filters: the rare end states, and `requires_action` across tenants. A completed task
--   (the common case) is found through (tenant, id) or the primary key, filtered; queued and
--   running tasks through their own partial indexes (0001, 0004, 0010). The list query names
--   its status as a literal, so the planner can use these.
-- - metadata containment: only tasks that have metadata. The list query says
--   `metadata <> '{}'` with a non-empty filter, which every match satisfies anyway.
-- - model: dropped. It alone cost about 0.25 ms per task (every task's versions went into it);
--   a tenant's tasks of one model are found by walking (tenant, id) newest first.
DROP INDEX tasks_tenant_model_id_idx;
DROP INDEX tasks_tenant_status_id_idx;
DROP INDEX tasks_status_id_idx;
DROP INDEX tasks_metadata_idx;
CREATE INDEX tasks_tenant_status_id_idx ON tasks (tenant, status, id)
    WHERE status IN ('incomplete', 'failed', 'cancelled');
CREATE INDEX tasks_status_id_idx ON tasks (status, id)
    WHERE status IN ('requires_action', 'incomplete', 'failed', 'cancelled');
CREATE INDEX tasks_metadata_idx ON tasks USING gin (metadata jsonb_path_ops) WHERE metadata <> '{}'::jsonb;
