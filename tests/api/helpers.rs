//! Test harness: one Postgres cluster per test process (the embedded bootstrap unless
//! `DATABASE_URL` is set), a fresh database per test cloned from a migrated template, the app
//! on an ephemeral port, and the real binary for multi-process tests.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::Value;
use sqlx::{Connection, PgConnection, PgPool};
use subagentd::config::Config;
use subagentd::db::embedded::{EmbeddedOptions, EmbeddedPostgres};
use subagentd::engine::definitions::FileAgents;
use subagentd::llm::Providers;
use subagentd::service::{Roles, Service};

/// The URL of a database on the test cluster, by name.
type UrlFor = Box<dyn Fn(&str) -> String + Send + Sync>;

struct Cluster {
    url_for: UrlFor,
    template: String,
    _pg: Option<EmbeddedPostgres>,
}

fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        // Its own thread and runtime: the caller may be inside a test's runtime.
        std::thread::spawn(start_cluster).join().expect("cluster start panicked")
    })
}

fn start_cluster() -> Cluster {
    let (url_for, pg): (UrlFor, _) = match std::env::var("DATABASE_URL") {
        Ok(url) => {
            let base = url::Url::parse(&url).expect("DATABASE_URL is a URL");
            (
                Box::new(move |db: &str| {
                    let mut u = base.clone();
                    u.set_path(db);
                    u.to_string()
                }),
                None,
            )
        }
        Err(_) => {
            let root = std::env::temp_dir().join("subagentd-test-pg");
            clean_stale(&root);
            let opts = EmbeddedOptions {
                data_dir: root.join(std::process::id().to_string()).join("pg"),
                bin_dir: std::env::var_os("SUBAGENTD_PG_BIN_DIR").map(Into::into),
                fast_unsafe: true,
                max_connections: 400,
                settings: vec![],
            };
            std::fs::create_dir_all(opts.data_dir.parent().unwrap()).unwrap();
            open_dirs(&root);
            let pg = EmbeddedPostgres::start(&opts).unwrap_or_else(|e| panic!("{e}"));
            let base = pg.url("");
            (Box::new(move |db: &str| format!("{base}{db}")), Some(pg))
        }
    };
    let template = format!("sat_tpl_{}", std::process::id());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let admin = subagentd::db::connect(&url_for("postgres"), 1).await.expect("connect to test cluster");
        sqlx::query(&format!("DROP DATABASE IF EXISTS {template}")).execute(&admin).await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {template}")).execute(&admin).await.unwrap();
        admin.close().await;
        let tpl = subagentd::db::connect(&url_for(&template), 1).await.unwrap();
        subagentd::db::MIGRATOR.run(&tpl).await.expect("migrate template");
        tpl.close().await;
    });
    Cluster { url_for, template, _pg: pg }
}

/// Remove clusters of earlier test runs whose process is gone.
fn clean_stale(root: &std::path::Path) {
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let alive = e
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
            .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The cluster may run as an unprivileged user: let it reach its directory.
fn open_dirs(root: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755));
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let _ = std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o755));
    }
}

pub struct TestDb {
    pub url: String,
    pub pool: PgPool,
    pub name: String,
}

/// Hold every insert into `table` of this database `secs` seconds (a trigger): a write as a busy
/// database or a slow admission holds it, to show what a door does meanwhile.
pub async fn hold_inserts(pool: &PgPool, table: &str, secs: f64) {
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION hold_{table}() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_sleep({secs}); RETURN NEW; END $$;
         CREATE TRIGGER hold_{table} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION hold_{table}();"
    ))
    .execute(pool)
    .await
    .unwrap();
}

pub async fn test_db() -> TestDb {
    // Service warnings (a failing claim, say) show in the output of a failing test.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    let c = cluster();
    let name = format!("sat_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&(c.url_for)("postgres")).await.expect("admin connect");
    // A template may be briefly busy while another test clones it: retry.
    for i in 0.. {
        match sqlx::query(&format!("CREATE DATABASE {name} TEMPLATE {}", c.template)).execute(&mut admin).await {
            Ok(_) => break,
            Err(e) if i < 50 => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("create test database: {e}"),
        }
    }
    admin.close().await.ok();
    let url = (c.url_for)(&name);
    let pool = subagentd::db::connect(&url, 5).await.expect("connect test db");
    TestDb { url, pool, name }
}

/// Shut a database's doors: terminate its connections and refuse new ones (or open them again).
pub async fn set_db_reachable(db: &TestDb, reachable: bool) {
    let mut admin = PgConnection::connect(&(cluster().url_for)("postgres")).await.unwrap();
    sqlx::query(&format!("ALTER DATABASE {} ALLOW_CONNECTIONS {reachable}", db.name))
        .execute(&mut admin)
        .await
        .unwrap();
    if !reachable {
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
            .bind(&db.name)
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

pub fn test_config(db_url: &str) -> Config {
    let mut cfg = Config::defaults();
    cfg.database_url = Some(db_url.to_string());
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.poll_interval_ms = 200;
    cfg.heartbeat_seconds = 1;
    cfg.lease_seconds = 5;
    cfg.db_max_connections = 8;
    cfg.drain_grace_seconds = 2;
    // The built-in tools are off in the in-process apps, so that what a run is offered is the
    // test's own tools; tests/api/web.rs turns them on.
    cfg.builtin_tools_off =
        "web_fetch,web_search,list_directory,glob,grep,read_file,write_file,edit_file,run_command".into();
    // Each app its own workspace cache and tasks' copies, out of the working directory.
    let own = uuid::Uuid::new_v4().simple();
    cfg.workspace_dir = Some(apps_dir().join(format!("ws-{own}")));
    cfg.sandbox_dir = Some(apps_dir().join(format!("sb-{own}")));
    cfg
}

/// Where this test process's apps keep their workspace caches and tasks' copies: a directory of
/// its own (named by its pid) under the temporary directory. The directories of test processes
/// that are gone are removed when the first app of a run asks for it, so runs leave no more than
/// their own behind.
fn apps_dir() -> &'static std::path::Path {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = std::env::temp_dir();
        subagentd::jobs::copy::sweep_gone_processes(&tmp, "subagentd-test-apps-");
        tmp.join(format!("subagentd-test-apps-{}", std::process::id()))
    })
}

pub struct TestApp {
    pub base: String,
    pub db: TestDb,
    pub client: reqwest::Client,
    pub service: Option<Service>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}, true).await
}

/// An app whose own retention passes are off (both windows 0), for a test that runs them.
pub async fn spawn_app_without_retention() -> TestApp {
    spawn_app_with(
        |c| {
            c.retention_days = 0;
            c.ledger_retention_days = 0;
        },
        true,
    )
    .await
}

/// What a test app runs with besides its config.
pub struct AppOptions {
    pub workers: bool,
    pub providers: Providers,
    pub file_agents: FileAgents,
}

impl Default for AppOptions {
    fn default() -> Self {
        AppOptions { workers: true, providers: Providers::with_builtin(), file_agents: FileAgents::default() }
    }
}

/// The app with workers (or API only), its config adjusted by `tweak`.
pub async fn spawn_app_with(tweak: impl FnOnce(&mut Config), workers: bool) -> TestApp {
    spawn_app_opts(tweak, AppOptions { workers, ..AppOptions::default() }).await
}

pub async fn spawn_app_opts(tweak: impl FnOnce(&mut Config), opts: AppOptions) -> TestApp {
    let db = test_db().await;
    let mut cfg = test_config(&db.url);
    let default_size = cfg.db_max_connections;
    tweak(&mut cfg);
    // A test that sizes the pool gets a pool of that size (the shared one has 5 connections).
    let pool = if cfg.db_max_connections == default_size {
        db.pool.clone()
    } else {
        subagentd::db::connect(&db.url, cfg.db_max_connections).await.expect("connect")
    };
    let service = Service::start(
        Arc::new(cfg),
        pool,
        opts.providers,
        Arc::new(opts.file_agents),
        Roles { api: true, workers: opts.workers },
    )
    .await
    .expect("start service");
    let base = format!("http://{}", service.addr.unwrap());
    TestApp { base, db, client: reqwest::Client::new(), service: Some(service) }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn post_task(&self, body: Value) -> reqwest::Response {
        self.post_json("/tasks", body).await
    }

    /// `POST path` (and its query) with a JSON body.
    pub async fn post_json(&self, path: &str, body: Value) -> reqwest::Response {
        self.client.post(self.url(path)).json(&body).send().await.unwrap()
    }

    /// `GET path` (and its query) as JSON, whatever the status.
    pub async fn get_json(&self, path: &str) -> Value {
        self.client.get(self.url(path)).send().await.unwrap().json().await.unwrap()
    }

    /// Submit and return the created task's JSON (asserting 201).
    pub async fn submit(&self, body: Value) -> Value {
        let r = self.post_task(body).await;
        assert_eq!(r.status(), 201, "submit failed: {}", r.text().await.unwrap());
        r.json().await.unwrap()
    }

    /// `POST /tasks?wait=true&timeout=30` and return the finished task's JSON (asserting 200).
    pub async fn wait_task(&self, body: Value) -> Value {
        let r = self.client.post(self.url("/tasks?wait=true&timeout=30")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "wait failed: {}", r.text().await.unwrap());
        r.json().await.unwrap()
    }

    pub async fn get_task(&self, id: &str) -> Value {
        let r = self.client.get(self.url(&format!("/tasks/{id}"))).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }

    /// Poll until the task is terminal (for tests of the background mode itself).
    pub async fn poll_until_terminal(&self, id: &str, within: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let t = self.get_task(id).await;
            if !matches!(t["status"].as_str(), Some("scheduled" | "queued" | "running")) {
                return t;
            }
            assert!(tokio::time::Instant::now() < deadline, "task {id} not terminal in time: {t}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub async fn task_count(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&self.db.pool).await.unwrap()
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.service.take() {
            s.stop().await;
        }
    }
}

/// A `subagentd` process; killed when dropped.
pub struct Proc {
    pub child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start the real binary with `args` against `db_url`.
pub fn spawn_binary(args: &[&str], db_url: &str, env: &[(&str, &str)]) -> Proc {
    spawn_binary_with(args, db_url, env, Limited::default())
}

/// What a spawned binary runs under besides its arguments.
#[derive(Default)]
pub struct Limited {
    /// Soft and hard `RLIMIT_NOFILE`.
    pub nofile: Option<u64>,
    /// Where its standard error goes (else the test's).
    pub stderr: Option<std::fs::File>,
}

/// `spawn_binary`, under a descriptor limit and with its standard error where `limited` says.
pub fn spawn_binary_with(args: &[&str], db_url: &str, env: &[(&str, &str)], limited: Limited) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_subagentd"));
    cmd.args(args)
        .env("DATABASE_URL", db_url)
        .env("SUBAGENTD_POLL_INTERVAL_MS", "100")
        .env("SUBAGENTD_HEARTBEAT_SECONDS", "1")
        .env("SUBAGENTD_LEASE_SECONDS", "5")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(limited.stderr.map_or_else(Stdio::inherit, Stdio::from));
    for (k, v) in env {
        cmd.env(k, v);
    }
    // Killed with the thread that started it (the test's own thread) even if its `Proc` is never
    // dropped: a full run once left a `serve` and a `worker` of the database-restart tests behind,
    // retrying a cluster that was gone.
    // SAFETY: prctl and getppid are async-signal-safe; this runs in the child before exec.
    // SAFETY (setrlimit): async-signal-safe too, on a value of this frame.
    let nofile = limited.nofile;
    unsafe {
        use std::os::unix::process::CommandExt;
        let parent = libc::getpid();
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 || libc::getppid() != parent {
                return Err(std::io::Error::other("the test that started this process is gone"));
            }
            if let Some(n) = nofile {
                let r = libc::rlimit { rlim_cur: n as libc::rlim_t, rlim_max: n as libc::rlim_t };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Proc { child: cmd.spawn().expect("spawn subagentd") }
}

/// Wait until `url` answers 200 (a spawned binary has started), for at most `within`.
pub async fn wait_until_ok(client: &reqwest::Client, url: &str, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while client.get(url).send().await.map(|r| r.status() != 200).unwrap_or(true) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{url} did not answer 200 within {within:?}: the service did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn assert_problem(r: reqwest::Response, status: u16, code: &str) -> Value {
    assert_eq!(r.status().as_u16(), status, "wrong status for {code}");
    let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    assert_eq!(ct, "application/problem+json");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["type"], format!("/problems/{code}"));
    assert_eq!(body["status"], status);
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{body}");
    body
}

/// A new API key for `tenant`, made with the admin API (`admin`: its token). The key is shown
/// once; its prefix is `sk_`.
/// Set `tenant`'s limits through the admin API of the service at `base`.
pub async fn put_tenant_limits(base: &str, admin: &str, tenant: &str, limits: &Value) {
    let r = reqwest::Client::new()
        .put(format!("{base}/admin/tenants/{tenant}"))
        .bearer_auth(admin)
        .json(limits)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
}

pub async fn admin_key(app: &TestApp, admin: &str, tenant: &str) -> String {
    let r = app
        .client
        .post(app.url("/admin/keys"))
        .bearer_auth(admin)
        .json(&serde_json::json!({"tenant": tenant}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    assert!(v["prefix"].as_str().unwrap().starts_with("sk_"));
    v["key"].as_str().unwrap().to_string()
}

/// A database of the test cluster with the migrations before `version` applied (the schema of
/// the release before that migration, to fill with rows and then migrate); `drop` removes it.
pub struct OldDatabase {
    pub pool: PgPool,
    pub url: String,
    name: String,
    admin: PgPool,
}

impl OldDatabase {
    /// A service (API and workers) on the migrated database, as an upgraded deployment runs it.
    pub async fn serve(&self) -> Service {
        Service::start(
            Arc::new(test_config(&self.url)),
            self.pool.clone(),
            Providers::with_builtin(),
            Arc::new(FileAgents::default()),
            Roles { api: true, workers: true },
        )
        .await
        .expect("start service")
    }

    pub async fn drop(self) {
        self.pool.close().await;
        sqlx::query(&format!("DROP DATABASE {} WITH (FORCE)", self.name)).execute(&self.admin).await.unwrap();
    }
}

pub async fn database_before(db: &TestDb, version: i64) -> OldDatabase {
    let name = format!("upg_{}", uuid::Uuid::new_v4().simple());
    let admin = subagentd::db::connect(&db.url.replace(&db.name, "postgres"), 1).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.unwrap();
    let url = db.url.replace(&db.name, &name);
    let pool = subagentd::db::connect(&url, 2).await.unwrap();
    let mut before = subagentd::db::MIGRATOR.iter().filter(|m| m.version < version).cloned().collect::<Vec<_>>();
    before.sort_by_key(|m| m.version);
    let old =
        sqlx::migrate::Migrator { migrations: std::borrow::Cow::Owned(before), ..sqlx::migrate::Migrator::DEFAULT };
    old.run(&pool).await.unwrap();
    OldDatabase { pool, url, name, admin }
}

/// Say that a group of tests cannot run here for want of a program. Under `.ci/run`, which sets
/// `require` (a `SUBAGENTD_REQUIRE_*` variable) to 1, that is a failure. Otherwise a notice, and
/// a line in the file `SUBAGENTD_SKIP_LOG` names, from which the README's test command
/// (`scripts/test`) says after `cargo test` what did not run and how to run it.
pub fn skipped(require: &str, group: &str, why: &str, how: &str) {
    if std::env::var(require).is_ok_and(|v| v == "1") {
        panic!("{group}: {why}, and {require}=1 requires it: {how}");
    }
    eprintln!("SKIPPED: {group}: {why} ({how})");
    if let Ok(path) = std::env::var("SUBAGENTD_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{group}: {why}; to run it: {how}");
        }
    }
}

/// Wait until `n` worker processes have registered with the database (each does as it starts,
/// before it claims): a condition, where a fixed pause guessed how long a start takes. Panics
/// past `within`.
pub async fn workers_up(pool: &PgPool, n: i64, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let up: i64 = sqlx::query_scalar("SELECT count(*) FROM workers").fetch_one(pool).await.unwrap_or(0);
        if up >= n {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{up} of {n} workers up after {within:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Every event stored in `pool` reads back as its kind's typed shape (`kinds::Event`), and that
/// shape writes the same JSON: the typed events and what the statements write agree, field for
/// field, whichever side (Rust or SQL) wrote the row.
pub async fn assert_events_typed(pool: &PgPool) {
    let rows: Vec<subagentd::store::events::EventRow> =
        sqlx::query_as("SELECT seq, kind, data, created_at FROM task_event_log").fetch_all(pool).await.unwrap();
    assert!(!rows.is_empty(), "no events to check");
    for r in rows {
        let kind = r.known().unwrap_or_else(|| panic!("unknown event kind {}", r.kind));
        let typed = subagentd::kinds::Event::parse(kind, r.data.clone())
            .unwrap_or_else(|e| panic!("{} does not read as its shape: {e}: {}", r.kind, r.data));
        let back = serde_json::to_value(&typed).unwrap();
        assert!(json_eq(&back, &r.data), "{} reads as {back} but was stored as {}", r.kind, r.data);
    }
}

/// Equal as JSON, numbers by value (PostgreSQL writes `1.50`, serde `1.5`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}
