//! The A2A door driven by the clients people use, against the real binary
//! (`tests/sdk/a2a_clients.py`): Google ADK's `RemoteA2aAgent` run through ADK's `Runner`, with
//! ADK 2.x on a2a-sdk 1.x (A2A 1.0) and with ADK 1.x on a2a-sdk 0.3 (A2A 0.3), and a2a-sdk
//! 0.3's own client sending, getting and cancelling. Each set of clients is pinned in a virtual
//! environment of its own (`tests/sdk/adk2-requirements.txt`, `tests/sdk/a2a03-requirements.txt`:
//! a2a-sdk 0.3 and 1.x cannot share one).
//!
//! Needs `SUBAGENTD_ADK2_PYTHON` and `SUBAGENTD_A2A03_PYTHON` (`.ci/run` makes both). Without
//! them each test prints a notice and passes — unless `SUBAGENTD_REQUIRE_SDKS=1` (set by
//! `.ci/run`), which makes that a failure.

use std::path::PathBuf;

use serde_json::Value;

use crate::helpers::*;
use crate::mcp::{key, replica, run_script};

fn python(var: &str, what: &str) -> Option<PathBuf> {
    match std::env::var(var) {
        Ok(p) => Some(PathBuf::from(p)),
        Err(_) => {
            skipped(
                "SUBAGENTD_REQUIRE_SDKS",
                what,
                &format!("{var} is not set"),
                "set it to a Python with the clients' requirements installed (bash .ci/run does)",
            );
            None
        }
    }
}

async fn client(p: PathBuf, scenario: &str, url: &str, key: &str) -> Value {
    client_over(p, scenario, url, key, "jsonrpc").await
}

async fn client_over(p: PathBuf, scenario: &str, url: &str, key: &str, transport: &str) -> Value {
    let args = vec![
        scenario.into(),
        "--url".into(),
        url.into(),
        "--key".into(),
        key.into(),
        "--transport".into(),
        transport.into(),
    ];
    let out = run_script(p, "a2a_clients.py", args, vec![]).await;
    assert_eq!(out["ok"], true, "{out}");
    out
}

/// The A2A versions the client's requests named (none: 0.3), and its JSON-RPC methods.
fn wire(out: &Value) -> (Vec<String>, Vec<String>) {
    let reqs: Vec<&Value> = out["wire"].as_array().unwrap().iter().filter(|w| w["rpc"].is_string()).collect();
    let versions = reqs.iter().map(|w| w["a2a_version"].as_str().unwrap_or("none").to_string()).collect();
    let methods = reqs.iter().map(|w| w["rpc"].as_str().unwrap().to_string()).collect();
    (versions, methods)
}

#[tokio::test]
async fn adk_2_on_a2a_sdk_1_delegates_in_a2a_1_0() {
    let Some(p) = python("SUBAGENTD_ADK2_PYTHON", "the A2A door's test with Google ADK 2 (a2a-sdk 1.x)") else {
        return;
    };
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let out = client(p, "adk", &r.base, &a).await;
    assert!(out["final_text"].as_str().unwrap().contains("hello from adk"), "{out}");
    let (versions, methods) = wire(&out);
    assert!(versions.iter().all(|v| v == "1.0"), "{versions:?}");
    assert!(methods.iter().all(|m| !m.contains('/')), "1.0 method names: {methods:?}");
    let done: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'completed' AND tenant = 'a'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(done, 1);
}

#[tokio::test]
async fn adk_1_and_a2a_sdk_0_3_send_get_and_cancel_in_a2a_0_3() {
    let Some(p) = python("SUBAGENTD_A2A03_PYTHON", "the A2A door's tests with ADK 1 and a2a-sdk 0.3") else {
        return;
    };
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let out = client(p.clone(), "adk", &r.base, &a).await;
    assert!(out["final_text"].as_str().unwrap().contains("hello from adk"), "{out}");
    let (versions, methods) = wire(&out);
    assert!(versions.iter().all(|v| v == "none"), "0.3 clients name no version: {versions:?}");
    assert_eq!(methods, vec!["message/send"], "ADK 1 sends a blocking message/send");
    // Over HTTP+JSON too (0.3's protobuf bodies on the same paths).
    let rest = client_over(p.clone(), "sdk03", &r.base, &a, "rest").await;
    assert_eq!(rest["transport"], "RestTransport", "{rest}");
    assert!(rest["blocking"]["text"].as_str().unwrap().contains("hello from sdk03"), "{rest}");
    assert_eq!(rest["nonblocking"]["state"], "canceled", "{rest}");
    let out = client(p, "sdk03", &r.base, &a).await;
    assert!(out["blocking"]["text"].as_str().unwrap().contains("hello from sdk03"), "{out}");
    assert_eq!(out["nonblocking"]["state"], "canceled", "{out}");
    let (_, methods) = wire(&out);
    for m in ["message/send", "tasks/get", "tasks/cancel"] {
        assert!(methods.iter().any(|x| x == m), "{m} in {methods:?}");
    }
    let id = out["nonblocking"]["task_id"].as_str().unwrap();
    let status: String =
        sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1::uuid").bind(id).fetch_one(&db.pool).await.unwrap();
    assert_eq!(status, "cancelled", "the same task, cancelled in the room");
}
