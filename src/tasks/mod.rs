//! The lifecycle room: everything a front door does with a task, in no protocol's terms.
//!
//! - `submit`: a request becomes a task — the depth rule (invariant 4), the idempotency key,
//!   the model rule (invariant 5), the whitelist (invariant 2, with the engine), the limits and
//!   admission — and, for a waiting caller, is waited on.
//! - `Lifecycle::{get, join, list, cancel, cancel_many}` here and in `list`; `answer` (a paused
//!   task's pending actions); `feed` (the event log, paged and live).
//! - `end`: every way a task ends, each written by one statement and waking its waiters.
//! - `kinds`: the task's domain types (a leaf); `view`: the task as every door shows it.
//!
//! A door extracts its protocol's request, calls one operation, and shapes the answer from a
//! `TaskView`; a refusal is a `TaskError` with a stable `code()`.
//!
//! May import: `hub`, `budget`, `engine`, `tools`, `llm`, `store`, `config`, `cache`,
//! `telemetry`. Never a door (`http`), `jobs` or `service`: a worker process plugs its fast
//! start in through `Shortcut`, and `jobs` calls `end` when a run ends.

pub mod answer;
pub mod end;
mod error;
pub mod feed;
pub mod guard;
pub mod kinds;
pub mod list;
pub mod schedule;
pub mod submit;
pub mod view;

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::budget::Limits;
use crate::cache::TtlCache;
use crate::config::Config;
use crate::engine::definitions::FileAgents;
use crate::engine::spec::TaskOptions;
use crate::hub::{Hub, Waiter};
use crate::llm::Providers;
use crate::store::tasks::{self as store, NewTask, StartHere, TaskRow};
use crate::store::StoreError;
use crate::tools::{Caller, ToolDef};
pub use error::TaskError;
use guard::{Hold, HoldKind};
use kinds::TaskStatus;
pub use submit::{Submission, Submitted, TaskRequest};
pub use view::TaskView;

/// Who is asking: one tenant, or every tenant (the admin's reads and cancels).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    Tenant(String),
}

impl Scope {
    /// The tenant to filter by (`None`: every tenant).
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Scope::All => None,
            Scope::Tenant(t) => Some(t),
        }
    }
}

/// A worker in this process that can start a waiting request's task at once, skipping the
/// queue (wait mode's shortcut; `jobs::worker` plugs it in).
pub trait Shortcut: Send + Sync {
    /// A free place for `new`, with the lease to insert it under (and its first provider call's
    /// reservation, to be written with it); `None` when it cannot start here now.
    fn take(&self, new: &NewTask, opts: &TaskOptions) -> Option<(StartHere, Box<dyn Place>)>;
}

/// A place taken by `Shortcut::take`.
pub trait Place: Send {
    /// Run the task inserted under the place's lease (`row`, as the insert returned it).
    fn start(self: Box<Self>, row: TaskRow, opts: TaskOptions, first_reserved: bool);
    /// Give back a task whose insert failed on the server's side (it may have been committed all
    /// the same): released to the queue if it was written.
    fn abandon(self: Box<Self>, id: Uuid);
}

/// The room's shared handles: one per process, cloned cheaply into each door.
#[derive(Clone)]
pub struct Lifecycle {
    pub pool: PgPool,
    pub cfg: Arc<Config>,
    pub providers: Arc<Providers>,
    pub file_agents: Arc<FileAgents>,
    pub tool_caller: Caller,
    pub hub: Arc<Hub>,
    /// Tenants' limits as last read (a tenant row exists for each entry).
    pub limits_cache: Arc<TtlCache<Limits>>,
    /// Tenants' available tools (catalog and MCP).
    pub tools_cache: Arc<TtlCache<Vec<ToolDef>>>,
    /// This process's worker, when it runs one: a waiting request's task may start in it.
    pub shortcut: Option<Arc<dyn Shortcut>>,
    /// Fired when the process drains: waits answer at once with the task as it stands.
    pub shutdown: CancellationToken,
    /// The streams and waits each tenant holds open on this replica.
    pub guard: Arc<guard::Guard>,
    /// The live feeds of this process, sharing each task's reads.
    pub feeds: Arc<feed::Feeds>,
}

/// A task with what became of the operation on it.
#[derive(Debug)]
pub struct Created {
    pub task: TaskView,
    /// A new task (false: an earlier one with the same idempotency key and request).
    pub created: bool,
    /// Terminal or waiting for its caller: a waiting request got its answer. False: the wait
    /// ran out (or the process drains) and the task goes on.
    pub settled: bool,
}

/// A joined task: settled (terminal or paused), or as it stood when the wait ran out.
#[derive(Debug)]
pub struct Joined {
    pub task: TaskView,
    pub settled: bool,
}

/// What a waiting request waits for: the task's end, or a pause (the caller may answer it).
pub fn settled(row: &TaskRow) -> bool {
    row.is_terminal() || row.status == TaskStatus::RequiresAction
}

impl Lifecycle {
    /// The tenant's limits with the configured defaults (cached a few seconds).
    pub async fn limits(&self, tenant: &str) -> Result<Limits, StoreError> {
        crate::budget::effective_limits(
            &self.pool,
            &self.limits_cache,
            &crate::budget::Defaults::from_config(&self.cfg),
            tenant,
        )
        .await
    }

    /// How long a wait may last: `requested` (default `SUBAGENTD_WAIT_DEFAULT_SECONDS`), capped
    /// by `SUBAGENTD_WAIT_MAX_SECONDS`.
    pub fn wait_bound(&self, requested: Option<f64>) -> Duration {
        let secs = requested
            .filter(|s| s.is_finite() && *s >= 0.0)
            .unwrap_or(self.cfg.wait_default_seconds as f64)
            .min(self.cfg.wait_max_seconds as f64);
        Duration::from_secs_f64(secs)
    }

    /// The task as the doors show it (a paused one with its pending actions).
    pub async fn view(&self, row: TaskRow) -> Result<TaskView, StoreError> {
        TaskView::one(&self.pool, row).await
    }

    async fn row(&self, scope: &Scope, id: Uuid) -> Result<TaskRow, TaskError> {
        store::get_in(&self.pool, scope.tenant(), id).await?.ok_or(TaskError::NotFound)
    }

    /// Submit a task and, with `wait`, wait (at most `wait_bound(wait)`) until it is settled.
    pub async fn create(&self, mut s: Submission, wait: Option<Duration>) -> Result<Created, TaskError> {
        let wait = wait.map(|d| d.min(Duration::from_secs(self.cfg.wait_max_seconds)));
        // Registered before the insert: the inserted row then needs no second read before waiting.
        let early = wait.map(|_| self.hub.waiter(s.id));
        s.waiting = wait.is_some();
        let tenant = Scope::Tenant(s.tenant.clone());
        let (row, created) = match self.submit(s).await? {
            Submitted::Created(r) => (r, true),
            Submitted::Existing(r) => (r, false),
        };
        // A tenant holding its `max_waits` here is answered at once, as if its wait had run out.
        let hold = match wait {
            Some(_) if !settled(&row) => self.hold(&row.tenant, HoldKind::Wait).await?.ok(),
            _ => None,
        };
        let (row, settled) = match (wait, early, hold) {
            (Some(d), Some(waiter), Some(_hold)) if created => self.wait_on(&tenant, row, d, waiter).await?,
            (Some(d), _, Some(_hold)) => self.waited(&tenant, row, d).await?,
            _ => {
                let settled = settled(&row);
                (row, settled)
            }
        };
        Ok(Created { task: self.view(row).await?, created, settled })
    }

    /// The task `id` of the caller's.
    pub async fn get(&self, scope: &Scope, id: Uuid) -> Result<TaskView, TaskError> {
        Ok(self.view(self.row(scope, id).await?).await?)
    }

    /// Join the task: wait (at most `d`) until it is settled.
    pub async fn join(&self, scope: &Scope, id: Uuid, d: Duration) -> Result<Joined, TaskError> {
        let d = d.min(Duration::from_secs(self.cfg.wait_max_seconds));
        let row = self.row(scope, id).await?;
        // Counted against the task's tenant (the admin's joins too); at its `max_waits`, the
        // task as it stands now.
        let (row, settled) = match self.hold(&row.tenant, HoldKind::Wait).await? {
            Ok(_hold) => self.waited(scope, row, d).await?,
            Err(_) => {
                let settled = settled(&row);
                (row, settled)
            }
        };
        Ok(Joined { task: self.view(row).await?, settled })
    }

    /// A hold of `kind` for `tenant` on this replica, within its limit (refused: `AtLimit`).
    pub async fn hold(&self, tenant: &str, kind: HoldKind) -> Result<Result<Hold, guard::AtLimit>, StoreError> {
        let limits = self.limits(tenant).await?;
        let limit = match kind {
            HoldKind::Stream => limits.max_streams,
            HoldKind::Wait => limits.max_waits,
        };
        Ok(self.guard.take(tenant, kind, limit.map(|l| l.max(0) as u32)))
    }

    /// A stream hold for `tenant`, or the refusal a door answers 429 with.
    pub async fn stream_hold(&self, tenant: &str) -> Result<Hold, TaskError> {
        self.hold(tenant, HoldKind::Stream)
            .await?
            .map_err(|a| TaskError::StreamLimit { limit: a.limit, current: a.current })
    }

    /// `row` once settled, or as it stands when `d` runs out or the process drains.
    async fn waited(&self, scope: &Scope, row: TaskRow, d: Duration) -> Result<(TaskRow, bool), TaskError> {
        if settled(&row) {
            return Ok((row, true));
        }
        let waiter = self.hub.waiter(row.id);
        // Read again: the task may have settled before the waiter was registered.
        let row = self.row(scope, row.id).await?;
        self.wait_on(scope, row, d, waiter).await
    }

    /// `waited`, for a `row` read after `waiter` was registered (so no completion is missed).
    async fn wait_on(
        &self,
        scope: &Scope,
        mut row: TaskRow,
        d: Duration,
        waiter: Waiter<'_>,
    ) -> Result<(TaskRow, bool), TaskError> {
        let deadline = tokio::time::Instant::now() + d;
        loop {
            if settled(&row) {
                return Ok((row, true));
            }
            if tokio::time::Instant::now() >= deadline || self.shutdown.is_cancelled() {
                return Ok((row, false));
            }
            let handed = tokio::select! {
                r = waiter.notified() => r,
                _ = tokio::time::sleep_until(deadline) => None,
                _ = self.shutdown.cancelled() => None,
                // A notification lost with a dropped connection costs at most this long.
                _ = tokio::time::sleep(Duration::from_secs(5)) => None,
            };
            // Finished in this process: the row as its final commit wrote it, with no second read.
            row = match handed.filter(|r| scope.tenant().is_none_or(|t| r.tenant == t)) {
                Some(r) => r,
                None => match store::get_in(&self.pool, scope.tenant(), row.id).await {
                    Ok(r) => r.ok_or(TaskError::NotFound)?,
                    // The database is away (a restart): go on waiting on what was last read; the
                    // task goes on, and the answer comes when it is back or the wait runs out.
                    Err(e) if e.is_unavailable() => row,
                    Err(e) => return Err(e.into()),
                },
            };
        }
    }

    /// The task a submission with idempotency key `key` made (within the key's 24 hours).
    pub async fn by_key(&self, tenant: &str, key: &str) -> Result<Option<TaskView>, TaskError> {
        match store::by_idempotency_key(&self.pool, tenant, key).await? {
            Some(row) => Ok(Some(self.view(row).await?)),
            None => Ok(None),
        }
    }

    /// Cancel the task (idempotent): queued or paused, it ends now; running, its worker is told
    /// (on whichever replica) and stops it; ended, it is returned unchanged.
    pub async fn cancel(&self, scope: &Scope, id: Uuid) -> Result<TaskView, TaskError> {
        let t = self.row(scope, id).await?;
        let filter = store::CancelFilter { id: Some(id), statuses: TaskStatus::OPEN.to_vec(), metadata: None };
        end::finish(&self.pool, &self.hub, end::End::Cancel { tenant: &t.tenant, filter }).await?;
        let row = store::get(&self.pool, &t.tenant, id).await?.ok_or(TaskError::NotFound)?;
        Ok(self.view(row).await?)
    }
}
