//! The engine's `RunStore` over Postgres: every write fenced on the task's lease, each retried
//! through short database outages; and the run's other ends that are not a task's end (a pause,
//! a release, a budget wait). A task's end is the lifecycle room's (`tasks::end`).

use std::sync::Arc;

use rust_decimal::Decimal;
use serde_json::Value;
use sqlx::PgPool;

use crate::budget;
use crate::engine::{
    Ask, BudgetWait, CallOutcome, CallRecord, Grant, LeaseLost, Outcome, Refusal, RunEnd, RunStore, TurnCheckpoint,
};
use crate::hub::Hub;
use crate::kinds::FailureCode;
use crate::kinds::{event, Event};
use crate::store::budget::{CallAsk, Reserve, ReserveWrite, SpendDefaults};
use crate::store::calls::CallRow;
use crate::store::committer::Committer;
use crate::store::events::EventsWrite;
use crate::store::runs::{self, Committed, TurnWrite};
use crate::store::{retrying, Fence, StoreError, CH_EVENT};

pub struct PgRunStore {
    pub pool: PgPool,
    pub fence: Fence,
    pub tenant: String,
    pub attempt: i32,
    pub budgets: SpendDefaults,
    /// Tells event streams on every replica that the task has new events.
    pub hub: Arc<Hub>,
    /// Commits turns together with other runs' (group commit).
    pub committer: Arc<Committer>,
    /// Where the run's streamed text goes (live output).
    pub live: Arc<crate::live::Output>,
    /// The run's own copy of its workspace, once made: its changes go with each checkpoint.
    pub copy: std::sync::OnceLock<Arc<super::copy::TaskCopy>>,
    /// Why a write of the run's was refused for what it holds (`StoreError::is_unstorable`):
    /// the run then stops, and its task fails naming this (`unstorable_end`).
    pub unstorable: std::sync::OnceLock<String>,
}

/// One ledger row, as the engine recorded the call.
fn ledger_row(c: &CallRecord, attempt: i32) -> CallRow {
    CallRow {
        call_key: c.key,
        turn: c.turn as i32,
        attempt,
        try_no: c.try_no as i32,
        provider: c.provider.clone(),
        model: c.model.clone(),
        input_tokens: c.usage.input_tokens as i64,
        output_tokens: c.usage.output_tokens as i64,
        cached_tokens: c.usage.cached_tokens as i64,
        cache_write_tokens: c.usage.cache_write_tokens as i64,
        web_searches: c.usage.web_searches as i64,
        cost_usd: c.cost_usd,
        latency_ms: c.latency_ms as i32,
        http_status: c.http_status.map(i32::from),
        outcome: c.outcome,
        error: c.error.clone(),
        usage_estimated: c.usage_estimated,
        reserved_usd: c.reserved_usd,
        reserved_tokens: c.reserved_tokens as i64,
        created_at: None,
    }
}

/// A call's reservation as `budget_reserve_call` takes it; `whole`: all of its output or nothing
/// (no lowering to the floor).
pub fn call_ask(ask: &Ask, whole: bool) -> CallAsk {
    let max_out = ask.max_out.min(i32::MAX as u32) as i32;
    CallAsk {
        prompt_usd: ask.prompt_usd,
        prompt_tokens: ask.prompt_tokens.min(i64::MAX as u64) as i64,
        out_usd: ask.out_usd,
        max_out,
        floor: if whole { max_out } else { ask.floor.min(i32::MAX as u32) as i32 },
    }
}

impl PgRunStore {
    /// Commit a turn (its messages, its call's ledger row, its events and a `checkpoint` event).
    async fn commit_turn(&self, cp: &TurnCheckpoint) -> Result<Committed, StoreError> {
        let r = self.committer.turns.write(self.turn_write(cp)).await;
        self.published(r)
    }

    /// Commit a turn with the copy's changes as they stand after it, in one transaction (so a
    /// rescued run rebuilds the copy its conversation knows).
    async fn commit_with_changes(
        &self,
        cp: &TurnCheckpoint,
        ch: &crate::workspace::copy::Changes,
    ) -> Result<Committed, StoreError> {
        let w = self.turn_write(cp);
        let r = retrying(&self.pool, || async {
            let mut tx = self.pool.begin().await?;
            if !crate::store::diffs::save_changes(&mut tx, self.fence, &ch.archive, &ch.deleted).await? {
                return Ok(Committed::LeaseLost);
            }
            let c = w.commit_alone(&mut tx).await?;
            tx.commit().await?;
            Ok(c)
        })
        .await;
        self.published(r)
    }

    /// A turn as the statements write it: its ledger row, messages and events (with `checkpoint`).
    pub fn turn_write(&self, cp: &TurnCheckpoint) -> TurnWrite {
        observe(&cp.call);
        let call = ledger_row(&cp.call, self.attempt);
        let messages: Vec<Value> = cp.messages.iter().map(|m| serde_json::to_value(m).unwrap_or(Value::Null)).collect();
        let mut events: Vec<Event> = cp.events.clone();
        events.push(Event::Checkpoint(event::Checkpoint { turn: cp.turn, messages: messages.len() }));
        TurnWrite { fence: self.fence, turn: Some(cp.turn as i32), call, messages, events, fin: None }
    }

    /// Pause the run: its last turn (with the results of the calls that ran) and the pause —
    /// `requires_action`, the actions, no lease or reservation — in one transaction. The pause's
    /// number, or `None` if the lease was lost.
    pub async fn pause(
        &self,
        cp: &TurnCheckpoint,
        actions: &[crate::store::actions::NewAction],
        timeout_secs: f64,
    ) -> Result<Option<i32>, StoreError> {
        let turn = self.turn_write(cp);
        let r = retrying(&self.pool, || async {
            let mut tx = self.pool.begin().await?;
            let c = turn.commit_alone(&mut tx).await?;
            if !matches!(c, Committed::Applied) {
                return Ok(None);
            }
            let paused =
                crate::store::actions::pause(&mut tx, self.fence, cp.turn as i32, actions, timeout_secs).await?;
            tx.commit().await?;
            Ok(paused)
        })
        .await?;
        if r.is_some() {
            self.hub.publish(CH_EVENT, self.fence.id.to_string());
            // Waiting requests return on a pause, and its webhook is due.
            self.hub.publish(crate::store::CH_DONE, self.fence.id.to_string());
        }
        Ok(r)
    }

    /// Tell the task's event streams, on every replica, of a write that was applied.
    fn published(&self, r: Result<Committed, StoreError>) -> Result<Committed, StoreError> {
        if matches!(r, Ok(Committed::Applied | Committed::Finished(_))) {
            self.hub.publish(CH_EVENT, self.fence.id.to_string());
        }
        r
    }

    /// Give the task back to the queue to wait for budget (`deadline`: its time limit), then
    /// wake the tenant's waiters that fit — this one too, if what it waited for settled
    /// meanwhile.
    pub async fn wait_for_budget(
        &self,
        w: &BudgetWait,
        deadline: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<bool, StoreError> {
        let row = runs::BudgetWaitRow {
            limit: w.limit.clone(),
            need_usd: w.need_usd,
            need_tokens: w.need_tokens.min(i64::MAX as u64) as i64,
            want_usd: w.want_usd,
            want_tokens: w.want_tokens.min(i64::MAX as u64) as i64,
            deadline,
        };
        let waited = retrying(&self.pool, || runs::wait_for_budget(&self.pool, self.fence, &row)).await?;
        if waited {
            self.hub.publish(CH_EVENT, self.fence.id.to_string());
            retrying(&self.pool, || budget::wake(&self.pool, &self.tenant, self.budgets)).await?;
        }
        Ok(waited)
    }

    /// Give the task back to the queue (a drain), after committing a last turn if there is one.
    pub async fn release(&self, last_turn: Option<&TurnCheckpoint>) -> Result<bool, StoreError> {
        if let Some(cp) = last_turn {
            if !matches!(self.commit_turn(cp).await?, Committed::Applied) {
                return Ok(false);
            }
        }
        retrying(&self.pool, || runs::release(&self.pool, self.fence)).await
    }
}

impl PgRunStore {
    /// A write's result for the engine: a lost lease, or a failure that stops this attempt; a
    /// write refused for what it holds is kept as the reason the task fails.
    fn lease_lost(&self, r: Result<Committed, StoreError>, what: &str) -> Result<(), LeaseLost> {
        match r {
            Ok(Committed::Applied | Committed::Finished(_)) => Ok(()),
            Ok(Committed::LeaseLost) => Err(LeaseLost),
            Err(e) if e.is_unstorable() => {
                tracing::error!(error = %e, "{what} refused for what it holds; the task fails");
                let _ = self.unstorable.set(format!("the run's {what} could not be stored: {e}"));
                Err(LeaseLost)
            }
            Err(e) => {
                tracing::error!(error = %e, "{what} failed; stopping this attempt");
                Err(LeaseLost)
            }
        }
    }

    /// The run's end as it can be written: when one of its writes was refused for what it
    /// holds, a failure naming why (`checkpoint_failed`), without the turn that could not be
    /// stored; else `end` itself.
    pub fn unstorable_end(&self, end: RunEnd) -> RunEnd {
        match self.unstorable.get() {
            Some(why) => RunEnd {
                outcome: Outcome::Failed { code: FailureCode::CheckpointFailed, message: why.clone() },
                last_turn: None,
            },
            None => end,
        }
    }
}

#[async_trait::async_trait]
impl RunStore for PgRunStore {
    fn live(&self) -> Option<Arc<dyn crate::engine::Live>> {
        Some(self.live.clone())
    }

    async fn reserve(&self, ask: &Ask, started: Event) -> Result<Grant, Refusal> {
        let w = ReserveWrite {
            fence: self.fence,
            tenant: self.tenant.clone(),
            ask: call_ask(ask, false),
            defaults: self.budgets,
            event: Some(started),
        };
        let r = self.committer.reserves.write(w).await;
        if let Ok(r) = &r {
            budget::counted(r);
        }
        match r {
            Ok(Reserve::Granted { max_tokens, usd, tokens }) => {
                self.hub.publish(CH_EVENT, self.fence.id.to_string());
                Ok(Grant { max_tokens, usd, tokens: tokens.max(0) as u64 })
            }
            Ok(Reserve::Wait { limit, need_usd, need_tokens, want_usd, want_tokens }) => {
                Err(Refusal::Wait(BudgetWait {
                    limit,
                    need_usd,
                    need_tokens: need_tokens.max(0) as u64,
                    want_usd,
                    want_tokens: want_tokens.max(0) as u64,
                }))
            }
            Ok(Reserve::LeaseLost) => Err(Refusal::LeaseLost),
            Ok(Reserve::Refused(limit)) => Err(Refusal::Budget(limit)),
            Err(e) => {
                tracing::error!(error = %e, "budget reservation failed; stopping this attempt");
                Err(Refusal::LeaseLost)
            }
        }
    }

    async fn events(&self, evs: &[Event]) -> Result<(), LeaseLost> {
        let w = EventsWrite { fence: self.fence, events: evs.to_vec() };
        let r =
            self.committer.events.write(w).await.map(|ok| if ok { Committed::Applied } else { Committed::LeaseLost });
        self.lease_lost(self.published(r), "event write")
    }

    async fn record_failed_call(&self, call: &CallRecord) -> Result<(), LeaseLost> {
        observe(call);
        let row = ledger_row(call, self.attempt);
        let events = vec![Event::LlmCallFailed(event::LlmCallFailed {
            turn: call.turn,
            try_no: call.try_no,
            http_status: call.http_status,
            error: call.error.clone(),
            latency_ms: call.latency_ms,
        })];
        let w = TurnWrite { fence: self.fence, turn: None, call: row, messages: vec![], events, fin: None };
        let r = self.committer.turns.write(w).await;
        self.lease_lost(self.published(r), "ledger write")
    }

    async fn checkpoint(&self, cp: &TurnCheckpoint) -> Result<(), LeaseLost> {
        if let Some(changes) = match self.copy.get() {
            Some(c) => c.take_changes().await,
            None => None,
        } {
            return self.lease_lost(self.commit_with_changes(cp, &changes).await, "checkpoint");
        }
        self.lease_lost(self.commit_turn(cp).await, "checkpoint")
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
    if c.outcome != CallOutcome::Ok {
        let status = c.http_status.map(|s| s.to_string()).unwrap_or_else(|| "none".into());
        metrics::counter!("subagentd_llm_errors_total", "provider" => c.provider.clone(), "model" => model.clone(), "http_status" => status)
            .increment(1);
    }
    for (kind, n) in [
        ("input", c.usage.input_tokens),
        ("output", c.usage.output_tokens),
        ("cached", c.usage.cached_tokens),
        ("cache_write", c.usage.cache_write_tokens),
    ] {
        metrics::counter!("subagentd_tokens_total", "model" => model.clone(), "kind" => kind).increment(n);
    }
    if let Some(cost) = c.cost_usd {
        let micro = (cost * Decimal::from(1_000_000)).trunc();
        metrics::counter!("subagentd_cost_microusd_total", "model" => model)
            .increment(u64::try_from(micro).unwrap_or(0));
    }
}
