//! `tools`, `tool_sources` and `tenant_secrets`, as plain rows (the tool types and their rules
//! are `crate::tools`').

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::PgPool;

use super::StoreError;

/// A catalog tool, as stored and as written (`created_at` and `updated_at` are the database's).
#[derive(Debug, Clone, Default)]
pub struct ToolRow {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    pub policy: String,
    /// `None`: a caller tool.
    pub endpoint: Option<String>,
    pub timeout_ms: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

pub async fn list(pool: &PgPool, tenant: &str) -> Result<Vec<ToolRow>, StoreError> {
    Ok(sqlx::query_as!(
        ToolRow,
        "SELECT name, description, parameters, policy, endpoint, timeout_ms, created_at, updated_at
         FROM tools WHERE tenant = $1 ORDER BY name",
        tenant
    )
    .fetch_all(pool)
    .await?)
}

pub async fn get(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<ToolRow>, StoreError> {
    Ok(sqlx::query_as!(
        ToolRow,
        "SELECT name, description, parameters, policy, endpoint, timeout_ms, created_at, updated_at
         FROM tools WHERE tenant = $1 AND name = $2",
        tenant,
        name
    )
    .fetch_optional(pool)
    .await?)
}

/// Insert or replace; true when created.
pub async fn put(pool: &PgPool, tenant: &str, t: &ToolRow) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar!(r#"INSERT INTO tools (tenant, name, description, parameters, policy, endpoint, timeout_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (tenant, name) DO UPDATE SET description = EXCLUDED.description, parameters = EXCLUDED.parameters,
             policy = EXCLUDED.policy, endpoint = EXCLUDED.endpoint, timeout_ms = EXCLUDED.timeout_ms, updated_at = now()
         RETURNING (xmax = 0) AS "created!""#, tenant, t.name, t.description, t.parameters, t.policy, t.endpoint, t.timeout_ms)
    .fetch_one(pool)
    .await?)
}

pub async fn delete(pool: &PgPool, tenant: &str, name: &str) -> Result<bool, StoreError> {
    let r = sqlx::query!(r#"DELETE FROM tools WHERE tenant = $1 AND name = $2"#, tenant, name).execute(pool).await?;
    Ok(r.rows_affected() == 1)
}

#[derive(Debug, Clone)]
pub struct SourceRow {
    pub name: String,
    pub url: String,
    pub headers: Json<BTreeMap<String, String>>,
    /// The last `tools/list`, as the tool definitions `crate::tools` made of it.
    pub tools: Value,
    pub refreshed_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

pub async fn sources(pool: &PgPool, tenant: &str) -> Result<Vec<SourceRow>, StoreError> {
    Ok(sqlx::query_as!(
        SourceRow,
        r#"SELECT name, url, headers AS "headers: Json<BTreeMap<String, String>>", tools, refreshed_at, last_error,
                created_at, updated_at
         FROM tool_sources WHERE tenant = $1 ORDER BY name"#,
        tenant
    )
    .fetch_all(pool)
    .await?)
}

pub async fn source(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<SourceRow>, StoreError> {
    Ok(sqlx::query_as!(
        SourceRow,
        r#"SELECT name, url, headers AS "headers: Json<BTreeMap<String, String>>", tools, refreshed_at, last_error,
                created_at, updated_at
         FROM tool_sources WHERE tenant = $1 AND name = $2"#,
        tenant,
        name
    )
    .fetch_optional(pool)
    .await?)
}

/// What a discovery found: its tools (`None`: it failed), and what to say about it (the
/// failure, or tools left out), for the source's `last_error`.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    pub tools: Option<Value>,
    pub note: Option<String>,
}

/// Insert or replace a source with its discovery result; true when created.
pub async fn put_source(
    pool: &PgPool,
    tenant: &str,
    name: &str,
    url: &str,
    headers: &BTreeMap<String, String>,
    d: &Discovery,
) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar!(r#"INSERT INTO tool_sources (tenant, name, url, headers, tools, refreshed_at, last_error)
         VALUES ($1, $2, $3, $4, coalesce($5, '[]'::jsonb), CASE WHEN $5::jsonb IS NOT NULL THEN now() END, $6)
         ON CONFLICT (tenant, name) DO UPDATE SET url = EXCLUDED.url, headers = EXCLUDED.headers, tools = EXCLUDED.tools,
             refreshed_at = EXCLUDED.refreshed_at, last_error = EXCLUDED.last_error, updated_at = now()
         RETURNING (xmax = 0) AS "created!""#, tenant, name, url, Json(headers) as _, d.tools, d.note)
    .fetch_one(pool)
    .await?)
}

/// A call to the source failed to reach it: its `last_error` says why (a refresh that works
/// clears it).
pub async fn source_unreachable(pool: &PgPool, tenant: &str, name: &str, error: &str) -> Result<(), StoreError> {
    sqlx::query!(
        r#"UPDATE tool_sources SET last_error = $3 WHERE tenant = $1 AND name = $2"#,
        tenant,
        name,
        format!("tools/call at {}: {error}", chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ"))
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Record a refresh: new tools on success; on failure the cached tools stay.
pub async fn refreshed(pool: &PgPool, tenant: &str, name: &str, d: &Discovery) -> Result<(), StoreError> {
    sqlx::query!(
        r#"UPDATE tool_sources SET tools = coalesce($3, tools),
             refreshed_at = CASE WHEN $3::jsonb IS NULL THEN refreshed_at ELSE now() END, last_error = $4
         WHERE tenant = $1 AND name = $2"#,
        tenant,
        name,
        d.tools,
        d.note
    )
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn delete_source(pool: &PgPool, tenant: &str, name: &str) -> Result<bool, StoreError> {
    let r =
        sqlx::query!(r#"DELETE FROM tool_sources WHERE tenant = $1 AND name = $2"#, tenant, name).execute(pool).await?;
    Ok(r.rows_affected() == 1)
}

/// The tenant's signing secret, created on first use.
pub async fn signing_secret(pool: &PgPool, tenant: &str) -> Result<String, StoreError> {
    if let Some(s) = sqlx::query_scalar!(r#"SELECT signing_secret FROM tenant_secrets WHERE tenant = $1"#, tenant)
        .fetch_optional(pool)
        .await?
    {
        return Ok(s);
    }
    sqlx::query!(
        r#"INSERT INTO tenant_secrets (tenant, signing_secret) VALUES ($1, $2) ON CONFLICT DO NOTHING"#,
        tenant,
        new_secret()
    )
    .execute(pool)
    .await?;
    Ok(sqlx::query_scalar!(r#"SELECT signing_secret FROM tenant_secrets WHERE tenant = $1"#, tenant)
        .fetch_one(pool)
        .await?)
}

/// Replace the tenant's signing secret; the only time a secret is returned.
pub async fn rotate_signing_secret(pool: &PgPool, tenant: &str) -> Result<String, StoreError> {
    let s = new_secret();
    sqlx::query!(
        r#"INSERT INTO tenant_secrets (tenant, signing_secret) VALUES ($1, $2)
         ON CONFLICT (tenant) DO UPDATE SET signing_secret = EXCLUDED.signing_secret, created_at = now()"#,
        tenant,
        s
    )
    .execute(pool)
    .await?;
    Ok(s)
}

fn new_secret() -> String {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut b);
    format!("whsec_{}", hex::encode(b))
}
