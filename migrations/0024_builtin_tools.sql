-- Built-in tools (issue 43): a tenant's switches and settings for them, and the per-minute count
-- of its web fetches (one row per tenant per minute, across replicas; old minutes are deleted by
-- retention).
ALTER TABLE tenants
    ADD COLUMN builtin_tools_off      text[],
    ADD COLUMN web_tools_policy       text CHECK (web_tools_policy IN ('auto', 'propose')),
    ADD COLUMN web_fetches_per_minute integer CHECK (web_fetches_per_minute >= 0),
    ADD COLUMN web_fetch_domains      text[];

CREATE TABLE web_fetch_minutes (
    tenant text        NOT NULL,
    minute timestamptz NOT NULL,
    n      integer     NOT NULL,
    PRIMARY KEY (tenant, minute)
);

-- Searches a provider ran on its side in a call (Anthropic's server-side web search), billed per
-- search on the call's ledger row.
ALTER TABLE llm_calls ADD COLUMN web_searches integer NOT NULL DEFAULT 0;
