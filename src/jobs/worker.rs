//! The worker: this process's runs, under a semaphore of `max_running` places. Runs come from
//! the claim loop (`claim`) or start here directly for a waiting request (`take_slot` and
//! `start`); the drain gives running sub-agents a grace period, then releases the rest.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use uuid::Uuid;

use super::run::Runner;
use crate::config::Config;
use crate::engine::spec::TaskOptions;
use crate::engine::StopCause;
use crate::hub::Hub;
use crate::llm::Providers;
use crate::store::tasks::{FirstCall, NewTask, StartHere, TaskRow};
use crate::store::{retrying, runs, Fence, CH_QUEUED};
use crate::tasks::{Place, Shortcut};
use crate::tools::Caller;

pub struct Worker {
    pub(super) runner: Arc<Runner>,
    pub(super) id: String,
    pub(super) sem: Arc<Semaphore>,
    /// Every run of this worker, claimed or started here; closed when the drain begins.
    runs: TaskTracker,
    /// `Hub::queued_generation` as it was before the last claim that came back short (`u64::MAX`
    /// until one has): while it is still current, nothing claimable is known to be queued.
    pub(super) empty_at: AtomicU64,
}

/// A place in this worker, taken for a waiting request's task so that it starts here at once
/// instead of going through the queue (see `Worker::take_slot`).
pub struct Slot {
    permit: OwnedSemaphorePermit,
    /// Holds the drain until the run is started (or the slot dropped).
    _tracked: TaskTrackerToken,
    pub start: StartHere,
}

impl Worker {
    pub fn new(
        pool: PgPool,
        hub: Arc<Hub>,
        providers: impl Into<Arc<Providers>>,
        tool_caller: Caller,
        cfg: Arc<Config>,
        workspaces: Arc<crate::workspace::Workspaces>,
    ) -> Arc<Worker> {
        let id = format!("{}-{}", hostname(), std::process::id());
        Arc::new(Worker {
            sem: Arc::new(Semaphore::new(cfg.max_running.max(1))),
            runner: Arc::new(Runner {
                committer: crate::store::committer::Committer::start(pool.clone()),
                pool,
                hub,
                providers: providers.into(),
                tool_caller,
                cfg,
                secrets: crate::cache::TtlCache::new(Duration::from_secs(60)),
                draining: CancellationToken::new(),
                workspaces,
            }),
            id,
            runs: TaskTracker::new(),
            empty_at: AtomicU64::new(u64::MAX),
        })
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.runner.hub
    }

    pub fn cfg(&self) -> &Arc<Config> {
        &self.runner.cfg
    }

    /// This worker's id, as leases record it (`host-pid`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A free place for a task submitted with `wait=true`, to be inserted already running
    /// under this worker's lease and started by `start`, which saves the claim's round trip and
    /// its transaction. `None` while draining, when every place is taken, or when claimable
    /// tasks may be queued (work was queued since the last claim that came back short): a task
    /// started here does not overtake one the claim could take. Tasks of a tenant at its running
    /// limit may still be queued; they wait for their tenant either way. The caller also leaves
    /// out tenants with a running limit, which only the claim keeps exact.
    pub fn take_slot(&self) -> Option<Slot> {
        // Tracked before the check: a drain that closes the tracker after it waits for this.
        let tracked = self.runs.token();
        if self.runs.is_closed() || self.empty_at.load(Ordering::Acquire) != self.hub().queued_generation() {
            return None;
        }
        let permit = self.sem.clone().try_acquire_owned().ok()?;
        Some(Slot {
            permit,
            _tracked: tracked,
            start: StartHere {
                lease: Uuid::new_v4(),
                worker: self.id.clone(),
                lease_secs: self.cfg().lease().as_secs_f64(),
                first_call: None,
            },
        })
    }

    /// What the first provider call of `t` will reserve, to be written with it (see
    /// `Runner::first_call`).
    pub fn first_call(&self, t: &NewTask, opts: &TaskOptions) -> Option<FirstCall> {
        self.runner.first_call(t, opts)
    }

    /// Run a task inserted with `slot`'s lease (`row` as the insert returned it), its first
    /// call already reserved if `first_reserved`.
    pub fn start(self: &Arc<Self>, row: TaskRow, opts: TaskOptions, slot: Slot, first_reserved: bool) {
        metrics::counter!("subagentd_direct_starts_total").increment(1);
        self.spawn_run(row, Some(opts), slot.permit, first_reserved);
    }

    /// Give back a task inserted with `slot` that could not be started (its insert failed on
    /// the server's side, and may have been committed all the same): released to the queue,
    /// in the background, if it was written.
    pub fn abandon(self: &Arc<Self>, id: Uuid, slot: Slot) {
        let (pool, hub) = (self.runner.pool.clone(), self.hub().clone());
        let fence = Fence { id, lease: slot.start.lease };
        self.runs.spawn(async move {
            let _slot = slot;
            match retrying(&pool, || runs::release(&pool, fence)).await {
                Ok(true) => hub.publish(CH_QUEUED, String::new()),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "release failed; the lease will expire and the task be rescued"),
            }
        });
    }

    /// Run a claimed task in one of this worker's places (`permit`).
    pub(super) fn spawn_run(
        &self,
        row: TaskRow,
        opts: Option<TaskOptions>,
        permit: OwnedSemaphorePermit,
        first_reserved: bool,
    ) {
        let runner = self.runner.clone();
        let trace_id = row.traceparent.as_deref().map(crate::telemetry::trace_id).unwrap_or("").to_string();
        let span = tracing::info_span!("run", task_id = %row.id, attempt = row.attempt, trace_id = %trace_id);
        if let Some(tp) = &row.traceparent {
            crate::telemetry::continue_trace(&span, tp);
        }
        self.runs.spawn(
            async move {
                let _permit = permit;
                runner.run_task(row, opts, first_reserved).await
            }
            .instrument(span),
        );
    }

    /// Stop taking runs; give the running ones `grace` to finish, then stop them and release
    /// their tasks to the queue (every run's own end does the release).
    pub async fn drain(&self, grace: Duration) {
        self.runs.close();
        if self.runs.is_empty() {
            return;
        }
        tracing::info!(running = self.runs.len(), grace_ms = grace.as_millis() as u64, "draining");
        if tokio::time::timeout(grace, self.runs.wait()).await.is_err() {
            self.runner.draining.cancel();
            for id in self.hub().running_ids() {
                self.hub().stop_run(id, StopCause::Drain);
            }
            self.runs.wait().await;
        }
    }
}

/// This worker as the lifecycle room's `Shortcut`: a waiting request's task starts in it.
struct Here(Arc<Worker>);

/// A place taken in this worker, for the room.
struct Taken(Arc<Worker>, Slot);

impl Shortcut for Here {
    fn take(&self, new: &NewTask, opts: &TaskOptions) -> Option<(StartHere, Box<dyn Place>)> {
        let slot = self.0.take_slot()?;
        let start = StartHere { first_call: self.0.first_call(new, opts), ..slot.start.clone() };
        Some((start, Box::new(Taken(self.0.clone(), slot))))
    }
}

impl Place for Taken {
    fn start(self: Box<Self>, row: TaskRow, opts: TaskOptions, first_reserved: bool) {
        let Taken(w, slot) = *self;
        w.start(row, opts, slot, first_reserved);
    }

    fn abandon(self: Box<Self>, id: Uuid) {
        let Taken(w, slot) = *self;
        w.abandon(id, slot);
    }
}

impl Worker {
    /// This worker as the room's shortcut for waiting requests.
    pub fn shortcut(self: &Arc<Self>) -> Arc<dyn Shortcut> {
        Arc::new(Here(self.clone()))
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "host".into())
}
