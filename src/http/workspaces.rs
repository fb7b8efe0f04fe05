//! `/workspaces`: a tenant's uploaded workspaces (`PUT` a `tar.gz`, streamed under its own cap
//! rather than the API's body limit; read their metadata; delete), and `/secrets`: its
//! write-only secrets (a private repository's token), whose values no answer carries; and
//! `/environments`: its named environments (an image with a setup script) and their builds.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::{AppState, Tenant};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/workspaces", get(list))
        .route("/workspaces/{name}", get(read).put(put).delete(delete))
        .route("/environments", get(environments))
        .route("/environments/{name}", get(environment).put(put_environment).delete(delete_environment))
        .route("/secrets", get(secrets))
        .route("/secrets/{name}", axum::routing::put(put_secret).delete(delete_secret))
}

async fn list(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Response, ApiError> {
    Ok(Json(json!({"workspaces": st.res.workspaces(&tenant).await?})).into_response())
}

async fn read(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    Ok(Json(st.res.workspace(&tenant, &name).await?).into_response())
}

async fn put(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let (row, created) = st.res.put_workspace(&tenant, &name, ct, body.into_data_stream()).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(row)).into_response())
}

async fn delete(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    st.res.delete_workspace(&tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn environments(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Response, ApiError> {
    Ok(Json(json!({"environments": st.res.environments(&tenant).await?})).into_response())
}

async fn environment(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    Ok(Json(st.res.environment(&tenant, &name).await?).into_response())
}

async fn put_environment(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<crate::resources::environments::EnvironmentDef>,
) -> Result<Response, ApiError> {
    let (row, created) = st.res.put_environment(&tenant, &name, body).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(row)).into_response())
}

async fn delete_environment(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    st.res.delete_environment(&tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn secrets(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Response, ApiError> {
    Ok(Json(json!({"secrets": st.res.secrets(&tenant).await?})).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutSecret {
    value: String,
    /// The only host the value is sent to.
    host: String,
}

async fn put_secret(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<PutSecret>,
) -> Result<Response, ApiError> {
    let (row, created) = st.res.put_secret(&tenant, &name, &body.value, &body.host).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(row)).into_response())
}

async fn delete_secret(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    st.res.delete_secret(&tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
