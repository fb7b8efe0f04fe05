//! Contexts: a conversation of tasks (A2A's `contextId`). A task submitted in a context
//! continues the context's latest task — its conversation, as `resume_from` — which must have
//! ended; the context's row (the context and the caller's messages, the task's history) is
//! written in the task's own transaction, so there is never one without the other. A retry of
//! a submission (its idempotency key) continues what its first try continued, and so is the
//! same request.
//!
//! Also here: the reads of a task's context rows, the messages added to a task's history, and
//! a task's push notification configs (targets of the webhook sender).

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::{Lifecycle, Scope, TaskError};
use crate::store::a2a as store;
pub use crate::store::a2a::{A2aTask as ContextRow, PushConfig};
use crate::store::StoreError;

/// The context a submission is made in, and the caller's message that made it (stored as the
/// first entry of the task's history).
#[derive(Debug, Clone)]
pub struct Context {
    pub id: String,
    pub message: Value,
}

/// Written with the task, in its transaction.
pub(super) async fn record(conn: &mut PgConnection, task: Uuid, tenant: &str, c: &Context) -> Result<(), StoreError> {
    store::insert(conn, task, tenant, &c.id, &c.message).await
}

impl Lifecycle {
    /// The task a submission in context `c` continues: what its first try continued, for a
    /// retry (`earlier`); else the context's latest task, if any.
    pub(super) async fn continued(
        &self,
        tenant: &str,
        c: &Context,
        earlier: Option<&crate::store::tasks::TaskRow>,
    ) -> Result<Option<Uuid>, TaskError> {
        if let Some(r) = earlier {
            return Ok(r.parent_task_id);
        }
        Ok(store::latest_in_context(&self.p.pool, tenant, &c.id).await?)
    }

    /// The context row of the task `id`, if it has one (a task started at another door has none).
    pub async fn context(&self, id: Uuid) -> Result<Option<ContextRow>, TaskError> {
        Ok(store::of(&self.p.pool, &[id]).await?.pop())
    }

    /// The context rows of these tasks.
    pub async fn contexts(&self, ids: &[Uuid]) -> Result<Vec<ContextRow>, TaskError> {
        Ok(store::of(&self.p.pool, ids).await?)
    }

    /// Answer the caller's paused task `id` (as `answer`) with the caller's `message` that
    /// carried the answers, which joins the task's history once the answers are taken.
    pub async fn answer_with_message(
        &self,
        scope: &Scope,
        by: &crate::kinds::Answerer,
        id: Uuid,
        answers: Vec<super::answer::ActionAnswer>,
        message: &Value,
    ) -> Result<super::TaskView, TaskError> {
        let answered = self.answer(scope, by, id, answers).await?;
        store::append(&self.p.pool, id, &answered.tenant, message).await?;
        Ok(answered)
    }

    /// Create (or replace) a push notification config of the tenant's task.
    pub async fn put_push(&self, tenant: &str, c: &PushConfig) -> Result<PushConfig, TaskError> {
        store::put_push(&self.p.pool, tenant, c).await?.ok_or(TaskError::NotFound)
    }

    /// A push notification config of the tenant's task.
    pub async fn push(&self, tenant: &str, task: Uuid, id: &str) -> Result<Option<PushConfig>, TaskError> {
        Ok(store::get_push(&self.p.pool, tenant, task, id).await?)
    }

    /// Delete a push notification config of the tenant's task.
    pub async fn delete_push(&self, tenant: &str, task: Uuid, id: &str) -> Result<bool, TaskError> {
        Ok(store::delete_push(&self.p.pool, tenant, task, id).await?)
    }

    /// A page of the push notification configs of the tenant's task (ids after `after`).
    pub async fn pushes(
        &self,
        tenant: &str,
        task: Uuid,
        after: &str,
        limit: i64,
    ) -> Result<Vec<PushConfig>, TaskError> {
        Ok(store::list_push(&self.p.pool, tenant, task, after, limit).await?)
    }
}
