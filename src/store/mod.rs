//! Every SQL statement of the service, one file per table family, typed rows out.

pub mod agents;
pub mod events;
pub mod runs;
pub mod tasks;
pub mod tenants;
pub mod tools;

pub use sqlx::PgPool;

/// Channels of the LISTEN/NOTIFY hub.
pub const CH_QUEUED: &str = "subagentd_queued";
pub const CH_DONE: &str = "subagentd_done";
pub const CH_CANCEL: &str = "subagentd_cancel";
/// A task has new events (payload: its id).
pub const CH_EVENT: &str = "subagentd_event";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl StoreError {
    /// Name of the unique constraint this error violated, if any.
    pub fn constraint(&self) -> Option<&str> {
        match self {
            StoreError::Db(sqlx::Error::Database(d)) => d.constraint(),
            _ => None,
        }
    }
}

/// Is the database reachable and fully migrated?
pub async fn ready(pool: &PgPool) -> Result<bool, StoreError> {
    let latest = crate::db::MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied: Option<i64> =
        sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success").fetch_one(pool).await?;
    Ok(applied.unwrap_or(0) >= latest)
}
