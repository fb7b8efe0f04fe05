//! Structured results: `output_schema` on a task or an agent definition, sent as each provider
//! kind's native structured output, every answer validated, a repair turn when it does not
//! match, and `output` beside `summary` wherever a task is shown.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

use crate::fakes::*;
use crate::helpers::*;
use crate::servers::{app_with, providers};

fn schema() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
           "required": ["city", "population"]})
}

/// An inline tool the model is offered (its endpoint is never called in these tests).
fn lookup() -> Value {
    json!({"name": "lookup", "parameters": {"type": "object"}, "policy": "auto", "endpoint": "http://127.0.0.1:9/lookup"})
}

async fn finished(app: &TestApp, body: Value) -> Value {
    let r = app.post_json("/tasks?wait=true&timeout=60", body).await;
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[tokio::test]
async fn an_openai_compatible_server_gets_response_format_and_a_wrong_answer_is_repaired() {
    let (oai, oai_url) = serve("/v1/chat/completions").await;
    let app = app_with(providers(&oai_url, "http://127.0.0.1:9", ""), |_| {}).await;
    oai.push(Answer::json(openai_text(r#"{"city": "Lyon", "population": "about half a million"}"#, 100, 20, 0)));
    oai.push(Answer::json(openai_text(r#"{"city": "Lyon", "population": 522250}"#, 150, 20, 0)));
    let t = finished(&app, json!({"prompt": "Biggest city of the Rhône?", "model": "local/qwen", "output_schema": schema(), "tools": [lookup()]})).await;
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["output"], json!({"city": "Lyon", "population": 522250}));
    assert_eq!(t["summary"], r#"{"city": "Lyon", "population": 522250}"#);
    let seen = oai.seen();
    assert_eq!(seen.len(), 2, "one repair turn");
    let rf = &seen[0].body["response_format"];
    assert_eq!(rf["type"], "json_schema");
    assert_eq!(rf["json_schema"]["schema"], schema());
    assert_eq!(rf["json_schema"]["name"], "final_answer");
    assert!(seen[0].body.get("tool_choice").is_none(), "the first call may use tools");
    assert_eq!(seen[1].body["tool_choice"], "none", "the repair call must answer");
    let last = seen[1].body["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "user");
    assert!(last["content"].as_str().unwrap().contains("/population"), "the errors go back: {last}");
    let system = seen[0].body["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("## Final answer") && system.contains("\"population\""), "{system}");
    let events = app.get_json(&format!("/tasks/{}/events", t["id"].as_str().unwrap())).await;
    assert!(events.to_string().contains("output_invalid"), "{events}");
    assert_events_typed(&app.db.pool).await;
    app.stop().await;
}

#[tokio::test]
async fn anthropic_gets_a_final_answer_tool_forced_when_the_model_stops_with_text() {
    let (ant, ant_url) = serve("/v1/messages").await;
    let app = app_with(providers("http://127.0.0.1:9", &ant_url, ""), |_| {}).await;
    // It stops with prose first; then, forced, it calls the final-answer tool.
    ant.push(Answer::json(anthropic_text("Lyon, with about 522,000 people.", 100, 15, 0)));
    ant.push(Answer::json(anthropic_tool_use(
        "toolu_1",
        "final_answer",
        json!({"city": "Lyon", "population": 522250}),
    )));
    let t = finished(&app, json!({"prompt": "Biggest city of the Rhône?", "model": "ant/claude-sonnet-4-5", "output_schema": schema(), "tools": [lookup()]})).await;
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["output"], json!({"city": "Lyon", "population": 522250}));
    let seen = ant.seen();
    assert_eq!(seen.len(), 2);
    let tools = seen[0].body["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["lookup", "final_answer"]);
    assert_eq!(tools[1]["input_schema"], schema());
    assert!(seen[0].body.get("tool_choice").is_none());
    assert_eq!(seen[1].body["tool_choice"], json!({"type": "tool", "name": "final_answer"}));
    // The final answer is not left as a dangling tool call in the conversation.
    let conv = app.get_json(&format!("/tasks/{}/messages", t["id"].as_str().unwrap())).await;
    assert!(!conv.to_string().contains("toolu_1"), "{conv}");

    // An answer that already matches needs no final-answer call.
    ant.push(Answer::json(anthropic_text(r#"{"city": "Nice", "population": 342669}"#, 100, 15, 0)));
    let t = finished(&app, json!({"prompt": "x", "model": "ant/claude-sonnet-4-5", "output_schema": schema()})).await;
    assert_eq!(t["output"]["city"], "Nice");
    assert_eq!(ant.seen().len(), 3);
    app.stop().await;
}

#[tokio::test]
async fn the_mock_answers_wrongly_first_and_output_is_in_get_wait_and_the_webhook() {
    let got: Arc<Mutex<Vec<Value>>> = Arc::default();
    let g = got.clone();
    let hook = Router::new().route(
        "/hook",
        post(move |body: String| {
            let g = g.clone();
            async move {
                g.lock().unwrap().push(serde_json::from_str::<Value>(&body).unwrap());
                "ok"
            }
        }),
    );
    let hook_url = format!("{}/hook", serve_router(hook).await);
    let app = spawn_app_with(|c| c.tool_allow = "*, 127.0.0.1/32".into(), true).await;

    let prompt = r#"x [mock:output_first={"city": 5}] [mock:output={"city": "Lyon", "population": 522250}]"#;
    let t = app
        .wait_task(json!({"prompt": prompt, "model": "mock/m", "output_schema": schema(), "webhook_url": hook_url}))
        .await;
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["turns"], 2, "one repair turn");
    assert_eq!(t["output"], json!({"city": "Lyon", "population": 522250}), "in the wait=true answer");
    let id = t["id"].as_str().unwrap();
    assert_eq!(app.get_task(id).await["output"], t["output"], "in GET /tasks/{{id}}");
    let listed = app.get_json("/tasks").await;
    assert_eq!(listed["tasks"][0]["output"], t["output"], "in the list");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.lock().unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "no webhook delivery");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(got.lock().unwrap()[0]["task"]["output"], t["output"], "in the webhook body");

    // Never right within the turns: incomplete, invalid_output, with the last errors.
    let t = app
        .wait_task(json!({"prompt": r#"x [mock:output={"city": 5}]"#, "model": "mock/m", "output_schema": schema(), "max_turns": 2}))
        .await;
    assert_eq!((t["status"].as_str(), t["stop_reason"].as_str()), (Some("incomplete"), Some("invalid_output")), "{t}");
    assert_eq!(t["error"]["code"], "invalid_output");
    let msg = t["error"]["message"].as_str().unwrap();
    assert!(msg.contains("/city") && msg.contains("population"), "{msg}");
    assert_eq!(t["summary"], r#"{"city": 5}"#);
    assert!(t.get("output").is_none_or(Value::is_null), "{t}");
    // Without a schema there is no output.
    let t = app.wait_task(json!({"prompt": "x", "model": "mock/m"})).await;
    assert!(t.get("output").is_none_or(Value::is_null), "{t}");
    app.stop().await;
}

#[tokio::test]
async fn an_agent_definition_carries_an_output_schema_and_bad_schemas_are_refused_naming_the_field() {
    let app = spawn_app_with(|_| {}, true).await;
    let md = format!(
        "---\nname: extractor\ndescription: Extracts cities\noutput_schema: {}\n---\nYou extract cities.\n",
        schema()
    );
    let r = app
        .client
        .put(app.url("/agents/extractor"))
        .header("content-type", "text/markdown")
        .body(md)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let d = app.get_json("/agents/extractor").await;
    assert_eq!(d["output_schema"], schema());
    let t = app
        .wait_task(json!({"prompt": r#"[mock:output={"city": "Lyon", "population": 1}]"#, "model": "mock/m", "subagent_type": "extractor"}))
        .await;
    assert_eq!(t["output"], json!({"city": "Lyon", "population": 1}));

    let big = json!({"type": "object", "description": "x".repeat(40_000)});
    let bad = [
        json!("a string"),
        json!({"type": "array", "items": {"type": "string"}}),
        json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": "zero"}}}),
        big,
    ];
    for schema in bad {
        let r = app.post_task(json!({"prompt": "x", "model": "mock/m", "output_schema": schema})).await;
        let p = assert_problem(r, 422, "validation_failed").await;
        assert_eq!(p["errors"][0]["field"], "output_schema", "{p}");
        let r = app
            .client
            .put(app.url("/agents/bad"))
            .json(&json!({"system_prompt": "x", "output_schema": schema}))
            .send()
            .await
            .unwrap();
        assert_eq!(assert_problem(r, 422, "validation_failed").await["errors"][0]["field"], "output_schema");
    }
    let r = app
        .client
        .put(app.url("/agents/bad"))
        .header("content-type", "text/markdown")
        .body("---\nname: bad\noutput_schema: {type: array}\n---\nx\n")
        .send()
        .await
        .unwrap();
    assert_eq!(assert_problem(r, 422, "validation_failed").await["errors"][0]["field"], "output_schema");
    assert_eq!(app.task_count().await, 1, "nothing else was stored");
    app.stop().await;
}
