-- The events a statement writes for one task, in one row (#47). A turn's checkpoint writes two or
-- three events at once (`llm_call_finished`, `tool_calls_started`; `tool_call_finished`,
-- `checkpoint`; `llm_call_finished`, `checkpoint`, `finished`), and a row each cost a heap tuple
-- header, the task's id, seq and time again, and an entry in the primary key: about 175 bytes of
-- WAL and 100 of table a row. A row now holds the statement's last event in `seq`, `kind` and
-- `data`, as before, and the ones before it, oldest first, in `earlier` as `[[kind, data], ...]`:
-- they have the seqs just below the row's (`seq - n` to `seq - 1` for n of them). A row with
-- one event has no `earlier`, exactly the rows written before this migration, which stay as
-- they are. `earlier` is `json`, the compact text the service writes, not `jsonb`: nothing
-- queries inside it but the view below, and an event's object is a third smaller as text (an
-- `llm_call_finished`, 246 bytes as jsonb, is 168).
--
-- Adding a column without a default changes only the catalog: instant, on every partition.
ALTER TABLE task_events ADD COLUMN earlier json;

DO $$
BEGIN
    ALTER TABLE task_events ALTER COLUMN earlier SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 is not available: earlier events keep pglz';
END $$;

-- One row per event, in the shape `task_events` had: for operators and for reads that want every
-- event of a task by kind. `row_seq` is the stored row's `seq`, the last of its events: a read
-- of the events after some seq bounds it too, so the primary key finds the rows.
CREATE VIEW task_event_log AS
SELECT e.task_id, x.seq, x.kind, x.data, e.created_at, e.seq AS row_seq
FROM task_events e
CROSS JOIN LATERAL (
    SELECT e.seq - json_array_length(e.earlier) - 1 + a.n::int AS seq, a.p->>0 AS kind, (a.p->1)::jsonb AS data
    FROM json_array_elements(e.earlier) WITH ORDINALITY AS a(p, n)
    UNION ALL
    SELECT e.seq, e.kind, e.data
) x;
