//! Each event kind's data, typed: what a task's log stores in `task_events.data`, the event
//! stream and webhooks show, and the doors read. An `Event` serialises as its data alone (the
//! kind is its own column), exactly the JSON object `openapi.yaml`'s `Event.data` describes;
//! `Event::parse` reads a stored row back by its kind. Kinds written by SQL (`created`,
//! `claimed`, `queued`, `budget_wait`, `requires_action`, `actions_answered`, `released`,
//! `rescued`, `cancel_requested`) are described here too, for their readers; a test of the
//! suite parses every event a task's lifecycle writes.
//!
//! Every struct reads leniently (`default`): a row written by an older version may lack a
//! field added since.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Answerer, Decision, EventKind, Gate, StopReason, TaskStatus};

/// One event's data, by kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Event {
    Created(Created),
    Queued(Queued),
    Claimed(Claimed),
    LlmCallStarted(LlmCallStarted),
    LlmCallFinished(LlmCallFinished),
    LlmCallFailed(LlmCallFailed),
    ModelFallback(ModelFallback),
    ModelFallbackSkipped(ModelFallbackSkipped),
    ToolCallsStarted(ToolCallsStarted),
    ToolCallFinished(ToolCallFinished),
    ToolCallRefused(ToolCallRef),
    ToolCallCut(ToolCallRef),
    ToolCallsWaiting(ToolCallsWaiting),
    TextToolCalls(TextToolCalls),
    LoopWarning(LoopWarning),
    AnswerCut(AnswerCut),
    OutputInvalid(OutputInvalid),
    Checkpoint(Checkpoint),
    BudgetWait(BudgetWait),
    RequiresAction(RequiresAction),
    ActionAnswered(ActionAnswered),
    ActionsAnswered(ActionsAnswered),
    CancelRequested(Empty),
    Cancelled(Empty),
    Released(Empty),
    Rescued(Rescued),
    WorkspaceReady(WorkspaceReady),
    EnvironmentReady(EnvironmentReady),
    Finished(Finished),
    /// The run's text as it streams (live only, never stored).
    OutputDelta(Value),
}

impl Event {
    pub fn kind(&self) -> EventKind {
        match self {
            Event::Created(_) => EventKind::Created,
            Event::Queued(_) => EventKind::Queued,
            Event::Claimed(_) => EventKind::Claimed,
            Event::LlmCallStarted(_) => EventKind::LlmCallStarted,
            Event::LlmCallFinished(_) => EventKind::LlmCallFinished,
            Event::LlmCallFailed(_) => EventKind::LlmCallFailed,
            Event::ModelFallback(_) => EventKind::ModelFallback,
            Event::ModelFallbackSkipped(_) => EventKind::ModelFallbackSkipped,
            Event::ToolCallsStarted(_) => EventKind::ToolCallsStarted,
            Event::ToolCallFinished(_) => EventKind::ToolCallFinished,
            Event::ToolCallRefused(_) => EventKind::ToolCallRefused,
            Event::ToolCallCut(_) => EventKind::ToolCallCut,
            Event::ToolCallsWaiting(_) => EventKind::ToolCallsWaiting,
            Event::TextToolCalls(_) => EventKind::TextToolCalls,
            Event::LoopWarning(_) => EventKind::LoopWarning,
            Event::AnswerCut(_) => EventKind::AnswerCut,
            Event::OutputInvalid(_) => EventKind::OutputInvalid,
            Event::Checkpoint(_) => EventKind::Checkpoint,
            Event::BudgetWait(_) => EventKind::BudgetWait,
            Event::RequiresAction(_) => EventKind::RequiresAction,
            Event::ActionAnswered(_) => EventKind::ActionAnswered,
            Event::ActionsAnswered(_) => EventKind::ActionsAnswered,
            Event::CancelRequested(_) => EventKind::CancelRequested,
            Event::Cancelled(_) => EventKind::Cancelled,
            Event::Released(_) => EventKind::Released,
            Event::Rescued(_) => EventKind::Rescued,
            Event::WorkspaceReady(_) => EventKind::WorkspaceReady,
            Event::EnvironmentReady(_) => EventKind::EnvironmentReady,
            Event::Finished(_) => EventKind::Finished,
            Event::OutputDelta(_) => EventKind::OutputDelta,
        }
    }

    /// A stored event read back: its data as its kind's shape.
    pub fn parse(kind: EventKind, data: Value) -> Result<Event, serde_json::Error> {
        use serde_json::from_value as v;
        Ok(match kind {
            EventKind::Created => Event::Created(v(data)?),
            EventKind::Queued => Event::Queued(v(data)?),
            EventKind::Claimed => Event::Claimed(v(data)?),
            EventKind::LlmCallStarted => Event::LlmCallStarted(v(data)?),
            EventKind::LlmCallFinished => Event::LlmCallFinished(v(data)?),
            EventKind::LlmCallFailed => Event::LlmCallFailed(v(data)?),
            EventKind::ModelFallback => Event::ModelFallback(v(data)?),
            EventKind::ModelFallbackSkipped => Event::ModelFallbackSkipped(v(data)?),
            EventKind::ToolCallsStarted => Event::ToolCallsStarted(v(data)?),
            EventKind::ToolCallFinished => Event::ToolCallFinished(v(data)?),
            EventKind::ToolCallRefused => Event::ToolCallRefused(v(data)?),
            EventKind::ToolCallCut => Event::ToolCallCut(v(data)?),
            EventKind::ToolCallsWaiting => Event::ToolCallsWaiting(v(data)?),
            EventKind::TextToolCalls => Event::TextToolCalls(v(data)?),
            EventKind::LoopWarning => Event::LoopWarning(v(data)?),
            EventKind::AnswerCut => Event::AnswerCut(v(data)?),
            EventKind::OutputInvalid => Event::OutputInvalid(v(data)?),
            EventKind::Checkpoint => Event::Checkpoint(v(data)?),
            EventKind::BudgetWait => Event::BudgetWait(v(data)?),
            EventKind::RequiresAction => Event::RequiresAction(v(data)?),
            EventKind::ActionAnswered => Event::ActionAnswered(v(data)?),
            EventKind::ActionsAnswered => Event::ActionsAnswered(v(data)?),
            EventKind::CancelRequested => Event::CancelRequested(v(data)?),
            EventKind::Cancelled => Event::Cancelled(v(data)?),
            EventKind::Released => Event::Released(v(data)?),
            EventKind::Rescued => Event::Rescued(v(data)?),
            EventKind::WorkspaceReady => Event::WorkspaceReady(v(data)?),
            EventKind::EnvironmentReady => Event::EnvironmentReady(v(data)?),
            EventKind::Finished => Event::Finished(v(data)?),
            EventKind::OutputDelta => Event::OutputDelta(data),
        })
    }

    /// The turn it belongs to, for the kinds that have one.
    pub fn turn(&self) -> Option<u32> {
        Some(match self {
            Event::LlmCallStarted(e) => e.turn,
            Event::LlmCallFinished(e) => e.turn,
            Event::LlmCallFailed(e) => e.turn,
            Event::ModelFallback(e) => e.turn,
            Event::ModelFallbackSkipped(e) => e.turn,
            Event::ToolCallsStarted(e) => e.turn,
            Event::ToolCallFinished(e) => e.turn,
            Event::ToolCallRefused(e) | Event::ToolCallCut(e) => e.turn,
            Event::ToolCallsWaiting(e) => e.turn,
            Event::TextToolCalls(e) => e.turn,
            Event::LoopWarning(e) => e.turn,
            Event::AnswerCut(e) => e.turn,
            Event::OutputInvalid(e) => e.turn,
            Event::Checkpoint(e) => e.turn,
            Event::RequiresAction(e) => e.turn,
            _ => return None,
        })
    }
}

/// `{}`: the kinds with nothing to say but their name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Empty {}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Created {
    pub subagent_type: String,
    pub model: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Queued {
    /// The time it was scheduled for (as PostgreSQL writes a timestamp).
    pub run_at: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Claimed {
    pub attempt: i32,
    pub worker: Option<String>,
}

/// A provider call's reservation (`prompt_tokens` and `max_tokens` let a rescue estimate the
/// call, should its worker be lost).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LlmCallStarted {
    pub turn: u32,
    #[serde(rename = "try")]
    pub try_no: u32,
    pub model: String,
    pub messages: usize,
    pub tools: usize,
    pub reserved_usd: Decimal,
    pub reserved_tokens: u64,
    pub prompt_tokens: u64,
    pub max_tokens: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LlmCallFinished {
    pub turn: u32,
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    pub cache_write_tokens: u64,
    pub latency_ms: u32,
    #[serde(rename = "try")]
    pub try_no: u32,
    pub finish_reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LlmCallFailed {
    pub turn: u32,
    #[serde(rename = "try")]
    pub try_no: u32,
    pub http_status: Option<u16>,
    pub error: Option<String>,
    pub latency_ms: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelFallback {
    pub turn: u32,
    pub from: String,
    pub to: String,
    pub reason: String,
    pub error: String,
    pub http_status: Option<u16>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelFallbackSkipped {
    pub turn: u32,
    pub model: String,
    pub reason: String,
}

/// A tool call named in an event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CallRef {
    pub tool_call_id: String,
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolCallsStarted {
    pub turn: u32,
    pub calls: Vec<CallRef>,
}

/// One tool call's end; `detail` is what the tool adds (a built-in's URL, status, bytes…), never
/// one of the fields above.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolCallFinished {
    pub turn: u32,
    pub tool_call_id: String,
    pub name: String,
    pub is_error: bool,
    pub duration_ms: u64,
    #[serde(flatten)]
    pub detail: Map<String, Value>,
}

impl ToolCallFinished {
    const OWN: [&'static str; 5] = ["turn", "tool_call_id", "name", "is_error", "duration_ms"];

    /// With a tool's detail, less any key that would shadow the event's own.
    pub fn with_detail(mut self, detail: Option<&Value>) -> Self {
        if let Some(Value::Object(extra)) = detail {
            for (k, v) in extra {
                if !Self::OWN.contains(&k.as_str()) {
                    self.detail.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
        }
        self
    }
}

/// `tool_call_refused` and `tool_call_cut`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolCallRef {
    pub turn: u32,
    pub tool_call_id: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitingCall {
    pub tool_call_id: String,
    pub name: String,
    pub kind: Gate,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolCallsWaiting {
    pub turn: u32,
    pub calls: Vec<WaitingCall>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TextToolCalls {
    pub turn: u32,
    pub calls: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoopWarning {
    pub turn: u32,
    pub name: String,
    pub repeats: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AnswerCut {
    pub turn: u32,
    pub max_tokens: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OutputInvalid {
    pub turn: u32,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Checkpoint {
    pub turn: u32,
    pub messages: usize,
}

/// The task's workspace is on this worker's disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkspaceReady {
    /// `git` or `upload`.
    pub source: String,
    /// The commit (git) or the content hash (upload) it reads.
    pub version: String,
    /// Found in this worker's cache: nothing was fetched or unpacked.
    pub cached: bool,
    /// Bytes fetched from the repository or read from the upload (0 when cached).
    pub fetched_bytes: u64,
    /// Time spent fetching or unpacking, in ms (the wait for another task's fetch included).
    pub millis: u64,
    /// Files in the tree, and their bytes.
    pub files: u64,
    pub bytes: u64,
    /// Entries left out (a submodule, a link leading outside), each with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
}

/// The image a run's commands run in, made ready (pulled, or found in this worker's cache).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EnvironmentReady {
    /// The reference as the task (or its named environment) names it.
    pub image: String,
    /// The named environment, if the task names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The manifest digest it runs in (recorded at the first start).
    pub digest: String,
    /// Found in this worker's cache: nothing was pulled.
    pub cached: bool,
    /// Compressed bytes pulled (0 when cached), and the layers.
    pub fetched_bytes: u64,
    pub layers: u64,
    /// The root's bytes, unpacked.
    pub bytes: u64,
    /// Time spent resolving and pulling, in ms (the wait for another task's pull included).
    pub millis: u64,
    /// A named environment's setup, when this start ran it (else it was cached), in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub setup_ms: Option<u64>,
    /// Entries left out of the root (a device node, a path leading outside…), each with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
}

/// A call waits for the tenant's reservations to settle (numbers as PostgreSQL writes them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetWait {
    pub limit: String,
    pub need_usd: Option<Decimal>,
    pub need_tokens: Option<i64>,
    pub want_usd: Option<Decimal>,
    pub want_tokens: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequiresAction {
    pub turn: u32,
    pub pause: i32,
    /// The pending actions as `GET /tasks/{id}/actions` lists them.
    pub actions: Value,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ActionAnswered {
    pub id: uuid::Uuid,
    pub decision: Option<Decision>,
    /// An output was given (its value is the action's, not the log's).
    pub output: bool,
    pub by: Answerer,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ActionsAnswered {
    pub pause: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rescued {
    pub status: TaskStatus,
    #[serde(default)]
    pub attempt: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    pub status: TaskStatus,
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_kind_has_its_shape_and_reads_back_as_itself() {
        for k in EventKind::ALL {
            let data = match k {
                EventKind::Rescued | EventKind::Finished => json!({"status": "failed"}),
                _ => json!({}),
            };
            let e = Event::parse(*k, data).unwrap_or_else(|e| panic!("{k}: {e}"));
            assert_eq!(e.kind(), *k);
            assert_eq!(Event::parse(*k, serde_json::to_value(&e).unwrap()).unwrap(), e, "{k} round-trips");
        }
    }

    #[test]
    fn data_is_written_as_before_and_a_tools_detail_never_shadows_its_fields() {
        let e = Event::ToolCallFinished(
            ToolCallFinished { turn: 2, tool_call_id: "c1".into(), name: "web_fetch".into(), ..Default::default() }
                .with_detail(Some(&json!({"url": "https://a.example/", "name": "other", "turn": 9}))),
        );
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({"turn": 2, "tool_call_id": "c1", "name": "web_fetch", "is_error": false, "duration_ms": 0,
                   "url": "https://a.example/"})
        );
        let f = Event::Finished(Finished { status: TaskStatus::Completed, stop_reason: None });
        assert_eq!(serde_json::to_value(&f).unwrap(), json!({"status": "completed", "stop_reason": null}));
        let s = Event::LlmCallStarted(LlmCallStarted { try_no: 1, ..Default::default() });
        assert_eq!(serde_json::to_value(&s).unwrap()["try"], 1);
        assert_eq!(serde_json::to_value(Event::Cancelled(Empty {})).unwrap(), json!({}));
    }

    /// Each kind's fields as the event stream and webhooks have shown them since before the
    /// kinds were typed (the `json!` objects each call site built, the SQL's
    /// `jsonb_build_object`s): a renamed or dropped field fails here.
    #[test]
    fn each_kinds_fields_are_the_wire_formats() {
        let fields = |k: EventKind| -> Vec<&'static str> {
            match k {
                EventKind::Created => vec!["model", "subagent_type"],
                EventKind::Queued => vec!["run_at"],
                EventKind::Claimed => vec!["attempt", "worker"],
                EventKind::LlmCallStarted => vec![
                    "max_tokens",
                    "messages",
                    "model",
                    "prompt_tokens",
                    "reserved_tokens",
                    "reserved_usd",
                    "tools",
                    "try",
                    "turn",
                ],
                EventKind::LlmCallFinished => vec![
                    "cache_write_tokens",
                    "cached_tokens",
                    "finish_reason",
                    "input_tokens",
                    "latency_ms",
                    "model",
                    "output_tokens",
                    "try",
                    "turn",
                ],
                EventKind::LlmCallFailed => vec!["error", "http_status", "latency_ms", "try", "turn"],
                EventKind::ModelFallback => vec!["error", "from", "http_status", "reason", "to", "turn"],
                EventKind::ModelFallbackSkipped => vec!["model", "reason", "turn"],
                EventKind::ToolCallsStarted | EventKind::ToolCallsWaiting | EventKind::TextToolCalls => {
                    vec!["calls", "turn"]
                }
                EventKind::ToolCallFinished => vec!["duration_ms", "is_error", "name", "tool_call_id", "turn"],
                EventKind::ToolCallRefused | EventKind::ToolCallCut => vec!["name", "tool_call_id", "turn"],
                EventKind::LoopWarning => vec!["name", "repeats", "turn"],
                EventKind::AnswerCut => vec!["max_tokens", "turn"],
                EventKind::OutputInvalid => vec!["errors", "turn"],
                EventKind::Checkpoint => vec!["messages", "turn"],
                EventKind::BudgetWait => vec!["limit", "need_tokens", "need_usd", "want_tokens", "want_usd"],
                EventKind::RequiresAction => vec!["actions", "pause", "turn"],
                EventKind::ActionAnswered => vec!["by", "decision", "id", "output"],
                EventKind::ActionsAnswered => vec!["pause"],
                EventKind::CancelRequested | EventKind::Cancelled | EventKind::Released => vec![],
                EventKind::Rescued => vec!["attempt", "status"],
                EventKind::WorkspaceReady => {
                    vec!["bytes", "cached", "fetched_bytes", "files", "millis", "source", "version"]
                }
                EventKind::EnvironmentReady => {
                    vec!["bytes", "cached", "digest", "fetched_bytes", "image", "layers", "millis"]
                }
                EventKind::Finished => vec!["status", "stop_reason"],
                EventKind::OutputDelta => vec![],
            }
        };
        for k in EventKind::ALL.iter().filter(|k| k.is_stored()) {
            let data = match k {
                EventKind::Rescued | EventKind::Finished => json!({"status": "failed"}),
                _ => json!({}),
            };
            let written = serde_json::to_value(Event::parse(*k, data).unwrap()).unwrap();
            let keys: Vec<&str> = written.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(keys, fields(*k), "{k}");
        }
        let calls = |v: Value| v["calls"][0].as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        let started = ToolCallsStarted { turn: 1, calls: vec![CallRef::default()] };
        assert_eq!(calls(serde_json::to_value(started).unwrap()), ["name", "tool_call_id"]);
        let waiting = WaitingCall { tool_call_id: "c".into(), name: "n".into(), kind: Gate::Approval };
        let waiting = ToolCallsWaiting { turn: 1, calls: vec![waiting] };
        assert_eq!(calls(serde_json::to_value(waiting).unwrap()), ["kind", "name", "tool_call_id"]);
    }
}
