//! What `subagent_type` names: a built-in type, the tenant's own definition (stored over the
//! API), or the agents directory's — in that order.

use sqlx::PgPool;

use crate::engine::agents::{AgentType, BUILTIN_NAMES};
use crate::engine::definitions::{AgentDefinition, FileAgents};
use crate::store::{agents as store, StoreError};

pub enum Resolved {
    Builtin(AgentType),
    Custom(AgentDefinition),
}

fn decode(v: serde_json::Value) -> Result<AgentDefinition, StoreError> {
    serde_json::from_value(v).map_err(|e| StoreError::Corrupt(format!("agent definition: {e}")))
}

/// The tenant's own definitions, by name.
pub async fn tenant_definitions(pool: &PgPool, tenant: &str) -> Result<Vec<AgentDefinition>, StoreError> {
    store::list(pool, tenant).await?.into_iter().map(decode).collect()
}

/// The agent `name` names for `tenant`, if any.
pub async fn resolve(
    pool: &PgPool,
    files: &FileAgents,
    tenant: &str,
    name: &str,
) -> Result<Option<Resolved>, StoreError> {
    if let Some(t) = AgentType::parse(name) {
        return Ok(Some(Resolved::Builtin(t)));
    }
    if let Some(d) = store::get(pool, tenant, name).await? {
        return Ok(Some(Resolved::Custom(decode(d)?)));
    }
    Ok(files.get(name).cloned().map(Resolved::Custom))
}

/// Every name `subagent_type` accepts for this tenant: the built-ins, then the custom ones.
pub async fn names(pool: &PgPool, files: &FileAgents, tenant: &str) -> Result<Vec<String>, StoreError> {
    let mut names: Vec<String> = BUILTIN_NAMES.iter().map(|s| s.to_string()).collect();
    let mut custom: Vec<String> = files.valid.iter().map(|d| d.name.to_string()).collect();
    custom.extend(tenant_definitions(pool, tenant).await?.into_iter().map(|d| d.name.to_string()));
    custom.sort();
    custom.dedup();
    names.extend(custom);
    Ok(names)
}
