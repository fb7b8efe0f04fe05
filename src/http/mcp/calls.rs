//! `tools/call`: each tool one room operation. A plain call of `task` waits for its task (at
//! most `SUBAGENTD_MCP_WAIT_SECONDS`, as a wait hold) and answers with its summary, or says it
//! is still running and names its id; a task-augmented call answers at once with the MCP task.
//! When the call asked for progress, or the client can be asked for input, the answer is a
//! stream: progress as turns finish, an `elicitation/create` for each pending action of a
//! paused run, then the result. The client's answer to an elicitation may come to any replica:
//! its id names the action, and the room stores it like `POST /tasks/{id}/actions`.

use std::time::Duration;

use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::rpc::{self, RpcError};
use super::tools;
use super::{Ctx, Reply};
use crate::kinds::{Gate, TaskStatus};
use crate::tasks::answer::ActionAnswer;
use crate::tasks::feed::Step;
use crate::tasks::{ActionRow, Submission, TaskError, TaskRequest, TaskView};

/// The related-task metadata key of 2025-11-25 tasks.
pub const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// `task`'s arguments (and an `agent_<name>` tool's, whose type is its name).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskArgs {
    #[serde(default)]
    subagent_type: Option<String>,
    description: String,
    prompt: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_turns: Option<i64>,
    #[serde(default)]
    parent_context: Option<String>,
    #[serde(default)]
    output_schema: Option<Value>,
    #[serde(default)]
    workspace: Option<crate::kinds::WorkspaceSpec>,
    #[serde(default)]
    environment: Option<crate::kinds::EnvironmentSpec>,
    /// Answer at once with the task's id; the task runs on whatever the session does.
    #[serde(default)]
    run_in_background: bool,
    /// A finished task whose conversation this call continues (`resume_from`).
    #[serde(default)]
    resume: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IdArgs {
    task_id: String,
    /// `task_wait` only: wait at most this long (for clients that give a call less than the
    /// door's bound).
    #[serde(default)]
    wait_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct CallParams {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    task: Option<Value>,
    #[serde(default, rename = "_meta")]
    meta: Option<Value>,
}

pub async fn call(ctx: Ctx, id: Value, params: Value) -> Result<Reply, RpcError> {
    let p: CallParams = serde_json::from_value(params).map_err(|e| RpcError::params(format!("tools/call: {e}")))?;
    let args = p.arguments.unwrap_or_else(|| json!({}));
    let progress = p.meta.as_ref().and_then(|m| m.get("progressToken")).cloned();
    let augmented = p.task.is_some() && ctx.tasks_supported();
    // An `agent_<name>` tool is not offered from inside a sub-agent; called anyway, the room
    // refuses it by the depth rule, as it does `task`.
    let agent = p.name.strip_prefix("agent_").filter(|_| ctx.st.room().config().mcp_tool_per_agent);
    match (p.name.as_str(), agent) {
        ("task", _) | (_, Some(_)) => {
            let a: TaskArgs = match serde_json::from_value(args) {
                Ok(a) => a,
                Err(e) => return Ok(Reply::Json(tools::bad_arguments(&e.to_string()))),
            };
            let how = match (augmented, a.run_in_background) {
                (true, _) => How::Augmented,
                (false, true) => How::Background,
                (false, false) => How::Held(progress),
            };
            match submission(&ctx, &id, agent, a) {
                Ok(s) => task(ctx, id, s, how).await,
                Err(reply) => Ok(Reply::Json(reply)),
            }
        }
        ("task_get" | "task_wait" | "task_cancel", _) => {
            let a: IdArgs = match serde_json::from_value(args) {
                Ok(a) => a,
                Err(e) => return Ok(Reply::Json(tools::bad_arguments(&e.to_string()))),
            };
            let Ok(task) = a.task_id.parse::<Uuid>() else {
                return Ok(Reply::Json(tools::bad_arguments("task_id: not a task id")));
            };
            let room = &ctx.st.room();
            let scope = ctx.scope();
            let r = match p.name.as_str() {
                "task_get" => room.get(&scope, task).await,
                "task_cancel" => room.cancel(&scope, task).await,
                _ => {
                    let bound =
                        bound(&ctx, progress.is_some()).min(Duration::from_secs(a.wait_seconds.unwrap_or(u64::MAX)));
                    if progress.is_some() || ctx.elicits() {
                        return Ok(follow(ctx, id, Start::Task(task), Until::Bound(bound), progress, None));
                    }
                    room.join(&scope, task, bound).await.map(|j| j.task)
                }
            };
            Ok(Reply::Json(match r {
                Ok(t) => tools::result(&t),
                Err(e) if e.is_client_error() => tools::refused(&e),
                Err(e) => return Err(internal(e)),
            }))
        }
        (other, _) => Err(RpcError::params(format!("unknown tool: {other}"))),
    }
}

/// The submission a call of `task` (or of `agent_<name>`) makes, or the tool result refusing its
/// arguments.
fn submission(ctx: &Ctx, id: &Value, agent: Option<&str>, a: TaskArgs) -> Result<Submission, Value> {
    let resume_from = match a.resume.as_deref().map(str::parse::<Uuid>) {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(_)) => return Err(tools::bad_arguments("resume: not a task id")),
    };
    let subagent_type = match (agent, a.subagent_type) {
        (Some(name), None) => Some(name.to_string()),
        (Some(_), Some(_)) => return Err(tools::bad_arguments("subagent_type: this tool's agent type is its name")),
        // A resumed task keeps its agent type unless the call names one.
        (None, None) if resume_from.is_some() => None,
        (None, None) => return Err(tools::bad_arguments("missing field `subagent_type`")),
        (None, t) => t,
    };
    let request = TaskRequest {
        prompt: a.prompt,
        subagent_type,
        description: Some(a.description),
        model: a.model,
        max_turns: a.max_turns,
        parent_context: a.parent_context,
        output_schema: a.output_schema,
        workspace: a.workspace,
        environment: a.environment,
        resume_from,
        ..TaskRequest::default()
    };
    Ok(Submission {
        // A background call is a request like any other: its retry starts no second task.
        idempotency_key: Some(ctx.key_of(id)),
        depth: ctx.depth.clone(),
        traceparent: ctx.traceparent.clone(),
        api_key: ctx.key_prefix.clone(),
        ..Submission::new(ctx.tenant.clone(), request)
    })
}

/// How long a call waits for its task: longer when the client asked for progress (it resets its
/// timeout on each notification).
fn bound(ctx: &Ctx, progress: bool) -> Duration {
    let c = ctx.st.room().config();
    Duration::from_secs(if progress { c.mcp_progress_wait_seconds } else { c.mcp_wait_seconds })
}

/// How a call of `task` is answered.
enum How {
    /// An MCP task at once (the call named `task`).
    Augmented,
    /// The task's id at once (`run_in_background`).
    Background,
    /// Held for the task's end, within a bound (with progress for this token).
    Held(Option<Value>),
}

/// Start the task of a `task` call and answer: at once for a task-augmented or background call,
/// else after waiting for it (on a stream when there is progress to send or a client to ask). A
/// call held open is noted under its session until it answers, so that ending the session
/// cancels its task.
async fn task(ctx: Ctx, id: Value, s: Submission, how: How) -> Result<Reply, RpcError> {
    let progress = match how {
        How::Held(p) => p,
        How::Augmented => return augmented(&ctx, s).await,
        How::Background => {
            return Ok(Reply::Json(match ctx.st.room().create(s, None).await {
                Ok(c) => tools::started(&c.task, ctx.st.room().config().mcp_wait_seconds),
                Err(e) if e.is_client_error() => tools::refused(&e),
                Err(e) => return Err(internal(e)),
            }))
        }
    };
    let key = ctx.key_of(&id);
    match ctx.st.res.mcp_call_started(&ctx.session, &key).await {
        Ok(true) => {}
        // Ended by its client since this request began: it starts nothing.
        Ok(false) => return Err(RpcError::new(-32001, "session not found: it has ended; initialize a new one")),
        Err(e) => tracing::warn!(error = %e, "could not note an MCP call in flight"),
    }
    let bound = bound(&ctx, progress.is_some());
    if progress.is_none() && !ctx.elicits() {
        let r = ctx.st.room().create(s, Some(bound)).await;
        answered_call(&ctx, &key).await;
        return Ok(Reply::Json(match r {
            Ok(c) => tools::result(&c.task),
            Err(e) if e.is_client_error() => tools::refused(&e),
            Err(e) => return Err(internal(e)),
        }));
    }
    Ok(follow(ctx, id, Start::Submit(Box::new(s)), Until::Bound(bound), progress, None))
}

/// The answer to a task-augmented call: the task, or an error (a refusal starts no task, so it is
/// a JSON-RPC error naming the problem's code).
async fn augmented(ctx: &Ctx, s: Submission) -> Result<Reply, RpcError> {
    match ctx.st.room().create(s, None).await {
        Ok(c) => Ok(Reply::Json(json!({"task": tools::mcp_task(ctx, &c.task)}))),
        Err(e) if e.is_client_error() => {
            Err(RpcError::params(format!("{}: {e}", e.code())).with(json!({"code": e.code()})))
        }
        Err(e) => Err(internal(e)),
    }
}

/// A held call answered: its task no longer goes with its session.
async fn answered_call(ctx: &Ctx, key: &str) {
    if let Err(e) = ctx.st.res.mcp_call_answered(&ctx.session, key).await {
        tracing::warn!(error = %e, "could not note an MCP call answered");
    }
}

pub fn internal(e: crate::tasks::TaskError) -> RpcError {
    tracing::error!(error = %e, "MCP call failed");
    RpcError::internal()
}

/// Where a followed call starts: a task to submit, or one that exists.
pub enum Start {
    Submit(Box<Submission>),
    Task(Uuid),
}

/// How long a followed call follows its task: at most a bound, as a wait (under a wait hold the
/// room takes), or until the task ends (`tasks/result`), under the stream hold the caller took
/// — a hold of no bound is a stream.
pub enum Until {
    Bound(Duration),
    End(crate::tasks::guard::Hold),
}

/// Answer on a stream: submit (or find) the task, then follow it (`until`) — progress
/// for every finished turn when the call has a `progressToken`, an elicitation for each pending
/// action of a pause when the client can be asked — and end with the result (`related`: the MCP
/// task the stream answers `tasks/result` for).
pub fn follow(
    ctx: Ctx,
    id: Value,
    start: Start,
    until: Until,
    progress: Option<Value>,
    related: Option<Uuid>,
) -> Reply {
    // Bounded: a client that stops reading holds the producer back, not memory.
    let (tx, rx) = mpsc::channel::<Value>(8);
    // A call that starts its task is held open until it answers (`task`'s noting).
    let held = match &start {
        Start::Submit(s) => s.idempotency_key.clone(),
        Start::Task(_) => None,
    };
    tokio::spawn(async move {
        let end = produce(&ctx, &tx, start, until, progress, related).await;
        // A client that went away leaves its call noted: ending its session cancels the task.
        if let Some(key) = held.filter(|_| !tx.is_closed()) {
            answered_call(&ctx, &key).await;
        }
        let msg = match end {
            Ok(mut result) => {
                if let Some(task) = related {
                    result["_meta"] = json!({RELATED_TASK: {"taskId": task}});
                }
                rpc::result(&id, result)
            }
            Err(e) => rpc::error(Some(&id), &e),
        };
        let _ = tx.send(msg).await;
    });
    Reply::Stream(rx)
}

async fn produce(
    ctx: &Ctx,
    tx: &mpsc::Sender<Value>,
    start: Start,
    until: Until,
    progress: Option<Value>,
    related: Option<Uuid>,
) -> Result<Value, RpcError> {
    let room = ctx.st.room();
    let scope = ctx.scope();
    // With a progress token, the run's text as it streams goes out as progress messages: for a
    // task this call makes, subscribed before it is made, so none of it is missed; for one it
    // waits on, once the task is found to be the caller's and open.
    let ahead = match &start {
        Start::Submit(s) if progress.is_some() => Some(room.output_ahead(s.id)),
        _ => None,
    };
    // With a token, a notification at least every BEAT from here: a client that resets its
    // timeout on progress holds the call as long as the task runs.
    let mut note = Notifier { tx, token: progress.clone(), sent: Progress::default(), total: 0 };
    let task = match made(ctx, start, &mut note).await? {
        Ok(t) => t,
        Err(e) if e.is_client_error() => return Ok(tools::refused(&e)),
        Err(e) => return Err(internal(e)),
    };
    if task.status.is_terminal() {
        return Ok(tools::result(&task));
    }
    let output = progress.is_some().then(|| ahead.unwrap_or_else(|| room.output_ahead(task.id)));
    let mut steps = match until {
        // A wait: at the tenant's `max_waits` it is answered at once, as if it had run out.
        Until::Bound(bound) => match room.watch_waiting(&task, output).await {
            Ok(Some(events)) => room.steps(&scope, task.id, events, Some(tokio::time::Instant::now() + bound)).boxed(),
            Ok(None) => return Ok(tools::result(&task)),
            Err(e) => return Err(internal(e)),
        },
        Until::End(hold) => room.steps(&scope, task.id, room.watch(&task, 0, hold, output), None).boxed(),
    };
    // Text messages sent in the turn now running: progress between its turn's numbers.
    let mut texts_in_turn = (0u32, 0u32);
    let max_turns = task.max_turns.unwrap_or(0);
    note.total = max_turns;
    let beat = tokio::time::sleep(BEAT);
    tokio::pin!(beat);
    let mut asked: Vec<Uuid> = vec![];
    loop {
        let step = tokio::select! {
            step = steps.next() => step,
            _ = tx.closed() => return Err(RpcError::internal()),
            _ = &mut beat, if progress.is_some() => {
                note.send(None, "still running").await?;
                beat.as_mut().reset(tokio::time::Instant::now() + BEAT);
                continue;
            }
        };
        match step.ok_or_else(RpcError::internal)?.map_err(|_| RpcError::internal())? {
            Step::Output(d) if progress.is_some() => {
                if texts_in_turn.0 != d.turn {
                    texts_in_turn = (d.turn, 0);
                }
                texts_in_turn.1 += 1;
                // Turn n's text counts from n - 1 towards n (its checkpoint), never reaching it.
                let p = f64::from(d.turn.saturating_sub(1)) + 1.0 - 1.0 / f64::from(1 + texts_in_turn.1);
                note.send(Some(p), &d.text).await?;
                beat.as_mut().reset(tokio::time::Instant::now() + BEAT);
            }
            Step::Turn(turn, _) if progress.is_some() => {
                note.send(Some(f64::from(turn)), &format!("turn {turn} of {max_turns} done")).await?;
                beat.as_mut().reset(tokio::time::Instant::now() + BEAT);
            }
            Step::Paused(now) => {
                if !ctx.elicits() {
                    return Ok(tools::result(&now));
                }
                for a in now.pending_actions.iter().flatten() {
                    if asked.contains(&a.id) {
                        continue;
                    }
                    asked.push(a.id);
                    if tx.send(elicitation(ctx, a, related)).await.is_err() {
                        return Err(RpcError::internal());
                    }
                }
            }
            Step::Ended(now) => return Ok(tools::result(&now)),
            _ => {}
        }
    }
}

/// The task a call follows, made (a waiting caller's: it may start in this process at once) or
/// read; while that takes (an admission or an insert held up), a notification every BEAT.
async fn made(ctx: &Ctx, start: Start, note: &mut Notifier<'_>) -> Result<Result<TaskView, TaskError>, RpcError> {
    let room = &ctx.st.room();
    let scope = ctx.scope();
    let made = async move {
        match start {
            Start::Submit(s) => room.create_followed(*s).await.map(|c| c.task),
            Start::Task(id) => room.get(&scope, id).await,
        }
    };
    tokio::pin!(made);
    loop {
        tokio::select! {
            t = &mut made => return Ok(t),
            _ = tokio::time::sleep(BEAT), if note.token.is_some() => note.send(None, "starting").await?,
        }
    }
}

/// The longest a call with a progress token goes without a notification (MCP clients that reset
/// their timeout on progress are told at least every 20 s).
const BEAT: Duration = Duration::from_secs(15);

/// A call's progress notifications (none without a token), the task's turn budget as their total.
struct Notifier<'a> {
    tx: &'a mpsc::Sender<Value>,
    token: Option<Value>,
    sent: Progress,
    total: u32,
}

impl Notifier<'_> {
    async fn send(&mut self, wanted: Option<f64>, message: &str) -> Result<(), RpcError> {
        let Some(token) = &self.token else { return Ok(()) };
        let mut n = json!({"progressToken": token, "progress": self.sent.next(wanted), "message": message});
        if self.total > 0 {
            n["total"] = json!(self.total);
        }
        self.tx.send(rpc::notification("notifications/progress", n)).await.map_err(|_| RpcError::internal())
    }
}

/// The progress values a call has sent: each one greater than the last, as MCP requires.
#[derive(Default)]
struct Progress {
    last: f64,
}

impl Progress {
    /// `wanted` if it is past the last value sent, else a small step towards the next whole
    /// turn that never reaches it (a thousandth, or half the way when that is less: thousands of
    /// beats in one turn before the steps grow too small for an f64).
    fn next(&mut self, wanted: Option<f64>) -> f64 {
        let p = match wanted {
            Some(w) if w > self.last => w,
            _ => self.last + ((self.last.floor() + 1.0 - self.last) / 2.0).min(0.001),
        };
        self.last = p;
        p
    }
}

/// The question that answers one pending action, as an `elicitation/create` request whose id
/// names the action.
fn elicitation(ctx: &Ctx, a: &ActionRow, related: Option<Uuid>) -> Value {
    let (message, schema) = match a.kind {
        Gate::Approval => (
            format!("A sub-agent wants to call `{}` with {}. Approve it?", a.name, a.arguments),
            json!({"type": "object", "properties": {
                "decision": {"type": "string", "enum": ["approve", "deny"], "description": "approve: the call runs; deny: the sub-agent is told it may not"},
                "message": {"type": "string", "description": "Why (shown to the sub-agent on a denial)."}
            }, "required": ["decision"]}),
        ),
        Gate::Output => (
            format!("A sub-agent calls `{}` with {}: give its output.", a.name, a.arguments),
            json!({"type": "object", "properties": {
                "output": {"type": "string", "description": "The tool's result (JSON is stored as JSON)."}
            }, "required": ["output"]}),
        ),
    };
    let mut params = json!({"message": message, "requestedSchema": schema});
    if ctx.version == super::V_2025_11_25 {
        params["mode"] = json!("form");
    }
    if let Some(task) = related {
        params["_meta"] = json!({RELATED_TASK: {"taskId": task}});
    }
    rpc::request(&format!("elicit:{}", a.id), "elicitation/create", params)
}

/// The client's answer to an elicitation, stored like `POST /tasks/{id}/actions` stores one (who
/// answered: the key of the request that carried it). `decline` is a denial (for an output, an
/// output saying so); `cancel` leaves the action pending.
pub async fn answered(ctx: &Ctx, id: &Value, result: Option<Value>, error: Option<Value>) {
    let Some(action) = id.as_str().and_then(|s| s.strip_prefix("elicit:")).and_then(|s| s.parse::<Uuid>().ok()) else {
        return;
    };
    if let Some(e) = error {
        tracing::info!(action = %action, error = %e, "an elicitation was answered with an error: the action stays pending");
        return;
    }
    let Some(result) = result else { return };
    let room = &ctx.st.room();
    let scope = ctx.scope();
    let kind = match room.action(&ctx.tenant, action).await {
        Ok(Some(a)) => a.kind,
        _ => return,
    };
    let content = result.get("content").cloned().unwrap_or_else(|| json!({}));
    let answer = match (result["action"].as_str(), kind) {
        (Some("accept"), Gate::Approval) => {
            let message = content["message"].as_str().map(str::to_string).filter(|m| !m.is_empty());
            match content["decision"].as_str() {
                Some("approve") => ActionAnswer::approve(action, message),
                Some("deny") => ActionAnswer::deny(action, message),
                _ => return,
            }
        }
        (Some("accept"), Gate::Output) => {
            let text = match &content["output"] {
                Value::String(s) => s.clone(),
                Value::Null => return,
                other => other.to_string(),
            };
            // Stored as JSON when it is JSON, as a string otherwise.
            ActionAnswer::output(action, serde_json::from_str(&text).unwrap_or(Value::String(text)))
        }
        (Some("decline"), Gate::Approval) => ActionAnswer::deny(action, Some("declined".into())),
        (Some("decline"), Gate::Output) => {
            ActionAnswer::output(action, json!("(the user declined to give this tool's output)"))
        }
        _ => return,
    };
    if let Err(e) = room.answer_action(&scope, &ctx.answerer(), answer).await {
        tracing::info!(action = %action, error = %e, "an elicitation's answer was not taken");
    }
}

/// The task a `tasks/result` follows: terminal, or paused where the client cannot be asked, is
/// answered at once.
pub fn settled_for(ctx: &Ctx, t: &TaskView) -> bool {
    t.status.is_terminal() || (t.status == TaskStatus::RequiresAction && !ctx.elicits())
}
