//! The lifecycle room: everything a front door does with a task, in no protocol's terms.
//!
//! - `submit`: a request becomes a task — the depth rule (invariant 4), the idempotency key,
//!   the model rule (invariant 5), the whitelist (invariant 2, with the engine), the limits and
//!   admission — and, for a waiting caller, is waited on.
//! - `Lifecycle::{get, join, list, cancel, cancel_settled, cancel_many}` here and in `list`;
//!   `answer` (a paused task's pending actions); `feed` (the event log, paged and live, and a
//!   door's own wait that reports progress); `context` (a conversation of tasks, and a task's
//!   push configs); `schedule` (schedules, and the timer's passes).
//! - `end`: every way a task ends, each written by one statement and waking its waiters.
//! - `view`: the task as every door shows it. The domain kinds are `crate::kinds`, a leaf.
//!
//! A door extracts its protocol's request, calls one operation, and shapes the answer from a
//! `TaskView`; a refusal is a `TaskError` with a stable `code()`. The room's handles are its
//! own (private fields): a door cannot reach the pool around it.
//!
//! May import: `kinds`, `hub`, `live`, `budget`, `engine`, `tools`, `llm`, `store`, `config`,
//! `cache`, `telemetry`. Never a door (`http`), `resources`, `jobs` or `service`: a worker
//! process plugs its fast start in through `Shortcut`, and `jobs` calls `end` when a run ends.

pub mod answer;
pub mod context;
pub mod end;
mod error;
pub mod feed;
pub mod guard;
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
use crate::kinds::TaskStatus;
use crate::llm::Providers;
pub use crate::store::calls::CallRow;
pub use crate::store::runs::MessageRow;
use crate::store::tasks::{self as store, NewTask, StartHere, TaskRow};
use crate::store::StoreError;
use crate::tools::{Caller, ToolDef};
pub use error::TaskError;
use guard::{Hold, HoldKind};
pub use submit::{refused_by_depth, Submission, Submitted, TaskRequest};
pub use view::{ActionRow, TaskView};

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

/// What the room is made of: the process's handles, made once (`service.rs`) and shared with
/// the other resources (`resources::Resources`).
#[derive(Clone)]
pub struct Parts {
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
    /// Fired when the process drains: waits answer at once with the task as it stands.
    pub shutdown: CancellationToken,
    /// The streams and waits each tenant holds open on this replica.
    pub guard: Arc<guard::Guard>,
    /// Workspaces: the git address guard, the upload caps.
    pub workspaces: Arc<crate::workspace::Workspaces>,
}

/// The room's shared handles: one per process, cloned cheaply into each door. Its parts are
/// its own: a door reaches a task only through the room's operations.
#[derive(Clone)]
pub struct Lifecycle {
    p: Parts,
    /// This process's worker, when it runs one: a waiting request's task may start in it.
    shortcut: Option<Arc<dyn Shortcut>>,
    /// The live feeds of this process, sharing each task's reads.
    feeds: Arc<feed::Feeds>,
}

impl Parts {
    /// The tenant's limits with the configured defaults (cached a few seconds).
    pub async fn limits(&self, tenant: &str) -> Result<Limits, StoreError> {
        let defaults = crate::budget::Defaults::from_config(&self.cfg);
        crate::budget::effective_limits(&self.pool, &self.limits_cache, &defaults, tenant).await
    }
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
    /// The room, of `parts`, with this process's worker (`shortcut`) if it runs one.
    pub fn new(parts: Parts, shortcut: Option<Arc<dyn Shortcut>>) -> Lifecycle {
        Lifecycle { p: parts, shortcut, feeds: Default::default() }
    }

    /// The service's configuration (read-only).
    pub fn config(&self) -> &Config {
        &self.p.cfg
    }

    /// The tenant's limits with the configured defaults (cached a few seconds).
    pub async fn limits(&self, tenant: &str) -> Result<Limits, TaskError> {
        Ok(self.p.limits(tenant).await?)
    }

    /// How long a wait may last: `requested` (default `SUBAGENTD_WAIT_DEFAULT_SECONDS`), capped
    /// by `SUBAGENTD_WAIT_MAX_SECONDS`.
    pub fn wait_bound(&self, requested: Option<f64>) -> Duration {
        let secs = requested
            .filter(|s| s.is_finite() && *s >= 0.0)
            .unwrap_or(self.p.cfg.wait_default_seconds as f64)
            .min(self.p.cfg.wait_max_seconds as f64);
        Duration::from_secs_f64(secs)
    }

    /// The task as the doors show it (a paused one with its pending actions).
    pub async fn view(&self, row: TaskRow) -> Result<TaskView, StoreError> {
        TaskView::one(&self.p.pool, row).await
    }

    async fn row(&self, scope: &Scope, id: Uuid) -> Result<TaskRow, TaskError> {
        store::get_in(&self.p.pool, scope.tenant(), id).await?.ok_or(TaskError::NotFound)
    }

    /// Submit a task and, with `wait`, wait (at most `wait_bound(wait)`) until it is settled.
    pub async fn create(&self, mut s: Submission, wait: Option<Duration>) -> Result<Created, TaskError> {
        let wait = wait.map(|d| d.min(Duration::from_secs(self.p.cfg.wait_max_seconds)));
        // Registered before the insert: the inserted row then needs no second read before waiting.
        let early = wait.map(|_| self.p.hub.waiter(s.id));
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
        let d = d.min(Duration::from_secs(self.p.cfg.wait_max_seconds));
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
    pub async fn hold(&self, tenant: &str, kind: HoldKind) -> Result<Result<Hold, guard::AtLimit>, TaskError> {
        let limits = self.limits(tenant).await?;
        let limit = match kind {
            HoldKind::Stream => limits.max_streams,
            HoldKind::Wait => limits.max_waits,
        };
        Ok(self.p.guard.take(tenant, kind, limit.map(|l| l.max(0) as u32)))
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
        let waiter = self.p.hub.waiter(row.id);
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
            if tokio::time::Instant::now() >= deadline || self.p.shutdown.is_cancelled() {
                return Ok((row, false));
            }
            let handed = tokio::select! {
                r = waiter.notified() => r,
                _ = tokio::time::sleep_until(deadline) => None,
                _ = self.p.shutdown.cancelled() => None,
                // A notification lost with a dropped connection costs at most this long.
                _ = tokio::time::sleep(Duration::from_secs(5)) => None,
            };
            // Finished in this process: the row as its final commit wrote it, with no second read.
            row = match handed.filter(|r| scope.tenant().is_none_or(|t| r.tenant == t)) {
                Some(r) => r,
                None => match store::get_in(&self.p.pool, scope.tenant(), row.id).await {
                    Ok(r) => r.ok_or(TaskError::NotFound)?,
                    // The database is away (a restart): go on waiting on what was last read; the
                    // task goes on, and the answer comes when it is back or the wait runs out.
                    Err(e) if e.is_unavailable() => row,
                    Err(e) => return Err(e.into()),
                },
            };
        }
    }

    /// The ledger of the caller's task `id`: one row per provider call try.
    pub async fn calls(&self, scope: &Scope, id: Uuid) -> Result<Vec<CallRow>, TaskError> {
        let row = self.row(scope, id).await?;
        Ok(crate::store::calls::of_task(&self.p.pool, id, row.created_at).await?)
    }

    /// The conversation of the caller's task `id` as checkpointed, each message with its turn.
    pub async fn messages(&self, scope: &Scope, id: Uuid) -> Result<Vec<MessageRow>, TaskError> {
        let row = self.row(scope, id).await?;
        Ok(crate::store::runs::conversation(&self.p.pool, id, row.created_at).await?)
    }

    /// A task's diff: its run's changes to its copy of its workspace, from the starting tree.
    pub async fn diff(&self, scope: &Scope, id: Uuid) -> Result<Diff, TaskError> {
        let row = self.row(scope, id).await?;
        if let Some(Some(text)) = crate::store::diffs::diff_of(&self.p.pool, &row.tenant, id, row.created_at).await? {
            return Ok(Diff::Text(text));
        }
        let opts = crate::engine::spec::TaskOptions::from_stored(&row.options).ok();
        let writes = opts.as_ref().is_some_and(|o| {
            o.workspace.is_some()
                && o.tools
                    .iter()
                    .any(|t| matches!(t.target, crate::tools::Target::Builtin { tool } if crate::tools::builtin::reach(tool).writes_workspace()))
        });
        Ok(match (opts.and_then(|o| o.workspace).is_some(), writes) {
            (false, _) => Diff::NoWorkspace,
            (true, false) => Diff::ReadOnly,
            (true, true) if !row.status.is_terminal() => Diff::NotYet,
            (true, true) if row.diff_stats.is_some() => Diff::Purged,
            (true, true) => Diff::NoCopy,
        })
    }

    /// An action of one of the tenant's tasks, by its id alone (a door that names actions).
    pub async fn action(&self, tenant: &str, id: Uuid) -> Result<Option<ActionRow>, TaskError> {
        Ok(crate::store::actions::get(&self.p.pool, tenant, id).await?)
    }

    /// Cancel the task a submission with idempotency key `key` made, if there is one (a door
    /// whose caller gave up on the request that started it).
    pub async fn cancel_by_key(&self, tenant: &str, key: &str) -> Result<Option<TaskView>, TaskError> {
        match store::by_idempotency_key(&self.p.pool, tenant, key).await? {
            Some(row) => Ok(Some(self.cancel(&Scope::Tenant(tenant.to_string()), row.id).await?)),
            None => Ok(None),
        }
    }

    /// Submit as a waiting caller — the task may start in this process at once — and answer
    /// at once: the caller follows the task itself (`watch_waiting`), as a door that reports a
    /// run's progress on its own stream does.
    pub async fn create_followed(&self, mut s: Submission) -> Result<Created, TaskError> {
        s.waiting = true;
        let (row, created) = match self.submit(s).await? {
            Submitted::Created(r) => (r, true),
            Submitted::Existing(r) => (r, false),
        };
        let settled = settled(&row);
        Ok(Created { task: self.view(row).await?, created, settled })
    }

    /// Cancel the task (idempotent): queued or paused, it ends now; running, its worker is told
    /// (on whichever replica) and stops it; ended, it is returned unchanged.
    pub async fn cancel(&self, scope: &Scope, id: Uuid) -> Result<TaskView, TaskError> {
        let t = self.row(scope, id).await?;
        let filter = store::CancelFilter { id: Some(id), statuses: TaskStatus::OPEN.to_vec(), metadata: None };
        end::finish(&self.p.pool, &self.p.hub, end::End::Cancel { tenant: &t.tenant, filter }).await?;
        let row = store::get(&self.p.pool, &t.tenant, id).await?.ok_or(TaskError::NotFound)?;
        Ok(self.view(row).await?)
    }

    /// Cancel the task and wait (at most `bound`) until it has ended: queued or paused, it ends
    /// at once; running, when its worker sees the cancel, on whichever replica. Past the bound
    /// (or at the tenant's `max_waits`), the task as it stands.
    pub async fn cancel_settled(&self, scope: &Scope, id: Uuid, bound: Duration) -> Result<TaskView, TaskError> {
        let t = self.cancel(scope, id).await?;
        if t.status.is_terminal() {
            return Ok(t);
        }
        Ok(self.join(scope, id, bound).await?.task)
    }
}

/// How long a door's cancel waits for a running task's worker to stop it.
pub const CANCEL_SETTLE: Duration = Duration::from_secs(10);

/// What `GET /tasks/{id}/diff` answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Diff {
    /// The unified diff (empty: no change).
    Text(String),
    /// The task has no workspace.
    NoWorkspace,
    /// Its tools only read its workspace: there is no copy to compare.
    ReadOnly,
    /// Its run has not ended.
    NotYet,
    /// Purged with its conversation (`--retention-days`); its counts stay on the task.
    Purged,
    /// Its run ended before its copy was made (it failed or was cancelled first).
    NoCopy,
}
