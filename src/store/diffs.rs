//! `task_diffs`: a task's changes to its own copy of its workspace. Each checkpoint saves what
//! rebuilds the copy (the changed files as tar.gz, the deleted paths); the run's end saves the
//! diff, and its counts on the task (`tasks.diff_stats`). Every write is fenced on the lease.

use serde_json::Value;
use sqlx::PgPool;

use super::{Fence, StoreError};

/// Save the copy's changes so far (on `conn`: with the turn they belong to, in its transaction).
pub async fn save_changes(
    conn: &mut sqlx::PgConnection,
    f: Fence,
    archive: &[u8],
    deleted: &[String],
) -> Result<bool, StoreError> {
    let n = sqlx::query(
        "INSERT INTO task_diffs (task_id, tenant, changes, deleted)
         SELECT id, tenant, $3, $4 FROM task_queue WHERE id = $1 AND lease_token = $2
         ON CONFLICT (task_id) DO UPDATE SET changes = $3, deleted = $4, updated_at = now()",
    )
    .bind(f.id)
    .bind(f.lease)
    .bind(archive)
    .bind(deleted)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// The changes saved for `task`: (tar.gz, deleted paths).
pub async fn changes_of(pool: &PgPool, task: uuid::Uuid) -> Result<Option<(Vec<u8>, Vec<String>)>, StoreError> {
    let row: Option<(Option<Vec<u8>>, Vec<String>)> =
        sqlx::query_as("SELECT changes, deleted FROM task_diffs WHERE task_id = $1")
            .bind(task)
            .fetch_optional(pool)
            .await?;
    Ok(row.and_then(|(c, d)| c.map(|c| (c, d))))
}

/// Do tasks `a` and `b` read the same workspace version (a resumed task may start from its
/// parent's changes only then)?
pub async fn same_version(pool: &PgPool, a: uuid::Uuid, b: uuid::Uuid) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT (SELECT workspace_version FROM tasks WHERE id = $1) IS NOT DISTINCT FROM
                (SELECT workspace_version FROM tasks WHERE id = $2)",
    )
    .bind(a)
    .bind(b)
    .fetch_one(pool)
    .await?)
}

/// Save the run's diff and its counts (on the task), fenced; false if the lease is gone.
pub async fn save_diff(pool: &PgPool, f: Fence, diff: &str, stats: &Value) -> Result<bool, StoreError> {
    let n: i64 = sqlx::query_scalar(
        "WITH t AS (UPDATE task_queue SET diff_stats = $4 WHERE id = $1 AND lease_token = $2 RETURNING id, tenant),
         d AS (INSERT INTO task_diffs (task_id, tenant, diff) SELECT id, tenant, $3 FROM t
               ON CONFLICT (task_id) DO UPDATE SET diff = $3, updated_at = now())
         SELECT count(*) FROM t",
    )
    .bind(f.id)
    .bind(f.lease)
    .bind(diff)
    .bind(stats)
    .fetch_one(pool)
    .await?;
    Ok(n == 1)
}

/// A tenant's task's diff: `None` if the task has no diff row (no copy, or purged), `Some(None)`
/// while its run has not ended.
pub async fn diff_of(pool: &PgPool, tenant: &str, task: uuid::Uuid) -> Result<Option<Option<String>>, StoreError> {
    let row: Option<(Option<String>,)> =
        sqlx::query_as("SELECT diff FROM task_diffs WHERE task_id = $1 AND tenant = $2")
            .bind(task)
            .bind(tenant)
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|r| r.0))
}
