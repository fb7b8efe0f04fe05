-- The per-tenant tool catalog: HTTP tools that subagentd calls back.
CREATE TABLE tools (
    tenant      text        NOT NULL,
    name        text        NOT NULL,
    description text        NOT NULL DEFAULT '',
    parameters  jsonb       NOT NULL,
    policy      text        NOT NULL CHECK (policy IN ('auto', 'propose')),
    endpoint    text        NOT NULL,
    timeout_ms  integer     NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name)
);

-- MCP servers (Streamable HTTP) as tool sources; their tools are discovered and cached.
CREATE TABLE tool_sources (
    tenant       text        NOT NULL,
    name         text        NOT NULL,
    url          text        NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}',   -- secret: never returned by the API
    tools        jsonb       NOT NULL DEFAULT '[]',   -- the last tools/list, as tool definitions
    refreshed_at timestamptz,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name)
);

-- Per-tenant HMAC secret that signs outbound tool calls and webhooks.
CREATE TABLE tenant_secrets (
    tenant         text PRIMARY KEY,
    signing_secret text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
