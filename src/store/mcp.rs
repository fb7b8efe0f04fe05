//! `mcp_sessions`: the MCP door's sessions — whose they are, the protocol version negotiated and
//! what the client can do — so that any replica serves any request of a session. A JSON-RPC
//! request's task is found by its idempotency key (`mcp:<session>:<request id>`), and a pending
//! action by its id, so neither needs a table of its own. `mcp_calls` names the calls a session
//! holds open, so that ending the session cancels their tasks.

use serde_json::Value;
use sqlx::PgPool;

use super::StoreError;

#[derive(Debug, Clone, PartialEq)]
pub struct McpSession {
    pub id: String,
    pub tenant: String,
    pub protocol_version: String,
    pub client_capabilities: Value,
}

pub async fn create(
    pool: &PgPool,
    id: &str,
    tenant: &str,
    version: &str,
    capabilities: &Value,
    client_info: &Value,
) -> Result<(), StoreError> {
    sqlx::query!(
        "INSERT INTO mcp_sessions (id, tenant, protocol_version, client_capabilities, client_info)
         VALUES ($1, $2, $3, $4, $5)",
        id,
        tenant,
        version,
        capabilities,
        client_info
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// What the service knows of a session id a request names.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    Live(McpSession),
    /// Its client ended it (`DELETE`), or it is another tenant's.
    Gone,
    /// No such session (never made here, or purged after its idle days).
    Unknown,
}

/// The session `id` as `tenant` sees it, noting that it was seen when it is live.
pub async fn get(pool: &PgPool, tenant: &str, id: &str) -> Result<Found, StoreError> {
    let row = sqlx::query!(
        r#"WITH seen AS (
             UPDATE mcp_sessions SET last_seen_at = now()
             WHERE id = $1 AND tenant = $2 AND ended_at IS NULL
             RETURNING id, tenant, protocol_version, client_capabilities, true AS live)
         SELECT id AS "id!", tenant AS "tenant!", protocol_version AS "protocol_version!",
                client_capabilities AS "client_capabilities!", live AS "live!" FROM seen
         UNION ALL
         SELECT id, tenant, protocol_version, client_capabilities, false FROM mcp_sessions
         WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM seen)"#,
        id,
        tenant
    )
    .fetch_optional(pool)
    .await?
    .map(|r| {
        let session = McpSession {
            id: r.id,
            tenant: r.tenant,
            protocol_version: r.protocol_version,
            client_capabilities: r.client_capabilities,
        };
        (session, r.live)
    });
    Ok(match row {
        Some((s, true)) => Found::Live(s),
        Some((_, false)) => Found::Gone,
        None => Found::Unknown,
    })
}

/// Adopt a session id the service does not know as a fresh session of `tenant`, with no client
/// capabilities; `None` if the id was taken meanwhile (by another tenant, or ended).
pub async fn adopt(pool: &PgPool, id: &str, tenant: &str, version: &str) -> Result<Option<McpSession>, StoreError> {
    Ok(sqlx::query_as!(
        McpSession,
        r#"INSERT INTO mcp_sessions (id, tenant, protocol_version, client_info)
         VALUES ($1, $2, $3, '{"adopted": true}')
         ON CONFLICT (id) DO NOTHING
         RETURNING id, tenant, protocol_version, client_capabilities"#,
        id,
        tenant,
        version
    )
    .fetch_optional(pool)
    .await?)
}

/// End a session, kept as ended; `None` if there was no live one of `tenant`'s, else the
/// idempotency keys of its calls still in flight (their tasks are the caller's to cancel).
pub async fn end(pool: &PgPool, tenant: &str, id: &str) -> Result<Option<Vec<String>>, StoreError> {
    let mut tx = pool.begin().await?;
    let ended = sqlx::query!(
        "UPDATE mcp_sessions SET ended_at = now() WHERE id = $1 AND tenant = $2 AND ended_at IS NULL",
        id,
        tenant
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if ended == 0 {
        return Ok(None);
    }
    let keys = sqlx::query_scalar!("DELETE FROM mcp_calls WHERE session_id = $1 RETURNING request_key", id)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Some(keys))
}

/// Note a call of session `id` held open for its task (`key`: the task's idempotency key);
/// false if the session has ended meanwhile (nothing is noted: the call must not start a task).
pub async fn call_started(pool: &PgPool, id: &str, tenant: &str, key: &str) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar!(
        r#"WITH live AS (SELECT 1 FROM mcp_sessions WHERE id = $1 AND tenant = $3 AND ended_at IS NULL),
              noted AS (INSERT INTO mcp_calls (session_id, request_key, tenant) SELECT $1, $2, $3 FROM live
                        ON CONFLICT (session_id, request_key) DO NOTHING)
         SELECT EXISTS (SELECT 1 FROM live) AS "live!""#,
        id,
        key,
        tenant
    )
    .fetch_one(pool)
    .await?)
}

/// The call answered (or its client went away): ending its session no longer touches its task.
pub async fn call_answered(pool: &PgPool, id: &str, key: &str) -> Result<(), StoreError> {
    sqlx::query!("DELETE FROM mcp_calls WHERE session_id = $1 AND request_key = $2", id, key).execute(pool).await?;
    Ok(())
}

/// Forget sessions not seen for `days` (live or ended), and calls noted a day ago (no call is
/// held that long: those a replica held when it died); how many sessions.
pub async fn purge_idle(pool: &PgPool, days: i32) -> Result<u64, StoreError> {
    sqlx::query!("DELETE FROM mcp_calls WHERE started_at < now() - interval '1 day'").execute(pool).await?;
    Ok(sqlx::query!("DELETE FROM mcp_sessions WHERE last_seen_at < now() - make_interval(days => $1)", days)
        .execute(pool)
        .await?
        .rows_affected())
}
