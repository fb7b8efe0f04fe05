//! `llm_calls`: the usage ledger, one row per provider call attempt. Rows are written by the
//! run's fenced statements (`runs::commit_turns`), read here, and dropped by the day past
//! `--ledger-retention-days` (`partitions`).

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;
pub use crate::kinds::CallOutcome;

/// One ledger row: what a run writes, and what `GET /tasks/{id}/calls` shows.
#[derive(Debug, Clone, Default, sqlx::FromRow, serde::Serialize)]
pub struct CallRow {
    /// Makes the write idempotent: a retry after an ambiguous commit changes nothing.
    #[serde(skip)]
    pub call_key: Uuid,
    pub turn: i32,
    /// The task attempt (claim) that made the call.
    pub attempt: i32,
    #[sqlx(rename = "try")]
    #[serde(rename = "try")]
    pub try_no: i32,
    pub provider: String,
    pub model: String,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cached_tokens: i64,
    /// Prompt tokens written to the provider's cache (part of `input_tokens`).
    #[sqlx(default)]
    pub cache_write_tokens: i64,
    /// Searches the provider ran on its side in this call (Anthropic's web search), billed in
    /// `cost_usd` at the model's price per search.
    #[sqlx(default)]
    pub web_searches: i64,
    pub cost_usd: Option<Decimal>,
    pub latency_ms: i32,
    pub http_status: Option<i32>,
    pub outcome: CallOutcome,
    pub error: Option<String>,
    /// The usage is an estimate (the answer never came, or the provider reported none).
    pub usage_estimated: bool,
    /// The reservation made for this call, released as the real cost is settled (written, not
    /// stored on the row).
    #[sqlx(default)]
    #[serde(skip)]
    pub reserved_usd: Decimal,
    #[sqlx(default)]
    #[serde(skip)]
    pub reserved_tokens: i64,
    /// The time in `call_key` (the database files the row under it); `None` on a row about to
    /// be written.
    #[sqlx(default)]
    pub created_at: Option<DateTime<Utc>>,
}

/// A task's ledger, in order. `since`: the task's creation (its calls are later, give or take a
/// worker's clock: a day's margin), so the read visits only the days since.
pub async fn of_task(pool: &PgPool, task: Uuid, since: DateTime<Utc>) -> Result<Vec<CallRow>, StoreError> {
    Ok(sqlx::query_as!(
        CallRow,
        r#"SELECT call_key, turn, attempt, try AS try_no, provider, model, input_tokens, output_tokens, cached_tokens,
                cache_write_tokens, web_searches::int8 AS "web_searches!", cost_usd,
                latency_ms, http_status, outcome AS "outcome: CallOutcome", error, usage_estimated,
                0::numeric AS "reserved_usd!", 0::int8 AS "reserved_tokens!", created_at
         FROM llm_calls WHERE task_id = $1 AND created_at >= $2::timestamptz - interval '1 day' ORDER BY id"#,
        task,
        since
    )
    .fetch_all(pool)
    .await?)
}
