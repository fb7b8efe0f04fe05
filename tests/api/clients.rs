//! The client libraries (`clients/python`, `clients/typescript`) against the real binary with
//! the mock provider: each one's own test suite (pytest; `node --test`), run here against a
//! `subagentd serve` started for it. And their types in step with `openapi.yaml`
//! (`clients/gen.py --check`), and the TypeScript `dist/` in step with its source.
//!
//! Needs a Python with `httpx`, `pytest`, `pytest-asyncio` and `pyyaml` (`SUBAGENTD_PYTHON`,
//! the virtual environment `.ci/run` makes), Node ≥ 20, and for the `dist/` check the
//! TypeScript compiler (`SUBAGENTD_TS_NODE_MODULES`: a folder whose `node_modules` has it;
//! `.ci/run` runs `npm ci` there). Without them each test prints a notice and passes — unless
//! `SUBAGENTD_REQUIRE_SDKS=1` (set by `.ci/run`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;
use crate::mcp::{node_modules, python};

const ADMIN: &str = "clients-admin-token";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `subagentd serve` for a client's suite: keys required, loopback tools and webhooks allowed;
/// its URL and a tenant's key.
async fn served(db: &TestDb) -> (Proc, String, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let proc = spawn_binary(
        &["serve"],
        &db.url,
        &[
            ("SUBAGENTD_LISTEN", listen.as_str()),
            ("SUBAGENTD_ADMIN_TOKEN", ADMIN),
            ("SUBAGENTD_AUTH", "keys"),
            ("SUBAGENTD_TOOL_ALLOW", "*, 127.0.0.1/32"),
        ],
    );
    let base = format!("http://{listen}");
    wait_until_ok(&reqwest::Client::new(), &format!("{base}/readyz"), Duration::from_secs(30)).await;
    let r = reqwest::Client::new()
        .post(format!("{base}/admin/keys"))
        .bearer_auth(ADMIN)
        .json(&json!({"tenant": "clients"}))
        .send()
        .await
        .unwrap();
    let key = r.json::<Value>().await.unwrap()["key"].as_str().unwrap().to_string();
    (proc, base, key)
}

fn run(mut c: Command, what: &str) {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{stderr}");
}

#[tokio::test]
async fn the_python_clients_suite_passes_against_the_real_binary() {
    let Some(py) = python() else { return };
    let db = test_db().await;
    let (_svc, base, key) = served(&db).await;
    let mut c = Command::new(py);
    c.current_dir(root().join("clients/python"))
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .env("PYTHONPATH", root().join("clients/python"))
        .env("SUBAGENTD_URL", &base)
        .env("SUBAGENTD_API_KEY", &key)
        .env("SUBAGENTD_ADMIN_TOKEN", ADMIN);
    tokio::task::spawn_blocking(move || run(c, "pytest clients/python/tests")).await.unwrap();
}

#[tokio::test]
async fn the_typescript_clients_suite_passes_against_the_real_binary() {
    // Node is all it needs (the built `dist/` is committed): the SDKs' folder stands for "Node
    // is here, and required".
    if node_modules().is_none() {
        return;
    }
    let db = test_db().await;
    let (_svc, base, key) = served(&db).await;
    let mut c = Command::new("node");
    c.current_dir(root().join("clients/typescript"))
        .args(["--test", "test/"])
        .env("SUBAGENTD_URL", &base)
        .env("SUBAGENTD_API_KEY", &key)
        .env("SUBAGENTD_ADMIN_TOKEN", ADMIN);
    tokio::task::spawn_blocking(move || run(c, "node --test clients/typescript/test/")).await.unwrap();
}

#[tokio::test]
async fn the_clients_types_are_made_from_the_current_openapi_yaml() {
    let Some(py) = python() else { return };
    let mut c = Command::new(py);
    c.current_dir(root()).args(["clients/gen.py", "--check"]);
    run(c, "clients/gen.py --check");
}

/// The TypeScript compiler, if it is installed where `.ci/run` puts it.
fn tsc() -> Option<PathBuf> {
    let dir = std::env::var("SUBAGENTD_TS_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("clients/typescript"));
    let bin = dir.join("node_modules/typescript/bin/tsc");
    if bin.exists() {
        return Some(bin);
    }
    skipped(
        "SUBAGENTD_REQUIRE_SDKS",
        "the TypeScript client's dist/ check",
        "no TypeScript compiler",
        "npm ci in clients/typescript, or set SUBAGENTD_TS_NODE_MODULES (bash .ci/run does)",
    );
    None
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().to_string(), std::fs::read(e.path()).unwrap()))
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn the_typescript_dist_is_built_from_its_source() {
    let Some(tsc) = tsc() else { return };
    let out = std::env::temp_dir().join(format!("subagentd-tsc-{}", uuid::Uuid::new_v4()));
    let mut c = Command::new("node");
    c.arg(tsc).args(["-p", "clients/typescript/tsconfig.json", "--outDir"]).arg(&out).current_dir(root());
    run(c, "tsc");
    let (built, committed) = (files(&out), files(&root().join("clients/typescript/dist")));
    let _ = std::fs::remove_dir_all(&out);
    let names = |v: &[(String, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&built), names(&committed), "dist/ has other files than the source makes");
    for (b, c) in built.iter().zip(&committed) {
        assert!(b.1 == c.1, "dist/{} is not what src/ makes: npm run build in clients/typescript", b.0);
    }
}
