//! OpenAI Chat Completions (`POST {base_url}/chat/completions`) and the many servers that
//! speak it: OpenAI, Azure OpenAI deployments, OpenRouter, vLLM, Ollama, llama.cpp, LM Studio.

use std::time::Duration;

use serde_json::{json, Value};

use super::wire::{post_json, protocol};
use super::{ChatRequest, ChatResponse, LlmError, Message, Provider, ToolCall, Usage};

#[derive(Clone)]
pub struct OpenAi {
    pub name: String,
    /// Up to and including `/v1` (or the Azure deployment path).
    pub base_url: String,
    pub api_key: Option<super::Secret>,
    /// `authorization` (Bearer, the default) or `api-key` (Azure).
    pub auth_header: String,
    /// Extra query parameters, e.g. Azure's `api-version`.
    pub query: Vec<(String, String)>,
    /// `max_tokens` (default) or `max_completion_tokens` (OpenAI reasoning models).
    pub max_tokens_field: String,
    pub client: reqwest::Client,
}

impl OpenAi {
    pub fn new(name: &str, base_url: &str, api_key: Option<super::Secret>, timeout: Duration) -> Self {
        OpenAi {
            name: name.to_string(),
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key,
            auth_header: "authorization".into(),
            query: vec![],
            max_tokens_field: "max_tokens".into(),
            client: super::http_client(timeout),
        }
    }
}

pub fn to_wire(m: &Message) -> Value {
    match m {
        Message::System { content } => json!({"role": "system", "content": content}),
        Message::User { content } => json!({"role": "user", "content": content}),
        Message::Assistant { content, tool_calls } => {
            let mut v = json!({"role": "assistant", "content": content});
            if !tool_calls.is_empty() {
                v["tool_calls"] = tool_calls
                    .iter()
                    .map(|t| {
                        let args = match &t.arguments {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        json!({"id": t.id, "type": "function", "function": {"name": t.name, "arguments": args}})
                    })
                    .collect();
            }
            v
        }
        Message::Tool { tool_call_id, content, .. } => {
            json!({"role": "tool", "tool_call_id": tool_call_id, "content": content})
        }
    }
}

pub fn parse_response(status: u16, v: &Value) -> Result<ChatResponse, LlmError> {
    let msg = v.pointer("/choices/0/message").ok_or_else(|| protocol(status, "response has no choices[0].message"))?;
    let text = msg.get("content").and_then(Value::as_str).map(str::to_string);
    let mut tool_calls = vec![];
    if let Some(calls) = msg.get("tool_calls").and_then(Value::as_array) {
        for c in calls {
            let id = c.get("id").and_then(Value::as_str).ok_or_else(|| protocol(status, "tool call without id"))?;
            let f = c.get("function").ok_or_else(|| protocol(status, "tool call without function"))?;
            let name =
                f.get("name").and_then(Value::as_str).ok_or_else(|| protocol(status, "tool call without name"))?;
            let raw = f.get("arguments").and_then(Value::as_str).unwrap_or("{}");
            // Models sometimes emit invalid JSON: keep the text, the tool layer reports it.
            let arguments = if raw.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
            };
            tool_calls.push(ToolCall { id: id.to_string(), name: name.to_string(), arguments });
        }
    }
    let u = v.get("usage").ok_or_else(|| protocol(status, "response has no usage"))?;
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let usage = Usage {
        input_tokens: n("/prompt_tokens"),
        output_tokens: n("/completion_tokens"),
        cached_tokens: n("/prompt_tokens_details/cached_tokens"),
    };
    Ok(ChatResponse { text, tool_calls, usage, http_status: Some(status) })
}

#[async_trait::async_trait]
impl Provider for OpenAi {
    fn name(&self) -> &str {
        &self.name
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let mut body = json!({
            "model": req.model,
            "messages": req.messages.iter().map(to_wire).collect::<Vec<_>>(),
        });
        if !req.tools.is_empty() {
            body["tools"] = req
                .tools
                .iter()
                .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
                .collect();
        }
        if let Some(mt) = req.max_tokens {
            body[self.max_tokens_field.as_str()] = json!(mt);
        }
        let mut r = self.client.post(format!("{}/chat/completions", self.base_url)).query(&self.query);
        if let Some(k) = &self.api_key {
            r = if self.auth_header.eq_ignore_ascii_case("authorization") {
                r.bearer_auth(k.expose())
            } else {
                r.header(self.auth_header.as_str(), k.expose())
            };
        }
        if let Some(tp) = &req.traceparent {
            r = r.header("traceparent", tp);
        }
        let (status, v) = post_json(r, &body).await?;
        parse_response(status, &v)
    }
}
