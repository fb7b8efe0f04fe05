//! The MCP door driven by the clients people use, against the real binary: the OpenAI Agents
//! SDK's `MCPServerStreamableHttp` with its default timeouts, LangChain's
//! `langchain-mcp-adapters` and fastmcp's `Client` (`tests/sdk/mcp_clients.py`, pinned in
//! `tests/sdk/mcp-clients-requirements.txt`).
//!
//! Needs `SUBAGENTD_MCP_CLIENTS_PYTHON`, a Python with those installed (`.ci/run` makes a virtual
//! environment of its own). Without it each test prints a notice and passes — unless
//! `SUBAGENTD_REQUIRE_SDKS=1` (set by `.ci/run`), which makes that a failure.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;
use crate::mcp::{key, replica, run_script};

fn python() -> Option<PathBuf> {
    match std::env::var("SUBAGENTD_MCP_CLIENTS_PYTHON") {
        Ok(p) => Some(PathBuf::from(p)),
        Err(_) => {
            skipped(
                "SUBAGENTD_REQUIRE_SDKS",
                "the MCP door's tests with the OpenAI Agents SDK, langchain-mcp-adapters and fastmcp",
                "SUBAGENTD_MCP_CLIENTS_PYTHON is not set",
                "set it to a Python with tests/sdk/mcp-clients-requirements.txt installed (bash .ci/run does)",
            );
            None
        }
    }
}

async fn client(scenario: &str, url: &str, key: &str) -> Option<Value> {
    let p = python()?;
    let args = vec![scenario.into(), "--url".into(), url.into(), "--key".into(), key.into()];
    Some(run_script(p, "mcp_clients.py", args, vec![]).await)
}

#[tokio::test]
async fn the_openai_agents_sdk_delegates_in_the_background_and_its_given_up_call_is_cancelled_with_its_session() {
    if python().is_none() {
        return;
    }
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let out = client("agents_sdk", &format!("{}/mcp", r.base), &a).await.unwrap();
    assert!(out["final"].as_str().unwrap().contains("answer from the background"), "{out}");
    assert!(out["waits"].as_u64().unwrap() >= 1, "followed with task_wait: {out}");
    // The background task ran to its end; the call the SDK gave up on (no cancel sent) was
    // cancelled when the SDK ended its session.
    let bg: String = sqlx::query_scalar("SELECT status FROM tasks WHERE description = 'from the agents sdk'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(bg, "completed");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let s: String = sqlx::query_scalar("SELECT status FROM tasks WHERE description = 'given up by the agents sdk'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        if s == "cancelled" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the given-up call's task is {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(tasks, 2, "no retry started a second task");
}

#[tokio::test]
async fn langchains_adapters_and_fastmcp_list_and_call_task() {
    if python().is_none() {
        return;
    }
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let url = format!("{}/mcp", r.base);
    let lc = client("langchain", &url, &a).await.unwrap();
    assert!(lc["text"].as_str().unwrap().contains("hello from langchain"), "{lc}");
    let fm = client("fastmcp", &url, &a).await.unwrap();
    assert_eq!(fm["text"], "hello from fastmcp");
    assert!(fm["progress"].as_array().unwrap().len() >= 2, "{fm}");
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'completed'").fetch_one(&db.pool).await.unwrap();
    assert_eq!(done, 3);
}
