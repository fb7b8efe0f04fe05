//! `mcp_sessions`: the MCP door's sessions — whose they are, the protocol version negotiated and
//! what the client can do — so that any replica serves any request of a session. A JSON-RPC
//! request's task is found by its idempotency key (`mcp:<session>:<request id>`), and a pending
//! action by its id, so neither needs a table of its own.

use serde_json::Value;
use sqlx::PgPool;

use super::StoreError;

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
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
    sqlx::query(
        "INSERT INTO mcp_sessions (id, tenant, protocol_version, client_capabilities, client_info)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(tenant)
    .bind(version)
    .bind(capabilities)
    .bind(client_info)
    .execute(pool)
    .await?;
    Ok(())
}

/// The session `id` of `tenant` (another tenant's is not found), noting that it was seen.
pub async fn get(pool: &PgPool, tenant: &str, id: &str) -> Result<Option<McpSession>, StoreError> {
    Ok(sqlx::query_as(
        "UPDATE mcp_sessions SET last_seen_at = now() WHERE id = $1 AND tenant = $2
         RETURNING id, tenant, protocol_version, client_capabilities",
    )
    .bind(id)
    .bind(tenant)
    .fetch_optional(pool)
    .await?)
}

/// End a session; false if there was none of `tenant`'s.
pub async fn delete(pool: &PgPool, tenant: &str, id: &str) -> Result<bool, StoreError> {
    Ok(sqlx::query("DELETE FROM mcp_sessions WHERE id = $1 AND tenant = $2")
        .bind(id)
        .bind(tenant)
        .execute(pool)
        .await?
        .rows_affected()
        > 0)
}

/// Forget sessions not seen for `days`; how many.
pub async fn purge_idle(pool: &PgPool, days: i32) -> Result<u64, StoreError> {
    Ok(sqlx::query("DELETE FROM mcp_sessions WHERE last_seen_at < now() - make_interval(days => $1)")
        .bind(days)
        .execute(pool)
        .await?
        .rows_affected())
}
