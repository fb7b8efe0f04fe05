//! Every SQL statement of the service, one file per table family; plain rows in and out.
//!
//! May import: `db` (migrations, for readiness) and the crate's leaves (`config`, and the task's
//! domain kinds, `tasks::kinds`). Never an engine, tool, budget or HTTP type, nor anything else
//! of the lifecycle room: conversion to those happens in the layers above.
//! Every write a worker makes is one statement fenced on `(id, lease_token)` (`Fence`): a task
//! holds a lease token only while it runs (a constraint, migration 0016), so the fence needs no
//! `status = 'running'`, and without one the primary key alone finds the row.

pub mod a2a;
pub mod actions;
pub mod agents;
pub mod budget;
pub mod calls;
pub mod committer;
pub mod diffs;
pub mod environments;
pub mod events;
pub mod mcp;
pub mod overview;
pub mod partitions;
pub mod retention;
pub mod runs;
pub mod schedules;
pub mod sessions;
pub mod tasks;
pub mod tenants;
pub mod tools;
pub mod workers;
pub mod workspaces;

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
/// A task to run at a time, or a schedule, was made: the timers look again (payload: empty).
pub const CH_TIMER: &str = "subagentd_timer";
/// A replica watches a task's live output, or no longer does (`+task:replica`, `-task:replica`).
pub const CH_WATCH: &str = "subagentd_watch";
/// A task's own channel for its live output (`subagentd_live_<id, 32 hex digits>`), listened to
/// only while some replica has a subscriber for it.
pub const CH_LIVE_PREFIX: &str = "subagentd_live_";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    /// A stored value this version cannot read (a row written by a newer version, say).
    #[error("stored data is not readable: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// The database went away (a restart, a failover, a cut connection) rather than refused
    /// the statement: worth waiting for.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed) => true,
            StoreError::Db(sqlx::Error::Tls(_) | sqlx::Error::Protocol(_)) => true,
            // 57P01..57P03: admin shutdown, crash shutdown, cannot connect now; class 08: connection.
            StoreError::Db(sqlx::Error::Database(d)) => {
                d.code().is_some_and(|c| c.starts_with("57P") || c.starts_with("08"))
            }
            _ => false,
        }
    }

    /// The database refused a value (class 22, data exception: out of range, malformed): bad
    /// input that validation did not catch, not the service's fault.
    pub fn is_bad_value(&self) -> bool {
        matches!(self, StoreError::Db(sqlx::Error::Database(d)) if d.code().is_some_and(|c| c.starts_with("22")))
    }

    /// The database refused what a write holds, and would refuse it again: a value (class 22,
    /// a NUL in text, a string too long…) or a size (class 54, program limit exceeded). A
    /// checkpoint that meets it ends its task rather than being retried by another attempt.
    pub fn is_unstorable(&self) -> bool {
        self.is_bad_value()
            || matches!(self, StoreError::Db(sqlx::Error::Database(d)) if d.code().is_some_and(|c| c.starts_with("54")))
    }

    /// An insert found no partition for its row (23514, "no partition of relation ... found
    /// for row"): `partitions::repair` creates them. A check constraint's violation has the same
    /// code and names its constraint; this one names none (whatever the server's language).
    pub fn is_no_partition(&self) -> bool {
        matches!(self, StoreError::Db(sqlx::Error::Database(d))
            if d.code().as_deref() == Some("23514")
                && (d.constraint().is_none() || d.message().starts_with("no partition of relation")))
    }

    /// The row a statement meant to lock or change left the queue for the history (its task
    /// ended) after the statement's snapshot: PostgreSQL cannot follow a row into another
    /// partition and answers a serialization failure (40001). Run again, the statement sees
    /// the ended task.
    pub fn is_moved(&self) -> bool {
        matches!(self, StoreError::Db(sqlx::Error::Database(d)) if d.code().as_deref() == Some("40001"))
    }

    /// Name of the unique constraint this error violated, if any.
    pub fn constraint(&self) -> Option<&str> {
        match self {
            StoreError::Db(sqlx::Error::Database(d)) => d.constraint(),
            _ => None,
        }
    }
}

/// How long before its task's `created_at` a read or write of the task's rows in a table
/// partitioned by the time they were written looks (the conversation, the stored diff): run-time
/// or plan-time pruning of the days before. Both times are the database's `now()`, the task's
/// taken first, so only a clock stepped back could put a row before its task; a margin of
/// minutes, not the day it was (which had every turn commit probe yesterday's messages
/// partition's index: 10,700 blocks read from disk in a 10M history run), keeps that case
/// covered. In SQL it is `subagentd_clock_margin()` (migration 0039; the same, checked by
/// `queries::the_clock_margin_is_the_same_in_sql_and_in_the_service`); given as a parameter,
/// `col >= $n` with the bound computed here is pruned when an unnamed statement is planned (an
/// expression on it, `$n - interval`, is stable and pruned only at execution, after every
/// partition is locked).
pub const CLOCK_MARGIN: chrono::Duration = chrono::Duration::minutes(5);

/// Who is writing: a task under one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub id: Uuid,
    pub lease: Uuid,
}

/// Is the database reachable and fully migrated?
pub async fn ready(pool: &PgPool) -> Result<bool, StoreError> {
    let latest = crate::db::MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied =
        sqlx::query_scalar!("SELECT max(version) FROM _sqlx_migrations WHERE success").fetch_one(pool).await?;
    Ok(applied.unwrap_or(0) >= latest)
}

/// Retry a database write: through an unavailable database for up to `UNAVAILABLE_WAIT`, through
/// other errors about 6 s in all (a lease outlives them). A write that finds no history
/// partition for its row has them created through `pool` (up to 10 s each time), then is tried
/// again, at most 6 times.
pub async fn retrying<T, F, Fut>(pool: &PgPool, mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut delay = Duration::from_millis(100);
    let started = std::time::Instant::now();
    let mut tries = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            // A history partition is missing: created on demand, then the write is tried again.
            Err(e) if e.is_no_partition() && tries < 6 => {
                tries += 1;
                if !partitions::repair(pool).await {
                    tokio::time::sleep(delay).await;
                }
            }
            // An unavailable database (a restart, a failover) is waited for as long as a lease:
            // the run keeps its place, and its lease is renewed once the database is back.
            Err(e) if e.is_unavailable() && started.elapsed() < UNAVAILABLE_WAIT => {
                tries += 1;
                tracing::warn!(error = %e, tries, "database unavailable; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            // Refused for what it holds: it would be refused again.
            Err(e) if e.is_unstorable() => return Err(e),
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

/// Run `f` again while a task it locks moved out of the queue under it (`is_moved`): the writes
/// that may meet a task ending at the same moment (a cancel, an answer, the claim, heartbeats,
/// the timers). Each run takes a new snapshot, so it sees the moved task ended; a cancel over
/// many tasks of a busy tenant may meet several ends, so it waits a little more each time (5 ms
/// doubling to 200 ms, at most 20 runs: about 3 s). A write that finds no partition for its row
/// (an end into a month, a rescued call into a day, that is missing) has them made through
/// `pool` once, as `retrying` does, and runs again.
pub async fn on_move<T, F, Fut>(pool: &PgPool, mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut delay = Duration::from_millis(5);
    let mut repaired = false;
    for run in 1..20 {
        match f().await {
            Err(e) if e.is_moved() => {
                if run == 5 {
                    // Rare: a heartbeat waiting this long may cost a short lease.
                    tracing::warn!(
                        runs = run,
                        "a write met tasks moving out of the queue 5 times running; trying again"
                    );
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(200));
            }
            Err(e) if e.is_no_partition() && !repaired => {
                repaired = true;
                if !partitions::repair(pool).await {
                    return Err(e);
                }
            }
            other => return other,
        }
    }
    f().await
}

/// How long a write waits for an unavailable database before it gives up.
pub const UNAVAILABLE_WAIT: Duration = Duration::from_secs(30);
