-- The console's chart of finishes per minute of the last hour, counted as tasks end (#47). The
-- overview counted them from `tasks` on every read: every task finished in the last hour, one
-- heap row each, about 1 µs a row, so its p99 grew with the throughput (100-116 ms with 75,000
-- finishes in the hour at 10M tasks of history; a sustained 1,000 tasks/s would be 3.6M rows).
--
-- A task ends by its row moving out of the queue into a month of history (`history_at` set: an
-- update of the partition key, which PostgreSQL runs as a delete and an insert, firing the
-- destination's AFTER INSERT row triggers), so one trigger on `tasks` counts every end, whichever
-- statement wrote it, and a row inserted straight into history (an import) as well. A finished
-- task whose row is later updated stays in its partition and is not counted again.
--
-- One row per minute, tenant, outcome and writing backend (`pg_backend_pid()`): a backend runs
-- one transaction at a time, so two ends never wait on each other's count, and a transaction
-- ending tasks of several tenants cannot deadlock with another over them. The reader sums the
-- backends. A minute has a row per tenant, outcome and backend that ended tasks in it, whatever
-- their number. Retention deletes the minutes more than two hours old (a rollup, not history;
-- the tasks keep their ends).
CREATE TABLE finished_minutes (
    minute  timestamptz NOT NULL,
    tenant  text        NOT NULL,
    status  text        NOT NULL,
    backend integer     NOT NULL,
    tasks   bigint      NOT NULL,
    PRIMARY KEY (minute, tenant, status, backend)
) WITH (fillfactor = 70);
-- One tenant's hour (the key serves every tenant's).
CREATE INDEX finished_minutes_tenant_idx ON finished_minutes (tenant, minute);

CREATE FUNCTION subagentd_count_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO finished_minutes AS f (minute, tenant, status, backend, tasks)
    VALUES (date_trunc('minute', NEW.finished_at), NEW.tenant, NEW.status, pg_backend_pid(), 1)
    ON CONFLICT (minute, tenant, status, backend) DO UPDATE SET tasks = f.tasks + 1;
    RETURN NULL;
END $$;

-- On the partitioned table: cloned onto every partition, those made later included. The WHEN
-- clause is evaluated without calling the function, so a task entering the queue, or a bulk
-- load of old history, costs no more than the test.
CREATE TRIGGER tasks_count_finish AFTER INSERT ON tasks FOR EACH ROW
    WHEN (NEW.history_at <> 'infinity' AND NEW.finished_at > now() - interval '1 hour')
    EXECUTE FUNCTION subagentd_count_finish();

-- The last hour's finishes of a database from the release before.
INSERT INTO finished_minutes (minute, tenant, status, backend, tasks)
SELECT date_trunc('minute', finished_at), tenant, status, 0, count(*) FROM tasks
WHERE finished_at > now() - interval '1 hour' AND history_at > now() - interval '1 hour'
  AND history_at <> 'infinity'
GROUP BY 1, 2, 3;
