//! One LISTEN connection per process, fanned out: workers are woken for new work, waiters
//! for finished tasks, running sub-agents for cancels, whichever replica caused them.
//!
//! May import: `engine` (the stop signal), `store`. Used by the lifecycle room (waits, feeds,
//! ends) and by `jobs` (runs, claims).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::engine::{StopCause, StopSignal};
use crate::store::tasks::TaskRow;
use crate::store::{Fence, CH_BUDGET, CH_CANCEL, CH_DONE, CH_EVENT, CH_LIVE_PREFIX, CH_QUEUED, CH_TIMER, CH_WATCH};

#[derive(Default)]
pub struct Hub {
    /// Woken when the task finishes.
    waiters: Mutex<HashMap<Uuid, Vec<Arc<Slot>>>>,
    /// Woken on every new event of the task (and when it finishes).
    streams: Mutex<HashMap<Uuid, Vec<Arc<Slot>>>>,
    runs: Mutex<HashMap<Uuid, (Fence, StopSignal)>>,
    /// Cancels that found no run here, kept a minute (locked after `runs`): a run registered just
    /// after its cancel was sent (claimed or started, not yet registered) stops at once instead
    /// of at its next heartbeat.
    early_cancels: Mutex<HashMap<Uuid, std::time::Instant>>,
    /// New work may be queued.
    pub queued: Notify,
    /// Counts the times new work may have been queued (`queued` notifications, reconnects).
    queued_generation: std::sync::atomic::AtomicU64,
    /// Some task finished (webhooks may be due).
    pub finished: Notify,
    /// A task at a time, or a schedule, was made (the timer looks again).
    pub timer: Notify,
    /// Tenants whose budget waiters may now fit (a reservation of theirs settled).
    budget_settled: Mutex<std::collections::HashSet<String>>,
    pub budget: Notify,
    /// Set while the listener is connected.
    connected: std::sync::atomic::AtomicBool,
    /// Notifications to send to every replica, batched by `publish_loop`.
    outbox: Mutex<Option<tokio::sync::mpsc::UnboundedSender<(&'static str, String)>>>,
    outbox_ready: Notify,
    /// Live output: this process's subscribers and other replicas' watches (`live`).
    pub live: crate::live::Registry,
}

/// One waiter's wake-up, and the finished task when a run in this process handed it over.
#[derive(Default)]
struct Slot {
    notify: Notify,
    finished: Mutex<Option<TaskRow>>,
}

/// A registered interest in one task's completion (or its events); unregisters on drop.
pub struct Waiter<'a> {
    hub: &'a Hub,
    id: Uuid,
    slot: Arc<Slot>,
    events: bool,
}

impl Waiter<'_> {
    /// Wait for the wake-up; gives the finished task when this process finished it (else
    /// the task is to be read again).
    pub async fn notified(&self) -> Option<TaskRow> {
        self.slot.notify.notified().await;
        self.slot.finished.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let map = if self.events { &self.hub.streams } else { &self.hub.waiters };
        let mut w = map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = w.get_mut(&self.id) {
            list.retain(|n| !Arc::ptr_eq(n, &self.slot));
            if list.is_empty() {
                w.remove(&self.id);
            }
        }
    }
}

impl Hub {
    pub fn new() -> Arc<Hub> {
        Arc::new(Hub::default())
    }

    /// Register before reading the task, so a completion between the read and the wait is
    /// not missed (`Notify` keeps the permit).
    pub fn waiter(&self, id: Uuid) -> Waiter<'_> {
        let slot = Arc::new(Slot::default());
        self.waiters.lock().unwrap_or_else(|e| e.into_inner()).entry(id).or_default().push(slot.clone());
        Waiter { hub: self, id, slot, events: false }
    }

    /// Like `waiter`, but also woken by every new event of the task.
    pub fn event_waiter(&self, id: Uuid) -> Waiter<'_> {
        let slot = Arc::new(Slot::default());
        self.streams.lock().unwrap_or_else(|e| e.into_inner()).entry(id).or_default().push(slot.clone());
        Waiter { hub: self, id, slot, events: true }
    }

    fn wake_streams(&self, id: Uuid) {
        if let Some(list) = self.streams.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
            list.iter().for_each(|n| n.notify.notify_one());
        }
    }

    /// Whether a request in this process waits for the task.
    pub fn has_waiters(&self, id: Uuid) -> bool {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&id)
    }

    pub fn waiter_count(&self) -> usize {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner()).values().map(Vec::len).sum()
    }

    pub fn done(&self, id: Uuid) {
        if let Some(list) = self.waiters.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
            list.iter().for_each(|n| n.notify.notify_one());
        }
        self.wake_streams(id);
    }

    /// A run in this process finished `task` (committed): its waiters here get the row as
    /// written, without reading it again; every replica is told.
    pub fn finished_here(&self, task: TaskRow) {
        if let Some(list) = self.waiters.lock().unwrap_or_else(|e| e.into_inner()).get(&task.id) {
            for s in list {
                *s.finished.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.clone());
            }
        }
        self.publish(CH_DONE, task.id.to_string());
    }

    /// Wake everyone: used after a reconnect, when notifications may have been missed.
    pub fn wake_all(&self) {
        for map in [&self.waiters, &self.streams] {
            for list in map.lock().unwrap_or_else(|e| e.into_inner()).values() {
                list.iter().for_each(|n| n.notify.notify_one());
            }
        }
        self.new_work();
    }

    fn new_work(&self) {
        self.queued_generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.queued.notify_waiters();
    }

    /// The tenants whose reservations settled since the last call, with waiters to wake.
    pub fn take_settled(&self) -> Vec<String> {
        self.budget_settled.lock().unwrap_or_else(|e| e.into_inner()).drain().collect()
    }

    /// Changes whenever work may have been queued since it was last read.
    pub fn queued_generation(&self) -> u64 {
        self.queued_generation.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn register_run(&self, fence: Fence, stop: StopSignal) {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if self.early_cancels.lock().unwrap_or_else(|e| e.into_inner()).remove(&fence.id).is_some() {
            stop.stop(StopCause::Cancelled);
        }
        runs.insert(fence.id, (fence, stop));
    }

    /// Stop the task's run if it is here; if not, remember the cancel a minute, in case the run
    /// is about to register (see `early_cancels`).
    pub fn cancel_run(&self, id: Uuid) {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        match runs.get(&id) {
            Some((_, s)) => s.stop(StopCause::Cancelled),
            None => {
                let mut early = self.early_cancels.lock().unwrap_or_else(|e| e.into_inner());
                let now = std::time::Instant::now();
                early.retain(|_, at| now.duration_since(*at) < Duration::from_secs(60));
                early.insert(id, now);
            }
        }
    }

    pub fn unregister_run(&self, id: Uuid) {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    pub fn stop_run(&self, id: Uuid, cause: StopCause) -> bool {
        match self.runs.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
            Some((_, s)) => {
                s.stop(cause);
                true
            }
            None => false,
        }
    }

    pub fn running_ids(&self) -> Vec<Uuid> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect()
    }

    pub fn running_fences(&self) -> Vec<Fence> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).values().map(|r| r.0).collect()
    }

    pub fn is_connected(&self) -> bool {
        self.connected.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Start `publish_loop` and return once it accepts notifications.
    pub async fn start_publishing(
        self: &Arc<Self>,
        pool: PgPool,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let ready = self.outbox_ready.notified();
        tokio::pin!(ready);
        ready.as_mut().enable();
        let h = tokio::spawn(self.clone().publish_loop(pool, shutdown));
        ready.await;
        h
    }

    /// Tell every replica (this one at once, the others through NOTIFY).
    pub fn publish(&self, channel: &'static str, payload: String) {
        self.dispatch(channel, &payload);
        if let Some(tx) = self.outbox.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let _ = tx.send((channel, payload));
        }
    }

    /// Send published notifications to Postgres in batches: whatever accumulates while one
    /// batch is being sent goes in the next, in one statement — group commit for NOTIFY, which
    /// otherwise serialises every notifying transaction's commit.
    pub async fn publish_loop(self: Arc<Self>, pool: PgPool, shutdown: CancellationToken) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(&'static str, String)>();
        *self.outbox.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        self.outbox_ready.notify_waiters();
        loop {
            let first = tokio::select! {
                m = rx.recv() => m,
                _ = shutdown.cancelled() => None,
            };
            let Some(first) = first else { return };
            // A moment for more to arrive: one NOTIFY transaction then carries a burst (local
            // waiters were already woken by `publish`; only other replicas wait these 2 ms).
            tokio::time::sleep(Duration::from_millis(2)).await;
            let mut by_channel: HashMap<&'static str, Vec<String>> = HashMap::new();
            by_channel.entry(first.0).or_default().push(first.1);
            while let Ok((c, p)) = rx.try_recv() {
                by_channel.entry(c).or_default().push(p);
            }
            let (mut chans, mut payloads) = (vec![], vec![]);
            for (c, mut ps) in by_channel {
                ps.sort();
                ps.dedup();
                // NOTIFY payloads must stay under 8000 bytes.
                let mut cur = String::new();
                for p in ps {
                    if !cur.is_empty() && cur.len() + p.len() + 1 > 7000 {
                        chans.push(c.to_string());
                        payloads.push(std::mem::take(&mut cur));
                    }
                    if !cur.is_empty() {
                        cur.push(',');
                    }
                    cur.push_str(&p);
                }
                chans.push(c.to_string());
                payloads.push(cur);
            }
            for attempt in 0..5 {
                let r = sqlx::query!(
                    "SELECT count(pg_notify(c, p)) FROM unnest($1::text[], $2::text[]) AS x(c, p)",
                    &chans,
                    &payloads
                )
                .fetch_one(&pool)
                .await;
                match r {
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, attempt, "NOTIFY failed; retrying");
                        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                    }
                }
            }
        }
    }

    fn dispatch(&self, channel: &str, payload: &str) {
        if channel.starts_with(CH_LIVE_PREFIX) {
            return self.live.notified(channel, payload);
        }
        if payload.contains(',') {
            for p in payload.split(',') {
                self.dispatch(channel, p);
            }
            return;
        }
        match channel {
            CH_QUEUED => self.new_work(),
            CH_DONE => {
                if let Ok(id) = payload.parse() {
                    self.done(id);
                }
                self.finished.notify_waiters();
            }
            CH_EVENT => {
                if let Ok(id) = payload.parse() {
                    self.wake_streams(id);
                }
            }
            CH_CANCEL => {
                if let Ok(id) = payload.parse() {
                    self.cancel_run(id);
                }
            }
            CH_BUDGET => {
                self.budget_settled.lock().unwrap_or_else(|e| e.into_inner()).insert(payload.to_string());
                self.budget.notify_one();
            }
            CH_WATCH => self.live.watch_said(payload),
            CH_TIMER => self.timer.notify_one(),
            _ => {}
        }
    }

    /// LISTEN on the live channel of every task subscribed here and UNLISTEN the rest: `listened`
    /// is what this connection listens on.
    async fn listen_live(
        &self,
        listener: &mut PgListener,
        listened: &mut std::collections::HashSet<Uuid>,
    ) -> Result<(), sqlx::Error> {
        let wanted = self.live.subscribed();
        for t in wanted.difference(listened).copied().collect::<Vec<_>>() {
            listener.listen(&crate::live::channel(t)).await?;
            listened.insert(t);
        }
        for t in listened.difference(&wanted).copied().collect::<Vec<_>>() {
            listener.unlisten(&crate::live::channel(t)).await?;
            listened.remove(&t);
        }
        Ok(())
    }

    /// Say this process's watches again, and forget others' that were not, every
    /// `live::REFRESH`, until `shutdown`.
    pub async fn refresh_live(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(crate::live::REFRESH) => self.live.refresh(&*self),
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// Listen until `shutdown`, reconnecting with backoff when the connection drops.
    pub async fn listen(self: Arc<Self>, pool: PgPool, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        while !shutdown.is_cancelled() {
            let mut listener = match PgListener::connect_with(&pool).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "notify listener cannot connect; retrying");
                    tokio::select! { _ = tokio::time::sleep(backoff) => {}, _ = shutdown.cancelled() => return }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            if let Err(e) =
                listener.listen_all([CH_QUEUED, CH_DONE, CH_CANCEL, CH_EVENT, CH_BUDGET, CH_WATCH, CH_TIMER]).await
            {
                tracing::warn!(error = %e, "LISTEN failed; retrying");
                tokio::select! { _ = tokio::time::sleep(backoff) => {}, _ = shutdown.cancelled() => return }
                continue;
            }
            // The live channels of the tasks this process has subscribers for (a new connection
            // listens on none of them yet).
            let mut live = std::collections::HashSet::new();
            if let Err(e) = self.listen_live(&mut listener, &mut live).await {
                tracing::warn!(error = %e, "LISTEN failed; retrying");
                continue;
            }
            backoff = Duration::from_millis(100);
            self.connected.store(true, std::sync::atomic::Ordering::Relaxed);
            // Anything sent while we were not listening is lost: everyone re-checks.
            self.wake_all();
            loop {
                let next = tokio::select! {
                    n = listener.try_recv() => n,
                    _ = shutdown.cancelled() => return,
                };
                match next {
                    Ok(Some(n)) => {
                        self.dispatch(n.channel(), n.payload());
                        // A watch said (this process's own among them, as soon as it is sent):
                        // listen on the live channels of the tasks subscribed here, and only those.
                        if n.channel() == CH_WATCH {
                            if let Err(e) = self.listen_live(&mut listener, &mut live).await {
                                tracing::warn!(error = %e, "notify listener failed; reconnecting");
                                self.connected.store(false, std::sync::atomic::Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                    // The connection dropped: reconnect ourselves, so that everyone is woken
                    // again only once we are listening.
                    Ok(None) => {
                        self.connected.store(false, std::sync::atomic::Ordering::Relaxed);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "notify listener failed; reconnecting");
                        self.connected.store(false, std::sync::atomic::Ordering::Relaxed);
                        break;
                    }
                }
            }
        }
    }
}

impl crate::live::Bus for Hub {
    fn registry(&self) -> &crate::live::Registry {
        &self.live
    }

    fn publish(&self, channel: &'static str, payload: String) {
        Hub::publish(self, channel, payload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tasks::TaskStatus;

    #[tokio::test]
    async fn a_task_finished_here_is_handed_to_its_waiters_and_others_are_only_woken() {
        let hub = Hub::new();
        let id = Uuid::now_v7();
        let (first, second) = (hub.waiter(id), hub.waiter(id));
        let other = hub.waiter(Uuid::now_v7());
        hub.finished_here(TaskRow { id, status: TaskStatus::Completed, turns: 3, ..Default::default() });
        for w in [&first, &second] {
            let row = tokio::time::timeout(Duration::from_secs(1), w.notified()).await.expect("woken");
            let row = row.expect("the finished task handed over");
            assert_eq!((row.id, row.status.as_str(), row.turns), (id, "completed", 3));
        }
        assert!(tokio::time::timeout(Duration::from_millis(50), other.notified()).await.is_err());
        // A completion seen only through NOTIFY (another replica's) wakes without a row.
        hub.dispatch(CH_DONE, &id.to_string());
        assert!(first.notified().await.is_none());
        drop((first, second, other));
        assert_eq!(hub.waiter_count(), 0);
    }

    #[tokio::test]
    async fn a_cancel_that_arrives_before_its_run_registers_stops_the_run_when_it_does() {
        let hub = Hub::new();
        let fence = Fence { id: Uuid::now_v7(), lease: Uuid::new_v4() };
        hub.dispatch(CH_CANCEL, &fence.id.to_string());
        let (early, other) = (StopSignal::new(), StopSignal::new());
        hub.register_run(fence, early.clone());
        assert!(matches!(early.cause(), Some(StopCause::Cancelled)));
        // Remembered once: a later run of another task is not affected.
        hub.register_run(Fence { id: Uuid::now_v7(), lease: Uuid::new_v4() }, other.clone());
        assert!(other.cause().is_none());
    }
}
