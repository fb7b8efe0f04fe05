//! `/agents`: the built-in types, the agents directory's definitions, and the tenant's own.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{ApiBytes, ApiPath};
use super::{AppState, Tenant};
use crate::engine::agents::{AgentType, BUILTIN_NAMES};
use crate::engine::definitions::{parse_markdown, AgentDefinition, AgentName, Written};
use crate::store::agents;
use crate::tasks::submit::agents::{resolve, tenant_definitions, unservable, Resolved};
use crate::tools::ToolDef;

pub fn router() -> Router<AppState> {
    Router::new().route("/agents", get(list)).route("/agents/{name}", get(read).put(put).delete(delete))
}

fn builtin_view(t: AgentType, name: &str) -> Value {
    json!({"name": name, "source": "builtin", "description": format!("built-in {} agent", t.as_str()),
           "system_prompt": t.system_prompt(), "max_turns": t.default_max_turns(),
           "tools": if t.read_only() { json!("read-only (policy auto)") } else { json!("all the caller allows") }})
}

/// A custom definition as the API shows it: as written (Claude Code's own fields under
/// `claude_code`), with `warnings` — what reading it noticed, and what it names that cannot be
/// served here now (`unmatched_tools`: names of its `tools` that are no tool of the tenant's).
fn custom_view(st: &AppState, d: &AgentDefinition, source: &str, tools: &[ToolDef]) -> Value {
    let mut v = serde_json::to_value(d).unwrap_or(Value::Null);
    let u = unservable(d, &st.tasks.providers, Some(tools), &st.tasks.file_agents.tool_aliases);
    if let Some(o) = v.as_object_mut() {
        o.remove("notices");
    }
    let mut warnings = d.notices.clone();
    warnings.extend(u.warnings);
    v["warnings"] = json!(warnings);
    if d.tools.is_some() {
        v["unmatched_tools"] = json!(u.unmatched_tools);
    }
    v["source"] = json!(source);
    v
}

async fn tenant_tools(st: &AppState, tenant: &str) -> Result<Vec<ToolDef>, ApiError> {
    Ok(crate::tools::catalog::available(&st.tasks.pool, &st.tasks.tools_cache, tenant).await?)
}

async fn list(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Json<Value>, ApiError> {
    let mut out: Vec<Value> = vec![];
    for name in BUILTIN_NAMES {
        if let Some(t) = AgentType::parse(name) {
            out.push(builtin_view(t, name));
        }
    }
    let tools = tenant_tools(&st, &tenant).await?;
    let mine = tenant_definitions(&st.tasks.pool, &tenant).await?;
    for d in &st.tasks.file_agents.valid {
        if !mine.iter().any(|m| m.name == d.name) {
            out.push(custom_view(&st, d, "file", &tools));
        }
    }
    out.extend(mine.iter().map(|d| custom_view(&st, d, "api", &tools)));
    Ok(Json(json!({"agents": out, "invalid": st.tasks.file_agents.invalid})))
}

async fn read(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    match resolve(&st.tasks.pool, &st.tasks.file_agents, &tenant, &name).await? {
        Some(Resolved::Builtin(t)) => Ok(Json(builtin_view(t, &name))),
        Some(Resolved::Custom(d)) => {
            let source = if st.tasks.file_agents.get(&name) == Some(&*d) { "file" } else { "api" };
            let tools = tenant_tools(&st, &tenant).await?;
            Ok(Json(custom_view(&st, &d, source, &tools)))
        }
        None => Err(ApiError::not_found("agent")),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutAgent {
    #[serde(default)]
    description: Option<String>,
    system_prompt: String,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    disallowed_tools: Option<Vec<String>>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_turns: Option<i64>,
    #[serde(default)]
    max_output_tokens: Option<i64>,
    #[serde(default)]
    approval: Option<String>,
    #[serde(default)]
    read_only: Option<bool>,
    #[serde(default)]
    output_schema: Option<Value>,
    #[serde(default)]
    fallback_models: Option<Vec<String>>,
    #[serde(default)]
    fallback_on: Option<Vec<String>>,
    #[serde(default)]
    priority: Option<String>,
}

fn definition_error(e: crate::engine::definitions::DefinitionError) -> ApiError {
    let field = e.field.clone().unwrap_or_else(|| "body".into());
    ApiError::invalid(&field, e.message)
}

/// JSON, or the Markdown of an agents-directory file (`text/markdown`).
fn parse_body(name: &str, headers: &HeaderMap, body: &Bytes) -> Result<AgentDefinition, ApiError> {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match mime.as_str() {
        "text/markdown" => {
            let text = std::str::from_utf8(body).map_err(|_| ApiError::invalid("body", "is not UTF-8"))?;
            let d = parse_markdown("request", text).map_err(definition_error)?;
            if d.name != *name {
                return Err(ApiError::invalid(
                    "name",
                    format!("the front matter says {:?} but the path says {name:?}", d.name.as_str()),
                ));
            }
            Ok(d)
        }
        "application/json" => {
            let p: PutAgent = super::extract::from_slice(body).map_err(|e| {
                let msg = e.to_string();
                let field = ["unknown field `", "missing field `"]
                    .iter()
                    .find_map(|pre| {
                        msg.split_once(pre).and_then(|(_, r)| r.split_once('`')).map(|(f, _)| f.to_string())
                    })
                    .unwrap_or_else(|| "body".into());
                if e.is_syntax() || e.is_eof() {
                    ApiError::new(StatusCode::BAD_REQUEST, "malformed_json", "Malformed JSON", msg)
                } else {
                    ApiError::invalid(&field, msg)
                }
            })?;
            if p.system_prompt.trim().is_empty() {
                return Err(ApiError::invalid("system_prompt", "must not be empty"));
            }
            let name = AgentName::parse(name).map_err(|m| ApiError::invalid("name", m))?;
            let written = Written {
                description: p.description.unwrap_or_default(),
                tools: p.tools,
                disallowed_tools: p.disallowed_tools.unwrap_or_default(),
                model: p.model,
                max_turns: p.max_turns,
                max_output_tokens: p.max_output_tokens,
                approval: p.approval,
                read_only: p.read_only,
                output_schema: p.output_schema,
                fallback_models: p.fallback_models.unwrap_or_default(),
                fallback_on: p.fallback_on,
                priority: p.priority,
                ..Written::default()
            };
            written
                .check(name, p.system_prompt.trim().to_string())
                .map_err(|(field, m)| ApiError::invalid(field.unwrap_or("body"), m))
        }
        _ => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "Unsupported media type",
            "send the definition as application/json or text/markdown",
        )),
    }
}

async fn put(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
    headers: HeaderMap,
    ApiBytes(body): ApiBytes,
) -> Result<Response, ApiError> {
    AgentName::parse(&name).map_err(|m| ApiError::invalid("name", m))?;
    let def = parse_body(&name, &headers, &body)?;
    // A model that cannot be served now, or tool names that are no tools here, do not make the
    // definition invalid: it is stored, and the answer (like GET) lists them under `warnings`.
    let stored = serde_json::to_value(&def).map_err(|_| ApiError::internal())?;
    let created = agents::put(&st.tasks.pool, &tenant, def.name.as_str(), &stored).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    let tools = tenant_tools(&st, &tenant).await?;
    Ok((status, Json(custom_view(&st, &def, "api", &tools))).into_response())
}

async fn delete(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    if agents::delete(&st.tasks.pool, &tenant, &name).await? {
        return Ok(StatusCode::NO_CONTENT);
    }
    if AgentType::parse(&name).is_some() || st.tasks.file_agents.get(&name).is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "definition_read_only",
            "Read-only definition",
            format!("{name:?} is a built-in or comes from the agents directory; it cannot be deleted over the API"),
        ));
    }
    Err(ApiError::not_found("agent"))
}
