//! Uploaded workspaces (the clean archive and its metadata), tenants' write-only secrets, and
//! the workspace version a task read.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use super::{Fence, StoreError};

/// An uploaded workspace as `GET /workspaces` shows it (never its archive).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct WorkspaceRow {
    pub name: String,
    pub content_hash: String,
    pub files: i64,
    pub size_bytes: i64,
    pub archive_bytes: i64,
    pub dropped: sqlx::types::Json<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLS: &str = "name, content_hash, files, size_bytes, archive_bytes, dropped, created_at, updated_at";

/// What a new upload stores.
pub struct NewWorkspace<'a> {
    pub content_hash: &'a str,
    pub files: i64,
    pub size_bytes: i64,
    pub archive: &'a [u8],
    pub dropped: serde_json::Value,
}

/// Store `w` as `tenant`'s `name` (replacing one of that name) if the tenant's archives stay
/// within `quota` bytes; `Ok(None)`: they would not. Uploads of one tenant are serialised, so
/// that two at once cannot both pass the quota.
pub async fn put(
    pool: &PgPool,
    tenant: &str,
    name: &str,
    w: &NewWorkspace<'_>,
    quota: i64,
) -> Result<Option<(WorkspaceRow, bool)>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('workspaces:' || $1, 0))")
        .bind(tenant)
        .execute(&mut *tx)
        .await?;
    let others: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(archive_bytes), 0)::bigint FROM workspaces WHERE tenant = $1 AND name <> $2",
    )
    .bind(tenant)
    .bind(name)
    .fetch_one(&mut *tx)
    .await?;
    if others + w.archive.len() as i64 > quota {
        return Ok(None);
    }
    let sql = format!(
        "INSERT INTO workspaces (tenant, name, content_hash, files, size_bytes, archive_bytes, archive, dropped)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (tenant, name) DO UPDATE SET content_hash = EXCLUDED.content_hash, files = EXCLUDED.files,
             size_bytes = EXCLUDED.size_bytes, archive_bytes = EXCLUDED.archive_bytes, archive = EXCLUDED.archive,
             dropped = EXCLUDED.dropped, updated_at = now()
         RETURNING {COLS}, (xmax = 0) AS created"
    );
    let row = sqlx::query(&sql)
        .bind(tenant)
        .bind(name)
        .bind(w.content_hash)
        .bind(w.files)
        .bind(w.size_bytes)
        .bind(w.archive.len() as i64)
        .bind(w.archive)
        .bind(sqlx::types::Json(&w.dropped))
        .fetch_one(&mut *tx)
        .await?;
    use sqlx::{FromRow, Row};
    let created: bool = row.try_get("created")?;
    let ws = WorkspaceRow::from_row(&row)?;
    tx.commit().await?;
    Ok(Some((ws, created)))
}

pub async fn list(pool: &PgPool, tenant: &str) -> Result<Vec<WorkspaceRow>, StoreError> {
    let sql = format!("SELECT {COLS} FROM workspaces WHERE tenant = $1 ORDER BY name");
    Ok(sqlx::query_as(&sql).bind(tenant).fetch_all(pool).await?)
}

pub async fn get(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<WorkspaceRow>, StoreError> {
    let sql = format!("SELECT {COLS} FROM workspaces WHERE tenant = $1 AND name = $2");
    Ok(sqlx::query_as(&sql).bind(tenant).bind(name).fetch_optional(pool).await?)
}

pub async fn delete(pool: &PgPool, tenant: &str, name: &str) -> Result<bool, StoreError> {
    let r = sqlx::query("DELETE FROM workspaces WHERE tenant = $1 AND name = $2")
        .bind(tenant)
        .bind(name)
        .execute(pool)
        .await?;
    Ok(r.rows_affected() > 0)
}

/// The upload's content hash now (`None`: no such workspace).
pub async fn content_hash(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar("SELECT content_hash FROM workspaces WHERE tenant = $1 AND name = $2")
        .bind(tenant)
        .bind(name)
        .fetch_optional(pool)
        .await?)
}

/// The clean archive of `name`, if it still has this content hash.
pub async fn archive(pool: &PgPool, tenant: &str, name: &str, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(sqlx::query_scalar("SELECT archive FROM workspaces WHERE tenant = $1 AND name = $2 AND content_hash = $3")
        .bind(tenant)
        .bind(name)
        .bind(hash)
        .fetch_optional(pool)
        .await?)
}

/// Record the version the task reads, once: the first run's answer stands, and every later
/// attempt (another replica, a resume, a rescue) reads it back. Fenced on the lease.
pub async fn record_version(pool: &PgPool, f: Fence, version: &str) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar(
        "UPDATE task_queue SET workspace_version = coalesce(workspace_version, $3)
         WHERE id = $1 AND lease_token = $2 RETURNING workspace_version",
    )
    .bind(f.id)
    .bind(f.lease)
    .bind(version)
    .fetch_optional(pool)
    .await?)
}

/// A secret's name and times (never its value).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct SecretRow {
    pub name: String,
    /// The only host its value is sent to.
    pub host: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

pub async fn put_secret(
    pool: &PgPool,
    tenant: &str,
    name: &str,
    value: &str,
    host: &str,
) -> Result<(SecretRow, bool), StoreError> {
    use sqlx::{FromRow, Row};
    let row = sqlx::query(
        "INSERT INTO secrets (tenant, name, value, host) VALUES ($1, $2, $3, $4)
         ON CONFLICT (tenant, name) DO UPDATE SET value = EXCLUDED.value, host = EXCLUDED.host, updated_at = now()
         RETURNING name, host, created_at, updated_at, (xmax = 0) AS created",
    )
    .bind(tenant)
    .bind(name)
    .bind(value)
    .bind(host)
    .fetch_one(pool)
    .await?;
    Ok((SecretRow::from_row(&row)?, row.try_get("created")?))
}

pub async fn secrets(pool: &PgPool, tenant: &str) -> Result<Vec<SecretRow>, StoreError> {
    Ok(sqlx::query_as("SELECT name, host, created_at, updated_at FROM secrets WHERE tenant = $1 ORDER BY name")
        .bind(tenant)
        .fetch_all(pool)
        .await?)
}

/// The host a secret is for (`None`: no such secret).
pub async fn secret_host(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar("SELECT host FROM secrets WHERE tenant = $1 AND name = $2")
        .bind(tenant)
        .bind(name)
        .fetch_optional(pool)
        .await?)
}

/// The value and its host, for the worker that fetches with it (never for an API answer).
pub async fn secret_value(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<(String, String)>, StoreError> {
    Ok(sqlx::query_as("SELECT value, host FROM secrets WHERE tenant = $1 AND name = $2")
        .bind(tenant)
        .bind(name)
        .fetch_optional(pool)
        .await?)
}

pub async fn delete_secret(pool: &PgPool, tenant: &str, name: &str) -> Result<bool, StoreError> {
    let r = sqlx::query("DELETE FROM secrets WHERE tenant = $1 AND name = $2")
        .bind(tenant)
        .bind(name)
        .execute(pool)
        .await?;
    Ok(r.rows_affected() > 0)
}
