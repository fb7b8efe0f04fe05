-- Named environments (issue 63): the layer a setup made (its root's differences from the image's,
-- a gzip tar with whiteouts), kept once for every replica: a replica without the build in its
-- cache applies the layer over the image instead of running the setup again. Written whole in one
-- transaction (the row and its chunks), so a killed build leaves none; removed with the
-- environment, and when its definition changes.
CREATE TABLE environment_layers (
    key text PRIMARY KEY,
    tenant text NOT NULL,
    name text NOT NULL,
    definition_hash text NOT NULL,
    digest text NOT NULL,
    bytes bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX environment_layers_by_name ON environment_layers (tenant, name);

CREATE TABLE environment_layer_chunks (
    key text NOT NULL REFERENCES environment_layers (key) ON DELETE CASCADE,
    n integer NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (key, n)
);
