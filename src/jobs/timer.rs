//! The timer: queues the scheduled tasks whose time has come, and makes the ticks of the
//! schedules that are due (through the lifecycle room, as any submission). Every worker process
//! runs one: a task is queued once (`SKIP LOCKED`) and a tick made once (its idempotency key),
//! whichever replica gets there. It sleeps until the next time due (at most `POLL`), and is
//! woken early when a sooner one is made (`CH_TIMER`).

use std::time::Duration;

use chrono::Utc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::tasks::Lifecycle;

/// The longest the timer sleeps: a task at a time is queued within this of it, at worst.
pub const POLL: Duration = Duration::from_secs(1);
/// The shortest wait between passes that found nothing to do.
const MIN_WAIT: Duration = Duration::from_millis(20);
/// Work taken at once; more waiting means another pass at once.
const BATCH: i64 = 500;
const TICKS: i64 = 50;
/// How long a replica holds a tick it took before another may take it.
const TICK_HOLD_SECS: f64 = 30.0;

pub struct Timer {
    pub room: Lifecycle,
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub queued: usize,
    pub ticks: usize,
}

impl Timer {
    pub fn start(self, stop: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move { self.run(stop).await })
    }

    /// Queue what is due, make the ticks that are due.
    pub async fn pass(&self) -> Result<Pass, crate::tasks::TaskError> {
        let queued = self.room.queue_due(BATCH).await?;
        let ticks = self.room.tick_due(TICKS, TICK_HOLD_SECS, Utc::now()).await?;
        Ok(Pass { queued, ticks })
    }

    async fn run(self, stop: CancellationToken) {
        loop {
            let mut wait = POLL;
            match self.pass().await {
                Ok(p) if p.queued as i64 >= BATCH || p.ticks as i64 >= TICKS => wait = Duration::ZERO,
                Ok(_) => {
                    if let Some(next) = self.room.next_due().await {
                        // A pass that did not take what is due (another replica holds it) waits a
                        // little, never zero: no replica spins on a time already past.
                        let left = (next - Utc::now()).to_std().unwrap_or(Duration::ZERO);
                        wait = left.clamp(MIN_WAIT, POLL);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "timer pass failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.room.timer_woken() => {}
                _ = stop.cancelled() => return,
            }
        }
    }
}
