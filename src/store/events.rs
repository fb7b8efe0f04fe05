//! `task_events`: the per-task, ordered, append-only log.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::{Fence, StoreError};

#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct EventRow {
    pub seq: i32,
    pub kind: String,
    pub data: Value,
    pub created_at: DateTime<Utc>,
}

/// Events of a task after `after`, in order.
pub async fn after(pool: &PgPool, task: Uuid, after: i32, limit: i64) -> Result<Vec<EventRow>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT seq, kind, data, created_at FROM task_events WHERE task_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    )
    .bind(task)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Append events, in order, from the worker holding the lease (the caller publishes `CH_EVENT`).
/// Returns false (writing nothing) if the lease is gone.
pub async fn append(pool: &PgPool, f: Fence, events: &[(&str, Value)]) -> Result<bool, StoreError> {
    let (kinds, datas): (Vec<&str>, Vec<&Value>) = events.iter().map(|(k, d)| (*k, d)).unzip();
    let sql = "WITH u AS (
            UPDATE tasks SET last_event_seq = last_event_seq + cardinality($3::text[])
            WHERE id = $1 AND lease_token = $2 AND status = 'running'
            RETURNING id, last_event_seq
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data)
            SELECT id, u.last_event_seq - cardinality($3::text[]) + x.ord, x.kind, x.data
            FROM u, unnest($3::text[], $4::jsonb[]) WITH ORDINALITY AS x(kind, data, ord)
         )
         SELECT count(*)::int FROM u";
    let n: i32 = sqlx::query_scalar(sql).bind(f.id).bind(f.lease).bind(&kinds).bind(&datas).fetch_one(pool).await?;
    Ok(n == 1)
}
