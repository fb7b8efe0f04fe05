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
    /// The lifecycle room the API serves, if it runs.
    pub tasks: Option<crate::tasks::Lifecycle>,
    done: JoinHandle<()>,
}

/// The tools' callers and the workspace cache, from the configuration.
async fn tools_of(cfg: &Config) -> std::io::Result<(crate::tools::Caller, Arc<crate::workspace::Workspaces>)> {
    let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    let caller = crate::tools::Caller::from_config(cfg).map_err(|e| invalid(e.to_string()))?;
    let sandbox = sandbox_of(cfg);
    // Images only where commands run: the cache is opened (what a killed process left half-made
    // removed) and the service's default image checked, at start.
    let images = match &sandbox {
        Some(_) => {
            let settings = crate::tools::image::Settings::from_config(cfg).map_err(invalid)?;
            let images = crate::tools::image::Images::open(settings).await.map_err(invalid)?;
            if let Some(default) = cfg.sandbox_image.as_deref() {
                images.check(default).map_err(|e| invalid(format!("SUBAGENTD_SANDBOX_IMAGE: {e}")))?;
            }
            Some(Arc::new(images))
        }
        None => None,
    };
    let caller = caller.with_sandbox(sandbox).with_images(images);
    let workspaces = crate::workspace::Workspaces::from_config(cfg).map_err(invalid)?;
    Ok((caller, Arc::new(workspaces)))
}

/// The sandbox `run_command` runs in, unless turned off or unable to start here (said in the
/// log). Each process keeps its tasks' copies under `<sandbox-dir>/<pid>`; the copies left by a
/// process that is gone are removed.
fn sandbox_of(cfg: &Config) -> Option<Arc<crate::tools::sandbox::Sandbox>> {
    use crate::tools::sandbox::Runtime;
    let off = cfg.builtin_tools_off.split(',').any(|t| t.trim() == "run_command");
    let dir = crate::jobs::copy::process_dir(cfg);
    crate::jobs::copy::sweep_gone_processes(dir.parent().unwrap_or(&dir), "");
    if off {
        return None;
    }
    let limits = crate::tools::sandbox::Limits {
        max_timeout: std::time::Duration::from_secs(cfg.sandbox_max_timeout_seconds.max(1)),
        memory_bytes: cfg.sandbox_memory_mb.max(16) << 20,
        processes: cfg.sandbox_processes.max(1),
        write_bytes: cfg.sandbox_write_mb << 20,
        write_entries: cfg.sandbox_write_entries,
        tmp_bytes: cfg.sandbox_tmp_mb << 20,
    };
    let (runtime, program) = Runtime::of(cfg);
    match crate::tools::sandbox::Sandbox::probe(
        runtime,
        program,
        limits,
        cfg.sandbox_max_commands,
        cfg.sandbox_tenant_commands,
        &dir,
    ) {
        Ok(s) => {
            tracing::info!(limits = %s.describe(), "run_command runs in the sandbox");
            Some(Arc::new(s))
        }
        Err(e) => {
            tracing::warn!(
                error = %e,
                "the sandbox cannot start on this host: run_command is not offered (see docs/operations.md, \"The sandbox\")"
            );
            None
        }
    }
}

impl Service {
    pub async fn start(
        cfg: Arc<Config>,
        pool: PgPool,
        providers: Providers,
        file_agents: Arc<FileAgents>,
        roles: Roles,
    ) -> std::io::Result<Service> {
        // The descriptor budget, first: it raises the descriptor limit, and the tenants' default
        // holds come from its connection cap.
        let plan = crate::http::capacity::Plan::make(&cfg);
        let cfg = {
            let mut c = (*cfg).clone();
            plan.apply(&mut c);
            Arc::new(c)
        };
        let (tool_caller, workspaces) = tools_of(&cfg).await?;
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
        let refresh_live = tokio::spawn(hub.clone().refresh_live(listener_stop.clone()));
        let upkeep = crate::jobs::Upkeep::start(&pool, &cfg, &listener_stop).await;

        let local_worker = roles.workers.then(|| {
            let (p, c) = (providers.clone(), tool_caller.clone());
            Worker::new(pool.clone(), hub.clone(), p, c, cfg.clone(), workspaces.clone())
        });
        let worker =
            local_worker.clone().map(|w| tokio::spawn(crate::jobs::run_worker(w, shutdown.clone(), cfg.drain_grace())));

        let parts = crate::tasks::Parts {
            pool: pool.clone(),
            cfg: cfg.clone(),
            providers,
            file_agents,
            tool_caller,
            hub: hub.clone(),
            limits_cache: Arc::new(crate::cache::TtlCache::new(std::time::Duration::from_secs(5))),
            tools_cache: Arc::new(crate::cache::TtlCache::new(std::time::Duration::from_secs(5))),
            shutdown: shutdown.clone(),
            guard: crate::tasks::guard::Guard::new(),
            workspaces,
        };
        let resources = crate::resources::Resources::new(&parts);
        let tasks = crate::tasks::Lifecycle::new(parts, local_worker.as_ref().map(|w| w.shortcut()));
        // A worker process queues the tasks whose time has come and makes schedules' ticks.
        let timer_stop = CancellationToken::new();
        let timer = roles.workers.then(|| crate::jobs::timer::Timer { room: tasks.clone() }.start(timer_stop.clone()));

        let mut room = None;
        let (addr, server) = if roles.api {
            let loopback = cfg.listen.ip().is_loopback();
            let auth = crate::http::auth::Auth::new(mode, loopback);
            let conns = Arc::new(crate::http::capacity::Connections::new(plan.cap));
            tracing::info!(
                descriptors = plan.limit,
                reserve = plan.reserve.total(),
                reserve_parts = %serde_json::to_string(&plan.reserve).unwrap_or_default(),
                connection_cap = plan.cap,
                set_by = if plan.configured { "SUBAGENTD_MAX_CONNECTIONS" } else { "descriptors less the reserve" },
                default_max_streams = cfg.default_max_streams.unwrap_or(0),
                default_max_waits = cfg.default_max_waits.unwrap_or(0),
                "connections: descriptor budget"
            );
            let state = AppState::new(tasks.clone(), resources, auth, conns.clone());
            room = Some(tasks);
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
            let limits = http::serve::Limits {
                idle: cfg.http_idle_timeout(),
                stall: std::time::Duration::from_secs(cfg.stream_stall_seconds.max(1)),
                send_buffer: cfg.socket_send_buffer,
            };
            let server = tokio::spawn(http::serve::serve(listener, app, conns, limits, stop));
            (Some(addr), Some(server))
        } else {
            (None, None)
        };

        let done = tokio::spawn(async move {
            if let Some(w) = worker {
                let _ = w.await;
            }
            timer_stop.cancel();
            if let Some(t) = timer {
                let _ = t.await;
            }
            if let Some(s) = server {
                let _ = s.await;
            }
            listener_stop.cancel();
            let _ = listen.await;
            let _ = publish.await;
            let _ = refresh_live.await;
            upkeep.join().await;
        });
        Ok(Service { addr, shutdown, hub, tasks: room, done })
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
