//! `agent_definitions`: custom agents defined per tenant over the API, stored as the JSON of
//! the definition (its type and rules are the engine's: `engine::definitions`).

use serde_json::Value;
use sqlx::PgPool;

use super::StoreError;

/// Every definition of the tenant, by name.
pub async fn list(pool: &PgPool, tenant: &str) -> Result<Vec<Value>, StoreError> {
    Ok(sqlx::query_scalar!("SELECT definition FROM agent_definitions WHERE tenant = $1 ORDER BY name", tenant)
        .fetch_all(pool)
        .await?)
}

pub async fn get(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<Value>, StoreError> {
    Ok(sqlx::query_scalar!("SELECT definition FROM agent_definitions WHERE tenant = $1 AND name = $2", tenant, name)
        .fetch_optional(pool)
        .await?)
}

/// Insert or replace `name`'s definition; true when it was created.
pub async fn put(pool: &PgPool, tenant: &str, name: &str, definition: &Value) -> Result<bool, StoreError> {
    let created = sqlx::query_scalar!(
        r#"INSERT INTO agent_definitions (tenant, name, definition) VALUES ($1, $2, $3)
         ON CONFLICT (tenant, name) DO UPDATE SET definition = EXCLUDED.definition, updated_at = now()
         RETURNING (xmax = 0) AS "created!""#,
        tenant,
        name,
        definition
    )
    .fetch_one(pool)
    .await?;
    Ok(created)
}

pub async fn delete(pool: &PgPool, tenant: &str, name: &str) -> Result<bool, StoreError> {
    let r = sqlx::query!("DELETE FROM agent_definitions WHERE tenant = $1 AND name = $2", tenant, name)
        .execute(pool)
        .await?;
    Ok(r.rows_affected() == 1)
}
