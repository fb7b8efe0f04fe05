//! The one place a run's end is decided: the engine's outcome becomes the task's terminal state
//! (written, with the run's last turn, by the lifecycle room's `tasks::end`), or a release to
//! the queue, a budget wait, a pause, or nothing when the lease is lost — exactly once.

use crate::engine::{BudgetWait, Outcome, PendingCall, RunEnd, StopCause};
use crate::kinds::{FailureCode, StopReason, TaskStatus};
use crate::store::actions::NewAction;
use crate::store::runs::{Committed, Finish};
use crate::store::CH_QUEUED;
use crate::tasks::end::{self, End, Ended};

use super::run_store::PgRunStore;

/// What becomes of a task when its run ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Disposition {
    /// A terminal state.
    Finish(Finish),
    /// Back to the queue without counting the attempt (a drain).
    Release,
    /// Back to the queue to wait for budget, without counting the attempt.
    Wait(BudgetWait),
    /// `requires_action` until its pending calls are answered.
    Pause(Vec<PendingCall>),
    /// Nothing: another attempt owns the task.
    LeaseLost,
}

/// What the run is: for the wording of a summary the engine could not write, and the log line
/// of a failure.
#[derive(Debug, Clone, Copy)]
pub struct RunFacts<'a> {
    pub agent: &'a str,
    /// The task's time limit, in seconds.
    pub time_limit: Option<f64>,
    /// `provider/model`.
    pub model: &'a str,
    /// The provider's host, if it has one.
    pub host: Option<&'a str>,
    /// How long a pause waits for its answers, in seconds.
    pub action_timeout: f64,
    /// When the task's time limit runs out (its paused time not counted).
    pub deadline: Option<chrono::DateTime<chrono::Utc>>,
}

/// How `outcome` is written to the task.
pub fn decide(outcome: &Outcome, facts: RunFacts<'_>) -> Disposition {
    let fin = |status, stop_reason: Option<StopReason>, summary: Option<String>| {
        Disposition::Finish(Finish {
            status,
            stop_reason,
            summary,
            output: None,
            error_code: None,
            error_message: None,
            return_task: false,
        })
    };
    match outcome {
        Outcome::Completed { summary, output } => Disposition::Finish(Finish {
            status: TaskStatus::Completed,
            stop_reason: Some(StopReason::FinalAnswer),
            summary: Some(summary.clone()),
            output: output.clone(),
            error_code: None,
            error_message: None,
            return_task: false,
        }),
        Outcome::InvalidOutput { summary, errors } => Disposition::Finish(Finish {
            status: TaskStatus::Incomplete,
            stop_reason: Some(StopReason::InvalidOutput),
            summary: Some(summary.clone()),
            output: None,
            error_code: Some(FailureCode::InvalidOutput),
            error_message: Some(format!("the final answer does not match the output schema: {}", errors.join("; "))),
            return_task: false,
        }),
        Outcome::Incomplete { stop_reason, summary } => {
            fin(TaskStatus::Incomplete, Some(*stop_reason), Some(summary.clone()))
        }
        Outcome::Failed { code, message } => Disposition::Finish(Finish {
            status: TaskStatus::Failed,
            stop_reason: None,
            summary: None,
            output: None,
            error_code: Some(*code),
            error_message: Some(message.clone()),
            return_task: false,
        }),
        Outcome::Stopped(StopCause::Cancelled) => fin(TaskStatus::Cancelled, Some(StopReason::Cancelled), None),
        Outcome::Stopped(StopCause::Timeout) => fin(
            TaskStatus::Incomplete,
            Some(StopReason::Timeout),
            Some(format!(
                "(sub-agent {} stopped: its time limit of {} s was reached)",
                facts.agent,
                facts.time_limit.unwrap_or(0.0)
            )),
        ),
        Outcome::Stopped(StopCause::Budget(limit)) => fin(
            TaskStatus::Incomplete,
            Some(StopReason::Budget),
            Some(format!("(sub-agent stopped: the {limit} budget would be exceeded)")),
        ),
        Outcome::Stopped(StopCause::Drain) => Disposition::Release,
        Outcome::Stopped(StopCause::BudgetWait(w)) => Disposition::Wait(w.clone()),
        Outcome::Paused(calls) => Disposition::Pause(calls.clone()),
        Outcome::Stopped(StopCause::LeaseLost) => Disposition::LeaseLost,
    }
}

/// Write the run's end: its last turn and terminal state in one commit (through the room's
/// `tasks::end`, which hands the finished task to this process's waiters); or its release, its
/// budget wait, its pause; or nothing.
pub async fn apply(
    store: &PgRunStore,
    end: RunEnd,
    facts: RunFacts<'_>,
    started_at: Option<chrono::DateTime<chrono::Utc>>,
) {
    match decide(&end.outcome, facts) {
        Disposition::LeaseLost => tracing::warn!("lease lost: this worker writes nothing more for the task"),
        Disposition::Release => match store.release(end.last_turn.as_ref()).await {
            Ok(true) => store.hub.publish(CH_QUEUED, String::new()),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "release failed; the lease will expire and the task be rescued"),
        },
        Disposition::Pause(calls) => pause(store, end, &calls, facts).await,
        Disposition::Wait(w) => {
            // The time limit runs on while the task waits.
            tracing::info!(limit = %w.limit, "waiting for budget: back to the queue");
            if let Err(e) = store.wait_for_budget(&w, facts.deadline).await {
                tracing::warn!(error = %e, "budget wait not written; the lease will expire and the task be rescued");
            }
        }
        Disposition::Finish(fin) => finish(store, end, fin, facts, started_at).await,
    }
}

async fn pause(store: &PgRunStore, end: RunEnd, calls: &[PendingCall], facts: RunFacts<'_>) {
    let Some(cp) = end.last_turn.as_ref() else {
        return tracing::error!("a pause without its turn: nothing written; the lease will expire");
    };
    let actions: Vec<NewAction> = calls
        .iter()
        .map(|c| NewAction {
            tool_call_id: c.call.id.clone(),
            kind: c.gate,
            name: c.call.name.clone(),
            arguments: c.call.arguments.clone(),
        })
        .collect();
    match store.pause(cp, &actions, facts.action_timeout).await {
        Ok(Some(n)) => {
            metrics::counter!("subagentd_pauses_total").increment(1);
            tracing::info!(pause = n, actions = actions.len(), "paused: requires action");
        }
        Ok(None) => tracing::warn!("lease lost before the pause; another attempt owns the task"),
        Err(e) => tracing::error!(error = %e, "pause failed; the lease will expire and the task be rescued"),
    }
}

async fn finish(
    store: &PgRunStore,
    end: RunEnd,
    fin: Finish,
    facts: RunFacts<'_>,
    started_at: Option<chrono::DateTime<chrono::Utc>>,
) {
    let id = store.fence.id;
    // The run's span (the current one) tells trace backends a run did not complete.
    match fin.status {
        TaskStatus::Failed => crate::telemetry::span_error(
            &tracing::Span::current(),
            fin.error_code.map_or("failed", FailureCode::as_str),
            fin.error_message.as_deref().unwrap_or("failed"),
        ),
        TaskStatus::Incomplete => {
            let reason = fin.stop_reason.map_or("incomplete", StopReason::as_str);
            crate::telemetry::span_error(&tracing::Span::current(), reason, &format!("incomplete: {reason}"))
        }
        _ => {}
    }
    if fin.status == TaskStatus::Failed {
        tracing::warn!(
            task_id = %id,
            code = fin.error_code.map_or("", FailureCode::as_str),
            message = fin.error_message.as_deref().unwrap_or(""),
            model = facts.model,
            host = facts.host.unwrap_or(""),
            "task failed"
        );
    }
    let mut status = fin.status;
    let last_turn = end.last_turn.as_ref().map(|cp| store.turn_write(cp));
    let ending = End::Run { fence: store.fence, last_turn, finish: fin, committer: &store.committer };
    let mut ended = end::finish(&store.pool, &store.hub, ending).await;
    let refused = match &ended {
        Err(e) if e.is_unstorable() => Some(e.to_string()),
        _ => None,
    };
    if let Some(why) = refused {
        // The last turn was refused for what it holds: the task fails naming why, without it,
        // rather than being rescued to do the work again.
        tracing::error!(error = %why, "the run's last turn could not be stored; the task fails");
        let failed = Outcome::Failed {
            code: FailureCode::CheckpointFailed,
            message: format!("the run's last turn could not be stored: {why}"),
        };
        let Disposition::Finish(fin) = decide(&failed, facts) else { unreachable!("a failure is a finish") };
        status = fin.status;
        let ending = End::Run { fence: store.fence, last_turn: None, finish: fin, committer: &store.committer };
        ended = end::finish(&store.pool, &store.hub, ending).await;
    }
    match ended {
        Ok(Ended::Run(Committed::Finished(_))) => {
            metrics::counter!("subagentd_tasks_finished_total", "status" => status.as_str()).increment(1);
            if let Some(started) = started_at {
                let took = (chrono::Utc::now() - started).to_std().unwrap_or_default();
                metrics::histogram!("subagentd_run_duration_seconds").record(took.as_secs_f64());
            }
            tracing::info!(status = status.as_str(), "task finished")
        }
        Ok(Ended::Run(Committed::LeaseLost)) => {
            tracing::warn!("lease lost before finish; another attempt owns the task")
        }
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "finish failed; the lease will expire and the task be rescued"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FACTS: RunFacts<'static> = RunFacts {
        agent: "plan",
        time_limit: Some(2.5),
        model: "mock/m",
        host: None,
        action_timeout: 60.0,
        deadline: None,
    };

    #[test]
    fn each_outcome_becomes_one_end() {
        let Disposition::Finish(f) = decide(&Outcome::Completed { summary: "s".into(), output: None }, FACTS) else {
            panic!()
        };
        assert_eq!(
            (f.status, f.stop_reason.map(StopReason::as_str), f.summary.as_deref()),
            (TaskStatus::Completed, Some("final_answer"), Some("s"))
        );
        let Disposition::Finish(f) = decide(&Outcome::Stopped(StopCause::Timeout), FACTS) else { panic!() };
        assert_eq!(f.stop_reason.map(StopReason::as_str), Some("timeout"));
        assert_eq!(f.summary.as_deref(), Some("(sub-agent plan stopped: its time limit of 2.5 s was reached)"));
        let Disposition::Finish(f) =
            decide(&Outcome::Failed { code: FailureCode::Internal, message: "m".into() }, FACTS)
        else {
            panic!()
        };
        assert_eq!((f.status, f.error_code.map(FailureCode::as_str)), (TaskStatus::Failed, Some("internal")));
        let Disposition::Finish(f) = decide(&Outcome::Stopped(StopCause::Budget("usd_per_day".into())), FACTS) else {
            panic!()
        };
        assert_eq!((f.status, f.stop_reason.map(StopReason::as_str)), (TaskStatus::Incomplete, Some("budget")));
        assert_eq!(decide(&Outcome::Stopped(StopCause::Drain), FACTS), Disposition::Release);
        assert_eq!(decide(&Outcome::Stopped(StopCause::LeaseLost), FACTS), Disposition::LeaseLost);
    }
}
