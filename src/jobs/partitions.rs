//! Keeps the history's daily partitions `partitions::AHEAD_DAYS` ahead: once at start (before
//! the service takes requests) and hourly after, in every process (an API-only replica inserts
//! too). `subagentd_ensure_partitions` takes an advisory lock, so one replica at a time creates
//! them and the others find them made. The gauge `subagentd_history_partitions_ahead_days`
//! says how far ahead they reach.

use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::store::{partitions, StoreError};

/// Keep the partitions ahead in this process: a pass now, then hourly until `stop`.
pub async fn keep(pool: PgPool, stop: CancellationToken) -> JoinHandle<()> {
    Partitions { pool, every: Duration::from_secs(3600) }.start(stop).await
}

pub struct Partitions {
    pub pool: PgPool,
    pub every: Duration,
}

impl Partitions {
    /// Create what is missing and report the reach.
    pub async fn pass(&self) -> Result<i64, StoreError> {
        partitions::ensure(&self.pool, partitions::AHEAD_DAYS).await?;
        let ahead = partitions::reach(&self.pool).await?;
        metrics::gauge!("subagentd_history_partitions_ahead_days").set(ahead as f64);
        Ok(ahead)
    }

    /// One pass now (the service starts with its partitions made), then one every `every`.
    pub async fn start(self, stop: CancellationToken) -> JoinHandle<()> {
        if let Err(e) = self.pass().await {
            tracing::warn!(error = %e, "history partitions not made at start; retried hourly, and on demand");
        }
        tokio::spawn(async move {
            loop {
                tokio::select! { _ = tokio::time::sleep(self.every) => {}, _ = stop.cancelled() => return }
                if let Err(e) = self.pass().await {
                    tracing::warn!(error = %e, "history partitions not made; retried next hour, and on demand");
                }
            }
        })
    }
}
