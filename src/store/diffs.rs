//! `task_diffs`: a task's changes to its own copy of its workspace. Each checkpoint saves what
//! rebuilds the copy (the changed files as tar.gz, the deleted paths); the run's end saves the
//! diff, and its counts on the task (`tasks.diff_stats`). Every write is fenced on the lease.
//! The table is partitioned by the day of a row's last write and dropped a day at a time past
//! `--retention-days` (migration 0031, `partitions::DIFFS`).

use serde_json::Value;
use sqlx::{Connection, PgConnection, PgPool};

use super::{Fence, StoreError, CLOCK_MARGIN};

type Time = chrono::DateTime<chrono::Utc>;

/// Save the copy's changes so far (on `conn`: with the turn they belong to, in its transaction,
/// or in one of their own).
pub async fn save_changes(
    conn: &mut PgConnection,
    f: Fence,
    archive: &[u8],
    deleted: &[String],
) -> Result<bool, StoreError> {
    write(conn, f, Saved::Changes(archive, deleted)).await
}

/// What a write of a task's diff row sets.
enum Saved<'a> {
    /// The copy's changes: tar.gz, deleted paths.
    Changes(&'a [u8], &'a [String]),
    /// The run's diff, and its counts on the task.
    Diff(&'a str, &'a Value),
}

/// Write the task's diff row under its lease (false if the lease is gone): locked, then updated
/// where it is or inserted if the task has none.
async fn write(conn: &mut PgConnection, f: Fence, saved: Saved<'_>) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    let Some((tenant, created)) = lock(&mut tx, f).await? else {
        return Ok(false);
    };
    let (changes, deleted, diff) = match saved {
        Saved::Changes(archive, deleted) => (Some(archive), Some(deleted), None),
        Saved::Diff(text, stats) => {
            sqlx::query!("UPDATE task_queue SET diff_stats = $2 WHERE id = $1", f.id, stats).execute(&mut *tx).await?;
            (None, None, Some(text))
        }
    };
    // What the row held before, for the tenant's kept bytes (under the task's lock: no other
    // write of this row runs meanwhile).
    // Planned for its parameters each time (`persistent(false)`, which only a runtime query
    // takes): the days before the task's are pruned at planning and never locked. Its one shape
    // runs in `sandbox::a_kill_dash_nine_after_two_edits_in_two_turns_loses_neither` and every test
    // that saves a copy's changes.
    let (old_changes, old_diff): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(octet_length(changes), 0)::bigint, coalesce(octet_length(diff), 0)::bigint
         FROM task_diffs WHERE task_id = $1 AND updated_at >= $2",
    )
    .bind(f.id)
    .bind(created - CLOCK_MARGIN)
    .persistent(false)
    .fetch_optional(&mut *tx)
    .await?
    .unwrap_or((0, 0));
    let new_changes = changes.map_or(old_changes, |c| c.len() as i64);
    let new_diff = diff.map_or(old_diff, |d| d.len() as i64);
    let delta = new_changes + new_diff - old_changes - old_diff;
    if delta != 0 {
        sqlx::query!(
            "INSERT INTO tenant_storage (tenant, kept_bytes) VALUES ($1, greatest($2::int8, 0))
             ON CONFLICT (tenant) DO UPDATE SET kept_bytes = greatest(tenant_storage.kept_bytes + $2, 0)",
            tenant,
            delta
        )
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query!(
        "WITH u AS (UPDATE task_diffs SET changes = coalesce($2, changes), deleted = coalesce($3, deleted),
                        diff = coalesce($4, diff), updated_at = now()
                    WHERE task_id = $1 AND updated_at >= $6 RETURNING 1)
         INSERT INTO task_diffs (task_id, tenant, changes, deleted, diff)
         SELECT $1, $5, $2, coalesce($3, '{}'), $4 WHERE NOT EXISTS (SELECT FROM u)",
        f.id,
        changes,
        deleted,
        diff,
        tenant,
        created - CLOCK_MARGIN
    )
    // Planned for its parameters each time: the days before the task's are pruned at planning
    // and never locked (a generic plan would lock every day's partition).
    .persistent(false)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Lock the task's row under its lease; its tenant and creation time (its diff is written after
/// it: the days before are never read), or `None` if the lease is gone. Every write of
/// a diff holds this lock and then updates the task's row of `task_diffs`, or inserts one, in a
/// statement of its own, which sees what the lock's last holder wrote: one row per task, although
/// the table's key holds the time (`updated_at`, the partition key).
/// A task that ended while the lock was awaited has left the queue (40001): its lease is gone.
async fn lock(conn: &mut PgConnection, f: Fence) -> Result<Option<(String, Time)>, StoreError> {
    let r = sqlx::query!(
        "SELECT tenant, created_at FROM task_queue WHERE id = $1 AND lease_token = $2 FOR UPDATE",
        f.id,
        f.lease
    )
    .fetch_optional(conn)
    .await
    .map(|r| r.map(|r| (r.tenant, r.created_at)))
    .map_err(StoreError::from);
    match r {
        Err(e) if e.is_moved() => Ok(None),
        r => r,
    }
}

/// The changes saved for `task`: (tar.gz, deleted paths).
pub async fn changes_of(pool: &PgPool, task: uuid::Uuid) -> Result<Option<(Vec<u8>, Vec<String>)>, StoreError> {
    let row =
        sqlx::query!("SELECT changes, deleted FROM task_diffs WHERE task_id = $1", task).fetch_optional(pool).await?;
    Ok(row.and_then(|r| r.changes.map(|c| (c, r.deleted))))
}

/// Do tasks `a` and `b` read the same workspace version (a resumed task may start from its
/// parent's changes only then)?
pub async fn same_version(pool: &PgPool, a: uuid::Uuid, b: uuid::Uuid) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar!(
        r#"SELECT (SELECT workspace_version FROM tasks WHERE id = $1) IS NOT DISTINCT FROM
                (SELECT workspace_version FROM tasks WHERE id = $2) AS "same!""#,
        a,
        b
    )
    .fetch_one(pool)
    .await?)
}

/// Save the run's diff and its counts (on the task), fenced; false if the lease is gone.
pub async fn save_diff(pool: &PgPool, f: Fence, diff: &str, stats: &Value) -> Result<bool, StoreError> {
    write(&mut *pool.acquire().await?, f, Saved::Diff(diff, stats)).await
}

/// A tenant's task's diff: `None` if the task has no diff row (no copy, or its day dropped), `Some(None)`
/// while its run has not ended. `since`: the task's creation (its diff is written after it).
pub async fn diff_of(
    pool: &PgPool,
    tenant: &str,
    task: uuid::Uuid,
    since: Time,
) -> Result<Option<Option<String>>, StoreError> {
    // Planned for its parameters each time, as `write`'s read (a runtime query). Its one shape
    // runs in `sandbox::a_general_agent_edits_runs_the_repositorys_test_and_returns_a_patch_that_applies`.
    Ok(sqlx::query_scalar("SELECT diff FROM task_diffs WHERE task_id = $1 AND tenant = $2 AND updated_at >= $3")
        .bind(task)
        .bind(tenant)
        .bind(since - CLOCK_MARGIN)
        .persistent(false)
        .fetch_optional(pool)
        .await?)
}

/// The bytes `tenant`'s kept changes and diffs hold (`tenant_storage`).
pub async fn kept_bytes(pool: &PgPool, tenant: &str) -> Result<i64, StoreError> {
    let n = sqlx::query_scalar!("SELECT kept_bytes FROM tenant_storage WHERE tenant = $1", tenant)
        .fetch_optional(pool)
        .await?;
    Ok(n.unwrap_or(0))
}
