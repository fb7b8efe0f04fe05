//! Heartbeat: renews every lease this process holds in one statement, and stops the runs whose
//! lease was lost or whose cancel was requested (a missed NOTIFY costs at most one beat).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::engine::StopCause;
use crate::hub::Hub;
use crate::store::{runs, StoreError};

pub struct Heartbeat {
    pub pool: PgPool,
    pub hub: Arc<Hub>,
    pub lease: Duration,
    pub every: Duration,
}

impl Heartbeat {
    /// One beat; returns how many leases it renewed (a lease whose row a write holds locked just
    /// then waits for the next beat).
    pub async fn pass(&self) -> Result<usize, StoreError> {
        let held = self.hub.running_fences();
        if held.is_empty() {
            return Ok(0);
        }
        let beats = runs::heartbeat(&self.pool, &held, self.lease.as_secs_f64()).await?;
        let alive: HashMap<Uuid, runs::Beat> = beats.into_iter().map(|b| (b.id, b)).collect();
        for f in &held {
            match alive.get(&f.id) {
                None => {
                    self.hub.stop_run(f.id, StopCause::LeaseLost);
                }
                Some(b) if b.cancel_requested => {
                    self.hub.stop_run(f.id, StopCause::Cancelled);
                }
                Some(_) => {}
            }
        }
        Ok(alive.values().filter(|b| b.renewed).count())
    }

    pub fn start(self, stop: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! { _ = tick.tick() => {}, _ = stop.cancelled() => return }
                // A failed beat (the database away) is tried again every second, so that leases
                // are renewed as soon as it is back.
                while let Err(e) = self.pass().await {
                    tracing::warn!(error = %e, "heartbeat failed; retrying in a second");
                    tokio::select! { _ = tokio::time::sleep(Duration::from_secs(1)) => {}, _ = stop.cancelled() => return }
                }
            }
        })
    }
}
