//! One run of a task in this process: its conversation (fresh, resumed, or continued after a
//! rescue), its tools and their credentials, the engine, its time limit and its stop signal,
//! and its end (`finish`).

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::finish::{self, RunFacts};
use super::run_store::{call_ask, PgRunStore};
use crate::budget::Defaults;
use crate::config::Config;
use crate::engine::agents::AgentType;
use crate::engine::spec::TaskOptions;
use crate::engine::{self, Answer, Gate, Outcome, Resolution, RunEnd, RunInput, StopCause, StopSignal};
use crate::hub::Hub;
use crate::kinds::FailureCode;
use crate::kinds::{Answerer, Decision};
use crate::llm::{Message, ModelRef, Providers, ToolCall};
use crate::store::tasks::{FirstCall, NewTask, TaskRow};
use crate::store::{retrying, runs, tools as tool_store, Fence};
use crate::tools::{Caller, Target, TaskTools};
use crate::workspace::{git, WorkspaceError};

/// What running a task needs, shared by every run of this process.
pub struct Runner {
    pub pool: PgPool,
    pub hub: Arc<Hub>,
    pub providers: Arc<Providers>,
    pub tool_caller: Caller,
    pub cfg: Arc<Config>,
    /// Tenants' signing secrets, cached a minute.
    pub secrets: crate::cache::TtlCache<String>,
    /// Fired when the drain's grace runs out: a run registering after that stops at once.
    pub draining: CancellationToken,
    /// Commits runs' turns in groups.
    pub committer: Arc<crate::store::committer::Committer>,
    /// This process's workspace cache.
    pub workspaces: Arc<crate::workspace::Workspaces>,
}

/// Keeps `subagentd_active_runs` right however a run ends.
struct ActiveRun;

impl ActiveRun {
    fn start() -> ActiveRun {
        metrics::gauge!("subagentd_active_runs").increment(1.0);
        ActiveRun
    }
}

impl Drop for ActiveRun {
    fn drop(&mut self) {
        metrics::gauge!("subagentd_active_runs").decrement(1.0);
    }
}

/// Unregisters a run from the hub however it ends, a panic included: the lease then lapses
/// and the rescuer takes the task, instead of a heartbeat keeping it `running` forever.
struct Registered<'a>(&'a Hub, Uuid);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.unregister_run(self.1);
    }
}

impl Runner {
    /// Run `row` (claimed, or started here) to its end. `opts`: its options when the caller has
    /// them typed already (else they are read from the row). `first_reserved`: its first call's
    /// reservation was written with the task.
    pub async fn run_task(&self, row: TaskRow, opts: Option<TaskOptions>, first_reserved: bool) {
        let Some(lease) = row.lease_token else { return };
        let fence = Fence { id: row.id, lease };
        metrics::counter!("subagentd_claims_total").increment(1);
        if row.attempt == 1 {
            let wait = (chrono::Utc::now() - row.queued_since()).to_std().unwrap_or_default();
            metrics::histogram!("subagentd_queue_wait_seconds").record(wait.as_secs_f64());
        }
        let _active = ActiveRun::start();
        let stop = StopSignal::new();
        self.hub.register_run(fence, stop.clone());
        let _registered = Registered(&self.hub, row.id);
        if row.cancel_requested {
            stop.stop(StopCause::Cancelled);
        }
        // Registered after the drain's sweep: stop as the sweep would have.
        if self.draining.is_cancelled() {
            stop.stop(StopCause::Drain);
        }
        let store = PgRunStore {
            pool: self.pool.clone(),
            fence,
            tenant: row.tenant.clone(),
            attempt: row.attempt,
            budgets: Defaults::from_config(&self.cfg).spend(),
            hub: self.hub.clone(),
            committer: self.committer.clone(),
            live: crate::live::Output::new(self.hub.clone(), self.pool.clone(), row.id),
            copy: Default::default(),
            unstorable: Default::default(),
        };
        let host = self.providers.resolve(&row.model).ok().and_then(|m| self.providers.get(&m.provider)?.host());
        let mut facts = RunFacts {
            agent: &row.subagent_type,
            time_limit: None,
            model: &row.model,
            host: host.as_deref(),
            action_timeout: self.cfg.max_action_timeout_seconds as f64,
            deadline: None,
        };
        // The task's options, read once for the whole run.
        let opts = match opts.map_or_else(|| TaskOptions::from_stored(&row.options), Ok) {
            Ok(o) => o,
            Err(e) => {
                let end = Outcome::Failed { code: FailureCode::Internal, message: e }.into();
                return finish::apply(&store, end, facts, row.started_at).await;
            }
        };
        facts.time_limit = opts.timeout_seconds;
        facts.action_timeout = opts.action_timeout_seconds.unwrap_or(facts.action_timeout);
        // The time limit runs from the task's first start, across attempts, paused time apart.
        facts.deadline = opts.timeout_seconds.and_then(|secs| {
            let started = row.started_at.unwrap_or_else(chrono::Utc::now);
            let limit = chrono::Duration::milliseconds((secs * 1000.0).min(1e12) as i64 + row.paused_ms.max(0));
            started.checked_add_signed(limit)
        });
        let timer = facts.deadline.map(|d| self.time_limit(d, &stop));
        let end = self.prepare_and_run(&row, &opts, &store, &stop, first_reserved).await;
        if let Some(t) = timer {
            t.abort();
        }
        // The last text goes out before the end is committed: a subscriber has it all when it
        // hears of the end.
        store.live.close().await;
        let end = store.unstorable_end(end);
        finish::apply(&store, end, facts, row.started_at).await;
    }

    /// Stop the run at the task's `deadline`.
    fn time_limit(&self, deadline: chrono::DateTime<chrono::Utc>, stop: &StopSignal) -> tokio::task::JoinHandle<()> {
        let left = (deadline - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO);
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(left).await;
            stop.stop(StopCause::Timeout);
        })
    }

    async fn prepare_and_run(
        &self,
        row: &TaskRow,
        opts: &TaskOptions,
        store: &PgRunStore,
        stop: &StopSignal,
        first_reserved: bool,
    ) -> RunEnd {
        let internal = |m: String| RunEnd::from(Outcome::Failed { code: FailureCode::Internal, message: m });
        let model = match self.providers.resolve(&row.model) {
            Ok(m) => m,
            Err(_) => {
                return Outcome::Failed {
                    code: FailureCode::UnknownModel,
                    message: format!("model {:?} has no configured provider on this worker", row.model),
                }
                .into()
            }
        };
        let Some(provider) = self.providers.for_model(&model) else {
            return internal("provider vanished".into());
        };
        let agent = AgentType::parse(&row.subagent_type).unwrap_or(AgentType::General);
        let load = |id| async move {
            let raw = retrying(&self.pool, || runs::messages(&self.pool, id))
                .await
                .map_err(|_| RunEnd::from(Outcome::Stopped(StopCause::LeaseLost)))?;
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
                        code: FailureCode::ResumeUnavailable,
                        message: format!("the conversation of task {parent} is no longer stored"),
                    }
                    .into()
                }
                Err(o) => return o,
            }
        } else {
            (vec![], opts.fresh_conversation(&row.prompt, agent))
        };
        let mut tools = match self.task_tools(row, opts).await {
            Ok(t) => t,
            Err(o) => return o.into(),
        };
        if let Some(spec) = &opts.workspace {
            let ready = tokio::spawn(self.workspace(row.clone(), store.fence, spec.clone()));
            tools.workspace = match until_ready(ready, stop, "the workspace").await {
                Ok(root) => Some(root),
                Err(o) => return o.into(),
            };
            if opts.tools.iter().any(|t| matches!(t.target, Target::Builtin { tool } if crate::tools::builtin::reach(tool).writes_workspace())) {
                if let Err(e) = self.own_copy(row, opts, store, &mut tools).await {
                    return internal(e);
                }
            }
        }
        let (images, sandbox) = (self.tool_caller.images.clone(), self.tool_caller.sandbox.clone());
        if let (Some(spec), Some(images), Some(sandbox)) = (opts.environment.clone(), images, sandbox) {
            // Network in runs never beside a private workspace (an upload, or a repository read
            // with a secret): a fetched URL could carry the code out.
            let private = opts.workspace.as_ref().is_some_and(|w| w.private());
            let tools_of = Tools { images, sandbox, private };
            let ready = tokio::spawn(environment(self.pool.clone(), tools_of, row.clone(), store.fence, spec));
            tools.environment = match until_ready(ready, stop, "the environment").await {
                Ok(root) => Some(root),
                Err(o) => return o.into(),
            };
        }
        let answers = match self.answers(row, &history).await {
            Ok(a) => a,
            Err(e) => return e,
        };
        let mut input = self.run_input(row.turns, row.traceparent.as_deref(), &row.subagent_type, opts, &model);
        input.history = history;
        input.new_messages = new_messages;
        input.first_reserved = first_reserved;
        input.answers = answers;
        let end = engine::run(input, provider.as_ref(), &tools, store, stop).await;
        if let Some(c) = store.copy.get() {
            match c.finish(&self.pool, store.fence).await {
                Ok(true) => {}
                Err(e) if e.is_unstorable() => {
                    // Refused for what it holds: the task fails naming why (`unstorable_end`).
                    let _ = store.unstorable.set(format!("the run's diff could not be stored: {e}"));
                    return Outcome::Stopped(StopCause::LeaseLost).into();
                }
                _ => return Outcome::Stopped(StopCause::LeaseLost).into(),
            }
        }
        end
    }

    /// The run's own copy of its workspace, in place of the shared tree for its tools.
    async fn own_copy(
        &self,
        row: &TaskRow,
        opts: &TaskOptions,
        store: &PgRunStore,
        tools: &mut TaskTools,
    ) -> Result<(), String> {
        let Some(shared) = tools.workspace.take() else { return Ok(()) };
        let root = super::copy::process_dir(&self.cfg);
        let limits = super::copy::Limits {
            write_bytes: self.cfg.sandbox_write_mb << 20,
            write_entries: self.cfg.sandbox_write_entries,
            keep_max: self.cfg.sandbox_keep_mb.max(1) << 20,
            rules: crate::workspace::copy::Rules {
                diff_max: self.cfg.sandbox_diff_max_kb << 10,
                binary_max: self.cfg.sandbox_diff_binary_kb << 10,
                ignore: crate::workspace::copy::patterns(&self.cfg.sandbox_ignore),
            },
        };
        let owner = self.tool_caller.sandbox.as_ref().and_then(|s| s.uid());
        let (task, parent) = (row.id, opts.resume_from);
        let c = super::copy::TaskCopy::make(&self.pool, task, parent, &shared.path, &root, limits, owner).await?;
        let c = Arc::new(c);
        tools.workspace = Some(crate::tools::files::Root {
            path: c.dir.clone(),
            copy: Some(crate::tools::files::Copy {
                dirty: c.dirty.clone(),
                max: c.max,
                keep: c.keep_max,
                lock: Default::default(),
            }),
            hold: Box::new((shared.hold, c.clone())),
        });
        let _ = store.copy.set(c);
        Ok(())
    }

    /// A resumed pause's answers: for each call of the conversation's last turn that has no
    /// result yet, how its action was answered, in the model's order.
    async fn answers(&self, row: &TaskRow, history: &[Message]) -> Result<Vec<Answer>, RunEnd> {
        if row.pauses == 0 {
            return Ok(vec![]);
        }
        let Some(at) = history.iter().rposition(|m| matches!(m, Message::Assistant { .. })) else { return Ok(vec![]) };
        let Message::Assistant { tool_calls, .. } = &history[at] else { return Ok(vec![]) };
        let answered: Vec<&str> = history[at..]
            .iter()
            .filter_map(|m| if let Message::Tool { tool_call_id, .. } = m { Some(tool_call_id.as_str()) } else { None })
            .collect();
        let open: Vec<&ToolCall> = tool_calls.iter().filter(|c| !answered.contains(&c.id.as_str())).collect();
        if open.is_empty() {
            return Ok(vec![]);
        }
        let actions = retrying(&self.pool, || crate::store::actions::of_pause(&self.pool, row.id, row.pauses))
            .await
            .map_err(|_| RunEnd::from(Outcome::Stopped(StopCause::LeaseLost)))?;
        Ok(open
            .into_iter()
            .map(|call| {
                let a = actions.iter().find(|a| a.tool_call_id == call.id);
                let gate = a.map_or(Gate::Approval, |a| a.kind);
                let resolution = match a {
                    Some(a) if a.answered_at.is_none() || a.answered_by == Some(Answerer::Expired) => {
                        Resolution::Expired(gate)
                    }
                    Some(a) if a.kind == Gate::Output => {
                        let text = match &a.output {
                            Some(serde_json::Value::String(s)) => s.clone(),
                            Some(v) => v.to_string(),
                            None => String::new(),
                        };
                        Resolution::Output(crate::tools::cap(text, self.tool_caller.max_result_bytes))
                    }
                    Some(a) if a.decision == Some(Decision::Approve) => Resolution::Approved,
                    Some(a) => Resolution::Denied { message: a.message.clone() },
                    None => Resolution::Expired(gate),
                };
                Answer { call: call.clone(), resolution }
            })
            .collect())
    }

    /// The run's input, its conversation left empty; `turns`, `traceparent` and `agent_name`
    /// are the task's.
    fn run_input(
        &self,
        turns: i32,
        traceparent: Option<&str>,
        agent_name: &str,
        opts: &TaskOptions,
        model: &ModelRef,
    ) -> RunInput {
        RunInput {
            provider_name: model.provider.clone(),
            price: self.providers.price(model),
            model: model.model.clone(),
            history: vec![],
            new_messages: vec![],
            turns_done: turns.max(0) as u32,
            max_turns: opts.max_turns.get(),
            tools: opts.tools.iter().map(|t| t.spec()).collect::<Vec<_>>().into(),
            tool_concurrency: self.cfg.tool_concurrency.max(1),
            // The agent definition's, else the model's or its provider's, else the default.
            max_tokens: Some(self.providers.max_tokens_for(
                model,
                opts.agent.as_ref().and_then(|d| d.max_output_tokens),
                self.cfg.max_output_tokens,
            )),
            traceparent: traceparent.map(Into::into),
            retry: self.providers.retry,
            agent: agent_name.to_string(),
            first_reserved: false,
            text_tool_calls: self.providers.text_tool_calls(model),
            output_floor: crate::budget::OUTPUT_FLOOR,
            gates: opts.gates(),
            answers: vec![],
            output_schema: opts.output_schema.clone(),
            fallbacks: opts.fallback_models.iter().filter_map(|m| self.fallback(m, opts)).collect(),
            fallback_on: opts.fallback_on(),
        }
    }

    /// Fallback model `name` as a run of `opts` may use it: unfit (skipped, with the reason)
    /// when its provider cannot serve what the run needs, or is not configured on this worker.
    fn fallback(&self, name: &str, opts: &TaskOptions) -> Option<engine::Fallback> {
        let m = ModelRef::parse(name)?;
        let (provider, mut unfit) = match self.providers.for_model(&m) {
            Some(p) => (p, None),
            None => (
                Arc::new(crate::llm::mock::MockProvider) as Arc<dyn crate::llm::Provider>,
                Some(format!("no provider {:?} is configured on this worker", m.provider)),
            ),
        };
        let cannot = self.providers.cannot(&m);
        if unfit.is_none() && !opts.tools.is_empty() && cannot.contains(&"tools") {
            unfit = Some("its provider cannot call tools, and this run has tools".into());
        }
        if unfit.is_none() && opts.output_schema.is_some() && cannot.contains(&"structured output") {
            unfit = Some("its provider gives no structured output, and this run has an output_schema".into());
        }
        Some(engine::Fallback {
            provider,
            provider_name: m.provider.clone(),
            price: self.providers.price(&m),
            max_tokens: Some(self.providers.max_tokens_for(
                &m,
                opts.agent.as_ref().and_then(|d| d.max_output_tokens),
                self.cfg.max_output_tokens,
            )),
            text_tool_calls: self.providers.text_tool_calls(&m),
            model: m.model,
            unfit,
        })
    }

    /// What the first provider call of `t`, about to start here, will reserve, so that the
    /// reservation can be written with the task (one commit less before the call; the run
    /// then skips its own first reservation). `None` for a task whose run will reserve for
    /// itself: one that does not start fresh, or whose model is unknown here.
    pub fn first_call(&self, t: &NewTask, opts: &TaskOptions) -> Option<FirstCall> {
        let model = self.providers.resolve(&t.model).ok()?;
        if opts.resume_from.is_some() || self.providers.for_model(&model).is_none() {
            return None;
        }
        let agent = AgentType::parse(&t.subagent_type).unwrap_or(AgentType::General);
        let mut input = self.run_input(0, t.traceparent.as_deref(), &t.subagent_type, opts, &model);
        input.new_messages = opts.fresh_conversation(&t.prompt, agent);
        let (ask, started) = engine::first_reservation(&input);
        let (usd, tokens) = ask.worst();
        let defaults = Defaults::from_config(&self.cfg).spend();
        // Written whole or not at all: the run's first call then asks for what it reserved.
        let whole = call_ask(&ask, true);
        Some(FirstCall { usd, tokens: tokens.min(i64::MAX as u64) as i64, started, defaults, ask: whole })
    }

    /// The task's workspace on this worker's disk: its version resolved and recorded at the
    /// first start (every later attempt reads the recorded one), then its tree from the cache,
    /// filled if this replica lacks it; a `workspace_ready` event says what it took.
    fn workspace(
        &self,
        row: TaskRow,
        fence: Fence,
        spec: crate::kinds::WorkspaceSpec,
    ) -> impl std::future::Future<Output = Result<crate::tools::files::Root, Outcome>> + Send + 'static {
        let (pool, ws) = (self.pool.clone(), self.workspaces.clone());
        async move {
            let failed = |e: WorkspaceError| Outcome::Failed { code: e.code(), message: e.to_string() };
            let lost = || Outcome::Stopped(StopCause::LeaseLost);
            let token = match &spec.secret {
                Some(name) => {
                    match retrying(&pool, || crate::store::workspaces::secret_value(&pool, &row.tenant, name)).await {
                        Ok(Some((v, host))) => {
                            // Sent only to its own host (the secret may have changed since submission).
                            let url = spec.git.as_deref().and_then(|u| url::Url::parse(u).ok());
                            let url_host = url.and_then(|u| u.host_str().map(str::to_ascii_lowercase));
                            if url_host.as_deref() != Some(host.as_str()) {
                                let e = WorkspaceError::Refused(format!("the secret {name:?} is for host {host:?}"));
                                return Err(failed(e));
                            }
                            Some(v)
                        }
                        Ok(None) => {
                            return Err(failed(WorkspaceError::Gone(format!("the secret {name:?} no longer exists"))))
                        }
                        Err(_) => return Err(lost()),
                    }
                }
                None => None,
            };
            let version = match &row.workspace_version {
                Some(v) => v.clone(),
                None => {
                    let v = resolve(&pool, &ws, &row.tenant, &spec, token.clone()).await.map_err(failed)?;
                    match crate::store::workspaces::record_version(&pool, fence, &v).await {
                        Ok(Some(v)) => v,
                        _ => return Err(lost()),
                    }
                }
            };
            // A git tree is cached under its URL and secret too: a commit id alone (a private
            // commit named over a public URL) never finds a tree another fetch brought.
            let key = match &spec.git {
                Some(url) => {
                    use sha2::Digest;
                    let from = format!("{url}\0{}", spec.secret.as_deref().unwrap_or(""));
                    format!("{}{version}", &hex::encode(sha2::Sha256::digest(from.as_bytes()))[..16])
                }
                None => version.clone(),
            };
            let entry = ws.entry(&row.tenant, spec.source(), &key);
            let started = std::time::Instant::now();
            let (p, t, v, s) = (pool.clone(), row.tenant.clone(), version.clone(), spec.clone());
            let net = (ws.caps.clone(), ws.allow.clone(), ws.ca.clone());
            let filled = ws.ready(entry, move |aside| fill(p, t, s, v, token, net, aside)).await;
            let source = spec.source();
            let outcome = match &filled {
                Ok((_, None)) => "cached",
                Ok((_, Some(_))) => "fetched",
                Err(_) => "failed",
            };
            metrics::counter!("subagentd_workspace_fetches_total", "source" => source, "outcome" => outcome)
                .increment(1);
            let (held, stats) = filled.map_err(failed)?;
            let total = held.bytes();
            let ev = crate::kinds::event::WorkspaceReady {
                source: source.into(),
                version,
                cached: stats.is_none(),
                fetched_bytes: stats.as_ref().map_or(0, |s| s.fetched_bytes),
                millis: started.elapsed().as_millis() as u64,
                files: stats.as_ref().map_or(0, |s| s.files),
                bytes: stats.as_ref().map_or(total, |s| s.bytes),
                dropped: stats.map(|s| s.dropped).unwrap_or_default(),
            };
            match crate::store::events::append(&pool, fence, &[crate::kinds::Event::WorkspaceReady(ev)]).await {
                Ok(true) => {}
                _ => return Err(lost()),
            }
            Ok(crate::tools::files::Root { path: held.root.clone(), hold: Box::new(held), copy: None })
        }
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
            on_source_error: None,
            web: None,
            workspace: None,
            environment: None,
        };
        if opts.tools.iter().any(|d| matches!(d.target, Target::Builtin { .. })) {
            // The tenant's fetch rate and domains are read at the run's first fetch.
            t.web = Some(crate::tools::web::WebTenant::new(
                row.tenant.clone(),
                self.cfg.default_web_fetches_per_minute,
                self.pool.clone(),
            ));
        }
        if opts.tools.iter().any(|d| matches!(d.target, Target::Http { .. })) {
            // Cached a minute: a rotated secret signs calls within that time.
            let secret = match self.secrets.get(&row.tenant) {
                Some(s) => s,
                None => {
                    let s = retrying(&self.pool, || tool_store::signing_secret(&self.pool, &row.tenant))
                        .await
                        .map_err(|_| Outcome::Stopped(StopCause::LeaseLost))?;
                    self.secrets.put(&row.tenant, s.clone());
                    s
                }
            };
            t.tenant_secret = Some(secret);
        }
        if opts.tools.iter().any(|d| matches!(d.target, Target::Mcp { .. })) {
            let sources = retrying(&self.pool, || tool_store::sources(&self.pool, &row.tenant))
                .await
                .map_err(|_| Outcome::Stopped(StopCause::LeaseLost))?;
            for s in sources {
                t.mcp_headers.insert(s.name, s.headers.0.into_iter().collect());
            }
            // A source a call could not reach says so on its `last_error`.
            let (pool, tenant) = (self.pool.clone(), row.tenant.clone());
            t.on_source_error = Some(std::sync::Arc::new(move |source: &str, error: &str| {
                let (pool, tenant, source, error) =
                    (pool.clone(), tenant.clone(), source.to_string(), error.to_string());
                tokio::spawn(async move {
                    if let Err(e) = tool_store::source_unreachable(&pool, &tenant, &source, &error).await {
                        tracing::warn!(error = %e, source = %source, "MCP source error not recorded");
                    }
                });
            }));
        }
        Ok(t)
    }
}

/// The version a task's workspace names now: the commit its ref points at, or the upload's
/// content hash.
async fn resolve(
    pool: &PgPool,
    ws: &crate::workspace::Workspaces,
    tenant: &str,
    spec: &crate::kinds::WorkspaceSpec,
    token: Option<String>,
) -> Result<String, WorkspaceError> {
    match (&spec.git, &spec.name) {
        (Some(url), _) => {
            let (url, r, caps, allow, ca) =
                (url.clone(), spec.git_ref.clone(), ws.caps.clone(), ws.allow.clone(), ws.ca.clone());
            let limit = caps.timeout;
            let listing = tokio::task::spawn_blocking(move || {
                let scratch = tempfile::tempdir().map_err(|e| WorkspaceError::Internal(e.to_string()))?;
                let remote = git::Remote { url: &url, token: token.as_deref(), allow, ca };
                git::resolve(&remote, r.as_deref(), &caps, scratch.path())
            });
            // Listing refs has no interrupt of its own: a server that trickles is left behind.
            match tokio::time::timeout(limit, listing).await {
                Ok(r) => r.map_err(|e| WorkspaceError::Internal(e.to_string()))?,
                Err(_) => {
                    Err(WorkspaceError::TooLarge(format!("listing the refs took longer than {} s", limit.as_secs())))
                }
            }
        }
        (None, Some(name)) => match crate::store::workspaces::content_hash(pool, tenant, name).await {
            Ok(Some(h)) => Ok(h),
            Ok(None) => Err(WorkspaceError::Gone(format!("the workspace {name:?} no longer exists"))),
            Err(e) => Err(WorkspaceError::Internal(e.to_string())),
        },
        (None, None) => Err(WorkspaceError::Internal("a workspace with neither git nor name".into())),
    }
}

/// Fill `aside/tree` with the workspace at `version`: fetched from the repository, or
/// unpacked from the upload's archive (which must still have that content hash).
async fn fill(
    pool: PgPool,
    tenant: String,
    spec: crate::kinds::WorkspaceSpec,
    version: String,
    token: Option<String>,
    (caps, allow, ca): (crate::workspace::Caps, Arc<crate::tools::ssrf::AllowList>, Option<Arc<Vec<u8>>>),
    aside: std::path::PathBuf,
) -> Result<crate::workspace::Stats, WorkspaceError> {
    let internal = |e: String| WorkspaceError::Internal(e);
    if let Some(url) = spec.git {
        // The fetch interrupts itself at the time cap; this bounds what comes before the pack.
        let limit = caps.timeout * 2;
        let fetching = tokio::task::spawn_blocking(move || {
            let remote = git::Remote { url: &url, token: token.as_deref(), allow, ca };
            git::fetch(&remote, &version, &caps, &aside.join("scratch"), &aside.join("tree"))
        });
        return match tokio::time::timeout(limit, fetching).await {
            Ok(r) => r.map_err(|e| internal(e.to_string()))?,
            Err(_) => Err(WorkspaceError::TooLarge(format!("the fetch took longer than {} s", limit.as_secs()))),
        };
    }
    let name = spec.name.unwrap_or_default();
    let started = std::time::Instant::now();
    let archive = match crate::store::workspaces::archive(&pool, &tenant, &name, &version).await {
        Ok(Some(a)) => a,
        Ok(None) => {
            return Err(WorkspaceError::Gone(format!(
                "the workspace {name:?} was deleted or replaced since this task first read it ({version})"
            )))
        }
        Err(e) => return Err(internal(e.to_string())),
    };
    let read = archive.len() as u64;
    tokio::task::spawn_blocking(move || {
        let tree = aside.join("tree");
        std::fs::create_dir_all(&tree).map_err(|e| internal(e.to_string()))?;
        crate::workspace::archive::unpack(&archive, &tree).map_err(|e| internal(format!("cannot unpack: {e}")))?;
        let files = walkdir::WalkDir::new(&tree).into_iter().flatten().filter(|e| e.file_type().is_file()).count();
        Ok(crate::workspace::Stats {
            fetched_bytes: read,
            files: files as u64,
            bytes: git::dir_size(&tree),
            millis: started.elapsed().as_millis() as u64,
            dropped: vec![],
        })
    })
    .await
    .map_err(|e| internal(e.to_string()))?
}

/// The image a run's commands run in: its digest resolved and recorded at the first start (every
/// later attempt, on any replica, reads the recorded one), its root from this worker's cache,
/// pulled if it lacks it, and for a named environment its setup run over it once; an
/// `environment_ready` event says what it took.
/// What making a run's environment ready takes.
struct Tools {
    images: Arc<crate::tools::image::Images>,
    sandbox: Arc<crate::tools::sandbox::Sandbox>,
    /// The task's workspace could be private: no network in its runs.
    private: bool,
}

/// `ready` (a workspace's fill, an environment's pull) awaited: its value, or the outcome the run
/// ends with: its failure, or the run's stop (the work goes on in its task, what it makes cached
/// for the next run).
async fn until_ready<T>(
    ready: tokio::task::JoinHandle<Result<T, Outcome>>,
    stop: &StopSignal,
    what: &str,
) -> Result<T, Outcome> {
    tokio::select! {
        r = ready => r.unwrap_or_else(|e| Err(Outcome::Failed {
            code: FailureCode::Internal,
            message: format!("{what} could not be made ready: {e}"),
        })),
        cause = stop.stopped() => Err(Outcome::Stopped(cause)),
    }
}

async fn environment(
    pool: sqlx::PgPool,
    t: Tools,
    row: TaskRow,
    fence: Fence,
    spec: crate::kinds::EnvironmentSpec,
) -> Result<crate::tools::image::RunEnvironment, Outcome> {
    use crate::tools::image::named;
    let Tools { images, sandbox, private } = t;
    let failed = |code: FailureCode, message: String| Outcome::Failed { code, message };
    let lost = || Outcome::Stopped(StopCause::LeaseLost);
    let started = std::time::Instant::now();
    // A named environment: its definition as it is now at the first start (a changed one is built
    // anew), as it was then at a later one.
    let named = match &spec.name {
        None => None,
        Some(name) => match crate::store::environments::get(&pool, &row.tenant, name).await {
            Ok(Some(env)) if env.status == "failed" && row.environment_digest.is_none() => {
                let how = env.exit_code.map_or_else(String::new, |c| format!(" (exit code {c})"));
                let message = format!(
                    "the environment {name:?} failed its setup{how}: {}; PUT /environments/{name} again to retry",
                    env.output_tail.unwrap_or_default()
                );
                return Err(failed(FailureCode::EnvironmentFailed, message));
            }
            Ok(Some(env)) => Some(env),
            Ok(None) => {
                let message = format!("the environment {name:?} no longer exists");
                return Err(failed(FailureCode::EnvironmentFailed, message));
            }
            Err(_) => return Err(lost()),
        },
    };
    // A later attempt: the definition its first start recorded (a change since is for later tasks).
    let named = match (named, &row.environment_digest) {
        (Some(env), Some(_)) => match crate::store::workspaces::environment_definition(&pool, row.id).await {
            Ok(Some(d)) => match serde_json::from_value::<crate::store::environments::Pinned>(d) {
                Ok(p) => Some(env.with_definition(p)),
                Err(e) => return Err(failed(FailureCode::Internal, format!("the recorded environment: {e}"))),
            },
            // Recorded by a version before definitions were.
            Ok(None) => Some(env),
            Err(_) => return Err(lost()),
        },
        (named, _) => named,
    };
    let Some(image) = named.as_ref().map(|e| e.image.clone()).or_else(|| spec.image.clone()) else {
        return Err(failed(FailureCode::Internal, "an environment with neither image nor name".into()));
    };
    let access =
        crate::tools::image::access(&pool, &row.tenant, &image).await.map_err(|e| failed(e.code(), e.to_string()))?;
    let digest = match &row.environment_digest {
        Some(d) => d.clone(),
        None => {
            let d = images.resolve(&image, &access).await.map_err(|e| failed(e.code(), e.to_string()))?;
            let pinned = named.as_ref().and_then(|e| serde_json::to_value(e.pinned()).ok());
            match crate::store::workspaces::record_environment(&pool, fence, &d, pinned.as_ref()).await {
                Ok(Some((d, _))) => d,
                _ => return Err(lost()),
            }
        }
    };
    let (root, pulled, setup) = match &named {
        None => {
            let (root, stats) =
                images.root(&image, &digest, &access).await.map_err(|e| failed(e.code(), e.to_string()))?;
            (root, stats, None)
        }
        Some(env) => {
            let (root, run, stats) = named::build(&pool, &images, &sandbox, &row.tenant, env, &digest, &access)
                .await
                .map_err(|e| failed(e.code(), format!("the environment {:?}: {e}", env.name)))?;
            (root, stats, run)
        }
    };
    let ev = crate::kinds::event::EnvironmentReady {
        image,
        name: spec.name.clone(),
        digest,
        cached: pulled.is_none() && setup.is_none(),
        fetched_bytes: pulled.as_ref().map_or(0, |s| s.fetched_bytes),
        layers: pulled.as_ref().map_or(0, |s| s.layers as u64),
        bytes: root.bytes,
        millis: started.elapsed().as_millis() as u64,
        setup_ms: setup.as_ref().map(|r| r.millis),
        dropped: pulled
            .map(|s| s.unpacked.dropped.into_iter().map(|d| format!("{}: {}", d.path, d.reason)).collect())
            .unwrap_or_default(),
    };
    let net =
        named.as_ref().filter(|e| e.network_in_runs && !private).and_then(|e| named::network(e, &row.tenant, &images));
    match crate::store::events::append(&pool, fence, &[crate::kinds::Event::EnvironmentReady(ev)]).await {
        Ok(true) => Ok(crate::tools::image::RunEnvironment { root, net }),
        _ => Err(lost()),
    }
}
