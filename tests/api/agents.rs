//! Agent types and custom definitions, the seed invariants end to end, and `resume_from`.

use serde_json::{json, Value};
use subagentd::engine::definitions::FileAgents;

use crate::helpers::*;

async fn system_prompt_of(app: &TestApp, id: &str) -> String {
    sqlx::query_scalar("SELECT message->>'content' FROM task_message_log WHERE task_id = $1::uuid AND seq = 1")
        .bind(id)
        .fetch_one(&app.db.pool)
        .await
        .unwrap()
}

async fn conversation(app: &TestApp, id: &str) -> Vec<Value> {
    sqlx::query_scalar("SELECT message FROM task_message_log WHERE task_id = $1::uuid ORDER BY seq")
        .bind(id)
        .fetch_all(&app.db.pool)
        .await
        .unwrap()
}

async fn wait_done(app: &TestApp, body: Value) -> Value {
    let r = app.client.post(app.url("/tasks?wait=true&timeout=30")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[tokio::test]
async fn each_type_gets_its_own_prompt_and_a_request_prompt_overrides_it() {
    let app = spawn_app().await;
    let r = wait_done(&app, json!({"prompt": "x", "model": "mock/m", "subagent_type": "explore"})).await;
    let p = system_prompt_of(&app, r["id"].as_str().unwrap()).await;
    assert!(p.contains("Type: explore") && p.contains("Stop the moment"), "{p}");
    let r = wait_done(
        &app,
        json!({"prompt": "x", "model": "mock/m", "subagent_type": "plan", "system_prompt": "Only this."}),
    )
    .await;
    assert_eq!(system_prompt_of(&app, r["id"].as_str().unwrap()).await, "Only this.");
    let r = wait_done(
        &app,
        json!({"prompt": "x", "model": "mock/m", "system_prompt": "Base.", "parent_context": "Parent knows Z."}),
    )
    .await;
    assert_eq!(
        system_prompt_of(&app, r["id"].as_str().unwrap()).await,
        "Base.\n\n## Context from the parent agent\n\nParent knows Z."
    );
    // Fresh conversation: the provider saw [system, user] and nothing of any other task.
    let conv = conversation(&app, r["id"].as_str().unwrap()).await;
    assert_eq!(conv[1], json!({"role": "user", "content": "x"}));
    assert_eq!(conv.len(), 3);
    app.stop().await;
}

#[tokio::test]
async fn a_tenant_defines_an_agent_over_the_api_and_runs_it() {
    let app = spawn_app().await;
    let r = app
        .client
        .put(app.url("/agents/triager"))
        .json(
            &json!({"description": "Sorts tickets", "system_prompt": "You sort tickets.", "model": "mock/triage-model",
                      "max_turns": 2, "tools": ["search"], "disallowed_tools": ["delete"]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let again = app
        .client
        .put(app.url("/agents/triager"))
        .json(&json!({"system_prompt": "You sort tickets."}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200, "a second PUT replaces");
    app.client
        .put(app.url("/agents/triager"))
        .json(&json!({"description": "Sorts tickets", "system_prompt": "You sort tickets.", "model": "mock/triage-model", "max_turns": 2}))
        .send()
        .await
        .unwrap();

    let got: Value = app.client.get(app.url("/agents/triager")).send().await.unwrap().json().await.unwrap();
    assert_eq!(got["source"], "api");
    assert_eq!(got["max_turns"], 2);
    let list: Value = app.client.get(app.url("/agents")).send().await.unwrap().json().await.unwrap();
    let names: Vec<&str> = list["agents"].as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["general", "general-purpose", "research", "explore", "plan", "triager"]);

    // The definition's model and turn budget apply when the request names neither.
    let t = wait_done(&app, json!({"prompt": "ticket 1 [mock:tool_turns=9]", "subagent_type": "triager"})).await;
    assert_eq!(t["model"], "mock/triage-model");
    assert_eq!(t["subagent_type"], "triager");
    assert_eq!(t["max_turns"], 2);
    assert_eq!(t["stop_reason"], "max_turns");
    assert_eq!(system_prompt_of(&app, t["id"].as_str().unwrap()).await, "You sort tickets.");

    assert_eq!(app.client.delete(app.url("/agents/triager")).send().await.unwrap().status(), 204);
    let r = app.client.get(app.url("/agents/triager")).send().await.unwrap();
    assert_problem(r, 404, "not_found").await;
    let r = app.client.delete(app.url("/agents/triager")).send().await.unwrap();
    assert_problem(r, 404, "not_found").await;
    let r = app.client.delete(app.url("/agents/research")).send().await.unwrap();
    assert_problem(r, 409, "definition_read_only").await;
    app.stop().await;
}

#[tokio::test]
async fn a_claude_code_markdown_definition_can_be_put_as_is() {
    let app = spawn_app_with(|_| {}, false).await;
    let md = "---\nname: reviewer\ndescription: Reviews diffs\ntools: Read, Grep\nmodel: inherit\ncolor: green\n---\nYou review.\n";
    let r = app
        .client
        .put(app.url("/agents/reviewer"))
        .header("content-type", "text/markdown")
        .body(md)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["tools"], json!(["Read", "Grep"]));
    assert!(v.get("model").is_none(), "inherit means no model of its own");
    let r =
        app.client.put(app.url("/agents/other")).header("content-type", "text/markdown").body(md).send().await.unwrap();
    assert_problem(r, 422, "validation_failed").await;
    app.stop().await;
}

#[tokio::test]
async fn invalid_definitions_are_refused_naming_the_field_and_change_nothing() {
    let app = spawn_app_with(|_| {}, false).await;
    let cases: Vec<(&str, &str, &str, u16, &str, &str)> = vec![
        ("Bad Name", "application/json", r#"{"system_prompt": "x"}"#, 422, "validation_failed", "name"),
        ("research", "application/json", r#"{"system_prompt": "x"}"#, 422, "validation_failed", "name"),
        (
            "ok",
            "application/json",
            r#"{"system_prompt": "x", "temperature": 1}"#,
            422,
            "validation_failed",
            "temperature",
        ),
        ("ok", "application/json", r#"{"description": "no prompt"}"#, 422, "validation_failed", "system_prompt"),
        ("ok", "application/json", r#"{"system_prompt": "  "}"#, 422, "validation_failed", "system_prompt"),
        ("ok", "application/json", r#"{"system_prompt": "x", "max_turns": 0}"#, 422, "validation_failed", "max_turns"),
        ("ok", "application/json", r#"{"system_prompt": "x", "model": "/x"}"#, 422, "validation_failed", "model"),
        (
            "ok",
            "application/json",
            r#"{"system_prompt": "x", "model": "two words"}"#,
            422,
            "validation_failed",
            "model",
        ),
        ("ok", "application/json", r#"{"system_prompt": "#, 400, "malformed_json", ""),
        ("ok", "text/markdown", "---\nname: [\n---\nx\n", 422, "validation_failed", ""),
        ("ok", "text/markdown", "---\ndescription: d\n---\nx\n", 422, "validation_failed", "name"),
        ("ok", "text/plain", "hello", 415, "unsupported_media_type", ""),
    ];
    for (name, ct, body, status, code, field) in cases {
        let r = app
            .client
            .put(app.url(&format!("/agents/{name}")))
            .header("content-type", ct)
            .body(body)
            .send()
            .await
            .unwrap();
        let p = assert_problem(r, status, code).await;
        if !field.is_empty() {
            assert_eq!(p["errors"][0]["field"], field, "{name} {body}: {p}");
        }
    }
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM agent_definitions").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(n, 0);
    app.stop().await;
}

#[tokio::test]
async fn a_directory_of_definitions_loads_good_files_and_lists_bad_ones() {
    let dir = std::env::temp_dir().join(format!("subagentd-agents-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("scout.md"),
        "---\nname: scout\ndescription: Finds things\nmax_turns: 3\n---\nYou scout.\n",
    )
    .unwrap();
    std::fs::write(dir.join("broken.md"), "---\nname: broken\nflavour: sour\n---\nx\n").unwrap();
    let file_agents = FileAgents::load(Some(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
    let app = spawn_app_opts(|_| {}, AppOptions { file_agents, ..AppOptions::default() }).await;
    let list: Value = app.client.get(app.url("/agents")).send().await.unwrap().json().await.unwrap();
    let scout = list["agents"].as_array().unwrap().iter().find(|a| a["name"] == "scout").unwrap();
    assert_eq!(scout["source"], "file");
    let invalid = list["invalid"].as_array().unwrap();
    assert_eq!(invalid.len(), 1);
    assert!(invalid[0]["source"].as_str().unwrap().ends_with("broken.md"));
    assert!(invalid[0]["error"].as_str().unwrap().contains("flavour"), "{invalid:?}");

    let t = wait_done(&app, json!({"prompt": "find", "model": "mock/m", "subagent_type": "scout"})).await;
    assert_eq!(t["status"], "completed");
    assert_eq!(t["max_turns"], 3);
    assert_eq!(system_prompt_of(&app, t["id"].as_str().unwrap()).await, "You scout.");
    // Unknown names list the custom ones too.
    let r = app.post_task(json!({"prompt": "x", "model": "mock/m", "subagent_type": "broken"})).await;
    let p = assert_problem(r, 422, "unknown_subagent_type").await;
    assert!(p["available"].as_array().unwrap().contains(&json!("scout")));
    app.stop().await;
}

#[tokio::test]
async fn resume_from_continues_the_saved_conversation_as_a_new_task() {
    let app = spawn_app().await;
    let first = wait_done(&app, json!({"prompt": "find foo [mock:tool_turns=1] [mock:reply=foo is in a.rs]", "model": "mock/m", "subagent_type": "research"})).await;
    assert_eq!(first["status"], "completed");
    let second =
        wait_done(&app, json!({"prompt": "now find bar [mock:reply=bar is in b.rs]", "resume_from": first["id"]}))
            .await;
    assert_eq!(second["status"], "completed");
    assert_eq!(second["summary"], "bar is in b.rs");
    assert_eq!(second["parent_task_id"], first["id"]);
    assert_eq!(second["subagent_type"], "research", "the parent's type is kept");
    assert_eq!(second["model"], "mock/m", "the parent's model is kept");
    assert_ne!(second["id"], first["id"]);
    let parent_conv = conversation(&app, first["id"].as_str().unwrap()).await;
    let conv = conversation(&app, second["id"].as_str().unwrap()).await;
    assert_eq!(conv[..parent_conv.len()], parent_conv[..]);
    assert_eq!(conv[parent_conv.len()], json!({"role": "user", "content": "now find bar [mock:reply=bar is in b.rs]"}));
    assert_eq!(conv.len(), parent_conv.len() + 2);
    // The parent is untouched.
    assert_eq!(conversation(&app, first["id"].as_str().unwrap()).await, parent_conv);
    app.stop().await;
}

#[tokio::test]
async fn resume_from_refuses_unknown_unfinished_and_never_run_tasks() {
    let app = spawn_app_with(|_| {}, false).await;
    let r = app.post_task(json!({"prompt": "x", "resume_from": "01900000-0000-7000-8000-000000000000"})).await;
    assert_eq!(assert_problem(r, 422, "validation_failed").await["errors"][0]["field"], "resume_from");
    let r = app.post_task(json!({"prompt": "x", "resume_from": "nope"})).await;
    assert_eq!(assert_problem(r, 422, "validation_failed").await["errors"][0]["field"], "resume_from");
    let queued = app.submit(json!({"prompt": "x", "model": "mock/m"})).await;
    let r = app.post_task(json!({"prompt": "x", "resume_from": queued["id"]})).await;
    assert_problem(r, 409, "task_not_terminal").await;
    app.client.post(app.url(&format!("/tasks/{}/cancel", queued["id"].as_str().unwrap()))).send().await.unwrap();
    let r = app.post_task(json!({"prompt": "x", "resume_from": queued["id"]})).await;
    assert_problem(r, 422, "validation_failed").await;
    assert_eq!(app.task_count().await, 1);
    app.stop().await;
}
