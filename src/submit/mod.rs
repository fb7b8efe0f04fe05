//! Submission: a request becomes a typed spec (`TaskOptions` and the task's row), with its
//! agent, model, tools and limits resolved; it is admitted (the queue and spend limits of
//! `budget`, with the tenant's row locked) and inserted — queued, or, for a waiting request in
//! a process with room, already claimed by this process's worker (`jobs::worker`), with its
//! first provider call reserved in the same commit.
//!
//! May import: `jobs` (the worker and the hub), `budget`, `engine`, `tools`, `llm`, `store`,
//! `config`, `cache`. Never `http`: errors are `SubmitError`, which `http` maps to
//! problem+json.

pub mod agents;

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use crate::budget::{self, BudgetError, Defaults, Limits, Smallest};
use crate::cache::TtlCache;
use crate::config::Config;
use crate::engine::agents::AgentType;
use crate::engine::claude_code;
use crate::engine::definitions::FileAgents;
use crate::engine::spec::{Approval, MaxTurns, TaskOptions, Usd};
use crate::jobs::hub::Hub;
use crate::jobs::worker::{Slot, Worker};
use crate::llm::{ModelRef, Providers, ResolveError};
use crate::store::budget::Reserve;
use crate::store::tasks::{self, Inserted, NewTask, TaskRow, TaskStatus};
use crate::store::{Fence, StoreError, CH_EVENT, CH_QUEUED};
use crate::tools::catalog::{self, InlineTool};
use crate::tools::{Caller, ToolDef, Whitelist};
use agents::Resolved;

const MAX_PROMPT_CHARS: usize = 200_000;
const MAX_DESCRIPTION_CHARS: usize = 80;
const MAX_METADATA_BYTES: usize = 16 * 1024;

/// The body of `POST /tasks`.
#[derive(Debug, Deserialize)]
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
}

/// One submission: the request and what came with it.
pub struct Submission {
    /// Chosen by the caller, so that it can register a waiter before the insert.
    pub id: Uuid,
    pub tenant: String,
    pub request: TaskRequest,
    pub idempotency_key: Option<String>,
    /// A valid W3C `traceparent`, lower-cased.
    pub traceparent: Option<String>,
    /// A caller waits for the end: the task may start in this process.
    pub waiting: bool,
    /// The prefix of the API key it came with (the usage rollup's `api_key`).
    pub api_key: Option<String>,
}

/// What a submission became.
#[derive(Debug)]
pub enum Submitted {
    Created(TaskRow),
    /// The task an earlier request with the same idempotency key and body created.
    Existing(TaskRow),
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("no model given")]
    ModelRequired,
    #[error("{detail}")]
    UnknownModel { detail: String, providers: Vec<String> },
    #[error("subagent_type: {name:?} is not a known agent type")]
    UnknownAgent { name: String, available: Vec<String> },
    #[error("task {id} is {status}")]
    NotTerminal { id: Uuid, status: TaskStatus },
    /// The model has no price, and the task's only limits are in USD.
    #[error("model {model} has no price")]
    UnpricedModel { model: String, limits: Vec<&'static str> },
    #[error("this Idempotency-Key was used with a different request")]
    IdempotencyConflict { task_id: Uuid },
    #[error(transparent)]
    Budget(#[from] BudgetError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Internal(String),
}

impl SubmitError {
    fn invalid(field: &str, message: impl Into<String>) -> Self {
        SubmitError::Invalid { field: field.to_string(), message: message.into() }
    }
}

impl From<crate::tools::ToolError> for SubmitError {
    fn from(e: crate::tools::ToolError) -> Self {
        match e {
            crate::tools::ToolError::Invalid { field, message } => SubmitError::Invalid { field, message },
            other => SubmitError::Internal(other.to_string()),
        }
    }
}

/// Everything submission needs, shared by every request.
#[derive(Clone)]
pub struct Submitter {
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
    pub worker: Option<Arc<Worker>>,
}

/// A validated task, ready to insert.
struct Prepared {
    new: NewTask,
    options: TaskOptions,
    /// Its smallest first call, which a spend budget must still hold for it to be admitted.
    smallest: Smallest,
}

impl Submitter {
    /// The tenant's limits with the configured defaults (cached a few seconds).
    pub async fn limits(&self, tenant: &str) -> Result<Limits, StoreError> {
        budget::effective_limits(&self.pool, &self.limits_cache, &Defaults::from_config(&self.cfg), tenant).await
    }

    /// Validate, resolve, admit and insert one task.
    pub async fn submit(&self, s: Submission) -> Result<Submitted, SubmitError> {
        let limits = self.limits(&s.tenant).await?;
        let mut p = self.prepare(&s, &limits).await?;
        // A repeated request is answered before the limits are checked: it adds nothing.
        let hash = p.new.request_hash.clone();
        if let Some(key) = &p.new.idempotency_key {
            if let Some(r) = tasks::by_idempotency_key(&self.pool, &s.tenant, key).await? {
                return same_request(r, &hash);
            }
        }
        // A waiting request's task starts in this process when it has room, skipping the
        // queue's claim round trip (not for tenants with a running limit: only the claim keeps
        // it exact).
        let slot = match &self.worker {
            Some(w) if s.waiting && limits.max_running.is_none() => w.take_slot().map(|slot| (slot, w.clone())),
            _ => None,
        };
        let inserted = match slot {
            Some((slot, w)) => {
                p.new.start =
                    Some(tasks::StartHere { first_call: w.first_call(&p.new, &p.options), ..slot.start.clone() });
                // In a task of its own: a client hanging up during the insert must not leave the
                // task committed as running with no run behind it.
                let this = self.clone();
                tokio::spawn(async move { this.admit_and_start(&limits, &p, &w, slot).await })
                    .await
                    .map_err(|e| SubmitError::Internal(format!("submission task failed: {e}")))??
            }
            None => {
                let (inserted, _) = self.admit(&limits, &p).await?;
                if matches!(inserted, Inserted::New(..)) {
                    self.hub.publish(CH_QUEUED, String::new());
                }
                inserted
            }
        };
        match inserted {
            Inserted::New(r, _) => Ok(Submitted::Created(r)),
            Inserted::Existing(r) => same_request(r, &hash),
        }
    }

    /// Insert a task to start in this process (`slot`, taken from `w`) and start its run. If
    /// the insert fails on the server's side, the commit may still have happened: the task is
    /// then given back to the queue (a no-op if it was not written).
    async fn admit_and_start(
        &self,
        limits: &Limits,
        p: &Prepared,
        w: &Arc<Worker>,
        slot: Slot,
    ) -> Result<Inserted, SubmitError> {
        match self.admit(limits, p).await {
            Ok((Inserted::New(r, reserved_with_it), reserved)) => {
                self.hub.publish(CH_EVENT, r.id.to_string());
                w.start(r.clone(), p.options.clone(), slot, reserved);
                Ok(Inserted::New(r, reserved_with_it))
            }
            Ok((existing, _)) => Ok(existing),
            Err(e) => {
                if !matches!(e, SubmitError::Budget(BudgetError::QueueFull { .. } | BudgetError::Exhausted { .. })) {
                    w.abandon(p.new.id, slot);
                }
                Err(e)
            }
        }
    }

    /// Insert the task, unless a queue or spend limit refuses it (nothing written). With such
    /// limits, the tenant row is locked so that concurrent submissions cannot both take the
    /// last place. A task that starts here (`new.start`) has its first provider call reserved
    /// in the same commit; then the second value is true.
    async fn admit(&self, limits: &Limits, p: &Prepared) -> Result<(Inserted, bool), SubmitError> {
        let new = &p.new;
        let first = new.start.as_ref().and_then(|s| s.first_call.as_ref());
        if !budget::guards_admission(limits) {
            // One statement, which also writes the first call's reservation when it can.
            let mut conn = self.pool.acquire().await.map_err(StoreError::from)?;
            let r = tasks::insert(&mut conn, new).await?;
            let reserved = matches!(r, Inserted::New(_, true)) && first.is_some();
            return Ok((r, reserved));
        }
        let mut tx = self.pool.begin().await.map_err(StoreError::from)?;
        budget::admission_checks(&mut tx, limits, &new.tenant, p.smallest).await?;
        let r = tasks::insert(&mut tx, new).await?;
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

    /// The model, explicitly: the request's, else the agent definition's, else the configured
    /// default — never a silent fallback.
    fn resolve_model(&self, requested: Option<&str>, from_definition: Option<&str>) -> Result<ModelRef, SubmitError> {
        let pick = |m: Option<&str>| m.map(str::trim).filter(|m| !m.is_empty()).map(str::to_string);
        let name = pick(requested)
            .or_else(|| pick(from_definition))
            .or_else(|| self.cfg.default_model.clone())
            .or_else(|| self.providers.default_model.clone())
            .ok_or(SubmitError::ModelRequired)?;
        let providers = self.providers.names();
        self.providers.resolve(&name).map_err(|e| {
            let detail = match e {
                ResolveError::Malformed(m) => format!("model: {m:?} is neither provider/model nor a configured alias"),
                ResolveError::UnknownProvider { provider, model } if model != name => format!(
                    "model: {name:?} (a model alias for {model:?}) needs provider {provider:?}, which is not configured \
                     (configured: {})",
                    providers.join(", ")
                ),
                ResolveError::UnknownProvider { provider, model } => format!(
                    "model: {model:?} needs provider {provider:?}, which is not configured (configured: {})",
                    providers.join(", ")
                ),
            };
            SubmitError::UnknownModel { detail, providers: providers.clone() }
        })
    }

    /// The request as a task to insert: every field checked, the agent, model, tools and
    /// per-task limits resolved.
    async fn prepare(&self, s: &Submission, limits: &Limits) -> Result<Prepared, SubmitError> {
        let body = &s.request;
        if let Some(u) = &body.webhook_url {
            self.tool_caller.allow.check_url(u).map_err(|e| SubmitError::invalid("webhook_url", e.0))?;
        }
        let prompt = body.prompt.trim();
        if prompt.is_empty() {
            return Err(SubmitError::invalid("prompt", "must not be empty"));
        }
        // PostgreSQL text cannot hold NUL characters.
        let texts = [
            ("prompt", Some(&body.prompt)),
            ("description", body.description.as_ref()),
            ("system_prompt", body.system_prompt.as_ref()),
            ("parent_context", body.parent_context.as_ref()),
        ];
        for (field, v) in texts {
            if v.is_some_and(|v| v.contains('\0')) {
                return Err(SubmitError::invalid(field, "must not contain NUL characters"));
            }
        }
        if body.metadata.as_ref().is_some_and(|m| m.to_string().contains("\\u0000")) {
            return Err(SubmitError::invalid("metadata", "must not contain NUL characters"));
        }
        if body.prompt.chars().count() > MAX_PROMPT_CHARS {
            return Err(SubmitError::invalid("prompt", format!("must be at most {MAX_PROMPT_CHARS} characters")));
        }
        if body.description.as_ref().is_some_and(|d| d.chars().count() > MAX_DESCRIPTION_CHARS) {
            return Err(SubmitError::invalid(
                "description",
                format!("must be at most {MAX_DESCRIPTION_CHARS} characters"),
            ));
        }
        let max_turns = match body.max_turns {
            Some(n) if n < 1 => {
                return Err(SubmitError::invalid("max_turns", "must be at least 1 (values above 50 are clamped to 50)"))
            }
            Some(n) => Some(n.min(u32::MAX as i64) as u32),
            None => None,
        };
        if body.system_prompt.as_deref().is_some_and(|s| s.trim().is_empty()) {
            return Err(SubmitError::invalid("system_prompt", "must not be empty when given"));
        }
        let metadata = match &body.metadata {
            None | Some(Value::Null) => json!({}),
            Some(m @ Value::Object(_)) => {
                if m.to_string().len() > MAX_METADATA_BYTES {
                    return Err(SubmitError::invalid(
                        "metadata",
                        format!("must be at most {MAX_METADATA_BYTES} bytes of JSON"),
                    ));
                }
                m.clone()
            }
            Some(_) => return Err(SubmitError::invalid("metadata", "must be a JSON object")),
        };
        // A resumed task continues its parent: same agent and model unless the request says
        // otherwise.
        let parent = match body.resume_from {
            Some(pid) => Some(self.parent(&s.tenant, pid).await?),
            None => None,
        };
        let parent_opts = parent.as_ref().and_then(|(_, o)| o.as_ref());
        let type_name = body
            .subagent_type
            .clone()
            .or_else(|| parent.as_ref().map(|(p, _)| p.subagent_type.clone()))
            .unwrap_or_else(|| "general".into());
        let (agent, definition) = match (parent_opts.and_then(|o| o.agent.as_ref()), &body.subagent_type) {
            // A resumed custom agent keeps the definition snapshot its parent ran with.
            (Some(d), None) => (AgentType::General, Some(d.clone())),
            _ => match agents::resolve(&self.pool, &self.file_agents, &s.tenant, &type_name).await? {
                Some(Resolved::Builtin(t)) => (t, None),
                // Custom agents run with general's tool policy and their own prompt and lists.
                Some(Resolved::Custom(d)) => (AgentType::General, Some(*d)),
                None => {
                    let available = agents::names(&self.pool, &self.file_agents, &s.tenant).await?;
                    return Err(SubmitError::UnknownAgent { name: type_name, available });
                }
            },
        };
        let parent_model = if body.model.is_none() { parent.as_ref().map(|(p, _)| p.model.clone()) } else { None };
        let model = self.resolve_model(
            body.model.as_deref().or(parent_model.as_deref()),
            definition.as_ref().and_then(|d| d.model.as_deref()),
        )?;
        let turns = max_turns.or(definition.as_ref().and_then(|d| d.max_turns));
        let turns = match (turns, limits.max_task_turns) {
            (t, Some(cap)) => Some(t.unwrap_or(agent.default_max_turns()).min(cap.max(1) as u32)),
            (t, None) => t,
        };
        let mut cap = self.cfg.max_task_timeout_seconds as f64;
        if let Some(t) = limits.max_task_timeout_seconds {
            cap = cap.min(f64::from(t.max(1)));
        }
        let max_cost_usd = match body.max_cost_usd {
            Some(v) => {
                let d = Usd::from_f64(v).map_err(|m| SubmitError::invalid("max_cost_usd", m))?.get();
                Some(limits.max_task_cost_usd.map_or(d, |cap| d.min(cap)))
            }
            None => limits.max_task_cost_usd,
        };
        let max_tokens = match body.max_tokens {
            Some(v) if v < 1 => return Err(SubmitError::invalid("max_tokens", "must be at least 1")),
            Some(v) => Some(limits.max_task_tokens.map_or(v, |cap| v.min(cap))),
            None => limits.max_task_tokens,
        };
        let timeout_seconds = match body.timeout_seconds {
            Some(t) if !t.is_finite() || t <= 0.0 => {
                return Err(SubmitError::invalid("timeout_seconds", "must be a positive number of seconds"))
            }
            Some(t) => t.min(cap),
            None => cap,
        };
        // A model with no price cannot be held to limits in USD: refuse it unless a token limit
        // holds it too.
        if self.providers.price(&model).is_none() && limits.tokens_per_day.is_none() && max_tokens.is_none() {
            let usd: Vec<&'static str> = [
                ("usd_per_day", limits.usd_per_day.is_some()),
                ("usd_per_month", limits.usd_per_month.is_some()),
                ("max_cost_usd", max_cost_usd.is_some()),
            ]
            .into_iter()
            .filter_map(|(n, set)| set.then_some(n))
            .collect();
            if !usd.is_empty() {
                return Err(SubmitError::UnpricedModel { model: model.full(), limits: usd });
            }
        }
        let tools = self.whitelist(&s.tenant, agent, definition.as_ref(), body).await?;
        let max_out = self.providers.max_tokens_for(
            &model,
            definition.as_ref().and_then(|d| d.max_output_tokens),
            self.cfg.max_output_tokens,
        );
        let approval = match body.approval.as_deref() {
            Some(a) => Approval::parse(a)
                .ok_or_else(|| SubmitError::invalid("approval", format!("{a:?} is not one of none, propose, all")))?,
            None => definition
                .as_ref()
                .and_then(|d| d.approval)
                .or_else(|| limits.approval.as_deref().and_then(Approval::parse))
                .unwrap_or_default(),
        };
        let action_cap = self.cfg.max_action_timeout_seconds as f64;
        let action_timeout_seconds = match body.action_timeout_seconds {
            Some(t) if !t.is_finite() || t <= 0.0 => {
                return Err(SubmitError::invalid("action_timeout_seconds", "must be a positive number of seconds"))
            }
            Some(t) => Some(t.min(action_cap)),
            None => None,
        };
        let output_schema = match &body.output_schema {
            Some(schema) => {
                crate::engine::output::check_schema(schema).map_err(|m| SubmitError::invalid("output_schema", m))?;
                Some(schema.clone())
            }
            None => definition.as_ref().and_then(|d| d.output_schema.clone()),
        };
        let options = TaskOptions {
            max_turns: MaxTurns::for_agent(agent, turns),
            system_prompt: body.system_prompt.clone(),
            parent_context: body.parent_context.clone(),
            agent: definition,
            resume_from: body.resume_from,
            timeout_seconds: Some(timeout_seconds),
            tools,
            approval,
            action_timeout_seconds,
            output_schema,
        };
        let stored = options.to_stored();
        // The same key must come with the same request: hash what was asked, as resolved.
        let request_hash = s.idempotency_key.as_ref().map(|_| {
            let canonical = json!([type_name, body.description, prompt, model.full(), stored, metadata]);
            hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
        });
        let new = NewTask {
            id: s.id,
            tenant: s.tenant.clone(),
            subagent_type: if AgentType::parse(&type_name).is_some() { agent.as_str().to_string() } else { type_name },
            description: body.description.clone(),
            prompt: body.prompt.clone(),
            model: model.full(),
            options: stored,
            metadata,
            idempotency_key: s.idempotency_key.clone(),
            request_hash,
            parent_task_id: body.resume_from,
            max_cost_usd,
            max_tokens,
            // A task without a caller's trace gets one of its own: its runs and calls join it.
            traceparent: Some(s.traceparent.clone().unwrap_or_else(crate::telemetry::new_traceparent)),
            webhook_url: body.webhook_url.clone(),
            api_key: s.api_key.clone(),
            start: None,
        };
        // What a spend budget must still hold for the task: its first call at the smallest.
        let spends = limits.usd_per_day.is_some() || limits.usd_per_month.is_some() || limits.tokens_per_day.is_some();
        let smallest = if spends {
            let messages = options.fresh_conversation(&new.prompt, agent);
            let specs = options.tools.iter().map(|t| t.spec()).collect();
            let floor = budget::OUTPUT_FLOOR.min(max_out);
            let (usd, tokens) = crate::engine::smallest_call(messages, specs, self.providers.price(&model), floor);
            Smallest { usd, tokens: tokens.min(i64::MAX as u64) as i64 }
        } else {
            Smallest::default()
        };
        Ok(Prepared { new, options, smallest })
    }

    /// The task `resume_from` names, if it can be resumed, with its options.
    async fn parent(&self, tenant: &str, pid: Uuid) -> Result<(TaskRow, Option<TaskOptions>), SubmitError> {
        let p = tasks::get(&self.pool, tenant, pid)
            .await?
            .ok_or_else(|| SubmitError::invalid("resume_from", format!("no task {pid} to resume")))?;
        if !p.is_terminal() {
            return Err(SubmitError::NotTerminal { id: pid, status: p.status });
        }
        if p.turns == 0 {
            return Err(SubmitError::invalid(
                "resume_from",
                format!("task {pid} never ran, so it has no conversation to resume"),
            ));
        }
        let opts = TaskOptions::from_stored(&p.options).ok();
        Ok((p, opts))
    }

    /// The run's tools: the catalog and MCP tools, then inline ones, through the filter chain.
    async fn whitelist(
        &self,
        tenant: &str,
        agent: AgentType,
        definition: Option<&crate::engine::definitions::AgentDefinition>,
        body: &TaskRequest,
    ) -> Result<Vec<ToolDef>, SubmitError> {
        let mut available = catalog::available(&self.pool, &self.tools_cache, tenant).await?;
        for (i, t) in body.tools.iter().flatten().enumerate() {
            let def = catalog::validate(
                &self.tool_caller,
                self.cfg.tool_timeout_ms,
                &format!("tools[{i}]."),
                &t.name,
                &t.tool,
            )?;
            available.retain(|a| a.name != def.name);
            available.push(def);
        }
        if let Some(allowed) = &body.allowed_tools {
            if let Some(unknown) = allowed.iter().find(|n| !available.iter().any(|a| &a.name == *n)) {
                let names: Vec<&str> = available.iter().map(|a| a.name.as_str()).collect();
                return Err(SubmitError::invalid(
                    "allowed_tools",
                    format!(
                        "{unknown:?} is not a tool of yours; available: {}",
                        if names.is_empty() { "none".into() } else { names.join(", ") }
                    ),
                ));
            }
        }
        // A definition's tool names as its author wrote them, mapped to tools here.
        let aliases = &self.file_agents.tool_aliases;
        let allow = definition.and_then(|d| d.tools.as_deref()).map(|t| claude_code::tool_names(t, aliases));
        let deny = definition.map(|d| claude_code::tool_names(&d.disallowed_tools, aliases)).unwrap_or_default();
        let w = Whitelist {
            read_only: agent.read_only() || definition.is_some_and(|d| d.read_only),
            allow: allow.as_deref(),
            deny: &deny,
            requested: body.allowed_tools.as_deref(),
        };
        Ok(crate::tools::offered(available, w))
    }
}

/// An earlier task with the submission's idempotency key: the same request (its `hash`), or a
/// conflict.
fn same_request(r: TaskRow, hash: &Option<String>) -> Result<Submitted, SubmitError> {
    if r.request_hash != *hash {
        return Err(SubmitError::IdempotencyConflict { task_id: r.id });
    }
    Ok(Submitted::Existing(r))
}
