//! Agent cards: the service's at `/.well-known/agent-card.json` (its skills the agent types
//! every tenant has), one per agent type at `/a2a/agents/{name}/.well-known/agent-card.json`,
//! and the authenticated extended card (`GetExtendedAgentCard`), whose skills add the tenant's
//! own agents. URLs are the ones clients reach the service at: `SUBAGENTD_PUBLIC_URL`, else the
//! request's `Host` (`X-Forwarded-Host`, `X-Forwarded-Proto`) as a proxy passes it on.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::super::auth::Mode;
use super::super::error::ApiError;
use super::super::extract::ApiPath;
use super::errors::A2aError;
use super::{AppState, Ctx, Tenant};
use crate::engine::agents::AgentType;
use crate::resources::agents::Described;

/// Prompts that show what each built-in type is for.
fn examples(name: &str) -> Vec<&'static str> {
    match AgentType::parse(name) {
        Some(AgentType::General) => vec![
            "Refactor the date parsing in utils/dates.py to use the standard library, and summarise what changed",
            "Draft a release note from the merged pull requests of this week",
        ],
        Some(AgentType::Research) => {
            vec!["Which of our dependencies are affected by CVE-2026-1234? List each with the fixed version"]
        }
        Some(AgentType::Explore) => {
            vec!["Where is the retry policy for outbound webhooks defined, and what are its limits?"]
        }
        Some(AgentType::Plan) => vec!["Plan the migration of the billing jobs from cron to a queue, step by step"],
        None => vec![],
    }
}

fn skill(d: &Described) -> Value {
    let mut s = json!({
        "id": d.name, "name": d.name, "description": d.line,
        "tags": ["subagent", if d.builtin { "built-in" } else { "custom" }],
        "inputModes": ["text/plain", "application/json"],
        "outputModes": ["text/plain", "application/json"],
    });
    let ex = examples(&d.name);
    if !ex.is_empty() {
        s["examples"] = json!(ex);
    }
    s
}

/// A card: the service's (`agent` None) or one agent type's, at `base`.
fn card(st: &AppState, base: &str, agent: Option<&Described>, skills: &[Described]) -> Value {
    let (name, description, root) = match agent {
        Some(a) => (
            a.name.clone(),
            format!("A sub-agent of type {}: {}. {}", a.name, a.line, ABOUT),
            format!("{base}/a2a/agents/{}", a.name),
        ),
        None => (
            "subagentd".to_string(),
            format!(
                "Runs LLM sub-agents as jobs. Each skill is an agent type: name it in the message's metadata as \
                 `subagent_type` (default `general`). {ABOUT}"
            ),
            format!("{base}/a2a"),
        ),
    };
    // One card for both versions: 1.0's `supportedInterfaces` beside 0.3's `url`,
    // `preferredTransport`, `protocolVersion` and `additionalInterfaces` (0.3 over JSON-RPC).
    let mut c = json!({
        "name": name,
        "description": description,
        "version": env!("CARGO_PKG_VERSION"),
        "provider": {"organization": "subagentd", "url": base},
        "supportedInterfaces": [
            {"url": root, "protocolBinding": "JSONRPC", "protocolVersion": crate::a2a::VERSION},
            {"url": format!("{root}/v1"), "protocolBinding": "HTTP+JSON", "protocolVersion": crate::a2a::VERSION},
        ],
        "url": root,
        "preferredTransport": "JSONRPC",
        "protocolVersion": V03,
        "additionalInterfaces": [{"url": root, "transport": "JSONRPC"}, {"url": root, "transport": "HTTP+JSON"}],
        // 0.3's extended card is an authenticated one: there is none without keys.
        "supportsAuthenticatedExtendedCard": st.auth.mode != Mode::None,
        "capabilities": {"streaming": true, "pushNotifications": true, "extendedAgentCard": true},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills.iter().map(skill).collect::<Vec<_>>(),
    });
    if st.auth.mode != Mode::None {
        // 1.0's scheme (`httpAuthSecurityScheme`) and 0.3's (`type: http`) in one object: each
        // version's parser reads its own and ignores the other's.
        let about = "An API key of the service: `Authorization: Bearer sk_…`";
        c["securitySchemes"] = json!({"bearer": {
            "httpAuthSecurityScheme": {"scheme": "Bearer", "description": about},
            "type": "http", "scheme": "bearer", "description": about}});
        c["securityRequirements"] = json!([{"schemes": {"bearer": {"list": []}}}]);
        c["security"] = json!([{"bearer": []}]);
    }
    c
}

/// A card without 0.3's fields: the extended card a 1.0 request asks for (the public card,
/// fetched with no version named, serves both).
pub fn only_v10(mut c: Value) -> Value {
    if let Some(o) = c.as_object_mut() {
        for k in [
            "url",
            "preferredTransport",
            "protocolVersion",
            "additionalInterfaces",
            "supportsAuthenticatedExtendedCard",
            "security",
        ] {
            o.remove(k);
        }
    }
    if let Some(s) = c.pointer_mut("/securitySchemes/bearer").and_then(Value::as_object_mut) {
        for k in ["type", "scheme", "description"] {
            s.remove(k);
        }
    }
    c
}

/// The 0.3 version the card names for clients that read `protocolVersion`.
const V03: &str = "0.3.0";

const ABOUT: &str = "A message starts a task that runs with a fresh conversation and its type's tools, and \
    returns one summary (a text artifact; a structured output as a data artifact). Options such as `model`, \
    `max_turns` or `output_schema` go in the message's metadata under the names of POST /tasks. A task that waits \
    for a decision is input-required: answer it with a data part {\"actions\": [...]}.";

/// When this process first served a card's current bytes, to the second: the card's
/// `Last-Modified`. A card is known by its URL (which names the host asked and the agent) and
/// whether it is private; when its bytes change, its time is the time they changed, so bytes
/// that come back to an earlier version get a later time, never their old one. A later first
/// sight on another replica only makes a client's `If-Modified-Since` there miss, never match
/// wrongly. At most `SEEN_MAX` cards are remembered; past that the memory starts again (a later
/// time, which is as safe).
fn modified(card: &str, etag: &str) -> chrono::DateTime<chrono::Utc> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Seen = HashMap<String, (String, chrono::DateTime<chrono::Utc>)>;
    const SEEN_MAX: usize = 1024;
    static SEEN: OnceLock<Mutex<Seen>> = OnceLock::new();
    let mut seen = SEEN.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if seen.len() >= SEEN_MAX && !seen.contains_key(card) {
        seen.clear();
    }
    let now = chrono::Utc::now();
    let now = now - chrono::Duration::nanoseconds(i64::from(chrono::Timelike::nanosecond(&now)));
    match seen.get(card) {
        Some((tag, at)) if tag == etag => *at,
        _ => {
            seen.insert(card.to_string(), (etag.to_string(), now));
            now
        }
    }
}

/// Whether a request's validators say its copy of a card is current: `If-None-Match` naming the
/// ETag (or `*`), or, only where no `If-None-Match` is sent (RFC 9110 §13.1.3), an
/// `If-Modified-Since` at or after `modified`.
fn current(headers: &HeaderMap, etag: &str, modified: chrono::DateTime<chrono::Utc>) -> bool {
    let mut tags = headers.get_all(header::IF_NONE_MATCH).iter().peekable();
    if tags.peek().is_some() {
        return tags
            .filter_map(|h| h.to_str().ok())
            .any(|h| h.split(',').map(|t| t.trim().trim_start_matches("W/")).any(|t| t == etag || t == "*"));
    }
    headers
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| chrono::DateTime::parse_from_rfc2822(h).ok())
        .is_some_and(|since| since >= modified)
}

/// A card with caching headers: `max-age`, an `ETag` of its bytes and a `Last-Modified`, and 304
/// to an `If-None-Match` naming it (or an `If-Modified-Since` not before it). Its URLs follow the
/// request's host, so caches key on those too; a tenant's own agent's card is private to that key.
fn reply(v: Value, headers: &HeaderMap, private: bool) -> Response {
    use sha2::Digest;
    let body = v.to_string();
    let etag = format!("\"{}\"", hex::encode(&sha2::Sha256::digest(body.as_bytes())[..12]));
    let card =
        format!("{}|{}|{private}", v["url"].as_str().unwrap_or_default(), v["name"].as_str().unwrap_or_default());
    let modified = modified(&card, &etag);
    let matched = current(headers, &etag, modified);
    let mut r = match matched {
        true => StatusCode::NOT_MODIFIED.into_response(),
        false => (StatusCode::OK, body).into_response(),
    };
    let h = r.headers_mut();
    if !matched {
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    h.insert(header::ETAG, HeaderValue::from_str(&etag).expect("hex is a header value"));
    let http_date = modified.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
    h.insert(header::LAST_MODIFIED, HeaderValue::from_str(&http_date).expect("a date is a header value"));
    let (cache, vary) = match private {
        true => ("private, max-age=300", "Host, X-Forwarded-Host, X-Forwarded-Proto, Authorization"),
        false => ("public, max-age=300", "Host, X-Forwarded-Host, X-Forwarded-Proto"),
    };
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(header::VARY, HeaderValue::from_static(vary));
    r
}

/// `GET /.well-known/agent-card.json`: public.
pub async fn shared(State(st): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let skills = st.res.described(None).await?;
    let base = super::super::origin::base_url(&headers, st.room().config().public_url.as_deref());
    Ok(reply(card(&st, &base, None, &skills), &headers, false))
}

/// `GET /a2a/agents/{name}/.well-known/agent-card.json`: public for the built-in types and the
/// agents directory's; a tenant's own agent's with that tenant's key.
pub async fn of_agent(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
    tenant: Result<Tenant, ApiError>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let mut all = st.res.described(None).await?;
    let private = !all.iter().any(|d| d.name == name);
    if private {
        if let Ok(Tenant(t)) = tenant {
            all = st.res.described(Some(&t)).await?;
        }
    }
    let Some(agent) = all.into_iter().find(|d| d.name == name) else {
        return Err(ApiError::not_found("agent type (a tenant's own agent's card needs its key)"));
    };
    let base = super::super::origin::base_url(&headers, st.room().config().public_url.as_deref());
    Ok(reply(card(&st, &base, Some(&agent), std::slice::from_ref(&agent)), &headers, private))
}

/// `GetExtendedAgentCard`: the card with the tenant's own agents among the skills.
pub async fn extended(ctx: &Ctx) -> Result<Value, A2aError> {
    let all = ctx.st.res.described(Some(&ctx.tenant)).await.map_err(|e| A2aError::from(ApiError::from(e)))?;
    Ok(match &ctx.agent {
        Some(name) => {
            let agent = all.into_iter().find(|d| d.name == *name).ok_or_else(A2aError::not_found)?;
            card(&ctx.st, &ctx.base, Some(&agent), std::slice::from_ref(&agent))
        }
        None => card(&ctx.st, &ctx.base, None, &all),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cards_bytes_that_come_back_get_the_time_they_came_back() {
        let first = modified("https://h/a2a|c|false", "\"x\"");
        assert_eq!(modified("https://h/a2a|c|false", "\"x\""), first, "the same bytes keep their time");
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let changed = modified("https://h/a2a|c|false", "\"y\"");
        assert!(changed > first);
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(modified("https://h/a2a|c|false", "\"x\"") > changed, "never the old time again");
        assert_eq!(modified("https://other/a2a|c|false", "\"x\"").timestamp_subsec_nanos(), 0, "to the second");
    }
}
