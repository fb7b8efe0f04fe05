//! The SQL side of budgets: a tenant's use against its limits, and the reservation of a provider
//! call's worst case (`budget_reserve`, migration 0004), which locks the tenant's row while it
//! checks. Settlement is part of the turn's checkpoint (`runs::commit_turn`). The rules that
//! decide what these figures mean live in `crate::budget`.

use rust_decimal::Decimal;
use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;

use super::{Fence, StoreError};

/// The configured spend limits of a tenant that sets none.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpendDefaults {
    pub usd_per_day: Option<Decimal>,
    pub usd_per_month: Option<Decimal>,
    pub tokens_per_day: Option<i64>,
}

/// What `budget_reserve` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserve {
    Reserved,
    /// The lease is no longer held: nothing was written.
    LeaseLost,
    /// The named limit would be passed: nothing was written.
    Refused(String),
}

/// Reserve a call's worst case against the task's and the tenant's budgets. `event`, if given,
/// is the call's `llm_call_started` event, appended in the same statement.
pub async fn reserve(
    db: impl sqlx::PgExecutor<'_>,
    f: Fence,
    usd: Decimal,
    tokens: i64,
    d: SpendDefaults,
    event: Option<&Value>,
) -> Result<Reserve, StoreError> {
    let r: String = sqlx::query_scalar("SELECT budget_reserve($1, $2, $3, $4, $5, $6, $7, $8)")
        .bind(f.id)
        .bind(f.lease)
        .bind(usd)
        .bind(tokens)
        .bind(d.usd_per_day)
        .bind(d.usd_per_month)
        .bind(d.tokens_per_day)
        .bind(event)
        .fetch_one(db)
        .await?;
    Ok(match r.as_str() {
        "ok" => Reserve::Reserved,
        "lease_lost" => Reserve::LeaseLost,
        _ => Reserve::Refused(r),
    })
}

/// What a tenant uses now, against its limits.
#[derive(Debug, Clone, Default, Serialize, sqlx::FromRow)]
pub struct Use {
    pub usd_today: Decimal,
    pub usd_this_month: Decimal,
    pub tokens_today: i64,
    /// Worst-case cost reserved by provider calls in flight.
    pub reserved_usd: Decimal,
    pub reserved_tokens: i64,
    pub running: i64,
    pub queued: i64,
}

pub async fn usage_now(conn: &mut PgConnection, tenant: &str) -> Result<Use, StoreError> {
    Ok(sqlx::query_as(
        "WITH d AS (SELECT (now() AT TIME ZONE 'UTC')::date AS today)
         SELECT
           coalesce((SELECT sum(cost_usd) FROM usage_daily, d WHERE tenant = $1 AND day = d.today), 0) AS usd_today,
           coalesce((SELECT sum(cost_usd) FROM usage_daily, d WHERE tenant = $1 AND day >= date_trunc('month', d.today)::date), 0) AS usd_this_month,
           coalesce((SELECT sum(input_tokens + output_tokens) FROM usage_daily, d WHERE tenant = $1 AND day = d.today), 0)::bigint AS tokens_today,
           coalesce((SELECT sum(reserved_usd) FROM tasks WHERE tenant = $1 AND status = 'running'), 0) AS reserved_usd,
           coalesce((SELECT sum(reserved_tokens) FROM tasks WHERE tenant = $1 AND status = 'running'), 0)::bigint AS reserved_tokens,
           (SELECT count(*) FROM tasks WHERE tenant = $1 AND status = 'running') AS running,
           (SELECT count(*) FROM tasks WHERE tenant = $1 AND status = 'queued') AS queued",
    )
    .bind(tenant)
    .fetch_one(conn)
    .await?)
}
