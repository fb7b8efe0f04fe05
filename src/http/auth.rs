//! Who is calling: API keys (`Authorization: Bearer sk_…`) map to tenants; single-user mode
//! gives every request the configured tenant; the admin token guards `/admin/…`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};

use super::error::ApiError;
use super::AppState;
use crate::store::tenants;

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
}

impl Auth {
    pub fn new(mode: Mode, loopback: bool) -> Auth {
        Auth { mode, loopback, keys: Mutex::default(), any_keys: Mutex::default() }
    }

    /// Forget cached answers (after a key is created or revoked here).
    pub fn forget(&self) {
        self.keys.lock().unwrap_or_else(|e| e.into_inner()).clear();
        *self.any_keys.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    async fn single_user_allowed(&self, st: &AppState) -> Result<bool, ApiError> {
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
                let any = tenants::any_active_key(&st.pool).await?;
                *self.any_keys.lock().unwrap_or_else(|e| e.into_inner()) = Some((any, Instant::now()));
                Ok(!any)
            }
        }
    }

    async fn tenant_of(&self, st: &AppState, key: &str) -> Result<Option<String>, ApiError> {
        if let Some((t, at)) = self.keys.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
            if at.elapsed() < CACHE_TTL {
                return Ok(Some(t.clone()));
            }
        }
        let t = tenants::tenant_of_key(&st.pool, key).await?;
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

/// The caller's tenant. Every read and write is scoped to it.
pub struct Tenant(pub String);

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, ApiError> {
        match bearer(parts) {
            Some(key) => match st.auth.tenant_of(st, key).await? {
                Some(t) => Ok(Tenant(t)),
                None => Err(unauthorized("the API key is not valid (unknown or revoked)")),
            },
            None if st.auth.single_user_allowed(st).await? => Ok(Tenant(st.cfg.tenant.clone())),
            None => Err(unauthorized(
                "send an API key as `Authorization: Bearer sk_…` (create one with `subagentd keys create --tenant NAME`)",
            )),
        }
    }
}

/// A request carrying the admin token.
pub struct Admin;

pub fn is_admin(parts: &Parts, st: &AppState) -> bool {
    match (&st.cfg.admin_token, bearer(parts)) {
        (Some(want), Some(got)) => tenants::constant_time_eq(want.as_bytes(), got.as_bytes()),
        _ => false,
    }
}

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, ApiError> {
        if st.cfg.admin_token.is_none() {
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
        if is_admin(parts, st) {
            return Ok(Caller::Admin);
        }
        Ok(Caller::Tenant(Tenant::from_request_parts(parts, st).await?.0))
    }
}
