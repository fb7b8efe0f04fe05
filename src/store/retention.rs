//! Purges by row what is not history: idempotency keys past their day, a batch at a time; the
//! per-minute counts (the overview's finishes, the web fetches) past their hours. Conversations,
//! events, stored diffs and the ledger go by whole partitions (`partitions`).

use sqlx::PgPool;

use super::StoreError;

/// Forget idempotency keys past their 24 hours (a key then names no task: `tasks::insert`),
/// a batch at a time. Not history: the table holds a day of keys.
pub async fn purge_keys(pool: &PgPool) -> Result<u64, StoreError> {
    in_batches(|| async {
        sqlx::query!(
            "DELETE FROM task_keys WHERE (tenant, key) IN (
                SELECT tenant, key FROM task_keys WHERE created_at < now() - interval '24 hours' LIMIT 5000)"
        )
        .execute(pool)
        .await
    })
    .await
}

/// Forget the per-minute counts no reader needs any more: the overview's finishes (it charts the
/// last hour) older than two hours, the web fetches (their limit is per minute) older than one.
/// A few rows a minute each, a batch at a time.
pub async fn purge_minutes(pool: &PgPool) -> Result<u64, StoreError> {
    let finished = in_batches(|| async {
        sqlx::query!(
            "DELETE FROM finished_minutes WHERE (minute, tenant, status, backend) IN (
                SELECT minute, tenant, status, backend FROM finished_minutes
                WHERE minute < now() - interval '2 hours' LIMIT 5000)"
        )
        .execute(pool)
        .await
    })
    .await?;
    let fetches = in_batches(|| async {
        sqlx::query!(
            "DELETE FROM web_fetch_minutes WHERE (tenant, minute) IN (
                SELECT tenant, minute FROM web_fetch_minutes WHERE minute < now() - interval '1 hour' LIMIT 5000)"
        )
        .execute(pool)
        .await
    })
    .await?;
    Ok(finished + fetches)
}

/// Run a delete of at most `BATCH` (5,000) rows until a batch comes back short; the rows deleted
/// in all.
async fn in_batches<F, Fut>(delete: F) -> Result<u64, StoreError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<sqlx::postgres::PgQueryResult, sqlx::Error>>,
{
    const BATCH: u64 = 5000;
    let mut total = 0;
    loop {
        let n = delete().await?.rows_affected();
        total += n;
        if n < BATCH {
            return Ok(total);
        }
    }
}
