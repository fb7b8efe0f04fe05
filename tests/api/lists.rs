//! One list of states: the Rust enums (`subagentd::kinds`) are the list, and every other place
//! that spells one out — `openapi.yaml`'s enums and descriptions, the database's CHECK
//! constraints, both client libraries' sets, the console's lists and styles — says the same.
//! Adding a state is then: the enum, one migration, and what this test names.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;
use subagentd::kinds::{EventKind, FailureCode, Priority, StopReason, TaskStatus, WebhookEvent};

use crate::helpers::test_db;

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn set<'a>(it: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    it.into_iter().map(str::to_string).collect()
}

fn statuses() -> BTreeSet<String> {
    set(TaskStatus::ALL.iter().map(|s| s.as_str()))
}

fn open() -> BTreeSet<String> {
    set(TaskStatus::OPEN.iter().map(|s| s.as_str()))
}

fn stored_events() -> BTreeSet<String> {
    set(EventKind::ALL.iter().filter(|k| k.is_stored()).map(|k| k.as_str()))
}

fn terminal() -> BTreeSet<String> {
    set(TaskStatus::ALL.iter().filter(|s| s.is_terminal()).map(|s| s.as_str()))
}

/// The words in single or double quotes of `text` (a JS array, a SQL list).
fn quoted(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for q in ['\'', '"'] {
        for (i, w) in text.split(q).enumerate() {
            if i % 2 == 1 && !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                out.insert(w.to_string());
            }
        }
    }
    out
}

/// The text of `src` from `start` to the first `end` after it.
fn between<'a>(src: &'a str, start: &str, end: &str) -> &'a str {
    let at = src.find(start).unwrap_or_else(|| panic!("{start:?} not found"));
    let rest = &src[at + start.len()..];
    &rest[..rest.find(end).unwrap_or_else(|| panic!("no {end:?} after {start:?}"))]
}

/// Every `enum` of `openapi.yaml`, with where it is.
fn spec_enums() -> Vec<(String, BTreeSet<String>)> {
    fn walk(v: &Value, at: &str, out: &mut Vec<(String, BTreeSet<String>)>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k == "enum" {
                        if let Some(list) = x.as_array() {
                            out.push((at.to_string(), set(list.iter().filter_map(Value::as_str))));
                        }
                    }
                    walk(x, &format!("{at}/{k}"), out);
                }
            }
            Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| walk(x, &format!("{at}/{i}"), out)),
            _ => {}
        }
    }
    let spec: Value = serde_yaml::from_str(&read("openapi.yaml")).unwrap();
    let mut out = vec![];
    walk(&spec, "", &mut out);
    out
}

#[test]
fn openapi_lists_the_states_stop_reasons_and_priorities_of_the_enums() {
    let spec: Value = serde_yaml::from_str(&read("openapi.yaml")).unwrap();
    let schemas = &spec["components"]["schemas"];
    let listed = |v: &Value| set(v.as_array().unwrap().iter().filter_map(Value::as_str));
    assert_eq!(listed(&schemas["StatusFilter"]["enum"]), statuses(), "StatusFilter's enum");
    assert_eq!(listed(&schemas["Status"]["examples"]), statuses(), "Status's examples");
    let said = schemas["Status"]["description"].as_str().unwrap();
    let before_dash = said.split(" — ").next().unwrap();
    assert_eq!(set(before_dash.split(", ")), statuses(), "Status's description: {said}");

    // Every enum made of states is all of them, the open ones or the terminal ones; every enum of
    // priorities is all three.
    let all_states = statuses();
    let priorities = set(Priority::ALL.iter().map(|p| p.as_str()));
    let mut seen_open = false;
    for (at, e) in spec_enums() {
        let values: BTreeSet<String> = e.into_iter().filter(|v| !v.is_empty()).collect();
        if values.len() >= 2 && values.is_subset(&all_states) {
            assert!(
                values == all_states || values == open() || values == terminal(),
                "{at}: {values:?} is neither every state, the open ones nor the terminal ones"
            );
            seen_open |= values == open();
        }
        if values.len() >= 2 && values.is_subset(&priorities) {
            assert_eq!(values, priorities, "{at}");
        }
    }
    assert!(seen_open, "POST /tasks/cancel's status filter lists the open states");

    // The stop reasons, as the Task schema says them.
    let reason = spec["components"]["schemas"]["Task"]["properties"]["stop_reason"]["description"].as_str().unwrap();
    let listed: BTreeSet<String> = reason.split(" (").next().unwrap().split(", ").map(str::to_string).collect();
    assert_eq!(listed, set(StopReason::ALL.iter().map(|s| s.as_str())), "Task.stop_reason: {reason}");
    // The event kinds the log holds, as the Event schema says them; the webhook events.
    let said = spec["components"]["schemas"]["Event"]["properties"]["kind"]["description"].as_str().unwrap();
    let listed: BTreeSet<String> = said.split(" (").next().unwrap().split(", ").map(str::to_string).collect();
    assert_eq!(listed, stored_events(), "Event.kind: {said}");
    let text = read("openapi.yaml");
    for e in WebhookEvent::ALL {
        assert!(text.contains(&format!("\"event\": \"{e}\"")), "openapi.yaml does not show the webhook event {e}");
    }
    // Wherever the spec counts the open states in words, the count is right.
    let spec_text = read("openapi.yaml");
    let words = ["one", "two", "three", "four", "five", "six"];
    assert!(
        !spec_text.contains(&format!("all {}", words[open().len() - 2])),
        "openapi.yaml counts the open states wrong somewhere"
    );
}

#[tokio::test]
async fn the_database_checks_the_same_states() {
    let db = test_db().await;
    let defs: Vec<String> = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'tasks'::regclass AND contype = 'c'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let status = defs.iter().find(|d| d.contains("status") && !d.contains("finished_at") && !d.contains("lease"));
    assert_eq!(quoted(status.expect("a CHECK on tasks.status")), statuses(), "{defs:#?}");
    let open_check = defs.iter().find(|d| d.contains("finished_at IS NULL")).expect("the finished_at CHECK");
    assert_eq!(quoted(open_check), open(), "{open_check}");

    let tenants: Vec<String> = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'tenants'::regclass AND contype = 'c'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let prio = tenants.iter().find(|d| d.contains("priority")).expect("a CHECK on tenants.priority");
    assert_eq!(quoted(prio), set(Priority::ALL.iter().map(|p| p.as_str())), "{prio}");
}

#[test]
fn the_clients_and_the_console_list_the_same_states() {
    let ts = read("clients/typescript/src/index.ts");
    assert_eq!(quoted(between(&ts, "export const TERMINAL = new Set([", "])")), terminal(), "TypeScript TERMINAL");
    let settled: BTreeSet<String> = terminal().into_iter().chain(["requires_action".to_string()]).collect();
    assert_eq!(quoted(between(&ts, "export const SETTLED = new Set([", "])")), settled, "TypeScript SETTLED");
    let js = read("clients/typescript/dist/index.js");
    assert_eq!(quoted(between(&js, "export const TERMINAL = new Set([", "])")), terminal(), "dist/index.js TERMINAL");

    let py = read("clients/python/subagentd/_base.py");
    assert_eq!(quoted(between(&py, "TERMINAL = {", "}")), terminal(), "Python TERMINAL");
    assert_eq!(quoted(between(&py, "SETTLED = TERMINAL | {", "}")), set(["requires_action"]), "Python SETTLED");

    let app = read("src/console/assets/app.js");
    let listed = between(&app, "const STATUSES = [", "];");
    let order: Vec<&str> = TaskStatus::ALL.iter().map(|s| s.as_str()).collect();
    let in_app: Vec<String> = listed.split(',').map(|w| w.trim().trim_matches('\'').to_string()).collect();
    assert_eq!(in_app, order, "the console's STATUSES, in the enum's order");
    assert_eq!(quoted(between(&app, "const CANCELLABLE = new Set([", "])")), open(), "the console's CANCELLABLE");
    assert_eq!(quoted(between(&app, "const TERMINAL = new Set([", "])")), terminal(), "the console's TERMINAL");
    // The live stream's listeners: one for every kind of event the log holds.
    assert_eq!(quoted(between(&app, "const EVENT_KINDS = [", "];")), stored_events(), "the console's EVENT_KINDS");
    let css = read("src/console/assets/app.css");
    for s in TaskStatus::ALL {
        assert!(css.contains(&format!(".status-{s} ")), "app.css has no style for status {s}");
    }
}

#[test]
fn every_event_kind_the_store_writes_is_one_of_the_enum() {
    let mut found = BTreeSet::new();
    for f in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store")).unwrap() {
        let code = std::fs::read_to_string(f.unwrap().path()).unwrap();
        for (at, _) in code.match_indices("INSERT INTO task_events") {
            let stmt = &code[at..code[at..].find("FROM").map_or(code.len(), |e| at + e)];
            let Some(select) = stmt.find("SELECT") else { continue };
            // The third column of the SELECT: a kind, or a CASE choosing between kinds.
            let cols = &stmt[select + 6..];
            let third = cols.splitn(3, ", ").nth(2).unwrap_or("");
            let third =
                if third.trim_start().starts_with("CASE") { &third[..third.find("END").unwrap()] } else { third };
            let third = if third.trim_start().starts_with("CASE") {
                third.split("THEN").skip(1).collect::<Vec<_>>().join(" ")
            } else {
                third.split(", ").next().unwrap_or("").to_string()
            };
            found.extend(quoted(&third));
        }
    }
    assert!(found.len() >= 10, "the reader finds the kinds written by SQL: {found:?}");
    for k in &found {
        assert!(
            EventKind::parse(k).is_some_and(|k| k.is_stored()),
            "the store writes event kind {k:?}, not in EventKind"
        );
    }
}

#[test]
fn every_failure_code_and_stop_reason_has_its_row_in_the_troubleshooting_guide() {
    let guide = read("docs/troubleshooting.md");
    for c in FailureCode::ALL {
        let status = if *c == FailureCode::InvalidOutput { "incomplete" } else { "failed" };
        let row = guide.lines().find(|l| l.starts_with(&format!("| `{status}` / ")) && l.contains(&format!("`{c}`")));
        assert!(row.is_some(), "docs/troubleshooting.md has no row for error code {c}");
    }
    for r in StopReason::ALL.iter().filter(|r| !matches!(r, StopReason::FinalAnswer | StopReason::Cancelled)) {
        assert!(
            guide.lines().any(|l| l.starts_with("| `incomplete` / ") && l.contains(&format!("`{r}`"))),
            "docs/troubleshooting.md has no row for stop reason {r}"
        );
    }
}
