//! MCP servers (Streamable HTTP) as tool sources, through the official SDK (`rmcp`):
//! `tools/list` to discover (cached by the caller), `tools/call` to run. A tool whose
//! `readOnlyHint` is true gets policy `auto`; every other tool `propose`.
//!
//! Calls go over one session per server (URL and headers) and process, reused by every call
//! and opened again when it closes or fails; at most `CALLS_PER_SESSION` calls share it at once.
//! The session's transport carries `Subagent-Depth: 1` (so a server that calls back into
//! `POST /tasks` is refused, as for HTTP tools); each `tools/call` carries the call's
//! `traceparent` and idempotency key in its `_meta`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{CallToolRequestParams, RequestMetaObject};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::Value;
use tokio::sync::{Mutex, Semaphore};

use super::{Caller, Policy, Target, ToolDef, ToolError, ToolOutput};
use crate::llm::ToolCall;

/// Calls that may share one session at once; more wait for a turn.
pub const CALLS_PER_SESSION: usize = 32;

/// Sessions one process keeps open at once (each holds connections and a descriptor budget:
/// `http::capacity`). A new one closes an idle one beyond this; with none idle, the call fails.
pub const MAX_SESSIONS: usize = 64;

/// The longest tool name providers accept, and its characters (`[a-zA-Z0-9_-]`).
pub const MAX_TOOL_NAME: usize = 64;

/// Name a discovered tool is offered under: `<source>__<tool>`.
pub fn offered_name(source: &str, tool: &str) -> String {
    format!("{source}__{tool}")
}

/// Can providers take `name` as a tool name?
pub fn fits_providers(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOOL_NAME
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

type Client = RunningService<RoleClient, ()>;

struct Session {
    client: Client,
    permits: Semaphore,
}

/// One server's slot: its session, if open. Locked while a session is being opened, so that
/// calls to that server wait for it (and calls to other servers do not).
type Slot = Arc<Mutex<Option<Arc<Session>>>>;

/// This process's MCP sessions, by server.
#[derive(Default)]
pub struct Sessions {
    slots: std::sync::Mutex<HashMap<String, Slot>>,
}

impl Sessions {
    fn slot(&self, url: &str, headers: &[(String, String)]) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry(session_key(url, headers)).or_default().clone()
    }

    /// The server's open session, or a new one.
    async fn get(&self, caller: &Caller, url: &str, headers: &[(String, String)]) -> Result<Arc<Session>, ToolError> {
        let slot = self.slot(url, headers);
        let mut cur = slot.lock().await;
        if let Some(s) = cur.as_ref().filter(|s| !s.client.is_closed()) {
            return Ok(s.clone());
        }
        self.make_room(&slot)?;
        let s = Arc::new(Session {
            client: connect(caller, url, headers).await?,
            permits: Semaphore::new(CALLS_PER_SESSION),
        });
        *cur = Some(s.clone());
        Ok(s)
    }

    /// Below `MAX_SESSIONS` open sessions besides `mine`, closing idle ones (no call in flight)
    /// if need be; an error if every one is busy.
    fn make_room(&self, mine: &Slot) -> Result<(), ToolError> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut open: usize = 0;
        let mut idle = vec![];
        for (key, slot) in slots.iter() {
            if Arc::ptr_eq(slot, mine) {
                continue;
            }
            match slot.try_lock() {
                Ok(cur) => match cur.as_ref() {
                    Some(s) if Arc::strong_count(s) == 1 || s.client.is_closed() => {
                        open += 1;
                        idle.push(key.clone());
                    }
                    Some(_) => open += 1,
                    None => idle.push(key.clone()),
                },
                // Being opened, or closed, by another call.
                Err(_) => open += 1,
            }
        }
        let over = (open + 1).saturating_sub(MAX_SESSIONS);
        let mut closed = 0;
        for key in idle {
            let Some(slot) = slots.get(&key) else { continue };
            let Ok(mut cur) = slot.try_lock() else { continue };
            // Empty slots go; a session only while there are too many.
            if cur.is_some() && closed >= over {
                continue;
            }
            closed += usize::from(cur.take().is_some());
            drop(cur);
            slots.remove(&key);
        }
        if closed < over {
            return Err(ToolError::Mcp(format!(
                "this process has its {MAX_SESSIONS} MCP sessions open and busy; try again shortly"
            )));
        }
        Ok(())
    }

    /// Forget `s` (it failed): the next call opens a new session.
    async fn drop_session(&self, url: &str, headers: &[(String, String)], s: &Arc<Session>) {
        let slot = self.slot(url, headers);
        let mut cur = slot.lock().await;
        if cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, s)) {
            *cur = None;
        }
    }
}

fn session_key(url: &str, headers: &[(String, String)]) -> String {
    let mut h: Vec<String> = headers.iter().map(|(k, v)| format!("{}:{v}", k.to_ascii_lowercase())).collect();
    h.sort();
    format!("{url}\n{}", h.join("\n"))
}

async fn connect(caller: &Caller, url: &str, headers: &[(String, String)]) -> Result<Client, ToolError> {
    caller.allow.check_url(url).map_err(|e| ToolError::Mcp(e.to_string()))?;
    let mut custom = HashMap::new();
    for (k, v) in headers {
        let name =
            HeaderName::from_bytes(k.as_bytes()).map_err(|_| ToolError::Mcp(format!("bad header name {k:?}")))?;
        let value = HeaderValue::from_str(v).map_err(|_| ToolError::Mcp(format!("bad value for header {k:?}")))?;
        custom.insert(name, value);
    }
    // Every request of a session comes from a sub-agent: one level deep, like HTTP tool calls.
    custom.insert(HeaderName::from_static("subagent-depth"), HeaderValue::from_static("1"));
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string()).custom_headers(custom);
    let transport = StreamableHttpClientTransport::with_client(caller.client.clone(), config);
    ().serve(transport).await.map_err(|e| ToolError::Mcp(format!("MCP handshake with {url} failed: {e}")))
}

/// What `tools/list` found: the tools offered, and those left out because providers would
/// refuse their names (named, so the source's `last_error` can say so).
#[derive(Debug, Clone, Default)]
pub struct Discovered {
    pub tools: Vec<ToolDef>,
    pub left_out: Vec<String>,
}

impl Discovered {
    /// Why tools were left out, for the source's `last_error`.
    pub fn note(&self) -> Option<String> {
        (!self.left_out.is_empty()).then(|| {
            format!(
                "left out {} tool(s) whose offered name is longer than {MAX_TOOL_NAME} characters or has characters \
                 outside [a-zA-Z0-9_-] (providers refuse such names; a shorter source name may fit): {}",
                self.left_out.len(),
                self.left_out.join(", ")
            )
        })
    }
}

/// `tools/list` of one server, as tool definitions named `<source>__<tool>`.
pub async fn discover(
    caller: &Caller,
    source: &str,
    url: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Result<Discovered, ToolError> {
    let work = async {
        let client = connect(caller, url, headers).await?;
        let tools = client.list_all_tools().await.map_err(|e| ToolError::Mcp(format!("tools/list failed: {e}")));
        let _ = client.cancel().await;
        tools
    };
    let tools = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| ToolError::Mcp(format!("MCP server {url} did not answer in time")))??;
    let mut out = Discovered::default();
    for t in tools {
        let v = serde_json::to_value(&t).map_err(|e| ToolError::Mcp(e.to_string()))?;
        let name = v.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        let offered = offered_name(source, &name);
        if !fits_providers(&offered) {
            out.left_out.push(offered);
            continue;
        }
        let read_only = v.pointer("/annotations/readOnlyHint").and_then(Value::as_bool).unwrap_or(false);
        out.tools.push(ToolDef {
            name: offered,
            description: v.get("description").and_then(Value::as_str).unwrap_or_default().to_string(),
            parameters: std::sync::Arc::new(
                v.get("inputSchema").cloned().unwrap_or_else(|| serde_json::json!({"type": "object"})),
            ),
            policy: if read_only { Policy::Auto } else { Policy::Propose },
            target: Target::Mcp {
                source: source.to_string(),
                url: url.to_string(),
                tool: name,
                timeout_ms: timeout.as_millis() as u64,
            },
        });
    }
    Ok(out)
}

/// One `tools/call`, as the caller says where and with what.
pub struct McpCall<'a> {
    pub url: &'a str,
    pub headers: &'a [(String, String)],
    /// The tool as the server names it.
    pub tool: &'a str,
    pub call: &'a ToolCall,
    pub timeout: Duration,
    pub traceparent: Option<&'a str>,
    pub idempotency_key: String,
}

/// Why a call could not be made: the full chain, for the log and the source's `last_error`;
/// the model gets `ToolOutput`'s plain sentence.
pub type Unreachable = String;

/// `tools/call`; the result's text blocks (or structured content) become the tool result.
/// `Err` (besides the output the model sees) when the server could not be reached.
pub async fn call(caller: &Caller, c: McpCall<'_>) -> (ToolOutput, Option<Unreachable>) {
    let args = c.call.arguments.as_object().cloned().unwrap_or_default();
    let mut meta = RequestMetaObject::new();
    if let Some(tp) = c.traceparent {
        meta.set_traceparent(tp);
    }
    meta.0 .0.insert("idempotencyKey".into(), Value::String(c.idempotency_key.clone()));
    let mut params = CallToolRequestParams::new(c.tool.to_string()).with_arguments(args);
    params.meta = Some(meta);
    let work = async {
        // A session that closed or failed is opened again, once.
        for retry in [false, true] {
            let s = caller.mcp.get(caller, c.url, c.headers).await?;
            let _permit = s.permits.acquire().await.map_err(|e| ToolError::Mcp(e.to_string()))?;
            match s.client.call_tool(params.clone()).await {
                Ok(r) => return Ok(r),
                Err(e @ (ServiceError::TransportSend(_) | ServiceError::TransportClosed)) if !retry => {
                    tracing::debug!(error = %e, url = c.url, "MCP session failed; opening a new one");
                    caller.mcp.drop_session(c.url, c.headers, &s).await;
                }
                Err(e) => {
                    if matches!(e, ServiceError::TransportSend(_) | ServiceError::TransportClosed) {
                        caller.mcp.drop_session(c.url, c.headers, &s).await;
                    }
                    return Err(ToolError::Mcp(format!("tools/call failed: {e}")));
                }
            }
        }
        unreachable!("the loop returns")
    };
    let name = &c.call.name;
    match tokio::time::timeout(c.timeout, work).await {
        Err(_) => (
            ToolOutput {
                content: format!("tool {name} timed out after {} ms", c.timeout.as_millis()),
                is_error: true,
                detail: None,
            },
            None,
        ),
        Ok(Err(e)) => (
            ToolOutput {
                content: format!(
                    "The tool `{name}` could not be run: its tool server could not be reached. You may try it again \
                     later, or go on without it."
                ),
                is_error: true,
                detail: None,
            },
            Some(e.to_string()),
        ),
        Ok(Ok(result)) => {
            let v = serde_json::to_value(&result).unwrap_or(Value::Null);
            let is_error = v.get("isError").and_then(Value::as_bool).unwrap_or(false);
            let texts: Vec<String> = v
                .get("content")
                .and_then(Value::as_array)
                .map(|blocks| {
                    blocks
                        .iter()
                        .map(|b| match b.get("text").and_then(Value::as_str) {
                            Some(t) => t.to_string(),
                            None => b.to_string(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            let content = if texts.is_empty() {
                v.get("structuredContent").map(|s| s.to_string()).unwrap_or_default()
            } else {
                texts.join("\n")
            };
            (ToolOutput { content, is_error, detail: None }, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offered_names_must_fit_what_providers_accept() {
        assert!(fits_providers("docs__lookup"));
        assert!(fits_providers(&"a".repeat(64)));
        assert!(!fits_providers(&"a".repeat(65)));
        assert!(!fits_providers("docs__look.up"));
        assert!(!fits_providers("docs__look up"));
    }
}
