-- Named environments (issue 63): a tenant's image with a setup script, built once per
-- (definition, image digest) into a root each replica keeps in its image cache. The row holds the
-- definition and what its latest build said: `building`, `ready` or `failed`, with the setup's
-- exit code and the tail of its output.
CREATE TABLE environments (
    tenant text NOT NULL,
    name text NOT NULL,
    image text NOT NULL,
    setup text NOT NULL DEFAULT '',
    -- Hosts (and CIDRs) its setup, and with `network_in_runs` its tasks' commands, may reach
    -- through the egress proxy.
    network_allow text[] NOT NULL DEFAULT '{}',
    network_in_runs boolean NOT NULL DEFAULT false,
    -- sha256 of the definition (image, setup and network), so that a changed one is built anew.
    definition_hash text NOT NULL,
    status text NOT NULL DEFAULT 'building' CHECK (status IN ('building', 'ready', 'failed')),
    -- The image's manifest digest the build ran on, once resolved.
    digest text,
    exit_code integer,
    output_tail text,
    -- The built root's bytes, unpacked.
    size_bytes bigint,
    built_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name)
);
