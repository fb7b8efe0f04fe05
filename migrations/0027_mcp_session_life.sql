-- MCP sessions live as long as a client keeps them (#46). A session its client ended (DELETE)
-- is kept as ended, so that a later request naming it is answered 404 as the spec says; one
-- the service no longer knows (purged after SUBAGENTD_MCP_SESSION_IDLE_DAYS idle) is adopted
-- afresh instead. The purge reads mcp_sessions_seen_idx.
ALTER TABLE mcp_sessions ADD COLUMN ended_at timestamptz;

-- The door's calls still in flight (held for their answer), by session: ending a session cancels
-- their tasks. `request_key` is the task's idempotency key (`mcp:<session>:<request id>`), found
-- through the tasks' own unique index; a row goes when its call answers. A call started with
-- `run_in_background` (or as an MCP task) has none.
CREATE TABLE mcp_calls (
    session_id  text        NOT NULL,
    request_key text        NOT NULL,
    tenant      text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, request_key)
);
CREATE INDEX mcp_calls_started_idx ON mcp_calls (started_at);
