//! Anthropic Messages API (`POST {base_url}/v1/messages`).

use std::time::Duration;

use serde_json::{json, Value};

use super::wire::{post_json, protocol};
use super::{ChatRequest, ChatResponse, LlmError, Message, Provider, ToolCall, Usage};

pub const API_VERSION: &str = "2023-06-01";

#[derive(Clone)]
pub struct Anthropic {
    pub name: String,
    pub base_url: String,
    pub api_key: Option<super::Secret>,
    /// Messages requires `max_tokens`; used when the request sets none.
    pub default_max_tokens: u32,
    pub client: reqwest::Client,
}

impl Anthropic {
    pub fn new(name: &str, base_url: &str, api_key: Option<super::Secret>, timeout: Duration) -> Self {
        Anthropic {
            name: name.to_string(),
            base_url: base_url.trim_end_matches('/').trim_end_matches("/v1").to_string(),
            api_key,
            default_max_tokens: 4096,
            client: super::http_client(timeout),
        }
    }
}

/// System text and the `messages` array: tool results of one turn are grouped into one user
/// message of `tool_result` blocks, as the API requires.
pub fn to_wire(messages: &[Message]) -> (String, Vec<Value>) {
    let mut system = vec![];
    let mut out: Vec<Value> = vec![];
    for m in messages {
        match m {
            Message::System { content } => system.push(content.clone()),
            Message::User { content } => out.push(json!({"role": "user", "content": content})),
            Message::Assistant { content, tool_calls } => {
                let mut blocks = vec![];
                if let Some(t) = content.as_ref().filter(|t| !t.is_empty()) {
                    blocks.push(json!({"type": "text", "text": t}));
                }
                for c in tool_calls {
                    let input = if c.arguments.is_object() { c.arguments.clone() } else { json!({}) };
                    blocks.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
                }
                out.push(json!({"role": "assistant", "content": blocks}));
            }
            Message::Tool { tool_call_id, content, is_error, .. } => {
                let block = json!({"type": "tool_result", "tool_use_id": tool_call_id, "content": content, "is_error": is_error});
                let last_is_results = out.last().is_some_and(|l| {
                    l["role"] == "user"
                        && l["content"].as_array().is_some_and(|b| b.iter().all(|b| b["type"] == "tool_result"))
                });
                if last_is_results {
                    if let Some(arr) = out.last_mut().and_then(|l| l["content"].as_array_mut()) {
                        arr.push(block);
                    }
                } else {
                    out.push(json!({"role": "user", "content": [block]}));
                }
            }
        }
    }
    (system.join("\n\n"), out)
}

pub fn parse_response(status: u16, v: &Value) -> Result<ChatResponse, LlmError> {
    let blocks =
        v.get("content").and_then(Value::as_array).ok_or_else(|| protocol(status, "response has no content array"))?;
    let mut text = String::new();
    let mut tool_calls = vec![];
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => {
                let id = b.get("id").and_then(Value::as_str).ok_or_else(|| protocol(status, "tool_use without id"))?;
                let name =
                    b.get("name").and_then(Value::as_str).ok_or_else(|| protocol(status, "tool_use without name"))?;
                tool_calls.push(ToolCall {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments: b.get("input").cloned().unwrap_or_else(|| json!({})),
                });
            }
            _ => {}
        }
    }
    if v.get("stop_reason").and_then(Value::as_str).is_none() {
        return Err(protocol(status, "response has no stop_reason (truncated?)"));
    }
    let u = v.get("usage").ok_or_else(|| protocol(status, "response has no usage"))?;
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    // Anthropic's input_tokens exclude cache reads and writes; ours include them, with reads
    // also counted as cached.
    let usage = Usage {
        input_tokens: n("input_tokens") + n("cache_read_input_tokens") + n("cache_creation_input_tokens"),
        output_tokens: n("output_tokens"),
        cached_tokens: n("cache_read_input_tokens"),
    };
    Ok(ChatResponse { text: (!text.is_empty()).then_some(text), tool_calls, usage, http_status: Some(status) })
}

#[async_trait::async_trait]
impl Provider for Anthropic {
    fn name(&self) -> &str {
        &self.name
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let (system, messages) = to_wire(&req.messages);
        let mut body = json!({
            "model": req.model,
            "max_tokens": req.max_tokens.unwrap_or(self.default_max_tokens),
            "messages": messages,
        });
        if !system.is_empty() {
            body["system"] = json!(system);
        }
        if !req.tools.is_empty() {
            body["tools"] = req
                .tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
                .collect();
        }
        let mut r = self.client.post(format!("{}/v1/messages", self.base_url)).header("anthropic-version", API_VERSION);
        if let Some(k) = &self.api_key {
            r = r.header("x-api-key", k.expose());
        }
        if let Some(tp) = &req.traceparent {
            r = r.header("traceparent", tp);
        }
        let (status, v) = post_json(r, &body).await?;
        parse_response(status, &v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_results_of_one_turn_share_one_user_message() {
        let msgs = vec![
            Message::System { content: "sys".into() },
            Message::User { content: "q".into() },
            Message::Assistant {
                content: Some("let me look".into()),
                tool_calls: vec![
                    ToolCall { id: "a".into(), name: "x".into(), arguments: json!({"k": 1}) },
                    ToolCall { id: "b".into(), name: "y".into(), arguments: json!({}) },
                ],
            },
            Message::Tool { tool_call_id: "a".into(), name: "x".into(), content: "1".into(), is_error: false },
            Message::Tool { tool_call_id: "b".into(), name: "y".into(), content: "no".into(), is_error: true },
        ];
        let (system, wire) = to_wire(&msgs);
        assert_eq!(system, "sys");
        assert_eq!(wire.len(), 3);
        assert_eq!(wire[1]["content"][1]["type"], "tool_use");
        assert_eq!(wire[2]["role"], "user");
        assert_eq!(wire[2]["content"].as_array().unwrap().len(), 2);
        assert_eq!(wire[2]["content"][1]["is_error"], true);
    }

    #[test]
    fn usage_counts_cache_reads_as_input_and_cached() {
        let v = json!({"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                       "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20}});
        let r = parse_response(200, &v).unwrap();
        assert_eq!(r.usage, Usage { input_tokens: 130, output_tokens: 5, cached_tokens: 100 });
        assert_eq!(r.text.as_deref(), Some("hi"));
    }
}
