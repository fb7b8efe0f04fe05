//! Claude Code itself calls the MCP door's `task` tool: `claude -p` (`@anthropic-ai/claude-code`,
//! pinned in `tests/sdk/claude-code/package.json`) runs offline against a fake Anthropic Messages
//! API served here, with `--mcp-config` naming the real binary's `/mcp`.
//!
//! Needs `SUBAGENTD_CLAUDE_CODE`, the folder where that package is installed (`.ci/run` installs
//! it). Without it the test prints a notice and passes — unless `SUBAGENTD_REQUIRE_SDKS=1` (set
//! by `.ci/run`), which makes that a failure.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::fakes::serve_router;
use crate::helpers::*;
use crate::mcp::{key, replica};

const TOOL: &str = "mcp__subagentd__task";

/// Claude Code's native binary (the package's `bin/claude` is a link to it, made by its
/// postinstall script; called directly, it needs none).
fn claude() -> Option<PathBuf> {
    match std::env::var("SUBAGENTD_CLAUDE_CODE") {
        Ok(dir) => Some(PathBuf::from(dir).join("node_modules/@anthropic-ai/claude-code-linux-x64/claude")),
        Err(_) => {
            skipped(
                "SUBAGENTD_REQUIRE_SDKS",
                "the MCP door's test with Claude Code",
                "SUBAGENTD_CLAUDE_CODE is not set",
                "set it to a folder where tests/sdk/claude-code/package.json is installed (bash .ci/run does)",
            );
            None
        }
    }
}

/// The texts of the tool results in a Messages request, by the id of the tool use they answer.
fn tool_results(body: &Value) -> Vec<(String, String)> {
    let mut out = vec![];
    for m in body["messages"].as_array().into_iter().flatten() {
        for b in m["content"].as_array().into_iter().flatten().filter(|b| b["type"] == "tool_result") {
            let text = match &b["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"),
                _ => String::new(),
            };
            out.push((b["tool_use_id"].as_str().unwrap_or("").to_string(), text));
        }
    }
    out
}

fn sse(event: &str, data: Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

/// A fake model: it calls the MCP `task` tool when it is offered, then answers with what the tool
/// returned. Every request's body is kept.
async fn messages(State(seen): State<Arc<Mutex<Vec<Value>>>>, Json(body): Json<Value>) -> Response {
    seen.lock().unwrap().push(body.clone());
    let offered = body["tools"].as_array().into_iter().flatten().any(|t| t["name"] == TOOL);
    let block = match tool_results(&body).into_iter().find(|(id, _)| id.starts_with("toolu_task")) {
        Some((_, text)) => json!({"type": "text", "text": format!("The sub-agent answered: {text}")}),
        None if offered => json!({"type": "tool_use", "id": "toolu_task1", "name": TOOL, "input": {
            "subagent_type": "general", "description": "from claude code", "prompt": "hi [mock:reply=hello from subagentd]"}}),
        None => json!({"type": "text", "text": "ok"}),
    };
    let stop = if block["type"] == "tool_use" { "tool_use" } else { "end_turn" };
    let model = body["model"].as_str().unwrap_or("claude-fake").to_string();
    let usage = json!({"input_tokens": 10, "output_tokens": 12});
    if body["stream"] != true {
        let m = json!({"id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": [block],
                       "stop_reason": stop, "stop_sequence": null, "usage": usage});
        return Json(m).into_response();
    }
    let mut s = sse(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message",
        "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 1}}}),
    );
    let (start, delta) = match block["type"].as_str() {
        Some("tool_use") => (
            json!({"type": "tool_use", "id": block["id"], "name": TOOL, "input": {}}),
            json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
        ),
        _ => (json!({"type": "text", "text": ""}), json!({"type": "text_delta", "text": block["text"]})),
    };
    s += &sse("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": start}));
    s += &sse("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": delta}));
    s += &sse("content_block_stop", json!({"type": "content_block_stop", "index": 0}));
    s += &sse(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
        "usage": {"output_tokens": 12}}),
    );
    s += &sse("message_stop", json!({"type": "message_stop"}));
    ([("content-type", "text/event-stream")], s).into_response()
}

#[tokio::test]
async fn claude_code_calls_the_task_tool_offline_and_gets_the_answer() {
    let Some(bin) = claude() else { return };
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let seen = Arc::new(Mutex::new(vec![]));
    let app = Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(|| async { Json(json!({"input_tokens": 10})) }))
        .with_state(seen.clone());
    let fake = serve_router(app).await;
    let config = json!({"mcpServers": {"subagentd": {"type": "http", "url": format!("{}/mcp", r.base),
                                                      "headers": {"Authorization": format!("Bearer {a}")}}}});
    let home = tempfile::tempdir().unwrap();
    let out = tokio::task::spawn_blocking(move || {
        // Nothing of this machine's environment, and nothing but loopback to reach: no telemetry,
        // no update check, MCP tools offered to the model as tools (no tool search).
        Command::new(bin)
            .current_dir(home.path())
            .env_clear()
            .envs([
                ("PATH", "/usr/bin:/bin"),
                ("HOME", home.path().to_str().unwrap()),
                ("TERM", "dumb"),
                ("ANTHROPIC_BASE_URL", fake.as_str()),
                ("ANTHROPIC_API_KEY", "sk-fake"),
                ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
                ("DISABLE_TELEMETRY", "1"),
                ("DISABLE_AUTOUPDATER", "1"),
                ("DISABLE_ERROR_REPORTING", "1"),
                ("ENABLE_TOOL_SEARCH", "false"),
            ])
            .args(["-p", "Delegate this to a sub-agent with the task tool."])
            .args(["--mcp-config", &config.to_string(), "--allowedTools", TOOL, "--output-format", "json"])
            .output()
            .expect("run claude")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "claude failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert!(result["result"].as_str().unwrap_or("").contains("hello from subagentd"), "{result}");
    // The model was offered the door's tool, called it, and read its result.
    let bodies = seen.lock().unwrap().clone();
    assert!(bodies.iter().any(|b| !tool_results(b).is_empty()), "no tool result reached the model");
    let (status, summary): (String, Option<String>) =
        sqlx::query_as("SELECT status, summary FROM tasks WHERE description = 'from claude code' AND tenant = 'a'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), summary.as_deref()), ("completed", Some("hello from subagentd")));
}
