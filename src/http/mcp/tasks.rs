//! MCP tasks (2025-11-25): a task-augmented `tools/call` answers at once with the task; its
//! id is the service's task id, so the same run is in `GET /tasks/{id}`, the console and the
//! ledger. `tasks/get`, `tasks/list` (the tenant's, paged), `tasks/cancel`, and `tasks/result`,
//! which waits for the end (asking the client for input meanwhile, if it can be asked) and then
//! answers as a plain call would, with the related-task metadata.

use serde_json::{json, Value};
use uuid::Uuid;

use super::calls::{self, Start, Until};
use super::rpc::RpcError;
use super::tools::mcp_task;
use super::{Ctx, Reply};
use crate::tasks::list::ListRequest;
use crate::tasks::{TaskError, CANCEL_SETTLE};

fn task_id(params: &Value) -> Result<Uuid, RpcError> {
    params
        .get("taskId")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| RpcError::params("taskId: a task id is required"))
}

fn not_found(e: TaskError) -> RpcError {
    match e {
        TaskError::NotFound => RpcError::params("Failed to retrieve task: Task not found"),
        e => calls::internal(e),
    }
}

pub async fn handle(ctx: Ctx, id: Value, method: &str, params: Value) -> Result<Reply, RpcError> {
    let room = &ctx.st.room();
    let scope = ctx.scope();
    match method {
        "tasks/get" => {
            let t = room.get(&scope, task_id(&params)?).await.map_err(not_found)?;
            Ok(Reply::Json(mcp_task(&ctx, &t)))
        }
        "tasks/list" => {
            let q = ListRequest {
                cursor: params.get("cursor").and_then(Value::as_str).map(str::to_string),
                limit: Some(50),
                ..ListRequest::default()
            };
            let page = room.list(&scope, &q).await.map_err(|e| match e {
                TaskError::BadParam { .. } => RpcError::params("invalid cursor"),
                e => calls::internal(e),
            })?;
            let tasks: Vec<Value> = page.tasks.iter().map(|t| mcp_task(&ctx, t)).collect();
            let mut r = json!({"tasks": tasks});
            if let Some(c) = page.next_cursor {
                r["nextCursor"] = json!(c);
            }
            Ok(Reply::Json(r))
        }
        "tasks/cancel" => {
            let id = task_id(&params)?;
            let before = room.get(&scope, id).await.map_err(not_found)?;
            if before.status.is_terminal() {
                return Err(RpcError::params(format!(
                    "Cannot cancel task: already in terminal status '{}'",
                    mcp_task(&ctx, &before)["status"].as_str().unwrap_or("")
                )));
            }
            let t = room.cancel_settled(&scope, id, CANCEL_SETTLE).await.map_err(not_found)?;
            Ok(Reply::Json(mcp_task(&ctx, &t)))
        }
        "tasks/result" => {
            let task = task_id(&params)?;
            let t = room.get(&scope, task).await.map_err(not_found)?;
            let meta = json!({calls::RELATED_TASK: {"taskId": task}});
            if calls::settled_for(&ctx, &t) {
                let mut r = super::tools::result(&t);
                r["_meta"] = meta;
                return Ok(Reply::Json(r));
            }
            // It blocks until the task ends, however long that is: a held connection of no
            // bound, so a stream's hold (beyond the tenant's `max_streams`: 429, as every stream).
            let hold = match room.stream_hold(&t.tenant).await {
                Ok(h) => h,
                Err(e @ TaskError::StreamLimit { .. }) => return Ok(Reply::Refused(e)),
                Err(e) => return Err(calls::internal(e)),
            };
            Ok(calls::follow(ctx.clone(), id, Start::Task(task), Until::End(hold), None, Some(task)))
        }
        _ => Err(RpcError::new(super::rpc::METHOD_NOT_FOUND, format!("method not found: {method}"))),
    }
}
