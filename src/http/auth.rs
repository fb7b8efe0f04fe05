//! Who is calling: API keys (`Authorization: Bearer sk_…`) map to tenants; single-user mode
//! gives every request the configured tenant; the admin token guards `/admin/…`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, Method, StatusCode};

use super::error::ApiError;
use super::AppState;
use crate::resources::keys::constant_time_eq;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// API keys once any exist; single-user before that, on a loopback address only.
    Auto,
    Keys,
    /// Single-user: every request is the configured tenant.
    None,
}

impl Mode {
    pub fn parse(s: &str) -> Result<Mode, String> {
        match s {
            "auto" => Ok(Mode::Auto),
            "keys" => Ok(Mode::Keys),
            "none" => Ok(Mode::None),
            other => Err(format!("SUBAGENTD_AUTH: {other:?} is not auto, keys or none")),
        }
    }
}

/// How long a checked key (or the "any keys?" answer) is trusted before asking the database
/// again; a revoked key stops working on other replicas within this time.
const CACHE_TTL: Duration = Duration::from_secs(10);

pub struct Auth {
    pub mode: Mode,
    pub loopback: bool,
    keys: Mutex<HashMap<String, (String, Instant)>>,
    any_keys: Mutex<Option<(bool, Instant)>>,
    /// Tenants' request rates, counted in this process.
    pub rates: super::ratelimit::RateLimits,
}

impl Auth {
    pub fn new(mode: Mode, loopback: bool) -> Auth {
        Auth { mode, loopback, keys: Mutex::default(), any_keys: Mutex::default(), rates: Default::default() }
    }

    /// Forget cached answers (after a key is created or revoked here).
    pub fn forget(&self) {
        self.keys.lock().unwrap_or_else(|e| e.into_inner()).clear();
        *self.any_keys.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub async fn single_user_allowed(&self, st: &AppState) -> Result<bool, ApiError> {
        match self.mode {
            Mode::None => Ok(true),
            Mode::Keys => Ok(false),
            Mode::Auto => {
                if !self.loopback {
                    return Ok(false);
                }
                if let Some((v, at)) = *self.any_keys.lock().unwrap_or_else(|e| e.into_inner()) {
                    if at.elapsed() < CACHE_TTL {
                        return Ok(!v);
                    }
                }
                let any = st.res.any_active_key().await?;
                *self.any_keys.lock().unwrap_or_else(|e| e.into_inner()) = Some((any, Instant::now()));
                Ok(!any)
            }
        }
    }

    pub async fn tenant_of(&self, st: &AppState, key: &str) -> Result<Option<String>, ApiError> {
        if let Some((t, at)) = self.keys.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
            if at.elapsed() < CACHE_TTL {
                return Ok(Some(t.clone()));
            }
        }
        let t = st.res.tenant_of_key(key).await?;
        if let Some(t) = &t {
            self.keys.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string(), (t.clone(), Instant::now()));
        }
        Ok(t)
    }
}

fn unauthorized(detail: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized", detail)
        .header(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))
}

fn bearer(parts: &Parts) -> Option<&str> {
    let v = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The console's session cookie.
pub const SESSION_COOKIE: &str = "subagentd_session";

/// The value of a cookie of the request.
pub fn cookie<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> Option<&'a str> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|v| {
        v.split(';').map(str::trim).find_map(|c| c.split_once('=').filter(|(k, _)| *k == name).map(|(_, v)| v))
    })
}

/// The prefix of the API key a request carries (`sk_xxxxxxxx`), for the usage rollup.
pub fn key_prefix(headers: &axum::http::HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = v.split_once(' ')?;
    let key = key.trim();
    let (prefix, _) =
        key.rsplit_once('_').filter(|_| scheme.eq_ignore_ascii_case("bearer") && key.starts_with("sk_"))?;
    Some(prefix.to_string())
}

/// Who is calling, however they proved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The admin token, or a session made with it: every tenant.
    Admin,
    Tenant(String),
}

/// Resolve the caller once per request: a bearer key or the admin token, else the console's
/// session cookie (whose writes must carry its CSRF token), else single-user mode.
async fn principal(parts: &mut Parts, st: &AppState) -> Result<Principal, ApiError> {
    if let Some(p) = parts.extensions.get::<Principal>() {
        return Ok(p.clone());
    }
    let p = match bearer(parts) {
        Some(_) if is_admin(parts, st) => Principal::Admin,
        Some(key) => match st.auth.tenant_of(st, key).await? {
            Some(t) => Principal::Tenant(t),
            None => return Err(unauthorized("the API key is not valid (unknown or revoked)")),
        },
        None => match cookie(&parts.headers, SESSION_COOKIE) {
            Some(value) => {
                let s = st.res.console_session(value)
                    .await?
                    .ok_or_else(|| unauthorized("the console session has ended: sign in again"))?;
                let safe = matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS);
                let sent = parts.headers.get("x-csrf-token").and_then(|v| v.to_str().ok());
                let same = sent.is_some_and(|t| constant_time_eq(t.as_bytes(), s.csrf.as_bytes()));
                if !safe && !same {
                    return Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "csrf_failed",
                        "Missing CSRF token",
                        "a write made with the console's session cookie must carry its X-CSRF-Token header",
                    ));
                }
                match s.tenant {
                    Some(t) if !s.admin => Principal::Tenant(t),
                    _ => Principal::Admin,
                }
            }
            None if st.auth.single_user_allowed(st).await? => {
                // On a loopback listener, only requests addressed to this machine: a page whose
                // name is rebound to 127.0.0.1 must not act as the single user.
                let public = st.tasks.config().public_url.as_deref();
                if st.auth.loopback && !super::origin::addressed_locally(&parts.headers, public) {
                    return Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "host_not_allowed",
                        "Host not allowed",
                        "single-user mode answers only requests addressed to this machine (localhost, 127.0.0.1, \
                         [::1]) or to SUBAGENTD_PUBLIC_URL's host; send an API key, or set SUBAGENTD_PUBLIC_URL",
                    ));
                }
                Principal::Tenant(st.tasks.config().tenant.clone())
            }
            None => {
                return Err(unauthorized(
                    "send an API key as `Authorization: Bearer sk_…` (create one with `subagentd keys create --tenant NAME`)",
                ))
            }
        },
    };
    if let Principal::Tenant(t) = &p {
        within_rate(st, t).await?;
    }
    parts.extensions.insert(p.clone());
    Ok(p)
}

/// A tenant's request counts against its rate (when it has one), once per request.
async fn within_rate(st: &AppState, tenant: &str) -> Result<(), ApiError> {
    let limits = st.tasks.limits(tenant).await?;
    let Some(rate) = limits.requests_per_second else { return Ok(()) };
    st.auth
        .rates
        .check(tenant, rate, limits.request_burst)
        .map_err(|wait| super::ratelimit::too_many(tenant, rate, limits.request_burst, wait))
}

/// The caller's tenant. Every read and write is scoped to it.
pub struct Tenant(pub String);

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, ApiError> {
        // The admin token is not a key: as before, it is not a tenant.
        if bearer(parts).is_some() && is_admin(parts, st) {
            return Err(unauthorized("the API key is not valid (unknown or revoked)"));
        }
        match principal(parts, st).await? {
            Principal::Tenant(t) => Ok(Tenant(t)),
            Principal::Admin => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "tenant_required",
                "A tenant is required",
                "this operation acts for one tenant: use that tenant's API key",
            )),
        }
    }
}

/// What the caller may read: one tenant's tasks, or every tenant's (the admin).
pub use crate::tasks::Scope;

impl FromRequestParts<AppState> for Scope {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, ApiError> {
        Ok(match principal(parts, st).await? {
            Principal::Admin => Scope::All,
            Principal::Tenant(t) => Scope::Tenant(t),
        })
    }
}

/// A request carrying the admin token.
pub struct Admin;

pub fn is_admin(parts: &Parts, st: &AppState) -> bool {
    match (&st.tasks.config().admin_token, bearer(parts)) {
        (Some(want), Some(got)) => constant_time_eq(want.as_bytes(), got.as_bytes()),
        _ => false,
    }
}

/// `?tenant=` naming another tenant than the key's: only the admin token chooses a tenant.
pub fn other_tenant() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "tenant_forbidden",
        "Another tenant's",
        "`tenant` names another tenant than the API key's: only the admin token may choose a tenant",
    )
    .with(serde_json::json!({"errors": [{"field": "tenant", "message": "only the admin token may choose a tenant"}]}))
}

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, ApiError> {
        if st.tasks.config().admin_token.is_none() {
            // Without credentials, a challenge as on every route that needs them; with some, the
            // truth: there is no admin API here.
            if bearer(parts).is_none() {
                return Err(unauthorized(
                    "the admin API needs the admin token (and is off here: set SUBAGENTD_ADMIN_TOKEN)",
                ));
            }
            return Err(ApiError::not_found("route (the admin API is off: set SUBAGENTD_ADMIN_TOKEN)"));
        }
        if is_admin(parts, st) {
            Ok(Admin)
        } else {
            Err(unauthorized("the admin API needs `Authorization: Bearer <SUBAGENTD_ADMIN_TOKEN>`"))
        }
    }
}

/// The caller of `/usage`: the admin (any tenant) or a tenant.
pub enum Caller {
    Admin,
    Tenant(String),
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, ApiError> {
        Ok(match principal(parts, st).await? {
            Principal::Admin => Caller::Admin,
            Principal::Tenant(t) => Caller::Tenant(t),
        })
    }
}
