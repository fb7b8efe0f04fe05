-- A task's events and conversation are history partitioned by day (#47). Each row is keyed by
-- the time it was written (`created_at`, the writing transaction's now()), never the task's
-- creation time, so that a task scheduled far ahead never writes into a partition retention has
-- dropped. Retention then drops whole partitions past `--retention-days` (DETACH CONCURRENTLY,
-- then DROP) instead of deleting rows. Daily, not hourly: the soak wrote about 4 KiB of events
-- and messages per task, 86 GB a day at 250 tasks/s, and 30 days of daily partitions keep
-- planning cheap (a task's read probes each partition's primary key; hourly would be 720).
--
-- The primary key must hold the partition key, so it is (task_id, seq, created_at). (task_id,
-- seq) is still unique: seq comes from the task row's own counters (last_event_seq, and the
-- conversation's max(seq) + k under the task's lease), each taken under the task row's lock.
-- There is no DEFAULT partition: the service creates partitions ahead (subagentd_ensure_partitions,
-- under an advisory lock so one replica at a time), and on demand when an insert finds none.
-- DETACH ... CONCURRENTLY needs PostgreSQL 14 or newer.

-- A day's partition: made as a table of its own, then attached, so that only SHARE UPDATE
-- EXCLUSIVE is taken on the parent (CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE
-- and queue every read and insert behind a long reader). A table of the name not yet attached
-- is attached.
CREATE FUNCTION subagentd_partition(parent text, day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    part text := parent || '_p' || to_char(day, 'YYYYMMDD');
BEGIN
    IF to_regclass(part) IS NOT NULL
       AND EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(part)) THEN
        RETURN false;
    END IF;
    IF to_regclass(part) IS NULL THEN
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING COMPRESSION)', part, parent);
    END IF;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', parent, part,
                   day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
    RETURN true;
END $$;

-- Partitions of every history table from yesterday to `ahead` days from now (UTC); returns the
-- last day covered. One caller at a time (a transaction-scoped advisory lock); a lock it cannot
-- have within a second fails the call (55P03), to be tried again later, rather than queue.
CREATE FUNCTION subagentd_ensure_partitions(ahead integer) RETURNS date
LANGUAGE plpgsql SET lock_timeout = '1s' AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    parent text;
    d date;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('subagentd_partitions'));
    FOREACH parent IN ARRAY ARRAY['task_events', 'task_messages'] LOOP
        FOR d IN SELECT generate_series(today - 1, today + ahead, interval '1 day')::date LOOP
            PERFORM subagentd_partition(parent, d);
        END LOOP;
    END LOOP;
    RETURN today + ahead;
END $$;

ALTER TABLE task_events RENAME TO task_events_old;
ALTER TABLE task_messages RENAME TO task_messages_old;
ALTER TABLE task_events_old RENAME CONSTRAINT task_events_pkey TO task_events_old_pkey;
ALTER TABLE task_messages_old RENAME CONSTRAINT task_messages_pkey TO task_messages_old_pkey;

CREATE TABLE task_events (
    task_id    uuid        NOT NULL,
    seq        integer     NOT NULL,
    kind       text        NOT NULL,
    data       jsonb       NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, seq, created_at)
) PARTITION BY RANGE (created_at);

CREATE TABLE task_messages (
    task_id    uuid        NOT NULL,
    seq        integer     NOT NULL,
    turn       integer     NOT NULL,
    message    jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, seq, created_at)
) PARTITION BY RANGE (created_at);

-- TOAST compression lz4 where the server was built with it (faster than pglz and as small for
-- JSON); partitions take it from their parent.
DO $$
BEGIN
    ALTER TABLE task_events ALTER COLUMN data SET COMPRESSION lz4;
    ALTER TABLE task_messages ALTER COLUMN message SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 is not available: history keeps pglz';
END $$;

-- Partitions for every day the old tables hold, then the copy (about 3 minutes per million tasks'
-- events and messages, 11 and 5 each, on 2 cores; docs/upgrades.md).
DO $$
DECLARE
    first date;
    d date;
BEGIN
    SELECT least((SELECT min(created_at) FROM task_events_old), (SELECT min(created_at) FROM task_messages_old))
           AT TIME ZONE 'UTC' INTO first;
    IF first IS NOT NULL THEN
        FOR d IN SELECT generate_series(first, (now() AT TIME ZONE 'UTC')::date, interval '1 day')::date LOOP
            PERFORM subagentd_partition('task_events', d);
            PERFORM subagentd_partition('task_messages', d);
        END LOOP;
    END IF;
    PERFORM subagentd_ensure_partitions(7);
END $$;

INSERT INTO task_events SELECT task_id, seq, kind, data, created_at FROM task_events_old;
INSERT INTO task_messages SELECT task_id, seq, turn, message, created_at FROM task_messages_old;
DROP TABLE task_events_old;
DROP TABLE task_messages_old;
