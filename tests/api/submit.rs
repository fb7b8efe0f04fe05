//! The submission module on its own, without HTTP: a real database, no router.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use subagentd::budget::{BudgetError, Limits};
use subagentd::cache::TtlCache;
use subagentd::config::Config;
use subagentd::engine::definitions::FileAgents;
use subagentd::hub::Hub;
use subagentd::llm::Providers;
use subagentd::store::tasks::TaskStatus;
use subagentd::tasks::{Lifecycle, Parts, Submission, Submitted, TaskError as SubmitError, TaskRequest};

use crate::helpers::*;

fn submitter(db: &TestDb, tweak: impl FnOnce(&mut Config)) -> Lifecycle {
    let mut cfg = test_config(&db.url);
    tweak(&mut cfg);
    let parts = Parts {
        pool: db.pool.clone(),
        tool_caller: subagentd::tools::Caller::from_config(&cfg).unwrap(),
        workspaces: Arc::new(subagentd::workspace::Workspaces::from_config(&cfg).unwrap()),
        cfg: Arc::new(cfg),
        providers: Arc::new(Providers::with_builtin()),
        file_agents: Arc::new(FileAgents::default()),
        hub: Hub::new(),
        limits_cache: Arc::new(TtlCache::new(Duration::from_secs(5))),
        tools_cache: Arc::new(TtlCache::new(Duration::from_secs(5))),
        shutdown: Default::default(),
        guard: subagentd::tasks::guard::Guard::new(),
    };
    Lifecycle::new(parts, None)
}

fn submission(body: serde_json::Value, key: Option<&str>) -> Submission {
    let request: TaskRequest = serde_json::from_value(body).unwrap();
    Submission {
        id: uuid::Uuid::now_v7(),
        tenant: "acme".into(),
        request,
        idempotency_key: key.map(Into::into),
        depth: None,
        traceparent: None,
        waiting: false,
        api_key: None,
        context: None,
    }
}

#[tokio::test]
async fn a_request_becomes_a_queued_task_with_its_typed_options() {
    let db = test_db().await;
    let s = submitter(&db, |_| {});
    let sub = submission(json!({"prompt": "look", "model": "mock/m", "subagent_type": "plan", "max_turns": 99}), None);
    let id = sub.id;
    let Submitted::Created(row) = s.submit(sub).await.unwrap() else { panic!("not created") };
    assert_eq!((row.id, row.status, row.subagent_type.as_str()), (id, TaskStatus::Queued, "plan"));
    let opts = subagentd::engine::spec::TaskOptions::from_stored(&row.options).unwrap();
    assert_eq!(opts.max_turns.get(), 50, "clamped");
    let tenant: String = sqlx::query_scalar("SELECT name FROM tenants").fetch_one(&db.pool).await.unwrap();
    assert_eq!(tenant, "acme", "the tenant's row is created on first sight");
}

#[tokio::test]
async fn the_same_idempotency_key_gives_the_same_task_and_another_body_a_conflict() {
    let db = test_db().await;
    let s = submitter(&db, |_| {});
    let body = json!({"prompt": "once", "model": "mock/m"});
    let Submitted::Created(first) = s.submit(submission(body.clone(), Some("k1"))).await.unwrap() else { panic!() };
    let Submitted::Existing(again) = s.submit(submission(body, Some("k1"))).await.unwrap() else { panic!() };
    assert_eq!(first.id, again.id);
    let e = s.submit(submission(json!({"prompt": "other", "model": "mock/m"}), Some("k1"))).await.unwrap_err();
    assert!(matches!(e, SubmitError::IdempotencyConflict { task_id } if task_id == first.id), "{e:?}");
}

#[tokio::test]
async fn bad_requests_are_domain_errors_naming_the_field_and_write_nothing() {
    let db = test_db().await;
    let s = submitter(&db, |_| {});
    let cases = [
        (json!({"prompt": "  ", "model": "mock/m"}), "prompt"),
        (json!({"prompt": "x", "model": "mock/m", "max_turns": 0}), "max_turns"),
        (json!({"prompt": "x", "model": "mock/m", "max_cost_usd": -1}), "max_cost_usd"),
        (json!({"prompt": "x", "model": "mock/m", "metadata": [1]}), "metadata"),
        (json!({"prompt": "x", "model": "mock/m", "allowed_tools": ["nope"]}), "allowed_tools"),
    ];
    for (body, field) in cases {
        match s.submit(submission(body, None)).await {
            Err(SubmitError::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    assert!(matches!(s.submit(submission(json!({"prompt": "x"}), None)).await, Err(SubmitError::ModelRequired)));
    let e = s.submit(submission(json!({"prompt": "x", "model": "nope/m"}), None)).await.unwrap_err();
    assert!(matches!(e, SubmitError::UnknownModel { .. }), "{e:?}");
    let e = s.submit(submission(json!({"prompt": "x", "model": "mock/m", "subagent_type": "ghost"}), None)).await;
    assert!(
        matches!(e, Err(SubmitError::UnknownAgent { ref available, .. }) if available.contains(&"plan".to_string()))
    );
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(n, 0);
}

#[tokio::test]
async fn the_queue_limit_refuses_with_a_budget_error_and_writes_nothing() {
    let db = test_db().await;
    let s = submitter(&db, |c| c.default_max_queued = Some(1));
    s.submit(submission(json!({"prompt": "1", "model": "mock/m"}), None)).await.unwrap();
    let e = s.submit(submission(json!({"prompt": "2", "model": "mock/m"}), None)).await.unwrap_err();
    assert!(matches!(e, SubmitError::Budget(BudgetError::QueueFull { max: 1, queued: 1, .. })), "{e:?}");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn limits_set_through_the_budget_module_are_validated_and_merged_with_the_defaults() {
    let db = test_db().await;
    let bad = Limits { max_queued: Some(-1), ..Limits::default() };
    let e = subagentd::budget::set_limits(&db.pool, "acme", &bad).await.unwrap_err();
    assert!(matches!(e, BudgetError::Invalid { field: "max_queued", .. }), "{e:?}");
    assert!(subagentd::budget::set_limits(&db.pool, "not ok", &Limits::default()).await.is_err());
    let own = Limits { max_queued: Some(3), ..Limits::default() };
    assert!(subagentd::budget::set_limits(&db.pool, "acme", &own).await.unwrap(), "created");
    let s = submitter(&db, |c| c.default_usd_per_day = Some(rust_decimal::Decimal::from(7)));
    let l = s.limits("acme").await.unwrap();
    assert_eq!((l.max_queued, l.usd_per_day), (Some(3), Some(rust_decimal::Decimal::from(7))));
}
