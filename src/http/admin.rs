//! `/admin/…`: API keys and tenant limits, guarded by the admin token.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Admin;
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery};
use super::AppState;
use crate::store::tenants::{self, Limits};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/admin/keys", post(create_key).get(list_keys))
        .route("/admin/keys/{id}", delete(revoke_key))
        .route("/admin/tenants", get(list_tenants))
        .route("/admin/tenants/{name}", get(read_tenant).put(put_tenant))
}

/// Tenant names: what API keys and the CLI accept.
pub fn check_tenant_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid("tenant", "must be 1-64 characters of a-z, A-Z, 0-9, '-', '_' and '.'"))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewKey {
    tenant: String,
    #[serde(default)]
    name: Option<String>,
}

async fn create_key(_: Admin, State(st): State<AppState>, ApiJson(b): ApiJson<NewKey>) -> Result<Response, ApiError> {
    check_tenant_name(&b.tenant)?;
    let (row, key) = tenants::create_key(&st.pool, &b.tenant, b.name.as_deref()).await?;
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
    Ok(Json(json!({"keys": tenants::list_keys(&st.pool, q.tenant.as_deref()).await?})))
}

async fn revoke_key(_: Admin, State(st): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    match tenants::revoke_key(&st.pool, &id).await? {
        Some(_) => {
            st.auth.forget();
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(ApiError::not_found("key")),
    }
}

async fn list_tenants(_: Admin, State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"tenants": tenants::names(&st.pool).await?})))
}

async fn read_tenant(_: Admin, State(st): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let mut conn = st.pool.acquire().await.map_err(crate::store::StoreError::from)?;
    let limits = tenants::limits(&mut conn, &name, false).await?.ok_or_else(|| ApiError::not_found("tenant"))?;
    let used = tenants::usage_now(&mut conn, &name).await?;
    Ok(Json(json!({"name": name, "limits": limits, "use": used, "defaults": defaults(&st)})))
}

fn defaults(st: &AppState) -> Value {
    json!({"usd_per_day": st.cfg.default_usd_per_day, "usd_per_month": st.cfg.default_usd_per_month,
           "tokens_per_day": st.cfg.default_tokens_per_day, "max_running": st.cfg.default_max_running,
           "max_queued": st.cfg.default_max_queued})
}

pub fn check_limits(l: &Limits) -> Result<(), ApiError> {
    let neg_usd = [
        ("usd_per_day", l.usd_per_day),
        ("usd_per_month", l.usd_per_month),
        ("max_task_cost_usd", l.max_task_cost_usd),
    ];
    for (f, v) in neg_usd {
        if v.is_some_and(|v| v.is_sign_negative()) {
            return Err(ApiError::invalid(f, "must not be negative"));
        }
    }
    let ints = [
        ("tokens_per_day", l.tokens_per_day),
        ("max_task_tokens", l.max_task_tokens),
        ("max_running", l.max_running.map(i64::from)),
        ("max_queued", l.max_queued.map(i64::from)),
        ("max_task_turns", l.max_task_turns.map(i64::from)),
        ("max_task_timeout_seconds", l.max_task_timeout_seconds.map(i64::from)),
    ];
    for (f, v) in ints {
        if v.is_some_and(|v| v < 0) {
            return Err(ApiError::invalid(f, "must not be negative"));
        }
    }
    Ok(())
}

async fn put_tenant(
    _: Admin,
    State(st): State<AppState>,
    Path(name): Path<String>,
    ApiJson(b): ApiJson<Limits>,
) -> Result<Response, ApiError> {
    check_tenant_name(&name)?;
    check_limits(&b)?;
    let created = tenants::put_limits(&st.pool, &name, &b).await?;
    st.limits_cache.remove(&name);
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({"name": name, "limits": b}))).into_response())
}
