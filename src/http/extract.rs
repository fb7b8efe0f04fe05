//! Extractors whose rejections are problem+json, naming what is wrong.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// `Json<T>` with problem+json rejections. The body is a JSON object unless `LIST` (then an
/// array): serde would otherwise read a struct from an array of its fields in order.
pub struct ApiJson<T, const LIST: bool = false>(pub T);

impl<S: Send + Sync, T: DeserializeOwned, const LIST: bool> FromRequest<S> for ApiJson<T, LIST> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !json_content_type(req.headers()) {
            return Err(unsupported_media_type());
        }
        let ApiBytes(bytes) = ApiBytes::from_request(req, state).await?;
        body::<T, LIST>(&bytes).map(ApiJson)
    }
}

/// `ApiJson`'s reading of a body already read.
fn body<T: DeserializeOwned, const LIST: bool>(bytes: &[u8]) -> Result<T, ApiError> {
    if let Some(at) = nul_field(bytes) {
        return Err(nul_refused(&at));
    }
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if !LIST && first == Some(&b'[') {
        return Err(ApiError::invalid("body", "must be a JSON object"));
    }
    match axum::Json::<T>::from_bytes(bytes) {
        Ok(axum::Json(v)) => Ok(v),
        // JSON Schema counts `2.0` as the integer 2: a whole number written with a fraction is
        // read as that integer (tried only when the body did not fit as written).
        Err(JsonRejection::JsonDataError(e)) => match whole_numbers(bytes) {
            Some(v) => serde_json::from_value(v).map_err(|_| json_rejection(JsonRejection::JsonDataError(e))),
            None => Err(json_rejection(JsonRejection::JsonDataError(e))),
        },
        Err(r) => Err(json_rejection(r)),
    }
}

/// `ApiJson<T, true>` for a list of answers to pending actions: a caller tool's `output` is a
/// tool's result, so a NUL in it is shown as U+FFFD (`kinds::text`; the model is told, as of
/// any tool's result, by `ToolOutput::storable`), where a NUL anywhere else is refused.
pub struct ApiAnswers<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiAnswers<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !json_content_type(req.headers()) {
            return Err(unsupported_media_type());
        }
        let ApiBytes(mut bytes) = ApiBytes::from_request(req, state).await?;
        if nul_field(&bytes).is_some() {
            if let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                let outputs = v.as_array_mut().into_iter().flatten().filter_map(|a| a.get_mut("output"));
                outputs.for_each(|o| {
                    crate::kinds::text::storable_value(o);
                });
                bytes = serde_json::to_vec(&v).unwrap_or_default().into();
            }
        }
        body::<T, true>(&bytes).map(ApiAnswers)
    }
}

/// How long a request's body may take to arrive in full, counted from when its handler starts
/// reading it: `SUBAGENTD_HTTP_IDLE_TIMEOUT_SECONDS`, the bound on the wait for a request's head,
/// applied to its body too. Without it a client that trickles a body (a byte every few seconds)
/// held its connection, task and buffers for as long as it liked: hyper's timer covers the head
/// only, and tower-http's body timeout restarts at every chunk. A request extension, put there
/// by the router; absent, a body may take any time.
#[derive(Clone, Copy, Debug)]
pub struct BodyDeadline(pub std::time::Duration);

/// The request body in full, with problem+json rejections: 413 beyond the body limit, 408 when
/// it has not all arrived within the [`BodyDeadline`] (the connection is then closed, since the
/// rest of the body is still on its way).
pub struct ApiBytes(pub axum::body::Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let deadline = req.extensions().get::<BodyDeadline>().copied();
        let read = axum::body::Bytes::from_request(req, state);
        let read = match deadline {
            Some(BodyDeadline(d)) => tokio::time::timeout(d, read).await.map_err(|_| request_timeout(d))?,
            None => read.await,
        };
        read.map(ApiBytes).map_err(|e| json_rejection(JsonRejection::from(e)))
    }
}

fn request_timeout(d: std::time::Duration) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "request_timeout",
        "Request timeout",
        format!(
            "the request body did not arrive in full within {} s (SUBAGENTD_HTTP_IDLE_TIMEOUT_SECONDS)",
            d.as_secs_f64()
        ),
    );
    e.headers.push((axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close")));
    e
}

/// `serde_json::from_slice`, reading `2.0` as the integer 2 as `ApiJson` does (for bodies that
/// are not always JSON); the error is the one for the body as written.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(bytes).or_else(|e| match whole_numbers(bytes) {
        Some(v) => serde_json::from_value(v).map_err(|_| e),
        None => Err(e),
    })
}

/// Where a JSON body holds U+0000 (PostgreSQL's text and jsonb cannot): the path of the first
/// string or key that does (`metadata.a`, `parts[0].text`), if any.
pub fn nul_field(bytes: &[u8]) -> Option<String> {
    // A NUL in JSON is always the escape `\u0000`: only a body that has one is walked.
    if !bytes.windows(6).any(|w| w.eq_ignore_ascii_case(b"\\u0000")) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    nul_in(&v, String::new())
}

/// The path of the first string or key in `v` that holds U+0000.
pub fn nul_in(v: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    let join = |k: &str| if at.is_empty() { k.to_string() } else { format!("{at}.{k}") };
    match v {
        Value::String(s) if s.contains('\0') => Some(if at.is_empty() { "body".into() } else { at }),
        Value::Array(a) => a.iter().enumerate().find_map(|(i, x)| nul_in(x, format!("{at}[{i}]"))),
        Value::Object(o) => o.iter().find_map(|(k, x)| match k.contains('\0') {
            true => Some(join(&k.replace('\0', "\\u0000"))),
            false => nul_in(x, join(k)),
        }),
        _ => None,
    }
}

/// The refusal of a value with U+0000: the field is the body's (its top-level key), the message
/// says where in it.
pub fn nul_refused(at: &str) -> ApiError {
    let field = at.split(['.', '[']).next().filter(|f| !f.is_empty()).unwrap_or("body");
    ApiError::invalid(field, format!("{at}: holds U+0000 (NUL), which cannot be stored"))
}

/// The body with every float that is a whole number (and fits an `i64`/`u64`) made an integer;
/// `None` when there is none.
fn whole_numbers(bytes: &[u8]) -> Option<serde_json::Value> {
    let mut v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    whole(&mut v).then_some(v)
}

/// Make every float in `v` that is a whole number (and fits an `i64`/`u64`) an integer, as JSON
/// Schema counts it; whether there was one.
pub fn whole(v: &mut serde_json::Value) -> bool {
    use serde_json::{Number, Value};
    fn walk(v: &mut Value) -> bool {
        match v {
            Value::Number(n) if n.is_f64() => {
                let f = n.as_f64().unwrap_or(f64::NAN);
                // (Within the range of i64 below zero and of u64 above, where `as` is exact.)
                let whole = f.fract() == 0.0 && (-9.223_372_036_854_776e18..1.844_674_407_370_955_2e19).contains(&f);
                if whole {
                    *n = if f < 0.0 { Number::from(f as i64) } else { Number::from(f as u64) };
                }
                whole
            }
            Value::Array(a) => a.iter_mut().fold(false, |c, x| walk(x) | c),
            Value::Object(o) => o.values_mut().fold(false, |c, x| walk(x) | c),
            _ => false,
        }
    }
    walk(v)
}

/// `application/json` or `application/<anything>+json`, as axum's `Json` accepts.
fn json_content_type(headers: &axum::http::HeaderMap) -> bool {
    let Some(ct) = headers.get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    mime.strip_prefix("application/").is_some_and(|sub| sub == "json" || sub.ends_with("+json"))
}

fn unsupported_media_type() -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        "Unsupported media type",
        "the body must be JSON with `Content-Type: application/json`",
    )
}

fn json_rejection(r: JsonRejection) -> ApiError {
    match r {
        JsonRejection::MissingJsonContentType(_) => unsupported_media_type(),
        JsonRejection::JsonSyntaxError(e) => {
            ApiError::new(StatusCode::BAD_REQUEST, "malformed_json", "Malformed JSON", e.body_text())
        }
        JsonRejection::JsonDataError(e) => {
            // serde names the field: "prompt: invalid type: integer `1`, expected a string at line 1 column 12".
            let text = e.body_text();
            let detail = text.trim_start_matches("Failed to deserialize the JSON body into the target type: ");
            let (field, message) = split_field(detail, "body");
            ApiError::invalid(&field, message)
        }
        JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "Payload too large",
            "the request body is larger than the configured limit (SUBAGENTD_MAX_BODY_BYTES)",
        ),
        other => ApiError::new(other.status(), "bad_request", "Bad request", other.body_text()),
    }
}

/// `Query<T>` with problem+json rejections.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(r) => Err(query_rejection(r)),
        }
    }
}

fn query_rejection(r: QueryRejection) -> ApiError {
    let text = r.body_text();
    let detail = text.trim_start_matches("Failed to deserialize query string: ");
    let (field, message) = split_field(detail, "query");
    ApiError::bad_param(&field, message)
}

/// serde's messages come as `path: message`, or name the field inside the message
/// (`missing field `x``, `unknown field `x``): find the field either way.
fn split_field(detail: &str, whole: &str) -> (String, String) {
    let (path, message) = match detail.split_once(": ") {
        Some((p, m)) if !p.contains(' ') => (p.to_string(), m.to_string()),
        _ => (String::new(), detail.to_string()),
    };
    let quoted = ["missing field `", "unknown field `"].iter().find_map(|pre| {
        let rest = message.split_once(pre)?.1;
        Some(rest.split_once('`')?.0.to_string())
    });
    let field = match (path.as_str(), quoted) {
        (".", Some(q)) | ("", Some(q)) => q,
        ("." | "", None) => whole.to_string(),
        (p, _) => p.to_string(),
    };
    (field, message)
}

/// `Path<T>` with problem+json rejections: 400 naming the parameter (axum's own answer is
/// text/plain, e.g. for a name whose percent-encoding is not UTF-8).
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        use axum::extract::path::ErrorKind;
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(ApiPath(v)),
            Err(r) => {
                let key = match &r {
                    PathRejection::FailedToDeserializePathParams(e) => match e.kind() {
                        ErrorKind::InvalidUtf8InPathParam { key }
                        | ErrorKind::ParseErrorAtKey { key, .. }
                        | ErrorKind::DeserializeError { key, .. } => Some(key.clone()),
                        _ => None,
                    },
                    _ => None,
                };
                Err(ApiError::bad_param(key.as_deref().unwrap_or("path"), r.body_text()))
            }
        }
    }
}

/// A path `{id}` that must be a UUID.
pub struct TaskId(pub uuid::Uuid);

impl<S: Send + Sync> FromRequestParts<S> for TaskId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let ApiPath(raw) = ApiPath::<String>::from_request_parts(parts, state).await?;
        raw.parse().map(TaskId).map_err(|_| ApiError::bad_param("id", format!("{raw:?} is not a UUID")))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_number_postgres_prints_in_full_reads_back() {
        // jsonb keeps 1.7976931348623157e308 as a numeric and prints all 309 digits.
        let full = format!("[179769313486231570{}]", "0".repeat(291));
        let v: Vec<f64> = serde_json::from_str(&full).expect("reads back");
        assert_eq!(v[0], 1.7976931348623157e308);
    }

    #[test]
    fn a_nul_is_found_where_it_is_and_an_escaped_backslash_is_not_one() {
        assert_eq!(super::nul_field(br#"{"a": {"b": ["x", "y\u0000"]}}"#).as_deref(), Some("a.b[1]"));
        assert_eq!(super::nul_field(br#"{"m": {"k\u0000": 1}}"#).as_deref(), Some("m.k\\u0000"));
        assert_eq!(super::nul_field(br#"{"a": "\\u0000 is text"}"#), None);
        assert_eq!(super::nul_field(br#"{"a": "plain"}"#), None);
    }

    #[test]
    fn whole_numbers_written_with_a_fraction_are_integers() {
        let v =
            super::whole_numbers(br#"{"a": 1790.0, "b": [2.5, -3.0], "c": "4.0", "d": 9007199254740992.0}"#).unwrap();
        assert_eq!(v, serde_json::json!({"a": 1790, "b": [2.5, -3], "c": "4.0", "d": 9007199254740992u64}));
        assert!(super::whole_numbers(br#"{"a": 1, "b": 2.5}"#).is_none());
    }
}
