//! A task followed as A2A streams it: the `Task` first, then a `WORKING` status update when it
//! starts and after each turn, and at the end its artifacts and its final status — or, at a
//! pause, the `INPUT_REQUIRED` status saying what it waits for. The stream ends there (A2A 1.0
//! has no `final` flag: the server closes the stream). Fed by the room's live feed of the
//! task's events, so a task running on another replica streams the same.

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::errors::A2aError;
use super::Ctx;
use crate::a2a::{state, stream_ends, timestamp, Shown};
use crate::kinds::TaskStatus;
use crate::tasks::context::ContextRow as A2aTask;
use crate::tasks::feed::{OutputAhead, Step};
use crate::tasks::guard::Hold;
use crate::tasks::TaskView;

/// Stream `task` (its events after `after`) under `hold`.
pub fn follow(
    ctx: Ctx,
    task: TaskView,
    a2a: Option<A2aTask>,
    after: i32,
    hold: Hold,
    live: Option<OutputAhead>,
    history: Option<usize>,
) -> mpsc::Receiver<Result<Value, A2aError>> {
    // Bounded: a client that stops reading holds the producer back, not memory.
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        if let Err(e) = produce(&ctx, &tx, Followed { task, a2a, after, hold, live }, history).await {
            let _ = tx.send(Err(e)).await;
        }
    });
    rx
}

/// What a stream follows: the task as it stood, from which event, under which hold, and its
/// run's text if it was subscribed ahead.
struct Followed {
    task: TaskView,
    a2a: Option<A2aTask>,
    after: i32,
    hold: Hold,
    live: Option<OutputAhead>,
}

async fn produce(
    ctx: &Ctx,
    tx: &mpsc::Sender<Result<Value, A2aError>>,
    f: Followed,
    history: Option<usize>,
) -> Result<(), A2aError> {
    let Followed { task, a2a, after, hold, live: ahead } = f;
    let room = ctx.st.room();
    let scope = ctx.scope();
    let shown = Shown { task: &task, a2a: a2a.as_ref() };
    let context = shown.context_id();
    if tx.send(Ok(json!({"task": shown.task(history, true)}))).await.is_err() || stream_ends(task.status) {
        return Ok(());
    }
    let mut working = task.status == TaskStatus::Running;
    let output = ahead.unwrap_or_else(|| room.output_ahead(task.id));
    let mut steps = Box::pin(room.steps(&scope, task.id, room.watch(&task, after, hold, Some(output)), None));
    // The live text's artifact of each turn: (turn, try) of the text it holds so far.
    let mut live: Option<(u32, u32)> = None;
    loop {
        let step = tokio::select! {
            step = steps.next() => step,
            _ = tx.closed() => return Ok(()),
        };
        let Some(step) = step else { return Ok(()) };
        let (metadata, at) = match step? {
            Step::Output(d) => {
                // An artifact of its own per turn (not the summary's), appended to as the text
                // comes; a retried call's text starts it again.
                let append = live == Some((d.turn, d.attempt));
                live = Some((d.turn, d.attempt));
                let update = json!({"artifactUpdate": {"taskId": task.id, "contextId": context, "append": append,
                    "artifact": {"artifactId": format!("live-output-turn-{}", d.turn), "name": "live output",
                                 "description": "The model's text as it writes it (turn, try in the metadata)",
                                 "parts": [{"text": d.text}], "metadata": {"turn": d.turn, "try": d.attempt}}}});
                if tx.send(Ok(update)).await.is_err() {
                    return Ok(());
                }
                continue;
            }
            Step::Claimed(ev) if !working => (json!({}), ev.created_at),
            Step::Claimed(_) => continue,
            Step::Turn(turn, ev) => (json!({"turn": turn}), ev.created_at),
            Step::Paused(now) => {
                let update = Shown { task: &now, a2a: a2a.as_ref() }.status_update(None);
                let _ = tx.send(Ok(update)).await;
                return Ok(());
            }
            // The feed ends after the task's last event: it has ended.
            Step::Ended(now) => {
                let shown = Shown { task: &now, a2a: a2a.as_ref() };
                for artifact in shown.artifacts() {
                    if tx.send(Ok(shown.artifact_update(artifact))).await.is_err() {
                        return Ok(());
                    }
                }
                let _ = tx.send(Ok(shown.status_update(None))).await;
                return Ok(());
            }
        };
        working = true;
        let mut update = json!({"taskId": task.id, "contextId": context,
                                "status": {"state": state(TaskStatus::Running), "timestamp": timestamp(at)}});
        if metadata.as_object().is_some_and(|m| !m.is_empty()) {
            update["metadata"] = metadata;
        }
        if tx.send(Ok(json!({"statusUpdate": update}))).await.is_err() {
            return Ok(());
        }
    }
}
