-- A task's options, stored once for every task that has the same (#47). `tasks.options` (the
-- task's tools frozen at submission, its turn limit, approval, fallbacks…) was 384 of a task
-- row's 720 bytes in the soak, the same for every task of an agent type, and a task row is
-- written whole three times: into the queue, at the claim (an update that is not HOT), and into
-- its month at the end. The service now writes a task's options once here, keyed by the SHA-256 of
-- their `jsonb` text (the statement that inserts the task inserts them, `ON CONFLICT DO NOTHING`:
-- options already here cost an index probe and no WAL), and the task row names them in
-- `options_sha256`, its `options` NULL. Every read of a task puts them back
-- (`store::tasks::COLS`).
--
-- Kept for ever, like the task rows that name them. Rows written before keep their options inline
-- (`options_sha256` NULL) and read as before.
CREATE TABLE task_options (
    hash    bytea PRIMARY KEY CHECK (octet_length(hash) = 32),
    options jsonb NOT NULL
);

DO $$
BEGIN
    ALTER TABLE task_options ALTER COLUMN options SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 is not available: task options keep pglz';
END $$;

-- Catalog changes only, on every partition: a column without a default, and a NOT NULL dropped.
ALTER TABLE tasks ADD COLUMN options_sha256 bytea;
ALTER TABLE tasks ALTER COLUMN options DROP NOT NULL;
