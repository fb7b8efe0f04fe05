//! `workers`: the database session each worker process holds open while it lives, so that the
//! rescuer can tell a dead process (its session gone) from a slow one (its lease still running).

use sqlx::PgConnection;

use super::StoreError;

/// Register `worker` as living on `conn`'s session (again, after a reconnect).
pub async fn register(conn: &mut PgConnection, worker: &str) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO workers (id, backend_pid, backend_start)
         SELECT $1, pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()
         ON CONFLICT (id) DO UPDATE SET backend_pid = EXCLUDED.backend_pid, backend_start = EXCLUDED.backend_start,
             registered_at = now()",
    )
    .bind(worker)
    .execute(conn)
    .await?;
    Ok(())
}

/// Is the session still there? (A cheap round trip that fails once it is gone.)
pub async fn ping(conn: &mut PgConnection) -> Result<(), StoreError> {
    sqlx::query("SELECT 1").execute(conn).await?;
    Ok(())
}

/// A worker that stops cleanly leaves (its runs are released by then).
pub async fn unregister(conn: &mut PgConnection, worker: &str) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM workers WHERE id = $1").bind(worker).execute(conn).await?;
    Ok(())
}

/// The ids of workers whose session is gone: dead. After a restart of the database every
/// session is gone at once — that is not the death of the workers, which register again as they
/// reconnect: a registration older than the server counts as dead only `grace` (the SQL
/// parameter named, in seconds) after the server started.
pub fn dead_sql(grace: &str) -> String {
    format!(
        "SELECT w.id FROM workers w
         WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                           WHERE a.pid = w.backend_pid AND a.backend_start = w.backend_start)
           AND (w.backend_start >= pg_postmaster_start_time()
                OR now() > pg_postmaster_start_time() + make_interval(secs => {grace}::float8))"
    )
}

/// Forget dead workers that no running task names any more.
pub async fn forget_dead(pool: &sqlx::PgPool, grace_secs: f64) -> Result<u64, StoreError> {
    let sql = format!(
        "DELETE FROM workers WHERE id IN ({}) AND NOT EXISTS
             (SELECT 1 FROM task_queue t WHERE t.worker_id = workers.id AND t.status = 'running')",
        dead_sql("$1")
    );
    Ok(sqlx::query(&sql).bind(grace_secs).execute(pool).await?.rows_affected())
}
