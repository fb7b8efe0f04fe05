//! Tenants, API keys, admission limits, budgets under concurrency, fair claiming, rollups.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;

const ADMIN: &str = "admin-secret-token";

async fn new_key(app: &TestApp, tenant: &str) -> String {
    admin_key(app, ADMIN, tenant).await
}

async fn set_limits(app: &TestApp, tenant: &str, limits: Value) {
    put_tenant_limits(&app.base, ADMIN, tenant, &limits).await;
}

/// The binary's CLI against `app`'s database.
fn cli(app: &TestApp, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_subagentd"))
        .args(args)
        .env("DATABASE_URL", &app.db.url)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

fn with_admin(c: &mut subagentd::config::Config) {
    c.admin_token = Some(ADMIN.into());
}

#[tokio::test]
async fn every_endpoint_is_scoped_to_the_callers_tenant_and_others_see_404() {
    let app = spawn_app_with(
        |c| {
            with_admin(c);
            c.tool_allow = "*, 127.0.0.1/32".into();
        },
        false,
    )
    .await;
    let a = new_key(&app, "acme").await;
    let b = new_key(&app, "globex").await;
    let c = &app.client;
    // Keys exist now: a request without one is refused.
    let r = c.post(app.url("/tasks")).json(&json!({"prompt": "x", "model": "mock/m"})).send().await.unwrap();
    assert_eq!(assert_problem(r, 401, "unauthorized").await["status"], 401);
    let r = c.get(app.url("/tasks")).bearer_auth("sk_00000000_nope").send().await.unwrap();
    assert_problem(r, 401, "unauthorized").await;

    let t: Value = c
        .post(app.url("/tasks"))
        .bearer_auth(&a)
        .json(&json!({"prompt": "x", "model": "mock/m"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = t["id"].as_str().unwrap();
    c.put(app.url("/tools/lookup"))
        .bearer_auth(&a)
        .json(&json!({"parameters": {"type": "object"}, "policy": "auto", "endpoint": "http://127.0.0.1:9/x"}))
        .send()
        .await
        .unwrap();
    c.put(app.url("/agents/triager")).bearer_auth(&a).json(&json!({"system_prompt": "p"})).send().await.unwrap();
    c.put(app.url("/tool-sources/docs"))
        .bearer_auth(&a)
        .json(&json!({"url": "http://127.0.0.1:9/mcp"}))
        .send()
        .await
        .unwrap();

    for (method, path) in [
        ("GET", format!("/tasks/{id}")),
        ("GET", format!("/tasks/{id}/calls")),
        ("POST", format!("/tasks/{id}/cancel")),
        ("GET", "/tools/lookup".to_string()),
        ("DELETE", "/tools/lookup".to_string()),
        ("GET", "/agents/triager".to_string()),
        ("DELETE", "/agents/triager".to_string()),
        ("GET", "/tool-sources/docs".to_string()),
        ("POST", "/tool-sources/docs/refresh".to_string()),
        ("DELETE", "/tool-sources/docs".to_string()),
    ] {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let r = c.request(m.clone(), app.url(&path)).bearer_auth(&b).send().await.unwrap();
        assert_problem(r, 404, "not_found").await;
        let r = c.request(m, app.url(&path)).bearer_auth(&a).send().await.unwrap();
        assert!(r.status().is_success(), "{method} {path} as the owner: {}", r.status());
    }
    let listed: Value = c.get(app.url("/tasks")).bearer_auth(&b).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["tasks"], json!([]));
    let r = c
        .post(app.url("/tasks"))
        .bearer_auth(&b)
        .json(&json!({"prompt": "x", "resume_from": id}))
        .send()
        .await
        .unwrap();
    assert_problem(r, 422, "validation_failed").await;
    let cancel: Value =
        c.post(app.url("/tasks/cancel")).bearer_auth(&b).json(&json!({})).send().await.unwrap().json().await.unwrap();
    assert_eq!(cancel["cancelled"], json!([]));

    // A revoked key stops working.
    let keys: Value =
        c.get(app.url("/admin/keys?tenant=acme")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    let key_id = keys["keys"][0]["id"].as_str().unwrap();
    assert!(!keys.to_string().contains(&a), "keys are never listed");
    assert_eq!(
        c.delete(app.url(&format!("/admin/keys/{key_id}"))).bearer_auth(ADMIN).send().await.unwrap().status(),
        204
    );
    let r = c.get(app.url("/tasks")).bearer_auth(&a).send().await.unwrap();
    assert_problem(r, 401, "unauthorized").await;
    // The admin API needs the admin token.
    let r = c.post(app.url("/admin/keys")).bearer_auth(&b).json(&json!({"tenant": "x"})).send().await.unwrap();
    assert_problem(r, 401, "unauthorized").await;
    app.stop().await;
}

#[tokio::test]
async fn a_non_loopback_address_never_defaults_to_single_user_mode() {
    let app = spawn_app_with(|c| c.listen = "0.0.0.0:0".parse().unwrap(), false).await;
    let r = app.client.get(app.url("/tasks")).send().await.unwrap();
    assert_problem(r, 401, "unauthorized").await;
    app.stop().await;
}

#[tokio::test]
async fn single_user_mode_answers_only_requests_addressed_to_this_machine() {
    // A web page whose name is rebound to 127.0.0.1 reaches the port with its own name as Host
    // (and an Origin to match): no key is needed in single-user mode, so it must be refused.
    let app = spawn_app_with(|_| {}, false).await;
    let port = app.base.rsplit(':').next().unwrap().to_string();
    let c = &app.client;
    let rebound = format!("rebound.example.com:{port}");
    let origin = format!("http://{rebound}");
    let body = json!({"prompt": "x", "model": "mock/m"});
    let r = c.post(app.url("/tasks")).header("host", &rebound).header("origin", &origin).json(&body).send().await;
    let p = assert_problem(r.unwrap(), 403, "host_not_allowed").await;
    assert!(p["detail"].as_str().unwrap().contains("SUBAGENTD_PUBLIC_URL"), "{p}");
    for door in ["/mcp", "/a2a"] {
        let r = c.post(app.url(door)).header("host", &rebound).header("origin", &origin).json(&json!({})).send();
        assert_eq!(r.await.unwrap().status(), 403, "{door}");
    }
    assert_eq!(app.task_count().await, 0, "nothing started");
    // The same request addressed to a loopback name is the single user's.
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let r = c.post(app.url("/tasks")).header("host", &host).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 201, "{host}");
    }
    app.stop().await;
}

#[tokio::test]
async fn the_cli_creates_keys_that_the_api_accepts_and_revokes_them() {
    let app = spawn_app_with(|_| {}, false).await;
    let out = cli(&app, &["keys", "create", "--tenant", "initech"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(key.starts_with("sk_"));
    let r = app
        .client
        .post(app.url("/tasks"))
        .bearer_auth(&key)
        .json(&json!({"prompt": "x", "model": "mock/m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let tenant: String = sqlx::query_scalar("SELECT tenant FROM tasks").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(tenant, "initech");
    let stored: String = sqlx::query_scalar("SELECT key_hash FROM api_keys").fetch_one(&app.db.pool).await.unwrap();
    assert!(!stored.contains(&key[12..]), "the key is stored hashed");
    // Listing: every tenant's keys, or one tenant's; a key needs its tenant named.
    assert!(cli(&app, &["keys", "create", "--tenant", "acme"]).status.success());
    let tenants_listed = |out: std::process::Output| -> Vec<String> {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        let mut t: Vec<String> = rows.iter().map(|r| r["tenant"].as_str().unwrap().to_string()).collect();
        t.sort();
        t
    };
    assert_eq!(tenants_listed(cli(&app, &["keys", "list"])), ["acme", "initech"]);
    assert_eq!(tenants_listed(cli(&app, &["keys", "list", "--tenant", "acme"])), ["acme"]);
    let out = cli(&app, &["keys", "create"]);
    assert!(!out.status.success(), "a key for the default tenant made without asking");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tenant"));
    let prefix = key.rsplit_once('_').unwrap().0.to_string();
    let out = cli(&app, &["keys", "revoke", &prefix]);
    assert!(out.status.success());
    let revoked: bool = sqlx::query_scalar("SELECT revoked_at IS NOT NULL FROM api_keys WHERE tenant = 'initech'")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert!(revoked);
    app.stop().await;
}

#[tokio::test]
async fn the_cli_sets_every_limit_and_shows_it_and_a_flag_the_process_also_takes_stays_the_processs() {
    let app = spawn_app_with(with_admin, false).await;
    let out = cli(
        &app,
        &[
            "tenants",
            "set",
            "acme",
            "--usd-per-day",
            "5",
            "--usd-per-month",
            "100.5",
            "--tokens-per-day",
            "1000",
            "--tenant-max-running",
            "4",
            "--max-queued",
            "100",
            "--max-task-cost-usd",
            "0.5",
            "--max-task-tokens",
            "5000",
            "--max-task-turns",
            "7",
            "--tenant-max-task-timeout-seconds",
            "60",
            "--approval",
            "propose",
            "--requests-per-second",
            "20",
            "--request-burst",
            "40",
            "--max-streams",
            "10",
            "--max-waits",
            "20",
            "--fallback-models",
            "mock/a,mock/b",
            "--max-scheduled",
            "30",
            "--priority",
            "high",
            "--tenant-builtin-tools-off",
            "web_search",
            "--web-tools-policy",
            "propose",
            "--web-fetches-per-minute",
            "12",
            "--web-fetch-domains",
            "example.com,docs.rs",
            "--private-workspace-web",
            "task",
            // The process's own settings, taken by every subcommand: not the tenant's.
            "--max-running",
            "8",
            "--builtin-tools-off",
            "web_fetch",
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = cli(&app, &["tenants", "show", "acme"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    let l = &shown["limits"];
    assert_eq!(
        *l,
        json!({"usd_per_day": 5.0, "usd_per_month": 100.5, "tokens_per_day": 1000, "max_running": 4,
               "max_queued": 100, "max_task_cost_usd": 0.5, "max_task_tokens": 5000, "max_task_turns": 7,
               "max_task_timeout_seconds": 60, "approval": "propose", "requests_per_second": 20.0,
               "request_burst": 40, "max_streams": 10, "max_waits": 20, "fallback_models": ["mock/a", "mock/b"],
               "max_scheduled": 30, "priority": "high", "builtin_tools_off": ["web_search"],
               "web_tools_policy": "propose", "web_fetches_per_minute": 12,
               "web_fetch_domains": ["example.com", "docs.rs"], "private_workspace_web": "task"}),
        "every flag set its own limit, and --max-running none"
    );
    let api = app.client.get(app.url("/admin/tenants/acme")).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(api.json::<Value>().await.unwrap()["limits"], *l, "the API reads what the CLI set");
    let out = cli(&app, &["tenants", "set", "acme", "--usd-per-day=-1"]);
    assert!(!out.status.success(), "a negative limit is refused");
    app.stop().await;
}

#[tokio::test]
async fn admission_over_the_queue_limit_is_429_with_retry_after_and_writes_nothing() {
    let app = spawn_app_with(with_admin, false).await;
    set_limits(&app, "default", json!({"max_queued": 2})).await;
    app.submit(json!({"prompt": "1", "model": "mock/m"})).await;
    app.submit(json!({"prompt": "2", "model": "mock/m"})).await;
    let r = app.post_task(json!({"prompt": "3", "model": "mock/m"})).await;
    assert_eq!(r.headers()["retry-after"], "5");
    let p = assert_problem(r, 429, "queue_limit_reached").await;
    assert_eq!(p["limit"], "max_queued");
    assert_eq!(p["value"], 2);
    assert_eq!(p["current"], 2);
    assert_eq!(app.task_count().await, 2);
    app.stop().await;
}

#[tokio::test]
async fn admission_with_the_daily_spend_used_up_is_402_naming_the_limit() {
    let app = spawn_app_with(with_admin, false).await;
    set_limits(&app, "default", json!({"usd_per_day": 1.5})).await;
    sqlx::query(
        "INSERT INTO usage_daily (day, tenant, model, agent_type, calls, ok, cost_usd)
         VALUES ((now() AT TIME ZONE 'UTC')::date, 'default', 'mock/m', 'general', 3, 3, 1.5)",
    )
    .execute(&app.db.pool)
    .await
    .unwrap();
    let r = app.post_task(json!({"prompt": "x", "model": "mock/m"})).await;
    let p = assert_problem(r, 402, "budget_exhausted").await;
    assert_eq!(p["limit"], "usd_per_day");
    assert_eq!(p["value"], 1.5);
    assert_eq!(p["current"], 1.5);
    assert_eq!(app.task_count().await, 0);
    // The month limit is named the same way.
    set_limits(&app, "default", json!({"usd_per_month": 1.0})).await;
    let p =
        assert_problem(app.post_task(json!({"prompt": "x", "model": "mock/m"})).await, 402, "budget_exhausted").await;
    assert_eq!(p["limit"], "usd_per_month");
    app.stop().await;
}

#[tokio::test]
async fn per_task_limits_are_capped_by_the_tenants() {
    let app = spawn_app_with(with_admin, false).await;
    set_limits(&app, "default", json!({"max_task_turns": 3, "max_task_cost_usd": 0.5, "max_task_tokens": 1000})).await;
    let t = app
        .submit(json!({"prompt": "x", "model": "mock/m", "max_turns": 40, "max_cost_usd": 9.0, "max_tokens": 5000}))
        .await;
    assert_eq!(t["max_turns"], 3);
    let row: (Option<rust_decimal::Decimal>, Option<i64>) =
        sqlx::query_as("SELECT max_cost_usd, max_tokens FROM tasks").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(row, (Some(rust_decimal::Decimal::new(5, 1)), Some(1000)));
    let r = app.post_task(json!({"prompt": "x", "model": "mock/m", "max_cost_usd": -1})).await;
    assert_problem(r, 422, "validation_failed").await;
    app.stop().await;
}

#[tokio::test]
async fn a_task_stops_incomplete_with_budget_when_its_own_limit_would_be_passed() {
    let app = spawn_app_with(|c| c.max_output_tokens = 16, true).await;
    let t = app
        .post_json(
            "/tasks?wait=true&timeout=30",
            json!({"prompt": "dig [mock:tool_turns=20]", "model": "mock/m", "max_turns": 20, "max_cost_usd": 0.001}),
        )
        .await;
    let t: Value = t.json().await.unwrap();
    assert_eq!(t["status"], "incomplete");
    assert_eq!(t["stop_reason"], "budget");
    assert!(t["cost_usd"].as_f64().unwrap() <= 0.001, "{t}");
    assert!(t["turns"].as_i64().unwrap() >= 1);
    assert!(t["summary"].as_str().unwrap().contains("max_cost_usd"), "{t}");
    app.stop().await;
}

#[tokio::test]
async fn fifty_concurrent_runs_of_one_tenant_cannot_overrun_its_daily_budget() {
    let limit = 0.004_f64;
    // Queue all 50 first, then set the budget, then let one worker process run them at once.
    let app = spawn_app_with(with_admin, false).await;
    let mut ids = vec![];
    for i in 0..50 {
        let t = app.submit(json!({"prompt": format!("job {i} [mock:tool_turns=4] [mock:delay_ms=20]"), "model": "mock/m", "max_turns": 10})).await;
        ids.push(t["id"].as_str().unwrap().to_string());
    }
    set_limits(&app, "default", json!({"usd_per_day": limit})).await;
    let _worker = spawn_binary(
        &["worker"],
        &app.db.url,
        &[("SUBAGENTD_MAX_OUTPUT_TOKENS", "16"), ("SUBAGENTD_MAX_RUNNING", "64")],
    );
    let mut budget_stops = 0;
    for id in &ids {
        let t = app.poll_until_terminal(id, Duration::from_secs(60)).await;
        if t["stop_reason"] == "budget" {
            budget_stops += 1;
        }
    }
    let spent: f64 =
        sqlx::query_scalar("SELECT sum(cost_usd)::float8 FROM llm_calls").fetch_one(&app.db.pool).await.unwrap();
    let rollup: f64 =
        sqlx::query_scalar("SELECT sum(cost_usd)::float8 FROM usage_daily").fetch_one(&app.db.pool).await.unwrap();
    let reserved: f64 =
        sqlx::query_scalar("SELECT sum(reserved_usd)::float8 FROM tasks").fetch_one(&app.db.pool).await.unwrap();
    println!("BUDGET limit={limit} spent={spent:.6} budget_stops={budget_stops}");
    assert!(spent <= limit + 1e-12, "spent {spent} over the limit {limit}");
    assert!(budget_stops > 0, "the budget should have stopped some runs");
    assert!(spent > limit * 0.8, "most of the budget is usable: {spent}");
    assert!((spent - rollup).abs() < 1e-9);
    assert_eq!(reserved, 0.0, "no reservation outlives its run");
    app.stop().await;
}

#[tokio::test]
async fn claiming_is_fair_when_one_tenant_floods_the_queue() {
    let app = spawn_app_with(with_admin, false).await;
    let flood = new_key(&app, "flood").await;
    let small = new_key(&app, "small").await;
    for i in 0..60 {
        let r = app
            .client
            .post(app.url("/tasks"))
            .bearer_auth(&flood)
            .json(&json!({"prompt": format!("f{i} [mock:delay_ms=40]"), "model": "mock/m"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let mut small_ids = vec![];
    for i in 0..4 {
        let t: Value = app
            .client
            .post(app.url("/tasks"))
            .bearer_auth(&small)
            .json(&json!({"prompt": format!("s{i} [mock:delay_ms=40]"), "model": "mock/m"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        small_ids.push(t["id"].as_str().unwrap().to_string());
    }
    // One worker process, two at a time: a FIFO queue would run all 60 flood tasks first.
    let _w = spawn_binary(&["worker"], &app.db.url, &[("SUBAGENTD_MAX_RUNNING", "2"), ("SUBAGENTD_CLAIM_BATCH", "2")]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tasks WHERE tenant = 'small' AND status = 'completed'")
                .fetch_one(&app.db.pool)
                .await
                .unwrap();
        if done == 4 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let flood_started_before: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tasks WHERE tenant = 'flood' AND started_at <
           (SELECT max(started_at) FROM tasks WHERE tenant = 'small')",
    )
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    println!("FAIRNESS flood tasks started before the small tenant's last: {flood_started_before} of 60");
    assert!(flood_started_before <= 8, "the small tenant waited behind {flood_started_before} flood tasks");
    app.stop().await;
}

#[tokio::test]
async fn a_tenants_running_limit_is_enforced_in_the_claim_across_processes() {
    let app = spawn_app_with(with_admin, false).await;
    set_limits(&app, "default", json!({"max_running": 2})).await;
    let mut ids = vec![];
    for i in 0..8 {
        ids.push(
            app.submit(json!({"prompt": format!("{i} [mock:delay_ms=300]"), "model": "mock/m"})).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let _a = spawn_binary(&["worker"], &app.db.url, &[]);
    let _b = spawn_binary(&["worker"], &app.db.url, &[]);
    let mut peak = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (running, open): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'running'), count(*) FILTER (WHERE status IN ('queued', 'running')) FROM tasks",
        )
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
        peak = peak.max(running);
        if open == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(peak, 2, "at most 2 running at once, and the limit is used");
    app.stop().await;
}

#[tokio::test]
async fn rollups_equal_the_ledger_after_a_mixed_load_and_usage_reports_them() {
    let app = spawn_app_with(with_admin, true).await;
    let bodies = [
        json!({"prompt": "a [mock:tool_turns=2]", "model": "mock/small", "subagent_type": "research"}),
        json!({"prompt": "b", "model": "mock/big", "subagent_type": "plan"}),
        json!({"prompt": "c [mock:fail=400]", "model": "mock/small"}),
        json!({"prompt": "d [mock:tool_turns=1]", "model": "mock/big"}),
        json!({"prompt": "e", "model": "mock/small", "subagent_type": "research"}),
    ];
    for b in bodies {
        app.client.post(app.url("/tasks?wait=true")).json(&b).send().await.unwrap();
    }
    let mismatch: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (
            SELECT c.tenant, c.provider || '/' || c.model AS model, t.subagent_type AS agent_type, count(*) AS calls,
                   count(*) FILTER (WHERE c.outcome = 'ok') AS ok, sum(c.input_tokens) AS i, sum(c.output_tokens) AS o,
                   coalesce(sum(c.cost_usd), 0) AS cost
            FROM llm_calls c JOIN tasks t ON t.id = c.task_id GROUP BY 1, 2, 3
         ) l FULL JOIN (
            SELECT tenant, model, agent_type, sum(calls) calls, sum(ok) ok, sum(input_tokens) i, sum(output_tokens) o, sum(cost_usd) cost
            FROM usage_daily GROUP BY 1, 2, 3
         ) r USING (tenant, model, agent_type)
         WHERE l.calls IS DISTINCT FROM r.calls OR l.ok IS DISTINCT FROM r.ok OR l.i IS DISTINCT FROM r.i
            OR l.o IS DISTINCT FROM r.o OR l.cost IS DISTINCT FROM r.cost",
    )
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(mismatch, 0, "rollups differ from the ledger");

    let u: Value =
        app.client.get(app.url("/usage?group_by=model,agent_type")).send().await.unwrap().json().await.unwrap();
    let rows = u["rows"].as_array().unwrap();
    let small_research = rows.iter().find(|r| r["model"] == "mock/small" && r["agent_type"] == "research").unwrap();
    assert_eq!(small_research["calls"], 4);
    let failed: i64 = rows.iter().map(|r| r["failed"].as_i64().unwrap()).sum();
    assert_eq!(failed, 1);
    let total: Value = app.client.get(app.url("/usage?group_by=")).send().await.unwrap().json().await.unwrap();
    let ledger_calls: i64 = sqlx::query_scalar("SELECT count(*) FROM llm_calls").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(total["rows"][0]["calls"], ledger_calls);
    let r = app.client.get(app.url("/usage?group_by=tenant")).send().await.unwrap();
    assert_problem(r, 400, "invalid_parameter").await;
    let admin: Value = app
        .client
        .get(app.url("/usage?group_by=tenant"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(admin["rows"][0]["tenant"], "default");
    let r = app.client.get(app.url("/usage?from=yesterday")).send().await.unwrap();
    assert_problem(r, 400, "invalid_parameter").await;

    // The views dashboards read.
    let outcomes: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, sum(tasks)::bigint FROM v_task_outcomes GROUP BY 1 ORDER BY 1")
            .fetch_all(&app.db.pool)
            .await
            .unwrap();
    assert_eq!(outcomes, [("completed".to_string(), 4), ("failed".to_string(), 1)]);
    let lat: Option<f64> =
        sqlx::query_scalar("SELECT run_p95_ms FROM v_task_latency").fetch_one(&app.db.pool).await.unwrap();
    assert!(lat.is_some());

    // One task's calls.
    let id: String =
        sqlx::query_scalar("SELECT id::text FROM tasks WHERE prompt LIKE 'a %'").fetch_one(&app.db.pool).await.unwrap();
    let calls: Value =
        app.client.get(app.url(&format!("/tasks/{id}/calls"))).send().await.unwrap().json().await.unwrap();
    assert_eq!(calls["calls"].as_array().unwrap().len(), 3);
    assert_eq!(calls["calls"][0]["outcome"], "ok");
    app.stop().await;
}

/// A burst of first requests for a tenant never seen before, larger than the connection pool,
/// is admitted: creating the tenant's row must not hold one connection while waiting for
/// another (which deadlocked the pool until its acquire timeout, then failed the requests).
#[tokio::test]
async fn a_burst_of_first_requests_for_a_new_tenant_does_not_starve_the_pool() {
    let app = spawn_app_with(|c| c.db_max_connections = 2, false).await;
    let posts = (0..16).map(|i| app.post_task(json!({"prompt": format!("burst {i}"), "model": "mock/m"})));
    let statuses: Vec<u16> = futures_util::future::join_all(posts).await.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(statuses, vec![201; 16]);
    assert_eq!(app.task_count().await, 16);
    app.stop().await;
}

#[tokio::test]
async fn a_tenants_running_limit_holds_for_waiting_requests_too() {
    let app = spawn_app_with(with_admin, true).await;
    set_limits(&app, "default", json!({"max_running": 1})).await;
    let waits = (0..2).map(|i| {
        let (client, url) = (app.client.clone(), app.url("/tasks?wait=true&timeout=30"));
        tokio::spawn(async move {
            let body = json!({"prompt": format!("{i} [mock:delay_ms=400]"), "model": "mock/m"});
            client.post(url).json(&body).send().await.unwrap().json::<Value>().await.unwrap()
        })
    });
    for w in waits.collect::<Vec<_>>() {
        assert_eq!(w.await.unwrap()["status"], "completed");
    }
    // A waiting request's task may skip the queue, but not a tenant's running limit: the two
    // provider calls came one after the other. (Each event's time is its own statement's start;
    // `started_at` is not used, as a claim stamps it with its transaction's start, before the
    // statement that counts the running tasks.)
    let spans: Vec<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT min(created_at) FILTER (WHERE kind = 'llm_call_started'),
                max(created_at) FILTER (WHERE kind = 'llm_call_finished')
         FROM task_event_log GROUP BY task_id ORDER BY 1",
    )
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(spans.len(), 2);
    assert!(spans[1].0 >= spans[0].1, "they overlapped: {spans:?}");
    app.stop().await;
}

/// 40 concurrent waiting requests against a daily budget of `limit` USD, set on the tenant or
/// (`by_default`) as the configured default.
async fn waiting_requests_against_a_daily_budget(by_default: bool) {
    let limit = 0.004_f64;
    let app = spawn_app_with(
        |c| {
            with_admin(c);
            c.max_output_tokens = 16;
            c.max_running = 64;
            if by_default {
                c.default_usd_per_day = Some(rust_decimal::Decimal::try_from(limit).unwrap());
            }
        },
        true,
    )
    .await;
    if !by_default {
        set_limits(&app, "default", json!({"usd_per_day": limit})).await;
    }
    // The worker's first claim (which finds the queue empty) is what lets a waiting request's
    // task start here; on a busy machine the requests could otherwise all come before it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Each starts in this process with its first call reserved in its insert's transaction.
    let waits: Vec<_> = (0..40)
        .map(|i| {
            let (client, url) = (app.client.clone(), app.url("/tasks?wait=true&timeout=60"));
            tokio::spawn(async move {
                let body = json!({"prompt": format!("job {i} [mock:tool_turns=4] [mock:delay_ms=20]"), "model": "mock/m", "max_turns": 10});
                let r = client.post(url).json(&body).send().await.unwrap();
                (r.status().as_u16(), r.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let (mut budget_stops, mut refused) = (0, 0);
    for w in waits {
        match w.await.unwrap() {
            (200, t) if t["stop_reason"] == "budget" => budget_stops += 1,
            (200, t) => assert_eq!(t["status"], "completed", "{t}"),
            (402, _) => refused += 1,
            (s, t) => panic!("{s}: {t}"),
        }
    }
    let spent: f64 = sqlx::query_scalar("SELECT coalesce(sum(cost_usd), 0)::float8 FROM llm_calls")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    let (reserved, started_here): (f64, i64) =
        sqlx::query_as("SELECT sum(reserved_usd)::float8, count(*) FILTER (WHERE started_at = created_at) FROM tasks")
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    println!("BUDGET wait limit={limit} spent={spent:.6} budget_stops={budget_stops} refused={refused} started_here={started_here}");
    assert!(started_here > 0, "no task took the shortcut: this test would not cover it");
    assert!(spent <= limit + 1e-12, "spent {spent} over the limit {limit}");
    assert!(budget_stops + refused > 0, "the budget should have stopped or refused some");
    assert!(spent > limit * 0.8, "most of the budget is usable: {spent}");
    assert_eq!(reserved, 0.0, "no reservation outlives its run");
    // Each call reserved once: the first in its task's insert, checked against the budget there.
    let (started, calls): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM task_event_log WHERE kind = 'llm_call_started'), (SELECT count(*) FROM llm_calls)",
    )
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(started, calls);
    app.stop().await;
}

#[tokio::test]
async fn concurrent_waiting_requests_cannot_overrun_the_tenants_daily_budget() {
    waiting_requests_against_a_daily_budget(false).await;
}

#[tokio::test]
async fn concurrent_waiting_requests_cannot_overrun_the_configured_default_budget() {
    waiting_requests_against_a_daily_budget(true).await;
}

#[tokio::test]
async fn a_tenant_with_only_a_queue_limit_gets_its_first_call_reserved_with_the_task() {
    let app = spawn_app_with(with_admin, true).await;
    set_limits(&app, "default", json!({"max_queued": 100})).await;
    let (id, t) = crate::wait::wait_started_here(&app, "queue-limited [mock:reply=fine]").await;
    assert_eq!(t["summary"], "fine");
    let kinds: Vec<String> = sqlx::query_scalar("SELECT kind FROM task_event_log WHERE task_id = $1 ORDER BY seq")
        .bind(id)
        .fetch_all(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(kinds[..3], ["created", "claimed", "llm_call_started"]);
    assert_eq!(kinds.iter().filter(|k| *k == "llm_call_started").count(), 1, "{kinds:?}");
    app.stop().await;
}

/// Admission lets a task in while the day's spend is under the limit; its first call, reserved
/// with the task, must still fit what is left.
async fn a_first_call_that_does_not_fit_what_is_left_is_not_made(by_default: bool) {
    let app = spawn_app_with(
        |c| {
            with_admin(c);
            if by_default {
                c.default_usd_per_day = Some(rust_decimal::Decimal::new(1, 2));
            }
        },
        true,
    )
    .await;
    if !by_default {
        set_limits(&app, "default", json!({"usd_per_day": 0.01})).await;
    }
    sqlx::query(
        "INSERT INTO usage_daily (day, tenant, model, agent_type, calls, ok, cost_usd)
         VALUES ((now() AT TIME ZONE 'UTC')::date, 'default', 'mock/m', 'general', 1, 1, 0.00999)",
    )
    .execute(&app.db.pool)
    .await
    .unwrap();
    // What is left is less than any call: the budget is spent, and admission says so (issue 14:
    // until then it admitted the task, which ended `incomplete` / `budget` without a call).
    for _ in 0..3 {
        let r = app.post_json("/tasks?wait=true&timeout=30", json!({"prompt": "one more", "model": "mock/m"})).await;
        let p = assert_problem(r, 402, "budget_exhausted").await;
        assert_eq!(p["limit"], "usd_per_day");
    }
    let calls: i64 = sqlx::query_scalar("SELECT count(*) FROM llm_calls").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(calls, 0, "a call that does not fit the budget must not be made");
    app.stop().await;
}

#[tokio::test]
async fn a_first_call_over_what_is_left_of_the_tenants_budget_is_not_made() {
    a_first_call_that_does_not_fit_what_is_left_is_not_made(false).await;
}

#[tokio::test]
async fn a_first_call_over_what_is_left_of_the_configured_default_budget_is_not_made() {
    a_first_call_that_does_not_fit_what_is_left_is_not_made(true).await;
}
