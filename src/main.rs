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
}

fn init_tracing(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,tower_http=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    init_tracing(&cli.config.log_format);
    let cfg = Arc::new(cli.config);
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
    };
    let file = match &cfg.config_file {
        Some(path) => FileConfig::load(path).unwrap_or_else(|e| fail(e)),
        None => FileConfig::default(),
    };
    let providers = Providers::from_config(&file, &|v| std::env::var(v).ok()).unwrap_or_else(|e| fail(e));
    tracing::info!(providers = ?providers.names(), "providers configured");
    let file_agents = Arc::new(FileAgents::load(cfg.agents_dir.as_deref()));
    if let Some(dir) = &cfg.agents_dir {
        tracing::info!(dir = %dir.display(), loaded = file_agents.valid.len(), invalid = file_agents.invalid.len(), "agent definitions");
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
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("subagentd: {e}");
    std::process::exit(1);
}
