//! The Agent2Agent protocol's (A2A 1.0) shapes of a task: its states, its `Task` object, the
//! status and artifact updates of a stream, and the body of a push notification. ProtoJSON as
//! the spec writes it: camelCase fields, enums by their proto names (`TASK_STATE_COMPLETED`),
//! timestamps in UTC with a `Z`.
//!
//! Kept out of the door (`http::a2a`) because the webhook sender, in any worker process, shapes
//! push notifications with it too. Imports the room's views and the A2A rows, nothing of HTTP.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

use crate::kinds::{Gate, TaskStatus, WebhookEvent};
use crate::store::a2a::{self as store, A2aTask};
use crate::store::actions::ActionRow;
use crate::store::StoreError;
use crate::tasks::TaskView;

/// The protocol version served.
pub const VERSION: &str = "1.0";

/// The A2A state of a task's status: a budget or turn limit's stop is `COMPLETED` (its
/// `stop_reason` in the metadata), as `incomplete` is at the REST door a finished task.
pub fn state(s: TaskStatus) -> &'static str {
    match s {
        TaskStatus::Scheduled | TaskStatus::Queued => "TASK_STATE_SUBMITTED",
        TaskStatus::Running => "TASK_STATE_WORKING",
        TaskStatus::RequiresAction => "TASK_STATE_INPUT_REQUIRED",
        TaskStatus::Completed | TaskStatus::Incomplete => "TASK_STATE_COMPLETED",
        TaskStatus::Failed => "TASK_STATE_FAILED",
        TaskStatus::Cancelled => "TASK_STATE_CANCELED",
    }
}

/// The statuses an A2A state stands for (`None`: not a state's name). `REJECTED` and
/// `AUTH_REQUIRED` stand for none: a rejected task is not stored, and none needs auth.
pub fn statuses_of(state: &str) -> Option<Vec<TaskStatus>> {
    Some(match state {
        "TASK_STATE_SUBMITTED" => vec![TaskStatus::Scheduled, TaskStatus::Queued],
        "TASK_STATE_WORKING" => vec![TaskStatus::Running],
        "TASK_STATE_INPUT_REQUIRED" => vec![TaskStatus::RequiresAction],
        "TASK_STATE_COMPLETED" => vec![TaskStatus::Completed, TaskStatus::Incomplete],
        "TASK_STATE_FAILED" => vec![TaskStatus::Failed],
        "TASK_STATE_CANCELED" => vec![TaskStatus::Cancelled],
        "TASK_STATE_REJECTED" | "TASK_STATE_AUTH_REQUIRED" => vec![],
        _ => return None,
    })
}

/// Terminal or interrupted: a stream of the task ends there.
pub fn stream_ends(s: TaskStatus) -> bool {
    s.is_terminal() || s == TaskStatus::RequiresAction
}

pub fn timestamp(t: DateTime<Utc>) -> String {
    // As stored (microseconds): a timestamp read back as `statusTimestampAfter` then means
    // exactly that moment.
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// A task with its A2A row, if it was started at the A2A door.
pub struct Shown<'a> {
    pub task: &'a TaskView,
    pub a2a: Option<&'a A2aTask>,
}

impl Shown<'_> {
    /// The task's context: its row's, else its own id (a task started at another door).
    pub fn context_id(&self) -> String {
        self.a2a.map(|a| a.context_id.clone()).unwrap_or_else(|| self.task.id.to_string())
    }

    /// When its status last changed.
    fn changed_at(&self) -> DateTime<Utc> {
        let t = self.task;
        t.finished_at.or(t.started_at).unwrap_or(t.created_at)
    }

    /// `TaskStatus`: the state, the agent's message where there is one (the summary or the
    /// error at the end, what a pause waits for), the time.
    pub fn status(&self) -> Value {
        let mut s = json!({"state": state(self.task.status), "timestamp": timestamp(self.changed_at())});
        if let Some(m) = self.agent_message() {
            s["message"] = m;
        }
        s
    }

    fn agent(&self, id: String, parts: Vec<Value>) -> Value {
        json!({"messageId": id, "role": "ROLE_AGENT", "parts": parts, "taskId": self.task.id,
               "contextId": self.context_id()})
    }

    /// The agent's message of the task's state: what a pause waits for, the summary of an end,
    /// the error of a failure. None while it is queued or running.
    pub fn agent_message(&self) -> Option<Value> {
        let t = self.task;
        match t.status {
            TaskStatus::RequiresAction => {
                let actions = t.pending_actions.as_deref().unwrap_or(&[]);
                let (text, data) = pending(actions);
                let id = format!("{}:pause:{}", t.id, actions.first().map_or(0, |a| a.pause));
                Some(
                    self.agent(id, vec![json!({"text": text}), json!({"data": data, "mediaType": "application/json"})]),
                )
            }
            TaskStatus::Completed | TaskStatus::Incomplete => {
                let summary = t.summary.clone().unwrap_or_default();
                Some(self.agent(format!("{}:summary", t.id), vec![json!({"text": summary})]))
            }
            TaskStatus::Failed | TaskStatus::Cancelled => {
                let text = match &t.error {
                    Some(e) => {
                        format!("{}: {}", e["code"].as_str().unwrap_or("error"), e["message"].as_str().unwrap_or(""))
                    }
                    None if t.status == TaskStatus::Cancelled => "cancelled".to_string(),
                    None => "failed".to_string(),
                };
                Some(self.agent(format!("{}:end", t.id), vec![json!({"text": text})]))
            }
            TaskStatus::Scheduled | TaskStatus::Queued | TaskStatus::Running => None,
        }
    }

    /// The caller's messages (a task from another door: its prompt as one), then the agent's
    /// final one.
    pub fn history(&self) -> Vec<Value> {
        let mut h: Vec<Value> = match self.a2a.and_then(|a| a.messages.as_array()) {
            Some(m) => m.clone(),
            None => vec![json!({"messageId": format!("{}:prompt", self.task.id), "role": "ROLE_USER",
                               "parts": [{"text": self.task.prompt}], "taskId": self.task.id,
                               "contextId": self.context_id()})],
        };
        if self.task.status.is_terminal() {
            h.extend(self.agent_message());
        }
        h
    }

    /// The summary as a text artifact, and a structured output as a data artifact.
    pub fn artifacts(&self) -> Vec<Value> {
        let t = self.task;
        if !t.status.is_terminal() {
            return vec![];
        }
        let mut out = vec![];
        if let Some(s) = t.summary.as_deref().filter(|s| !s.is_empty()) {
            out.push(json!({"artifactId": "summary", "name": "summary", "description": "the sub-agent's summary",
                            "parts": [{"text": s, "mediaType": "text/plain"}]}));
        }
        if let Some(o) = &t.output {
            out.push(json!({"artifactId": "output", "name": "output",
                            "description": "the final answer, valid against the task's output_schema",
                            "parts": [{"data": o, "mediaType": "application/json"}]}));
        }
        if let (Some(stats), Some(patch)) = (&t.diff, &t.patch) {
            out.push(json!({"artifactId": "diff", "name": "diff",
                            "description": "the task's changes to its copy of its workspace, as a unified diff (git apply takes it)",
                            "parts": [{"text": patch, "mediaType": "text/x-diff"}], "metadata": stats}));
        }
        out
    }

    /// What the task's metadata shows: the service's own status, the stop reason, usage and cost.
    pub fn metadata(&self) -> Value {
        let t = self.task;
        let mut m = json!({
            "status": t.status, "stop_reason": t.stop_reason, "subagent_type": t.subagent_type, "model": t.model,
            "turns": t.turns, "usage": t.usage, "cost_usd": t.cost_usd, "cost_complete": t.cost_complete,
            "created_at": timestamp(t.created_at),
        });
        if let Some(e) = &t.error {
            m["error"] = e.clone();
        }
        if t.metadata.as_object().is_some_and(|o| !o.is_empty()) {
            m["metadata"] = t.metadata.clone();
        }
        m
    }

    /// The `Task` object: history cut to its last `history` messages (`Some(0)`: none; `None`:
    /// all), artifacts when asked for.
    pub fn task(&self, history: Option<usize>, artifacts: bool) -> Value {
        let mut v = json!({"id": self.task.id, "contextId": self.context_id(), "status": self.status(),
                           "metadata": self.metadata()});
        let mut h = self.history();
        if let Some(n) = history {
            h.drain(..h.len().saturating_sub(n));
        }
        if !h.is_empty() {
            v["history"] = Value::Array(h);
        }
        let a = self.artifacts();
        if artifacts && !a.is_empty() {
            v["artifacts"] = Value::Array(a);
        }
        v
    }

    /// A `TaskStatusUpdateEvent` for the task as it stands.
    pub fn status_update(&self, metadata: Option<Value>) -> Value {
        let mut u = json!({"taskId": self.task.id, "contextId": self.context_id(), "status": self.status()});
        if let Some(m) = metadata {
            u["metadata"] = m;
        }
        json!({"statusUpdate": u})
    }

    /// A `TaskArtifactUpdateEvent` with one whole artifact.
    pub fn artifact_update(&self, artifact: Value) -> Value {
        json!({"artifactUpdate": {"taskId": self.task.id, "contextId": self.context_id(), "artifact": artifact,
                                  "lastChunk": true}})
    }
}

/// What a pause waits for, as text a person reads and as data a client answers from.
fn pending(actions: &[ActionRow]) -> (String, Value) {
    let mut lines = vec![format!(
        "The sub-agent waits for {} answer(s). Reply to this task (its taskId) with a data part \
         {{\"actions\": [...]}} holding one answer per action:",
        actions.len()
    )];
    for a in actions {
        lines.push(match a.kind {
            Gate::Approval => format!(
                "- approve or deny the call of `{}` with {}: {{\"id\": \"{}\", \"decision\": \"approve\"}} (or \"deny\", with an optional \"message\")",
                a.name, a.arguments, a.id
            ),
            Gate::Output => format!(
                "- give the output of `{}` called with {}: {{\"id\": \"{}\", \"output\": ...}}",
                a.name, a.arguments, a.id
            ),
        });
    }
    let data = json!({"actions": actions.iter().map(|a| json!({
        "id": a.id, "kind": a.kind, "name": a.name, "arguments": a.arguments, "expires_at": timestamp(a.expires_at),
    })).collect::<Vec<_>>()});
    (lines.join("\n"), data)
}

/// The A2A row of one task, if any.
pub async fn row(pool: &PgPool, id: Uuid) -> Result<Option<A2aTask>, StoreError> {
    Ok(store::of(pool, &[id]).await?.pop())
}

/// The body of a push notification for a delivery's event (a `StreamResponse`): a pause is a
/// status update saying what it waits for; an end is the whole task, with its artifacts.
pub async fn push_body(pool: &PgPool, task: &TaskView, event: WebhookEvent) -> Result<Value, StoreError> {
    let a2a = row(pool, task.id).await?;
    let shown = Shown { task, a2a: a2a.as_ref() };
    Ok(match event {
        WebhookEvent::TaskRequiresAction if task.status == TaskStatus::RequiresAction => shown.status_update(None),
        _ => json!({"task": shown.task(None, true)}),
    })
}
