-- Workspaces (issue 44): a tenant's uploaded workspaces (the clean archive itself, so that any
-- replica can unpack it), its write-only secrets (a private repository's token), the version a
-- task read (a commit, or an upload's content hash), and whether a private workspace's task may
-- also have the web tools.
CREATE TABLE workspaces (
    tenant        text        NOT NULL,
    name          text        NOT NULL,
    content_hash  text        NOT NULL,
    files         bigint      NOT NULL,
    size_bytes    bigint      NOT NULL,
    archive_bytes bigint      NOT NULL,
    archive       bytea       NOT NULL,
    dropped       jsonb       NOT NULL DEFAULT '[]',
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name)
);
-- Already compressed: stored out of line as it is, not compressed again.
ALTER TABLE workspaces ALTER COLUMN archive SET STORAGE EXTERNAL;

CREATE TABLE secrets (
    tenant     text        NOT NULL,
    name       text        NOT NULL,
    value      text        NOT NULL,
    -- The only host the value is ever sent to (a repository URL's host must be it).
    host       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name)
);

ALTER TABLE tasks ADD COLUMN workspace_version text;

ALTER TABLE tenants ADD COLUMN private_workspace_web text
    CHECK (private_workspace_web IN ('never', 'task', 'always'));
