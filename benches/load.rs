//! The load harness: starts its own PostgreSQL, a fake OpenAI-compatible provider and a tool
//! server on loopback, runs the real `subagentd` binary against them, measures, and writes
//! BENCHMARKS.md.
//!
//! cargo bench --bench load                 # every scenario, then BENCHMARKS.md
//! cargo bench --bench load -- throughput   # one scenario: throughput, concurrency, wait, admission, pgbench,
//!                                          # waitsat, mcp, a2a, holds, live, priority, connections, flood, webfetch, workspace (and on request:
//!                                          # soak, console, history)
//! BENCH_HISTORY_TASKS=N                    # history: N finished tasks of history (default 1,000,000)
//! BENCH_SCHEDULED=N                        # throughput with N tasks scheduled a day ahead beside it
//! BENCH_STREAM_PIECES=N                    # the fake streams its final answers in N pieces (when asked to stream)

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use subagentd::db::embedded::{EmbeddedOptions, EmbeddedPostgres};

/// Provider calls in progress at the fake provider, and their peak.
static CALLS_IN_FLIGHT: AtomicU64 = AtomicU64::new(0);
static CALLS_PEAK: AtomicU64 = AtomicU64::new(0);

struct InFlight;

impl InFlight {
    fn enter() -> InFlight {
        let n = CALLS_IN_FLIGHT.fetch_add(1, Ordering::Relaxed) + 1;
        CALLS_PEAK.fetch_max(n, Ordering::Relaxed);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        CALLS_IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The time the fake provider itself took (its sleep's overshoot included), in ms, summed per
/// `run:<id>` named in the task's prompt: wait mode's overhead is measured over this.
static PROVIDER_MS: Mutex<Option<std::collections::HashMap<String, f64>>> = Mutex::new(None);

/// Every this many provider calls, one answers 503 (0: never): the soak's provider errors.
static ERROR_EVERY: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Pieces the fake streams a final answer in, when the request asks for a stream (0: it answers
/// one JSON body, as a server that ignores `stream` does), and the gap between them in ms. Set by
/// `BENCH_STREAM_PIECES` / `BENCH_STREAM_GAP_MS`, or by a scenario.
static STREAM_PIECES: AtomicU64 = AtomicU64::new(0);
static STREAM_GAP_MS: AtomicU64 = AtomicU64::new(0);

/// A final answer as OpenAI-compatible Server-Sent Events: `pieces` content deltas `gap_ms` apart.
fn streamed_answer(pieces: u64, gap_ms: u64) -> axum::response::Response {
    use axum::response::IntoResponse;
    let chunk = |v: Value| axum::body::Bytes::from(format!("data: {v}\n\n"));
    let stream = futures_util::stream::unfold(0u64, move |i| async move {
        let item = match i {
            i if i < pieces => {
                if gap_ms > 0 && i > 0 {
                    tokio::time::sleep(Duration::from_millis(gap_ms)).await;
                }
                chunk(json!({"choices": [{"index": 0, "delta": {"content": format!("word{i} ")}}]}))
            }
            i if i == pieces => chunk(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                                             "usage": {"prompt_tokens": 100, "completion_tokens": pieces, "total_tokens": 100 + pieces}})),
            i if i == pieces + 1 => axum::body::Bytes::from("data: [DONE]\n\n"),
            _ => return None,
        };
        Some((Ok::<_, std::convert::Infallible>(item), i + 1))
    });
    let mut r = axum::body::Body::from_stream(stream).into_response();
    r.headers_mut().insert("content-type", axum::http::HeaderValue::from_static("text/event-stream"));
    r
}

/// The fake provider: a tool call first (unless the prompt says `no-tools`), then an answer.
async fn fake_chat(latency: Arc<AtomicU64>, Json(req): Json<Value>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let _in_flight = InFlight::enter();
    let t = Instant::now();
    let ms = latency.load(Ordering::Relaxed);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let every = ERROR_EVERY.load(Ordering::Relaxed);
    if every > 0 && CALLS.fetch_add(1, Ordering::Relaxed) % every == every - 1 {
        let body = json!({"error": {"message": "overloaded", "type": "server_error"}});
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    let msgs = req["messages"].as_array().cloned().unwrap_or_default();
    let last = msgs.last().cloned().unwrap_or(Value::Null);
    let user = msgs.iter().find(|m| m["role"] == "user").map(|m| m["content"].to_string()).unwrap_or_default();
    if let Some(id) =
        user.split("run:").nth(1).and_then(|r| r.split(|c: char| !c.is_ascii_alphanumeric() && c != '-').next())
    {
        let took = t.elapsed().as_secs_f64() * 1000.0;
        *PROVIDER_MS.lock().unwrap().get_or_insert_with(Default::default).entry(id.to_string()).or_default() += took;
    }
    let usage = json!({"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110});
    // `webfetch:<url>`: the built-in web_fetch of that page, then an answer.
    if let Some(url) = user.split("webfetch:").nth(1).and_then(|r| r.split([' ', '"', '\\']).next()) {
        if last["role"] == "user" {
            let args = json!({"url": url}).to_string();
            return Json(
                json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "web_fetch", "arguments": args}}]}}],
                "usage": usage}),
            )
            .into_response();
        }
    }
    // `grepws:<pattern>`: the built-in grep over the task's workspace, then an answer.
    if let Some(pattern) = user.split("grepws:").nth(1).and_then(|r| r.split([' ', '"', '\\']).next()) {
        if last["role"] == "user" {
            let args = json!({"pattern": pattern}).to_string();
            return Json(
                json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "grep", "arguments": args}}]}}],
                "usage": usage}),
            )
            .into_response();
        }
    }
    if last["role"] == "user" && !user.contains("no-tools") {
        return Json(
            json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": "{\"q\":\"x\"}"}}]}}],
            "usage": usage}),
        )
        .into_response();
    }
    let pieces = STREAM_PIECES.load(Ordering::Relaxed);
    if pieces > 0 && req["stream"] == true {
        return streamed_answer(pieces, STREAM_GAP_MS.load(Ordering::Relaxed));
    }
    Json(
        json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "done"}}], "usage": usage}),
    )
    .into_response()
}

async fn serve(app: Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    // As a real provider's server would: no Nagle delay on small responses.
    let l = axum::serve::ListenerExt::tap_io(l, |s: &mut tokio::net::TcpStream| {
        let _ = s.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    format!("http://{addr}")
}

struct Env {
    pg: EmbeddedPostgres,
    latency: Arc<AtomicU64>,
    provider: String,
    tools: String,
    dir: std::path::PathBuf,
}

struct Svc {
    child: Child,
    base: String,
    db_url: String,
}

impl Drop for Svc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The service binary: this build's, or `BENCH_BIN` (to measure another build with the same
/// harness, side by side).
fn service_binary() -> String {
    std::env::var("BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_subagentd").to_string())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Env {
    async fn start() -> Env {
        let dir = std::env::temp_dir().join(format!("subagentd-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        // pg_stat_statements: the report names the statements that cost the most.
        let opts = EmbeddedOptions {
            data_dir: dir.join("pg"),
            bin_dir: None,
            fast_unsafe: false,
            max_connections: 300,
            // The log (pg.log next to the data directory) names what PostgreSQL did and when:
            // every autovacuum, checkpoint, lock wait and statement over 500 ms, so that a slow
            // minute in the soak can be lined up with it.
            settings: vec![
                "shared_preload_libraries=pg_stat_statements".into(),
                "log_autovacuum_min_duration=0".into(),
                "log_lock_waits=on".into(),
                "log_min_duration_statement=500".into(),
                "log_line_prefix=%m [%p] ".into(),
                "track_io_timing=on".into(),
                "track_wal_io_timing=on".into(),
            ]
            .into_iter()
            // The claim's planning time apart from its execution, for the history scenario only
            // (it costs every statement a little).
            .chain(std::env::args().any(|a| a == "history").then(|| "pg_stat_statements.track_planning=on".to_string()))
            // More of PostgreSQL's settings, for experiments: `BENCH_PG_SETTINGS='autovacuum=off;work_mem=8MB'`.
            .chain(
                std::env::var("BENCH_PG_SETTINGS")
                    .unwrap_or_default()
                    .split(';')
                    .filter(|s| !s.is_empty())
                    .map(String::from),
            )
            .collect(),
        };
        let pg = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&opts)).await.unwrap().unwrap();
        let latency = Arc::new(AtomicU64::new(0));
        let l2 = latency.clone();
        let provider =
            serve(Router::new().route("/v1/chat/completions", post(move |b| fake_chat(l2.clone(), b)))).await;
        let tools = serve(
            Router::new()
                .route("/echo", post(|| async { Json(json!({"content": "ok"})) }))
                .route("/page", axum::routing::get(|| async { axum::response::Html(page_1mb()) })),
        )
        .await;
        Env { pg, latency, provider, tools, dir }
    }

    /// A fresh database and the real binary serving it. Earlier scenarios' databases are
    /// dropped and a checkpoint taken first, so that their leftovers (autovacuum, dirty pages
    /// flushed by a checkpoint) do not land in this scenario's measurement.
    async fn service(&self, name: &str, args: &[&str], env: &[(&str, String)]) -> Svc {
        let admin = subagentd::db::connect(&self.pg.url("postgres"), 1).await.unwrap();
        let old: Vec<String> = sqlx::query_scalar("SELECT datname::text FROM pg_database WHERE datname LIKE 'bench%'")
            .fetch_all(&admin)
            .await
            .unwrap();
        for db in old {
            sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).execute(&admin).await.unwrap();
        }
        sqlx::query("CHECKPOINT").execute(&admin).await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.unwrap();
        admin.close().await;
        let db_url = self.pg.local_url(name);
        let cfg = self.dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[providers.fake]\nkind = \"openai\"\nbase_url = \"{}/v1\"\ntimeout_seconds = 600\n{}\n",
                self.provider,
                // More of the provider's settings, for experiments (e.g. `max_connections = 64`).
                std::env::var("BENCH_PROVIDER_TOML").unwrap_or_default()
            ),
        )
        .unwrap();
        let port = free_port();
        let mut cmd = Command::new(service_binary());
        cmd.args(args)
            .env("DATABASE_URL", &db_url)
            .env("SUBAGENTD_CONFIG", &cfg)
            .env("SUBAGENTD_LISTEN", format!("127.0.0.1:{port}"))
            .env("SUBAGENTD_TOOL_ALLOW", "*, 127.0.0.1/32")
            .env("SUBAGENTD_POLL_INTERVAL_MS", "200")
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        pass_service_settings(&mut cmd);
        let child = cmd.spawn().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let c = reqwest::Client::new();
        for _ in 0..200 {
            if c.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let r = c
            .put(format!("{base}/tools/echo"))
            .json(&json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": format!("{}/echo", self.tools)}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "tool registration failed");
        // SQL to run once the service has migrated its database, for experiments (e.g. dropping
        // an index to measure what it costs).
        if let Ok(sql) = std::env::var("BENCH_SQL_AFTER_START") {
            let pool = subagentd::db::connect(&db_url, 1).await.unwrap();
            sqlx::raw_sql(&sql).execute(&pool).await.unwrap();
            pool.close().await;
        }
        Svc { child, base, db_url }
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn rss_peak_mib(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map_or(f64::NAN, |k| k / 1024.0)
}

async fn counts(pool: &sqlx::PgPool) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status IN ('queued','running')),
                count(*) FILTER (WHERE status IN ('failed','incomplete','cancelled')) FROM tasks",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn commits(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(pool)
        .await
        .unwrap()
}

type Report = Arc<Mutex<Vec<String>>>;

/// BENCH_SVC_X=v runs the service (or worker) under test with X=v: for trying settings without
/// editing.
fn pass_service_settings(cmd: &mut Command) {
    for (k, v) in std::env::vars() {
        if let Some(k) = k.strip_prefix("BENCH_SVC_") {
            cmd.env(k, v);
        }
    }
}

/// Start counting statements afresh (`print_top_statements` reads them).
async fn reset_statement_stats(pool: &sqlx::PgPool) {
    let _ = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").execute(pool).await;
    let _ = sqlx::query("SELECT pg_stat_statements_reset()").execute(pool).await;
}

/// CPU seconds used so far by PostgreSQL (every `postgres` process) and by the process `pid`.
fn cpu_seconds(pid: u32) -> (f64, f64) {
    let hz = 100.0; // USER_HZ on Linux
    let (mut pg, mut svc) = (0.0, 0.0);
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Ok(p) = name.parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let ticks = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
            + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        if &stat[open + 1..close] == "postgres" {
            pg += ticks / hz;
        } else if p == pid {
            svc += ticks / hz;
        }
    }
    (pg, svc)
}

/// The statements that took the most server time, per completed task.
async fn print_top_statements(pool: &sqlx::PgPool, tasks: i64) {
    let rows: Vec<(String, i64, f64, f64)> = sqlx::query_as(
        "SELECT regexp_replace(left(query, 90), '\\s+', ' ', 'g'), calls, total_exec_time, mean_exec_time
         FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 15",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    let hot: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables ORDER BY n_tup_ins + n_tup_upd DESC LIMIT 6",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    println!("table: inserts, updates (HOT) {hot:?}");
    println!("statement | calls per task | server ms per task | mean ms");
    for (q, calls, total, mean) in rows {
        let n = tasks.max(1) as f64;
        println!("{q} | {:.2} | {:.3} | {mean:.3}", calls as f64 / n, total / n);
    }
}

/// 1. Tasks/s completed end to end, background mode, one tool call then an answer, 0 ms provider.
async fn throughput(env: &Env, report: &Report, secs: u64) {
    env.latency.store(0, Ordering::Relaxed);
    let svc = throughput_service(env, "bench_tp").await;
    let pool = subagentd::db::connect(&svc.db_url, 2).await.unwrap();
    // Tasks waiting for a time a day ahead, beside the load (`BENCH_SCHEDULED`): what they cost
    // while they wait.
    if let Some(n) = std::env::var("BENCH_SCHEDULED").ok().and_then(|v| v.parse::<i64>().ok()) {
        sqlx::query(
            "INSERT INTO tasks (id, tenant, subagent_type, prompt, model, options, metadata, status, run_at, last_event_seq)
             SELECT gen_random_uuid(), 'default', 'general', 'later', 'fake/gpt-4o', '{\"max_turns\": 5}', '{}',
                    'scheduled', now() + interval '1 day' + make_interval(secs => g), 0
             FROM generate_series(1, $1) AS g",
        )
        .bind(n)
        .execute(&pool)
        .await
        .unwrap();
        let _ = sqlx::query("ANALYZE tasks").execute(&pool).await;
        println!("{n} scheduled tasks wait beside the load");
    }
    let d = drive(&svc, &pool, secs).await;
    let (rate, el) = (d.rate, d.el);
    let line = format!(
        "| 1. Throughput (background, 1 tool call + answer, provider 0 ms) | ≥ 500 tasks/s for 60 s | **{rate:.0} tasks/s** over {el:.0} s ({} completed; {} open at the end, {} not completed) | {} |",
        d.completed,
        d.open,
        d.bad,
        if rate >= 500.0 { "met" } else { "not met" }
    );
    println!("{line}\nDB transactions per completed task (incl. submission): {:.1}", d.per_task);
    let scenario = match STREAM_PIECES.load(Ordering::Relaxed) {
        0 => "throughput".to_string(),
        n => format!("throughput_stream{n}"),
    };
    record(
        &scenario,
        serde_json::json!({"tasks_per_s": (rate * 10.0).round() / 10.0, "seconds": el.round(), "completed": d.completed,
                           "not_completed": d.bad, "db_transactions_per_task": (d.per_task * 10.0).round() / 10.0}),
    );
    report.lock().unwrap().push(line);
    report.lock().unwrap().push(format!("@per_task {:.1}", d.per_task));
}

/// The admin token of the services that the console's reads are measured on.
const BENCH_ADMIN: &str = "bench-admin";

/// The throughput scenario's service: 256 runs at once, 40 connections (and an admin token, for
/// the history scenario's reads).
async fn throughput_service(env: &Env, name: &str) -> Svc {
    env.service(
        name,
        &["serve"],
        &[
            ("SUBAGENTD_MAX_RUNNING", "256".into()),
            ("SUBAGENTD_DB_MAX_CONNECTIONS", "40".into()),
            ("SUBAGENTD_ADMIN_TOKEN", BENCH_ADMIN.into()),
        ],
    )
    .await
}

/// What one throughput run measured.
struct Driven {
    rate: f64,
    el: f64,
    completed: i64,
    open: i64,
    bad: i64,
    per_task: f64,
}

/// Tasks finished since `since` (completed, and not completed), and those open now.
async fn counts_since(pool: &sqlx::PgPool, since: chrono::DateTime<chrono::Utc>) -> (i64, i64, i64) {
    // The time written into the statement, not bound: a generic plan for `finished_at >= $1`
    // scans the whole history (6 s at 10M tasks). Open tasks counted in the queue alone: as a history run began,
    // 360,000 blocks of the month partitions were read from disk, most likely by this count over `tasks`.
    let at = since.to_rfc3339();
    sqlx::query_as(&format!(
        "SELECT (SELECT count(*) FROM tasks WHERE finished_at >= '{at}' AND status = 'completed'),
                (SELECT count(*) FROM task_queue WHERE status IN ('queued', 'running')),
                (SELECT count(*) FROM tasks WHERE finished_at >= '{at}' AND status IN ('failed', 'incomplete', 'cancelled'))"
    ))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Scenario 1's load against `svc` for `secs` after a 5 s warm-up: 32 submitters keeping a
/// backlog of about 3,000, one tool call then an answer per task. Counts through the finished
/// index (not the whole table), so a database full of history is measured the same way.
async fn drive(svc: &Svc, pool: &sqlx::PgPool, secs: u64) -> Driven {
    let client = reqwest::Client::new();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let submitted = Arc::new(AtomicU64::new(0));
    // Keep a backlog, not a flood: the workers, not the queue, are measured. One poller counts
    // the queue ten times a second (its cost stays out of the per-task figures); submitters
    // wait while it is over the line.
    let backlog = Arc::new(AtomicU64::new(0));
    let poller = {
        let (stop, backlog, pool) = (stop.clone(), backlog.clone(), pool.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let open: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'queued'")
                    .fetch_one(&pool)
                    .await
                    .unwrap_or(0);
                backlog.store(open.max(0) as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut subs = vec![poller];
    for _ in 0..32 {
        let (c, base, stop, n, backlog) =
            (client.clone(), svc.base.clone(), stop.clone(), submitted.clone(), backlog.clone());
        subs.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if backlog.load(Ordering::Relaxed) > 3000 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let r =
                    c.post(format!("{base}/tasks")).json(&json!({"prompt": "go", "model": "fake/gpt-4o"})).send().await;
                if r.is_ok_and(|r| r.status() == 201) {
                    n.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Warm-up, 5 s unless `BENCH_WARM_SECS` says otherwise (the history scenario's database
    // comes freshly vacuumed: its first inserts fill the gaps the vacuum recorded in old pages).
    let warm = std::env::var("BENCH_WARM_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    tokio::time::sleep(Duration::from_secs(warm)).await;
    reset_statement_stats(pool).await;
    let since: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await.unwrap();
    let x0 = commits(pool).await;
    let cpu0 = cpu_seconds(svc.child.id());
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let el = t0.elapsed().as_secs_f64();
    let x1 = commits(pool).await;
    let cpu1 = cpu_seconds(svc.child.id());
    let (completed, open, bad) = counts_since(pool, since).await;
    stop.store(true, Ordering::Relaxed);
    for s in subs {
        let _ = s.await;
    }
    let rate = completed as f64 / el;
    print_top_statements(pool, completed).await;
    let per_task = (x1 - x0) as f64 / completed.max(1) as f64;
    let n = completed.max(1) as f64;
    let (pg_ms, svc_ms) = ((cpu1.0 - cpu0.0) * 1000.0 / n, (cpu1.1 - cpu0.1) * 1000.0 / n);
    println!(
        "CPU per completed task: PostgreSQL {pg_ms:.2} ms, service {svc_ms:.2} ms (PostgreSQL {:.0}%, service {:.0}% of one core)",
        (cpu1.0 - cpu0.0) / el * 100.0,
        (cpu1.1 - cpu0.1) / el * 100.0
    );
    Driven { rate, el, completed, open, bad, per_task }
}

/// The claim's two statements (the tenant walk, then the count and pick), per claim: calls, mean
/// planning ms, mean execution ms (pg_stat_statements with `track_planning`).
async fn claim_stats(pool: &sqlx::PgPool) -> (i64, f64, f64) {
    // Each statement's buffers, WAL and I/O time per call: where its time goes.
    type Costs = (String, i64, f64, f64, f64, f64, f64, f64, f64);
    let each: Vec<Costs> = sqlx::query_as(
        "SELECT left(query, 20), calls, total_plan_time / calls, total_exec_time / calls,
                shared_blks_hit::float8 / calls, shared_blks_read::float8 / calls, shared_blks_dirtied::float8 / calls,
                wal_fpi::float8 / calls, (blk_read_time + blk_write_time) / calls
         FROM pg_stat_statements WHERE (query LIKE 'WITH RECURSIVE qt AS%' OR query LIKE 'WITH lim AS%') AND calls > 0",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for (q, calls, plan, exec, hit, read, dirtied, fpi, io) in each {
        println!(
            "claim statement {q:?}: {calls} calls, planning {plan:.3} ms, execution {exec:.3} ms; per call {hit:.0} buffers hit, {read:.1} read, {dirtied:.1} dirtied, {fpi:.2} WAL full pages, {io:.3} ms I/O"
        );
    }
    sqlx::query_as(
        "WITH s AS (SELECT query, calls, total_plan_time, total_exec_time FROM pg_stat_statements
                    WHERE query LIKE 'WITH RECURSIVE qt AS%' OR query LIKE 'WITH lim AS%')
         SELECT coalesce(max(calls) FILTER (WHERE query LIKE 'WITH RECURSIVE%'), 0)::int8,
                coalesce(sum(total_plan_time) / nullif(max(calls) FILTER (WHERE query LIKE 'WITH RECURSIVE%'), 0), 0)::float8,
                coalesce(sum(total_exec_time) / nullif(max(calls) FILTER (WHERE query LIKE 'WITH RECURSIVE%'), 0), 0)::float8
         FROM s",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The month partitions of `tasks` and the ledger's day partitions for the last `days` days
/// (finished tasks and their calls are written there).
async fn month_partitions(pool: &sqlx::PgPool, days: i32) {
    for sql in [
        "SELECT subagentd_month_partition('tasks', d::date)
         FROM generate_series(now() - make_interval(days => $1), now(), interval '1 day') d",
        "SELECT subagentd_partition('llm_calls', d::date)
         FROM generate_series((now() AT TIME ZONE 'UTC')::date - $1, (now() AT TIME ZONE 'UTC')::date, interval '1 day') d",
    ] {
        sqlx::query(sql).bind(days).execute(pool).await.unwrap();
    }
}

/// The days the history scenario's tasks span.
const DAYS: f64 = 40.0;

/// Fill `n` finished tasks of history over 20 tenants and 40 days (ids ordered by time as the
/// service's are), two ledger rows each, and events and messages in the soak's proportions (11
/// and 5 per task) for the most recent `recent` (the rest as retention leaves them). In SQL, a
/// million at a time. Returns the days the recent tasks span.
async fn fill_history(pool: &sqlx::PgPool, n: i64, recent: i64) -> f64 {
    let t = Instant::now();
    sqlx::query("INSERT INTO tenants (name) SELECT 'h' || lpad(g::text, 2, '0') FROM generate_series(1, 20) g ON CONFLICT DO NOTHING")
        .execute(pool)
        .await
        .unwrap();
    month_partitions(pool, DAYS as i32 + 1).await;
    // Every task's options, stored once as the service stores them (migration 0036).
    sqlx::query(
        "INSERT INTO task_options (hash, options) SELECT sha256(convert_to(o::text, 'UTF8')), o
         FROM (SELECT '{\"max_turns\": 5}'::jsonb AS o) x ON CONFLICT DO NOTHING",
    )
    .execute(pool)
    .await
    .unwrap();
    let step = 1_000_000i64;
    let mut from = 1i64;
    while from <= n {
        let to = (from + step - 1).min(n);
        // The tasks and their two ledger rows each, in one statement (the ledger reads the
        // tasks it writes for from the insert itself).
        sqlx::query(
            "WITH t AS (
                INSERT INTO tasks (id, tenant, status, subagent_type, prompt, model, options, options_sha256, metadata, created_at, started_at,
                                   finished_at, history_at, summary, stop_reason, turns, input_tokens, output_tokens, cost_usd, attempt,
                                   last_event_seq)
                SELECT (lpad(to_hex((extract(epoch FROM ts) * 1000)::int8), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
                       'h' || lpad((g % 20 + 1)::text, 2, '0'), CASE WHEN g % 50 = 0 THEN 'cancelled' ELSE 'completed' END,
                       'general', 'go', 'fake/gpt-4o', NULL, sha256(convert_to('{\"max_turns\": 5}'::jsonb::text, 'UTF8')), '{}', ts, ts,
                       ts + interval '40 ms', ts + interval '40 ms',
                       CASE WHEN g % 50 = 0 THEN NULL ELSE 'done' END,
                       CASE WHEN g % 50 = 0 THEN 'cancelled' ELSE 'final_answer' END, 2, 240, 60, 0.0009, 1, 11
                FROM (SELECT g, now() - interval '1 hour' - (($3 - g)::float8 / $3) * make_interval(days => $4) AS ts,
                             md5(g::text) AS h FROM generate_series($1::int8, $2::int8) g) s
                RETURNING id, tenant, created_at
             )
             INSERT INTO llm_calls (call_key, task_id, tenant, turn, attempt, try, provider, model, input_tokens,
                                    output_tokens, cost_usd, latency_ms, outcome, created_at)
             SELECT key, id, tenant, k, 1, 1, 'fake', 'gpt-4o', 120, 30, 0.00045, 1, 'ok', subagentd_uuid_time(key)
             FROM (SELECT subagentd_uuidv7(t.created_at + k * interval '10 ms') AS key, t.*, k
                   FROM t, generate_series(1, 2) k) c",
        )
        .bind(from)
        .bind(to)
        .bind(n)
        .bind(DAYS as i32)
        .execute(pool)
        .await
        .unwrap();
        println!("history: {to} of {n} tasks and their ledger rows in {:.0} s", t.elapsed().as_secs_f64());
        from = to + 1;
    }
    let span = DAYS * recent.min(n) as f64 / n as f64;
    // Partitions for the days the recent tasks' events and messages were written on.
    sqlx::query(
        "SELECT subagentd_partition(p, d::date) FROM unnest(ARRAY['task_events', 'task_messages']) p,
                generate_series((now() AT TIME ZONE 'UTC')::date - $1, (now() AT TIME ZONE 'UTC')::date, interval '1 day') d",
    )
    .bind(span.ceil() as i32 + 1)
    .execute(pool)
    .await
    .unwrap();
    let recent_ids = "SELECT id, created_at FROM tasks WHERE tenant LIKE 'h%' ORDER BY created_at DESC LIMIT $1";
    sqlx::query(&format!(
        "INSERT INTO task_events (task_id, seq, kind, data, earlier, created_at)
         SELECT t.id, r.k, r.kind, d.d,
                (SELECT jsonb_agg(jsonb_build_array(ek, d.d) ORDER BY o) FROM unnest(r.ek) WITH ORDINALITY AS u(ek, o))::json,
                t.created_at + r.k * interval '3 ms'
         FROM ({recent_ids}) t,
              -- The soak's 11 events in its 7 rows (a statement's events share one).
              (VALUES (1, 'created', '{{}}'::text[]), (2, 'claimed', '{{}}'), (3, 'llm_call_started', '{{}}'),
                      (5, 'tool_calls_started', '{{llm_call_finished}}'), (7, 'checkpoint', '{{tool_call_finished}}'),
                      (8, 'llm_call_started', '{{}}'), (11, 'finished', '{{llm_call_finished,checkpoint}}')) r(k, kind, ek),
              LATERAL (SELECT jsonb_build_object('turn', (r.k + 1) / 5, 'model', 'fake/gpt-4o', 'input_tokens', 120,
                                                 'output_tokens', 30, 'latency_ms', 1, 'outcome', 'ok', 'attempt', 1,
                                                 'worker', 'w-' || substr(t.id::text, 1, 8)) AS d) d"
    ))
    .bind(recent)
    .execute(pool)
    .await
    .unwrap();
    const TEXT: &str = "The sub-agent works through the task and reports back. The sub-agent works through the task \
        and reports back. The sub-agent works through the task and reports back. The sub-agent works through the task and \
        reports back. ";
    sqlx::query(&format!(
        "INSERT INTO task_messages (task_id, seq, turn, message, earlier, created_at)
         SELECT t.id, r.k, r.turn, m.m[r.k],
                CASE WHEN r.k = 4 THEN to_jsonb(m.m[1:3]) END, t.created_at + r.k * interval '3 ms'
         FROM ({recent_ids}) t,
              -- The soak's 5 messages in its 2 rows (a checkpoint's messages share one).
              (VALUES (4, 1), (5, 2)) r(k, turn),
              -- The system message names its stored text (migration 0035).
              LATERAL (SELECT array_agg(CASE WHEN role = 'system'
                                  THEN jsonb_build_object('role', role, 'text_sha256', encode(sha256(convert_to($2::text, 'UTF8')), 'hex'))
                                  ELSE jsonb_build_object('role', role, 'content', $2::text) END ORDER BY o) AS m
                       FROM unnest(ARRAY['system', 'user', 'assistant', 'tool', 'assistant']) WITH ORDINALITY AS x(role, o)) m"
    ))
    .bind(recent)
    .bind(TEXT)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO message_texts (hash, content) VALUES (sha256(convert_to($1::text, 'UTF8')), $1) ON CONFLICT DO NOTHING")
        .bind(TEXT)
        .execute(pool)
        .await
        .unwrap();
    // Vacuumed as a history of that age would be: else autovacuum's first pass over the freshly
    // inserted partitions (tens of GB) runs during the measured load.
    sqlx::query("VACUUM (ANALYZE)").execute(pool).await.unwrap();
    sqlx::query("CHECKPOINT").execute(pool).await.unwrap();
    println!("history: filled in {:.0} s", t.elapsed().as_secs_f64());
    span
}

/// Scenario 17, history at scale (on request: `BENCH_HISTORY_TASKS=<n> cargo bench --bench load
/// -- history`; it needs tens of GB of disk at 10M): the throughput scenario on an empty database,
/// then on one holding `n` finished tasks of history; the claim's planning and execution apart;
/// then a retention pass with a window that expires part of the generated history.
async fn history(env: &Env, report: &Report, n: i64, secs: u64) {
    env.latency.store(0, Ordering::Relaxed);
    let recent = std::env::var("BENCH_HISTORY_RECENT").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let svc = throughput_service(env, "bench_hist_empty").await;
    let pool = subagentd::db::connect(&svc.db_url, 2).await.unwrap();
    let empty = drive(&svc, &pool, secs).await;
    let (_, plan0, exec0) = claim_stats(&pool).await;
    pool.close().await;
    drop(svc);

    let svc = throughput_service(env, "bench_hist").await;
    let pool = subagentd::db::connect(&svc.db_url, 2).await.unwrap();
    let span = fill_history(&pool, n, recent).await;
    let disk: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())").fetch_one(&pool).await.unwrap();
    let full = drive(&svc, &pool, secs).await;
    let (claims, plan1, exec1) = claim_stats(&pool).await;
    history_reads(&svc, &pool, report).await;

    // Retention with a window half the recent tasks' span: whole partitions go, no row is deleted.
    let window = ((span / 2.0).floor() as u32).max(1);
    // Rows deleted from the history's partitions (not the queue, whose every move out is a delete).
    let deleted = "SELECT coalesce(sum(n_tup_del), 0)::int8 FROM pg_stat_user_tables
                   WHERE relname LIKE 'tasks_p%' OR relname LIKE 'llm_calls_p%' OR relname LIKE 'task_events_p%'
                      OR relname LIKE 'task_messages_p%'";
    let d0: i64 = sqlx::query_scalar(deleted).fetch_one(&pool).await.unwrap();
    let t = Instant::now();
    let mut dropped = 0;
    for parent in subagentd::store::partitions::HISTORY {
        dropped += subagentd::store::partitions::drop_expired(&pool, parent, window).await.unwrap().len();
    }
    // And the ledger with a window half its days (its rows span the whole fill).
    let ledger = subagentd::store::partitions::LEDGER;
    dropped += subagentd::store::partitions::drop_expired(&pool, ledger, (DAYS / 2.0) as u32).await.unwrap().len();
    let pass = t.elapsed().as_secs_f64();
    // The statistics collector reports a backend's counts at its transaction's end, within a second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let d1: i64 = sqlx::query_scalar(deleted).fetch_one(&pool).await.unwrap();
    let (x, y) = (empty.rate, full.rate);
    let (a, b) = (plan0 + exec0, plan1 + exec1);
    println!(
        "history: claim planning {plan0:.3} -> {plan1:.3} ms, execution {exec0:.3} -> {exec1:.3} ms ({claims} claims with history); database {:.1} GB filled; retention window {window} days, pass {pass:.1} s",
        disk as f64 / 1e9
    );
    let line = format!(
        "history: {n} tasks; without {x:.0} tasks/s, with {y:.0} tasks/s, ratio {:.2}; claim {a:.3} -> {b:.3} ms mean; retention dropped {dropped} partitions, deleted {} history rows",
        y / x.max(1.0),
        d1 - d0
    );
    println!("{line}");
    record(
        "history",
        serde_json::json!({"tasks": n, "tasks_per_s_empty": x.round(), "tasks_per_s_full": y.round(),
                           "ratio": (y / x.max(1.0) * 100.0).round() / 100.0, "claim_ms_empty": a, "claim_ms_full": b}),
    );
    report.lock().unwrap().push(format!("@history {line}"));
}

/// The console's and the API's reads on the filled history (the service idle): the overview and
/// the task list with each filter, a second page, `/usage`, and a recent task's events, messages
/// and calls. The last line names the worst p99 against the console's 100 ms.
async fn history_reads(svc: &Svc, pool: &sqlx::PgPool, report: &Report) {
    // The run's backlog worked off first: the reads are measured on an idle service.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(120) {
        let open: i64 = sqlx::query_scalar("SELECT count(*) FROM task_queue").fetch_one(pool).await.unwrap();
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let key = tenant_key(&svc.base, "h07").await;
    let page: Value = reqwest::Client::new()
        .get(format!("{}/tasks?limit=50", svc.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cursor = page["next_cursor"].as_str().unwrap().to_string();
    // A recent task of the generated history's (not the run's), with its events and messages.
    let task: uuid::Uuid = sqlx::query_scalar(
        "SELECT task_id FROM task_messages WHERE created_at > now() - interval '1 day'
           AND created_at < now() - interval '30 minutes' ORDER BY created_at DESC LIMIT 1",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let tenant: String =
        sqlx::query_scalar("SELECT tenant FROM tasks WHERE id = $1").bind(task).fetch_one(pool).await.unwrap();
    let day_ago = (chrono::Utc::now() - chrono::Duration::days(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let week_ago = (chrono::Utc::now() - chrono::Duration::days(7)).format("%Y-%m-%d").to_string();
    let checks: Vec<(&str, String, &str)> = vec![
        ("overview, every tenant", "/overview".into(), BENCH_ADMIN),
        ("overview, one tenant", "/overview".into(), &key),
        ("task list, every tenant", "/tasks?limit=50".into(), BENCH_ADMIN),
        ("task list, one tenant", "/tasks?limit=50".into(), &key),
        ("task list, second page", format!("/tasks?limit=50&cursor={cursor}"), &key),
        ("… status=cancelled, every tenant", "/tasks?status=cancelled&limit=50".into(), BENCH_ADMIN),
        ("… status=cancelled, one tenant", "/tasks?status=cancelled&limit=50".into(), &key),
        ("… model, one tenant", "/tasks?model=fake/gpt-4o&limit=50".into(), &key),
        ("… created_before a day ago, every tenant", format!("/tasks?created_before={day_ago}&limit=50"), BENCH_ADMIN),
        ("/usage, one tenant, a week", format!("/usage?from={week_ago}"), &key),
        ("a task's events", format!("/tasks/{task}/events"), BENCH_ADMIN),
        ("a task's messages", format!("/tasks/{task}/messages"), BENCH_ADMIN),
        ("a task's calls", format!("/tasks/{task}/calls"), BENCH_ADMIN),
    ];
    let (rows, worst) = timed_reads(&svc.base, &checks).await;
    let line = format!(
        "history reads (task of {tenant}): {}; worst p99 {worst:.1} ms, {}",
        rows.join("; "),
        if worst < 100.0 { "under 100 ms" } else { "over 100 ms" }
    );
    println!("{line}");
    report.lock().unwrap().push(format!("@history {line}"));
}

/// Scenario 13, wait mode at saturation: `tasks` tasks, `callers` callers each waiting for its
/// task (`POST /tasks?wait=true`) before it sends the next, one tool call each, the provider
/// answering at once. The CPU the wait path costs where it hurts: wait mode's latency scenarios (a 100 or
/// 1,000 ms provider) do not show it. Tasks/s, and CPU per task: the service's and PostgreSQL's.
async fn wait_saturated(env: &Env, report: &Report, tasks: u64, callers: u64) {
    env.latency.store(0, Ordering::Relaxed);
    let svc = env
        .service(
            "bench_waitsat",
            &["serve"],
            &[("SUBAGENTD_MAX_RUNNING", "400".into()), ("SUBAGENTD_DB_MAX_CONNECTIONS", "40".into())],
        )
        .await;
    let client = reqwest::Client::builder().pool_max_idle_per_host(300).build().unwrap();
    let run = |n: u64| {
        let left = Arc::new(AtomicU64::new(n));
        let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut ws = vec![];
        for _ in 0..callers {
            let (c, base, left, ok, failed) =
                (client.clone(), svc.base.clone(), left.clone(), ok.clone(), failed.clone());
            ws.push(tokio::spawn(async move {
                while left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1)).is_ok() {
                    let r = c
                        .post(format!("{base}/tasks?wait=true&timeout=60"))
                        .json(&json!({"prompt": "go", "model": "fake/gpt-4o"}))
                        .send()
                        .await;
                    match r {
                        Ok(r) if r.status() == 200 => ok.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }));
        }
        (ws, ok, failed)
    };
    // A warm-up: connections opened, caches filled.
    let (ws, _, _) = run(callers * 10);
    for w in ws {
        w.await.unwrap();
    }
    let pool = subagentd::db::connect(&svc.db_url, 1).await.unwrap();
    reset_statement_stats(&pool).await;
    let x0 = commits(&pool).await;
    let (cpu0, t0) = (cpu_seconds(svc.child.id()), Instant::now());
    let (ws, ok, failed) = run(tasks);
    for w in ws {
        w.await.unwrap();
    }
    let (cpu1, el) = (cpu_seconds(svc.child.id()), t0.elapsed().as_secs_f64());
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    let n = ok.max(1) as f64;
    // What PostgreSQL was asked per task, whatever the machine's speed: transactions, and
    // statements by kind (pg_stat_statements).
    let xacts = (commits(&pool).await - x0) as f64 / n;
    let stmts: Vec<(String, i64, f64)> = sqlx::query_as(
        "SELECT regexp_replace(left(query, 70), '\\s+', ' ', 'g'), calls, mean_exec_time FROM pg_stat_statements
         WHERE calls > 0 ORDER BY calls DESC LIMIT 25",
    )
    .fetch_all(&pool)
    .await
    .unwrap_or_default();
    let total: i64 = stmts.iter().map(|s| s.1).sum();
    println!("WAITSAT statements per task: {:.2} ({xacts:.2} transactions)", total as f64 / n);
    for (q, c, mean) in &stmts {
        println!("  {:6.3}/task  {mean:7.3} ms  {q}", *c as f64 / n);
    }
    let (pg_ms, svc_ms) = ((cpu1.0 - cpu0.0) * 1000.0 / n, (cpu1.1 - cpu0.1) * 1000.0 / n);
    let rate = ok as f64 / el;
    println!(
        "WAITSAT: {rate:.0} tasks/s; CPU per task {:.2} ms (service {svc_ms:.2}, PostgreSQL {pg_ms:.2})",
        svc_ms + pg_ms
    );
    let line = format!(
        "| 13. Wait mode at saturation ({tasks} tasks, {callers} callers, `?wait=true`, 1 tool call + answer, provider 0 ms) | the build before the lifecycle room's figures | **{rate:.0} tasks/s; {:.2} ms CPU per task** (service {svc_ms:.2}, PostgreSQL {pg_ms:.2}; {failed} failed) | — |",
        svc_ms + pg_ms
    );
    report.lock().unwrap().push(line);
}

/// 2. 10,000 sub-agents in flight at once in one worker process, 2 s provider: all
///    complete; peak RSS of that process.
async fn concurrency(env: &Env, report: &Report, n: usize) {
    env.latency.store(2000, Ordering::Relaxed);
    // Enqueue everything first (API only), then one worker process takes it all at once.
    let api =
        env.service("bench_cc", &["serve", "--no-workers"], &[("SUBAGENTD_DB_MAX_CONNECTIONS", "20".into())]).await;
    let pool = subagentd::db::connect(&api.db_url, 2).await.unwrap();
    let client = reqwest::Client::new();
    let mut posts = vec![];
    for _ in 0..16 {
        let (c, base) = (client.clone(), api.base.clone());
        let per = n / 16;
        posts.push(tokio::spawn(async move {
            for _ in 0..per {
                c.post(format!("{base}/tasks"))
                    .json(&json!({"prompt": "no-tools", "model": "fake/gpt-4o"}))
                    .send()
                    .await
                    .unwrap();
            }
        }));
    }
    for p in posts {
        p.await.unwrap();
    }
    reset_statement_stats(&pool).await;
    CALLS_PEAK.store(0, Ordering::Relaxed);
    let cfg = env.dir.join("bench_cc.toml");
    let mut worker = Command::new(service_binary());
    pass_service_settings(&mut worker);
    let mut worker = worker
        .arg("worker")
        .env("DATABASE_URL", &api.db_url)
        .env("SUBAGENTD_CONFIG", &cfg)
        .env("SUBAGENTD_TOOL_ALLOW", "*, 127.0.0.1/32")
        .env("SUBAGENTD_MAX_RUNNING", n.to_string())
        .env("SUBAGENTD_CLAIM_BATCH", "1000")
        .env("SUBAGENTD_DB_MAX_CONNECTIONS", "60")
        .env("SUBAGENTD_LEASE_SECONDS", "120")
        .env("SUBAGENTD_HEARTBEAT_SECONDS", "30")
        // mimalloc returns freed memory at once rather than after 10 ms: the README's advice
        // for a worker running thousands of sub-agents at once (lower peak RSS, a little CPU).
        .env("MIMALLOC_PURGE_DELAY", "0")
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut peak_running = 0;
    let mut timeline = vec![];
    let (done, bad) = loop {
        let running: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'running'").fetch_one(&pool).await.unwrap();
        peak_running = peak_running.max(running);
        timeline.push(format!("{:.1}s:{running}", t0.elapsed().as_secs_f64()));
        let (c, open, bad) = counts(&pool).await;
        if open == 0 || t0.elapsed() > Duration::from_secs(300) {
            break (c, bad);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let rss = rss_peak_mib(worker.id());
    let el = t0.elapsed().as_secs_f64();
    println!("running over time: {}", timeline.iter().step_by(5).cloned().collect::<Vec<_>>().join(" "));
    print_top_statements(&pool, n as i64).await;
    let _ = worker.kill();
    let _ = worker.wait();
    let peak_calls = CALLS_PEAK.load(Ordering::Relaxed);
    let ok = done as usize == n && bad == 0 && rss < 384.0 && peak_running as usize >= n * 9 / 10;
    let line = format!(
        "| 2. Concurrency ({n} queued sub-agents taken by one `subagentd worker`, provider 2 s per call) | all in flight at once and complete, peak RSS < 384 MiB, no errors | **{done}/{n} completed, {bad} errors, peak {peak_running} running at once (claimed), peak {peak_calls} provider calls at once, worker peak RSS {rss:.0} MiB** ({:.1} KiB per run), all done {el:.1} s after the worker started | {} |",
        rss * 1024.0 / n as f64,
        if ok { "met" } else { "not met" }
    );
    println!("{line}");
    record(
        "concurrency",
        serde_json::json!({"tasks": n, "completed": done, "errors": bad, "peak_running": peak_running,
                           "worker_peak_rss_mib": rss.round(), "all_done_s": (el * 10.0).round() / 10.0}),
    );
    report.lock().unwrap().push(line);
}

/// A 1 MB HTML article: headings, paragraphs with links, lists and a table, a script and a
/// navigation bar, as pages are.
fn page_1mb() -> String {
    static PAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PAGE.get_or_init(|| {
        let mut s = String::from(
            "<!doctype html><html><head><title>Bench</title><style>body{font:14px sans-serif}</style>\
             <script>var x = 1;</script></head><body><nav><a href=\"/\">Home</a></nav>",
        );
        let mut i = 0;
        while s.len() < 1024 * 1024 {
            s.push_str(&format!(
                "<h2>Section {i}</h2><p>Paragraph {i} of the article, with <a href=\"https://example.org/{i}\">a link</a> \
                 and enough words to read like prose about tides, moons and harbours.</p>\
                 <ul><li>point one of {i}</li><li>point two of {i}</li></ul>\
                 <table><tr><th>Port</th><th>Range</th></tr><tr><td>P{i}</td><td>{i} m</td></tr></table>"
            ));
            i += 1;
        }
        s.push_str("<footer>Footer</footer></body></html>");
        s
    })
    .clone()
}

/// Scenario 14, the built-in `web_fetch`: `n` research tasks at once, each fetching a 1 MB HTML
/// page from a local server (the fake provider answers at once): each call's time, from its
/// `tool_call_finished` event, and the service's peak RSS.
async fn web_fetches(env: &Env, report: &Report, n: usize) {
    env.latency.store(0, Ordering::Relaxed);
    let svc = env
        .service(
            "bench_web",
            &["serve"],
            &[
                ("SUBAGENTD_MAX_RUNNING", (n * 2).to_string()),
                ("SUBAGENTD_DEFAULT_WEB_FETCHES_PER_MINUTE", "100000".into()),
            ],
        )
        .await;
    let pool = subagentd::db::connect(&svc.db_url, 2).await.unwrap();
    let rss_idle = rss_mib(svc.child.id());
    let client = reqwest::Client::new();
    let page = format!("{}/page", env.tools);
    let t0 = Instant::now();
    let posts: Vec<_> = (0..n)
        .map(|_| {
            let (c, base, page) = (client.clone(), svc.base.clone(), page.clone());
            tokio::spawn(async move {
                let r = c
                    .post(format!("{base}/tasks?wait=true&timeout=120"))
                    .json(&json!({"prompt": format!("read webfetch:{page} please"), "model": "fake/gpt-4o", "subagent_type": "research"}))
                    .send()
                    .await
                    .unwrap();
                r.json::<Value>().await.unwrap()["status"] == "completed"
            })
        })
        .collect();
    let mut ok = 0;
    for p in posts {
        ok += usize::from(p.await.unwrap());
    }
    let wall = t0.elapsed().as_secs_f64();
    let rss = rss_peak_mib(svc.child.id());
    let rows: Vec<(f64, i64, bool)> = sqlx::query_as(
        "SELECT (data->>'duration_ms')::float8, coalesce((data->>'bytes')::int8, 0), (data->>'is_error')::bool
         FROM task_event_log WHERE kind = 'tool_call_finished'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let errors = rows.iter().filter(|r| r.2).count();
    let bytes = rows.first().map_or(0, |r| r.1);
    let mut ms: Vec<f64> = rows.iter().map(|r| r.0).collect();
    let (p50, p95, max) = (pct(&mut ms, 0.5), pct(&mut ms, 0.95), pct(&mut ms, 1.0));
    let line = format!(
        "| 14. Built-in `web_fetch` ({n} research tasks at once, each fetching a 1 MB HTML page from a local server) | time per call and the service's peak RSS (issue 43: measured, no target) | **{ok}/{n} completed, {} calls, {errors} errors, {bytes} bytes read each; per call p50 {p50:.0} ms, p95 {p95:.0} ms, max {max:.0} ms; all done in {wall:.1} s; service RSS {rss_idle:.0} MiB idle, peak {rss:.0} MiB** | measured |",
        rows.len()
    );
    println!("{line}");
    report.lock().unwrap().push(line);
}

/// A repository of `files` source files (about 2 KB each, one of them defining `retry_policy`),
/// served over git's smart HTTP by `git http-backend` behind a CGI server; its URL.
async fn git_repo(dir: &std::path::Path, files: usize) -> String {
    let work = dir.join("ws-work");
    let git = |cwd: &std::path::Path, args: &[&str]| {
        let ok = Command::new("git")
            .args(["-c", "user.name=b", "-c", "user.email=b@example.com", "-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(cwd)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdout(Stdio::null())
            .status()
            .expect("git is installed")
            .success();
        assert!(ok, "git {args:?}");
    };
    for i in 0..files {
        let d = work.join(format!("src/m{:03}", i / 100));
        std::fs::create_dir_all(&d).unwrap();
        let body = if i == files / 2 { "pub fn retry_policy() -> u32 { 3 }\n".to_string() } else { String::new() };
        let filler: String = (0..40).map(|l| format!("// line {l} of file {i}: some ordinary source text\n")).collect();
        std::fs::write(d.join(format!("f{i}.rs")), format!("{filler}{body}")).unwrap();
    }
    git(&work, &["init", "-q"]);
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "bench"]);
    git(dir, &["clone", "-q", "--bare", "ws-work", "repo.git"]);
    let root = dir.to_path_buf();
    let app = Router::new().fallback(move |req: axum::extract::Request| {
        let root = root.clone();
        async move { cgi(root, req).await }
    });
    format!("{}/repo.git", serve(app).await)
}

async fn cgi(root: std::path::PathBuf, req: axum::extract::Request) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 64 << 20).await.unwrap_or_default();
    let header = |n: &str| parts.headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let mut child = tokio::process::Command::new("git")
        .arg("http-backend")
        .env("GIT_PROJECT_ROOT", &root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("PATH_INFO", parts.uri.path())
        .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("GIT_PROTOCOL", header("git-protocol"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, &body).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap().stdout;
    let at = out.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    let Some((at, gap)) = at.or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2))) else {
        return axum::http::StatusCode::BAD_GATEWAY.into_response();
    };
    let mut status = axum::http::StatusCode::OK;
    let mut headers = axum::http::HeaderMap::new();
    for line in String::from_utf8_lossy(&out[..at]).lines() {
        let Some((k, v)) = line.split_once(':') else { continue };
        if k.eq_ignore_ascii_case("status") {
            status = v.trim().split(' ').next().and_then(|c| c.parse().ok()).unwrap_or(status);
        } else if let (Ok(k), Ok(v)) =
            (axum::http::HeaderName::try_from(k.trim()), axum::http::HeaderValue::from_str(v.trim()))
        {
            headers.insert(k, v);
        }
    }
    (status, headers, out[at + gap..].to_vec()).into_response()
}

/// Scenario 16, workspaces: the first fetch and a cached start of a task over a repository of
/// `files` files, then `n` tasks grepping it at once (time per call, the service's RSS).
async fn workspace(env: &Env, report: &Report, files: usize, n: usize) {
    env.latency.store(0, Ordering::Relaxed);
    let repo = git_repo(&env.dir, files).await;
    let cache = env.dir.join("ws-cache");
    let svc = env
        .service(
            "bench_ws",
            &["serve"],
            &[
                ("SUBAGENTD_MAX_RUNNING", (n * 2).to_string()),
                ("SUBAGENTD_WORKSPACE_GIT_ALLOW", "127.0.0.1/32".into()),
                ("SUBAGENTD_WORKSPACE_DIR", cache.display().to_string()),
            ],
        )
        .await;
    let pool = subagentd::db::connect(&svc.db_url, 2).await.unwrap();
    let client = reqwest::Client::new();
    let run = |prompt: String| {
        let (c, base, repo) = (client.clone(), svc.base.clone(), repo.clone());
        async move {
            let t = Instant::now();
            let r = c
                .post(format!("{base}/tasks?wait=true&timeout=300"))
                .json(&json!({"prompt": prompt, "model": "fake/gpt-4o", "subagent_type": "explore", "workspace": {"git": repo}}))
                .send()
                .await
                .unwrap();
            let v = r.json::<Value>().await.unwrap();
            (v["status"] == "completed", t.elapsed().as_secs_f64() * 1000.0, v)
        }
    };
    let ready = |id: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (i64, i64, bool)>(
                "SELECT (data->>'millis')::int8, (data->>'fetched_bytes')::int8, (data->>'cached')::bool
                 FROM task_event_log WHERE task_id = $1::uuid AND kind = 'workspace_ready'",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let (ok1, first_ms, t1) = run("no-tools first".into()).await;
    let (fetch_ms, fetched, cached1) = ready(t1["id"].as_str().unwrap().to_string()).await;
    let (ok2, second_ms, t2) = run("no-tools second".into()).await;
    let (hit_ms, _, cached2) = ready(t2["id"].as_str().unwrap().to_string()).await;
    assert!(ok1 && ok2 && !cached1 && cached2, "{t1} {t2}");
    let grep_ms = |id: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, f64>(
                "SELECT (data->>'duration_ms')::float8 FROM task_event_log WHERE task_id = $1::uuid AND kind = 'tool_call_finished'",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    // One grep alone, then `n` at once.
    let mut alone = vec![];
    for _ in 0..5 {
        let (_, _, t) = run("find grepws:retry_policy alone".into()).await;
        alone.push(grep_ms(t["id"].as_str().unwrap().to_string()).await);
    }
    let alone_p50 = pct(&mut alone, 0.5);
    // The rows holding the lone runs' `tool_call_finished` (alone or with earlier events).
    sqlx::query(
        "DELETE FROM task_events WHERE kind = 'tool_call_finished' OR earlier::jsonb @> '[[\"tool_call_finished\"]]'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let rss_idle = rss_mib(svc.child.id());
    let t0 = Instant::now();
    let all: Vec<_> = (0..n).map(|_| tokio::spawn(run("find grepws:retry_policy please".into()))).collect();
    let mut ok = 0;
    for a in all {
        ok += usize::from(a.await.unwrap().0);
    }
    let wall = t0.elapsed().as_secs_f64();
    let rss = rss_peak_mib(svc.child.id());
    let mut ms: Vec<f64> = sqlx::query_scalar(
        "SELECT (data->>'duration_ms')::float8 FROM task_event_log WHERE kind = 'tool_call_finished' AND data->>'name' = 'grep'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let calls = ms.len();
    let (p50, p95, max) = (pct(&mut ms, 0.5), pct(&mut ms, 0.95), pct(&mut ms, 1.0));
    let line = format!(
        "| 16. Workspaces (a git repository of {files} files, {:.1} MB fetched, served by `git http-backend` on loopback; then {n} `explore` tasks grepping it at once) | first fetch, cached start, grep per call, the service's RSS (issue 44: measured, no target) | **first task {first_ms:.0} ms (fetch and checkout {fetch_ms} ms); a cached start {second_ms:.0} ms (ready in {hit_ms} ms); grep over the {files} files alone: {alone_p50:.0} ms per call (median of 5); {n} at once: {ok}/{n} completed, {calls} calls, p50 {p50:.0} ms, p95 {p95:.0} ms, max {max:.0} ms, all done in {wall:.1} s; service RSS {rss_idle:.0} MiB before, peak {rss:.0} MiB** | measured |",
        fetched as f64 / 1e6
    );
    println!("{line}");
    report.lock().unwrap().push(line);
}

/// 3. Overhead of `POST /tasks?wait=true` over the provider's latency, 200 waiters.
async fn wait_mode(env: &Env, report: &Report, secs: u64, provider_ms: u64, waiters: usize) {
    env.latency.store(provider_ms, Ordering::Relaxed);
    let svc = env
        .service(
            "bench_wait",
            &["serve"],
            &[("SUBAGENTD_MAX_RUNNING", "400".into()), ("SUBAGENTD_DB_MAX_CONNECTIONS", "40".into())],
        )
        .await;
    let client = reqwest::Client::builder().pool_max_idle_per_host(300).build().unwrap();
    let pool = subagentd::db::connect(&svc.db_url, 1).await.unwrap();
    reset_statement_stats(&pool).await;
    // Per request: overhead over the time the provider took, and over its nominal latency.
    let lat: Arc<Mutex<Vec<(f64, f64)>>> = Arc::default();
    // The first 3 s warm up (connections opened, caches filled) and are not counted.
    let warm = Instant::now() + Duration::from_secs(3);
    let deadline = warm + Duration::from_secs(secs);
    let failed = Arc::new(AtomicU64::new(0));
    let mut ws = vec![];
    for i in 0..waiters {
        let (c, base, lat, failed) = (client.clone(), svc.base.clone(), lat.clone(), failed.clone());
        // Starts spread over one provider latency: otherwise the waiters stay in step, and
        // every round is a burst of `waiters` simultaneous submissions (the warm-up is not
        // enough for them to drift apart with a provider this regular).
        let start = Instant::now() + Duration::from_millis(provider_ms * i as u64 / waiters as u64);
        ws.push(tokio::spawn(async move {
            tokio::time::sleep_until(start.into()).await;
            while Instant::now() < deadline {
                let t = Instant::now();
                let run = uuid::Uuid::new_v4().to_string();
                let r = c
                    .post(format!("{base}/tasks?wait=true&timeout=60"))
                    .json(&json!({"prompt": format!("no-tools run:{run}"), "model": "fake/gpt-4o"}))
                    .send()
                    .await;
                let took = t.elapsed().as_secs_f64() * 1000.0;
                let provider = PROVIDER_MS.lock().unwrap().as_mut().and_then(|m| m.remove(&run));
                match provider {
                    Some(p) if r.is_ok_and(|r| r.status() == 200) => {
                        if t >= warm {
                            lat.lock().unwrap().push((took - p, took - provider_ms as f64));
                        }
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    tokio::time::sleep_until(warm.into()).await;
    let (pg0, svc0, me0, t0) =
        (cpu_seconds(0).0, cpu_seconds(svc.child.id()).1, cpu_seconds(std::process::id()).1, Instant::now());
    for w in ws {
        w.await.unwrap();
    }
    let (pg1, svc1, me1) = (cpu_seconds(0).0, cpu_seconds(svc.child.id()).1, cpu_seconds(std::process::id()).1);
    let el = t0.elapsed().as_secs_f64();
    println!(
        "CPU use over the measured window (cores): PostgreSQL {:.2}, service {:.2}, harness (client and fakes) {:.2}",
        (pg1 - pg0) / el,
        (svc1 - svc0) / el,
        (me1 - me0) / el
    );
    print_top_statements(&pool, counts(&pool).await.0).await;
    // Where a task's time goes: each event's offset from the task's creation.
    let phases: Vec<(String, f64, f64)> = sqlx::query_as(
        "SELECT e.kind || '#' || e.seq,
                (percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.created_at - t.created_at)) * 1000)::float8,
                (percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM e.created_at - t.created_at)) * 1000)::float8
         FROM task_event_log e JOIN tasks t ON t.id = e.task_id
         WHERE t.status = 'completed' AND t.created_at > (SELECT min(created_at) FROM tasks) + interval '3 seconds'
         GROUP BY e.kind, e.seq ORDER BY e.seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let phases: Vec<String> = phases.iter().map(|(k, p50, p99)| format!("{k} +{p50:.1}/{p99:.1} ms")).collect();
    println!("event offsets from creation (p50/p99): {}", phases.join(", "));
    // The service's own view of the same requests.
    let m = client.get(format!("{}/metrics", svc.base)).send().await.unwrap().text().await.unwrap_or_default();
    for l in m.lines().filter(|l| l.starts_with("subagentd_http_request_duration_seconds") && l.contains("POST")) {
        println!("{l}");
    }
    let mut v: Vec<f64> = lat.lock().unwrap().iter().map(|l| l.0).collect();
    let mut nominal: Vec<f64> = lat.lock().unwrap().iter().map(|l| l.1).collect();
    let (p50, p99) = (pct(&mut v, 0.5), pct(&mut v, 0.99));
    let line = format!(
        "| 3. Wait mode ({waiters} concurrent `POST ?wait=true`, provider {provider_ms} ms) | overhead p50 < 5 ms, p99 < 25 ms | **overhead p50 {p50:.1} ms, p99 {p99:.1} ms** over the provider's measured time ({:.1} / {:.1} ms over its nominal {provider_ms} ms), {} requests after a 3 s warm-up; {} failed | {} |",
        pct(&mut nominal, 0.5),
        pct(&mut nominal, 0.99),
        v.len(),
        failed.load(Ordering::Relaxed),
        if p50 < 5.0 && p99 < 25.0 && failed.load(Ordering::Relaxed) == 0 { "met" } else { "not met" }
    );
    println!("{line}");
    let scenario = match (waiters, provider_ms) {
        (1, _) => "wait1".to_string(),
        (200, 1000) => "wait1000".to_string(),
        (200, 100) => "wait100".to_string(),
        (w, p) => format!("wait_{w}x{p}ms"),
    };
    record(
        &scenario,
        serde_json::json!({"overhead_p50_ms": (p50 * 10.0).round() / 10.0, "overhead_p99_ms": (p99 * 10.0).round() / 10.0,
                           "requests": v.len(), "failed": failed.load(Ordering::Relaxed)}),
    );
    report.lock().unwrap().push(line);
}

/// 4. `POST /tasks` at 1,000 requests/s for 30 s (API only: admission is measured).
async fn admission(env: &Env, report: &Report, secs: u64, rate: u64) {
    let svc =
        env.service("bench_adm", &["serve", "--no-workers"], &[("SUBAGENTD_DB_MAX_CONNECTIONS", "40".into())]).await;
    let client = reqwest::Client::builder().pool_max_idle_per_host(500).build().unwrap();
    let lat: Arc<Mutex<Vec<f64>>> = Arc::default();
    let refused = Arc::new(AtomicU64::new(0));
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut hs = vec![];
    let t0 = Instant::now();
    for _ in 0..secs * rate {
        tick.tick().await;
        let (c, base, lat, refused) = (client.clone(), svc.base.clone(), lat.clone(), refused.clone());
        hs.push(tokio::spawn(async move {
            let t = Instant::now();
            let r = c
                .post(format!("{base}/tasks"))
                .json(&json!({"prompt": "queued work", "model": "fake/gpt-4o"}))
                .send()
                .await;
            match r {
                Ok(r) if r.status() == 201 => lat.lock().unwrap().push(t.elapsed().as_secs_f64() * 1000.0),
                _ => {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for h in hs {
        let _ = h.await;
    }
    let el = t0.elapsed().as_secs_f64();
    let mut v = lat.lock().unwrap().clone();
    let n = v.len();
    let (p50, p99) = (pct(&mut v, 0.5), pct(&mut v, 0.99));
    let bad = refused.load(Ordering::Relaxed);
    let line = format!(
        "| 4. Admission (`POST /tasks` at {rate}/s for {secs} s) | p99 < 20 ms, none refused | **p50 {p50:.1} ms, p99 {p99:.1} ms; {n} accepted, {bad} refused or failed** ({:.0} req/s achieved) | {} |",
        n as f64 / el,
        if p99 < 20.0 && bad == 0 { "met" } else { "not met" }
    );
    println!("{line}");
    record(
        "admission",
        serde_json::json!({"p50_ms": (p50 * 10.0).round() / 10.0, "p99_ms": (p99 * 10.0).round() / 10.0,
                           "accepted": n, "refused_or_failed": bad, "rate_per_s": rate}),
    );
    report.lock().unwrap().push(line);
}

fn rss_mib(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map_or(f64::NAN, |k| k / 1024.0)
}

/// Scenario 9, idle keep-alive connections: `n` clients each make one request (a task read, which
/// goes through the state, auth and the router's layers) and keep the connection open; the
/// service's RSS before, with them open, and after they close.
async fn connections(env: &Env, report: &Report, n: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let svc = env.service("bench_connections", &["serve", "--no-workers"], &[]).await;
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{}/tasks", svc.base))
        .json(&json!({"prompt": "go", "model": "fake/gpt-4o"}))
        .send()
        .await
        .unwrap();
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let addr = svc.base.trim_start_matches("http://").to_string();
    let pid = svc.child.id();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_mib(pid);
    let t0 = Instant::now();
    let mut open = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let req = format!("GET /tasks/{id} HTTP/1.1\r\nhost: {addr}\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 16384];
        let k = s.read(&mut buf).await.unwrap();
        assert!(buf[..k].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..k.min(200)]));
        open.push(s);
    }
    let el = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let with = rss_mib(pid);
    drop(open);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = rss_mib(pid);
    let per = (with - before) * 1024.0 / n as f64;
    let line = format!(
        "| 9. Idle connections ({n} keep-alive clients, one `GET /tasks/{{id}}` each, left open) | memory a connection holds is its buffers, not a copy of the service's state | **{per:.0} KiB a connection** (service RSS {before:.0} MiB before, {with:.0} MiB with them open, {after:.0} MiB 5 s after they closed); opened and answered {:.0} a second | {} |",
        n as f64 / el,
        if per < 64.0 { "met" } else { "not met" }
    );
    println!("{line}");
    report.lock().unwrap().push(line);
}

/// Sockets the process holds open (clients' connections, the pool's, the providers').
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:")))
            .count()
    })
}

/// Table sizes (MiB, with indexes and TOAST) and live / dead tuples of the tables that grow.
async fn tables(pool: &sqlx::PgPool) -> Vec<(String, f64, i64, i64)> {
    // A partitioned table's rows live in its partitions: they are summed under the parent's name.
    sqlx::query_as(
        "SELECT coalesce(p.relname, s.relname)::text AS name,
                sum(pg_total_relation_size(s.relid))::float8 / 1048576, sum(s.n_live_tup)::int8, sum(s.n_dead_tup)::int8
         FROM pg_stat_user_tables s
         LEFT JOIN pg_inherits i ON i.inhrelid = s.relid LEFT JOIN pg_class p ON p.oid = i.inhparent
         WHERE coalesce(p.relname, s.relname) IN
             ('tasks', 'task_queue', 'llm_calls', 'task_messages', 'task_events', 'usage_daily', 'workers')
         GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The server's WAL position, in bytes.
async fn wal_bytes(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8").fetch_one(pool).await.unwrap()
}

/// Where the soak's WAL went from minute 2 to the end, per table and record type (partitions and
/// their indexes under their parent's name; records without a relation under their resource
/// manager), in
/// bytes per task and the full-page images' share (`BENCH_WAL_BY_TABLE=1`: pg_walinspect reads
/// every record, a minute or more for a long soak).
async fn wal_by_table(pool: &sqlx::PgPool, from: i64, to: i64, tasks: i64) {
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_walinspect").execute(pool).await.unwrap();
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "WITH r AS (
            SELECT record_length, fpi_length, resource_manager, record_type,
                   (regexp_match(block_ref, 'rel \\d+/\\d+/(\\d+)'))[1]::oid AS node
            FROM pg_get_wal_records_info(('0/0'::pg_lsn + $1::numeric), ('0/0'::pg_lsn + $2::numeric))
         )
         SELECT coalesce(p.relname, c.relname, r.resource_manager)::text || coalesce(' ' || r.record_type, ''), count(*),
                sum(record_length)::int8, sum(fpi_length)::int8
         FROM r LEFT JOIN pg_class c ON c.relfilenode = r.node AND r.node <> 0
                LEFT JOIN pg_inherits i ON i.inhrelid = c.oid LEFT JOIN pg_class p ON p.oid = i.inhparent
         GROUP BY 1 ORDER BY 3 DESC LIMIT 40",
    )
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await
    .unwrap();
    let n = tasks.max(1) as f64;
    println!("WAL by table and record type, per task (records, bytes, of which full pages):");
    for (name, records, bytes, fpi) in rows {
        println!("  {name}: {:.1} records, {:.0} B, {:.0} B", records as f64 / n, bytes as f64 / n, fpi as f64 / n);
    }
}

/// Scenario 8, the soak: `secs` (default 30 minutes) at about half the machine's capacity with a
/// mix — background tasks (one tool call each), wait-mode requests, one provider call in 100
/// answered 503 (retried), 2% of tasks cancelled soon after submission — reporting per minute:
/// admission and wait p99, errors, the service's RSS, and the tables' sizes and dead tuples.
async fn soak(env: &Env, report: &Report, secs: u64, rate: u64) {
    env.latency.store(20, Ordering::Relaxed);
    ERROR_EVERY.store(100, Ordering::Relaxed);
    let svc = env
        .service(
            "bench_soak",
            &["serve"],
            &[("SUBAGENTD_MAX_RUNNING", "256".into()), ("SUBAGENTD_DB_MAX_CONNECTIONS", "40".into())],
        )
        .await;
    let pool = subagentd::db::connect(&svc.db_url, 2).await.unwrap();
    let client = reqwest::Client::builder().pool_max_idle_per_host(500).build().unwrap();
    #[derive(Default)]
    struct Minute {
        admit: Vec<f64>,
        wait: Vec<f64>,
        errors: u64,
        /// Per wall-clock second (Unix time) in which a request ended: wait-mode answers and the
        /// slowest of them, admissions and the slowest of them. Written out at the end, to line
        /// slow seconds up with PostgreSQL's log.
        seconds: std::collections::BTreeMap<u64, [f64; 4]>,
    }
    impl Minute {
        fn second(&mut self, wait: bool, ms: f64) {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
            let s = self.seconds.entry(now).or_default();
            let i = if wait { 0 } else { 2 };
            s[i] += 1.0;
            s[i + 1] = s[i + 1].max(ms);
        }
    }
    let mut seconds = std::collections::BTreeMap::new();
    let minute: Arc<Mutex<Minute>> = Arc::default();
    let waiters = rate / 10;
    let background = rate - waiters;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(secs);
    // Background submissions at `background`/s, every 50th cancelled 50 ms later.
    let gen_bg = {
        let (c, base, m) = (client.clone(), svc.base.clone(), minute.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / background));
            let mut i = 0u64;
            while Instant::now() < end {
                tick.tick().await;
                i += 1;
                let (c, base, m) = (c.clone(), base.clone(), m.clone());
                tokio::spawn(async move {
                    let t = Instant::now();
                    let r = c
                        .post(format!("{base}/tasks"))
                        .json(&json!({"prompt": "go", "model": "fake/gpt-4o"}))
                        .send()
                        .await;
                    let ms = t.elapsed().as_secs_f64() * 1000.0;
                    let id = match r {
                        Ok(r) if r.status() == 201 => {
                            {
                                let mut m = m.lock().unwrap();
                                m.admit.push(ms);
                                m.second(false, ms);
                            }
                            r.json::<Value>().await.ok().and_then(|v| v["id"].as_str().map(String::from))
                        }
                        _ => {
                            m.lock().unwrap().errors += 1;
                            None
                        }
                    };
                    if let (true, Some(id)) = (i.is_multiple_of(50), id) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let r = c.post(format!("{base}/tasks/{id}/cancel")).send().await;
                        if !r.is_ok_and(|r| r.status() == 200) {
                            m.lock().unwrap().errors += 1;
                        }
                    }
                });
            }
        })
    };
    // Wait-mode requests at `waiters`/s.
    let gen_wait = {
        let (c, base, m) = (client.clone(), svc.base.clone(), minute.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / waiters.max(1)));
            while Instant::now() < end {
                tick.tick().await;
                let (c, base, m) = (c.clone(), base.clone(), m.clone());
                tokio::spawn(async move {
                    let t = Instant::now();
                    let r = c
                        .post(format!("{base}/tasks?wait=true&timeout=30"))
                        .json(&json!({"prompt": "go", "model": "fake/gpt-4o"}))
                        .send()
                        .await;
                    let ms = t.elapsed().as_secs_f64() * 1000.0;
                    match r {
                        Ok(r) if r.status() == 200 => {
                            let v: Value = r.json().await.unwrap_or(Value::Null);
                            if v["status"] == "completed" {
                                let mut m = m.lock().unwrap();
                                m.wait.push(ms);
                                m.second(true, ms);
                            } else {
                                m.lock().unwrap().errors += 1;
                            }
                        }
                        _ => m.lock().unwrap().errors += 1,
                    }
                });
            }
        })
    };
    let pid = svc.child.id();
    let mut rows = vec![];
    let mut rss = vec![];
    let mut first_tables = None;
    let (mut done, mut failed) = (0i64, 0i64);
    // Tasks are counted by the minute in which they finished, through `tasks_finished_idx`, up
    // to 5 s ago (a finishing transaction has committed by then). A count over the whole table
    // took 0.6–1.0 s of one of the two cores each minute by minute 20, and the runs it held up
    // piled up as connections at the moment the service's memory was read.
    let mut since: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT now() - interval '1 hour'").fetch_one(&pool).await.unwrap();
    for min in 1..=secs.div_ceil(60) {
        tokio::time::sleep_until((t0 + Duration::from_secs(min * 60).min(Duration::from_secs(secs))).into()).await;
        // The process first, before the harness's own queries.
        let r = rss_mib(pid);
        let socks = sockets(pid);
        rss.push(r);
        let mut m = std::mem::take(&mut *minute.lock().unwrap());
        seconds.append(&mut m.seconds);
        let (completed, failed_now, until): (i64, i64, chrono::DateTime<chrono::Utc>) = sqlx::query_as(
            "WITH w AS (SELECT clock_timestamp() - interval '5 seconds' AS until)
             SELECT count(*) FILTER (WHERE t.status = 'completed'), count(*) FILTER (WHERE t.status = 'failed'), w.until
             FROM w LEFT JOIN tasks t ON t.finished_at > $1 AND t.finished_at <= w.until
             GROUP BY w.until",
        )
        .bind(since)
        .fetch_one(&pool)
        .await
        .unwrap();
        since = until;
        let last_done = done;
        done += completed;
        failed += failed_now;
        let t = tables(&pool).await;
        let dead: i64 = t.iter().map(|x| x.3).sum();
        let live: i64 = t.iter().map(|x| x.2).sum();
        let mib: f64 = t.iter().map(|x| x.1).sum();
        if min == 2 {
            first_tables = Some((mib, done, wal_bytes(&pool).await));
        }
        let line = format!(
            "| {min} | {:.0}/s | {:.1} | {:.1} | {:.1} | {:.1} | {} | {failed} | {r:.0} | {socks} | {mib:.0} | {:.1}% |",
            (done - last_done) as f64 / 60.0,
            pct(&mut m.admit, 0.5),
            pct(&mut m.admit, 0.99),
            pct(&mut m.wait, 0.5),
            pct(&mut m.wait, 0.99),
            m.errors,
            100.0 * dead as f64 / (live + dead).max(1) as f64,
        );
        println!("{line}");
        rows.push(line);
    }
    let _ = gen_bg.await;
    let _ = gen_wait.await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let by_status: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM tasks GROUP BY status ORDER BY status")
            .fetch_all(&pool)
            .await
            .unwrap();
    let t = tables(&pool).await;
    let done = by_status.iter().find(|(s, _)| s == "completed").map_or(0, |x| x.1);
    let mib: f64 = t.iter().map(|x| x.1).sum();
    let (mib0, done0, wal0) = first_tables.unwrap_or((0.0, 0, 0));
    let wal_end = wal_bytes(&pool).await;
    let wal = (wal_end - wal0) as f64 / (done - done0).max(1) as f64;
    if std::env::var("BENCH_WAL_BY_TABLE").is_ok_and(|v| v == "1") {
        wal_by_table(&pool, wal0, wal_end, done - done0).await;
    }
    let after: Vec<f64> = rss.iter().skip(2).copied().collect();
    let (lo, hi) = after.iter().fold((f64::MAX, 0.0f64), |(a, b), x| (a.min(*x), b.max(*x)));
    let summary = format!(
        "Soak: {secs} s at {rate} tasks/s offered ({background}/s background, {waiters}/s wait mode), provider 20 ms, 1 call in 100 answered 503, 2% of background tasks cancelled. Tasks by status at the end: {by_status:?}. Service RSS after minute 2: {lo:.0}–{hi:.0} MiB ({:+.1}% from its lowest). Tables: {mib:.0} MiB at the end, {:.2} KiB per task after minute 2; WAL {wal:.0} bytes per task after minute 2.\n\nPer table at the end (MiB, live, dead): {}",
        (hi - lo) / lo * 100.0,
        (mib - mib0) * 1024.0 / (done - done0).max(1) as f64,
        t.iter().map(|(n, m, l, d)| format!("{n} {m:.0} / {l} / {d}")).collect::<Vec<_>>().join("; ")
    );
    println!("{summary}");
    let md = format!(
        "| minute | completed | admission p50 ms | admission p99 ms | wait p50 ms | wait p99 ms | errors | failed tasks (total) | service RSS MiB | open sockets | tables MiB | dead tuples |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n{}\n\n{summary}\n",
        rows.join("\n")
    );
    std::fs::write(std::env::temp_dir().join("subagentd-soak.md"), &md).ok();
    let csv: String = std::iter::once("unix_second,wait_answers,wait_max_ms,admissions,admission_max_ms\n".to_string())
        .chain(seconds.iter().map(|(t, [wn, wm, an, am])| format!("{t},{wn},{wm:.0},{an},{am:.0}\n")))
        .collect();
    std::fs::write(std::env::temp_dir().join("subagentd-soak-seconds.csv"), csv).ok();
    // The bench's directory goes at exit; its PostgreSQL log is kept next to the seconds.
    std::fs::copy(env.dir.join("pg.log"), std::env::temp_dir().join("subagentd-soak-pg.log")).ok();
    report.lock().unwrap().push(format!("@soak {summary}"));
    ERROR_EVERY.store(0, Ordering::Relaxed);
}

/// Scenario 7, one tenant flooding: tenant A sends `POST /tasks` from 128 connections as fast as
/// the service answers (several times its admission capacity) while tenant B submits 50 tasks a
/// second; B's admission latency, with A unlimited and with A limited to `rate` requests/s.
async fn flood(env: &Env, report: &Report, secs: u64, limit: Option<u32>) {
    let name = if limit.is_some() { "bench_flood_limited" } else { "bench_flood" };
    let svc = env
        .service(
            name,
            &["serve", "--no-workers"],
            &[("SUBAGENTD_ADMIN_TOKEN", BENCH_ADMIN.into()), ("SUBAGENTD_DB_MAX_CONNECTIONS", "40".into())],
        )
        .await;
    let client = reqwest::Client::builder().pool_max_idle_per_host(500).build().unwrap();
    let (a, b) = (tenant_key(&svc.base, "tenant-a").await, tenant_key(&svc.base, "tenant-b").await);
    if let Some(rate) = limit {
        let r = client
            .put(format!("{}/admin/tenants/tenant-a", svc.base))
            .bearer_auth(BENCH_ADMIN)
            .json(&json!({"requests_per_second": rate}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (a_ok, a_limited) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let flooders: Vec<_> = (0..128)
        .map(|_| {
            let (c, base, a, stop, ok, limited) =
                (client.clone(), svc.base.clone(), a.clone(), stop.clone(), a_ok.clone(), a_limited.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let r = c
                        .post(format!("{base}/tasks"))
                        .bearer_auth(&a)
                        .json(&json!({"prompt": "flood", "model": "fake/gpt-4o"}))
                        .send()
                        .await;
                    match r.map(|r| r.status().as_u16()) {
                        Ok(201) => ok.fetch_add(1, Ordering::Relaxed),
                        Ok(429) => limited.fetch_add(1, Ordering::Relaxed),
                        _ => 0,
                    };
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lat: Arc<Mutex<Vec<f64>>> = Arc::default();
    let failed = Arc::new(AtomicU64::new(0));
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut hs = vec![];
    let (a0, l0, t0) = (a_ok.load(Ordering::Relaxed), a_limited.load(Ordering::Relaxed), Instant::now());
    for _ in 0..secs * 50 {
        tick.tick().await;
        let (c, base, b, lat, failed) = (client.clone(), svc.base.clone(), b.clone(), lat.clone(), failed.clone());
        hs.push(tokio::spawn(async move {
            let t = Instant::now();
            let r = c
                .post(format!("{base}/tasks"))
                .bearer_auth(&b)
                .json(&json!({"prompt": "b's work", "model": "fake/gpt-4o"}))
                .send()
                .await;
            match r {
                Ok(r) if r.status() == 201 => lat.lock().unwrap().push(t.elapsed().as_secs_f64() * 1000.0),
                _ => {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for h in hs {
        let _ = h.await;
    }
    let el = t0.elapsed().as_secs_f64();
    let a_rate = (a_ok.load(Ordering::Relaxed) - a0) as f64 / el;
    let a_refused = (a_limited.load(Ordering::Relaxed) - l0) as f64 / el;
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        let _ = f.await;
    }
    let mut v = lat.lock().unwrap().clone();
    let (p50, p99) = (pct(&mut v, 0.5), pct(&mut v, 0.99));
    let line = format!(
        "| 7. Flood ({}: A floods `POST /tasks` from 128 connections, B submits 50/s for {secs} s) | B p99 < 20 ms with A limited | **B: p50 {p50:.1} ms, p99 {p99:.1} ms, {} failed; A: {a_rate:.0} accepted/s, {a_refused:.0} refused (429)/s** | {} |",
        match limit { Some(r) => format!("A limited to {r} requests/s"), None => "no rate limits".into() },
        failed.load(Ordering::Relaxed),
        if limit.is_none() { "reference" } else if p99 < 20.0 && failed.load(Ordering::Relaxed) == 0 { "met" } else { "not met" }
    );
    println!("{line}");
    report.lock().unwrap().push(line);
}

/// Scenario 6, the console's reads on a big table: a million tasks over 30 days (20 tenants) and five
/// million ledger rows, with the rollup they make; the overview and the task list, as the admin
/// (every tenant) and as one tenant, with the list's filters, timed over 40 requests each.
async fn console(env: &Env, report: &Report) {
    let svc = env
        .service("bench_console", &["serve", "--no-workers"], &[("SUBAGENTD_ADMIN_TOKEN", BENCH_ADMIN.into())])
        .await;
    let pool = subagentd::db::connect(&svc.db_url, 2).await.unwrap();
    let t0 = Instant::now();
    month_partitions(&pool, 31).await;
    // Ids are UUID v7 of their creation time, as the service makes them.
    let fill = [
        "INSERT INTO tenants (name) SELECT 'tenant-' || g FROM generate_series(1, 20) g ON CONFLICT DO NOTHING",
        "INSERT INTO tasks (id, tenant, status, stop_reason, subagent_type, prompt, model, options, metadata, summary,
                            turns, input_tokens, output_tokens, cost_usd, attempt, last_event_seq, created_at,
                            started_at, finished_at, history_at, error_code)
         SELECT (lpad(to_hex((extract(epoch FROM c) * 1000)::bigint), 12, '0') || '7' || substr(h, 1, 3) || '8'
                 || substr(h, 4, 15))::uuid,
                'tenant-' || (g % 20 + 1), s,
                CASE s WHEN 'completed' THEN 'final_answer' WHEN 'incomplete' THEN 'max_turns' ELSE NULL END,
                (ARRAY['general', 'research', 'explore', 'plan'])[g % 4 + 1], 'a prompt of some length, task ' || g,
                (ARRAY['fake/gpt-4o', 'fake/gpt-4o-mini', 'fake/claude-sonnet', 'fake/local'])[g % 4 + 1],
                '{\"max_turns\": 5}', jsonb_build_object('batch', 'b' || (g / 1000)),
                CASE WHEN s IN ('completed', 'incomplete') THEN 'A summary of the findings, ' || g END,
                5, 5000, 500, 0.0125, 1, 12, c, c + interval '1 second',
                CASE WHEN s IN ('queued', 'running') THEN NULL ELSE c + interval '20 seconds' END,
                CASE WHEN s IN ('queued', 'running') THEN 'infinity' ELSE c + interval '20 seconds' END,
                CASE WHEN s = 'failed' THEN 'provider_unavailable' END
         FROM (SELECT g, now() - (1000000 - g) * interval '2.592 seconds' AS c, md5(g::text) AS h,
                      CASE WHEN g > 999950 THEN (ARRAY['queued', 'running'])[g % 2 + 1]
                           WHEN g % 97 = 0 THEN 'failed' WHEN g % 31 = 0 THEN 'incomplete'
                           WHEN g % 211 = 0 THEN 'cancelled' ELSE 'completed' END AS s
               FROM generate_series(1, 1000000) g) x",
        "UPDATE tasks SET lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour',
                worker_id = 'host-' || (abs(hashtext(id::text)) % 3) WHERE status = 'running'",
        "INSERT INTO llm_calls (call_key, task_id, tenant, turn, attempt, try, provider, model, input_tokens,
                                output_tokens, cached_tokens, cost_usd, latency_ms, http_status, outcome, created_at)
         SELECT key, id, tenant, k, 1, 1, 'fake', split_part(model, '/', 2), 1000, 100, 0, 0.0025,
                800, 200, CASE WHEN k = 5 AND status = 'failed' THEN 'error' ELSE 'ok' END, subagentd_uuid_time(key)
         FROM (SELECT subagentd_uuidv7(t.created_at + k * interval '3 seconds') AS key, t.id, t.tenant, t.model, t.status, k
               FROM tasks t, generate_series(1, 5) k) c",
        "INSERT INTO usage_daily (day, tenant, model, agent_type, api_key, shard, calls, ok, failed, input_tokens,
                                  output_tokens, cached_tokens, cost_usd)
         SELECT (c.created_at AT TIME ZONE 'UTC')::date, c.tenant, c.provider || '/' || c.model, t.subagent_type, '', 0,
                count(*), count(*) FILTER (WHERE c.outcome = 'ok'), count(*) FILTER (WHERE c.outcome <> 'ok'),
                sum(c.input_tokens), sum(c.output_tokens), 0, sum(c.cost_usd)
         FROM llm_calls c JOIN tasks t ON t.id = c.task_id GROUP BY 1, 2, 3, 4",
        "UPDATE tenants SET usd_per_day = 500, usd_per_month = 10000 WHERE name IN ('tenant-1', 'tenant-2')",
        "ANALYZE",
    ];
    for sql in fill {
        sqlx::query(sql).execute(&pool).await.unwrap_or_else(|e| panic!("{e}: {sql}"));
    }
    let (tasks, calls): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM llm_calls)")
            .fetch_one(&pool)
            .await
            .unwrap();
    println!("console: {tasks} tasks and {calls} ledger rows made in {:.0} s", t0.elapsed().as_secs_f64());
    let key = tenant_key(&svc.base, "tenant-7").await;
    let day_ago = (chrono::Utc::now() - chrono::Duration::days(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let checks: Vec<(&str, String, &str)> = vec![
        ("overview, every tenant", "/overview".into(), BENCH_ADMIN),
        ("overview, one tenant", "/overview".into(), &key),
        ("task list, every tenant", "/tasks?limit=50".into(), BENCH_ADMIN),
        ("task list, one tenant", "/tasks?limit=50".into(), &key),
        ("… status=failed, every tenant", "/tasks?status=failed&limit=50".into(), BENCH_ADMIN),
        ("… status=failed, one tenant", "/tasks?status=failed&limit=50".into(), &key),
        ("… model, one tenant", "/tasks?model=fake/claude-sonnet&limit=50".into(), &key),
        ("… model, every tenant", "/tasks?model=fake/local&limit=50".into(), BENCH_ADMIN),
        ("… metadata, one tenant", "/tasks?metadata=%7B%22batch%22%3A%22b500%22%7D&limit=50".into(), &key),
        ("… created_before a day ago, every tenant", format!("/tasks?created_before={day_ago}&limit=50"), BENCH_ADMIN),
    ];
    let (rows, worst) = timed_reads(&svc.base, &checks).await;
    let line = format!(
        "| 6. Console reads: {tasks} tasks, {calls} ledger rows; overview and task list (p50 / p99 over 35 requests each) | under 100 ms | **{}** | {} |",
        rows.join("; "),
        if worst < 100.0 { "met" } else { "not met" }
    );
    println!("{line}");
    report.lock().unwrap().push(line);
}

/// An API key of `tenant`'s, made by the admin.
async fn tenant_key(base: &str, tenant: &str) -> String {
    let key: Value = reqwest::Client::new()
        .post(format!("{base}/admin/keys"))
        .bearer_auth(BENCH_ADMIN)
        .json(&json!({"tenant": tenant}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    key["key"].as_str().unwrap().to_string()
}

/// Each read 40 times (the first 5 to warm up): "name p50 / p99 ms" per read, and the worst p99.
async fn timed_reads(base: &str, checks: &[(&str, String, &str)]) -> (Vec<String>, f64) {
    let c = reqwest::Client::new();
    let mut rows = vec![];
    let mut worst: f64 = 0.0;
    for (name, path, who) in checks {
        let mut v = vec![];
        for i in 0..40 {
            let t = Instant::now();
            let r = c.get(format!("{base}{path}")).bearer_auth(who).send().await.unwrap();
            assert!(r.status().is_success(), "{path}: {}", r.status());
            let _ = r.bytes().await.unwrap();
            if i >= 5 {
                v.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
        let (p50, p99) = (pct(&mut v, 0.5), pct(&mut v, 0.99));
        worst = worst.max(p99);
        println!("reads: {name}: p50 {p50:.1} ms, p99 {p99:.1} ms");
        rows.push(format!("{name} {p50:.1} / {p99:.1} ms"));
    }
    (rows, worst)
}

/// How one waiting request is made: the REST door's `POST /tasks?wait=true`, or a plain MCP
/// `tools/call` of `task` in a session of its own.
#[derive(Clone)]
enum Door {
    /// With a tenant's key, or none (single-user mode); with a priority, or the default.
    Rest {
        key: Option<String>,
        priority: Option<&'static str>,
    },
    Mcp {
        session: String,
    },
    /// A blocking A2A `SendMessage` (JSON-RPC), single-user mode.
    A2a,
}

impl Door {
    async fn mcp(c: &reqwest::Client, base: &str) -> Door {
        let r = c
            .post(format!("{base}/mcp"))
            .json(
                &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
                "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}),
            )
            .send()
            .await
            .unwrap();
        Door::Mcp { session: r.headers()["mcp-session-id"].to_str().unwrap().to_string() }
    }

    /// One task, waited for; whether it completed.
    async fn run(&self, c: &reqwest::Client, base: &str, prompt: &str, model: &str, n: u64) -> bool {
        match self {
            Door::Rest { key, priority } => {
                let mut body = json!({"prompt": prompt, "model": model});
                if let Some(p) = priority {
                    body["priority"] = json!(p);
                }
                let mut r = c.post(format!("{base}/tasks?wait=true&timeout=60")).json(&body);
                if let Some(k) = key {
                    r = r.bearer_auth(k);
                }
                r.send().await.is_ok_and(|r| r.status() == 200)
            }
            Door::Mcp { session } => {
                let body = json!({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": "task",
                    "arguments": {"subagent_type": "general", "description": "bench", "prompt": prompt, "model": model}}});
                let r = c.post(format!("{base}/mcp")).header("mcp-session-id", session).json(&body).send().await;
                match r {
                    Ok(r) if r.status() == 200 => {
                        r.json::<Value>().await.is_ok_and(|v| v["result"]["structuredContent"]["status"] == "completed")
                    }
                    _ => false,
                }
            }
            Door::A2a => {
                let body = json!({"jsonrpc": "2.0", "id": n, "method": "SendMessage", "params": {"message": {
                    "messageId": uuid::Uuid::new_v4().to_string(), "role": "ROLE_USER", "parts": [{"text": prompt}],
                    "metadata": {"model": model}}}});
                let r = c.post(format!("{base}/a2a")).header("a2a-version", "1.0").json(&body).send().await;
                match r {
                    Ok(r) if r.status() == 200 => r
                        .json::<Value>()
                        .await
                        .is_ok_and(|v| v["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"),
                    _ => false,
                }
            }
        }
    }
}

/// `n` concurrent callers through `door` for `secs` (after a 3 s warm-up), each a task at a
/// time with the fake provider at `provider_ms`: each task's time over the provider's own, and
/// how many failed.
async fn waiting_callers(
    base: &str,
    door: impl Fn(usize) -> Door,
    n: usize,
    secs: u64,
    provider_ms: u64,
) -> (Vec<f64>, u64) {
    let client = reqwest::Client::builder().pool_max_idle_per_host(300).build().unwrap();
    let lat: Arc<Mutex<Vec<f64>>> = Arc::default();
    let warm = Instant::now() + Duration::from_secs(3);
    let deadline = warm + Duration::from_secs(secs);
    let failed = Arc::new(AtomicU64::new(0));
    let mut ws = vec![];
    for i in 0..n {
        let (c, base, lat, failed, door) = (client.clone(), base.to_string(), lat.clone(), failed.clone(), door(i));
        let start = Instant::now() + Duration::from_millis(provider_ms * i as u64 / n as u64);
        ws.push(tokio::spawn(async move {
            tokio::time::sleep_until(start.into()).await;
            let mut k = 0;
            while Instant::now() < deadline {
                k += 1;
                let t = Instant::now();
                let run = uuid::Uuid::new_v4().to_string();
                let ok = door.run(&c, &base, &format!("no-tools run:{run}"), "fake/gpt-4o", k).await;
                let took = t.elapsed().as_secs_f64() * 1000.0;
                let provider = PROVIDER_MS.lock().unwrap().as_mut().and_then(|m| m.remove(&run));
                match provider {
                    Some(p) if ok => {
                        if t >= warm {
                            lat.lock().unwrap().push(took - p);
                        }
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for w in ws {
        w.await.unwrap();
    }
    let v = lat.lock().unwrap().clone();
    (v, failed.load(Ordering::Relaxed))
}

/// Scenario 9, the MCP door's overhead: the same task as a plain MCP `tools/call` of `task` and
/// as `POST /tasks?wait=true`, 50 concurrent callers each (one MCP session each), provider 1 s.
async fn mcp_overhead(env: &Env, report: &Report, secs: u64) {
    env.latency.store(1000, Ordering::Relaxed);
    let svc = env
        .service(
            "bench_mcp",
            &["serve"],
            &[("SUBAGENTD_MAX_RUNNING", "400".into()), ("SUBAGENTD_DB_MAX_CONNECTIONS", "40".into())],
        )
        .await;
    let c = reqwest::Client::new();
    let mut sessions = vec![];
    for _ in 0..50 {
        sessions.push(Door::mcp(&c, &svc.base).await);
    }
    let (mut rest, rest_failed) =
        waiting_callers(&svc.base, |_| Door::Rest { key: None, priority: None }, 50, secs, 1000).await;
    let (mut mcp, mcp_failed) = waiting_callers(&svc.base, |i| sessions[i].clone(), 50, secs, 1000).await;
    let (r50, r99, m50, m99) = (pct(&mut rest, 0.5), pct(&mut rest, 0.99), pct(&mut mcp, 0.5), pct(&mut mcp, 0.99));
    let line = format!(
        "| 9. MCP door: a plain `tools/call` of `task` against `POST /tasks?wait=true` (50 concurrent callers each, provider 1000 ms) | ≤ 2 ms p50 extra | **MCP overhead p50 {m50:.1} ms, p99 {m99:.1} ms; REST p50 {r50:.1} ms, p99 {r99:.1} ms: {:+.1} ms p50, {:+.1} ms p99** ({} and {} calls; {} and {} failed) | {} |",
        m50 - r50,
        m99 - r99,
        mcp.len(),
        rest.len(),
        mcp_failed,
        rest_failed,
        if m50 - r50 <= 2.0 && mcp_failed == 0 { "met" } else { "not met" }
    );
    println!("{line}");
    report.lock().unwrap().push(line);
}

/// Scenario 11, the A2A door's overhead: the same task as a blocking A2A `SendMessage` (JSON-RPC)
/// and as `POST /tasks?wait=true`, 50 concurrent callers each, provider 1 s.
async fn a2a_overhead(env: &Env, report: &Report, secs: u64) {
    env.latency.store(1000, Ordering::Relaxed);
    let svc = env
        .service(
            "bench_a2a",
            &["serve"],
            &[("SUBAGENTD_MAX_RUNNING", "400".into()), ("SUBAGENTD_DB_MAX_CONNECTIONS", "40".into())],
        )
        .await;
    let (mut rest, rest_failed) =
        waiting_callers(&svc.base, |_| Door::Rest { key: None, priority: None }, 50, secs, 1000).await;
    let (mut a2a, a2a_failed) = waiting_callers(&svc.base, |_| Door::A2a, 50, secs, 1000).await;
    let (r50, r99, a50, a99) = (pct(&mut rest, 0.5), pct(&mut rest, 0.99), pct(&mut a2a, 0.5), pct(&mut a2a, 0.99));
    let line = format!(
        "| 11. A2A door: a blocking `SendMessage` (JSON-RPC) against `POST /tasks?wait=true` (50 concurrent callers each, provider 1000 ms) | ≤ 2 ms p50 extra | **A2A overhead p50 {a50:.1} ms, p99 {a99:.1} ms; REST p50 {r50:.1} ms, p99 {r99:.1} ms: {:+.1} ms p50, {:+.1} ms p99** ({} and {} calls; {} and {} failed) | {} |",
        a50 - r50,
        a99 - r99,
        a2a.len(),
        rest.len(),
        a2a_failed,
        rest_failed,
        if a50 - r50 <= 2.0 && a2a_failed == 0 { "met" } else { "not met" }
    );
    println!("{line}");
    report.lock().unwrap().push(line);
}

/// Scenario 12, live output: the service CPU a subscriber costs per 1,000 deltas. 50 tasks each
/// stream a 2,000-piece answer over about 20 s (a piece every 10 ms); run once with nobody
/// watching, once with an SSE subscriber on each task; the difference in the service's CPU
/// time, per 1,000 `output_delta` events the subscribers received.
async fn live(env: &Env, report: &Report) {
    const TASKS: usize = 50;
    env.latency.store(0, Ordering::Relaxed);
    STREAM_PIECES.store(2000, Ordering::Relaxed);
    STREAM_GAP_MS.store(10, Ordering::Relaxed);
    let svc = env
        .service(
            "bench_live",
            &["serve"],
            &[("SUBAGENTD_MAX_RUNNING", "200".into()), ("SUBAGENTD_DB_MAX_CONNECTIONS", "40".into())],
        )
        .await;
    let client = reqwest::Client::new();
    let mut rows = vec![];
    for watched in [false, true] {
        let (_, cpu0) = cpu_seconds(svc.child.id());
        let t0 = Instant::now();
        let mut ids = vec![];
        for i in 0..TASKS {
            let r = client
                .post(format!("{}/tasks", svc.base))
                .json(&json!({"prompt": format!("no-tools live {i} {watched}"), "model": "fake/m"}))
                .send()
                .await
                .unwrap();
            ids.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string());
        }
        let readers: Vec<_> = ids
            .iter()
            .map(|id| {
                let (c, url) = (client.clone(), format!("{}/tasks/{id}/events", svc.base));
                tokio::spawn(async move {
                    if !watched {
                        // Wait for the end without a stream: poll the task.
                        loop {
                            let t: Value =
                                c.get(url.trim_end_matches("/events")).send().await.unwrap().json().await.unwrap();
                            if t["finished_at"].is_string() {
                                return 0u64;
                            }
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                    let r = c.get(url).header("accept", "text/event-stream").send().await.unwrap();
                    let mut s = r.bytes_stream();
                    let mut deltas = 0u64;
                    let mut buf = String::new();
                    while let Some(Ok(b)) = futures_util::StreamExt::next(&mut s).await {
                        buf.push_str(&String::from_utf8_lossy(&b));
                        while let Some(end) = buf.find("\n\n") {
                            let ev: String = buf.drain(..end + 2).collect();
                            deltas += u64::from(ev.contains("event: output_delta"));
                        }
                    }
                    deltas
                })
            })
            .collect();
        let mut deltas = 0;
        for r in readers {
            deltas += r.await.unwrap();
        }
        let (_, cpu1) = cpu_seconds(svc.child.id());
        rows.push((watched, cpu1 - cpu0, deltas, t0.elapsed().as_secs_f64()));
    }
    STREAM_PIECES.store(0, Ordering::Relaxed);
    let (_, unwatched_cpu, _, unwatched_s) = rows[0];
    let (_, watched_cpu, deltas, watched_s) = rows[1];
    let per_k = (watched_cpu - unwatched_cpu) * 1000.0 / (deltas.max(1) as f64) * 1000.0;
    let line = format!(
        "| 12. Live output: {TASKS} tasks each streaming 2,000 pieces over ~20 s, unwatched, then each with an SSE subscriber | — | **{per_k:.1} ms of service CPU per 1,000 deltas** ({deltas} deltas; service CPU {unwatched_cpu:.2} s unwatched in {unwatched_s:.1} s, {watched_cpu:.2} s watched in {watched_s:.1} s) | — |"
    );
    println!("{line}");
    report.lock().unwrap().push(line);
}

/// Scenario 13, priority: a tenant's high-priority wait-mode requests (20 callers, provider
/// 1 s) with its running limit (100), first alone, then beside 10,000 of its own low-priority
/// tasks queued behind that limit; and the plan of the claim's pick.
async fn priority(env: &Env, report: &Report, secs: u64) {
    env.latency.store(1000, Ordering::Relaxed);
    let svc = env
        .service(
            "bench_prio",
            &["serve"],
            &[
                ("SUBAGENTD_MAX_RUNNING", "400".into()),
                ("SUBAGENTD_DB_MAX_CONNECTIONS", "40".into()),
                ("SUBAGENTD_DEFAULT_MAX_RUNNING", "100".into()),
            ],
        )
        .await;
    let high = |_| Door::Rest { key: None, priority: Some("high") };
    let (mut alone, alone_failed) = waiting_callers(&svc.base, high, 20, secs, 1000).await;
    // The backlog: 10,000 low-priority tasks of the same tenant.
    let client = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    let made = Arc::new(AtomicU64::new(0));
    let mut subs = vec![];
    for _ in 0..32 {
        let (c, base, made) = (client.clone(), svc.base.clone(), made.clone());
        subs.push(tokio::spawn(async move {
            while made.fetch_add(1, Ordering::Relaxed) < 10_000 {
                let body = json!({"prompt": "no-tools backlog", "model": "fake/gpt-4o", "priority": "low"});
                let _ = c.post(format!("{base}/tasks")).json(&body).send().await;
            }
        }));
    }
    for s in subs {
        let _ = s.await;
    }
    let pool = subagentd::db::connect(&svc.db_url, 2).await.unwrap();
    let queued: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'queued'").fetch_one(&pool).await.unwrap();
    let (mut beside, beside_failed) = waiting_callers(&svc.base, high, 20, secs, 1000).await;
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'queued'").fetch_one(&pool).await.unwrap();
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN (COSTS OFF) SELECT id, priority FROM tasks q
         WHERE q.status = 'queued' AND q.tenant = 'default' AND q.waiting_for IS NULL
         ORDER BY q.priority DESC, q.id LIMIT 100 FOR UPDATE SKIP LOCKED",
    )
    .fetch_all(&pool)
    .await
    .unwrap_or_default();
    println!("claim's pick, planned with {left} queued:\n{}", plan.join("\n"));
    let (a50, a99, b50, b99) =
        (pct(&mut alone, 0.5), pct(&mut alone, 0.99), pct(&mut beside, 0.5), pct(&mut beside, 0.99));
    let line = format!(
        "| 13. Priority: a tenant's high-priority waits (20 callers, provider 1000 ms, its running limit 100), alone and beside 10,000 of its own low-priority tasks queued behind that limit | as without the backlog | **overhead p50 {b50:.1} ms, p99 {b99:.1} ms beside the backlog ({queued} queued at the start, {left} at the end), against p50 {a50:.1} ms, p99 {a99:.1} ms alone** ({} and {} calls; {} and {} failed); the claim's pick: `{}` | — |",
        beside.len(),
        alone.len(),
        beside_failed,
        alone_failed,
        plan.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" / ")
    );
    println!("{line}");
    report.lock().unwrap().push(line);
}

/// Scenario 10, held connections: the memory 1,000 open event streams cost, and tenant B's waits
/// while tenant A holds its `max_streams` on a task that writes many events.
async fn holds(env: &Env, report: &Report, secs: u64) {
    const STREAMS: usize = 1000;
    env.latency.store(1000, Ordering::Relaxed);
    let svc = env
        .service(
            "bench_holds",
            &["serve"],
            &[
                ("SUBAGENTD_MAX_RUNNING", "400".into()),
                ("SUBAGENTD_DB_MAX_CONNECTIONS", "40".into()),
                ("SUBAGENTD_ADMIN_TOKEN", BENCH_ADMIN.into()),
            ],
        )
        .await;
    let c = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let (a, b) = (tenant_key(&svc.base, "a").await, tenant_key(&svc.base, "b").await);
    let r = c
        .put(format!("{}/admin/tenants/a", svc.base))
        .bearer_auth(BENCH_ADMIN)
        .json(&json!({"max_streams": STREAMS}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    // B's waits with nobody else around, first.
    let as_b = |_| Door::Rest { key: Some(b.clone()), priority: None };
    let (mut alone, _) = waiting_callers(&svc.base, as_b, 50, secs, 1000).await;
    // A's task: a turn every 800 ms for half a minute and more, each turn a handful of events.
    let t: Value = c
        .post(format!("{}/tasks", svc.base))
        .bearer_auth(&a)
        .json(&json!({"prompt": "[mock:tool_turns=45] [mock:delay_ms=800]", "model": "mock/m", "max_turns": 50}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = t["id"].as_str().unwrap().to_string();
    let before = rss_mib(svc.child.id());
    let mut streams = vec![];
    for _ in 0..STREAMS {
        let r = c
            .get(format!("{}/tasks/{id}/events", svc.base))
            .bearer_auth(&a)
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        streams.push(r);
    }
    let refused = c
        .get(format!("{}/tasks/{id}/events", svc.base))
        .bearer_auth(&a)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap()
        .status();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let with_streams = rss_mib(svc.child.id());
    // Every stream read, so that the events flow while B waits.
    let readers: Vec<_> = streams
        .into_iter()
        .map(|r| {
            tokio::spawn(async move {
                let mut s = r.bytes_stream();
                while let Some(Ok(_)) = futures_util::StreamExt::next(&mut s).await {}
            })
        })
        .collect();
    let (mut beside, failed) = waiting_callers(&svc.base, as_b, 50, secs, 1000).await;
    for r in readers {
        r.abort();
    }
    let (a50, a99, b50, b99) =
        (pct(&mut alone, 0.5), pct(&mut alone, 0.99), pct(&mut beside, 0.5), pct(&mut beside, 0.99));
    let line = format!(
        "| 10. Held connections: {STREAMS} event streams of tenant A on one task (a turn every 800 ms), tenant B's 50 concurrent waits (provider 1000 ms) | B's waits as without A | **{:.1} MiB per 1,000 open streams ({before:.0} → {with_streams:.0} MiB); stream {} refused with {refused}; B's wait overhead p50 {b50:.1} ms, p99 {b99:.1} ms beside A's streams, against p50 {a50:.1} ms, p99 {a99:.1} ms alone; {failed} failed** | — |",
        (with_streams - before) * 1000.0 / STREAMS as f64,
        STREAMS + 1,
    );
    println!("{line}");
    report.lock().unwrap().push(line);
}

/// 5. The same machine's pgbench simple-update TPS.
async fn pgbench(env: &Env, report: &Report) {
    // PATH may hold symlinks to the server binaries only: pgbench sits beside the real ones.
    let bin = subagentd::db::embedded::find_bin_dir(None).unwrap();
    let bin = std::fs::canonicalize(bin.join("postgres"))
        .ok()
        .and_then(|p| p.parent().map(|d| d.to_path_buf()))
        .unwrap_or(bin);
    let url = env.pg.url("postgres");
    let run = |args: &[&str]| Command::new(bin.join("pgbench")).args(args).arg(&url).output().unwrap();
    let init = run(&["-i", "-q", "-s", "10"]);
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let out = run(&["-N", "-c", "8", "-j", "2", "-T", "20", "-n"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let tps = text.lines().find(|l| l.starts_with("tps")).unwrap_or("tps = ?").to_string();
    let line = format!("| 5. PostgreSQL ceiling (`pgbench -N -c 8 -j 2 -T 20`, scale 10, same machine, fsync on) | a reference | **{}** | — |", tps.trim());
    println!("{line}");
    report.lock().unwrap().push(line);
}

/// Append one run's figures to `benches/results.jsonl` (BENCHMARKS.md's history; print a
/// scenario's with `python3 benches/history.py SCENARIO`): the scenario, its figures, the commit,
/// the machine and the date. `BENCH_NO_RESULTS=1` leaves the file alone.
/// Recorded: throughput, wait mode, admission, concurrency and history.
fn record(scenario: &str, figures: serde_json::Value) {
    if std::env::var("BENCH_NO_RESULTS").is_ok_and(|v| v == "1") {
        return;
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let line = serde_json::json!({
        "scenario": scenario,
        "figures": figures,
        "commit": commit,
        // A short name of the machine (`BENCH_MACHINE`, as BENCHMARKS.md's machines table names
        // them), else its description.
        "machine": std::env::var("BENCH_MACHINE").unwrap_or_else(|_| machine()),
        "date": chrono::Utc::now().format("%Y-%m-%d").to_string(),
        "harness": "cargo bench --bench load",
    });
    use std::io::Write;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/results.jsonl");
    match std::fs::OpenOptions::new().create(true).append(true).open(path) {
        Ok(mut f) => {
            let _ = writeln!(f, "{line}");
            println!("appended to benches/results.jsonl: {scenario}");
        }
        Err(e) => println!("benches/results.jsonl not written: {e}"),
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_string();
    let cores = cpu.lines().filter(|l| l.starts_with("processor")).count();
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kb: f64 =
        mem.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    format!("{cores} cores ({model}), {:.0} GiB RAM, Linux", kb / 1024.0 / 1024.0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let which: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let all = which.is_empty() || which.iter().any(|w| w == "all");
    let want = |s: &str| all || which.iter().any(|w| w == s);
    let env = Env::start().await;
    let report: Report = Arc::default();
    let env_u64 = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    STREAM_PIECES.store(env_u64("BENCH_STREAM_PIECES").unwrap_or(0), Ordering::Relaxed);
    STREAM_GAP_MS.store(env_u64("BENCH_STREAM_GAP_MS").unwrap_or(0), Ordering::Relaxed);
    if which.iter().any(|w| w == "history") {
        let n = std::env::var("BENCH_HISTORY_TASKS").ok().and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
        let secs = std::env::var("BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
        history(&env, &report, n, secs).await;
    }
    if want("throughput") {
        throughput(&env, &report, std::env::var("BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60)).await;
    }
    if want("concurrency") {
        concurrency(&env, &report, 10_000).await;
    }
    if want("wait") || which.iter().any(|w| w == "wait1000") {
        let waiters = std::env::var("BENCH_WAITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
        wait_mode(&env, &report, 20, 1000, waiters).await;
    }
    if want("wait") {
        wait_mode(&env, &report, 20, 100, 200).await;
    }
    if want("waitsat") {
        let tasks = std::env::var("BENCH_WAITSAT_TASKS").ok().and_then(|s| s.parse().ok()).unwrap_or(5000);
        wait_saturated(&env, &report, tasks, 50).await;
    }
    if which.iter().any(|w| w == "wait1") {
        wait_mode(&env, &report, 10, 100, 1).await;
    }
    if want("admission") {
        admission(&env, &report, 30, 1000).await;
    }
    if want("pgbench") {
        pgbench(&env, &report).await;
    }
    if which.iter().any(|w| w == "console") {
        console(&env, &report).await;
    }
    if which.iter().any(|w| w == "soak") {
        let secs = std::env::var("BENCH_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(1800);
        let rate = std::env::var("BENCH_SOAK_RATE").ok().and_then(|s| s.parse().ok()).unwrap_or(250);
        soak(&env, &report, secs, rate).await;
    }
    if want("mcp") {
        mcp_overhead(&env, &report, 20).await;
    }
    if want("a2a") {
        a2a_overhead(&env, &report, 20).await;
    }
    if want("holds") {
        holds(&env, &report, 20).await;
    }
    if want("live") {
        live(&env, &report).await;
    }
    if want("priority") {
        priority(&env, &report, 20).await;
    }
    if want("connections") {
        connections(&env, &report, 1000).await;
    }
    if want("webfetch") {
        web_fetches(&env, &report, 100).await;
    }
    if want("workspace") {
        workspace(&env, &report, 10_000, 50).await;
    }
    if want("flood") {
        flood(&env, &report, 20, None).await;
        flood(&env, &report, 20, Some(100)).await;
    }
    if all {
        let commit = Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let lines = report.lock().unwrap().clone();
        let per_task = lines.iter().find_map(|l| l.strip_prefix("@per_task ")).unwrap_or("?").to_string();
        let rows: Vec<String> = lines.into_iter().filter(|l| !l.starts_with('@')).collect();
        let date = chrono::Utc::now().format("%Y-%m-%d");
        let md = format!(
            "# Benchmarks\n\nMeasured {date} on {}, commit `{commit}`, with `cargo bench --bench load` (release build). The harness starts its own PostgreSQL 15 (durable defaults: fsync on, synchronous commit), a fake OpenAI-compatible provider and a tool server on loopback, and the real `subagentd` binary; the load generator, the fakes, the service and PostgreSQL share the 2 cores.\n\n| scenario | target | measured | |\n| --- | --- | --- | --- |\n{}\n\nDatabase transactions per completed task in scenario 1 (submission included): **{per_task}**.\n",
            machine(),
            rows.join("\n")
        );
        std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/BENCHMARKS.md.new"), md).unwrap();
        println!("wrote BENCHMARKS.md.new");
    }
    drop(env.pg);
    let _ = std::fs::remove_dir_all(&env.dir);
}
