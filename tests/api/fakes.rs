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

#[derive(Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Answer {
    pub fn json(v: Value) -> Self {
        Answer { status: 200, headers: vec![], body: v.to_string(), delay: Duration::ZERO }
    }
    pub fn status(status: u16, body: Value) -> Self {
        Answer { status, headers: vec![], body: body.to_string(), delay: Duration::ZERO }
    }
    pub fn raw(status: u16, body: &str) -> Self {
        Answer { status, headers: vec![], body: body.to_string(), delay: Duration::ZERO }
    }
    pub fn header(mut self, k: &'static str, v: &str) -> Self {
        self.headers.push((k, v.to_string()));
        self
    }
    pub fn after(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
}

#[derive(Clone, Debug)]
pub struct Seen {
    pub headers: HeaderMap,
    pub body: Value,
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
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    f.seen.lock().unwrap().push(Seen { headers, body });
    let a = f
        .answers
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| Answer::status(500, json!({"error": {"message": "fake: no answer scripted"}})));
    let mut guard = DropGuard(f.dropped.clone(), false);
    tokio::time::sleep(a.delay).await;
    guard.1 = true;
    let mut r = (StatusCode::from_u16(a.status).unwrap(), a.body).into_response();
    r.headers_mut().insert("content-type", "application/json".parse().unwrap());
    for (k, v) in a.headers {
        r.headers_mut().insert(k, v.parse().unwrap());
    }
    r
}

/// Serve `path` on an ephemeral loopback port; returns the fake and its base URL.
pub async fn serve(path: &str) -> (Fake, String) {
    let fake = Fake::default();
    let app = Router::new().route(path, post(handle)).with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (fake, format!("http://{addr}"))
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
