-- What each tenant's kept changes and diffs hold (issue 62): the bytes of `task_diffs`' `changes`
-- (what each checkpoint keeps of a task's copy) and `diff`, by tenant, kept in step by every
-- write of a diff (`store::diffs`) and by retention's drop of a day (`store::partitions`). The
-- quota (`SUBAGENTD_TENANT_STORAGE_MB`) is checked against it before a tool changes a copy.
CREATE TABLE tenant_storage (
    tenant     text   PRIMARY KEY,
    kept_bytes bigint NOT NULL DEFAULT 0
);

INSERT INTO tenant_storage (tenant, kept_bytes)
SELECT tenant, sum(coalesce(octet_length(changes), 0) + coalesce(octet_length(diff), 0))
FROM task_diffs
GROUP BY tenant;
