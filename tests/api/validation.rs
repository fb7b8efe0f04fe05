//! Every bad input gets a 4xx problem naming what is wrong, and writes nothing.

use serde_json::json;

use crate::helpers::*;

struct Case {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    content_type: Option<&'static str>,
    headers: &'static [(&'static str, &'static str)],
    body: String,
    status: u16,
    code: &'static str,
    field: Option<&'static str>,
}

fn post(
    name: &'static str,
    body: serde_json::Value,
    status: u16,
    code: &'static str,
    field: Option<&'static str>,
) -> Case {
    Case {
        name,
        method: "POST",
        path: "/tasks",
        content_type: Some("application/json"),
        headers: &[],
        body: body.to_string(),
        status,
        code,
        field,
    }
}

fn get(name: &'static str, path: &'static str, status: u16, code: &'static str, field: Option<&'static str>) -> Case {
    Case { name, method: "GET", path, content_type: None, headers: &[], body: String::new(), status, code, field }
}

fn cases() -> Vec<Case> {
    let ok = json!({"prompt": "x", "model": "mock/m"});
    vec![
        Case { body: "{\"prompt\": ".into(), ..post("malformed json", ok.clone(), 400, "malformed_json", None) },
        post(
            "prompt of the wrong type",
            json!({"prompt": 5, "model": "mock/m"}),
            422,
            "validation_failed",
            Some("prompt"),
        ),
        post("missing prompt", json!({"model": "mock/m"}), 422, "validation_failed", Some("prompt")),
        post(
            "unknown field",
            json!({"prompt": "x", "model": "mock/m", "colour": "red"}),
            422,
            "validation_failed",
            Some("colour"),
        ),
        post("empty prompt", json!({"prompt": "   ", "model": "mock/m"}), 422, "validation_failed", Some("prompt")),
        post(
            "NUL in the prompt",
            json!({"prompt": "a\u{0}b", "model": "mock/m"}),
            422,
            "validation_failed",
            Some("prompt"),
        ),
        post(
            "NUL in metadata",
            json!({"prompt": "x", "model": "mock/m", "metadata": {"k": "a\u{0}"}}),
            422,
            "validation_failed",
            Some("metadata"),
        ),
        post(
            "absurd max_cost_usd",
            json!({"prompt": "x", "model": "mock/m", "max_cost_usd": 1e12}),
            422,
            "validation_failed",
            Some("max_cost_usd"),
        ),
        post(
            "max_turns zero",
            json!({"prompt": "x", "model": "mock/m", "max_turns": 0}),
            422,
            "validation_failed",
            Some("max_turns"),
        ),
        post(
            "max_turns negative",
            json!({"prompt": "x", "model": "mock/m", "max_turns": -3}),
            422,
            "validation_failed",
            Some("max_turns"),
        ),
        post(
            "max_turns not an integer",
            json!({"prompt": "x", "model": "mock/m", "max_turns": 2.5}),
            422,
            "validation_failed",
            Some("max_turns"),
        ),
        post(
            "max_turns out of range",
            json!({"prompt": "x", "model": "mock/m", "max_turns": 1e30}),
            422,
            "validation_failed",
            Some("max_turns"),
        ),
        post(
            "description too long",
            json!({"prompt": "x", "model": "mock/m", "description": "d".repeat(81)}),
            422,
            "validation_failed",
            Some("description"),
        ),
        post(
            "metadata not an object",
            json!({"prompt": "x", "model": "mock/m", "metadata": [1]}),
            422,
            "validation_failed",
            Some("metadata"),
        ),
        post(
            "empty system prompt",
            json!({"prompt": "x", "model": "mock/m", "system_prompt": ""}),
            422,
            "validation_failed",
            Some("system_prompt"),
        ),
        post(
            "unknown subagent type",
            json!({"prompt": "x", "model": "mock/m", "subagent_type": "wizard"}),
            422,
            "unknown_subagent_type",
            Some("subagent_type"),
        ),
        post("no model anywhere", json!({"prompt": "x"}), 422, "model_required", None),
        post("model without provider", json!({"prompt": "x", "model": "gpt"}), 422, "unknown_model", Some("model")),
        post("unconfigured provider", json!({"prompt": "x", "model": "nope/gpt"}), 422, "unknown_model", Some("model")),
        Case {
            content_type: Some("text/plain"),
            ..post("wrong content type", ok.clone(), 415, "unsupported_media_type", None)
        },
        Case { content_type: None, ..post("no content type", ok.clone(), 415, "unsupported_media_type", None) },
        Case {
            body: json!({"prompt": "x".repeat(70_000), "model": "mock/m"}).to_string(),
            ..post("oversized body", ok.clone(), 413, "payload_too_large", None)
        },
        Case {
            method: "PUT",
            path: "/agents/oversized",
            body: json!({"description": "d", "system_prompt": "x".repeat(70_000)}).to_string(),
            ..post("oversized agent definition", ok.clone(), 413, "payload_too_large", None)
        },
        Case {
            path: "/tasks?wait=maybe",
            ..post("wait not a boolean", ok.clone(), 400, "invalid_parameter", Some("wait"))
        },
        Case {
            path: "/tasks?wait=true&timeout=-1",
            ..post("negative wait timeout", ok.clone(), 400, "invalid_parameter", Some("timeout"))
        },
        Case {
            path: "/tasks?colour=red",
            ..post("unknown query parameter", ok.clone(), 400, "invalid_parameter", Some("colour"))
        },
        Case {
            headers: &[("Subagent-Depth", "1")],
            ..post("call from inside a sub-agent", ok.clone(), 422, "recursion_refused", None)
        },
        Case {
            headers: &[("Subagent-Depth", "deep")],
            ..post("garbage depth header", ok.clone(), 400, "invalid_parameter", Some("Subagent-Depth"))
        },
        Case {
            headers: &[("Idempotency-Key", "")],
            ..post("empty idempotency key", ok.clone(), 400, "invalid_parameter", Some("Idempotency-Key"))
        },
        get("unknown id", "/tasks/01900000-0000-7000-8000-000000000000", 404, "not_found", None),
        get("bad uuid", "/tasks/not-a-uuid", 400, "invalid_parameter", Some("id")),
        get("id not UTF-8", "/tasks/%FF", 400, "invalid_parameter", Some("id")),
        get("agent name not UTF-8", "/agents/%FF", 400, "invalid_parameter", Some("name")),
        Case {
            method: "PUT",
            body: json!({"parameters": {"type": "object"}}).to_string(),
            content_type: Some("application/json"),
            ..get("tool name not UTF-8", "/tools/%FF", 400, "invalid_parameter", Some("name"))
        },
        Case {
            method: "POST",
            ..get("bad uuid on cancel", "/tasks/12345/cancel", 400, "invalid_parameter", Some("id"))
        },
        get("bad status filter", "/tasks?status=done", 400, "invalid_parameter", Some("status")),
        get("limit out of range", "/tasks?limit=0", 400, "invalid_parameter", Some("limit")),
        get("limit not a number", "/tasks?limit=ten", 400, "invalid_parameter", Some("limit")),
        get("bad timestamp", "/tasks?created_after=yesterday", 400, "invalid_parameter", Some("created_after")),
        get("bad cursor", "/tasks?cursor=zzz", 400, "invalid_parameter", Some("cursor")),
        get("unknown route", "/nope", 404, "route_not_found", None),
        Case { method: "DELETE", ..get("wrong method", "/tasks", 405, "method_not_allowed", None) },
    ]
}

#[tokio::test]
async fn every_bad_input_gets_a_problem_naming_the_field_and_writes_nothing() {
    let app = spawn_app_with(|c| c.max_body_bytes = 64 * 1024, false).await;
    for c in cases() {
        let method = reqwest::Method::from_bytes(c.method.as_bytes()).unwrap();
        let mut req = app.client.request(method, app.url(c.path)).body(c.body.clone());
        if let Some(ct) = c.content_type {
            req = req.header("content-type", ct);
        }
        for (k, v) in c.headers {
            req = req.header(*k, *v);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), c.status, "case {:?}", c.name);
        let body = assert_problem(r, c.status, c.code).await;
        if let Some(field) = c.field {
            let named = body["errors"].as_array().is_some_and(|e| e.iter().any(|e| e["field"] == field));
            assert!(named, "case {:?} does not name field {field}: {body}", c.name);
        }
    }
    assert_eq!(app.task_count().await, 0, "a bad request wrote a task");
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM task_event_log").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(events, 0);
    let agents: i64 =
        sqlx::query_scalar("SELECT count(*) FROM agent_definitions").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(agents, 0, "a bad request wrote an agent definition");
    app.stop().await;
}

#[tokio::test]
async fn an_unknown_subagent_type_lists_the_available_ones() {
    let app = spawn_app_with(|_| {}, false).await;
    let r = app.post_task(json!({"prompt": "x", "model": "mock/m", "subagent_type": "wizard"})).await;
    let body = assert_problem(r, 422, "unknown_subagent_type").await;
    let available: Vec<&str> = body["available"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(available, ["general", "general-purpose", "research", "explore", "plan"]);
    app.stop().await;
}

#[tokio::test]
async fn the_configured_default_model_is_used_when_the_request_names_none() {
    let app = spawn_app_with(|c| c.default_model = Some("mock/default".into()), false).await;
    let t = app.submit(json!({"prompt": "x"})).await;
    assert_eq!(t["model"], "mock/default");
    app.stop().await;
}

/// What the contract test (schemathesis) made exact: the answers a client can rely on.
#[tokio::test]
async fn the_answers_openapi_yaml_promises_for_edge_inputs() {
    let app = spawn_app_with(|_| {}, false).await;
    let c = &app.client;
    // An object body sent as an array is refused, not read field by field.
    let r = c.post(app.url("/tasks/cancel")).json(&json!([null, null])).send().await.unwrap();
    let p = assert_problem(r, 422, "validation_failed").await;
    assert_eq!(p["errors"][0]["field"], "body");
    // A whole number written with a fraction is that integer (JSON Schema's reading).
    let r = app.post_task(json!({"prompt": "x", "model": "mock/m", "max_turns": 3.0})).await;
    assert_eq!(r.status(), 201);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["max_turns"], 3);
    let r = app.post_task(json!({"prompt": "x", "model": "mock/m", "max_turns": 3.5})).await;
    assert_problem(r, 422, "validation_failed").await;
    // Answers to a task that never paused: it is not waiting (whatever the ids).
    let t = app.submit(json!({"prompt": "x", "model": "mock/m"})).await;
    let path = format!("/tasks/{}/actions", t["id"].as_str().unwrap());
    let r = app.post_json(&path, json!([{"id": uuid::Uuid::now_v7(), "decision": "approve"}])).await;
    assert_problem(r, 409, "task_not_paused").await;
    assert_eq!(app.task_count().await, 2, "nothing else was written");
}

#[tokio::test]
async fn last_event_id_means_the_same_on_the_json_page_as_on_the_stream() {
    let app = spawn_app().await;
    let t = app.wait_task(json!({"prompt": "x", "model": "mock/m"})).await;
    let path = format!("/tasks/{}/events", t["id"].as_str().unwrap());
    let all = app.get_json(&path).await;
    assert!(all["events"].as_array().unwrap().len() > 2, "{all}");
    let r = app.client.get(app.url(&path)).header("last-event-id", "2").send().await.unwrap();
    let page: serde_json::Value = r.json().await.unwrap();
    assert_eq!(page["events"][0]["seq"], 3, "resumes after the id: {page}");
    let r = app.client.get(app.url(&path)).header("last-event-id", "two").send().await.unwrap();
    let p = assert_problem(r, 400, "invalid_parameter").await;
    assert_eq!(p["errors"][0]["field"], "Last-Event-ID");
}
