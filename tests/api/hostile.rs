//! Hostile bytes from every kind of tool (issue 62): a result holding a NUL, and bytes that are
//! not UTF-8 where its channel can carry them (JSON cannot), completes its task. The bytes reach
//! the model as U+FFFD with a note, and nothing stored holds a NUL.
//!
//! The kinds come from an exhaustive `match` on `Target` and on `BuiltinTool`: a new kind of
//! tool, or a new built-in, does not compile here until it has its hostile case, and the test
//! fails until that case is run.

use std::collections::BTreeMap;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{json, Value};
use subagentd::tools::builtin::BuiltinTool;
use subagentd::tools::Target;

use crate::fakes::*;
use crate::helpers::*;
use crate::workspaces::git_server;

/// What every hostile source holds: a NUL and a byte that is not UTF-8.
const BYTES: &[u8] = b"x\0y\xffz";
/// The same, as JSON can carry it (no invalid UTF-8 there).
const JSON_TEXT: &str = "x\u{0}y";

/// Where each kind of tool gets its hostile case: the task that calls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Task {
    /// A `general` task over a git workspace, with the sandbox.
    Workspace,
    /// A task with the web tools, an HTTP tool, an MCP tool and a caller tool.
    Outside,
    /// A task on an OpenAI-compatible provider that answers with the bytes.
    Provider,
}

/// The hostile case of a built-in: its task, the call, and whether its result carries the bytes
/// back (`true`) or the bytes go in through the model's own arguments (`false`).
fn builtin_case(t: BuiltinTool, site: &str) -> (Task, Value, bool) {
    use BuiltinTool as B;
    match t {
        B::WebFetch => (Task::Outside, json!({"url": format!("{site}/page")}), true),
        B::WebSearch => (Task::Outside, json!({"query": "tides"}), true),
        B::ListDirectory => (Task::Workspace, json!({"path": ""}), true),
        B::Glob => (Task::Workspace, json!({"pattern": "*.txt"}), true),
        B::Grep => (Task::Workspace, json!({"pattern": "hello"}), true),
        B::ReadFile => (Task::Workspace, json!({"path": "lossy.txt"}), true),
        B::WriteFile => (Task::Workspace, json!({"path": "w\u{0}.txt", "content": JSON_TEXT}), false),
        B::EditFile => {
            (Task::Workspace, json!({"path": "w\u{0}.txt", "old_string": "y", "new_string": JSON_TEXT}), false)
        }
        B::RunCommand => (Task::Workspace, json!({"command": MAKE}), true),
    }
}

/// The workspace task's first command: the files the read-only tools then meet, and the bytes.
const MAKE: &str = "printf 'hello\\377 world\\n' > \"$(printf 'bad\\377name.txt')\" \
                    && printf 'x\\377y\\n' > lossy.txt && printf 'x\\000y\\377z'";

/// The kind of every tool target, each with its case: the tool names (as the tasks offer them)
/// whose results must come back clean.
fn kind_case(t: &Target) -> Vec<(Task, String)> {
    match t {
        Target::Http { .. } => vec![(Task::Outside, "raw_http".into())],
        Target::Mcp { .. } => vec![(Task::Outside, "hostile__raw".into())],
        Target::Caller => vec![(Task::Outside, "ask".into())],
        Target::Builtin { tool } => vec![(builtin_case(*tool, "").0, tool.as_str().into())],
        // Run on the provider's side: what comes back is the provider's own answer.
        Target::Provider { .. } => vec![(Task::Provider, "(the model's answer)".into())],
    }
}

/// A real MCP server (rmcp) whose one tool answers with a NUL.
mod mcp_hostile {
    use rmcp::handler::server::router::tool::ToolRouter;
    use rmcp::model::{ServerCapabilities, ServerConfig};
    use rmcp::{tool, tool_handler, tool_router, ServerHandler};

    #[derive(Debug, Clone)]
    pub struct Hostile {
        tool_router: ToolRouter<Self>,
    }

    #[tool_router]
    impl Hostile {
        pub fn new() -> Self {
            Hostile { tool_router: Self::tool_router() }
        }

        #[tool(description = "Answers with bytes that are not text", annotations(read_only_hint = true))]
        fn raw(&self) -> String {
            super::JSON_TEXT.to_string()
        }
    }

    #[tool_handler(router = self.tool_router)]
    impl ServerHandler for Hostile {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }
    }
}

/// The hostile servers: a page (`/page`), a search backend (`/search`), an HTTP tool (`/tool`)
/// and an MCP server (`/mcp`); their base URL.
async fn hostile_servers() -> String {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::StreamableHttpService;
    let mcp: StreamableHttpService<mcp_hostile::Hostile, LocalSessionManager> =
        StreamableHttpService::new(|| Ok(mcp_hostile::Hostile::new()), Default::default(), Default::default());
    let app = axum::Router::new()
        .route("/page", get(|| async { ([(header::CONTENT_TYPE, "text/plain")], BYTES).into_response() }))
        .route(
            "/search",
            get(|| async {
                axum::Json(
                    json!({"results": [{"title": JSON_TEXT, "url": "https://example.org/x", "content": JSON_TEXT}]}),
                )
            }),
        )
        // The HTTP tool's answer is JSON, read as UTF-8 with loss: it can carry both.
        .route(
            "/tool",
            post(|| async {
                ([(header::CONTENT_TYPE, "application/json")], &b"{\"content\": \"x\\u0000y\xffz\"}"[..])
                    .into_response()
            }),
        )
        .nest_service("/mcp", mcp);
    serve_router(app).await
}

/// Each tool's result as the model was given it, by tool name.
async fn results_by_name(app: &TestApp, id: &str) -> BTreeMap<String, String> {
    crate::tools::tool_results(app, id)
        .await
        .into_iter()
        .map(|m| (m["name"].as_str().unwrap().to_string(), m["content"].as_str().unwrap_or_default().to_string()))
        .collect()
}

/// What of task `id` is stored with a U+FFFD: its events, messages and ledger rows, as text.
async fn stored(app: &TestApp, id: &str) -> String {
    let q = "SELECT concat_ws(' ', (SELECT string_agg(data::text, ' ') FROM task_events WHERE task_id = $1::uuid), \
             (SELECT string_agg(message::text, ' ') FROM task_message_log WHERE task_id = $1::uuid), \
             (SELECT string_agg(coalesce(error, ''), ' ') FROM llm_calls WHERE task_id = $1::uuid), \
             (SELECT row_to_json(t)::text FROM tasks t WHERE id = $1::uuid))";
    sqlx::query_scalar(q).bind(id).fetch_one(&app.db.pool).await.unwrap()
}

#[tokio::test]
async fn every_kind_of_tool_given_a_nul_and_invalid_utf8_completes_its_task() {
    let Some(git) = git_server().await else { return };
    if !crate::sandbox::has_bwrap() {
        return;
    }
    let site = hostile_servers().await;
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let app = spawn_app_opts(
        |c| {
            c.tool_allow = "*, 127.0.0.1/32".into();
            c.workspace_git_allow = Some("127.0.0.1/32".into());
            c.builtin_tools_off = String::new();
            c.web_search_url = Some(site.clone());
            c.default_model = Some("mock/m".into());
        },
        AppOptions {
            providers: crate::providers::providers(&oai_url, "http://127.0.0.1:9", ""),
            ..AppOptions::default()
        },
    )
    .await;
    let r = app.client.put(app.url("/tool-sources/hostile")).json(&json!({"url": format!("{site}/mcp")})).send().await;
    let r = r.unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());

    // Every kind, each with its case.
    let http = Target::Http { endpoint: format!("{site}/tool"), timeout_ms: 5000 };
    let mcp = Target::Mcp { source: "hostile".into(), url: format!("{site}/mcp"), tool: "raw".into(), timeout_ms: 0 };
    let mut kinds = vec![http, mcp, Target::Caller, Target::Provider { tool: BuiltinTool::WebSearch }];
    kinds.extend(BuiltinTool::ALL.iter().map(|t| Target::Builtin { tool: *t }));
    let mut cases: BTreeMap<Task, Vec<String>> = BTreeMap::new();
    for k in &kinds {
        for (task, name) in kind_case(k) {
            cases.entry(task).or_default().push(name);
        }
    }

    // A task's calls, one a turn: those of its cases (a caller tool last, since it pauses).
    let calls_of = |task: Task| {
        let mut names = cases[&task].clone();
        names.sort_by_key(|n| (n == "ask", n != "run_command"));
        let calls: Vec<Value> = names
            .iter()
            .map(|n| {
                let args = BuiltinTool::parse(n).map_or(json!({}), |b| builtin_case(b, &site).1);
                json!({"tool": n, "args": args})
            })
            .collect();
        Value::Array(calls)
    };

    // The workspace task: the built-ins over a copy of a git repository, the command first (it
    // makes what the others read).
    let prompt = format!("change the code [mock:calls={}]", calls_of(Task::Workspace));
    let body = json!({"prompt": prompt, "workspace": {"git": format!("{}/repo.git", git.base)}, "max_turns": 12});
    let ws = app.wait_task(body).await;
    assert_eq!(ws["status"], "completed", "{ws}");

    // The outside task: a page, a search, an HTTP tool, an MCP tool, and a caller's output.
    let tools = json!([
        {"name": "raw_http", "parameters": {"type": "object"}, "policy": "auto", "endpoint": format!("{site}/tool")},
        {"name": "ask", "description": "Asks the caller", "parameters": {"type": "object"}, "policy": "auto"},
    ]);
    let prompt = format!("look [mock:calls={}]", calls_of(Task::Outside));
    let t = app.wait_task(json!({"prompt": prompt, "tools": tools, "max_turns": 10})).await;
    assert_eq!(t["status"], "requires_action", "{t}");
    let id = t["id"].as_str().unwrap().to_string();
    let action = t["pending_actions"][0]["id"].clone();
    // The caller's output holds a NUL: taken, as any tool's result is.
    let r = app.post_json(&format!("/tasks/{id}/actions"), json!([{"id": action, "output": JSON_TEXT}])).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = app.client.get(app.url(&format!("/tasks/{id}?wait=true&timeout=30"))).send().await.unwrap();
    let outside: Value = r.json().await.unwrap();
    assert_eq!(outside["status"], "completed", "{outside}");

    // The provider: first an error whose body holds the bytes, then an answer that does.
    oai.push(Answer::raw(500, "upstream\0failed"));
    oai.push(Answer::json(openai_text(JSON_TEXT, 5, 5, 0)));
    let p = app.wait_task(json!({"prompt": "say it", "model": "oai/gpt-4o"})).await;
    assert_eq!(p["status"], "completed", "{p}");
    assert_eq!(p["summary"], "x\u{FFFD}y", "{p}");

    // Each case, in its task.
    let tasks = [(Task::Workspace, &ws), (Task::Outside, &outside), (Task::Provider, &p)];
    for (task, view) in tasks {
        let id = view["id"].as_str().unwrap();
        let results = results_by_name(&app, id).await;
        let kept = stored(&app, id).await;
        assert!(!kept.contains('\0'), "{task:?}: nothing stored holds a NUL");
        for name in &cases[&task] {
            if task == Task::Provider {
                assert!(kept.contains("upstream\u{FFFD}failed"), "the provider's error is kept: {kept}");
                continue;
            }
            let r = results.get(name).unwrap_or_else(|| panic!("{name} ran in {task:?}: {results:?}"));
            let carries = BuiltinTool::parse(name).is_none_or(|b| builtin_case(b, &site).2);
            if carries {
                assert!(r.contains('\u{FFFD}') && r.contains("[note: this result held bytes"), "{name}: {r}");
            } else {
                assert!(!r.to_lowercase().contains("error"), "{name} ran: {r}");
            }
        }
    }
    let names: Vec<&String> = cases.values().flatten().collect();
    assert_eq!(names.len(), kinds.len(), "every kind has its case: {names:?}");
    app.stop().await;
}
