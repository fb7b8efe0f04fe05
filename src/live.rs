//! Live output: the text a model writes while its call streams, to whoever follows the task's
//! live feed right now — never stored, not paged, not counted in the event log's `seq`.
//!
//! A subscriber's replica *watches* the task: it says so on `CH_WATCH` (again every
//! `REFRESH`, and once more when its last subscriber leaves) and listens on the task's own
//! channel (`subagentd_live_<id>`) while it has subscribers. The replica running the task sends
//! the text there, coalesced, only while some other replica's watch is fresh, and hands it to its
//! own subscribers directly. A run nobody watches does one atomic load per streamed chunk.
//!
//! May import: `store` (channel names), `engine` (the `Live` port the engine writes to). Used by
//! `hub` (the registry, fed by NOTIFY), the lifecycle room (subscriptions) and `jobs` (a run's
//! output).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::PgPool;
use tokio::sync::broadcast;
use uuid::Uuid;

/// A watch is said again this often while its subscribers stay.
pub const REFRESH: Duration = Duration::from_secs(2);
/// A watch not said again within this is over (its replica died, or its word was lost).
const WATCH_TTL: Duration = Duration::from_secs(6);
/// A run's text is sent at most this often per task, or when this much has gathered.
pub const COALESCE: Duration = Duration::from_millis(50);
pub const COALESCE_BYTES: usize = 1024;
/// Text per NOTIFY: escaped as JSON it stays under PostgreSQL's 8,000-byte payload limit.
const NOTIFY_TEXT_BYTES: usize = 1000;
/// Deltas a slow subscriber may fall behind by before it misses some (never the stored events).
const SUBSCRIBER_BACKLOG: usize = 256;

/// Some text of a task's run: turn `turn`'s call, try `attempt` (a retried or fallen-back call
/// starts its text again with a higher `attempt`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Delta {
    pub turn: u32,
    #[serde(rename = "try")]
    pub attempt: u32,
    pub text: String,
}

/// The task's own channel.
pub fn channel(task: Uuid) -> String {
    format!("{}{}", crate::store::CH_LIVE_PREFIX, task.simple())
}

/// This process's side of live output: its subscribers, and the watches other replicas said.
pub struct Registry {
    /// This process, as watches and deltas name it.
    pub id: Uuid,
    subscribers: Mutex<HashMap<Uuid, broadcast::Sender<Arc<Delta>>>>,
    /// Other replicas' watches: task → replica → when it was last said.
    watches: Mutex<HashMap<Uuid, HashMap<Uuid, Instant>>>,
    /// How many tasks have a subscriber here or a watch from elsewhere: 0 makes `wanted` one load.
    watched: AtomicUsize,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            id: Uuid::new_v4(),
            subscribers: Mutex::default(),
            watches: Mutex::default(),
            watched: AtomicUsize::new(0),
        }
    }
}

/// What a run's text should reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wanted {
    pub here: bool,
    pub elsewhere: bool,
}

impl Wanted {
    pub fn any(self) -> bool {
        self.here || self.elsewhere
    }
}

/// What live output needs of the process's notification hub: the registry it keeps, and a way
/// to publish on a channel. `hub` implements it, so that this file imports nothing above it.
pub trait Bus: Send + Sync + 'static {
    fn registry(&self) -> &Registry;
    fn publish(&self, channel: &'static str, payload: String);
}

/// A subscription to a task's live output; unsubscribes when dropped.
pub struct Subscription {
    hub: Arc<dyn Bus>,
    task: Uuid,
    pub rx: broadcast::Receiver<Arc<Delta>>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.registry().unsubscribe(self.task, &*self.hub);
    }
}

impl Registry {
    fn recount(&self) {
        let here: HashSet<Uuid> = self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect();
        let mut all = here;
        all.extend(self.watches.lock().unwrap_or_else(|e| e.into_inner()).keys().copied());
        self.watched.store(all.len(), Ordering::Release);
    }

    /// Follow `task`'s live output from this process.
    pub fn subscribe(&self, task: Uuid, hub: Arc<dyn Bus>) -> Subscription {
        let (rx, first) = {
            let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
            match subs.get(&task) {
                Some(tx) => (tx.subscribe(), false),
                None => {
                    let (tx, rx) = broadcast::channel(SUBSCRIBER_BACKLOG);
                    subs.insert(task, tx);
                    (rx, true)
                }
            }
        };
        if first {
            self.recount();
            hub.publish(crate::store::CH_WATCH, format!("+{task}:{}", self.id));
        }
        Subscription { hub, task, rx }
    }

    fn unsubscribe(&self, task: Uuid, hub: &dyn Bus) {
        let last = {
            let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
            // The dropping receiver is still counted while `drop` runs.
            let gone = subs.get(&task).is_some_and(|tx| tx.receiver_count() <= 1);
            if gone {
                subs.remove(&task);
            }
            gone
        };
        if last {
            self.recount();
            hub.publish(crate::store::CH_WATCH, format!("-{task}:{}", self.id));
        }
    }

    /// The tasks this process has subscribers for (its live channels to listen on).
    pub fn subscribed(&self) -> HashSet<Uuid> {
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect()
    }

    /// Where `task`'s text should go now. One load when nothing anywhere is watched.
    pub fn wanted(&self, task: Uuid) -> Wanted {
        if self.watched.load(Ordering::Acquire) == 0 {
            return Wanted::default();
        }
        let here = self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&task);
        let now = Instant::now();
        let elsewhere = self
            .watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&task)
            .is_some_and(|w| w.values().any(|at| now.duration_since(*at) < WATCH_TTL));
        Wanted { here, elsewhere }
    }

    /// A watch said on `CH_WATCH` (`+task:replica` or `-task:replica`); this process's own are
    /// not watches from elsewhere.
    pub fn watch_said(&self, payload: &str) {
        let (add, rest) = match payload.split_at_checked(1) {
            Some(("+", rest)) => (true, rest),
            Some(("-", rest)) => (false, rest),
            _ => return,
        };
        let Some((task, replica)) = rest.split_once(':') else { return };
        let (Ok(task), Ok(replica)) = (task.parse::<Uuid>(), replica.parse::<Uuid>()) else { return };
        if replica == self.id {
            return;
        }
        {
            let mut w = self.watches.lock().unwrap_or_else(|e| e.into_inner());
            if add {
                w.entry(task).or_default().insert(replica, Instant::now());
            } else if let Some(by) = w.get_mut(&task) {
                by.remove(&replica);
                if by.is_empty() {
                    w.remove(&task);
                }
            }
        }
        self.recount();
    }

    /// Forget watches not said again in time; say this process's own again.
    pub fn refresh(&self, hub: &dyn Bus) {
        let now = Instant::now();
        {
            let mut w = self.watches.lock().unwrap_or_else(|e| e.into_inner());
            w.retain(|_, by| {
                by.retain(|_, at| now.duration_since(*at) < WATCH_TTL);
                !by.is_empty()
            });
        }
        self.recount();
        for task in self.subscribed() {
            hub.publish(crate::store::CH_WATCH, format!("+{task}:{}", self.id));
        }
    }

    /// Hand a delta to this process's subscribers of `task`.
    pub fn deliver_here(&self, task: Uuid, delta: Arc<Delta>) {
        if let Some(tx) = self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).get(&task) {
            let _ = tx.send(delta);
        }
    }

    /// A delta that came by NOTIFY on a task's channel (another replica's run).
    pub fn notified(&self, channel: &str, payload: &str) {
        let Some(task) = channel.strip_prefix(crate::store::CH_LIVE_PREFIX).and_then(|t| Uuid::try_parse(t).ok())
        else {
            return;
        };
        #[derive(serde::Deserialize)]
        struct Sent {
            from: Uuid,
            turn: u32,
            #[serde(rename = "try")]
            attempt: u32,
            text: String,
        }
        let Ok(s) = serde_json::from_str::<Sent>(payload) else { return };
        if s.from == self.id {
            return;
        }
        self.deliver_here(task, Arc::new(Delta { turn: s.turn, attempt: s.attempt, text: s.text }));
    }
}

/// A run's live output: the engine writes its text here as it streams; it goes out coalesced,
/// to this process's subscribers and, while another replica watches, by NOTIFY.
pub struct Output {
    /// Itself, to start its sender from `&self`.
    me: std::sync::Weak<Output>,
    hub: Arc<dyn Bus>,
    pool: PgPool,
    task: Uuid,
    buf: Mutex<Buffer>,
    /// Wakes the sender early (a full buffer, or the end).
    kick: tokio::sync::Notify,
    sender: Mutex<Option<tokio::task::JoinHandle<()>>>,
    closing: std::sync::atomic::AtomicBool,
    /// Text is gathered in `buf` (one load, not a lock, for a run nobody watches).
    gathered: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Buffer {
    /// Deltas complete and waiting to go (an earlier call's, or a full one).
    ready: Vec<Delta>,
    /// The text of the call streaming now.
    open: Option<Delta>,
}

impl Output {
    pub fn new(hub: Arc<dyn Bus>, pool: PgPool, task: Uuid) -> Arc<Output> {
        Arc::new_cyclic(|me| Output {
            me: me.clone(),
            hub,
            pool,
            task,
            buf: Mutex::default(),
            kick: tokio::sync::Notify::new(),
            sender: Mutex::default(),
            closing: std::sync::atomic::AtomicBool::new(false),
            gathered: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Text of turn `turn`'s call, try `attempt`.
    pub fn write(&self, turn: u32, attempt: u32, piece: &str) {
        if piece.is_empty() {
            return;
        }
        if !self.hub.registry().wanted(self.task).any() {
            // Nobody watches: this piece is not kept, and neither is what was gathered before
            // it, so that a subscriber's text never has a hole (a reconnect that comes between
            // the old stream's end and the new one's start gets the text from after the gap).
            if self.gathered.swap(false, Ordering::AcqRel) {
                let mut b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
                b.ready.clear();
                b.open = None;
            }
            return;
        }
        self.gathered.store(true, Ordering::Release);
        let full = {
            let mut b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
            match &mut b.open {
                Some(d) if d.turn == turn && d.attempt == attempt => d.text.push_str(piece),
                open => {
                    if let Some(d) = open.take() {
                        b.ready.push(d);
                    }
                    b.open = Some(Delta { turn, attempt, text: piece.to_string() });
                }
            }
            if b.open.as_ref().is_some_and(|d| d.text.len() >= COALESCE_BYTES) {
                let d = b.open.take();
                b.ready.extend(d);
                true
            } else {
                false
            }
        };
        self.start_sender();
        if full {
            self.kick.notify_one();
        }
    }

    fn start_sender(&self) {
        let mut s = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        if s.is_none() && !self.closing.load(Ordering::Acquire) {
            if let Some(me) = self.me.upgrade() {
                *s = Some(tokio::spawn(async move { me.send_loop().await }));
            }
        }
    }

    async fn send_loop(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = self.kick.notified() => {}
                _ = tokio::time::sleep(COALESCE) => {}
            }
            self.send_now().await;
            if self.closing.load(Ordering::Acquire) {
                return;
            }
        }
    }

    /// Send what has gathered.
    async fn send_now(&self) {
        let out: Vec<Delta> = {
            let mut b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
            let mut out = std::mem::take(&mut b.ready);
            out.extend(b.open.take());
            out
        };
        if out.is_empty() {
            return;
        }
        let wanted = self.hub.registry().wanted(self.task);
        for d in out {
            metrics::counter!("subagentd_output_deltas_total").increment(1);
            if wanted.elsewhere {
                self.notify(&d).await;
            }
            if wanted.here {
                self.hub.registry().deliver_here(self.task, Arc::new(d));
            }
        }
    }

    async fn notify(&self, d: &Delta) {
        let channel = channel(self.task);
        for text in pieces(&d.text, NOTIFY_TEXT_BYTES) {
            let payload =
                serde_json::json!({"from": self.hub.registry().id, "turn": d.turn, "try": d.attempt, "text": text});
            let r = sqlx::query!("SELECT pg_notify($1, $2)", channel, payload.to_string()).execute(&self.pool).await;
            if let Err(e) = r {
                // Live output is best effort: the stored events carry the run's record.
                tracing::debug!(error = %e, task_id = %self.task, "live output not sent");
                return;
            }
        }
    }

    /// Send what is left and stop (before the run's end is committed, so that a subscriber has
    /// the last text before it hears of the end).
    pub async fn close(&self) {
        self.closing.store(true, Ordering::Release);
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = sender {
            self.kick.notify_one();
            let _ = h.await;
        }
        self.send_now().await;
    }
}

/// `text` in pieces of at most `max` bytes, cut at character boundaries.
fn pieces(text: &str, max: usize) -> Vec<&str> {
    let mut out = vec![];
    let mut rest = text;
    while rest.len() > max {
        let mut cut = max;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (a, b) = rest.split_at(cut);
        out.push(a);
        rest = b;
    }
    out.push(rest);
    out
}

/// The engine's `Live` port over a run's `Output`.
impl crate::engine::Live for Output {
    fn text(&self, turn: u32, attempt: u32, piece: &str) {
        self.write(turn, attempt, piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_pieces_cut_at_character_boundaries_and_join_to_the_text() {
        let text = "é".repeat(700) + "abc";
        let parts = pieces(&text, 1000);
        assert!(parts.iter().all(|p| p.len() <= 1000));
        assert_eq!(parts.concat(), text);
        assert_eq!(pieces("", 10), vec![""]);
    }

    #[test]
    fn watches_from_elsewhere_come_and_go_and_this_replicas_own_are_not_counted() {
        let r = Registry::default();
        let task = Uuid::now_v7();
        assert!(!r.wanted(task).any());
        let other = Uuid::new_v4();
        r.watch_said(&format!("+{task}:{other}"));
        assert_eq!(r.wanted(task), Wanted { here: false, elsewhere: true });
        r.watch_said(&format!("+{task}:{}", r.id));
        r.watch_said(&format!("-{task}:{other}"));
        assert!(!r.wanted(task).any(), "its own watch is not from elsewhere");
        r.watch_said("garbage");
        r.watch_said(&format!("+{task}"));
        assert!(!r.wanted(task).any());
    }
}
