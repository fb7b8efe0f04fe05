//! Purges by row what is not history: idempotency keys past their day, a batch at a time.
//! Conversations, events, stored diffs and the ledger go by whole partitions (`partitions`).

use sqlx::PgPool;

use super::StoreError;

/// Forget idempotency keys past their 24 hours (a key then names no task: `tasks::insert`),
/// a batch at a time. Not history: the table holds a day of keys.
pub async fn purge_keys(pool: &PgPool) -> Result<u64, StoreError> {
    in_batches(5000, || {
        sqlx::query(
            "DELETE FROM task_keys WHERE (tenant, key) IN (
                SELECT tenant, key FROM task_keys WHERE created_at < now() - interval '24 hours' LIMIT 5000)",
        )
        .execute(pool)
    })
    .await
}

/// Run `delete` (one batch of at most `batch` rows) until a batch comes back short; the rows
/// deleted in all.
async fn in_batches<F, Fut>(batch: u64, mut delete: F) -> Result<u64, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<sqlx::postgres::PgQueryResult, sqlx::Error>>,
{
    let mut total = 0;
    loop {
        let n = delete().await?.rows_affected();
        total += n;
        if n < batch {
            return Ok(total);
        }
    }
}
