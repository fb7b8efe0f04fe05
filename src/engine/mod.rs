//! The sub-agent itself: a tool-calling loop over a fresh conversation, a tool whitelist,
//! one summary back. Pure logic over traits: storage (`RunStore`), provider (`llm::Provider`)
//! and tools (`tools::ToolRunner`) are injected, so every invariant is unit-testable with
//! in-memory fakes.
//!
//! May import: `llm`, `tools` (their types and traits), `telemetry`, and the task's domain
//! kinds (`tasks::kinds`, a leaf). Never `http`, `jobs`, `store` or `sqlx`: a run's writes go
//! through `RunStore`, and its end is returned, not written — the caller commits the last turn
//! with the end (`jobs::finish`, through `tasks::end`).

pub mod agents;
pub mod claude_code;
pub mod definitions;
pub mod output;
pub mod spec;
mod turn;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use rust_decimal::Decimal;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::kinds::{event, Event, FailureCode};
pub use crate::kinds::{CallOutcome, Gate, StopReason};
use crate::llm::pricing::Price;
use crate::llm::retry::RetryPolicy;
use crate::llm::{ChatRequest, LlmError, Message, Progress, Provider, ToolCall, ToolSpec, Usage};
pub use crate::tools::{ToolOutput, ToolRunner};

/// Everything a run needs, decided before it starts.
#[derive(Debug, Clone)]
pub struct RunInput {
    pub provider_name: String,
    /// The model as the provider knows it.
    pub model: String,
    pub price: Option<Price>,
    /// The conversation already checkpointed by earlier attempts of this task.
    pub history: Vec<Message>,
    /// Messages that start this task, saved with its first checkpoint: `[system, user]` for
    /// a fresh run (see `fresh_conversation`), a parent's conversation plus the new user
    /// message for a resumed one, nothing for a rescued attempt.
    pub new_messages: Vec<Message>,
    /// Turns already completed (and checkpointed) by earlier attempts.
    pub turns_done: u32,
    pub max_turns: u32,
    /// The whitelist: the only tools offered and the only tools ever executed.
    pub tools: Arc<[ToolSpec]>,
    /// Tool calls of one turn run concurrently, at most this many at once (in the model's order).
    pub tool_concurrency: usize,
    pub max_tokens: Option<u32>,
    /// The task's W3C trace context; each provider call carries a child of it.
    pub traceparent: Option<String>,
    pub retry: RetryPolicy,
    /// Agent type name, for the whitelist refusal message.
    pub agent: String,
    /// The first call's reservation (`first_reservation`) is already written, with the task:
    /// the run does not reserve it again.
    pub first_reserved: bool,
    /// Read a whole answer that is a tool call written as text as that call (the provider's
    /// `text_tool_calls` switch).
    pub text_tool_calls: bool,
    /// The fewest output tokens a call can usefully have: when the budget cannot afford its
    /// `max_tokens`, it may go ahead with fewer, never fewer than this.
    pub output_floor: u32,
    /// Tools whose calls wait for someone: a decision (approval) or the caller's output. A turn
    /// that calls any of them runs the others, then pauses the run.
    pub gates: Vec<(String, Gate)>,
    /// The answers to the pause this run resumes from, applied before its next call.
    pub answers: Vec<Answer>,
    /// The JSON Schema the final answer must satisfy (`output_schema`).
    pub output_schema: Option<Value>,
    /// The models a call moves to, in order, when its own cannot serve it (`fallback_models`).
    pub fallbacks: Vec<Fallback>,
    /// Which failures move a call to the next model (`fallback_on`).
    pub fallback_on: FallbackOn,
}

/// Another model a run's calls may move to (invariant 5: named by the caller, the agent or
/// the tenant; every move an event and a ledger row).
#[derive(Clone)]
pub struct Fallback {
    pub provider: Arc<dyn Provider>,
    pub provider_name: String,
    pub model: String,
    pub price: Option<Price>,
    pub max_tokens: Option<u32>,
    pub text_tool_calls: bool,
    /// Why it cannot serve this run (its provider calls no tools, or gives no structured
    /// output, and the run needs it): skipped, with this reason.
    pub unfit: Option<String>,
}

impl std::fmt::Debug for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallback")
            .field("model", &format!("{}/{}", self.provider_name, self.model))
            .field("unfit", &self.unfit)
            .finish_non_exhaustive()
    }
}

/// Which failures move a call to the next model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallbackOn {
    /// The model cannot be served: retries ran out against the deadline, the provider is
    /// unreachable, 5xx or 529, or a 429 asks to wait longer than the run can.
    pub unavailable: bool,
    /// The prompt does not fit the model's context.
    pub context_length: bool,
}

impl Default for FallbackOn {
    fn default() -> Self {
        FallbackOn { unavailable: true, context_length: false }
    }
}

/// The model a call goes to: the run's own (`at` 0), or the fallback it moved to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub provider_name: &'a str,
    pub model: &'a str,
    pub price: Option<Price>,
    pub max_tokens: Option<u32>,
    pub text_tool_calls: bool,
}

impl Target<'_> {
    pub fn full(&self) -> String {
        format!("{}/{}", self.provider_name, self.model)
    }
}

impl RunInput {
    pub(crate) fn target(&self, at: usize) -> Target<'_> {
        match at.checked_sub(1).and_then(|i| self.fallbacks.get(i)) {
            None => Target {
                provider_name: &self.provider_name,
                model: &self.model,
                price: self.price,
                max_tokens: self.max_tokens,
                text_tool_calls: self.text_tool_calls,
            },
            Some(f) => Target {
                provider_name: &f.provider_name,
                model: &f.model,
                price: f.price,
                max_tokens: f.max_tokens,
                text_tool_calls: f.text_tool_calls,
            },
        }
    }

    /// The provider of model `at` (`primary` is the run's own).
    fn provider_at<'a>(&'a self, primary: &'a dyn Provider, at: usize) -> &'a dyn Provider {
        match at.checked_sub(1).and_then(|i| self.fallbacks.get(i)) {
            None => primary,
            Some(f) => f.provider.as_ref(),
        }
    }
}

/// A tool call a paused run waits on.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingCall {
    pub call: ToolCall,
    pub gate: Gate,
}

/// How a pending call was answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    Approved,
    Denied {
        message: Option<String>,
    },
    /// The caller's output, as the tool result.
    Output(String),
    /// No answer came in time.
    Expired(Gate),
}

/// An answered pending call, applied when the run resumes.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub call: ToolCall,
    pub resolution: Resolution,
}

/// One provider call attempt, as the ledger records it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// Unique per call attempt, so that storing it twice stores it once.
    pub key: uuid::Uuid,
    pub turn: u32,
    pub try_no: u32,
    pub provider: String,
    pub model: String,
    pub usage: Usage,
    pub cost_usd: Option<Decimal>,
    pub latency_ms: u32,
    pub http_status: Option<u16>,
    pub outcome: CallOutcome,
    pub error: Option<String>,
    /// What was reserved for this call before it was made.
    pub reserved_usd: Decimal,
    pub reserved_tokens: u64,
    /// `usage` is an estimate: the provider gave none (its answer never came, or it reported
    /// no usage).
    pub usage_estimated: bool,
}

/// One completed turn: committed together, or not at all.
#[derive(Debug, Clone)]
pub struct TurnCheckpoint {
    pub turn: u32,
    /// Messages added this turn (the first turn includes `[system, user]`).
    pub messages: Vec<Message>,
    pub call: CallRecord,
    pub events: Vec<Event>,
}

/// The worker lost the right to write (lease expired or taken over).
#[derive(Debug, Clone, thiserror::Error)]
#[error("lease lost")]
pub struct LeaseLost;

/// A provider call to reserve before it is made: its prompt (estimated generously) and the
/// output it asks for, and the fewest output tokens it can do with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ask {
    pub prompt_usd: Decimal,
    pub prompt_tokens: u64,
    /// The price of one output token.
    pub out_usd: Decimal,
    pub max_out: u32,
    pub floor: u32,
}

impl Ask {
    /// The whole call, with every output token it asks for.
    pub fn worst(&self) -> (Decimal, u64) {
        (self.prompt_usd + self.out_usd * Decimal::from(self.max_out), self.prompt_tokens + u64::from(self.max_out))
    }
}

/// What a reservation granted: the call's `max_tokens` (lowered when the budget affords no
/// more), and what is held until the call settles.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    pub max_tokens: u32,
    pub usd: Decimal,
    pub tokens: u64,
}

/// A call that fits what is settled, but not while other calls' reservations are held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetWait {
    /// The limit others' reservations fill.
    pub limit: String,
    /// Its smallest call, and the call it would make.
    pub need_usd: Decimal,
    pub need_tokens: u64,
    pub want_usd: Decimal,
    pub want_tokens: u64,
}

/// Why a budget reservation did not go through.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// Not even the smallest call fits under the named limit.
    Budget(String),
    /// Busy, not exhausted: wait for reservations to settle.
    Wait(BudgetWait),
    LeaseLost,
}

/// Where a run's streamed text goes as the model writes it (live output: never stored).
pub trait Live: Send + Sync {
    /// Text of turn `turn`'s call, try `attempt`.
    fn text(&self, turn: u32, attempt: u32, piece: &str);
}

/// One call attempt's text, to the run's `Live`.
struct AttemptText {
    live: Arc<dyn Live>,
    turn: u32,
    attempt: u32,
}

impl crate::llm::TextSink for AttemptText {
    fn text(&self, piece: &str) {
        self.live.text(self.turn, self.attempt, piece)
    }
}

#[async_trait::async_trait]
pub trait RunStore: Send + Sync {
    /// Where the run's streamed text goes, if anywhere.
    fn live(&self) -> Option<Arc<dyn Live>> {
        None
    }
    /// Reserve the next provider call against the budgets, and record its start (`started`:
    /// the `llm_call_started` event) in the same write.
    async fn reserve(&self, ask: &Ask, started: Event) -> Result<Grant, Refusal>;
    /// Append progress events (a turn's events so far, as its tools start), in order, outside
    /// a checkpoint.
    async fn events(&self, events: &[Event]) -> Result<(), LeaseLost>;
    /// Record a provider attempt that completes no turn (failed, or interrupted by a stop).
    async fn record_failed_call(&self, call: &CallRecord) -> Result<(), LeaseLost>;
    /// Commit a completed turn: messages, its call's usage and its events, atomically. (The
    /// run's last turn is not committed here: it is returned in `RunEnd`, to be committed with
    /// the run's end.)
    async fn checkpoint(&self, turn: &TurnCheckpoint) -> Result<(), LeaseLost>;
}

/// Why a run was told to stop from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopCause {
    Cancelled,
    LeaseLost,
    /// The process is draining: release the task for another worker.
    Drain,
    Timeout,
    /// A budget reservation was refused (the limit's name).
    Budget(String),
    /// A budget reservation must wait for others to settle: the task goes back to the queue.
    BudgetWait(BudgetWait),
}

/// A cancellation token that remembers the first reason it was fired for.
#[derive(Clone, Default)]
pub struct StopSignal {
    token: CancellationToken,
    cause: Arc<Mutex<Option<StopCause>>>,
}

impl StopSignal {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn stop(&self, cause: StopCause) {
        if let Ok(mut c) = self.cause.lock() {
            c.get_or_insert(cause);
        }
        self.token.cancel();
    }
    pub fn cause(&self) -> Option<StopCause> {
        self.cause.lock().ok().and_then(|c| c.clone())
    }
    pub async fn stopped(&self) -> StopCause {
        self.token.cancelled().await;
        self.cause().unwrap_or(StopCause::Cancelled)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The model gave its final answer (with an `output_schema`: `output` is its value).
    Completed {
        summary: String,
        output: Option<Value>,
    },
    /// The final answer never matched the `output_schema` within the turn budget.
    InvalidOutput {
        summary: String,
        errors: Vec<String>,
    },
    /// A limit stopped the run; the summary is partial or a fallback line.
    Incomplete {
        stop_reason: StopReason,
        summary: String,
    },
    Failed {
        code: FailureCode,
        message: String,
    },
    /// Stopped from outside before finishing.
    Stopped(StopCause),
    /// Some of the last turn's tool calls wait for a decision or the caller's output: the run
    /// pauses (its last turn, with the results of the calls that ran, is committed with it).
    Paused(Vec<PendingCall>),
}

/// How a run ended: its outcome, and its last turn when that turn is not committed yet — the
/// caller commits it together with the end, in one write.
#[derive(Debug, Clone)]
pub struct RunEnd {
    pub outcome: Outcome,
    pub last_turn: Option<TurnCheckpoint>,
}

impl From<Outcome> for RunEnd {
    fn from(outcome: Outcome) -> Self {
        RunEnd { outcome, last_turn: None }
    }
}

/// The first messages of a fresh sub-agent: its system prompt and its task, nothing else.
pub fn fresh_conversation(system_prompt: String, task: String) -> Vec<Message> {
    vec![Message::System { content: system_prompt }, Message::User { content: task }]
}

/// Run the sub-agent until a final answer, a limit, a failure or a stop signal. Every turn but
/// the last is checkpointed through `store`; the last is returned with the outcome.
pub async fn run(
    input: RunInput,
    provider: &dyn Provider,
    tools: &dyn ToolRunner,
    store: &dyn RunStore,
    stop: &StopSignal,
) -> RunEnd {
    let mut messages = input.history.clone();
    let mut pending: Vec<Message> = input.new_messages.clone();
    messages.extend(pending.iter().cloned());
    // A resumed pause: the answered calls' results complete the paused turn, in the model's
    // order (an approved call runs now, once; its idempotency key is the same if it repeats).
    let applied = match apply_answers(&input, tools, stop).await {
        Ok(m) => m,
        Err(cause) => return Outcome::Stopped(cause).into(),
    };
    messages.extend(applied.iter().cloned());
    pending.extend(applied);
    let mut turns = turn::Turns {
        input: &input,
        provider,
        tools,
        store,
        stop,
        messages,
        pending,
        last_text: None,
        check: input.output_schema.as_ref().and_then(output::OutputCheck::new),
        force_output: false,
        streak: (None, 0),
        at: 0,
    };
    let mut n = input.turns_done;
    while n < input.max_turns {
        n += 1;
        if let turn::Step::End(end) = turns.turn(n).await {
            return end;
        }
    }
    max_turns_reached(&input, turns.last_text, n).into()
}

/// The tool results of a resumed pause's answered calls, in the order of `input.answers`.
async fn apply_answers(input: &RunInput, tools: &dyn ToolRunner, stop: &StopSignal) -> Result<Vec<Message>, StopCause> {
    let mut out = vec![];
    for a in &input.answers {
        let name = &a.call.name;
        let result = match &a.resolution {
            Resolution::Approved => {
                let span = tool_span(name, &a.call.id);
                let out = tokio::select! {
                    r = tracing::Instrument::instrument(tools.run(&a.call), span.clone()) => r,
                    cause = stop.stopped() => return Err(cause),
                };
                span.record("is_error", out.is_error);
                if out.is_error {
                    crate::telemetry::span_error(&span, "tool_error", &out.content);
                }
                out
            }
            Resolution::Denied { message } => ToolOutput {
                content: match message.as_deref().map(str::trim).filter(|m| !m.is_empty()) {
                    Some(m) => format!("The call to `{name}` was denied and not run: {m}"),
                    None => format!("The call to `{name}` was denied and not run."),
                },
                is_error: true,
                detail: None,
            },
            Resolution::Output(text) => ToolOutput { content: text.clone(), is_error: false, detail: None },
            Resolution::Expired(Gate::Approval) => ToolOutput {
                content: format!("No decision came in time for the call to `{name}`: it was denied and not run."),
                is_error: true,
                detail: None,
            },
            Resolution::Expired(Gate::Output) => ToolOutput {
                content: format!("The output of `{name}` did not come in time: the tool gave no result."),
                is_error: true,
                detail: None,
            },
        };
        let result = result.storable();
        out.push(Message::Tool {
            tool_call_id: a.call.id.clone(),
            name: name.clone(),
            content: result.content,
            is_error: result.is_error,
        });
    }
    Ok(out)
}

/// A tool call's span (OpenTelemetry GenAI `execute_tool`): kind CLIENT, as every tool runs
/// outside, over HTTP or MCP.
fn tool_span(name: &str, call_id: &str) -> tracing::Span {
    tracing::info_span!(
        "tool_call",
        otel.name = %format!("execute_tool {name}"),
        otel.kind = "client",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %name,
        gen_ai.tool.call.id = %call_id,
        tool = %name,
        tool_call_id = %call_id,
        is_error = tracing::field::Empty,
    )
}

fn max_turns_reached(input: &RunInput, last_text: Option<String>, turn: u32) -> Outcome {
    Outcome::Incomplete {
        stop_reason: StopReason::MaxTurns,
        summary: last_text
            .unwrap_or_else(|| format!("(sub-agent {} stopped after {turn} turns without a summary)", input.agent)),
    }
}

/// What a call asks to reserve: its prompt (estimated generously, at 3 characters a token) and
/// every output token the provider is allowed to produce, at model `t`'s price.
fn ask(t: &Target, floor: u32, req: &ChatRequest) -> Ask {
    let worst = worst_case(req);
    let price = |u: Usage| t.price.map_or(Decimal::ZERO, |p| p.worst_cost(&u));
    let max_out = req.max_tokens.unwrap_or(0);
    // A provider-side search tool may search `SERVER_SEARCH_MAX_USES` times in the call.
    let searches = req.tools.iter().filter(|s| s.server == Some(crate::kinds::BuiltinTool::WebSearch)).count() as u64;
    let searches_usd = t.price.map_or(Decimal::ZERO, |p| {
        p.web_search * Decimal::from(searches * u64::from(crate::llm::SERVER_SEARCH_MAX_USES))
    });
    Ask {
        prompt_usd: price(Usage { input_tokens: worst.input_tokens, ..Usage::default() }) + searches_usd,
        prompt_tokens: worst.input_tokens,
        out_usd: price(Usage { output_tokens: 1, ..Usage::default() }),
        max_out,
        floor: floor.min(max_out),
    }
}

/// The smallest call that `messages` and `tools` make with `floor` output tokens, priced:
/// what a budget must still hold for a task to start (the same estimate a run reserves by).
pub fn smallest_call(messages: Vec<Message>, tools: Vec<ToolSpec>, price: Option<Price>, floor: u32) -> (Decimal, u64) {
    let req = ChatRequest { messages, tools: tools.into(), max_tokens: Some(floor), ..ChatRequest::default() };
    let u = worst_case(&req);
    (price.map_or(Decimal::ZERO, |p| p.worst_cost(&u)), u.input_tokens + u.output_tokens)
}

/// The most a call can use: its prompt at 3 characters a token, and every output token allowed.
fn worst_case(req: &ChatRequest) -> Usage {
    let prompt_chars: usize = req.messages.iter().map(Message::chars).sum::<usize>()
        + req.tools.iter().map(|t| t.name.len() + t.description.len() + json_len(&t.parameters)).sum::<usize>()
        + req.output_schema.as_ref().map_or(0, json_len);
    Usage {
        input_tokens: (prompt_chars as u64).div_ceil(3),
        output_tokens: u64::from(req.max_tokens.unwrap_or(0)),
        ..Usage::default()
    }
}

/// The length of `v` as JSON text, counted without writing it out.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// The `llm_call_started` event, written with the call's reservation.
fn started_event(t: &Target, req: &ChatRequest, a: &Ask, turn: u32, try_no: u32) -> Event {
    let (reserved_usd, reserved_tokens) = a.worst();
    Event::LlmCallStarted(event::LlmCallStarted {
        turn,
        try_no,
        model: t.full(),
        messages: req.messages.len(),
        tools: req.tools.len(),
        reserved_usd,
        reserved_tokens,
        prompt_tokens: a.prompt_tokens,
        max_tokens: a.max_out,
    })
}

/// The request of the run's next turn to model `t`, over the conversation so far.
fn request(input: &RunInput, t: &Target, messages: &[Message], force_output: bool) -> ChatRequest {
    ChatRequest {
        model: t.model.to_string(),
        messages: messages.to_vec(),
        tools: input.tools.clone(),
        max_tokens: t.max_tokens,
        traceparent: input.traceparent.as_deref().map(crate::telemetry::child),
        progress: Some(std::sync::Arc::new(Progress::default())),
        output_schema: input.output_schema.clone(),
        force_output,
    }
}

/// What `run` would reserve for its first call, whole (`Ask::worst`), and its
/// `llm_call_started` event, so that a caller may write that reservation ahead, with the task
/// (`RunInput::first_reserved` then tells the run).
pub fn first_reservation(input: &RunInput) -> (Ask, Event) {
    let messages: Vec<Message> = input.history.iter().chain(&input.new_messages).cloned().collect();
    let t = input.target(0);
    let req = request(input, &t, &messages, false);
    let a = ask(&t, input.output_floor, &req);
    (a, started_event(&t, &req, &a, input.turns_done + 1, 1))
}

/// One provider call of turn `turn`, with its retries: each try reserved against the budgets
/// first, recorded in the ledger when it fails or is stopped, and retried while the policy
/// allows; when the model cannot serve it, moved to the next fallback model (`at`, which the
/// run's later calls keep), the same request from the same checkpoint.
async fn call_with_retries(
    input: &RunInput,
    primary: &dyn Provider,
    at: &mut usize,
    store: &dyn RunStore,
    stop: &StopSignal,
    req: &mut ChatRequest,
    turn: u32,
) -> Result<(crate::llm::ChatResponse, CallRecord), Outcome> {
    let mut try_no = 0;
    'models: loop {
        let t = input.target(*at);
        let provider = input.provider_at(primary, *at);
        req.model = t.model.to_string();
        req.max_tokens = t.max_tokens;
        let first = Instant::now();
        let a = ask(&t, input.output_floor, req);
        let asked_max = req.max_tokens;
        loop {
            try_no += 1;
            let reserved = reserve(input, store, req, &t, &a, asked_max, (*at == 0, turn), try_no).await?;
            let started = Instant::now();
            let span = call_span(&t, provider, req, turn, try_no);
            // Each try starts from nothing; its text goes out as this try's.
            req.progress = Some(Arc::new(match store.live() {
                Some(live) => Progress::with_sink(Arc::new(AttemptText { live, turn, attempt: try_no })),
                None => Progress::default(),
            }));
            let result = tokio::select! {
                r = tracing::Instrument::instrument(provider.chat(req), span.clone()) => r,
                cause = stop.stopped() => {
                    let rec = interrupted(&t, req, turn, try_no, started, reserved, &cause);
                    let _ = store.record_failed_call(&rec).await;
                    return Err(Outcome::Stopped(cause));
                }
            };
            match &result {
                Ok(r) => {
                    span.record("gen_ai.usage.input_tokens", r.usage.input_tokens.min(i64::MAX as u64) as i64);
                    span.record("gen_ai.usage.output_tokens", r.usage.output_tokens.min(i64::MAX as u64) as i64);
                    span.record("gen_ai.response.model", r.model.as_deref().unwrap_or(t.model));
                    crate::telemetry::span_strings(&span, "gen_ai.response.finish_reasons", &[r.finish.as_str()]);
                }
                Err(e) => {
                    span.record("error", tracing::field::display(&e.message));
                    crate::telemetry::span_error(&span, e.code().as_str(), &e.message);
                }
            }
            let mut rec = record(&t, turn, try_no, started, reserved);
            let e = match result {
                Ok(resp) => {
                    rec.usage = resp.usage;
                    rec.usage_estimated = resp.usage_estimated;
                    rec.cost_usd = t.price.map(|p| p.cost(&resp.usage));
                    rec.http_status = resp.http_status;
                    return Ok((resp, rec));
                }
                // What a provider (or a proxy before it) said is kept on the ledger, in events
                // and as the task's error: made storable first, as a tool's result is.
                Err(mut e) => {
                    crate::kinds::text::storable(&mut e.message);
                    e
                }
            };
            rec.outcome = CallOutcome::Error;
            rec.http_status = e.http_status;
            rec.error = Some(e.message.clone());
            rec.cost_usd = t.price.map(|_| Decimal::ZERO);
            if store.record_failed_call(&rec).await.is_err() {
                return Err(Outcome::Stopped(StopCause::LeaseLost));
            }
            let delay = e
                .retryable()
                .then(|| input.retry.next_delay(try_no, first.elapsed(), e.retry_after, e.restarting()))
                .flatten();
            if let Some(d) = delay {
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    cause = stop.stopped() => return Err(Outcome::Stopped(cause)),
                }
                continue;
            }
            // This model cannot serve the call: the next one may.
            match fall_back(input, at, store, &e, turn).await {
                Ok(true) => continue 'models,
                Ok(false) => return Err(failed(&e, try_no)),
                Err(LeaseLost) => return Err(Outcome::Stopped(StopCause::LeaseLost)),
            }
        }
    }
}

/// Why error `e` may move a call to the next model, if it may: `unavailable` (it cannot be
/// served now) or `context_length`. A client error (400, 401, 404…) or a body the service
/// cannot read never does: another model would be asked the same wrong thing.
pub fn fallback_reason(e: &LlmError) -> Option<&'static str> {
    use crate::llm::LlmErrorKind as K;
    match e.kind {
        K::Connection | K::Timeout | K::RateLimited | K::Overloaded | K::Server => Some("unavailable"),
        K::ContextExceeded => Some("context_length"),
        K::Client | K::Protocol => None,
    }
}

/// Move the run to its next fallback model that can serve it, after model `at` failed with `e`
/// (when `fallback_on` allows it): a `model_fallback` event names both models and the reason; a
/// model that cannot serve the run is skipped, with a `model_fallback_skipped` event. False when
/// there is none.
async fn fall_back(
    input: &RunInput,
    at: &mut usize,
    store: &dyn RunStore,
    e: &LlmError,
    turn: u32,
) -> Result<bool, LeaseLost> {
    let Some(reason) = fallback_reason(e) else { return Ok(false) };
    let allowed = match reason {
        "context_length" => input.fallback_on.context_length,
        _ => input.fallback_on.unavailable,
    };
    if !allowed {
        return Ok(false);
    }
    let from = input.target(*at).full();
    while *at < input.fallbacks.len() {
        *at += 1;
        let next = input.target(*at).full();
        if let Some(why) = input.fallbacks[*at - 1].unfit.clone() {
            let skipped = event::ModelFallbackSkipped { turn, model: next, reason: why };
            store.events(&[Event::ModelFallbackSkipped(skipped)]).await?;
            continue;
        }
        metrics::counter!("subagentd_model_fallbacks_total", "from" => from.clone(), "to" => next.clone(),
                          "reason" => reason)
        .increment(1);
        let event = event::ModelFallback {
            turn,
            from,
            to: next,
            reason: reason.to_string(),
            error: e.message.clone(),
            http_status: e.http_status,
        };
        store.events(&[Event::ModelFallback(event)]).await?;
        return Ok(true);
    }
    Ok(false)
}

/// Reserve try `try_no` of the call against the budgets (its `llm_call_started` event with it),
/// lowering its `max_tokens` to what the budget affords: what is held until it settles. The
/// run's first call may have been reserved with the task, whole (`first_reservation`).
#[allow(clippy::too_many_arguments)] // the call's place: which model, which turn, which try
async fn reserve(
    input: &RunInput,
    store: &dyn RunStore,
    req: &mut ChatRequest,
    t: &Target<'_>,
    a: &Ask,
    asked_max: Option<u32>,
    (own_model, turn): (bool, u32),
    try_no: u32,
) -> Result<(Decimal, u64), Outcome> {
    if input.first_reserved && own_model && turn == input.turns_done + 1 && try_no == 1 {
        return Ok(a.worst());
    }
    let started = started_event(t, req, a, turn, try_no);
    match store.reserve(a, started).await {
        Ok(g) => {
            // The budget may afford fewer output tokens than asked: the call asks for those.
            req.max_tokens = asked_max.map(|_| g.max_tokens);
            Ok((g.usd, g.tokens))
        }
        Err(Refusal::LeaseLost) => Err(Outcome::Stopped(StopCause::LeaseLost)),
        Err(Refusal::Budget(limit)) => Err(Outcome::Stopped(StopCause::Budget(limit))),
        Err(Refusal::Wait(w)) => Err(Outcome::Stopped(StopCause::BudgetWait(w))),
    }
}

/// A call's span: OpenTelemetry GenAI semantic conventions, as span fields (numbers as i64:
/// tracing's unsigned fields reach OpenTelemetry as strings).
fn call_span(t: &Target, provider: &dyn Provider, req: &ChatRequest, turn: u32, try_no: u32) -> tracing::Span {
    tracing::info_span!(
        "llm_call",
        otel.name = %format!("chat {}", t.model),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = %provider.system(),
        gen_ai.system = %t.provider_name,
        gen_ai.request.model = %t.model,
        gen_ai.request.max_tokens = i64::from(req.max_tokens.unwrap_or(0)),
        turn = i64::from(turn),
        try_no = i64::from(try_no),
        gen_ai.response.model = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        error = tracing::field::Empty,
    )
}

/// A call's ledger row, before its answer is known (`ok`, no usage).
fn record(t: &Target, turn: u32, try_no: u32, started: Instant, reserved: (Decimal, u64)) -> CallRecord {
    CallRecord {
        key: uuid::Uuid::now_v7(),
        turn,
        try_no,
        provider: t.provider_name.to_string(),
        model: t.model.to_string(),
        usage: Usage::default(),
        cost_usd: None,
        latency_ms: started.elapsed().as_millis().min(u32::MAX as u128) as u32,
        http_status: None,
        outcome: CallOutcome::Ok,
        error: None,
        reserved_usd: reserved.0,
        reserved_tokens: reserved.1,
        usage_estimated: false,
    }
}

/// A call stopped while the provider was answering. It was sent, and a provider may bill what
/// it did before the connection was dropped: recorded, its usage estimated — the prompt as
/// sent, and the output streamed so far, else the reserved bound.
fn interrupted(
    t: &Target,
    req: &ChatRequest,
    turn: u32,
    try_no: u32,
    started: Instant,
    reserved: (Decimal, u64),
    cause: &StopCause,
) -> CallRecord {
    let mut usage = worst_case(req);
    if let Some(chars) = req.progress.as_ref().map(|p| p.output_chars()).filter(|c| *c > 0) {
        usage.output_tokens = chars.div_ceil(4).min(usage.output_tokens.max(1));
    }
    CallRecord {
        usage,
        cost_usd: t.price.map(|p| p.cost(&usage)),
        outcome: CallOutcome::Interrupted,
        error: Some(format!("stopped while the provider was answering ({cause:?})")),
        usage_estimated: true,
        ..record(t, turn, try_no, started, reserved)
    }
}

fn failed(e: &LlmError, tries: u32) -> Outcome {
    let status = e.http_status.map(|s| format!(" (HTTP {s})")).unwrap_or_default();
    Outcome::Failed {
        code: e.code(),
        message: format!("provider call failed after {tries} attempt(s){status}: {}", e.message),
    }
}

#[cfg(test)]
mod tests;
