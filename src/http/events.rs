//! `GET /tasks/{id}/events`: the task's event log (the room's `feed`) as JSON pages, or live as
//! Server-Sent Events that resume from `Last-Event-ID` without gaps or duplicates, with the
//! run's text as it streams (`output_delta`, live only).

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
use crate::tasks::feed::Item;

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
    crate::tasks::feed::checked(q.after, q.limit)?;
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
    let after = resume.or(q.after);
    let wants_stream =
        headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/event-stream"));
    if !wants_stream {
        return Ok(Json(st.tasks.events(&scope, id, after, q.limit).await?).into_response());
    }
    // A finished task's stream has ended for good: a client that reconnects after reading it
    // all (an `EventSource` does, whenever a stream closes) is told to stop with 204.
    let Some(feed) = st.tasks.follow(&scope, id, after).await? else {
        return Ok(axum::http::StatusCode::NO_CONTENT.into_response());
    };
    // How long a client waits before it reconnects, should the stream drop while the task runs.
    let hint = futures_util::stream::once(async { Ok(Event::default().retry(RECONNECT_AFTER)) });
    let events = futures_util::StreamExt::map(feed, to_sse);
    let flat = futures_util::StreamExt::chain(hint, events);
    Ok(Sse::new(flat).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response())
}

/// A stored event with its `id:` (its seq, to resume after); the run's text as it streams as
/// `output_delta`, with no `id:` — it is not in the log, and a client that reconnects resumes
/// the log after the last event it had.
fn to_sse(item: Item) -> Result<Event, Infallible> {
    Ok(match item {
        Item::Event(e) => {
            let data = json!({"seq": e.seq, "kind": e.kind, "data": e.data, "created_at": e.created_at});
            Event::default().id(e.seq.to_string()).event(e.kind.as_str()).data(data.to_string())
        }
        Item::Output(d) => Event::default().event("output_delta").data(json!(d).to_string()),
    })
}
