//! `GET /tasks/{id}/events`: the task's event log as JSON pages, or live as Server-Sent
//! Events that resume from `Last-Event-ID` without gaps or duplicates (fed by NOTIFY from any
//! replica, backed by the table).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use super::auth::Scope;
use super::error::ApiError;
use super::extract::{ApiQuery, TaskId};
use super::AppState;
use crate::store::{events, tasks};

/// The `retry:` hint sent at the start of every live stream.
const RECONNECT_AFTER: Duration = Duration::from_secs(3);

pub fn router() -> Router<AppState> {
    Router::new().route("/tasks/{id}/events", get(list))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Page {
    #[serde(default)]
    after: Option<i32>,
    #[serde(default)]
    limit: Option<i64>,
}

async fn list(
    State(st): State<AppState>,
    scope: Scope,
    TaskId(id): TaskId,
    ApiQuery(q): ApiQuery<Page>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_param("limit", "must be between 1 and 1000"));
    }
    if q.after.is_some_and(|a| a < 0) {
        return Err(ApiError::bad_param("after", "must be 0 or more"));
    }
    // `Last-Event-ID` means the same on both paths: resume after it (it wins over `after`).
    let resume = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| ApiError::bad_param("Last-Event-ID", "must be an event sequence number"))?,
        ),
        None => None,
    };
    let start = resume.or(q.after).unwrap_or(0);
    let task = tasks::get_in(&st.submit.pool, scope.tenant(), id).await?.ok_or_else(|| ApiError::not_found("task"))?;
    let tenant = task.tenant.clone();
    let wants_stream =
        headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/event-stream"));
    if !wants_stream {
        let rows = events::after(&st.submit.pool, id, start, limit).await?;
        let next = rows.last().map(|e| e.seq).unwrap_or(start);
        return Ok(Json(json!({"events": rows, "next_after": next, "task_status": task.status})).into_response());
    }
    // A finished task's stream has ended for good: a client that reconnects after reading it
    // all (an `EventSource` does, whenever a stream closes) is told to stop with 204.
    if task.is_terminal() && events::after(&st.submit.pool, id, start, 1).await?.is_empty() {
        return Ok(axum::http::StatusCode::NO_CONTENT.into_response());
    }
    let stream = futures_util::stream::unfold((st, tenant, start, false), move |(st, tenant, seq, done)| async move {
        if done {
            return None;
        }
        let mut seq = seq;
        loop {
            // Register before reading, so an event between the read and the wait wakes us.
            let hub = st.submit.hub.clone();
            let waiter = hub.event_waiter(id);
            let rows = match events::after(&st.submit.pool, id, seq, 200).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "event stream read failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            if !rows.is_empty() {
                seq = rows.last().map(|e| e.seq).unwrap_or(seq);
                let batch: Vec<Result<Event, Infallible>> = rows.into_iter().map(to_sse).collect();
                return Some((futures_util::stream::iter(batch), (st, tenant, seq, false)));
            }
            // Nothing new: a finished task has written its last event — but it may have
            // finished between the read above and this check, so read once more before ending.
            match tasks::get(&st.submit.pool, &tenant, id).await {
                Ok(Some(t)) if t.is_terminal() => {
                    let tail = events::after(&st.submit.pool, id, seq, 1000).await.unwrap_or_default();
                    if tail.is_empty() {
                        return None;
                    }
                    seq = tail.last().map(|e| e.seq).unwrap_or(seq);
                    let batch: Vec<Result<Event, Infallible>> = tail.into_iter().map(to_sse).collect();
                    return Some((futures_util::stream::iter(batch), (st, tenant, seq, true)));
                }
                Ok(None) => return None,
                _ => {}
            }
            tokio::select! {
                _ = waiter.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = st.shutdown.cancelled() => return None,
            }
        }
    });
    // How long a client waits before it reconnects, should the stream drop while the task runs.
    let hint = futures_util::stream::once(async { Ok(Event::default().retry(RECONNECT_AFTER)) });
    let flat = futures_util::StreamExt::chain(hint, futures_util::StreamExt::flatten(stream));
    Ok(Sse::new(flat).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response())
}

fn to_sse(e: events::EventRow) -> Result<Event, Infallible> {
    let data = json!({"seq": e.seq, "kind": e.kind, "data": e.data, "created_at": e.created_at});
    Ok(Event::default().id(e.seq.to_string()).event(e.kind).data(data.to_string()))
}
