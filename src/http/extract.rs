//! Extractors whose rejections are problem+json, naming what is wrong.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// `Json<T>` with problem+json rejections.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(r) => Err(json_rejection(r)),
        }
    }
}

fn json_rejection(r: JsonRejection) -> ApiError {
    match r {
        JsonRejection::MissingJsonContentType(_) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "Unsupported media type",
            "the body must be JSON with `Content-Type: application/json`",
        ),
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

/// A path `{id}` that must be a UUID.
pub struct TaskId(pub uuid::Uuid);

impl<S: Send + Sync> FromRequestParts<S> for TaskId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let axum::extract::Path(raw) = axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|r: PathRejection| ApiError::bad_param("id", r.body_text()))?;
        raw.parse().map(TaskId).map_err(|_| ApiError::bad_param("id", format!("{raw:?} is not a UUID")))
    }
}
