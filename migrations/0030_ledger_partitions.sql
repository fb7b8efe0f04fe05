-- The ledger by the day (#47): `llm_calls` is partitioned by `created_at`, and retention drops
-- whole days past `--ledger-retention-days` (DETACH CONCURRENTLY, then DROP) instead of deleting
-- rows. Daily, like the conversations: a task's ledger rows are 2 to 10 of about 300 bytes, so
-- a month at 250 tasks/s is far too much for one partition to drop, and a 400-day window is 400
-- partitions that every statement of the service prunes to one or two (below).
--
-- A row's time is its call's: `created_at` is the time in its `call_key`, a UUIDv7 the worker
-- makes as the call's try ends (`subagentd_uuid_time`), and a CHECK holds every new row to it.
-- That is how the call key stays unique although a unique index must hold the partition key:
-- the index is on (call_key, created_at), and as created_at is a function of call_key, two rows
-- with one key would have one created_at too, which the index refuses. (A retried write of a
-- call is the same key, hence the same partition, where its first write is found.) Rows from
-- before this migration keep their times and keys (NOT VALID: their keys were unique already).
-- A worker's clock sets the day its calls are filed under; NTP's skew is far below a day, and
-- yesterday's and the next 7 days' partitions are always there.
--
-- No foreign key ties a ledger row to its task since 0006, and nothing cascades: task rows are
-- kept for ever and carry their own totals, so a task outlives its dropped ledger days with its
-- usage intact, as it outlived the deleted rows before; the daily rollups (usage_daily) keep the
-- sums the dashboards read.

-- The time in a UUIDv7 (its first 48 bits, milliseconds since the epoch).
CREATE FUNCTION subagentd_uuid_time(u uuid) RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT to_timestamp(('x' || substr(replace(u::text, '-', ''), 1, 12))::bit(48)::bigint / 1000.0)
$$;

-- A UUIDv7 of the time `ts` (to the millisecond), random in the rest: the keys of the ledger rows
-- the database writes itself (a rescued task's interrupted call).
CREATE FUNCTION subagentd_uuidv7(ts timestamptz) RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) PLACING
               substring(int8send(floor(extract(epoch FROM ts) * 1000)::bigint) FROM 3) FROM 1 FOR 6), 52, 1), 53, 1),
           'hex')::uuid
$$;

-- As in 0028, and with the parent's CHECK constraints (the ledger's time rule), which a table
-- must have to be attached.
CREATE OR REPLACE FUNCTION subagentd_partition(parent text, day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    part text := parent || '_p' || to_char(day, 'YYYYMMDD');
BEGIN
    IF to_regclass(part) IS NOT NULL
       AND EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(part)) THEN
        RETURN false;
    END IF;
    IF to_regclass(part) IS NULL THEN
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMPRESSION)',
                       part, parent);
    END IF;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', parent, part,
                   day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
    RETURN true;
END $$;

-- As in 0029, with the ledger's days.
CREATE OR REPLACE FUNCTION subagentd_ensure_partitions(ahead integer) RETURNS date
LANGUAGE plpgsql SET lock_timeout = '1s' AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    parent text;
    d date;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('subagentd_partitions'));
    FOREACH parent IN ARRAY ARRAY['task_events', 'task_messages', 'llm_calls'] LOOP
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

ALTER TABLE llm_calls RENAME TO llm_calls_0029;
ALTER TABLE llm_calls_0029 RENAME CONSTRAINT llm_calls_pkey TO llm_calls_0029_pkey;
DROP INDEX llm_calls_task_idx, llm_calls_call_key_idx, llm_calls_tenant_time_idx;
-- The ids go on from where they were: the sequence outlives the old table.
ALTER SEQUENCE llm_calls_id_seq OWNED BY NONE;

-- No default time: a row's time is its key's, which the writer gives.
CREATE TABLE llm_calls (LIKE llm_calls_0029 INCLUDING DEFAULTS INCLUDING COMPRESSION)
    PARTITION BY RANGE (created_at);
ALTER TABLE llm_calls ALTER COLUMN created_at DROP DEFAULT;
ALTER SEQUENCE llm_calls_id_seq OWNED BY llm_calls.id;

-- A partition for each day the old ledger has rows, then the copy.
DO $$
DECLARE
    d date;
BEGIN
    FOR d IN SELECT DISTINCT (created_at AT TIME ZONE 'UTC')::date FROM llm_calls_0029 LOOP
        PERFORM subagentd_partition('llm_calls', d);
    END LOOP;
    PERFORM subagentd_ensure_partitions(7);
END $$;

INSERT INTO llm_calls SELECT * FROM llm_calls_0029;
DROP TABLE llm_calls_0029;

-- The indexes a partition needs: the key (a retried write finds its first), a task's calls
-- (GET /tasks/{id}/calls), the primary key. The (tenant, created_at) index is gone: nothing in
-- the service reads the ledger by tenant (usage reads the rollups), and a query by time prunes
-- to its days.
ALTER TABLE llm_calls ADD PRIMARY KEY (id, created_at);
CREATE UNIQUE INDEX llm_calls_call_key_idx ON llm_calls (call_key, created_at);
CREATE INDEX llm_calls_task_idx ON llm_calls (task_id, id);
ALTER TABLE llm_calls ADD CONSTRAINT llm_calls_created_at_check
    CHECK (created_at = subagentd_uuid_time(call_key)) NOT VALID;

-- A retried write of a run's turn is known by its task's row, not by a probe of the ledger:
-- each turn's commit sets `last_call_key` to its call's key in the update it fences on, and
-- applies only where it differs. A run commits its turns one after another and retries the last
-- until it knows its outcome, so the last key is the one a retry carries; a retry racing its
-- first try waits for the row and then sees the key. (The ledger's statements then name no
-- partition they cannot prune: a probe over every day, planned generically, locked them all.)
ALTER TABLE tasks ADD COLUMN last_call_key uuid;

ANALYZE llm_calls;
