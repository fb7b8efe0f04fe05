//! The webhook sender: a task's deliveries (`task.finished`, `task.requires_action` at each
//! pause) are POSTed to its `webhook_url` and to its A2A push configs (signed like tool calls;
//! a push's body is the A2A `StreamResponse`, with the config's token and credentials), retried
//! with exponential backoff, each delivery's status kept in `webhook_deliveries`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::hub::Hub;
use crate::kinds::WebhookEvent;
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
    metrics::counter!("subagentd_webhook_attempts_total", "outcome" => if outcome.is_ok() { "delivered" } else { "failed" }, "event" => d.event.as_str())
        .increment(1);
    if let Err(e) = tasks::webhook_attempted(pool, d.id, outcome, retry).await {
        tracing::warn!(error = %e, task_id = %d.task_id, "webhook status not recorded; it will be retried");
    }
}

/// POST the delivery's event to its target, signed, with an idempotency key per event: the
/// task's webhook, or an A2A push config.
async fn send(pool: &PgPool, caller: &Caller, d: &tasks::Delivery) -> Result<(), String> {
    let t = tasks::get_any(pool, d.task_id).await.map_err(|e| e.to_string())?.ok_or("the task is gone")?;
    let tenant = t.tenant.clone();
    let webhook_url = t.webhook_url.clone();
    let view = TaskView::one(pool, t).await.map_err(|e| e.to_string())?;
    let mut key = match d.event {
        WebhookEvent::TaskFinished => format!("{}:finished", d.task_id),
        WebhookEvent::TaskRequiresAction => format!("{}:requires_action:{}", d.task_id, d.seq),
    };
    let (url, body, headers) = if d.push_config.is_empty() {
        let Some(url) = webhook_url else { return Err("the task has no webhook".into()) };
        (url, webhook_body(pool, d, view).await?, vec![("content-type", "application/json".to_string())])
    } else {
        let c = crate::store::a2a::push_target(pool, d.task_id, &d.push_config)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the push config was deleted")?;
        let body = crate::a2a::push_body(pool, &view, d.event).await.map_err(|e| e.to_string())?;
        key = format!("{key}:{}", c.id);
        let mut h = vec![("content-type", "application/a2a+json".to_string())];
        if let Some(token) = c.token.filter(|t| !t.is_empty()) {
            h.push(("x-a2a-notification-token", token));
        }
        if let Some(scheme) = c.auth_scheme.filter(|s| !s.is_empty()) {
            let credentials = c.auth_credentials.unwrap_or_default();
            h.push(("authorization", format!("{scheme} {credentials}").trim_end().to_string()));
        }
        (c.url, body, h)
    };
    let body = serde_json::to_vec(&body).unwrap_or_default();
    caller.allow.check_url(&url).map_err(|e| e.0)?;
    let secret = tools::signing_secret(pool, &tenant).await.map_err(|e| e.to_string())?;
    let ts = chrono::Utc::now().timestamp();
    let mut r = caller
        .client
        .post(&url)
        .timeout(Duration::from_secs(10))
        .header("idempotency-key", key)
        .header("subagent-timestamp", ts.to_string())
        .header("subagent-signature", crate::tools::http::signature(&secret, ts, &body));
    for (k, v) in headers {
        r = r.header(k, v);
    }
    match r.body(body).send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("HTTP {}", r.status().as_u16())),
        Err(e) => Err(e.to_string()),
    }
}

/// A webhook's body: `{"event", "task"}`, the task as the API shows it now; a
/// `task.requires_action` one also has `pause` and that pause's `actions`, answered or not,
/// since the task may have moved on by the time it is sent.
async fn webhook_body(pool: &PgPool, d: &tasks::Delivery, view: TaskView) -> Result<serde_json::Value, String> {
    let mut payload = serde_json::json!({"event": d.event, "task": view});
    if d.event == WebhookEvent::TaskRequiresAction {
        let actions = crate::store::actions::of_pause(pool, d.task_id, d.seq).await.map_err(|e| e.to_string())?;
        payload["pause"] = d.seq.into();
        payload["actions"] = serde_json::to_value(actions).unwrap_or_default();
    }
    Ok(payload)
}
