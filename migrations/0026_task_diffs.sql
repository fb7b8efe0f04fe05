-- A task's changes to its own copy of its workspace (issue 45): what rebuilds the copy on
-- another replica (the changed files, the deleted paths), saved with each turn's checkpoint,
-- and at the end the unified diff against the starting tree. One row per task with a
-- writable copy; purged with the conversations (`--retention-days`).
CREATE TABLE task_diffs (
    task_id    uuid        PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
    tenant     text        NOT NULL,
    -- tar.gz of the changed and new files and links (not what .gitignore ignores).
    changes    bytea,
    deleted    text[]      NOT NULL DEFAULT '{}',
    -- The final diff (text/x-diff) and its counts; NULL until the run ends.
    diff       text,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The diff's counts, shown with the task ({files_changed, lines_added, lines_removed, ...}).
ALTER TABLE tasks ADD COLUMN diff_stats jsonb;
