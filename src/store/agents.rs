//! `agent_definitions`: custom agents defined per tenant over the API.

use sqlx::PgPool;

use super::StoreError;
use crate::engine::definitions::AgentDefinition;

pub async fn list(pool: &PgPool, tenant: &str) -> Result<Vec<AgentDefinition>, StoreError> {
    let rows: Vec<sqlx::types::Json<AgentDefinition>> =
        sqlx::query_scalar("SELECT definition FROM agent_definitions WHERE tenant = $1 ORDER BY name")
            .bind(tenant)
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(|j| j.0).collect())
}

pub async fn get(pool: &PgPool, tenant: &str, name: &str) -> Result<Option<AgentDefinition>, StoreError> {
    let row: Option<sqlx::types::Json<AgentDefinition>> =
        sqlx::query_scalar("SELECT definition FROM agent_definitions WHERE tenant = $1 AND name = $2")
            .bind(tenant)
            .bind(name)
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|j| j.0))
}

/// Insert or replace; true when it was created.
pub async fn put(pool: &PgPool, tenant: &str, def: &AgentDefinition) -> Result<bool, StoreError> {
    let created: bool = sqlx::query_scalar(
        "INSERT INTO agent_definitions (tenant, name, definition) VALUES ($1, $2, $3)
         ON CONFLICT (tenant, name) DO UPDATE SET definition = EXCLUDED.definition, updated_at = now()
         RETURNING (xmax = 0)",
    )
    .bind(tenant)
    .bind(&def.name)
    .bind(sqlx::types::Json(def))
    .fetch_one(pool)
    .await?;
    Ok(created)
}

pub async fn delete(pool: &PgPool, tenant: &str, name: &str) -> Result<bool, StoreError> {
    let r = sqlx::query("DELETE FROM agent_definitions WHERE tenant = $1 AND name = $2")
        .bind(tenant)
        .bind(name)
        .execute(pool)
        .await?;
    Ok(r.rows_affected() == 1)
}
