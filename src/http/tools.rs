//! `/tools`, `/tool-sources` and `/signing-secret`: the tenant's tool catalog.

use std::collections::BTreeMap;

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
use crate::resources::tools::SourceRow;
use crate::tools::catalog::{self, ToolInput};
use crate::tools::{Target, ToolDef};

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
        Target::Builtin { .. } => {
            v["run_by"] = json!("subagentd");
        }
        Target::Provider { .. } => {
            v["run_by"] = json!("provider");
        }
    }
    v
}

async fn list(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Json<Value>, ApiError> {
    let (catalog, sourced) = st.res.tools(&tenant).await?;
    let mut out: Vec<Value> = catalog.iter().map(|d| view(d, "catalog")).collect();
    out.extend(sourced.iter().map(|d| view(d, "mcp")));
    out.extend(st.res.builtin_tools(&tenant).await?.iter().map(|d| view(d, "builtin")));
    Ok(Json(json!({"tools": out})))
}

async fn read(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(view(&st.res.tool(&tenant, &name).await?, "catalog")))
}

async fn put(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<ToolInput>,
) -> Result<Response, ApiError> {
    let (created, def) = st.res.put_tool(&tenant, &name, &body).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(view(&def, "catalog"))).into_response())
}

async fn delete(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    st.res.delete_tool(&tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceInput {
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// Header values are secrets: only their names are shown.
fn source_view(s: &SourceRow) -> Value {
    json!({
        "name": s.name, "url": s.url, "headers": s.headers.0.keys().collect::<Vec<_>>(),
        "tools": catalog::source_tools(s).iter().map(|d| view(d, "mcp")).collect::<Vec<_>>(),
        "refreshed_at": s.refreshed_at, "last_error": s.last_error,
    })
}

async fn list_sources(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Json<Value>, ApiError> {
    let all: Vec<Value> = st.res.sources(&tenant).await?.iter().map(source_view).collect();
    Ok(Json(json!({"tool_sources": all})))
}

async fn read_source(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(source_view(&st.res.source(&tenant, &name).await?)))
}

async fn put_source(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<SourceInput>,
) -> Result<Response, ApiError> {
    let (created, row) = st.res.put_source(&tenant, &name, &body.url, &body.headers).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(source_view(&row))).into_response())
}

async fn refresh_source(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(source_view(&st.res.refresh_source(&tenant, &name).await?)))
}

async fn delete_source(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    st.res.delete_source(&tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A new signing secret for outbound tool calls and webhooks. The only time a secret is shown.
async fn rotate_secret(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Json<Value>, ApiError> {
    let secret = st.res.rotate_signing_secret(&tenant).await?;
    Ok(Json(json!({"secret": secret, "algorithm": "HMAC-SHA256", "signed": "<Subagent-Timestamp>.<body>"})))
}
