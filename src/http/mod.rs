//! The HTTP API: one module per resource, merged here with the tower layers. Handlers route,
//! extract and shape views; the work is done below (`submit`, `budget`, `store`, …), whose
//! errors `error` maps to problem+json.
//!
//! May import every module below it: `submit`, `jobs`, `budget`, `engine`, `tools`, `llm`,
//! `store`, `view`, `config`, `telemetry`, `cache`.

pub mod admin;
pub mod agents;
pub mod auth;
pub mod console;
pub mod error;
pub mod events;
pub mod extract;
pub mod health;
pub mod metrics;
pub mod overview;
pub mod ratelimit;
pub mod tasks;
pub mod tools;
pub mod usage;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
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
    /// Shared: the router clones the state for every request.
    pub providers: Arc<Providers>,
    pub file_agents: Arc<FileAgents>,
    pub auth: Arc<auth::Auth>,
    /// Tenants' limits as last read (a tenant row exists for each entry), for admission.
    pub limits_cache: Arc<crate::cache::TtlCache<crate::budget::Limits>>,
    /// Tenants' available tools (catalog and MCP), for admission.
    pub tools_cache: Arc<crate::cache::TtlCache<Vec<crate::tools::ToolDef>>>,
    /// The guarded client and limits for calls to tenant-supplied URLs.
    pub tool_caller: crate::tools::Caller,
    /// Fired when the server drains: waiting requests answer 202 at once.
    pub shutdown: CancellationToken,
    /// Submission (sharing the handles above), with this process's worker if it runs one.
    pub submit: crate::submit::Submitter,
}

pub use auth::Tenant;

pub fn router(state: AppState) -> Router {
    let limit = state.cfg.max_body_bytes;
    Router::new()
        .merge(tasks::router())
        .merge(agents::router())
        .merge(tools::router())
        .merge(usage::router())
        .merge(events::router())
        .merge(metrics::router())
        .merge(overview::router())
        .merge(admin::router())
        .merge(health::router())
        .merge(console::router())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "route_not_found", "Not found", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "Method not allowed",
                "this route does not accept that method",
            )
        })
        .layer(axum::middleware::from_fn(metrics::track))
        .layer(DefaultBodyLimit::max(limit))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
