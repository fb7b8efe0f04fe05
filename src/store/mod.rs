//! Every SQL statement of the service, one file per table family; plain rows in and out.
//!
//! May import: `db` (migrations, for readiness) and the crate's leaves (`config`). Never an
//! engine, tool, budget or HTTP type: conversion to those happens in the layers above.
//! Every write a worker makes is one statement fenced on `(id, lease_token)` (`Fence`).

pub mod actions;
pub mod agents;
pub mod budget;
pub mod calls;
pub mod events;
pub mod overview;
pub mod retention;
pub mod runs;
pub mod sessions;
pub mod tasks;
pub mod tenants;
pub mod tools;

use std::time::Duration;

pub use sqlx::PgPool;
use uuid::Uuid;

/// Channels of the LISTEN/NOTIFY hub.
pub const CH_QUEUED: &str = "subagentd_queued";
pub const CH_DONE: &str = "subagentd_done";
pub const CH_CANCEL: &str = "subagentd_cancel";
/// A task has new events (payload: its id).
pub const CH_EVENT: &str = "subagentd_event";
/// A tenant with tasks waiting for budget settled a reservation (payload: the tenant).
pub const CH_BUDGET: &str = "subagentd_budget";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    /// A stored value this version cannot read (a row written by a newer version, say).
    #[error("stored data is not readable: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Name of the unique constraint this error violated, if any.
    pub fn constraint(&self) -> Option<&str> {
        match self {
            StoreError::Db(sqlx::Error::Database(d)) => d.constraint(),
            _ => None,
        }
    }
}

/// Who is writing: a task under one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub id: Uuid,
    pub lease: Uuid,
}

/// Is the database reachable and fully migrated?
pub async fn ready(pool: &PgPool) -> Result<bool, StoreError> {
    let latest = crate::db::MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied: Option<i64> =
        sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success").fetch_one(pool).await?;
    Ok(applied.unwrap_or(0) >= latest)
}

/// Retry a database write through short outages (about 6 s in all; a lease outlives them).
pub async fn retrying<T, F, Fut>(mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut delay = Duration::from_millis(100);
    let mut tries = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tries < 6 => {
                tries += 1;
                tracing::warn!(error = %e, tries, "database write failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(3));
            }
            Err(e) => return Err(e),
        }
    }
}
