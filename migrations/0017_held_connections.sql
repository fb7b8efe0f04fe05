-- Per-tenant caps on held connections, counted by each replica on its own: open event streams
-- and waiting requests (NULL: the configured default; 0: none allowed).
ALTER TABLE tenants ADD COLUMN max_streams integer CHECK (max_streams >= 0),
                    ADD COLUMN max_waits integer CHECK (max_waits >= 0);
