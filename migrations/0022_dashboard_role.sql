-- A read-only role for dashboards (Grafana over the usage views): SELECT on the views they read,
-- nothing else (not the conversations, not the keys; no writes). Log in as a member of it, e.g.
--   CREATE ROLE grafana LOGIN PASSWORD '…' IN ROLE subagentd_dashboards;
-- The role is made here when it does not exist and the migrating user may create roles; else a
-- notice says so, and an operator creates it and grants SELECT on these three views by hand.
-- A later migration that recreates one of these views grants it again.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'subagentd_dashboards')
       AND (SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        BEGIN
            CREATE ROLE subagentd_dashboards NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL; -- another database of this cluster migrating at the same moment made it
        END;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'subagentd_dashboards') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO subagentd_dashboards', current_schema());
        GRANT SELECT ON v_usage_daily, v_task_outcomes, v_task_latency TO subagentd_dashboards;
    ELSE
        RAISE NOTICE 'role subagentd_dashboards not created (no CREATEROLE): dashboards need a read-only role of their own';
    END IF;
END
$$;
