//! The MCP door as the clients people use reach it: sessions that live as long as a client keeps
//! them (Claude Code keeps its session id for the life of a terminal), `task` in the seed's full
//! shape (`run_in_background`, `resume`), calls held as long as the client hears progress, and a
//! session its client ends taking the tasks of its calls in flight with it. Raw JSON-RPC against
//! the real binary where the point is what the server does; the official TypeScript SDK for the
//! long call a client resets its timeout on.

use std::time::Duration;

use serde_json::{json, Value};
use subagentd::jobs::retention::{Purged, Retention};

use crate::helpers::*;
use crate::mcp::{key, node_modules, post, py, replica, run_node, scalar};

async fn initialize(base: &str, key: &str, capabilities: Value) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-11-25", "capabilities": capabilities,
                                 "clientInfo": {"name": "raw", "version": "1"}}});
    let r = post(base, key, None, &[], init).await;
    assert_eq!(r.status(), 200);
    r.headers()["mcp-session-id"].to_str().unwrap().to_string()
}

fn call(id: Value, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "task", "arguments": args}})
}

async fn status_of(db: &TestDb, id: &str) -> String {
    scalar(db, "SELECT status FROM tasks WHERE id = $1", id).await
}

async fn until_status(db: &TestDb, id: &str, want: &str, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let s = status_of(db, id).await;
        if s == want {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "task {id} is {s}, not {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pass(db: &TestDb) -> Retention {
    // Conversation and ledger retention off: the sessions' purge runs all the same.
    Retention { pool: db.pool.clone(), days: 0, ledger_days: 0, mcp_idle_days: 30, every: Duration::from_secs(1) }
}

#[tokio::test]
async fn a_session_outlives_the_old_purge_an_unknown_id_is_adopted_and_an_ended_one_is_404() {
    let db = test_db().await;
    // The session cache is a few seconds: each step below waits it out where it matters.
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let (a, b) = (key(&r.base, "a").await, key(&r.base, "b").await);
    let sid = initialize(&r.base, &a, json!({"elicitation": {}})).await;
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
    let set_seen = |days: i32| {
        let (pool, sid) = (db.pool.clone(), sid.clone());
        async move {
            sqlx::query("UPDATE mcp_sessions SET last_seen_at = now() - make_interval(days => $1) WHERE id = $2")
                .bind(days)
                .bind(sid)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    // Idle two days (the old purge took a day): kept, and served with what the client said it
    // can do.
    set_seen(2).await;
    assert_eq!(pass(&db).pass().await.unwrap(), Purged { partitions: 0, ledger_partitions: 0, sessions: 0 });
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(post(&r.base, &a, Some(&sid), &[], ping.clone()).await.status(), 200);
    let caps: Value = sqlx::query_scalar("SELECT client_capabilities FROM mcp_sessions WHERE id = $1")
        .bind(&sid)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(caps, json!({"elicitation": {}}));
    // Idle past the setting's 30 days: purged, then adopted afresh by the next request from the
    // same tenant's key (no client capabilities), while another tenant's key gets 404.
    set_seen(31).await;
    assert_eq!(pass(&db).pass().await.unwrap().sessions, 1);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_sessions").fetch_one(&db.pool).await.unwrap();
    assert_eq!(left, 0);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let pong: Value = post(&r.base, &a, Some(&sid), &[], ping.clone()).await.json().await.unwrap();
    assert_eq!(pong["result"], json!({}));
    let (tenant, caps): (String, Value) =
        sqlx::query_as("SELECT tenant, client_capabilities FROM mcp_sessions WHERE id = $1")
            .bind(&sid)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((tenant.as_str(), caps), ("a", json!({})));
    assert_eq!(post(&r.base, &b, Some(&sid), &[], ping.clone()).await.status(), 404, "another tenant's");
    // The adopted session works as any: a call runs its task.
    let done: Value = post(
        &r.base,
        &a,
        Some(&sid),
        &[],
        call(
            json!(3),
            json!({"subagent_type": "general", "description": "after",
            "prompt": "p [mock:reply=still here]"}),
        ),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(done["result"]["content"][0]["text"], "still here", "{done}");
    // A NUL cannot be stored: refused, named, whatever the method.
    let nul = json!({"jsonrpc": "2.0", "id": 9, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
        "capabilities": {}, "clientInfo": {"name": "a\u{0}b", "version": "1"}}});
    let v: Value = post(&r.base, &a, None, &[], nul).await.json().await.unwrap();
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("clientInfo.name"), "{v}");
    // An id not of the service's making is never adopted.
    assert_eq!(post(&r.base, &a, Some("nosuch"), &[], ping.clone()).await.status(), 404);
    // Ended by its client: 404 from then on, as the spec says, and not adopted.
    let end =
        || reqwest::Client::new().delete(format!("{}/mcp", r.base)).bearer_auth(&a).header("mcp-session-id", &sid);
    assert_eq!(end().send().await.unwrap().status(), 204);
    let gone = post(&r.base, &a, Some(&sid), &[], ping.clone()).await;
    assert_eq!(gone.status(), 404);
    assert_eq!(gone.json::<Value>().await.unwrap()["error"]["code"], -32001);
    assert_eq!(end().send().await.unwrap().status(), 404);
}

#[tokio::test]
async fn background_calls_answer_at_once_resume_continues_and_ending_a_session_cancels_only_calls_in_flight() {
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m"), ("SUBAGENTD_MCP_WAIT_SECONDS", "40")]).await;
    let a = key(&r.base, "a").await;
    let sid = initialize(&r.base, &a, json!({})).await;
    // run_in_background: the id at once, and how to follow it.
    let bg = call(
        json!("bg"),
        json!({"subagent_type": "general", "description": "in the background",
        "prompt": "p [mock:delay_ms=6000] [mock:reply=done on its own]", "run_in_background": true}),
    );
    let t0 = std::time::Instant::now();
    let started: Value = post(&r.base, &a, Some(&sid), &[], bg.clone()).await.json().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3), "a background call waited {:?}", t0.elapsed());
    let res = &started["result"];
    assert_eq!(res["isError"], false, "{started}");
    let bg_id = res["structuredContent"]["task_id"].as_str().unwrap().to_string();
    assert!(["queued", "running"].contains(&res["structuredContent"]["status"].as_str().unwrap()));
    let text = res["content"][0]["text"].as_str().unwrap();
    assert!(text.contains(&bg_id) && text.contains("task_wait") && text.contains("task_get"), "{text}");
    // Its retry (the same request id) is the same task.
    let again: Value = post(&r.base, &a, Some(&sid), &[], bg).await.json().await.unwrap();
    assert_eq!(again["result"]["structuredContent"]["task_id"], bg_id.as_str());
    // A held call, whose client gives up without a cancel (the OpenAI Agents SDK after 5 s).
    let held = call(
        json!("held"),
        json!({"subagent_type": "general", "description": "held",
        "prompt": "p [mock:delay_ms=30000]"}),
    );
    let (base, key2, sid2) = (r.base.clone(), a.clone(), sid.clone());
    let pending = tokio::spawn(async move { post(&base, &key2, Some(&sid2), &[], held).await });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let held_id: String = loop {
        let id: Option<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM tasks WHERE description = 'held'")
            .fetch_optional(&db.pool)
            .await
            .unwrap();
        if let Some(id) = id {
            break id.to_string();
        }
        assert!(std::time::Instant::now() < deadline, "the held call started no task");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let noted: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_calls WHERE session_id = $1")
        .bind(&sid)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(noted, 1, "only the held call is in flight");
    pending.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The client ends its session: the held call's task is cancelled, the background one runs on.
    let end = reqwest::Client::new().delete(format!("{}/mcp", r.base)).bearer_auth(&a).header("mcp-session-id", &sid);
    assert_eq!(end.send().await.unwrap().status(), 204);
    until_status(&db, &held_id, "cancelled", Duration::from_secs(15)).await;
    assert_ne!(status_of(&db, &bg_id).await, "cancelled");
    until_status(&db, &bg_id, "completed", Duration::from_secs(30)).await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_calls").fetch_one(&db.pool).await.unwrap();
    assert_eq!(left, 0);
    // A call that answers is no longer in flight: ending its session leaves its task alone.
    let sid = initialize(&r.base, &a, json!({})).await;
    let quick: Value = post(
        &r.base,
        &a,
        Some(&sid),
        &[],
        call(
            json!(1),
            json!({"subagent_type": "general",
        "description": "quick", "prompt": "p [mock:reply=quick]"}),
        ),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(quick["result"]["content"][0]["text"], "quick");
    let noted: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_calls").fetch_one(&db.pool).await.unwrap();
    assert_eq!(noted, 0);
    // resume: the finished background task goes on with its conversation, as resume_from.
    let resumed: Value = post(
        &r.base,
        &a,
        Some(&sid),
        &[],
        call(
            json!(2),
            json!({"description": "more",
        "prompt": "and then? [mock:reply=more of it]", "resume": bg_id}),
        ),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(resumed["result"]["content"][0]["text"], "more of it", "{resumed}");
    let child = resumed["result"]["structuredContent"]["task_id"].as_str().unwrap().to_string();
    let (parent, agent): (Option<uuid::Uuid>, String) =
        sqlx::query_as("SELECT parent_task_id, subagent_type FROM tasks WHERE id = $1::uuid")
            .bind(&child)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((parent.map(|p| p.to_string()), agent.as_str()), (Some(bg_id.clone()), "general"));
    // A resume the room refuses says why and starts nothing.
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    for (resume, says) in [("nope", "resume: not a task id"), (&*uuid::Uuid::new_v4().to_string(), "to resume")] {
        let v: Value = post(
            &r.base,
            &a,
            Some(&sid),
            &[],
            call(
                json!(resume),
                json!({"subagent_type": "general",
            "description": "bad", "prompt": "p", "resume": resume}),
            ),
        )
        .await
        .json()
        .await
        .unwrap();
        assert_eq!(v["result"]["isError"], true, "{v}");
        assert!(v["result"]["content"][0]["text"].as_str().unwrap().contains(says), "{v}");
    }
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(before, after);
}

/// A call with a progress token is told it is alive from its start: while its task is being made
/// (here its insert held 17 s by a trigger, as a busy database or a slow admission holds it), a
/// notification every 15 s, not only once the task runs.
#[tokio::test]
async fn a_call_with_a_progress_token_hears_from_the_start_while_its_task_is_being_made() {
    let db = test_db().await;
    hold_inserts(&db.pool, "task_queue", 17.0).await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let Some(out) = py("slow_start", &format!("{}/mcp", r.base), &a, &[]).await else { return };
    assert!(out["seconds"].as_f64().unwrap() >= 17.0, "the insert was held: {out}");
    let first = &out["progress"][0];
    assert_eq!(first[1], "starting", "{out}");
    assert!(first[0].as_f64().unwrap() < 17.0, "heard from before the task was made: {out}");
}

#[tokio::test]
async fn a_client_that_resets_its_timeout_on_progress_gets_a_three_minute_tasks_answer_in_one_call() {
    let Some(modules) = node_modules() else { return };
    let db = test_db().await;
    let r = replica(&db, &[("SUBAGENTD_DEFAULT_MODEL", "mock/m")]).await;
    let a = key(&r.base, "a").await;
    let out = run_node(&modules, "mcp_client.mjs", vec!["long".into(), format!("{}/mcp", r.base), a]).await;
    assert_eq!(out["text"], "worth the wait", "{out}");
    assert_eq!(out["status"], "completed");
    assert!(out["ms"].as_u64().unwrap() >= 180_000, "{out}");
    assert!(out["max_gap_ms"].as_u64().unwrap() <= 20_000, "progress at least every 20 s: {out}");
    assert_eq!(out["growing"], true, "{out}");
}

#[tokio::test]
async fn a_database_from_before_session_life_migrates_with_every_session_kept_and_live() {
    let db = test_db().await;
    let old = database_before(&db, 26).await;
    let pool = old.pool.clone();
    sqlx::query(
        "INSERT INTO mcp_sessions (id, tenant, protocol_version, client_capabilities)
         VALUES ('s1', 'acme', '2025-11-25', '{\"elicitation\": {}}')",
    )
    .execute(&pool)
    .await
    .unwrap();
    subagentd::db::MIGRATOR.run(&pool).await.unwrap();
    match subagentd::store::mcp::get(&pool, "acme", "s1").await.unwrap() {
        subagentd::store::mcp::Found::Live(s) => assert_eq!(s.client_capabilities, json!({"elicitation": {}})),
        other => panic!("the session is {other:?}, not live"),
    }
    let calls: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_calls").fetch_one(&pool).await.unwrap();
    assert_eq!(calls, 0);
    old.drop().await;
}
