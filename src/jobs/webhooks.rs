//! The webhook sender: finished tasks with a `webhook_url` are POSTed (signed like tool calls),
//! retried with exponential backoff, and their delivery status is kept on the task.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::hub::Hub;
use crate::store::{tasks, tools, StoreError};
use crate::tools::Caller;
use crate::view::TaskView;

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

async fn deliver(pool: &PgPool, caller: &Caller, t: tasks::TaskRow) {
    let Some(url) = t.webhook_url.clone() else { return };
    let (id, attempts, tenant) = (t.id, t.webhook_attempts, t.tenant.clone());
    let body = serde_json::to_vec(&serde_json::json!({"event": "task.finished", "task": TaskView::from(t)}))
        .unwrap_or_default();
    let outcome = match caller.allow.check_url(&url) {
        Err(e) => Err(e.0),
        Ok(_) => {
            let secret = tools::signing_secret(pool, &tenant).await.map_err(|e| e.to_string());
            match secret {
                Err(e) => Err(e),
                Ok(secret) => {
                    let ts = chrono::Utc::now().timestamp();
                    let r = caller
                        .client
                        .post(&url)
                        .timeout(Duration::from_secs(10))
                        .header("content-type", "application/json")
                        .header("idempotency-key", format!("{id}:finished"))
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
            }
        }
    };
    let retry = (outcome.is_err() && attempts + 1 < MAX_ATTEMPTS).then(|| backoff(attempts));
    metrics::counter!("subagentd_webhook_attempts_total", "outcome" => if outcome.is_ok() { "delivered" } else { "failed" })
        .increment(1);
    if let Err(e) = tasks::webhook_attempted(pool, id, outcome, retry).await {
        tracing::warn!(error = %e, task_id = %id, "webhook status not recorded; it will be retried");
    }
}
