use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;

#[tokio::test]
async fn healthz_and_readyz_are_ok_with_a_migrated_database() {
    let app = spawn_app_with(|_| {}, false).await;
    let h = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(h.status(), 200);
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "ready");
    app.stop().await;
}

#[tokio::test]
async fn readyz_fails_while_the_database_is_unreachable_and_recovers_after() {
    let app = spawn_app_with(|c| c.db_max_connections = 2, false).await;
    set_db_reachable(&app.db, false).await;
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_problem(r, 503, "unavailable").await;
    // Liveness does not depend on the database.
    assert_eq!(app.client.get(app.url("/healthz")).send().await.unwrap().status(), 200);

    set_db_reachable(&app.db, true).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let r = app.client.get(app.url("/readyz")).send().await.unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not ready again after the database returned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await;
}

/// With no `DATABASE_URL`, the binary bootstraps its own cluster in its data directory, talks
/// to it over the cluster's Unix socket, and serves; a second start reuses the cluster.
#[tokio::test]
async fn without_database_url_the_binary_runs_its_own_postgres_over_a_unix_socket() {
    let dir = std::env::temp_dir().join(format!("subagentd-embedded-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.join("data");
    let client = reqwest::Client::new();
    for round in 0..2 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let base = format!("http://127.0.0.1:{port}");
        // Killed on drop, should an assertion fail first.
        let mut proc = Proc {
            child: std::process::Command::new(env!("CARGO_BIN_EXE_subagentd"))
                .arg("serve")
                .env_remove("DATABASE_URL")
                .env("SUBAGENTD_DATA_DIR", &data)
                .env("SUBAGENTD_LISTEN", format!("127.0.0.1:{port}"))
                .env("RUST_LOG", "warn")
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        };
        let mut ready = false;
        for _ in 0..600 {
            if client.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ready, "round {round}: the service never became ready");
        let r = client
            .post(format!("{base}/tasks?wait=true&timeout=30"))
            .json(&serde_json::json!({"prompt": "hello", "model": "mock/m"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "round {round}");
        let t: Value = r.json().await.unwrap();
        assert_eq!(t["status"], "completed");
        // The cluster's socket sits in its data directory.
        // This start's port is line 4 of postmaster.pid; its socket must be there.
        let pid_file = std::fs::read_to_string(data.join("pg").join("postmaster.pid")).unwrap();
        let port = pid_file.lines().nth(3).unwrap().trim().to_string();
        assert!(
            data.join("pg").join(format!(".s.PGSQL.{port}")).exists(),
            "round {round}: no Unix socket in the data directory"
        );
        // … and the service's connections come over it (no client address), none over TCP.
        let pw = std::fs::read_to_string(data.join("pg.password")).unwrap();
        let url = format!(
            "postgres://postgres:{}@localhost:{}/subagentd?host={}",
            pw.trim(),
            port,
            data.join("pg").display()
        );
        let pool = subagentd::db::connect(&url, 1).await.unwrap();
        let (unix, tcp): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE client_addr IS NULL), count(*) FILTER (WHERE client_addr IS NOT NULL)
             FROM pg_stat_activity WHERE datname = 'subagentd' AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        pool.close().await;
        assert!(unix > 0 && tcp == 0, "round {round}: {unix} connections over the socket, {tcp} over TCP");
        let listed: Value = client.get(format!("{base}/tasks")).send().await.unwrap().json().await.unwrap();
        assert_eq!(listed["tasks"].as_array().map(Vec::len), Some(round + 1), "round {round}: the cluster is reused");
        unsafe { libc::kill(proc.child.id() as i32, libc::SIGTERM) };
        let pid = proc.child.id();
        let waited =
            tokio::time::timeout(Duration::from_secs(30), tokio::task::spawn_blocking(move || proc.child.wait())).await;
        if waited.is_err() {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        assert!(waited.is_ok(), "round {round}: the service (pid {pid}) did not stop on SIGTERM");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
