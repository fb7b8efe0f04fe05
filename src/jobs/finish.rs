//! The one place a run's end is decided and written: the engine's outcome becomes the task's
//! terminal state (or a release to the queue, or nothing when the lease is lost) exactly once,
//! committed with the run's last turn in one statement, and the finished task is handed to
//! this process's waiters from that commit.

use crate::engine::{BudgetWait, Gate, Outcome, PendingCall, RunEnd, StopCause};
use crate::store::actions::NewAction;
use crate::store::runs::{Committed, Finish};
use crate::store::tasks::TaskStatus;
use crate::store::{CH_DONE, CH_QUEUED};

use super::run_store::PgRunStore;

/// What becomes of a task when its run ends.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
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
pub fn decide(outcome: &Outcome, facts: RunFacts<'_>) -> End {
    let fin = |status, stop_reason: Option<&str>, summary: Option<String>| {
        End::Finish(Finish {
            status,
            stop_reason: stop_reason.map(Into::into),
            summary,
            output: None,
            error_code: None,
            error_message: None,
            return_task: false,
        })
    };
    match outcome {
        Outcome::Completed { summary, output } => End::Finish(Finish {
            status: TaskStatus::Completed,
            stop_reason: Some("final_answer".into()),
            summary: Some(summary.clone()),
            output: output.clone(),
            error_code: None,
            error_message: None,
            return_task: false,
        }),
        Outcome::InvalidOutput { summary, errors } => End::Finish(Finish {
            status: TaskStatus::Incomplete,
            stop_reason: Some("invalid_output".into()),
            summary: Some(summary.clone()),
            output: None,
            error_code: Some("invalid_output".into()),
            error_message: Some(format!("the final answer does not match the output schema: {}", errors.join("; "))),
            return_task: false,
        }),
        Outcome::Incomplete { stop_reason, summary } => {
            fin(TaskStatus::Incomplete, Some(stop_reason), Some(summary.clone()))
        }
        Outcome::Failed { code, message } => End::Finish(Finish {
            status: TaskStatus::Failed,
            stop_reason: None,
            summary: None,
            output: None,
            error_code: Some(code.clone()),
            error_message: Some(message.clone()),
            return_task: false,
        }),
        Outcome::Stopped(StopCause::Cancelled) => fin(TaskStatus::Cancelled, Some("cancelled"), None),
        Outcome::Stopped(StopCause::Timeout) => fin(
            TaskStatus::Incomplete,
            Some("timeout"),
            Some(format!(
                "(sub-agent {} stopped: its time limit of {} s was reached)",
                facts.agent,
                facts.time_limit.unwrap_or(0.0)
            )),
        ),
        Outcome::Stopped(StopCause::Budget(limit)) => fin(
            TaskStatus::Incomplete,
            Some("budget"),
            Some(format!("(sub-agent stopped: the {limit} budget would be exceeded)")),
        ),
        Outcome::Stopped(StopCause::Drain) => End::Release,
        Outcome::Stopped(StopCause::BudgetWait(w)) => End::Wait(w.clone()),
        Outcome::Paused(calls) => End::Pause(calls.clone()),
        Outcome::Stopped(StopCause::LeaseLost) => End::LeaseLost,
    }
}

/// Write the run's end: its last turn and terminal state in one commit, handing the finished
/// task to this process's waiters; or its release; or nothing.
pub async fn apply(
    store: &PgRunStore,
    end: RunEnd,
    facts: RunFacts<'_>,
    started_at: Option<chrono::DateTime<chrono::Utc>>,
) {
    let hub = &store.hub;
    let id = store.fence.id;
    match decide(&end.outcome, facts) {
        End::LeaseLost => tracing::warn!("lease lost: this worker writes nothing more for the task"),
        End::Release => match store.release(end.last_turn.as_ref()).await {
            Ok(true) => hub.publish(CH_QUEUED, String::new()),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "release failed; the lease will expire and the task be rescued"),
        },
        End::Pause(calls) => {
            let Some(cp) = end.last_turn.as_ref() else {
                return tracing::error!("a pause without its turn: nothing written; the lease will expire");
            };
            let actions: Vec<NewAction> = calls
                .iter()
                .map(|c| NewAction {
                    tool_call_id: c.call.id.clone(),
                    kind: if c.gate == Gate::Approval { "approval" } else { "output" },
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
        End::Wait(w) => {
            // The time limit runs on while the task waits.
            tracing::info!(limit = %w.limit, "waiting for budget: back to the queue");
            if let Err(e) = store.wait_for_budget(&w, facts.deadline).await {
                tracing::warn!(error = %e, "budget wait not written; the lease will expire and the task be rescued");
            }
        }
        End::Finish(fin) => {
            // The run's span (the current one) tells trace backends a run did not complete.
            match fin.status {
                TaskStatus::Failed => crate::telemetry::span_error(
                    &tracing::Span::current(),
                    fin.error_code.as_deref().unwrap_or("failed"),
                    fin.error_message.as_deref().unwrap_or("failed"),
                ),
                TaskStatus::Incomplete => {
                    let reason = fin.stop_reason.as_deref().unwrap_or("incomplete");
                    crate::telemetry::span_error(&tracing::Span::current(), reason, &format!("incomplete: {reason}"))
                }
                _ => {}
            }
            if fin.status == TaskStatus::Failed {
                tracing::warn!(
                    task_id = %id,
                    code = fin.error_code.as_deref().unwrap_or(""),
                    message = fin.error_message.as_deref().unwrap_or(""),
                    model = facts.model,
                    host = facts.host.unwrap_or(""),
                    "task failed"
                );
            }
            // The row comes back only when a request in this process waits for it.
            let fin = Finish { return_task: hub.has_waiters(id), ..fin };
            match store.commit_end(end.last_turn.as_ref(), &fin).await {
                Ok(Committed::Finished(task)) => {
                    match task {
                        Some(task) => hub.finished_here(*task),
                        None => hub.publish(CH_DONE, id.to_string()),
                    }
                    metrics::counter!("subagentd_tasks_finished_total", "status" => fin.status.as_str()).increment(1);
                    if let Some(started) = started_at {
                        let took = (chrono::Utc::now() - started).to_std().unwrap_or_default();
                        metrics::histogram!("subagentd_run_duration_seconds").record(took.as_secs_f64());
                    }
                    tracing::info!(status = fin.status.as_str(), "task finished")
                }
                Ok(Committed::Applied) => {}
                Ok(Committed::LeaseLost) => {
                    tracing::warn!("lease lost before finish; another attempt owns the task")
                }
                Err(e) => tracing::error!(error = %e, "finish failed; the lease will expire and the task be rescued"),
            }
        }
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
        let End::Finish(f) = decide(&Outcome::Completed { summary: "s".into(), output: None }, FACTS) else { panic!() };
        assert_eq!(
            (f.status, f.stop_reason.as_deref(), f.summary.as_deref()),
            (TaskStatus::Completed, Some("final_answer"), Some("s"))
        );
        let End::Finish(f) = decide(&Outcome::Stopped(StopCause::Timeout), FACTS) else { panic!() };
        assert_eq!(f.stop_reason.as_deref(), Some("timeout"));
        assert_eq!(f.summary.as_deref(), Some("(sub-agent plan stopped: its time limit of 2.5 s was reached)"));
        let End::Finish(f) = decide(&Outcome::Failed { code: "c".into(), message: "m".into() }, FACTS) else {
            panic!()
        };
        assert_eq!((f.status, f.error_code.as_deref()), (TaskStatus::Failed, Some("c")));
        let End::Finish(f) = decide(&Outcome::Stopped(StopCause::Budget("usd_per_day".into())), FACTS) else {
            panic!()
        };
        assert_eq!((f.status, f.stop_reason.as_deref()), (TaskStatus::Incomplete, Some("budget")));
        assert_eq!(decide(&Outcome::Stopped(StopCause::Drain), FACTS), End::Release);
        assert_eq!(decide(&Outcome::Stopped(StopCause::LeaseLost), FACTS), End::LeaseLost);
    }
}
