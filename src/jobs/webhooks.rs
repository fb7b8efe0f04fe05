//! The webhook sender: a task's deliveries (`task.finished`, `task.requires_action` at each
//! pause) are POSTed to its `webhook_url` (signed like tool calls), retried with exponential
//! backoff, each delivery's status kept in `webhook_deliveries`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::hub::Hub;
use crate::store::{tasks, tools, StoreError};
use crate::tasks::view::TaskView;
use crate::tools::Caller;

/// Attempts before a webhook is given up as `failed`.
pub const MAX_ATTEMPTS: i32 = 8;

/// Delay before attempt `n + 1` after `n` failures: 1 s, 2 s, 4 s … capped at 5 minutes.
pub fn backoff(failures: i32) -> Duration {
    Duration::from_secs(1u64 << failures.clamp(0, 8) as u64).min(Duration::from_secs(300))
}

/// Deliveries taken per scan.
const BATCH: usize = 20;

pub struct WebhookSender {
    pub pool: PgPool,
    pub hub: Arc<Hub>,
    pub caller: Caller,
}

impl WebhookSender {
    /// One scan: deliver (or retry) the webhooks that are due; returns how many were attempted.
    pub async fn pass(&self) -> Result<usize, StoreError> {
        let due = tasks::take_due_webhooks(&self.pool, BATCH as i64, 30.0).await?;
        let n = due.len();
        futures_util::future::join_all(due.into_iter().map(|t| deliver(&self.pool, &self.caller, t))).await;
        Ok(n)
    }

    pub fn start(self, stop: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                let woken = self.hub.finished.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                match self.pass().await {
                    Ok(BATCH) => continue,
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "webhook scan failed"),
                }
                tokio::select! {
                    _ = &mut woken => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.cancelled() => return,
                }
                // Every finish wakes this loop; scan at most four times a second, not once per task.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                    _ = stop.cancelled() => return,
                }
            }
        })
    }
}

async fn deliver(pool: &PgPool, caller: &Caller, d: tasks::Delivery) {
    let outcome = send(pool, caller, &d).await;
    let retry = (outcome.is_err() && d.attempts + 1 < MAX_ATTEMPTS).then(|| backoff(d.attempts));
    metrics::counter!("subagentd_webhook_attempts_total", "outcome" => if outcome.is_ok() { "delivered" } else { "failed" }, "event" => d.event.clone())
        .increment(1);
    if let Err(e) = tasks::webhook_attempted(pool, d.id, outcome, retry).await {
        tracing::warn!(error = %e, task_id = %d.task_id, "webhook status not recorded; it will be retried");
    }
}

/// POST the delivery's event (`{"event", "task"}`, the task as the API shows it now; a
/// `task.requires_action` one also has `pause` and that pause's `actions`, answered or not, since
/// the task may have moved on by the time it is sent) to the task's webhook, signed, with an
/// idempotency key per event.
async fn send(pool: &PgPool, caller: &Caller, d: &tasks::Delivery) -> Result<(), String> {
    let t = tasks::get_any(pool, d.task_id).await.map_err(|e| e.to_string())?.ok_or("the task is gone")?;
    let Some(url) = t.webhook_url.clone() else { return Err("the task has no webhook".into()) };
    let tenant = t.tenant.clone();
    let view = TaskView::one(pool, t).await.map_err(|e| e.to_string())?;
    let key = match d.event.as_str() {
        "task.finished" => format!("{}:finished", d.task_id),
        other => format!("{}:{}:{}", d.task_id, other.trim_start_matches("task."), d.seq),
    };
    let mut payload = serde_json::json!({"event": d.event, "task": view});
    if d.event == "task.requires_action" {
        let actions = crate::store::actions::of_pause(pool, d.task_id, d.seq).await.map_err(|e| e.to_string())?;
        payload["pause"] = d.seq.into();
        payload["actions"] = serde_json::to_value(actions).unwrap_or_default();
    }
    let body = serde_json::to_vec(&payload).unwrap_or_default();
    caller.allow.check_url(&url).map_err(|e| e.0)?;
    let secret = tools::signing_secret(pool, &tenant).await.map_err(|e| e.to_string())?;
    let ts = chrono::Utc::now().timestamp();
    let r = caller
        .client
        .post(&url)
        .timeout(Duration::from_secs(10))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("subagent-timestamp", ts.to_string())
        .header("subagent-signature", crate::tools::http::signature(&secret, ts, &body))
        .body(body)
        .send()
        .await;
    match r {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("HTTP {}", r.status().as_u16())),
        Err(e) => Err(e.to_string()),
    }
}
