//! The engine's `RunStore` over Postgres: every write fenced on the task's lease.

use serde_json::Value;
use sqlx::PgPool;

use super::worker::retry_db;
use rust_decimal::Decimal;

use crate::engine::{CallRecord, LeaseLost, Outcome, Refusal, RunStore, TurnCheckpoint};
use crate::store::runs::{self, CallRow, Fence};

pub struct PgRunStore {
    pub pool: PgPool,
    pub fence: Fence,
    pub attempt: i32,
    pub budgets: runs::BudgetDefaults,
    /// Tells event streams on every replica that the task has new events.
    pub hub: std::sync::Arc<super::hub::Hub>,
    /// The first call's `llm_call_started` event, when its reservation was written with the
    /// task (`Worker::first_call`, written by the insert or `budget_reserve` in its transaction).
    pub reserved: std::sync::Mutex<Option<Value>>,
    /// Set once the last checkpoint has also ended the task (`Committed::Finished`).
    pub finished: std::sync::Mutex<Option<runs::Committed>>,
}

impl PgRunStore {
    async fn write_checkpoint(&self, cp: &TurnCheckpoint, fin: Option<&runs::Finish>) -> Result<(), LeaseLost> {
        observe(&cp.call);
        let row = self.row(&cp.call);
        let msgs: Vec<Value> = cp.messages.iter().map(|m| serde_json::to_value(m).unwrap_or(Value::Null)).collect();
        let mut events: Vec<(&str, Value)> = cp.events.iter().map(|(k, v)| (*k, v.clone())).collect();
        events.push(("checkpoint", serde_json::json!({"turn": cp.turn, "messages": msgs.len()})));
        self.commit(Some(cp.turn as i32), &row, &msgs, &events, fin).await
    }

    fn row(&self, c: &CallRecord) -> CallRow {
        CallRow {
            call_key: c.key,
            turn: c.turn as i32,
            attempt: self.attempt,
            try_no: c.try_no as i32,
            provider: c.provider.clone(),
            model: c.model.clone(),
            input_tokens: c.usage.input_tokens as i64,
            output_tokens: c.usage.output_tokens as i64,
            cached_tokens: c.usage.cached_tokens as i64,
            cost_usd: c.cost_usd,
            latency_ms: c.latency_ms as i32,
            http_status: c.http_status.map(i32::from),
            outcome: c.outcome.to_string(),
            error: c.error.clone(),
            reserved_usd: c.reserved_usd,
            reserved_tokens: c.reserved_tokens as i64,
        }
    }

    async fn commit(
        &self,
        turn: Option<i32>,
        call: &CallRow,
        msgs: &[Value],
        events: &[(&str, Value)],
        fin: Option<&runs::Finish>,
    ) -> Result<(), LeaseLost> {
        match retry_db(|| runs::commit_turn(&self.pool, self.fence, turn, call, msgs, events, fin)).await {
            Ok(runs::Committed::Applied) => {
                self.hub.publish(crate::store::CH_EVENT, self.fence.id.to_string());
                Ok(())
            }
            Ok(done @ runs::Committed::Finished(_)) => {
                self.hub.publish(crate::store::CH_EVENT, self.fence.id.to_string());
                *self.finished.lock().unwrap_or_else(|e| e.into_inner()) = Some(done);
                Ok(())
            }
            Ok(runs::Committed::LeaseLost) => Err(LeaseLost),
            Err(e) => {
                tracing::error!(error = %e, "checkpoint failed; stopping this attempt");
                Err(LeaseLost)
            }
        }
    }
}

#[async_trait::async_trait]
impl RunStore for PgRunStore {
    async fn reserve(&self, usd: Decimal, tokens: u64, started: Value) -> Result<(), Refusal> {
        if let Some(written) = self.reserved.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if written == started {
                return Ok(());
            }
            // Not expected: both come from `engine::first_reservation`'s computation. Reserving
            // again only holds more until the task ends.
            tracing::warn!("the reservation written with the task is not the run's first; reserving again");
        }
        match retry_db(|| runs::reserve(&self.pool, self.fence, usd, tokens as i64, self.budgets, Some(&started))).await
        {
            Ok(None) => {
                self.hub.publish(crate::store::CH_EVENT, self.fence.id.to_string());
                Ok(())
            }
            Ok(Some(limit)) if limit == "lease_lost" => Err(Refusal::LeaseLost),
            Ok(Some(limit)) => {
                metrics::counter!("subagentd_budget_refusals_total", "limit" => limit.clone(), "stage" => "in_flight")
                    .increment(1);
                Err(Refusal::Budget(limit))
            }
            Err(e) => {
                tracing::error!(error = %e, "budget reservation failed; stopping this attempt");
                Err(Refusal::LeaseLost)
            }
        }
    }

    async fn event(&self, kind: &'static str, data: Value) -> Result<(), LeaseLost> {
        match retry_db(|| crate::store::events::append(&self.pool, self.fence, kind, &data)).await {
            Ok(true) => {
                self.hub.publish(crate::store::CH_EVENT, self.fence.id.to_string());
                Ok(())
            }
            Ok(false) => Err(LeaseLost),
            Err(e) => {
                tracing::error!(error = %e, "event write failed; stopping this attempt");
                Err(LeaseLost)
            }
        }
    }

    async fn record_failed_call(&self, call: &CallRecord) -> Result<(), LeaseLost> {
        observe(call);
        let row = self.row(call);
        let ev = serde_json::json!({"turn": call.turn, "try": call.try_no, "http_status": call.http_status,
                                    "error": call.error, "latency_ms": call.latency_ms});
        self.commit(None, &row, &[], &[("llm_call_failed", ev)], None).await
    }

    async fn checkpoint(&self, cp: &TurnCheckpoint) -> Result<(), LeaseLost> {
        self.write_checkpoint(cp, None).await
    }

    async fn final_checkpoint(&self, cp: &TurnCheckpoint, outcome: &Outcome) -> Result<(), LeaseLost> {
        let fin = super::worker::finish_for(outcome, "", None)
            .map(|f| runs::Finish { return_task: self.hub.has_waiters(self.fence.id), ..f });
        self.write_checkpoint(cp, fin.as_ref()).await
    }
}

/// Provider-call metrics, by provider and model.
fn observe(c: &CallRecord) {
    let model = format!("{}/{}", c.provider, c.model);
    let labels = [("provider", c.provider.clone()), ("model", model.clone()), ("outcome", c.outcome.to_string())];
    metrics::histogram!("subagentd_llm_call_duration_seconds", &labels).record(f64::from(c.latency_ms) / 1000.0);
    metrics::counter!("subagentd_llm_calls_total", &labels).increment(1);
    if c.try_no > 1 {
        metrics::counter!("subagentd_llm_retries_total", "provider" => c.provider.clone(), "model" => model.clone())
            .increment(1);
    }
    if c.outcome != "ok" {
        let status = c.http_status.map(|s| s.to_string()).unwrap_or_else(|| "none".into());
        metrics::counter!("subagentd_llm_errors_total", "provider" => c.provider.clone(), "model" => model.clone(), "http_status" => status)
            .increment(1);
    }
    for (kind, n) in
        [("input", c.usage.input_tokens), ("output", c.usage.output_tokens), ("cached", c.usage.cached_tokens)]
    {
        metrics::counter!("subagentd_tokens_total", "model" => model.clone(), "kind" => kind).increment(n);
    }
    if let Some(cost) = c.cost_usd {
        let micro = (cost * rust_decimal::Decimal::from(1_000_000)).trunc();
        metrics::counter!("subagentd_cost_microusd_total", "model" => model)
            .increment(u64::try_from(micro).unwrap_or(0));
    }
}
