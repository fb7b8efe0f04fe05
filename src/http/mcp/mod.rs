//! The MCP door: the service as an MCP server over Streamable HTTP at `/mcp` (protocol
//! 2025-11-25, and 2025-06-18 for older clients). Any MCP client delegates work to a sub-agent
//! with the `task` tool (the seeds' tool: `subagent_type`, `description`, `prompt`) and gets one
//! summary back; `task_get`, `task_wait` and `task_cancel` follow a long run, and MCP tasks
//! (2025-11-25) run a call in the background.
//!
//! Written on the lifecycle room, like every door: each call is one room operation, so the
//! rules hold here as at the REST door (tenants, the depth rule, the model rule, budgets,
//! idempotency, holds). Sessions live in PostgreSQL (`store::mcp`), so any replica serves any
//! request of one; a JSON-RPC request's task is found by its idempotency key
//! (`mcp:<session>:<request id>`), so a retry of the same request starts no second task and a
//! `notifications/cancelled` reaches the task from any replica; an elicitation's id is its
//! pending action's (`elicit:<action id>`), so whichever replica receives the answer stores it.
//!
//! The official Rust SDK (`rmcp`) serves a session from one process's memory, and its task
//! types are the later extension's, not the 2025-11-25 tasks the reference clients speak: this
//! door writes the few JSON-RPC messages it needs itself. It offers no standalone stream
//! (`GET /mcp` is 405): every answer, and every message about a request, comes on that
//! request's own stream.

mod calls;
mod tasks;
mod tools;

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::auth::key_prefix;
use super::error::ApiError;
use super::extract::ApiBytes;
pub(crate) use super::jsonrpc as rpc;
use super::{AppState, Tenant};
use crate::kinds::Answerer;
use crate::resources::sessions::{McpFound, McpSession};
use crate::tasks::Scope;
use rpc::{Incoming, RpcError};

pub const V_2025_11_25: &str = "2025-11-25";
pub const V_2025_06_18: &str = "2025-06-18";
const SUPPORTED: [&str; 2] = [V_2025_11_25, V_2025_06_18];

pub fn router(st: AppState) -> Router<AppState> {
    Router::new()
        .route("/mcp", post(message).delete(end_session))
        .route_layer(axum::middleware::from_fn_with_state(st, check_origin))
}

/// An `Origin` other than the service's own is refused (a browser page elsewhere must not
/// reach a local server); a request without one (any non-browser client) passes.
async fn check_origin(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let own = origin
            .to_str()
            .is_ok_and(|o| super::origin::is_own(o, req.headers(), st.room().config().public_url.as_deref()));
        if !own {
            let e = RpcError::new(rpc::INVALID_REQUEST, "forbidden: this Origin is not the service's own");
            return http_error(StatusCode::FORBIDDEN, &e);
        }
    }
    next.run(req).await
}

/// A JSON-RPC error as the body of an HTTP error.
fn http_error(status: StatusCode, e: &RpcError) -> Response {
    let mut r = (status, rpc::error(None, e).to_string()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn json_reply(v: &Value) -> Response {
    let mut r = (StatusCode::OK, v.to_string()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A request's place: who asks, in which session, at which protocol version.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub st: AppState,
    pub tenant: String,
    pub session: McpSession,
    pub version: &'static str,
    /// `Subagent-Depth` as sent.
    pub depth: Option<String>,
    pub key_prefix: Option<String>,
    pub traceparent: Option<String>,
}

impl Ctx {
    pub fn scope(&self) -> Scope {
        Scope::Tenant(self.tenant.clone())
    }

    /// The request comes from inside a sub-agent (the service's own MCP client sends depth 1).
    pub fn nested(&self) -> bool {
        crate::tasks::refused_by_depth(self.depth.as_deref())
    }

    /// The client can be asked for input (`elicitation/create`, form mode).
    pub fn elicits(&self) -> bool {
        self.session.client_capabilities.get("elicitation").is_some_and(|e| e.is_object())
    }

    pub fn tasks_supported(&self) -> bool {
        self.version == V_2025_11_25
    }

    /// The idempotency key of the task a request of this session starts.
    pub fn key_of(&self, request: &Value) -> String {
        format!("mcp:{}:{}", self.session.id, request)
    }

    pub fn answerer(&self) -> Answerer {
        Answerer::of(&self.scope(), self.key_prefix.clone())
    }
}

/// What a request is answered with.
pub(crate) enum Reply {
    Json(Value),
    /// Messages for the client before the response (progress, elicitation), then the response.
    Stream(mpsc::Receiver<Value>),
    /// Refused before any answer: an HTTP error, as the REST door gives it (a stream beyond the
    /// tenant's `max_streams`: 429 with `Retry-After`).
    Refused(crate::tasks::TaskError),
}

async fn message(
    State(st): State<AppState>,
    tenant: Result<Tenant, ApiError>,
    headers: HeaderMap,
    body: Result<ApiBytes, ApiError>,
) -> Response {
    let Tenant(tenant) = match tenant {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let bytes = match body {
        Ok(ApiBytes(b)) => b,
        Err(e) if e.status == StatusCode::PAYLOAD_TOO_LARGE => {
            let max = st.room().config().max_body_bytes;
            let e = RpcError::new(rpc::INVALID_REQUEST, format!("request body too large: at most {max} bytes"));
            return http_error(StatusCode::PAYLOAD_TOO_LARGE, &e);
        }
        Err(e) => return e.into_response(),
    };
    let asked = match headers.get("mcp-protocol-version").map(|v| v.to_str().unwrap_or("")) {
        Some(v) => match SUPPORTED.iter().find(|s| **s == v) {
            Some(s) => Some(*s),
            None => {
                let e = RpcError::new(rpc::INVALID_REQUEST, format!("unsupported MCP-Protocol-Version {v:?}"))
                    .with(json!({"supported": SUPPORTED}));
                return http_error(StatusCode::BAD_REQUEST, &e);
            }
        },
        None => None,
    };
    let msg = match rpc::parse(&bytes) {
        Ok(m) => m,
        Err(e) => return http_error(StatusCode::BAD_REQUEST, &e),
    };
    // U+0000 cannot be stored (a session's capabilities, a task's arguments): refused, named.
    if let Incoming::Request { id, params, .. } = &msg {
        if let Some(at) = super::extract::nul_in(params, String::new()) {
            let e = RpcError::params(format!("{at}: holds U+0000 (NUL), which cannot be stored"));
            return json_reply(&rpc::error(Some(id), &e));
        }
    }
    if let Incoming::Request { id, method, params } = &msg {
        if method == "initialize" {
            return initialize(&st, &tenant, id, params).await;
        }
    }
    let Some(sid) = headers.get("mcp-session-id").and_then(|v| v.to_str().ok()) else {
        let e = RpcError::new(rpc::INVALID_REQUEST, "no Mcp-Session-Id: send `initialize` first");
        return http_error(StatusCode::BAD_REQUEST, &e);
    };
    let session = match session(&st, &tenant, sid, asked).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            let e = RpcError::new(-32001, "session not found: initialize a new one");
            return http_error(StatusCode::NOT_FOUND, &e);
        }
        Err(e) => return e.into_response(),
    };
    let version = asked.or_else(|| SUPPORTED.iter().find(|s| **s == session.protocol_version).copied());
    let ctx = Ctx {
        st,
        tenant,
        session,
        version: version.unwrap_or(V_2025_06_18),
        depth: headers.get("subagent-depth").and_then(|v| v.to_str().ok()).map(str::to_string),
        key_prefix: key_prefix(&headers),
        traceparent: headers.get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_string),
    };
    match msg {
        Incoming::Notification { method, params } => {
            notified(&ctx, &method, &params).await;
            StatusCode::ACCEPTED.into_response()
        }
        Incoming::Response { id, result, error } => {
            calls::answered(&ctx, &id, result, error).await;
            StatusCode::ACCEPTED.into_response()
        }
        Incoming::Request { id, method, params } => match request(ctx, &id, &method, params).await {
            Ok(Reply::Json(v)) => json_reply(&rpc::result(&id, v)),
            Ok(Reply::Stream(rx)) => stream(rx),
            Ok(Reply::Refused(e)) => ApiError::from(e).into_response(),
            Err(e) => json_reply(&rpc::error(Some(&id), &e)),
        },
    }
}

/// An answer sent as Server-Sent Events: what the producer sends, in order, then the end.
fn stream(rx: mpsc::Receiver<Value>) -> Response {
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        let v = rx.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(Event::default().event("message").data(v.to_string())), rx))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

async fn request(ctx: Ctx, id: &Value, method: &str, params: Value) -> Result<Reply, RpcError> {
    match method {
        "ping" => Ok(Reply::Json(json!({}))),
        "tools/list" => tools::list(&ctx).await.map(Reply::Json),
        "tools/call" => calls::call(ctx, id.clone(), params).await,
        "tasks/get" | "tasks/result" | "tasks/list" | "tasks/cancel" if ctx.tasks_supported() => {
            tasks::handle(ctx, id.clone(), method, params).await
        }
        other => Err(RpcError::new(rpc::METHOD_NOT_FOUND, format!("method not found: {other}"))),
    }
}

async fn notified(ctx: &Ctx, method: &str, params: &Value) {
    if method != "notifications/cancelled" {
        return;
    }
    // A request the client gave up on: its task is cancelled, from whichever replica this is.
    let Some(request) = params.get("requestId") else { return };
    let key = ctx.key_of(request);
    if let Err(e) = ctx.st.room().cancel_by_key(&ctx.tenant, &key).await {
        tracing::warn!(error = %e, "MCP cancel of a request's task failed");
    }
}

/// A session of `tenant`, cached a few seconds. One its client ended, or another tenant's, is not
/// found; an id the service does not know (purged after its idle days, or from before a
/// restore) is adopted as a fresh session with no client capabilities, at the version the
/// request names: Claude Code keeps its session id for the life of a terminal and does not
/// initialize again after a 404.
async fn session(st: &AppState, tenant: &str, id: &str, asked: Option<&str>) -> Result<Option<McpSession>, ApiError> {
    if let Some(s) = st.mcp_sessions.get(id).filter(|s| s.tenant == tenant) {
        return Ok(Some(s));
    }
    let s = match st.res.mcp_session(tenant, id).await? {
        McpFound::Live(s) => Some(s),
        McpFound::Gone => None,
        McpFound::Unknown if adoptable(id) => {
            let s = st.res.adopt_mcp_session(tenant, id, asked.unwrap_or(V_2025_11_25)).await?;
            if s.is_some() {
                tracing::info!(tenant, "adopted an MCP session the service no longer knew");
            }
            s
        }
        McpFound::Unknown => None,
    };
    if let Some(s) = &s {
        st.mcp_sessions.put(id, s.clone());
    }
    Ok(s)
}

/// An id as `initialize` makes them (48 hex digits): only such an id is adopted.
fn adoptable(id: &str) -> bool {
    id.len() == 48 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

async fn initialize(st: &AppState, tenant: &str, id: &Value, params: &Value) -> Response {
    let asked = params.get("protocolVersion").and_then(Value::as_str).unwrap_or("");
    // The client's version if it is one of ours, else our latest (the client decides then).
    let version = SUPPORTED.iter().find(|s| **s == asked).copied().unwrap_or(V_2025_11_25);
    let caps = params.get("capabilities").filter(|c| c.is_object()).cloned().unwrap_or_else(|| json!({}));
    let client = params.get("clientInfo").filter(|c| c.is_object()).cloned().unwrap_or_else(|| json!({}));
    let sid = {
        use rand::RngCore;
        let mut b = [0u8; 24];
        rand::thread_rng().fill_bytes(&mut b);
        hex::encode(b)
    };
    if let Err(e) = st.res.start_mcp_session(&sid, tenant, version, &caps, &client).await {
        return ApiError::from(e).into_response();
    }
    let mut capabilities = json!({"tools": {"listChanged": false}});
    if version == V_2025_11_25 {
        capabilities["tasks"] = json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}});
    }
    let result = json!({
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": {"name": "subagentd", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Delegate a self-contained piece of work to a sub-agent with the `task` tool: it runs with a \
            fresh conversation and its agent type's tools, and returns one summary. A call that runs longer than the \
            wait returns its task_id: follow it with task_wait, task_get or task_cancel.",
    });
    let mut r = json_reply(&rpc::result(id, result));
    if let Ok(v) = HeaderValue::from_str(&sid) {
        r.headers_mut().insert("mcp-session-id", v);
    }
    r
}

async fn end_session(State(st): State<AppState>, Tenant(tenant): Tenant, headers: HeaderMap) -> Response {
    let Some(sid) = headers.get("mcp-session-id").and_then(|v| v.to_str().ok()) else {
        let e = RpcError::new(rpc::INVALID_REQUEST, "no Mcp-Session-Id");
        return http_error(StatusCode::BAD_REQUEST, &e);
    };
    st.mcp_sessions.remove(sid);
    match st.res.end_mcp_session(&tenant, sid).await {
        Ok(Some(in_flight)) => {
            // The tasks of calls still held open go with the session; background ones run on.
            for key in in_flight {
                if let Err(e) = st.room().cancel_by_key(&tenant, &key).await {
                    tracing::warn!(error = %e, "cancelling an ended MCP session's task failed");
                }
            }
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(None) => http_error(StatusCode::NOT_FOUND, &RpcError::new(-32001, "session not found")),
        Err(e) => ApiError::from(e).into_response(),
    }
}
