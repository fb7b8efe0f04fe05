-- Run once by the postgres image when its data directory is created (docker-compose.yml mounts
-- this into /docker-entrypoint-initdb.d). Grafana logs in as `grafana`, a member of
-- `subagentd_dashboards`: the service's migrations grant that role SELECT on the usage views
-- and nothing else, so a dashboard can neither read the conversations nor write or drop.
CREATE ROLE subagentd_dashboards NOLOGIN;
CREATE ROLE grafana LOGIN PASSWORD 'grafana' IN ROLE subagentd_dashboards;
