//! `schedules`: a tenant's cron schedules, each with the task body its ticks submit, when it
//! ticks next, and how its last tick went. A tick is taken by one replica at a time (a short
//! hold, `ticking_until`) and made once by its task's idempotency key.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;

#[derive(Debug, Clone, serde::Serialize)]
pub struct ScheduleRow {
    #[serde(skip)]
    pub tenant: String,
    pub name: String,
    pub cron: String,
    pub timezone: String,
    pub task: Value,
    pub paused: bool,
    pub next_run_at: Option<DateTime<Utc>>,
    pub last_run_at: Option<DateTime<Utc>>,
    pub last_task_id: Option<Uuid>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

pub async fn list(pool: &PgPool, tenant: &str) -> Result<Vec<ScheduleRow>, StoreError> {
    Ok(sqlx::query_as!(
        ScheduleRow,
        "SELECT tenant, name, cron, timezone, task, paused, next_run_at, last_run_at, last_task_id, last_error,
                created_at, updated_at
         FROM schedules WHERE tenant = $1 ORDER BY name",
        tenant
    )
    .fetch_all(pool)
    .await?)
}

pub async fn get(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<ScheduleRow>, StoreError> {
    Ok(sqlx::query_as!(
        ScheduleRow,
        "SELECT tenant, name, cron, timezone, task, paused, next_run_at, last_run_at, last_task_id, last_error,
                created_at, updated_at
         FROM schedules WHERE tenant = $1 AND name = $2",
        tenant,
        name
    )
    .fetch_optional(pool)
    .await?)
}

/// A schedule as written by `put`.
pub struct SchedulePut<'a> {
    pub tenant: &'a str,
    pub name: &'a str,
    pub cron: &'a str,
    pub timezone: &'a str,
    pub task: &'a Value,
    pub paused: bool,
    pub next_run_at: Option<DateTime<Utc>>,
}

/// Insert or replace a schedule (its history kept); the row, and true when it was created.
pub async fn put(pool: &PgPool, p: &SchedulePut<'_>) -> Result<(ScheduleRow, bool), StoreError> {
    let r = sqlx::query!(
        r#"INSERT INTO schedules (tenant, name, cron, timezone, task, paused, next_run_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (tenant, name) DO UPDATE SET cron = EXCLUDED.cron, timezone = EXCLUDED.timezone,
             task = EXCLUDED.task, paused = EXCLUDED.paused, next_run_at = EXCLUDED.next_run_at,
             ticking_until = NULL, updated_at = now()
         RETURNING tenant, name, cron, timezone, task, paused, next_run_at, last_run_at, last_task_id, last_error,
                   created_at, updated_at, (xmax = 0) AS "created!""#,
        p.tenant,
        p.name,
        p.cron,
        p.timezone,
        p.task,
        p.paused,
        p.next_run_at
    )
    .fetch_one(pool)
    .await?;
    let row = ScheduleRow {
        tenant: r.tenant,
        name: r.name,
        cron: r.cron,
        timezone: r.timezone,
        task: r.task,
        paused: r.paused,
        next_run_at: r.next_run_at,
        last_run_at: r.last_run_at,
        last_task_id: r.last_task_id,
        last_error: r.last_error,
        created_at: r.created_at,
        updated_at: r.updated_at,
    };
    Ok((row, r.created))
}

pub async fn delete(pool: &PgPool, tenant: &str, name: &str) -> Result<bool, StoreError> {
    let r = sqlx::query!("DELETE FROM schedules WHERE tenant = $1 AND name = $2", tenant, name).execute(pool).await?;
    Ok(r.rows_affected() == 1)
}

/// Pause (no ticks) or resume (ticking from `next_run_at`) a schedule; the row, if it exists.
pub async fn set_paused(
    pool: &PgPool,
    tenant: &str,
    name: &str,
    paused: bool,
    next_run_at: Option<DateTime<Utc>>,
) -> Result<Option<ScheduleRow>, StoreError> {
    Ok(sqlx::query_as!(
        ScheduleRow,
        "UPDATE schedules SET paused = $3, next_run_at = $4, ticking_until = NULL, updated_at = now()
         WHERE tenant = $1 AND name = $2
         RETURNING tenant, name, cron, timezone, task, paused, next_run_at, last_run_at, last_task_id, last_error,
                   created_at, updated_at",
        tenant,
        name,
        paused,
        next_run_at
    )
    .fetch_optional(pool)
    .await?)
}

/// Take the schedules due now (at most `limit`), each held by this replica for `hold_secs`:
/// another replica takes a tick only if this one has not finished it by then.
pub async fn take_due(pool: &PgPool, limit: i64, hold_secs: f64) -> Result<Vec<ScheduleRow>, StoreError> {
    Ok(sqlx::query_as!(
        ScheduleRow,
        "WITH due AS (
            SELECT tenant, name FROM schedules
            WHERE NOT paused AND next_run_at <= now() AND (ticking_until IS NULL OR ticking_until < now())
            ORDER BY next_run_at LIMIT $1 FOR UPDATE SKIP LOCKED
         )
         UPDATE schedules s SET ticking_until = now() + make_interval(secs => $2)
         FROM due WHERE s.tenant = due.tenant AND s.name = due.name
         RETURNING s.tenant, s.name, s.cron, s.timezone, s.task, s.paused, s.next_run_at, s.last_run_at, s.last_task_id,
                   s.last_error, s.created_at, s.updated_at",
        limit,
        hold_secs
    )
    .fetch_all(pool)
    .await?)
}

/// The tick due at `due` is done: the schedule ticks next at `next`, its last tick was `tick`
/// (its task, or why it was refused). Written only if the schedule still waits for that tick (a
/// replica that finished it first, or an edit meanwhile, wins).
#[allow(clippy::too_many_arguments)]
pub async fn ticked(
    pool: &PgPool,
    tenant: &str,
    name: &str,
    due: DateTime<Utc>,
    next: Option<DateTime<Utc>>,
    tick: DateTime<Utc>,
    task: Option<Uuid>,
    error: Option<&str>,
) -> Result<bool, StoreError> {
    let r = sqlx::query!(
        "UPDATE schedules SET next_run_at = $4, last_run_at = $5, last_task_id = coalesce($6, last_task_id),
             last_error = $7, ticking_until = NULL, updated_at = now()
         WHERE tenant = $1 AND name = $2 AND next_run_at = $3",
        tenant,
        name,
        due,
        next,
        tick,
        task,
        error
    )
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// When the next schedule is due, if any is: a schedule held by a replica making its tick (or
/// whose tick just failed) counts from the end of its hold, so a held, past-due schedule does not
/// make every timer spin.
pub async fn next_due(pool: &PgPool) -> Result<Option<DateTime<Utc>>, StoreError> {
    Ok(sqlx::query_scalar!(
        "SELECT min(greatest(next_run_at, coalesce(ticking_until, next_run_at))) FROM schedules WHERE NOT paused"
    )
    .fetch_one(pool)
    .await?)
}
