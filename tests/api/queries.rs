//! The SQL no macro checks, and what the checked SQL relies on (#66). Every static statement is a
//! sqlx macro, checked against the schema when it compiles; what is left is run here in each of
//! its shapes against the real schema:
//! - the task list and its count, built from a filter (`store::tasks::list`, `count`);
//! - `TurnRow`, the typed row the turn's commit takes, against the type it is sent as;
//! - the clock margin, in SQL and in the service.
//!
//! (The retention DDL runs in `history::retention_drops_partitions_while_the_claim_and_inserts_go_on`
//! and `history::stored_diffs_from_the_release_before_keep_every_row_go_by_the_day_and_stay_one_per_task`.)

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde_json::{json, Value};
use subagentd::kinds::{event, CallOutcome, Event, FailureCode, StopReason, TaskStatus};
use subagentd::store::calls::CallRow;
use subagentd::store::runs::{Finish, TurnWrite};
use subagentd::store::tasks::{self, Inserted, ListFilter, NewTask};
use subagentd::store::Fence;
use uuid::Uuid;

use crate::helpers::test_db;

/// What the test knows of a task it made, to say which filters name it.
struct Made {
    id: Uuid,
    tenant: &'static str,
    ty: &'static str,
    model: &'static str,
    metadata: Value,
    status: TaskStatus,
    created_at: DateTime<Utc>,
    context: Option<&'static str>,
}

/// A list's shape: its name, the tenant it reads, its filter, and which tasks it names.
type Shape<'a> = (&'a str, Option<&'a str>, ListFilter, Box<dyn Fn(&Made) -> bool>);

fn filter() -> ListFilter {
    ListFilter { limit: 1000, ..Default::default() }
}

#[tokio::test]
async fn every_shape_of_a_task_list_reads_the_tasks_it_names() {
    let db = test_db().await;
    let pool = &db.pool;
    let mut made: Vec<Made> = vec![];
    let plan = [
        ("a", "research", "mock/one", json!({"team": "x"}), TaskStatus::Queued, Some("ctx-1")),
        ("a", "plan", "mock/two", json!({}), TaskStatus::Completed, None),
        ("a", "research", "mock/two", json!({"team": "y"}), TaskStatus::Failed, Some("ctx-1")),
        ("a", "general", "mock/one", json!({"team": "x", "n": 1}), TaskStatus::Cancelled, None),
        ("b", "research", "mock/one", json!({"team": "x"}), TaskStatus::Completed, Some("ctx-1")),
        ("b", "plan", "mock/one", json!({}), TaskStatus::Queued, None),
    ];
    for (i, (tenant, ty, model, metadata, status, context)) in plan.into_iter().enumerate() {
        let id = Uuid::now_v7();
        let t = NewTask {
            id,
            tenant: tenant.into(),
            subagent_type: ty.into(),
            description: None,
            prompt: format!("task {i}"),
            model: model.into(),
            options: json!({}),
            metadata: metadata.clone(),
            idempotency_key: None,
            request_hash: None,
            parent_task_id: None,
            max_cost_usd: None,
            max_tokens: None,
            traceparent: None,
            webhook_url: None,
            api_key: None,
            start: None,
            run_at: None,
            priority: 1,
        };
        let mut conn = pool.acquire().await.unwrap();
        let Inserted::New(row, _) = tasks::insert(&mut conn, &t).await.unwrap() else { panic!("a new task") };
        if status != TaskStatus::Queued {
            // An end as a run writes one (the row moves out of the queue's partition).
            sqlx::query("UPDATE tasks SET status = $2, finished_at = now(), history_at = now() WHERE id = $1")
                .bind(id)
                .bind(status.as_str())
                .execute(pool)
                .await
                .unwrap();
        }
        if let Some(c) = context {
            subagentd::store::a2a::insert(&mut conn, id, tenant, c, &json!({"messageId": format!("m{i}")}))
                .await
                .unwrap();
        }
        made.push(Made { id, tenant, ty, model, metadata, status, created_at: row.created_at, context });
        // Creation times a millisecond apart at least, for the time bounds.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let third = made[2].created_at;
    let cursor = made[4].id;

    // Each shape: a filter, and which tasks it names (newest first, as the list orders them).
    let mut shapes: Vec<Shape> = vec![];
    let with = |f: fn(&mut ListFilter)| {
        let mut l = filter();
        f(&mut l);
        l
    };
    shapes.push(("everything, every tenant", None, filter(), Box::new(|_| true)));
    shapes.push(("a tenant (read as a range)", Some("a"), filter(), Box::new(|m| m.tenant == "a")));
    shapes.push((
        "one status that the range serves",
        Some("a"),
        with(|f| f.statuses = vec![TaskStatus::Completed]),
        Box::new(|m| m.tenant == "a" && m.status == TaskStatus::Completed),
    ));
    shapes.push((
        "one status of a partial index (tenant by equality)",
        Some("a"),
        with(|f| f.statuses = vec![TaskStatus::Failed]),
        Box::new(|m| m.tenant == "a" && m.status == TaskStatus::Failed),
    ));
    shapes.push((
        "several statuses",
        None,
        with(|f| f.statuses = vec![TaskStatus::Queued, TaskStatus::Cancelled]),
        Box::new(|m| matches!(m.status, TaskStatus::Queued | TaskStatus::Cancelled)),
    ));
    shapes.push((
        "a type",
        Some("a"),
        with(|f| f.subagent_type = Some("research".into())),
        Box::new(|m| m.tenant == "a" && m.ty == "research"),
    ));
    shapes.push(("a model", None, with(|f| f.model = Some("mock/two".into())), Box::new(|m| m.model == "mock/two")));
    shapes.push((
        "metadata that must contain a key",
        None,
        with(|f| f.metadata = Some(json!({"team": "x"}))),
        Box::new(|m| m.metadata.get("team") == Some(&json!("x"))),
    ));
    shapes.push((
        "empty metadata (every task)",
        Some("b"),
        with(|f| f.metadata = Some(json!({}))),
        Box::new(|m| m.tenant == "b"),
    ));
    let after = third;
    shapes.push((
        "created after",
        Some("a"),
        ListFilter { created_after: Some(after), ..filter() },
        Box::new(move |m| m.tenant == "a" && m.created_at > after),
    ));
    shapes.push((
        "created before",
        None,
        ListFilter { created_before: Some(after), ..filter() },
        Box::new(move |m| m.created_at < after),
    ));
    shapes.push((
        "changed after (every task changed since the first was made)",
        Some("a"),
        ListFilter { changed_after: Some(made[0].created_at), ..filter() },
        Box::new(|m| m.tenant == "a"),
    ));
    shapes.push((
        "an A2A context, a tenant's",
        Some("a"),
        with(|f| f.a2a_context = Some("ctx-1".into())),
        Box::new(|m| m.tenant == "a" && m.context == Some("ctx-1")),
    ));
    shapes.push((
        "an A2A context, every tenant's",
        None,
        with(|f| f.a2a_context = Some("ctx-1".into())),
        Box::new(|m| m.context == Some("ctx-1")),
    ));
    let own = made[1].id;
    shapes.push((
        "a task with no context is its own",
        Some("a"),
        ListFilter { a2a_context: Some(own.to_string()), ..filter() },
        Box::new(move |m| m.id == own),
    ));
    shapes.push((
        "a cursor",
        Some("a"),
        ListFilter { before_id: Some(cursor), ..filter() },
        Box::new(move |m| m.tenant == "a" && m.id < cursor),
    ));
    shapes.push((
        "every filter at once",
        Some("a"),
        ListFilter {
            statuses: vec![TaskStatus::Queued, TaskStatus::Failed],
            subagent_type: Some("research".into()),
            model: Some("mock/one".into()),
            metadata: Some(json!({"team": "x"})),
            created_after: Some(made[0].created_at - chrono::Duration::seconds(1)),
            created_before: Some(Utc::now() + chrono::Duration::seconds(1)),
            changed_after: Some(made[0].created_at - chrono::Duration::seconds(1)),
            a2a_context: Some("ctx-1".into()),
            before_id: Some(Uuid::max()),
            limit: 1000,
        },
        Box::new(|m| {
            m.tenant == "a"
                && m.ty == "research"
                && m.model == "mock/one"
                && m.metadata.get("team") == Some(&json!("x"))
                && matches!(m.status, TaskStatus::Queued | TaskStatus::Failed)
                && m.context == Some("ctx-1")
        }),
    ));

    for (name, tenant, f, names) in &shapes {
        let mut want: Vec<Uuid> = made.iter().filter(|m| names(m)).map(|m| m.id).collect();
        want.sort_by(|a, b| b.cmp(a));
        assert!(!want.is_empty(), "{name}: the shape names no task, so it proves little");
        let got: Vec<Uuid> = tasks::list(pool, *tenant, f).await.unwrap().iter().map(|t| t.id).collect();
        assert_eq!(got, want, "{name}: the list");
        assert_eq!(tasks::count(pool, *tenant, f).await.unwrap(), want.len() as i64, "{name}: the count");
    }
    // A row of the list is the task as every other read reads it (the view `task_rows`).
    for m in &made {
        let listed = tasks::list(
            pool,
            Some(m.tenant),
            &ListFilter { before_id: Some(Uuid::from_u128(m.id.as_u128() + 1)), limit: 1, ..filter() },
        )
        .await
        .unwrap();
        let one = tasks::get(pool, m.tenant, m.id).await.unwrap().unwrap();
        assert_eq!(format!("{:?}", listed[0]), format!("{one:?}"));
    }
}

#[tokio::test]
async fn a_turn_row_is_the_type_the_statement_takes() {
    let db = test_db().await;
    let (task, lease, key) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let w = TurnWrite {
        fence: Fence { id: task, lease },
        turn: Some(22),
        call: CallRow {
            call_key: key,
            turn: 19,
            attempt: 20,
            try_no: 21,
            provider: "prov".into(),
            model: "mod".into(),
            input_tokens: 11,
            output_tokens: 12,
            cached_tokens: 13,
            cache_write_tokens: 14,
            web_searches: 15,
            cost_usd: Some(Decimal::new(125, 2)),
            latency_ms: 17,
            http_status: Some(18),
            outcome: CallOutcome::Error,
            error: Some("boom".into()),
            usage_estimated: true,
            reserved_usd: Decimal::new(375, 2),
            reserved_tokens: 16,
            created_at: None,
        },
        messages: vec![json!({"role": "system", "content": "be brief"}), json!({"role": "assistant", "content": "hi"})],
        events: vec![Event::Cancelled(event::Empty {})],
        fin: Some(Finish {
            status: TaskStatus::Failed,
            stop_reason: Some(StopReason::Budget),
            summary: Some("sum".into()),
            output: Some(json!({"out": 1})),
            error_code: Some(FailureCode::ProviderRejected),
            error_message: Some("msg".into()),
            return_task: true,
        }),
    };
    let read = subagentd::store::runs::turn_as_read(&db.pool, &w).await.unwrap();
    let finished = serde_json::to_string(&Event::Finished(event::Finished {
        status: TaskStatus::Failed,
        stop_reason: Some(StopReason::Budget),
    }))
    .unwrap();
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"be brief"));
    let want = json!({
        "task": task, "lease": lease, "turns": 22, "call_key": key, "call_turn": 19, "attempt": 20, "try_no": 21,
        "provider": "prov", "model": "mod", "outcome": "error", "error": "boom",
        "input_tokens": 11, "output_tokens": 12, "cached_tokens": 13, "cache_write_tokens": 14, "web_searches": 15,
        "cost_usd": 1.25, "latency_ms": 17, "http_status": 18, "usage_estimated": true,
        "reserved_usd": 3.75, "reserved_tokens": 16,
        "status": "failed", "stop_reason": "budget", "summary": "sum", "output": {"out": 1},
        "error_code": "provider_rejected", "error_message": "msg", "want_task": true,
        "messages": [{"role": "system", "text_sha256": sha}, {"role": "assistant", "content": "hi"}],
        "text_hashes": [format!("\\x{sha}")], "texts": ["be brief"],
        // The turn's event, then the end's (`finished`), as one row.
        "event_kind": "finished",
        "event_data": finished,
        "earlier": r#"[["cancelled",{}]]"#,
        "events": 2,
    });
    // Every attribute of the type, by name: none missing, none extra, each the field of its name.
    let attrs: Vec<String> = sqlx::query_scalar(
        "SELECT a.attname::text FROM pg_attribute a JOIN pg_type t ON t.typrelid = a.attrelid
         WHERE t.typname = 'subagentd_turn' AND a.attnum > 0 ORDER BY a.attnum",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let mut keys: Vec<&String> = want.as_object().unwrap().keys().collect();
    let mut sorted_attrs: Vec<&String> = attrs.iter().collect();
    keys.sort();
    sorted_attrs.sort();
    assert_eq!(sorted_attrs, keys, "the type's attributes are the fields the test knows");
    for a in &attrs {
        assert_eq!(read[a], want[a], "attribute {a}");
    }
}

#[tokio::test]
async fn the_clock_margin_is_the_same_in_sql_and_in_the_service() {
    let db = test_db().await;
    let secs: f64 = sqlx::query_scalar("SELECT extract(epoch FROM subagentd_clock_margin())::float8")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(secs as i64, subagentd::store::CLOCK_MARGIN.num_seconds());
}
