//! `task_events`: the per-task, ordered, append-only log.

use chrono::{DateTime, Utc};
use serde_json::Value;
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

/// Events of a task after `after`, in order: the stored rows after it (a row's `seq` is its last
/// event's), each opened into its events (migration 0033), those at or before `after` left out.
pub async fn after(pool: &PgPool, task: Uuid, after: i32, limit: i64) -> Result<Vec<EventRow>, StoreError> {
    // Each row holds at least one event after `after`: `limit` rows hold enough.
    let rows = sqlx::query_as!(
        StoredRow,
        r#"SELECT seq, kind, coalesce(data_text, data::json) AS "data!", earlier, created_at FROM task_events
         WHERE task_id = $1 AND seq > $2
         ORDER BY seq LIMIT $3"#,
        task,
        after,
        limit
    )
    .fetch_all(pool)
    .await?;
    let mut out: Vec<EventRow> = rows.into_iter().flat_map(StoredRow::open).filter(|e| e.seq > after).collect();
    out.truncate(usize::try_from(limit).unwrap_or(0));
    Ok(out)
}

/// A stored row of `task_events`: one statement's events for a task.
struct StoredRow {
    seq: i32,
    kind: String,
    data: Value,
    earlier: Option<Value>,
    created_at: DateTime<Utc>,
}

impl StoredRow {
    /// Its events, in order: the earlier ones (`[kind, data]` each, the seqs below the row's),
    /// then the row's own.
    fn open(self) -> Vec<EventRow> {
        let earlier = match self.earlier {
            Some(Value::Array(a)) => a,
            _ => vec![],
        };
        let (first, created_at) = (self.seq - earlier.len() as i32, self.created_at);
        let mut out: Vec<EventRow> = earlier
            .into_iter()
            .enumerate()
            .map(|(i, pair)| {
                let (kind, data) = match pair {
                    Value::Array(mut p) if p.len() == 2 => {
                        let data = p.pop().unwrap_or_default();
                        (p.pop().and_then(|k| k.as_str().map(str::to_string)).unwrap_or_default(), data)
                    }
                    other => (String::new(), other),
                };
                EventRow { seq: first + i as i32, kind, data, created_at }
            })
            .collect();
        out.push(EventRow { seq: self.seq, kind: self.kind, data: self.data, created_at });
        out
    }
}

/// The events before a row's last, as `earlier` stores them: `[[kind, data], ...]`, compact JSON
/// text (the column is `json`; bound as text and cast).
pub(super) type Earlier = String;

/// A statement's events for one task as the one row it writes (migration 0033): the last event's
/// kind and data, the ones before it as `[[kind, data], ...]` (none when it is alone), and how
/// many there are (the task's `last_event_seq` moves by that many; no row when none).
pub(super) struct Packed {
    pub kind: Option<EventKind>,
    /// The last event's data, as compact JSON text (`data_text`, migration 0037).
    pub data: Option<String>,
    pub earlier: Option<Earlier>,
    pub n: i32,
}

pub(super) fn pack<'a>(events: impl IntoIterator<Item = &'a Event>) -> Packed {
    let mut all: Vec<(EventKind, &Event)> = events.into_iter().map(|e| (e.kind(), e)).collect();
    let n = all.len() as i32;
    let last = all.pop();
    Packed {
        kind: last.map(|(k, _)| k),
        data: last.map(|(_, e)| serde_json::to_string(e).expect("events serialise as JSON")),
        // Kinds are strings and every event an object with string keys: this cannot fail, and a
        // stand-in would leave the row's seqs off by the missing events.
        earlier: (!all.is_empty()).then(|| serde_json::to_string(&all).expect("events serialise as JSON")),
        n,
    }
}

/// Append events, in order, from the worker holding the lease (the caller publishes `CH_EVENT`).
/// Returns false (writing nothing) if the lease is gone.
pub async fn append(pool: &PgPool, f: Fence, events: &[Event]) -> Result<bool, StoreError> {
    let p = pack(events);
    let n = sqlx::query_scalar!(
        r#"WITH u AS (
            UPDATE task_queue SET last_event_seq = last_event_seq + $6
            WHERE id = $1 AND lease_token = $2
            RETURNING id, last_event_seq
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data, data_text, earlier)
            SELECT id, last_event_seq, $3, NULL, $4::json, $5::json FROM u WHERE $3::text IS NOT NULL
         )
         SELECT count(*)::int AS "n!" FROM u"#,
        f.id,
        f.lease,
        p.kind.map(EventKind::as_str),
        p.data as _,
        p.earlier as _,
        p.n
    )
    .fetch_one(pool)
    .await?;
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
    let mut rows = Rows::default();
    for (i, w) in items.iter().enumerate() {
        rows.push(i as i64 + 1, &w.events);
    }
    let done = sqlx::query_scalar!(
        r#"WITH b AS (
            SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[]) WITH ORDINALITY AS b(b_id, b_lease, b_nev, b_i)
            ORDER BY b_id
         ), u AS (
            UPDATE task_queue SET last_event_seq = last_event_seq + b_nev FROM b
            WHERE id = b_id AND lease_token = b_lease AND id = ANY($1)
            RETURNING b_i, b_id, b_nev, last_event_seq AS u_seq
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data, data_text, earlier)
            SELECT b_id, u_seq, x.kind, NULL, x.data, x.earlier
            FROM u JOIN unnest($4::int8[], $5::text[], $6::json[], $7::json[]) AS x(ei, kind, data, earlier) ON x.ei = u.b_i
         )
         SELECT b_i AS "b_i!" FROM u"#,
        &items.iter().map(|w| w.fence.id).collect::<Vec<_>>(),
        &items.iter().map(|w| w.fence.lease).collect::<Vec<_>>(),
        &items.iter().map(|w| w.events.len() as i32).collect::<Vec<_>>(),
        &rows.of,
        &rows.kinds as _,
        &rows.datas as _,
        &rows.earlier as _
    )
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

/// The event rows of a batch of runs, one per run with events (`pack`), as four parallel
/// arrays: the run's place in the batch, and the row's kind, data and earlier events.
#[derive(Default)]
struct Rows {
    of: Vec<i64>,
    kinds: Vec<EventKind>,
    datas: Vec<String>,
    earlier: Vec<Option<Earlier>>,
}

impl Rows {
    /// Run `i`'s events (nothing for none).
    fn push<'a>(&mut self, i: i64, events: impl IntoIterator<Item = &'a Event>) {
        let p = pack(events);
        if let (Some(kind), Some(data)) = (p.kind, p.data) {
            self.of.push(i);
            self.kinds.push(kind);
            self.datas.push(data);
            self.earlier.push(p.earlier);
        }
    }
}

/// The seq of the task's last event (0 for none; `None`: no such task of `tenant`'s).
pub async fn last_seq(pool: &PgPool, tenant: Option<&str>, task: Uuid) -> Result<Option<i32>, StoreError> {
    Ok(sqlx::query_scalar!(
        "SELECT last_event_seq FROM tasks WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
        task,
        tenant
    )
    .fetch_optional(pool)
    .await?)
}
