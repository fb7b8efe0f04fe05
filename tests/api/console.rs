//! The ops console in a real browser (headless Chromium over WebDriver) against the real
//! binary: live lists and timelines, cancel, the usage chart and its CSV, text that stays text,
//! and sign-in with tenant isolation. Also its headers, and every Grafana panel's SQL.

use std::time::Duration;

use serde_json::{json, Value};

use crate::browser::{browser, Browser};
use crate::fakes::serve_router;
use crate::helpers::*;

const ADMIN: &str = "console-admin-token";

struct Served {
    base: String,
    _db: TestDb,
    _proc: Proc,
    client: reqwest::Client,
}

/// `subagentd serve` on a free loopback port, with `env`.
async fn serve(env: &[(&str, &str)]) -> Served {
    let db = test_db().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut all: Vec<(&str, &str)> = vec![("SUBAGENTD_LISTEN", &listen), ("SUBAGENTD_ADMIN_TOKEN", ADMIN)];
    all.extend_from_slice(env);
    let proc = spawn_binary(&["serve"], &db.url, &all);
    let base = format!("http://{listen}");
    let client = reqwest::Client::new();
    wait_until_ok(&client, &format!("{base}/healthz"), Duration::from_secs(30)).await;
    Served { base, _db: db, _proc: proc, client }
}

impl Served {
    async fn submit(&self, body: Value, key: Option<&str>) -> String {
        let mut r = self.client.post(format!("{}/tasks", self.base)).json(&body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
        r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string()
    }

    async fn finished(&self, id: &str) -> Value {
        let r = self.client.get(format!("{}/tasks/{id}?wait=true&timeout=30", self.base)).send().await.unwrap();
        r.json().await.unwrap()
    }

    async fn key(&self, tenant: &str) -> String {
        let r = self
            .client
            .post(format!("{}/admin/keys", self.base))
            .bearer_auth(ADMIN)
            .json(&json!({"tenant": tenant}))
            .send()
            .await
            .unwrap();
        r.json::<Value>().await.unwrap()["key"].as_str().unwrap().to_string()
    }
}

async fn open(b: &Browser, s: &Served, hash: &str) {
    b.client.goto(&format!("{}/console{hash}", s.base)).await.unwrap();
}

/// The rows of a task table, by task id, with their status.
async fn row_status(b: &Browser, table: &str, id: &str) -> Option<String> {
    let v = b
        .js(&format!(
            "const r = document.querySelector('{table} tr[data-task-id=\"{id}\"] [data-test=status]'); return r ? r.textContent : null;"
        ))
        .await;
    v.as_str().map(str::to_string)
}

#[tokio::test]
async fn the_overview_loads_clean_and_a_new_task_appears_and_completes_without_a_reload_then_its_page_tells_its_story()
{
    let s = serve(&[]).await;
    let Some(b) = browser(1280, 800).await else { return };
    open(&b, &s, "").await;
    b.wait_for("#overview [data-test=count-running] .value").await;
    let id = s
        .submit(
            json!({"prompt": "Count the moons [mock:tool_turns=2] [mock:delay_ms=400] [mock:reply=Ninety-five.]",
                       "model": "mock/demo", "subagent_type": "research"}),
            None,
        )
        .await;
    let seen = format!("document.querySelector('#latest-tasks tr[data-task-id=\"{id}\"]') !== null");
    b.wait_until("the new task is listed without a reload", &format!("return {seen};")).await;
    b.wait_until(
        "its status reaches completed",
        &format!("const r = document.querySelector('#latest-tasks tr[data-task-id=\"{id}\"] [data-test=status]'); return !!r && r.textContent.trim() === 'completed';"),
    )
    .await;
    assert_eq!(row_status(&b, "#latest-tasks", &id).await.as_deref().map(str::trim), Some("completed"));
    assert_eq!(b.severe_logs().await, Vec::<String>::new(), "console errors on the overview");

    // Its page: fields, the timeline in order, the conversation and the ledger.
    open(&b, &s, &format!("#/tasks/{id}")).await;
    b.wait_until("the timeline ends with finished", "const l = document.querySelectorAll('#timeline li[data-seq]'); return l.length > 0 && l[l.length - 1].dataset.kind === 'finished';").await;
    let seqs: Vec<i64> = serde_json::from_value(
        b.js("return Array.from(document.querySelectorAll('#timeline li[data-seq]')).map(l => Number(l.dataset.seq));")
            .await,
    )
    .unwrap();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "events in order, none missing: {seqs:?}");
    assert_eq!(seqs.first(), Some(&1));
    let kinds =
        b.js("return Array.from(document.querySelectorAll('#timeline li[data-seq]')).map(l => l.dataset.kind);").await;
    assert_eq!(kinds[0], "created");
    let count = |kind: &str| kinds.as_array().unwrap().iter().filter(|k| *k == kind).count();
    assert_eq!((count("llm_call_finished"), count("checkpoint"), count("finished")), (3, 3, 1), "{kinds}");
    assert!(b.text("#task-summary").await.contains("Ninety-five."));
    b.wait_until("the conversation", "return document.querySelectorAll('#conversation .message').length >= 6;").await;
    b.wait_until("the ledger", "return document.querySelectorAll('#calls tbody tr').length === 3;").await;
    b.screenshot("console-task").await;
    assert_eq!(b.severe_logs().await, Vec::<String>::new(), "console errors on the task page");
    b.close().await;
}

#[tokio::test]
async fn a_running_tasks_page_streams_its_events_as_they_happen() {
    let s = serve(&[]).await;
    let Some(b) = browser(1280, 800).await else { return };
    let id =
        s.submit(json!({"prompt": "Slowly [mock:tool_turns=3] [mock:delay_ms=700]", "model": "mock/demo"}), None).await;
    open(&b, &s, &format!("#/tasks/{id}")).await;
    b.wait_for("#timeline li[data-seq]").await;
    let early: usize =
        b.js("return document.querySelectorAll('#timeline li[data-seq]').length;").await.as_u64().unwrap() as usize;
    b.wait_until("finished arrives live", "const l = document.querySelectorAll('#timeline li[data-seq]'); return l.length > 0 && l[l.length - 1].dataset.kind === 'finished';").await;
    let late: usize =
        b.js("return document.querySelectorAll('#timeline li[data-seq]').length;").await.as_u64().unwrap() as usize;
    assert!(late > early + 3, "events streamed in while it ran: {early} then {late}");
    let t = s.finished(&id).await;
    assert_eq!(t["status"], "completed");
    b.close().await;
}

#[tokio::test]
async fn a_running_tasks_page_shows_its_text_as_the_model_writes_it() {
    let s = serve(&[]).await;
    let Some(b) = browser(1280, 800).await else { return };
    let reply: String = (1..=60).map(|i| format!("word{i}")).collect::<Vec<_>>().join(" ");
    let id = s
        .submit(
            // The page opens before the text starts: live output is what is written from then on.
            json!({"prompt": format!("Write slowly [mock:delay_ms=2000] [mock:stream_ms=80] [mock:reply={reply}]"),
                   "model": "mock/demo"}),
            None,
        )
        .await;
    open(&b, &s, &format!("#/tasks/{id}")).await;
    // Part of the text, while the task still runs.
    b.wait_until(
        "some live text while it runs",
        "const e = document.querySelector('#live-output'); const st = document.querySelector('#task-status');
         return !!e && e.textContent.includes('word10') && !!st && st.textContent.trim() === 'running';",
    )
    .await;
    let partial = b.text("#live-output").await;
    assert!(partial.starts_with("word1 word2") && !partial.contains("word60"), "{partial}");
    assert!(b.text("#live-note").await.contains("turn 1"));
    b.screenshot("console-live-output").await;
    b.wait_until(
        "it ends",
        "const st = document.querySelector('#task-status'); return !!st && st.textContent.trim() === 'completed';",
    )
    .await;
    b.wait_until(
        "the whole text",
        &format!("return document.querySelector('#live-output').textContent === {};", json!(reply)),
    )
    .await;
    assert_eq!(b.text("#task-summary").await.trim(), reply);
    assert_eq!(b.severe_logs().await, Vec::<String>::new(), "console errors on the live page");
    b.close().await;
}

#[tokio::test]
async fn task_lists_name_tasks_apart_with_the_whole_id_on_hover_and_a_copy_button() {
    let s = serve(&[]).await;
    // Tasks of one second: their ids start alike (a UUIDv7's first digits are its time).
    let mut ids = vec![];
    for i in 0..4 {
        ids.push(s.submit(json!({"prompt": format!("n{i} [mock:reply=ok]"), "model": "mock/demo"}), None).await);
    }
    assert!(ids.iter().all(|i| i[..8] == ids[0][..8]), "same first digits: {ids:?}");
    let Some(b) = browser(1280, 800).await else { return };
    open(&b, &s, "#/tasks").await;
    for id in &ids {
        b.wait_for(&format!("#tasks-table tr[data-task-id=\"{id}\"]")).await;
    }
    let shown = b
        .js("return Array.from(document.querySelectorAll('#tasks-table tr[data-task-id]')).map(r => {
               const a = r.querySelector('.task-short-id'); return [r.dataset.taskId, a.textContent, a.title]; });")
        .await;
    let shown: Vec<(String, String, String)> = serde_json::from_value(shown).unwrap();
    let labels: std::collections::HashSet<&str> = shown.iter().map(|s| s.1.as_str()).collect();
    assert_eq!(labels.len(), shown.len(), "every row named apart: {shown:?}");
    for (id, label, title) in &shown {
        assert_eq!(title, id, "the whole id on hover");
        assert!(id.ends_with(label.trim_start_matches('…')), "{label} is part of {id}");
    }
    b.screenshot("console-task-ids").await;
    // The copy button hands the whole id to the clipboard (a headless browser's clipboard cannot
    // be read back: the Clipboard API's writeText is watched instead).
    let first = &ids[0];
    b.js(
        "window.__copied = []; navigator.clipboard.writeText = async (t) => { window.__copied.push(t); }; return true;",
    )
    .await;
    b.js(&format!(
        "document.querySelector('#tasks-table tr[data-task-id=\"{first}\"] .copy-id').click(); return true;"
    ))
    .await;
    b.wait_until(
        "copied",
        &format!("const c = document.querySelector('#tasks-table tr[data-task-id=\"{first}\"] .copy-id'); return !!c && c.dataset.copied === {};", json!(first)),
    )
    .await;
    assert_eq!(b.js("return window.__copied;").await, json!([first]));
    // The task page's header: the short id, the whole id on hover and beside it, a copy button.
    open(&b, &s, &format!("#/tasks/{first}")).await;
    b.wait_for("#task-page .task-title .copy-id").await;
    assert_eq!(b.text("#task-id").await, *first);
    let title = b.js("return document.querySelector('.task-title .task-short-id').title;").await;
    assert_eq!(title, json!(first));
    b.close().await;
}

#[tokio::test]
async fn cancel_on_the_task_page_stops_a_slow_running_task() {
    let s = serve(&[]).await;
    let Some(b) = browser(1280, 800).await else { return };
    let id = s.submit(json!({"prompt": "Take long [mock:delay_ms=20000]", "model": "mock/demo"}), None).await;
    open(&b, &s, &format!("#/tasks/{id}")).await;
    b.wait_until(
        "it runs",
        "const e = document.querySelector('#task-status'); return !!e && e.textContent.trim() === 'running';",
    )
    .await;
    b.wait_for("#cancel-button").await.click().await.unwrap();
    b.wait_until(
        "it shows cancelled",
        "const e = document.querySelector('#task-status'); return !!e && e.textContent.trim() === 'cancelled';",
    )
    .await;
    let t: Value = s.client.get(format!("{}/tasks/{id}", s.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(t["status"], "cancelled");
    assert!(t["run_ms"].as_i64().unwrap() < 15000, "stopped, not run out: {t}");
    b.close().await;
}

#[tokio::test]
async fn the_usage_chart_draws_and_its_csv_export_matches_the_usage_api() {
    let s = serve(&[]).await;
    for model in ["mock/alpha", "mock/beta", "mock/alpha"] {
        let id = s.submit(json!({"prompt": "x [mock:tool_turns=1]", "model": model}), None).await;
        s.finished(&id).await;
    }
    let Some(b) = browser(1280, 800).await else { return };
    open(&b, &s, "#/usage").await;
    b.wait_for("#usage-chart canvas").await;
    b.wait_until(
        "the chart has drawn pixels",
        "const c = document.querySelector('#usage-chart canvas'); if (!c || !c.width) return false;
         const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
         let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) n++; return n > 500;",
    )
    .await;
    b.wait_until("the table", "return document.querySelectorAll('#usage-table tbody tr').length >= 2;").await;
    b.screenshot("console-usage").await;
    let href = b.js("return document.querySelector('#usage-csv').href;").await.as_str().unwrap().to_string();
    assert!(href.contains("format=csv"), "{href}");
    let csv = s.client.get(&href).send().await.unwrap().text().await.unwrap();
    let json_url = href.replace("&format=csv", "").replace("format=csv&", "");
    let rows: Value = s.client.get(&json_url).send().await.unwrap().json().await.unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0].split(',').next(), Some("day"));
    assert_eq!(lines.len() - 1, rows["rows"].as_array().unwrap().len(), "{csv}");
    for r in rows["rows"].as_array().unwrap() {
        let needle = format!("{},{}", r["model"].as_str().unwrap(), r["agent_type"].as_str().unwrap_or(""));
        let calls = r["calls"].to_string();
        assert!(
            lines
                .iter()
                .any(|l| l.contains(r["model"].as_str().unwrap()) && l.split(',').nth(5) == Some(calls.as_str())),
            "no CSV line for {needle} with {calls} calls: {csv}"
        );
    }
    b.close().await;
}

#[tokio::test]
async fn a_summary_that_looks_like_markup_stays_text() {
    let s = serve(&[]).await;
    let payload = "<img src=x onerror=alert(1)>";
    let id = s.submit(json!({"prompt": format!("[mock:reply={payload}]"), "model": "mock/demo"}), None).await;
    assert_eq!(s.finished(&id).await["summary"], payload);
    let Some(b) = browser(1280, 800).await else { return };
    open(&b, &s, "").await;
    b.wait_for("#overview").await;
    // Any alert from here on is recorded; the pages are rendered anew by the router.
    b.js("window.__alerted = false; window.alert = () => { window.__alerted = true; }; location.hash = '#/tasks'; return true;")
        .await;
    b.wait_for(&format!("#tasks-table tr[data-task-id=\"{id}\"]")).await;
    b.js(&format!("location.hash = '#/tasks/{id}'; return true;")).await;
    b.wait_until(
        "the summary",
        &format!(
            "const e = document.querySelector('#task-summary'); return !!e && e.textContent.includes({});",
            json!(payload)
        ),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.js("return document.querySelectorAll('img').length;").await, json!(0), "an element was created");
    assert_eq!(b.js("return window.__alerted;").await, json!(false), "a script ran");
    assert!(b.text("#task-summary").await.contains(payload));
    b.close().await;
}

#[tokio::test]
async fn with_keys_the_console_asks_to_sign_in_reads_nothing_and_a_tenant_sees_only_its_own_tasks() {
    let s = serve(&[("SUBAGENTD_AUTH", "keys")]).await;
    let a = s.key("acme").await;
    let bkey = s.key("globex").await;
    let mine = s.submit(json!({"prompt": "acme's [mock:reply=for acme]", "model": "mock/demo"}), Some(&a)).await;
    let theirs = s.submit(json!({"prompt": "globex's", "model": "mock/demo"}), Some(&bkey)).await;
    let Some(b) = browser(1280, 800).await else { return };
    open(&b, &s, "").await;
    b.wait_for("#signin-form").await;
    b.screenshot("console-signin").await;
    let read = b
        .js("return performance.getEntriesByType('resource').map(e => new URL(e.name).pathname).filter(p => !p.startsWith('/console'));")
        .await;
    assert_eq!(read, json!([]), "nothing read before signing in");
    assert_eq!(b.js("return document.querySelectorAll('#latest-tasks tr[data-task-id]').length;").await, json!(0));
    b.wait_for("#signin-key").await.send_keys(&a).await.unwrap();
    b.wait_for("#signin-submit").await.click().await.unwrap();
    b.wait_for(&format!("#latest-tasks tr[data-task-id=\"{mine}\"]")).await;
    open(&b, &s, "#/tasks").await;
    b.wait_for(&format!("#tasks-table tr[data-task-id=\"{mine}\"]")).await;
    assert!(row_status(&b, "#tasks-table", &theirs).await.is_none(), "another tenant's task is shown");
    assert!(row_status(&b, "#latest-tasks", &theirs).await.is_none());
    // The key stays out of the browser: not in storage, not in a readable cookie, not in a URL.
    let stored = b
        .js("return JSON.stringify(Object.assign({}, localStorage)) + JSON.stringify(Object.assign({}, sessionStorage)) + document.cookie + location.href;")
        .await;
    assert!(!stored.as_str().unwrap().contains(&a[..12]), "the key is stored: {stored}");
    assert!(!stored.as_str().unwrap().contains("subagentd_session"), "the session cookie is readable by scripts");
    // Another tenant's task page is a 404 for this session.
    open(&b, &s, &format!("#/tasks/{theirs}")).await;
    b.wait_until(
        "an error is shown",
        "const e = document.querySelector('#error-banner'); return !!e && e.textContent.length > 0;",
    )
    .await;
    b.close().await;
}

/// A tool server that records the arguments of each call and answers `done`.
async fn recording_tool() -> (std::sync::Arc<std::sync::Mutex<Vec<Value>>>, String) {
    use axum::{routing::post, Json, Router};
    let seen = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    let s = seen.clone();
    let app = Router::new().route(
        "/t",
        post(move |Json(v): Json<Value>| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push(v["arguments"].clone());
                Json(json!({"content": "done"}))
            }
        }),
    );
    let url = format!("{}/t", serve_router(app).await);
    (seen, url)
}

#[tokio::test]
async fn a_paused_task_is_approved_and_given_its_output_from_its_page() {
    let (seen, url) = recording_tool().await;
    let s = serve(&[("SUBAGENTD_TOOL_ALLOW", "*, 127.0.0.1/32")]).await;
    let Some(b) = browser(1280, 900).await else { return };
    let id = s
        .submit(
            json!({"prompt": "Restart the web tier [mock:tool_turns=1] [mock:tool=restart,ask_user] [mock:args={\"svc\":\"web\"}] [mock:reply=Restarted.]",
                   "model": "mock/demo", "approval": "all",
                   "tools": [{"name": "restart", "parameters": {"type": "object"}, "policy": "propose", "endpoint": url},
                             {"name": "ask_user", "description": "Asks the operator", "parameters": {"type": "object"}, "policy": "auto"}]}),
            None,
        )
        .await;
    open(&b, &s, &format!("#/tasks/{id}")).await;
    b.wait_until(
        "two pending actions",
        "return document.querySelectorAll('#pending-actions .pending-action').length === 2;",
    )
    .await;
    assert_eq!(b.text("#task-status").await.trim(), "requires_action");
    b.screenshot("console-pending").await;
    // Approve the restart with a message.
    b.wait_for("#pending-actions [data-kind=approval] [data-test=action-message]")
        .await
        .send_keys("go ahead")
        .await
        .unwrap();
    b.wait_for("#pending-actions [data-kind=approval] button[data-decision=approve]").await.click().await.unwrap();
    b.wait_until("one left", "return document.querySelectorAll('#pending-actions .pending-action').length === 1;")
        .await;
    // The caller tool's output: JSON (text that is not JSON goes as text).
    b.wait_for("#pending-actions [data-kind=output] [data-test=action-output]")
        .await
        .send_keys(r#"{"answer": 42}"#)
        .await
        .unwrap();
    b.wait_for("#pending-actions [data-kind=output] button[data-decision=output]").await.click().await.unwrap();
    b.wait_until(
        "it completes",
        "const e = document.querySelector('#task-status'); return !!e && e.textContent.trim() === 'completed';",
    )
    .await;
    assert!(b.text("#task-summary").await.contains("Restarted."));
    let hidden = b.js("return document.querySelector('#pending-actions').hidden;").await;
    assert_eq!(hidden, json!(true), "nothing pending any more");
    assert_eq!(*seen.lock().unwrap(), [json!({"svc": "web"})], "the approved call ran once");
    let t = s.finished(&id).await;
    assert_eq!(t["status"], "completed");
    let kinds =
        b.js("return Array.from(document.querySelectorAll('#timeline li[data-seq]')).map(l => l.dataset.kind);").await;
    let answered = kinds.as_array().unwrap().iter().filter(|k| *k == "action_answered").count();
    assert_eq!(answered, 2, "{kinds}");
    assert_eq!(b.severe_logs().await, Vec::<String>::new());
    b.close().await;
}

#[tokio::test]
async fn screenshots_of_the_main_pages_at_desktop_and_phone_size() {
    let s = serve(&[]).await;
    for (i, model) in ["mock/demo", "mock/large", "mock/demo", "mock/small"].iter().enumerate() {
        let id = s
            .submit(
                json!({"prompt": format!("Task {i} [mock:tool_turns=1]"), "model": model, "subagent_type": "research",
                           "metadata": {"batch": "docs"}}),
                None,
            )
            .await;
        s.finished(&id).await;
    }
    s.submit(json!({"prompt": "Still working [mock:delay_ms=30000]", "model": "mock/demo"}), None).await;
    // A Claude Code agent file whose model and tools cannot be served here: listed, with warnings.
    let r = s
        .client
        .put(format!("{}/agents/api-designer", s.base))
        .header("content-type", "text/markdown")
        .body("---\nname: api-designer\ndescription: Designs APIs\ntools: Read, Write\nmodel: sonnet\n---\nYou design APIs.\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // What the tenant's kept changes and diffs hold, shown with its spend.
    sqlx::query("INSERT INTO tenant_storage (tenant, kept_bytes) VALUES ('default', 3355443)")
        .execute(&s._db.pool)
        .await
        .unwrap();
    let Some(b) = browser(1280, 800).await else { return };
    for (name, hash, ready) in [
        ("console-overview", "", "#latest-tasks tr[data-task-id]"),
        ("console-tasks", "#/tasks", "#tasks-table tr[data-task-id]"),
        ("console-catalog", "#/catalog", "#agents-table [data-test=agent-warnings] li"),
    ] {
        open(&b, &s, hash).await;
        b.wait_for(ready).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        b.screenshot(name).await;
    }
    open(&b, &s, "").await;
    b.wait_for("#spend .spend-row").await;
    let spend = b.text("#spend").await;
    assert!(spend.contains("kept diffs 3.2 MiB / 10 GiB"), "{spend}");
    b.js("document.querySelector('#spend').scrollIntoView(); return true;").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.screenshot("console-spend").await;
    open(&b, &s, "#/catalog").await;
    b.wait_for("#agents-table [data-test=agent-warnings] li").await;
    // The catalog lists the built-in tools, run by the service, and the types that get them.
    let tools = b.text("#tools-table").await;
    assert!(tools.contains("web_fetch") && tools.contains("built in: run by subagentd"), "{tools}");
    let agents = b.text("#agents-table").await;
    assert!(agents.contains("built in: web_fetch"), "{agents}");
    assert_eq!(b.severe_logs().await, Vec::<String>::new());
    b.close().await;
    let Some(phone) = browser(390, 844).await else { return };
    open(&phone, &s, "").await;
    phone.wait_for("#latest-tasks tr[data-task-id]").await;
    // Readable on a phone: the page does not scroll sideways.
    let wide = phone.js("return document.documentElement.scrollWidth <= window.innerWidth + 1;").await;
    assert_eq!(wide, json!(true), "the overview is wider than a phone");
    tokio::time::sleep(Duration::from_millis(500)).await;
    phone.screenshot("console-phone").await;
    phone.close().await;
}

#[tokio::test]
async fn the_console_is_served_with_a_strict_policy_and_versioned_assets() {
    let app = spawn_app_with(|_| {}, false).await;
    let r = app.client.get(app.url("/console")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"].to_str().unwrap().to_string();
    for part in ["script-src 'self'", "frame-ancestors 'none'", "default-src 'self'"] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"));
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    let page = r.text().await.unwrap();
    let js = page.split("src=\"").nth(2).and_then(|s| s.split('"').next()).unwrap().to_string();
    assert!(js.contains("?v="), "{js}");
    let r = app.client.get(app.url(&js)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["cache-control"].to_str().unwrap().contains("immutable"));
    let root = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let r = root.get(app.url("/")).send().await.unwrap();
    assert_eq!(r.headers()["location"], "/console");
    let r = app.client.get(app.url("/console/assets/nope.js")).send().await.unwrap();
    assert_problem(r, 404, "not_found").await;
    app.stop().await;
}

#[tokio::test]
async fn a_session_is_made_from_a_key_once_and_its_writes_need_the_csrf_token() {
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into()), true).await;
    let key = admin_key(&app, ADMIN, "acme").await;
    let key = key.as_str();
    let r = app.post_json("/console/session", json!({"key": "sk_00000000_wrong"})).await;
    assert_problem(r, 401, "unauthorized").await;
    let r = app.post_json("/console/session", json!({"key": key})).await;
    assert_eq!(r.status(), 200);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    assert!(!cookie.contains(key), "the cookie is not the key");
    let session: Value = r.json().await.unwrap();
    assert_eq!((session["tenant"].as_str(), session["admin"].as_bool()), (Some("acme"), Some(false)));
    let csrf = session["csrf"].as_str().unwrap().to_string();
    let jar = cookie.split(';').next().unwrap().to_string();
    let t = app
        .client
        .post(app.url("/tasks"))
        .bearer_auth(key)
        .json(&json!({"prompt": "slow [mock:delay_ms=5000]", "model": "mock/m"}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let id = t["id"].as_str().unwrap();
    // Reads with the cookie alone; a write without the token is refused and changes nothing.
    let r = app.client.get(app.url(&format!("/tasks/{id}"))).header("cookie", &jar).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = app.client.post(app.url(&format!("/tasks/{id}/cancel"))).header("cookie", &jar).send().await.unwrap();
    assert_problem(r, 403, "csrf_failed").await;
    let still: Value =
        app.client.get(app.url(&format!("/tasks/{id}"))).bearer_auth(key).send().await.unwrap().json().await.unwrap();
    assert_ne!(still["status"], "cancelled");
    let r = app
        .client
        .post(app.url(&format!("/tasks/{id}/cancel")))
        .header("cookie", &jar)
        .header("x-csrf-token", &csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // An admin session reads every tenant's tasks; signing out ends the session.
    let r = app.post_json("/console/session", json!({"key": ADMIN})).await;
    let admin_jar = r.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let admin: Value = r.json().await.unwrap();
    assert_eq!(admin["admin"], true);
    let listed: Value =
        app.client.get(app.url("/tasks")).header("cookie", &admin_jar).send().await.unwrap().json().await.unwrap();
    assert!(listed["tasks"].as_array().unwrap().iter().any(|t| t["id"] == id && t["tenant"] == "acme"));
    let r = app
        .client
        .delete(app.url("/console/session"))
        .header("cookie", &admin_jar)
        .header("x-csrf-token", admin["csrf"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = app.client.get(app.url("/tasks")).header("cookie", &admin_jar).send().await.unwrap();
    assert_problem(r, 401, "unauthorized").await;
    app.stop().await;
}

#[tokio::test]
async fn every_grafana_panel_query_runs_against_the_migrated_schema_with_data() {
    let app = spawn_app().await;
    for i in 0..3 {
        app.wait_task(json!({"prompt": format!("x{i} [mock:tool_turns=1]"), "model": "mock/m"})).await;
    }
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/dashboards/subagentd.json"))
            .unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    let mut ran = 0;
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let Some(sql) = t["rawSql"].as_str() else { continue };
            // Grafana's macros, as its Postgres data source expands them.
            let re = regex_lite::Regex::new(r"\$__timeFilter\(([^)]*)\)").unwrap();
            let sql = re.replace_all(sql, "$1 BETWEEN now() - interval '30 days' AND now() + interval '1 day'");
            let rows: Vec<sqlx::postgres::PgRow> = sqlx::query(&sql)
                .fetch_all(&app.db.pool)
                .await
                .unwrap_or_else(|e| panic!("panel {:?}: {e}\n{sql}", p["title"]));
            assert!(!rows.is_empty(), "panel {:?} shows nothing with data present", p["title"]);
            ran += 1;
        }
    }
    assert!(ran >= 5, "{ran} panels");
    app.stop().await;
}

#[tokio::test]
async fn at_its_stream_limit_a_task_page_follows_by_polling_and_the_overview_shows_the_replicas_holds() {
    let s = serve(&[]).await;
    let Some(b) = browser(1280, 800).await else { return };
    let r = s
        .client
        .put(format!("{}/admin/tenants/default", s.base))
        .bearer_auth(ADMIN)
        .json(&json!({"max_streams": 1}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let id = s
        .submit(json!({"prompt": "Slowly [mock:tool_turns=3] [mock:delay_ms=900] [mock:reply=All done.]", "model": "mock/demo"}), None)
        .await;
    // Another reader holds the tenant's one stream.
    let held = s
        .client
        .get(format!("{}/tasks/{id}/events", s.base))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    open(&b, &s, &format!("#/tasks/{id}")).await;
    b.wait_until(
        "the page says the tenant is at its stream limit",
        "const n = document.querySelector('#stream-state'); return !!n && n.textContent.includes('stream limit');",
    )
    .await;
    b.js("document.querySelector('#stream-state').scrollIntoView({block: 'center'}); return null;").await;
    b.screenshot("console-stream-limit").await;
    b.wait_until(
        "the events still arrive, polled, to the last",
        "const l = document.querySelectorAll('#timeline li[data-seq]'); return l.length > 0 && l[l.length - 1].dataset.kind === 'finished';",
    )
    .await;
    b.wait_until(
        "the summary shows",
        "const e = document.querySelector('#task-summary'); return !!e && e.textContent.includes('All done.');",
    )
    .await;
    drop(held);
    // The overview: this replica's open streams, by tenant, against the limit (a stream held on
    // a task that runs a while).
    let long = s.submit(json!({"prompt": "Long [mock:delay_ms=30000]", "model": "mock/demo"}), None).await;
    let held = s
        .client
        .get(format!("{}/tasks/{long}/events", s.base))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    open(&b, &s, "").await;
    b.wait_until(
        "the holds card lists the tenant",
        "const r = document.querySelector('#holds-table tr[data-tenant=\"default\"]'); return !!r && r.textContent.includes('1 / 1');",
    )
    .await;
    assert!(b.text("[data-test=connections]").await.contains("connections on the replica that answered"));
    b.js("document.querySelector('#holds-table').scrollIntoView({block: 'center'}); return null;").await;
    b.screenshot("console-holds").await;
    // The refused stream's 429 is the browser's to log; nothing else is.
    let logs: Vec<String> = b.severe_logs().await.into_iter().filter(|l| !l.contains("429")).collect();
    assert_eq!(logs, Vec::<String>::new(), "console errors");
    drop(held);
    b.close().await;
}

#[tokio::test]
async fn the_api_reference_draws_the_task_operations_from_the_binarys_own_document_and_fetches_nothing_elsewhere() {
    let s = serve(&[]).await;
    let r = s.client.get(format!("{}/openapi.yaml", s.base)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/yaml; charset=utf-8");
    let served = r.text().await.unwrap();
    assert_eq!(served, include_str!("../../openapi.yaml"), "the binary serves the repository's document");
    let r = s.client.get(format!("{}/docs", s.base)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"].to_str().unwrap().to_string();
    for directive in ["default-src 'none'", "script-src 'self';", "connect-src 'self'", "frame-ancestors 'none'"] {
        assert!(csp.contains(directive), "{directive} in {csp}");
    }
    assert!(!csp.contains("http") && !csp.contains("unsafe-eval") && !csp.contains("blob:"), "{csp}");

    let Some(b) = browser(1280, 900).await else { return };
    b.client.goto(&format!("{}/docs", s.base)).await.unwrap();
    b.wait_until("Redoc drew the document", "return document.documentElement.dataset.reference === 'ready';").await;
    let text = b.js("return document.body.innerText;").await.as_str().unwrap_or_default().to_string();
    for op in [
        "Submit a task",
        "List tasks, newest first",
        "Read a task; with",
        "Cancel every queued, running and/or paused task",
        "The task's usage ledger",
    ] {
        assert!(text.contains(op), "the reference shows {op:?}");
    }
    // Every request the page made went to this origin.
    let origins =
        b.js("return [...new Set(performance.getEntriesByType('resource').map(e => new URL(e.name).origin))];").await;
    assert_eq!(origins, serde_json::json!([s.base]), "requests beyond the service: {origins}");
    assert_eq!(b.severe_logs().await, Vec::<String>::new(), "errors (a CSP refusal among them) in the page");
    // The task operations, where a reader lands from the README.
    b.js("const h = [...document.querySelectorAll('h2')].find(e => e.textContent.includes('Submit a task')); \
          h.scrollIntoView(); window.scrollBy(0, -20); return null;")
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    b.screenshot("api-reference").await;
    b.close().await;
}
