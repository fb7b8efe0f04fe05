//! Purges by row what is not history: idempotency keys past their day, a batch at a time; the
//! per-minute counts (the overview's finishes, the web fetches) past their hours. Conversations,
//! events, stored diffs and the ledger go by whole partitions (`partitions`).

use sqlx::PgPool;

use super::StoreError;

/// Forget idempotency keys past their 24 hours (a key then names no task: `tasks::insert`),
/// a batch at a time. Not history: the table holds a day of keys.
pub async fn purge_keys(pool: &PgPool) -> Result<u64, StoreError> {
    delete_older(pool, "task_keys", "tenant, key", "created_at", "24 hours").await
}

/// Forget the per-minute counts no reader needs any more: the overview's finishes (it charts the
/// last hour) older than two hours, the web fetches (their limit is per minute) older than one.
/// A few rows a minute each, a batch at a time.
pub async fn purge_minutes(pool: &PgPool) -> Result<u64, StoreError> {
    let finished =
        delete_older(pool, "finished_minutes", "minute, tenant, status, backend", "minute", "2 hours").await?;
    let fetches = delete_older(pool, "web_fetch_minutes", "tenant, minute", "minute", "1 hour").await?;
    Ok(finished + fetches)
}

/// Delete the rows of `table` whose `time` is older than `age`, 5,000 at a time (by its primary
/// key, `key`) until a batch comes back short; the rows deleted in all. Names and ages are this
/// module's constants.
async fn delete_older(pool: &PgPool, table: &str, key: &str, time: &str, age: &str) -> Result<u64, StoreError> {
    const BATCH: u64 = 5000;
    let sql = format!(
        "DELETE FROM {table} WHERE ({key}) IN (
            SELECT {key} FROM {table} WHERE {time} < now() - interval '{age}' LIMIT {BATCH})"
    );
    let mut total = 0;
    loop {
        let n = sqlx::query(&sql).execute(pool).await?.rows_affected();
        total += n;
        if n < BATCH {
            return Ok(total);
        }
    }
}
