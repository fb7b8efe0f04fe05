//! The engine's invariants with in-memory fakes (the intent of seed 003's tests).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use super::*;
use crate::llm::{ChatResponse, LlmErrorKind, ToolCall};
use serde_json::json;

/// A provider that answers from a queue and records every request.
#[derive(Default)]
struct Scripted {
    answers: Mutex<VecDeque<Result<ChatResponse, LlmError>>>,
    seen: Mutex<Vec<ChatRequest>>,
    delay: Option<Duration>,
}

impl Scripted {
    fn new(answers: Vec<Result<ChatResponse, LlmError>>) -> Self {
        Scripted { answers: Mutex::new(answers.into()), ..Default::default() }
    }
    fn requests(&self) -> Vec<ChatRequest> {
        self.seen.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Provider for Scripted {
    fn name(&self) -> &str {
        "fake"
    }
    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        self.seen.lock().unwrap().push(req.clone());
        if let Some(d) = self.delay {
            tokio::time::sleep(d).await;
        }
        self.answers.lock().unwrap().pop_front().unwrap_or_else(|| Ok(text("default")))
    }
}

fn usage(i: u64, o: u64) -> Usage {
    Usage { input_tokens: i, output_tokens: o, ..Usage::default() }
}
fn text(t: &str) -> ChatResponse {
    ChatResponse { text: Some(t.into()), usage: usage(10, 5), http_status: Some(200), ..ChatResponse::default() }
}
fn calls(names: &[(&str, Value)]) -> ChatResponse {
    ChatResponse {
        text: None,
        tool_calls: names
            .iter()
            .enumerate()
            .map(|(i, (n, a))| ToolCall { id: format!("c{i}"), name: n.to_string(), arguments: a.clone() })
            .collect(),
        usage: usage(20, 3),
        http_status: Some(200),
        finish: crate::llm::FinishReason::ToolCalls,
        usage_estimated: false,
        model: None,
    }
}

#[derive(Default)]
struct Store {
    checkpoints: Mutex<Vec<TurnCheckpoint>>,
    failed: Mutex<Vec<CallRecord>>,
    lose_lease_at_turn: Option<u32>,
    /// `None`: unlimited.
    budget_left: Mutex<Option<Decimal>>,
    events: Mutex<Vec<&'static str>>,
}

#[async_trait::async_trait]
impl RunStore for Store {
    async fn events(&self, events: &[Event]) -> Result<(), LeaseLost> {
        self.events.lock().unwrap().extend(events.iter().map(|e| e.kind().as_str()));
        Ok(())
    }
    async fn reserve(&self, ask: &Ask, _started: Event) -> Result<Grant, Refusal> {
        self.events.lock().unwrap().push("llm_call_started");
        let (usd, tokens) = ask.worst();
        let mut left = self.budget_left.lock().unwrap();
        match left.as_mut() {
            Some(l) if *l < usd => Err(Refusal::Budget("max_cost_usd".into())),
            Some(l) => {
                *l -= usd;
                Ok(Grant { max_tokens: ask.max_out, usd, tokens })
            }
            None => Ok(Grant { max_tokens: ask.max_out, usd, tokens }),
        }
    }
    async fn record_failed_call(&self, call: &CallRecord) -> Result<(), LeaseLost> {
        self.failed.lock().unwrap().push(call.clone());
        Ok(())
    }
    async fn checkpoint(&self, turn: &TurnCheckpoint) -> Result<(), LeaseLost> {
        if self.lose_lease_at_turn == Some(turn.turn) {
            return Err(LeaseLost);
        }
        self.checkpoints.lock().unwrap().push(turn.clone());
        Ok(())
    }
}

#[derive(Default)]
struct Tools {
    ran: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl ToolRunner for Tools {
    async fn run(&self, call: &ToolCall) -> ToolOutput {
        self.ran.lock().unwrap().push(call.name.clone());
        ToolOutput { content: format!("result of {}", call.name), is_error: false, detail: None }
    }
}

fn spec(name: &str) -> ToolSpec {
    ToolSpec { name: name.into(), description: "d".into(), parameters: json!({"type": "object"}).into(), server: None }
}

fn input() -> RunInput {
    RunInput {
        provider_name: "fake".into(),
        model: "m1".into(),
        price: Some(Price {
            input_per_m: 1.into(),
            output_per_m: 2.into(),
            cached_per_m: 0.into(),
            cache_write_per_m: 0.into(),
            web_search: 0.into(),
        }),
        history: vec![],
        new_messages: fresh_conversation("SYS".into(), "do the task".into()),
        turns_done: 0,
        max_turns: 5,
        tools: vec![spec("list_things"), spec("get_thing")].into(),
        tool_concurrency: 4,
        max_tokens: None,
        traceparent: None,
        retry: RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(1),
            cap: Duration::from_millis(2),
            deadline: Duration::from_secs(5),
        },
        agent: "research".into(),
        first_reserved: false,
        text_tool_calls: false,
        output_floor: 0,
        gates: vec![],
        answers: vec![],
        output_schema: None,
        fallbacks: vec![],
        fallback_on: FallbackOn::default(),
    }
}

/// `run`, with its last turn committed the way the worker commits it (with the run's end).
async fn run_to_end(inp: RunInput, p: &Scripted, t: &Tools, s: &Store, stop: &StopSignal) -> Outcome {
    let end = run(inp, p, t, s, stop).await;
    if let Some(cp) = end.last_turn {
        if s.checkpoint(&cp).await.is_err() {
            return Outcome::Stopped(StopCause::LeaseLost);
        }
    }
    end.outcome
}

async fn go(p: &Scripted, inp: RunInput) -> (Outcome, Store, Tools) {
    let (s, t) = (Store::default(), Tools::default());
    let o = run_to_end(inp, p, &t, &s, &StopSignal::new()).await;
    (o, s, t)
}

#[tokio::test]
async fn first_call_sees_exactly_system_then_user() {
    let p = Scripted::new(vec![Ok(text("ok"))]);
    let (o, _, _) = go(&p, input()).await;
    assert_eq!(o, Outcome::Completed { summary: "ok".into(), output: None });
    let first = &p.requests()[0];
    assert_eq!(
        first.messages,
        vec![Message::System { content: "SYS".into() }, Message::User { content: "do the task".into() }]
    );
}

#[tokio::test]
async fn only_whitelisted_tools_are_offered() {
    let p = Scripted::new(vec![Ok(text("ok"))]);
    go(&p, input()).await;
    let names: Vec<String> = p.requests()[0].tools.iter().map(|t| t.name.clone()).collect();
    assert_eq!(names, ["list_things", "get_thing"]);
}

#[tokio::test]
async fn a_call_to_an_unoffered_tool_is_answered_as_an_error_and_never_run() {
    let p = Scripted::new(vec![Ok(calls(&[("delete_thing", json!({"id": 1}))])), Ok(text("gave up"))]);
    let (o, store, tools) = go(&p, input()).await;
    assert_eq!(o, Outcome::Completed { summary: "gave up".into(), output: None });
    assert!(tools.ran.lock().unwrap().is_empty());
    let second = &p.requests()[1];
    match second.messages.last().unwrap() {
        Message::Tool { content, is_error, name, .. } => {
            assert!(is_error);
            assert_eq!(name, "delete_thing");
            assert!(content.contains("not available"), "{content}");
            assert!(content.contains("list_things, get_thing"), "{content}");
        }
        m => panic!("expected a tool result, got {m:?}"),
    }
    assert_eq!(
        store.checkpoints.lock().unwrap()[0].events.iter().filter(|e| e.kind().as_str() == "tool_call_refused").count(),
        1
    );
}

#[tokio::test]
async fn tool_call_then_result_then_summary() {
    let p = Scripted::new(vec![Ok(calls(&[("get_thing", json!({"id": 7}))])), Ok(text("thing 7 is blue"))]);
    let (o, store, tools) = go(&p, input()).await;
    assert_eq!(o, Outcome::Completed { summary: "thing 7 is blue".into(), output: None });
    assert_eq!(*tools.ran.lock().unwrap(), ["get_thing"]);
    // Events in the order they happened: the call's end before its tools' start.
    assert_eq!(
        *store.events.lock().unwrap(),
        ["llm_call_started", "llm_call_finished", "tool_calls_started", "llm_call_started"]
    );
    let cps = store.checkpoints.lock().unwrap();
    assert_eq!(cps.len(), 2);
    // Turn 1 checkpoints system, user, assistant(tool call), tool result; turn 2 the answer.
    assert_eq!(cps[0].messages.len(), 4);
    assert_eq!(cps[1].messages.len(), 1);
    match &p.requests()[1].messages[3] {
        Message::Tool { content, tool_call_id, .. } => {
            assert_eq!(content, "result of get_thing");
            assert_eq!(tool_call_id, "c0");
        }
        m => panic!("{m:?}"),
    }
}

#[tokio::test]
async fn usage_and_cost_roll_up_per_call() {
    let p = Scripted::new(vec![Ok(calls(&[("get_thing", json!({}))])), Ok(text("done"))]);
    let (_, store, _) = go(&p, input()).await;
    let cps = store.checkpoints.lock().unwrap();
    let mut total = Usage::default();
    let mut cost = Decimal::ZERO;
    for c in cps.iter() {
        total += c.call.usage;
        cost += c.call.cost_usd.unwrap();
    }
    assert_eq!(total, usage(30, 8));
    // 30 input at $1/M + 8 output at $2/M.
    assert_eq!(cost, Decimal::new(46, 6));
}

#[tokio::test]
async fn max_turns_without_text_gives_the_fallback_summary() {
    let answers = (0..3).map(|i| Ok(calls(&[("get_thing", json!({"i": i}))]))).collect();
    let p = Scripted::new(answers);
    let (o, _, _) = go(&p, RunInput { max_turns: 3, ..input() }).await;
    assert_eq!(
        o,
        Outcome::Incomplete {
            stop_reason: StopReason::MaxTurns,
            summary: "(sub-agent research stopped after 3 turns without a summary)".into()
        }
    );
    assert_eq!(p.requests().len(), 3);
}

#[tokio::test]
async fn the_same_call_three_times_is_warned_and_five_times_stops_the_run() {
    let answers = (0..6).map(|_| Ok(calls(&[("list_things", json!({"q": "x"}))]))).collect();
    let p = Scripted::new(answers);
    let (o, _, tools) = go(&p, RunInput { max_turns: 10, ..input() }).await;
    assert!(matches!(o, Outcome::Incomplete { stop_reason: StopReason::LoopDetected, .. }), "{o:?}");
    // Runs 1 and 2 execute; 3 and 4 get a warning instead; 5 stops.
    assert_eq!(tools.ran.lock().unwrap().len(), 2);
    assert_eq!(p.requests().len(), 5);
    let fourth = p.requests()[3].clone();
    match fourth.messages.last().unwrap() {
        Message::Tool { content, .. } => assert!(content.starts_with("Warning"), "{content}"),
        m => panic!("{m:?}"),
    }
}

#[tokio::test]
async fn retryable_errors_are_retried_and_every_attempt_recorded() {
    let p = Scripted::new(vec![
        Err(LlmError::from_status(429, "slow down", Some(Duration::from_millis(1)))),
        Err(LlmError::from_status(529, "overloaded", None)),
        Ok(text("fine")),
    ]);
    let (o, store, _) = go(&p, input()).await;
    assert_eq!(o, Outcome::Completed { summary: "fine".into(), output: None });
    let failed = store.failed.lock().unwrap();
    assert_eq!(failed.iter().map(|c| (c.try_no, c.http_status)).collect::<Vec<_>>(), [(1, Some(429)), (2, Some(529))]);
    assert_eq!(store.checkpoints.lock().unwrap()[0].call.try_no, 3);
}

#[tokio::test]
async fn client_errors_fail_fast_with_the_providers_message() {
    let p = Scripted::new(vec![Err(LlmError::from_status(401, "invalid x-api-key", None))]);
    let (o, store, _) = go(&p, input()).await;
    match o {
        Outcome::Failed { code, message } => {
            assert_eq!(code, "provider_rejected");
            assert!(message.contains("invalid x-api-key") && message.contains("HTTP 401"), "{message}");
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(store.failed.lock().unwrap().len(), 1);
    assert_eq!(p.requests().len(), 1);
}

#[tokio::test]
async fn protocol_errors_are_not_retried() {
    let p = Scripted::new(vec![Err(LlmError::new(LlmErrorKind::Protocol, "truncated JSON"))]);
    let (o, _, _) = go(&p, input()).await;
    assert!(matches!(o, Outcome::Failed { ref code, .. } if code == "provider_protocol"), "{o:?}");
}

#[tokio::test]
async fn a_stop_signal_interrupts_a_provider_call() {
    let p = Scripted { delay: Some(Duration::from_secs(30)), ..Scripted::new(vec![Ok(text("late"))]) };
    let (s, t, stop) = (Store::default(), Tools::default(), StopSignal::new());
    let stopper = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        stopper.stop(StopCause::Cancelled);
    });
    let o = tokio::time::timeout(Duration::from_secs(5), run_to_end(input(), &p, &t, &s, &stop)).await.unwrap();
    assert_eq!(o, Outcome::Stopped(StopCause::Cancelled));
    assert!(s.checkpoints.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_lost_lease_stops_the_run_at_its_next_write() {
    let p = Scripted::new(vec![Ok(calls(&[("get_thing", json!({}))])), Ok(text("x"))]);
    let (s, t) = (Store { lose_lease_at_turn: Some(1), ..Default::default() }, Tools::default());
    let o = run_to_end(input(), &p, &t, &s, &StopSignal::new()).await;
    assert_eq!(o, Outcome::Stopped(StopCause::LeaseLost));
    assert_eq!(p.requests().len(), 1);
}

#[tokio::test]
async fn a_resumed_run_continues_the_saved_conversation_without_repeating_turns() {
    let history = vec![
        Message::System { content: "SYS".into() },
        Message::User { content: "do the task".into() },
        Message::Assistant { content: None, tool_calls: vec![] },
    ];
    let p = Scripted::new(vec![Ok(text("resumed"))]);
    let (o, store, _) =
        go(&p, RunInput { history: history.clone(), new_messages: vec![], turns_done: 1, ..input() }).await;
    assert_eq!(o, Outcome::Completed { summary: "resumed".into(), output: None });
    assert_eq!(p.requests()[0].messages, history);
    let cps = store.checkpoints.lock().unwrap();
    assert_eq!(cps[0].turn, 2);
    assert_eq!(cps[0].messages.len(), 1);
}

#[tokio::test]
async fn a_refused_reservation_ends_the_run_incomplete_with_budget_and_the_partial_summary() {
    let answers = vec![
        Ok(ChatResponse { text: Some("halfway there".into()), ..calls(&[("get_thing", json!({"a": 1}))]) }),
        Ok(text("never reached")),
    ];
    let p = Scripted::new(answers);
    // Enough for the first call's worst case, not the second's.
    let inp = RunInput { max_tokens: Some(1000), ..input() };
    let s = Store { budget_left: Mutex::new(Some(Decimal::new(25, 4))), ..Default::default() };
    let o = run_to_end(inp, &p, &Tools::default(), &s, &StopSignal::new()).await;
    assert_eq!(o, Outcome::Incomplete { stop_reason: StopReason::Budget, summary: "halfway there".into() });
    assert_eq!(p.requests().len(), 1);
    let cp = s.checkpoints.lock().unwrap();
    assert!(cp[0].call.reserved_usd > Decimal::ZERO);
    assert_eq!(cp[0].call.reserved_tokens, 1000 + (cp[0].call.reserved_tokens - 1000));
}

#[tokio::test]
async fn a_gated_call_pauses_the_run_after_the_others_ran_and_its_answer_completes_the_turn() {
    let p =
        Scripted::new(vec![Ok(calls(&[("get_thing", json!({"a": 1})), ("list_things", json!({}))])), Ok(text("done"))]);
    let inp = RunInput { gates: vec![("get_thing".into(), Gate::Approval)], ..input() };
    let (s, t) = (Store::default(), Tools::default());
    let end = run(inp.clone(), &p, &t, &s, &StopSignal::new()).await;
    let Outcome::Paused(waits) = &end.outcome else { panic!("{:?}", end.outcome) };
    assert_eq!((waits.len(), waits[0].call.name.as_str(), waits[0].gate), (1, "get_thing", Gate::Approval));
    assert_eq!(*t.ran.lock().unwrap(), ["list_things"], "the ungated call ran, the gated one did not");
    let cp = end.last_turn.expect("the paused turn is returned to be committed with the pause");
    let results: Vec<&str> = cp
        .messages
        .iter()
        .filter_map(|m| if let Message::Tool { name, .. } = m { Some(name.as_str()) } else { None })
        .collect();
    assert_eq!(results, ["list_things"]);
    // Resumed with its approval: it runs once, and the turn's results reach the model.
    let history = [inp.new_messages.clone(), cp.messages.clone()].concat();
    let answers = vec![Answer { call: waits[0].call.clone(), resolution: Resolution::Approved }];
    let resumed = RunInput { history, new_messages: vec![], turns_done: 1, answers, ..inp };
    let o = run_to_end(resumed, &p, &t, &s, &StopSignal::new()).await;
    assert_eq!(o, Outcome::Completed { summary: "done".into(), output: None });
    assert_eq!(*t.ran.lock().unwrap(), ["list_things", "get_thing"]);
    let last = p.requests().last().unwrap().messages.clone();
    let ids: Vec<&str> = last
        .iter()
        .filter_map(|m| if let Message::Tool { tool_call_id, .. } = m { Some(tool_call_id.as_str()) } else { None })
        .collect();
    assert_eq!(ids, ["c1", "c0"], "both calls answered before the next call");
}

#[tokio::test]
async fn a_denied_call_reaches_the_model_as_an_error_with_the_message() {
    let call = ToolCall { id: "c9".into(), name: "get_thing".into(), arguments: json!({}) };
    let answers = vec![Answer { call, resolution: Resolution::Denied { message: Some("not on prod".into()) } }];
    let p = Scripted::new(vec![Ok(text("ok"))]);
    let (o, _, t) = go(&p, RunInput { answers, ..input() }).await;
    assert_eq!(o, Outcome::Completed { summary: "ok".into(), output: None });
    assert!(t.ran.lock().unwrap().is_empty());
    let sent = &p.requests()[0].messages;
    let Some(Message::Tool { content, is_error, .. }) = sent.last() else { panic!("{sent:?}") };
    assert!(*is_error && content.contains("denied") && content.contains("not on prod"), "{content}");
}

fn schema() -> Value {
    json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
}

#[tokio::test]
async fn a_wrong_structured_answer_is_repaired_within_the_turns_and_the_next_call_must_answer() {
    let p = Scripted::new(vec![Ok(text(r#"{"n": "seven"}"#)), Ok(text(r#"{"n": 7}"#))]);
    let (t, s, stop) = (Tools::default(), Store::default(), StopSignal::new());
    let inp = RunInput { output_schema: Some(schema()), ..input() };
    let o = run_to_end(inp, &p, &t, &s, &stop).await;
    assert_eq!(o, Outcome::Completed { summary: r#"{"n": 7}"#.into(), output: Some(json!({"n": 7})) });
    let reqs = p.requests();
    assert_eq!(reqs.len(), 2);
    assert!(reqs.iter().all(|r| r.output_schema == Some(schema())), "every call carries the schema");
    assert!(!reqs[0].force_output && reqs[1].force_output, "only the repair call must answer");
    let Message::User { content } = reqs[1].messages.last().unwrap() else { panic!("a repair message") };
    assert!(content.contains("/n: ") && content.contains("does not match"), "{content}");
}

#[tokio::test]
async fn no_matching_answer_within_the_turns_ends_invalid_output_with_the_errors() {
    let p = Scripted::new(vec![Ok(text("not json")), Ok(text(r#"{"m": 1}"#))]);
    let (t, s, stop) = (Tools::default(), Store::default(), StopSignal::new());
    let inp = RunInput { output_schema: Some(schema()), max_turns: 2, ..input() };
    let o = run_to_end(inp, &p, &t, &s, &stop).await;
    let Outcome::InvalidOutput { summary, errors } = o else { panic!("{o:?}") };
    assert_eq!(summary, r#"{"m": 1}"#, "the last answer is kept as the summary");
    assert!(errors[0].contains("\"n\" is a required property"), "{errors:?}");
}

fn fallback(p: &Arc<Scripted>, model: &str, unfit: Option<&str>) -> Fallback {
    Fallback {
        provider: p.clone(),
        provider_name: "backup".into(),
        model: model.into(),
        price: Some(Price {
            input_per_m: 10.into(),
            output_per_m: 20.into(),
            cached_per_m: 0.into(),
            cache_write_per_m: 0.into(),
            web_search: 0.into(),
        }),
        max_tokens: Some(64),
        text_tool_calls: false,
        unfit: unfit.map(str::to_string),
    }
}

fn unavailable() -> LlmError {
    LlmError::from_status(529, "overloaded", None)
}

#[tokio::test]
async fn a_call_its_model_cannot_serve_moves_to_the_next_fallback_with_an_event_and_a_ledger_row_each() {
    // The primary answers 503 to every try (3 tries, the policy's), the backup answers.
    let primary = Scripted::new(vec![Err(unavailable()), Err(unavailable()), Err(unavailable())]);
    let backup = Arc::new(Scripted::new(vec![Ok(text("from the backup"))]));
    let inp = RunInput { fallbacks: vec![fallback(&backup, "b1", None)], ..input() };
    let (o, store, _) = go(&primary, inp).await;
    assert_eq!(o, Outcome::Completed { summary: "from the backup".into(), output: None });
    // Each failed try is a ledger row of its own model; the answer, the backup's.
    let failed = store.failed.lock().unwrap();
    assert_eq!(
        failed.iter().map(|c| (c.model.as_str(), c.try_no)).collect::<Vec<_>>(),
        [("m1", 1), ("m1", 2), ("m1", 3)]
    );
    let cp = store.checkpoints.lock().unwrap();
    let last = &cp.last().unwrap().call;
    assert_eq!((last.provider.as_str(), last.model.as_str(), last.try_no), ("backup", "b1", 4));
    // At the backup's price, and asking what the backup allows.
    assert_eq!(last.cost_usd, Some(Decimal::new(2, 4)), "10 in and 5 out at 10 and 20 per million");
    assert_eq!(backup.requests()[0].model, "b1");
    assert_eq!(backup.requests()[0].max_tokens, Some(64));
    assert!(store.events.lock().unwrap().contains(&"model_fallback"));
    // From the same checkpoint: the backup sees the conversation the primary was asked.
    assert_eq!(backup.requests()[0].messages, primary.requests()[0].messages);
}

#[tokio::test]
async fn a_client_error_never_falls_back_and_a_context_overflow_only_when_asked() {
    let bad = || LlmError::from_status(400, "bad request", None);
    let backup = Arc::new(Scripted::new(vec![Ok(text("never"))]));
    let primary = Scripted::new(vec![Err(bad())]);
    let (o, store, _) = go(&primary, RunInput { fallbacks: vec![fallback(&backup, "b1", None)], ..input() }).await;
    assert!(matches!(o, Outcome::Failed { ref code, .. } if code == "provider_rejected"), "{o:?}");
    assert!(backup.requests().is_empty());
    assert!(!store.events.lock().unwrap().contains(&"model_fallback"));
    let overflow = || LlmError::new(LlmErrorKind::ContextExceeded, "too long");
    let primary = Scripted::new(vec![Err(overflow())]);
    let (o, _, _) = go(&primary, RunInput { fallbacks: vec![fallback(&backup, "b1", None)], ..input() }).await;
    assert!(matches!(o, Outcome::Failed { ref code, .. } if code == "context_exceeded"), "{o:?}");
    assert!(backup.requests().is_empty(), "context_length is not in the default fallback_on");
    let primary = Scripted::new(vec![Err(overflow())]);
    let inp = RunInput {
        fallbacks: vec![fallback(&backup, "b1", None)],
        fallback_on: FallbackOn { unavailable: true, context_length: true },
        ..input()
    };
    let (o, _, _) = go(&primary, inp).await;
    assert_eq!(o, Outcome::Completed { summary: "never".into(), output: None });
}

#[tokio::test]
async fn a_fallback_that_cannot_serve_the_run_is_skipped_with_its_reason() {
    let unfit = Arc::new(Scripted::new(vec![Ok(text("unfit"))]));
    let fit = Arc::new(Scripted::new(vec![Ok(text("fit"))]));
    let primary = Scripted::new(vec![Err(unavailable()), Err(unavailable()), Err(unavailable())]);
    let inp = RunInput {
        fallbacks: vec![
            fallback(&unfit, "no-tools", Some("its provider cannot call tools")),
            fallback(&fit, "b2", None),
        ],
        ..input()
    };
    let (o, store, _) = go(&primary, inp).await;
    assert_eq!(o, Outcome::Completed { summary: "fit".into(), output: None });
    assert!(unfit.requests().is_empty());
    let events = store.events.lock().unwrap();
    let skipped = events.iter().position(|e| *e == "model_fallback_skipped").unwrap();
    let moved = events.iter().position(|e| *e == "model_fallback").unwrap();
    assert!(skipped < moved);
}

#[tokio::test]
async fn a_fallback_the_budget_cannot_afford_ends_the_run_with_budget() {
    let backup = Arc::new(Scripted::new(vec![Ok(text("dear"))]));
    let primary = Scripted::new(vec![Err(unavailable()), Err(unavailable()), Err(unavailable())]);
    let store = Store { budget_left: Mutex::new(Some(Decimal::new(1, 3))), ..Store::default() };
    let inp = RunInput { fallbacks: vec![fallback(&backup, "b1", None)], max_tokens: Some(10), ..input() };
    let t = Tools::default();
    let o = run_to_end(inp, &primary, &t, &store, &StopSignal::new()).await;
    assert!(matches!(o, Outcome::Incomplete { stop_reason: StopReason::Budget, .. }), "{o:?}");
    assert!(backup.requests().is_empty(), "never called");
}
