//! Readiness, and the gauges `/metrics` reads from the tables at each scrape.

use std::time::Duration;

use super::{Error, Resources};
use crate::store;

/// What a readiness check found.
pub enum Readiness {
    /// The database answers and its migrations are applied; whether this process's LISTEN
    /// connection is up.
    Ready { listener: bool },
    /// The database answers, but its migrations are not applied.
    Unmigrated,
    /// The database does not answer (with why), or not within the bound.
    Unreachable(Option<Error>),
}

impl Resources {
    /// Is the database there, migrated? A connection the pool kept from before a database
    /// restart fails its first use: one more try, within the same bound, asks a fresh one.
    pub async fn readiness(&self, bound: Duration) -> Readiness {
        let check = async {
            match store::ready(&self.p.pool).await {
                Err(e) if e.is_unavailable() => store::ready(&self.p.pool).await,
                r => r,
            }
        };
        match tokio::time::timeout(bound, check).await {
            Ok(Ok(true)) => Readiness::Ready { listener: self.p.hub.is_connected() },
            Ok(Ok(false)) => Readiness::Unmigrated,
            Ok(Err(e)) => Readiness::Unreachable(Some(e.into())),
            Err(_) => Readiness::Unreachable(None),
        }
    }

    /// Set the gauges read from the tables: tasks in each open state (which partial indexes make
    /// cheap), waiters on this replica, tasks waiting for budget.
    pub async fn set_gauges(&self) -> Result<(), Error> {
        for (status, n) in store::tasks::open_counts(&self.p.pool).await? {
            metrics::gauge!("subagentd_tasks", "status" => status.as_str()).set(n as f64);
        }
        metrics::gauge!("subagentd_waiters").set(self.p.hub.waiter_count() as f64);
        let waiting: i64 = store::budget::waiting(&self.p.pool).await?.iter().map(|w| w.1).sum();
        metrics::gauge!("subagentd_budget_waiting").set(waiting as f64);
        Ok(())
    }
}
