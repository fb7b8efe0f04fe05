//! A task's event log: a page of it, or followed live — every stored event after a sequence
//! number, in order, without gaps or duplicates, woken by NOTIFY from whichever replica wrote
//! them (a read every few seconds covers a lost notification), ending after the task's last.
//! Followed live, it may also carry the run's text as the model writes it (`live`): never
//! stored, so it has no place in the log, and a follower that comes back resumes the log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::Stream;
use uuid::Uuid;

use super::{Lifecycle, Scope, TaskError, TaskView};
use crate::kinds::{EventKind, TaskStatus};
pub use crate::store::events::EventRow;
use crate::store::{events, tasks as store};

/// What a live feed gives: a stored event, or some of the run's text as it streams.
#[derive(Debug, Clone)]
pub enum Item {
    Event(EventRow),
    Output(Arc<crate::live::Delta>),
}

impl Item {
    /// The stored event, if it is one.
    pub fn event(self) -> Option<EventRow> {
        match self {
            Item::Event(e) => Some(e),
            Item::Output(_) => None,
        }
    }
}

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
        let rows = events::after(&self.p.pool, id, after, limit).await?;
        let next_after = rows.last().map(|e| e.seq).unwrap_or(after);
        Ok(EventsPage { events: rows, next_after, task_status: task.status })
    }

    /// The seq of the task's last event now: follow it from there to see only what comes next.
    pub async fn last_seq(&self, scope: &Scope, id: Uuid) -> Result<i32, TaskError> {
        events::last_seq(&self.p.pool, scope.tenant(), id).await?.ok_or(TaskError::NotFound)
    }

    /// The task's events after `after`, live, until its last, and the run's text as it streams.
    /// `None`: the task has ended and there is nothing after `after` — its stream has ended for
    /// good.
    pub async fn follow(
        &self,
        scope: &Scope,
        id: Uuid,
        after: Option<i32>,
    ) -> Result<Option<impl Stream<Item = Item> + Send + 'static>, TaskError> {
        let (start, _) = checked(after, None)?;
        let task = self.row(scope, id).await?;
        if task.is_terminal() && events::after(&self.p.pool, id, start, 1).await?.is_empty() {
            return Ok(None);
        }
        // Held until the stream is dropped (it ends, or its client leaves or stalls).
        let hold = self.stream_hold(&task.tenant).await?;
        Ok(Some(self.feed(id, task.tenant, start, hold, Some(self.subscribe(id)))))
    }

    /// The task's events after `after`, live, under a hold the caller took (a door's wait that
    /// reports progress: it counts as the wait it is, not as a stream), with the run's text as it
    /// streams when `output` (see `output_ahead`). The task is the caller's.
    pub fn watch(
        &self,
        task: &TaskView,
        after: i32,
        hold: super::guard::Hold,
        output: Option<OutputAhead>,
    ) -> impl Stream<Item = Item> + Send + 'static {
        let live = output.map(|o| self.text_of(o, task.id));
        self.feed(task.id, task.tenant.clone(), after, hold, live)
    }

    /// `watch`, as a wait: under a wait hold of the task's tenant taken here; `None` at its
    /// `max_waits` (the caller answers with the task as it stands, as a wait that ran out).
    pub async fn watch_waiting(
        &self,
        task: &TaskView,
        output: Option<OutputAhead>,
    ) -> Result<Option<impl Stream<Item = Item> + Send + 'static>, TaskError> {
        Ok(match self.hold(&task.tenant, super::guard::HoldKind::Wait).await? {
            Ok(hold) => {
                let live = output.map(|o| self.text_of(o, task.id));
                Some(self.feed(task.id, task.tenant.clone(), 0, hold, live))
            }
            Err(_) => None,
        })
    }

    /// The run's text of task `id`, subscribed now. Taken before the request that starts the run
    /// (a task's insert, a paused task's answer) has made it, a stream that request answers with
    /// misses none of it, however soon a worker starts.
    pub fn output_ahead(&self, id: Uuid) -> OutputAhead {
        OutputAhead { id, sub: self.subscribe(id) }
    }

    /// `o`'s subscription when it is task `id`'s (a retried request answers with the task the
    /// first one made: its text is subscribed now).
    fn text_of(&self, o: OutputAhead, id: Uuid) -> crate::live::Subscription {
        if o.id == id {
            o.sub
        } else {
            self.subscribe(id)
        }
    }

    fn subscribe(&self, id: Uuid) -> crate::live::Subscription {
        self.p.hub.live.subscribe(id, self.p.hub.clone())
    }

    fn feed(
        &self,
        id: Uuid,
        tenant: String,
        seq: i32,
        hold: super::guard::Hold,
        // Subscribed before the log is read: text written from then on is not missed.
        live: Option<crate::live::Subscription>,
    ) -> impl Stream<Item = Item> + Send + 'static {
        let shared = self.feeds.of(id);
        let feed = Follow { room: self.clone(), id, tenant, seq, done: false, shared, live, _hold: hold };
        let batches = futures_util::stream::unfold(feed, Follow::next);
        futures_util::StreamExt::flat_map(batches, futures_util::stream::iter)
    }
}

/// What following a task gives a door, in order (`Lifecycle::steps`): each door says it in its
/// own protocol.
pub enum Step {
    /// A worker claimed the run (its `claimed` event).
    Claimed(EventRow),
    /// A turn ended (its checkpoint): the turn, and the event.
    Turn(u32, EventRow),
    /// The run's text as it streams.
    Output(Arc<crate::live::Delta>),
    /// The task waits for a decision: the task as it stands, read when its pause came (a pause
    /// already answered by then is not a step).
    Paused(Box<TaskView>),
    /// The follow is over (the task ended, or the caller's deadline came): the task as it stands.
    /// Nothing comes after it.
    Ended(Box<TaskView>),
}

/// The state of `Lifecycle::steps`.
struct Steps<S> {
    room: Lifecycle,
    scope: Scope,
    id: Uuid,
    items: std::pin::Pin<Box<S>>,
    deadline: Option<tokio::time::Instant>,
    ended: bool,
}

impl<S: Stream<Item = Item> + Send> Steps<S> {
    async fn next(mut self) -> Option<(Result<Step, TaskError>, Self)> {
        use futures_util::StreamExt;
        if self.ended {
            return None;
        }
        loop {
            let until = self.deadline;
            let item = tokio::select! {
                item = self.items.next() => item,
                _ = async move {
                    match until {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => None,
            };
            let step = match item {
                Some(Item::Output(d)) => Step::Output(d),
                // Matched on the kind (a row whose data does not read still counts); the data,
                // typed, only where it is used.
                Some(Item::Event(ev)) => match ev.known() {
                    Some(EventKind::Claimed) => Step::Claimed(ev),
                    Some(EventKind::Checkpoint) => Step::Turn(ev.event().and_then(|e| e.turn()).unwrap_or(0), ev),
                    Some(EventKind::RequiresAction) => match self.room.get(&self.scope, self.id).await {
                        Ok(now) if now.status == TaskStatus::RequiresAction => Step::Paused(Box::new(now)),
                        Ok(_) => continue,
                        Err(e) => return Some((Err(e), self)),
                    },
                    _ => continue,
                },
                // The feed ends after the task's last event (or the deadline came): the final read.
                None => {
                    self.ended = true;
                    let now = self.room.get(&self.scope, self.id).await.map(|t| Step::Ended(Box::new(t)));
                    return Some((now, self));
                }
            };
            return Some((Ok(step), self));
        }
    }
}

impl Lifecycle {
    /// A door's follow of task `id` over `items` (from `watch` or `watch_waiting`): its steps —
    /// the run claimed, each turn, its text, a pause — then, when the feed ends or `deadline`
    /// comes, the task as it stands. The door stops reading when its client leaves.
    pub fn steps<S>(
        &self,
        scope: &Scope,
        id: Uuid,
        items: S,
        deadline: Option<tokio::time::Instant>,
    ) -> impl Stream<Item = Result<Step, TaskError>> + Send + 'static
    where
        S: Stream<Item = Item> + Send + 'static,
    {
        let state =
            Steps { room: self.clone(), scope: scope.clone(), id, items: Box::pin(items), deadline, ended: false };
        futures_util::stream::unfold(state, Steps::next)
    }
}

/// A task's live text subscribed ahead of its run (`Lifecycle::output_ahead`).
pub struct OutputAhead {
    id: Uuid,
    sub: crate::live::Subscription,
}

/// The live feeds of this process, by task: the streams following one task share its reads.
/// A thousand streams of one task, woken by each of its events, make a read or two of the log
/// between them, not a thousand (each stream's reads loaded the pool every tenant shares).
#[derive(Default)]
pub struct Feeds {
    tasks: std::sync::Mutex<std::collections::HashMap<Uuid, std::sync::Weak<Shared>>>,
}

impl Feeds {
    fn of(&self, id: Uuid) -> Arc<Shared> {
        let mut m = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = m.get(&id).and_then(std::sync::Weak::upgrade) {
            return s;
        }
        m.retain(|_, w| w.strong_count() > 0);
        let s = Arc::new(Shared::default());
        m.insert(id, Arc::downgrade(&s));
        s
    }
}

/// One task's log as its streams here last read it.
#[derive(Default)]
struct Shared {
    cache: tokio::sync::Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    /// When the last read of the log began: every event written before then, after `base`, is
    /// here — or beyond the last read's batch, if it was full (`complete` false).
    read_at: Option<Instant>,
    /// The cache holds every event after this seq, up to the last one read.
    base: i32,
    /// The events after `base` (at most `KEEP`), in order.
    events: std::collections::VecDeque<EventRow>,
    /// The last read reached the end of the log (it was not a full batch).
    complete: bool,
    /// When the task was found ended (its log complete), if it was.
    ended_at: Option<Instant>,
    /// When a look at the task that found it still open began.
    open_at: Option<Instant>,
}

/// How many of a task's latest events its streams share.
const KEEP: usize = 1000;

impl Cache {
    /// The events after `seq` as this cache knows them, or `None` when it cannot tell.
    fn after(&self, seq: i32) -> Option<Vec<EventRow>> {
        if self.read_at.is_none() || seq < self.base {
            return None;
        }
        let rows: Vec<EventRow> =
            self.events.iter().filter(|e| e.seq > seq).take(LIVE_BATCH as usize).cloned().collect();
        if rows.is_empty() && !self.complete {
            return None;
        }
        Some(rows)
    }

    fn head(&self) -> i32 {
        self.events.back().map_or(self.base, |e| e.seq)
    }
}

impl Shared {
    /// The events after `seq`, as of a read that began after `since` (a stream's wake-up): from
    /// the shared cache when a read began after it, else a read (of what is new) made for all.
    async fn after(
        &self,
        pool: &sqlx::PgPool,
        id: Uuid,
        seq: i32,
        since: Instant,
    ) -> Result<Vec<EventRow>, crate::store::StoreError> {
        let mut c = self.cache.lock().await;
        if c.read_at.is_some_and(|r| r >= since) {
            if let Some(rows) = c.after(seq) {
                return Ok(rows);
            }
        }
        let started = Instant::now();
        // What is new beyond the cache, when it covers this stream; else this stream's own read,
        // which starts the cache again.
        let extend = c.read_at.is_some() && seq >= c.base;
        let from = if extend { c.head().max(seq) } else { seq };
        let rows = events::after(pool, id, from, LIVE_BATCH).await?;
        c.complete = (rows.len() as i64) < LIVE_BATCH;
        if extend {
            c.events.extend(rows);
        } else {
            c.base = seq;
            c.events = rows.into();
        }
        while c.events.len() > KEEP {
            if let Some(e) = c.events.pop_front() {
                c.base = e.seq;
            }
        }
        c.read_at = Some(started);
        Ok(c.after(seq).unwrap_or_default())
    }

    /// Whether the task has ended (`None`: it is gone), as of a look that began after `since`.
    async fn ended(
        &self,
        pool: &sqlx::PgPool,
        tenant: &str,
        id: Uuid,
        since: Instant,
    ) -> Result<Option<bool>, crate::store::StoreError> {
        let mut c = self.cache.lock().await;
        if c.ended_at.is_some() {
            return Ok(Some(true));
        }
        if c.open_at.is_some_and(|o| o >= since) {
            return Ok(Some(false));
        }
        let started = Instant::now();
        let ended = match store::get(pool, tenant, id).await? {
            Some(t) => t.is_terminal(),
            None => return Ok(None),
        };
        if ended {
            c.ended_at = Some(started);
        } else {
            c.open_at = Some(started);
        }
        Ok(Some(ended))
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
    /// The task's log, shared with its other streams here.
    shared: Arc<Shared>,
    /// The run's text as it streams, when asked for.
    live: Option<crate::live::Subscription>,
    /// Its place among the tenant's streams on this replica.
    _hold: super::guard::Hold,
}

impl Follow {
    /// `rows`, with the run's text received and not yet given where it was written: after the
    /// events that start a run and its call (a late stream shows the task working before its
    /// text), before any other (the call's end, the task's, a pause: a follower may stop there).
    fn with_text(&mut self, rows: Vec<EventRow>) -> Vec<Item> {
        let text = self.take_text();
        let at = rows
            .iter()
            .position(|e| {
                !matches!(e.known(), Some(EventKind::Created | EventKind::Claimed | EventKind::LlmCallStarted))
            })
            .unwrap_or(rows.len());
        let mut items: Vec<Item> = Vec::with_capacity(rows.len() + text.len());
        let mut rows = rows.into_iter();
        items.extend(rows.by_ref().take(at).map(Item::Event));
        items.extend(text);
        items.extend(rows.map(Item::Event));
        items
    }

    /// The run's text received and not yet given, without waiting.
    fn take_text(&mut self) -> Vec<Item> {
        use tokio::sync::broadcast::error::TryRecvError;
        let mut out = vec![];
        while let Some(sub) = self.live.as_mut() {
            match sub.rx.try_recv() {
                Ok(d) => out.push(Item::Output(d)),
                Err(TryRecvError::Lagged(_)) => continue,
                Err(TryRecvError::Closed) => self.live = None,
                Err(TryRecvError::Empty) => break,
            }
        }
        out
    }

    /// The next batch of events, or of the run's text (waiting for one), or `None` once the
    /// task's last event was given.
    async fn next(mut self) -> Option<(Vec<Item>, Follow)> {
        if self.done {
            return None;
        }
        let (hub, pool) = (self.room.p.hub.clone(), self.room.p.pool.clone());
        let mut since = Instant::now();
        loop {
            // Register before reading, so an event between the read and the wait wakes us.
            let waiter = hub.event_waiter(self.id);
            let rows = match self.shared.after(&pool, self.id, self.seq, since).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "event stream read failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    since = Instant::now();
                    continue;
                }
            };
            // The run's text received by now goes with the rows read, where the log puts it (after
            // the call started, before it ended). A stream that comes late, or a run quicker than
            // the reads, would otherwise end with its text unread.
            if let Some(last) = rows.last() {
                self.seq = last.seq;
                return Some((self.with_text(rows), self));
            }
            let text = self.take_text();
            if !text.is_empty() {
                return Some((text, self));
            }
            // Nothing new: a finished task has written its last event — but it may have
            // finished between the read above and this check, so read once more before ending.
            // (A look that began after this stream woke: an event after it wakes the stream.)
            match self.shared.ended(&pool, &self.tenant, self.id, since).await {
                Ok(Some(true)) => {
                    let tail = events::after(&pool, self.id, self.seq, 1000).await.unwrap_or_default();
                    self.seq = tail.last().map_or(self.seq, |e| e.seq);
                    self.done = true;
                    let items = self.with_text(tail);
                    return (!items.is_empty()).then_some((items, self));
                }
                Ok(None) => return None,
                _ => {}
            }
            let text = async {
                match self.live.as_mut() {
                    Some(sub) => sub.rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = waiter.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = self.room.p.shutdown.cancelled() => return None,
                d = text => match d {
                    Ok(d) => return Some((vec![Item::Output(d)], self)),
                    // A subscriber that fell behind misses some text, never an event.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => self.live = None,
                },
            }
            since = Instant::now();
        }
    }
}
