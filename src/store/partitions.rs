//! The history's daily partitions (migrations 0028, 0030 and 0031): created ahead, created on demand
//! when an insert finds none, and dropped whole past retention (`DETACH ... CONCURRENTLY`, then
//! `DROP`). Partitions are named `<parent>_pYYYYMMDD` and hold the UTC day they are named for.

use std::time::Duration;

use chrono::{NaiveDate, Utc};
use sqlx::PgPool;

use super::StoreError;

/// A task's conversation and events: partitioned by the day their rows are written, kept
/// `--retention-days`.
pub const HISTORY: [&str; 2] = ["task_events", "task_messages"];

/// The ledger: partitioned by the day of each call (its key's time), kept
/// `--ledger-retention-days`.
pub const LEDGER: &str = "llm_calls";

/// The stored diffs of tasks' copies of their workspaces: partitioned by the day of a row's last
/// write (`updated_at`), kept `--retention-days` (migration 0031).
pub const DIFFS: &str = "task_diffs";

/// Every table partitioned by the day.
pub const DAILY: [&str; 4] = ["task_events", "task_messages", DIFFS, LEDGER];

/// The column a daily table is partitioned on, for the tables whose open tasks' rows retention
/// moves to today rather than drop (`None`: the ledger, whose rows go with their day).
fn moved_on(parent: &str) -> Option<&'static str> {
    if HISTORY.contains(&parent) {
        Some("created_at")
    } else if parent == DIFFS {
        Some("updated_at")
    } else {
        None
    }
}

/// How many days ahead the service keeps partitions.
pub const AHEAD_DAYS: i32 = 7;

/// A retention statement waits this long for a lock, then gives up until the next pass: the
/// claim and inserts are never stalled longer.
pub const LOCK_TIMEOUT: &str = "1s";

/// Create the partitions from yesterday to `ahead` days on (one caller at a time). Returns the
/// last UTC day covered.
pub async fn ensure(pool: &PgPool, ahead: i32) -> Result<NaiveDate, StoreError> {
    Ok(sqlx::query_scalar!(r#"SELECT subagentd_ensure_partitions($1) AS "until!""#, ahead).fetch_one(pool).await?)
}

/// How many whole days ahead of today (UTC) every history table has partitions, `tasks`' month
/// partitions included (negative when even today's is missing).
pub async fn reach(pool: &PgPool) -> Result<i64, StoreError> {
    let mut least: Option<i64> = None;
    let today = Utc::now().date_naive();
    for parent in DAILY {
        let days: std::collections::BTreeSet<NaiveDate> =
            partitions(pool, parent).await?.into_iter().filter(|p| !p.detached).map(|p| p.day).collect();
        // The days from today on that follow one another without a gap.
        let ahead = (0..).take_while(|k| days.contains(&(today + chrono::Days::new(*k)))).count() as i64 - 1;
        least = Some(least.map_or(ahead, |l| l.min(ahead)));
    }
    // And the month partitions of `tasks`, which a task ending on those days moves into.
    let months: std::collections::BTreeSet<String> = sqlx::query_scalar!(
        r#"SELECT c.relname::text AS "name!" FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid
         WHERE i.inhparent = to_regclass('tasks') AND c.relname ~ '^tasks_p[0-9]{6}$'"#
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .collect();
    let month_of = |k: u64| format!("tasks_p{}", (today + chrono::Days::new(k)).format("%Y%m"));
    let ahead = (0..).take_while(|k| months.contains(&month_of(*k))).count() as i64 - 1;
    Ok(least.map_or(ahead, |l| l.min(ahead)))
}

/// One partition of a history table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    pub day: NaiveDate,
    /// A `DETACH ... CONCURRENTLY` that did not finish: it is finalized, then dropped.
    pub detaching: bool,
    /// Detached, not dropped (its `DROP` failed): a table of the name that is no partition.
    pub detached: bool,
}

/// The partitions of `parent` named the service's way, oldest first, and the tables of such a
/// name that are no longer attached.
pub async fn partitions(pool: &PgPool, parent: &str) -> Result<Vec<Partition>, StoreError> {
    let rows = sqlx::query!(
        r#"SELECT c.relname::text AS "name!", i.inhdetachpending AS "pending?" FROM pg_class c
         LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
         WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace
           AND c.relname ~ ('^' || $1 || '_p[0-9]{8}$')
           AND (i.inhparent IS NULL OR i.inhparent = to_regclass($1))
         ORDER BY 1"#,
        parent
    )
    .fetch_all(pool)
    .await?;
    let prefix = format!("{parent}_p");
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let (name, pending) = (r.name, r.pending);
            let day = NaiveDate::parse_from_str(name.strip_prefix(&prefix)?, "%Y%m%d").ok()?;
            Some(Partition { name, day, detaching: pending == Some(true), detached: pending.is_none() })
        })
        .collect())
}

/// Drop the partitions of `parent` whose whole day is more than `days` days old. In `HISTORY`
/// and `DIFFS`, the rows of tasks still open (scheduled, queued, running or paused) are first moved to today's
/// partition, so a long pause keeps its conversation; the ledger's go with their day, as its rows
/// were deleted by their time before (the task keeps its totals). One replica at a time (a session advisory lock: the
/// others skip the pass). Every statement runs with `LOCK_TIMEOUT`; one that times out leaves
/// its partition, and the older ones after it, for the next pass. Returns the partitions dropped.
pub async fn drop_expired(pool: &PgPool, parent: &str, days: u32) -> Result<Vec<String>, StoreError> {
    let cutoff = Utc::now().date_naive() - chrono::Days::new(u64::from(days));
    // A partition holds [day, day + 1): expired once day + 1 <= cutoff, i.e. its newest row is older than the window.
    let mut expired: Vec<Partition> = partitions(pool, parent).await?.into_iter().filter(|p| p.day < cutoff).collect();
    // A table has at most one detach pending: it is finished first (and tables left detached
    // are dropped before anything else).
    expired.sort_by_key(|p| (!p.detached, !p.detaching, p.day));
    if expired.is_empty() {
        return Ok(vec![]);
    }
    let mut conn = pool.acquire().await?;
    let mine = sqlx::query_scalar!(r#"SELECT pg_try_advisory_lock(hashtext('subagentd_retention')) AS "mine!""#)
        .fetch_one(&mut *conn)
        .await?;
    if !mine {
        return Ok(vec![]);
    }
    let outcome = drop_all(&mut conn, parent, expired).await;
    // Whatever happened, the setting and the lock go before the connection is given back.
    let reset = async {
        sqlx::query!("RESET lock_timeout").execute(&mut *conn).await?;
        sqlx::query!("SELECT pg_advisory_unlock(hashtext('subagentd_retention'))")
            .fetch_one(&mut *conn)
            .await
            .map(|_| ())
    }
    .await;
    if reset.is_err() {
        // A connection whose settings and locks are unknown is not given back to the pool.
        let _ = conn.detach();
    }
    outcome
}

/// Drop `expired` in order under `LOCK_TIMEOUT`, stopping at the first that times out.
async fn drop_all(
    conn: &mut sqlx::PgConnection,
    parent: &str,
    expired: Vec<Partition>,
) -> Result<Vec<String>, StoreError> {
    sqlx::query!("SELECT set_config('lock_timeout', $1, false)", LOCK_TIMEOUT).fetch_one(&mut *conn).await?;
    let mut dropped = vec![];
    for p in expired {
        match drop_one(conn, parent, &p).await {
            Ok(()) => dropped.push(p.name),
            // A lock busy past the timeout (a detach it interrupted stays pending, and no other
            // can start), or a row an open task's own write moved while this pass moved it
            // (40001; only `DIFFS` rows are written again): this partition and the rest wait for
            // a later pass.
            Err(e) if is_lock_timeout(&e) || e.is_moved() => {
                tracing::info!(partition = %p.name, "a lock was busy; the partition is dropped on a later pass");
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(dropped)
}

async fn drop_one(conn: &mut sqlx::PgConnection, parent: &str, p: &Partition) -> Result<(), StoreError> {
    if p.detaching {
        // A detach a timeout interrupted (on this pass or an earlier one) is finished.
        execute(conn, &Ddl::Finalize(parent, &p.name).sql()).await?;
    } else if !p.detached {
        if let Some(at) = moved_on(parent) {
            // Open tasks keep their rows: moved (an update of the partition key) to today.
            // Their times become the move's.
            execute(conn, &Ddl::MoveOpen(parent, at, p.day).sql()).await?;
        }
        execute(conn, &Ddl::Detach(parent, &p.name).sql()).await?;
    }
    // A partition detached here or on an earlier pass whose drop failed. A day of stored diffs
    // leaves its tenants' kept bytes in the same transaction (`tenant_storage`, migration 0038).
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    if parent == "task_diffs" {
        execute(&mut tx, &Ddl::Unkeep(&p.name).sql()).await?;
    }
    execute(&mut tx, &Ddl::Drop(&p.name).sql()).await?;
    tx.commit().await?;
    Ok(())
}

/// A retention statement on tables named at run time (a partition, its parent): SQL no macro
/// can check. Every name is the service's own (`partitions`' rows, this module's constants).
enum Ddl<'a> {
    /// `(parent, partition)`: finish an interrupted `DETACH ... CONCURRENTLY`.
    Finalize(&'a str, &'a str),
    /// `(parent, time column, day)`: move the rows of open tasks out of the day's partition.
    MoveOpen(&'a str, &'a str, NaiveDate),
    /// `(parent, partition)`.
    Detach(&'a str, &'a str),
    /// A detached day of `task_diffs`: its bytes leave its tenants' kept bytes.
    Unkeep(&'a str),
    Drop(&'a str),
}

impl Ddl<'_> {
    fn sql(&self) -> String {
        match self {
            Ddl::Finalize(parent, name) => format!("ALTER TABLE {parent} DETACH PARTITION {name} FINALIZE"),
            Ddl::MoveOpen(parent, at, day) => format!(
                "UPDATE {parent} SET {at} = now()
                 WHERE {at} >= '{day}'::date::timestamp AT TIME ZONE 'UTC'
                   AND {at} < ('{day}'::date + 1)::timestamp AT TIME ZONE 'UTC'
                   AND task_id IN (SELECT id FROM task_queue
                                   WHERE status IN ('scheduled', 'queued', 'running', 'requires_action'))"
            ),
            Ddl::Detach(parent, name) => format!("ALTER TABLE {parent} DETACH PARTITION {name} CONCURRENTLY"),
            Ddl::Unkeep(name) => format!(
                "UPDATE tenant_storage s SET kept_bytes = greatest(0, s.kept_bytes - d.bytes)
                 FROM (SELECT tenant, sum(coalesce(octet_length(changes), 0) + coalesce(octet_length(diff), 0)) AS bytes
                       FROM {name} GROUP BY tenant) d
                 WHERE s.tenant = d.tenant"
            ),
            Ddl::Drop(name) => format!("DROP TABLE {name}"),
        }
    }
}

/// Run a `Ddl` statement. Its shapes run against the real schema in
/// `history::retention_drops_partitions_while_the_claim_and_inserts_go_on` (finalize, move,
/// detach, drop) and `history::stored_diffs_from_the_release_before_keep_every_row_go_by_the_day_and_stay_one_per_task`
/// (the kept bytes of a day of diffs).
async fn execute(conn: &mut sqlx::PgConnection, sql: &str) -> Result<(), StoreError> {
    sqlx::query(sql).execute(conn).await?;
    Ok(())
}

fn is_lock_timeout(e: &StoreError) -> bool {
    // 55P03: lock_not_available (lock_timeout).
    matches!(e, StoreError::Db(sqlx::Error::Database(d)) if d.code().as_deref() == Some("55P03"))
}

/// The fallback: an insert found no partition for its row (the service has not kept them ahead,
/// or one was removed by hand). Creates them now; true if it could. It locks the parent tables
/// briefly, so it runs only when an insert has failed.
pub async fn repair(pool: &PgPool) -> bool {
    match tokio::time::timeout(Duration::from_secs(10), ensure(pool, AHEAD_DAYS)).await {
        Ok(Ok(until)) => {
            tracing::warn!(%until, "an insert found no partition: history partitions created on demand");
            true
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "history partitions could not be created on demand");
            false
        }
        Err(_) => false,
    }
}
