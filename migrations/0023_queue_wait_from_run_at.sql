-- A scheduled task queues at its start time (run_at), not at its creation: the dashboards' queue
-- wait counts from the later of the two, as the API's `queue_ms` and the queue-wait histogram
-- do. CREATE OR REPLACE keeps the view's grants (the dashboards role's SELECT, migration 0022).
CREATE OR REPLACE VIEW v_task_latency AS
SELECT (finished_at AT TIME ZONE 'UTC')::date AS day, tenant, count(*) AS tasks,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - greatest(created_at, coalesce(run_at, created_at))) * 1000) AS queue_wait_p50_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - greatest(created_at, coalesce(run_at, created_at))) * 1000) AS queue_wait_p95_ms,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at) * 1000) AS run_p50_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at) * 1000) AS run_p95_ms
FROM tasks WHERE finished_at IS NOT NULL AND started_at IS NOT NULL
GROUP BY 1, 2;
