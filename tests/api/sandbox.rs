//! General agents that change code (issue 45): a writable copy of a real git workspace per
//! task, `write_file` / `edit_file` / `run_command` (in bubblewrap) over it, and the patch back
//! (`GET /tasks/{id}/diff`), applied with `git apply` to the original commit. The escapes from
//! the sandbox are `tools::sandbox`'s own tests; here the service's side of them.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::*;
use crate::workspaces::{git, git_server};

fn sb_config(c: &mut subagentd::config::Config) {
    c.builtin_tools_off = "web_fetch,web_search".into();
    c.workspace_git_allow = Some("127.0.0.1/32".into());
    c.default_model = Some("mock/m".into());
}

/// The sandbox starts here, or the group is skipped (a failure under `.ci/run`): bubblewrap, or
/// gVisor under `SUBAGENTD_SANDBOX_RUNTIME=gvisor` (the second pass of `scripts/test`), which must
/// run a command, else the tests say why.
pub(crate) fn has_bwrap() -> bool {
    use subagentd::tools::sandbox::{Limits, Runtime, Sandbox};
    let cfg = subagentd::config::Config::defaults();
    if let (Runtime::Gvisor, runsc) = Runtime::of(&cfg) {
        let limits = Limits {
            max_timeout: Duration::from_secs(30),
            memory_bytes: 256 << 20,
            processes: 64,
            write_bytes: 1 << 20,
            write_entries: 100,
            tmp_bytes: 1 << 20,
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        return match Sandbox::probe(Runtime::Gvisor, runsc, limits, 1, 0, dir.path()) {
            Ok(_) => true,
            Err(e) => {
                skipped(
                    "SUBAGENTD_REQUIRE_TOOLS",
                    "sandboxed commands under gVisor",
                    &format!("runsc cannot make a sandbox here: {e}"),
                    "apt-get install runsc, on a host with unprivileged user namespaces (bash .ci/run installs it)",
                );
                false
            }
        };
    }
    let ok = std::process::Command::new("bwrap")
        .args(["--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "--", "/usr/bin/true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skipped(
            "SUBAGENTD_REQUIRE_TOOLS",
            "sandboxed commands",
            "bubblewrap (`bwrap`) is missing or cannot make a sandbox here",
            "apt-get install bubblewrap (bash .ci/run does)",
        );
    }
    ok
}

/// The prompt whose mock makes these calls, one a turn.
fn script(calls: &[(&str, Value)]) -> String {
    let list: Vec<Value> = calls.iter().map(|(t, a)| json!({"tool": t, "args": a})).collect();
    format!("change the code [mock:calls={}]", Value::Array(list))
}

async fn run(app: &TestApp, body: Value) -> Value {
    let r = app.client.post(app.url("/tasks?wait=true&timeout=120")).json(&body).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    r.json().await.unwrap()
}

async fn tool_results(app: &TestApp, t: &Value) -> Vec<String> {
    crate::tools::tool_results(app, t["id"].as_str().unwrap())
        .await
        .into_iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

async fn diff(app: &TestApp, t: &Value) -> reqwest::Response {
    app.client.get(app.url(&format!("/tasks/{}/diff", t["id"].as_str().unwrap()))).send().await.unwrap()
}

/// Apply `patch` with `git apply` to a clone of `repo` at `commit`; the clone's directory.
fn apply(repo: &str, commit: &str, patch: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["clone", "-q", repo, "c"]);
    let c = dir.path().join("c");
    git(&c, &["checkout", "-q", commit]);
    std::fs::write(dir.path().join("p.diff"), patch).unwrap();
    git(&c, &["apply", "--whitespace=nowarn", dir.path().join("p.diff").to_str().unwrap()]);
    dir
}

#[tokio::test]
async fn a_general_agent_edits_runs_the_repositorys_test_and_returns_a_patch_that_applies() {
    let Some(srv) = git_server().await else { return };
    if !has_bwrap() {
        return;
    }
    let app = spawn_app_with(sb_config, true).await;
    let repo = format!("{}/repo.git", srv.base);
    let calls = [
        ("run_command", json!({"command": "sh check.sh"})),
        ("edit_file", json!({"path": "src/retry.rs", "old_string": "    5", "new_string": "    7"})),
        ("read_file", json!({"path": "src/retry.rs"})),
        ("run_command", json!({"command": "sh check.sh && mkdir -p target && echo junk > target/out"})),
        ("write_file", json!({"path": "NOTES.md", "content": "Retries raised to 7.\n"})),
    ];
    let t = run(&app, json!({"workspace": {"git": repo}, "prompt": script(&calls), "max_turns": 10})).await;
    assert_eq!(t["status"], "completed", "{t}");
    let tools: Vec<&str> = t["tools"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for name in ["write_file", "edit_file", "run_command", "read_file"] {
        assert!(tools.contains(&name), "general has {name}: {tools:?}");
    }
    let results = tool_results(&app, &t).await;
    assert!(
        results[0].starts_with("exit code: 1") && results[0].contains("FAIL: expected 7 retries"),
        "{}",
        results[0]
    );
    assert!(results[1].contains("Edited \"src/retry.rs\""), "{}", results[1]);
    assert!(results[2].contains("3\t    7"), "the read tools see the task's own change: {}", results[2]);
    assert!(results[3].starts_with("exit code: 0") && results[3].contains("PASS: 7 retries"), "{}", results[3]);

    // The counts on the task, the diff as text/x-diff, applying to the commit.
    assert_eq!(t["diff"]["files_changed"], 2, "{t}");
    assert_eq!((t["diff"]["lines_added"].as_u64(), t["diff"]["lines_removed"].as_u64()), (Some(2), Some(1)), "{t}");
    let r = diff(&app, &t).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/x-diff; charset=utf-8");
    let patch = r.text().await.unwrap();
    assert!(!patch.contains("target/"), "what .gitignore ignores is left out:\n{patch}");
    // On a blocking thread: the git server answering the clone runs on this test's runtime.
    let (r2, c2, p2) = (repo.clone(), srv.main.clone(), patch.clone());
    let applied = tokio::task::spawn_blocking(move || apply(&r2, &c2, &p2)).await.unwrap();
    let retry = std::fs::read_to_string(applied.path().join("c/src/retry.rs")).unwrap();
    assert!(retry.contains("    7\n"), "{retry}");
    assert_eq!(std::fs::read_to_string(applied.path().join("c/NOTES.md")).unwrap(), "Retries raised to 7.\n");

    // Each command is a tool call with its exit code and output size; counted by outcome.
    let ev: Value = app
        .client
        .get(app.url(&format!("/tasks/{}/events", t["id"].as_str().unwrap())))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let commands: Vec<&Value> = ev["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "tool_call_finished" && e["data"]["name"] == "run_command")
        .collect();
    assert_eq!(commands.len(), 2);
    assert_eq!(
        (commands[0]["data"]["exit_code"].as_i64(), commands[1]["data"]["exit_code"].as_i64()),
        (Some(1), Some(0))
    );
    assert!(commands[1]["data"]["output_bytes"].as_u64().unwrap() > 0, "{}", commands[1]);
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    // The recorder is the process's, shared with the other tests' apps running commands at the
    // same time: each outcome counted at least once, not exactly.
    for outcome in ["exit", "ok"] {
        let line = format!("subagentd_sandbox_commands_total{{outcome=\"{outcome}\"}} ");
        let n: u64 = metrics.lines().find_map(|l| l.strip_prefix(&line)?.trim().parse().ok()).unwrap_or(0);
        assert!(n >= 1, "{outcome}: {metrics}");
    }

    // The shared tree is never changed: a later reader sees the commit as it is.
    let read = json!({"subagent_type": "explore", "workspace": {"git": repo},
        "prompt": "[mock:tool_turns=1] [mock:tool=read_file] [mock:args={\"path\": \"src/retry.rs\"}]"});
    let e = run(&app, read).await;
    assert!(tool_results(&app, &e).await[0].contains("3\t    5"), "the cached tree is as fetched");
    assert!(e.get("diff").is_none(), "a reader has no diff: {e}");
    let r = diff(&app, &e).await;
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("only read its workspace"));
    app.stop().await;
}

#[tokio::test]
async fn two_tasks_on_one_commit_never_see_each_others_writes_and_readers_never_get_write_tools() {
    let Some(srv) = git_server().await else { return };
    if !has_bwrap() {
        return;
    }
    let app = spawn_app_with(sb_config, true).await;
    let repo = format!("{}/repo.git", srv.base);
    let body = |who: &str| {
        let calls = [
            ("write_file", json!({"path": "mine.txt", "content": format!("{who}\n")})),
            ("run_command", json!({"command": "sleep 1; cat mine.txt; ls"})),
        ];
        json!({"workspace": {"git": repo}, "prompt": script(&calls)})
    };
    let (a, b) = tokio::join!(run(&app, body("task A")), run(&app, body("task B")));
    for (t, own, other) in [(&a, "task A", "task B"), (&b, "task B", "task A")] {
        assert_eq!(t["status"], "completed", "{t}");
        let out = &tool_results(&app, t).await[1];
        assert!(out.contains(own) && !out.contains(other), "{out}");
        let patch = diff(&app, t).await.text().await.unwrap();
        assert!(patch.contains(&format!("+{own}")) && !patch.contains(other), "{patch}");
    }
    // explore, plan and research never get them, nor a read-only definition.
    for agent in ["explore", "plan", "research"] {
        let t = run(&app, json!({"subagent_type": agent, "workspace": {"git": repo}, "prompt": "look"})).await;
        let tools = t["tools"].to_string();
        assert!(
            !tools.contains("write_file") && !tools.contains("edit_file") && !tools.contains("run_command"),
            "{agent}: {tools}"
        );
    }
    let r = app
        .client
        .put(app.url("/agents/reviewer"))
        .json(&json!({"description": "reviews", "system_prompt": "review", "read_only": true}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let t = run(&app, json!({"subagent_type": "reviewer", "workspace": {"git": repo}, "prompt": "look"})).await;
    assert!(!t["tools"].to_string().contains("write_file"), "{t}");
    // With approval, a command waits for a decision like any side-effecting tool.
    let calls = [("run_command", json!({"command": "echo approved"}))];
    let t = run(&app, json!({"workspace": {"git": repo}, "approval": "propose", "prompt": script(&calls)})).await;
    assert_eq!(t["status"], "requires_action", "{t}");
    let acts = t["pending_actions"].to_string();
    assert!(acts.contains("\"kind\":\"approval\"") && acts.contains("\"name\":\"run_command\""), "{t}");
    app.stop().await;
}

#[tokio::test]
async fn a_kill_dash_nine_after_two_edits_in_two_turns_loses_neither() {
    let Some(srv) = git_server().await else { return };
    if !has_bwrap() {
        return;
    }
    let app = spawn_app_with(sb_config, false).await;
    let repo = format!("{}/repo.git", srv.base);
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env = |d: &tempfile::TempDir| -> Vec<(String, String)> {
        vec![
            ("SUBAGENTD_DATA_DIR".into(), d.path().display().to_string()),
            ("SUBAGENTD_WORKSPACE_GIT_ALLOW".into(), "127.0.0.1/32".into()),
            ("SUBAGENTD_BUILTIN_TOOLS_OFF".into(), "web_fetch,web_search".into()),
            ("SUBAGENTD_LEASE_SECONDS".into(), "2".into()),
            ("SUBAGENTD_HEARTBEAT_SECONDS".into(), "1".into()),
        ]
    };
    let spawn = |d: &tempfile::TempDir| {
        let e = env(d);
        let refs: Vec<(&str, &str)> = e.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        spawn_binary(&["worker"], &app.db.url, &refs)
    };
    let a = spawn(&da);
    workers_up(&app.db.pool, 1, Duration::from_secs(30)).await;
    let calls = [
        ("edit_file", json!({"path": "src/retry.rs", "old_string": "    5", "new_string": "    7"})),
        ("write_file", json!({"path": "NOTES.md", "content": "second turn\n"})),
        ("run_command", json!({"command": "sleep 4; cat src/retry.rs NOTES.md"})),
    ];
    let t = app.submit(json!({"workspace": {"git": repo}, "prompt": script(&calls), "max_turns": 10})).await;
    let id: uuid::Uuid = t["id"].as_str().unwrap().parse().unwrap();
    // Killed once the second turn's checkpoint (with its changes) is written.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM task_event_log WHERE task_id = $1 AND kind = 'checkpoint' AND (data->>'turn')::int >= 2",
        )
        .bind(id)
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
        if n > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the second turn never checkpointed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut a = a;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGKILL) };
    let _ = a.child.wait();
    let _b = spawn(&db);
    let done = loop {
        let d = app.get_task(t["id"].as_str().unwrap()).await;
        if !matches!(d["status"].as_str(), Some("queued" | "running")) {
            break d;
        }
        assert!(Instant::now() < deadline + Duration::from_secs(60), "the rescued run never ended: {d}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["status"], "completed", "{done}");
    let attempt: i32 =
        sqlx::query_scalar("SELECT attempt FROM tasks WHERE id = $1").bind(id).fetch_one(&app.db.pool).await.unwrap();
    assert!(attempt >= 2, "the run was rescued: attempt {attempt}");
    let results = tool_results(&app, &done).await;
    let last = results.last().unwrap();
    assert!(last.contains("    7") && last.contains("second turn"), "the rescued run has both edits: {last}");
    let patch = diff(&app, &done).await.text().await.unwrap();
    assert!(patch.contains("+    7") && patch.contains("+second turn"), "{patch}");
    assert_eq!(done["diff"]["files_changed"], 2, "{done}");
    app.stop().await;
}

#[tokio::test]
async fn the_mcp_result_and_the_a2a_task_carry_the_patch() {
    let Some(srv) = git_server().await else { return };
    if !has_bwrap() {
        return;
    }
    let app = spawn_app_with(sb_config, true).await;
    let repo = format!("{}/repo.git", srv.base);
    let edit = [("edit_file", json!({"path": "src/retry.rs", "old_string": "    5", "new_string": "    7"}))];
    let mcp = crate::mcp::RawMcp::open(&app).await;
    let list = mcp.call(2, "tools/list", json!({})).await;
    assert!(list.text().await.unwrap().contains("\"patch\""), "the output schema names the patch");
    let args =
        json!({"subagent_type": "general", "description": "fix", "workspace": {"git": repo}, "prompt": script(&edit)});
    let v: Value = mcp.task(3, args).await.json().await.unwrap();
    let diff = &v["result"]["structuredContent"]["diff"];
    assert_eq!(diff["files_changed"], 1, "{v}");
    assert!(diff["patch"].as_str().unwrap_or_default().contains("+    7"), "{v}");

    let send = json!({"jsonrpc": "2.0", "id": 5, "method": "SendMessage",
                      "params": {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": script(&edit)}],
                                             "metadata": {"workspace": {"git": repo}}},
                                 "configuration": {"blocking": true}}});
    let a2a = |body: Value| crate::a2a::raw(&app, "general", body);
    let r: Value = a2a(send).await.json().await.unwrap();
    let id = r["result"]["task"]["id"].as_str().or(r["result"]["id"].as_str()).unwrap_or_default().to_string();
    assert!(!id.is_empty(), "{r}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let task = loop {
        let g: Value = a2a(json!({"jsonrpc": "2.0", "id": 6, "method": "GetTask", "params": {"id": id}}))
            .await
            .json()
            .await
            .unwrap();
        if g["result"]["status"]["state"] == "TASK_STATE_COMPLETED" {
            break g;
        }
        assert!(Instant::now() < deadline, "{g}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let artifacts = task["result"]["artifacts"].as_array().cloned().unwrap_or_default();
    let d = artifacts.iter().find(|a| a["artifactId"] == "diff").unwrap_or_else(|| panic!("{task}"));
    assert_eq!(d["parts"][0]["mediaType"], "text/x-diff");
    assert!(d["parts"][0]["text"].as_str().unwrap().contains("+    7"), "{d}");
    assert_eq!(d["metadata"]["lines_added"], 1, "{d}");
    app.stop().await;
}

/// The sandbox's app with an admin token (tenants of their own), `tweak` applied after.
async fn admin_app(admin: &str, tweak: impl FnOnce(&mut subagentd::config::Config)) -> TestApp {
    let admin = admin.to_string();
    spawn_app_with(
        move |c| {
            sb_config(c);
            c.admin_token = Some(admin);
            tweak(c);
        },
        true,
    )
    .await
}

/// The `tool_call_finished` events of `run_command` in task `id`'s log, as `key` sees it (""
/// for the single user).
async fn command_events(app: &TestApp, key: &str, id: &str) -> Vec<Value> {
    let mut req = app.client.get(app.url(&format!("/tasks/{id}/events")));
    if !key.is_empty() {
        req = req.bearer_auth(key);
    }
    let ev: Value = req.send().await.unwrap().json().await.unwrap();
    ev["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "tool_call_finished" && e["data"]["name"] == "run_command")
        .cloned()
        .collect()
}

#[tokio::test]
async fn one_tenants_long_commands_never_hold_every_slot_another_tenants_command_starts_within_seconds() {
    const ADMIN: &str = "sandbox-fair-admin";
    let Some(srv) = git_server().await else { return };
    if !has_bwrap() {
        return;
    }
    // A process cap of 2, the tenant share as it is by default (half of it).
    let app = admin_app(ADMIN, |c| c.sandbox_max_commands = 2).await;
    let (a, b) = (admin_key(&app, ADMIN, "tenant-a").await, admin_key(&app, ADMIN, "tenant-b").await);
    let repo = format!("{}/repo.git", srv.base);
    let long = script(&[("run_command", json!({"command": "sleep 45", "timeout_seconds": 60}))]);
    let mut held = vec![];
    for _ in 0..3 {
        let r = app
            .client
            .post(app.url("/tasks"))
            .bearer_auth(&a)
            .json(&json!({"workspace": {"git": repo}, "prompt": long}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
        held.push(r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string());
    }
    // Tenant A's commands have asked for their slots before B comes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = Instant::now();
    let quick = script(&[("run_command", json!({"command": "echo hi"}))]);
    let r = app
        .client
        .post(app.url("/tasks?wait=true&timeout=60"))
        .bearer_auth(&b)
        .json(&json!({"workspace": {"git": repo}, "prompt": quick}))
        .send()
        .await
        .unwrap();
    let t: Value = r.json().await.unwrap();
    let took = started.elapsed();
    assert_eq!(t["status"], "completed", "{t}");
    assert!(took < Duration::from_secs(15), "B's echo took {took:?} beside A's three 45 s commands");
    let b_cmd = command_events(&app, &b, t["id"].as_str().unwrap()).await;
    assert_eq!(b_cmd.len(), 1, "{b_cmd:?}");
    assert_eq!(b_cmd[0]["data"]["outcome"], "ok", "{b_cmd:?}");
    let waited = b_cmd[0]["data"]["slot_wait_ms"].as_u64().expect("the wait for a slot is in the event");
    assert!(waited < 15_000, "{waited} ms");
    // A holds one slot at most: its other two commands have not started.
    let mut a_finished = 0;
    for id in &held {
        a_finished += command_events(&app, &a, id).await.len();
    }
    assert_eq!(a_finished, 0, "A's sleeps are still running or waiting");
    for id in &held {
        let r = app.client.post(app.url(&format!("/tasks/{id}/cancel"))).bearer_auth(&a).send().await.unwrap();
        assert!(r.status().is_success());
    }
}

#[tokio::test]
async fn directories_and_links_by_the_hundred_thousand_are_stopped_and_links_out_of_the_tree_stay_out_of_the_patch() {
    let Some(srv) = git_server().await else { return };
    if !has_bwrap() {
        return;
    }
    // The default limits (65,536 entries more than the start, 1 GiB).
    let app = spawn_app_with(sb_config, true).await;
    let repo = format!("{}/repo.git", srv.base);
    let py = |body: &str| format!("python3 -c \"import os\n{body}\"");
    let calls = [
        ("run_command", json!({"command": py("for i in range(300000): os.mkdir('zd%d' % i)")})),
        ("run_command", json!({"command": "rm -rf zd*"})),
        ("run_command", json!({"command": py("for i in range(100000): os.symlink('/' + 'x' * 200, 'zl%d' % i)")})),
        ("run_command", json!({"command": "rm -f zl*"})),
        ("run_command", json!({"command": "ln -s / rootl && ln -s ../../../etc/passwd src/up && echo kept > ok.txt"})),
    ];
    let t = run(&app, json!({"workspace": {"git": repo}, "prompt": script(&calls), "max_turns": 10})).await;
    assert_eq!(t["status"], "completed", "{t}");
    let cmds = command_events(&app, "", t["id"].as_str().unwrap()).await;
    assert_eq!(cmds.len(), 5, "{cmds:?}");
    for (i, what) in [(0, "300,000 directories"), (2, "100,000 links")] {
        assert_eq!(cmds[i]["data"]["outcome"], "limit", "{what}: {}", cmds[i]);
        // Said, not asserted: the command's time, and the walk after it (BENCHMARKS.md).
        let d = &cmds[i]["data"];
        assert!(d["walk_ms"].is_u64(), "the walk after the command is timed: {d}");
        eprintln!("{what}: stopped after {} ms, the walk after it {} ms", d["duration_ms"], d["walk_ms"]);
        assert_eq!(cmds[i + 1]["data"]["outcome"], "ok", "what it left is removed: {}", cmds[i + 1]);
    }
    let results = tool_results(&app, &t).await;
    assert!(results[0].contains("grew past its limit"), "{}", results[0]);
    assert_eq!(cmds[4]["data"]["outcome"], "ok", "{}", cmds[4]);

    // The patch: the file, not the links leading out; both named in `omitted`.
    let omitted: Vec<&str> = t["diff"]["omitted"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for name in ["rootl", "src/up"] {
        assert!(omitted.contains(&format!("{name} (a symbolic link leading outside the tree)").as_str()), "{t}");
    }
    let patch = diff(&app, &t).await.text().await.unwrap();
    assert!(patch.contains("b/ok.txt") && !patch.contains("rootl") && !patch.contains("src/up"), "{patch}");
    let (r2, c2) = (repo.clone(), srv.main.clone());
    let applied = tokio::task::spawn_blocking(move || apply(&r2, &c2, &patch)).await.unwrap();
    let c = applied.path().join("c");
    assert_eq!(std::fs::read_to_string(c.join("ok.txt")).unwrap(), "kept\n");
    assert!(c.join("rootl").symlink_metadata().is_err() && c.join("src/up").symlink_metadata().is_err());
}

#[test]
fn the_default_ignore_patterns_are_the_settings_default() {
    let c = subagentd::config::Config::defaults();
    assert_eq!(c.sandbox_ignore, subagentd::workspace::copy::DEFAULT_IGNORE);
}

#[tokio::test]
async fn binary_files_are_in_the_patch_in_gits_form_and_build_output_is_left_out_without_a_gitignore() {
    let Some(srv) = git_server().await else { return };
    if !has_bwrap() {
        return;
    }
    let app = spawn_app_with(sb_config, true).await;
    let repo = format!("{}/repo.git", srv.base);
    // A tree with no `.gitignore`; a binary added, one changed, one past the binary cap (256 KiB),
    // a text file edited, and the bytecode and build output a run leaves.
    let make = "rm .gitignore && mkdir -p __pycache__ node_modules/x target/debug && python3 -c \"\
import os
open('data.bin', 'wb').write(bytes(range(256)) * 12)
open('logo.bin', 'ab').write(bytes([1, 2, 0]))
open('big.bin', 'wb').write(os.urandom(400000))
open('__pycache__/m.cpython-311.pyc', 'wb').write(os.urandom(300))
open('mod.pyc', 'wb').write(os.urandom(300))
open('node_modules/x/index.js', 'w').write('x')
open('target/debug/out', 'wb').write(os.urandom(300))\" && sed -i 's/    5/    7/' src/retry.rs";
    let calls = [("run_command", json!({"command": make}))];
    let t = run(&app, json!({"workspace": {"git": repo}, "prompt": script(&calls), "max_turns": 4})).await;
    assert_eq!(t["status"], "completed", "{t}");
    let omitted: Vec<&str> = t["diff"]["omitted"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(
        omitted.len() == 1 && omitted[0].starts_with("big.bin (binary, 400000 bytes, sha256 "),
        "the binary past the cap is named with its size and hash: {omitted:?}"
    );
    assert_eq!(t["diff"]["binary_files"], 3, "data.bin, logo.bin, big.bin: {t}");
    let patch = diff(&app, &t).await.text().await.unwrap();
    assert_eq!(patch.matches("GIT binary patch").count(), 2, "{patch}");
    assert!(patch.contains(
        "diff --git a/data.bin b/data.bin\nnew file mode 100644\nindex 0000000000000000000000000000000000000000.."
    ));
    for left in ["a/__pycache__", "a/mod.pyc", "a/node_modules", "a/target/", "a/big.bin", "Binary files"] {
        assert!(!patch.contains(left), "{left} is in the patch:\n{patch}");
    }
    // It applies with git to the starting commit, and gives the run's bytes.
    let (r2, c2) = (repo.clone(), srv.main.clone());
    let applied = tokio::task::spawn_blocking(move || apply(&r2, &c2, &patch)).await.unwrap();
    let c = applied.path().join("c");
    assert_eq!(std::fs::read(c.join("data.bin")).unwrap(), (0..=255u8).collect::<Vec<_>>().repeat(12));
    assert_eq!(std::fs::read(c.join("logo.bin")).unwrap(), [0u8, 159, 146, 150, 1, 2, 0]);
    assert!(std::fs::read_to_string(c.join("src/retry.rs")).unwrap().contains("    7"));
    assert!(!c.join(".gitignore").exists() && !c.join("mod.pyc").exists() && !c.join("big.bin").exists());
}

/// A worker process's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::test]
async fn two_files_of_300_mb_of_random_bytes_complete_the_task_and_the_workers_memory_stays_under_1_gib() {
    let Some(srv) = git_server().await else { return };
    if !has_bwrap() {
        return;
    }
    // The API here; the runs in the real binary, whose memory is read.
    let app = spawn_app_with(sb_config, false).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_string_lossy().into_owned();
    let worker = spawn_binary(
        &["worker"],
        &app.db.url,
        &[
            ("SUBAGENTD_DATA_DIR", &data),
            ("SUBAGENTD_BUILTIN_TOOLS_OFF", "web_fetch,web_search"),
            ("SUBAGENTD_WORKSPACE_GIT_ALLOW", "127.0.0.1/32"),
            ("SUBAGENTD_DEFAULT_MODEL", "mock/m"),
        ],
    );
    let repo = format!("{}/repo.git", srv.base);
    let calls = [
        (
            "run_command",
            json!({"command": "head -c 300000000 /dev/urandom > r1 && head -c 300000000 /dev/urandom > r2"}),
        ),
        ("run_command", json!({"command": "ls -l r1 r2 | wc -l"})),
    ];
    let t = run(&app, json!({"workspace": {"git": repo}, "prompt": script(&calls), "max_turns": 5})).await;
    assert_eq!(t["status"], "completed", "{t}");
    let results = tool_results(&app, &t).await;
    assert!(results[0].starts_with("exit code: 0") && results[1].contains("2\n"), "{results:?}");
    assert!(results[0].contains("larger than the 64 MiB a checkpoint keeps"), "the model is told: {}", results[0]);
    let omitted: Vec<&str> = t["diff"]["omitted"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(omitted.contains(&"r1 (over the diff's size cap)") && omitted.contains(&"r2 (over the diff's size cap)"));
    let peak = peak_rss(worker.child.id());
    eprintln!("the worker's peak RSS: {} MiB", peak >> 20);
    assert!(peak < 1 << 30, "the worker's peak RSS was {} MiB", peak >> 20);
    // What the checkpoints kept of the changes: under SUBAGENTD_SANDBOX_KEEP_MB (64 MiB).
    let kept: i64 = sqlx::query_scalar("SELECT coalesce(max(octet_length(changes)), 0)::bigint FROM task_diffs")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert!(kept < 64 << 20, "{kept} bytes kept");
}

#[tokio::test]
async fn a_tenant_at_its_storage_quota_is_refused_new_changes_with_a_sentence_and_its_use_is_shown() {
    const ADMIN: &str = "sandbox-storage-admin";
    let Some(srv) = git_server().await else { return };
    if !has_bwrap() {
        return;
    }
    let app = admin_app(ADMIN, |c| c.tenant_storage_mb = 1).await;
    let key = admin_key(&app, ADMIN, "keeper").await;
    let repo = format!("{}/repo.git", srv.base);
    let tenant = || async {
        let r = app.client.get(app.url("/admin/tenants/keeper")).bearer_auth(ADMIN).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.json::<Value>().await.unwrap()
    };
    assert_eq!(tenant().await["storage"], json!({"kept_bytes": 0, "quota_bytes": 1 << 20}));
    let task = |calls: Vec<(&'static str, Value)>| {
        let body = json!({"workspace": {"git": repo}, "prompt": script(&calls), "max_turns": 5});
        let (app, key) = (&app, key.clone());
        async move {
            let r = app.client.post(app.url("/tasks?wait=true&timeout=120")).bearer_auth(&key).json(&body).send();
            let t: Value = r.await.unwrap().json().await.unwrap();
            assert_eq!(t["status"], "completed", "{t}");
            t
        }
    };
    // 2 MB of random bytes, kept with the task's checkpoints: past the 1 MiB quota.
    let first = task(vec![("run_command", json!({"command": "head -c 2000000 /dev/urandom > blob"}))]).await;
    let kept = tenant().await["storage"]["kept_bytes"].as_i64().unwrap();
    assert!(kept > 2_000_000, "{kept}: the kept changes are counted");
    let second = task(vec![
        ("write_file", json!({"path": "NOTES.md", "content": "more\n"})),
        ("run_command", json!({"command": "echo hi"})),
        ("read_file", json!({"path": "src/retry.rs"})),
    ])
    .await;
    let results: Vec<String> = crate::tools::tool_results(&app, second["id"].as_str().unwrap())
        .await
        .into_iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    for r in &results[..2] {
        assert!(r.contains("storage for kept changes and diffs is full") && r.contains("of 1 MiB"), "{r}");
    }
    assert!(results[2].contains("retry_policy"), "reading goes on: {}", results[2]);
    assert!(second.get("diff").is_none() || second["diff"]["files_changed"] == 0, "{second}");
    assert!(first["diff"]["files_changed"] == 1, "{first}");
}

#[tokio::test]
async fn nul_and_invalid_utf8_in_a_commands_output_and_a_repositorys_files_complete_the_task() {
    let Some(srv) = git_server().await else { return };
    if !has_bwrap() {
        return;
    }
    let app = spawn_app_with(sb_config, true).await;
    let repo = format!("{}/repo.git", srv.base);
    let make = "head -c 9000 /dev/zero | tr '\\000' a > late.txt && printf '\\nhello\\000world\\n' >> late.txt \
                && touch \"$(printf 'evil\\nname.txt')\" && printf 'x\\000y\\377z' && cat /proc/1/cmdline";
    let calls = [
        ("run_command", json!({"command": make})),
        ("read_file", json!({"path": "late.txt"})),
        ("grep", json!({"pattern": "hello"})),
        ("list_directory", json!({"path": ""})),
        ("write_file", json!({"path": "nul.txt", "content": "a\u{0}b"})),
    ];
    let t = run(&app, json!({"workspace": {"git": repo}, "prompt": script(&calls), "max_turns": 10})).await;
    assert_eq!(t["status"], "completed", "{t}");
    let results = tool_results(&app, &t).await;
    assert_eq!(results.len(), 5, "{results:?}");
    assert!(results.iter().all(|r| !r.contains('\0')), "{results:?}");
    assert!(
        results[0].contains("x\u{FFFD}y\u{FFFD}z") && results[0].contains("[note: this result held bytes"),
        "{}",
        results[0]
    );
    assert!(results[1].contains("binary file (9013 bytes)"), "{}", results[1]);
    assert!(!results[2].contains("late.txt"), "{}", results[2]);
    assert!(results[3].contains("\"evil\\nname.txt\""), "{}", results[3]);
    let patch = diff(&app, &t).await.text().await.unwrap();
    assert!(patch.contains("+a\u{FFFD}b"), "the model's NUL reached the file as U+FFFD:\n{patch}");
}

/// The live processes descended from `pid` (by /proc's parent links): (pid, command line).
fn descendants(pid: u32) -> Vec<(u32, String)> {
    let mut procs = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // `pid (comm) state ppid …`: the comm may hold spaces and parentheses.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        let mut f = rest.split_whitespace();
        let (state, ppid) = (f.next().unwrap_or(""), f.next().and_then(|s| s.parse::<u32>().ok()).unwrap_or(0));
        if state != "Z" {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            procs.push((p, ppid, String::from_utf8_lossy(&cmd).replace('\0', " ")));
        }
    }
    let mut found = vec![];
    let mut parents = vec![pid];
    while let Some(parent) = parents.pop() {
        for (p, ppid, cmd) in &procs {
            if *ppid == parent {
                found.push((*p, cmd.clone()));
                parents.push(*p);
            }
        }
    }
    found
}

/// A kill -9 of the service while a command runs leaves no process of its sandbox behind: bwrap
/// dies with its parent (`--die-with-parent`), runsc by the death signal set as it starts, and
/// gVisor's own processes with runsc. Under either runtime (`scripts/test`'s second pass).
#[tokio::test]
async fn a_kill_dash_nine_during_a_command_leaves_no_process_of_its_sandbox() {
    let Some(srv) = git_server().await else { return };
    if !has_bwrap() {
        return;
    }
    let app = spawn_app_with(sb_config, false).await;
    let repo = format!("{}/repo.git", srv.base);
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().display().to_string();
    let mut w = spawn_binary(
        &["worker"],
        &app.db.url,
        &[
            ("SUBAGENTD_DATA_DIR", &data_dir),
            ("SUBAGENTD_WORKSPACE_GIT_ALLOW", "127.0.0.1/32"),
            ("SUBAGENTD_BUILTIN_TOOLS_OFF", "web_fetch,web_search"),
        ],
    );
    workers_up(&app.db.pool, 1, Duration::from_secs(30)).await;
    let calls = [("run_command", json!({"command": "sleep 60 & sleep 60; wait"}))];
    app.submit(json!({"workspace": {"git": repo}, "prompt": script(&calls), "max_turns": 3})).await;
    // The command is running: its sleeps on the host (bwrap), or gVisor's kernel (runsc).
    let deadline = Instant::now() + Duration::from_secs(60);
    let sandbox = loop {
        let d = descendants(w.child.id());
        let running = d.iter().any(|(_, c)| c.starts_with("sleep 60") || c.starts_with("runsc-sandbox"));
        if running {
            // A moment for whatever the sandbox starts beside it.
            tokio::time::sleep(Duration::from_millis(500)).await;
            break descendants(w.child.id());
        }
        assert!(Instant::now() < deadline, "the command never started: {d:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(w.child.id() as i32, libc::SIGKILL) };
    let _ = w.child.wait();
    let gone = Instant::now() + Duration::from_secs(10);
    loop {
        let alive: Vec<&(u32, String)> = sandbox
            .iter()
            .filter(|(p, _)| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| !r.trim_start().starts_with('Z')))
            })
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(Instant::now() < gone, "left behind by the killed service: {alive:?} (of {sandbox:?})");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await;
}
