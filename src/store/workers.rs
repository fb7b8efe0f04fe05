//! `workers`: the database session each worker process holds open while it lives, so that the
//! rescuer can tell a dead process (its session gone) from a slow one (its lease still running).

use sqlx::PgConnection;

use super::StoreError;

/// Register `worker` as living on `conn`'s session (again, after a reconnect).
pub async fn register(conn: &mut PgConnection, worker: &str) -> Result<(), StoreError> {
    sqlx::query!(
        "INSERT INTO workers (id, backend_pid, backend_start)
         SELECT $1, pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()
         ON CONFLICT (id) DO UPDATE SET backend_pid = EXCLUDED.backend_pid, backend_start = EXCLUDED.backend_start,
             registered_at = now()",
        worker
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Is the session still there? (A cheap round trip that fails once it is gone.)
pub async fn ping(conn: &mut PgConnection) -> Result<(), StoreError> {
    sqlx::query_scalar!("SELECT 1 AS one").fetch_one(conn).await?;
    Ok(())
}

/// A worker that stops cleanly leaves (its runs are released by then).
pub async fn unregister(conn: &mut PgConnection, worker: &str) -> Result<(), StoreError> {
    sqlx::query!("DELETE FROM workers WHERE id = $1", worker).execute(conn).await?;
    Ok(())
}

/// Forget dead workers (`subagentd_dead_workers`, migration 0039) that no running task names
/// any more.
pub async fn forget_dead(pool: &sqlx::PgPool, grace_secs: f64) -> Result<u64, StoreError> {
    Ok(sqlx::query!(
        "DELETE FROM workers WHERE id IN (SELECT subagentd_dead_workers($1)) AND NOT EXISTS
             (SELECT 1 FROM task_queue t WHERE t.worker_id = workers.id AND t.status = 'running')",
        grace_secs
    )
    .execute(pool)
    .await?
    .rows_affected())
}
