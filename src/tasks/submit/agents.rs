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
}

/// Check `d`'s model against `providers` and its tool names (through `aliases`) against the
/// tenant's `available` tools; `None` for the tools: not known (at start, for the agents
/// directory: then only Claude Code's own tool names, unmapped, are reported).
pub fn unservable(
    d: &AgentDefinition,
    providers: &crate::llm::Providers,
    available: Option<&[crate::tools::ToolDef]>,
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
    if let Some(names) = &d.tools {
        for n in names {
            let here = claude_code::tool_name(n, aliases);
            let missing = match available {
                Some(tools) => !tools.iter().any(|t| t.name == here),
                None => here == *n && claude_code::BUILTIN_TOOLS.contains(&n.as_str()),
            };
            if missing {
                out.unmatched_tools.push(n.clone());
            }
        }
        if !out.unmatched_tools.is_empty() {
            let listed = out
                .unmatched_tools
                .iter()
                .map(|n| match claude_code::tool_name(n, aliases) {
                    here if here != *n => format!("{n} (→ {here})"),
                    _ => n.clone(),
                })
                .collect::<Vec<_>>()
                .join(", ");
            let offered: Vec<&str> =
                names.iter().filter(|n| !out.unmatched_tools.contains(n)).map(String::as_str).collect();
            out.warnings.push(format!(
                "tools {listed} name no tool here{}: map them to tools under [tool_aliases] in the config file, or \
                 register tools of those names; {}",
                if available.is_none() { " unless a tenant registers them" } else { "" },
                if offered.is_empty() {
                    "until then the agent is offered no tools".to_string()
                } else {
                    format!("until then it is offered only {}", offered.join(", "))
                }
            ));
        }
    }
    out
}
