-- The messages a statement writes for one task, in one row (#47), as migration 0033 did for the
-- events. A turn's checkpoint writes the messages since the last (the first: the system prompt,
-- the task, the model's answer and its tools' results; then one or two a turn), and a row each
-- cost a heap tuple header, the task's id, seq, turn and time again, and an entry in the primary
-- key. A row now holds the statement's last message in `seq` and `message`, as before, and the
-- ones before it, oldest first, in `earlier` as a JSON array: they have the seqs just below the
-- row's (`seq - n` to `seq - 1` for n of them), and the row's turn. A row with one message has no
-- `earlier`, exactly the rows written before this migration, which stay as they are. A row of
-- several is also more often over PostgreSQL's 2 kB threshold, past which it is compressed.
--
-- Adding a column without a default changes only the catalog: instant, on every partition.
ALTER TABLE task_messages ADD COLUMN earlier jsonb;

DO $$
BEGIN
    ALTER TABLE task_messages ALTER COLUMN earlier SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 is not available: earlier messages keep pglz';
END $$;

-- One row per message, in the shape `task_messages` had: the conversation as the service reads
-- it, and for operators. `row_seq` is the stored row's `seq`, the last of its messages.
CREATE VIEW task_message_log AS
SELECT m.task_id, x.seq, m.turn, x.message, m.created_at, m.seq AS row_seq
FROM task_messages m
CROSS JOIN LATERAL (
    SELECT m.seq - jsonb_array_length(m.earlier) - 1 + a.n::int AS seq, a.message
    FROM jsonb_array_elements(m.earlier) WITH ORDINALITY AS a(message, n)
    UNION ALL
    SELECT m.seq, m.message
) x;
