//! The claim loop: takes queued tasks for this worker's free places, fairly across tenants and
//! within their running limits (`store::runs::claim`), woken by NOTIFY with a polling fallback.
//! Claims start small and double while each comes back full (a backlog), up to `claim_batch`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::worker::Worker;
use crate::store::{runs, CH_EVENT};

/// The first claim's size after the queue ran dry.
const SMALL_CLAIM: usize = 4;

pub struct ClaimLoop {
    worker: Arc<Worker>,
    /// The claim loop's own connection: claims never queue behind the runs' writes for a
    /// pooled connection (a backlog's claims otherwise waited behind each batch's reservations).
    claim_pool: PgPool,
}

impl ClaimLoop {
    pub fn new(worker: Arc<Worker>) -> ClaimLoop {
        let pool = &worker.runner.pool;
        let claim_pool = crate::db::pool_options(1).connect_lazy_with((*pool.connect_options()).clone());
        ClaimLoop { worker, claim_pool }
    }

    /// One claim for the places in `permits` (at least one); returns how many tasks it took,
    /// each started in one of the places (the rest are given back).
    pub async fn claim_into(&self, mut permits: Vec<OwnedSemaphorePermit>) -> usize {
        let w = &self.worker;
        let asked = permits.len();
        let generation = w.hub().queued_generation();
        let claimed = runs::claim(
            &self.claim_pool,
            asked as i64,
            w.cfg().lease().as_secs_f64(),
            w.id(),
            w.cfg().default_max_running,
        )
        .await;
        match claimed {
            Ok(rows) => {
                let n = rows.len();
                if n < asked {
                    w.empty_at.store(generation, Ordering::Release);
                }
                for row in rows {
                    w.hub().publish(CH_EVENT, row.id.to_string());
                    let Some(p) = permits.pop() else { break };
                    w.spawn_run(row, None, p, false);
                }
                n
            }
            Err(e) => {
                tracing::warn!(error = %e, "claim failed");
                0
            }
        }
    }

    /// One pass for the tests: claim for as many free places as there are, up to `most`.
    pub async fn pass(&self, most: usize) -> usize {
        let permits = self.free_places(most);
        if permits.is_empty() {
            return 0;
        }
        self.claim_into(permits).await
    }

    fn free_places(&self, most: usize) -> Vec<OwnedSemaphorePermit> {
        let mut permits = vec![];
        while permits.len() < most {
            match self.worker.sem.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        permits
    }

    /// Claim until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let w = self.worker.clone();
        let most = w.cfg().claim_batch.max(1);
        let small = SMALL_CLAIM.min(most);
        let mut batch = small;
        loop {
            let Some(first) = (tokio::select! {
                p = w.sem.clone().acquire_owned() => p.ok(),
                _ = stop.cancelled() => None,
            }) else {
                break;
            };
            let mut permits = vec![first];
            permits.extend(self.free_places(batch - 1));
            // Register for the wake-up before claiming, so a NOTIFY during the claim counts.
            let woken = w.hub().queued.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let asked = permits.len();
            let n = self.claim_into(permits).await;
            batch = if n > 0 && n == asked { (batch * 2).min(most) } else { small };
            if n == 0 {
                tokio::select! {
                    _ = &mut woken => {}
                    _ = tokio::time::sleep(w.cfg().poll_interval()) => {}
                    _ = stop.cancelled() => break,
                }
            }
        }
    }
}
