//! Uploaded workspaces (the clean archive and its metadata), tenants' write-only secrets, and
//! the workspace version a task read.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use super::{Fence, StoreError};

/// An uploaded workspace as `GET /workspaces` shows it (never its archive).
#[derive(Debug, Clone, Serialize)]
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
    sqlx::query!(r#"SELECT pg_advisory_xact_lock(hashtextextended('workspaces:' || $1, 0))"#, tenant)
        .execute(&mut *tx)
        .await?;
    let others: i64 = sqlx::query_scalar!(
        r#"SELECT coalesce(sum(archive_bytes), 0)::bigint AS "n!" FROM workspaces WHERE tenant = $1 AND name <> $2"#,
        tenant,
        name
    )
    .fetch_one(&mut *tx)
    .await?;
    if others + w.archive.len() as i64 > quota {
        return Ok(None);
    }
    let r = sqlx::query!(
        r#"INSERT INTO workspaces (tenant, name, content_hash, files, size_bytes, archive_bytes, archive, dropped)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (tenant, name) DO UPDATE SET content_hash = EXCLUDED.content_hash, files = EXCLUDED.files,
             size_bytes = EXCLUDED.size_bytes, archive_bytes = EXCLUDED.archive_bytes, archive = EXCLUDED.archive,
             dropped = EXCLUDED.dropped, updated_at = now()
         RETURNING name, content_hash, files, size_bytes, archive_bytes, dropped AS "dropped: sqlx::types::Json<serde_json::Value>",
                   created_at, updated_at, (xmax = 0) AS "created!""#,
        tenant,
        name,
        w.content_hash,
        w.files,
        w.size_bytes,
        w.archive.len() as i64,
        w.archive,
        sqlx::types::Json(&w.dropped) as _
    )
    .fetch_one(&mut *tx)
    .await?;
    let (ws, created) = (
        WorkspaceRow {
            name: r.name,
            content_hash: r.content_hash,
            files: r.files,
            size_bytes: r.size_bytes,
            archive_bytes: r.archive_bytes,
            dropped: r.dropped,
            created_at: r.created_at,
            updated_at: r.updated_at,
        },
        r.created,
    );
    tx.commit().await?;
    Ok(Some((ws, created)))
}

pub async fn list(pool: &PgPool, tenant: &str) -> Result<Vec<WorkspaceRow>, StoreError> {
    Ok(sqlx::query_as!(
        WorkspaceRow,
        r#"SELECT name, content_hash, files, size_bytes, archive_bytes,
                dropped AS "dropped: sqlx::types::Json<serde_json::Value>", created_at, updated_at
         FROM workspaces WHERE tenant = $1 ORDER BY name"#,
        tenant
    )
    .fetch_all(pool)
    .await?)
}

pub async fn get(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<WorkspaceRow>, StoreError> {
    Ok(sqlx::query_as!(
        WorkspaceRow,
        r#"SELECT name, content_hash, files, size_bytes, archive_bytes,
                dropped AS "dropped: sqlx::types::Json<serde_json::Value>", created_at, updated_at
         FROM workspaces WHERE tenant = $1 AND name = $2"#,
        tenant,
        name
    )
    .fetch_optional(pool)
    .await?)
}

pub async fn delete(pool: &PgPool, tenant: &str, name: &str) -> Result<bool, StoreError> {
    let r =
        sqlx::query!(r#"DELETE FROM workspaces WHERE tenant = $1 AND name = $2"#, tenant, name).execute(pool).await?;
    Ok(r.rows_affected() > 0)
}

/// The upload's content hash now (`None`: no such workspace).
pub async fn content_hash(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar!(r#"SELECT content_hash FROM workspaces WHERE tenant = $1 AND name = $2"#, tenant, name)
        .fetch_optional(pool)
        .await?)
}

/// The clean archive of `name`, if it still has this content hash.
pub async fn archive(pool: &PgPool, tenant: &str, name: &str, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(sqlx::query_scalar!(
        r#"SELECT archive FROM workspaces WHERE tenant = $1 AND name = $2 AND content_hash = $3"#,
        tenant,
        name,
        hash
    )
    .fetch_optional(pool)
    .await?)
}

/// Record the version the task reads, once: the first run's answer stands, and every later
/// attempt (another replica, a resume, a rescue) reads it back. Fenced on the lease.
pub async fn record_version(pool: &PgPool, f: Fence, version: &str) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar!(
        r#"UPDATE task_queue SET workspace_version = coalesce(workspace_version, $3)
         WHERE id = $1 AND lease_token = $2 RETURNING workspace_version AS "workspace_version!""#,
        f.id,
        f.lease,
        version
    )
    .fetch_optional(pool)
    .await?)
}

/// Record the image digest the task runs in, once, as `record_version` does its workspace's, and
/// with it a named environment's definition (`environments::Pinned`): what is recorded answers.
pub async fn record_environment(
    pool: &PgPool,
    f: Fence,
    digest: &str,
    definition: Option<&serde_json::Value>,
) -> Result<Option<(String, Option<serde_json::Value>)>, StoreError> {
    let r = sqlx::query!(
        r#"UPDATE task_queue SET environment_digest = coalesce(environment_digest, $3),
             environment_definition = CASE WHEN environment_digest IS NULL THEN $4 ELSE environment_definition END
         WHERE id = $1 AND lease_token = $2
         RETURNING environment_digest AS "environment_digest!", environment_definition"#,
        f.id,
        f.lease,
        digest,
        definition
    )
    .fetch_optional(pool)
    .await?;
    Ok(r.map(|r| (r.environment_digest, r.environment_definition)))
}

/// The named environment's definition a task's first start recorded (`record_environment`).
pub async fn environment_definition(pool: &PgPool, id: uuid::Uuid) -> Result<Option<serde_json::Value>, StoreError> {
    Ok(sqlx::query_scalar!("SELECT environment_definition FROM task_queue WHERE id = $1", id)
        .fetch_optional(pool)
        .await?
        .flatten())
}

/// A secret's name and times (never its value).
#[derive(Debug, Clone, Serialize)]
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
    let r = sqlx::query!(
        r#"INSERT INTO secrets (tenant, name, value, host) VALUES ($1, $2, $3, $4)
         ON CONFLICT (tenant, name) DO UPDATE SET value = EXCLUDED.value, host = EXCLUDED.host, updated_at = now()
         RETURNING name, host, created_at, updated_at, (xmax = 0) AS "created!""#,
        tenant,
        name,
        value,
        host
    )
    .fetch_one(pool)
    .await?;
    Ok((SecretRow { name: r.name, host: r.host, created_at: r.created_at, updated_at: r.updated_at }, r.created))
}

pub async fn secrets(pool: &PgPool, tenant: &str) -> Result<Vec<SecretRow>, StoreError> {
    Ok(sqlx::query_as!(
        SecretRow,
        r#"SELECT name, host, created_at, updated_at FROM secrets WHERE tenant = $1 ORDER BY name"#,
        tenant
    )
    .fetch_all(pool)
    .await?)
}

/// The host a secret is for (`None`: no such secret).
pub async fn secret_host(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar!(r#"SELECT host FROM secrets WHERE tenant = $1 AND name = $2"#, tenant, name)
        .fetch_optional(pool)
        .await?)
}

/// The value and its host, for the worker that fetches with it (never for an API answer).
pub async fn secret_value(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<(String, String)>, StoreError> {
    Ok(sqlx::query!("SELECT value, host FROM secrets WHERE tenant = $1 AND name = $2", tenant, name)
        .fetch_optional(pool)
        .await?
        .map(|r| (r.value, r.host)))
}

/// The value of `tenant`'s secret for `host` (a registry's credentials), if it has one.
pub async fn secret_for_host(pool: &PgPool, tenant: &str, host: &str) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar!(
        "SELECT value FROM secrets WHERE tenant = $1 AND host = $2 ORDER BY name LIMIT 1",
        tenant,
        host
    )
    .fetch_optional(pool)
    .await?)
}

pub async fn delete_secret(pool: &PgPool, tenant: &str, name: &str) -> Result<bool, StoreError> {
    let r = sqlx::query!(r#"DELETE FROM secrets WHERE tenant = $1 AND name = $2"#, tenant, name).execute(pool).await?;
    Ok(r.rows_affected() > 0)
}
