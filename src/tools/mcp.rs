//! MCP servers (Streamable HTTP) as tool sources, through the official SDK (`rmcp`):
//! `tools/list` to discover (cached by the caller), `tools/call` to run. A tool whose
//! `readOnlyHint` is true gets policy `auto`; every other tool `propose`.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::Value;

use super::{Caller, Policy, Target, ToolDef, ToolError, ToolOutput};
use crate::llm::ToolCall;

/// Name a discovered tool is offered under: `<source>__<tool>`.
pub fn offered_name(source: &str, tool: &str) -> String {
    format!("{source}__{tool}")
}

async fn connect(
    caller: &Caller,
    url: &str,
    headers: &[(String, String)],
) -> Result<rmcp::service::RunningService<rmcp::RoleClient, ()>, ToolError> {
    caller.allow.check_url(url).map_err(|e| ToolError::Mcp(e.to_string()))?;
    let mut custom = HashMap::new();
    for (k, v) in headers {
        let name =
            HeaderName::from_bytes(k.as_bytes()).map_err(|_| ToolError::Mcp(format!("bad header name {k:?}")))?;
        let value = HeaderValue::from_str(v).map_err(|_| ToolError::Mcp(format!("bad value for header {k:?}")))?;
        custom.insert(name, value);
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string()).custom_headers(custom);
    let transport = StreamableHttpClientTransport::with_client(caller.client.clone(), config);
    ().serve(transport).await.map_err(|e| ToolError::Mcp(format!("MCP handshake with {url} failed: {e}")))
}

/// `tools/list` of one server, as tool definitions named `<source>__<tool>`.
pub async fn discover(
    caller: &Caller,
    source: &str,
    url: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Result<Vec<ToolDef>, ToolError> {
    let work = async {
        let client = connect(caller, url, headers).await?;
        let tools = client.list_all_tools().await.map_err(|e| ToolError::Mcp(format!("tools/list failed: {e}")));
        let _ = client.cancel().await;
        tools
    };
    let tools = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| ToolError::Mcp(format!("MCP server {url} did not answer in time")))??;
    let mut out = vec![];
    for t in tools {
        let v = serde_json::to_value(&t).map_err(|e| ToolError::Mcp(e.to_string()))?;
        let name = v.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        let read_only = v.pointer("/annotations/readOnlyHint").and_then(Value::as_bool).unwrap_or(false);
        out.push(ToolDef {
            name: offered_name(source, &name),
            description: v.get("description").and_then(Value::as_str).unwrap_or_default().to_string(),
            parameters: v.get("inputSchema").cloned().unwrap_or_else(|| serde_json::json!({"type": "object"})),
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

/// `tools/call`; the result's text blocks (or structured content) become the tool result.
pub async fn call(
    caller: &Caller,
    url: &str,
    headers: &[(String, String)],
    tool: &str,
    call: &ToolCall,
    timeout: Duration,
) -> ToolOutput {
    let args = call.arguments.as_object().cloned().unwrap_or_default();
    let work = async {
        let client = connect(caller, url, headers).await?;
        let r = client
            .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
            .await
            .map_err(|e| ToolError::Mcp(format!("tools/call failed: {e}")));
        let _ = client.cancel().await;
        r
    };
    match tokio::time::timeout(timeout, work).await {
        Err(_) => ToolOutput {
            content: format!("tool {} timed out after {} ms", call.name, timeout.as_millis()),
            is_error: true,
        },
        Ok(Err(e)) => ToolOutput { content: format!("tool {}: {e}", call.name), is_error: true },
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
            ToolOutput { content, is_error }
        }
    }
}
