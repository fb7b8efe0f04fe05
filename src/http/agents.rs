//! `/agents`: the built-in types, the agents directory's definitions, and the tenant's own.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{ApiBytes, ApiPath};
use super::{AppState, Tenant};
use crate::engine::definitions::{parse_markdown, AgentDefinition, AgentName, Written};

pub fn router() -> Router<AppState> {
    Router::new().route("/agents", get(list)).route("/agents/{name}", get(read).put(put).delete(delete))
}

async fn list(State(st): State<AppState>, Tenant(tenant): Tenant) -> Result<Json<Value>, ApiError> {
    let (agents, invalid) = st.res.agents(&tenant).await?;
    Ok(Json(json!({"agents": agents, "invalid": invalid})))
}

async fn read(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(st.res.agent(&tenant, &name).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutAgent {
    #[serde(default)]
    description: Option<String>,
    system_prompt: String,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    disallowed_tools: Option<Vec<String>>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_turns: Option<i64>,
    #[serde(default)]
    max_output_tokens: Option<i64>,
    #[serde(default)]
    approval: Option<String>,
    #[serde(default)]
    read_only: Option<bool>,
    #[serde(default)]
    output_schema: Option<Value>,
    #[serde(default)]
    fallback_models: Option<Vec<String>>,
    #[serde(default)]
    fallback_on: Option<Vec<String>>,
    #[serde(default)]
    priority: Option<String>,
}

fn definition_error(e: crate::engine::definitions::DefinitionError) -> ApiError {
    let field = e.field.clone().unwrap_or_else(|| "body".into());
    ApiError::invalid(&field, e.message)
}

/// JSON, or the Markdown of an agents-directory file (`text/markdown`).
fn parse_body(name: &str, headers: &HeaderMap, body: &Bytes) -> Result<AgentDefinition, ApiError> {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match mime.as_str() {
        "text/markdown" => {
            let text = std::str::from_utf8(body).map_err(|_| ApiError::invalid("body", "is not UTF-8"))?;
            // Markdown with no front matter is all system prompt, the agent named by the path.
            let bare = text.trim_start_matches('\u{feff}');
            let framed;
            let framed_already =
                (bare.starts_with("---\n") || bare.starts_with("---\r\n")) && bare[3..].contains("\n---");
            let text = if framed_already {
                text
            } else {
                framed = format!("---\nname: {}\n---\n{bare}", serde_json::Value::String(name.to_string()));
                framed.as_str()
            };
            let d = parse_markdown("request", text).map_err(definition_error)?;
            if d.name != *name {
                return Err(ApiError::invalid(
                    "name",
                    format!("the front matter says {:?} but the path says {name:?}", d.name.as_str()),
                ));
            }
            Ok(d)
        }
        "application/json" => {
            let p: PutAgent = super::extract::from_slice(body).map_err(|e| {
                let msg = e.to_string();
                let field = ["unknown field `", "missing field `"]
                    .iter()
                    .find_map(|pre| {
                        msg.split_once(pre).and_then(|(_, r)| r.split_once('`')).map(|(f, _)| f.to_string())
                    })
                    .unwrap_or_else(|| "body".into());
                if e.is_syntax() || e.is_eof() {
                    ApiError::new(StatusCode::BAD_REQUEST, "malformed_json", "Malformed JSON", msg)
                } else {
                    ApiError::invalid(&field, msg)
                }
            })?;
            if p.system_prompt.trim().is_empty() {
                return Err(ApiError::invalid("system_prompt", "must not be empty"));
            }
            let name = AgentName::parse(name).map_err(|m| ApiError::invalid("name", m))?;
            let written = Written {
                description: p.description.unwrap_or_default(),
                tools: p.tools,
                disallowed_tools: p.disallowed_tools.unwrap_or_default(),
                model: p.model,
                max_turns: p.max_turns,
                max_output_tokens: p.max_output_tokens,
                approval: p.approval,
                read_only: p.read_only,
                output_schema: p.output_schema,
                fallback_models: p.fallback_models.unwrap_or_default(),
                fallback_on: p.fallback_on,
                priority: p.priority,
                ..Written::default()
            };
            written
                .check(name, p.system_prompt.trim().to_string())
                .map_err(|(field, m)| ApiError::invalid(field.unwrap_or("body"), m))
        }
        _ => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "Unsupported media type",
            "send the definition as application/json or text/markdown",
        )),
    }
}

async fn put(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
    headers: HeaderMap,
    ApiBytes(body): ApiBytes,
) -> Result<Response, ApiError> {
    AgentName::parse(&name).map_err(|m| ApiError::invalid("name", m))?;
    let def = parse_body(&name, &headers, &body)?;
    let (created, view) = st.res.put_agent(&tenant, &def).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(view)).into_response())
}

async fn delete(
    State(st): State<AppState>,
    Tenant(tenant): Tenant,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    st.res.delete_agent(&tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
