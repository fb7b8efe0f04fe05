//! The `mock` provider: deterministic, no network, scripted by directives in the prompt.
//!
//! Directives are `[mock:key=value]` anywhere in the task's user message:
//!
//! | directive | effect |
//! | --- | --- |
//! | `[mock:reply=TEXT]` | the final answer is `TEXT` (default: `Mock summary: <prompt>`) |
//! | `[mock:output=JSON]` | the final answer is `JSON` (for a task with an `output_schema`) |
//! | `[mock:output_first=JSON]` | the first final answer is `JSON` (say, a wrong one), later ones `output` |
//! | `[mock:tool_turns=N]` | the first `N` turns answer with tool calls instead of text |
//! | `[mock:tool=NAME]` | the tool to call (default: the first tool offered, else `lookup`); `A,B` calls each in turn |
//! | `[mock:parallel=K]` | tool calls per tool turn (default 1, at least one per named tool) |
//! | `[mock:args=JSON]` | arguments of each tool call (default `{"turn": N, "call": K}`) |
//! | `[mock:calls=JSON]` | a list of `{"tool": NAME, "args": {…}}`: turn `N` makes the `N`th call, then the final answer |
//! | `[mock:loop]` | never give a final answer (every turn calls a tool with the same arguments) |
//! | `[mock:delay_ms=N]` | wait `N` ms before answering |
//! | `[mock:fail=KIND]` | every call fails: `429`, `500`, `529`, `400`, `timeout`, `protocol` |
//! | `[mock:stream_ms=N]` | the final answer is written word by word, `N` ms apart, as a streamed answer is (live output) |
//!
//! Usage is deterministic: input tokens = characters of the conversation / 4, output
//! tokens = characters of the answer / 4 (at least 1). Priced like a small model.

use std::time::Duration;

use super::{ChatRequest, ChatResponse, FinishReason, LlmError, LlmErrorKind, Message, Provider, ToolCall, Usage};

pub struct MockProvider;

#[derive(Debug, Default)]
struct Script {
    reply: Option<String>,
    output: Option<String>,
    output_first: Option<String>,
    tool_turns: u32,
    tool: Option<String>,
    parallel: u32,
    args: Option<serde_json::Value>,
    calls: Vec<(String, serde_json::Value)>,
    looping: bool,
    delay_ms: u64,
    fail: Option<String>,
    stream_ms: Option<u64>,
}

/// Each `[mock:…]` of `text`: where it stands, and its body (`None` when it is not closed: it
/// then runs to the end of the text). Values may hold brackets (JSON args): the closing bracket
/// is matched by depth.
fn spans(text: &str) -> Vec<(std::ops::Range<usize>, Option<&str>)> {
    let mut out = vec![];
    let mut from = 0;
    while let Some(i) = text[from..].find("[mock:") {
        let (start, body) = (from + i, from + i + 6);
        let mut depth = 1;
        let mut end = None;
        for (j, c) in text[body..].char_indices() {
            match c {
                '[' => depth += 1,
                ']' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(body + j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else {
            out.push((start..text.len(), None));
            break;
        };
        out.push((start..end + 1, Some(&text[body..end])));
        from = end + 1;
    }
    out
}

fn directives(text: &str) -> Vec<(String, String)> {
    spans(text)
        .into_iter()
        .filter_map(|(_, body)| body)
        .map(|body| {
            let (k, v) = body.split_once('=').unwrap_or((body, ""));
            (k.trim().to_string(), v.to_string())
        })
        .collect()
}

/// The text with every directive removed.
fn strip_directives(text: &str) -> String {
    let mut out = String::new();
    let mut last = 0;
    for (r, _) in spans(text) {
        out.push_str(&text[last..r.start]);
        last = r.end;
    }
    out.push_str(&text[last..]);
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Script {
    fn parse(text: &str) -> Script {
        let mut s = Script { parallel: 1, ..Script::default() };
        for (k, v) in directives(text) {
            match k.as_str() {
                "reply" => s.reply = Some(v),
                "output" => s.output = Some(v.trim().to_string()),
                "output_first" => s.output_first = Some(v.trim().to_string()),
                "tool_turns" => s.tool_turns = v.trim().parse().unwrap_or(0),
                "tool" => s.tool = Some(v.trim().to_string()),
                "parallel" => s.parallel = v.trim().parse().unwrap_or(1).clamp(1, 16),
                "args" => s.args = serde_json::from_str(&v).ok(),
                "calls" => {
                    let list: Vec<serde_json::Value> = serde_json::from_str(&v).unwrap_or_default();
                    s.calls = list
                        .into_iter()
                        .map(|c| (c["tool"].as_str().unwrap_or("lookup").to_string(), c["args"].clone()))
                        .collect();
                }
                "loop" => s.looping = true,
                "delay_ms" => s.delay_ms = v.trim().parse().unwrap_or(0),
                "fail" => s.fail = Some(v.trim().to_string()),
                "stream_ms" => s.stream_ms = v.trim().parse().ok(),
                _ => {}
            }
        }
        s
    }
}

#[async_trait::async_trait]
impl Provider for MockProvider {
    fn name(&self) -> &str {
        "mock"
    }

    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        // The script is the latest user message with directives (else the latest): later user
        // messages without any (a repair, a re-ask) keep it. The turn is how many answers came
        // since.
        let is_user = |m: &Message| matches!(m, Message::User { .. });
        let scripted =
            req.messages.iter().rposition(|m| matches!(m, Message::User { content } if content.contains("[mock:")));
        let at = scripted.or_else(|| req.messages.iter().rposition(is_user));
        let prompt = match at.map(|i| &req.messages[i]) {
            Some(Message::User { content }) => content.as_str(),
            _ => "",
        };
        let since = at.map_or(&req.messages[..0], |i| &req.messages[i..]);
        let turn = since.iter().filter(|m| matches!(m, Message::Assistant { .. })).count() as u32;
        let finals_before = since
            .iter()
            .filter(|m| matches!(m, Message::Assistant { tool_calls, .. } if tool_calls.is_empty()))
            .count();
        let script = Script::parse(prompt);
        if script.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(script.delay_ms)).await;
        }
        if let Some(kind) = &script.fail {
            return Err(match kind.as_str() {
                "timeout" => LlmError::new(LlmErrorKind::Timeout, "mock: request timed out"),
                "protocol" => LlmError::new(LlmErrorKind::Protocol, "mock: malformed response body"),
                code => {
                    let status = code.parse().unwrap_or(500);
                    LlmError::from_status(status, format!("mock: provider answered HTTP {status}"), None)
                }
            });
        }
        let input_tokens = (req.messages.iter().map(Message::chars).sum::<usize>() as u64).div_ceil(4);
        if let Some((name, arguments)) = script.calls.get(turn as usize) {
            let call =
                ToolCall { id: format!("call_{}_1", turn + 1), name: name.clone(), arguments: arguments.clone() };
            let out = (name.len() + arguments.to_string().len()) as u64;
            return Ok(ChatResponse {
                text: None,
                tool_calls: vec![call],
                usage: Usage { input_tokens, output_tokens: out.div_ceil(4).max(1), ..Usage::default() },
                finish: FinishReason::ToolCalls,
                ..ChatResponse::default()
            });
        }
        if script.looping || turn < script.tool_turns {
            let names: Vec<String> = match &script.tool {
                Some(list) => list.split(',').map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect(),
                None => vec![req.tools.first().map_or_else(|| "lookup".to_string(), |t| t.name.clone())],
            };
            let names = if names.is_empty() { vec!["lookup".to_string()] } else { names };
            let calls = script.parallel.max(names.len() as u32);
            let tool_calls: Vec<ToolCall> = (0..calls)
                .map(|k| {
                    let name = names[k as usize % names.len()].clone();
                    let arguments = match (&script.args, script.looping) {
                        (Some(a), _) => a.clone(),
                        (None, true) => serde_json::json!({}),
                        (None, false) => serde_json::json!({ "turn": turn + 1, "call": k + 1 }),
                    };
                    ToolCall { id: format!("call_{}_{}", turn + 1, k + 1), name, arguments }
                })
                .collect();
            let out = tool_calls.iter().map(|t| t.name.len() + t.arguments.to_string().len()).sum::<usize>() as u64;
            return Ok(ChatResponse {
                text: None,
                tool_calls,
                usage: Usage { input_tokens, output_tokens: out.div_ceil(4).max(1), ..Usage::default() },
                finish: FinishReason::ToolCalls,
                ..ChatResponse::default()
            });
        }
        let structured = match (&script.output_first, &script.output) {
            (Some(first), _) if finals_before == 0 => Some(first.clone()),
            (_, Some(out)) => Some(out.clone()),
            (Some(first), None) => Some(first.clone()),
            (None, None) => None,
        };
        let text = structured.or(script.reply).unwrap_or_else(|| {
            let p: String = strip_directives(prompt).chars().take(200).collect();
            format!("Mock summary: {p}")
        });
        if let (Some(ms), Some(progress)) = (script.stream_ms, &req.progress) {
            // Word by word, as a provider streams it.
            for word in text.split_inclusive(' ') {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                progress.add_text(word);
            }
        }
        Ok(ChatResponse {
            usage: Usage { input_tokens, output_tokens: (text.len() as u64).div_ceil(4).max(1), ..Usage::default() },
            text: Some(text),
            ..ChatResponse::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(prompt: &str) -> ChatRequest {
        ChatRequest {
            model: "m".into(),
            messages: vec![Message::System { content: "s".into() }, Message::User { content: prompt.into() }],
            tools: std::sync::Arc::from(vec![]),
            ..ChatRequest::default()
        }
    }

    #[tokio::test]
    async fn default_reply_echoes_the_prompt_without_directives() {
        let prompt = "find foo [mock:delay_ms=1] please";
        let r = MockProvider.chat(&req(prompt)).await.unwrap();
        assert_eq!(r.text.as_deref(), Some("Mock summary: find foo please"));
        assert!(r.tool_calls.is_empty());
        assert_eq!(r.usage.input_tokens, (1 + prompt.len() as u64).div_ceil(4));
    }

    #[tokio::test]
    async fn tool_turns_then_reply_with_json_args() {
        let mut r = req(r#"go [mock:tool_turns=1] [mock:tool=get] [mock:args={"id":[1]}] [mock:reply=done]"#);
        let first = MockProvider.chat(&r).await.unwrap();
        assert_eq!(first.tool_calls[0].name, "get");
        assert_eq!(first.tool_calls[0].arguments, serde_json::json!({"id": [1]}));
        r.messages.push(Message::Assistant { content: None, tool_calls: first.tool_calls });
        let second = MockProvider.chat(&r).await.unwrap();
        assert_eq!(second.text.as_deref(), Some("done"));
    }

    #[tokio::test]
    async fn a_list_of_tools_calls_each_in_one_turn() {
        let r = MockProvider.chat(&req("[mock:tool_turns=1] [mock:tool=ask, fetch]")).await.unwrap();
        let names: Vec<&str> = r.tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["ask", "fetch"]);
        let r = MockProvider.chat(&req("[mock:tool_turns=1] [mock:tool=ask,fetch] [mock:parallel=3]")).await.unwrap();
        let names: Vec<&str> = r.tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["ask", "fetch", "ask"]);
    }

    #[tokio::test]
    async fn fail_directive_maps_to_error_kinds() {
        let e = MockProvider.chat(&req("[mock:fail=429]")).await.unwrap_err();
        assert_eq!(e.kind, LlmErrorKind::RateLimited);
        assert!(e.retryable());
        let e = MockProvider.chat(&req("[mock:fail=400]")).await.unwrap_err();
        assert!(!e.retryable());
        let e = MockProvider.chat(&req("[mock:fail=protocol]")).await.unwrap_err();
        assert_eq!(e.code(), "provider_protocol");
    }
}
