//! Fake LLM providers as real HTTP servers, speaking the documented wire formats: a queue of
//! scripted answers, and a record of every request received.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

#[derive(Clone, Default)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub delay: Duration,
    /// A streamed answer (`text/event-stream`): each chunk after its delay.
    pub chunks: Option<Vec<(Duration, String)>>,
    /// After the chunks, keep the connection open and send nothing (a stalled stream).
    pub hang: bool,
    /// A streamed answer that waits for the test: see `Gate`.
    pub gate: Option<Gate>,
}

/// Before chunk `at`, the stream sends `filler` (a chunk) every 50 ms until `open` turns true
/// (at most 30 s): a test opens it when it has seen what it waits for (a condition, not a clock).
#[derive(Clone)]
pub struct Gate {
    pub at: usize,
    pub filler: String,
    pub open: tokio::sync::watch::Receiver<bool>,
}

impl Answer {
    pub fn json(v: Value) -> Self {
        Answer { status: 200, body: v.to_string(), ..Answer::default() }
    }
    pub fn status(status: u16, body: Value) -> Self {
        Answer { status, body: body.to_string(), ..Answer::default() }
    }
    pub fn raw(status: u16, body: &str) -> Self {
        Answer { status, body: body.to_string(), ..Answer::default() }
    }
    /// Server-Sent Events, one `data:` event a chunk (an `event:` line first where the JSON has
    /// a `type`, as Anthropic sends), `gap` apart.
    pub fn sse(events: &[Value], gap: Duration) -> Self {
        let chunks = events
            .iter()
            .map(|e| {
                let text = match (e.as_str(), e.get("type").and_then(Value::as_str)) {
                    (Some(raw), _) => format!("data: {raw}\n\n"),
                    (None, Some(t)) => format!("event: {t}\ndata: {e}\n\n"),
                    (None, None) => format!("data: {e}\n\n"),
                };
                (gap, text)
            })
            .collect();
        Answer { status: 200, chunks: Some(chunks), ..Answer::default() }
    }
    /// Stop sending after the first `n` chunks, keeping the connection open.
    pub fn stall_after(mut self, n: usize) -> Self {
        if let Some(c) = &mut self.chunks {
            c.truncate(n);
        }
        self.hang = true;
        self
    }
    pub fn header(mut self, k: &'static str, v: &str) -> Self {
        self.headers.push((k, v.to_string()));
        self
    }
    pub fn after(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
    /// Hold the stream before chunk `at`, sending `filler` (an event, as `sse` makes one) until
    /// the returned sender says `true`.
    pub fn gated(mut self, at: usize, filler: &Value) -> (Self, tokio::sync::watch::Sender<bool>) {
        let (tx, open) = tokio::sync::watch::channel(false);
        let filler = Answer::sse(std::slice::from_ref(filler), Duration::ZERO).chunks.unwrap().remove(0).1;
        self.gate = Some(Gate { at, filler, open });
        (self, tx)
    }
}

#[derive(Clone, Debug)]
pub struct Seen {
    pub headers: HeaderMap,
    pub body: Value,
    /// The body's bytes as sent.
    pub raw: Bytes,
}

#[derive(Clone, Default)]
pub struct Fake {
    answers: Arc<Mutex<VecDeque<Answer>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Requests whose connection was dropped before the answer was sent.
    pub dropped: Arc<Mutex<u32>>,
}

impl Fake {
    pub fn push(&self, a: Answer) -> &Self {
        self.answers.lock().unwrap().push_back(a);
        self
    }
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

struct DropGuard(Arc<Mutex<u32>>, bool);
impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.1 {
            *self.0.lock().unwrap() += 1;
        }
    }
}

async fn handle(State(f): State<Fake>, headers: HeaderMap, body: Bytes) -> Response {
    let raw = body;
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    f.seen.lock().unwrap().push(Seen { headers, body, raw });
    let a = f
        .answers
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| Answer::status(500, json!({"error": {"message": "fake: no answer scripted"}})));
    let mut guard = DropGuard(f.dropped.clone(), false);
    tokio::time::sleep(a.delay).await;
    guard.1 = true;
    if let (Some(chunks), Some(gate)) = (a.chunks.clone(), a.gate) {
        return gated_stream(chunks, gate, a.hang);
    }
    if let Some(chunks) = a.chunks {
        let hang = a.hang;
        let stream = futures_util::stream::unfold((chunks.into_iter(), hang), |(mut it, hang)| async move {
            match it.next() {
                Some((gap, text)) => {
                    tokio::time::sleep(gap).await;
                    Some((Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(text)), (it, hang)))
                }
                None if hang => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    None
                }
                None => None,
            }
        });
        let mut r = axum::body::Body::from_stream(stream).into_response();
        r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
        return r;
    }
    let mut r = (StatusCode::from_u16(a.status).unwrap(), a.body).into_response();
    r.headers_mut().insert("content-type", "application/json".parse().unwrap());
    for (k, v) in a.headers {
        r.headers_mut().insert(k, v.parse().unwrap());
    }
    r
}

/// A streamed answer held at its gate: fillers until the gate opens, then the rest.
fn gated_stream(chunks: Vec<(Duration, String)>, gate: Gate, hang: bool) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(1);
    tokio::spawn(async move {
        for (i, (gap, text)) in chunks.into_iter().enumerate() {
            if gate.at == i {
                let mut open = gate.open.clone();
                let until = tokio::time::Instant::now() + Duration::from_secs(30);
                while !*open.borrow_and_update() && tokio::time::Instant::now() < until {
                    if tx.send(gate.filler.clone()).await.is_err() {
                        return;
                    }
                    let _ = tokio::time::timeout(Duration::from_millis(50), open.changed()).await;
                }
            }
            tokio::time::sleep(gap).await;
            if tx.send(text).await.is_err() {
                return;
            }
        }
        if hang {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let text = rx.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(text)), rx))
    });
    let mut r = axum::body::Body::from_stream(stream).into_response();
    r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
    r
}

/// Serve `path` on an ephemeral loopback port; returns the fake and its base URL.
pub async fn serve(path: &str) -> (Fake, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_on(path, listener)
}

fn serve_on(path: &str, listener: tokio::net::TcpListener) -> (Fake, String) {
    let fake = Fake::default();
    let app = Router::new().route(path, post(handle)).with_state(fake.clone());
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (fake, format!("http://{addr}"))
}

/// Serve `app` on an ephemeral loopback port (a fake tool, webhook receiver or provider);
/// returns its base URL.
pub async fn serve_router(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// A server that is not up yet: its URL refuses connections until `after`, then `path` is
/// served there. (The fake is returned at once, to script answers.)
pub async fn serve_later(path: &str, after: Duration) -> (Fake, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let fake = Fake::default();
    let app = Router::new().route(path, post(handle)).with_state(fake.clone());
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        axum::serve(listener, app).await.unwrap()
    });
    (fake, format!("http://127.0.0.1:{port}"))
}

/// An OpenAI-compatible stream: the text in pieces, tool calls (id, name, raw arguments), the
/// finish reason, then the usage and `[DONE]`.
pub fn openai_stream(text: &str, calls: &[(&str, &str, &str)], finish: &str, usage: (u64, u64)) -> Vec<Value> {
    let mut out = vec![json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})];
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(6) {
        out.push(json!({"choices": [{"index": 0, "delta": {"content": piece.iter().collect::<String>()}}]}));
    }
    for (i, (id, name, args)) in calls.iter().enumerate() {
        out.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""}}]}}]}));
        out.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": args}}]}}]}));
    }
    out.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}));
    out.push(json!({"choices": [], "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1}}));
    out.push(json!("[DONE]"));
    out
}

/// An Anthropic message stream: the text in pieces, then the stop reason and usage.
pub fn anthropic_stream(text: &str, stop_reason: &str, usage: (u64, u64)) -> Vec<Value> {
    let mut out = vec![
        json!({"type": "message_start", "message": {"id": "msg_s", "usage": {"input_tokens": usage.0, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ];
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(6) {
        out.push(json!({"type": "content_block_delta", "index": 0,
                        "delta": {"type": "text_delta", "text": piece.iter().collect::<String>()}}));
    }
    out.push(json!({"type": "content_block_stop", "index": 0}));
    out.push(
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": usage.1}}),
    );
    out.push(json!({"type": "message_stop"}));
    out
}

pub fn openai_text(text: &str, prompt: u64, completion: u64, cached: u64) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}}
    })
}

pub fn openai_tool_call(id: &str, name: &str, args: &str) -> Value {
    json!({
        "id": "chatcmpl-2", "object": "chat.completion", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": args}}]}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}
    })
}

pub fn anthropic_text(text: &str, input: u64, output: u64, cache_read: u64) -> Value {
    json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": input, "output_tokens": output, "cache_read_input_tokens": cache_read,
                  "cache_creation_input_tokens": 0}
    })
}

pub fn anthropic_tool_use(id: &str, name: &str, input: Value) -> Value {
    json!({
        "id": "msg_2", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "Let me check."}, {"type": "tool_use", "id": id, "name": name, "input": input}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 40, "output_tokens": 12}
    })
}
