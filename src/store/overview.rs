//! What the console's overview reads, for one tenant or every tenant (`None`): the tasks open
//! now, the finishes of the last hour (counted as they are written), today's calls by model and
//! spend by tenant (from the rollup, never the ledger), and the replicas holding leases. Each is
//! an index scan.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgPool;

use super::budget::SpendDefaults;
use super::StoreError;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Now {
    pub scheduled: i64,
    pub queued: i64,
    pub running: i64,
    pub requires_action: i64,
    pub waiting_for_budget: i64,
}

pub async fn now(pool: &PgPool, tenant: Option<&str>) -> Result<Now, StoreError> {
    Ok(sqlx::query_as!(
        Now,
        r#"SELECT
            (SELECT count(*) FROM task_queue WHERE status = 'scheduled' AND ($1::text IS NULL OR tenant = $1)) AS "scheduled!",
            (SELECT count(*) FROM task_queue WHERE status = 'queued' AND ($1::text IS NULL OR tenant = $1)) AS "queued!",
            (SELECT count(*) FROM task_queue WHERE status = 'running' AND ($1::text IS NULL OR tenant = $1)) AS "running!",
            (SELECT count(*) FROM task_queue WHERE status = 'requires_action' AND ($1::text IS NULL OR tenant = $1))
                AS "requires_action!",
            (SELECT count(*) FROM task_queue WHERE waiting_for IS NOT NULL AND status = 'queued'
                AND ($1::text IS NULL OR tenant = $1)) AS "waiting_for_budget!""#,
        tenant
    )
    .fetch_one(pool)
    .await?)
}

/// Tasks finished in one minute of the last hour, by outcome: from `finished_minutes`, which
/// counts each end as it is written (a trigger on `tasks`, migration 0032), so the read is a row
/// per tenant, outcome and writing backend a minute whatever the throughput, where counting the
/// hour's tasks was one row a task. The minutes that began in the last hour: the current one and
/// the 59 before.
#[derive(Debug, Clone, Serialize)]
pub struct Finished {
    pub minute: DateTime<Utc>,
    pub status: String,
    pub tasks: i64,
}

pub async fn finished_last_hour(pool: &PgPool, tenant: Option<&str>) -> Result<Vec<Finished>, StoreError> {
    Ok(sqlx::query_as!(
        Finished,
        r#"SELECT minute, status, sum(tasks)::bigint AS "tasks!" FROM finished_minutes
         WHERE minute > now() - interval '1 hour' AND ($1::text IS NULL OR tenant = $1)
         GROUP BY 1, 2 ORDER BY 1, 2"#,
        tenant
    )
    .fetch_all(pool)
    .await?)
}

/// Provider calls today by model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelToday {
    pub model: String,
    pub calls: i64,
    pub failed: i64,
    pub cost_usd: Decimal,
}

pub async fn models_today(pool: &PgPool, tenant: Option<&str>) -> Result<Vec<ModelToday>, StoreError> {
    Ok(sqlx::query_as!(
        ModelToday,
        r#"SELECT model, sum(calls)::bigint AS "calls!", sum(failed)::bigint AS "failed!", sum(cost_usd) AS "cost_usd!"
         FROM usage_daily WHERE day = (now() AT TIME ZONE 'UTC')::date AND ($1::text IS NULL OR tenant = $1)
         GROUP BY model ORDER BY 2 DESC LIMIT 50"#,
        tenant
    )
    .fetch_all(pool)
    .await?)
}

/// A tenant's spend today and this month against its limits (the configured defaults filled
/// in), and what its calls in flight hold.
#[derive(Debug, Clone, Serialize)]
pub struct Spend {
    pub tenant: String,
    pub today_usd: Decimal,
    pub month_usd: Decimal,
    pub usd_per_day: Option<Decimal>,
    pub usd_per_month: Option<Decimal>,
    pub tokens_today: i64,
    pub tokens_per_day: Option<i64>,
    pub reserved_usd: Decimal,
    /// What its kept changes and diffs hold (`tenant_storage`), in bytes.
    pub kept_bytes: i64,
}

pub async fn spend(pool: &PgPool, tenant: Option<&str>, d: SpendDefaults) -> Result<Vec<Spend>, StoreError> {
    Ok(sqlx::query_as!(
        Spend,
        r#"WITH d AS (SELECT (now() AT TIME ZONE 'UTC')::date AS today),
         s AS (
            SELECT tenant, sum(cost_usd) FILTER (WHERE day = d.today) AS today_usd, sum(cost_usd) AS month_usd,
                   sum(input_tokens + output_tokens) FILTER (WHERE day = d.today) AS tokens_today
            FROM usage_daily, d WHERE day >= date_trunc('month', d.today)::date AND ($1::text IS NULL OR tenant = $1)
            GROUP BY tenant
         ), r AS (
            SELECT tenant, sum(reserved_usd) AS reserved FROM task_queue
            WHERE status = 'running' AND ($1::text IS NULL OR tenant = $1) GROUP BY tenant
         )
         SELECT t.name AS tenant, coalesce(s.today_usd, 0) AS "today_usd!", coalesce(s.month_usd, 0) AS "month_usd!",
                coalesce(t.usd_per_day, $2) AS usd_per_day, coalesce(t.usd_per_month, $3) AS usd_per_month,
                coalesce(s.tokens_today, 0)::bigint AS "tokens_today!", coalesce(t.tokens_per_day, $4) AS tokens_per_day,
                coalesce(r.reserved, 0) AS "reserved_usd!", coalesce(ts.kept_bytes, 0)::bigint AS "kept_bytes!"
         FROM tenants t LEFT JOIN s ON s.tenant = t.name LEFT JOIN r ON r.tenant = t.name
              LEFT JOIN tenant_storage ts ON ts.tenant = t.name
         WHERE ($1::text IS NULL OR t.name = $1)
         ORDER BY 3 DESC, t.name LIMIT 100"#,
        tenant,
        d.usd_per_day,
        d.usd_per_month,
        d.tokens_per_day
    )
    .fetch_all(pool)
    .await?)
}

/// A worker process holding leases now.
#[derive(Debug, Clone, Serialize)]
pub struct Replica {
    pub worker: String,
    pub running: i64,
    pub lease_expires_at: Option<DateTime<Utc>>,
}

pub async fn replicas(pool: &PgPool, tenant: Option<&str>) -> Result<Vec<Replica>, StoreError> {
    Ok(sqlx::query_as!(
        Replica,
        r#"SELECT worker_id AS "worker!", count(*) AS "running!", max(lease_expires_at) AS lease_expires_at FROM task_queue
         WHERE status = 'running' AND worker_id IS NOT NULL AND ($1::text IS NULL OR tenant = $1)
         GROUP BY worker_id ORDER BY worker_id"#,
        tenant
    )
    .fetch_all(pool)
    .await?)
}
