//! Pool setup, migrations and the embedded Postgres bootstrap.
//!
//! May import: `config`. The bottom of the storage side: `store` builds on it.

pub mod embedded;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use crate::config::Config;
use embedded::{EmbeddedOptions, EmbeddedPostgres};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The database the service uses: an external one, or the embedded cluster it started.
pub struct Database {
    pub pool: PgPool,
    pub url: String,
    /// Kept alive for the life of the service; dropping it stops the cluster.
    pub embedded: Option<EmbeddedPostgres>,
}

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error(transparent)]
    Bootstrap(#[from] embedded::BootstrapError),
    #[error("database: {0}")]
    Sqlx(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl Database {
    /// Connect to `DATABASE_URL`, or start the embedded cluster and create the `subagentd`
    /// database in it; then apply migrations unless disabled.
    pub async fn open(cfg: &Config) -> Result<Self, DbError> {
        let (url, embedded) = match &cfg.database_url {
            Some(url) => (url.clone(), None),
            None => {
                let opts = EmbeddedOptions {
                    data_dir: cfg.data_dir.join("pg"),
                    bin_dir: cfg.pg_bin_dir.clone(),
                    fast_unsafe: false,
                    max_connections: 200,
                    settings: vec![],
                };
                let pg = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&opts))
                    .await
                    .map_err(|e| embedded::BootstrapError::Failed(e.to_string()))??;
                tracing::info!(port = pg.port, data_dir = %pg.data_dir.display(), "embedded postgres started");
                let admin = connect(&pg.local_url("postgres"), 1).await?;
                ensure_database(&admin, "subagentd").await?;
                admin.close().await;
                (pg.local_url("subagentd"), Some(pg))
            }
        };
        let pool = connect(&url, cfg.db_max_connections).await?;
        if !cfg.no_migrate {
            MIGRATOR.run(&pool).await?;
        }
        Ok(Database { pool, url, embedded })
    }
}

/// The settings of every pool the service opens.
pub fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        // No ping before every acquire (a round trip per statement); a dead connection fails
        // its statement instead, and writers retry.
        .test_before_acquire(false)
}

/// A pool whose first connection is retried for a while: a database that is still starting
/// (or restarting) is waited for, not reported as a failure.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    let opts: PgConnectOptions = url.parse::<PgConnectOptions>()?.disable_statement_logging();
    let mut delay = Duration::from_millis(50);
    let mut tries = 0;
    loop {
        match pool_options(max_connections).connect_with(opts.clone()).await {
            Ok(pool) => return Ok(pool),
            Err(e) if tries < 40 && is_transient(&e) => {
                tries += 1;
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e),
        }
    }
}

fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => true,
        // 57P03: the database system is starting up.
        sqlx::Error::Database(d) => d.code().as_deref() == Some("57P03"),
        _ => false,
    }
}

pub async fn ensure_database(admin: &PgPool, name: &str) -> Result<(), sqlx::Error> {
    let exists =
        sqlx::query_scalar!(r#"SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AS "exists!""#, name)
            .fetch_one(admin)
            .await?;
    if !exists {
        // Identifiers cannot be bound; `name` is ours, not user input. Its one shape runs in every
        // test that starts the embedded cluster (`helpers::spawn_app`).
        match sqlx::query(&format!("CREATE DATABASE \"{name}\"")).execute(admin).await {
            Ok(_) => {}
            // 42P04: created concurrently by another process.
            Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some("42P04") => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
