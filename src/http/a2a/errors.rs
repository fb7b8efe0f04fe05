//! The errors A2A names, each as both bindings show it: a JSON-RPC error (HTTP 200, `data` an
//! array holding a `google.rpc.ErrorInfo`) and an HTTP+JSON `google.rpc.Status` with its HTTP
//! status. The room's refusals map onto them, their own code kept in the ErrorInfo's metadata.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::super::error::ApiError;
use super::super::jsonrpc::{self, RpcError};
use crate::budget::BudgetError;
use crate::tasks::TaskError;

/// An error of the A2A spec's table (§5.4), and the JSON-RPC ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    TaskNotFound,
    TaskNotCancelable,
    UnsupportedOperation,
    ContentTypeNotSupported,
    VersionNotSupported,
    Parse,
    InvalidRequest,
    MethodNotFound,
    InvalidParams,
    Internal,
}

impl Kind {
    pub fn code(self) -> i64 {
        match self {
            Kind::TaskNotFound => -32001,
            Kind::TaskNotCancelable => -32002,
            Kind::UnsupportedOperation => -32004,
            Kind::ContentTypeNotSupported => -32005,
            Kind::VersionNotSupported => -32009,
            Kind::Parse => jsonrpc::PARSE_ERROR,
            Kind::InvalidRequest => jsonrpc::INVALID_REQUEST,
            Kind::MethodNotFound => jsonrpc::METHOD_NOT_FOUND,
            Kind::InvalidParams => jsonrpc::INVALID_PARAMS,
            Kind::Internal => jsonrpc::INTERNAL_ERROR,
        }
    }

    fn http(self) -> StatusCode {
        match self {
            Kind::TaskNotFound | Kind::MethodNotFound => StatusCode::NOT_FOUND,
            Kind::ContentTypeNotSupported => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    fn grpc(self) -> &'static str {
        match self {
            Kind::TaskNotFound | Kind::MethodNotFound => "NOT_FOUND",
            Kind::ContentTypeNotSupported | Kind::Parse | Kind::InvalidRequest | Kind::InvalidParams => {
                "INVALID_ARGUMENT"
            }
            Kind::Internal => "INTERNAL",
            _ => "FAILED_PRECONDITION",
        }
    }

    /// The ErrorInfo reason: the error's name in UPPER_SNAKE_CASE, without "Error".
    fn reason(self) -> &'static str {
        match self {
            Kind::TaskNotFound => "TASK_NOT_FOUND",
            Kind::TaskNotCancelable => "TASK_NOT_CANCELABLE",
            Kind::UnsupportedOperation => "UNSUPPORTED_OPERATION",
            Kind::ContentTypeNotSupported => "CONTENT_TYPE_NOT_SUPPORTED",
            Kind::VersionNotSupported => "VERSION_NOT_SUPPORTED",
            Kind::Parse => "PARSE_ERROR",
            Kind::InvalidRequest => "INVALID_REQUEST",
            Kind::MethodNotFound => "METHOD_NOT_FOUND",
            Kind::InvalidParams => "INVALID_PARAMS",
            Kind::Internal => "INTERNAL_ERROR",
        }
    }
}

/// An error to answer with: its kind, a message, the ErrorInfo's metadata (strings), and, for
/// one that is not the protocol's (a 401, a 429, a 503 from the HTTP layer), its own status
/// and headers.
#[derive(Debug)]
pub struct A2aError {
    pub kind: Kind,
    pub message: String,
    pub metadata: Value,
    pub transport: Option<(StatusCode, Vec<(header::HeaderName, HeaderValue)>)>,
    /// The HTTP+JSON binding's status where it is not the kind's (a conflict: 409); the JSON-RPC
    /// binding answers 200 with the error as ever.
    pub rest_status: Option<StatusCode>,
}

impl A2aError {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        A2aError { kind, message: message.into(), metadata: json!({}), transport: None, rest_status: None }
    }

    pub fn params(message: impl Into<String>) -> Self {
        A2aError::new(Kind::InvalidParams, message)
    }

    pub fn not_found() -> Self {
        A2aError::new(Kind::TaskNotFound, "task not found")
    }

    pub fn internal() -> Self {
        A2aError::new(Kind::Internal, "internal error; it has been logged")
    }

    /// Answered with HTTP 400, not 200 (a body that is no JSON-RPC request at all).
    pub fn bad_request(mut self) -> Self {
        self.transport = Some((StatusCode::BAD_REQUEST, vec![]));
        self
    }

    pub fn meta(mut self, key: &str, value: impl Into<String>) -> Self {
        self.metadata[key] = Value::String(value.into());
        self
    }

    fn info(&self) -> Value {
        json!({"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": self.kind.reason(),
               "domain": "a2a-protocol.org", "metadata": self.metadata})
    }

    /// As a JSON-RPC error object.
    pub fn rpc(&self) -> RpcError {
        RpcError::new(self.kind.code(), self.message.clone()).with(json!([self.info()]))
    }

    /// As a JSON-RPC response to request `id`: HTTP 200, or the transport's own status.
    pub fn rpc_response(&self, id: Option<&Value>) -> Response {
        let status = self.transport.as_ref().map_or(StatusCode::OK, |t| t.0);
        self.respond(status, jsonrpc::error(id, &self.rpc()))
    }

    /// As the HTTP+JSON binding's `google.rpc.Status` body.
    pub fn status_body(&self) -> Value {
        let (status, grpc) = match self.transport.as_ref().map(|t| t.0).or(self.rest_status) {
            Some(s) => (s, grpc_of(s)),
            None => (self.kind.http(), self.kind.grpc()),
        };
        json!({"error": {"code": status.as_u16(), "status": grpc, "message": self.message, "details": [self.info()]}})
    }

    pub fn rest_response(&self) -> Response {
        let status = self.transport.as_ref().map(|t| t.0).or(self.rest_status).unwrap_or(self.kind.http());
        self.respond(status, self.status_body())
    }

    fn respond(&self, status: StatusCode, body: Value) -> Response {
        let mut r = (status, body.to_string()).into_response();
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        for (k, v) in self.transport.iter().flat_map(|t| t.1.iter()) {
            r.headers_mut().insert(k.clone(), v.clone());
        }
        r
    }
}

/// The gRPC status name of an HTTP status the HTTP layer answers with.
fn grpc_of(s: StatusCode) -> &'static str {
    match s.as_u16() {
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        408 => "DEADLINE_EXCEEDED",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        500..=599 => "INTERNAL",
        _ => "INVALID_ARGUMENT",
    }
}

/// An error of the HTTP layer (authentication, the rate limit, a body too large or too slow):
/// its status and headers kept, its body in the binding's shape.
impl From<ApiError> for A2aError {
    fn from(e: ApiError) -> Self {
        let kind = if e.status.is_server_error() { Kind::Internal } else { Kind::InvalidRequest };
        let mut a = A2aError::new(kind, e.detail.clone()).meta("code", e.code);
        a.transport = Some((e.status, e.headers));
        a
    }
}

/// The room's refusals: a task of no one's (or another tenant's) is not found; a value of the
/// request that cannot be taken is invalid params, naming it; an operation the task's state
/// does not allow is unsupported. Admission refusals are not errors here (the door answers a
/// rejected task); the hold limit is a 429, as at the REST door.
impl From<TaskError> for A2aError {
    fn from(e: TaskError) -> Self {
        let code = e.code();
        let message = e.to_string();
        let kind = match &e {
            TaskError::NotFound | TaskError::ScheduleNotFound => return A2aError::not_found(),
            TaskError::Invalid { .. }
            | TaskError::BadParam { .. }
            | TaskError::ModelRequired
            | TaskError::UnknownModel { .. }
            | TaskError::UnknownAgent { .. }
            | TaskError::UnpricedModel { .. }
            | TaskError::IdempotencyConflict { .. }
            | TaskError::UnknownAction { .. }
            | TaskError::WrongActionKind { .. }
            | TaskError::ActionAnswered { .. }
            | TaskError::Budget(BudgetError::Invalid { .. }) => Kind::InvalidParams,
            TaskError::RecursionRefused { .. } | TaskError::NotTerminal { .. } | TaskError::NotPaused { .. } => {
                Kind::UnsupportedOperation
            }
            TaskError::StreamLimit { .. }
            | TaskError::Budget(
                BudgetError::QueueFull { .. } | BudgetError::ScheduledFull { .. } | BudgetError::Exhausted { .. },
            ) => {
                return A2aError::from(ApiError::from(e));
            }
            TaskError::Budget(BudgetError::Store(_)) | TaskError::Store(_) | TaskError::Internal(_) => {
                if e.is_client_error() {
                    Kind::InvalidParams
                } else if code == "unavailable" {
                    return A2aError::from(ApiError::from(e));
                } else {
                    tracing::error!(error = %e, "A2A request failed");
                    return A2aError::internal();
                }
            }
        };
        let mut a = A2aError::new(kind, message).meta("code", code);
        // A messageId used again with another message: a conflict, as at the REST door.
        if let TaskError::IdempotencyConflict { task_id } = &e {
            a = a.meta("taskId", task_id.to_string());
            a.rest_status = Some(StatusCode::CONFLICT);
        }
        if let TaskError::Invalid { field, .. } | TaskError::BadParam { field, .. } = &e {
            a = a.meta("field", field.clone());
        }
        a
    }
}
