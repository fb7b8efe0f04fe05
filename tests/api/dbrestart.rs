//! The database restarts under load, on a private cluster (not the one the other tests share):
//! a crash (`pg_ctl restart -m immediate`), and a stop of 20 seconds. Every task completes, once;
//! waiting requests are answered; `/readyz` tells the truth; no attempt is spent on the outage.
//! Figures go to RELIABILITY.md.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subagentd::db::embedded::{EmbeddedOptions, EmbeddedPostgres};
use uuid::Uuid;

use crate::helpers::*;

struct Private {
    pg: Option<EmbeddedPostgres>,
    opts: EmbeddedOptions,
    url: String,
    pool: sqlx::PgPool,
    _dir: std::path::PathBuf,
}

/// A cluster of its own, durable (fsync on: a crash must lose nothing committed), migrated.
async fn private_cluster() -> Private {
    // Under this process's own directory: the shared cluster's start removes every directory of
    // the root not named by a live process id.
    let dir = std::env::temp_dir()
        .join("subagentd-test-pg")
        .join(std::process::id().to_string())
        .join(format!("restart-{}", Uuid::new_v4().simple()));
    let opts = EmbeddedOptions {
        data_dir: dir.join("pg"),
        bin_dir: std::env::var_os("SUBAGENTD_PG_BIN_DIR").map(Into::into),
        fast_unsafe: false,
        max_connections: 200,
        settings: vec![],
    };
    std::fs::create_dir_all(&dir).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        for d in [dir.parent().unwrap(), &dir] {
            let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755));
        }
    }
    let o2 =
        EmbeddedOptions { data_dir: opts.data_dir.clone(), bin_dir: opts.bin_dir.clone(), settings: vec![], ..opts };
    let pg = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&o2).unwrap()).await.unwrap();
    let url = pg.url("postgres");
    let pool = subagentd::db::connect(&url, 4).await.unwrap();
    subagentd::db::MIGRATOR.run(&pool).await.unwrap();
    Private { pg: Some(pg), opts, url, pool, _dir: dir }
}

/// `serve` (API and a worker) and one more worker, with the default lease.
async fn start_service(p: &Private) -> (Vec<Proc>, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let env = [
        ("SUBAGENTD_LISTEN", listen.as_str()),
        ("SUBAGENTD_LEASE_SECONDS", "30"),
        ("SUBAGENTD_HEARTBEAT_SECONDS", "10"),
    ];
    let procs = vec![spawn_binary(&["serve"], &p.url, &env), spawn_binary(&["worker"], &p.url, &env[1..])];
    let base = format!("http://{listen}");
    let client = reqwest::Client::new();
    wait_until_ok(&client, &format!("{base}/readyz"), Duration::from_secs(30)).await;
    (procs, base)
}

/// Submit `n` background tasks and `waiting` wait=true requests (answered later).
async fn load(base: &str, n: usize, waiting: usize) -> (Vec<Uuid>, Vec<tokio::task::JoinHandle<(u16, Value)>>) {
    let client = reqwest::Client::new();
    let mut ids = vec![];
    for i in 0..n {
        let r = client
            .post(format!("{base}/tasks"))
            .json(&json!({"prompt": format!("job {i} [mock:tool_turns=3] [mock:delay_ms=250]"), "model": "mock/m"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        ids.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().parse().unwrap());
    }
    let waits = (0..waiting)
        .map(|i| {
            let (client, base) = (client.clone(), base.to_string());
            tokio::spawn(async move {
                let r = client
                    .post(format!("{base}/tasks?wait=true&timeout=90"))
                    .json(&json!({"prompt": format!("waiting {i} [mock:tool_turns=3] [mock:delay_ms=250]"), "model": "mock/m"}))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                (status, r.json::<Value>().await.unwrap_or(Value::Null))
            })
        })
        .collect();
    (ids, waits)
}

/// `/readyz` answers: when asked, when answered, and the status (0: none came). An answer is
/// true of some moment between the two.
type Seen = Arc<Mutex<Vec<(Instant, Instant, u16)>>>;

/// Watch `/readyz` every 100 ms until the token is cancelled.
fn watch_readyz(base: &str) -> (Seen, tokio_util::sync::CancellationToken) {
    let seen: Seen = Arc::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let (s, st, base) = (seen.clone(), stop.clone(), base.to_string());
    tokio::spawn(async move {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
        while !st.is_cancelled() {
            // Stamped when asked: an answer that took its second to come says how things were then.
            let asked = Instant::now();
            let code = client.get(format!("{base}/readyz")).send().await.map(|r| r.status().as_u16()).unwrap_or(0);
            s.lock().unwrap().push((asked, Instant::now(), code));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (seen, stop)
}

/// Time from `back` until a new task submitted with wait=true completes.
async fn time_to_service(base: &str, back: Instant) -> Duration {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    loop {
        let r = client
            .post(format!("{base}/tasks?wait=true&timeout=20"))
            .json(&json!({"prompt": "probe", "model": "mock/m"}))
            .send()
            .await;
        if let Ok(r) = r {
            if r.status() == 200 && r.json::<Value>().await.map(|t| t["status"] == "completed").unwrap_or(false) {
                return back.elapsed();
            }
        }
        assert!(back.elapsed() < Duration::from_secs(90), "service did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn assert_all_done_once(pool: &sqlx::PgPool, ids: &[Uuid]) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let open: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status IN ('queued', 'running')")
            .fetch_one(pool)
            .await
            .unwrap();
        if open == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{open} tasks unfinished after the restart");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let bad: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT id, status FROM tasks WHERE id = ANY($1) AND status <> 'completed'")
            .bind(ids)
            .fetch_all(pool)
            .await
            .unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    let twice: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT task_id, count(*) FROM task_event_log WHERE kind = 'finished' GROUP BY task_id HAVING count(*) <> 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(twice.is_empty(), "finished twice: {twice:?}");
    let billed: Vec<(Uuid, i32, i64)> = sqlx::query_as(
        "SELECT task_id, turn, count(*) FROM llm_calls WHERE outcome = 'ok' GROUP BY task_id, turn HAVING count(*) > 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(billed.is_empty(), "a turn billed twice: {billed:?}");
    sqlx::query_scalar("SELECT coalesce(max(attempt), 0)::bigint FROM tasks").fetch_one(pool).await.unwrap()
}

async fn scenario(name: &str, downtime: Option<Duration>) {
    let mut p = private_cluster().await;
    let (_procs, base) = start_service(&p).await;
    let (ids, waits) = load(&base, 40, 6).await;
    let (readyz, stop_watch) = watch_readyz(&base);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let down = Instant::now();
    let opts = EmbeddedOptions {
        data_dir: p.opts.data_dir.clone(),
        bin_dir: p.opts.bin_dir.clone(),
        settings: vec![],
        fast_unsafe: false,
        max_connections: p.opts.max_connections,
    };
    let mut pg = p.pg.take().unwrap();
    let pg = tokio::task::spawn_blocking(move || {
        match downtime {
            None => pg.crash(),
            Some(d) => {
                pg.stop();
                std::thread::sleep(d);
            }
        }
        let starting = Instant::now();
        pg.start_again(&opts).unwrap();
        (pg, starting)
    })
    .await
    .unwrap();
    let (pg, starting) = pg;
    let back = Instant::now();
    p.pg = Some(pg);
    // The test's own connections died with the server.
    p.pool.close().await;
    p.pool = subagentd::db::connect(&p.url, 4).await.unwrap();
    let to_service = time_to_service(&base, back).await;
    let max_attempt = assert_all_done_once(&p.pool, &ids).await;
    let mut answered = vec![];
    for w in waits {
        let (status, body) =
            tokio::time::timeout(Duration::from_secs(120), w).await.expect("a waiting request hung").unwrap();
        assert!(status == 200 || status == 202, "a waiting request got {status}: {body}");
        answered.push(status);
    }
    stop_watch.cancel();
    let seen = readyz.lock().unwrap().clone();
    // Answered wholly while the database was down; asked once the service was back.
    let during: Vec<u16> = seen
        .iter()
        .filter(|(asked, answered, _)| *asked > down + Duration::from_millis(500) && *answered < starting)
        .map(|s| s.2)
        .collect();
    let after: Vec<u16> = seen.iter().filter(|(asked, _, _)| *asked > back + to_service).map(|s| s.2).collect();
    if downtime.is_some() {
        assert!(
            !during.is_empty() && during.iter().all(|c| *c != 200),
            "/readyz said ready while the database was down: {during:?}"
        );
    }
    assert!(after.iter().all(|c| *c == 200), "/readyz after the service was back: {after:?}");
    p.pool.close().await;
    println!(
        "RELIABILITY db {name}: tasks={} waiting_requests={} answered={answered:?} max_attempt={max_attempt} \
         down_ms={} time_to_full_service_ms={} readyz_while_down={:?}",
        ids.len(),
        answered.len(),
        (back - down).as_millis(),
        to_service.as_millis(),
        during.iter().collect::<std::collections::BTreeSet<_>>()
    );
    assert_eq!(max_attempt, 1, "no attempt was spent on the outage");
}

#[tokio::test]
async fn a_database_crash_under_load_loses_nothing_and_spends_no_attempt() {
    scenario("crash (restart -m immediate)", None).await;
}

#[tokio::test]
async fn a_database_stopped_for_20_seconds_under_load_loses_nothing_and_spends_no_attempt() {
    scenario("stopped 20 s", Some(Duration::from_secs(20))).await;
}
