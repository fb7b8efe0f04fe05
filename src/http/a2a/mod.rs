//! The A2A door: every agent type as a remote agent over the Agent2Agent protocol (1.0, and 0.3
//! over JSON-RPC for a request that names no version: `v03.rs` maps it onto the same methods).
//! JSON-RPC 2.0 at `POST /a2a` (SSE for the streaming methods) and the HTTP+JSON binding under
//! `/a2a/v1/`; each agent type is also an agent of its own at `/a2a/agents/{name}` (both
//! bindings below it, and its own card). The service's card is at
//! `/.well-known/agent-card.json`.
//!
//! Written on the lifecycle room, like every door: a method is one room operation (or two: a
//! message to a paused task answers it, then joins it), so the rules hold here as at the REST
//! door — tenants (another's task is not found), the depth rule, the model rule, budgets (an
//! admission refusal is a `TASK_STATE_REJECTED` task, not stored), rate limits (429), holds
//! (a blocking send is a wait, a stream a stream) and idempotency (a message's `messageId` is
//! its key: a retry starts no second task). The A2A shapes of a task are `crate::a2a`'s (the
//! webhook sender shapes push notifications with them); a task's context and its caller's
//! messages are `store::a2a`'s rows.
//!
//! The official Rust SDK (`a2a-lf`, `a2a-server-lf`) was read first and not taken: its server
//! brings its own axum stack and a protobuf build, keeps tasks in its own store, and its wire
//! details (error codes, the version header, the empty DELETE body) would need overriding; the
//! protocol's JSON is a few shapes, written here and in `crate::a2a` to the spec.

mod card;
mod errors;
mod ops;
mod push;
mod rest;
mod send;
mod stream;
mod v03;

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::auth::key_prefix;
use super::error::ApiError;
use super::extract::{ApiBytes, ApiPath};
use super::jsonrpc;
use super::{AppState, Tenant};
use crate::kinds::Answerer;
use crate::tasks::Scope;
use errors::{A2aError, Kind};

pub fn router(st: AppState) -> Router<AppState> {
    let door = Router::new()
        .route("/a2a", post(rpc))
        .route("/a2a/", post(rpc))
        .route("/a2a/agents/{name}", post(rpc))
        .route("/a2a/agents/{name}/", post(rpc))
        .route("/a2a/v1/message:send", post(rest::send))
        .route("/a2a/v1/message:stream", post(rest::stream))
        .route("/a2a/v1/tasks", get(rest::list))
        .route("/a2a/v1/tasks/{id}", get(rest::task_get).post(rest::task_post))
        .route("/a2a/v1/tasks/{id}/pushNotificationConfigs", get(rest::push_list).post(rest::push_create))
        .route("/a2a/v1/tasks/{id}/pushNotificationConfigs/{config}", get(rest::push_get).delete(rest::push_delete))
        .route("/a2a/v1/extendedAgentCard", get(rest::extended_card))
        // 0.3's authenticated extended card over HTTP+JSON (`GetAgentCard`): `{card url}/v1/card`,
        // and at the root, where 0.3's TCK asks it (it joins the absolute path to the host).
        .route("/a2a/v1/card", get(rest::extended_card))
        .route("/v1/card", get(rest::extended_card))
        .route("/a2a/agents/{name}/v1/message:send", post(rest::send))
        .route("/a2a/agents/{name}/v1/message:stream", post(rest::stream))
        .route("/a2a/agents/{name}/v1/tasks", get(rest::list))
        .route("/a2a/agents/{name}/v1/tasks/{id}", get(rest::task_get).post(rest::task_post))
        .route("/a2a/agents/{name}/v1/tasks/{id}/pushNotificationConfigs", get(rest::push_list).post(rest::push_create))
        .route(
            "/a2a/agents/{name}/v1/tasks/{id}/pushNotificationConfigs/{config}",
            get(rest::push_get).delete(rest::push_delete),
        )
        .route("/a2a/agents/{name}/v1/extendedAgentCard", get(rest::extended_card))
        .route("/a2a/agents/{name}/v1/card", get(rest::extended_card))
        .route_layer(axum::middleware::from_fn_with_state(st, check_origin));
    Router::new()
        .route("/.well-known/agent-card.json", get(card::shared))
        .route("/a2a/agents/{name}/.well-known/agent-card.json", get(card::of_agent))
        .merge(door)
}

/// An `Origin` other than the service's own is refused (a page elsewhere must not drive a
/// caller's browser against the door); a request without one (any non-browser client) passes.
async fn check_origin(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let own = origin
            .to_str()
            .is_ok_and(|o| super::origin::is_own(o, req.headers(), st.room().config().public_url.as_deref()));
        if !own {
            let mut e = A2aError::new(Kind::InvalidRequest, "forbidden: this Origin is not the service's own");
            e.transport = Some((StatusCode::FORBIDDEN, vec![]));
            return match req.uri().path().contains("/v1/") {
                true => e.rest_response(),
                false => e.rpc_response(None),
            };
        }
    }
    next.run(req).await
}

/// The protocol version a request is served in: 1.0, or 0.3 for a request that names none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    V03,
    V10,
}

/// A request's place: who asks, at which agent, from where.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub st: AppState,
    pub tenant: String,
    /// The agent type of a per-agent URL (`/a2a/agents/{name}`); `None` at the shared one.
    pub agent: Option<String>,
    /// The base URL clients reach the service at.
    pub base: String,
    /// `Subagent-Depth` as sent.
    pub depth: Option<String>,
    pub key_prefix: Option<String>,
    pub traceparent: Option<String>,
}

impl Ctx {
    pub fn scope(&self) -> Scope {
        Scope::Tenant(self.tenant.clone())
    }

    pub fn answerer(&self) -> Answerer {
        Answerer::of(&self.scope(), self.key_prefix.clone())
    }
}

/// An opened request: its context, body, path parameters and query.
type Opened = (Ctx, axum::body::Bytes, HashMap<String, String>, Vec<(String, String)>);

/// Everything a request to the door brings, its failures kept to be answered in the binding's
/// shape (the extractor itself never rejects).
pub(crate) struct Incoming {
    tenant: Result<Tenant, ApiError>,
    headers: HeaderMap,
    path: Result<HashMap<String, String>, ApiError>,
    query: Vec<(String, String)>,
    body: Result<axum::body::Bytes, ApiError>,
}

impl FromRequest<AppState> for Incoming {
    type Rejection = Infallible;

    async fn from_request(req: Request, st: &AppState) -> Result<Self, Infallible> {
        let (mut parts, body) = req.into_parts();
        let tenant = Tenant::from_request_parts(&mut parts, st).await;
        let path = ApiPath::<HashMap<String, String>>::from_request_parts(&mut parts, st).await.map(|p| p.0);
        let query =
            axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&parts.uri).map(|q| q.0).unwrap_or_default();
        let headers = parts.headers.clone();
        let body = match tenant.is_ok() {
            true => ApiBytes::from_request(Request::from_parts(parts, body), st).await.map(|b| b.0),
            false => Ok(Default::default()),
        };
        Ok(Incoming { tenant, headers, path, query, body })
    }
}

impl Incoming {
    /// The request's context and body, once its caller is known.
    fn open(self, st: AppState) -> Result<Opened, A2aError> {
        let Tenant(tenant) = self.tenant?;
        let path = self.path?;
        let body = self.body?;
        let header = |n: &str| self.headers.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
        let ctx = Ctx {
            tenant,
            agent: path.get("name").cloned(),
            base: super::origin::base_url(&self.headers, st.room().config().public_url.as_deref()),
            depth: header("subagent-depth"),
            key_prefix: key_prefix(&self.headers),
            traceparent: header("traceparent"),
            st,
        };
        Ok((ctx, body, path, self.query))
    }

    /// The version the request names (`A2A-Version`, as a header or a query parameter), if it
    /// names one: the header's value (one that is not text names no version this agent speaks),
    /// else the query parameter's, trimmed; empty names none.
    fn named_version(&self) -> Option<String> {
        let header = match self.headers.get("a2a-version").map(|v| v.to_str()) {
            Some(Err(_)) => Some("(not text)".to_string()),
            Some(Ok(v)) => Some(v.to_string()),
            None => None,
        };
        header
            .or_else(|| self.query.iter().find(|(k, _)| k.eq_ignore_ascii_case("a2a-version")).map(|(_, v)| v.clone()))
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// `version`, except that a request naming none whose body is in 1.0's shape alone (a
    /// message's `parts` and no `content`, a push config's `url` outside a `config`) is 1.0's.
    fn version_of_body(&self) -> Result<Version, A2aError> {
        let v = self.version()?;
        if v != Version::V03 || self.named_version().is_some() {
            return Ok(v);
        }
        let body = self.body.as_ref().ok().and_then(|b| serde_json::from_slice::<Value>(b).ok());
        let v10 = body.is_some_and(|b| {
            let m = b.get("message");
            let parts = m.is_some_and(|m| m.get("parts").is_some() && m.get("content").is_none());
            parts || (b.get("url").is_some() && b.get("config").is_none())
        });
        Ok(if v10 { Version::V10 } else { v })
    }

    /// The version the request is served in: 1.x as 1.0, 0.3 (or none named, as the spec says)
    /// as 0.3; any other is refused.
    fn version(&self) -> Result<Version, A2aError> {
        let named = self.named_version().unwrap_or_else(|| "0.3".to_string());
        let mut parts = named.split('.');
        match (parts.next(), parts.next()) {
            (Some("1"), _) => Ok(Version::V10),
            (Some("0"), Some("3")) => Ok(Version::V03),
            _ => Err(A2aError::new(
                Kind::VersionNotSupported,
                format!(
                    "A2A version {named:?} is not supported: this agent serves {} (send `A2A-Version: {}`) and 0.3",
                    crate::a2a::VERSION,
                    crate::a2a::VERSION
                ),
            )
            .meta("supported", format!("{}, 0.3", crate::a2a::VERSION))),
        }
    }
}

/// What a method answers with.
pub(crate) enum Out {
    Json(Value),
    /// `StreamResponse`s as they come (an error ends the stream).
    Stream(mpsc::Receiver<Result<Value, A2aError>>),
}

/// A method's params as its type, or invalid params naming what is wrong.
pub(crate) fn params<T: DeserializeOwned>(method: &str, mut v: Value) -> Result<T, A2aError> {
    // ProtoJSON from a client whose numbers are all doubles (Python's protobuf): `3.0` is 3.
    super::extract::whole(&mut v);
    serde_json::from_value(v).map_err(|e| A2aError::params(format!("{method}: {e}")))
}

/// ProtoJSON parsers take a field's proto name as well as its JSON name (`task_id` is `taskId`):
/// the params' keys as their JSON names, where the JSON name is not there too. What the caller
/// owns is left as it is: `metadata` (task options are named as `POST /tasks` names them), a
/// data part's `data`.
fn json_names(v: &mut Value) {
    match v {
        Value::Object(m) => {
            let proto: Vec<String> = m.keys().filter(|k| k.contains('_')).cloned().collect();
            for k in proto {
                let mut camel = String::with_capacity(k.len());
                let mut up = false;
                for c in k.chars() {
                    match c {
                        '_' => up = true,
                        c if up => {
                            camel.extend(c.to_uppercase());
                            up = false
                        }
                        c => camel.push(c),
                    }
                }
                if let Some(val) = m.remove(&k) {
                    m.entry(camel).or_insert(val);
                }
            }
            for (k, val) in m.iter_mut() {
                if !matches!(k.as_str(), "metadata" | "data") {
                    json_names(val);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(json_names),
        _ => {}
    }
}

/// Run one method of A2A 1.0.
async fn dispatch(ctx: Ctx, method: &str, mut p: Value) -> Result<Out, A2aError> {
    if !p.is_object() {
        return Err(A2aError::params(format!("{method}: params must be an object")));
    }
    json_names(&mut p);
    if let Some(at) = super::extract::nul_in(&p, String::new()) {
        return Err(A2aError::params(format!("{at}: holds U+0000 (NUL), which cannot be stored")).meta("field", at));
    }
    // A request's tenant is empty or the key's own.
    match p.get("tenant") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t.is_empty() || *t == ctx.tenant => {}
        Some(_) => {
            return Err(A2aError::params("tenant: must be empty or the API key's own tenant").meta("field", "tenant"))
        }
    }
    match method {
        "SendMessage" => send::send(ctx, p).await.map(Out::Json),
        "SendStreamingMessage" => send::stream(ctx, p).await.map(Out::Stream),
        "GetTask" => ops::get(&ctx, p).await.map(Out::Json),
        "ListTasks" => ops::list(&ctx, p).await.map(Out::Json),
        "CancelTask" => ops::cancel(&ctx, p).await.map(Out::Json),
        "SubscribeToTask" => ops::subscribe(ctx, p).await.map(Out::Stream),
        "CreateTaskPushNotificationConfig" => push::create(&ctx, p).await.map(Out::Json),
        "GetTaskPushNotificationConfig" => push::get(&ctx, p).await.map(Out::Json),
        "ListTaskPushNotificationConfigs" => push::list(&ctx, p).await.map(Out::Json),
        "DeleteTaskPushNotificationConfig" => push::delete(&ctx, p).await.map(Out::Json),
        "GetExtendedAgentCard" => card::extended(&ctx).await.map(Out::Json),
        other => Err(A2aError::new(Kind::MethodNotFound, format!("method not found: {other}"))),
    }
}

fn json_reply(v: &Value) -> Response {
    let mut r = (StatusCode::OK, v.to_string()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Server-Sent Events: each item as `shape` makes it (an error as an `error` event, the last).
fn sse(
    rx: mpsc::Receiver<Result<Value, A2aError>>,
    shape: impl Fn(Result<Value, A2aError>) -> Event + Send + 'static,
) -> Response {
    let events = futures_util::stream::unfold((rx, shape), |(mut rx, shape)| async move {
        let item = rx.recv().await?;
        Some((Ok::<_, Infallible>(shape(item)), (rx, shape)))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

/// `POST /a2a` and `POST /a2a/agents/{name}`: one JSON-RPC request (no batches, no
/// notifications), answered with JSON or, for the streaming methods, SSE — in 1.0, or in 0.3
/// for a request that names no version.
async fn rpc(State(st): State<AppState>, inc: Incoming) -> Response {
    let version = inc.version();
    let headers = inc.headers.clone();
    let v03 = matches!(version, Ok(Version::V03));
    let (ctx, body, _, _) = match inc.open(st) {
        Ok(x) => x,
        Err(e) => return e.rpc_response(None),
    };
    // 0.3 clients read a JSON-RPC error in an HTTP 200 (the HTTP layer's refusals aside).
    let refuse = |e: A2aError, id: Option<&Value>| match v03
        && e.transport.as_ref().is_none_or(|t| t.0 == StatusCode::BAD_REQUEST)
    {
        true => json_reply(&jsonrpc::error(id, &v03::error(&e))),
        false => e.rpc_response(id),
    };
    if let Some(e) = content_type(&headers) {
        return refuse(e, jsonrpc::id_of(&body).as_ref());
    }
    // No body at all is no JSON-RPC message, in either version: 400.
    if body.iter().all(u8::is_ascii_whitespace) {
        return A2aError::new(Kind::Parse, "parse error: the body is empty").bad_request().rpc_response(None);
    }
    let (id, method, p) = match jsonrpc::parse(&body) {
        Ok(jsonrpc::Incoming::Request { id, method, params }) => (id, method, params),
        // 0.3 servers answer a request without an id (with a null one), as its SDKs do.
        Ok(jsonrpc::Incoming::Notification { method, params }) if v03 => (Value::Null, method, params),
        // A body that is not a JSON-RPC request is refused at the HTTP level too (as at the MCP
        // door): 400, with the JSON-RPC error (naming its id where it has one).
        Ok(_) => {
            let e = A2aError::new(Kind::InvalidRequest, "invalid request: A2A takes requests (with an `id`) only");
            return refuse(e.bad_request(), None);
        }
        Err(e) => {
            let kind = if e.code == jsonrpc::PARSE_ERROR { Kind::Parse } else { Kind::InvalidRequest };
            return refuse(A2aError::new(kind, e.message).bad_request(), jsonrpc::id_of(&body).as_ref());
        }
    };
    // A version neither 1.x nor 0.3: refused at the HTTP level too, as its header was.
    if let Err(e) = version {
        return e.bad_request().rpc_response(Some(&id));
    }
    if v03 {
        return rpc_03(ctx, id, &method, p).await;
    }
    let extended = method == "GetExtendedAgentCard";
    match dispatch(ctx, &method, p).await {
        Ok(Out::Json(v)) if extended => json_reply(&jsonrpc::result(&id, card::only_v10(v))),
        Ok(Out::Json(v)) => json_reply(&jsonrpc::result(&id, v)),
        Ok(Out::Stream(rx)) => sse(rx, move |item| match item {
            Ok(v) => Event::default().data(jsonrpc::result(&id, v).to_string()),
            Err(e) => Event::default().event("error").data(jsonrpc::error(Some(&id), &e.rpc()).to_string()),
        }),
        Err(e) => e.rpc_response(Some(&id)),
    }
}

/// A 0.3 request: its method and params mapped onto 1.0's, the answer mapped back.
async fn rpc_03(ctx: Ctx, id: Value, method: &str, p: Value) -> Response {
    let refuse = |e: A2aError, id: &Value| match e.transport.is_some() {
        true => e.rpc_response(Some(id)),
        false => json_reply(&jsonrpc::error(Some(id), &v03::error(&e))),
    };
    let Some(core) = v03::method(method) else {
        let hint = if dispatch_names(method) { " (a 1.0 method: send `A2A-Version: 1.0`)" } else { "" };
        return refuse(A2aError::new(Kind::MethodNotFound, format!("method not found: {method}{hint}")), &id);
    };
    if !p.is_object() {
        return refuse(A2aError::params(format!("{method}: params must be an object")), &id);
    }
    let task = p.get("id").cloned().unwrap_or(Value::Null);
    let out = match dispatch(ctx.clone(), core, v03::params_in(core, p)).await {
        // A resubscription to an ended task: its last state, as its stream ended (0.3 clients
        // resubscribe after a drop, and the task may have ended meanwhile).
        Err(e) if core == "SubscribeToTask" && e.kind == Kind::UnsupportedOperation => {
            match dispatch(ctx, "GetTask", json!({"id": task})).await {
                Ok(Out::Json(t)) => {
                    let end = json!({"statusUpdate": {"taskId": t["id"], "contextId": t["contextId"], "status": t["status"]}});
                    Ok(Out::Stream(fixed(vec![Ok(json!({"task": t})), Ok(end)])))
                }
                other => other,
            }
        }
        // On a stream, an error comes on the stream, as 0.3 clients read it.
        Err(e) if v03::streams(method) && e.transport.is_none() => Ok(Out::Stream(fixed(vec![Err(e)]))),
        other => other,
    };
    match out {
        Ok(Out::Json(v)) => json_reply(&jsonrpc::result(&id, v03::result_out(core, v))),
        Ok(Out::Stream(rx)) => sse(rx, move |item| match item {
            Ok(v) => Event::default().data(jsonrpc::result(&id, v03::event_out(&v)).to_string()),
            Err(e) => Event::default().data(jsonrpc::error(Some(&id), &v03::error(&e)).to_string()),
        }),
        Err(e) => refuse(e, &id),
    }
}

/// A stream of these items only.
fn fixed(items: Vec<Result<Value, A2aError>>) -> mpsc::Receiver<Result<Value, A2aError>> {
    let (tx, rx) = mpsc::channel(items.len().max(1));
    for i in items {
        let _ = tx.try_send(i);
    }
    rx
}

/// A body sent as something other than JSON (`Content-Type`, when there is one): not taken.
pub(crate) fn content_type(headers: &HeaderMap) -> Option<A2aError> {
    let ct = headers.get(header::CONTENT_TYPE)?.to_str().unwrap_or("?");
    let media = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if media == "application/json" || media.ends_with("+json") {
        return None;
    }
    Some(
        A2aError::new(
            Kind::ContentTypeNotSupported,
            format!("Content-Type {ct:?}: the body is JSON (application/json)"),
        )
        .meta("contentType", ct),
    )
}

/// A method name of A2A 1.0.
fn dispatch_names(method: &str) -> bool {
    matches!(
        method,
        "SendMessage"
            | "SendStreamingMessage"
            | "GetTask"
            | "ListTasks"
            | "CancelTask"
            | "SubscribeToTask"
            | "CreateTaskPushNotificationConfig"
            | "GetTaskPushNotificationConfig"
            | "ListTaskPushNotificationConfigs"
            | "DeleteTaskPushNotificationConfig"
            | "GetExtendedAgentCard"
    )
}
