//! Answering a paused task: each pending action by its own id — a decision for an approval, an
//! output for a caller's tool. All of a request's answers are taken or none is; an answer is
//! stored (with who gave it) before it is acknowledged; the same answer again is accepted; the
//! last answer of a pause queues the run again.

use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::{Lifecycle, Scope, TaskError, TaskView};
use crate::kinds::{Answerer, Decision, TaskStatus};
use crate::store::actions::{self, Refused};
use crate::store::{tasks as store, CH_EVENT, CH_QUEUED};

/// One answer as a door received it: a decision (with an optional message) or an output.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionAnswer {
    pub id: Uuid,
    #[serde(default)]
    pub decision: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub output: Option<Value>,
}

impl ActionAnswer {
    pub fn approve(id: Uuid, message: Option<String>) -> Self {
        ActionAnswer { id, decision: Some("approve".into()), message, output: None }
    }

    pub fn deny(id: Uuid, message: Option<String>) -> Self {
        ActionAnswer { id, decision: Some("deny".into()), message, output: None }
    }

    pub fn output(id: Uuid, output: Value) -> Self {
        ActionAnswer { id, decision: None, message: None, output: Some(output) }
    }
}

pub const MAX_ANSWERS: usize = 100;
const MAX_MESSAGE_CHARS: usize = 4000;

impl Answerer {
    /// Who answers: the admin, a key (by its prefix), or a tenant in single-user mode.
    pub fn of(scope: &Scope, key_prefix: Option<String>) -> Answerer {
        match (scope, key_prefix) {
            (Scope::All, _) => Answerer::Admin,
            (Scope::Tenant(_), Some(prefix)) => Answerer::Key(prefix),
            (Scope::Tenant(t), None) => Answerer::Tenant(t.clone()),
        }
    }
}

impl Lifecycle {
    /// Answer pending actions of the task `id`; the task as it stands after.
    pub async fn answer(
        &self,
        scope: &Scope,
        by: &Answerer,
        id: Uuid,
        body: Vec<ActionAnswer>,
    ) -> Result<TaskView, TaskError> {
        if body.is_empty() {
            // Nothing to take: a task that is not paused says so before the empty list does.
            let t = self.row(scope, id).await?;
            if t.status != TaskStatus::RequiresAction {
                return Err(TaskError::NotPaused { status: t.status });
            }
        }
        let answers = self.checked(body)?;
        let outcome = actions::answer(&self.p.pool, scope.tenant(), id, &answers, by).await?;
        let done = outcome.map_err(|r| match r {
            Refused::NoTask => TaskError::NotFound,
            Refused::NotPaused(status) => TaskError::NotPaused { status },
            Refused::Unknown { index, id } => TaskError::UnknownAction { index, id },
            Refused::WrongKind { index, id, kind } => TaskError::WrongActionKind { index, id, kind },
            Refused::Conflict { index, id, by } => TaskError::ActionAnswered { index, id, by },
        })?;
        for a in &answers {
            let kind = a.decision.map_or("output", Decision::as_str);
            metrics::counter!("subagentd_actions_answered_total", "answer" => kind).increment(1);
        }
        self.p.hub.publish(CH_EVENT, id.to_string());
        if done.left == 0 {
            self.p.hub.publish(CH_QUEUED, String::new());
        }
        let row = store::get(&self.p.pool, &done.tenant, id).await?.ok_or(TaskError::NotFound)?;
        Ok(self.view(row).await?)
    }

    /// Answer one pending action by its id alone (a door that names actions, not tasks): the
    /// task it belongs to, as it stands after.
    pub async fn answer_action(
        &self,
        scope: &Scope,
        by: &Answerer,
        answer: ActionAnswer,
    ) -> Result<TaskView, TaskError> {
        let action = match scope.tenant() {
            Some(t) => actions::get(&self.p.pool, t, answer.id).await?,
            None => None,
        };
        let Some(action) = action else { return Err(TaskError::UnknownAction { index: 0, id: answer.id }) };
        self.answer(scope, by, action.task_id, vec![answer]).await
    }

    /// The answers, each checked on its own (before any is written).
    fn checked(&self, body: Vec<ActionAnswer>) -> Result<Vec<actions::Answer>, TaskError> {
        if body.is_empty() || body.len() > MAX_ANSWERS {
            return Err(TaskError::invalid("body", format!("must list 1 to {MAX_ANSWERS} answers")));
        }
        let cap = self.p.cfg.tool_result_max_bytes;
        let mut answers = vec![];
        for (i, a) in body.into_iter().enumerate() {
            let at = |f: &str| format!("[{i}].{f}");
            let decision = match (a.decision.as_deref(), &a.output) {
                (Some(d), None) => Some(
                    Decision::parse(d)
                        .ok_or_else(|| TaskError::invalid(&at("decision"), format!("{d:?} is not approve or deny")))?,
                ),
                (None, Some(_)) => None,
                _ => return Err(TaskError::invalid(&at("decision"), "give either a decision or an output")),
            };
            if decision.is_none() && a.message.is_some() {
                return Err(TaskError::invalid(&at("message"), "goes with a decision, not an output"));
            }
            if a.message.as_ref().is_some_and(|m| m.chars().count() > MAX_MESSAGE_CHARS) {
                return Err(TaskError::invalid(
                    &at("message"),
                    format!("must be at most {MAX_MESSAGE_CHARS} characters"),
                ));
            }
            if a.message.as_ref().is_some_and(|m| m.contains('\0')) {
                return Err(TaskError::invalid(&at("message"), "holds U+0000 (NUL), which cannot be stored"));
            }
            if let Some(o) = &a.output {
                let size = match o {
                    Value::String(s) => s.len(),
                    other => other.to_string().len(),
                };
                if size > cap {
                    return Err(TaskError::invalid(
                        &at("output"),
                        format!("must be at most {cap} bytes (SUBAGENTD_TOOL_RESULT_MAX_BYTES), like any tool result"),
                    ));
                }
                // `POST /tasks/{id}/actions` shows an output's NUL as U+FFFD (`ApiAnswers`); a
                // door that did not is refused here rather than fail the task's checkpoint.
                if crate::kinds::text::has_nul(o) {
                    return Err(TaskError::invalid(&at("output"), "holds U+0000 (NUL), which cannot be stored"));
                }
            }
            answers.push(actions::Answer { id: a.id, decision, message: a.message, output: a.output });
        }
        Ok(answers)
    }
}
