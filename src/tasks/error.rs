//! What the lifecycle room refuses, and why: one enum for every operation, each with the stable
//! code a door shows (`code()`: the REST door's problem `code`, the MCP door's error code in
//! its result, the A2A door's reason).

use uuid::Uuid;

use crate::budget::BudgetError;
use crate::kinds::{Answerer, Gate, TaskStatus};
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A value of the request that cannot be taken, naming its field.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// A parameter beside the request (a query parameter, a header) that is not valid.
    #[error("{field}: {message}")]
    BadParam { field: String, message: String },
    /// The request comes from inside a sub-agent (`Subagent-Depth` ≥ 1): sub-agents are one
    /// level deep (invariant 4).
    #[error("this request comes from inside a sub-agent (Subagent-Depth: {depth}); sub-agents are one level deep")]
    RecursionRefused { depth: u32 },
    /// No model in the request, the agent definition or the configuration (invariant 5).
    #[error("no model given")]
    ModelRequired,
    #[error("{detail}")]
    UnknownModel { detail: String, providers: Vec<String> },
    #[error("subagent_type: {name:?} is not a known agent type")]
    UnknownAgent { name: String, available: Vec<String> },
    /// `resume_from` names a task that has not ended.
    #[error("task {id} is {status}")]
    NotTerminal { id: Uuid, status: TaskStatus },
    /// The model has no price, and the task's only limits are in USD.
    #[error("model {model} has no price")]
    UnpricedModel { model: String, limits: Vec<&'static str> },
    #[error("this Idempotency-Key was used with a different request")]
    IdempotencyConflict { task_id: Uuid },
    /// No such task for the caller (another tenant's task is not found either).
    #[error("no such task")]
    NotFound,
    /// No such schedule of the caller's.
    #[error("no such schedule")]
    ScheduleNotFound,
    /// Answers for a task that is not waiting for any.
    #[error("the task is {status}: only a task that requires action takes answers")]
    NotPaused { status: TaskStatus },
    #[error("[{index}].id: {id} is not an action of this task")]
    UnknownAction { index: usize, id: Uuid },
    /// A decision for an action that waits for an output, or the reverse.
    #[error("[{index}]: action {id} waits for {}", wants(*kind))]
    WrongActionKind { index: usize, id: Uuid, kind: Gate },
    /// The action was answered otherwise already (or its time ran out).
    #[error("[{index}]: action {id} was {}", answered(by))]
    ActionAnswered { index: usize, id: Uuid, by: Answerer },
    /// The tenant holds its `max_streams` open on this replica already.
    #[error("the tenant has {current} event streams open on this replica, its limit (max_streams {limit})")]
    StreamLimit { limit: u32, current: u32 },
    #[error(transparent)]
    Budget(#[from] BudgetError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Internal(String),
}

fn wants(kind: Gate) -> &'static str {
    match kind {
        Gate::Output => "an output, not a decision",
        Gate::Approval => "a decision, not an output",
    }
}

fn answered(by: &Answerer) -> String {
    match by {
        Answerer::Expired => "expired (no answer came in time)".to_string(),
        other => format!("answered otherwise by {other}"),
    }
}

impl TaskError {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        TaskError::Invalid { field: field.to_string(), message: message.into() }
    }

    pub fn bad_param(field: &str, message: impl Into<String>) -> Self {
        TaskError::BadParam { field: field.to_string(), message: message.into() }
    }

    /// The stable code every door shows for this refusal.
    pub fn code(&self) -> &'static str {
        match self {
            TaskError::Invalid { .. } => "validation_failed",
            TaskError::BadParam { .. } => "invalid_parameter",
            TaskError::RecursionRefused { .. } => "recursion_refused",
            TaskError::ModelRequired => "model_required",
            TaskError::UnknownModel { .. } => "unknown_model",
            TaskError::UnknownAgent { .. } => "unknown_subagent_type",
            TaskError::NotTerminal { .. } => "task_not_terminal",
            TaskError::UnpricedModel { .. } => "unpriced_model",
            TaskError::IdempotencyConflict { .. } => "idempotency_conflict",
            TaskError::NotFound | TaskError::ScheduleNotFound => "not_found",
            TaskError::NotPaused { .. } => "task_not_paused",
            TaskError::UnknownAction { .. } => "unknown_action",
            TaskError::WrongActionKind { .. } => "wrong_action_kind",
            TaskError::ActionAnswered { .. } => "action_already_answered",
            TaskError::StreamLimit { .. } => "stream_limit_reached",
            TaskError::Budget(BudgetError::Invalid { .. }) => "validation_failed",
            TaskError::Budget(BudgetError::QueueFull { .. }) => "queue_limit_reached",
            TaskError::Budget(BudgetError::ScheduledFull { .. }) => "scheduled_limit_reached",
            TaskError::Budget(BudgetError::Exhausted { .. }) => "budget_exhausted",
            TaskError::Budget(BudgetError::Store(e)) | TaskError::Store(e) if e.is_unavailable() => "unavailable",
            TaskError::Budget(BudgetError::Store(_)) | TaskError::Store(_) | TaskError::Internal(_) => "internal",
        }
    }

    /// Admission refused the task (a queue or spend limit): nothing was written, and a door
    /// that can show a refused task (A2A's `TASK_STATE_REJECTED`) shows one.
    pub fn is_admission_refusal(&self) -> bool {
        matches!(
            self,
            TaskError::Budget(
                BudgetError::QueueFull { .. } | BudgetError::ScheduledFull { .. } | BudgetError::Exhausted { .. }
            )
        )
    }

    /// The caller's mistake (as opposed to the service's, or the database's).
    pub fn is_client_error(&self) -> bool {
        !matches!(self.code(), "internal" | "unavailable")
    }
}

impl From<crate::tools::ToolError> for TaskError {
    fn from(e: crate::tools::ToolError) -> Self {
        match e {
            crate::tools::ToolError::Invalid { field, message } => TaskError::Invalid { field, message },
            other => TaskError::Internal(other.to_string()),
        }
    }
}
