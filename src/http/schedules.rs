//! `/schedules`: a tenant's cron schedules, each submitting its task body at every tick (the
//! room's `schedule`): create or replace, read, list, delete, pause and resume.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::{AppState, Tenant};
use crate::tasks::schedule::ScheduleRequest;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/schedules", get(list))
        .route("/schedules/{name}", get(read).put(put).delete(delete))
        .route("/schedules/{name}/pause", post(pause))
        .route("/schedules/{name}/resume", post(resume))
}

async fn list(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Response, ApiError> {
    let all = st.tasks.schedules(&tenant).await?;
    Ok(Json(json!({"schedules": all})).into_response())
}

async fn read(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    Ok(Json(st.tasks.schedule(&tenant, &name).await?).into_response())
}

/// `Subagent-Depth`: a schedule makes tasks, so a sub-agent's tool may not set one going.
fn depth(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    super::tasks::header_text(headers, "subagent-depth", "Subagent-Depth")
}

async fn put(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ScheduleRequest>,
) -> Result<Response, ApiError> {
    let depth = depth(&headers)?;
    let (row, created) = st.tasks.put_schedule(&tenant, &name, body, depth.as_deref()).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(row)).into_response())
}

async fn delete(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    st.tasks.delete_schedule(&tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn pause(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    Ok(Json(st.tasks.pause_schedule(&tenant, &name, true, None).await?).into_response())
}

async fn resume(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let depth = depth(&headers)?;
    Ok(Json(st.tasks.pause_schedule(&tenant, &name, false, depth.as_deref()).await?).into_response())
}
