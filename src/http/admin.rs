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
use crate::budget::{self, Limits};
use crate::store::tenants;

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
    budget::check_tenant_name(&b.tenant)?;
    let (row, key) = tenants::create_key(&st.tasks.pool, &b.tenant, b.name.as_deref()).await?;
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
    Ok(Json(json!({"keys": tenants::list_keys(&st.tasks.pool, q.tenant.as_deref()).await?})))
}

async fn revoke_key(
    _: Admin,
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    match tenants::revoke_key(&st.tasks.pool, &id).await? {
        Some(_) => {
            st.auth.forget();
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(ApiError::not_found("key")),
    }
}

async fn list_tenants(_: Admin, State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"tenants": tenants::names(&st.tasks.pool).await?})))
}

async fn read_tenant(
    _: Admin,
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let mut conn = st.tasks.pool.acquire().await.map_err(crate::store::StoreError::from)?;
    let limits = tenants::limits(&mut conn, &name, false).await?.ok_or_else(|| ApiError::not_found("tenant"))?;
    let used = crate::store::budget::usage_now(&mut conn, &name).await?;
    Ok(Json(json!({"name": name, "limits": limits, "use": used, "defaults": defaults(&st)})))
}

fn defaults(st: &AppState) -> Value {
    let d = budget::Defaults::from_config(&st.tasks.cfg);
    json!({"usd_per_day": d.usd_per_day, "usd_per_month": d.usd_per_month, "tokens_per_day": d.tokens_per_day,
           "max_running": d.max_running, "max_queued": d.max_queued,
           "requests_per_second": d.requests_per_second, "request_burst": d.request_burst,
           "max_streams": d.max_streams, "max_waits": d.max_waits, "max_scheduled": d.max_scheduled})
}

async fn put_tenant(
    _: Admin,
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(b): ApiJson<Limits>,
) -> Result<Response, ApiError> {
    let created = budget::set_limits(&st.tasks.pool, &name, &b).await?;
    st.tasks.limits_cache.remove(&name);
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({"name": name, "limits": b}))).into_response())
}
