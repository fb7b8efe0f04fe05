//! The built-in tools: the tools the service runs itself, with no caller endpoint (`web_fetch`,
//! `web_search`; over a task's workspace `list_directory`, `glob`, `grep`, `read_file`; on the
//! task's own copy of it `write_file`, `edit_file` and, in the sandbox, `run_command`).
//!
//! Each is one file of this module: a type implementing `Builtin` (what it does, its schema,
//! what it reaches, its policy, the agent types given it, what it needs of the host, its run),
//! and one line in `tool`'s list. Its name is a `BuiltinTool` variant (`kinds`, so that
//! `telemetry` and `llm` may name it): a variant without its line in `tool` does not compile,
//! nor does a tool without every method of `Builtin`. Each has a reserved name no tenant tool
//! may take, a switch for the service and one per tenant (`Registry`).

mod edit_file;
mod glob;
mod grep;
mod list_directory;
mod read_file;
mod run_command;
mod web_fetch;
mod web_search;
mod write_file;

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

pub use crate::kinds::BuiltinTool;

use super::{files, Policy, Target, TaskTools, ToolDef, ToolOutput};
use crate::kinds::AgentType;
use crate::llm::ToolCall;
use crate::store::tenants::Limits;

/// The built-ins, one line each.
pub fn tool(t: BuiltinTool) -> &'static dyn Builtin {
    match t {
        BuiltinTool::WebFetch => &web_fetch::WebFetch,
        BuiltinTool::WebSearch => &web_search::WebSearch,
        BuiltinTool::ListDirectory => &list_directory::ListDirectory,
        BuiltinTool::Glob => &glob::Glob,
        BuiltinTool::Grep => &grep::Grep,
        BuiltinTool::ReadFile => &read_file::ReadFile,
        BuiltinTool::WriteFile => &write_file::WriteFile,
        BuiltinTool::EditFile => &edit_file::EditFile,
        BuiltinTool::RunCommand => &run_command::RunCommand,
    }
}

/// A tool the service runs itself.
#[async_trait::async_trait]
pub trait Builtin: Send + Sync {
    /// Its name.
    fn name(&self) -> BuiltinTool;
    /// What it does, in a few words (the type prompts say it after its name).
    fn phrase(&self) -> &'static str;
    /// What the model is told of it.
    fn description(&self) -> &'static str;
    /// The JSON Schema of its arguments (an object; calls are checked against it before `run`).
    fn parameters(&self) -> Value;
    /// What it acts on: where it is offered, and how the runner frames its calls.
    fn reach(&self) -> Reach;
    /// Its policy for a tenant with these (own) limits.
    fn policy(&self, limits: &Limits) -> Policy;
    /// The built-in agent types given it (a defined agent names its tools itself).
    fn types(&self) -> &'static [AgentType];
    /// The name of its counterpart among Claude Code's own tools, which an agent file written
    /// for Claude Code lists (`engine::claude_code`).
    fn claude_code_name(&self) -> Option<&'static str>;
    /// Why this host cannot offer it, in words an operator can act on; `None` where it can.
    fn unavailable(&self, host: Backends) -> Option<&'static str>;
    /// One call, its arguments checked against `parameters`, framed as its `reach` says.
    async fn run(&self, cx: &Cx<'_>, call: &ToolCall) -> ToolOutput;
}

/// What a built-in acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The web, behind the address guard: not offered beside a private workspace unless the
    /// tenant allows it (a URL could carry its contents out); a call is stopped at the web
    /// tools' timeout.
    Web,
    /// Reads the task's workspace: offered only to a task with one.
    ReadsWorkspace,
    /// Changes the task's own copy of its workspace: offered only to a task with one, to types
    /// that may have side effects; a call holds the copy's lock, is refused while the tenant's
    /// storage is full, and marks the copy changed.
    WritesWorkspace,
}

impl Reach {
    pub fn reaches_web(self) -> bool {
        self == Reach::Web
    }

    pub fn reads_workspace(self) -> bool {
        self == Reach::ReadsWorkspace
    }

    pub fn writes_workspace(self) -> bool {
        self == Reach::WritesWorkspace
    }

    pub fn needs_workspace(self) -> bool {
        self != Reach::Web
    }
}

/// What `t` acts on.
pub fn reach(t: BuiltinTool) -> Reach {
    tool(t).reach()
}

/// What the host has that some built-ins need.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backends {
    /// A SearXNG-compatible API is configured.
    pub search: bool,
    /// `web_search` on an Anthropic model is the provider's own.
    pub anthropic_search: bool,
    /// The sandbox starts here.
    pub sandbox: bool,
}

/// What one built-in call runs with.
pub struct Cx<'a> {
    /// Everything the task's tool calls have (the service's clients, the tenant, the sandbox).
    pub task: &'a TaskTools,
    /// The task's workspace, for a tool that needs one (the runner answers a call without it).
    pub workspace: Option<&'a files::Root>,
}

/// A workspace tool's work over the tree at its root (canonical), with the call's checked
/// arguments and the result cap: the answer, or the sentence that says why not. Blocking.
pub type TreeWork = fn(&Path, &Value, usize) -> Result<String, String>;

impl Cx<'_> {
    /// The cap on a result, in bytes.
    pub fn max_result(&self) -> usize {
        self.task.caller.max_result_bytes
    }

    /// `work` over the workspace's tree, on a blocking thread (file I/O).
    pub async fn on_tree(&self, call: &ToolCall, work: TreeWork) -> ToolOutput {
        let Some(w) = self.workspace else {
            return no_workspace(call);
        };
        let (root, args, max) = (w.path.clone(), call.arguments.clone(), self.max_result());
        match tokio::task::spawn_blocking(move || work(&root, &args, max)).await {
            // Capped once, by the runner, as every tool's result is.
            Ok(Ok(s)) => ToolOutput::text(s, false),
            Ok(Err(s)) => ToolOutput::text(s, true),
            Err(e) => ToolOutput::text(format!("{} failed: {e}", call.name), true),
        }
    }
}

/// The answer to a workspace tool's call in a task with no workspace.
pub fn no_workspace(call: &ToolCall) -> ToolOutput {
    ToolOutput::text(format!("{} works on the task's workspace, and this task has none", call.name), true)
}

/// The answer to a call that would change the task's copy in a run that has none.
pub fn no_copy(call: &ToolCall) -> ToolOutput {
    ToolOutput::text(format!("{} changes the task's own copy, and this run has none", call.name), true)
}

/// A text argument (checked by the schema; "" where absent).
pub fn text<'a>(args: &'a Value, key: &str) -> &'a str {
    args.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// The policy of the web tools for a tenant: its `web_tools_policy`, `auto` unless it says
/// `propose`.
pub fn web_policy(limits: &Limits) -> Policy {
    match limits.web_tools_policy.as_deref() {
        Some("propose") => Policy::Propose,
        _ => Policy::Auto,
    }
}

/// The built-in whose counterpart Claude Code names `name` (`WebFetch` is `web_fetch`).
pub fn by_claude_code_name(name: &str) -> Option<BuiltinTool> {
    BuiltinTool::ALL.iter().copied().find(|t| tool(*t).claude_code_name() == Some(name))
}

/// Is `name` a built-in tool's (so no tenant tool may be so named)?
pub fn is_reserved(name: &str) -> bool {
    BuiltinTool::parse(name).is_some()
}

/// Does the tool only read (so read-only agent types may have it whatever its policy)?
pub fn reads_only(t: BuiltinTool) -> bool {
    !reach(t).writes_workspace()
}

/// The built-ins this service offers: those not turned off, with what they need configured.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    off: Vec<BuiltinTool>,
    /// A SearXNG-compatible API is configured.
    search: bool,
    /// `web_search` on an Anthropic model is the provider's own.
    anthropic_search: bool,
    /// The sandbox starts here (`run_command` is offered only then).
    sandbox: bool,
}

impl Registry {
    /// `off`: `SUBAGENTD_BUILTIN_TOOLS_OFF`; `search`: a SearXNG-compatible API is configured;
    /// `anthropic_search`: Anthropic models search on the provider's side.
    pub fn new(off: &str, search: bool, anthropic_search: bool) -> Result<Registry, String> {
        let mut r = Registry { off: vec![], search, anthropic_search, sandbox: false };
        for name in off.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let t = BuiltinTool::parse(name).ok_or_else(|| {
                let all: Vec<&str> = BuiltinTool::ALL.iter().map(|b| b.as_str()).collect();
                format!("SUBAGENTD_BUILTIN_TOOLS_OFF: {name:?} is not a built-in tool; they are {}", all.join(", "))
            })?;
            r.off.push(t);
        }
        Ok(r)
    }

    /// This registry, knowing whether the sandbox can start on this host.
    pub fn with_sandbox(self, sandbox: bool) -> Registry {
        Registry { sandbox, ..self }
    }

    /// What this host has for the built-ins that need something.
    fn backends(&self) -> Backends {
        Backends { search: self.search, anthropic_search: self.anthropic_search, sandbox: self.sandbox }
    }

    /// Is `t` on for the service (turned on, and what it needs here)?
    pub fn on(&self, t: BuiltinTool) -> bool {
        !self.off.contains(&t) && tool(t).unavailable(self.backends()).is_none()
    }

    /// The built-ins of `for_tenant` as a run on a model of this provider has them: `web_search`
    /// is the provider's own on an Anthropic model when the operator chose it and no decision
    /// must be asked before a search (a provider-side search cannot wait for one); else the
    /// SearXNG API's, if one is configured; else it is not offered.
    pub fn for_run(&self, limits: &Limits, anthropic_model: bool, searches_gated: bool) -> Vec<ToolDef> {
        self.for_tenant(limits)
            .into_iter()
            .filter_map(|mut d| match d.target {
                Target::Builtin { tool: BuiltinTool::WebSearch } => {
                    if self.anthropic_search && anthropic_model && !searches_gated {
                        d.target = Target::Provider { tool: BuiltinTool::WebSearch };
                        Some(d)
                    } else {
                        self.search.then_some(d)
                    }
                }
                _ => Some(d),
            })
            .collect()
    }

    /// Is Anthropic's own search the only one (so `web_search` is offered only on Anthropic
    /// models, where searches are not gated)?
    pub fn searches_only_on_anthropic(&self) -> bool {
        self.anthropic_search && !self.search
    }

    /// Why `t` is not among a tenant's built-ins (`for_tenant`), in words an operator can act
    /// on; `None` where it is.
    pub fn why_off(&self, t: BuiltinTool, limits: &Limits) -> Option<String> {
        if limits.builtin_tools_off.as_deref().unwrap_or_default().iter().any(|o| o == t.as_str()) {
            return Some(format!("{t} is switched off for this tenant (its builtin_tools_off)"));
        }
        if self.off.contains(&t) {
            return Some(format!("{t} is switched off for the service (SUBAGENTD_BUILTIN_TOOLS_OFF)"));
        }
        tool(t).unavailable(self.backends()).map(str::to_string)
    }

    /// The built-ins a tenant with these (own) limits may be offered, with its policy for them.
    pub fn for_tenant(&self, limits: &Limits) -> Vec<ToolDef> {
        let off = limits.builtin_tools_off.as_deref().unwrap_or_default();
        BuiltinTool::ALL
            .iter()
            .copied()
            .filter(|t| self.on(*t) && !off.iter().any(|o| o == t.as_str()))
            .map(|t| def(t, tool(t).policy(limits)))
            .collect()
    }
}

/// A built-in's description and parameters, built once (every run's options name them).
fn schema(t: BuiltinTool) -> (&'static str, Arc<Value>) {
    static SCHEMAS: std::sync::LazyLock<Vec<Arc<Value>>> =
        std::sync::LazyLock::new(|| BuiltinTool::ALL.iter().map(|t| Arc::new(tool(*t).parameters())).collect());
    let i = BuiltinTool::ALL.iter().position(|x| *x == t).unwrap_or(0);
    (tool(t).description(), SCHEMAS[i].clone())
}

/// A built-in as a run knows it.
pub fn def(t: BuiltinTool, policy: Policy) -> ToolDef {
    let (description, parameters) = schema(t);
    ToolDef {
        name: t.as_str().to_string(),
        description: description.to_string(),
        parameters,
        policy,
        target: Target::Builtin { tool: t },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn switches_and_backends_decide_what_is_offered() {
        let all = Registry::new("", true, false).unwrap();
        let names = |v: Vec<ToolDef>| v.into_iter().map(|d| d.name).collect::<Vec<_>>();
        let files = ["list_directory", "glob", "grep", "read_file"];
        let writes = ["write_file", "edit_file"];
        let with = |web: &[&'static str]| [web, &files[..], &writes[..]].concat();
        assert_eq!(names(all.for_tenant(&Limits::default())), with(&["web_fetch", "web_search"]));
        let no_search = Registry::new("", false, false).unwrap();
        assert_eq!(names(no_search.for_tenant(&Limits::default())), with(&["web_fetch"]));
        let off = Registry::new(" web_fetch ", true, false).unwrap();
        assert_eq!(names(off.for_tenant(&Limits::default())), with(&["web_search"]));
        let tenant_off =
            Limits { builtin_tools_off: Some(vec!["web_search".into(), "grep".into()]), ..Limits::default() };
        assert_eq!(
            names(all.for_tenant(&tenant_off)),
            ["web_fetch", "list_directory", "glob", "read_file", "write_file", "edit_file"]
        );
        // run_command only where the sandbox starts; the writing tools are `propose`.
        let sandboxed = Registry::new("", false, false).unwrap().with_sandbox(true);
        assert_eq!(
            names(sandboxed.for_tenant(&Limits::default())),
            with(&["web_fetch"]).into_iter().chain(["run_command"]).collect::<Vec<_>>()
        );
        assert!(sandboxed
            .for_tenant(&Limits::default())
            .iter()
            .all(|d| (d.policy == Policy::Propose)
                == ["write_file", "edit_file", "run_command"].contains(&d.name.as_str())));
        assert!(Registry::new("web_fetch,nope", true, false).unwrap_err().contains("\"nope\""));
        let propose = Limits { web_tools_policy: Some("propose".into()), ..Limits::default() };
        let policy = |d: &ToolDef| (d.name.clone(), d.policy);
        assert!(
            all.for_tenant(&propose).iter().all(|d| d.policy == Policy::Propose || files.contains(&d.name.as_str())),
            "the web tools' policy is not the workspace tools': {:?}",
            all.for_tenant(&propose).iter().map(policy).collect::<Vec<_>>()
        );
        assert!(all
            .for_tenant(&propose)
            .iter()
            .filter(|d| files.contains(&d.name.as_str()))
            .all(|d| d.policy == Policy::Auto));
        assert!(all
            .for_tenant(&Limits::default())
            .iter()
            .all(|d| d.policy == Policy::Auto || writes.contains(&d.name.as_str())));
    }

    #[test]
    fn web_search_is_the_providers_on_anthropic_models_unless_a_decision_is_needed() {
        let target = |r: &Registry, anthropic: bool, gated: bool| {
            r.for_run(&Limits::default(), anthropic, gated)
                .into_iter()
                .find(|d| d.name == "web_search")
                .map(|d| d.target)
        };
        let both = Registry::new("", true, true).unwrap();
        let provider = Some(Target::Provider { tool: BuiltinTool::WebSearch });
        let ours = Some(Target::Builtin { tool: BuiltinTool::WebSearch });
        assert_eq!(target(&both, true, false), provider);
        assert_eq!(target(&both, false, false), ours);
        assert_eq!(target(&both, true, true), ours, "a gated search is ours");
        let only_anthropic = Registry::new("", false, true).unwrap();
        assert_eq!(target(&only_anthropic, true, false), provider);
        assert_eq!(target(&only_anthropic, false, false), None, "no backend for another provider's model");
        assert_eq!(target(&only_anthropic, true, true), None);
    }

    #[test]
    fn each_builtin_is_the_tool_its_name_says_with_an_object_schema_and_a_type_that_gets_it() {
        for t in BuiltinTool::ALL.iter().copied() {
            let b = tool(t);
            assert_eq!(b.name(), t, "the list's line for {t} names another tool");
            assert!(super::super::check_parameters(&b.parameters()).is_ok(), "{t}'s schema");
            assert!(!b.description().is_empty() && !b.phrase().is_empty(), "{t} says what it does");
            assert!(!b.types().is_empty(), "no agent type is given {t}");
            if let Some(cc) = b.claude_code_name() {
                assert_eq!(by_claude_code_name(cc), Some(t));
            }
        }
        // The general type has every tool; the read-only types none that writes.
        assert!(BuiltinTool::ALL.iter().all(|t| tool(*t).types().contains(&AgentType::General)));
        for t in BuiltinTool::ALL.iter().filter(|t| reach(**t).writes_workspace()) {
            assert_eq!(tool(*t).types(), [AgentType::General], "{t} changes the copy");
        }
    }

    #[test]
    fn names_are_reserved() {
        assert!(is_reserved("web_fetch") && is_reserved("web_search") && !is_reserved("WebFetch"));
        assert_eq!(def(BuiltinTool::WebFetch, Policy::Auto).parameters["required"], json!(["url"]));
    }
}
