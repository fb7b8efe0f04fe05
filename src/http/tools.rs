//! `/tools`, `/tool-sources` and `/signing-secret`: the tenant's tool catalog.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::ApiJson;
use super::{AppState, Tenant};
use crate::store::tools as store;
use crate::tools::{check_parameters, check_tool_name, mcp, Policy, Target, ToolDef};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/tools", get(list))
        .route("/tools/{name}", get(read).put(put).delete(delete))
        .route("/tool-sources", get(list_sources))
        .route("/tool-sources/{name}", get(read_source).put(put_source).delete(delete_source))
        .route("/tool-sources/{name}/refresh", post(refresh_source))
        .route("/signing-secret", post(rotate_secret))
}

/// A tool as registered or brought inline with a task.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ToolInput {
    #[serde(default)]
    pub description: Option<String>,
    pub parameters: Value,
    pub policy: Policy,
    pub endpoint: String,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// An inline tool: the same fields plus its name.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct InlineTool {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub parameters: Value,
    pub policy: Policy,
    pub endpoint: String,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

const MAX_TOOL_TIMEOUT_MS: u64 = 300_000;

/// Validate a tool into a definition; `field` prefixes the names of bad fields.
pub fn to_def(st: &AppState, field: &str, name: &str, t: &ToolInput) -> Result<ToolDef, ApiError> {
    check_tool_name(name).map_err(|m| ApiError::invalid(&format!("{field}name"), m))?;
    check_parameters(&t.parameters).map_err(|m| ApiError::invalid(&format!("{field}parameters"), m))?;
    st.tool_caller.allow.check_url(&t.endpoint).map_err(|e| ApiError::invalid(&format!("{field}endpoint"), e.0))?;
    let timeout_ms = match t.timeout_ms {
        Some(0) => return Err(ApiError::invalid(&format!("{field}timeout_ms"), "must be at least 1")),
        Some(ms) if ms > MAX_TOOL_TIMEOUT_MS => {
            return Err(ApiError::invalid(
                &format!("{field}timeout_ms"),
                format!("must be at most {MAX_TOOL_TIMEOUT_MS}"),
            ))
        }
        Some(ms) => ms,
        None => st.cfg.tool_timeout_ms,
    };
    Ok(ToolDef {
        name: name.to_string(),
        description: t.description.clone().unwrap_or_default(),
        parameters: t.parameters.clone(),
        policy: t.policy,
        target: Target::Http { endpoint: t.endpoint.clone(), timeout_ms },
    })
}

fn view(d: &ToolDef, source: &str) -> Value {
    let mut v = json!({"name": d.name, "description": d.description, "parameters": d.parameters, "policy": d.policy, "source": source});
    match &d.target {
        Target::Http { endpoint, timeout_ms } => {
            v["endpoint"] = json!(endpoint);
            v["timeout_ms"] = json!(timeout_ms);
        }
        Target::Mcp { source, tool, .. } => {
            v["tool_source"] = json!(source);
            v["mcp_tool"] = json!(tool);
        }
    }
    v
}

/// Every tool the tenant could offer a run: the catalog, then each MCP source's cached tools.
/// (Cached for a few seconds; this replica's own changes take effect at once.)
pub async fn available(st: &AppState, tenant: &str) -> Result<Vec<ToolDef>, ApiError> {
    if let Some(v) = st.tools_cache.get(tenant) {
        return Ok(v);
    }
    let mut out: Vec<ToolDef> = store::list(&st.pool, tenant).await?.iter().map(|r| r.def()).collect();
    for s in store::sources(&st.pool, tenant).await? {
        out.extend(s.tools.0);
    }
    st.tools_cache.put(tenant, out.clone());
    Ok(out)
}

async fn list(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Json<Value>, ApiError> {
    let mut out: Vec<Value> = store::list(&st.pool, &tenant).await?.iter().map(|r| view(&r.def(), "catalog")).collect();
    for s in store::sources(&st.pool, &tenant).await? {
        out.extend(s.tools.0.iter().map(|d| view(d, "mcp")));
    }
    Ok(Json(json!({"tools": out})))
}

async fn read(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let row = store::get(&st.pool, &tenant, &name).await?.ok_or_else(|| ApiError::not_found("tool"))?;
    Ok(Json(view(&row.def(), "catalog")))
}

async fn put(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<ToolInput>,
) -> Result<Response, ApiError> {
    let def = to_def(&st, "", &name, &body)?;
    let created = store::put(&st.pool, &tenant, &def).await?;
    st.tools_cache.remove(&tenant);
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(view(&def, "catalog"))).into_response())
}

async fn delete(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    if store::delete(&st.pool, &tenant, &name).await? {
        st.tools_cache.remove(&tenant);
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("tool"))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceInput {
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// Header values are secrets: only their names are shown.
fn source_view(s: &store::SourceRow) -> Value {
    json!({
        "name": s.name, "url": s.url, "headers": s.headers.0.keys().collect::<Vec<_>>(),
        "tools": s.tools.0.iter().map(|d| view(d, "mcp")).collect::<Vec<_>>(),
        "refreshed_at": s.refreshed_at, "last_error": s.last_error,
    })
}

fn discovery_timeout(st: &AppState) -> Duration {
    Duration::from_millis(st.cfg.tool_timeout_ms)
}

async fn list_sources(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Json<Value>, ApiError> {
    let all: Vec<Value> = store::sources(&st.pool, &tenant).await?.iter().map(source_view).collect();
    Ok(Json(json!({"tool_sources": all})))
}

async fn read_source(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let s = store::source(&st.pool, &tenant, &name).await?.ok_or_else(|| ApiError::not_found("tool source"))?;
    Ok(Json(source_view(&s)))
}

async fn put_source(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<SourceInput>,
) -> Result<Response, ApiError> {
    check_tool_name(&name).map_err(|m| ApiError::invalid("name", m))?;
    if name.contains("__") {
        return Err(ApiError::invalid("name", "must not contain `__` (it separates source and tool names)"));
    }
    st.tool_caller.allow.check_url(&body.url).map_err(|e| ApiError::invalid("url", e.0))?;
    for (k, v) in &body.headers {
        if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
            || reqwest::header::HeaderValue::from_str(v).is_err()
        {
            return Err(ApiError::invalid("headers", format!("{k:?} is not a valid header")));
        }
    }
    let headers: Vec<(String, String)> = body.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let found = mcp::discover(&st.tool_caller, &name, &body.url, &headers, discovery_timeout(&st)).await;
    let created = store::put_source(&st.pool, &tenant, &name, &body.url, &body.headers, &found).await?;
    st.tools_cache.remove(&tenant);
    let row = store::source(&st.pool, &tenant, &name).await?.ok_or_else(ApiError::internal)?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(source_view(&row))).into_response())
}

async fn refresh_source(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let s = store::source(&st.pool, &tenant, &name).await?.ok_or_else(|| ApiError::not_found("tool source"))?;
    let headers: Vec<(String, String)> = s.headers.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let found = mcp::discover(&st.tool_caller, &name, &s.url, &headers, discovery_timeout(&st)).await;
    store::refreshed(&st.pool, &tenant, &name, &found).await?;
    st.tools_cache.remove(&tenant);
    let row = store::source(&st.pool, &tenant, &name).await?.ok_or_else(ApiError::internal)?;
    Ok(Json(source_view(&row)))
}

async fn delete_source(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    if store::delete_source(&st.pool, &tenant, &name).await? {
        st.tools_cache.remove(&tenant);
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("tool source"))
    }
}

/// A new signing secret for outbound tool calls and webhooks. The only time a secret is shown.
async fn rotate_secret(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Json<Value>, ApiError> {
    let secret = store::rotate_signing_secret(&st.pool, &tenant).await?;
    Ok(Json(json!({"secret": secret, "algorithm": "HMAC-SHA256", "signed": "<Subagent-Timestamp>.<body>"})))
}
