-- Worker presence: each worker process registers the database session it holds open while it
-- lives. A running task whose worker's session is gone is rescued at once, not when its lease
-- runs out (a stalled but connected worker still keeps its lease until it expires).
CREATE TABLE workers (
    id            text        PRIMARY KEY,
    backend_pid   integer     NOT NULL,
    backend_start timestamptz NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tasks_running_worker_idx ON tasks (worker_id) WHERE status = 'running';
