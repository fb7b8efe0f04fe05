//! Tools: definitions (registered per tenant, brought inline, or discovered from MCP
//! servers), the whitelist filter chain, and the runner that validates arguments and calls
//! them — signed HTTP callbacks or MCP `tools/call` — behind the SSRF guard.
//!
//! May import: `kinds` (the built-ins' names), `llm` (the neutral tool-call types), `store` (the catalog's rows), `config`,
//! `telemetry`, `cache`. Not the engine: the engine calls tools through `ToolRunner`, defined
//! here.

pub mod builtin;
pub mod capped;
pub mod catalog;
pub mod edit;
pub mod egress;
pub mod files;
pub mod gvisor;
pub mod hostfs;
pub mod html;
pub mod http;
pub mod image;
pub mod leftovers;
pub mod mcp;
pub mod netns;
pub mod page;
pub mod sandbox;
pub mod slots;
pub mod ssrf;
pub mod web;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::llm::{ToolCall, ToolSpec};

/// What a tool call gave the model: its result, or an error the model sees (never a crash).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub content: String,
    pub is_error: bool,
    /// What the call's `tool_call_finished` event adds (a fetch's final URL and bytes).
    pub detail: Option<Value>,
}

impl ToolOutput {
    pub fn text(content: impl Into<String>, is_error: bool) -> ToolOutput {
        ToolOutput { content: content.into(), is_error, detail: None }
    }

    /// The result as the store can always hold it: every NUL in its text and its event's
    /// detail shown as U+FFFD, and a note to the model when it held bytes that are not text
    /// (NUL, or invalid UTF-8 already shown so). Every result passes here on its way into the
    /// conversation (`engine`), whatever tool made it.
    pub fn storable(mut self) -> ToolOutput {
        use crate::kinds::text;
        let nuls = text::storable(&mut self.content);
        if let Some(note) = text::note(&self.content, nuls) {
            self.content.push('\n');
            self.content.push_str(&note);
        }
        if let Some(d) = self.detail.as_mut() {
            text::storable_value(d);
        }
        self
    }
}

/// Runs one tool call of a sub-agent (arguments already checked against the whitelist).
#[async_trait::async_trait]
pub trait ToolRunner: Send + Sync {
    async fn run(&self, call: &ToolCall) -> ToolOutput;
}

/// Why a tool could not be defined, reached or set up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    /// A tool definition's field is not acceptable.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// An MCP server could not be reached or did not answer as the protocol says.
    #[error("{0}")]
    Mcp(String),
    /// The configuration (allow-list, client) is not usable.
    #[error("{0}")]
    Config(String),
}

impl ToolError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ToolError::Invalid { field: field.into(), message: message.into() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Read-only: safe to run unattended; offered to every agent type.
    Auto,
    /// Writes or side effects: offered to `general` agents only.
    Propose,
}

/// Where a tool runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Target {
    Http {
        endpoint: String,
        timeout_ms: u64,
    },
    Mcp {
        source: String,
        url: String,
        tool: String,
        timeout_ms: u64,
    },
    /// No endpoint: the caller runs it and submits its output (the run pauses for it).
    Caller,
    /// Run by the service itself (`builtin`).
    Builtin {
        tool: builtin::BuiltinTool,
    },
    /// A built-in run by the model's provider on its side (Anthropic's web search): its calls
    /// and results stay inside the provider's answer, and are billed on its ledger row.
    Provider {
        tool: builtin::BuiltinTool,
    },
}

/// A tool as a run knows it: what the model is offered, and where calls go. A built-in is
/// stored (in a task's options) by its name, policy and target alone: its description and
/// schema are the registry's, filled back when read, so that every task row does not carry them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "ToolDefWire", into = "ToolDefWire")]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    /// Shared: the run's tool specs and each turn's request point at it, not at a copy.
    pub parameters: Arc<Value>,
    pub policy: Policy,
    pub target: Target,
}

fn is_null(v: &Arc<Value>) -> bool {
    v.is_null()
}

/// `ToolDef` as stored.
#[derive(Serialize, Deserialize)]
struct ToolDefWire {
    name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    description: String,
    #[serde(default, skip_serializing_if = "is_null")]
    parameters: Arc<Value>,
    policy: Policy,
    target: Target,
}

impl From<ToolDef> for ToolDefWire {
    fn from(d: ToolDef) -> Self {
        let builtin = matches!(d.target, Target::Builtin { .. } | Target::Provider { .. });
        ToolDefWire {
            name: d.name,
            description: if builtin { String::new() } else { d.description },
            parameters: if builtin { Arc::new(Value::Null) } else { d.parameters },
            policy: d.policy,
            target: d.target,
        }
    }
}

impl From<ToolDefWire> for ToolDef {
    fn from(w: ToolDefWire) -> Self {
        match w.target {
            Target::Builtin { tool } | Target::Provider { tool } if w.parameters.is_null() => {
                ToolDef { name: w.name, target: w.target, ..builtin::def(tool, w.policy) }
            }
            _ => ToolDef {
                name: w.name,
                description: w.description,
                parameters: w.parameters,
                policy: w.policy,
                target: w.target,
            },
        }
    }
}

impl ToolDef {
    pub fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            parameters: self.parameters.clone(),
            server: match self.target {
                Target::Provider { tool } => Some(tool),
                _ => None,
            },
        }
    }
}

/// Tool names the providers accept (OpenAI: `^[a-zA-Z0-9_-]{1,64}$`).
pub fn check_tool_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err("must be 1-64 characters of a-z, A-Z, 0-9, '_' and '-'".into());
    }
    Ok(())
}

/// Is `schema` a JSON Schema for an object of arguments?
pub fn check_parameters(schema: &Value) -> Result<(), String> {
    if !schema.is_object() {
        return Err("must be a JSON Schema object".into());
    }
    if let Some(t) = schema.get("type") {
        if t != "object" {
            return Err("must describe an object (`\"type\": \"object\"`)".into());
        }
    }
    jsonschema::validator_for(schema).map(|_| ()).map_err(|e| format!("is not a valid JSON Schema: {e}"))
}

/// The filters a run's tools pass, in order: the agent type's policy (read-only types see
/// `auto` tools only), the definition's `tools` and `disallowed_tools`, the request's
/// `allowed_tools`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Whitelist<'a> {
    pub read_only: bool,
    /// The definition's allow-list; `None`: every tool.
    pub allow: Option<&'a [String]>,
    pub deny: &'a [String],
    /// The request's `allowed_tools`.
    pub requested: Option<&'a [String]>,
}

/// The whitelist: the tools of `available` that pass every filter of `w`.
pub fn offered(available: Vec<ToolDef>, w: Whitelist<'_>) -> Vec<ToolDef> {
    available
        .into_iter()
        .filter(|t| {
            !w.read_only
                || t.policy == Policy::Auto
                || matches!(t.target, Target::Builtin { tool } | Target::Provider { tool } if builtin::reads_only(tool))
        })
        .filter(|t| w.allow.is_none_or(|allow| allow.contains(&t.name)))
        .filter(|t| !w.deny.contains(&t.name))
        .filter(|t| w.requested.is_none_or(|a| a.contains(&t.name)))
        .collect()
}

/// Cap a tool result, with a visible marker when cut.
pub fn cap(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    let dropped = s.len() - cut;
    s.truncate(cut);
    s.push_str(&format!("\n…[truncated: {dropped} more bytes]"));
    s
}

/// How tool calls go out.
#[derive(Clone)]
pub struct Caller {
    pub client: reqwest::Client,
    pub allow: Arc<ssrf::AllowList>,
    pub max_result_bytes: usize,
    /// This process's MCP sessions (one per server, reused by every call).
    pub mcp: Arc<mcp::Sessions>,
    /// The web tools' clients and settings.
    pub web: web::Web,
    /// The built-in tools this service offers.
    pub builtins: builtin::Registry,
    /// The sandbox `run_command` runs in, where it starts on this host.
    pub sandbox: Option<Arc<sandbox::Sandbox>>,
    /// The images commands may run in (with the sandbox).
    pub images: Option<Arc<image::Images>>,
    /// What a tenant's kept changes and diffs may hold, in bytes (`SUBAGENTD_TENANT_STORAGE_MB`).
    pub storage_quota: u64,
}

impl Caller {
    pub fn from_config(cfg: &crate::config::Config) -> Result<Caller, ToolError> {
        let allow = Arc::new(
            ssrf::AllowList::parse(&cfg.tool_allow)
                .map_err(|e| ToolError::Config(format!("SUBAGENTD_TOOL_ALLOW: {e}")))?,
        );
        Ok(Caller {
            client: ssrf::guarded_client(allow.clone()).map_err(ToolError::Config)?,
            allow,
            max_result_bytes: cfg.tool_result_max_bytes.max(256),
            mcp: Arc::default(),
            builtins: builtin::Registry::new(
                &cfg.builtin_tools_off,
                cfg.web_search_url.as_deref().is_some_and(|u| !u.trim().is_empty()),
                cfg.web_search_anthropic,
            )
            .map_err(ToolError::Config)?,
            web: web::Web::from_config(cfg)?,
            sandbox: None,
            images: None,
            storage_quota: cfg.tenant_storage_mb.saturating_mul(1 << 20),
        })
    }

    /// This caller with the sandbox (`run_command` is then offered).
    pub fn with_sandbox(mut self, sandbox: Option<Arc<sandbox::Sandbox>>) -> Caller {
        self.builtins = self.builtins.with_sandbox(sandbox.is_some());
        self.sandbox = sandbox;
        self
    }

    pub fn with_images(mut self, images: Option<Arc<image::Images>>) -> Caller {
        self.images = images;
        self
    }
}

/// Everything one task's tool calls need.
pub struct TaskTools {
    pub caller: Caller,
    pub defs: Vec<ToolDef>,
    pub task_id: uuid::Uuid,
    pub tenant_secret: Option<String>,
    pub traceparent: Option<String>,
    /// Headers of the task's MCP sources (by source name), for `tools/call`.
    pub mcp_headers: std::collections::HashMap<String, Vec<(String, String)>>,
    /// Told when an MCP source could not be reached.
    pub on_source_error: Option<SourceErrors>,
    /// The tenant as the web tools need it (its fetch rate, its domains).
    pub web: Option<web::WebTenant>,
    /// The task's workspace tree, held in the cache while the run lasts.
    pub workspace: Option<files::Root>,
    /// The image its commands run in (held in the image cache while the run lasts); `None`:
    /// the host's `/usr`.
    pub environment: Option<image::RunEnvironment>,
}

impl TaskTools {
    /// A built-in's call, framed as its reach says: a web tool's stopped at the web tools'
    /// timeout; a workspace tool's only with a workspace, over a task's own copy one call at a
    /// time, and each that may change it refused while the tenant's storage is full and marks it
    /// changed.
    async fn builtin_call(&self, b: &dyn builtin::Builtin, call: &ToolCall) -> ToolOutput {
        let reach = b.reach();
        if !reach.needs_workspace() {
            let cx = builtin::Cx { task: self, workspace: None };
            return web::timed(&self.caller.web, b.name(), call, b.run(&cx, call)).await;
        }
        let Some(w) = &self.workspace else {
            return builtin::no_workspace(call);
        };
        let _one = match &w.copy {
            Some(c) => Some(c.lock.lock().await),
            None if reach.writes_workspace() => return builtin::no_copy(call),
            None => None,
        };
        if reach.writes_workspace() {
            if let Some(full) = self.storage_full().await {
                return tool_error(full);
            }
        }
        let out = b.run(&builtin::Cx { task: self, workspace: Some(w) }, call).await;
        if let (Some(c), true) = (&w.copy, reach.writes_workspace()) {
            c.dirty.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let outcome = if out.is_error { "error" } else { "ok" };
        metrics::counter!("subagentd_builtin_tool_calls_total", "tool" => b.name().as_str(), "outcome" => outcome)
            .increment(1);
        out
    }

    /// The sentence that refuses a change to the copy when the tenant's kept changes and diffs
    /// are at its storage quota; `None` when there is room (or its use cannot be read now).
    async fn storage_full(&self) -> Option<String> {
        let web = self.web.as_ref()?;
        let used = crate::store::diffs::kept_bytes(&web.pool, &web.tenant).await.ok()?;
        (used as u64 >= self.caller.storage_quota).then(|| {
            format!(
                "not run: the tenant's storage for kept changes and diffs is full ({} of {} MiB); \
                 no file can be changed until older tasks' diffs expire. Read what you need and give \
                 your final answer.",
                used >> 20,
                self.caller.storage_quota >> 20
            )
        })
    }
}

/// Told (source name, the error's full chain) when a call could not reach an MCP source.
pub type SourceErrors = Arc<dyn Fn(&str, &str) + Send + Sync>;

fn tool_error(msg: impl Into<String>) -> ToolOutput {
    ToolOutput::text(msg, true)
}

#[async_trait::async_trait]
impl ToolRunner for TaskTools {
    async fn run(&self, call: &ToolCall) -> ToolOutput {
        let Some(def) = self.defs.iter().find(|d| d.name == call.name) else {
            return tool_error(format!("tool {} is not available", call.name));
        };
        if !call.arguments.is_object() {
            return tool_error(format!("arguments of {} must be a JSON object; got {}", call.name, call.arguments));
        }
        if let Ok(v) = jsonschema::validator_for(&def.parameters) {
            let errors: Vec<String> = v
                .iter_errors(&call.arguments)
                .take(5)
                .map(|e| {
                    let path = e.instance_path.to_string();
                    format!("{}: {e}", if path.is_empty() { "/".to_string() } else { path })
                })
                .collect();
            if !errors.is_empty() {
                return tool_error(format!(
                    "invalid arguments for {} (not called): {}. Fix them and call again.",
                    call.name,
                    errors.join("; ")
                ));
            }
        }
        let out = match &def.target {
            Target::Http { endpoint, timeout_ms } => {
                http::call(self, endpoint, Duration::from_millis(*timeout_ms), call).await
            }
            Target::Mcp { source, url, tool, timeout_ms } => {
                let headers = self.mcp_headers.get(source).cloned().unwrap_or_default();
                let c = mcp::McpCall {
                    url,
                    headers: &headers,
                    tool,
                    call,
                    timeout: Duration::from_millis(*timeout_ms),
                    traceparent: self.traceparent.as_deref(),
                    idempotency_key: format!("{}:{}", self.task_id, call.id),
                };
                let (out, unreachable) = mcp::call(&self.caller, c).await;
                if let Some(e) = unreachable {
                    tracing::warn!(source = %source, tool = %call.name, error = %e, "MCP tool server could not be reached");
                    if let Some(tell) = &self.on_source_error {
                        tell(source, &e);
                    }
                }
                out
            }
            // Its calls pause the run for the caller's output; they never reach here.
            Target::Caller => tool_error(format!("tool {} is run by the caller, not by subagentd", call.name)),
            Target::Provider { .. } => tool_error(format!("tool {} is run by the model's provider", call.name)),
            Target::Builtin { tool } => self.builtin_call(builtin::tool(*tool), call).await,
        };
        ToolOutput { content: cap(out.content, self.caller.max_result_bytes), ..out }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, policy: Policy) -> ToolDef {
        ToolDef {
            name: name.into(),
            description: String::new(),
            parameters: Arc::new(serde_json::json!({"type": "object"})),
            policy,
            target: Target::Http { endpoint: "http://x".into(), timeout_ms: 1 },
        }
    }

    fn names(v: Vec<ToolDef>) -> Vec<String> {
        v.into_iter().map(|t| t.name).collect()
    }

    #[test]
    fn read_only_types_see_only_auto_tools_and_lists_narrow_further() {
        let all = vec![
            t("list", Policy::Auto),
            t("get", Policy::Auto),
            t("create", Policy::Propose),
            t("delete", Policy::Propose),
        ];
        assert_eq!(names(offered(all.clone(), Whitelist { read_only: true, ..Whitelist::default() })), ["list", "get"]);
        assert_eq!(names(offered(all.clone(), Whitelist::default())), ["list", "get", "create", "delete"]);
        let allow = ["get".to_string(), "create".into(), "delete".into()];
        let deny = ["delete".to_string()];
        let def = Whitelist { allow: Some(&allow), deny: &deny, ..Whitelist::default() };
        assert_eq!(names(offered(all.clone(), def)), ["get", "create"]);
        let requested = ["create".to_string()];
        assert_eq!(names(offered(all, Whitelist { requested: Some(&requested), ..def })), ["create"]);
    }

    #[test]
    fn a_builtin_is_stored_by_name_and_read_back_whole() {
        let d = builtin::def(builtin::BuiltinTool::WebFetch, Policy::Propose);
        let stored = serde_json::to_value(&d).unwrap();
        assert_eq!(
            stored,
            serde_json::json!({"name": "web_fetch", "policy": "propose", "target": {"kind": "builtin", "tool": "web_fetch"}})
        );
        assert_eq!(serde_json::from_value::<ToolDef>(stored).unwrap(), d);
        let http = t("lookup", Policy::Auto);
        assert_eq!(serde_json::from_value::<ToolDef>(serde_json::to_value(&http).unwrap()).unwrap(), http);
    }

    #[test]
    fn results_are_capped_with_a_marker_on_a_char_boundary() {
        assert_eq!(cap("short".into(), 10), "short");
        let c = cap("ééééé".into(), 3);
        assert_eq!(c, "é\n…[truncated: 8 more bytes]");
    }

    #[test]
    fn parameters_must_be_an_object_schema() {
        assert!(
            check_parameters(&serde_json::json!({"type": "object", "properties": {"q": {"type": "string"}}})).is_ok()
        );
        assert!(check_parameters(&serde_json::json!({"type": "string"})).is_err());
        assert!(check_parameters(&serde_json::json!([1])).is_err());
        assert!(check_parameters(&serde_json::json!({"type": "object", "properties": {"q": {"type": 5}}})).is_err());
        assert!(check_tool_name("search_docs-2").is_ok());
        assert!(check_tool_name("no.dots").is_err());
    }
}
