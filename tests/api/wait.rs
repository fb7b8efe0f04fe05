use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;

#[tokio::test]
async fn wait_mode_returns_the_finished_task() {
    let app = spawn_app().await;
    let r = app
        .post_json(
            "/tasks?wait=true",
            json!({"prompt": "quick [mock:tool_turns=1] [mock:reply=all done]", "model": "mock/m"}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["status"], "completed");
    assert_eq!(t["summary"], "all done");
    assert_eq!(t["turns"], 2);
    app.stop().await;
}

#[tokio::test]
async fn a_wait_that_times_out_answers_202_with_location_and_the_task_still_finishes() {
    let app = spawn_app().await;
    let r = app
        .post_json("/tasks?wait=true&timeout=0.2", json!({"prompt": "slow [mock:delay_ms=800]", "model": "mock/m"}))
        .await;
    assert_eq!(r.status(), 202);
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    let t: Value = r.json().await.unwrap();
    assert!(matches!(t["status"].as_str(), Some("queued" | "running")), "{t}");
    assert_eq!(loc, format!("/tasks/{}", t["id"].as_str().unwrap()));
    let done = app.poll_until_terminal(t["id"].as_str().unwrap(), Duration::from_secs(20)).await;
    assert_eq!(done["status"], "completed");
    app.stop().await;
}

#[tokio::test]
async fn get_with_wait_joins_a_running_task_and_is_woken_by_its_completion() {
    let app = spawn_app().await;
    let t = app.submit(json!({"prompt": "slow [mock:delay_ms=500]", "model": "mock/m"})).await;
    let id = t["id"].as_str().unwrap();
    let started = std::time::Instant::now();
    let r = app.client.get(app.url(&format!("/tasks/{id}?wait=true&timeout=30"))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let done: Value = r.json().await.unwrap();
    assert_eq!(done["status"], "completed");
    // Woken by the completion, not by the 30 s timeout.
    assert!(started.elapsed() < Duration::from_secs(25));
    // The waiter unregistered when the request ended: nothing leaks per request.
    assert_eq!(app.service.as_ref().unwrap().hub.waiter_count(), 0);
    app.stop().await;
}

#[tokio::test]
async fn a_wait_on_a_terminal_task_answers_at_once() {
    let app = spawn_app_with(|_| {}, false).await;
    let t = app.submit(json!({"prompt": "x", "model": "mock/m"})).await;
    let id = t["id"].as_str().unwrap();
    app.client.post(app.url(&format!("/tasks/{id}/cancel"))).send().await.unwrap();
    let r = app.client.get(app.url(&format!("/tasks/{id}?wait=true&timeout=30"))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "cancelled");
    app.stop().await;
}

#[tokio::test]
async fn a_waiter_on_one_replica_is_woken_by_a_worker_on_another() {
    // API-only app here; the worker is a separate process of the real binary.
    let app = spawn_app_with(|_| {}, false).await;
    let _worker = spawn_binary(&["worker"], &app.db.url, &[]);
    let r = app
        .post_json(
            "/tasks?wait=true&timeout=30",
            json!({"prompt": "elsewhere [mock:reply=from the other process]", "model": "mock/m"}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["summary"], "from the other process");
    app.stop().await;
}

/// A waiting request through the shortcut: POSTed until one starts where it was accepted (right
/// after start-up the listener's first wake-up may send one through the queue), then its id.
pub async fn wait_started_here(app: &TestApp, prompt: &str) -> (uuid::Uuid, Value) {
    for _ in 0..50 {
        let t = app.wait_task(json!({"prompt": prompt, "model": "mock/m"})).await;
        let id: uuid::Uuid = t["id"].as_str().unwrap().parse().unwrap();
        // Claimed by the insert itself: it started in the transaction that created it (a claim is
        // a later transaction, with a later `now()`).
        let here: bool = sqlx::query_scalar("SELECT started_at = created_at FROM tasks WHERE id = $1")
            .bind(id)
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
        if here {
            return (id, t);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no waiting request's task started where it was accepted");
}

/// The id `sql` selects, polled for up to 10 s.
async fn poll_for_task(app: &TestApp, sql: &str) -> uuid::Uuid {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found: Option<uuid::Uuid> = sqlx::query_scalar(sql).fetch_optional(&app.db.pool).await.unwrap();
        if let Some(id) = found {
            return id;
        }
        assert!(tokio::time::Instant::now() < deadline, "no task matched in time: {sql}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_waiting_requests_task_starts_where_it_was_accepted_without_being_queued() {
    let app = spawn_app().await;
    let (id, t) = wait_started_here(&app, "here [mock:reply=started here]").await;
    assert_eq!(t["summary"], "started here");
    let attempt: i32 =
        sqlx::query_scalar("SELECT attempt FROM tasks WHERE id = $1").bind(id).fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(attempt, 1);
    let kinds: Vec<(i32, String)> =
        sqlx::query_as("SELECT seq, kind FROM task_event_log WHERE task_id = $1 ORDER BY seq")
            .bind(id)
            .fetch_all(&app.db.pool)
            .await
            .unwrap();
    let kinds: Vec<&str> = kinds
        .iter()
        .enumerate()
        .map(|(i, (seq, k))| {
            assert_eq!(*seq, i as i32 + 1, "no gaps");
            k.as_str()
        })
        .collect();
    // The first call's reservation was written with the task, once: the run found it there.
    assert_eq!(kinds, ["created", "claimed", "llm_call_started", "llm_call_finished", "checkpoint", "finished"]);
    let (reserved, calls): (rust_decimal::Decimal, i64) = sqlx::query_as(
        "SELECT reserved_usd, (SELECT count(*) FROM llm_calls WHERE task_id = $1) FROM tasks WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert_eq!((reserved, calls), (rust_decimal::Decimal::ZERO, 1));
    app.stop().await;
}

#[tokio::test]
async fn a_drain_gives_a_waiting_requests_task_back_to_the_queue_and_answers_202() {
    let mut app = spawn_app().await;
    let (client, url) = (app.client.clone(), app.url("/tasks?wait=true&timeout=30"));
    let waiting = tokio::spawn(async move {
        client.post(url).json(&json!({"prompt": "long [mock:delay_ms=20000]", "model": "mock/m"})).send().await
    });
    let id = poll_for_task(&app, "SELECT id FROM tasks WHERE status = 'running'").await;
    // The drain waits its grace (2 s), then stops the run and releases the task: a run started
    // by a request is the worker's like a claimed one.
    app.service.take().unwrap().stop().await;
    let r = waiting.await.unwrap().unwrap();
    assert_eq!(r.status(), 202);
    let (status, attempt): (String, i32) = sqlx::query_as("SELECT status, attempt FROM tasks WHERE id = $1")
        .bind(id)
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_eq!((status.as_str(), attempt), ("queued", 0), "released, its attempt not counted");
    let last: String =
        sqlx::query_scalar("SELECT kind FROM task_event_log WHERE task_id = $1 ORDER BY seq DESC LIMIT 1")
            .bind(id)
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    assert_eq!(last, "released");
    assert_events_typed(&app.db.pool).await;
    app.stop().await;
}

#[tokio::test]
async fn the_task_a_wait_returns_is_the_task_as_stored() {
    let app = spawn_app().await;
    // Ended by its last checkpoint, and by a separate finish after a failed call.
    for prompt in ["ok [mock:tool_turns=1] [mock:reply=fine]", "bad [mock:fail=400]"] {
        let waited = app.wait_task(json!({"prompt": prompt, "model": "mock/m"})).await;
        assert!(matches!(waited["status"].as_str(), Some("completed" | "failed")), "{waited}");
        // Handed over by the run that finished it, it is the same as a later read.
        let stored = app.get_task(waited["id"].as_str().unwrap()).await;
        assert_eq!(waited, stored);
    }
    app.stop().await;
}

#[tokio::test]
async fn a_first_call_over_the_tasks_budget_stops_a_waiting_task_before_it_is_made() {
    let app = spawn_app().await;
    let t = app.wait_task(json!({"prompt": "too dear", "model": "mock/m", "max_cost_usd": 0.000001})).await;
    assert_eq!((t["status"].as_str(), t["stop_reason"].as_str()), (Some("incomplete"), Some("budget")), "{t}");
    assert_eq!(t["turns"], 0);
    assert!(t["summary"].as_str().unwrap().contains("max_cost_usd"), "{t}");
    let (calls, reserved): (i64, rust_decimal::Decimal) =
        sqlx::query_as("SELECT (SELECT count(*) FROM llm_calls), (SELECT coalesce(sum(reserved_usd), 0) FROM tasks)")
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    assert_eq!((calls, reserved), (0, rust_decimal::Decimal::ZERO), "no call made, nothing held");
    app.stop().await;
}

#[tokio::test]
async fn a_cancel_stops_a_waiting_requests_task_started_where_it_was_accepted() {
    let app = spawn_app().await;
    wait_started_here(&app, "warm-up").await;
    let (client, url) = (app.client.clone(), app.url("/tasks?wait=true&timeout=30"));
    let waiting = tokio::spawn(async move {
        let r = client.post(url).json(&json!({"prompt": "long [mock:delay_ms=20000]", "model": "mock/m"})).send().await;
        r.unwrap().json::<Value>().await.unwrap()
    });
    let started = "SELECT t.id FROM tasks t JOIN task_event_log e ON e.task_id = t.id
                   WHERE t.status = 'running' AND e.kind = 'llm_call_started'";
    let id = poll_for_task(&app, started).await;
    let here: bool = sqlx::query_scalar("SELECT started_at = created_at FROM tasks WHERE id = $1")
        .bind(id)
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert!(here, "the task should have started where it was accepted");
    let asked = std::time::Instant::now();
    app.client.post(app.url(&format!("/tasks/{id}/cancel"))).send().await.unwrap();
    let t = waiting.await.unwrap();
    // Stopped mid-call at once (not after the 20 s call), and the waiter answered.
    assert!(asked.elapsed() < Duration::from_secs(5), "took {:?}", asked.elapsed());
    assert_eq!(t["status"], "cancelled", "{t}");
    let reserved: rust_decimal::Decimal = sqlx::query_scalar("SELECT reserved_usd FROM tasks WHERE id = $1")
        .bind(id)
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(reserved, rust_decimal::Decimal::ZERO);
    app.stop().await;
}

/// A connection that sends no request is closed after the idle timeout — from its accept, and
/// again after each response — but a request being answered is not: a `?wait=true` lasting
/// longer than the timeout gets its result on the same connection.
#[tokio::test]
async fn idle_connections_are_closed_but_a_long_wait_is_not_cut() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_app_with(|c| c.http_idle_timeout_seconds = 1, true).await;
    let addr = app.base.trim_start_matches("http://").to_string();
    let eof_within = |mut s: tokio::net::TcpStream| async move {
        let t = std::time::Instant::now();
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the server closes an idle connection")
            .unwrap_or(0);
        (n, t.elapsed())
    };

    // Connected, nothing sent: closed once the second has passed, not before.
    let silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (n, took) = eof_within(silent).await;
    assert_eq!(n, 0, "closed without a response");
    assert!(took >= Duration::from_millis(900), "closed after {took:?}, before the idle timeout");

    // One request answered, then idle on keep-alive: closed too.
    let mut kept = tokio::net::TcpStream::connect(&addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut head = vec![0u8; 4096];
    let n = kept.read(&mut head).await.unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head[..n]));
    let (n, _) = eof_within(kept).await;
    assert_eq!(n, 0, "an idle keep-alive connection is closed");

    // A wait of 2.5 s on one connection, with a 1 s idle timeout: answered in full.
    let mut waiting = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let body = json!({"prompt": "slow [mock:delay_ms=2500] [mock:reply=waited]", "model": "mock/m"}).to_string();
    let req = format!(
        "POST /tasks?wait=true&timeout=30 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    waiting.write_all(req.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(20), waiting.read_to_string(&mut answer)).await.unwrap().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let t: Value = serde_json::from_str(&answer[answer.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert_eq!(t["status"], "completed");
    assert_eq!(t["summary"], "waited");
    app.stop().await;
}

/// A body trickled in (a few bytes every 300 ms, so that no single wait between chunks reaches
/// the idle timeout) is refused once the idle timeout has passed since its handler began reading
/// it: 408 problem+json, the connection closed, nothing created. A body sent at once is served.
#[tokio::test]
async fn a_request_body_trickled_past_the_idle_timeout_is_refused_with_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_app_with(|c| c.http_idle_timeout_seconds = 1, false).await;
    let addr = app.base.trim_start_matches("http://").to_string();
    let task = json!({"prompt": "x", "model": "mock/m"}).to_string();
    let agent = json!({"description": "d", "system_prompt": "p"}).to_string();
    for (what, path, body) in [("task", "POST /tasks", &task), ("agent definition", "PUT /agents/trickled", &agent)] {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "{path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let started = std::time::Instant::now();
        let mut answer = Vec::new();
        let (mut r, mut w) = s.split();
        let writer = async {
            for chunk in body.as_bytes().chunks(2) {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if w.write_all(chunk).await.is_err() {
                    break;
                }
            }
            std::future::pending::<()>().await
        };
        let reader = tokio::time::timeout(Duration::from_secs(10), r.read_to_end(&mut answer));
        tokio::select! {
            read = reader => { read.expect("the server answers and closes the connection").unwrap(); }
            _ = writer => unreachable!(),
        }
        let took = started.elapsed();
        assert!(body.len() / 2 * 300 > 3000, "the trickle should outlast the timeout several times");
        assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(5), "{what}: answered after {took:?}");
        let answer = String::from_utf8_lossy(&answer).to_string();
        assert!(answer.starts_with("HTTP/1.1 408"), "{what}: {answer}");
        assert!(answer.to_ascii_lowercase().contains("content-type: application/problem+json"), "{what}: {answer}");
        assert!(answer.to_ascii_lowercase().contains("connection: close"), "{what}: {answer}");
        let problem: Value = serde_json::from_str(&answer[answer.find("\r\n\r\n").unwrap() + 4..]).unwrap();
        assert_eq!(problem["type"], "/problems/request_timeout", "{what}: {problem}");
    }
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(tasks, 0, "no task from a refused body");
    assert_eq!(app.client.get(app.url("/agents/trickled")).send().await.unwrap().status(), 404);
    // The same bodies sent at once are served.
    assert_eq!(app.post_json("/tasks", serde_json::from_str::<Value>(&task).unwrap()).await.status(), 201);
    let put = app.client.put(app.url("/agents/trickled")).json(&serde_json::from_str::<Value>(&agent).unwrap());
    assert_eq!(put.send().await.unwrap().status(), 201);
    app.stop().await;
}
