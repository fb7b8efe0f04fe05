//! `GET /metrics` (Prometheus text format) and the HTTP request metrics middleware.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::error::ApiError;
use super::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/metrics", get(render))
}

async fn render(State(st): State<AppState>) -> Result<Response, ApiError> {
    st.res.set_gauges().await?;
    let body = crate::telemetry::prometheus().render();
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response())
}

/// Count and time every request by method, route template and status.
pub async fn track(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().to_string();
    let route =
        req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_else(|| "unmatched".into());
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    metrics::counter!("subagentd_http_requests_total", "method" => method.clone(), "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("subagentd_http_request_duration_seconds", "method" => method, "route" => route)
        .record(started.elapsed().as_secs_f64());
    resp
}
