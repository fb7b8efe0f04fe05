//! The web pages: the API reference (`/docs`, rendering `/openapi.yaml`), and the ops console:
//! `/console` (the page), `/console/assets/…` (embedded, versioned, shared by both), and
//! `/console/session`, where an API key or the admin token is exchanged once for a session
//! cookie (`HttpOnly`, `SameSite=Strict`, `Secure` behind TLS) whose writes need its CSRF token.
//! The key itself is never stored in the browser, put in a URL or logged.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::auth::{cookie, Principal, Scope, SESSION_COOKIE};
use super::error::ApiError;
use super::extract::ApiJson;
use super::AppState;
use crate::console;
use crate::resources::keys::constant_time_eq;

/// How long a console session lasts.
const SESSION_SECS: f64 = 12.0 * 3600.0;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/console") }))
        .route("/console", get(page))
        .route("/console/assets/{*path}", get(asset))
        .route("/console/session", get(whoami).post(sign_in).delete(sign_out))
        .route("/docs", get(reference))
        .route("/openapi.yaml", get(openapi))
}

/// `/docs`: the API reference, drawn in the browser from `/openapi.yaml` by the vendored Redoc.
async fn reference() -> Response {
    let mut resp = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], console::DOCS.as_str()).into_response();
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    for (k, v) in console::DOCS_SECURITY_HEADERS {
        h.insert(*k, HeaderValue::from_static(v));
    }
    resp
}

/// `/openapi.yaml`: the API's description, as this binary serves it.
async fn openapi() -> Response {
    let mut resp = ([(header::CONTENT_TYPE, "application/yaml; charset=utf-8")], console::OPENAPI).into_response();
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    secured(resp)
}

fn secured(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    for (k, v) in console::SECURITY_HEADERS {
        h.insert(*k, HeaderValue::from_static(v));
    }
    resp
}

async fn page() -> Response {
    let mut resp = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], console::INDEX.as_str()).into_response();
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    secured(resp)
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    let a = console::asset(&path).ok_or_else(|| ApiError::not_found("console asset"))?;
    let etag = format!("\"{}\"", a.hash);
    if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        return Ok(secured(StatusCode::NOT_MODIFIED.into_response()));
    }
    let mut resp = ([(header::CONTENT_TYPE, a.content_type)], a.bytes).into_response();
    let h = resp.headers_mut();
    // The page names each asset with its content's hash: a new version is a new URL.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=31536000, immutable"));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    Ok(secured(resp))
}

/// Who the console acts as: `open` (single-user mode, no sign-in), or a `session`.
async fn whoami(State(st): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    if let Some(value) = cookie(&headers, SESSION_COOKIE) {
        if let Some(s) = st.res.console_session(value).await? {
            return Ok(
                Json(json!({"mode": "session", "tenant": s.tenant, "admin": s.admin, "csrf": s.csrf})).into_response()
            );
        }
    }
    if st.auth.single_user_allowed(&st).await? {
        return Ok(Json(json!({"mode": "open", "tenant": st.tasks.config().tenant, "admin": false, "csrf": null}))
            .into_response());
    }
    Err(ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "Sign in",
        "sign in with an API key or the admin token",
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignIn {
    key: String,
}

/// Exchange an API key or the admin token for a session cookie.
async fn sign_in(
    State(st): State<AppState>,
    headers: HeaderMap,
    ApiJson(b): ApiJson<SignIn>,
) -> Result<Response, ApiError> {
    let key = b.key.trim();
    if key.is_empty() {
        return Err(ApiError::invalid("key", "must not be empty"));
    }
    let who = match &st.tasks.config().admin_token {
        Some(admin) if constant_time_eq(admin.as_bytes(), key.as_bytes()) => Principal::Admin,
        _ => match st.auth.tenant_of(&st, key).await? {
            Some(t) => Principal::Tenant(t),
            None => {
                return Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "Unauthorized",
                    "not a valid API key or admin token",
                ))
            }
        },
    };
    let (tenant, admin) = match &who {
        Principal::Admin => (None, true),
        Principal::Tenant(t) => (Some(t.as_str()), false),
    };
    let (value, s) = st.res.start_console_session(tenant, admin, SESSION_SECS).await?;
    let tls = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).is_some_and(|p| p == "https");
    let cookie = format!(
        "{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        SESSION_SECS as u64,
        if tls { "; Secure" } else { "" }
    );
    let mut resp =
        Json(json!({"mode": "session", "tenant": s.tenant, "admin": s.admin, "csrf": s.csrf})).into_response();
    resp.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).map_err(|_| ApiError::internal())?);
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

/// End the session (a write: its CSRF token is checked by `Scope`).
async fn sign_out(State(st): State<AppState>, headers: HeaderMap, _scope: Scope) -> Result<Response, ApiError> {
    if let Some(value) = cookie(&headers, SESSION_COOKIE) {
        st.res.end_console_session(value).await?;
    }
    let mut resp = StatusCode::NO_CONTENT.into_response();
    resp.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("subagentd_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    Ok(resp)
}
