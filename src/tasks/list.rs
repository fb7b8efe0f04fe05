//! Many tasks at once: a filtered, keyset-paged list, and the cancel of every task matching a
//! filter. The filters arrive as a door received them (strings) and are checked here, once for
//! every door.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::end::{self, End, Ended};
use super::{Lifecycle, Scope, TaskError, TaskView};
use crate::engine::agents::AgentType;
use crate::kinds::TaskStatus;
pub use crate::store::tasks::ListFilter;
use crate::store::tasks::{self as store, CancelFilter};

/// What a list asks for (`GET /tasks`'s query): every field optional, as received.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListRequest {
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub subagent_type: Option<String>,
    /// `provider/model`.
    #[serde(default)]
    pub model: Option<String>,
    /// A JSON object the task's metadata must contain.
    #[serde(default)]
    pub metadata: Option<String>,
    /// The admin's reads: one tenant's tasks (default: every tenant's).
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub created_after: Option<String>,
    #[serde(default)]
    pub created_before: Option<String>,
    /// 1 to 200 (default 50).
    #[serde(default)]
    pub limit: Option<i64>,
    /// The previous page's `next_cursor`.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// One page of tasks, newest first.
#[derive(Debug, serde::Serialize)]
pub struct Page {
    pub tasks: Vec<TaskView>,
    /// Pass as `cursor` for the next page; `None` on the last.
    pub next_cursor: Option<String>,
}

/// Which of the caller's tasks to cancel (`POST /tasks/cancel`'s body).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkCancel {
    /// Among `scheduled`, `queued`, `running` and `requires_action` (default: all four).
    #[serde(default)]
    pub status: Option<Vec<String>>,
    /// Only tasks whose metadata contains this object.
    #[serde(default)]
    pub metadata: Option<Value>,
}

/// What a bulk cancel did.
#[derive(Debug, Default, serde::Serialize)]
pub struct CancelledMany {
    /// Queued or paused: cancelled now.
    pub cancelled: Vec<Uuid>,
    /// Running: their workers were told, and stop them.
    pub cancel_requested: Vec<Uuid>,
}

fn time_param(field: &str, v: &Option<String>) -> Result<Option<DateTime<Utc>>, TaskError> {
    v.as_deref()
        .map(|s| {
            DateTime::parse_from_rfc3339(s)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|_| TaskError::bad_param(field, format!("{s:?} is not an RFC 3339 timestamp")))
        })
        .transpose()
}

/// The status a door names, or a refusal listing the statuses.
pub fn status_param(s: &str) -> Result<TaskStatus, TaskError> {
    TaskStatus::parse(s).ok_or_else(|| {
        let all: Vec<&str> = TaskStatus::ALL.iter().map(|t| t.as_str()).collect();
        TaskError::bad_param("status", format!("{s:?} is not one of {}", all.join(", ")))
    })
}

impl ListRequest {
    /// The tenant to list: the caller's, or for the admin the one it names (or all).
    fn tenant(&self, scope: &Scope) -> Result<Option<String>, TaskError> {
        match (scope, &self.tenant) {
            (_, Some(t)) if t.is_empty() => Err(TaskError::bad_param("tenant", "must not be empty")),
            (Scope::All, t) => Ok(t.clone()),
            (Scope::Tenant(_), Some(_)) => {
                Err(TaskError::bad_param("tenant", "only the admin token may choose a tenant"))
            }
            (Scope::Tenant(t), None) => Ok(Some(t.clone())),
        }
    }

    fn filter(&self) -> Result<(ListFilter, i64), TaskError> {
        let metadata = match self.metadata.as_deref() {
            None => None,
            Some(m) => match serde_json::from_str::<Value>(m) {
                Ok(v @ Value::Object(_)) => Some(v),
                _ => return Err(TaskError::bad_param("metadata", "must be a JSON object, e.g. {\"batch\":\"a\"}")),
            },
        };
        if self.model.as_deref().is_some_and(str::is_empty) {
            return Err(TaskError::bad_param("model", "must not be empty"));
        }
        let status = self.status.as_deref().map(status_param).transpose()?;
        let subagent_type = self.subagent_type.as_deref().map(|t| match AgentType::parse(t) {
            Some(b) => b.as_str().to_string(),
            None => t.to_string(),
        });
        let limit = self.limit.unwrap_or(50);
        if !(1..=200).contains(&limit) {
            return Err(TaskError::bad_param("limit", "must be between 1 and 200"));
        }
        let before_id = self
            .cursor
            .as_deref()
            .map(|c| c.parse::<Uuid>().map_err(|_| TaskError::bad_param("cursor", "not a cursor returned by this API")))
            .transpose()?;
        let f = ListFilter {
            statuses: status.into_iter().collect(),
            subagent_type,
            model: self.model.clone(),
            metadata,
            created_after: time_param("created_after", &self.created_after)?,
            created_before: time_param("created_before", &self.created_before)?,
            before_id,
            limit: limit + 1,
            ..ListFilter::default()
        };
        Ok((f, limit))
    }
}

impl Lifecycle {
    /// The caller's tasks, newest first, filtered and paged.
    pub async fn list(&self, scope: &Scope, q: &ListRequest) -> Result<Page, TaskError> {
        let tenant = q.tenant(scope)?;
        let (f, limit) = q.filter()?;
        let mut rows = store::list(&self.p.pool, tenant.as_deref(), &f).await?;
        let next_cursor = if rows.len() as i64 > limit {
            rows.truncate(limit as usize);
            rows.last().map(|r| r.id.to_string())
        } else {
            None
        };
        Ok(Page { tasks: TaskView::of(&self.p.pool, rows).await?, next_cursor })
    }

    /// Cancel every task of `tenant` matching the filter.
    pub async fn cancel_many(&self, tenant: &str, body: BulkCancel) -> Result<CancelledMany, TaskError> {
        let statuses: Option<Vec<TaskStatus>> = match body.status {
            None => Some(TaskStatus::OPEN.to_vec()),
            Some(v) if v.is_empty() => None,
            Some(v) => v.iter().map(|s| TaskStatus::parse(s).filter(|t| !t.is_terminal())).collect(),
        };
        let Some(statuses) = statuses else {
            let open: Vec<String> = TaskStatus::OPEN.iter().map(|s| format!("`{s}`")).collect();
            return Err(TaskError::invalid(
                "status",
                format!("must list some of {} (terminal tasks cannot be cancelled)", open.join(", ")),
            ));
        };
        if body.metadata.as_ref().is_some_and(|m| !m.is_object()) {
            return Err(TaskError::invalid("metadata", "must be a JSON object"));
        }
        let filter = CancelFilter { id: None, statuses, metadata: body.metadata };
        let Ended::Cancel(hit) = end::finish(&self.p.pool, &self.p.hub, End::Cancel { tenant, filter }).await? else {
            return Err(TaskError::Internal("a cancel ended as something else".into()));
        };
        let mut out = CancelledMany::default();
        for (id, old) in hit {
            match old {
                TaskStatus::Running => out.cancel_requested.push(id),
                _ => out.cancelled.push(id),
            }
        }
        Ok(out)
    }
}

impl Lifecycle {
    /// A page of the caller's tasks by a filter a door made (`f.limit`: the page's size, 1 to
    /// 200), newest first; with `total`, how many match on every page too.
    pub async fn page(&self, scope: &Scope, mut f: ListFilter, total: bool) -> Result<(Page, Option<i64>), TaskError> {
        let limit = f.limit;
        if !(1..=200).contains(&limit) {
            return Err(TaskError::bad_param("limit", "must be between 1 and 200"));
        }
        let count = match total {
            true => Some(store::count(&self.p.pool, scope.tenant(), &f).await?),
            false => None,
        };
        f.limit = limit + 1;
        let mut rows = store::list(&self.p.pool, scope.tenant(), &f).await?;
        let next_cursor = if rows.len() as i64 > limit {
            rows.truncate(limit as usize);
            rows.last().map(|r| r.id.to_string())
        } else {
            None
        };
        Ok((Page { tasks: TaskView::of(&self.p.pool, rows).await?, next_cursor }, count))
    }
}
