//! Anthropic Messages API (`POST {base_url}/v1/messages`), streamed (its message events carry
//! the usage); a plain JSON answer is read too.

use serde_json::{json, Value};

use super::sse::SseEvent;
use super::wire::{cut_stream, exchange, protocol, Answer, Timeouts};
use super::{
    ChatRequest, ChatResponse, FinishReason, LlmError, Message, Progress, Provider, ToolCall, Usage, FINAL_ANSWER_TOOL,
};

pub const API_VERSION: &str = "2023-06-01";

/// Messages requires `max_tokens`: sent when a request sets none.
const DEFAULT_MAX_TOKENS: u32 = 4096;

#[derive(Clone)]
pub struct Anthropic {
    pub name: String,
    pub base_url: String,
    pub api_key: Option<super::Secret>,
    /// Ask for a streamed answer.
    pub stream: bool,
    /// Mark prompt cache breakpoints (`cache_control`), so that each turn reads the turns before
    /// it from the provider's cache (default on; off for a compatible server that rejects them).
    pub prompt_caching: bool,
    pub timeouts: Timeouts,
    pub client: reqwest::Client,
}

impl Anthropic {
    pub fn new(name: &str, base_url: &str, api_key: Option<super::Secret>, timeouts: Timeouts) -> Self {
        Anthropic {
            name: name.to_string(),
            base_url: base_url.trim_end_matches('/').trim_end_matches("/v1").to_string(),
            api_key,
            stream: true,
            prompt_caching: true,
            timeouts,
            client: super::http_client(),
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

/// Mark a request's cache breakpoints (Anthropic allows four; this uses at most four): the last
/// tool (tools are the start of the cached prefix, shared by every run with the same tools),
/// the system prompt (shared by every run of the same agent and context), the message that was
/// last in the run's previous request (this request reads everything up to it from the cache,
/// however many blocks the last turn added) and the last message (written for the next turn).
/// Content given as a string becomes one text block, in every message (a message reads the
/// same on every turn, marked or not: only the marks move).
pub fn mark_cache_breakpoints(body: &mut Value) {
    let mark = || json!({"type": "ephemeral"});
    if let Some(last) = body.get_mut("tools").and_then(Value::as_array_mut).and_then(|t| t.last_mut()) {
        last["cache_control"] = mark();
    }
    if let Some(s) = body.get("system").and_then(Value::as_str).map(str::to_string) {
        body["system"] = json!([{"type": "text", "text": s, "cache_control": mark()}]);
    }
    let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else { return };
    for m in messages.iter_mut() {
        if let Some(text) = m["content"].as_str().map(str::to_string) {
            m["content"] = json!([{"type": "text", "text": text}]);
        }
    }
    let Some(last) = messages.len().checked_sub(1) else { return };
    // The previous request ended with the user message before the last assistant answer.
    let previous = messages
        .iter()
        .rposition(|m| m["role"] == "assistant")
        .and_then(|a| messages[..a].iter().rposition(|m| m["role"] == "user"));
    for i in previous.into_iter().chain([last]) {
        if let Some(block) = messages[i]["content"].as_array_mut().and_then(|b| b.last_mut()) {
            block["cache_control"] = mark();
        }
    }
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
    let Some(stop) = v.get("stop_reason").and_then(Value::as_str) else {
        return Err(protocol(status, "response has no stop_reason (truncated?)"));
    };
    let u = v.get("usage").ok_or_else(|| protocol(status, "response has no usage"))?;
    Ok(ChatResponse {
        text: (!text.is_empty()).then_some(text),
        tool_calls,
        usage: usage_of(u),
        http_status: Some(status),
        finish: FinishReason::parse(stop),
        usage_estimated: false,
        model: v.get("model").and_then(Value::as_str).map(str::to_string),
    })
}

/// Anthropic's `input_tokens` exclude cache reads and writes; ours include them, with reads
/// also counted as cached and writes as cache writes (each billed at its own rate).
fn usage_of(u: &Value) -> Usage {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    Usage {
        input_tokens: n("input_tokens") + n("cache_read_input_tokens") + n("cache_creation_input_tokens"),
        output_tokens: n("output_tokens"),
        cached_tokens: n("cache_read_input_tokens"),
        cache_write_tokens: n("cache_creation_input_tokens"),
        web_searches: u.pointer("/server_tool_use/web_search_requests").and_then(Value::as_u64).unwrap_or(0),
    }
}

/// Anthropic's server-side web search tool, as a request names it.
pub const WEB_SEARCH_TOOL: &str = "web_search_20250305";

/// One content block of a streamed answer.
enum Block {
    Text(String),
    /// id, name, the input's JSON as it arrives.
    Tool(String, String, String),
    Other,
}

/// A streamed answer as it accumulates.
#[derive(Default)]
struct Streamed {
    blocks: Vec<Block>,
    /// From `message_start`; its output count is replaced by `message_delta`'s.
    usage: Option<Value>,
    stop: Option<String>,
    done: bool,
    model: Option<String>,
}

impl Streamed {
    fn feed(&mut self, e: SseEvent, progress: Option<&Progress>) -> Result<bool, LlmError> {
        if e.data.trim().is_empty() {
            return Ok(false);
        }
        let v: Value =
            serde_json::from_str(&e.data).map_err(|err| protocol(200, format!("bad stream event: {err}")))?;
        let block = |v: &Value| v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        match v.get("type").and_then(Value::as_str).unwrap_or_default() {
            "message_start" => {
                self.usage = v.pointer("/message/usage").cloned();
                self.model = v.pointer("/message/model").and_then(Value::as_str).map(str::to_string);
            }
            "content_block_start" => {
                let i = block(&v);
                while self.blocks.len() <= i {
                    self.blocks.push(Block::Other);
                }
                let b = v.get("content_block").unwrap_or(&Value::Null);
                let s = |k: &str| b.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                self.blocks[i] = match b.get("type").and_then(Value::as_str) {
                    Some("text") => Block::Text(s("text")),
                    Some("tool_use") => Block::Tool(s("id"), s("name"), String::new()),
                    _ => Block::Other,
                };
            }
            "content_block_delta" => {
                let d = v.get("delta").unwrap_or(&Value::Null);
                let piece = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or_default();
                match self.blocks.get_mut(block(&v)) {
                    Some(Block::Text(t)) => {
                        t.push_str(piece("text"));
                        if let Some(p) = progress {
                            p.add_text(piece("text"));
                        }
                    }
                    Some(Block::Tool(_, _, input)) => {
                        input.push_str(piece("partial_json"));
                        if let Some(p) = progress {
                            p.add_output(piece("partial_json").len());
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(s) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop = Some(s.to_string());
                }
                if let Some(out) = v.pointer("/usage/output_tokens") {
                    let u = self.usage.get_or_insert_with(|| json!({}));
                    u["output_tokens"] = out.clone();
                }
                // The server-side searches of the whole answer, counted at its end.
                if let Some(searches) = v.pointer("/usage/server_tool_use") {
                    let u = self.usage.get_or_insert_with(|| json!({}));
                    u["server_tool_use"] = searches.clone();
                }
            }
            "message_stop" => {
                self.done = true;
                return Ok(true);
            }
            "error" => {
                let kind = v.pointer("/error/type").and_then(Value::as_str).unwrap_or_default();
                let msg = v.pointer("/error/message").and_then(Value::as_str).unwrap_or("error in the stream");
                let status = match kind {
                    "overloaded_error" => 529,
                    "rate_limit_error" => 429,
                    "invalid_request_error" => 400,
                    _ => 500,
                };
                return Err(LlmError::from_status(status, msg.to_string(), None));
            }
            _ => {}
        }
        Ok(false)
    }

    fn into_response(self, status: u16) -> Result<ChatResponse, LlmError> {
        let Some(stop) = self.stop else { return Err(cut_stream()) };
        let mut text = String::new();
        let mut tool_calls = vec![];
        for b in self.blocks {
            match b {
                Block::Text(t) => text.push_str(&t),
                Block::Tool(id, name, input) => {
                    let arguments = if input.trim().is_empty() {
                        json!({})
                    } else {
                        // Cut input (at `max_tokens`) stays text: it is never run.
                        serde_json::from_str(&input).unwrap_or(Value::String(input))
                    };
                    tool_calls.push(ToolCall { id, name, arguments });
                }
                Block::Other => {}
            }
        }
        let usage = self.usage.as_ref().map(usage_of).ok_or_else(|| protocol(status, "the stream had no usage"))?;
        Ok(ChatResponse {
            text: (!text.is_empty()).then_some(text),
            tool_calls,
            usage,
            http_status: Some(status),
            finish: FinishReason::parse(&stop),
            usage_estimated: false,
            model: self.model,
        })
    }
}

#[async_trait::async_trait]
impl Provider for Anthropic {
    fn name(&self) -> &str {
        &self.name
    }

    fn system(&self) -> &str {
        "anthropic"
    }

    fn host(&self) -> Option<String> {
        super::host_of(&self.base_url)
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let (system, messages) = to_wire(&req.messages);
        let max_tokens = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        let mut body = json!({
            "model": req.model,
            "max_tokens": max_tokens,
            "messages": messages,
        });
        if self.stream {
            body["stream"] = json!(true);
        }
        if !system.is_empty() {
            body["system"] = json!(system);
        }
        let mut tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| match t.server {
                Some(crate::kinds::BuiltinTool::WebSearch) => {
                    json!({"type": WEB_SEARCH_TOOL, "name": t.name, "max_uses": super::SERVER_SEARCH_MAX_USES})
                }
                _ => json!({"name": t.name, "description": t.description, "input_schema": t.parameters}),
            })
            .collect();
        // A structured answer is the input of a `final_answer` tool (unless a tool of the run
        // already has that name: then the answer is read from the text).
        let native = req.output_schema.as_ref().filter(|_| !req.tools.iter().any(|t| t.name == FINAL_ANSWER_TOOL));
        if let Some(schema) = native {
            tools.push(json!({"name": FINAL_ANSWER_TOOL, "input_schema": schema,
                              "description": "Give your final answer by calling this tool, once, when you are done: \
                                              its input is your answer."}));
            if req.force_output {
                body["tool_choice"] = json!({"type": "tool", "name": FINAL_ANSWER_TOOL});
            }
        }
        if !tools.is_empty() {
            body["tools"] = Value::Array(tools);
        }
        if self.prompt_caching {
            mark_cache_breakpoints(&mut body);
        }
        let mut r = self.client.post(format!("{}/v1/messages", self.base_url)).header("anthropic-version", API_VERSION);
        if let Some(k) = &self.api_key {
            r = r.header("x-api-key", k.expose());
        }
        if let Some(tp) = &req.traceparent {
            r = r.header("traceparent", tp);
        }
        let mut acc = Streamed::default();
        let progress = req.progress.clone();
        let mut feed = |e: SseEvent| acc.feed(e, progress.as_deref());
        let resp = match exchange(r, &body, self.timeouts, Some(max_tokens), &mut feed).await? {
            Answer::Json(status, v) => parse_response(status, &v),
            Answer::Streamed { status, .. } => acc.into_response(status),
        }?;
        Ok(if native.is_some() { final_answer_as_text(resp) } else { resp })
    }
}

/// A call of the `final_answer` tool is the final answer: its input becomes the answer's text
/// (and the other calls of the turn, if any, still run).
fn final_answer_as_text(mut resp: ChatResponse) -> ChatResponse {
    if let Some(i) = resp.tool_calls.iter().position(|c| c.name == FINAL_ANSWER_TOOL) {
        let call = resp.tool_calls.remove(i);
        resp.text = Some(call.arguments.to_string());
        if resp.tool_calls.is_empty() && resp.finish == FinishReason::ToolCalls {
            resp.finish = FinishReason::Stop;
        }
    }
    resp
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
    fn a_streamed_answer_collects_blocks_stop_reason_and_usage() {
        let events = [
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 12, "output_tokens": 1, "cache_read_input_tokens": 100}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Checking"}}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "find", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"q\": "}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"x\"}"}}),
            json!({"type": "ping"}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 20}}),
            json!({"type": "message_stop"}),
        ];
        let mut acc = Streamed::default();
        let progress = Progress::default();
        for e in events {
            acc.feed(SseEvent { event: None, data: e.to_string() }, Some(&progress)).unwrap();
        }
        let r = acc.into_response(200).unwrap();
        assert_eq!(r.text.as_deref(), Some("Checking"));
        assert_eq!(r.tool_calls[0].arguments, json!({"q": "x"}));
        assert_eq!(r.finish, FinishReason::ToolCalls);
        assert_eq!(
            r.usage,
            Usage { input_tokens: 112, output_tokens: 20, cached_tokens: 100, cache_write_tokens: 0, web_searches: 0 }
        );
        assert_eq!(progress.output_chars(), 8 + 10);
    }

    #[test]
    fn server_side_searches_are_counted_and_their_blocks_are_not_tool_calls() {
        let v = json!({
            "model": "claude-sonnet-4-5", "stop_reason": "end_turn",
            "content": [
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "tides"}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                {"type": "text", "text": "Found it."}
            ],
            "usage": {"input_tokens": 10, "output_tokens": 5, "server_tool_use": {"web_search_requests": 3}}
        });
        let r = parse_response(200, &v).unwrap();
        assert!(r.tool_calls.is_empty(), "the provider ran the search itself");
        assert_eq!(r.text.as_deref(), Some("Found it."));
        assert_eq!(r.usage.web_searches, 3);
    }

    #[test]
    fn a_stream_that_stops_at_max_tokens_is_cut_and_one_that_just_ends_is_lost() {
        let mut acc = Streamed::default();
        for e in [
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 5}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "Half an ans"}}),
            json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 16}}),
        ] {
            acc.feed(SseEvent { event: None, data: e.to_string() }, None).unwrap();
        }
        assert_eq!(acc.into_response(200).unwrap().finish, FinishReason::Length);
        let mut lost = Streamed::default();
        lost.feed(SseEvent { event: None, data: json!({"type": "message_start", "message": {}}).to_string() }, None)
            .unwrap();
        assert!(lost.into_response(200).unwrap_err().restarting());
    }

    #[test]
    fn breakpoints_mark_tools_system_the_previous_turns_end_and_the_last_message() {
        let (system, messages) = to_wire(&[
            Message::System { content: "sys".into() },
            Message::User { content: "q".into() },
            Message::Assistant {
                content: None,
                tool_calls: vec![ToolCall { id: "a".into(), name: "x".into(), arguments: json!({}) }],
            },
            Message::Tool { tool_call_id: "a".into(), name: "x".into(), content: "r1".into(), is_error: false },
        ]);
        let mut body = json!({"system": system, "messages": messages,
                              "tools": [{"name": "x", "input_schema": {}}, {"name": "y", "input_schema": {}}]});
        mark_cache_breakpoints(&mut body);
        let eph = json!({"type": "ephemeral"});
        assert_eq!(body["tools"][0].get("cache_control"), None);
        assert_eq!(body["tools"][1]["cache_control"], eph);
        assert_eq!(body["system"], json!([{"type": "text", "text": "sys", "cache_control": eph}]));
        let m = body["messages"].as_array().unwrap();
        assert_eq!(m[0]["content"], json!([{"type": "text", "text": "q", "cache_control": eph}]), "the previous end");
        assert_eq!(m[1]["content"][0].get("cache_control"), None);
        assert_eq!(m[2]["content"][0]["cache_control"], eph, "the last message");
        let marks = body.to_string().matches("cache_control").count();
        assert_eq!(marks, 4, "within Anthropic's four breakpoints");

        // The first turn: one user message, marked once.
        let mut first = json!({"messages": [{"role": "user", "content": "q"}]});
        mark_cache_breakpoints(&mut first);
        assert_eq!(first.to_string().matches("cache_control").count(), 1);

        // Later, the first message is no longer marked, and reads as it did.
        let mut later = json!({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                                            {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"},
                                            {"role": "user", "content": "d"}]});
        mark_cache_breakpoints(&mut later);
        assert_eq!(later["messages"][0]["content"], json!([{"type": "text", "text": "q"}]));
        assert_eq!(later["messages"][1]["content"], json!([{"type": "text", "text": "a"}]));
        assert_eq!(later["messages"][2]["content"][0]["cache_control"], eph);
    }

    #[test]
    fn usage_counts_cache_reads_as_input_and_cached() {
        let v = json!({"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                       "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20}});
        let r = parse_response(200, &v).unwrap();
        assert_eq!(
            r.usage,
            Usage { input_tokens: 130, output_tokens: 5, cached_tokens: 100, cache_write_tokens: 20, web_searches: 0 }
        );
        assert_eq!(r.text.as_deref(), Some("hi"));
    }
}
