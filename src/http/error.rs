//! The one error type at the edge: RFC 9457 `application/problem+json` with a stable code,
//! and the mapping of every domain error (`TaskError`, `resources::Error`, `BudgetError`,
//! `ToolError`) to it.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::budget::BudgetError;
use crate::tasks::TaskError;
use crate::tools::ToolError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// Stable machine-readable code; the problem `type` is `/problems/<code>`.
    pub code: &'static str,
    pub title: &'static str,
    pub detail: String,
    /// Extension members (e.g. `errors`, `available`).
    pub extra: Value,
    pub headers: Vec<(header::HeaderName, HeaderValue)>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        ApiError { status, code, title, detail: detail.into(), extra: Value::Null, headers: vec![] }
    }

    pub fn with(mut self, extra: Value) -> Self {
        self.extra = extra;
        self
    }

    /// 422 naming the field at fault.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            "The request is not valid",
            format!("{field}: {message}"),
        )
        .with(json!({"errors": [{"field": field, "message": message}]}))
    }

    /// 400 for a bad query or path parameter.
    pub fn bad_param(field: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_parameter",
            "A parameter is not valid",
            format!("{field}: {message}"),
        )
        .with(json!({"errors": [{"field": field, "message": message}]}))
    }

    pub fn not_found(what: &str) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", "Not found", format!("no such {what}"))
    }

    pub fn internal() -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            "an internal error occurred; it has been logged",
        )
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable", detail)
            .header(header::RETRY_AFTER, HeaderValue::from_static("1"))
    }

    pub fn header(mut self, name: header::HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }
}

/// A failure below the room: the database away (503), a value it cannot store (422: bad input
/// that validation did not catch), or the service's own (500).
fn below(unavailable: bool, bad_value: bool, e: &dyn std::fmt::Display) -> ApiError {
    if unavailable {
        tracing::warn!(error = %e, "database unavailable");
        return ApiError::unavailable("the database is unavailable; retry shortly");
    }
    if bad_value {
        tracing::warn!(error = %e, "input rejected by the database");
        return ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            "The request is not valid",
            "a value in the request cannot be stored (out of range or malformed)",
        );
    }
    tracing::error!(error = %e, "store error");
    ApiError::internal()
}

impl From<crate::resources::Error> for ApiError {
    fn from(e: crate::resources::Error) -> Self {
        use crate::resources::Error;
        match e {
            Error::Invalid { field, message } => ApiError::invalid(&field, message),
            Error::NotFound(what) => ApiError::not_found(what),
            Error::ReadOnly(detail) => {
                ApiError::new(StatusCode::CONFLICT, "definition_read_only", "Read-only definition", detail)
            }
            Error::TooLarge { code, detail } => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, code, "Too large", detail),
            Error::MediaType(detail) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "Unsupported media type",
                detail,
            ),
            Error::Budget(b) => b.into(),
            Error::Tool(t) => t.into(),
            Error::Task(t) => t.into(),
        }
    }
}

impl From<BudgetError> for ApiError {
    fn from(e: BudgetError) -> Self {
        match e {
            BudgetError::Invalid { field, message } => ApiError::invalid(field, message),
            BudgetError::QueueFull { max, queued, detail } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "queue_limit_reached", "Limit reached", detail)
                    .with(json!({"limit": "max_queued", "value": max, "current": queued}))
                    .header(header::RETRY_AFTER, HeaderValue::from_static("5"))
            }
            BudgetError::ScheduledFull { max, scheduled, detail } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "scheduled_limit_reached", "Limit reached", detail)
                    .with(json!({"limit": "max_scheduled", "value": max, "current": scheduled}))
                    .header(header::RETRY_AFTER, HeaderValue::from_static("60"))
            }
            BudgetError::Exhausted { limit, value, current, detail } => {
                ApiError::new(StatusCode::PAYMENT_REQUIRED, "budget_exhausted", "Budget exhausted", detail)
                    .with(json!({"limit": limit, "value": value, "current": current}))
            }
            BudgetError::Store(e) => below(e.is_unavailable(), e.is_bad_value(), &e),
        }
    }
}

impl From<ToolError> for ApiError {
    fn from(e: ToolError) -> Self {
        match e {
            ToolError::Invalid { field, message } => ApiError::invalid(&field, message),
            other => {
                tracing::error!(error = %other, "tool error");
                ApiError::internal()
            }
        }
    }
}

impl From<TaskError> for ApiError {
    fn from(e: TaskError) -> Self {
        let detail = e.to_string();
        match e {
            TaskError::Invalid { field, message } => ApiError::invalid(&field, message),
            TaskError::BadParam { field, message } => ApiError::bad_param(&field, message),
            TaskError::RecursionRefused { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "recursion_refused",
                "Sub-agents cannot start sub-agents",
                detail,
            )
            .with(json!({"max_depth": 1})),
            TaskError::ModelRequired => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "model_required",
                "No model given",
                "name a model as `provider/model` (or an alias) in `model`, in the agent definition, or configure \
                 SUBAGENTD_DEFAULT_MODEL; there is no silent fallback",
            ),
            TaskError::UnknownModel { detail, providers } => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "unknown_model", "Unknown model", detail)
                    .with(json!({"errors": [{"field": "model", "message": "unknown model"}], "providers": providers}))
            }
            TaskError::UnknownAgent { name, available } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown_subagent_type",
                "Unknown sub-agent type",
                format!("subagent_type: {name:?} is not a known agent type; available: {}", available.join(", ")),
            )
            .with(json!({"errors": [{"field": "subagent_type", "message": "unknown agent type"}], "available": available})),
            TaskError::NotTerminal { id, status } => ApiError::new(
                StatusCode::CONFLICT,
                "task_not_terminal",
                "Task still running",
                format!("resume_from: task {id} is {status}; only a finished task can be resumed"),
            ),
            TaskError::UnpricedModel { model, limits } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unpriced_model",
                "Model has no price",
                format!(
                    "model: {model:?} has no price, so the limits in USD ({}) cannot hold it; configure its price \
                     under [pricing], or give the tenant a token limit (tokens_per_day) or the task max_tokens",
                    limits.join(", ")
                ),
            )
            .with(json!({"errors": [{"field": "model", "message": "model has no price"}], "limits": limits})),
            TaskError::IdempotencyConflict { task_id } => ApiError::new(
                StatusCode::CONFLICT,
                "idempotency_conflict",
                "Idempotency key reused",
                "this Idempotency-Key was used with a different request",
            )
            .with(json!({"task_id": task_id})),
            TaskError::NotFound => ApiError::not_found("task"),
            TaskError::ScheduleNotFound => ApiError::not_found("schedule"),
            TaskError::NotPaused { .. } => {
                ApiError::new(StatusCode::CONFLICT, "task_not_paused", "Task is not waiting", detail)
            }
            TaskError::UnknownAction { index, id } => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "unknown_action", "Unknown action", detail).with(
                    json!({"errors": [{"field": format!("[{index}].id"), "message": "unknown action"}], "action_id": id}),
                )
            }
            TaskError::WrongActionKind { index, id, .. } => {
                let wants = detail.split_once(" waits for ").map_or("", |(_, w)| w).to_string();
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "wrong_action_kind", "Wrong kind of answer", detail)
                    .with(json!({"errors": [{"field": format!("[{index}]"), "message": format!("waits for {wants}")}],
                                 "action_id": id}))
            }
            TaskError::ActionAnswered { id, .. } => {
                ApiError::new(StatusCode::CONFLICT, "action_already_answered", "Action already answered", detail)
                    .with(json!({"action_id": id}))
            }
            TaskError::StreamLimit { limit, current } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "stream_limit_reached", "Stream limit reached", detail)
                    .with(json!({"limit": limit, "current": current}))
                    .header(header::RETRY_AFTER, HeaderValue::from_static("5"))
                    .header(header::CONNECTION, HeaderValue::from_static("close"))
            }
            TaskError::Budget(b) => b.into(),
            TaskError::Store(s) => below(s.is_unavailable(), s.is_bad_value(), &s),
            TaskError::Internal(m) => {
                tracing::error!(error = %m, "task operation failed");
                ApiError::internal()
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({
            "type": format!("/problems/{}", self.code),
            "code": self.code,
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        if let (Value::Object(b), Value::Object(x)) = (&mut body, self.extra) {
            b.extend(x);
        }
        let mut resp = (self.status, body.to_string()).into_response();
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        for (k, v) in self.headers {
            h.insert(k, v);
        }
        resp
    }
}
