//! Claude Code agent files imported as their authors wrote them, the same way from the agents
//! directory and through `PUT /agents/{name}`: models that cannot be served now and tool names
//! that name nothing here are warnings, not refusals; dotted names; descriptions with an
//! unquoted `: `; Claude Code's own fields kept (and `permissionMode` mapped); `[tool_aliases]`
//! and `mcp__<server>__<tool>` names.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use subagentd::engine::definitions::FileAgents;

use crate::helpers::*;

/// Realistic agent files, one per case (written here, in the style of public collections).
const FILES: &[(&str, &str)] = &[
    (
        "api-designer.md",
        "---\nname: api-designer\ndescription: API architecture expert designing scalable, developer-friendly interfaces.\n\
         tools: Read, Write, MultiEdit, Bash, openapi-generator\nmodel: sonnet\n---\n\n\
         You are a senior API designer. Design REST and GraphQL APIs that are consistent and well documented.\n",
    ),
    (
        "dotnet-framework-4.8-expert.md",
        "---\nname: dotnet-framework-4.8-expert\ndescription: \"Legacy .NET Framework 4.8 specialist\"\nmodel: opus\ncolor: purple\n---\n\
         You maintain .NET Framework 4.8 applications.\n",
    ),
    (
        "typescript-pro.md",
        "---\nname: typescript-pro\ndescription: Use this agent when: the code is TypeScript. Examples: <example>Context: a type error</example>\n\
         tools: Read, Grep, mcp__docs__lookup\n---\nYou write strict, idiomatic TypeScript.\n",
    ),
    (
        "release-manager.md",
        "---\nname: release-manager\ndescription: Ships releases\ntools: deploy, mcp__docs__lookup\npermissionMode: default\n\
         color: green\nskills:\n  - changelog\n  - semver\nhooks:\n  Stop:\n    - command: notify-team\n---\n\
         You prepare and ship releases.\n",
    ),
    (
        "planner.md",
        "---\nname: planner\ndescription: Plans, never changes anything\npermissionMode: plan\nmodel: inherit\n---\nYou plan.\n",
    ),
    ("tuned.md", "---\nname: tuned\ndescription: Has a field Claude Code does not define\ntemperature: 0.2\n---\nYou answer.\n"),
];

fn aliases() -> BTreeMap<String, String> {
    BTreeMap::from([("Read".to_string(), "docs__lookup".to_string())])
}

/// An app with the docs MCP source and a `deploy` tool (policy propose) registered.
async fn app_with(file_agents: FileAgents) -> TestApp {
    let app = spawn_app_opts(
        |c| c.tool_allow = "*, 127.0.0.1/32".into(),
        AppOptions { file_agents, ..AppOptions::default() },
    )
    .await;
    let url = crate::tools::mcp_server().await;
    let r = app.client.put(app.url("/tool-sources/docs")).json(&json!({"url": url})).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let r = app
        .client
        .put(app.url("/tools/deploy"))
        .json(&json!({"parameters": {"type": "object"}, "policy": "propose", "endpoint": "http://127.0.0.1:9/deploy"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    app
}

fn without_source(mut v: Value) -> Value {
    v.as_object_mut().unwrap().remove("source");
    v
}

#[tokio::test]
async fn claude_code_files_load_the_same_from_the_directory_and_over_put_with_warnings_not_refusals() {
    let dir = std::env::temp_dir().join(format!("subagentd-cc-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in FILES {
        std::fs::write(dir.join(file), text).unwrap();
    }
    let from_dir = app_with(FileAgents::load(Some(&dir)).with_aliases(aliases())).await;
    std::fs::remove_dir_all(&dir).unwrap();
    let over_put = app_with(FileAgents::default().with_aliases(aliases())).await;

    // The directory: every file but the one with a field Claude Code does not define.
    let list = from_dir.get_json("/agents").await;
    let invalid = list["invalid"].as_array().unwrap();
    assert_eq!(invalid.len(), 1, "{invalid:?}");
    assert!(invalid[0]["error"].as_str().unwrap().contains("temperature"), "{invalid:?}");

    // PUT: the same files, the same outcome, the same views.
    for (file, text) in FILES {
        let name = file.trim_end_matches(".md");
        let r = over_put
            .client
            .put(over_put.url(&format!("/agents/{name}")))
            .header("content-type", "text/markdown")
            .body(*text)
            .send()
            .await
            .unwrap();
        if name == "tuned" {
            assert_eq!(assert_problem(r, 422, "validation_failed").await["errors"][0]["field"], "temperature");
            continue;
        }
        assert_eq!(r.status(), 201, "{name}: {}", r.text().await.unwrap());
        let put: Value = r.json().await.unwrap();
        let got = over_put.get_json(&format!("/agents/{name}")).await;
        let file_view = from_dir.get_json(&format!("/agents/{name}")).await;
        assert_eq!(file_view["source"], "file");
        assert_eq!(got["source"], "api");
        assert_eq!(without_source(put), without_source(got.clone()), "{name}: PUT answers what GET shows");
        assert_eq!(without_source(file_view), without_source(got), "{name}: both paths load it alike");
    }

    let app = &over_put;
    // A model no provider serves now: stored, with a warning; a task of it is refused clearly.
    let a = app.get_json("/agents/api-designer").await;
    assert_eq!(a["model"], "sonnet");
    let warnings = a["warnings"].to_string();
    assert!(warnings.contains("model alias") && warnings.contains("anthropic"), "{warnings}");
    // Claude Code's own tools name nothing here; `Read` is mapped by [tool_aliases].
    assert_eq!(a["unmatched_tools"], json!(["Write", "MultiEdit", "Bash", "openapi-generator"]));
    assert!(warnings.contains("[tool_aliases]"), "{warnings}");
    // What each name maps to here, and why one is not offered, with its fix.
    let m = a["tool_mapping"].as_array().unwrap();
    let row = |name: &str| m.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("{name}: {m:?}")).clone();
    assert_eq!(m.len(), 5, "{m:?}");
    assert_eq!(row("Read"), json!({"name": "Read", "tool": "docs__lookup", "offered": true}));
    for (name, tool, why) in [
        ("Write", "write_file", "switched off for the service (SUBAGENTD_BUILTIN_TOOLS_OFF)"),
        ("Bash", "run_command", "switched off for the service (SUBAGENTD_BUILTIN_TOOLS_OFF)"),
        ("MultiEdit", "MultiEdit", "Claude Code's own tool, with no counterpart here"),
        ("openapi-generator", "openapi-generator", "register one (PUT /tools/openapi-generator)"),
    ] {
        let r = row(name);
        assert_eq!((r["tool"].as_str(), r["offered"].as_bool()), (Some(tool), Some(false)), "{r}");
        assert!(r["note"].as_str().unwrap().contains(why), "{r}");
        assert!(warnings.contains(why), "the warning gives the same cause: {warnings}");
    }
    let r = app.post_task(json!({"prompt": "x", "subagent_type": "api-designer"})).await;
    let p = assert_problem(r, 422, "unknown_model").await;
    assert!(p["detail"].as_str().unwrap().contains("\"sonnet\" (a model alias for"), "{p}");
    let t = app.wait_task(json!({"prompt": "x", "subagent_type": "api-designer", "model": "mock/m"})).await;
    assert_eq!(t["status"], "completed");
    assert_eq!(t["tools"], json!(["docs__lookup"]), "Read → docs__lookup, the rest name nothing");

    // The MCP form of a tool name, and a description read leniently.
    let ts = app.get_json("/agents/typescript-pro").await;
    assert_eq!(
        ts["description"],
        "Use this agent when: the code is TypeScript. Examples: <example>Context: a type error</example>"
    );
    assert_eq!(ts["unmatched_tools"], json!(["Grep"]));
    assert!(ts["warnings"].to_string().contains("not valid YAML"), "{ts}");
    let t = app.wait_task(json!({"prompt": "x", "subagent_type": "typescript-pro", "model": "mock/m"})).await;
    assert_eq!(t["tools"], json!(["docs__lookup"]));

    // Claude Code's fields are kept as written; permissionMode means something here.
    let rm = app.get_json("/agents/release-manager").await;
    assert_eq!(rm["claude_code"]["color"], "green");
    assert_eq!(rm["claude_code"]["skills"], json!(["changelog", "semver"]));
    assert_eq!(rm["claude_code"]["hooks"], json!({"Stop": [{"command": "notify-team"}]}));
    assert_eq!(rm["claude_code"]["permissionMode"], "default");
    assert_eq!(rm["approval"], "propose");
    assert!(rm["warnings"].to_string().contains("permissionMode: default is taken as approval: propose"), "{rm}");
    assert_eq!(rm["unmatched_tools"], json!([]));
    let t = app
        .wait_task(json!({"prompt": "[mock:tool_turns=1] [mock:tool=deploy]", "subagent_type": "release-manager", "model": "mock/m"}))
        .await;
    assert_eq!(t["status"], "requires_action", "a propose call waits for a decision: {t}");
    let plan = app.get_json("/agents/planner").await;
    assert_eq!(plan["read_only"], true);
    let t = app.wait_task(json!({"prompt": "x", "subagent_type": "planner", "model": "mock/m"})).await;
    assert_eq!(t["tools"], json!(["docs__lookup"]), "plan mode: only auto tools");

    // A dotted name.
    let d = app.get_json("/agents/dotnet-framework-4.8-expert").await;
    assert_eq!(d["claude_code"]["color"], "purple");
    let t =
        app.wait_task(json!({"prompt": "x", "subagent_type": "dotnet-framework-4.8-expert", "model": "mock/m"})).await;
    assert_eq!(t["status"], "completed");
    assert_eq!(t["subagent_type"], "dotnet-framework-4.8-expert");

    from_dir.stop().await;
    over_put.stop().await;
}
