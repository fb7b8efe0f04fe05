//! Every way a task ends, and the one function that ends it: `finish` takes the end by name, runs
//! the store's one statement for that kind of end, and wakes the waiters of every task it ended —
//! in this process at once (a run's own end hands its waiters the row as committed), on the
//! other replicas through NOTIFY.
//!
//! An end that is decided in one statement stays one statement (a cancel racing a finish, a
//! rescue, a budget stop are each settled by the row lock of that statement); this is its only
//! caller.

use sqlx::PgPool;
use uuid::Uuid;

use crate::hub::Hub;
use crate::kinds::TaskStatus;
use crate::store::committer::Committer;
use crate::store::runs::{self, Committed, Finish, TurnWrite};
use crate::store::tasks::{self as store, CancelFilter};
use crate::store::{budget, retrying, Fence, StoreError, CH_CANCEL, CH_DONE, CH_EVENT, CH_QUEUED};

/// How a task (or several) ends.
#[allow(clippy::large_enum_variant)] // made once per end and consumed at once: not worth a box
pub enum End<'a> {
    /// A run ends (`jobs::finish`): its last turn, if not committed yet, and its terminal state
    /// in one statement — group-committed with other runs' turns when it has a last turn.
    Run { fence: Fence, last_turn: Option<TurnWrite>, finish: Finish, committer: &'a Committer },
    /// A cancel of the tenant's tasks matching `filter`: queued and paused ones end now; running
    /// ones are flagged, and their workers (on whichever replica) stop them and end them as a
    /// run's end.
    Cancel { tenant: &'a str, filter: CancelFilter },
    /// The runs of lost workers (expired leases, sessions gone): queued again, or failed
    /// (`worker_lost`) when out of attempts, or cancelled when that was asked.
    Rescue { max_attempts: i32, grace_secs: f64 },
    /// Budget waits that ran past their task's time limit: `incomplete` / `timeout`.
    WaitsTimedOut,
}

/// What an end wrote.
#[derive(Debug)]
pub enum Ended {
    Run(Committed),
    /// Each task hit, with its status before the cancel.
    Cancel(Vec<(Uuid, TaskStatus)>),
    /// Each task rescued, with its status now.
    Rescue(Vec<(Uuid, TaskStatus)>),
    WaitsTimedOut(Vec<Uuid>),
}

/// End tasks as `end` says: its statement, then the wake-ups.
pub async fn finish(pool: &PgPool, hub: &Hub, end: End<'_>) -> Result<Ended, StoreError> {
    match end {
        End::Run { fence, last_turn, finish, committer } => run(pool, hub, fence, last_turn, finish, committer).await,
        End::Cancel { tenant, filter } => {
            let hit = store::cancel_matching(pool, tenant, &filter).await?;
            for (id, old) in &hit {
                // A running task's worker stops it, wherever it runs (here: at once).
                let channel = if *old == TaskStatus::Running { CH_CANCEL } else { CH_DONE };
                hub.publish(channel, id.to_string());
                hub.publish(CH_EVENT, id.to_string());
            }
            Ok(Ended::Cancel(hit))
        }
        End::Rescue { max_attempts, grace_secs } => {
            let rescued = runs::rescue(pool, max_attempts, grace_secs).await?;
            for (id, status) in &rescued {
                match status {
                    TaskStatus::Queued => hub.publish(CH_QUEUED, String::new()),
                    _ => hub.publish(CH_DONE, id.to_string()),
                }
                hub.publish(CH_EVENT, id.to_string());
            }
            Ok(Ended::Rescue(rescued))
        }
        End::WaitsTimedOut => {
            let ended = budget::end_expired_waits(pool).await?;
            for id in &ended {
                hub.publish(CH_DONE, id.to_string());
                hub.publish(CH_EVENT, id.to_string());
            }
            Ok(Ended::WaitsTimedOut(ended))
        }
    }
}

/// A run's end. Its waiters in this process get the task as the commit wrote it (read back only
/// when there are some: it costs a decode at every finish).
async fn run(
    pool: &PgPool,
    hub: &Hub,
    fence: Fence,
    last_turn: Option<TurnWrite>,
    finish: Finish,
    committer: &Committer,
) -> Result<Ended, StoreError> {
    let id = fence.id;
    let finish = Finish { return_task: hub.has_waiters(id), ..finish };
    let written = match last_turn {
        Some(turn) => committer.turns.write(TurnWrite { fin: Some(finish), ..turn }).await?,
        None => retrying(pool, || runs::finish(pool, fence, &finish)).await?,
    };
    Ok(Ended::Run(match written {
        Committed::Finished(task) => {
            hub.publish(CH_EVENT, id.to_string());
            match task {
                Some(task) => hub.finished_here(*task),
                None => hub.publish(CH_DONE, id.to_string()),
            }
            // Handed over: the row is the waiters' now.
            Committed::Finished(None)
        }
        other => other,
    }))
}
