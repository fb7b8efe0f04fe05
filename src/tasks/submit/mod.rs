//! Submission: the rules a request meets before it is a task — the depth rule (invariant 4) and
//! the idempotency key here, the rest in `prepare` (every field checked; the agent, the model
//! (invariant 5), the tools (the whitelist, invariant 2) and the per-task limits resolved) — then
//! admission (the queue and spend limits of `budget`, with the tenant's row locked) and the
//! insert: queued, or, for a waiting request in a process with room (`Shortcut`), already
//! claimed by this process's worker, with its first provider call reserved in the same commit.

pub mod agents;
mod prepare;

use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::context::Context;
use super::{Lifecycle, Place, TaskError};
use crate::budget::{self, Limits, Smallest};
use crate::engine::spec::TaskOptions;
use crate::store::budget::Reserve;
use crate::store::tasks::{self, Inserted, NewTask, TaskRow};
use crate::store::{Fence, StoreError, CH_EVENT, CH_QUEUED};
use crate::tools::catalog::InlineTool;

const MAX_IDEMPOTENCY_KEY: usize = 255;

/// The body of `POST /tasks`, as every door takes it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    pub prompt: String,
    #[serde(default)]
    pub subagent_type: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub max_turns: Option<i64>,
    #[serde(default)]
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub parent_context: Option<String>,
    #[serde(default)]
    pub metadata: Option<Value>,
    /// A terminal task whose conversation this one continues.
    #[serde(default)]
    pub resume_from: Option<Uuid>,
    /// Wall-clock limit of the run (capped by SUBAGENTD_MAX_TASK_TIMEOUT_SECONDS).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Tools brought with the task (they win over catalog tools of the same name).
    #[serde(default)]
    pub tools: Option<Vec<InlineTool>>,
    /// Narrow the tools to these names.
    #[serde(default)]
    pub allowed_tools: Option<Vec<String>>,
    /// Spend limit of this task in USD (capped by the tenant's `max_task_cost_usd`).
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    /// Token limit (input + output) of this task (capped by the tenant's `max_task_tokens`).
    #[serde(default)]
    pub max_tokens: Option<i64>,
    /// Where to POST the task when it finishes or pauses (signed; same allow-list as tools).
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// Which tool calls wait for a decision: `none`, `propose` or `all` (default: the agent
    /// definition's, else the tenant's, else `none`).
    #[serde(default)]
    pub approval: Option<String>,
    /// How long a pause waits for its answers (capped by SUBAGENTD_MAX_ACTION_TIMEOUT_SECONDS).
    #[serde(default)]
    pub action_timeout_seconds: Option<f64>,
    /// The JSON Schema the final answer must satisfy (default: the agent definition's).
    #[serde(default)]
    pub output_schema: Option<Value>,
    /// The models a call moves to, in order, when its own cannot serve it (default: the agent
    /// definition's, else the tenant's; `[]`: none).
    #[serde(default)]
    pub fallback_models: Option<Vec<String>>,
    /// Which failures move a call to the next model: `unavailable` (the default), `context_length`.
    #[serde(default)]
    pub fallback_on: Option<Vec<String>>,
    /// Start at this time (RFC 3339); until then the task is `scheduled`. A time past runs now.
    #[serde(default)]
    pub run_at: Option<String>,
    /// Start this many seconds from now (instead of `run_at`).
    #[serde(default)]
    pub delay_seconds: Option<f64>,
    /// `high`, `normal` or `low`: which of the tenant's queued tasks is claimed first (default:
    /// the agent definition's, else the tenant's, else `normal`).
    #[serde(default)]
    pub priority: Option<String>,
    /// The code the workspace tools read: `{"git": url, "ref": …, "secret": …}` or
    /// `{"name": …}` (an uploaded workspace).
    #[serde(default)]
    pub workspace: Option<crate::kinds::WorkspaceSpec>,
    /// The OCI image `run_command` runs in: `{"image": "host[:port]/repo:tag"}` (default: the
    /// service's `SUBAGENTD_SANDBOX_IMAGE`, else the host's `/usr`).
    #[serde(default)]
    pub environment: Option<crate::kinds::EnvironmentSpec>,
}

/// One submission: the request and what came with it, as the door received it.
pub struct Submission {
    /// The new task's id (`Submission::new` makes one).
    pub id: Uuid,
    pub tenant: String,
    pub request: TaskRequest,
    /// The caller's key for retries (`Idempotency-Key`), unchecked.
    pub idempotency_key: Option<String>,
    /// The caller's `Subagent-Depth`, unchecked: 1 or more is refused (sub-agents are one level
    /// deep; the service sends it on every outbound tool call).
    pub depth: Option<String>,
    /// The caller's W3C `traceparent`, unchecked (an invalid one is ignored, as W3C says).
    pub traceparent: Option<String>,
    /// A caller waits for the end: the task may start in this process.
    pub waiting: bool,
    /// The prefix of the API key it came with (the usage rollup's `api_key`).
    pub api_key: Option<String>,
    /// The context it is made in: it continues the context's latest task, and the context's row
    /// is written with it (`tasks::context`).
    pub context: Option<Context>,
}

impl Submission {
    pub fn new(tenant: impl Into<String>, request: TaskRequest) -> Submission {
        Submission {
            id: Uuid::now_v7(),
            tenant: tenant.into(),
            request,
            idempotency_key: None,
            depth: None,
            traceparent: None,
            waiting: false,
            api_key: None,
            context: None,
        }
    }
}

/// What a submission became.
#[derive(Debug)]
pub enum Submitted {
    Created(TaskRow),
    /// The task an earlier request with the same idempotency key and body created.
    Existing(TaskRow),
}

/// A validated task, ready to insert.
pub(in crate::tasks) struct Prepared {
    new: NewTask,
    options: TaskOptions,
    /// Its smallest first call, which a spend budget must still hold for it to be admitted.
    smallest: Smallest,
    /// The context whose row is written with it.
    context: Option<Context>,
}

/// Refuse calls made from inside a sub-agent's tool: sub-agents are one level deep.
pub(in crate::tasks) fn check_depth(depth: Option<&str>) -> Result<(), TaskError> {
    let Some(v) = depth else { return Ok(()) };
    let depth: u32 =
        v.trim().parse().map_err(|_| TaskError::bad_param("Subagent-Depth", "must be a non-negative integer"))?;
    if depth >= 1 {
        return Err(TaskError::RecursionRefused { depth });
    }
    Ok(())
}

/// A request the depth rule refuses (`Subagent-Depth` of 1 or more, or unreadable): a door
/// offers such a caller nothing that would start a task.
pub fn refused_by_depth(depth: Option<&str>) -> bool {
    check_depth(depth).is_err()
}

fn check_key(key: Option<&str>) -> Result<Option<String>, TaskError> {
    let Some(k) = key.map(str::trim) else { return Ok(None) };
    if !k.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(TaskError::bad_param("Idempotency-Key", "must be visible ASCII"));
    }
    if k.is_empty() || k.len() > MAX_IDEMPOTENCY_KEY {
        return Err(TaskError::bad_param("Idempotency-Key", format!("must be 1 to {MAX_IDEMPOTENCY_KEY} characters")));
    }
    Ok(Some(k.to_string()))
}

impl Lifecycle {
    /// Check, resolve, admit and insert one task.
    pub async fn submit(&self, mut s: Submission) -> Result<Submitted, TaskError> {
        check_depth(s.depth.as_deref())?;
        s.idempotency_key = check_key(s.idempotency_key.as_deref())?;
        s.traceparent = s.traceparent.as_deref().and_then(crate::telemetry::parse_traceparent);
        let limits = self.limits(&s.tenant).await?;
        let earlier = match &s.idempotency_key {
            Some(key) => tasks::by_idempotency_key(&self.p.pool, &s.tenant, key).await?,
            None => None,
        };
        if let Some(c) = &s.context {
            if s.request.resume_from.is_some() {
                return Err(TaskError::invalid(
                    "resume_from",
                    "a task in a context continues the context's latest task",
                ));
            }
            s.request.resume_from = self.continued(&s.tenant, c, earlier.as_ref()).await?;
        }
        let mut p = self.prepare(&s, &limits).await?;
        p.context = s.context.take();
        // A repeated request is answered before the limits are checked: it adds nothing.
        let hash = p.new.request_hash.clone();
        if let Some(r) = earlier {
            return same_request(r, &hash);
        }
        // A waiting request's task starts in this process when it has room, skipping the
        // queue's claim round trip (not for tenants with a running limit: only the claim keeps
        // it exact).
        let place = match &self.shortcut {
            Some(w) if s.waiting && limits.max_running.is_none() && p.new.run_at.is_none() => {
                w.take(&p.new, &p.options)
            }
            _ => None,
        };
        let inserted = match place {
            Some((start, place)) => {
                p.new.start = Some(start);
                // In a task of its own: a client hanging up during the insert must not leave the
                // task committed as running with no run behind it.
                let this = self.clone();
                tokio::spawn(async move { this.admit_and_start(&limits, &p, place).await })
                    .await
                    .map_err(|e| TaskError::Internal(format!("submission task failed: {e}")))??
            }
            None => {
                let (inserted, _) = self.admit(&limits, &p).await?;
                match (&inserted, p.new.run_at) {
                    (Inserted::New(..), None) => self.p.hub.publish(CH_QUEUED, String::new()),
                    // The timers see a start time sooner than they planned for.
                    (Inserted::New(..), Some(_)) => self.p.hub.publish(crate::store::CH_TIMER, String::new()),
                    _ => {}
                }
                inserted
            }
        };
        match inserted {
            Inserted::New(r, _) => Ok(Submitted::Created(r)),
            Inserted::Existing(r) => same_request(r, &hash),
        }
    }

    /// Insert a task to start in this process (in `place`) and start its run. If the insert
    /// fails on the server's side, the commit may still have happened: the task is then given
    /// back to the queue (a no-op if it was not written).
    async fn admit_and_start(
        &self,
        limits: &Limits,
        p: &Prepared,
        place: Box<dyn Place>,
    ) -> Result<Inserted, TaskError> {
        match self.admit(limits, p).await {
            Ok((Inserted::New(r, reserved_with_it), reserved)) => {
                self.p.hub.publish(CH_EVENT, r.id.to_string());
                place.start(r.clone(), p.options.clone(), reserved);
                Ok(Inserted::New(r, reserved_with_it))
            }
            Ok((existing, _)) => Ok(existing),
            Err(e) => {
                if !e.is_admission_refusal() {
                    place.abandon(p.new.id);
                }
                Err(e)
            }
        }
    }

    /// Insert the task, unless a queue or spend limit refuses it (nothing written). With such
    /// limits, the tenant row is locked so that concurrent submissions cannot both take the
    /// last place. A task that starts here (`new.start`) has its first provider call reserved
    /// in the same commit; then the second value is true.
    async fn admit(&self, limits: &Limits, p: &Prepared) -> Result<(Inserted, bool), TaskError> {
        match self.admit_once(limits, p).await {
            // The task's first event found no partition for today: created on demand (a
            // fallback; they are kept days ahead), then the insert is made again.
            Err(TaskError::Store(e)) if e.is_no_partition() && crate::store::partitions::repair(&self.p.pool).await => {
                self.admit_once(limits, p).await
            }
            r => r,
        }
    }

    async fn admit_once(&self, limits: &Limits, p: &Prepared) -> Result<(Inserted, bool), TaskError> {
        let new = &p.new;
        let first = new.start.as_ref().and_then(|s| s.first_call.as_ref());
        let scheduled = new.run_at.is_some();
        let guarded = budget::guards_admission(limits) || scheduled;
        if !guarded && p.context.is_none() {
            // One statement, which also writes the first call's reservation when it can.
            let mut conn = self.p.pool.acquire().await.map_err(StoreError::from)?;
            let r = tasks::insert(&mut conn, new).await?;
            let reserved = matches!(r, Inserted::New(_, true)) && first.is_some();
            return Ok((r, reserved));
        }
        let mut tx = self.p.pool.begin().await.map_err(StoreError::from)?;
        if guarded {
            budget::admission_checks(&mut tx, limits, &new.tenant, p.smallest, scheduled).await?;
        }
        let r = tasks::insert(&mut tx, new).await?;
        if let (Inserted::New(row, _), Some(c)) = (&r, &p.context) {
            super::context::record(&mut tx, row.id, &row.tenant, c).await?;
        }
        // With a spend budget, the reservation is checked against it in the same transaction.
        let reserved = match (&r, first) {
            (Inserted::New(_, true), Some(_)) => true,
            (Inserted::New(TaskRow { id, lease_token: Some(lease), .. }, false), Some(f)) => {
                // Whole or not at all (the run reserves for itself, and may wait, if not).
                let fence = Fence { id: *id, lease: *lease };
                matches!(
                    crate::store::budget::reserve(&mut *tx, fence, f.ask, f.defaults, Some(&f.started)).await?,
                    Reserve::Granted { .. }
                )
            }
            _ => false,
        };
        tx.commit().await.map_err(StoreError::from)?;
        Ok((r, reserved))
    }
}

/// An earlier task with the submission's idempotency key: the same request (its `hash`), or a
/// conflict.
fn same_request(r: TaskRow, hash: &Option<String>) -> Result<Submitted, TaskError> {
    if r.request_hash != *hash {
        return Err(TaskError::IdempotencyConflict { task_id: r.id });
    }
    Ok(Submitted::Existing(r))
}
