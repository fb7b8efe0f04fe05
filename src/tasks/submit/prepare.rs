//! A request as a task to insert: every field checked, then the agent, the model (explicit,
//! never a silent fallback: invariant 5), the tools (the whitelist: invariant 2) and the
//! per-task limits resolved, in that order — so the first thing wrong is the one named.

use rust_decimal::Decimal;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::agents::{self, Resolved};
use super::{Prepared, Submission, TaskRequest};
use crate::budget::{self, Limits, Smallest};
use crate::engine::agents::{AgentType, Approval};
use crate::engine::claude_code;
use crate::engine::definitions::AgentDefinition;
use crate::engine::spec::{FallbackWhen, MaxTurns, TaskOptions, Usd};
use crate::kinds::{Priority, WorkspaceSpec};
use crate::llm::{ModelRef, ResolveError};
use crate::store::tasks::{self, NewTask, TaskRow};
use crate::tasks::{Lifecycle, TaskError};
use crate::tools::builtin::reach;
use crate::tools::catalog;
use crate::tools::{ToolDef, Whitelist};

const MAX_PROMPT_CHARS: usize = 200_000;
const MAX_DESCRIPTION_CHARS: usize = 80;
const MAX_METADATA_BYTES: usize = 16 * 1024;

/// What the request asks, checked on its own (before anything is read for it).
struct Checked {
    max_turns: Option<u32>,
    metadata: Value,
    /// A start time ahead (a time past, or none: now).
    run_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The furthest ahead a task may be scheduled.
const MAX_SCHEDULE_AHEAD_DAYS: i64 = 366;

/// Who runs the task: its agent (a custom definition runs with general's policy), and the model.
struct Agent {
    /// The name as asked (or the parent's).
    type_name: String,
    agent: AgentType,
    definition: Option<AgentDefinition>,
    model: ModelRef,
    /// The workspace of the task it resumes (read with the parent, once).
    parent_workspace: Option<WorkspaceSpec>,
}

/// The task's own limits, each within the tenant's caps.
struct TaskLimits {
    turns: Option<u32>,
    max_cost_usd: Option<Decimal>,
    max_tokens: Option<i64>,
    timeout_seconds: f64,
}

impl Lifecycle {
    pub(in crate::tasks) async fn prepare(&self, s: &Submission, limits: &Limits) -> Result<Prepared, TaskError> {
        let body = &s.request;
        let checked = self.check(body)?;
        let who = self.agent(s).await?;
        let own = task_limits(body, limits, &who, checked.max_turns, self.p.cfg.max_task_timeout_seconds as f64)?;
        self.priced(&who.model, limits, &own)?;
        let approval = approval(body, limits, who.definition.as_ref())?;
        let workspace = self.workspace(&s.tenant, body, limits, who.parent_workspace.as_ref()).await?;
        let tools = self.whitelist(&s.tenant, limits, &who, approval, body, workspace.as_ref()).await?;
        let max_out = self.p.providers.max_tokens_for(
            &who.model,
            who.definition.as_ref().and_then(|d| d.max_output_tokens),
            self.p.cfg.max_output_tokens,
        );
        let environment = self.environment(&s.tenant, body, &tools).await?;
        let mut options = self.options(body, limits, &who, &own, approval, tools)?;
        options.workspace = workspace;
        options.environment = environment;
        let stored = options.to_stored();
        let prompt = body.prompt.trim();
        // The same key must come with the same request: hash what was asked, as resolved.
        let request_hash = s.idempotency_key.as_ref().map(|_| {
            let canonical =
                json!([who.type_name, body.description, prompt, who.model.full(), stored, checked.metadata]);
            hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
        });
        let new = NewTask {
            id: s.id,
            tenant: s.tenant.clone(),
            subagent_type: match AgentType::parse(&who.type_name) {
                Some(_) => who.agent.as_str().to_string(),
                None => who.type_name.clone(),
            },
            description: body.description.clone(),
            prompt: body.prompt.clone(),
            model: who.model.full(),
            options: stored,
            metadata: checked.metadata,
            idempotency_key: s.idempotency_key.clone(),
            request_hash,
            parent_task_id: body.resume_from,
            max_cost_usd: own.max_cost_usd,
            max_tokens: own.max_tokens,
            // A task without a caller's trace gets one of its own: its runs and calls join it.
            traceparent: Some(s.traceparent.clone().unwrap_or_else(crate::telemetry::new_traceparent)),
            webhook_url: body.webhook_url.clone(),
            api_key: s.api_key.clone(),
            start: None,
            run_at: checked.run_at,
            priority: self.priority(body, limits, &who)?.rank(),
        };
        // What a spend budget must still hold for the task: its first call at the smallest.
        let spends = limits.usd_per_day.is_some() || limits.usd_per_month.is_some() || limits.tokens_per_day.is_some();
        let smallest = if spends {
            let messages = options.fresh_conversation(&new.prompt, who.agent);
            let specs = options.tools.iter().map(|t| t.spec()).collect();
            let floor = budget::OUTPUT_FLOOR.min(max_out);
            let (usd, tokens) =
                crate::engine::smallest_call(messages, specs, self.p.providers.price(&who.model), floor);
            Smallest { usd, tokens: tokens.min(i64::MAX as u64) as i64 }
        } else {
            Smallest::default()
        };
        Ok(Prepared { new, options, smallest, context: None })
    }

    /// The request's own values: texts, sizes, the turn budget's floor, the metadata.
    fn check(&self, body: &TaskRequest) -> Result<Checked, TaskError> {
        if let Some(u) = &body.webhook_url {
            self.p.tool_caller.allow.check_url(u).map_err(|e| TaskError::invalid("webhook_url", e.0))?;
        }
        if body.prompt.trim().is_empty() {
            return Err(TaskError::invalid("prompt", "must not be empty"));
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
                return Err(TaskError::invalid(field, "must not contain NUL characters"));
            }
        }
        if body.metadata.as_ref().is_some_and(|m| m.to_string().contains("\\u0000")) {
            return Err(TaskError::invalid("metadata", "must not contain NUL characters"));
        }
        if body.prompt.chars().count() > MAX_PROMPT_CHARS {
            return Err(TaskError::invalid("prompt", format!("must be at most {MAX_PROMPT_CHARS} characters")));
        }
        if body.description.as_ref().is_some_and(|d| d.chars().count() > MAX_DESCRIPTION_CHARS) {
            return Err(TaskError::invalid(
                "description",
                format!("must be at most {MAX_DESCRIPTION_CHARS} characters"),
            ));
        }
        let max_turns = match body.max_turns {
            Some(n) if n < 1 => {
                return Err(TaskError::invalid("max_turns", "must be at least 1 (values above 50 are clamped to 50)"))
            }
            Some(n) => Some(n.min(u32::MAX as i64) as u32),
            None => None,
        };
        if body.system_prompt.as_deref().is_some_and(|s| s.trim().is_empty()) {
            return Err(TaskError::invalid("system_prompt", "must not be empty when given"));
        }
        let metadata = match &body.metadata {
            None | Some(Value::Null) => json!({}),
            Some(m @ Value::Object(_)) => {
                if m.to_string().len() > MAX_METADATA_BYTES {
                    return Err(TaskError::invalid(
                        "metadata",
                        format!("must be at most {MAX_METADATA_BYTES} bytes of JSON"),
                    ));
                }
                m.clone()
            }
            Some(_) => return Err(TaskError::invalid("metadata", "must be a JSON object")),
        };
        let run_at = run_at(body)?;
        Ok(Checked { max_turns, metadata, run_at })
    }

    /// The request's priority, else the agent definition's, else the tenant's, else `normal`.
    fn priority(&self, body: &TaskRequest, limits: &Limits, who: &Agent) -> Result<Priority, TaskError> {
        match body.priority.as_deref() {
            Some(p) => Priority::parse(p.trim())
                .ok_or_else(|| TaskError::invalid("priority", format!("{p:?} is not one of high, normal, low"))),
            None => Ok(who
                .definition
                .as_ref()
                .and_then(|d| d.priority)
                .or_else(|| limits.priority.as_deref().and_then(Priority::parse))
                .unwrap_or_default()),
        }
    }

    /// The agent and the model. A resumed task continues its parent: same agent and model
    /// unless the request says otherwise.
    async fn agent(&self, s: &Submission) -> Result<Agent, TaskError> {
        let body = &s.request;
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
            _ => match agents::resolve(&self.p.pool, &self.p.file_agents, &s.tenant, &type_name).await? {
                Some(Resolved::Builtin(t)) => (t, None),
                // Custom agents run with general's tool policy and their own prompt and lists.
                Some(Resolved::Custom(d)) => (AgentType::General, Some(*d)),
                None => {
                    let available = agents::names(&self.p.pool, &self.p.file_agents, &s.tenant).await?;
                    return Err(TaskError::UnknownAgent { name: type_name, available });
                }
            },
        };
        let parent_model = if body.model.is_none() { parent.as_ref().map(|(p, _)| p.model.clone()) } else { None };
        let model = self.resolve_model(
            body.model.as_deref().or(parent_model.as_deref()),
            definition.as_ref().and_then(|d| d.model.as_deref()),
        )?;
        let parent_workspace = parent_opts.and_then(|o| o.workspace.clone());
        Ok(Agent { type_name, agent, definition, model, parent_workspace })
    }

    /// The model, explicitly: the request's, else the agent definition's, else the configured
    /// default — never a silent fallback.
    fn resolve_model(&self, requested: Option<&str>, from_definition: Option<&str>) -> Result<ModelRef, TaskError> {
        let pick = |m: Option<&str>| m.map(str::trim).filter(|m| !m.is_empty()).map(str::to_string);
        let name = pick(requested)
            .or_else(|| pick(from_definition))
            .or_else(|| self.p.cfg.default_model.clone())
            .or_else(|| self.p.providers.default_model.clone())
            .ok_or(TaskError::ModelRequired)?;
        let providers = self.p.providers.names();
        self.p.providers.resolve(&name).map_err(|e| {
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
            TaskError::UnknownModel { detail, providers: providers.clone() }
        })
    }

    /// A model with no price cannot be held to limits in USD: refused unless a token limit
    /// holds it too.
    fn priced(&self, model: &ModelRef, limits: &Limits, own: &TaskLimits) -> Result<(), TaskError> {
        if self.p.providers.price(model).is_some() || limits.tokens_per_day.is_some() || own.max_tokens.is_some() {
            return Ok(());
        }
        let usd: Vec<&'static str> = [
            ("usd_per_day", limits.usd_per_day.is_some()),
            ("usd_per_month", limits.usd_per_month.is_some()),
            ("max_cost_usd", own.max_cost_usd.is_some()),
        ]
        .into_iter()
        .filter_map(|(n, set)| set.then_some(n))
        .collect();
        match usd.is_empty() {
            true => Ok(()),
            false => Err(TaskError::UnpricedModel { model: model.full(), limits: usd }),
        }
    }

    /// What the task asks of its run, typed.
    fn options(
        &self,
        body: &TaskRequest,
        limits: &Limits,
        who: &Agent,
        own: &TaskLimits,
        approval: Approval,
        tools: Vec<ToolDef>,
    ) -> Result<TaskOptions, TaskError> {
        let definition = who.definition.as_ref();
        let action_cap = self.p.cfg.max_action_timeout_seconds as f64;
        let action_timeout_seconds = match body.action_timeout_seconds {
            Some(t) if !t.is_finite() || t <= 0.0 => {
                return Err(TaskError::invalid("action_timeout_seconds", "must be a positive number of seconds"))
            }
            Some(t) => Some(t.min(action_cap)),
            None => None,
        };
        let output_schema = match &body.output_schema {
            Some(schema) => {
                crate::engine::output::check_schema(schema).map_err(|m| TaskError::invalid("output_schema", m))?;
                Some(schema.clone())
            }
            None => definition.and_then(|d| d.output_schema.clone()),
        };
        let (fallback_models, fallback_on) = self.fallbacks(body, limits, who, own)?;
        Ok(TaskOptions {
            max_turns: MaxTurns::for_agent(who.agent, own.turns),
            system_prompt: body.system_prompt.clone(),
            parent_context: body.parent_context.clone(),
            agent: who.definition.clone(),
            resume_from: body.resume_from,
            timeout_seconds: Some(own.timeout_seconds),
            tools,
            approval,
            action_timeout_seconds,
            output_schema,
            fallback_models,
            fallback_on,
            workspace: None,
            environment: None,
        })
    }

    /// The request's `environment`, checked (its registry allowed, before any network), else the
    /// service's default image: only for a task given `run_command`, the one tool it concerns.
    async fn environment(
        &self,
        tenant: &str,
        body: &TaskRequest,
        tools: &[crate::tools::ToolDef],
    ) -> Result<Option<crate::kinds::EnvironmentSpec>, TaskError> {
        use crate::tools::Target;
        let commands =
            tools.iter().any(|t| matches!(t.target, Target::Builtin { tool: crate::kinds::BuiltinTool::RunCommand }));
        let Some(env) = &body.environment else {
            let default =
                self.p.cfg.sandbox_image.as_deref().filter(|_| commands && self.p.tool_caller.images.is_some());
            return Ok(default.map(|d| crate::kinds::EnvironmentSpec { image: Some(d.to_string()), name: None }));
        };
        let Some(images) = &self.p.tool_caller.images else {
            return Err(TaskError::invalid(
                "environment",
                "an environment is where run_command runs, and the sandbox does not start on this host",
            ));
        };
        if !commands {
            return Err(TaskError::invalid(
                "environment",
                "an environment is where run_command runs, and this task is not given run_command \
                 (a general task with a workspace is)",
            ));
        }
        match (&env.image, &env.name) {
            (Some(image), None) => {
                images.check(image).map_err(|e| TaskError::invalid("environment.image", e.to_string()))?;
                Ok(Some(env.clone()))
            }
            (None, Some(name)) => {
                if crate::store::environments::get(&self.p.pool, tenant, name).await?.is_none() {
                    return Err(TaskError::invalid(
                        "environment.name",
                        format!("no environment named {name:?}: define one with PUT /environments/{name}"),
                    ));
                }
                Ok(Some(env.clone()))
            }
            _ => Err(TaskError::invalid(
                "environment",
                "give `image` (an OCI reference such as registry.example.com/team/app:1) or `name` (an environment of \
                 PUT /environments/{name}), not both",
            )),
        }
    }

    /// The request's `workspace`, checked: a repository URL the address guard allows (an IP
    /// literal fully, a name again at connect), a plain ref, a secret and an upload that exist
    /// for this tenant, and the web beside a private workspace only where the tenant allows it.
    async fn workspace(
        &self,
        tenant: &str,
        body: &TaskRequest,
        limits: &Limits,
        parent: Option<&WorkspaceSpec>,
    ) -> Result<Option<WorkspaceSpec>, TaskError> {
        // A task that continues another's conversation reads the same workspace (the conversation
        // holds what was read there: the same rules, the web tools' included, must hold).
        let Some(w) = body.workspace.as_ref().or(parent) else { return Ok(None) };
        let pool = &self.p.pool;
        match (&w.git, &w.name) {
            (Some(url), None) => {
                let parsed = url::Url::parse(url)
                    .map_err(|e| TaskError::invalid("workspace.git", format!("{url:?} is not a URL: {e}")))?;
                if !parsed.username().is_empty() || parsed.password().is_some() {
                    return Err(TaskError::invalid(
                        "workspace.git",
                        "credentials in the URL are not allowed: store the token as a secret (PUT /secrets/{name}) \
                         and name it in `workspace.secret`",
                    ));
                }
                self.p.workspaces.allow.check_url(url).map_err(|e| TaskError::invalid("workspace.git", e.0))?;
                if let Some(r) = &w.git_ref {
                    let bad = r.is_empty()
                        || r.len() > 255
                        || r.starts_with('-')
                        || r.contains("..")
                        || r.chars().any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c));
                    if bad {
                        return Err(TaskError::invalid(
                            "workspace.ref",
                            format!("{r:?} is not a branch, tag or commit name"),
                        ));
                    }
                }
                if let Some(secret) = &w.secret {
                    if parsed.scheme() != "https" {
                        return Err(TaskError::invalid(
                            "workspace.secret",
                            "a secret is sent only over https: the repository URL must be https://",
                        ));
                    }
                    let host = parsed.host_str().unwrap_or_default().to_ascii_lowercase();
                    match crate::store::workspaces::secret_host(pool, tenant, secret).await? {
                        None => {
                            return Err(TaskError::invalid(
                                "workspace.secret",
                                format!("no secret named {secret:?}: create it with PUT /secrets/{secret}"),
                            ))
                        }
                        Some(h) if h != host => {
                            return Err(TaskError::invalid(
                                "workspace.secret",
                                format!("the secret {secret:?} is for host {h:?}, not {host:?}"),
                            ))
                        }
                        Some(_) => {}
                    }
                }
            }
            (None, Some(name)) => {
                if w.git_ref.is_some() || w.secret.is_some() {
                    return Err(TaskError::invalid("workspace", "`ref` and `secret` go with `git`, not with `name`"));
                }
                if crate::store::workspaces::content_hash(pool, tenant, name).await?.is_none() {
                    return Err(TaskError::invalid(
                        "workspace.name",
                        format!("no workspace named {name:?}: upload one with PUT /workspaces/{name}"),
                    ));
                }
            }
            _ => {
                return Err(TaskError::invalid(
                    "workspace",
                    "give either `git` (a repository URL, with an optional `ref`) or `name` (an uploaded workspace)",
                ))
            }
        }
        if w.web == Some(true) && !web_beside(limits, w) {
            return Err(TaskError::invalid(
                "workspace.web",
                "the web tools are not offered beside a private workspace for this tenant \
                 (its `private_workspace_web` is `never`)",
            ));
        }
        Ok(Some(w.clone()))
    }

    /// The fallback models (the request's, else the definition's, else the tenant's), each one
    /// served here, priced where a USD limit applies, and not the task's own model; and which
    /// failures move a call to them. Explicit like the model itself (invariant 5).
    fn fallbacks(
        &self,
        body: &TaskRequest,
        limits: &Limits,
        who: &Agent,
        own: &TaskLimits,
    ) -> Result<(Vec<String>, Option<Vec<FallbackWhen>>), TaskError> {
        let definition = who.definition.as_ref();
        let (field, names) = match (&body.fallback_models, definition.filter(|d| !d.fallback_models.is_empty())) {
            (Some(list), _) => ("fallback_models", list.clone()),
            (None, Some(d)) => ("agent.fallback_models", d.fallback_models.clone()),
            (None, None) => ("tenant.fallback_models", limits.fallback_models.clone().unwrap_or_default()),
        };
        let names = crate::llm::check_fallback_models(&names).map_err(|m| TaskError::invalid(field, m))?;
        let mut models = vec![];
        for (i, name) in names.iter().enumerate() {
            let m = self.resolve_model(Some(name), None).map_err(|e| match e {
                TaskError::UnknownModel { detail, .. } => {
                    TaskError::invalid(field, format!("[{i}] {}", detail.trim_start_matches("model: ")))
                }
                e => e,
            })?;
            if m == who.model || models.contains(&m.full()) {
                return Err(TaskError::invalid(field, format!("[{i}] {name:?} is the task's model, or named twice")));
            }
            self.priced(&m, limits, own).map_err(|e| TaskError::invalid(field, format!("[{i}] {e}")))?;
            models.push(m.full());
        }
        let fallback_on = match body.fallback_on.as_ref() {
            Some(w) => Some(
                crate::engine::definitions::check_fallback_on(w).map_err(|m| TaskError::invalid("fallback_on", m))?,
            ),
            None => definition.and_then(|d| d.fallback_on.clone()),
        };
        Ok((models, fallback_on))
    }

    /// The task `resume_from` names, if it can be resumed, with its options.
    async fn parent(&self, tenant: &str, pid: Uuid) -> Result<(TaskRow, Option<TaskOptions>), TaskError> {
        let p = tasks::get(&self.p.pool, tenant, pid)
            .await?
            .ok_or_else(|| TaskError::invalid("resume_from", format!("no task {pid} to resume")))?;
        if !p.is_terminal() {
            return Err(TaskError::NotTerminal { id: pid, status: p.status });
        }
        if p.turns == 0 {
            return Err(TaskError::invalid(
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
        limits: &Limits,
        who: &Agent,
        approval: Approval,
        body: &TaskRequest,
        workspace: Option<&WorkspaceSpec>,
    ) -> Result<Vec<ToolDef>, TaskError> {
        let (agent, definition) = (who.agent, who.definition.as_ref());
        let mut available = catalog::available(&self.p.pool, &self.p.tools_cache, tenant).await?;
        // A tenant tool named like a built-in (from before the name was reserved) gives way to it.
        available.retain(|t| !crate::tools::builtin::is_reserved(&t.name));
        for (i, t) in body.tools.iter().flatten().enumerate() {
            let def = catalog::validate(
                &self.p.tool_caller,
                self.p.cfg.tool_timeout_ms,
                &format!("tools[{i}]."),
                &t.name,
                &t.tool,
            )?;
            available.retain(|a| a.name != def.name);
            available.push(def);
        }
        // The built-ins on for the service and the tenant: a built-in type gets those the seed
        // gives it; a definition those its `tools` names (all of them with no list, as `general`).
        // A provider-side search cannot wait for a decision: where one would be asked, the
        // search is the service's own.
        let gated = match approval {
            Approval::All => true,
            Approval::Propose => limits.web_tools_policy.as_deref() == Some("propose"),
            Approval::None => false,
        };
        let anthropic = self.p.providers.for_model(&who.model).is_some_and(|p| p.system() == "anthropic");
        let builtins = self.p.tool_caller.builtins.for_run(limits, anthropic, gated);
        // The workspace tools only with a workspace; the web beside a private one only where
        // the tenant allows it (a fetched URL could carry the code out).
        let web_ok = workspace.is_none_or(|w| web_beside(limits, w));
        available.extend(builtins.into_iter().filter(|d| match (&d.target, definition) {
            (crate::tools::Target::Builtin { tool } | crate::tools::Target::Provider { tool }, _)
                if (reach(*tool).needs_workspace() && workspace.is_none())
                    || (reach(*tool).reaches_web() && !web_ok) =>
            {
                false
            }
            (crate::tools::Target::Builtin { tool } | crate::tools::Target::Provider { tool }, None) => {
                agent.gets(*tool)
            }
            _ => true,
        }));
        if let Some(allowed) = &body.allowed_tools {
            if let Some(unknown) = allowed.iter().find(|n| !available.iter().any(|a| &a.name == *n)) {
                let names: Vec<&str> = available.iter().map(|a| a.name.as_str()).collect();
                // A built-in not offered here says why, not that it is not the tenant's.
                let why = crate::kinds::BuiltinTool::parse(unknown).map(|t| {
                    if let Some(off) = self.p.tool_caller.builtins.why_off(t, limits) {
                        off
                    } else if reach(t).needs_workspace() && workspace.is_none() {
                        format!("{t} is offered only in a task with a workspace")
                    } else if reach(t).reaches_web() && !web_ok {
                        format!(
                            "{t} is not offered beside a private workspace (an upload, or a repository read with a \
                             secret) unless the tenant's private_workspace_web allows it (`task`: with workspace.web: true)"
                        )
                    } else {
                        format!("{t} is not offered to this task")
                    }
                });
                return Err(TaskError::invalid(
                    "allowed_tools",
                    format!(
                        "{}; available: {}",
                        why.unwrap_or_else(|| format!("{unknown:?} is not a tool of yours")),
                        if names.is_empty() { "none".into() } else { names.join(", ") }
                    ),
                ));
            }
        }
        // A definition's tool names as its author wrote them, mapped to tools here.
        let aliases = &self.p.file_agents.tool_aliases;
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

/// The task's approval mode: the request's, else its agent definition's, else the tenant's.
/// May a task over workspace `w` have the web tools? Always beside a public one; beside a
/// private one (an upload, a repository read with a secret) as the tenant's
/// `private_workspace_web` says: `always`, `task` when the task asks, else never.
fn web_beside(limits: &Limits, w: &WorkspaceSpec) -> bool {
    !w.private()
        || match limits.private_workspace_web.as_deref() {
            Some("always") => true,
            Some("task") => w.web == Some(true),
            _ => false,
        }
}

fn approval(body: &TaskRequest, limits: &Limits, definition: Option<&AgentDefinition>) -> Result<Approval, TaskError> {
    Ok(match body.approval.as_deref() {
        Some(a) => Approval::parse(a)
            .ok_or_else(|| TaskError::invalid("approval", format!("{a:?} is not one of none, propose, all")))?,
        None => definition
            .and_then(|d| d.approval)
            .or_else(|| limits.approval.as_deref().and_then(Approval::parse))
            .unwrap_or_default(),
    })
}

/// The task's limits: its turns, spend, tokens and time, each within the tenant's caps.
fn task_limits(
    body: &TaskRequest,
    limits: &Limits,
    who: &Agent,
    max_turns: Option<u32>,
    max_timeout: f64,
) -> Result<TaskLimits, TaskError> {
    let turns = max_turns.or(who.definition.as_ref().and_then(|d| d.max_turns));
    let turns = match (turns, limits.max_task_turns) {
        (t, Some(cap)) => Some(t.unwrap_or(who.agent.default_max_turns()).min(cap.max(1) as u32)),
        (t, None) => t,
    };
    let mut cap = max_timeout;
    if let Some(t) = limits.max_task_timeout_seconds {
        cap = cap.min(f64::from(t.max(1)));
    }
    let max_cost_usd = match body.max_cost_usd {
        Some(v) => {
            let d = Usd::from_f64(v).map_err(|m| TaskError::invalid("max_cost_usd", m))?.get();
            Some(limits.max_task_cost_usd.map_or(d, |cap| d.min(cap)))
        }
        None => limits.max_task_cost_usd,
    };
    let max_tokens = match body.max_tokens {
        Some(v) if v < 1 => return Err(TaskError::invalid("max_tokens", "must be at least 1")),
        Some(v) => Some(limits.max_task_tokens.map_or(v, |cap| v.min(cap))),
        None => limits.max_task_tokens,
    };
    let timeout_seconds = match body.timeout_seconds {
        Some(t) if !t.is_finite() || t <= 0.0 => {
            return Err(TaskError::invalid("timeout_seconds", "must be a positive number of seconds"))
        }
        Some(t) => t.min(cap),
        None => cap,
    };
    Ok(TaskLimits { turns, max_cost_usd, max_tokens, timeout_seconds })
}

/// When the task starts: `run_at` (RFC 3339) or `delay_seconds` from now, not both; `None` for
/// now (a time past is now). At most a year ahead.
fn run_at(body: &TaskRequest) -> Result<Option<chrono::DateTime<chrono::Utc>>, TaskError> {
    let now = chrono::Utc::now();
    let at = match (&body.run_at, body.delay_seconds) {
        (Some(_), Some(_)) => return Err(TaskError::invalid("run_at", "give run_at or delay_seconds, not both")),
        (Some(t), None) => chrono::DateTime::parse_from_rfc3339(t.trim())
            .map_err(|_| TaskError::invalid("run_at", format!("{t:?} is not an RFC 3339 time (2026-11-26T09:00:00Z)")))?
            .with_timezone(&chrono::Utc),
        (None, Some(d)) if !d.is_finite() || d < 0.0 => {
            return Err(TaskError::invalid("delay_seconds", "must be a number of seconds, 0 or more"))
        }
        (None, Some(d)) => now + chrono::Duration::milliseconds((d.min(1e12) * 1000.0) as i64),
        (None, None) => return Ok(None),
    };
    if at > now + chrono::Duration::days(MAX_SCHEDULE_AHEAD_DAYS) {
        let field = if body.run_at.is_some() { "run_at" } else { "delay_seconds" };
        return Err(TaskError::invalid(field, format!("must be at most {MAX_SCHEDULE_AHEAD_DAYS} days ahead")));
    }
    Ok((at > now).then_some(at))
}
