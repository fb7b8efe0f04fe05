//! The REST door: one module per resource, merged here with the tower layers. Handlers route,
//! extract and shape views; a task's lifecycle is the room's (`tasks`: one call per handler),
//! every other resource's rules and queries are `resources`'s, and `error` maps every error to
//! problem+json. No handler reaches the pool, SQL or `store`.
//!
//! May import: `tasks`, `resources`, `a2a`, `kinds`, `budget`, `engine`, `tools`, `config`,
//! `cache`, `console`, `telemetry` (the code map in ARCHITECTURE.md, held by a test). Not
//! `jobs`: the room is the way to a task.

pub mod a2a;
pub mod admin;
pub mod agents;
pub mod auth;
pub mod capacity;
pub mod console;
pub mod error;
pub mod events;
pub mod extract;
pub mod health;
pub mod jsonrpc;
pub mod mcp;
pub mod metrics;
pub mod origin;
pub mod overview;
pub mod ratelimit;
pub mod schedules;
pub mod serve;
pub mod tasks;
pub mod tools;
pub mod usage;
pub mod workspaces;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::Router;
use tower_http::trace::TraceLayer;

use error::ApiError;

/// What every handler shares. One `Arc`: the router clones the state for every request, and
/// that is one increment.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    /// The lifecycle room: every operation on a task.
    pub tasks: crate::tasks::Lifecycle,
    /// Every other resource's operations (keys and tenants, agents, tools, usage, the overview,
    /// sessions, readiness).
    pub res: crate::resources::Resources,
    pub auth: auth::Auth,
    /// The connections this replica serves now, against its cap.
    pub conns: Arc<capacity::Connections>,
    /// MCP sessions as last read (a session is fixed once made; a replica that ended one forgets
    /// it at once, the others within seconds).
    pub mcp_sessions: crate::cache::TtlCache<crate::resources::sessions::McpSession>,
}

impl AppState {
    pub fn new(
        tasks: crate::tasks::Lifecycle,
        res: crate::resources::Resources,
        auth: auth::Auth,
        conns: Arc<capacity::Connections>,
    ) -> Self {
        let mcp_sessions = crate::cache::TtlCache::new(std::time::Duration::from_secs(5));
        AppState(Arc::new(Shared { tasks, res, auth, conns, mcp_sessions }))
    }
}

impl AppState {
    /// The lifecycle room, named where a door follows a task.
    pub fn room(&self) -> &crate::tasks::Lifecycle {
        &self.0.tasks
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

pub use auth::Tenant;

pub fn router(state: AppState) -> Router {
    let limit = state.tasks.config().max_body_bytes;
    // No deadline for bodies when connections may idle forever (the timeout set to 0).
    let deadline = state.tasks.config().http_idle_timeout().map(extract::BodyDeadline);
    let app = Router::new()
        .merge(tasks::router())
        .merge(agents::router())
        .merge(schedules::router())
        .merge(workspaces::router())
        .merge(tools::router())
        .merge(usage::router())
        .merge(events::router())
        .merge(metrics::router())
        .merge(overview::router())
        .merge(admin::router())
        .merge(health::router())
        .merge(console::router())
        .merge(mcp::router(state.clone()))
        .merge(a2a::router(state.clone()))
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
        .layer(DefaultBodyLimit::max(limit));
    let app = match deadline {
        Some(d) => app.layer(axum::Extension(d)),
        None => app,
    };
    app.layer(TraceLayer::new_for_http()).with_state(state)
}
