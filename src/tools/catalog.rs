//! A tenant's tools as the API defines them: the shape of a tool in a request, its validation
//! into a `ToolDef`, and the conversion between definitions and the store's rows.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;

use super::{check_parameters, check_tool_name, Caller, Policy, Target, ToolDef, ToolError};
use crate::cache::TtlCache;
use crate::store::tools::{self as store, SourceRow, ToolRow};
use crate::store::StoreError;

/// Longest timeout a tool may ask for.
pub const MAX_TOOL_TIMEOUT_MS: u64 = 300_000;

/// A tool as registered (`PUT /tools/{name}`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ToolInput {
    #[serde(default)]
    pub description: Option<String>,
    pub parameters: Value,
    pub policy: Policy,
    /// Where subagentd calls it; none: a caller tool (the caller runs it and submits its output).
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// A tool brought inline with a task: `name` and the fields of `ToolInput`. (Read by hand:
/// serde cannot refuse unknown fields through `flatten`, and `ToolInput` refuses them.)
#[derive(Debug, Clone, Serialize)]
pub struct InlineTool {
    pub name: String,
    #[serde(flatten)]
    pub tool: ToolInput,
}

impl<'de> Deserialize<'de> for InlineTool {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut fields = serde_json::Map::deserialize(d)?;
        let name = match fields.remove("name") {
            Some(Value::String(n)) => n,
            Some(other) => return Err(D::Error::custom(format!("name: expected a string, got {other}"))),
            None => return Err(D::Error::missing_field("name")),
        };
        let tool = ToolInput::deserialize(Value::Object(fields)).map_err(D::Error::custom)?;
        Ok(InlineTool { name, tool })
    }
}

/// Validate a tool into a definition; `field` prefixes the names of bad fields (`tools[0].`).
/// `default_timeout_ms` applies when the tool sets none.
pub fn validate(
    caller: &Caller,
    default_timeout_ms: u64,
    field: &str,
    name: &str,
    t: &ToolInput,
) -> Result<ToolDef, ToolError> {
    let at = |f: &str| format!("{field}{f}");
    check_tool_name(name).map_err(|m| ToolError::invalid(at("name"), m))?;
    if super::builtin::is_reserved(name) {
        return Err(ToolError::invalid(
            at("name"),
            format!("{name:?} is the name of a built-in tool; a tenant tool may not take it"),
        ));
    }
    check_parameters(&t.parameters).map_err(|m| ToolError::invalid(at("parameters"), m))?;
    let Some(endpoint) = &t.endpoint else {
        if t.timeout_ms.is_some() {
            return Err(ToolError::invalid(at("timeout_ms"), "a caller tool (no endpoint) has no timeout of its own"));
        }
        return Ok(ToolDef {
            name: name.to_string(),
            description: t.description.clone().unwrap_or_default(),
            parameters: std::sync::Arc::new(t.parameters.clone()),
            policy: t.policy,
            target: Target::Caller,
        });
    };
    caller.allow.check_url(endpoint).map_err(|e| ToolError::invalid(at("endpoint"), e.0))?;
    let timeout_ms = match t.timeout_ms {
        Some(0) => return Err(ToolError::invalid(at("timeout_ms"), "must be at least 1")),
        Some(ms) if ms > MAX_TOOL_TIMEOUT_MS => {
            return Err(ToolError::invalid(at("timeout_ms"), format!("must be at most {MAX_TOOL_TIMEOUT_MS}")))
        }
        Some(ms) => ms,
        None => default_timeout_ms,
    };
    Ok(ToolDef {
        name: name.to_string(),
        description: t.description.clone().unwrap_or_default(),
        parameters: std::sync::Arc::new(t.parameters.clone()),
        policy: t.policy,
        target: Target::Http { endpoint: endpoint.clone(), timeout_ms },
    })
}

/// A catalog row as a definition.
pub fn from_row(r: &ToolRow) -> ToolDef {
    ToolDef {
        name: r.name.clone(),
        description: r.description.clone(),
        parameters: std::sync::Arc::new(r.parameters.clone()),
        policy: if r.policy == "auto" { Policy::Auto } else { Policy::Propose },
        target: match &r.endpoint {
            Some(endpoint) => Target::Http { endpoint: endpoint.clone(), timeout_ms: r.timeout_ms.max(0) as u64 },
            None => Target::Caller,
        },
    }
}

/// A catalog definition as the row to write (`None` for a tool the catalog does not hold: an
/// MCP source's).
pub fn to_row(d: &ToolDef) -> Option<ToolRow> {
    let (endpoint, timeout_ms) = match &d.target {
        Target::Http { endpoint, timeout_ms } => (Some(endpoint.clone()), (*timeout_ms).min(i32::MAX as u64) as i32),
        Target::Caller => (None, 0),
        Target::Mcp { .. } | Target::Builtin { .. } | Target::Provider { .. } => return None,
    };
    Some(ToolRow {
        name: d.name.clone(),
        description: d.description.clone(),
        parameters: (*d.parameters).clone(),
        policy: if d.policy == Policy::Auto { "auto" } else { "propose" }.into(),
        endpoint,
        timeout_ms,
        ..ToolRow::default()
    })
}

/// The tools an MCP source's last discovery found (a row this version cannot read gives none).
pub fn source_tools(s: &SourceRow) -> Vec<ToolDef> {
    serde_json::from_value(s.tools.clone()).unwrap_or_default()
}

/// Discovered tools as the source row stores them.
pub fn stored_tools(found: &Result<super::mcp::Discovered, ToolError>) -> store::Discovery {
    match found {
        Ok(d) => store::Discovery {
            tools: Some(serde_json::to_value(&d.tools).unwrap_or(Value::Array(vec![]))),
            note: d.note(),
        },
        Err(e) => store::Discovery { tools: None, note: Some(e.to_string()) },
    }
}

/// Every tool the tenant could offer a run: the catalog, then each MCP source's cached tools.
/// Cached for the cache's time to live; this replica's own changes remove the entry at once.
pub async fn available(
    pool: &PgPool,
    cache: &TtlCache<Vec<ToolDef>>,
    tenant: &str,
) -> Result<Vec<ToolDef>, StoreError> {
    if let Some(v) = cache.get(tenant) {
        return Ok(v);
    }
    let mut out: Vec<ToolDef> = store::list(pool, tenant).await?.iter().map(from_row).collect();
    for s in store::sources(pool, tenant).await? {
        out.extend(source_tools(&s));
    }
    cache.put(tenant, out.clone());
    Ok(out)
}
