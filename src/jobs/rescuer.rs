//! The rescuer: re-queues running tasks whose worker is gone — its lease expired, or its
//! database session is gone (see `presence`) — recording the call it had in flight; fails those
//! out of attempts (`worker_lost`) and ends those whose cancel was requested. Safe on every
//! replica at once; every second.

use std::time::Duration;

use std::sync::Arc;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::hub::Hub;
use crate::store::StoreError;
use crate::tasks::end::{self, End, Ended};

pub struct Rescuer {
    pub pool: PgPool,
    /// Wakes the waiters of the tasks it ends, and the workers for those it queues.
    pub hub: Arc<Hub>,
    pub max_attempts: i32,
    pub every: Duration,
    /// After a restart of the database, how long workers have to register again before their
    /// runs count as lost (the lease, by default).
    pub grace: Duration,
}

impl Rescuer {
    /// One sweep; returns how many tasks it rescued.
    pub async fn pass(&self) -> Result<usize, StoreError> {
        let rescue = End::Rescue { max_attempts: self.max_attempts, grace_secs: self.grace.as_secs_f64() };
        let Ended::Rescue(rescued) = end::finish(&self.pool, &self.hub, rescue).await? else { return Ok(0) };
        for (_, status) in &rescued {
            metrics::counter!("subagentd_rescued_total", "to" => status.as_str()).increment(1);
        }
        if !rescued.is_empty() {
            tracing::warn!(count = rescued.len(), "rescued tasks of lost workers (expired leases, or sessions gone)");
            crate::store::workers::forget_dead(&self.pool, self.grace.as_secs_f64()).await?;
        }
        Ok(rescued.len())
    }

    pub fn start(self, stop: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::select! { _ = tokio::time::sleep(self.every) => {}, _ = stop.cancelled() => return }
                if let Err(e) = self.pass().await {
                    tracing::warn!(error = %e, "rescuer failed");
                }
            }
        })
    }
}
