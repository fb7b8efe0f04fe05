//! The HTTP+JSON binding: each route makes the method's params from its path, query and body,
//! and runs the same method as JSON-RPC does. Errors are `google.rpc.Status` bodies with the
//! spec's HTTP statuses; streams are SSE of bare `StreamResponse`s.

use std::collections::HashMap;

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::errors::{A2aError, Kind};
use super::{dispatch, json_reply, sse, AppState, Incoming, Out};

/// Which route a request came by.
#[derive(Clone, Copy)]
enum Route {
    Send,
    Stream,
    List,
    /// `GET /tasks/{id}`: the task, or `{id}:subscribe`.
    TaskGet,
    /// `POST /tasks/{id}:cancel` or `{id}:subscribe`.
    TaskPost,
    PushCreate,
    PushList,
    PushGet,
    PushDelete,
    Card,
}

pub async fn send(State(st): State<AppState>, inc: Incoming) -> Response {
    serve(st, inc, Route::Send).await
}
pub async fn stream(State(st): State<AppState>, inc: Incoming) -> Response {
    serve(st, inc, Route::Stream).await
}
pub async fn list(State(st): State<AppState>, inc: Incoming) -> Response {
    serve(st, inc, Route::List).await
}
pub async fn task_get(State(st): State<AppState>, inc: Incoming) -> Response {
    serve(st, inc, Route::TaskGet).await
}
pub async fn task_post(State(st): State<AppState>, inc: Incoming) -> Response {
    serve(st, inc, Route::TaskPost).await
}
pub async fn push_create(State(st): State<AppState>, inc: Incoming) -> Response {
    serve(st, inc, Route::PushCreate).await
}
pub async fn push_list(State(st): State<AppState>, inc: Incoming) -> Response {
    serve(st, inc, Route::PushList).await
}
pub async fn push_get(State(st): State<AppState>, inc: Incoming) -> Response {
    serve(st, inc, Route::PushGet).await
}
pub async fn push_delete(State(st): State<AppState>, inc: Incoming) -> Response {
    serve(st, inc, Route::PushDelete).await
}
pub async fn extended_card(State(st): State<AppState>, inc: Incoming) -> Response {
    serve(st, inc, Route::Card).await
}

async fn serve(st: AppState, inc: Incoming, route: Route) -> Response {
    // None named is 0.3, its bodies the 0.3 protobuf's JSON (`v03.rs`), unless the body is
    // in 1.0's shape alone.
    let v03 = match inc.version_of_body() {
        Ok(super::Version::V10) => false,
        Ok(super::Version::V03) => true,
        Err(e) => return e.rest_response(),
    };
    let typed = super::content_type(&inc.headers);
    let (ctx, method, p) = match inc.open(st) {
        // A body that is not JSON: 415 (an empty one, as a cancel may send, has no type to check).
        Ok((_, body, _, _)) if !body.is_empty() && typed.is_some() => return typed.expect("checked").rest_response(),
        Ok((ctx, body, path, query)) => match call(route, &body, &path, &query, v03) {
            Ok((method, p)) => (ctx, method, p),
            Err(e) => return e.rest_response(),
        },
        Err(e) => return e.rest_response(),
    };
    match dispatch(ctx, method, p).await {
        Ok(Out::Json(v)) if v03 => json_reply(&super::v03::rest_out(method, v)),
        // The extended card asked for in 1.0 is 1.0's alone.
        Ok(Out::Json(v)) if method == "GetExtendedAgentCard" => json_reply(&super::card::only_v10(v)),
        Ok(Out::Json(v)) => json_reply(&v),
        Ok(Out::Stream(rx)) => sse(rx, move |item| match item {
            Ok(v) if v03 => Event::default().data(super::v03::rest_event_out(&v).to_string()),
            Ok(v) => Event::default().data(v.to_string()),
            Err(e) => Event::default().event("error").data(e.status_body().to_string()),
        }),
        Err(e) => e.rest_response(),
    }
}

/// The method a route runs and its params.
fn call(
    route: Route,
    body: &[u8],
    path: &HashMap<String, String>,
    query: &[(String, String)],
    v03: bool,
) -> Result<(&'static str, Value), A2aError> {
    let id = || path.get("id").cloned().unwrap_or_default();
    // A 0.3 body read as 1.0's params (its proto field names as JSON names first).
    let as_10 = |f: fn(Value) -> Value| -> Result<Value, A2aError> {
        let mut b = object(body)?;
        if v03 {
            super::json_names(&mut b);
            b = f(b);
        }
        Ok(b)
    };
    Ok(match route {
        Route::Send => ("SendMessage", as_10(super::v03::rest_send_in)?),
        Route::Stream => ("SendStreamingMessage", as_10(super::v03::rest_send_in)?),
        Route::List if v03 => {
            return Err(A2aError::new(Kind::MethodNotFound, "A2A 0.3 has no task list (send `A2A-Version: 1.0`)"))
        }
        Route::List => ("ListTasks", from_query(query)?),
        Route::TaskGet => match id().strip_suffix(":subscribe") {
            Some(task) => ("SubscribeToTask", json!({"id": task})),
            None => {
                let mut p = from_query(query)?;
                p["id"] = Value::String(id());
                ("GetTask", p)
            }
        },
        Route::TaskPost => {
            let segment = id();
            let (task, verb) = segment.rsplit_once(':').unwrap_or((segment.as_str(), ""));
            let method = match verb {
                "cancel" => "CancelTask",
                "subscribe" => "SubscribeToTask",
                _ => {
                    return Err(A2aError::new(
                        Kind::MethodNotFound,
                        "method not found: POST /tasks/{id}:cancel or /tasks/{id}:subscribe",
                    ))
                }
            };
            let mut p = if body.iter().all(u8::is_ascii_whitespace) { json!({}) } else { object(body)? };
            same("id", &mut p, task)?;
            (method, p)
        }
        Route::PushCreate => {
            let mut p = as_10(super::v03::rest_push_in)?;
            same("taskId", &mut p, &id())?;
            ("CreateTaskPushNotificationConfig", p)
        }
        Route::PushList => {
            let mut p = from_query(query)?;
            p["taskId"] = Value::String(id());
            ("ListTaskPushNotificationConfigs", p)
        }
        Route::PushGet | Route::PushDelete => {
            let p = json!({"taskId": id(), "id": path.get("config").cloned().unwrap_or_default()});
            (
                if matches!(route, Route::PushGet) {
                    "GetTaskPushNotificationConfig"
                } else {
                    "DeleteTaskPushNotificationConfig"
                },
                p,
            )
        }
        Route::Card => ("GetExtendedAgentCard", json!({})),
    })
}

/// The body as a JSON object.
fn object(body: &[u8]) -> Result<Value, A2aError> {
    match super::super::extract::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(A2aError::new(Kind::InvalidRequest, "the body must be a JSON object")),
        Err(e) => Err(A2aError::new(Kind::Parse, format!("the body is not JSON: {e}"))),
    }
}

/// `field` of the body set to the path's value (a body naming another is refused).
fn same(field: &str, p: &mut Value, from_path: &str) -> Result<(), A2aError> {
    match p.get(field) {
        Some(Value::String(v)) if !v.is_empty() && v != from_path => {
            Err(A2aError::params(format!("{field}: the body names {v:?}, the path {from_path:?}")).meta("field", field))
        }
        Some(v) if !v.is_string() && !v.is_null() => {
            Err(A2aError::params(format!("{field}: must be a string")).meta("field", field))
        }
        _ => {
            p[field] = Value::String(from_path.to_string());
            Ok(())
        }
    }
}

/// Query parameters as params: the numbers and booleans A2A names read as such, the rest as
/// strings (the version parameter aside).
fn from_query(query: &[(String, String)]) -> Result<Value, A2aError> {
    let mut m = Map::new();
    for (k, v) in query {
        let value = match k.as_str() {
            "pageSize" | "historyLength" | "page_size" | "history_length" => match v.parse::<i64>() {
                Ok(n) => json!(n),
                Err(_) => {
                    return Err(A2aError::params(format!("{k}: {v:?} is not an integer")).meta("field", k.clone()))
                }
            },
            "includeArtifacts" => match v.as_str() {
                "true" => json!(true),
                "false" => json!(false),
                _ => return Err(A2aError::params(format!("{k}: {v:?} is not true or false")).meta("field", k.clone())),
            },
            _ if k.eq_ignore_ascii_case("a2a-version") => continue,
            _ => json!(v),
        };
        m.insert(k.clone(), value);
    }
    Ok(Value::Object(m))
}
