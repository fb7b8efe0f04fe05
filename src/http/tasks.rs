//! `/tasks`: submit, read, list, wait, cancel.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::agents::{self, Resolved};
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery, TaskId};
use super::tools::{self, InlineTool, ToolInput};
use super::{AppState, Tenant};
use crate::engine::agents::AgentType;
use crate::engine::spec::{self, TaskOptions};
use crate::jobs::worker::{Slot, Worker};
use crate::llm::{ModelRef, ResolveError};
use crate::store::tasks::{self, Inserted, ListFilter, NewTask, TaskRow};
use crate::store::tenants::{self, Limits};
pub use crate::view::TaskView;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/tasks", post(create).get(list))
        .route("/tasks/{id}", get(read))
        .route("/tasks/{id}/cancel", post(cancel))
        .route("/tasks/cancel", post(cancel_bulk))
}

const MAX_PROMPT_CHARS: usize = 200_000;
const MAX_DESCRIPTION_CHARS: usize = 80;
const MAX_METADATA_BYTES: usize = 16 * 1024;
const MAX_IDEMPOTENCY_KEY: usize = 255;

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTask {
    prompt: String,
    #[serde(default)]
    subagent_type: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_turns: Option<i64>,
    #[serde(default)]
    system_prompt: Option<String>,
    #[serde(default)]
    parent_context: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
    /// A terminal task whose conversation this one continues.
    #[serde(default)]
    resume_from: Option<Uuid>,
    /// Wall-clock limit of the run (capped by SUBAGENTD_MAX_TASK_TIMEOUT_SECONDS).
    #[serde(default)]
    timeout_seconds: Option<f64>,
    /// Tools brought with the task (they win over catalog tools of the same name).
    #[serde(default)]
    tools: Option<Vec<InlineTool>>,
    /// Narrow the tools to these names.
    #[serde(default)]
    allowed_tools: Option<Vec<String>>,
    /// Spend limit of this task in USD (capped by the tenant's `max_task_cost_usd`).
    #[serde(default)]
    max_cost_usd: Option<f64>,
    /// Token limit (input + output) of this task (capped by the tenant's `max_task_tokens`).
    #[serde(default)]
    max_tokens: Option<i64>,
    /// Where to POST the task when it finishes (signed; same allow-list as tools).
    #[serde(default)]
    webhook_url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    #[serde(default)]
    wait: Option<bool>,
    #[serde(default)]
    timeout: Option<f64>,
}

impl WaitQuery {
    /// `None` when not waiting.
    fn wait_for(&self, st: &AppState) -> Result<Option<Duration>, ApiError> {
        if let Some(t) = self.timeout {
            if !t.is_finite() || t < 0.0 {
                return Err(ApiError::bad_param("timeout", "must be a number of seconds, 0 or more"));
            }
        }
        if self.wait != Some(true) {
            return Ok(None);
        }
        let secs = self.timeout.unwrap_or(st.cfg.wait_default_seconds as f64).min(st.cfg.wait_max_seconds as f64);
        Ok(Some(Duration::from_secs_f64(secs)))
    }
}

fn location(id: Uuid) -> HeaderValue {
    HeaderValue::from_str(&format!("/tasks/{id}")).unwrap_or_else(|_| HeaderValue::from_static("/tasks"))
}

fn respond(status: StatusCode, row: TaskRow) -> Response {
    let loc = location(row.id);
    let mut resp = (status, Json(TaskView::from(row))).into_response();
    if matches!(status, StatusCode::CREATED | StatusCode::ACCEPTED) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    resp
}

/// Refuse calls made from inside a sub-agent's tool: sub-agents are one level deep.
fn check_depth(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(v) = headers.get("subagent-depth") else {
        return Ok(());
    };
    let depth: u32 = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| ApiError::bad_param("Subagent-Depth", "must be a non-negative integer"))?;
    if depth >= 1 {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "recursion_refused",
            "Sub-agents cannot start sub-agents",
            format!(
                "this request comes from inside a sub-agent (Subagent-Depth: {depth}); sub-agents are one level deep"
            ),
        )
        .with(json!({"max_depth": 1})));
    }
    Ok(())
}

/// The model, explicitly: the request's, else the agent definition's, else the configured
/// default — never a silent fallback.
fn resolve_model(st: &AppState, requested: Option<&str>, from_definition: Option<&str>) -> Result<ModelRef, ApiError> {
    let pick = |m: Option<&str>| m.map(str::trim).filter(|m| !m.is_empty()).map(str::to_string);
    let name = pick(requested)
        .or_else(|| pick(from_definition))
        .or_else(|| st.cfg.default_model.clone())
        .or_else(|| st.providers.default_model.clone());
    let Some(name) = name else {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "model_required",
            "No model given",
            "name a model as `provider/model` (or an alias) in `model`, in the agent definition, or configure \
             SUBAGENTD_DEFAULT_MODEL; there is no silent fallback",
        ));
    };
    let providers = st.providers.names();
    st.providers.resolve(&name).map_err(|e| {
        let why = match e {
            ResolveError::Malformed(m) => format!("model: {m:?} is neither provider/model nor a configured alias"),
            ResolveError::UnknownProvider { provider, model } => {
                format!(
                    "model: {model:?} needs provider {provider:?}, which is not configured (configured: {})",
                    providers.join(", ")
                )
            }
        };
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "unknown_model", "Unknown model", why)
            .with(json!({"errors": [{"field": "model", "message": "unknown model"}], "providers": providers}))
    })
}

async fn validate(
    st: &AppState,
    tenant: &str,
    limits: &Limits,
    body: &CreateTask,
    idem: Option<String>,
    traceparent: Option<String>,
) -> Result<NewTask, ApiError> {
    if let Some(u) = &body.webhook_url {
        st.tool_caller.allow.check_url(u).map_err(|e| ApiError::invalid("webhook_url", e.0))?;
    }
    let prompt = body.prompt.trim();
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt", "must not be empty"));
    }
    // PostgreSQL text cannot hold NUL characters.
    let texts = [
        ("prompt", Some(&body.prompt)),
        ("description", body.description.as_ref()),
        ("system_prompt", body.system_prompt.as_ref()),
        ("parent_context", body.parent_context.as_ref()),
    ];
    for (field, v) in texts {
        if v.is_some_and(|v| v.contains('\0')) {
            return Err(ApiError::invalid(field, "must not contain NUL characters"));
        }
    }
    if body.metadata.as_ref().is_some_and(|m| m.to_string().contains("\\u0000")) {
        return Err(ApiError::invalid("metadata", "must not contain NUL characters"));
    }
    if body.prompt.chars().count() > MAX_PROMPT_CHARS {
        return Err(ApiError::invalid("prompt", format!("must be at most {MAX_PROMPT_CHARS} characters")));
    }
    if let Some(d) = &body.description {
        if d.chars().count() > MAX_DESCRIPTION_CHARS {
            return Err(ApiError::invalid(
                "description",
                format!("must be at most {MAX_DESCRIPTION_CHARS} characters"),
            ));
        }
    }
    let max_turns = match body.max_turns {
        Some(n) if n < 1 => {
            return Err(ApiError::invalid("max_turns", "must be at least 1 (values above 50 are clamped to 50)"))
        }
        Some(n) => Some(n.min(u32::MAX as i64) as u32),
        None => None,
    };
    if body.system_prompt.as_deref().is_some_and(|s| s.trim().is_empty()) {
        return Err(ApiError::invalid("system_prompt", "must not be empty when given"));
    }
    let metadata = match &body.metadata {
        None | Some(Value::Null) => json!({}),
        Some(m @ Value::Object(_)) => {
            if m.to_string().len() > MAX_METADATA_BYTES {
                return Err(ApiError::invalid(
                    "metadata",
                    format!("must be at most {MAX_METADATA_BYTES} bytes of JSON"),
                ));
            }
            m.clone()
        }
        Some(_) => return Err(ApiError::invalid("metadata", "must be a JSON object")),
    };
    // A resumed task continues its parent: same agent and model unless the request says otherwise.
    let parent = match body.resume_from {
        Some(pid) => {
            let p = tasks::get(&st.pool, tenant, pid)
                .await?
                .ok_or_else(|| ApiError::invalid("resume_from", format!("no task {pid} to resume")))?;
            if !p.is_terminal() {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "task_not_terminal",
                    "Task still running",
                    format!("resume_from: task {pid} is {}; only a finished task can be resumed", p.status),
                ));
            }
            if p.turns == 0 {
                return Err(ApiError::invalid(
                    "resume_from",
                    format!("task {pid} never ran, so it has no conversation to resume"),
                ));
            }
            Some(p)
        }
        None => None,
    };
    let parent_opts: Option<TaskOptions> = parent.as_ref().and_then(|p| serde_json::from_value(p.options.clone()).ok());
    let type_name = body
        .subagent_type
        .clone()
        .or_else(|| parent.as_ref().map(|p| p.subagent_type.clone()))
        .unwrap_or_else(|| "general".into());
    let (agent, definition) = match (&parent_opts, &body.subagent_type) {
        // A resumed custom agent keeps the definition snapshot its parent ran with.
        (Some(TaskOptions { agent: Some(d), .. }), None) => (AgentType::General, Some(d.clone())),
        _ => match agents::resolve(st, tenant, &type_name).await? {
            Resolved::Builtin(t) => (t, None),
            // Custom agents run with general's tool policy and their own prompt and lists.
            Resolved::Custom(d) => (AgentType::General, Some(d)),
        },
    };
    let parent_model = if body.model.is_none() { parent.as_ref().map(|p| p.model.clone()) } else { None };
    let model = resolve_model(
        st,
        body.model.as_deref().or(parent_model.as_deref()),
        definition.as_ref().and_then(|d| d.model.as_deref()),
    )?;
    let turns = max_turns.or(definition.as_ref().and_then(|d| d.max_turns));
    let turns = match (turns, limits.max_task_turns) {
        (t, Some(cap)) => Some(t.unwrap_or(agent.default_max_turns()).min(cap.max(1) as u32)),
        (t, None) => t,
    };
    let mut cap = st.cfg.max_task_timeout_seconds as f64;
    if let Some(t) = limits.max_task_timeout_seconds {
        cap = cap.min(f64::from(t.max(1)));
    }
    let max_cost_usd = match body.max_cost_usd {
        Some(v) if !v.is_finite() || !(0.0..1e9).contains(&v) => {
            return Err(ApiError::invalid("max_cost_usd", "must be a number from 0 to 1e9"))
        }
        Some(v) => {
            let d = Decimal::try_from(v).map_err(|_| ApiError::invalid("max_cost_usd", "is out of range"))?;
            Some(limits.max_task_cost_usd.map_or(d, |cap| d.min(cap)))
        }
        None => limits.max_task_cost_usd,
    };
    let max_tokens = match body.max_tokens {
        Some(v) if v < 1 => return Err(ApiError::invalid("max_tokens", "must be at least 1")),
        Some(v) => Some(limits.max_task_tokens.map_or(v, |cap| v.min(cap))),
        None => limits.max_task_tokens,
    };
    let timeout_seconds = match body.timeout_seconds {
        Some(t) if !t.is_finite() || t <= 0.0 => {
            return Err(ApiError::invalid("timeout_seconds", "must be a positive number of seconds"))
        }
        Some(t) => t.min(cap),
        None => cap,
    };
    // The whitelist: catalog and MCP tools, then inline ones, through the filter chain.
    let mut available = tools::available(st, tenant).await?;
    for (i, t) in body.tools.iter().flatten().enumerate() {
        let input = ToolInput {
            description: t.description.clone(),
            parameters: t.parameters.clone(),
            policy: t.policy,
            endpoint: t.endpoint.clone(),
            timeout_ms: t.timeout_ms,
        };
        let def = tools::to_def(st, &format!("tools[{i}]."), &t.name, &input)?;
        available.retain(|a| a.name != def.name);
        available.push(def);
    }
    if let Some(allowed) = &body.allowed_tools {
        if let Some(unknown) = allowed.iter().find(|n| !available.iter().any(|a| &a.name == *n)) {
            let names: Vec<&str> = available.iter().map(|a| a.name.as_str()).collect();
            return Err(ApiError::invalid(
                "allowed_tools",
                format!(
                    "{unknown:?} is not a tool of yours; available: {}",
                    if names.is_empty() { "none".into() } else { names.join(", ") }
                ),
            ));
        }
    }
    let offered =
        crate::tools::offered(available, agent.read_only(), definition.as_ref(), body.allowed_tools.as_deref());
    let options = TaskOptions {
        max_turns: spec::max_turns(agent, turns),
        system_prompt: body.system_prompt.clone(),
        parent_context: body.parent_context.clone(),
        agent: definition,
        resume_from: body.resume_from,
        timeout_seconds: Some(timeout_seconds),
        tools: offered,
    };
    let options = serde_json::to_value(&options).map_err(|_| ApiError::internal())?;
    // The same key must come with the same request: hash what was asked, as resolved.
    let request_hash = idem.as_ref().map(|_| {
        let canonical = json!([type_name, body.description, prompt, model.full(), options, metadata]);
        hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
    });
    Ok(NewTask {
        id: Uuid::now_v7(),
        tenant: tenant.to_string(),
        subagent_type: if AgentType::parse(&type_name).is_some() { agent.as_str().to_string() } else { type_name },
        description: body.description.clone(),
        prompt: body.prompt.clone(),
        model: model.full(),
        options,
        metadata,
        idempotency_key: idem,
        request_hash,
        parent_task_id: body.resume_from,
        max_cost_usd,
        max_tokens,
        traceparent,
        webhook_url: body.webhook_url.clone(),
        start: None,
    })
}

/// The tenant's limits with the configured defaults filled in (cached for a few seconds; the
/// row is created on first sight).
async fn effective_limits(st: &AppState, tenant: &str) -> Result<Limits, ApiError> {
    if let Some(l) = st.limits_cache.get(tenant) {
        return Ok(l);
    }
    let mut conn = st.pool.acquire().await.map_err(crate::store::StoreError::from)?;
    let found = tenants::limits(&mut conn, tenant, false).await?;
    // Back to the pool before `ensure` takes one: holding one connection while waiting for
    // another deadlocks the pool when a burst of first requests for a new tenant fills it.
    drop(conn);
    let own = match found {
        Some(l) => l,
        None => {
            tenants::ensure(&st.pool, tenant).await?;
            Limits::default()
        }
    };
    let c = &st.cfg;
    let l = Limits {
        usd_per_day: own.usd_per_day.or(c.default_usd_per_day),
        usd_per_month: own.usd_per_month.or(c.default_usd_per_month),
        tokens_per_day: own.tokens_per_day.or(c.default_tokens_per_day),
        max_running: own.max_running.or(c.default_max_running),
        max_queued: own.max_queued.or(c.default_max_queued),
        ..own
    };
    st.limits_cache.put(tenant, l.clone());
    Ok(l)
}

fn over(code: &'static str, status: StatusCode, limit: &str, value: Value, current: Value, detail: String) -> ApiError {
    metrics::counter!("subagentd_budget_refusals_total", "limit" => limit.to_string(), "stage" => "admission")
        .increment(1);
    let mut e = ApiError::new(
        status,
        code,
        if status == StatusCode::PAYMENT_REQUIRED { "Budget exhausted" } else { "Limit reached" },
        detail,
    )
    .with(json!({"limit": limit, "value": value, "current": current}));
    if status == StatusCode::TOO_MANY_REQUESTS {
        e = e.header(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    e
}

/// Insert the task, unless a queue or spend limit refuses it (429 / 402, nothing written).
/// With such limits, the tenant row is locked so that concurrent submissions cannot both
/// take the last place. A task that starts here (`new.start`) has its first provider call
/// reserved in the same commit; that reservation's event is returned for the run.
async fn admit(st: &AppState, limits: &Limits, new: &NewTask) -> Result<(Inserted, Option<Value>), ApiError> {
    let guarded = limits.max_queued.is_some()
        || limits.usd_per_day.is_some()
        || limits.usd_per_month.is_some()
        || limits.tokens_per_day.is_some();
    let first = new.start.as_ref().and_then(|s| s.first_call.as_ref());
    if !guarded {
        // One statement, which also writes the first call's reservation when it can.
        let mut conn = st.pool.acquire().await.map_err(crate::store::StoreError::from)?;
        let r = tasks::insert(&mut conn, new).await?;
        let reserved = matches!(r, Inserted::New(_, true)).then(|| first.map(|f| f.started.clone())).flatten();
        return Ok((r, reserved));
    }
    let mut tx = st.pool.begin().await.map_err(crate::store::StoreError::from)?;
    admission_checks(&mut tx, limits, &new.tenant).await?;
    let r = tasks::insert(&mut tx, new).await?;
    // With a spend budget, the reservation is checked against it in the same transaction.
    let reserved = match (&r, first) {
        (Inserted::New(_, true), Some(f)) => Some(f.started.clone()),
        (Inserted::New(TaskRow { id, lease_token: Some(lease), .. }, false), Some(f)) => {
            let fence = crate::store::runs::Fence { id: *id, lease: *lease };
            let refused =
                crate::store::runs::reserve(&mut *tx, fence, f.usd, f.tokens, f.defaults, Some(&f.started)).await?;
            refused.is_none().then(|| f.started.clone())
        }
        _ => None,
    };
    tx.commit().await.map_err(crate::store::StoreError::from)?;
    Ok((r, reserved))
}

/// The queue and spend limits, checked with the tenant's row locked (in `conn`'s transaction).
async fn admission_checks(conn: &mut sqlx::PgConnection, limits: &Limits, tenant: &str) -> Result<(), ApiError> {
    tenants::limits(&mut *conn, tenant, true).await?;
    let used = tenants::usage_now(&mut *conn, tenant).await?;
    if let Some(max) = limits.max_queued {
        if used.queued >= i64::from(max) {
            return Err(over(
                "queue_limit_reached",
                StatusCode::TOO_MANY_REQUESTS,
                "max_queued",
                json!(max),
                json!(used.queued),
                format!("{} tasks are queued; the limit is {max}: retry when some have started", used.queued),
            ));
        }
    }
    let spend = [
        ("usd_per_day", limits.usd_per_day, used.usd_today + used.reserved_usd),
        ("usd_per_month", limits.usd_per_month, used.usd_this_month + used.reserved_usd),
    ];
    for (name, limit, current) in spend {
        if let Some(limit) = limit {
            if current >= limit {
                return Err(over(
                    "budget_exhausted",
                    StatusCode::PAYMENT_REQUIRED,
                    name,
                    json!(limit),
                    json!(current.normalize()),
                    format!("{name}: {} USD used (including calls in flight) of {limit}", current.normalize()),
                ));
            }
        }
    }
    if let Some(limit) = limits.tokens_per_day {
        let current = used.tokens_today + used.reserved_tokens;
        if current >= limit {
            return Err(over(
                "budget_exhausted",
                StatusCode::PAYMENT_REQUIRED,
                "tokens_per_day",
                json!(limit),
                json!(current),
                format!("tokens_per_day: {current} tokens used (including calls in flight) of {limit}"),
            ));
        }
    }
    Ok(())
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let k = v.to_str().map_err(|_| ApiError::bad_param("Idempotency-Key", "must be visible ASCII"))?.trim();
    if k.is_empty() || k.len() > MAX_IDEMPOTENCY_KEY {
        return Err(ApiError::bad_param("Idempotency-Key", format!("must be 1 to {MAX_IDEMPOTENCY_KEY} characters")));
    }
    Ok(Some(k.to_string()))
}

async fn create(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(q): ApiQuery<WaitQuery>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateTask>,
) -> Result<Response, ApiError> {
    check_depth(&headers)?;
    let wait = q.wait_for(&st)?;
    let idem = idempotency_key(&headers)?;
    let limits = effective_limits(&st, &tenant).await?;
    // W3C: an invalid traceparent is ignored, not an error.
    let traceparent =
        headers.get("traceparent").and_then(|v| v.to_str().ok()).and_then(crate::telemetry::parse_traceparent);
    let mut new = validate(&st, &tenant, &limits, &body, idem, traceparent).await?;
    // A repeated request is answered before the limits are checked: it adds nothing.
    if let Some(key) = &new.idempotency_key {
        if let Some(r) = tasks::by_idempotency_key(&st.pool, &tenant, key).await? {
            if r.request_hash != new.request_hash {
                return Err(idempotency_conflict(&r));
            }
            return match wait {
                None => Ok(respond(StatusCode::OK, r)),
                Some(d) => waited(&st, &tenant, r, d).await,
            };
        }
    }
    // Registered before the insert: the inserted row then needs no second read before waiting.
    let early = wait.map(|_| st.hub.waiter(new.id));
    // A waiting request's task starts in this process when it has room, skipping the queue's
    // claim round trip (not for tenants with a running limit: only the claim keeps it exact).
    let slot = match (&wait, &st.worker) {
        (Some(_), Some(w)) if limits.max_running.is_none() => w.take_slot().map(|s| (s, w.clone())),
        _ => None,
    };
    let inserted = match slot {
        Some((slot, w)) => {
            new.start = Some(tasks::StartHere { first_call: w.first_call(&new), ..slot.start.clone() });
            // In a task of its own: a client hanging up during the insert must not leave the task
            // committed as running with no run behind it.
            let (st2, limits2) = (st.clone(), limits.clone());
            let (r, back) = tokio::spawn(async move {
                let r = admit_and_start(&st2, &limits2, &new, &w, slot).await;
                (r, new)
            })
            .await
            .map_err(|_| ApiError::internal())?;
            new = back;
            r?
        }
        None => {
            let (inserted, _) = admit(&st, &limits, &new).await?;
            if matches!(inserted, Inserted::New(..)) {
                st.hub.publish(crate::store::CH_QUEUED, String::new());
            }
            inserted
        }
    };
    let (row, created) = match inserted {
        Inserted::New(r, _) => (r, true),
        Inserted::Existing(r) => {
            if r.request_hash != new.request_hash {
                return Err(idempotency_conflict(&r));
            }
            (r, false)
        }
    };
    let ok = if created { StatusCode::CREATED } else { StatusCode::OK };
    match (wait, early) {
        (None, _) => Ok(respond(ok, row)),
        (Some(d), Some(waiter)) if created => wait_on(&st, &tenant, row, d, waiter).await,
        (Some(d), _) => waited(&st, &tenant, row, d).await,
    }
}

/// Insert a task to start in this process (`slot`, taken from `w`) and start its run. If the
/// insert fails on the server's side, the commit may still have happened: the task is then given
/// back to the queue (a no-op if it was not written).
async fn admit_and_start(
    st: &AppState,
    limits: &Limits,
    new: &NewTask,
    w: &Arc<Worker>,
    slot: Slot,
) -> Result<Inserted, ApiError> {
    match admit(st, limits, new).await {
        Ok((Inserted::New(r, reserved_with_it), reserved)) => {
            st.hub.publish(crate::store::CH_EVENT, r.id.to_string());
            w.start(r.clone(), slot, reserved);
            Ok(Inserted::New(r, reserved_with_it))
        }
        Ok((existing, _)) => Ok(existing),
        Err(e) => {
            if e.status.is_server_error() {
                w.abandon(new.id, slot);
            }
            Err(e)
        }
    }
}

fn idempotency_conflict(r: &TaskRow) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "idempotency_conflict",
        "Idempotency key reused",
        "this Idempotency-Key was used with a different request",
    )
    .with(json!({"task_id": r.id}))
}

/// Wait for a task to become terminal: 200 with the finished task, or 202 with the task as
/// it stands (and `Location`) when the wait runs out or the server drains.
async fn waited(st: &AppState, tenant: &str, row: TaskRow, d: Duration) -> Result<Response, ApiError> {
    if row.is_terminal() {
        return Ok(respond(StatusCode::OK, row));
    }
    let waiter = st.hub.waiter(row.id);
    // Read again: the task may have finished before the waiter was registered.
    let row = tasks::get(&st.pool, tenant, row.id).await?.ok_or_else(|| ApiError::not_found("task"))?;
    wait_on(st, tenant, row, d, waiter).await
}

/// `waited`, for a `row` read after `waiter` was registered (so no completion is missed).
async fn wait_on(
    st: &AppState,
    tenant: &str,
    mut row: TaskRow,
    d: Duration,
    waiter: crate::jobs::hub::Waiter<'_>,
) -> Result<Response, ApiError> {
    let deadline = tokio::time::Instant::now() + d;
    loop {
        if row.is_terminal() {
            return Ok(respond(StatusCode::OK, row));
        }
        if tokio::time::Instant::now() >= deadline || st.shutdown.is_cancelled() {
            return Ok(respond(StatusCode::ACCEPTED, row));
        }
        let handed = tokio::select! {
            r = waiter.notified() => r,
            _ = tokio::time::sleep_until(deadline) => None,
            _ = st.shutdown.cancelled() => None,
            // A notification lost with a dropped connection costs at most this long.
            _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => None,
        };
        // Finished in this process: the row as its final commit wrote it, with no second read.
        row = match handed.filter(|r| r.tenant == tenant) {
            Some(r) => r,
            None => tasks::get(&st.pool, tenant, row.id).await?.ok_or_else(|| ApiError::not_found("task"))?,
        };
    }
}

async fn read(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    TaskId(id): TaskId,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> Result<Response, ApiError> {
    let wait = q.wait_for(&st)?;
    let row = tasks::get(&st.pool, &tenant, id).await?.ok_or_else(|| ApiError::not_found("task"))?;
    match wait {
        None => Ok(respond(StatusCode::OK, row)),
        Some(d) => waited(&st, &tenant, row, d).await,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    subagent_type: Option<String>,
    #[serde(default)]
    created_after: Option<String>,
    #[serde(default)]
    created_before: Option<String>,
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    cursor: Option<String>,
}

const STATUSES: &[&str] = &["queued", "running", "completed", "incomplete", "failed", "cancelled"];

fn time_param(field: &str, v: &Option<String>) -> Result<Option<DateTime<Utc>>, ApiError> {
    v.as_deref()
        .map(|s| {
            DateTime::parse_from_rfc3339(s)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|_| ApiError::bad_param(field, format!("{s:?} is not an RFC 3339 timestamp")))
        })
        .transpose()
}

async fn list(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Response, ApiError> {
    if let Some(s) = &q.status {
        if !STATUSES.contains(&s.as_str()) {
            return Err(ApiError::bad_param("status", format!("{s:?} is not one of {}", STATUSES.join(", "))));
        }
    }
    let subagent_type = q.subagent_type.as_deref().map(|t| match AgentType::parse(t) {
        Some(b) => b.as_str().to_string(),
        None => t.to_string(),
    });
    let limit = q.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(ApiError::bad_param("limit", "must be between 1 and 200"));
    }
    let before_id = q
        .cursor
        .as_deref()
        .map(|c| c.parse::<Uuid>().map_err(|_| ApiError::bad_param("cursor", "not a cursor returned by this API")))
        .transpose()?;
    let f = ListFilter {
        status: q.status.clone(),
        subagent_type,
        created_after: time_param("created_after", &q.created_after)?,
        created_before: time_param("created_before", &q.created_before)?,
        before_id,
        limit: limit + 1,
    };
    let mut rows = tasks::list(&st.pool, &tenant, &f).await?;
    let next_cursor = if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        rows.last().map(|r| r.id.to_string())
    } else {
        None
    };
    let tasks: Vec<TaskView> = rows.into_iter().map(TaskView::from).collect();
    Ok(Json(json!({"tasks": tasks, "next_cursor": next_cursor})).into_response())
}

async fn cancel(State(st): State<AppState>, Tenant(tenant): Tenant, TaskId(id): TaskId) -> Result<Response, ApiError> {
    let row = tasks::cancel(&st.pool, &tenant, id).await?.ok_or_else(|| ApiError::not_found("task"))?;
    // A running task is told through NOTIFY; if its worker is in this process, tell it now.
    if row.status == "running" {
        st.hub.cancel_run(id);
    }
    Ok(respond(StatusCode::OK, row))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkCancel {
    /// `queued`, `running`, or both (the default).
    #[serde(default)]
    status: Option<Vec<String>>,
    /// Only tasks whose metadata contains this object.
    #[serde(default)]
    metadata: Option<Value>,
}

/// Cancel every task of the caller matching a filter.
async fn cancel_bulk(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiJson(body): ApiJson<BulkCancel>,
) -> Result<Response, ApiError> {
    let statuses = body.status.unwrap_or_else(|| vec!["queued".into(), "running".into()]);
    if statuses.is_empty() || statuses.iter().any(|s| s != "queued" && s != "running") {
        return Err(ApiError::invalid(
            "status",
            "must list `queued` and/or `running` (terminal tasks cannot be cancelled)",
        ));
    }
    if body.metadata.as_ref().is_some_and(|m| !m.is_object()) {
        return Err(ApiError::invalid("metadata", "must be a JSON object"));
    }
    let f = tasks::CancelFilter { id: None, statuses, metadata: body.metadata };
    let hit = tasks::cancel_matching(&st.pool, &tenant, &f).await?;
    let mut cancelled = vec![];
    let mut requested = vec![];
    for (id, old) in hit {
        if old == "running" {
            st.hub.cancel_run(id);
            requested.push(id);
        } else {
            cancelled.push(id);
        }
    }
    Ok(Json(json!({"cancelled": cancelled, "cancel_requested": requested})).into_response())
}
