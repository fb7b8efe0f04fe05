//! `/tools`, `/tool-sources` and `/signing-secret`: the tenant's tool catalog.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::{AppState, Tenant};
use crate::store::tools as store;
use crate::tools::catalog::{self, ToolInput};
use crate::tools::{check_tool_name, mcp, Target, ToolDef};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/tools", get(list))
        .route("/tools/{name}", get(read).put(put).delete(delete))
        .route("/tool-sources", get(list_sources))
        .route("/tool-sources/{name}", get(read_source).put(put_source).delete(delete_source))
        .route("/tool-sources/{name}/refresh", post(refresh_source))
        .route("/signing-secret", post(rotate_secret))
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
        Target::Caller => {
            v["endpoint"] = json!(null);
            v["run_by"] = json!("caller");
        }
    }
    v
}

async fn list(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Json<Value>, ApiError> {
    let mut out: Vec<Value> =
        store::list(&st.tasks.pool, &tenant).await?.iter().map(|r| view(&catalog::from_row(r), "catalog")).collect();
    for s in store::sources(&st.tasks.pool, &tenant).await? {
        out.extend(catalog::source_tools(&s).iter().map(|d| view(d, "mcp")));
    }
    Ok(Json(json!({"tools": out})))
}

async fn read(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let row = store::get(&st.tasks.pool, &tenant, &name).await?.ok_or_else(|| ApiError::not_found("tool"))?;
    Ok(Json(view(&catalog::from_row(&row), "catalog")))
}

async fn put(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<ToolInput>,
) -> Result<Response, ApiError> {
    let def = catalog::validate(&st.tasks.tool_caller, st.tasks.cfg.tool_timeout_ms, "", &name, &body)?;
    let row = catalog::to_row(&def).ok_or_else(ApiError::internal)?;
    let created = store::put(&st.tasks.pool, &tenant, &row).await?;
    st.tasks.tools_cache.remove(&tenant);
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(view(&def, "catalog"))).into_response())
}

async fn delete(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    if store::delete(&st.tasks.pool, &tenant, &name).await? {
        st.tasks.tools_cache.remove(&tenant);
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
        "tools": catalog::source_tools(s).iter().map(|d| view(d, "mcp")).collect::<Vec<_>>(),
        "refreshed_at": s.refreshed_at, "last_error": s.last_error,
    })
}

fn discovery_timeout(st: &AppState) -> Duration {
    Duration::from_millis(st.tasks.cfg.tool_timeout_ms)
}

async fn list_sources(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Json<Value>, ApiError> {
    let all: Vec<Value> = store::sources(&st.tasks.pool, &tenant).await?.iter().map(source_view).collect();
    Ok(Json(json!({"tool_sources": all})))
}

async fn read_source(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let s = store::source(&st.tasks.pool, &tenant, &name).await?.ok_or_else(|| ApiError::not_found("tool source"))?;
    Ok(Json(source_view(&s)))
}

async fn put_source(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<SourceInput>,
) -> Result<Response, ApiError> {
    check_tool_name(&name).map_err(|m| ApiError::invalid("name", m))?;
    if name.contains("__") {
        return Err(ApiError::invalid("name", "must not contain `__` (it separates source and tool names)"));
    }
    st.tasks.tool_caller.allow.check_url(&body.url).map_err(|e| ApiError::invalid("url", e.0))?;
    for (k, v) in &body.headers {
        if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
            || reqwest::header::HeaderValue::from_str(v).is_err()
        {
            return Err(ApiError::invalid("headers", format!("{k:?} is not a valid header")));
        }
    }
    let headers: Vec<(String, String)> = body.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let found = mcp::discover(&st.tasks.tool_caller, &name, &body.url, &headers, discovery_timeout(&st)).await;
    let found = catalog::stored_tools(&found);
    let created = store::put_source(&st.tasks.pool, &tenant, &name, &body.url, &body.headers, &found).await?;
    st.tasks.tools_cache.remove(&tenant);
    let row = store::source(&st.tasks.pool, &tenant, &name).await?.ok_or_else(ApiError::internal)?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(source_view(&row))).into_response())
}

async fn refresh_source(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let s = store::source(&st.tasks.pool, &tenant, &name).await?.ok_or_else(|| ApiError::not_found("tool source"))?;
    let headers: Vec<(String, String)> = s.headers.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let found = mcp::discover(&st.tasks.tool_caller, &name, &s.url, &headers, discovery_timeout(&st)).await;
    store::refreshed(&st.tasks.pool, &tenant, &name, &catalog::stored_tools(&found)).await?;
    st.tasks.tools_cache.remove(&tenant);
    let row = store::source(&st.tasks.pool, &tenant, &name).await?.ok_or_else(ApiError::internal)?;
    Ok(Json(source_view(&row)))
}

async fn delete_source(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    if store::delete_source(&st.tasks.pool, &tenant, &name).await? {
        st.tasks.tools_cache.remove(&tenant);
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("tool source"))
    }
}

/// A new signing secret for outbound tool calls and webhooks. The only time a secret is shown.
async fn rotate_secret(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Json<Value>, ApiError> {
    let secret = store::rotate_signing_secret(&st.tasks.pool, &tenant).await?;
    Ok(Json(json!({"secret": secret, "algorithm": "HMAC-SHA256", "signed": "<Subagent-Timestamp>.<body>"})))
}
