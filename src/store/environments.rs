//! Named environments (issue 63): a tenant's definitions (an image and a setup script) and what
//! the latest build of each said.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::StoreError;

/// A named environment as `GET /environments/{name}` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct EnvironmentRow {
    pub name: String,
    pub image: String,
    pub setup: String,
    /// Hosts, `*.domain` and CIDRs the setup may reach through the egress proxy.
    pub network_allow: Vec<String>,
    /// Whether the tasks' commands may too.
    pub network_in_runs: bool,
    /// The definition's hash (`sha256:` of its image and setup): a changed one is built anew.
    pub definition_hash: String,
    /// `building`, `ready` or `failed`.
    pub status: String,
    /// The image's manifest digest the build ran on.
    pub digest: Option<String>,
    pub exit_code: Option<i32>,
    /// The last 4 KiB of the setup's output (stdout and stderr).
    pub output_tail: Option<String>,
    pub size_bytes: Option<i64>,
    pub built_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A definition as a task's first start used it, kept with the task
/// (`tasks.environment_definition`), so that every later attempt of that task (a rescue on another
/// replica, a resume) builds and runs the same one: a changed definition is for later tasks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pinned {
    pub image: String,
    pub setup: String,
    pub network_allow: Vec<String>,
    pub network_in_runs: bool,
    pub definition_hash: String,
}

impl EnvironmentRow {
    /// Its definition, to pin on a task.
    pub fn pinned(&self) -> Pinned {
        Pinned {
            image: self.image.clone(),
            setup: self.setup.clone(),
            network_allow: self.network_allow.clone(),
            network_in_runs: self.network_in_runs,
            definition_hash: self.definition_hash.clone(),
        }
    }

    /// This row with `p`'s definition in place of its own. What its builds record goes to the row
    /// only while the row's definition is `p`'s (`record_build` matches the hash).
    pub fn with_definition(mut self, p: Pinned) -> EnvironmentRow {
        self.image = p.image;
        self.setup = p.setup;
        self.network_allow = p.network_allow;
        self.network_in_runs = p.network_in_runs;
        self.definition_hash = p.definition_hash;
        self
    }
}

/// Store `tenant`'s `name` as this definition; a changed one (another hash) starts `building`
/// with its last build's figures cleared. The row, and whether it is new.
/// A definition as stored.
pub struct Definition<'a> {
    pub image: &'a str,
    pub setup: &'a str,
    pub network_allow: &'a [String],
    pub network_in_runs: bool,
    pub hash: &'a str,
}

pub async fn put(
    pool: &PgPool,
    tenant: &str,
    name: &str,
    d: &Definition<'_>,
) -> Result<(EnvironmentRow, bool), StoreError> {
    let r = sqlx::query!(
        r#"INSERT INTO environments AS e (tenant, name, image, setup, network_allow, network_in_runs, definition_hash)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (tenant, name) DO UPDATE SET image = EXCLUDED.image, setup = EXCLUDED.setup,
             network_allow = EXCLUDED.network_allow, network_in_runs = EXCLUDED.network_in_runs,
             definition_hash = EXCLUDED.definition_hash, updated_at = now(),
             -- The same definition keeps its build, unless it failed (a PUT then tries again).
             status = CASE WHEN e.definition_hash = EXCLUDED.definition_hash AND e.status <> 'failed'
                           THEN e.status ELSE 'building' END,
             digest = CASE WHEN e.definition_hash = EXCLUDED.definition_hash AND e.status <> 'failed' THEN e.digest END,
             exit_code = CASE WHEN e.definition_hash = EXCLUDED.definition_hash AND e.status <> 'failed' THEN e.exit_code END,
             output_tail = CASE WHEN e.definition_hash = EXCLUDED.definition_hash AND e.status <> 'failed'
                                THEN e.output_tail END,
             size_bytes = CASE WHEN e.definition_hash = EXCLUDED.definition_hash AND e.status <> 'failed' THEN e.size_bytes END,
             built_at = CASE WHEN e.definition_hash = EXCLUDED.definition_hash AND e.status <> 'failed' THEN e.built_at END
         RETURNING name, image, setup, network_allow, network_in_runs, definition_hash, status, digest, exit_code, output_tail, size_bytes,
                   built_at, created_at, updated_at, (xmax = 0) AS "created!""#,
        tenant,
        name,
        d.image,
        d.setup,
        d.network_allow,
        d.network_in_runs,
        d.hash
    )
    .fetch_one(pool)
    .await?;
    let row = EnvironmentRow {
        name: r.name,
        image: r.image,
        setup: r.setup,
        network_allow: r.network_allow,
        network_in_runs: r.network_in_runs,
        definition_hash: r.definition_hash,
        status: r.status,
        digest: r.digest,
        exit_code: r.exit_code,
        output_tail: r.output_tail,
        size_bytes: r.size_bytes,
        built_at: r.built_at,
        created_at: r.created_at,
        updated_at: r.updated_at,
    };
    // The layers of the definitions before this one are not needed again (a task pinned to one
    // builds it anew where it runs).
    drop_layers(pool, tenant, name, Some(&row.definition_hash)).await?;
    Ok((row, r.created))
}

pub async fn get(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<EnvironmentRow>, StoreError> {
    Ok(sqlx::query_as!(
        EnvironmentRow,
        r#"SELECT name, image, setup, network_allow, network_in_runs, definition_hash, status, digest, exit_code, output_tail, size_bytes, built_at,
                  created_at, updated_at
         FROM environments WHERE tenant = $1 AND name = $2"#,
        tenant,
        name
    )
    .fetch_optional(pool)
    .await?)
}

pub async fn list(pool: &PgPool, tenant: &str) -> Result<Vec<EnvironmentRow>, StoreError> {
    Ok(sqlx::query_as!(
        EnvironmentRow,
        r#"SELECT name, image, setup, network_allow, network_in_runs, definition_hash, status, digest, exit_code, output_tail, size_bytes, built_at,
                  created_at, updated_at
         FROM environments WHERE tenant = $1 ORDER BY name"#,
        tenant
    )
    .fetch_all(pool)
    .await?)
}

/// Remove `tenant`'s `name`; whether there was one.
pub async fn delete(pool: &PgPool, tenant: &str, name: &str) -> Result<bool, StoreError> {
    let n = sqlx::query!(r#"DELETE FROM environments WHERE tenant = $1 AND name = $2"#, tenant, name)
        .execute(pool)
        .await?
        .rows_affected();
    drop_layers(pool, tenant, name, None).await?;
    Ok(n > 0)
}

/// A setup's layer to keep for every replica (`environment_layers`).
pub struct Layer<'a> {
    pub key: &'a str,
    pub tenant: &'a str,
    pub name: &'a str,
    pub definition_hash: &'a str,
    pub digest: &'a str,
}

/// Record `layer` of `bytes` bytes in `tx`, the transaction its chunks go in (a build killed
/// midway leaves nothing); false when one is kept under its key already, or when the environment
/// is gone or its definition is another now (its row locked until `tx` ends, so that a `PUT` or
/// a `DELETE` meanwhile removes what this one kept).
pub async fn insert_layer(tx: &mut sqlx::PgConnection, layer: &Layer<'_>, bytes: i64) -> Result<bool, StoreError> {
    let current = sqlx::query_scalar!(
        r#"SELECT 1 AS "one!" FROM environments WHERE tenant = $1 AND name = $2 AND definition_hash = $3 FOR SHARE"#,
        layer.tenant,
        layer.name,
        layer.definition_hash
    )
    .fetch_optional(&mut *tx)
    .await?;
    if current.is_none() {
        return Ok(false);
    }
    let made = sqlx::query!(
        r#"INSERT INTO environment_layers (key, tenant, name, definition_hash, digest, bytes) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (key) DO NOTHING"#,
        layer.key,
        layer.tenant,
        layer.name,
        layer.definition_hash,
        layer.digest,
        bytes
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    Ok(made > 0)
}

/// The `n`th chunk of the layer under `key`.
pub async fn insert_layer_chunk(tx: &mut sqlx::PgConnection, key: &str, n: i32, data: &[u8]) -> Result<(), StoreError> {
    sqlx::query!(r#"INSERT INTO environment_layer_chunks (key, n, data) VALUES ($1, $2, $3)"#, key, n, data)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// A transaction that reads one layer whole as it was at its start (its chunks never mixed
/// with another's kept under the same key meanwhile).
pub async fn read_layers(pool: &PgPool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query!("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY").execute(&mut *tx).await?;
    Ok(tx)
}

/// The bytes of the layer kept under `key`, if one is.
pub async fn layer_bytes(tx: &mut sqlx::PgConnection, key: &str) -> Result<Option<i64>, StoreError> {
    Ok(sqlx::query_scalar!(r#"SELECT bytes FROM environment_layers WHERE key = $1"#, key).fetch_optional(tx).await?)
}

/// Its `n`th chunk (none: past its end).
pub async fn layer_chunk(tx: &mut sqlx::PgConnection, key: &str, n: i32) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(sqlx::query_scalar!(r#"SELECT data FROM environment_layer_chunks WHERE key = $1 AND n = $2"#, key, n)
        .fetch_optional(tx)
        .await?)
}

/// Remove `tenant`'s layers of `name`, but those of the definition `keep`.
pub async fn drop_layers(pool: &PgPool, tenant: &str, name: &str, keep: Option<&str>) -> Result<(), StoreError> {
    sqlx::query!(
        r#"DELETE FROM environment_layers WHERE tenant = $1 AND name = $2 AND definition_hash IS DISTINCT FROM $3"#,
        tenant,
        name,
        keep
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// What a build of the definition `hash` said; nothing when the definition has changed since.
pub struct Built<'a> {
    pub status: &'a str,
    pub digest: Option<&'a str>,
    pub exit_code: Option<i32>,
    pub output_tail: Option<&'a str>,
    pub size_bytes: Option<i64>,
}

pub async fn record_build(
    pool: &PgPool,
    tenant: &str,
    name: &str,
    hash: &str,
    b: &Built<'_>,
) -> Result<(), StoreError> {
    sqlx::query!(
        r#"UPDATE environments SET status = $4, digest = coalesce($5, digest), exit_code = $6, output_tail = $7,
             size_bytes = $8, built_at = CASE WHEN $4 = 'building' THEN built_at ELSE now() END
         WHERE tenant = $1 AND name = $2 AND definition_hash = $3"#,
        tenant,
        name,
        hash,
        b.status,
        b.digest,
        b.exit_code,
        b.output_tail,
        b.size_bytes
    )
    .execute(pool)
    .await?;
    Ok(())
}
