//! Running tasks: the worker and its runs (`worker`, `run`, `run_store`, `finish`), the
//! long-running services of a worker process — the claim loop, heartbeat, rescuer, retention,
//! webhook sender and budget waker, each in its own file with a `pass` that runs once (the
//! tests' hook); and the timer (tasks at a time, schedules), which submits through the room.
//!
//! May import: the lifecycle room (`tasks`: a run's end goes through `tasks::end`; its kinds
//! and views), `hub`, `engine`, `budget`, `tools`, `llm`, `store`, `config`, `telemetry`,
//! `cache`. Never a door (`http`): the room reaches this process's worker only through the
//! `tasks::Shortcut` it plugs in.

pub mod claim;
pub mod copy;
pub mod finish;
pub mod heartbeat;
pub mod partitions;
pub mod presence;
pub mod queue_vacuum;
pub mod rescuer;
pub mod retention;
pub mod run;
pub mod run_store;
pub mod timer;
pub mod waits;
pub mod webhooks;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use worker::Worker;

/// The upkeep every process runs beside its doors and workers, until its listener stops: the
/// history's partitions kept ahead, the queue vacuumed.
pub struct Upkeep {
    partitions: tokio::task::JoinHandle<()>,
    queue_vacuum: Option<tokio::task::JoinHandle<()>>,
}

impl Upkeep {
    /// Start both (the partitions' first pass done before this returns).
    pub async fn start(pool: &sqlx::PgPool, cfg: &crate::config::Config, stop: &CancellationToken) -> Upkeep {
        let partitions = partitions::keep(pool.clone(), stop.clone()).await;
        let every = Duration::from_secs(cfg.queue_vacuum_seconds);
        Upkeep { partitions, queue_vacuum: queue_vacuum::keep(pool.clone(), every, stop.clone()) }
    }

    /// Wait for both to have stopped.
    pub async fn join(self) {
        let _ = self.partitions.await;
        if let Some(v) = self.queue_vacuum {
            let _ = v.await;
        }
    }
}

/// How often every worker process looks for lost workers' runs.
pub const RESCUE_EVERY: Duration = Duration::from_secs(1);

/// Run a worker process's services until `shutdown`: claim, keep leases, rescue, purge and
/// deliver; then drain (running sub-agents get `grace`, the rest go back to the queue) and
/// stop the background services last.
pub async fn run_worker(worker: Arc<Worker>, shutdown: CancellationToken, grace: Duration) {
    let (runner, cfg) = (worker.runner.clone(), worker.cfg().clone());
    let background = CancellationToken::new();
    let every = (cfg.lease() / 3).max(Duration::from_millis(200));
    let services = [
        heartbeat::Heartbeat {
            pool: runner.pool.clone(),
            hub: runner.hub.clone(),
            lease: cfg.lease(),
            every: cfg.heartbeat(),
        }
        .start(background.clone()),
        rescuer::Rescuer {
            pool: runner.pool.clone(),
            hub: runner.hub.clone(),
            max_attempts: cfg.max_attempts,
            every: RESCUE_EVERY,
            grace: cfg.lease(),
        }
        .start(background.clone()),
        retention::Retention {
            pool: runner.pool.clone(),
            days: cfg.retention_days,
            ledger_days: cfg.ledger_retention_days,
            mcp_idle_days: cfg.mcp_session_idle_days,
            every,
        }
        .start(background.clone()),
        webhooks::WebhookSender {
            pool: runner.pool.clone(),
            hub: runner.hub.clone(),
            caller: runner.tool_caller.clone(),
        }
        .start(background.clone()),
        waits::BudgetWaker {
            pool: runner.pool.clone(),
            hub: runner.hub.clone(),
            defaults: crate::budget::Defaults::from_config(&cfg).spend(),
            every: Duration::from_secs(2),
        }
        .start(background.clone()),
    ];
    let presence_stop = CancellationToken::new();
    let presence = presence::Presence {
        options: (*runner.pool.connect_options()).clone(),
        worker: worker.id().to_string(),
        every: Duration::from_secs(1),
    }
    .start(presence_stop.clone())
    .await;
    claim::ClaimLoop::new(worker.clone()).run(shutdown).await;
    worker.drain(grace).await;
    presence_stop.cancel();
    let _ = presence.await;
    background.cancel();
    for s in services {
        let _ = s.await;
    }
}
