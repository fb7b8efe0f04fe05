//! Per-tenant API request rates: off unless set; a tenant over its rate gets 429 with
//! `Retry-After` and nothing changes; other tenants and the admin are not slowed.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;

const ADMIN: &str = "rate-admin-token";

async fn new_key(app: &TestApp, tenant: &str) -> String {
    admin_key(app, ADMIN, tenant).await
}

async fn put_limits(app: &TestApp, tenant: &str, limits: Value) -> reqwest::Response {
    app.client.put(app.url(&format!("/admin/tenants/{tenant}"))).bearer_auth(ADMIN).json(&limits).send().await.unwrap()
}

async fn post_as(app: &TestApp, key: &str) -> reqwest::Response {
    app.client
        .post(app.url("/tasks"))
        .bearer_auth(key)
        .json(&json!({"prompt": "x", "model": "mock/m"}))
        .send()
        .await
        .unwrap()
}

async fn tasks_of(app: &TestApp, tenant: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM tasks WHERE tenant = $1")
        .bind(tenant)
        .fetch_one(&app.db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_tenant_over_its_rate_gets_429_with_retry_after_and_changes_nothing_while_others_are_served() {
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into()), false).await;
    let acme = new_key(&app, "acme").await;
    let globex = new_key(&app, "globex").await;
    assert!(put_limits(&app, "acme", json!({"requests_per_second": 1, "request_burst": 3}))
        .await
        .status()
        .is_success());

    for i in 0..3 {
        assert_eq!(post_as(&app, &acme).await.status(), 201, "request {i} is within the burst");
    }
    let r = post_as(&app, &acme).await;
    assert_eq!(r.headers()["retry-after"], "1");
    let p = assert_problem(r, 429, "rate_limited").await;
    assert!(p["detail"].as_str().unwrap().contains("1 requests per second (burst 3)"), "{p}");
    assert_eq!(tasks_of(&app, "acme").await, 3, "a refused submission creates no task");
    // Every request counts, reads as well (a polling loop is what the limit is for).
    let r = app.client.get(app.url("/tasks")).bearer_auth(&acme).send().await.unwrap();
    assert_problem(r, 429, "rate_limited").await;

    // Another tenant (no rate: unlimited) and the admin are not slowed.
    for _ in 0..50 {
        assert_eq!(post_as(&app, &globex).await.status(), 201);
    }
    for _ in 0..20 {
        let r = app.client.get(app.url("/admin/tenants")).bearer_auth(ADMIN).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(tasks_of(&app, "globex").await, 50);

    // The rate refills: one request a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(post_as(&app, &acme).await.status(), 201);
    assert_eq!(post_as(&app, &acme).await.status(), 429);

    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let refused: f64 = metrics
        .lines()
        .find(|l| l.starts_with("subagentd_rate_limited_total{tenant=\"acme\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(refused >= 3.0, "{refused}");
}

#[tokio::test]
async fn the_configured_default_rate_applies_to_every_tenant_and_a_tenants_own_rate_wins() {
    let app = spawn_app_with(
        |c| {
            c.admin_token = Some(ADMIN.into());
            c.default_requests_per_second = Some(0.5);
            c.default_request_burst = Some(2);
        },
        false,
    )
    .await;
    // Single-user mode: the configured tenant.
    assert_eq!(app.post_task(json!({"prompt": "x", "model": "mock/m"})).await.status(), 201);
    assert_eq!(app.client.get(app.url("/tasks")).send().await.unwrap().status(), 200);
    let r = app.client.get(app.url("/tasks")).send().await.unwrap();
    let wait: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&wait), "a request every 2 s: {wait}");
    assert_problem(r, 429, "rate_limited").await;
    let defaults = app.client.get(app.url("/admin/tenants/default")).bearer_auth(ADMIN).send().await.unwrap();
    let defaults: Value = defaults.json().await.unwrap();
    assert_eq!(defaults["defaults"]["requests_per_second"], 0.5);

    // Its own rate replaces the default at once on this replica.
    assert!(put_limits(&app, "default", json!({"requests_per_second": 1000})).await.status().is_success());
    for _ in 0..30 {
        assert_eq!(app.client.get(app.url("/tasks")).send().await.unwrap().status(), 200);
    }
}

#[tokio::test]
async fn a_rate_that_cannot_be_kept_is_refused_and_the_limits_stay_as_they_were() {
    let app = spawn_app_with(|c| c.admin_token = Some(ADMIN.into()), false).await;
    assert_eq!(put_limits(&app, "acme", json!({"requests_per_second": 5})).await.status(), 201);
    for (body, field) in [
        (json!({"requests_per_second": 0}), "requests_per_second"),
        (json!({"requests_per_second": 5e-324}), "requests_per_second"),
        (json!({"requests_per_second": -1}), "requests_per_second"),
        (json!({"requests_per_second": 2000000}), "requests_per_second"),
        (json!({"requests_per_second": 5, "request_burst": 0}), "request_burst"),
        (json!({"requests_per_second": "5"}), "requests_per_second"),
    ] {
        let p = assert_problem(put_limits(&app, "acme", body.clone()).await, 422, "validation_failed").await;
        assert!(p["detail"].as_str().unwrap().contains(field), "{body}: {p}");
    }
    let t: Value =
        app.client.get(app.url("/admin/tenants/acme")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert_eq!(t["limits"]["requests_per_second"], 5.0);
    assert_eq!(t["limits"]["request_burst"], Value::Null);
}
