//! `/usage`: the caller's aggregates from the daily rollup (the admin may see every tenant), as
//! JSON or CSV; `/tasks/{id}/calls`: one task's ledger; `/tasks/{id}/messages`: its conversation.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use chrono::NaiveDate;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::{Caller, Scope};
use super::error::ApiError;
use super::extract::{ApiQuery, TaskId};
use super::AppState;
use crate::resources::usage::usage_csv;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/usage", get(usage))
        .route("/tasks/{id}/calls", get(calls))
        .route("/tasks/{id}/messages", get(messages))
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
    /// `json` (default) or `csv`.
    #[serde(default)]
    format: Option<String>,
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
) -> Result<Response, ApiError> {
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
            "day" | "model" | "agent_type" | "api_key" => {}
            "tenant" if admin => {}
            "tenant" => return Err(ApiError::bad_param("group_by", "grouping by tenant needs the admin token")),
            other => {
                return Err(ApiError::bad_param(
                    "group_by",
                    format!("{other:?} is not one of day, model, agent_type, api_key, tenant"),
                ))
            }
        }
    }
    let tenant = match (&caller, &q.tenant) {
        (Caller::Tenant(t), None) => Some(t.clone()),
        // A tenant's key may name its own tenant; another's is not its to read.
        (Caller::Tenant(t), Some(named)) if named == t || named.is_empty() => Some(t.clone()),
        (Caller::Tenant(_), Some(_)) => return Err(super::auth::other_tenant()),
        (Caller::Admin, t) => t.clone(),
    };
    let csv = match q.format.as_deref() {
        None | Some("json") => false,
        Some("csv") => true,
        Some(other) => return Err(ApiError::bad_param("format", format!("{other:?} is not json or csv"))),
    };
    if q.tenant.as_deref().is_some_and(str::is_empty) {
        return Err(ApiError::bad_param("tenant", "must not be empty"));
    }
    let rows = st.res.usage(tenant.as_deref(), from, to, &groups).await?;
    if csv {
        let body = usage_csv(&rows);
        let disposition = format!("attachment; filename=\"usage-{from}-{to}.csv\"");
        return Ok((
            [(header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()), (header::CONTENT_DISPOSITION, disposition)],
            body,
        )
            .into_response());
    }
    Ok(Json(json!({"from": from, "to": to, "group_by": groups, "rows": rows})).into_response())
}

async fn calls(State(st): State<AppState>, scope: Scope, TaskId(id): TaskId) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"calls": st.tasks.calls(&scope, id).await?})))
}

/// A task's conversation as checkpointed: each message with its turn (purged with the task's
/// events after `SUBAGENTD_RETENTION_DAYS`).
async fn messages(State(st): State<AppState>, scope: Scope, TaskId(id): TaskId) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"messages": st.tasks.messages(&scope, id).await?})))
}
