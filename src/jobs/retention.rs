//! Retention: drops the day partitions of conversations, events and stored diffs written more
//! than `retention_days` ago (a task still open keeps its rows: they are moved to today's; every
//! 10 minutes); drops the
//! ledger's day partitions older than `ledger_retention_days` (hourly; the daily rollups keep
//! their sums, the tasks their totals), and MCP
//! sessions idle for `mcp_session_idle_days`, idempotency keys past their 24 hours and the
//! per-minute counts past their hours (every 10 minutes, whatever the other windows). A day
//! count of 0 keeps them forever.

use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::{retention, StoreError};

pub struct Retention {
    pub pool: PgPool,
    pub days: u32,
    pub ledger_days: u32,
    pub mcp_idle_days: u32,
    /// How often it wakes to see whether a purge is due.
    pub every: Duration,
}

/// What one pass purged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    /// History partitions (conversations, events, stored diffs) dropped whole.
    pub partitions: u64,
    /// Ledger partitions dropped whole.
    pub ledger_partitions: u64,
    pub sessions: u64,
}

impl Retention {
    /// One pass of both purges, whatever their schedule.
    pub async fn pass(&self) -> Result<Purged, StoreError> {
        retention::purge_minutes(&self.pool).await?;
        let mut p = Purged { sessions: self.purge_sessions().await?, ..Purged::default() };
        if self.days > 0 {
            p.partitions = self.purge_conversations().await?;
        }
        if self.ledger_days > 0 {
            p.ledger_partitions = self.purge_ledger().await?;
        }
        Ok(p)
    }

    /// MCP sessions idle past their window (a client that comes back is adopted afresh), and
    /// idempotency keys past their 24 hours (whatever the windows).
    async fn purge_sessions(&self) -> Result<u64, StoreError> {
        retention::purge_keys(&self.pool).await?;
        if self.mcp_idle_days == 0 {
            return Ok(0);
        }
        let n = crate::store::mcp::purge_idle(&self.pool, self.mcp_idle_days as i32).await?;
        if n > 0 {
            tracing::info!(sessions = n, days = self.mcp_idle_days, "forgot idle MCP sessions");
        }
        Ok(n)
    }

    async fn purge_conversations(&self) -> Result<u64, StoreError> {
        let mut dropped = 0;
        let parents = crate::store::partitions::HISTORY.into_iter().chain([crate::store::partitions::DIFFS]);
        for parent in parents {
            let gone = crate::store::partitions::drop_expired(&self.pool, parent, self.days).await?;
            if !gone.is_empty() {
                tracing::info!(table = parent, partitions = ?gone, "dropped history partitions past retention");
            }
            dropped += gone.len() as u64;
        }
        Ok(dropped)
    }

    /// The ledger's days past its window, whole (the rollups keep their sums, the tasks their
    /// totals).
    async fn purge_ledger(&self) -> Result<u64, StoreError> {
        let ledger = crate::store::partitions::LEDGER;
        let gone = crate::store::partitions::drop_expired(&self.pool, ledger, self.ledger_days).await?;
        if !gone.is_empty() {
            tracing::info!(partitions = ?gone, "dropped ledger partitions past retention (rollups keep their sums)");
        }
        Ok(gone.len() as u64)
    }

    pub fn start(self, stop: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move {
            let (mut next, mut next_ledger, mut next_sessions) = (Instant::now(), Instant::now(), Instant::now());
            loop {
                tokio::select! { _ = tokio::time::sleep(self.every) => {}, _ = stop.cancelled() => return }
                if Instant::now() >= next_sessions {
                    next_sessions = Instant::now() + Duration::from_secs(600);
                    if let Err(e) = self.purge_sessions().await {
                        tracing::warn!(error = %e, "MCP session purge failed");
                    }
                    if let Err(e) = retention::purge_minutes(&self.pool).await {
                        tracing::warn!(error = %e, "per-minute count purge failed");
                    }
                }
                if self.days > 0 && Instant::now() >= next {
                    next = Instant::now() + Duration::from_secs(600);
                    if let Err(e) = self.purge_conversations().await {
                        tracing::warn!(error = %e, "retention purge failed");
                    }
                }
                if self.ledger_days > 0 && Instant::now() >= next_ledger {
                    next_ledger = Instant::now() + Duration::from_secs(3600);
                    if let Err(e) = self.purge_ledger().await {
                        tracing::warn!(error = %e, "ledger purge failed");
                    }
                }
            }
        })
    }
}
