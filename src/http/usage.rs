//! `/usage`: the caller's aggregates from the daily rollup (the admin may see every tenant),
//! and `/tasks/{id}/calls`: one task's ledger.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use chrono::NaiveDate;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Caller;
use super::error::ApiError;
use super::extract::{ApiQuery, TaskId};
use super::{AppState, Tenant};
use crate::store::tenants;

pub fn router() -> Router<AppState> {
    Router::new().route("/usage", get(usage)).route("/tasks/{id}/calls", get(calls))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageQuery {
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    group_by: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
}

fn date(field: &str, v: &Option<String>, default: NaiveDate) -> Result<NaiveDate, ApiError> {
    match v {
        None => Ok(default),
        Some(s) => NaiveDate::parse_from_str(s, "%Y-%m-%d")
            .or_else(|_| chrono::DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&chrono::Utc).date_naive()))
            .map_err(|_| ApiError::bad_param(field, format!("{s:?} is not a date (YYYY-MM-DD) or RFC 3339 time"))),
    }
}

async fn usage(
    State(st): State<AppState>,
    caller: Caller,
    ApiQuery(q): ApiQuery<UsageQuery>,
) -> Result<Json<Value>, ApiError> {
    let today = chrono::Utc::now().date_naive();
    let to = date("to", &q.to, today)?;
    let from = date("from", &q.from, to - chrono::Duration::days(29))?;
    if from > to {
        return Err(ApiError::bad_param("from", "must not be after `to`"));
    }
    let groups: Vec<&str> =
        q.group_by.as_deref().unwrap_or("day").split(',').map(str::trim).filter(|g| !g.is_empty()).collect();
    let admin = matches!(caller, Caller::Admin);
    for g in &groups {
        match *g {
            "day" | "model" | "agent_type" => {}
            "tenant" if admin => {}
            "tenant" => return Err(ApiError::bad_param("group_by", "grouping by tenant needs the admin token")),
            other => {
                return Err(ApiError::bad_param(
                    "group_by",
                    format!("{other:?} is not one of day, model, agent_type, tenant"),
                ))
            }
        }
    }
    let tenant = match (&caller, &q.tenant) {
        (Caller::Tenant(t), None) => Some(t.clone()),
        (Caller::Tenant(_), Some(_)) => {
            return Err(ApiError::bad_param("tenant", "only the admin token may choose a tenant"))
        }
        (Caller::Admin, t) => t.clone(),
    };
    let rows = tenants::usage(&st.pool, tenant.as_deref(), from, to, &groups).await?;
    Ok(Json(json!({"from": from, "to": to, "group_by": groups, "rows": rows})))
}

async fn calls(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    TaskId(id): TaskId,
) -> Result<Json<Value>, ApiError> {
    crate::store::tasks::get(&st.pool, &tenant, id).await?.ok_or_else(|| ApiError::not_found("task"))?;
    Ok(Json(json!({"calls": crate::store::calls::of_task(&st.pool, id).await?})))
}
