-- A run's system prompt, stored once (#47). The first checkpoint of every run writes the
-- conversation's system message, and the tasks of one agent type (or one definition) share it:
-- in the soak it was 881 of a task's 1,460 bytes of conversation, written again for each task.
-- The service now writes a system message as `{"role": "system", "text_sha256": "<hex>"}` and its
-- text once here, keyed by the SHA-256 of its UTF-8 bytes (inserted by the same statement, `ON
-- CONFLICT DO NOTHING`: a text already here costs an index probe and no WAL). The view below puts
-- the text back (`task_message_log`), so every reader sees the message as it was sent.
--
-- Kept for ever, like the task rows: a system message is made only from its task's `options`
-- (the request's or the definition's prompt, the parent's context, the output schema's
-- instructions; kept with the task row for ever) and the service's own prompts for the built-in
-- types, so this table keeps no caller text longer than the task row does. A text is never
-- deleted while a message may name it; conversations past `--retention-days` drop their rows, not
-- the texts they named.
--
-- Rows written before this migration keep their text inline and read as before.
CREATE TABLE message_texts (
    hash    bytea PRIMARY KEY CHECK (octet_length(hash) = 32),
    content text  NOT NULL
);

DO $$
BEGIN
    ALTER TABLE message_texts ALTER COLUMN content SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 is not available: message texts keep pglz';
END $$;

-- One row per message, as migration 0034 made it, with a stored text put back where a message
-- names it: every reader sees the message as it was sent.
CREATE OR REPLACE VIEW task_message_log AS
SELECT m.task_id, x.seq, m.turn,
       CASE WHEN x.message ? 'text_sha256'
           THEN (x.message - 'text_sha256') || jsonb_build_object('content',
               (SELECT t.content FROM message_texts t WHERE t.hash = decode(x.message->>'text_sha256', 'hex')))
           ELSE x.message END AS message,
       m.created_at, m.seq AS row_seq
FROM task_messages m
CROSS JOIN LATERAL (
    SELECT m.seq - jsonb_array_length(m.earlier) - 1 + a.n::int AS seq, a.message
    FROM jsonb_array_elements(m.earlier) WITH ORDINALITY AS a(message, n)
    UNION ALL
    SELECT m.seq, m.message
) x;
