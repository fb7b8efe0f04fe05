//! The rescuer: re-queues running tasks whose lease expired, fails those out of attempts
//! (`worker_lost`) and ends those whose cancel was requested. Safe on every replica at once.

use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::store::{runs, StoreError};

pub struct Rescuer {
    pub pool: PgPool,
    pub max_attempts: i32,
    pub every: Duration,
}

impl Rescuer {
    /// One sweep; returns how many tasks it rescued.
    pub async fn pass(&self) -> Result<usize, StoreError> {
        let rescued = runs::rescue(&self.pool, self.max_attempts).await?;
        for (_, status) in &rescued {
            metrics::counter!("subagentd_rescued_total", "to" => status.as_str()).increment(1);
        }
        if !rescued.is_empty() {
            tracing::warn!(count = rescued.len(), "rescued tasks with expired leases");
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
