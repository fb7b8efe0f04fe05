//! `/admin/…`: API keys and tenant limits, guarded by the admin token.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Admin;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::AppState;
use crate::budget::Limits;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/admin/keys", post(create_key).get(list_keys))
        .route("/admin/keys/{id}", delete(revoke_key))
        .route("/admin/tenants", get(list_tenants))
        .route("/admin/tenants/{name}", get(read_tenant).put(put_tenant))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewKey {
    tenant: String,
    #[serde(default)]
    name: Option<String>,
}

async fn create_key(_: Admin, State(st): State<AppState>, ApiJson(b): ApiJson<NewKey>) -> Result<Response, ApiError> {
    let (row, key) = st.res.create_key(&b.tenant, b.name.as_deref()).await?;
    st.auth.forget();
    let mut v = serde_json::to_value(&row).map_err(|_| ApiError::internal())?;
    v["key"] = json!(key);
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFilter {
    #[serde(default)]
    tenant: Option<String>,
}

async fn list_keys(
    _: Admin,
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<KeyFilter>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"keys": st.res.keys(q.tenant.as_deref()).await?})))
}

async fn revoke_key(
    _: Admin,
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    st.res.revoke_key(&id).await?;
    st.auth.forget();
    Ok(StatusCode::NO_CONTENT)
}

async fn list_tenants(_: Admin, State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"tenants": st.res.tenants().await?})))
}

async fn read_tenant(
    _: Admin,
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(serde_json::to_value(st.res.tenant(&name).await?).map_err(|_| ApiError::internal())?))
}

async fn put_tenant(
    _: Admin,
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(b): ApiJson<Limits>,
) -> Result<Response, ApiError> {
    let created = st.res.set_limits(&name, &b).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({"name": name, "limits": b}))).into_response())
}
