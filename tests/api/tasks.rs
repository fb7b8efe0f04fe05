use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;

#[tokio::test]
async fn a_submitted_task_is_run_and_polled_to_completion_with_summary_and_usage() {
    let app = spawn_app().await;
    let r = app
        .post_task(json!({"prompt": "count the moons [mock:tool_turns=1]", "model": "mock/small",
                                  "description": "moons", "metadata": {"ticket": 7}}))
        .await;
    assert_eq!(r.status(), 201);
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    let t: Value = r.json().await.unwrap();
    assert_eq!(loc, format!("/tasks/{}", t["id"].as_str().unwrap()));
    assert_eq!(t["status"], "queued");
    assert_eq!(t["max_turns"], 5);
    assert_eq!(t["subagent_type"], "general");

    let done = app.poll_until_terminal(t["id"].as_str().unwrap(), Duration::from_secs(20)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stop_reason"], "final_answer");
    assert_eq!(done["summary"], "Mock summary: count the moons");
    assert_eq!(done["turns"], 2);
    assert_eq!(done["metadata"], json!({"ticket": 7}));
    assert!(done["usage"]["input_tokens"].as_i64().unwrap() > 0);
    assert!(done["usage"]["output_tokens"].as_i64().unwrap() > 0);
    assert!(done["cost_usd"].as_f64().unwrap() > 0.0);
    assert!(done["finished_at"].is_string() && done["run_ms"].is_i64() && done["queue_ms"].is_i64());

    // The ledger has one row per call and sums to the task's usage.
    let (calls, input, output): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), sum(input_tokens)::bigint, sum(output_tokens)::bigint FROM llm_calls WHERE task_id = $1::uuid",
    )
    .bind(done["id"].as_str().unwrap())
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(calls, 2);
    assert_eq!(input, done["usage"]["input_tokens"].as_i64().unwrap());
    assert_eq!(output, done["usage"]["output_tokens"].as_i64().unwrap());

    // The conversation is checkpointed: system, user, assistant (tool call), tool result, answer.
    let roles: Vec<String> =
        sqlx::query_scalar("SELECT message->>'role' FROM task_message_log WHERE task_id = $1::uuid ORDER BY seq")
            .bind(done["id"].as_str().unwrap())
            .fetch_all(&app.db.pool)
            .await
            .unwrap();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);

    let kinds: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM task_event_log WHERE task_id = $1::uuid ORDER BY seq")
            .bind(done["id"].as_str().unwrap())
            .fetch_all(&app.db.pool)
            .await
            .unwrap();
    assert_eq!(kinds.first().map(String::as_str), Some("created"));
    assert_eq!(kinds.get(1).map(String::as_str), Some("claimed"));
    assert_eq!(kinds.last().map(String::as_str), Some("finished"));
    app.stop().await;
}

#[tokio::test]
async fn a_run_that_never_answers_ends_incomplete_with_the_fallback_summary() {
    let app = spawn_app().await;
    let t = app.submit(json!({"prompt": "dig [mock:tool_turns=9]", "model": "mock/m", "max_turns": 2})).await;
    let done = app.poll_until_terminal(t["id"].as_str().unwrap(), Duration::from_secs(20)).await;
    assert_eq!(done["status"], "incomplete");
    assert_eq!(done["stop_reason"], "max_turns");
    assert_eq!(done["summary"], "(sub-agent general stopped after 2 turns without a summary)");
    assert_eq!(done["turns"], 2);
    app.stop().await;
}

#[tokio::test]
async fn max_turns_above_fifty_is_clamped() {
    let app = spawn_app_with(|_| {}, false).await;
    let t = app.submit(json!({"prompt": "x", "model": "mock/m", "max_turns": 500})).await;
    assert_eq!(t["max_turns"], 50);
    let t = app.submit(json!({"prompt": "x", "model": "mock/m", "subagent_type": "plan"})).await;
    assert_eq!(t["max_turns"], 3);
    app.stop().await;
}

#[tokio::test]
async fn a_provider_failure_fails_the_task_and_keeps_every_attempt_in_the_ledger() {
    let app = spawn_app().await;
    let t = app.submit(json!({"prompt": "x [mock:fail=400]", "model": "mock/m"})).await;
    let done = app.poll_until_terminal(t["id"].as_str().unwrap(), Duration::from_secs(20)).await;
    assert_eq!(done["status"], "failed");
    assert_eq!(done["error"]["code"], "provider_rejected");
    assert!(done["error"]["message"].as_str().unwrap().contains("HTTP 400"), "{done}");
    let outcomes: Vec<(String, Option<i32>)> =
        sqlx::query_as("SELECT outcome, http_status FROM llm_calls WHERE task_id = $1::uuid")
            .bind(done["id"].as_str().unwrap())
            .fetch_all(&app.db.pool)
            .await
            .unwrap();
    assert_eq!(outcomes, [("error".to_string(), Some(400))]);
    app.stop().await;
}

#[tokio::test]
async fn cancelling_a_queued_task_ends_it_at_once_and_is_idempotent() {
    let app = spawn_app_with(|_| {}, false).await; // no workers: it stays queued
    let t = app.submit(json!({"prompt": "x", "model": "mock/m"})).await;
    let id = t["id"].as_str().unwrap();
    let r = app.client.post(app.url(&format!("/tasks/{id}/cancel"))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let c: Value = r.json().await.unwrap();
    assert_eq!(c["status"], "cancelled");
    assert!(c["finished_at"].is_string());
    let again: Value =
        app.client.post(app.url(&format!("/tasks/{id}/cancel"))).send().await.unwrap().json().await.unwrap();
    assert_eq!(again["status"], "cancelled");
    assert_eq!(again["finished_at"], c["finished_at"]);
    app.stop().await;
}

#[tokio::test]
async fn cancelling_a_running_task_stops_it_and_keeps_its_partial_usage() {
    let app = spawn_app().await;
    let t = app
        .submit(json!({"prompt": "slow [mock:tool_turns=20] [mock:delay_ms=300]", "model": "mock/m", "max_turns": 20}))
        .await;
    let id = t["id"].as_str().unwrap().to_string();
    // Wait until at least one turn is checkpointed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let cur = app.get_task(&id).await;
        if cur["turns"].as_i64().unwrap() >= 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = app.client.post(app.url(&format!("/tasks/{id}/cancel"))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let done = app.poll_until_terminal(&id, Duration::from_secs(10)).await;
    assert_eq!(done["status"], "cancelled");
    assert!(done["turns"].as_i64().unwrap() >= 1);
    assert!(done["usage"]["input_tokens"].as_i64().unwrap() > 0, "partial usage kept: {done}");
    assert!(done["turns"].as_i64().unwrap() < 20);
    app.stop().await;
}

#[tokio::test]
async fn cancelling_an_unknown_task_is_404() {
    let app = spawn_app_with(|_| {}, false).await;
    let r = app.client.post(app.url("/tasks/01900000-0000-7000-8000-000000000000/cancel")).send().await.unwrap();
    assert_problem(r, 404, "not_found").await;
    app.stop().await;
}

#[tokio::test]
async fn listing_filters_by_status_and_type_and_pages_newest_first() {
    let app = spawn_app_with(|_| {}, false).await;
    let mut ids = vec![];
    for i in 0..5 {
        let ty = if i % 2 == 0 { "research" } else { "plan" };
        let t = app.submit(json!({"prompt": format!("p{i}"), "model": "mock/m", "subagent_type": ty})).await;
        ids.push(t["id"].as_str().unwrap().to_string());
    }
    app.client.post(app.url(&format!("/tasks/{}/cancel", ids[0]))).send().await.unwrap();

    let page: Value = app.client.get(app.url("/tasks?limit=2")).send().await.unwrap().json().await.unwrap();
    let got: Vec<&str> = page["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(got, [ids[4].as_str(), ids[3].as_str()]);
    let cursor = page["next_cursor"].as_str().unwrap();
    let page2: Value =
        app.client.get(app.url(&format!("/tasks?limit=2&cursor={cursor}"))).send().await.unwrap().json().await.unwrap();
    let got2: Vec<&str> = page2["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(got2, [ids[2].as_str(), ids[1].as_str()]);
    let page3: Value = app
        .client
        .get(app.url(&format!("/tasks?limit=2&cursor={}", page2["next_cursor"].as_str().unwrap())))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page3["tasks"].as_array().unwrap().len(), 1);
    assert!(page3["next_cursor"].is_null());

    let research: Value =
        app.client.get(app.url("/tasks?subagent_type=research")).send().await.unwrap().json().await.unwrap();
    assert_eq!(research["tasks"].as_array().unwrap().len(), 3);
    let cancelled: Value =
        app.client.get(app.url("/tasks?status=cancelled")).send().await.unwrap().json().await.unwrap();
    assert_eq!(cancelled["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(cancelled["tasks"][0]["id"], ids[0].as_str());

    let created_3 = app.get_task(&ids[3]).await["created_at"].as_str().unwrap().to_string();
    let since = |k: &str| format!("/tasks?{k}={}", created_3.replace('+', "%2B"));
    let after = app.get_json(&since("created_after")).await;
    let got: Vec<&str> = after["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(got, [ids[4].as_str()]);
    let before = app.get_json(&since("created_before")).await;
    assert_eq!(before["tasks"].as_array().unwrap().len(), 3);
    app.stop().await;
}

#[tokio::test]
async fn the_same_idempotency_key_returns_the_same_task_and_a_different_body_is_409() {
    let app = spawn_app_with(|_| {}, false).await;
    let send =
        |body: Value| app.client.post(app.url("/tasks")).header("Idempotency-Key", "order-42").json(&body).send();
    let first = send(json!({"prompt": "x", "model": "mock/m"})).await.unwrap();
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    let again = send(json!({"prompt": "x", "model": "mock/m"})).await.unwrap();
    assert_eq!(again.status(), 200);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["id"], first["id"]);
    let other = send(json!({"prompt": "y", "model": "mock/m"})).await.unwrap();
    let body = assert_problem(other, 409, "idempotency_conflict").await;
    assert_eq!(body["task_id"], first["id"]);
    assert_eq!(app.task_count().await, 1);
    app.stop().await;
}
