//! `/healthz` (the process is up) and `/readyz` (the database is reachable and migrated, and the
//! replica below 90% of its connection cap).

use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use crate::resources::health::Readiness;

pub fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz))
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn readyz(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    // Near its connection cap a replica is not ready for more (a load balancer sends elsewhere);
    // it is still alive (`/healthz`).
    if st.conns.crowded() {
        return Err(ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "at_capacity",
            "At capacity",
            format!(
                "this replica serves {} connections, at or above 90% of its cap of {}",
                st.conns.open(),
                st.conns.cap
            ),
        )
        .header(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1")));
    }
    match st.res.readiness(Duration::from_secs(1)).await {
        Readiness::Ready { listener } => Ok(Json(json!({"status": "ready", "listener": listener}))),
        Readiness::Unmigrated => {
            Err(ApiError::unavailable("database migrations are not applied (run `subagentd migrate`)"))
        }
        Readiness::Unreachable(Some(e)) => {
            tracing::warn!(error = %e, "readiness check failed");
            Err(ApiError::unavailable("the database is not reachable"))
        }
        Readiness::Unreachable(None) => Err(ApiError::unavailable("the database did not answer within 1 s")),
    }
}
