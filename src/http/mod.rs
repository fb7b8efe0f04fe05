//! The HTTP API: one module per resource, merged here with the tower layers.

pub mod agents;
pub mod error;
pub mod extract;
pub mod health;
pub mod tasks;
pub mod tools;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRequestParts};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::Router;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tower_http::trace::TraceLayer;

use crate::config::Config;
use crate::engine::definitions::FileAgents;
use crate::jobs::hub::Hub;
use crate::llm::Providers;
use error::ApiError;

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub cfg: Arc<Config>,
    pub hub: Arc<Hub>,
    pub providers: Providers,
    pub file_agents: Arc<FileAgents>,
    /// The guarded client and limits for calls to tenant-supplied URLs.
    pub tool_caller: crate::tools::Caller,
    /// Fired when the server drains: waiting requests answer 202 at once.
    pub shutdown: CancellationToken,
}

/// The caller's tenant. Single-user mode: every request belongs to the configured tenant.
pub struct Tenant(pub String);

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(_parts: &mut Parts, st: &AppState) -> Result<Self, ApiError> {
        Ok(Tenant(st.cfg.tenant.clone()))
    }
}

pub fn router(state: AppState) -> Router {
    let limit = state.cfg.max_body_bytes;
    Router::new()
        .merge(tasks::router())
        .merge(agents::router())
        .merge(tools::router())
        .merge(health::router())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "route_not_found", "Not found", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "Method not allowed",
                "this route does not accept that method",
            )
        })
        .layer(DefaultBodyLimit::max(limit))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
