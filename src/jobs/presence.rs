//! Presence: the worker process holds one database session open for as long as it lives,
//! registered in `workers`. When the process dies its session goes with it, and the rescuer
//! (on any replica) rescues its runs at once instead of waiting out their leases. The session is
//! checked every second and opened again (and registered again) when it drops — after a restart
//! of the database, within the rescuer's grace.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::store::{workers, StoreError};

pub struct Presence {
    pub options: PgConnectOptions,
    pub worker: String,
    pub every: Duration,
}

impl Presence {
    /// Open a session and register on it.
    pub async fn connect(&self) -> Result<PgConnection, StoreError> {
        let mut conn = self.options.connect().await?;
        workers::register(&mut conn, &self.worker).await?;
        Ok(conn)
    }

    /// Register (before the first claim, so that every run of this process has a presence),
    /// then keep the session alive in the background.
    pub async fn start(self, stop: CancellationToken) -> JoinHandle<()> {
        let first = self.connect().await;
        if let Err(e) = &first {
            tracing::warn!(error = %e, "worker presence not registered yet; retrying");
        }
        tokio::spawn(async move {
            let mut conn: Option<PgConnection> = first.ok();
            loop {
                if conn.is_none() {
                    match self.connect().await {
                        Ok(c) => conn = Some(c),
                        Err(e) => tracing::warn!(error = %e, "worker presence not registered; retrying"),
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(self.every) => {}
                    _ = stop.cancelled() => break,
                }
                if let Some(c) = conn.as_mut() {
                    if let Err(e) = workers::ping(c).await {
                        tracing::warn!(error = %e, "worker presence session lost; registering again");
                        conn = None;
                    }
                }
            }
            // A clean stop: the runs are released by now; leave.
            if let Some(mut c) = conn {
                let _ = workers::unregister(&mut c, &self.worker).await;
                let _ = c.close().await;
            }
        })
    }
}
