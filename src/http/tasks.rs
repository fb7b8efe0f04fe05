//! `/tasks`: submit (through `submit`), read, list, wait, cancel — routing, extraction and
//! views only.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::auth::Scope;
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery, TaskId};
use super::{AppState, Tenant};
use crate::engine::agents::AgentType;
use crate::store::tasks::{self, ListFilter, TaskRow, TaskStatus};
use crate::submit::{Submission, Submitted, TaskRequest};
pub use crate::view::TaskView;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/tasks", post(create).get(list))
        .route("/tasks/{id}", get(read))
        .route("/tasks/{id}/cancel", post(cancel))
        .route("/tasks/{id}/actions", post(answer))
        .route("/tasks/cancel", post(cancel_bulk))
}

const MAX_IDEMPOTENCY_KEY: usize = 255;

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
        if self.wait != Some(true) {
            return Ok(None);
        }
        let secs = self
            .timeout
            .unwrap_or(st.submit.cfg.wait_default_seconds as f64)
            .min(st.submit.cfg.wait_max_seconds as f64);
        Ok(Some(Duration::from_secs_f64(secs)))
    }
}

fn location(id: Uuid) -> HeaderValue {
    HeaderValue::from_str(&format!("/tasks/{id}")).unwrap_or_else(|_| HeaderValue::from_static("/tasks"))
}

/// The task as the API shows it (a paused one with its pending actions).
async fn respond(st: &AppState, status: StatusCode, row: TaskRow) -> Result<Response, ApiError> {
    let loc = location(row.id);
    let mut resp = (status, Json(TaskView::one(&st.submit.pool, row).await?)).into_response();
    if matches!(status, StatusCode::CREATED | StatusCode::ACCEPTED) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(resp)
}

/// Refuse calls made from inside a sub-agent's tool: sub-agents are one level deep.
fn check_depth(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(v) = headers.get("subagent-depth") else {
        return Ok(());
    };
    let depth: u32 = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| ApiError::bad_param("Subagent-Depth", "must be a non-negative integer"))?;
    if depth >= 1 {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "recursion_refused",
            "Sub-agents cannot start sub-agents",
            format!(
                "this request comes from inside a sub-agent (Subagent-Depth: {depth}); sub-agents are one level deep"
            ),
        )
        .with(json!({"max_depth": 1})));
    }
    Ok(())
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let k = v.to_str().map_err(|_| ApiError::bad_param("Idempotency-Key", "must be visible ASCII"))?.trim();
    if k.is_empty() || k.len() > MAX_IDEMPOTENCY_KEY {
        return Err(ApiError::bad_param("Idempotency-Key", format!("must be 1 to {MAX_IDEMPOTENCY_KEY} characters")));
    }
    Ok(Some(k.to_string()))
}

async fn create(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(q): ApiQuery<WaitQuery>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<TaskRequest>,
) -> Result<Response, ApiError> {
    check_depth(&headers)?;
    let wait = q.wait_for(&st)?;
    let idempotency_key = idempotency_key(&headers)?;
    // W3C: an invalid traceparent is ignored, not an error.
    let traceparent =
        headers.get("traceparent").and_then(|v| v.to_str().ok()).and_then(crate::telemetry::parse_traceparent);
    let id = Uuid::now_v7();
    // Registered before the insert: the inserted row then needs no second read before waiting.
    let early = wait.map(|_| st.submit.hub.waiter(id));
    let api_key = super::auth::key_prefix(&headers);
    let s = Submission {
        id,
        tenant: tenant.clone(),
        request,
        idempotency_key,
        traceparent,
        waiting: wait.is_some(),
        api_key,
    };
    let (row, created) = match st.submit.submit(s).await? {
        Submitted::Created(r) => (r, true),
        Submitted::Existing(r) => (r, false),
    };
    let ok = if created { StatusCode::CREATED } else { StatusCode::OK };
    match (wait, early) {
        (None, _) => respond(&st, ok, row).await,
        (Some(d), Some(waiter)) if created => wait_on(&st, Some(&tenant), row, d, waiter).await,
        (Some(d), _) => waited(&st, Some(&tenant), row, d).await,
    }
}

/// What a waiting request waits for: the task's end, or a pause (the caller may answer it).
fn answered(row: &TaskRow) -> bool {
    row.is_terminal() || row.status == TaskStatus::RequiresAction
}

/// Wait for a task to become terminal or to require action: 200 with the task, or 202 with the
/// task as it stands (and `Location`) when the wait runs out or the server drains.
async fn waited(st: &AppState, tenant: Option<&str>, row: TaskRow, d: Duration) -> Result<Response, ApiError> {
    if answered(&row) {
        return respond(st, StatusCode::OK, row).await;
    }
    let waiter = st.submit.hub.waiter(row.id);
    // Read again: the task may have finished before the waiter was registered.
    let row = tasks::get_in(&st.submit.pool, tenant, row.id).await?.ok_or_else(|| ApiError::not_found("task"))?;
    wait_on(st, tenant, row, d, waiter).await
}

/// `waited`, for a `row` read after `waiter` was registered (so no completion is missed).
async fn wait_on(
    st: &AppState,
    tenant: Option<&str>,
    mut row: TaskRow,
    d: Duration,
    waiter: crate::jobs::hub::Waiter<'_>,
) -> Result<Response, ApiError> {
    let deadline = tokio::time::Instant::now() + d;
    loop {
        if answered(&row) {
            return respond(st, StatusCode::OK, row).await;
        }
        if tokio::time::Instant::now() >= deadline || st.shutdown.is_cancelled() {
            return respond(st, StatusCode::ACCEPTED, row).await;
        }
        let handed = tokio::select! {
            r = waiter.notified() => r,
            _ = tokio::time::sleep_until(deadline) => None,
            _ = st.shutdown.cancelled() => None,
            // A notification lost with a dropped connection costs at most this long.
            _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => None,
        };
        // Finished in this process: the row as its final commit wrote it, with no second read.
        row = match handed.filter(|r| tenant.is_none_or(|t| r.tenant == t)) {
            Some(r) => r,
            None => match tasks::get_in(&st.submit.pool, tenant, row.id).await {
                Ok(r) => r.ok_or_else(|| ApiError::not_found("task"))?,
                // The database is away (a restart): go on waiting on what was last read; the
                // task goes on, and the answer comes when it is back or the wait runs out.
                Err(e) if e.is_unavailable() => row,
                Err(e) => return Err(e.into()),
            },
        };
    }
}

async fn read(
    State(st): State<AppState>,
    scope: Scope,
    TaskId(id): TaskId,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> Result<Response, ApiError> {
    let wait = q.wait_for(&st)?;
    let row = tasks::get_in(&st.submit.pool, scope.tenant(), id).await?.ok_or_else(|| ApiError::not_found("task"))?;
    match wait {
        None => respond(&st, StatusCode::OK, row).await,
        Some(d) => waited(&st, scope.tenant(), row, d).await,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    subagent_type: Option<String>,
    /// `provider/model`.
    #[serde(default)]
    model: Option<String>,
    /// A JSON object the task's metadata must contain.
    #[serde(default)]
    metadata: Option<String>,
    /// The admin's reads: one tenant's tasks (default: every tenant's).
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    created_after: Option<String>,
    #[serde(default)]
    created_before: Option<String>,
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    cursor: Option<String>,
}

fn time_param(field: &str, v: &Option<String>) -> Result<Option<DateTime<Utc>>, ApiError> {
    v.as_deref()
        .map(|s| {
            DateTime::parse_from_rfc3339(s)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|_| ApiError::bad_param(field, format!("{s:?} is not an RFC 3339 timestamp")))
        })
        .transpose()
}

async fn list(
    State(st): State<AppState>,
    scope: Scope,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Response, ApiError> {
    let tenant = match (&scope, &q.tenant) {
        (_, Some(t)) if t.is_empty() => return Err(ApiError::bad_param("tenant", "must not be empty")),
        (Scope::All, t) => t.clone(),
        (Scope::Tenant(_), Some(_)) => {
            return Err(ApiError::bad_param("tenant", "only the admin token may choose a tenant"))
        }
        (Scope::Tenant(t), None) => Some(t.clone()),
    };
    let metadata = match q.metadata.as_deref() {
        None => None,
        Some(m) => match serde_json::from_str::<Value>(m) {
            Ok(v @ Value::Object(_)) => Some(v),
            _ => return Err(ApiError::bad_param("metadata", "must be a JSON object, e.g. {\"batch\":\"a\"}")),
        },
    };
    if q.model.as_deref().is_some_and(str::is_empty) {
        return Err(ApiError::bad_param("model", "must not be empty"));
    }
    let status = q
        .status
        .as_deref()
        .map(|s| {
            TaskStatus::parse(s).ok_or_else(|| {
                let all: Vec<&str> = TaskStatus::ALL.iter().map(|t| t.as_str()).collect();
                ApiError::bad_param("status", format!("{s:?} is not one of {}", all.join(", ")))
            })
        })
        .transpose()?;
    let subagent_type = q.subagent_type.as_deref().map(|t| match AgentType::parse(t) {
        Some(b) => b.as_str().to_string(),
        None => t.to_string(),
    });
    let limit = q.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(ApiError::bad_param("limit", "must be between 1 and 200"));
    }
    let before_id = q
        .cursor
        .as_deref()
        .map(|c| c.parse::<Uuid>().map_err(|_| ApiError::bad_param("cursor", "not a cursor returned by this API")))
        .transpose()?;
    let f = ListFilter {
        status,
        subagent_type,
        model: q.model.clone(),
        metadata,
        created_after: time_param("created_after", &q.created_after)?,
        created_before: time_param("created_before", &q.created_before)?,
        before_id,
        limit: limit + 1,
    };
    let mut rows = tasks::list(&st.submit.pool, tenant.as_deref(), &f).await?;
    let next_cursor = if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        rows.last().map(|r| r.id.to_string())
    } else {
        None
    };
    let tasks: Vec<TaskView> = TaskView::of(&st.submit.pool, rows).await?;
    Ok(Json(json!({"tasks": tasks, "next_cursor": next_cursor})).into_response())
}

async fn cancel(State(st): State<AppState>, scope: Scope, TaskId(id): TaskId) -> Result<Response, ApiError> {
    let row = tasks::cancel(&st.submit.pool, scope.tenant(), id).await?.ok_or_else(|| ApiError::not_found("task"))?;
    // A running task is told through NOTIFY; if its worker is in this process, tell it now.
    if row.status == TaskStatus::Running {
        st.submit.hub.cancel_run(id);
    }
    respond(&st, StatusCode::OK, row).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkCancel {
    /// Among `queued`, `running` and `requires_action` (default: all three).
    #[serde(default)]
    status: Option<Vec<String>>,
    /// Only tasks whose metadata contains this object.
    #[serde(default)]
    metadata: Option<Value>,
}

/// Cancel every task of the caller matching a filter.
async fn cancel_bulk(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiJson(body): ApiJson<BulkCancel>,
) -> Result<Response, ApiError> {
    let statuses: Option<Vec<TaskStatus>> = match body.status {
        None => Some(vec![TaskStatus::Queued, TaskStatus::Running, TaskStatus::RequiresAction]),
        Some(v) if v.is_empty() => None,
        Some(v) => v.iter().map(|s| TaskStatus::parse(s).filter(|t| !t.is_terminal())).collect(),
    };
    let Some(statuses) = statuses else {
        return Err(ApiError::invalid(
            "status",
            "must list `queued`, `running` and/or `requires_action` (terminal tasks cannot be cancelled)",
        ));
    };
    if body.metadata.as_ref().is_some_and(|m| !m.is_object()) {
        return Err(ApiError::invalid("metadata", "must be a JSON object"));
    }
    let f = tasks::CancelFilter { id: None, statuses, metadata: body.metadata };
    let hit = tasks::cancel_matching(&st.submit.pool, &tenant, &f).await?;
    let mut cancelled = vec![];
    let mut requested = vec![];
    for (id, old) in hit {
        if old == TaskStatus::Running {
            st.submit.hub.cancel_run(id);
            requested.push(id);
        } else {
            cancelled.push(id);
        }
    }
    Ok(Json(json!({"cancelled": cancelled, "cancel_requested": requested})).into_response())
}

/// One answer of `POST /tasks/{id}/actions`: a decision for an approval, or an output.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionAnswer {
    id: Uuid,
    #[serde(default)]
    decision: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    output: Option<Value>,
}

const MAX_ANSWERS: usize = 100;
const MAX_MESSAGE_CHARS: usize = 4000;

/// Answer a paused task's pending actions, each by its own id: approve or deny a call, or give
/// the output of a caller tool. Stored before it is acknowledged; the same answer again is
/// accepted; the last answer of a pause queues the task again.
async fn answer(
    State(st): State<AppState>,
    scope: Scope,
    headers: HeaderMap,
    TaskId(id): TaskId,
    ApiJson(body): ApiJson<Vec<ActionAnswer>, true>,
) -> Result<Response, ApiError> {
    use crate::store::actions::{self, Refused};
    if body.is_empty() || body.len() > MAX_ANSWERS {
        return Err(ApiError::invalid("body", format!("must list 1 to {MAX_ANSWERS} answers")));
    }
    let cap = st.submit.cfg.tool_result_max_bytes;
    let mut answers = vec![];
    for (i, a) in body.into_iter().enumerate() {
        let at = |f: &str| format!("[{i}].{f}");
        let decision = match (a.decision.as_deref(), &a.output) {
            (Some("approve"), None) => Some("approve"),
            (Some("deny"), None) => Some("deny"),
            (Some(other), None) => {
                return Err(ApiError::invalid(&at("decision"), format!("{other:?} is not approve or deny")))
            }
            (None, Some(_)) => None,
            _ => return Err(ApiError::invalid(&at("decision"), "give either a decision or an output")),
        };
        if decision.is_none() && a.message.is_some() {
            return Err(ApiError::invalid(&at("message"), "goes with a decision, not an output"));
        }
        if a.message.as_ref().is_some_and(|m| m.chars().count() > MAX_MESSAGE_CHARS || m.contains('\0')) {
            return Err(ApiError::invalid(&at("message"), format!("must be at most {MAX_MESSAGE_CHARS} characters")));
        }
        if let Some(o) = &a.output {
            let size = match o {
                Value::String(s) => s.len(),
                other => other.to_string().len(),
            };
            if size > cap || o.to_string().contains("\\u0000") {
                return Err(ApiError::invalid(
                    &at("output"),
                    format!("must be at most {cap} bytes (SUBAGENTD_TOOL_RESULT_MAX_BYTES), like any tool result"),
                ));
            }
        }
        answers.push(actions::Answer { id: a.id, decision, message: a.message, output: a.output });
    }
    let by = match (&scope, super::auth::key_prefix(&headers)) {
        (Scope::All, _) => "admin".to_string(),
        (Scope::Tenant(_), Some(prefix)) => format!("key:{prefix}"),
        (Scope::Tenant(t), None) => format!("tenant:{t}"),
    };
    let outcome = actions::answer(&st.submit.pool, scope.tenant(), id, &answers, &by).await?;
    let done = match outcome {
        Ok(done) => done,
        Err(Refused::NoTask) => return Err(ApiError::not_found("task")),
        Err(Refused::NotPaused(status)) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "task_not_paused",
                "Task is not waiting",
                format!("the task is {status}: only a task that requires action takes answers"),
            ))
        }
        Err(Refused::Unknown { index, id }) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown_action",
                "Unknown action",
                format!("[{index}].id: {id} is not an action of this task"),
            )
            .with(
                json!({"errors": [{"field": format!("[{index}].id"), "message": "unknown action"}], "action_id": id}),
            ))
        }
        Err(Refused::WrongKind { index, id, kind }) => {
            let wants = if kind == "output" { "an output, not a decision" } else { "a decision, not an output" };
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "wrong_action_kind",
                "Wrong kind of answer",
                format!("[{index}]: action {id} waits for {wants}"),
            )
            .with(json!({"errors": [{"field": format!("[{index}]"), "message": format!("waits for {wants}")}], "action_id": id})));
        }
        Err(Refused::Conflict { index, id, by }) => {
            let why = if by == "expired" {
                "expired (no answer came in time)".to_string()
            } else {
                format!("answered otherwise by {by}")
            };
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "action_already_answered",
                "Action already answered",
                format!("[{index}]: action {id} was {why}"),
            )
            .with(json!({"action_id": id})));
        }
    };
    for a in &answers {
        let kind = a.decision.unwrap_or("output");
        metrics::counter!("subagentd_actions_answered_total", "answer" => kind).increment(1);
    }
    st.submit.hub.publish(crate::store::CH_EVENT, id.to_string());
    if done.left == 0 {
        st.submit.hub.publish(crate::store::CH_QUEUED, String::new());
    }
    let row = tasks::get(&st.submit.pool, &done.tenant, id).await?.ok_or_else(|| ApiError::not_found("task"))?;
    respond(&st, StatusCode::OK, row).await
}
