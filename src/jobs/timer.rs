//! The timer: queues the scheduled tasks whose time has come, and makes the ticks of the
//! schedules that are due (through the lifecycle room, as any submission). Every worker process
//! runs one: a task is queued once (`SKIP LOCKED`) and a tick made once (its idempotency key),
//! whichever replica gets there. It sleeps until the next time due (at most `POLL`), and is
//! woken early when a sooner one is made (`CH_TIMER`).

use std::time::Duration;

use chrono::Utc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::store::{schedules, tasks as store, CH_EVENT, CH_QUEUED};
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
        let room = &self.room;
        let ids = store::queue_due(&room.pool, BATCH).await?;
        if !ids.is_empty() {
            room.hub.publish(CH_QUEUED, String::new());
            for id in &ids {
                room.hub.publish(CH_EVENT, id.to_string());
            }
        }
        let due = schedules::take_due(&room.pool, TICKS, TICK_HOLD_SECS).await?;
        for s in &due {
            if let Err(e) = room.tick(s, Utc::now()).await {
                tracing::warn!(error = %e, schedule = %s.name, tenant = %s.tenant, "schedule tick not made; retried");
            }
        }
        Ok(Pass { queued: ids.len(), ticks: due.len() })
    }

    async fn run(self, stop: CancellationToken) {
        loop {
            let mut wait = POLL;
            match self.pass().await {
                Ok(p) if p.queued as i64 >= BATCH || p.ticks as i64 >= TICKS => wait = Duration::ZERO,
                Ok(_) => {
                    if let Some(next) = self.next_due().await {
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
                _ = self.room.hub.timer.notified() => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// The soonest time due: a scheduled task's, or a schedule's.
    async fn next_due(&self) -> Option<chrono::DateTime<Utc>> {
        let pool = &self.room.pool;
        let a = store::next_run_at(pool).await.ok().flatten();
        let b = schedules::next_due(pool).await.ok().flatten();
        [a, b].into_iter().flatten().min()
    }
}
