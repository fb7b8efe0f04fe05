//! A dead worker is noticed by its database session, not its lease: kill -9 under load with the
//! default 30 s lease, measured from the kill to each interrupted task's next provider call; the
//! calls a lost worker had in flight are in the ledger (at least what the provider served, at
//! most what was reserved); and a worker that is merely paused past its lease is fenced off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::{Json, Router};
use rand::Rng;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::fakes::serve_router;
use crate::helpers::*;

/// What the fake provider served, by task (its prompt's `job N`): (input, output) tokens.
type Served = Arc<Mutex<HashMap<String, (u64, u64)>>>;

/// An OpenAI-compatible provider that answers three tool calls, then a final answer, each after
/// `delay`, counting each call's usage on arrival (a call whose worker dies was still served).
async fn provider(delay: Duration) -> (Served, String) {
    let served: Served = Arc::default();
    let s = served.clone();
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |Json(body): Json<Value>| {
            let s = s.clone();
            async move {
                let msgs = body["messages"].as_array().cloned().unwrap_or_default();
                let job = msgs.iter().find(|m| m["role"] == "user").and_then(|m| m["content"].as_str()).unwrap_or("").to_string();
                let tools_done = msgs.iter().filter(|m| m["role"] == "tool").count();
                let (input, output) = (100 + 10 * msgs.len() as u64, 20);
                {
                    let mut s = s.lock().unwrap();
                    let e = s.entry(job).or_default();
                    e.0 += input;
                    e.1 += output;
                }
                tokio::time::sleep(delay).await;
                let message = if tools_done < 3 {
                    json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{}", tools_done + 1), "type": "function",
                            "function": {"name": "t", "arguments": "{}"}}]})
                } else {
                    json!({"role": "assistant", "content": "done"})
                };
                let finish = if tools_done < 3 { "tool_calls" } else { "stop" };
                Json(json!({"id": "x", "object": "chat.completion", "model": "m",
                            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                            "usage": {"prompt_tokens": input, "completion_tokens": output}}))
            }
        }),
    );
    let tool = Router::new().route("/t", post(|| async { Json(json!({"content": "ok"})) }));
    let base = serve_router(app.merge(tool)).await;
    (served, base)
}

/// A config file for the fake provider (priced, so that spend can be checked).
fn config(base: &str) -> (tempfile_path::TempPath, subagentd::llm::Providers) {
    let text = format!(
        "[providers.local]\nkind = \"openai\"\nbase_url = \"{base}/v1\"\nstream = false\n\n[pricing]\n\"local/m\" = {{ input = 1, output = 2 }}\n"
    );
    let path = tempfile_path::TempPath::new("toml");
    std::fs::write(&path.0, &text).unwrap();
    let file: subagentd::config::FileConfig = toml::from_str(&text).unwrap();
    (path, subagentd::llm::Providers::from_config(&file, &|_| None).unwrap())
}

mod tempfile_path {
    /// A file path in the temp directory, removed when dropped.
    pub struct TempPath(pub std::path::PathBuf);
    impl TempPath {
        pub fn new(ext: &str) -> TempPath {
            TempPath(std::env::temp_dir().join(format!("subagentd-{}.{ext}", uuid::Uuid::new_v4().simple())))
        }
        pub fn as_str(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

async fn open_count(app: &TestApp, ids: &[Uuid]) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM tasks WHERE id = ANY($1) AND status IN ('queued', 'running')")
        .bind(ids)
        .fetch_one(&app.db.pool)
        .await
        .unwrap()
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else {
        v[((v.len() - 1) as f64 * p).round() as usize]
    }
}

#[tokio::test]
async fn kill_dash_nine_with_the_default_lease_resumes_in_seconds_and_every_served_call_is_in_the_ledger() {
    let (served, base) = provider(Duration::from_millis(300)).await;
    let (cfg_path, providers) = config(&base);
    let app = spawn_app_opts(
        |c| c.tool_allow = "*, 127.0.0.1/32".into(),
        AppOptions { workers: false, providers, ..AppOptions::default() },
    )
    .await;
    let env: Vec<(&str, &str)> = vec![
        ("SUBAGENTD_CONFIG", cfg_path.as_str()),
        ("SUBAGENTD_TOOL_ALLOW", "*, 127.0.0.1/32"),
        ("SUBAGENTD_LEASE_SECONDS", "30"),
        ("SUBAGENTD_HEARTBEAT_SECONDS", "10"),
        ("SUBAGENTD_MAX_ATTEMPTS", "50"),
    ];
    let mut workers: Vec<Proc> = (0..3).map(|_| spawn_binary(&["worker"], &app.db.url, &env)).collect();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let tool =
        json!({"name": "t", "parameters": {"type": "object"}, "policy": "auto", "endpoint": format!("{base}/t")});
    let mut ids = vec![];
    for i in 0..45 {
        let t = app
            .submit(json!({"prompt": format!("job {i}"), "model": "local/m", "max_turns": 10, "tools": [tool]}))
            .await;
        ids.push(t["id"].as_str().unwrap().parse::<Uuid>().unwrap());
    }
    let mut kills: Vec<(chrono::DateTime<chrono::Utc>, u32)> = vec![];
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(rand::thread_rng().gen_range(400..1200))).await;
        let i = rand::thread_rng().gen_range(0..workers.len());
        let pid = workers[i].child.id();
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let _ = workers[i].child.wait();
        kills.push((chrono::Utc::now(), pid));
        workers[i] = spawn_binary(&["worker"], &app.db.url, &env);
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    while open_count(&app, &ids).await > 0 {
        assert!(Instant::now() < deadline, "tasks left unfinished after the kills");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let not_done: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE id = ANY($1) AND status <> 'completed'")
        .bind(&ids)
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(not_done, 0);

    // Kill → the interrupted task's next provider call.
    let host = std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "host".into());
    let mut gaps = vec![];
    for (at, pid) in &kills {
        let worker = format!("{host}-{pid}");
        let next: Vec<Option<f64>> = sqlx::query_scalar(
            "SELECT extract(epoch FROM (SELECT min(s.created_at) FROM task_event_log s WHERE s.task_id = c.task_id
                 AND s.kind = 'llm_call_started' AND s.created_at > $2) - $2)::float8 * 1000
             FROM task_event_log c WHERE c.kind = 'claimed' AND c.data->>'worker' = $1 AND c.task_id = ANY($3)
               AND NOT EXISTS (SELECT 1 FROM task_event_log f WHERE f.task_id = c.task_id AND f.kind = 'finished'
                               AND f.created_at < $2)
               AND NOT EXISTS (SELECT 1 FROM task_event_log r WHERE r.task_id = c.task_id AND r.seq > c.seq
                               AND r.kind IN ('claimed', 'released') AND r.created_at < $2)",
        )
        .bind(&worker)
        .bind(at)
        .bind(&ids)
        .fetch_all(&app.db.pool)
        .await
        .unwrap();
        gaps.extend(next.into_iter().flatten());
    }
    assert!(!gaps.is_empty(), "no kill interrupted a run");
    let (p50, max) = (pct(&mut gaps, 0.5), pct(&mut gaps, 1.0));

    // The ledger holds at least what the provider served for each task, and costs at most what
    // was reserved.
    let ledger: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT t.prompt, sum(l.input_tokens)::bigint, sum(l.output_tokens)::bigint FROM llm_calls l JOIN tasks t ON t.id = l.task_id
         WHERE t.id = ANY($1) GROUP BY t.prompt",
    )
    .bind(&ids)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    let served = served.lock().unwrap().clone();
    let (mut served_total, mut ledger_total) = (0u64, 0u64);
    for (prompt, inp, out) in &ledger {
        let (si, so) = served.get(prompt).copied().unwrap_or_default();
        served_total += si + so;
        ledger_total += (*inp + *out) as u64;
        assert!(*inp as u64 >= si && *out as u64 >= so, "{prompt}: ledger {inp}/{out} < served {si}/{so}");
    }
    let (spent, reserved, interrupted): (f64, f64, i64) = sqlx::query_as(
        "SELECT (SELECT coalesce(sum(cost_usd), 0)::float8 FROM llm_calls WHERE task_id = ANY($1)),
                (SELECT coalesce(sum((data->>'reserved_usd')::numeric), 0)::float8 FROM task_event_log
                 WHERE kind = 'llm_call_started' AND task_id = ANY($1)),
                (SELECT count(*) FROM llm_calls WHERE task_id = ANY($1) AND outcome = 'interrupted' AND usage_estimated)",
    )
    .bind(&ids)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert!(spent <= reserved + 1e-9, "spent {spent} over the reserved bounds {reserved}");
    assert!(interrupted > 0, "the kills interrupted calls in flight");
    println!(
        "RELIABILITY liveness: tasks={} kills={} interrupted_runs={} kill_to_next_call_p50_ms={p50:.0} max_ms={max:.0} \
         provider_tokens={served_total} ledger_tokens={ledger_total} interrupted_calls_recorded={interrupted}",
        ids.len(),
        kills.len(),
        gaps.len()
    );
}

#[tokio::test]
async fn a_worker_paused_past_its_lease_is_fenced_off_when_it_wakes() {
    let (_served, base) = provider(Duration::from_millis(150)).await;
    let (cfg_path, providers) = config(&base);
    let app = spawn_app_opts(
        |c| c.tool_allow = "*, 127.0.0.1/32".into(),
        AppOptions { workers: false, providers, ..AppOptions::default() },
    )
    .await;
    let env: Vec<(&str, &str)> = vec![
        ("SUBAGENTD_CONFIG", cfg_path.as_str()),
        ("SUBAGENTD_TOOL_ALLOW", "*, 127.0.0.1/32"),
        ("SUBAGENTD_LEASE_SECONDS", "2"),
        ("SUBAGENTD_HEARTBEAT_SECONDS", "1"),
    ];
    let mut paused = spawn_binary(&["worker"], &app.db.url, &env);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let tool =
        json!({"name": "t", "parameters": {"type": "object"}, "policy": "auto", "endpoint": format!("{base}/t")});
    let mut ids = vec![];
    for i in 0..6 {
        let t = app
            .submit(json!({"prompt": format!("job {i}"), "model": "local/m", "max_turns": 10, "tools": [tool]}))
            .await;
        ids.push(t["id"].as_str().unwrap().parse::<Uuid>().unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Stopped, not dead: its session stays, so only the lease can take its runs away.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(paused.child.id() as i32, libc::SIGSTOP) };
    let other = spawn_binary(&["worker"], &app.db.url, &env);
    tokio::time::sleep(Duration::from_secs(4)).await;
    unsafe { libc::kill(paused.child.id() as i32, libc::SIGCONT) };
    let deadline = Instant::now() + Duration::from_secs(60);
    while open_count(&app, &ids).await > 0 {
        assert!(Instant::now() < deadline, "tasks left unfinished");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let twice: Vec<(Uuid, i32, i64)> = sqlx::query_as(
        "SELECT task_id, turn, count(*) FROM llm_calls WHERE outcome = 'ok' AND task_id = ANY($1)
         GROUP BY task_id, turn HAVING count(*) > 1",
    )
    .bind(&ids)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    assert!(twice.is_empty(), "the woken worker's late writes were fenced off: {twice:?}");
    let finished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM task_event_log WHERE kind = 'finished' AND task_id = ANY($1)")
            .bind(&ids)
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    assert_eq!(finished, ids.len() as i64, "each task finished once");
    let taken: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT task_id) FROM task_event_log WHERE kind = 'rescued' AND task_id = ANY($1)",
    )
    .bind(&ids)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert!(taken > 0, "the stopped worker's runs were taken over when its lease ran out");
    drop(other);
    let _ = paused.child.kill();
}
