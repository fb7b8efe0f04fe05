//! The `subagentd` command: parses the config, starts telemetry, and calls into the library
//! (`service` for `serve` and `worker`; `budget` and `store` for the admin commands).

use std::sync::Arc;

use clap::{Parser, Subcommand};
use subagentd::config::{Config, FileConfig};
use subagentd::db::Database;
use subagentd::engine::definitions::FileAgents;
use subagentd::llm::Providers;
use subagentd::service::{Roles, Service};

#[derive(Parser)]
#[command(name = "subagentd", version, about = "Runs LLM sub-agents as durable jobs over HTTP")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    config: Config,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP API and the worker pool.
    Serve {
        /// Run the API only; workers run elsewhere (`subagentd worker`).
        #[arg(long)]
        no_workers: bool,
    },
    /// Run the worker pool only (no HTTP API).
    Worker,
    /// Apply database migrations and exit.
    Migrate,
    /// Manage API keys.
    Keys {
        #[command(subcommand)]
        action: KeysCmd,
    },
    /// Manage tenants' limits.
    Tenants {
        #[command(subcommand)]
        action: TenantsCmd,
    },
    /// Ask a running service whether it is ready (`GET /readyz`): exit 0 on 200, else 1. For
    /// container health checks: needs no shell and no curl.
    Healthcheck {
        /// The URL to ask (default: `/readyz` at `--listen`, a wildcard address asked on loopback).
        #[arg(long)]
        url: Option<String>,
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 5.0)]
        timeout: f64,
    },
}

#[derive(Subcommand)]
enum KeysCmd {
    /// Create a key for a tenant (`--tenant NAME`, required) and print it (the only time it is
    /// shown).
    Create {
        #[arg(long)]
        name: Option<String>,
    },
    /// Revoke a key by id or prefix (`sk_…` before the second underscore).
    Revoke { key: String },
    /// List keys (never the keys themselves): every tenant's, or `--tenant NAME`'s.
    List,
}

#[derive(Subcommand)]
enum TenantsCmd {
    /// Set a tenant's limits (omitted ones fall back to the configured defaults).
    Set {
        name: String,
        #[command(flatten)]
        limits: Box<subagentd::budget::Limits>,
    },
    /// Show a tenant's limits and current use.
    Show { name: String },
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// mimalloc: glibc's malloc was a tenth of the service's CPU under load (many small,
/// short-lived allocations across tokio's worker threads). Its 2.x line (Cargo.toml): over minutes
/// 3-30 of the soak, RSS moved by 11.8% with 3.x and by 7.8% with 2.x (BENCHMARKS.md, 2026-11-24).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// No transparent huge pages for this process (unless `MIMALLOC_ALLOW_THP=1`): mimalloc asks for
/// them on its heap, and the kernel then backs whole 2 MiB ranges of which a few pages are in use
/// and collapses more of them as the process runs, so resident memory crept up (20 of a soak's
/// 75 MiB were huge pages) while the heap stayed level.
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var("MIMALLOC_ALLOW_THP").as_deref() != Ok("1") {
        // SAFETY: PR_SET_THP_DISABLE takes integer arguments and only sets a flag on the process.
        unsafe {
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
        }
    }
}

fn main() {
    no_huge_pages();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(collect_when_idle)
        .build()
        .unwrap_or_else(|e| fail(format!("cannot start the runtime: {e}")))
        .block_on(run());
}

/// When one of tokio's worker threads runs out of work, at most once a second, it has mimalloc
/// collect its heap and purge what is free. mimalloc frees a thread's emptied pages only on that
/// thread, as it allocates again (and 3.x purged them only when something collected): after a
/// burst of connections, the pages their buffers had used stayed resident, and a 30-minute soak's
/// RSS rose with every burst (BENCHMARKS.md, 2026-11-24). Forcing it costs a walk over the
/// thread's pages.
fn collect_when_idle() {
    use std::cell::Cell;
    use std::time::{Duration, Instant};
    thread_local!(static LAST: Cell<Option<Instant>> = const { Cell::new(None) });
    let now = Instant::now();
    if LAST.get().is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
        return;
    }
    LAST.set(Some(now));
    // SAFETY: `mi_collect` only works on the calling thread's own heap and mimalloc's arenas,
    // under mimalloc's own synchronisation.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

async fn run() {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::Healthcheck { url, timeout } = &cli.command {
        let url = url.clone().unwrap_or_else(|| subagentd::config::readyz_url(cli.config.listen));
        std::process::exit(healthcheck(&url, *timeout).await);
    }
    let otel = subagentd::telemetry::init_tracing(&cli.config.log_format, cli.config.otlp_endpoint.as_deref())
        .unwrap_or_else(|e| fail(e));
    let cfg = Arc::new(cli.config);
    // The default request rate is checked like a tenant's own.
    let rate = subagentd::budget::Limits {
        requests_per_second: cfg.default_requests_per_second,
        request_burst: cfg.default_request_burst,
        ..Default::default()
    };
    if let Err(e) = subagentd::budget::validate(&rate) {
        fail(format!(
            "the default request rate (SUBAGENTD_DEFAULT_REQUESTS_PER_SECOND, SUBAGENTD_DEFAULT_REQUEST_BURST): {e}"
        ));
    }
    let roles = match cli.command {
        Command::Migrate => {
            let mut c = (*cfg).clone();
            c.no_migrate = false;
            match Database::open(&c).await {
                Ok(_) => {
                    eprintln!("migrations applied");
                    return;
                }
                Err(e) => fail(e),
            }
        }
        Command::Serve { no_workers } => Roles { api: true, workers: !no_workers },
        Command::Worker => Roles { api: false, workers: true },
        Command::Keys { action } => {
            let tenant = tenant_given(&matches);
            return admin(&cfg, Admin::Keys(action, tenant)).await;
        }
        Command::Tenants { action } => return admin(&cfg, Admin::Tenants(action)).await,
        Command::Healthcheck { .. } => unreachable!("answered above"),
    };
    let file = match &cfg.config_file {
        Some(path) => FileConfig::load(path).unwrap_or_else(|e| fail(e)),
        None => FileConfig::default(),
    };
    let providers = Providers::from_config(&file, &|v| std::env::var(v).ok()).unwrap_or_else(|e| fail(e));
    tracing::info!(providers = ?providers.names(), "providers configured");
    let file_agents = Arc::new(FileAgents::load(cfg.agents_dir.as_deref()).with_aliases(file.tool_aliases.clone()));
    if let Some(dir) = &cfg.agents_dir {
        tracing::info!(dir = %dir.display(), loaded = file_agents.valid.len(), invalid = file_agents.invalid.len(), "agent definitions");
        // What loaded but cannot be served as written (the same warnings GET /agents/{name} shows).
        for d in &file_agents.valid {
            let u = subagentd::tasks::submit::agents::unservable(d, &providers, None, &file_agents.tool_aliases);
            for w in d.notices.iter().chain(&u.warnings) {
                tracing::warn!(agent = %d.name, "agent definition: {w}");
            }
        }
    }
    let db = match Database::open(&cfg).await {
        Ok(db) => db,
        Err(e) => fail(e),
    };
    let service = match Service::start(cfg.clone(), db.pool.clone(), providers, file_agents, roles).await {
        Ok(s) => s,
        Err(e) => fail(format!("cannot start: {e}")),
    };
    if let Some(addr) = service.addr {
        tracing::info!(%addr, workers = roles.workers, "subagentd listening");
        println!("subagentd listening on http://{addr}");
    } else {
        tracing::info!("subagentd worker running");
    }
    shutdown_signal().await;
    tracing::info!("shutting down: draining");
    service.stop().await;
    db.pool.close().await;
    drop(db);
    tracing::info!("stopped");
    if let Some(p) = otel {
        let _ = p.shutdown();
    }
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("subagentd: {e}");
    std::process::exit(1);
}

enum Admin {
    /// With the `--tenant` given on the command line, if one was.
    Keys(KeysCmd, Option<String>),
    Tenants(TenantsCmd),
}

/// The `--tenant` of `keys …` when it was given on the command line. It is the global setting
/// (single-user mode's tenant, `SUBAGENTD_TENANT`, default `default`), which every subcommand
/// takes: its default or environment value must not pass for a choice (`keys list` would list
/// one tenant's keys, `keys create` make a key for `default`).
fn tenant_given(m: &clap::ArgMatches) -> Option<String> {
    let mut at = m;
    while let Some((_, sub)) = at.subcommand() {
        at = sub;
    }
    [at, m]
        .into_iter()
        .find(|x| x.value_source("tenant") == Some(clap::parser::ValueSource::CommandLine))
        .and_then(|x| x.get_one::<String>("tenant").cloned())
}

/// The admin commands: straight to the database (the service need not run).
async fn admin(cfg: &Config, cmd: Admin) {
    use subagentd::budget;
    use subagentd::store::tenants;
    let db = Database::open(cfg).await.unwrap_or_else(|e| fail(e));
    let out = match cmd {
        Admin::Keys(KeysCmd::Create { name }, tenant) => {
            let tenant = tenant.unwrap_or_else(|| fail("keys create: give the key's tenant with --tenant NAME"));
            budget::check_tenant_name(&tenant).unwrap_or_else(|e| fail(e));
            let (row, key) = tenants::create_key(&db.pool, &tenant, name.as_deref()).await.unwrap_or_else(|e| fail(e));
            eprintln!("created key {} for tenant {} (shown once; it is stored hashed):", row.id, row.tenant);
            key
        }
        Admin::Keys(KeysCmd::Revoke { key }, _) => {
            match tenants::revoke_key(&db.pool, &key).await.unwrap_or_else(|e| fail(e)) {
                Some(row) => format!("revoked {} ({}) of tenant {}", row.id, row.prefix, row.tenant),
                None => fail(format!("no key {key:?}")),
            }
        }
        Admin::Keys(KeysCmd::List, tenant) => {
            let rows = tenants::list_keys(&db.pool, tenant.as_deref()).await.unwrap_or_else(|e| fail(e));
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        }
        Admin::Tenants(TenantsCmd::Set { name, limits: l }) => {
            // The admin API's checks, then the same write.
            budget::set_limits(&db.pool, &name, &l).await.unwrap_or_else(|e| fail(e));
            format!("tenant {name}: {}", serde_json::to_string(&l).unwrap_or_default())
        }
        Admin::Tenants(TenantsCmd::Show { name }) => {
            let mut conn = db.pool.acquire().await.unwrap_or_else(|e| fail(e));
            let l = tenants::limits(&mut conn, &name, false).await.unwrap_or_else(|e| fail(e));
            let Some(l) = l else { fail(format!("no tenant {name:?}")) };
            let u = subagentd::store::budget::usage_now(&mut conn, &name).await.unwrap_or_else(|e| fail(e));
            serde_json::to_string_pretty(&serde_json::json!({"name": name, "limits": l, "use": u})).unwrap_or_default()
        }
    };
    println!("{out}");
    db.pool.close().await;
}

/// `subagentd healthcheck`: 0 when `url` answers 200 within `timeout` seconds; else 1, with why
/// on stderr.
async fn healthcheck(url: &str, timeout: f64) -> i32 {
    let timeout = std::time::Duration::from_secs_f64(timeout.clamp(0.1, 300.0));
    // No proxy: a container's HTTP_PROXY must not carry a check of its own loopback.
    let answer = match reqwest::Client::builder().no_proxy().timeout(timeout).build() {
        Ok(c) => c.get(url).send().await,
        Err(e) => {
            eprintln!("healthcheck: {e}");
            return 1;
        }
    };
    match answer {
        Ok(r) if r.status() == reqwest::StatusCode::OK => 0,
        Ok(r) => {
            let status = r.status();
            eprintln!("healthcheck: {url} answered {status}: {}", r.text().await.unwrap_or_default());
            1
        }
        Err(e) => {
            eprintln!("healthcheck: {url}: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// A subcommand's own flag under the id of a global setting shadows it: its type then
    /// decides how the setting is read (`tenants set` panicked so), or the setting's default
    /// passes for the flag's value (`keys list` listed only `default`'s keys).
    #[test]
    fn no_subcommand_flag_takes_the_id_of_a_global_setting() {
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        let globals: Vec<String> =
            cmd.get_arguments().filter(|a| a.is_global_set()).map(|a| a.get_id().to_string()).collect();
        assert!(globals.iter().any(|g| g == "tenant") && globals.iter().any(|g| g == "max_running"));
        fn walk(c: &clap::Command, globals: &[String], path: &str) {
            for sub in c.get_subcommands() {
                let here = format!("{path} {}", sub.get_name());
                for a in sub.get_arguments() {
                    assert!(!globals.contains(&a.get_id().to_string()), "`{here}` redefines --{}", a.get_id());
                }
                walk(sub, globals, &here);
            }
        }
        walk(&cmd, &globals, "subagentd");
    }

    #[test]
    fn the_keys_tenant_counts_only_when_given_on_the_command_line() {
        let given = |args: &[&str]| tenant_given(&Cli::command().get_matches_from(args));
        assert_eq!(given(&["subagentd", "keys", "list"]), None);
        assert_eq!(given(&["subagentd", "keys", "list", "--tenant", "acme"]), Some("acme".into()));
        assert_eq!(given(&["subagentd", "--tenant", "acme", "keys", "create"]), Some("acme".into()));
        assert_eq!(
            given(&["subagentd", "keys", "create", "--tenant", "initech", "--name", "ci"]),
            Some("initech".into())
        );
    }
}
