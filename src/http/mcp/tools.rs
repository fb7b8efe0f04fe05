//! The door's tools, as `tools/list` offers them, and a task as a tool's result.
//!
//! `task` is the seeds' tool: `subagent_type` (the tenant's agent types, each named with its
//! one-line description), `description` and `prompt`, plus the task's options a caller may want
//! (`model`, `max_turns`, `parent_context`, `output_schema`). `task_get`, `task_wait` and
//! `task_cancel` follow a task by its id, for clients that give a call about a minute and do
//! not speak MCP tasks. The list is made afresh for every `tools/list`, so it follows the
//! tenant's agents as they change.

use serde_json::{json, Value};

use super::rpc::RpcError;
use super::Ctx;
use crate::kinds::TaskStatus;
use crate::tasks::{TaskError, TaskView};

/// What every result of a task carries as `structuredContent` (its `outputSchema`).
pub fn task_output_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "task_id": {"type": "string"},
            "status": {"type": "string", "description": "scheduled, queued, running, requires_action, completed, incomplete, failed, cancelled"},
            "stop_reason": {"type": ["string", "null"]},
            "summary": {"type": ["string", "null"], "description": "the sub-agent's one summary"},
            "output": {"description": "with an output_schema: the final answer's value"},
            "usage": {"type": "object"},
            "cost_usd": {"type": "number"},
            "error": {"type": ["object", "null"]},
            "pending_actions": {"type": "array", "description": "while paused: what the task waits for"},
            "diff": {
                "type": "object",
                "description": "with a writable copy of its workspace, once its run ended: the counts of its changes and `patch`, the unified diff (git apply takes it; as GET /tasks/{id}/diff)",
                "properties": {
                    "files_changed": {"type": "integer"},
                    "lines_added": {"type": "integer"},
                    "lines_removed": {"type": "integer"},
                    "binary_files": {"type": "integer"},
                    "bytes": {"type": "integer"},
                    "omitted": {"type": "array", "items": {"type": "string"}},
                    "omitted_more": {"type": "integer", "minimum": 1},
                    "patch": {"type": "string"}
                }
            }
        },
        "required": ["task_id", "status"]
    })
}

fn id_input(what: &str) -> Value {
    json!({"type": "object", "properties": {"task_id": {"type": "string", "description": what}}, "required": ["task_id"]})
}

/// The tenant's agent types, each with its one-line description.
async fn agents(ctx: &Ctx) -> Result<Vec<(String, String)>, RpcError> {
    let all = ctx.st.res.described(Some(&ctx.tenant)).await.map_err(|_| RpcError::internal())?;
    Ok(all.into_iter().map(|d| (d.name, d.line)).collect())
}

fn task_input(agents: &[(String, String)]) -> Value {
    let names: Vec<&str> = agents.iter().map(|a| a.0.as_str()).collect();
    json!({
        "type": "object",
        "properties": {
            "subagent_type": {"type": "string", "enum": names, "description": "The sub-agent's type."},
            "description": {"type": "string", "maxLength": 80, "description": "A short title (at most 80 characters), for logs; the sub-agent does not see it."},
            "prompt": {"type": "string", "description": "The task itself. Say what the one summary it returns should hold."},
            "model": {"type": "string", "description": "provider/model (default: the agent's, else the service's)."},
            "max_turns": {"type": "integer", "minimum": 1, "description": "Turn budget (clamped to 50)."},
            "parent_context": {"type": "string", "description": "Context from the caller, put into the sub-agent's system prompt."},
            "output_schema": {"type": "object", "description": "A JSON Schema the final answer must satisfy; its value comes back as `output`."},
            "run_in_background": {"type": "boolean", "description": "Answer at once with the task_id instead of waiting: the sub-agent runs on its own (even after this session ends); follow it with task_wait (its result) or task_get (a look)."},
            "resume": {"type": "string", "description": "The task_id of a finished task to continue: its sub-agent goes on with its whole conversation and this prompt (the same agent type and model unless given)."},
            "workspace": {
                "type": "object",
                "description": "Code for the sub-agent to read with list_directory, glob, grep and read_file: a git repository at a ref ({\"git\": URL, \"ref\": branch, tag or commit, \"secret\": the name of a stored token for a private one}) or an uploaded workspace ({\"name\": …}).",
                "properties": {
                    "git": {"type": "string", "description": "An http(s) repository URL."},
                    "ref": {"type": "string", "description": "A branch, tag or full commit id (default: the default branch)."},
                    "secret": {"type": "string", "description": "The name of the tenant's secret holding a private repository's token."},
                    "name": {"type": "string", "description": "An uploaded workspace's name."},
                    "web": {"type": "boolean", "description": "Also offer the web tools beside a private workspace, where the tenant allows it."}
                },
                "additionalProperties": false
            },
            "environment": {
                "type": "object",
                "description": "The OCI image the sub-agent's commands (run_command) run in, with the workspace at /workspace: {\"image\": \"host[:port]/repo:tag\"} (default: the service's).",
                "properties": {
                    "image": {"type": "string", "description": "An OCI image reference from an allowed registry."}
                },
                "required": ["image"],
                "additionalProperties": false
            }
        },
        "required": ["subagent_type", "description", "prompt"],
        "additionalProperties": false
    })
}

/// `tools/list`: `task` (not from inside a sub-agent: one level deep), the follow-up tools, and,
/// when configured, one tool per agent type.
pub async fn list(ctx: &Ctx) -> Result<Value, RpcError> {
    let mut tools = vec![];
    let optional = |mut t: Value| {
        if ctx.tasks_supported() {
            t["execution"] = json!({"taskSupport": "optional"});
        }
        t
    };
    if !ctx.nested() {
        let agents = agents(ctx).await?;
        let lines: Vec<String> = agents.iter().map(|(n, d)| format!("- {n}: {d}")).collect();
        tools.push(optional(json!({
            "name": "task",
            "title": "Delegate to a sub-agent",
            "description": format!(
                "Launch a sub-agent with a fresh conversation and its type's tools to do one focused task, and get \
                 back a single summary (you do not see its tool calls). Sub-agents cannot start sub-agents. If the \
                 task takes longer than the call waits, the result says it is still running and names its task_id: \
                 follow it with task_wait. With run_in_background the call answers at once with the task_id (run \
                 several in parallel that way); resume continues a finished task with a new prompt.\n\nAgent types:\n{}",
                lines.join("\n")
            ),
            "inputSchema": task_input(&agents),
            "outputSchema": task_output_schema(),
            "annotations": {"readOnlyHint": false, "destructiveHint": false, "openWorldHint": true},
        })));
        if ctx.st.room().config().mcp_tool_per_agent {
            for (name, line) in &agents {
                let mut input = task_input(&agents);
                input["properties"].as_object_mut().map(|p| p.remove("subagent_type"));
                input["required"] = json!(["description", "prompt"]);
                tools.push(optional(json!({
                    "name": format!("agent_{name}"),
                    "description": format!("Run the {name} sub-agent ({line}) on one task; one summary back."),
                    "inputSchema": input,
                    "outputSchema": task_output_schema(),
                })));
            }
        }
    }
    for (name, what) in [
        ("task_get", "A task started earlier: its status and, once it ended, its summary."),
        ("task_wait", "Wait (about as long as a `task` call does, or wait_seconds) for a task started earlier, and get its result."),
        ("task_cancel", "Cancel a task started earlier; the result is the task as it stands."),
    ] {
        let mut input = id_input("The task_id a `task` call returned.");
        if name == "task_wait" {
            input["properties"]["wait_seconds"] = json!({"type": "integer", "minimum": 0,
                "description": "Wait at most this long (default and most: about as long as a `task` call waits); less when your tool calls time out sooner."});
        }
        tools.push(json!({
            "name": name,
            "description": what,
            "inputSchema": input,
            "outputSchema": task_output_schema(),
            "annotations": {"readOnlyHint": name == "task_get", "destructiveHint": name == "task_cancel"},
        }));
    }
    Ok(json!({"tools": tools}))
}

/// A cancelled task's error code and message (its own, else `cancelled` and what happened).
fn cancelled(t: &TaskView) -> (String, String) {
    let e = t.error.as_ref();
    let code = e.and_then(|e| e["code"].as_str()).unwrap_or("cancelled").to_string();
    let message = e.and_then(|e| e["message"].as_str()).map(str::to_string).unwrap_or_else(|| {
        let when = if t.started_at.is_some() { "while it ran" } else { "before it started" };
        format!("task {} was cancelled {when}; its usage so far is in the result", t.id)
    });
    (code, message)
}

/// The task as a tool's structured result.
fn structured(t: &TaskView) -> Value {
    let mut s = json!({
        "task_id": t.id, "status": t.status, "stop_reason": t.stop_reason, "summary": t.summary,
        "usage": t.usage, "cost_usd": t.cost_usd, "error": t.error,
    });
    if t.status == TaskStatus::Cancelled && t.error.is_none() {
        let (code, message) = cancelled(t);
        s["error"] = json!({"code": code, "message": message});
    }
    if let Some(o) = &t.output {
        s["output"] = o.clone();
    }
    if let Some(p) = &t.pending_actions {
        s["pending_actions"] = json!(p);
    }
    if let Some(d) = &t.diff {
        s["diff"] = d.clone();
        // A single task's view carries its patch (`TaskView::one`).
        if let Some(p) = &t.patch {
            s["diff"]["patch"] = Value::String(p.clone());
        }
    }
    s
}

/// How to answer a paused task without elicitation.
fn pause_text(t: &TaskView) -> String {
    let waits: Vec<String> = t
        .pending_actions
        .iter()
        .flatten()
        .map(|a| format!("- action {} ({} of `{}` with {})", a.id, a.kind, a.name, a.arguments))
        .collect();
    format!(
        "Task {} is paused: it waits for these answers:\n{}\nAnswer each by its id with POST /tasks/{}/actions \
         ([{{\"id\": ..., \"decision\": \"approve\" | \"deny\"}}] or [{{\"id\": ..., \"output\": ...}}]) or in the \
         console, then follow the task with task_wait.",
        t.id,
        waits.join("\n"),
        t.id
    )
}

/// A task as a `tools/call` result: a summary for a task that ended well, an error for one that
/// failed or was cancelled, what it waits for when paused, and its id while it runs.
pub fn result(t: &TaskView) -> Value {
    let (text, is_error) = match t.status {
        TaskStatus::Completed => (t.summary.clone().unwrap_or_default(), false),
        TaskStatus::Incomplete => {
            let reason = t.stop_reason.map_or("incomplete", |r| r.as_str());
            (format!("(incomplete: {reason}) {}", t.summary.clone().unwrap_or_default()), false)
        }
        TaskStatus::Failed => {
            let e = t.error.clone().unwrap_or_default();
            (format!("The task failed ({}): {}", e["code"].as_str().unwrap_or("failed"), e["message"].as_str().unwrap_or("")), true)
        }
        TaskStatus::Cancelled => {
            let (code, message) = cancelled(t);
            (format!("The task was cancelled ({code}): {message}"), true)
        }
        TaskStatus::RequiresAction => (pause_text(t), false),
        TaskStatus::Scheduled | TaskStatus::Queued | TaskStatus::Running => (
            format!(
                "Task {} is still running. Call task_wait with task_id \"{}\" to wait for its result, or task_get to look.",
                t.id, t.id
            ),
            false,
        ),
    };
    json!({"content": [{"type": "text", "text": text}], "structuredContent": structured(t), "isError": is_error})
}

/// The answer to a `run_in_background` call: the task's id, and how to follow it.
pub fn started(t: &TaskView, wait_seconds: u64) -> Value {
    let text = format!(
        "Started task {id} in the background (now {status}); it runs on its own. To get its result, call task_wait \
         with task_id \"{id}\" (each call waits up to about {wait_seconds} s, less with wait_seconds if your tool \
         calls time out sooner; call it again while it runs); task_get looks without waiting, and task_cancel stops it.",
        id = t.id,
        status = t.status.as_str(),
    );
    json!({"content": [{"type": "text", "text": text}], "structuredContent": structured(t), "isError": false})
}

/// A refusal as a tool's error result: it names the problem's code (and the field at fault), and
/// started nothing.
pub fn refused(e: &TaskError) -> Value {
    let text = format!("{}: {e}", e.code());
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

/// A tool's arguments that are not what its schema says.
pub fn bad_arguments(message: &str) -> Value {
    json!({"content": [{"type": "text", "text": format!("invalid arguments: {message}")}], "isError": true})
}

/// How often a client may poll a task.
const POLL_MS: u64 = 1000;

/// The service's task as an MCP task.
pub fn mcp_task(ctx: &Ctx, t: &TaskView) -> Value {
    let (status, message) = match t.status {
        TaskStatus::Scheduled => (
            "working",
            Some(format!("scheduled: it starts at {}", t.run_at.map_or_else(String::new, |r| r.to_rfc3339()))),
        ),
        TaskStatus::Queued => ("working", Some("queued".to_string())),
        TaskStatus::Running => ("working", None),
        TaskStatus::RequiresAction => {
            ("input_required", Some("paused: it waits for an answer to a pending action".into()))
        }
        TaskStatus::Completed => ("completed", None),
        TaskStatus::Incomplete => {
            ("completed", Some(format!("incomplete: stopped by {}", t.stop_reason.map_or("a limit", |r| r.as_str()))))
        }
        TaskStatus::Failed => ("failed", t.error.as_ref().and_then(|e| e["message"].as_str()).map(str::to_string)),
        TaskStatus::Cancelled => ("cancelled", None),
    };
    let updated = [Some(t.created_at), t.started_at, t.finished_at].into_iter().flatten().max().unwrap_or(t.created_at);
    let days = ctx.st.room().config().retention_days;
    let ttl = if days == 0 { Value::Null } else { json!(u64::from(days) * 86_400_000) };
    let mut v = json!({
        "taskId": t.id, "status": status, "createdAt": t.created_at, "lastUpdatedAt": updated,
        "ttl": ttl, "pollInterval": POLL_MS,
    });
    if let Some(m) = message {
        v["statusMessage"] = json!(m);
    }
    v
}
