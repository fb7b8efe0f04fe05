//! The container files against the real binary: the Dockerfile's and compose's health checks run
//! under `dash` (the `/bin/sh` of debian:bookworm-slim, which has no `/dev/tcp`), the containers'
//! environment names only settings the service reads, logs written to a file carry no colour
//! codes, and the dashboards' role reads the usage views and nothing else.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::helpers::*;

fn repo_file(name: &str) -> String {
    std::fs::read_to_string(format!("{}/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// The Dockerfile's `HEALTHCHECK … CMD [..]` (exec form) as its argument list.
fn dockerfile_healthcheck() -> Vec<String> {
    let text = repo_file("Dockerfile");
    let line = text.lines().find(|l| l.starts_with("HEALTHCHECK")).expect("the Dockerfile has a HEALTHCHECK");
    let cmd = line.split_once(" CMD ").expect("HEALTHCHECK … CMD …").1.trim();
    serde_json::from_str(cmd).unwrap_or_else(|e| panic!("the HEALTHCHECK is not in exec form ({e}): {cmd}"))
}

fn compose() -> serde_yaml::Value {
    serde_yaml::from_str(&repo_file("docker-compose.yml")).unwrap()
}

/// Compose's `test:` of the subagentd service as a command line for `/bin/sh -c`, as Docker
/// runs it (`CMD` args are joined here; `CMD-SHELL` is already one).
fn compose_healthcheck() -> String {
    let test = &compose()["services"]["subagentd"]["healthcheck"]["test"];
    let parts: Vec<String> = serde_yaml::from_value(test.clone()).expect("a list");
    match parts.first().map(String::as_str) {
        Some("CMD") => shell_words(&parts[1..]),
        Some("CMD-SHELL") => parts[1..].join(" "),
        other => panic!("unexpected healthcheck form {other:?}"),
    }
}

fn shell_words(args: &[String]) -> String {
    args.iter().map(|a| format!("'{}'", a.replace('\'', r"'\''"))).collect::<Vec<_>>().join(" ")
}

/// Run `line` under dash with the binary first on PATH and `env`; its exit code and stderr.
async fn under_dash(line: &str, env: &[(&str, &str)]) -> (i32, String) {
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_subagentd")).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new("/usr/bin/dash");
    cmd.arg("-c").arg(line).env_clear().env("PATH", path).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    // Off the runtime's thread: a fake this test serves must answer meanwhile.
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().expect("run dash (Debian's /bin/sh)");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test]
async fn the_dockerfile_and_compose_health_checks_pass_under_dash_while_the_service_is_ready_and_fail_after() {
    if !std::path::Path::new("/usr/bin/dash").exists() {
        skipped(
            "SUBAGENTD_REQUIRE_TOOLS",
            "the containers' health check under dash",
            "no /usr/bin/dash",
            "apt-get install dash",
        );
        return;
    }
    let db = test_db().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // As in the image: listening on every address; the check asks on loopback.
    let listen = format!("0.0.0.0:{port}");
    let proc = spawn_binary(&["serve"], &db.url, &[("SUBAGENTD_LISTEN", &listen)]);
    let client = reqwest::Client::new();
    wait_until_ok(&client, &format!("http://127.0.0.1:{port}/readyz"), Duration::from_secs(30)).await;
    let docker = shell_words(&dockerfile_healthcheck());
    let compose = compose_healthcheck();
    // The container's environment: the image's ENV, no DATABASE_URL needed by the check, and the
    // proxy Docker passes into containers from its client's settings (a check of loopback must
    // not go through it; this one refuses every connection).
    let env = [
        ("SUBAGENTD_LISTEN", listen.as_str()),
        ("HTTP_PROXY", "http://127.0.0.1:9"),
        ("http_proxy", "http://127.0.0.1:9"),
    ];
    for (what, line) in [("Dockerfile", &docker), ("docker-compose.yml", &compose)] {
        let (code, err) = under_dash(line, &env).await;
        assert_eq!(code, 0, "{what}'s health check `{line}` under dash: {err}");
    }
    drop(proc);
    for (what, line) in [("Dockerfile", &docker), ("docker-compose.yml", &compose)] {
        let (code, err) = under_dash(line, &env).await;
        assert_ne!(code, 0, "{what}'s health check passed with the service stopped");
        assert!(err.contains("healthcheck"), "it says why: {err}");
    }
    // A check of a URL that answers but is not ready fails too (404 here), saying what it got.
    let fake = crate::fakes::serve_router(axum::Router::new()).await;
    let (code, err) = under_dash(&format!("subagentd healthcheck --url {fake}/readyz"), &[]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("404"), "{err}");
}

/// Every environment variable the service reads: its settings' (clap's `env`), and the few
/// read directly.
pub fn settings_read() -> BTreeSet<String> {
    use clap::Args;
    let cmd = subagentd::config::Config::augment_args(clap::Command::new("subagentd"));
    let mut names: BTreeSet<String> =
        cmd.get_arguments().filter_map(|a| a.get_env()).map(|e| e.to_string_lossy().into_owned()).collect();
    assert!(names.contains("DATABASE_URL") && names.contains("SUBAGENTD_LISTEN"), "{names:?}");
    names.extend(["RUST_LOG", "NO_COLOR", "MIMALLOC_ALLOW_THP"].map(String::from));
    names
}

#[test]
fn the_containers_environment_names_only_settings_the_service_reads() {
    let known = settings_read();
    let mut named = vec![];
    for line in repo_file("Dockerfile").lines() {
        if let Some(rest) = line.strip_prefix("ENV ") {
            for pair in rest.split_whitespace() {
                named.push(("Dockerfile ENV", pair.split('=').next().unwrap().to_string()));
            }
        }
    }
    let compose = compose();
    let env = compose["services"]["subagentd"]["environment"].as_mapping().expect("subagentd's environment");
    for k in env.keys() {
        named.push(("docker-compose.yml", k.as_str().unwrap().to_string()));
    }
    assert!(named.len() >= 3, "{named:?}");
    for (at, name) in &named {
        assert!(known.contains(name), "{at} sets {name}, which the service does not read");
    }
}

#[tokio::test]
async fn logs_written_to_a_file_carry_no_colour_codes() {
    let db = test_db().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let path = std::env::temp_dir().join(format!("subagentd-log-{}", uuid::Uuid::new_v4()));
    let file = std::fs::File::create(&path).unwrap();
    let proc = spawn_binary_with(
        &["serve"],
        &db.url,
        &[("SUBAGENTD_LISTEN", &listen), ("RUST_LOG", "info")],
        Limited { stderr: Some(file), ..Limited::default() },
    );
    let client = reqwest::Client::new();
    wait_until_ok(&client, &format!("http://{listen}/readyz"), Duration::from_secs(30)).await;
    let r = client
        .post(format!("http://{listen}/tasks?wait=true"))
        .json(&serde_json::json!({"prompt": "hello", "model": "mock/m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    drop(proc);
    let log = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(log.lines().count() >= 2 && log.contains("INFO"), "the service logged: {log}");
    assert!(!log.contains('\u{1b}'), "escape codes in a log file:\n{log}");
}

#[tokio::test]
async fn the_dashboards_role_reads_the_usage_views_and_nothing_else() {
    let app = spawn_app().await;
    app.wait_task(serde_json::json!({"prompt": "x [mock:tool_turns=1]", "model": "mock/m"})).await;
    let mut c = app.db.pool.acquire().await.unwrap();
    sqlx::query("SET ROLE subagentd_dashboards").execute(&mut *c).await.expect("migration 0022 made the role");
    for view in ["v_usage_daily", "v_task_outcomes", "v_task_latency"] {
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {view}"))
            .fetch_one(&mut *c)
            .await
            .unwrap_or_else(|e| panic!("{view}: {e}"));
        assert!(n >= 1, "{view} shows the task's usage");
    }
    // Creating in the schema is PUBLIC's right before PostgreSQL 15, not this role's.
    let version: i32 =
        sqlx::query_scalar("SELECT current_setting('server_version_num')::int").fetch_one(&mut *c).await.unwrap();
    let create = (version >= 150000).then_some("CREATE TABLE dash_owned (x int)");
    for refused in [
        "SELECT count(*) FROM tasks",
        "SELECT count(*) FROM task_messages",
        "SELECT count(*) FROM task_message_log",
        "SELECT count(*) FROM message_texts",
        "SELECT count(*) FROM task_options",
        "SELECT count(*) FROM task_event_log",
        "SELECT count(*) FROM api_keys",
        "DELETE FROM usage_daily",
        "DROP VIEW v_usage_daily",
    ]
    .into_iter()
    .chain(create)
    {
        let e = sqlx::query(refused).execute(&mut *c).await.expect_err(refused).to_string();
        assert!(e.contains("permission denied") || e.contains("must be owner"), "{refused}: {e}");
    }
    sqlx::query("RESET ROLE").execute(&mut *c).await.unwrap();
    drop(c);
    app.stop().await;
}

/// The subagentd service's `security_opt` in the compose file.
fn compose_security_opts() -> Vec<String> {
    serde_yaml::from_value(compose()["services"]["subagentd"]["security_opt"].clone()).expect("a list")
}

/// The shipped seccomp profile's rules.
fn seccomp_profile() -> serde_json::Value {
    serde_json::from_str(&repo_file("deploy/seccomp/subagentd.json")).expect("deploy/seccomp/subagentd.json is JSON")
}

#[test]
fn the_shipped_deployment_confines_system_calls_with_dockers_default_plus_only_what_the_sandbox_needs() {
    let opts = compose_security_opts();
    assert!(opts.contains(&"seccomp:./deploy/seccomp/subagentd.json".to_string()), "{opts:?}");
    for (file, text) in [
        ("docker-compose.yml", repo_file("docker-compose.yml")),
        ("README.md", repo_file("README.md")),
        ("docs/operations.md", repo_file("docs/operations.md")),
    ] {
        for gone in ["seccomp=unconfined", "seccomp:unconfined"] {
            assert!(!text.contains(gone), "{file} still says {gone}");
        }
    }
    let p = seccomp_profile();
    assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO", "what no rule names is refused");
    let ours: Vec<&serde_json::Value> = p["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["comment"].as_str().is_some_and(|c| c.starts_with("subagentd:")))
        .collect();
    assert_eq!(ours.len(), 1, "one rule of ours beside Docker's");
    let names: Vec<&str> = ours[0]["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert_eq!(names, ["chroot", "clone", "mount", "pivot_root", "sethostname", "umount2", "unshare"]);
    assert_eq!(ours[0]["action"], "SCMP_ACT_ALLOW");
}

/// `podman run` as compose runs the service, over a root made of this machine's files: the
/// binary (bound in) and its libraries, bubblewrap and its, busybox as `/bin/sh`, the CA
/// certificates. No image hub: `--rootfs`. `security` are the security options. Answers what
/// the service said of its sandbox at start: the log line that says it runs, or why not.
async fn service_in_a_container(
    root: &std::path::Path,
    security: &[String],
    db_url: &str,
    env: &[(&str, &str)],
) -> String {
    use tokio::io::AsyncBufReadExt;
    let work = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(work.path(), Some(10001), Some(10001)).unwrap();
    let name = format!("subagentd-seccomp-{}", uuid::Uuid::new_v4().simple());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut args: Vec<String> = [
        "run",
        "--rm",
        "--name",
        &name,
        "--user",
        "10001",
        "--read-only",
        "--network",
        "host",
        // This machine's quirks, none a security option: runc (crun refuses a hybrid cgroup
        // layout), limits at or below the engine's own (it may not raise them).
        "--runtime",
        "runc",
        "--cgroup-manager",
        "cgroupfs",
        "--ulimit",
        "nofile=1024:4096",
        "--ulimit",
        "nproc=1024:4096",
    ]
    .map(String::from)
    .to_vec();
    for s in security {
        args.extend(["--security-opt".to_string(), s.clone()]);
    }
    let bin = env!("CARGO_BIN_EXE_subagentd");
    args.extend(["-v".into(), format!("{bin}:/usr/bin/subagentd:ro")]);
    args.extend(["-v".into(), format!("{}:/work", work.path().display()), "-w".into(), "/work".into()]);
    // The test's PostgreSQL over its Unix socket, where its URL names one.
    let socket = url::Url::parse(db_url).unwrap().query_pairs().find(|(k, _)| k == "host").map(|(_, v)| v.into_owned());
    if let Some(dir) = socket {
        args.extend(["-v".into(), format!("{dir}:{dir}")]);
    }
    for (k, v) in [
        ("DATABASE_URL", db_url.to_string()),
        ("SUBAGENTD_LISTEN", format!("127.0.0.1:{port}")),
        ("RUST_LOG", "info".into()),
    ] {
        args.extend(["-e".into(), format!("{k}={v}")]);
    }
    for (k, v) in env {
        args.extend(["-e".into(), format!("{k}={v}")]);
    }
    args.extend(["--rootfs".into(), root.display().to_string(), "/usr/bin/subagentd".into(), "serve".into()]);
    let mut child = tokio::process::Command::new("podman")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("podman runs");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = vec![];
    let said = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.contains("run_command runs in the sandbox") || l.contains("run_command is not offered") {
                return Some(l);
            }
            seen.push(l);
        }
        None
    })
    .await;
    let _ = Command::new("podman")
        .args(["rm", "-f", "-t", "0", &name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let _ = child.kill().await;
    match said {
        Ok(Some(l)) => l,
        _ => panic!("the service in the container said nothing of its sandbox: {}", seen.join("\n")),
    }
}

/// Where busybox is (`/usr/bin` on a merged `/usr`, else `/bin`).
fn busybox() -> &'static str {
    ["/usr/bin/busybox", "/bin/busybox"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("/usr/bin/busybox")
}

/// A root for `service_in_a_container` in `dir`, from this machine's files.
fn container_root(dir: &std::path::Path) {
    use std::os::unix::fs::symlink;
    let copy = |from: &str| {
        let to = dir.join(from.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        if !to.exists() {
            std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {from}: {e}"));
        }
    };
    for program in [env!("CARGO_BIN_EXE_subagentd"), "/usr/bin/bwrap"] {
        let out = Command::new("ldd").arg(program).output().expect("ldd");
        String::from_utf8_lossy(&out.stdout).split_whitespace().filter(|w| w.starts_with('/')).for_each(copy);
    }
    copy("/usr/bin/bwrap");
    // gVisor's runsc (statically linked), for the other runtime.
    copy("/usr/bin/runsc");
    copy("/etc/ssl/certs/ca-certificates.crt");
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::copy(busybox(), dir.join("bin/busybox")).unwrap();
    for applet in ["sh", "true", "touch"] {
        symlink("busybox", dir.join("bin").join(applet)).unwrap();
    }
    for d in ["usr/bin", "proc", "dev", "sys", "tmp", "etc", "work"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::write(dir.join("etc/passwd"), "root:x:0:0::/:/bin/sh\nsubagentd:x:10001:10001::/work:/bin/sh\n").unwrap();
    // Searchable by the service's uid, as an image's root is.
    Command::new("chmod").args(["-R", "a+rX"]).arg(dir).status().unwrap();
}

#[tokio::test]
async fn in_a_container_engine_the_shipped_profile_lets_the_sandbox_start_and_dockers_default_does_not() {
    let missing: Vec<&str> = [
        ("podman", "/usr/bin/podman"),
        ("runc", "/usr/sbin/runc"),
        ("busybox", busybox()),
        ("bwrap", "/usr/bin/bwrap"),
        ("runsc", "/usr/bin/runsc"),
    ]
    .into_iter()
    .filter(|(_, p)| !std::path::Path::new(p).exists())
    .map(|(n, _)| n)
    .collect();
    // Rootful Podman: `.ci/run` requires it only where it runs as root.
    if !missing.is_empty() || unsafe { libc::geteuid() } != 0 {
        skipped(
            "SUBAGENTD_REQUIRE_PODMAN",
            "the seccomp profile in a container engine",
            &format!("missing {missing:?}, or not root (Podman runs rootful here)"),
            "apt-get install podman runc busybox-static bubblewrap runsc, and run the tests as root",
        );
        return;
    }
    let db = test_db().await;
    let root = tempfile::tempdir().unwrap();
    container_root(root.path());
    let profile = format!("{}/deploy/seccomp/subagentd.json", env!("CARGO_MANIFEST_DIR"));
    // Compose's own options, the profile's path made absolute.
    let shipped: Vec<String> = compose_security_opts()
        .into_iter()
        .map(|o| if o.starts_with("seccomp:") { format!("seccomp={profile}") } else { o })
        .collect();
    let said = service_in_a_container(root.path(), &shipped, &db.url, &[]).await;
    assert!(
        said.contains("run_command runs in the sandbox") && said.contains("commands in bwrap"),
        "under the shipped options: {said}"
    );
    let said = service_in_a_container(root.path(), &shipped, &db.url, &[("SUBAGENTD_SANDBOX_RUNTIME", "gvisor")]).await;
    assert!(
        said.contains("run_command runs in the sandbox") && said.contains("commands in gvisor"),
        "gVisor under the shipped options: {said}"
    );

    // Docker's own default: the shipped profile without its one rule of ours.
    let mut docker = seccomp_profile();
    docker["syscalls"]
        .as_array_mut()
        .unwrap()
        .retain(|r| !r["comment"].as_str().is_some_and(|c| c.starts_with("subagentd:")));
    let docker_file = root.path().join("docker-default.json");
    std::fs::write(&docker_file, serde_json::to_vec(&docker).unwrap()).unwrap();
    let defaults: Vec<String> = shipped
        .iter()
        .map(|o| if o.starts_with("seccomp=") { format!("seccomp={}", docker_file.display()) } else { o.clone() })
        .collect();
    let said = service_in_a_container(root.path(), &defaults, &db.url, &[]).await;
    assert!(
        said.contains("run_command is not offered") && said.contains("new namespace"),
        "under Docker's default profile: {said}"
    );

    // The profile alone: the engine's masked /proc paths keep bwrap from mounting the sandbox's.
    let masked: Vec<String> = shipped.iter().filter(|o| !o.starts_with("systempaths")).cloned().collect();
    assert!(masked.len() < shipped.len(), "compose unmasks the system paths: {shipped:?}");
    let said = service_in_a_container(root.path(), &masked, &db.url, &[]).await;
    assert!(
        said.contains("run_command is not offered") && said.contains("Can't mount proc"),
        "with /proc masked: {said}"
    );
}
