//! `/tasks`: submit, read, list, wait, cancel, answer — each handler extracts the request, makes
//! one call into the lifecycle room (`tasks`) and shapes its answer.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use uuid::Uuid;

use super::auth::{key_prefix, Scope};
use super::error::ApiError;
use super::extract::{ApiAnswers, ApiJson, ApiQuery, TaskId};
use super::{AppState, Tenant};
use crate::kinds::Answerer;
use crate::tasks::answer::ActionAnswer;
use crate::tasks::list::{BulkCancel, ListRequest};
use crate::tasks::{Submission, TaskRequest, TaskView};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/tasks", post(create).get(list))
        .route("/tasks/{id}", get(read))
        .route("/tasks/{id}/cancel", post(cancel))
        .route("/tasks/{id}/actions", post(answer))
        .route("/tasks/{id}/diff", get(diff))
        .route("/tasks/cancel", post(cancel_bulk))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    #[serde(default)]
    wait: Option<bool>,
    #[serde(default)]
    timeout: Option<f64>,
}

impl WaitQuery {
    /// `None` when not waiting.
    fn wait_for(&self, st: &AppState) -> Result<Option<Duration>, ApiError> {
        if let Some(t) = self.timeout {
            if !t.is_finite() || t < 0.0 {
                return Err(ApiError::bad_param("timeout", "must be a number of seconds, 0 or more"));
            }
        }
        Ok((self.wait == Some(true)).then(|| st.tasks.wait_bound(self.timeout)))
    }
}

fn location(id: Uuid) -> HeaderValue {
    HeaderValue::from_str(&format!("/tasks/{id}")).unwrap_or_else(|_| HeaderValue::from_static("/tasks"))
}

/// The task as the API shows it, with `Location` on a 201 or 202.
fn respond(status: StatusCode, task: TaskView) -> Response {
    let loc = location(task.id);
    let mut resp = (status, Json(task)).into_response();
    if matches!(status, StatusCode::CREATED | StatusCode::ACCEPTED) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    resp
}

/// A header as the room takes it; one that is not visible ASCII is refused here.
pub(super) fn header_text(headers: &HeaderMap, name: &str, field: &str) -> Result<Option<String>, ApiError> {
    headers
        .get(name)
        .map(|v| v.to_str().map(str::to_string).map_err(|_| ApiError::bad_param(field, "must be visible ASCII")))
        .transpose()
}

async fn create(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(q): ApiQuery<WaitQuery>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<TaskRequest>,
) -> Result<Response, ApiError> {
    let depth = header_text(&headers, "subagent-depth", "Subagent-Depth")?;
    let wait = q.wait_for(&st)?;
    let s = Submission {
        idempotency_key: header_text(&headers, "idempotency-key", "Idempotency-Key")?,
        depth,
        // W3C: an invalid traceparent is ignored, not an error.
        traceparent: headers.get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_string),
        api_key: key_prefix(&headers),
        ..Submission::new(tenant, request)
    };
    let c = st.tasks.create(s, wait).await?;
    Ok(match (wait, c.settled) {
        (None, _) => respond(if c.created { StatusCode::CREATED } else { StatusCode::OK }, c.task),
        (Some(_), true) => respond(StatusCode::OK, c.task),
        (Some(_), false) => respond(StatusCode::ACCEPTED, c.task),
    })
}

async fn read(
    State(st): State<AppState>,
    scope: Scope,
    TaskId(id): TaskId,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> Result<Response, ApiError> {
    Ok(match q.wait_for(&st)? {
        None => respond(StatusCode::OK, st.tasks.get(&scope, id).await?),
        Some(d) => {
            let j = st.tasks.join(&scope, id, d).await?;
            respond(if j.settled { StatusCode::OK } else { StatusCode::ACCEPTED }, j.task)
        }
    })
}

async fn list(
    State(st): State<AppState>,
    scope: Scope,
    ApiQuery(mut q): ApiQuery<ListRequest>,
) -> Result<Response, ApiError> {
    // A tenant's key may name its own tenant (the default); another's is not its to read.
    if let (Scope::Tenant(t), Some(named)) = (&scope, &q.tenant) {
        if named.is_empty() {
            return Ok(Json(st.tasks.list(&scope, &q).await?).into_response());
        }
        if named != t {
            return Err(super::auth::other_tenant());
        }
        q.tenant = None;
    }
    Ok(Json(st.tasks.list(&scope, &q).await?).into_response())
}

async fn cancel(State(st): State<AppState>, scope: Scope, TaskId(id): TaskId) -> Result<Response, ApiError> {
    Ok(respond(StatusCode::OK, st.tasks.cancel(&scope, id).await?))
}

/// Cancel every task of the caller matching a filter.
async fn cancel_bulk(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiJson(body): ApiJson<BulkCancel>,
) -> Result<Response, ApiError> {
    Ok(Json(st.tasks.cancel_many(&tenant, body).await?).into_response())
}

/// Answer a paused task's pending actions, each by its own id: approve or deny a call, or give
/// the output of a caller tool.
async fn answer(
    State(st): State<AppState>,
    scope: Scope,
    headers: HeaderMap,
    TaskId(id): TaskId,
    ApiAnswers(body): ApiAnswers<Vec<ActionAnswer>>,
) -> Result<Response, ApiError> {
    let by = Answerer::of(&scope, key_prefix(&headers));
    Ok(respond(StatusCode::OK, st.tasks.answer(&scope, &by, id, body).await?))
}

/// The task's diff (`text/x-diff`), or 404 with why there is none.
async fn diff(State(st): State<AppState>, scope: Scope, TaskId(id): TaskId) -> Result<Response, ApiError> {
    use crate::tasks::Diff;
    let why = match st.tasks.diff(&scope, id).await? {
        Diff::Text(t) => return Ok(([(header::CONTENT_TYPE, "text/x-diff; charset=utf-8")], t).into_response()),
        Diff::NoWorkspace => "this task has no workspace, so no diff",
        Diff::ReadOnly => "this task's tools only read its workspace, so no diff",
        Diff::NotYet => "the diff is written when the task's run ends",
        Diff::Purged => "the diff was purged with the task's conversation (retention); its counts stay on the task",
        Diff::NoCopy => "the task ended before its copy of the workspace was made",
    };
    Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", "No diff", why))
}
