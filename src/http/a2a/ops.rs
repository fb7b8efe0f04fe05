//! `GetTask`, `ListTasks`, `CancelTask`, `SubscribeToTask`: each a room operation on the
//! caller's tasks (at a per-agent URL, that agent type's only).

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::errors::{A2aError, Kind};
use super::{params, stream, Ctx};
use crate::a2a::{statuses_of, Shown};
use crate::tasks::context::ContextRow as A2aTask;
use crate::tasks::list::ListFilter;
use crate::tasks::{TaskView, CANCEL_SETTLE};

/// The caller's task named `id` (at a per-agent URL, of that agent type): another tenant's, or
/// an id that is not one, is not found.
pub async fn task_of(ctx: &Ctx, id: &str) -> Result<TaskView, A2aError> {
    let id: Uuid = id.parse().map_err(|_| A2aError::not_found())?;
    let t = ctx.st.room().get(&ctx.scope(), id).await?;
    if ctx.agent.as_ref().is_some_and(|a| *a != t.subagent_type) {
        return Err(A2aError::not_found());
    }
    Ok(t)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct IdParams {
    id: String,
    #[serde(default)]
    history_length: Option<i64>,
}

pub async fn get(ctx: &Ctx, p: Value) -> Result<Value, A2aError> {
    let p: IdParams = params("GetTask", p)?;
    let history = history_length(p.history_length)?;
    let t = task_of(ctx, &p.id).await?;
    let a2a = ctx.st.room().context(t.id).await?;
    Ok(Shown { task: &t, a2a: a2a.as_ref() }.task(history, true))
}

pub async fn cancel(ctx: &Ctx, p: Value) -> Result<Value, A2aError> {
    let p: IdParams = params("CancelTask", p)?;
    let t = task_of(ctx, &p.id).await?;
    if t.status.is_terminal() {
        return Err(A2aError::new(
            Kind::TaskNotCancelable,
            format!("task {} is {}: it cannot be canceled", t.id, t.status),
        ));
    }
    let room = &ctx.st.room();
    let t = room.cancel_settled(&ctx.scope(), t.id, CANCEL_SETTLE).await?;
    let a2a = room.context(t.id).await?;
    Ok(Shown { task: &t, a2a: a2a.as_ref() }.task(None, true))
}

pub async fn subscribe(ctx: Ctx, p: Value) -> Result<mpsc::Receiver<Result<Value, A2aError>>, A2aError> {
    let p: IdParams = params("SubscribeToTask", p)?;
    let room = ctx.st.room().clone();
    let id: Uuid = p.id.parse().map_err(|_| A2aError::not_found())?;
    // Read before the task: whatever happens after its snapshot is followed.
    let after = room.last_seq(&ctx.scope(), id).await?;
    let t = task_of(&ctx, &p.id).await?;
    if t.status.is_terminal() {
        return Err(A2aError::new(
            Kind::UnsupportedOperation,
            format!("task {} is {}: an ended task has no updates to subscribe to (GetTask reads it)", t.id, t.status),
        ));
    }
    let hold = room.stream_hold(&ctx.tenant).await?;
    let a2a = room.context(t.id).await?;
    Ok(stream::follow(ctx, t, a2a, after, hold, None, None))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListParams {
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    page_size: Option<i64>,
    #[serde(default)]
    page_token: Option<String>,
    #[serde(default)]
    history_length: Option<i64>,
    #[serde(default)]
    status_timestamp_after: Option<String>,
    #[serde(default)]
    include_artifacts: Option<bool>,
}

fn bad(field: &str, message: String) -> A2aError {
    A2aError::params(format!("{field}: {message}")).meta("field", field)
}

/// The caller's tasks, newest first, filtered and paged (cursor: the last task's id).
pub async fn list(ctx: &Ctx, p: Value) -> Result<Value, A2aError> {
    let p: ListParams = params("ListTasks", p)?;
    let history = history_length(p.history_length)?;
    // 0 is how protobuf's JSON writes an unset number: the default.
    let page_size = p.page_size.filter(|n| *n != 0).unwrap_or(50);
    if !(1..=100).contains(&page_size) {
        return Err(bad("pageSize", "must be between 1 and 100".into()));
    }
    let statuses = match p.status.as_deref().filter(|s| !s.is_empty() && *s != "TASK_STATE_UNSPECIFIED") {
        None => None,
        Some(s) => Some(statuses_of(s).ok_or_else(|| bad("status", format!("{s:?} is not a TaskState")))?),
    };
    if statuses.as_ref().is_some_and(Vec::is_empty) {
        // REJECTED and AUTH_REQUIRED: no stored task is ever either.
        return Ok(json!({"tasks": [], "nextPageToken": "", "pageSize": page_size, "totalSize": 0}));
    }
    let before_id = match p.page_token.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => Some(t.parse::<Uuid>().map_err(|_| bad("pageToken", "not a token this service gave".into()))?),
    };
    let changed_after = match p.status_timestamp_after.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => Some(
            chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|_| bad("statusTimestampAfter", format!("{t:?} is not an RFC 3339 timestamp")))?
                .with_timezone(&chrono::Utc),
        ),
    };
    let f = ListFilter {
        statuses: statuses.unwrap_or_default(),
        subagent_type: ctx.agent.clone(),
        changed_after,
        a2a_context: p.context_id.filter(|c| !c.is_empty()),
        before_id,
        limit: page_size,
        ..ListFilter::default()
    };
    let room = &ctx.st.room();
    let (page, total) = room.page(&ctx.scope(), f, true).await?;
    let ids: Vec<Uuid> = page.tasks.iter().map(|t| t.id).collect();
    let rows: HashMap<Uuid, A2aTask> = room.contexts(&ids).await?.into_iter().map(|r| (r.task_id, r)).collect();
    let artifacts = p.include_artifacts.unwrap_or(false);
    let tasks: Vec<Value> =
        page.tasks.iter().map(|t| Shown { task: t, a2a: rows.get(&t.id) }.task(history, artifacts)).collect();
    Ok(json!({
        "tasks": tasks,
        "nextPageToken": page.next_cursor.unwrap_or_default(),
        "pageSize": page_size,
        "totalSize": total.unwrap_or(0),
    }))
}

pub fn history_length(n: Option<i64>) -> Result<Option<usize>, A2aError> {
    match n {
        Some(n) if !(0..=i32::MAX as i64).contains(&n) => {
            Err(A2aError::params("historyLength: must be 0 to 2147483647").meta("field", "historyLength"))
        }
        n => Ok(n.map(|n| n as usize)),
    }
}
