//! The waits' keeper: wakes the tasks waiting for budget (`budget_wait`) when reservations of
//! their tenant settle — told by NOTIFY from whichever replica settled — oldest first while what
//! each waits for fits; and, every few seconds, as a fallback for a lost notification, wakes
//! every tenant's waiters that fit, ends the budget waits that ran past their task's time limit,
//! and answers the paused runs' actions whose time ran out (which queues those runs again).

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::budget;
use crate::hub::Hub;
use crate::store::budget::{self as sql, SpendDefaults};
use crate::store::StoreError;
use crate::tasks::end::{self, End, Ended};

pub struct BudgetWaker {
    pub pool: PgPool,
    pub hub: Arc<Hub>,
    pub defaults: SpendDefaults,
    /// The fallback sweep's period.
    pub every: Duration,
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub woken: usize,
    /// Waits ended by their task's time limit.
    pub timed_out: usize,
    /// Paused runs queued again because their actions' time ran out.
    pub expired_pauses: usize,
}

impl BudgetWaker {
    /// One sweep: end the waits past their time limit, wake every tenant's waiters that fit.
    pub async fn pass(&self) -> Result<Swept, StoreError> {
        let timed_out = match end::finish(&self.pool, &self.hub, End::WaitsTimedOut).await? {
            Ended::WaitsTimedOut(ended) => ended.len(),
            _ => 0,
        };
        let mut woken = 0;
        for (tenant, _) in sql::waiting(&self.pool).await? {
            woken += budget::wake(&self.pool, &tenant, self.defaults).await?;
        }
        let expired_pauses = crate::store::actions::expire(&self.pool).await?;
        for id in &expired_pauses {
            self.hub.publish(crate::store::CH_EVENT, id.to_string());
        }
        Ok(Swept { woken, timed_out, expired_pauses: expired_pauses.len() })
    }

    pub fn start(self, stop: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut sweep = tokio::time::interval(self.every);
            sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = self.hub.budget.notified() => {
                        for tenant in self.hub.take_settled() {
                            if let Err(e) = budget::wake(&self.pool, &tenant, self.defaults).await {
                                tracing::warn!(error = %e, tenant, "waking budget waiters failed");
                            }
                        }
                    }
                    _ = sweep.tick() => {
                        if let Err(e) = self.pass().await {
                            tracing::warn!(error = %e, "budget waiter sweep failed");
                        }
                    }
                    _ = stop.cancelled() => return,
                }
            }
        })
    }
}
