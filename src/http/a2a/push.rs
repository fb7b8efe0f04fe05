//! Push notification configs: several per task, each a target the webhook sender delivers the
//! task's pauses and end to (signed like every webhook, within the same allow-list, with the
//! same retries), with the A2A body, the config's token in `X-A2A-Notification-Token` and its
//! `authentication` as `Authorization`.

use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::errors::{A2aError, Kind};
use super::{ops, params, Ctx};
use crate::tasks::context::PushConfig;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigIn {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    task_id: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    authentication: Option<AuthIn>,
    #[serde(default)]
    tenant: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct AuthIn {
    #[serde(default)]
    scheme: String,
    #[serde(default)]
    credentials: Option<String>,
}

fn bad(field: &str, message: impl Into<String>) -> A2aError {
    A2aError::params(format!("{field}: {}", message.into())).meta("field", field)
}

fn visible(s: &str) -> bool {
    s.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// Is `v` what protobuf's JSON writes for an unset message or field: null, `""`, `0`, `false`,
/// or an array or object of nothing else?
pub fn unset(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.iter().all(unset),
        Value::Object(o) => o.values().all(unset),
    }
}

/// A config as given, checked (its task not yet: `task` when known).
pub fn checked(ctx: &Ctx, v: &Value, task: Option<Uuid>) -> Result<PushConfig, A2aError> {
    let c: ConfigIn =
        serde_json::from_value(v.clone()).map_err(|e| bad("taskPushNotificationConfig", e.to_string()))?;
    if c.tenant.as_ref().is_some_and(|t| !t.is_empty() && *t != ctx.tenant) {
        return Err(bad("tenant", "must be empty or the API key's own tenant"));
    }
    let url = c.url.filter(|u| !u.is_empty()).ok_or_else(|| bad("url", "required"))?;
    if url.len() > 2048 {
        return Err(bad("url", "must be at most 2048 characters"));
    }
    ctx.st.res.check_outbound_url(&url).map_err(|e| bad("url", e))?;
    let id = match c.id.filter(|i| !i.is_empty()) {
        Some(i) if i.len() <= 255 && visible(&i) => i,
        Some(_) => return Err(bad("id", "must be at most 255 visible ASCII characters")),
        None => Uuid::new_v4().to_string(),
    };
    if c.token.as_ref().is_some_and(|t| t.len() > 1024 || !visible(t)) {
        return Err(bad("token", "must be at most 1024 visible ASCII characters"));
    }
    let (scheme, credentials) = match c.authentication {
        // An empty object (or one of empty fields) is how protobuf's JSON writes an unset
        // message: the same as none.
        None => (None, None),
        Some(a) if a.scheme.is_empty() && a.credentials.as_deref().is_none_or(str::is_empty) => (None, None),
        Some(a) => {
            if a.scheme.is_empty()
                || a.scheme.len() > 64
                || !a.scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(bad("authentication.scheme", "must be an HTTP authentication scheme (Bearer, Basic…)"));
            }
            if a.credentials.as_ref().is_some_and(|c| c.len() > 4096 || !visible(c)) {
                return Err(bad("authentication.credentials", "must be at most 4096 visible ASCII characters"));
            }
            (Some(a.scheme), a.credentials)
        }
    };
    let task_id = match (task, c.task_id.filter(|t| !t.is_empty())) {
        (Some(t), _) => t,
        (None, Some(t)) => t.parse().map_err(|_| A2aError::not_found())?,
        (None, None) => Uuid::nil(),
    };
    Ok(PushConfig {
        task_id,
        id,
        url,
        token: c.token.filter(|t| !t.is_empty()),
        auth_scheme: scheme,
        auth_credentials: credentials,
    })
}

/// Register a config for the caller's task `task`.
pub async fn register(ctx: &Ctx, mut c: PushConfig, task: Uuid) -> Result<Value, A2aError> {
    c.task_id = task;
    Ok(shape(&ctx.st.room().put_push(&ctx.tenant, &c).await?))
}

/// A config as A2A shows it (its credentials are not shown again).
fn shape(c: &PushConfig) -> Value {
    let mut v = json!({"id": c.id, "taskId": c.task_id, "url": c.url});
    if let Some(t) = &c.token {
        v["token"] = json!(t);
    }
    if let Some(s) = &c.auth_scheme {
        v["authentication"] = json!({"scheme": s});
    }
    v
}

pub async fn create(ctx: &Ctx, p: Value) -> Result<Value, A2aError> {
    let c = checked(ctx, &p, None)?;
    if c.task_id.is_nil() {
        return Err(bad("taskId", "required"));
    }
    let task = ops::task_of(ctx, &c.task_id.to_string()).await?;
    register(ctx, c, task.id).await
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Named {
    task_id: String,
    id: String,
}

pub async fn get(ctx: &Ctx, p: Value) -> Result<Value, A2aError> {
    let p: Named = params("GetTaskPushNotificationConfig", p)?;
    let task = ops::task_of(ctx, &p.task_id).await?;
    let c = ctx.st.room().push(&ctx.tenant, task.id, &p.id).await?;
    c.map(|c| shape(&c)).ok_or_else(|| A2aError::new(Kind::TaskNotFound, "push notification config not found"))
}

pub async fn delete(ctx: &Ctx, p: Value) -> Result<Value, A2aError> {
    let p: Named = params("DeleteTaskPushNotificationConfig", p)?;
    let task = ops::task_of(ctx, &p.task_id).await?;
    // Idempotent: a config already gone is deleted.
    ctx.st.room().delete_push(&ctx.tenant, task.id, &p.id).await?;
    Ok(json!({}))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListParams {
    task_id: String,
    #[serde(default)]
    page_size: Option<i64>,
    #[serde(default)]
    page_token: Option<String>,
}

pub async fn list(ctx: &Ctx, p: Value) -> Result<Value, A2aError> {
    let p: ListParams = params("ListTaskPushNotificationConfigs", p)?;
    // 0 is how protobuf's JSON writes an unset number: the default.
    let size = p.page_size.filter(|n| *n != 0).unwrap_or(50);
    if !(1..=100).contains(&size) {
        return Err(bad("pageSize", "must be between 1 and 100"));
    }
    let task = ops::task_of(ctx, &p.task_id).await?;
    let after = p.page_token.unwrap_or_default();
    let mut configs = ctx.st.room().pushes(&ctx.tenant, task.id, &after, size + 1).await?;
    let next = if configs.len() as i64 > size {
        configs.truncate(size as usize);
        configs.last().map(|c| c.id.clone()).unwrap_or_default()
    } else {
        String::new()
    };
    Ok(json!({"configs": configs.iter().map(shape).collect::<Vec<_>>(), "nextPageToken": next}))
}
