//! The written contract against the running binary: schemathesis (4.x, every check) generates
//! requests from `openapi.yaml` — valid ones, which must be served as documented, and invalid
//! ones, which must be refused — and checks every answer against the document. Test data that
//! must exist in the service (a configured model, URLs the allow-list admits) comes from
//! `tests/contract/hooks.py`. What the run leaves out, and any failure it may report, is listed
//! with its reason in `tests/contract/baseline.toml` (and docs/api.md).
//!
//! Needs schemathesis: `SUBAGENTD_SCHEMATHESIS` (the `st` program; `.ci/run` installs it in a
//! virtual environment) or `st` on the PATH. Without it the test prints a notice and passes —
//! unless `SUBAGENTD_REQUIRE_SCHEMATHESIS=1` (set by `.ci/run`), which makes that a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;

const ADMIN: &str = "contract-admin-token";
/// Cases per operation and phase; with the seed, the run is the same every time (about 2,600
/// requests, about 10 s).
const EXAMPLES: &str = "40";
const SEED: &str = "1";

/// An entry of `tests/contract/baseline.toml`: a setting that leaves something out, or a failure
/// the run may report (an operation, `METHOD /path`, and a check, `ST202`); each with its reason.
#[derive(serde::Deserialize)]
struct Entry {
    id: String,
    reason: String,
    setting: Option<String>,
    operation: Option<String>,
    check: Option<String>,
}

fn baseline() -> Vec<Entry> {
    #[derive(serde::Deserialize)]
    struct File {
        entry: Vec<Entry>,
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(here.join("tests/contract/baseline.toml")).unwrap();
    toml::from_str::<File>(&text).unwrap().entry
}

/// Every setting of `tests/contract/` that leaves an operation, a phase or a kind of input out is
/// an entry of the baseline, and every entry is a setting still there or a failure, with its
/// reason in docs/api.md.
#[test]
fn every_exception_of_the_contract_run_is_listed_with_its_reason() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let settings = std::fs::read_to_string(here.join("tests/contract/schemathesis.toml")).unwrap();
    let api = std::fs::read_to_string(here.join("docs/api.md")).unwrap();
    let entries = baseline();
    assert!(entries.len() < 8, "the baseline is to stay short: {} entries", entries.len());
    for e in &entries {
        assert!(e.reason.len() > 20, "{}: a reason", e.id);
        assert!(api.contains(&format!("| `{}` |", e.id)), "{}: in docs/api.md's exceptions", e.id);
        match (&e.setting, &e.operation, &e.check) {
            (Some(s), None, None) if s == "hooks.py" => assert!(here.join("tests/contract/hooks.py").is_file()),
            (Some(s), None, None) => assert!(settings.contains(s.as_str()), "{}: {s:?} is no longer a setting", e.id),
            (None, Some(_), Some(_)) => {}
            _ => panic!("{}: a setting, or an operation and a check", e.id),
        }
    }
    let listed = |line: &str| entries.iter().any(|e| e.setting.as_deref().is_some_and(|s| line.contains(s)));
    // What the settings leave out: generation switched off, and each operation block that turns
    // an operation or a phase off (named by its include line).
    for line in settings.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        if line.starts_with("allow-") && line.ends_with("false") {
            assert!(listed(line), "{line:?} leaves a kind of input out: list it in tests/contract/baseline.toml");
        }
    }
    for block in settings.split("[[operations]]").skip(1) {
        let off = block.lines().any(|l| !l.trim_start().starts_with('#') && l.contains("enabled = false"));
        let include = block.lines().map(str::trim).find(|l| l.starts_with("include-path")).unwrap_or("");
        if off {
            assert!(listed(include), "{include:?} turns something off: list it in tests/contract/baseline.toml");
        }
    }
}

fn schemathesis() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("SUBAGENTD_SCHEMATHESIS") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("st")).find(|p| p.is_file())
}

#[tokio::test]
async fn schemathesis_finds_the_service_doing_what_openapi_yaml_says() {
    let Some(st) = schemathesis() else {
        skipped(
            "SUBAGENTD_REQUIRE_SCHEMATHESIS",
            "the contract test (schemathesis against openapi.yaml)",
            "schemathesis not found",
            "pip install 'schemathesis>=4,<5' and put `st` on the PATH or in SUBAGENTD_SCHEMATHESIS (bash .ci/run does)",
        );
        return;
    };
    let db = test_db().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let _svc = spawn_binary(
        &["serve"],
        &db.url,
        &[
            ("SUBAGENTD_LISTEN", &listen),
            ("SUBAGENTD_AUTH", "keys"),
            ("SUBAGENTD_ADMIN_TOKEN", ADMIN),
            ("SUBAGENTD_DEFAULT_MODEL", "mock/m"),
            ("SUBAGENTD_TOOL_ALLOW", "127.0.0.1/32"),
            ("RUST_LOG", "off"),
        ],
    );
    let base = format!("http://{listen}");
    let client = reqwest::Client::new();
    wait_until_ok(&client, &format!("{base}/readyz"), Duration::from_secs(30)).await;
    let r = client.post(format!("{base}/admin/keys")).bearer_auth(ADMIN).json(&json!({"tenant": "contract"})).send();
    let key = r.await.unwrap().json::<Value>().await.unwrap()["key"].as_str().unwrap().to_string();

    // schemathesis keeps its example database and reports where it runs: not in the clone.
    let dir = std::env::temp_dir().join(format!("subagentd-contract-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for f in ["hooks.py", "schemathesis.toml"] {
        std::fs::copy(here.join("tests/contract").join(f), dir.join(f)).unwrap();
    }
    let out = tokio::task::spawn_blocking({
        let (dir, st) = (dir.clone(), st.clone());
        let schema = here.join("openapi.yaml");
        move || {
            Command::new(st)
                .current_dir(&dir)
                .env("SUBAGENTD_CONTRACT_KEY", key)
                .env("SUBAGENTD_CONTRACT_ADMIN", ADMIN)
                .env("SUBAGENTD_CONTRACT_URL", &base)
                .env("SCHEMATHESIS_HOOKS", "hooks")
                .env("PYTHONPATH", &dir)
                .args(["run", schema.to_str().unwrap(), "--url", &base, "--checks", "all"])
                .args(["--max-examples", EXAMPLES, "--seed", SEED, "--no-color"])
                .output()
                .expect("run schemathesis")
        }
    })
    .await
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    let summary: Vec<&str> = text.lines().filter(|l| l.contains(" generated, ") || l.contains("Tested:")).collect();
    println!("CONTRACT schemathesis: {}", summary.join(" / ").trim());
    // Each failure (an operation's heading, then its checks' codes) must be a baseline entry.
    let (mut failures, mut operation) = (vec![], String::new());
    for line in text.lines() {
        if line.starts_with("___") {
            operation = line.trim_matches(|c: char| c == '_' || c == ' ').to_string();
        } else if let Some(code) = line.strip_prefix("- ST").and_then(|l| l.split(' ').next()) {
            failures.push((operation.clone(), format!("ST{code}")));
        }
    }
    let entries = baseline();
    let known = |(op, check): &(String, String)| {
        entries.iter().any(|e| e.operation.as_ref() == Some(op) && e.check.as_ref() == Some(check))
    };
    let unknown: Vec<&(String, String)> = failures.iter().filter(|f| !known(f)).collect();
    for e in entries.iter().filter(|e| e.operation.is_some()) {
        if !failures.iter().any(|(op, check)| e.operation.as_ref() == Some(op) && e.check.as_ref() == Some(check)) {
            println!("CONTRACT: baseline entry {} did not fail: it may go", e.id);
        }
    }
    assert!(
        unknown.is_empty() && (out.status.success() || !failures.is_empty()),
        "schemathesis found the service and openapi.yaml disagreeing outside tests/contract/baseline.toml \
         ({unknown:?}):\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A run that tested nothing proves nothing.
    let generated: u64 =
        summary.iter().find_map(|l| l.trim().split(' ').next().and_then(|n| n.parse().ok())).unwrap_or(0);
    assert!(generated >= 1000, "schemathesis generated only {generated} cases:\n{text}");
}
