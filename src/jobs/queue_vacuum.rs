//! Vacuums the queue every `--queue-vacuum-seconds` in this process (every process writes it:
//! submits, claims, ends). `VACUUM (SKIP_LOCKED)`: a pass that finds another replica's under way
//! is skipped, so replicas never queue behind each other.

use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::store::runs;

/// Vacuum the queue every `every` until `stop`; nothing when `every` is zero.
pub fn keep(pool: PgPool, every: Duration, stop: CancellationToken) -> Option<JoinHandle<()>> {
    if every.is_zero() {
        return None;
    }
    Some(tokio::spawn(async move {
        loop {
            tokio::select! { _ = tokio::time::sleep(every) => {}, _ = stop.cancelled() => return }
            if let Err(e) = runs::vacuum_queue(&pool).await {
                tracing::warn!(error = %e, "queue not vacuumed; tried again next pass");
            }
        }
    }))
}
