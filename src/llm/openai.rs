//! OpenAI Chat Completions (`POST {base_url}/chat/completions`) and the many servers that
//! speak it: OpenAI, Azure OpenAI deployments, OpenRouter, vLLM, Ollama, llama.cpp, LM Studio.
//! Answers are streamed (`stream_options.include_usage` for the usage); a server that answers
//! with one JSON body anyway is read as such.

use serde::Serialize;
use serde_json::{json, Value};

use super::sse::SseEvent;
use super::wire::{exchange, protocol, Answer, Timeouts};
use super::{ChatRequest, ChatResponse, FinishReason, LlmError, Message, Progress, Provider, ToolCall, Usage};

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
    /// Ask for a streamed answer.
    pub stream: bool,
    /// Send `prompt_cache_key` (one per run: its system prompt and first message), so that
    /// a run's turns are routed to the cache that holds their common prefix.
    pub prompt_cache_key: bool,
    pub timeouts: Timeouts,
    pub client: reqwest::Client,
}

impl OpenAi {
    pub fn new(name: &str, base_url: &str, api_key: Option<super::Secret>, timeouts: Timeouts) -> Self {
        OpenAi {
            name: name.to_string(),
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key,
            auth_header: "authorization".into(),
            query: vec![],
            max_tokens_field: "max_tokens".into(),
            stream: true,
            prompt_cache_key: false,
            timeouts,
            client: super::http_client(),
        }
    }
}

/// A message as the chat completions API takes it, borrowed from the conversation.
#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum WireMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: &'a str,
    },
    Assistant {
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

#[derive(Serialize)]
pub struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireCallFn<'a>,
}

#[derive(Serialize)]
struct WireCallFn<'a> {
    name: &'a str,
    /// The arguments as JSON text (the API's form), or as the model wrote them when not JSON.
    arguments: std::borrow::Cow<'a, str>,
}

pub fn to_wire(m: &Message) -> WireMessage<'_> {
    match m {
        Message::System { content } => WireMessage::System { content },
        Message::User { content } => WireMessage::User { content },
        Message::Assistant { content, tool_calls } => WireMessage::Assistant {
            content: content.as_deref(),
            tool_calls: tool_calls
                .iter()
                .map(|t| WireCall {
                    id: &t.id,
                    kind: "function",
                    function: WireCallFn {
                        name: &t.name,
                        arguments: match &t.arguments {
                            Value::String(s) => s.into(),
                            other => other.to_string().into(),
                        },
                    },
                })
                .collect(),
        },
        Message::Tool { tool_call_id, content, .. } => WireMessage::Tool { tool_call_id, content },
    }
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFn<'a>,
}

#[derive(Serialize)]
struct WireFn<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// A chat completions request, serialised straight from the run's own conversation and tools
/// (no copy of them as a JSON tree: that copy was a measurable share of a turn's CPU).
#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    /// The output limit, under the name the provider is configured with.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<String>,
}

/// Arguments as the model wrote them: JSON, or (invalid, often cut) the raw text, which the
/// tool layer reports back to the model.
/// A run's `prompt_cache_key`: the same on every turn of the run (the model, and the first two
/// messages: the system prompt and the task), different between runs.
pub fn cache_key(req: &ChatRequest) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(req.model.as_bytes());
    for m in req.messages.iter().take(2) {
        h.update([0]);
        h.update(serde_json::to_vec(m).unwrap_or_default());
    }
    format!("subagentd-{}", hex::encode(&h.finalize()[..12]))
}

fn arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        json!({})
    } else {
        serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
    }
}

fn usage_of(u: &Value) -> Usage {
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    Usage {
        input_tokens: n("/prompt_tokens"),
        output_tokens: n("/completion_tokens"),
        cached_tokens: n("/prompt_tokens_details/cached_tokens"),
        // OpenAI bills no cache writes (its caching is automatic); a compatible server that
        // reports them (`cache_creation_input_tokens`, as some gateways do) is read too.
        cache_write_tokens: n("/prompt_tokens_details/cache_creation_input_tokens")
            .max(n("/cache_creation_input_tokens")),
        web_searches: 0,
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
            tool_calls.push(ToolCall { id: id.to_string(), name: name.to_string(), arguments: arguments(raw) });
        }
    }
    let u = v.get("usage").ok_or_else(|| protocol(status, "response has no usage"))?;
    let finish = v.pointer("/choices/0/finish_reason").and_then(Value::as_str).map(FinishReason::parse);
    Ok(ChatResponse {
        text,
        tool_calls,
        usage: usage_of(u),
        http_status: Some(status),
        finish: finish.unwrap_or_default(),
        usage_estimated: false,
        model: v.get("model").and_then(Value::as_str).map(str::to_string),
    })
}

/// A streamed answer as it accumulates.
#[derive(Default)]
struct Streamed {
    text: String,
    /// By the stream's `index`: id, name, raw arguments.
    calls: Vec<(String, String, String)>,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    done: bool,
    model: Option<String>,
}

impl Streamed {
    /// One `data:` chunk; true once the answer is complete.
    fn feed(&mut self, e: SseEvent, progress: Option<&Progress>) -> Result<bool, LlmError> {
        let data = e.data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let v: Value = serde_json::from_str(data).map_err(|err| protocol(200, format!("bad stream chunk: {err}")))?;
        if let Some(err) = v.get("error") {
            let msg = err.get("message").and_then(Value::as_str).unwrap_or("error in the stream").to_string();
            let status = err.get("code").and_then(Value::as_u64).filter(|c| (400..600).contains(c)).unwrap_or(500);
            return Err(LlmError::from_status(status as u16, msg, None));
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage_of(u));
        }
        if self.model.is_none() {
            self.model = v.get("model").and_then(Value::as_str).map(str::to_string);
        }
        if let Some(choice) = v.pointer("/choices/0") {
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            if let Some(t) = delta.get("content").and_then(Value::as_str) {
                self.text.push_str(t);
                if let Some(p) = progress {
                    p.add_text(t);
                }
            }
            for c in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                let i = c.get("index").and_then(Value::as_u64).unwrap_or(self.calls.len() as u64) as usize;
                while self.calls.len() <= i {
                    self.calls.push(Default::default());
                }
                let slot = &mut self.calls[i];
                if let Some(id) = c.get("id").and_then(Value::as_str) {
                    slot.0 = id.to_string();
                }
                if let Some(n) = c.pointer("/function/name").and_then(Value::as_str) {
                    slot.1.push_str(n);
                }
                if let Some(a) = c.pointer("/function/arguments").and_then(Value::as_str) {
                    slot.2.push_str(a);
                    if let Some(p) = progress {
                        p.add_output(a.len());
                    }
                }
            }
            if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish = Some(FinishReason::parse(f));
            }
        }
        Ok(false)
    }

    fn into_response(self, status: u16, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        // Whole when the server said `[DONE]` or gave a finish reason (some close without
        // `[DONE]`); anything else is a lost connection.
        if self.finish.is_none() && !self.done {
            return Err(super::wire::cut_stream());
        }
        let mut tool_calls = vec![];
        for (i, (id, name, raw)) in self.calls.into_iter().enumerate() {
            if name.is_empty() {
                return Err(protocol(status, "streamed tool call without a name"));
            }
            let id = if id.is_empty() { format!("call_{i}") } else { id };
            tool_calls.push(ToolCall { id, name, arguments: arguments(&raw) });
        }
        let out_chars =
            self.text.len() + tool_calls.iter().map(|t| t.name.len() + t.arguments.to_string().len()).sum::<usize>();
        let (usage, usage_estimated) = match self.usage {
            Some(u) => (u, false),
            // The server ignored `include_usage`: count a quarter of a token a character.
            None => (
                Usage {
                    input_tokens: (req.messages.iter().map(Message::chars).sum::<usize>() as u64).div_ceil(4),
                    output_tokens: (out_chars as u64).div_ceil(4),
                    ..Usage::default()
                },
                true,
            ),
        };
        Ok(ChatResponse {
            text: (!self.text.is_empty()).then_some(self.text),
            tool_calls,
            usage,
            http_status: Some(status),
            finish: self.finish.unwrap_or_default(),
            usage_estimated,
            model: self.model,
        })
    }
}

#[async_trait::async_trait]
impl Provider for OpenAi {
    fn name(&self) -> &str {
        &self.name
    }

    fn system(&self) -> &str {
        "openai"
    }

    fn host(&self) -> Option<String> {
        super::host_of(&self.base_url)
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let mut body = WireRequest {
            model: &req.model,
            messages: req.messages.iter().map(to_wire).collect(),
            // A provider-side tool of another provider (Anthropic's web search, after a fallback
            // to this one) is not offered here.
            tools: req
                .tools
                .iter()
                .filter(|t| t.server.is_none())
                .map(|t| WireTool {
                    kind: "function",
                    function: WireFn { name: &t.name, description: &t.description, parameters: &t.parameters },
                })
                .collect(),
            max_tokens: req.max_tokens.filter(|_| self.max_tokens_field != "max_completion_tokens"),
            max_completion_tokens: req.max_tokens.filter(|_| self.max_tokens_field == "max_completion_tokens"),
            response_format: None,
            tool_choice: None,
            stream: self.stream,
            stream_options: self.stream.then(|| json!({"include_usage": true})),
            prompt_cache_key: self.prompt_cache_key.then(|| cache_key(req)),
        };
        if let Some(schema) = &req.output_schema {
            // Not `strict`: strict mode refuses schemas that do not list every property as
            // required and forbid others; every answer is validated here anyway.
            body.response_format = Some(
                json!({"type": "json_schema", "json_schema": {"name": "final_answer", "schema": schema, "strict": false}}),
            );
            if req.force_output && !req.tools.is_empty() {
                body.tool_choice = Some("none");
            }
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
        let mut acc = Streamed::default();
        let progress = req.progress.clone();
        let mut feed = |e: SseEvent| acc.feed(e, progress.as_deref());
        match exchange(r, &body, self.timeouts, req.max_tokens, &mut feed).await? {
            Answer::Json(status, v) => parse_response(status, &v),
            Answer::Streamed { status, .. } => acc.into_response(status, req),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(chunks: &[Value]) -> Result<ChatResponse, LlmError> {
        let mut acc = Streamed::default();
        for c in chunks {
            acc.feed(SseEvent { event: None, data: c.to_string() }, None)?;
        }
        acc.feed(SseEvent { event: None, data: "[DONE]".into() }, None)?;
        acc.into_response(200, &ChatRequest::default())
    }

    #[test]
    fn a_streamed_answer_collects_text_tool_calls_finish_and_usage() {
        let r = feed_all(&[
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": " me", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "look", "arguments": ""}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"q\":"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}}}),
        ])
        .unwrap();
        assert_eq!(r.text.as_deref(), Some("Let me"));
        assert_eq!(
            r.tool_calls,
            vec![ToolCall { id: "call_1".into(), name: "look".into(), arguments: json!({"q": 1}) }]
        );
        assert_eq!(r.finish, FinishReason::ToolCalls);
        assert_eq!(
            r.usage,
            Usage { input_tokens: 9, output_tokens: 4, cached_tokens: 2, cache_write_tokens: 0, web_searches: 0 }
        );
        assert!(!r.usage_estimated);
    }

    #[test]
    fn a_cut_answer_says_length_and_its_cut_arguments_stay_text() {
        let r = feed_all(&[
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "w", "arguments": "{\"body\": \"very lo"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
        ])
        .unwrap();
        assert_eq!(r.finish, FinishReason::Length);
        assert_eq!(r.tool_calls[0].arguments, json!("{\"body\": \"very lo"));
        assert!(r.usage_estimated, "no usage chunk: estimated");
    }

    #[test]
    fn an_error_in_the_stream_is_an_error() {
        let e = feed_all(&[json!({"error": {"message": "Loading model", "code": 503}})]).unwrap_err();
        assert_eq!(e.http_status, Some(503));
        assert!(e.restarting());
    }
}
