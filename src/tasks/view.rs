//! The task as every door (and the webhooks) show it: the row with its options read once, and a
//! paused task's pending actions.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::engine::spec::TaskOptions;
use crate::kinds::{StopReason, TaskStatus};
pub use crate::store::actions::ActionRow;
use crate::store::tasks::TaskRow;

/// The task as the API shows it.
#[derive(Debug, Default, Serialize)]
pub struct TaskView {
    pub id: Uuid,
    pub tenant: String,
    pub status: TaskStatus,
    pub stop_reason: Option<StopReason>,
    pub subagent_type: String,
    pub description: Option<String>,
    pub model: String,
    /// The models its calls may move to, in order (`fallback_models`), and on what failures.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fallback_models: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_on: Option<Vec<crate::engine::spec::FallbackWhen>>,
    /// The model whose answer ended the run (its own `model`, or a fallback), once it ended.
    pub answered_model: Option<String>,
    /// Which of its tenant's queued tasks is claimed first.
    pub priority: crate::kinds::Priority,
    /// A scheduled task's start time (kept once it is queued).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_at: Option<DateTime<Utc>>,
    pub prompt: String,
    pub max_turns: Option<u32>,
    /// The tools the run is offered (its whitelist).
    pub tools: Vec<String>,
    /// Its workspace as asked (`git`, `ref`, `secret` by name, or `name`), with the version its
    /// run reads once it first started: `commit` (git) or `content_hash` (an upload).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace: Option<Value>,
    /// The image its commands run in (`image`, as asked or the service's default), with the
    /// manifest `digest` its run resolved it to once it first started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environment: Option<Value>,
    /// With a writable copy of its workspace, once its run ended: its diff's counts
    /// (`files_changed`, `lines_added`, `lines_removed`, `binary_files`, `bytes`, and `omitted`
    /// files past the size cap); the diff itself is `GET /tasks/{id}/diff`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<Value>,
    pub summary: Option<String>,
    /// With an `output_schema`: the final answer's value (valid against it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    pub error: Option<Value>,
    pub turns: i32,
    pub usage: Value,
    pub cost_usd: Decimal,
    /// False when some call's model had no price: `cost_usd` is then a lower bound.
    pub cost_complete: bool,
    /// True when some call's usage is an estimate (its answer never came, or the provider
    /// reported none): `usage` and `cost_usd` include estimates.
    pub usage_estimated: bool,
    pub attempt: i32,
    pub metadata: Value,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub queue_ms: Option<i64>,
    pub run_ms: Option<i64>,
    /// The task this one resumed.
    pub parent_task_id: Option<Uuid>,
    pub trace_id: Option<String>,
    /// Completion webhook: url, delivery status, attempts, last error.
    pub webhook: Option<Value>,
    /// What a queued task waits for (`budget`: reservations of its tenant to settle).
    pub waiting_for: Option<String>,
    /// While `requires_action`: what it waits for, each to be answered by its own `id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_actions: Option<Vec<ActionRow>>,
    /// The diff itself, read with a single task's view (a door shows it: A2A's `diff` artifact);
    /// never in the JSON view (`GET /tasks/{id}/diff` serves it).
    #[serde(skip)]
    pub patch: Option<String>,
}

impl TaskView {
    /// Views of `rows`, the paused ones with their pending actions (read in one query).
    pub async fn of(pool: &sqlx::PgPool, rows: Vec<TaskRow>) -> Result<Vec<TaskView>, crate::store::StoreError> {
        let paused: Vec<Uuid> = rows.iter().filter(|r| r.status == TaskStatus::RequiresAction).map(|r| r.id).collect();
        let mut actions = crate::store::actions::pending_of(pool, &paused).await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let paused = r.status == TaskStatus::RequiresAction;
                let id = r.id;
                let mut v = TaskView::from(r);
                if paused {
                    let (mine, rest): (Vec<_>, Vec<_>) = actions.drain(..).partition(|a| a.task_id == id);
                    actions = rest;
                    v.pending_actions = Some(mine);
                }
                v
            })
            .collect())
    }

    /// The view of one row (see `of`).
    pub async fn one(pool: &sqlx::PgPool, row: TaskRow) -> Result<TaskView, crate::store::StoreError> {
        let mut v = TaskView::of(pool, vec![row]).await?.pop().unwrap_or_default();
        if v.diff.is_some() {
            v.patch = crate::store::diffs::diff_of(pool, &v.tenant, v.id, v.created_at).await?.flatten();
        }
        Ok(v)
    }
}

impl From<TaskRow> for TaskView {
    fn from(r: TaskRow) -> Self {
        let opts = TaskOptions::from_stored(&r.options).ok();
        let error = r.error_code.as_ref().map(|c| json!({"code": c, "message": r.error_message}));
        let queue_ms = r.started_at.map(|s| (s - r.queued_since()).num_milliseconds());
        let run_ms = match (r.started_at, r.finished_at) {
            (Some(s), Some(f)) => Some((f - s).num_milliseconds()),
            _ => None,
        };
        TaskView {
            id: r.id,
            tenant: r.tenant,
            status: r.status,
            stop_reason: r.stop_reason,
            subagent_type: r.subagent_type,
            description: r.description,
            model: r.model,
            fallback_models: opts.as_ref().map(|o| o.fallback_models.clone()).unwrap_or_default(),
            fallback_on: opts.as_ref().and_then(|o| o.fallback_on.clone()),
            answered_model: r.answered_model,
            priority: crate::kinds::Priority::from_rank(r.priority),
            run_at: r.run_at,
            prompt: r.prompt,
            max_turns: opts.as_ref().map(|o| o.max_turns.get()),
            workspace: opts.as_ref().and_then(|o| o.workspace.as_ref()).map(|w| {
                let mut v = serde_json::to_value(w).unwrap_or_default();
                let key = if w.git.is_some() { "commit" } else { "content_hash" };
                v[key] = r.workspace_version.clone().map_or(Value::Null, Value::String);
                v
            }),
            environment: opts.as_ref().and_then(|o| o.environment.as_ref()).map(|e| {
                let mut v = serde_json::to_value(e).unwrap_or_default();
                v["digest"] = r.environment_digest.clone().map_or(Value::Null, Value::String);
                v
            }),
            tools: opts.map(|o| o.tools.into_iter().map(|t| t.name).collect()).unwrap_or_default(),
            diff: r.diff_stats,
            summary: r.summary,
            output: r.output,
            error,
            turns: r.turns,
            usage: {
                let mut u = json!({
                    "input_tokens": r.input_tokens,
                    "output_tokens": r.output_tokens,
                    "cached_tokens": r.cached_tokens,
                    "total_tokens": r.input_tokens + r.output_tokens,
                });
                // Only where a provider wrote to its cache (Anthropic's, with breakpoints).
                if r.cache_write_tokens > 0 {
                    u["cache_write_tokens"] = json!(r.cache_write_tokens);
                }
                u
            },
            cost_usd: r.cost_usd.normalize(),
            cost_complete: r.unpriced_calls == 0,
            usage_estimated: r.estimated_calls > 0,
            attempt: r.attempt,
            metadata: r.metadata,
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            queue_ms,
            run_ms,
            parent_task_id: r.parent_task_id,
            trace_id: r.traceparent.as_deref().map(|t| crate::telemetry::trace_id(t).to_string()),
            waiting_for: r.waiting_for.filter(|_| r.status == TaskStatus::Queued),
            pending_actions: None,
            patch: None,
            webhook: r.webhook_url.as_ref().map(|u| {
                let d = r.webhook.clone().unwrap_or_else(|| json!({}));
                json!({"url": u, "status": d["status"], "attempts": d["attempts"].as_i64().unwrap_or(0),
                       "last_error": d["last_error"], "delivered_at": d["delivered_at"]})
            }),
        }
    }
}
