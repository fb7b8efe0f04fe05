//! A task's event log: a page of it, or followed live — every stored event after a sequence
//! number, in order, without gaps or duplicates, woken by NOTIFY from whichever replica wrote
//! them (a read every few seconds covers a lost notification), ending after the task's last.

use std::time::Duration;

use futures_util::Stream;
use uuid::Uuid;

use super::kinds::TaskStatus;
use super::{Lifecycle, Scope, TaskError, TaskView};
pub use crate::store::events::EventRow;
use crate::store::{events, tasks as store};

/// A page of events.
#[derive(Debug, serde::Serialize)]
pub struct EventsPage {
    pub events: Vec<EventRow>,
    /// Pass as `after` for the next page.
    pub next_after: i32,
    pub task_status: TaskStatus,
}

/// How many events a live read takes at once.
const LIVE_BATCH: i64 = 200;

/// A page's place and size as asked: `after` 0 or more (default 0), `limit` 1 to 1,000 (default
/// 100).
pub fn checked(after: Option<i32>, limit: Option<i64>) -> Result<(i32, i64), TaskError> {
    let limit = limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(TaskError::bad_param("limit", "must be between 1 and 1000"));
    }
    if after.is_some_and(|a| a < 0) {
        return Err(TaskError::bad_param("after", "must be 0 or more"));
    }
    Ok((after.unwrap_or(0), limit))
}

impl Lifecycle {
    /// The task's events after `after` (default 0), at most `limit` (1 to 1,000, default 100).
    pub async fn events(
        &self,
        scope: &Scope,
        id: Uuid,
        after: Option<i32>,
        limit: Option<i64>,
    ) -> Result<EventsPage, TaskError> {
        let (after, limit) = checked(after, limit)?;
        let task = self.row(scope, id).await?;
        let rows = events::after(&self.pool, id, after, limit).await?;
        let next_after = rows.last().map(|e| e.seq).unwrap_or(after);
        Ok(EventsPage { events: rows, next_after, task_status: task.status })
    }

    /// The task's events after `after`, live, until its last. `None`: the task has ended and
    /// there is nothing after `after` — its stream has ended for good.
    pub async fn follow(
        &self,
        scope: &Scope,
        id: Uuid,
        after: Option<i32>,
    ) -> Result<Option<impl Stream<Item = EventRow> + Send + 'static>, TaskError> {
        let (start, _) = checked(after, None)?;
        let task = self.row(scope, id).await?;
        if task.is_terminal() && events::after(&self.pool, id, start, 1).await?.is_empty() {
            return Ok(None);
        }
        // Held until the stream is dropped (it ends, or its client leaves or stalls).
        let hold = self.stream_hold(&task.tenant).await?;
        Ok(Some(self.feed(id, task.tenant, start, hold)))
    }

    /// The task's events after `after`, live, under a hold the caller took (a door's wait that
    /// reports progress: it counts as the wait it is, not as a stream). The task is the caller's.
    pub fn watch(
        &self,
        task: &TaskView,
        after: i32,
        hold: super::guard::Hold,
    ) -> impl Stream<Item = EventRow> + Send + 'static {
        self.feed(task.id, task.tenant.clone(), after, hold)
    }

    fn feed(
        &self,
        id: Uuid,
        tenant: String,
        seq: i32,
        hold: super::guard::Hold,
    ) -> impl Stream<Item = EventRow> + Send + 'static {
        let feed = Follow { room: self.clone(), id, tenant, seq, done: false, _hold: hold };
        let batches = futures_util::stream::unfold(feed, Follow::next);
        futures_util::StreamExt::flat_map(batches, futures_util::stream::iter)
    }
}

/// A live feed's place in the log.
struct Follow {
    room: Lifecycle,
    id: Uuid,
    tenant: String,
    seq: i32,
    /// The task has ended and its last events were given.
    done: bool,
    /// Its place among the tenant's streams on this replica.
    _hold: super::guard::Hold,
}

impl Follow {
    /// The next batch of events (waiting for one), or `None` once the task's last was given.
    async fn next(mut self) -> Option<(Vec<EventRow>, Follow)> {
        if self.done {
            return None;
        }
        let (hub, pool) = (self.room.hub.clone(), self.room.pool.clone());
        loop {
            // Register before reading, so an event between the read and the wait wakes us.
            let waiter = hub.event_waiter(self.id);
            let rows = match events::after(&pool, self.id, self.seq, LIVE_BATCH).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "event stream read failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            if let Some(last) = rows.last() {
                self.seq = last.seq;
                return Some((rows, self));
            }
            // Nothing new: a finished task has written its last event — but it may have
            // finished between the read above and this check, so read once more before ending.
            match store::get(&pool, &self.tenant, self.id).await {
                Ok(Some(t)) if t.is_terminal() => {
                    let tail = events::after(&pool, self.id, self.seq, 1000).await.unwrap_or_default();
                    let last = tail.last()?.seq;
                    self.seq = last;
                    self.done = true;
                    return Some((tail, self));
                }
                Ok(None) => return None,
                _ => {}
            }
            tokio::select! {
                _ = waiter.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = self.room.shutdown.cancelled() => return None,
            }
        }
    }
}
