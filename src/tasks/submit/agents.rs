//! What `subagent_type` names: a built-in type, the tenant's own definition (stored over the
//! API), or the agents directory's — in that order.

use sqlx::PgPool;

use crate::engine::agents::{AgentType, BUILTIN_NAMES};
use crate::engine::definitions::{AgentDefinition, FileAgents};
use crate::store::{agents as store, StoreError};

pub enum Resolved {
    Builtin(AgentType),
    Custom(Box<AgentDefinition>),
}

fn decode(v: serde_json::Value) -> Result<AgentDefinition, StoreError> {
    serde_json::from_value(v).map_err(|e| StoreError::Corrupt(format!("agent definition: {e}")))
}

/// The tenant's own definitions, by name.
pub async fn tenant_definitions(pool: &PgPool, tenant: &str) -> Result<Vec<AgentDefinition>, StoreError> {
    store::list(pool, tenant).await?.into_iter().map(decode).collect()
}

/// The agent `name` names for `tenant`, if any.
pub async fn resolve(
    pool: &PgPool,
    files: &FileAgents,
    tenant: &str,
    name: &str,
) -> Result<Option<Resolved>, StoreError> {
    if let Some(t) = AgentType::parse(name) {
        return Ok(Some(Resolved::Builtin(t)));
    }
    if let Some(d) = store::get(pool, tenant, name).await? {
        return Ok(Some(Resolved::Custom(Box::new(decode(d)?))));
    }
    Ok(files.get(name).cloned().map(|d| Resolved::Custom(Box::new(d))))
}

/// Every name `subagent_type` accepts for this tenant: the built-ins, then the custom ones.
pub async fn names(pool: &PgPool, files: &FileAgents, tenant: &str) -> Result<Vec<String>, StoreError> {
    let mut names: Vec<String> = BUILTIN_NAMES.iter().map(|s| s.to_string()).collect();
    let mut custom: Vec<String> = files.valid.iter().map(|d| d.name.to_string()).collect();
    custom.extend(tenant_definitions(pool, tenant).await?.into_iter().map(|d| d.name.to_string()));
    custom.sort();
    custom.dedup();
    names.extend(custom);
    Ok(names)
}

/// An agent type as a door lists it: its name and one-line description.
#[derive(Debug, Clone, PartialEq)]
pub struct Described {
    pub name: String,
    pub line: String,
    pub builtin: bool,
}

/// The agent types a tenant may name (`None`: the ones every tenant may — the built-ins and the
/// agents directory's), each with its one-line description; aliases are not listed twice.
pub async fn described(pool: &PgPool, files: &FileAgents, tenant: Option<&str>) -> Result<Vec<Described>, StoreError> {
    let custom = match tenant {
        Some(t) => tenant_definitions(pool, t).await?,
        None => vec![],
    };
    let mut names: Vec<String> = BUILTIN_NAMES.iter().map(|s| s.to_string()).collect();
    let mut more: Vec<String> = files.valid.iter().map(|d| d.name.to_string()).collect();
    more.extend(custom.iter().map(|d| d.name.to_string()));
    more.sort();
    more.dedup();
    names.extend(more);
    let mut out = vec![];
    for n in names {
        // Aliases (`general-purpose`) are accepted, and not listed twice.
        if n == "general-purpose" {
            continue;
        }
        let (line, builtin) = match AgentType::parse(&n) {
            Some(t) => (builtin_line(t).to_string(), true),
            None => (
                custom
                    .iter()
                    .find(|d| d.name.as_str() == n)
                    .or_else(|| files.get(&n))
                    .map(|d| d.description.lines().next().unwrap_or("").trim().to_string())
                    .filter(|d| !d.is_empty())
                    .unwrap_or_else(|| "a custom agent".into()),
                false,
            ),
        };
        out.push(Described { name: n, line, builtin });
    }
    Ok(out)
}

/// A built-in type's one-line description.
pub fn builtin_line(t: AgentType) -> &'static str {
    match t {
        AgentType::General => {
            "heterogeneous work, writes included, with every tool the caller allows and the web (web_fetch, web_search)"
        }
        AgentType::Research => {
            "read-only fact-finding, on the web (web_fetch, web_search) and the caller's read-only tools"
        }
        AgentType::Explore => "read-only exploration of a codebase or a corpus",
        AgentType::Plan => "a thinking pass that plans, with few tools",
    }
}

/// What a definition names that cannot be served here now. A definition is valid without
/// these (it is stored and listed, from a file or over the API alike); a task of it is refused
/// while its model cannot be served, and is offered only the tools that exist.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Unservable {
    pub warnings: Vec<String>,
    /// Names of its `tools` list (as written) that name no tool of the tenant.
    pub unmatched_tools: Vec<String>,
    /// Each name of its `tools` list, what it maps to here and whether it is offered (empty
    /// where the tenant's tools are not known).
    pub tool_mapping: Vec<ToolMapping>,
}

/// What one name of a definition's `tools` list is here.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ToolMapping {
    /// The name as written (`WebSearch`, `Bash`, `mcp__github__search`).
    pub name: String,
    /// The tool it means here (`web_search`, `run_command`, `github__search`).
    pub tool: String,
    /// Offered to the agent's tasks (some only in some tasks: see `note`).
    pub offered: bool,
    /// Why it is not offered, and its fix; or, where offered, in which tasks only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Where a definition's tool names are read: the tenant's tools (its own and the built-ins it
/// has), the service's built-ins and the tenant's limits.
pub struct Here<'a> {
    pub tools: &'a [crate::tools::ToolDef],
    pub builtins: &'a crate::tools::builtin::Registry,
    pub limits: &'a crate::store::tenants::Limits,
}

/// What `name` (as written in `d`'s tools) maps to here, whether it is offered, and why not.
fn mapping(
    d: &AgentDefinition,
    name: &str,
    here: &Here<'_>,
    aliases: &std::collections::BTreeMap<String, String>,
) -> ToolMapping {
    use crate::engine::claude_code;
    use crate::kinds::BuiltinTool;
    use crate::tools::builtin::reach;
    let tool = claude_code::tool_name(name, aliases);
    let builtin = BuiltinTool::parse(&tool);
    let found = here.tools.iter().find(|t| t.name == tool);
    if d.disallowed_tools.iter().any(|n| claude_code::tool_name(n, aliases) == tool) {
        let note = format!("{tool} is also in the definition's disallowedTools, which wins");
        return ToolMapping { name: name.into(), tool, offered: false, note: Some(note) };
    }
    let (offered, note) = match (found, builtin) {
        (None, Some(b)) => {
            (false, Some(here.builtins.why_off(b, here.limits).unwrap_or_else(|| format!("{b} is off"))))
        }
        (None, None) if tool == name && claude_code::BUILTIN_TOOLS.contains(&name) => (
            false,
            Some(format!(
                "{name} is Claude Code's own tool, with no counterpart here: map it to a tool under [tool_aliases] in \
                 the config file, or register a tool named {name}"
            )),
        ),
        (None, None) => (
            false,
            Some(format!(
                "this tenant has no tool named {tool}: register one (PUT /tools/{tool}), or map {name} to another \
                 under [tool_aliases] in the config file"
            )),
        ),
        (Some(t), _) if d.read_only && t.policy != crate::tools::Policy::Auto => (
            false,
            Some(format!(
                "the agent is read-only (permissionMode: plan), and {tool} asks for a decision ({:?})",
                t.policy
            )),
        ),
        (Some(_), Some(b)) => {
            let mut only = vec![];
            if reach(b).writes_workspace() {
                only.push("in a task with a workspace (on the task's own copy of it)".to_string());
            } else if reach(b).needs_workspace() {
                only.push("in a task with a workspace".to_string());
            }
            if b == BuiltinTool::WebSearch && here.builtins.searches_only_on_anthropic() {
                only.push(
                    "on an Anthropic model, and where no decision is asked before a search (the only search \
                     configured is Anthropic's own: SUBAGENTD_WEB_SEARCH_ANTHROPIC, no SUBAGENTD_WEB_SEARCH_URL)"
                        .to_string(),
                );
            }
            if reach(b).reaches_web() {
                only.push(match here.limits.private_workspace_web.as_deref() {
                    Some("always") => String::new(),
                    Some("task") => "beside a private workspace (an upload, or a repository read with a secret) only \
                                     when the task sets workspace.web: true"
                        .into(),
                    _ => "never beside a private workspace (an upload, or a repository read with a secret): the \
                          tenant's private_workspace_web is off; a task without one, or over a public repository, has it"
                        .into(),
                });
            }
            only.retain(|o| !o.is_empty());
            (true, (!only.is_empty()).then(|| format!("offered only {}", only.join("; "))))
        }
        (Some(_), None) => (true, None),
    };
    ToolMapping { name: name.into(), tool, offered, note }
}

/// Check `d`'s model against `providers` and its tool names (through `aliases`) against the
/// tenant's tools; `None` for those: not known (at start, for the agents directory: then only
/// Claude Code's own tool names, unmapped, are reported).
pub fn unservable(
    d: &AgentDefinition,
    providers: &crate::llm::Providers,
    here: Option<&Here<'_>>,
    aliases: &std::collections::BTreeMap<String, String>,
) -> Unservable {
    use crate::engine::claude_code;
    let mut out = Unservable::default();
    if let Some(m) = &d.model {
        if let Err(e) = providers.resolve(m) {
            let configured = providers.names().join(", ");
            let why = match (e, providers.aliases.get(m)) {
                (crate::llm::ResolveError::UnknownProvider { provider, model }, Some(_)) => format!(
                    "model {m:?} is a model alias for {model:?}, whose provider {provider:?} is not configured (configured: {configured})"
                ),
                (crate::llm::ResolveError::UnknownProvider { provider, model }, None) => {
                    format!("model {model:?} needs provider {provider:?}, which is not configured (configured: {configured})")
                }
                (crate::llm::ResolveError::Malformed(_), _) => {
                    format!("model {m:?} is neither provider/model nor a configured alias")
                }
            };
            out.warnings.push(format!(
                "{why}: a task of this agent is refused (unknown_model) unless it names a model, until the model can be served"
            ));
        }
    }
    let Some(names) = &d.tools else { return out };
    let mut why_not = vec![];
    match here {
        Some(h) => {
            out.tool_mapping = names.iter().map(|n| mapping(d, n, h, aliases)).collect();
            for m in out.tool_mapping.iter().filter(|m| !m.offered) {
                if !h.tools.iter().any(|t| t.name == m.tool) {
                    out.unmatched_tools.push(m.name.clone());
                }
                let to = if m.tool != m.name { format!(" (→ {})", m.tool) } else { String::new() };
                why_not.push(format!("{}{to}: {}", m.name, m.note.as_deref().unwrap_or("not offered")));
            }
        }
        None => {
            for n in names {
                if claude_code::tool_name(n, aliases) == *n && claude_code::BUILTIN_TOOLS.contains(&n.as_str()) {
                    out.unmatched_tools.push(n.clone());
                    why_not.push(format!(
                        "{n}: Claude Code's own tool, with no counterpart here unless a tenant registers a tool so \
                         named: map it under [tool_aliases] in the config file"
                    ));
                }
            }
        }
    }
    if !why_not.is_empty() {
        let offered: Vec<&str> = match here {
            Some(_) => out.tool_mapping.iter().filter(|m| m.offered).map(|m| m.name.as_str()).collect(),
            None => names.iter().filter(|n| !out.unmatched_tools.contains(n)).map(String::as_str).collect(),
        };
        out.warnings.push(format!(
            "not offered: {}; {}",
            why_not.join("; "),
            if offered.is_empty() {
                "the agent is offered none of its tools".to_string()
            } else {
                format!("it is offered {}", offered.join(", "))
            }
        ));
    }
    out
}
