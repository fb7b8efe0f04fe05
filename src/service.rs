//! Wiring: the HTTP server, the worker and its services, and the notify hub as one service
//! with one shutdown token. The top of the house, with `main.rs`.

use std::net::SocketAddr;
use std::sync::Arc;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::definitions::FileAgents;
use crate::http::{self, AppState};
use crate::hub::Hub;
use crate::jobs::worker::Worker;
use crate::llm::Providers;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    pub api: bool,
    pub workers: bool,
}

pub struct Service {
    /// Where the API listens, if it runs.
    pub addr: Option<SocketAddr>,
    pub shutdown: CancellationToken,
    pub hub: Arc<Hub>,
    done: JoinHandle<()>,
}

impl Service {
    pub async fn start(
        cfg: Arc<Config>,
        pool: PgPool,
        providers: Providers,
        file_agents: Arc<FileAgents>,
        roles: Roles,
    ) -> std::io::Result<Service> {
        let tool_caller = crate::tools::Caller::from_config(&cfg)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let mode = crate::http::auth::Mode::parse(&cfg.auth)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        crate::telemetry::prometheus();
        crate::telemetry::register_metrics(&providers.names(), &providers.known_models());
        let providers = Arc::new(providers);
        let shutdown = CancellationToken::new();
        let hub = Hub::new();
        // The listener outlives the drain, so that waiters and cancels keep working during it.
        let listener_stop = CancellationToken::new();
        let listen = tokio::spawn(hub.clone().listen(pool.clone(), listener_stop.clone()));
        let publish = hub.start_publishing(pool.clone(), listener_stop.clone()).await;

        let local_worker = roles
            .workers
            .then(|| Worker::new(pool.clone(), hub.clone(), providers.clone(), tool_caller.clone(), cfg.clone()));
        let worker =
            local_worker.clone().map(|w| tokio::spawn(crate::jobs::run_worker(w, shutdown.clone(), cfg.drain_grace())));

        let (addr, server) = if roles.api {
            let loopback = cfg.listen.ip().is_loopback();
            let tasks = crate::tasks::Lifecycle {
                pool: pool.clone(),
                cfg: cfg.clone(),
                providers,
                file_agents,
                tool_caller,
                hub: hub.clone(),
                limits_cache: Arc::new(crate::cache::TtlCache::new(std::time::Duration::from_secs(5))),
                tools_cache: Arc::new(crate::cache::TtlCache::new(std::time::Duration::from_secs(5))),
                shortcut: local_worker.as_ref().map(|w| w.shortcut()),
                shutdown: shutdown.clone(),
            };
            let auth = crate::http::auth::Auth::new(mode, loopback);
            let state = AppState::new(tasks, auth);
            let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
            if mode == crate::http::auth::Mode::Auto && !loopback {
                tracing::warn!(
                    "listening on a non-loopback address: every request needs an API key (SUBAGENTD_AUTH=auto)"
                );
            } else if mode != crate::http::auth::Mode::Keys {
                tracing::warn!(
                    tenant = %cfg.tenant,
                    "single-user mode: requests without an API key act as tenant {:?} (until an API key exists{}); \
                     do not expose this port",
                    cfg.tenant,
                    if mode == crate::http::auth::Mode::None { ", never: SUBAGENTD_AUTH=none" } else { "" }
                );
            }
            let addr = listener.local_addr()?;
            let app = http::router(state);
            let stop = shutdown.clone();
            let server = tokio::spawn(http::serve::serve(listener, app, cfg.http_idle_timeout(), stop));
            (Some(addr), Some(server))
        } else {
            (None, None)
        };

        let done = tokio::spawn(async move {
            if let Some(w) = worker {
                let _ = w.await;
            }
            if let Some(s) = server {
                let _ = s.await;
            }
            listener_stop.cancel();
            let _ = listen.await;
            let _ = publish.await;
        });
        Ok(Service { addr, shutdown, hub, done })
    }

    /// Drain and stop: stop claiming, let runs finish (or release them), finish in-flight
    /// requests.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.done.await;
    }

    /// Wait until the service stops by itself (after `shutdown` is fired).
    pub async fn wait(self) {
        let _ = self.done.await;
    }
}
