//! `SendMessage` and `SendStreamingMessage`: a message starts a task, continues a context, or
//! answers a paused task.
//!
//! - A message's text parts are the prompt; data parts join it as JSON; `raw` parts of a text
//!   type are text; other `raw` and `url` parts are not taken (`ContentTypeNotSupportedError`).
//! - The task's options come from the metadata (the request's, then the message's) under the
//!   names `POST /tasks` uses, checked the same way; `subagent_type` defaults to `general`, and
//!   at a per-agent URL is that agent.
//! - A `contextId` alone continues the context's latest task, which must have ended (its
//!   conversation, as `resume_from`); an unknown one starts that context.
//! - A message with a `taskId` answers that task's pause with a data part `{"actions": [...]}`
//!   (the items `POST /tasks/{id}/actions` takes); to any other task it is refused.
//! - The `messageId` and the message are the idempotency key (`a2a:<messageId>:<hash>`): a retry
//!   returns the first task; another message under a used id is a new one.
//! - An admission refusal (budget, queue) is a `TASK_STATE_REJECTED` task, not stored.

use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::errors::{A2aError, Kind};
use super::ops::history_length;
use super::{params, push, stream, Ctx};
use crate::a2a::{timestamp, Shown};
use crate::tasks::answer::ActionAnswer;
use crate::tasks::context::{Context, ContextRow as A2aTask};
use crate::tasks::feed::OutputAhead;
use crate::tasks::{Submission, TaskError, TaskRequest, TaskView};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SendParams {
    #[serde(default)]
    message: Option<Value>,
    #[serde(default)]
    configuration: Option<Configuration>,
    #[serde(default)]
    metadata: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Configuration {
    #[serde(default)]
    accepted_output_modes: Option<Vec<String>>,
    #[serde(default, alias = "pushNotificationConfig")]
    task_push_notification_config: Option<Value>,
    #[serde(default)]
    history_length: Option<i64>,
    #[serde(default)]
    return_immediately: Option<bool>,
}

/// The output modes a task's answer comes in (the summary as text, an output as JSON).
const OUTPUT_MODES: [&str; 5] = ["text/plain", "text/markdown", "application/json", "text/*", "*/*"];

/// A caller's message, read.
struct Inbound {
    id: String,
    context_id: Option<String>,
    task_id: Option<String>,
    /// The text and data parts, in order.
    prompt: String,
    /// The answers of a data part `{"actions": [...]}`.
    actions: Option<Vec<ActionAnswer>>,
    metadata: Option<Value>,
    /// The message as stored in the task's history.
    stored: Value,
}

fn nonempty(v: &Value, field: &str) -> Result<Option<String>, A2aError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => {
            Err(A2aError::params(format!("message.{field}: must be a string"))
                .meta("field", format!("message.{field}")))
        }
    }
}

fn read_message(m: &Value) -> Result<Inbound, A2aError> {
    let bad = |field: &str, msg: String| A2aError::params(format!("{field}: {msg}")).meta("field", field.to_string());
    if !m.is_object() {
        return Err(bad("message", "must be an object".into()));
    }
    let id = nonempty(m, "messageId")?.ok_or_else(|| bad("message.messageId", "required".into()))?;
    if id.len() > 200 || !id.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(bad("message.messageId", "must be 1 to 200 visible ASCII characters (a UUID, say)".into()));
    }
    match m.get("role").and_then(Value::as_str) {
        Some("ROLE_USER") => {}
        other => return Err(bad("message.role", format!("{other:?}: a caller's message is ROLE_USER"))),
    }
    let Some(parts) = m.get("parts").and_then(Value::as_array).filter(|p| !p.is_empty()) else {
        return Err(bad("message.parts", "at least one part is required".into()));
    };
    let mut texts = vec![];
    let mut actions = None;
    for (i, p) in parts.iter().enumerate() {
        let at = format!("message.parts[{i}]");
        // A 0.3 part of no kind of 0.3's (1.0's parts have no `kind`; a 1.0 client's stray one
        // naming a 0.3 kind is let be).
        if let Some(k) = p.get("kind").filter(|k| !matches!(k.as_str(), Some("text" | "data" | "file"))) {
            return Err(bad(&format!("{at}.kind"), format!("must be text, data or file, not {k}")));
        }
        let media = match p.get("mediaType") {
            None => "",
            Some(Value::String(m)) => m.as_str(),
            Some(_) => return Err(bad(&format!("{at}.mediaType"), "must be a string".into())),
        };
        let is_text = media.starts_with("text/") || media == "application/json";
        // A field given as null is not given.
        let present: Vec<&str> =
            ["text", "raw", "url", "data"].into_iter().filter(|k| p.get(*k).is_some_and(|v| !v.is_null())).collect();
        match present.as_slice() {
            ["text"] => match &p["text"] {
                Value::String(s) => texts.push(s.clone()),
                _ => return Err(bad(&format!("{at}.text"), "must be a string".into())),
            },
            ["data"] => match p["data"].get("actions") {
                Some(a) if p["data"].as_object().is_some_and(|o| o.len() == 1) => {
                    let list: Vec<ActionAnswer> = serde_json::from_value(a.clone())
                        .map_err(|e| bad(&format!("{at}.data.actions"), e.to_string()))?;
                    actions = Some(list);
                }
                _ => texts.push(p["data"].to_string()),
            },
            ["raw"] if is_text => {
                let raw = p["raw"].as_str().ok_or_else(|| bad(&format!("{at}.raw"), "must be base64".into()))?;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(raw)
                    .map_err(|_| bad(&format!("{at}.raw"), "is not base64".into()))?;
                let s = String::from_utf8(bytes).map_err(|_| bad(&format!("{at}.raw"), "is not UTF-8 text".into()))?;
                texts.push(s);
            }
            ["url"] if media.starts_with("text/") => {
                let url = p["url"].as_str().ok_or_else(|| bad(&format!("{at}.url"), "must be a string".into()))?;
                texts.push(format!("Attached ({media}): {url}"));
            }
            ["raw"] | ["url"] => {
                let what = if media.is_empty() { "a part with no mediaType" } else { media };
                return Err(A2aError::new(
                    Kind::ContentTypeNotSupported,
                    format!("{at}: {what} is not taken: a sub-agent's prompt is text (text parts, data parts as JSON, text/* files)"),
                )
                .meta("field", at)
                .meta("mediaType", media));
            }
            [] => return Err(bad(&at, "has none of text, raw, url, data".into())),
            _ => return Err(bad(&at, format!("has {} — a part has exactly one of them", present.join(", ")))),
        }
    }
    let context_id = nonempty(m, "contextId")?;
    if context_id.as_ref().is_some_and(|c| c.len() > 255) {
        return Err(bad("message.contextId", "must be at most 255 characters".into()));
    }
    let metadata = match m.get("metadata") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Object(_)) => Some(v.clone()),
        Some(_) => return Err(bad("message.metadata", "must be an object".into())),
    };
    Ok(Inbound {
        id,
        context_id,
        task_id: nonempty(m, "taskId")?,
        prompt: texts.join("\n\n"),
        actions,
        metadata,
        stored: known(m),
    })
}

/// A field's value kept when it is there.
fn keep(v: &Value, keys: &[&str]) -> Map<String, Value> {
    keys.iter().filter_map(|k| v.get(*k).filter(|x| !x.is_null()).map(|x| ((*k).to_string(), x.clone()))).collect()
}

/// The message as it is stored and shown again: the fields A2A's `Message` has, and of each part
/// those of a `Part`. A field the door does not know is ignored: never stored, never echoed.
fn known(m: &Value) -> Value {
    let mut out = keep(m, &["messageId", "contextId", "taskId", "role", "metadata", "extensions", "referenceTaskIds"]);
    if let Some(parts) = m.get("parts").and_then(Value::as_array) {
        let parts = parts
            .iter()
            .map(|p| Value::Object(keep(p, &["text", "raw", "url", "data", "mediaType", "filename", "metadata"])))
            .collect();
        out.insert("parts".into(), Value::Array(parts));
    }
    Value::Object(out)
}

/// The task's request: the metadata's options, the message's prompt, the agent type.
fn task_request(ctx: &Ctx, request_meta: Option<&Value>, msg: &Inbound) -> Result<TaskRequest, A2aError> {
    let mut m = Map::new();
    for (at, src) in [("metadata", request_meta), ("message.metadata", msg.metadata.as_ref())] {
        match src {
            None | Some(Value::Null) => {}
            Some(Value::Object(o)) => m.extend(o.clone()),
            Some(_) => return Err(A2aError::params(format!("{at}: must be an object")).meta("field", at)),
        }
    }
    for (key, why) in [
        ("prompt", "the prompt is the message's text"),
        ("resume_from", "send the message with the contextId of the task to continue"),
    ] {
        if m.contains_key(key) {
            return Err(A2aError::params(format!("metadata.{key}: {why}")).meta("field", format!("metadata.{key}")));
        }
    }
    match (&ctx.agent, m.get("subagent_type")) {
        (Some(a), Some(t)) if t.as_str() != Some(a.as_str()) => {
            return Err(A2aError::params(format!("metadata.subagent_type: this URL is agent {a:?}'s"))
                .meta("field", "metadata.subagent_type"))
        }
        (Some(a), _) => {
            m.insert("subagent_type".into(), json!(a));
        }
        (None, None) => {
            m.insert("subagent_type".into(), json!("general"));
        }
        (None, Some(_)) => {}
    }
    if msg.prompt.trim().is_empty() {
        return Err(
            A2aError::params("message.parts: no text or data to make a prompt of").meta("field", "message.parts")
        );
    }
    m.insert("prompt".into(), json!(msg.prompt));
    let bytes = serde_json::to_vec(&Value::Object(m)).unwrap_or_default();
    super::super::extract::from_slice::<TaskRequest>(&bytes)
        .map_err(|e| A2aError::params(format!("metadata: {e}")).meta("field", "metadata"))
}

/// How a send answers.
#[derive(Clone, Copy, PartialEq)]
enum How {
    /// Once the task is settled (or the wait runs out).
    Block,
    /// At once.
    Return,
    /// At once, to be streamed: the run's text is subscribed before the run can start.
    Stream,
}

/// What a send made.
enum Started {
    /// A task as it stands, the event after which to follow it, and (`How::Stream`) its run's
    /// text, subscribed ahead.
    Task { view: Box<TaskView>, a2a: Option<A2aTask>, after: i32, live: Option<OutputAhead> },
    /// A refused admission: the `Task`, not stored.
    Rejected(Value),
}

pub async fn send(ctx: Ctx, p: Value) -> Result<Value, A2aError> {
    let p: SendParams = params("SendMessage", p)?;
    let conf = p.configuration.as_ref();
    let history = history_length(conf.and_then(|c| c.history_length))?;
    let how = if conf.and_then(|c| c.return_immediately) == Some(true) { How::Return } else { How::Block };
    Ok(match start(&ctx, &p, how).await? {
        Started::Task { view, a2a, .. } => {
            json!({"task": Shown { task: &view, a2a: a2a.as_ref() }.task(history, true)})
        }
        Started::Rejected(task) => json!({"task": task}),
    })
}

pub async fn stream(ctx: Ctx, p: Value) -> Result<mpsc::Receiver<Result<Value, A2aError>>, A2aError> {
    let p: SendParams = params("SendStreamingMessage", p)?;
    let history = history_length(p.configuration.as_ref().and_then(|c| c.history_length))?;
    // Held before anything starts: at the tenant's stream limit, nothing is.
    let hold = ctx.st.room().stream_hold(&ctx.tenant).await.map_err(A2aError::from)?;
    Ok(match start(&ctx, &p, How::Stream).await? {
        Started::Task { view, a2a, after, live } => stream::follow(ctx, *view, a2a, after, hold, live, history),
        Started::Rejected(task) => {
            let (tx, rx) = mpsc::channel(1);
            let _ = tx.try_send(Ok(json!({"task": task})));
            rx
        }
    })
}

async fn start(ctx: &Ctx, p: &SendParams, how: How) -> Result<Started, A2aError> {
    let msg = read_message(
        p.message.as_ref().ok_or_else(|| A2aError::params("message: required").meta("field", "message"))?,
    )?;
    if let Some(modes) = p.configuration.as_ref().and_then(|c| c.accepted_output_modes.as_ref()) {
        if !modes.is_empty() && !modes.iter().any(|m| OUTPUT_MODES.contains(&m.as_str())) {
            return Err(A2aError::new(
                Kind::ContentTypeNotSupported,
                format!(
                    "acceptedOutputModes: a task answers in text/plain (and application/json), not {}",
                    modes.join(", ")
                ),
            ));
        }
    }
    let push = match p.configuration.as_ref().and_then(|c| c.task_push_notification_config.as_ref()) {
        // An unset message, as protobuf's JSON writes one (`{}`): no config.
        Some(c) if c.is_object() && push::unset(c) => None,
        Some(c) if c.is_object() => Some(push::checked(ctx, c, None)?),
        Some(_) => {
            return Err(A2aError::params("configuration.taskPushNotificationConfig: must be an object")
                .meta("field", "configuration.taskPushNotificationConfig"))
        }
        None => None,
    };
    let started = match &msg.task_id {
        Some(task) => answer(ctx, &msg, task, how).await?,
        None => submit(ctx, p, &msg, how).await?,
    };
    if let (Some(c), Started::Task { view, .. }) = (push, &started) {
        push::register(ctx, c, view.id).await?;
    }
    Ok(started)
}

/// A message to an existing task: the answers to its pause.
async fn answer(ctx: &Ctx, msg: &Inbound, task: &str, how: How) -> Result<Started, A2aError> {
    let room = &ctx.st.room();
    let scope = ctx.scope();
    let view = super::ops::task_of(ctx, task).await?;
    let a2a = room.context(view.id).await?;
    let context = Shown { task: &view, a2a: a2a.as_ref() }.context_id();
    if msg.context_id.as_ref().is_some_and(|c| *c != context) {
        return Err(A2aError::params(format!("message.contextId: task {} is in context {context:?}", view.id))
            .meta("field", "message.contextId"));
    }
    let after = room.last_seq(&scope, view.id).await?;
    let live = (how == How::Stream).then(|| room.output_ahead(view.id));
    let actions = msg.actions.clone().unwrap_or_default();
    let mut stored = msg.stored.clone();
    stored["taskId"] = json!(view.id);
    stored["contextId"] = json!(context);
    let answered = room.answer_with_message(&scope, &ctx.answerer(), view.id, actions, &stored).await.map_err(|e| {
        match e {
        TaskError::NotPaused { status } if status.is_terminal() => A2aError::new(
            Kind::UnsupportedOperation,
            format!(
                "task {} is {status}: it takes no more messages; to continue its conversation, send a message with \
                 its contextId and no taskId",
                view.id
            ),
        ),
        TaskError::NotPaused { status } => A2aError::new(
            Kind::UnsupportedOperation,
            format!("task {} is {status}: it takes a message only while it waits for input (input-required)", view.id),
        ),
        TaskError::Invalid { ref field, .. } if msg.actions.is_none() && field == "body" => A2aError::params(
            "this task waits for answers: reply with a data part {\"actions\": [...]}, one answer per pending action \
             (its status message lists them)",
        )
        .meta("field", "message.parts"),
        e => e.into(),
    }
    })?;
    let view = match how {
        How::Block => room.join(&scope, view.id, room.wait_bound(None)).await?.task,
        How::Return | How::Stream => answered,
    };
    let a2a = room.context(view.id).await?;
    Ok(Started::Task { view: Box::new(view), a2a, after, live })
}

/// A message that starts a task: in a new context, or continuing one (the room continues the
/// context's latest task, which must have ended; a retry of the message is its first task).
async fn submit(ctx: &Ctx, p: &SendParams, msg: &Inbound, how: How) -> Result<Started, A2aError> {
    let room = &ctx.st.room();
    if msg.actions.is_some() {
        return Err(A2aError::params(
            "message: answers (a data part {\"actions\": ...}) go to a paused task: set its taskId",
        )
        .meta("field", "message.taskId"));
    }
    let request = task_request(ctx, p.metadata.as_ref(), msg)?;
    let context = msg.context_id.clone().unwrap_or_else(|| Uuid::new_v4().to_string());
    let mut s = Submission {
        idempotency_key: Some(key(&msg.id, ctx.agent.as_deref(), p.metadata.as_ref(), &msg.stored)),
        depth: ctx.depth.clone(),
        traceparent: ctx.traceparent.clone(),
        api_key: ctx.key_prefix.clone(),
        ..Submission::new(ctx.tenant.clone(), request)
    };
    let mut stored = msg.stored.clone();
    stored["taskId"] = json!(s.id);
    stored["contextId"] = json!(context);
    s.context = Some(Context { id: context.clone(), message: stored.clone() });
    let id = s.id;
    let wait = (how == How::Block).then(|| room.wait_bound(None));
    let live = (how == How::Stream).then(|| room.output_ahead(id));
    let created = match room.create(s, wait).await {
        Ok(c) => c,
        Err(e) if e.is_admission_refusal() => return Ok(Started::Rejected(rejected(id, &context, stored, &e))),
        Err(TaskError::NotTerminal { id: latest, status }) => {
            return Err(A2aError::new(
                Kind::UnsupportedOperation,
                format!(
                    "context {context:?}: its latest task {latest} is {status}: answer or wait for it (by its taskId) \
                     before continuing the context"
                ),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let a2a = room.context(created.task.id).await?;
    Ok(Started::Task { view: Box::new(created.task), a2a, after: 0, live })
}

/// A message's idempotency key: its `messageId` and what it says. A retry (the same message
/// again) is its first task; another message that reuses the id is a message of its own, as the
/// A2A conformance suite sends them (the spec lets a server deduplicate by `messageId`, it does
/// not make a reused one an error).
fn key(id: &str, agent: Option<&str>, request_meta: Option<&Value>, message: &Value) -> String {
    use sha2::Digest;
    // At a per-agent URL, that agent's: the same message to two agents is two tasks.
    let said = json!([agent, request_meta, message]).to_string();
    format!("a2a:{id}:{}", hex::encode(&sha2::Sha256::digest(said.as_bytes())[..8]))
}

/// The task an admission refused: `TASK_STATE_REJECTED`, the reason in its message and
/// metadata. Not stored: `GetTask` does not find it.
fn rejected(id: Uuid, context: &str, message: Value, e: &TaskError) -> Value {
    let reason = e.to_string();
    json!({
        "id": id,
        "contextId": context,
        "status": {
            "state": "TASK_STATE_REJECTED",
            "timestamp": timestamp(chrono::Utc::now()),
            "message": {"messageId": format!("{id}:rejected"), "role": "ROLE_AGENT", "taskId": id, "contextId": context,
                        "parts": [{"text": format!("{}: {reason}", e.code())}]},
        },
        "history": [message],
        "metadata": {"code": e.code(), "reason": reason},
    })
}
