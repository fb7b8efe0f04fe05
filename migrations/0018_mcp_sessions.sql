-- MCP sessions (the `/mcp` door): kept here so that any replica serves any request of a session.
CREATE TABLE mcp_sessions (
    id                  text        PRIMARY KEY,      -- the Mcp-Session-Id given to the client
    tenant              text        NOT NULL,
    protocol_version    text        NOT NULL,         -- as negotiated at initialize
    client_capabilities jsonb       NOT NULL DEFAULT '{}',
    client_info         jsonb       NOT NULL DEFAULT '{}',
    created_at          timestamptz NOT NULL DEFAULT now(),
    last_seen_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX mcp_sessions_seen_idx ON mcp_sessions (last_seen_at);
