use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use crate::helpers::*;

#[tokio::test]
async fn two_worker_processes_never_run_the_same_task_twice() {
    let app = spawn_app_with(|_| {}, false).await; // API only
    let _a = spawn_binary(&["worker"], &app.db.url, &[("SUBAGENTD_CLAIM_BATCH", "4")]);
    let _b = spawn_binary(&["worker"], &app.db.url, &[("SUBAGENTD_CLAIM_BATCH", "4")]);
    workers_up(&app.db.pool, 2, Duration::from_secs(30)).await;

    let mut ids = vec![];
    for i in 0..40 {
        let t = app
            .submit(json!({"prompt": format!("job {i} [mock:tool_turns=1] [mock:delay_ms=30]"), "model": "mock/m"}))
            .await;
        ids.push(t["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        let t = app.poll_until_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(t["status"], "completed", "{t}");
        assert_eq!(t["attempt"], 1, "{t}");
    }
    let ids: Vec<Uuid> = ids.iter().map(|s| s.parse().unwrap()).collect();
    let claims: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT task_id, count(*) FROM task_event_log WHERE kind = 'claimed' AND task_id = ANY($1) GROUP BY task_id",
    )
    .bind(&ids)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(claims.len(), 40);
    assert!(claims.iter().all(|c| c.1 == 1), "a task was claimed twice: {claims:?}");
    let calls: Vec<(Uuid, i64)> =
        sqlx::query_as("SELECT task_id, count(*) FROM llm_calls WHERE task_id = ANY($1) GROUP BY task_id")
            .bind(&ids)
            .fetch_all(&app.db.pool)
            .await
            .unwrap();
    assert!(calls.iter().all(|c| c.1 == 2), "a turn ran twice: {calls:?}");
    let workers: HashSet<String> =
        sqlx::query_scalar::<_, String>("SELECT data->>'worker' FROM task_event_log WHERE kind = 'claimed'")
            .fetch_all(&app.db.pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(workers.len(), 2, "both processes should have taken work: {workers:?}");
    app.stop().await;
}
