//! `task_events`: the per-task, ordered, append-only log.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

use super::{Fence, StoreError};
use crate::kinds::{Event, EventKind};

#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct EventRow {
    pub seq: i32,
    /// As stored: a replica of a newer version may write a kind this one does not know, and its
    /// pages and streams pass it on (an open set); `known()` is the kind to match on.
    pub kind: String,
    pub data: Value,
    pub created_at: DateTime<Utc>,
}

impl EventRow {
    /// The event's kind, if this version knows it.
    pub fn known(&self) -> Option<EventKind> {
        EventKind::parse(&self.kind)
    }

    /// The event, typed, if this version knows its kind (and its data has that kind's shape).
    pub fn event(&self) -> Option<Event> {
        Event::parse(self.known()?, self.data.clone()).ok()
    }
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
pub async fn append(pool: &PgPool, f: Fence, events: &[Event]) -> Result<bool, StoreError> {
    let (kinds, datas): (Vec<EventKind>, Vec<Json<&Event>>) = events.iter().map(|e| (e.kind(), Json(e))).unzip();
    let sql = "WITH u AS (
            UPDATE task_queue SET last_event_seq = last_event_seq + cardinality($3::text[])
            WHERE id = $1 AND lease_token = $2
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

/// One run's events, owned, for `append_many` (the arguments of `append`).
#[derive(Debug, Clone)]
pub struct EventsWrite {
    pub fence: Fence,
    pub events: Vec<Event>,
}

/// Append several runs' events in one statement, each fenced on its own lease: for each, in the
/// order given, whether it was written (false: its lease is gone, and nothing of it was).
pub async fn append_many(pool: &PgPool, items: &[&EventsWrite]) -> Result<Vec<bool>, StoreError> {
    let (mut of, mut kinds, mut datas) = (vec![], vec![], vec![]);
    for (i, w) in items.iter().enumerate() {
        for e in &w.events {
            of.push(i as i64 + 1);
            kinds.push(e.kind());
            datas.push(Json(e));
        }
    }
    let done: Vec<i64> = sqlx::query_scalar(&APPEND_MANY)
        .bind(items.iter().map(|w| w.fence.id).collect::<Vec<_>>())
        .bind(items.iter().map(|w| w.fence.lease).collect::<Vec<_>>())
        .bind(items.iter().map(|w| w.events.len() as i32).collect::<Vec<_>>())
        .bind(&of)
        .bind(&kinds)
        .bind(&datas)
        .fetch_all(pool)
        .await?;
    let mut out = vec![false; items.len()];
    for i in done {
        if let Some(o) = usize::try_from(i - 1).ok().and_then(|i| out.get_mut(i)) {
            *o = true;
        }
    }
    Ok(out)
}

static APPEND_MANY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH b AS (
            SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[]) WITH ORDINALITY AS b(b_id, b_lease, b_nev, b_i)
            ORDER BY b_id
         ), u AS (
            UPDATE task_queue SET last_event_seq = last_event_seq + b_nev FROM b
            WHERE id = b_id AND lease_token = b_lease AND id = ANY($1)
            RETURNING b_i, b_id, b_nev, last_event_seq AS u_seq
         ), e AS ({})
         SELECT b_i FROM u",
        insert_batched(4, 5, 6)
    )
});

/// The events of a batch of runs, for a statement whose CTE `u` has, per run written, its place
/// in the batch (`b_i`), task (`b_id`), event count (`b_nev`) and new `last_event_seq` (`u_seq`).
/// The events are parameters `$of` (each one's run, `b_i`), `$kinds` and `$datas`, in order.
pub(super) fn insert_batched(of: u8, kinds: u8, datas: u8) -> String {
    format!(
        "INSERT INTO task_events (task_id, seq, kind, data)
            SELECT b_id, u_seq - b_nev + x.k, x.kind, x.data
            FROM u JOIN (SELECT ei, kind, data, row_number() OVER (PARTITION BY ei ORDER BY ord) AS k
                         FROM unnest(${of}::int8[], ${kinds}::text[], ${datas}::jsonb[])
                         WITH ORDINALITY AS y(ei, kind, data, ord)) x
                 ON x.ei = u.b_i"
    )
}

/// The seq of the task's last event (0 for none; `None`: no such task of `tenant`'s).
pub async fn last_seq(pool: &PgPool, tenant: Option<&str>, task: Uuid) -> Result<Option<i32>, StoreError> {
    Ok(sqlx::query_scalar("SELECT last_event_seq FROM tasks WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)")
        .bind(task)
        .bind(tenant)
        .fetch_optional(pool)
        .await?)
}
