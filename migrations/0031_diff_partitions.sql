-- The stored diffs by the day (#47): `task_diffs` is partitioned by `updated_at`, the time of a
-- row's last write, and retention drops whole days past `--retention-days` (DETACH
-- CONCURRENTLY, then DROP) instead of deleting the diffs of tasks finished that long ago, row by
-- row, as it did. A diff is written at each checkpoint of a run with a writable copy and last
-- at the run's end, so a finished task's diff lies in the partition of its last write's day (its
-- end's, unless it ended outside a run: cancelled while paused, failed by the rescuer), and an
-- open task's moves to today's with each write (an update of the partition key).
--
-- The primary key must hold the partition key: it is (task_id, updated_at). A task still has one
-- row: its writes lock the task's row first (FOR UPDATE, fenced on the lease) and then update the
-- diff, or insert it if the task has none, in a later statement that sees what the last holder
-- of the lock wrote (`store::diffs`); retention's move of an open task's row updates it in place.
-- No foreign key to `tasks` (dropped in 0029: its key holds `history_at`).

-- As in 0030, with the diffs' days.
CREATE OR REPLACE FUNCTION subagentd_ensure_partitions(ahead integer) RETURNS date
LANGUAGE plpgsql SET lock_timeout = '1s' AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    parent text;
    d date;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('subagentd_partitions'));
    FOREACH parent IN ARRAY ARRAY['task_events', 'task_messages', 'task_diffs', 'llm_calls'] LOOP
        FOR d IN SELECT generate_series(today - 1, today + ahead, interval '1 day')::date LOOP
            PERFORM subagentd_partition(parent, d);
        END LOOP;
    END LOOP;
    FOR d IN SELECT DISTINCT date_trunc('month', g)::date
             FROM generate_series(today - 1, today + ahead, interval '1 day') g LOOP
        PERFORM subagentd_month_partition('tasks', d);
    END LOOP;
    RETURN today + ahead;
END $$;

ALTER TABLE task_diffs RENAME TO task_diffs_0030;
ALTER TABLE task_diffs_0030 RENAME CONSTRAINT task_diffs_pkey TO task_diffs_0030_pkey;

CREATE TABLE task_diffs (LIKE task_diffs_0030 INCLUDING DEFAULTS INCLUDING COMPRESSION)
    PARTITION BY RANGE (updated_at);

-- A partition for each day the old table has rows, then the copy.
DO $$
DECLARE
    d date;
BEGIN
    FOR d IN SELECT DISTINCT (updated_at AT TIME ZONE 'UTC')::date FROM task_diffs_0030 LOOP
        PERFORM subagentd_partition('task_diffs', d);
    END LOOP;
    PERFORM subagentd_ensure_partitions(7);
END $$;

INSERT INTO task_diffs SELECT * FROM task_diffs_0030;
DROP TABLE task_diffs_0030;

ALTER TABLE task_diffs ADD PRIMARY KEY (task_id, updated_at);

ANALYZE task_diffs;
