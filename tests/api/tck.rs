//! The official A2A conformance suites (the TCK) against the real binary: A2A 1.0 at every level
//! (`must`, `should`, `may`), over JSON-RPC and HTTP+JSON; A2A 0.3's every category (mandatory,
//! capabilities, quality, features) over both bindings too, and its check that the two agree. The suites are vendored in `tests/vendor/` (no registry serves them), unpacked
//! into a temporary folder and run with pytest as their `run_tck.py` runs them. A test that fails
//! must be one of the exclusions below, each with its reason; one that is excluded and passes is
//! reported, so the list stays true.
//!
//! Needs `SUBAGENTD_TCK10_PYTHON` and `SUBAGENTD_TCK03_PYTHON` (Pythons with
//! `tests/vendor/tck-*-requirements.txt`; `.ci/run` makes them). Without them each test prints a
//! notice and passes — unless `SUBAGENTD_REQUIRE_SDKS=1` (set by `.ci/run`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::helpers::*;

/// The 1.0 suite's tests this service does not pass, and why.
const EXCLUDED_10: &[(&str, &str)] = &[
    (
        "test_agent_card.py::TestAgentCardStructure::test_agent_card_validates_against_schema",
        "one public card serves 0.3 and 1.0 clients (the 0.3 SDKs require `url`, `preferredTransport`; both \
         SDKs read such a card); the 1.0 schema forbids the 0.3 fields. The 1.0 extended card has none of them.",
    ),
    (
        "test_artifacts.py::",
        "the suite's own agent's behaviour, chosen by a messageId prefix (file, data and URL artifacts, a Message \
         answer, a fixed text): a sub-agent answers with its summary",
    ),
    (
        "test_data_model.py::TestCamelCaseFieldNames::test_no_snake_case_keys",
        "it reads into the task's `metadata`, a free-form Struct whose keys are the REST API's own names \
         (`cost_usd`, `stop_reason`, `subagent_type`), as documented",
    ),
    (
        "test_requirements.py::test_must_requirement[CORE-SEND-003-",
        "a part of an unsupported media type is ContentTypeNotSupportedError, as the spec's error table says; the \
         requirement names no error and the test passes only if the send succeeds",
    ),
];

/// The 0.3 suite's tests this service does not pass, and why. Each also fails against the suite's
/// own reference agent (a2a-sdk 0.3): it sends a follow-up message to, or cancels, a task that has
/// already completed.
const EXCLUDED_03: &[(&str, &str)] = &[
    (
        "test_a2a_v030_new_methods.py::TestMethodMappingCompliance::test_core_method_mapping_compliance",
        "cancels a completed task",
    ),
    ("test_message_send_method.py::test_message_send_continue_task", "a message to a completed task"),
    ("test_state_transitions.py::test_task_history_length", "a message to a completed task"),
    ("test_tasks_cancel_method.py::test_tasks_cancel_valid", "cancels a completed task"),
    ("test_message_send_capabilities.py::test_message_send_continue_with_contextid", "a message to a completed task"),
    (
        "test_resilience.py::test_partial_update_recovery",
        "quality: four messages to a completed task (a blocking send returns the task ended)",
    ),
    (
        "test_task_state_quality.py::test_task_state_transitions",
        "quality: expects the task still submitted or working after a blocking send, then sends it a message; \
         a sub-agent's task ends with its summary (the mock model's at once) and an ended task takes no message",
    ),
    ("test_task_state_quality.py::test_task_cancel_state_handling", "quality: cancels a completed task"),
];

fn python(var: &str) -> Option<PathBuf> {
    match std::env::var(var) {
        Ok(p) => Some(PathBuf::from(p)),
        Err(_) => {
            skipped(
                "SUBAGENTD_REQUIRE_SDKS",
                "the A2A conformance suites (TCK)",
                &format!("{var} is not set"),
                "set it to a Python with tests/vendor/tck-*-requirements.txt installed (bash .ci/run does)",
            );
            None
        }
    }
}

/// The binary as a single-user instance with no keys (the suites send none), the mock model.
async fn instance(db: &TestDb) -> (Proc, String) {
    instance_with(db, "none").await
}

/// The same with `SUBAGENTD_AUTH` set to `auth`.
async fn instance_with(db: &TestDb, auth: &str) -> (Proc, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let env = [
        ("SUBAGENTD_LISTEN", listen.as_str()),
        ("SUBAGENTD_AUTH", auth),
        ("SUBAGENTD_DEFAULT_MODEL", "mock/m"),
        ("SUBAGENTD_TOOL_ALLOW", "*, 127.0.0.1/32"),
    ];
    let proc = spawn_binary(&["serve"], &db.url, &env);
    let base = format!("http://{listen}");
    wait_until_ok(&reqwest::Client::new(), &format!("{base}/readyz"), Duration::from_secs(30)).await;
    (proc, base)
}

/// Unpack a vendored suite into `dir`.
fn unpack(tarball: &str, dir: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vendor").join(tarball);
    let ok = Command::new("tar").arg("-xzf").arg(&src).arg("-C").arg(dir).status().expect("run tar");
    assert!(ok.success(), "unpack {tarball}");
}

/// Run pytest in `dir` with `args`; the (passed, failed) test ids of its JUnit report.
async fn pytest(python: PathBuf, dir: PathBuf, args: Vec<String>) -> (BTreeSet<String>, BTreeSet<String>) {
    let report = dir.join("junit.xml");
    let mut all = vec!["-m".to_string(), "pytest".into(), "-p".into(), "no:cacheprovider".into(), "-q".into()];
    all.push(format!("--junitxml={}", report.display()));
    all.extend(args);
    let d = dir.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .current_dir(&d)
            .args(&all)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .expect("run pytest")
    })
    .await
    .unwrap();
    let xml = std::fs::read_to_string(&report).unwrap_or_else(|_| {
        panic!("no report:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    junit(&xml)
}

/// The (passed, failed) test ids of a JUnit report: `file.py::Class::name` (skipped ones in neither).
fn junit(xml: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut passed, mut failed) = (BTreeSet::new(), BTreeSet::new());
    for case in xml.split("<testcase ").skip(1) {
        let attr = |name: &str| {
            let at =
                case.find(&format!(" {name}=\"")).or_else(|| case.starts_with(&format!("{name}=\"")).then_some(0))?;
            let rest = &case[at..];
            let start = rest.find('"')? + 1;
            let end = rest[start..].find('"')? + start;
            Some(rest[start..end].replace("&quot;", "\"").replace("&amp;", "&"))
        };
        let (Some(class), Some(name)) = (attr("classname"), attr("name")) else { continue };
        // `tests.compatibility.core_operations.test_x.Class` → `test_x.py::Class`.
        let parts: Vec<&str> = class.split('.').collect();
        let file = parts.iter().position(|p| p.starts_with("test_")).unwrap_or(parts.len().saturating_sub(1));
        let mut id = format!("{}.py", parts[file]);
        for p in &parts[file + 1..] {
            id += &format!("::{p}");
        }
        id += &format!("::{name}");
        let body = case.split("</testcase>").next().unwrap_or("");
        if body.contains("<failure") || body.contains("<error") {
            failed.insert(id);
        } else if !body.contains("<skipped") {
            passed.insert(id);
        }
    }
    (passed, failed)
}

/// Every failure is excluded (with its reason); an excluded test that passed is named.
fn judge(suite: &str, passed: &BTreeSet<String>, failed: &BTreeSet<String>, excluded: &[(&str, &str)], least: usize) {
    let unexplained: Vec<&String> = failed.iter().filter(|f| !excluded.iter().any(|(e, _)| f.contains(e))).collect();
    assert!(unexplained.is_empty(), "{suite}: failures outside the exclusions: {unexplained:#?}");
    for (e, why) in excluded {
        if !failed.iter().any(|f| f.contains(e)) {
            println!("{suite}: excluded {e} ({why}) did not fail: the exclusion may go");
        }
    }
    assert!(passed.len() >= least, "{suite}: only {} tests passed: {passed:#?}", passed.len());
    println!("{suite}: {} passed, {} failed (all excluded)", passed.len(), failed.len());
}

#[tokio::test]
async fn the_a2a_1_0_conformance_suite_passes_at_every_level_over_both_bindings() {
    let Some(py) = python("SUBAGENTD_TCK10_PYTHON") else { return };
    let db = test_db().await;
    let (_proc, base) = instance(&db).await;
    let dir = tempfile::tempdir().unwrap();
    unpack("a2a-tck-1.0-dev-357c4a8.tar.gz", dir.path());
    let reports = dir.path().join("out");
    let args = vec![
        "tests/compatibility".into(),
        format!("--sut-host={base}"),
        "--transport=jsonrpc,http_json".into(),
        "-m".into(),
        "must or should or may".into(),
        format!("--compatibility-report={}", reports.join("compat").display()),
    ];
    let (passed, failed) = pytest(py, dir.path().to_path_buf(), args).await;
    judge("A2A 1.0 TCK", &passed, &failed, EXCLUDED_10, 100);
}

#[tokio::test]
async fn the_a2a_0_3_conformance_suite_passes_in_every_category_over_both_bindings() {
    let Some(py) = python("SUBAGENTD_TCK03_PYTHON") else { return };
    let db = test_db().await;
    let (_proc, base) = instance(&db).await;
    let dir = tempfile::tempdir().unwrap();
    unpack("a2a-tck-0.3.x-eb1f804.tar.gz", dir.path());
    let url = format!("{base}/a2a");
    let run = |path: &str, markers: Option<&str>, rest: bool| {
        let mut a = vec![path.to_string(), format!("--sut-url={url}"), "--test-scope=all".into(), "--tb=short".into()];
        if let Some(m) = markers {
            a.extend(["-m".to_string(), m.to_string()]);
        }
        if rest {
            a.extend(["--transport-strategy=prefer_rest".to_string(), "--transports=rest".into()]);
        }
        a
    };
    // Over JSON-RPC, then over HTTP+JSON (where the JSON-RPC compliance tests do not apply).
    for (binding, rest, mandatory) in
        [("JSON-RPC", false, "mandatory_jsonrpc or mandatory_protocol"), ("HTTP+JSON", true, "mandatory_protocol")]
    {
        let d = dir.path().to_path_buf();
        let (mut passed, mut failed) =
            pytest(py.clone(), d.clone(), run("tests/mandatory/", Some(mandatory), rest)).await;
        for optional in ["capabilities", "quality", "features"] {
            let (p, f) = pytest(py.clone(), d.clone(), run(&format!("tests/optional/{optional}/"), None, rest)).await;
            passed.extend(p);
            failed.extend(f);
        }
        judge(&format!("A2A 0.3 TCK over {binding}"), &passed, &failed, EXCLUDED_03, if rest { 60 } else { 80 });
    }
    // The two bindings give the same answers (the suite's multi-transport category, which needs both).
    let (passed, failed) =
        pytest(py, dir.path().to_path_buf(), run("tests/optional/multi_transport/", None, false)).await;
    judge("A2A 0.3 TCK, the bindings' equivalence", &passed, &failed, &[], 10);
}

/// 0.3's authenticated extended card, which a card declares only where API keys are required:
/// its tests against an instance with `SUBAGENTD_AUTH=keys` (they send no key, and expect a 401
/// at `{card url}/v1/card` over HTTP+JSON and an error over JSON-RPC).
#[tokio::test]
async fn the_a2a_0_3_extended_card_tests_pass_over_both_bindings_where_keys_are_required() {
    let Some(py) = python("SUBAGENTD_TCK03_PYTHON") else { return };
    let db = test_db().await;
    let (_proc, base) = instance_with(&db, "keys").await;
    let dir = tempfile::tempdir().unwrap();
    unpack("a2a-tck-0.3.x-eb1f804.tar.gz", dir.path());
    let (mut passed, mut failed) = (BTreeSet::new(), BTreeSet::new());
    for rest in [false, true] {
        let mut args = vec![
            "tests/mandatory/protocol/test_extended_agent_card.py".to_string(),
            "tests/mandatory/protocol/test_a2a_v030_new_methods.py".into(),
            format!("--sut-url={base}/a2a"),
            "--test-scope=all".into(),
            "--tb=short".into(),
            "-k".into(),
            "extended".into(),
        ];
        if rest {
            args.extend(["--transport-strategy=prefer_rest".to_string(), "--transports=rest".into()]);
        }
        let (p, f) = pytest(py.clone(), dir.path().to_path_buf(), args).await;
        passed.extend(p.into_iter().map(|t| format!("{t} ({})", if rest { "HTTP+JSON" } else { "JSON-RPC" })));
        failed.extend(f.into_iter().map(|t| format!("{t} ({})", if rest { "HTTP+JSON" } else { "JSON-RPC" })));
    }
    judge("A2A 0.3 TCK, the extended card", &passed, &failed, &[], 8);
}
