//! The worker pool: claims tasks, runs each sub-agent under a semaphore, keeps leases alive,
//! rescues tasks of dead workers, and drains on shutdown.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use uuid::Uuid;

use super::hub::Hub;
use super::run_store::PgRunStore;
use crate::config::Config;
use crate::engine::agents::{compose_system_prompt, AgentType};
use crate::engine::spec::TaskOptions;
use crate::engine::{self, Outcome, RunInput, StopCause, StopSignal};
use crate::llm::{Message, ModelRef, Providers};
use crate::store::runs::{self, Fence, Finish};
use crate::store::tasks::{FirstCall, NewTask, TaskRow};
use crate::tools::{Caller, Target, TaskTools};

/// How a run's outcome is written to its task; `None` when the run ends without a terminal
/// state (drained back to the queue, or its lease lost). `agent` and `limit` (the time limit)
/// only word the summary of a timeout.
pub fn finish_for(outcome: &Outcome, agent: &str, limit: Option<f64>) -> Option<Finish> {
    let fin = |status, stop_reason: Option<&str>, summary: Option<String>| Finish {
        status,
        stop_reason: stop_reason.map(Into::into),
        summary,
        error_code: None,
        error_message: None,
        return_task: false,
    };
    Some(match outcome {
        Outcome::Completed { summary } => fin("completed", Some("final_answer"), Some(summary.clone())),
        Outcome::Incomplete { stop_reason, summary } => fin("incomplete", Some(stop_reason), Some(summary.clone())),
        Outcome::Failed { code, message } => {
            Finish { error_code: Some(code.clone()), error_message: Some(message.clone()), ..fin("failed", None, None) }
        }
        Outcome::Stopped(StopCause::Cancelled) => fin("cancelled", Some("cancelled"), None),
        Outcome::Stopped(StopCause::Timeout) => fin(
            "incomplete",
            Some("timeout"),
            Some(format!("(sub-agent {agent} stopped: its time limit of {} s was reached)", limit.unwrap_or(0.0))),
        ),
        Outcome::Stopped(StopCause::Budget(limit)) => fin(
            "incomplete",
            Some("budget"),
            Some(format!("(sub-agent stopped: the {limit} budget would be exceeded)")),
        ),
        Outcome::Stopped(StopCause::Drain | StopCause::LeaseLost) => return None,
    })
}

/// A fresh task's conversation: `[system, user]`.
fn fresh_start(prompt: &str, opts: &TaskOptions, agent: AgentType) -> Vec<Message> {
    let base = opts
        .system_prompt
        .clone()
        .or_else(|| opts.agent.as_ref().map(|d| d.system_prompt.clone()))
        .unwrap_or_else(|| agent.system_prompt());
    let system = compose_system_prompt(&base, opts.parent_context.as_deref());
    engine::fresh_conversation(system, prompt.to_string())
}

/// The first claim's size after the queue ran dry (see `Worker::run`).
const SMALL_CLAIM: usize = 4;

pub struct Worker {
    pool: PgPool,
    /// The claim loop's own connection: claims never queue behind the runs' writes for a
    /// pooled connection (a backlog's claims otherwise waited behind each batch's reservations).
    claim_pool: PgPool,
    hub: Arc<Hub>,
    providers: Providers,
    tool_caller: Caller,
    cfg: Arc<Config>,
    id: String,
    sem: Arc<Semaphore>,
    /// Tenants' signing secrets, cached a minute.
    secrets: crate::cache::TtlCache<String>,
    /// Every run of this worker, claimed or started here; closed when the drain begins.
    runs: TaskTracker,
    /// Fired when the drain's grace runs out: runs still going are stopped and released, and so
    /// is one that starts after that (from a place taken before the drain).
    draining: CancellationToken,
    /// `Hub::queued_generation` as it was before the last claim that came back short (`u64::MAX`
    /// until one has): while it is still current, nothing claimable is known to be queued.
    empty_at: AtomicU64,
}

/// A place in this worker, taken for a waiting request's task so that it starts here at once
/// instead of going through the queue (see `Worker::take_slot`).
pub struct Slot {
    permit: OwnedSemaphorePermit,
    /// Holds the drain until the run is started (or the slot dropped).
    _tracked: TaskTrackerToken,
    pub start: crate::store::tasks::StartHere,
}

impl Worker {
    pub fn new(
        pool: PgPool,
        hub: Arc<Hub>,
        providers: Providers,
        tool_caller: Caller,
        cfg: Arc<Config>,
    ) -> Arc<Worker> {
        let id = format!("{}-{}", hostname(), std::process::id());
        let claim_pool = crate::db::pool_options(1).connect_lazy_with((*pool.connect_options()).clone());
        Arc::new(Worker {
            sem: Arc::new(Semaphore::new(cfg.max_running.max(1))),
            claim_pool,
            pool,
            hub,
            providers,
            tool_caller,
            cfg,
            id,
            secrets: crate::cache::TtlCache::new(Duration::from_secs(60)),
            runs: TaskTracker::new(),
            draining: CancellationToken::new(),
            empty_at: AtomicU64::new(u64::MAX),
        })
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
        if self.runs.is_closed() || self.empty_at.load(Ordering::Acquire) != self.hub.queued_generation() {
            return None;
        }
        let permit = self.sem.clone().try_acquire_owned().ok()?;
        Some(Slot {
            permit,
            _tracked: tracked,
            start: crate::store::tasks::StartHere {
                lease: Uuid::new_v4(),
                worker: self.id.clone(),
                lease_secs: self.cfg.lease().as_secs_f64(),
                first_call: None,
            },
        })
    }

    /// Run a task inserted with `slot`'s lease (`row` as the insert returned it), its first
    /// call already reserved if `reserved` (see `first_call`).
    pub fn start(self: &Arc<Self>, row: TaskRow, slot: Slot, reserved: Option<Value>) {
        metrics::counter!("subagentd_direct_starts_total").increment(1);
        self.spawn_run(row, slot.permit, reserved);
    }

    /// Give back a task inserted with `slot` that could not be started (its insert failed on
    /// the server's side, and may have been committed all the same): released to the queue,
    /// in the background, if it was written.
    pub fn abandon(self: &Arc<Self>, id: Uuid, slot: Slot) {
        let (pool, hub) = (self.pool.clone(), self.hub.clone());
        let fence = Fence { id, lease: slot.start.lease };
        self.runs.spawn(async move {
            let _slot = slot;
            match retry_db(|| runs::release(&pool, fence)).await {
                Ok(true) => hub.publish(crate::store::CH_QUEUED, String::new()),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "release failed; the lease will expire and the task be rescued"),
            }
        });
    }

    fn spawn_run(self: &Arc<Self>, row: TaskRow, permit: OwnedSemaphorePermit, reserved: Option<Value>) {
        let this = self.clone();
        let trace_id = row.traceparent.as_deref().map(crate::telemetry::trace_id).unwrap_or("").to_string();
        let span = tracing::info_span!("run", task_id = %row.id, attempt = row.attempt, trace_id = %trace_id);
        if let Some(tp) = &row.traceparent {
            crate::telemetry::continue_trace(&span, tp);
        }
        self.runs.spawn(async move { this.run_task(row, permit, reserved).await }.instrument(span));
    }

    /// Run the claim loop, heartbeats and the rescuer until `shutdown`; then drain: stop
    /// claiming, give running sub-agents `grace` to finish, release the rest to the queue.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken, grace: Duration) {
        let background = CancellationToken::new();
        let hb = tokio::spawn(self.clone().heartbeat_loop(background.clone()));
        let rescuer = tokio::spawn(self.clone().rescue_loop(background.clone()));
        let webhooks = tokio::spawn(super::webhooks::run(
            self.pool.clone(),
            self.hub.clone(),
            self.tool_caller.clone(),
            background.clone(),
        ));
        // Claims start small and double while each comes back full (a backlog), up to
        // `claim_batch`: one large claim delays every task in it until all are written, which
        // costs latency when the queue is short; a backlog is still taken in large batches.
        let (small, most) = (SMALL_CLAIM.min(self.cfg.claim_batch.max(1)), self.cfg.claim_batch.max(1));
        let mut batch = small;
        loop {
            let Some(permit) = (tokio::select! {
                p = self.sem.clone().acquire_owned() => p.ok(),
                _ = shutdown.cancelled() => None,
            }) else {
                break;
            };
            let mut permits = vec![permit];
            while permits.len() < batch {
                match self.sem.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            // Register for the wake-up before claiming, so a NOTIFY during the claim counts.
            let woken = self.hub.queued.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let asked = permits.len();
            let generation = self.hub.queued_generation();
            let claimed = runs::claim(
                &self.claim_pool,
                asked as i64,
                self.cfg.lease().as_secs_f64(),
                &self.id,
                self.cfg.default_max_running,
            )
            .await;
            let n = match claimed {
                Ok(rows) => {
                    let n = rows.len();
                    if n < asked {
                        self.empty_at.store(generation, Ordering::Release);
                    }
                    for row in rows {
                        self.hub.publish(crate::store::CH_EVENT, row.id.to_string());
                        let Some(p) = permits.pop() else { break };
                        self.spawn_run(row, p, None);
                    }
                    n
                }
                Err(e) => {
                    tracing::warn!(error = %e, "claim failed");
                    0
                }
            };
            batch = if n > 0 && n == asked { (batch * 2).min(most) } else { small };
            drop(permits);
            if n == 0 {
                tokio::select! {
                    _ = &mut woken => {}
                    _ = tokio::time::sleep(self.cfg.poll_interval()) => {}
                    _ = shutdown.cancelled() => break,
                }
            }
        }
        // Drain.
        self.runs.close();
        if !self.runs.is_empty() {
            tracing::info!(running = self.runs.len(), grace_ms = grace.as_millis() as u64, "draining");
            if tokio::time::timeout(grace, self.runs.wait()).await.is_err() {
                self.draining.cancel();
                for id in self.hub.running_ids() {
                    self.hub.stop_run(id, StopCause::Drain);
                }
                self.runs.wait().await;
            }
        }
        background.cancel();
        let _ = hb.await;
        let _ = rescuer.await;
        let _ = webhooks.await;
    }

    async fn run_task(self: Arc<Self>, row: TaskRow, _permit: OwnedSemaphorePermit, reserved: Option<Value>) {
        let Some(lease) = row.lease_token else { return };
        let fence = Fence { id: row.id, lease };
        metrics::counter!("subagentd_claims_total").increment(1);
        if row.attempt == 1 {
            let wait = (chrono::Utc::now() - row.created_at).to_std().unwrap_or_default();
            metrics::histogram!("subagentd_queue_wait_seconds").record(wait.as_secs_f64());
        }
        metrics::gauge!("subagentd_active_runs").increment(1.0);
        let _active = ActiveRun;
        let stop = StopSignal::new();
        self.hub.register_run(fence, stop.clone());
        // Unregistered however the run ends, a panic included: the lease then lapses and the
        // rescuer takes the task, instead of a heartbeat keeping it `running` forever.
        let _registered = Registered(&self.hub, row.id);
        if row.cancel_requested {
            stop.stop(StopCause::Cancelled);
        }
        // Registered after the drain's sweep: stop as the sweep would have.
        if self.draining.is_cancelled() {
            stop.stop(StopCause::Drain);
        }
        // The time limit runs from the task's first start, across attempts.
        let limit = serde_json::from_value::<TaskOptions>(row.options.clone()).ok().and_then(|o| o.timeout_seconds);
        let timer = limit.map(|secs| {
            let started = row.started_at.unwrap_or_else(chrono::Utc::now);
            let limit = chrono::Duration::milliseconds((secs * 1000.0).min(1e12) as i64);
            let left =
                started.checked_add_signed(limit).map_or(chrono::Duration::days(365), |end| end - chrono::Utc::now());
            let left = left.to_std().unwrap_or(Duration::ZERO);
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(left).await;
                stop.stop(StopCause::Timeout);
            })
        });
        let (outcome, finished) = self.execute(&row, fence, &stop, reserved).await;
        if let Some(t) = timer {
            t.abort();
        }
        let Some(fin) = finish_for(&outcome, &row.subagent_type, limit) else {
            match outcome {
                Outcome::Stopped(StopCause::Drain) => match retry_db(|| runs::release(&self.pool, fence)).await {
                    Ok(true) => self.hub.publish(crate::store::CH_QUEUED, String::new()),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "release failed; the lease will expire and the task be rescued")
                    }
                },
                _ => tracing::warn!("lease lost: this worker writes nothing more for the task"),
            }
            return;
        };
        // The last checkpoint may already have ended the task, in the same commit.
        let fin = Finish { return_task: self.hub.has_waiters(row.id), ..fin };
        let written = match finished {
            Some(done) => Ok(done),
            None => retry_db(|| runs::finish(&self.pool, fence, &fin)).await,
        };
        match written {
            Ok(done @ (runs::Committed::Finished(_) | runs::Committed::Applied)) => {
                match done {
                    runs::Committed::Finished(Some(task)) => self.hub.finished_here(*task),
                    _ => self.hub.publish(crate::store::CH_DONE, row.id.to_string()),
                }
                metrics::counter!("subagentd_tasks_finished_total", "status" => fin.status).increment(1);
                if let Some(started) = row.started_at {
                    let took = (chrono::Utc::now() - started).to_std().unwrap_or_default();
                    metrics::histogram!("subagentd_run_duration_seconds").record(took.as_secs_f64());
                }
                tracing::info!(status = fin.status, "task finished")
            }
            Ok(runs::Committed::LeaseLost) => tracing::warn!("lease lost before finish; another attempt owns the task"),
            Err(e) => {
                tracing::error!(error = %e, "finish failed; the lease will expire and the task be rescued")
            }
        }
    }

    /// Run the sub-agent; also gives the finished task if its last checkpoint ended it.
    async fn execute(
        &self,
        row: &TaskRow,
        fence: Fence,
        stop: &StopSignal,
        reserved: Option<Value>,
    ) -> (Outcome, Option<runs::Committed>) {
        let store = PgRunStore {
            pool: self.pool.clone(),
            fence,
            attempt: row.attempt,
            budgets: self.cfg.budget_defaults(),
            hub: self.hub.clone(),
            finished: Default::default(),
            reserved: reserved.into(),
        };
        let outcome = self.prepare_and_run(row, &store, stop).await;
        (outcome, store.finished.into_inner().unwrap_or_else(|e| e.into_inner()))
    }

    async fn prepare_and_run(&self, row: &TaskRow, store: &PgRunStore, stop: &StopSignal) -> Outcome {
        let internal = |m: String| Outcome::Failed { code: "internal".into(), message: m };
        let opts: TaskOptions = match serde_json::from_value(row.options.clone()) {
            Ok(o) => o,
            Err(e) => return internal(format!("bad task options: {e}")),
        };
        let model = match self.providers.resolve(&row.model) {
            Ok(m) => m,
            Err(_) => {
                return Outcome::Failed {
                    code: "unknown_model".into(),
                    message: format!("model {:?} has no configured provider on this worker", row.model),
                }
            }
        };
        let Some(provider) = self.providers.for_model(&model) else {
            return internal("provider vanished".into());
        };
        let agent = AgentType::parse(&row.subagent_type).unwrap_or(AgentType::General);
        let load = |id| async move {
            let raw = retry_db(|| runs::messages(&self.pool, id))
                .await
                .map_err(|_| Outcome::Stopped(StopCause::LeaseLost))?;
            raw.into_iter()
                .map(serde_json::from_value::<Message>)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| internal(format!("bad saved conversation: {e}")))
        };
        // A rescued attempt continues its own checkpoint; a first attempt starts fresh, or
        // from its parent's conversation when it resumes one.
        let (history, new_messages) = if row.turns > 0 {
            match load(row.id).await {
                Ok(h) => (h, vec![]),
                Err(o) => return o,
            }
        } else if let Some(parent) = opts.resume_from {
            match load(parent).await {
                Ok(mut h) if !h.is_empty() => {
                    h.push(Message::User { content: row.prompt.clone() });
                    (vec![], h)
                }
                Ok(_) => {
                    return Outcome::Failed {
                        code: "resume_unavailable".into(),
                        message: format!("the conversation of task {parent} is no longer stored"),
                    }
                }
                Err(o) => return o,
            }
        } else {
            (vec![], fresh_start(&row.prompt, &opts, agent))
        };
        let tools = match self.task_tools(row, &opts).await {
            Ok(t) => t,
            Err(o) => return o,
        };
        let input = self.run_input(
            row.turns,
            row.traceparent.as_deref(),
            &row.subagent_type,
            &opts,
            &model,
            history,
            new_messages,
        );
        engine::run(input, provider.as_ref(), &tools, store, stop).await
    }

    /// The run's input; `turns`, `traceparent` and `agent_name` are the task's.
    #[allow(clippy::too_many_arguments)]
    fn run_input(
        &self,
        turns: i32,
        traceparent: Option<&str>,
        agent_name: &str,
        opts: &TaskOptions,
        model: &ModelRef,
        history: Vec<Message>,
        new_messages: Vec<Message>,
    ) -> RunInput {
        RunInput {
            provider_name: model.provider.clone(),
            price: self.providers.price(model),
            model: model.model.clone(),
            history,
            new_messages,
            turns_done: turns.max(0) as u32,
            max_turns: opts.max_turns,
            tools: opts.tools.iter().map(|t| t.spec()).collect(),
            tool_concurrency: self.cfg.tool_concurrency.max(1),
            max_tokens: Some(self.cfg.max_output_tokens.max(1)),
            traceparent: traceparent.map(Into::into),
            retry: self.providers.retry,
            agent: agent_name.to_string(),
        }
    }

    /// What the first provider call of `t`, about to start here, will reserve, so that the
    /// reservation can be written with the task (one commit less before the call; the run's
    /// own first reservation then finds it written). `None` for a task whose run will reserve
    /// for itself: one that does not start fresh, or whose model is unknown here.
    pub fn first_call(&self, t: &NewTask) -> Option<FirstCall> {
        let opts = serde_json::from_value::<TaskOptions>(t.options.clone()).ok()?;
        let model = self.providers.resolve(&t.model).ok()?;
        if opts.resume_from.is_some() || self.providers.for_model(&model).is_none() {
            return None;
        }
        let agent = AgentType::parse(&t.subagent_type).unwrap_or(AgentType::General);
        let fresh = fresh_start(&t.prompt, &opts, agent);
        let input = self.run_input(0, t.traceparent.as_deref(), &t.subagent_type, &opts, &model, vec![], fresh);
        let (usd, tokens, started) = engine::first_reservation(&input);
        Some(FirstCall { usd, tokens: tokens as i64, started, defaults: self.cfg.budget_defaults() })
    }

    /// The run's tools, with what calling them needs: the tenant's signing secret for HTTP
    /// tools, the sources' headers for MCP tools.
    async fn task_tools(&self, row: &TaskRow, opts: &TaskOptions) -> Result<TaskTools, Outcome> {
        let mut t = TaskTools {
            caller: self.tool_caller.clone(),
            defs: opts.tools.clone(),
            task_id: row.id,
            tenant_secret: None,
            traceparent: row.traceparent.as_deref().map(crate::telemetry::child),
            mcp_headers: Default::default(),
        };
        if opts.tools.iter().any(|d| matches!(d.target, Target::Http { .. })) {
            // Cached a minute: a rotated secret signs calls within that time.
            let secret = match self.secrets.get(&row.tenant) {
                Some(s) => s,
                None => {
                    let s = retry_db(|| crate::store::tools::signing_secret(&self.pool, &row.tenant))
                        .await
                        .map_err(|_| Outcome::Stopped(StopCause::LeaseLost))?;
                    self.secrets.put(&row.tenant, s.clone());
                    s
                }
            };
            t.tenant_secret = Some(secret);
        }
        if opts.tools.iter().any(|d| matches!(d.target, Target::Mcp { .. })) {
            let sources = retry_db(|| crate::store::tools::sources(&self.pool, &row.tenant))
                .await
                .map_err(|_| Outcome::Stopped(StopCause::LeaseLost))?;
            for s in sources {
                t.mcp_headers.insert(s.name, s.headers.0.into_iter().collect());
            }
        }
        Ok(t)
    }

    async fn heartbeat_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.cfg.heartbeat());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! { _ = tick.tick() => {}, _ = stop.cancelled() => return }
            let held = self.hub.running_fences();
            if held.is_empty() {
                continue;
            }
            match runs::heartbeat(&self.pool, &held, self.cfg.lease().as_secs_f64()).await {
                Ok(alive) => {
                    let alive: std::collections::HashMap<Uuid, bool> = alive.into_iter().collect();
                    for f in &held {
                        match alive.get(&f.id) {
                            None => {
                                self.hub.stop_run(f.id, StopCause::LeaseLost);
                            }
                            Some(true) => {
                                self.hub.stop_run(f.id, StopCause::Cancelled);
                            }
                            Some(false) => {}
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
            }
        }
    }

    async fn rescue_loop(self: Arc<Self>, stop: CancellationToken) {
        let every = (self.cfg.lease() / 3).max(Duration::from_millis(200));
        let mut next_purge = tokio::time::Instant::now();
        let mut next_ledger_purge = tokio::time::Instant::now();
        loop {
            tokio::select! { _ = tokio::time::sleep(every) => {}, _ = stop.cancelled() => return }
            if self.cfg.retention_days > 0 && tokio::time::Instant::now() >= next_purge {
                next_purge = tokio::time::Instant::now() + Duration::from_secs(600);
                match runs::purge_finished(&self.pool, self.cfg.retention_days as i32).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(tasks = n, "purged conversations and events past retention"),
                    Err(e) => tracing::warn!(error = %e, "retention purge failed"),
                }
            }
            if self.cfg.ledger_retention_days > 0 && tokio::time::Instant::now() >= next_ledger_purge {
                next_ledger_purge = tokio::time::Instant::now() + Duration::from_secs(3600);
                match runs::purge_ledger(&self.pool, self.cfg.ledger_retention_days as i32).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(calls = n, "purged ledger rows past retention (rollups keep them)"),
                    Err(e) => tracing::warn!(error = %e, "ledger purge failed"),
                }
            }
            match runs::rescue(&self.pool, self.cfg.max_attempts).await {
                Ok(rescued) if !rescued.is_empty() => {
                    for (_, status) in &rescued {
                        metrics::counter!("subagentd_rescued_total", "to" => status.clone()).increment(1);
                    }
                    tracing::warn!(count = rescued.len(), "rescued tasks with expired leases");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "rescuer failed"),
            }
        }
    }
}

/// Retry a database write through short outages (the lease outlives them).
pub async fn retry_db<T, F, Fut>(mut f: F) -> Result<T, crate::store::StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::store::StoreError>>,
{
    let mut delay = Duration::from_millis(100);
    let mut tries = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tries < 6 => {
                tries += 1;
                tracing::warn!(error = %e, tries, "database write failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(3));
            }
            Err(e) => return Err(e),
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "host".into())
}

/// Keeps `subagentd_active_runs` right however a run ends.
struct ActiveRun;

impl Drop for ActiveRun {
    fn drop(&mut self) {
        metrics::gauge!("subagentd_active_runs").decrement(1.0);
    }
}

struct Registered<'a>(&'a Hub, Uuid);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.unregister_run(self.1);
    }
}
