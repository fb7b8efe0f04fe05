//! Purges past retention: the conversations and events of finished tasks, and old ledger rows
//! (the daily rollups keep their sums). Each runs a batch at a time.

use sqlx::PgPool;

use super::StoreError;

/// Delete the conversation and events of tasks finished more than `days` ago, a batch at a
/// time; the tasks and the usage ledger stay. Returns how many tasks were purged.
pub async fn purge_finished(pool: &PgPool, days: i32) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let n: i64 = sqlx::query_scalar(
            "WITH t AS (
                SELECT id FROM tasks WHERE finished_at < now() - make_interval(days => $1)
                AND (EXISTS (SELECT 1 FROM task_messages m WHERE m.task_id = tasks.id)
                     OR EXISTS (SELECT 1 FROM task_events e WHERE e.task_id = tasks.id)
                     OR EXISTS (SELECT 1 FROM task_diffs d WHERE d.task_id = tasks.id))
                LIMIT 500
             ), m AS (DELETE FROM task_messages WHERE task_id IN (SELECT id FROM t)),
             e AS (DELETE FROM task_events WHERE task_id IN (SELECT id FROM t)),
             d AS (DELETE FROM task_diffs WHERE task_id IN (SELECT id FROM t))
             SELECT count(*) FROM t",
        )
        .bind(days)
        .fetch_one(pool)
        .await?;
        total += n as u64;
        if n < 500 {
            return Ok(total);
        }
    }
}

/// Delete ledger rows older than `days`, a batch at a time (the rollups keep their sums).
pub async fn purge_ledger(pool: &PgPool, days: i32) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let n = sqlx::query(
            "DELETE FROM llm_calls WHERE id IN (
                SELECT id FROM llm_calls WHERE created_at < now() - make_interval(days => $1) ORDER BY id LIMIT 5000)",
        )
        .bind(days)
        .execute(pool)
        .await?
        .rows_affected();
        total += n;
        if n < 5000 {
            return Ok(total);
        }
    }
}
