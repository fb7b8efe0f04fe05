//! One run's turns: each a provider call, then its answer read — a final answer (checked against
//! the output schema when there is one), an answer cut at the output limit, or tool calls
//! (refused off the whitelist, watched for loops, paused where they wait for someone, run
//! concurrently otherwise) — and the turn checkpointed, or returned as the run's last.

use std::time::Instant;

use super::output::{self, OutputCheck};
use super::CallOutcome;
use super::{
    call_with_retries, max_turns_reached, request, tool_span, CallRecord, Outcome, PendingCall, RunEnd, RunInput,
    RunStore, StopCause, StopReason, StopSignal, TurnCheckpoint,
};
use crate::kinds::{event, Event};
use crate::llm::{ChatRequest, ChatResponse, FinishReason, Message, Provider, ToolCall};
use crate::tools::{ToolOutput, ToolRunner};

const LOOP_WARN_AT: usize = 3;
const LOOP_STOP_AT: usize = 5;

/// What a turn leads to.
#[allow(clippy::large_enum_variant)] // one per turn, returned at once: not worth a box
pub(super) enum Step {
    /// The next turn (this one is checkpointed).
    Next,
    End(RunEnd),
}

/// A run between its turns.
pub(super) struct Turns<'a> {
    pub input: &'a RunInput,
    pub provider: &'a dyn Provider,
    pub tools: &'a dyn ToolRunner,
    pub store: &'a dyn RunStore,
    pub stop: &'a StopSignal,
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// Its messages not yet checkpointed.
    pub pending: Vec<Message>,
    /// The latest non-empty text the model wrote: the summary if the run stops early.
    pub last_text: Option<String>,
    pub check: Option<OutputCheck>,
    /// After an answer that did not match the schema, the next call must answer.
    pub force_output: bool,
    /// (tool name, arguments) of consecutive identical calls, and how many, for loop detection.
    pub streak: (Option<(String, String)>, usize),
    /// The model the run's calls go to: 0 its own, `n` its `n`th fallback (moved to, and kept).
    pub at: usize,
}

/// A turn's tool calls, screened: each one's result where it is not to run (refused, cut, a
/// loop), the ones to run, and whether the loop detector stops the run.
struct Screened {
    results: Vec<Option<ToolOutput>>,
    to_run: Vec<usize>,
    loop_stop: bool,
}

impl Turns<'_> {
    /// Turn `turn`: its call, and what its answer leads to.
    pub async fn turn(&mut self, turn: u32) -> Step {
        let input = self.input;
        let mut req = request(input, &input.target(self.at), &self.messages, self.force_output);
        let called = call_with_retries(input, self.provider, &mut self.at, self.store, self.stop, &mut req, turn).await;
        let target = input.target(self.at);
        let (mut resp, call) = match called {
            Ok(r) => r,
            Err(Outcome::Stopped(StopCause::Budget(limit))) => {
                let summary = self.last_text.take().unwrap_or_else(|| {
                    format!(
                        "(sub-agent {} stopped after {} turns: the next call would exceed the {limit} budget)",
                        input.agent,
                        turn - 1
                    )
                });
                return Step::End(Outcome::Incomplete { stop_reason: StopReason::Budget, summary }.into());
            }
            Err(o) => return Step::End(o.into()),
        };
        storable_response(&mut resp);
        let mut events = vec![Event::LlmCallFinished(event::LlmCallFinished {
            turn,
            model: target.full(),
            input_tokens: call.usage.input_tokens,
            output_tokens: call.usage.output_tokens,
            cached_tokens: call.usage.cached_tokens,
            cache_write_tokens: call.usage.cache_write_tokens,
            latency_ms: call.latency_ms,
            try_no: call.try_no,
            finish_reason: resp.finish.as_str().to_string(),
        })];
        // Cut at the output limit: the text is partial, and so may be a tool call's arguments.
        let cut = resp.finish == FinishReason::Length;
        if resp.tool_calls.is_empty() && !cut && target.text_tool_calls {
            let offered: Vec<&str> = input.tools.iter().map(|t| t.name.as_str()).collect();
            if let Some(calls) = resp.text.as_deref().and_then(|t| crate::llm::text_tools::parse(t, &offered, turn)) {
                events.push(Event::TextToolCalls(event::TextToolCalls { turn, calls: calls.len() }));
                resp.text = None;
                resp.tool_calls = calls;
            }
        }
        if let Some(t) = resp.text.as_ref().filter(|t| !t.trim().is_empty()) {
            self.last_text = Some(t.clone());
        }
        let assistant = Message::Assistant { content: resp.text.clone(), tool_calls: resp.tool_calls.clone() };
        self.messages.push(assistant.clone());
        self.pending.push(assistant);
        match (resp.tool_calls.is_empty(), cut) {
            (true, true) => self.cut_answer(turn, &req, &resp, call, events).await,
            (true, false) => self.final_answer(turn, &resp, call, events).await,
            (false, _) => self.tool_calls(turn, &resp.tool_calls, cut, call, events).await,
        }
    }

    /// The turn as a checkpoint: its messages not yet saved, its call and its events.
    fn checkpoint(&mut self, turn: u32, call: CallRecord, events: Vec<Event>) -> TurnCheckpoint {
        TurnCheckpoint { turn, messages: std::mem::take(&mut self.pending), call, events }
    }

    /// Save the turn and go on (a lost lease stops the run).
    async fn next(&mut self, cp: TurnCheckpoint) -> Step {
        match self.store.checkpoint(&cp).await {
            Ok(()) => Step::Next,
            Err(_) => Step::End(Outcome::Stopped(StopCause::LeaseLost).into()),
        }
    }

    /// Ask the model something more before its next call.
    fn tell(&mut self, content: String) {
        let m = Message::User { content };
        self.messages.push(m.clone());
        self.pending.push(m);
    }

    /// An answer cut at the output limit: asked again, shorter, while turns remain.
    async fn cut_answer(
        &mut self,
        turn: u32,
        req: &ChatRequest,
        resp: &ChatResponse,
        call: CallRecord,
        mut events: Vec<Event>,
    ) -> Step {
        let limit = req.max_tokens.map_or("its".to_string(), |n| n.to_string());
        events.push(Event::AnswerCut(event::AnswerCut { turn, max_tokens: req.max_tokens }));
        if turn < self.input.max_turns {
            self.tell(format!(
                "Your answer was cut off at the output limit of {limit} tokens before it was complete. \
                 Give your complete final answer again, shorter, so that it fits."
            ));
            let cp = self.checkpoint(turn, call, events);
            return self.next(cp).await;
        }
        let outcome = Outcome::Incomplete {
            stop_reason: StopReason::MaxTokens,
            summary: resp.text.clone().filter(|t| !t.trim().is_empty()).unwrap_or_else(|| {
                format!("(sub-agent {}'s answer was cut off at the output limit of {limit} tokens)", self.input.agent)
            }),
        };
        Step::End(RunEnd { outcome, last_turn: Some(self.checkpoint(turn, call, events)) })
    }

    /// A final answer: the run's end, unless it does not match the output schema and turns
    /// remain (the model is told what is wrong, and answers again).
    async fn final_answer(&mut self, turn: u32, resp: &ChatResponse, call: CallRecord, mut events: Vec<Event>) -> Step {
        let agent = &self.input.agent;
        let Some(check) = &self.check else {
            let outcome = match self.last_text.take() {
                Some(summary) => Outcome::Completed { summary, output: None },
                None => Outcome::Incomplete {
                    stop_reason: StopReason::FinalAnswerEmpty,
                    summary: format!("(sub-agent {agent} ended turn {turn} with an empty answer)"),
                },
            };
            return Step::End(RunEnd { outcome, last_turn: Some(self.checkpoint(turn, call, events)) });
        };
        let text = resp.text.clone().unwrap_or_default();
        let errors = match check.read(&text) {
            Ok(value) => {
                let outcome = Outcome::Completed { summary: text, output: Some(value) };
                return Step::End(RunEnd { outcome, last_turn: Some(self.checkpoint(turn, call, events)) });
            }
            Err(errors) => errors,
        };
        events.push(Event::OutputInvalid(event::OutputInvalid { turn, errors: errors.clone() }));
        if turn < self.input.max_turns {
            self.tell(output::repair_message(&errors));
            let cp = self.checkpoint(turn, call, events);
            self.force_output = true;
            return self.next(cp).await;
        }
        let summary = self
            .last_text
            .take()
            .unwrap_or_else(|| format!("(sub-agent {agent} gave no answer that matches its output schema)"));
        let cp = self.checkpoint(turn, call, events);
        Step::End(RunEnd { outcome: Outcome::InvalidOutput { summary, errors }, last_turn: Some(cp) })
    }

    /// Tool calls: screened (whitelist, cut arguments, loops), the ones that wait for someone
    /// set apart, the rest run concurrently in the model's order; then the run pauses, stops, or
    /// goes on.
    async fn tool_calls(
        &mut self,
        turn: u32,
        calls: &[ToolCall],
        cut: bool,
        call: CallRecord,
        mut events: Vec<Event>,
    ) -> Step {
        let Screened { mut results, mut to_run, loop_stop } = self.screen(turn, calls, cut, &mut events);
        // Calls that wait for someone do not run now: the others do, then the run pauses.
        let gate_of = |name: &str| self.input.gates.iter().find(|(n, _)| n == name).map(|g| g.1);
        let mut waits: Vec<PendingCall> = vec![];
        if !loop_stop {
            to_run.retain(|&i| match gate_of(&calls[i].name) {
                Some(gate) => {
                    waits.push(PendingCall { call: calls[i].clone(), gate });
                    false
                }
                None => true,
            });
        }
        if !to_run.is_empty() {
            let started: Vec<event::CallRef> = to_run
                .iter()
                .map(|&i| event::CallRef { tool_call_id: calls[i].id.clone(), name: calls[i].name.clone() })
                .collect();
            // The turn's events so far (its call's `llm_call_finished` first) go out now, in the
            // order they happened, ahead of the tools' own.
            let mut progress = std::mem::take(&mut events);
            progress.push(Event::ToolCallsStarted(event::ToolCallsStarted { turn, calls: started }));
            if self.store.events(&progress).await.is_err() {
                return Step::End(Outcome::Stopped(StopCause::LeaseLost).into());
            }
        }
        match self.run_tools(turn, calls, to_run, &mut events).await {
            Ok(ran) => ran.into_iter().for_each(|(i, out)| results[i] = Some(out)),
            Err(cause) => {
                // The provider billed this call: keep it in the ledger even though the turn will
                // not be checkpointed (outcome `interrupted`; a resumed attempt redoes the turn).
                let mut interrupted = call.clone();
                interrupted.outcome = CallOutcome::Interrupted;
                let _ = self.store.record_failed_call(&interrupted).await;
                return Step::End(Outcome::Stopped(cause).into());
            }
        }
        for (tc, out) in calls.iter().zip(results) {
            if waits.iter().any(|w| w.call.id == tc.id) {
                // Its result comes with the answer.
                continue;
            }
            let out = out.unwrap_or(ToolOutput { content: "tool not run".into(), is_error: true, detail: None });
            let m = Message::Tool {
                tool_call_id: tc.id.clone(),
                name: tc.name.clone(),
                content: out.content,
                is_error: out.is_error,
            };
            self.messages.push(m.clone());
            self.pending.push(m);
        }
        if !waits.is_empty() {
            let listed: Vec<event::WaitingCall> = waits
                .iter()
                .map(|w| event::WaitingCall {
                    tool_call_id: w.call.id.clone(),
                    name: w.call.name.clone(),
                    kind: w.gate,
                })
                .collect();
            events.push(Event::ToolCallsWaiting(event::ToolCallsWaiting { turn, calls: listed }));
            let cp = self.checkpoint(turn, call, events);
            return Step::End(RunEnd { outcome: Outcome::Paused(waits), last_turn: Some(cp) });
        }
        let cp = self.checkpoint(turn, call, events);
        let outcome = if loop_stop {
            let agent = &self.input.agent;
            Outcome::Incomplete {
                stop_reason: StopReason::LoopDetected,
                summary: self.last_text.clone().unwrap_or_else(|| {
                    format!(
                        "(sub-agent {agent} stopped after {turn} turns: it repeated the same tool call {LOOP_STOP_AT} times)"
                    )
                }),
            }
        } else if turn >= self.input.max_turns {
            max_turns_reached(self.input, self.last_text.clone(), turn)
        } else {
            return self.next(cp).await;
        };
        Step::End(RunEnd { outcome, last_turn: Some(cp) })
    }

    /// Which calls run: a call cut mid-arguments never does, nor one off the whitelist (it is
    /// answered as a tool error, invariant 2), nor a repeat past the loop limit.
    fn screen(&mut self, turn: u32, calls: &[ToolCall], cut: bool, events: &mut Vec<Event>) -> Screened {
        let input = self.input;
        let mut s = Screened { results: vec![None; calls.len()], to_run: vec![], loop_stop: false };
        for (i, tc) in calls.iter().enumerate() {
            let key = (tc.name.clone(), tc.arguments.to_string());
            if self.streak.0.as_ref() == Some(&key) {
                self.streak.1 += 1;
            } else {
                self.streak = (Some(key), 1);
            }
            let refusal = if cut && !tc.arguments.is_object() {
                events.push(Event::ToolCallCut(call_ref(turn, tc)));
                format!(
                    "Your call to `{}` was cut off at the output limit before its arguments were complete, \
                     and was not run. Call it again with shorter arguments, or give your final answer.",
                    tc.name
                )
            } else if !input.tools.iter().any(|t| t.name == tc.name) {
                let offered: Vec<&str> = input.tools.iter().map(|t| t.name.as_str()).collect();
                events.push(Event::ToolCallRefused(call_ref(turn, tc)));
                format!(
                    "Tool `{}` is not available to this {} sub-agent and was not run. Available tools: {}. \
                     Change strategy or give your final answer.",
                    tc.name,
                    input.agent,
                    if offered.is_empty() { "none".to_string() } else { offered.join(", ") }
                )
            } else if self.streak.1 >= LOOP_STOP_AT {
                s.loop_stop = true;
                "Loop detected: run stopped.".into()
            } else if self.streak.1 >= LOOP_WARN_AT {
                events.push(Event::LoopWarning(event::LoopWarning {
                    turn,
                    name: tc.name.clone(),
                    repeats: self.streak.1,
                }));
                format!(
                    "Warning: you have called `{}` with the same arguments {} times in a row; the result will \
                     not change. Try something different or give your final answer.",
                    tc.name, self.streak.1
                )
            } else {
                s.to_run.push(i);
                continue;
            };
            s.results[i] = Some(ToolOutput { content: refusal, is_error: true, detail: None });
        }
        s
    }

    /// Run the calls `to_run`, at most `tool_concurrency` at once, in the model's order; each
    /// one's `tool_call_finished` event. A stop ends them all.
    async fn run_tools(
        &self,
        turn: u32,
        calls: &[ToolCall],
        to_run: Vec<usize>,
        events: &mut Vec<Event>,
    ) -> Result<Vec<(usize, ToolOutput)>, StopCause> {
        let tools = self.tools;
        let runs: Vec<_> = to_run
            .into_iter()
            .map(|i| {
                let tc = &calls[i];
                async move {
                    let started = Instant::now();
                    let span = tool_span(&tc.name, &tc.id);
                    let out = tracing::Instrument::instrument(tools.run(tc), span.clone()).await;
                    span.record("is_error", out.is_error);
                    if out.is_error {
                        crate::telemetry::span_error(&span, "tool_error", &out.content);
                    }
                    (i, out, started.elapsed())
                }
            })
            .collect();
        let bounded = futures_util::StreamExt::collect::<Vec<_>>(futures_util::StreamExt::buffered(
            futures_util::stream::iter(runs),
            self.input.tool_concurrency.max(1),
        ));
        let ran = tokio::select! {
            r = bounded => r,
            cause = self.stop.stopped() => return Err(cause),
        };
        Ok(ran
            .into_iter()
            .map(|(i, out, took)| {
                let tc = &calls[i];
                let out = out.storable();
                let finished = event::ToolCallFinished {
                    turn,
                    tool_call_id: tc.id.clone(),
                    name: tc.name.clone(),
                    is_error: out.is_error,
                    duration_ms: took.as_millis() as u64,
                    detail: Default::default(),
                };
                events.push(Event::ToolCallFinished(finished.with_detail(out.detail.as_ref())));
                (i, out)
            })
            .collect())
    }
}

/// The model's answer as the store can always hold it: a NUL in its text or in a tool call's
/// id, name or arguments shown as U+FFFD (`kinds::text`), so that what a file or a page talked
/// it into writing cannot fail the turn's checkpoint.
fn storable_response(resp: &mut ChatResponse) {
    use crate::kinds::text;
    if let Some(t) = resp.text.as_mut() {
        text::storable(t);
    }
    for c in &mut resp.tool_calls {
        text::storable(&mut c.id);
        text::storable(&mut c.name);
        text::storable_value(&mut c.arguments);
    }
}

/// A tool call as `tool_call_cut` and `tool_call_refused` name it.
fn call_ref(turn: u32, tc: &ToolCall) -> event::ToolCallRef {
    event::ToolCallRef { turn, tool_call_id: tc.id.clone(), name: tc.name.clone() }
}
