//! `GET /overview`: what the console's landing page shows, for the caller's tenant (or every
//! tenant, for the admin).

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use rust_decimal::prelude::ToPrimitive;
use serde_json::{json, Value};

use super::auth::Scope;
use super::error::ApiError;
use super::AppState;
use crate::store::overview;
use crate::store::tasks::{self, ListFilter};
use crate::tasks::view::TaskView;

pub fn router() -> Router<AppState> {
    Router::new().route("/overview", get(read))
}

async fn read(State(st): State<AppState>, scope: Scope) -> Result<Json<Value>, ApiError> {
    let tenant = scope.tenant();
    let defaults = crate::budget::Defaults::from_config(&st.tasks.cfg).spend();
    let newest = ListFilter { limit: 10, ..ListFilter::default() };
    let (now, finished, models, spend, replicas, latest) = tokio::try_join!(
        overview::now(&st.tasks.pool, tenant),
        overview::finished_last_hour(&st.tasks.pool, tenant),
        overview::models_today(&st.tasks.pool, tenant),
        overview::spend(&st.tasks.pool, tenant, defaults),
        overview::replicas(&st.tasks.pool, tenant),
        tasks::list(&st.tasks.pool, tenant, &newest),
    )?;
    // One entry per minute with finishes, its outcomes as fields.
    let mut per_minute: Vec<Value> = vec![];
    for f in finished {
        let minute = json!(f.minute);
        if per_minute.last().is_none_or(|m| m["minute"] != minute) {
            per_minute.push(json!({"minute": minute, "completed": 0, "incomplete": 0, "failed": 0, "cancelled": 0}));
        }
        if let Some(m) = per_minute.last_mut() {
            m[f.status.as_str()] = json!(f.tasks);
        }
    }
    let models: Vec<Value> = models
        .into_iter()
        .map(|m| {
            let rate = if m.calls > 0 { m.failed as f64 / m.calls as f64 } else { 0.0 };
            json!({"model": m.model, "calls": m.calls, "failed": m.failed, "error_rate": rate,
                   "cost_usd": m.cost_usd.to_f64().unwrap_or(0.0)})
        })
        .collect();
    let latest: Vec<TaskView> = TaskView::of(&st.tasks.pool, latest).await?;
    // What this replica holds open, per tenant (the caller's tenant only, but for the admin).
    let mut holds = vec![];
    for (t, open) in st.tasks.guard.open() {
        if tenant.is_some_and(|mine| mine != t) {
            continue;
        }
        let l = st.tasks.limits(&t).await?;
        holds.push(json!({"tenant": t, "streams": open.streams, "waits": open.waits,
                          "max_streams": l.max_streams, "max_waits": l.max_waits}));
    }
    let this = json!({"holds": holds, "connections": st.conns.open(), "connection_cap": st.conns.cap});
    Ok(Json(json!({"now": now, "finished_per_minute": per_minute, "models": models, "spend": spend,
                   "replicas": replicas, "latest": latest, "this_replica": this})))
}
