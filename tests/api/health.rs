use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;

#[tokio::test]
async fn healthz_and_readyz_are_ok_with_a_migrated_database() {
    let app = spawn_app_with(|_| {}, false).await;
    let h = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(h.status(), 200);
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "ready");
    app.stop().await;
}

#[tokio::test]
async fn readyz_fails_while_the_database_is_unreachable_and_recovers_after() {
    let app = spawn_app_with(|c| c.db_max_connections = 2, false).await;
    set_db_reachable(&app.db, false).await;
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_problem(r, 503, "unavailable").await;
    // Liveness does not depend on the database.
    assert_eq!(app.client.get(app.url("/healthz")).send().await.unwrap().status(), 200);

    set_db_reachable(&app.db, true).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let r = app.client.get(app.url("/readyz")).send().await.unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not ready again after the database returned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await;
}
