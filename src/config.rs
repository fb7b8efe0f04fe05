//! One `Config` for every command, from flags and `SUBAGENTD_*` / `DATABASE_URL` env vars, and
//! the optional TOML file (`FileConfig`).
//!
//! The bottom of the house: it imports nothing of this crate, and everything may import it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// TOML file with providers, model aliases, prices and retry policy.
    #[arg(long = "config", env = "SUBAGENTD_CONFIG", global = true)]
    pub config_file: Option<PathBuf>,

    /// Directory of agent definitions (Markdown with YAML front matter, `.claude/agents` format).
    #[arg(long, env = "SUBAGENTD_AGENTS_DIR", global = true)]
    pub agents_dir: Option<PathBuf>,

    /// Postgres URL. Unset: start a private cluster under `--data-dir` (embedded bootstrap).
    #[arg(long, env = "DATABASE_URL", global = true)]
    pub database_url: Option<String>,

    /// Address the HTTP API listens on.
    #[arg(long, env = "SUBAGENTD_LISTEN", default_value = "127.0.0.1:8080", global = true)]
    pub listen: SocketAddr,

    /// Directory for local state; the embedded Postgres cluster lives in `<data-dir>/pg`.
    #[arg(long, env = "SUBAGENTD_DATA_DIR", default_value = ".subagentd", global = true)]
    pub data_dir: PathBuf,

    /// Directory holding `initdb` and `postgres` (otherwise PATH, `pg_config --bindir`,
    /// `/usr/lib/postgresql/*/bin`).
    #[arg(long, env = "SUBAGENTD_PG_BIN_DIR", global = true)]
    pub pg_bin_dir: Option<PathBuf>,

    /// Do not apply migrations at start.
    #[arg(long, env = "SUBAGENTD_NO_MIGRATE", global = true)]
    pub no_migrate: bool,

    /// Maximum connections in the Postgres pool.
    #[arg(long, env = "SUBAGENTD_DB_MAX_CONNECTIONS", default_value_t = 20, global = true)]
    pub db_max_connections: u32,

    /// Running sub-agents per process (the worker semaphore).
    #[arg(long, env = "SUBAGENTD_MAX_RUNNING", default_value_t = 64, global = true)]
    pub max_running: usize,

    /// Most tasks claimed per claim statement; claims start at 4 and double while each comes back full.
    #[arg(long, env = "SUBAGENTD_CLAIM_BATCH", default_value_t = 32, global = true)]
    pub claim_batch: usize,

    /// Polling fallback for new work when no NOTIFY arrives, in milliseconds.
    #[arg(long, env = "SUBAGENTD_POLL_INTERVAL_MS", default_value_t = 1000, global = true)]
    pub poll_interval_ms: u64,

    /// Lease length of a running task, in seconds.
    #[arg(long, env = "SUBAGENTD_LEASE_SECONDS", default_value_t = 30, global = true)]
    pub lease_seconds: u64,

    /// How often a worker renews its leases, in seconds.
    #[arg(long, env = "SUBAGENTD_HEARTBEAT_SECONDS", default_value_t = 10, global = true)]
    pub heartbeat_seconds: u64,

    /// Claims of one task before it fails with `worker_lost`.
    #[arg(long, env = "SUBAGENTD_MAX_ATTEMPTS", default_value_t = 3, global = true)]
    pub max_attempts: i32,

    /// Model used when neither the request nor the agent definition names one.
    #[arg(long, env = "SUBAGENTD_DEFAULT_MODEL", global = true)]
    pub default_model: Option<String>,

    /// Largest accepted request body, in bytes.
    #[arg(long, env = "SUBAGENTD_MAX_BODY_BYTES", default_value_t = 1024 * 1024, global = true)]
    pub max_body_bytes: usize,

    /// Where tools, MCP servers and webhooks may be: `*` (any public address), hosts
    /// (`api.example.com`, `*.example.com`) and CIDRs (`10.0.0.0/8`, `127.0.0.1/32`).
    /// Private, loopback and link-local addresses need a CIDR.
    #[arg(long, env = "SUBAGENTD_TOOL_ALLOW", default_value = "*", global = true)]
    pub tool_allow: String,

    /// Tool results longer than this are cut, with a visible marker, in bytes.
    #[arg(long, env = "SUBAGENTD_TOOL_RESULT_MAX_BYTES", default_value_t = 65536, global = true)]
    pub tool_result_max_bytes: usize,

    /// Default timeout of a tool call, in milliseconds (a tool may set its own).
    #[arg(long, env = "SUBAGENTD_TOOL_TIMEOUT_MS", default_value_t = 30000, global = true)]
    pub tool_timeout_ms: u64,

    /// Built-in tools turned off for the whole service, comma-separated (`web_fetch`,
    /// `web_search`). A tenant can turn more off for itself, never one back on.
    #[arg(long, env = "SUBAGENTD_BUILTIN_TOOLS_OFF", default_value = "", global = true)]
    pub builtin_tools_off: String,

    /// Where `web_fetch` may go, in `SUBAGENTD_TOOL_ALLOW`'s syntax; unset: the same as
    /// `SUBAGENTD_TOOL_ALLOW`. Private, loopback and link-local addresses need a CIDR.
    #[arg(long, env = "SUBAGENTD_WEB_FETCH_ALLOW", global = true)]
    pub web_fetch_allow: Option<String>,

    /// The most of a fetched page's body `web_fetch` reads, in bytes (the rest is never read);
    /// the text the model gets is cut further, to the tool-result cap.
    #[arg(long, env = "SUBAGENTD_WEB_FETCH_MAX_BYTES", default_value_t = 2 * 1024 * 1024, global = true)]
    pub web_fetch_max_bytes: usize,

    /// Where a task's git workspace may be fetched from, in `SUBAGENTD_TOOL_ALLOW`'s syntax;
    /// unset: the same as `SUBAGENTD_TOOL_ALLOW`.
    #[arg(long, env = "SUBAGENTD_WORKSPACE_GIT_ALLOW", global = true)]
    pub workspace_git_allow: Option<String>,

    /// Extra CA certificates (PEM) a git server's certificate may chain to, beside the
    /// system's: an internal git server's own CA.
    #[arg(long, env = "SUBAGENTD_WORKSPACE_CA_FILE", global = true)]
    pub workspace_ca_file: Option<PathBuf>,

    /// The disk cache of workspaces' trees (fetched commits, unpacked uploads); unset:
    /// `<data-dir>/workspaces`. Disposable: emptied at will, filled again on use.
    #[arg(long, env = "SUBAGENTD_WORKSPACE_DIR", global = true)]
    pub workspace_dir: Option<PathBuf>,

    /// The cache's size bound in MiB; past it, the trees least recently used (and not in use)
    /// are removed.
    #[arg(long, env = "SUBAGENTD_WORKSPACE_CACHE_MB", default_value_t = 2048, global = true)]
    pub workspace_cache_mb: u64,

    /// A git fetch's caps: its time in seconds, and the bytes it may bring (MiB).
    #[arg(long, env = "SUBAGENTD_WORKSPACE_FETCH_TIMEOUT_SECONDS", default_value_t = 120, global = true)]
    pub workspace_fetch_timeout_seconds: u64,
    #[arg(long, env = "SUBAGENTD_WORKSPACE_FETCH_MAX_MB", default_value_t = 512, global = true)]
    pub workspace_fetch_max_mb: u64,

    /// A workspace's tree at most: its files, and their bytes (MiB) — a checked-out commit or
    /// an upload's uncompressed contents.
    #[arg(long, env = "SUBAGENTD_WORKSPACE_MAX_FILES", default_value_t = 100_000, global = true)]
    pub workspace_max_files: u64,
    #[arg(long, env = "SUBAGENTD_WORKSPACE_MAX_MB", default_value_t = 1024, global = true)]
    pub workspace_max_mb: u64,

    /// An upload (`PUT /workspaces/{name}`) at most, compressed, in MiB.
    #[arg(long, env = "SUBAGENTD_WORKSPACE_UPLOAD_MAX_MB", default_value_t = 100, global = true)]
    pub workspace_upload_max_mb: u64,

    /// The compressed bytes of a tenant's uploaded workspaces together, in MiB.
    #[arg(long, env = "SUBAGENTD_WORKSPACE_QUOTA_MB", default_value_t = 1024, global = true)]
    pub workspace_quota_mb: u64,

    /// The sandbox `run_command` runs in: the bubblewrap program (`bwrap`, looked up on PATH).
    /// Where it cannot start, the service says so at start and does not offer `run_command`.
    #[arg(long, env = "SUBAGENTD_SANDBOX_BWRAP", default_value = "bwrap", global = true)]
    pub sandbox_bwrap: String,

    /// What makes the sandbox: `bwrap` (bubblewrap: namespaces of the host's kernel) or `gvisor`
    /// (`runsc`, rootless: the commands' system calls answered by gVisor's kernel in user space,
    /// not the host's). docs/security.md compares them.
    #[arg(long, env = "SUBAGENTD_SANDBOX_RUNTIME", default_value = "bwrap",
          value_parser = ["bwrap", "gvisor"], global = true)]
    pub sandbox_runtime: String,

    /// gVisor's program, for `SUBAGENTD_SANDBOX_RUNTIME=gvisor` (looked up on PATH).
    #[arg(long, env = "SUBAGENTD_SANDBOX_RUNSC", default_value = "runsc", global = true)]
    pub sandbox_runsc: String,

    /// Where tasks' writable copies of their workspaces live while they run; unset:
    /// `<data-dir>/sandboxes` (best on the workspace cache's filesystem, so that copies share
    /// blocks where it can). Disposable: a copy is rebuilt from its task's saved changes.
    #[arg(long, env = "SUBAGENTD_SANDBOX_DIR", global = true)]
    pub sandbox_dir: Option<PathBuf>,

    /// Commands running at once in this process, across tasks; 0: the number of cores.
    #[arg(long, env = "SUBAGENTD_SANDBOX_MAX_COMMANDS", default_value_t = 0, global = true)]
    pub sandbox_max_commands: usize,

    /// Commands running at once for one tenant in this process, a share of
    /// `SUBAGENTD_SANDBOX_MAX_COMMANDS` (0: half of it, at least 1), so that no tenant holds every
    /// slot; waiting commands are served across tenants in turn.
    #[arg(long, env = "SUBAGENTD_SANDBOX_TENANT_COMMANDS", default_value_t = 0, global = true)]
    pub sandbox_tenant_commands: usize,

    /// A command's wall time at most, in seconds (`timeout_seconds` is capped to it; the
    /// default is 120 s, or this if lower). Its CPU time is capped to the same.
    #[arg(long, env = "SUBAGENTD_SANDBOX_MAX_TIMEOUT_SECONDS", default_value_t = 600, global = true)]
    pub sandbox_max_timeout_seconds: u64,

    /// A command's memory at most, in MiB (a cgroup where the host offers one, else its
    /// address space).
    #[arg(long, env = "SUBAGENTD_SANDBOX_MEMORY_MB", default_value_t = 2048, global = true)]
    pub sandbox_memory_mb: u64,

    /// A command's processes and threads at most (a cgroup's `pids.max` where the host offers
    /// one, else `RLIMIT_NPROC`).
    #[arg(long, env = "SUBAGENTD_SANDBOX_PROCESSES", default_value_t = 256, global = true)]
    pub sandbox_processes: u64,

    /// What a task's copy may grow by over its starting tree, and any one file's size, in MiB;
    /// and the size of a command's own `/tmp`.
    #[arg(long, env = "SUBAGENTD_SANDBOX_WRITE_MB", default_value_t = 1024, global = true)]
    pub sandbox_write_mb: u64,
    #[arg(long, env = "SUBAGENTD_SANDBOX_TMP_MB", default_value_t = 256, global = true)]
    pub sandbox_tmp_mb: u64,

    /// A task's diff (`GET /tasks/{id}/diff`) at most, in KiB: past it, whole files are left
    /// out and named.
    #[arg(long, env = "SUBAGENTD_SANDBOX_DIFF_MAX_KB", default_value_t = 1024, global = true)]
    pub sandbox_diff_max_kb: u64,

    /// A binary file's size at most, in KiB, to be in the diff in git's binary form (`GIT
    /// binary patch`); a larger one is left out and named in `diff.omitted` with its size and
    /// hash.
    #[arg(long, env = "SUBAGENTD_SANDBOX_DIFF_BINARY_KB", default_value_t = 256, global = true)]
    pub sandbox_diff_binary_kb: u64,

    /// gitignore patterns, comma-separated, that a task's diff and saved changes leave out even
    /// where the tree has no `.gitignore` (read as a `.gitignore` at the tree's root, before the
    /// tree's own, which may un-ignore with `!`). Empty: only the tree's own.
    #[arg(
        long,
        env = "SUBAGENTD_SANDBOX_IGNORE",
        default_value = "__pycache__/,*.pyc,target/,node_modules/",
        global = true
    )]
    pub sandbox_ignore: String,

    /// What a task's saved changes (kept with each checkpoint, so that a rescued run rebuilds
    /// its copy) hold at most, in MiB: a file that does not fit is left out, named with its size
    /// and hash. Bounds each checkpoint's message to PostgreSQL and the memory it takes.
    #[arg(long, env = "SUBAGENTD_SANDBOX_KEEP_MB", default_value_t = 64, global = true)]
    pub sandbox_keep_mb: u64,

    /// What a tenant's kept changes and diffs (`task_diffs`, until retention drops their day)
    /// may hold together, in MiB: past it, the tools that change a task's copy are refused with a
    /// sentence to the model. Its use is in `GET /admin/tenants/{name}` (`storage`).
    #[arg(long, env = "SUBAGENTD_TENANT_STORAGE_MB", default_value_t = 10240, global = true)]
    pub tenant_storage_mb: u64,

    /// Entries (files, directories, links) a task's copy may gain over its starting tree: past
    /// it a command is stopped (outcome `limit`), as past the write allowance.
    #[arg(long, env = "SUBAGENTD_SANDBOX_WRITE_ENTRIES", default_value_t = 65536, global = true)]
    pub sandbox_write_entries: u64,

    /// The OCI image commands run in when a task names no `environment` (`host[:port]/repo:tag`
    /// or `…@sha256:…`); unset: the host's `/usr`.
    #[arg(long, env = "SUBAGENTD_SANDBOX_IMAGE", global = true)]
    pub sandbox_image: Option<String>,

    /// Registries images may be pulled from (hosts, `*.domain`, CIDRs, `*` for any public host),
    /// each connection checked by the address guard; unset: `SUBAGENTD_TOOL_ALLOW`.
    #[arg(long, env = "SUBAGENTD_REGISTRY_ALLOW", global = true)]
    pub registry_allow: Option<String>,

    /// Registries (`host:port`, comma-separated) reached over plain HTTP, as Docker's
    /// `insecure-registries`.
    #[arg(long, env = "SUBAGENTD_INSECURE_REGISTRIES", default_value = "", global = true)]
    pub insecure_registries: String,

    /// Where an environment's network (`network.allow`, through the egress proxy) may reach at
    /// all, whatever a tenant lists: the same syntax as `SUBAGENTD_TOOL_ALLOW`; `*` is any public
    /// address (a private one only where a CIDR here allows it).
    #[arg(long, env = "SUBAGENTD_SANDBOX_EGRESS_ALLOW", default_value = "*", global = true)]
    pub sandbox_egress_allow: String,

    /// The ports an environment's network may reach (comma-separated; `*`: any).
    #[arg(long, env = "SUBAGENTD_SANDBOX_EGRESS_PORTS", default_value = "80,443", global = true)]
    pub sandbox_egress_ports: String,

    /// The image cache (one unpacked root per manifest digest); unset: `<data-dir>/images`.
    /// Disposable; the sandbox's uid must be able to read it.
    #[arg(long, env = "SUBAGENTD_IMAGE_DIR", global = true)]
    pub image_dir: Option<PathBuf>,

    /// An image's bytes at most, in MiB: compressed as pulled, and unpacked.
    #[arg(long, env = "SUBAGENTD_IMAGE_MAX_MB", default_value_t = 4096, global = true)]
    pub image_max_mb: u64,

    /// An image's entries (files, directories, links) at most.
    #[arg(long, env = "SUBAGENTD_IMAGE_MAX_ENTRIES", default_value_t = 500_000, global = true)]
    pub image_max_entries: u64,

    /// The image cache's bound, in MiB: past it, the roots used longest ago go (never one in use).
    #[arg(long, env = "SUBAGENTD_IMAGE_CACHE_MB", default_value_t = 20480, global = true)]
    pub image_cache_mb: u64,

    /// A pull's time at most, in seconds (a task waits for it within its own timeout).
    #[arg(long, env = "SUBAGENTD_IMAGE_PULL_TIMEOUT_SECONDS", default_value_t = 600, global = true)]
    pub image_pull_timeout_seconds: u64,

    /// `web_fetch` calls a tenant may make per minute, across replicas (a tenant's own
    /// `web_fetches_per_minute` wins; 0: none).
    #[arg(long, env = "SUBAGENTD_DEFAULT_WEB_FETCHES_PER_MINUTE", default_value_t = 60, global = true)]
    pub default_web_fetches_per_minute: i32,

    /// `web_search` on an Anthropic model is Anthropic's own server-side web search (priced per
    /// search: `web_search` under `[pricing]`), rather than `SUBAGENTD_WEB_SEARCH_URL`'s API.
    #[arg(long, env = "SUBAGENTD_WEB_SEARCH_ANTHROPIC", default_value_t = false, global = true)]
    pub web_search_anthropic: bool,

    /// A SearXNG-compatible search API (`{url}/search?q=…&format=json`) that `web_search` asks;
    /// unset (and no `anthropic` backend): `web_search` is not offered.
    #[arg(long, env = "SUBAGENTD_WEB_SEARCH_URL", global = true)]
    pub web_search_url: Option<String>,

    /// Tool calls of one turn run at once, at most this many.
    #[arg(long, env = "SUBAGENTD_TOOL_CONCURRENCY", default_value_t = 8, global = true)]
    pub tool_concurrency: usize,

    /// How requests are authenticated: `auto` (API keys once any exist; before that single-user
    /// mode, but only on a loopback address), `keys` (always API keys), `none` (single-user).
    #[arg(long, env = "SUBAGENTD_AUTH", default_value = "auto", global = true)]
    pub auth: String,

    /// Bearer token of the admin API (`/admin/...`); unset: the admin API is off.
    #[arg(long, env = "SUBAGENTD_ADMIN_TOKEN", global = true, hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Default spend limit per tenant per UTC day, in USD (a tenant's own limit wins).
    #[arg(long, env = "SUBAGENTD_DEFAULT_USD_PER_DAY", global = true)]
    pub default_usd_per_day: Option<rust_decimal::Decimal>,

    /// Default spend limit per tenant per UTC calendar month, in USD.
    #[arg(long, env = "SUBAGENTD_DEFAULT_USD_PER_MONTH", global = true)]
    pub default_usd_per_month: Option<rust_decimal::Decimal>,

    /// Default token limit per tenant per UTC day.
    #[arg(long, env = "SUBAGENTD_DEFAULT_TOKENS_PER_DAY", global = true)]
    pub default_tokens_per_day: Option<i64>,

    /// Default limit of running sub-agents per tenant (across replicas).
    #[arg(long, env = "SUBAGENTD_DEFAULT_MAX_RUNNING", global = true)]
    pub default_max_running: Option<i32>,

    /// Default limit of queued tasks per tenant.
    #[arg(long, env = "SUBAGENTD_DEFAULT_MAX_QUEUED", global = true)]
    pub default_max_queued: Option<i32>,

    /// Default limit of scheduled tasks (waiting for their time) per tenant.
    #[arg(long, env = "SUBAGENTD_DEFAULT_MAX_SCHEDULED", default_value_t = 100_000, global = true)]
    pub default_max_scheduled: i32,

    /// Default API request rate per tenant, per process (a tenant's own rate wins); unset: no
    /// rate limit. With N replicas a tenant may make N times this rate.
    #[arg(long, env = "SUBAGENTD_DEFAULT_REQUESTS_PER_SECOND", global = true)]
    pub default_requests_per_second: Option<f64>,

    /// Default burst above the request rate (unset: one second's worth of the rate).
    #[arg(long, env = "SUBAGENTD_DEFAULT_REQUEST_BURST", global = true)]
    pub default_request_burst: Option<i32>,

    /// Default of the event streams a tenant may hold open at once on one replica (a tenant's own
    /// `max_streams` wins). Unset: a quarter of the replica's connection cap.
    #[arg(long, env = "SUBAGENTD_DEFAULT_MAX_STREAMS", global = true)]
    pub default_max_streams: Option<i32>,

    /// Default of the waiting requests a tenant may hold at once on one replica (a tenant's own
    /// `max_waits` wins). Unset: half of the replica's connection cap.
    #[arg(long, env = "SUBAGENTD_DEFAULT_MAX_WAITS", global = true)]
    pub default_max_waits: Option<i32>,

    /// Connections this replica serves at once; beyond it a connection is answered 503
    /// `at_capacity` at once. Unset: the descriptor limit less what the rest of the process
    /// needs (logged at start).
    #[arg(long, env = "SUBAGENTD_MAX_CONNECTIONS", global = true)]
    pub max_connections: Option<usize>,

    /// A response that cannot be written for this long (the client stopped reading) is closed,
    /// in seconds.
    #[arg(long, env = "SUBAGENTD_STREAM_STALL_SECONDS", default_value_t = 30, global = true)]
    pub stream_stall_seconds: u64,

    /// The send buffer of accepted sockets, in bytes (SO_SNDBUF); unset: the system's.
    #[arg(long, env = "SUBAGENTD_SOCKET_SEND_BUFFER", global = true)]
    pub socket_send_buffer: Option<usize>,

    /// The address clients reach this service at (`https://agents.example.com`), behind its proxy:
    /// MCP accepts requests whose `Origin` is this (or the `Host` they came to), and A2A agent
    /// cards name it. Unset: the `Host` (and `X-Forwarded-Proto`) of each request.
    #[arg(long, env = "SUBAGENTD_PUBLIC_URL", global = true)]
    pub public_url: Option<String>,

    /// How long a plain MCP `tools/call` of `task` (or `task_wait`) waits for the task before it
    /// answers that it is still running, in seconds (MCP clients give a call about 60 s).
    #[arg(long, env = "SUBAGENTD_MCP_WAIT_SECONDS", default_value_t = 50, global = true)]
    pub mcp_wait_seconds: u64,

    /// How long an MCP call of `task` (or `task_wait`) that asked for progress (a
    /// `progressToken`) is held for its task, in seconds, with a progress notification at least
    /// every 20 s (clients that reset their timeout on progress get the answer in one call).
    #[arg(long, env = "SUBAGENTD_MCP_PROGRESS_WAIT_SECONDS", default_value_t = 600, global = true)]
    pub mcp_progress_wait_seconds: u64,

    /// MCP sessions not seen for this many days are forgotten (a later request naming one is
    /// adopted as a fresh session); 0 keeps them forever.
    #[arg(long, env = "SUBAGENTD_MCP_SESSION_IDLE_DAYS", default_value_t = 30, global = true)]
    pub mcp_session_idle_days: u32,

    /// Offer one MCP tool per agent type (`agent_<name>`) besides `task`.
    #[arg(long, env = "SUBAGENTD_MCP_TOOL_PER_AGENT", global = true)]
    pub mcp_tool_per_agent: bool,

    /// Output tokens a provider call may produce (sent as `max_tokens`, and reserved).
    #[arg(long, env = "SUBAGENTD_MAX_OUTPUT_TOKENS", default_value_t = 4096, global = true)]
    pub max_output_tokens: u32,

    /// Longest run a task may ask for with `timeout_seconds` (and the default), in seconds.
    #[arg(long, env = "SUBAGENTD_MAX_TASK_TIMEOUT_SECONDS", default_value_t = 3600, global = true)]
    pub max_task_timeout_seconds: u64,

    /// Longest a paused run waits for its actions to be answered (a task's
    /// `action_timeout_seconds` is capped by it, and defaults to it), in seconds.
    #[arg(long, env = "SUBAGENTD_MAX_ACTION_TIMEOUT_SECONDS", default_value_t = 86400, global = true)]
    pub max_action_timeout_seconds: u64,

    /// Days after which conversations, events and stored diffs are dropped, a day's partition at
    /// a time (an open task's rows are kept; tasks and the usage ledger stay). 0 keeps them forever.
    #[arg(long, env = "SUBAGENTD_RETENTION_DAYS", default_value_t = 30, global = true)]
    pub retention_days: u32,

    /// How often each process vacuums the queue (`task_queue`), in seconds: its dead row versions
    /// slow every claim until cleared, and autovacuum comes at most once a minute. 0 leaves it
    /// to autovacuum.
    #[arg(long, env = "SUBAGENTD_QUEUE_VACUUM_SECONDS", default_value_t = 5, global = true)]
    pub queue_vacuum_seconds: u64,

    /// Days the usage ledger (`llm_calls`) is kept; the daily rollups are kept forever.
    /// 0 keeps the ledger forever.
    #[arg(long, env = "SUBAGENTD_LEDGER_RETENTION_DAYS", default_value_t = 400, global = true)]
    pub ledger_retention_days: u32,

    /// On SIGTERM/SIGINT, how long running sub-agents may finish before they are released
    /// back to the queue, in seconds.
    #[arg(long, env = "SUBAGENTD_DRAIN_GRACE_SECONDS", default_value_t = 10, global = true)]
    pub drain_grace_seconds: u64,

    /// How long an HTTP connection may go without sending a complete request head, in
    /// seconds: from its accept, and again from the end of each response (an idle keep-alive
    /// connection). The connection is then closed. A request's body must arrive in full
    /// within the same time, counted from when its handler starts reading it (else 408 and the
    /// connection closed). A request being answered, however long (`?wait=true`, an event
    /// stream), is not affected. 0: never (not advised: a client that connects and sends nothing,
    /// or trickles a body, then holds its connection forever).
    #[arg(long, env = "SUBAGENTD_HTTP_IDLE_TIMEOUT_SECONDS", default_value_t = 30, global = true)]
    pub http_idle_timeout_seconds: u64,

    /// Default wait of `?wait=true`, in seconds.
    #[arg(long, env = "SUBAGENTD_WAIT_DEFAULT_SECONDS", default_value_t = 60, global = true)]
    pub wait_default_seconds: u64,

    /// Longest wait a client may ask for with `?wait=true&timeout=`, in seconds.
    #[arg(long, env = "SUBAGENTD_WAIT_MAX_SECONDS", default_value_t = 300, global = true)]
    pub wait_max_seconds: u64,

    /// Tenant of every request until API keys are configured (single-user mode).
    #[arg(long, env = "SUBAGENTD_TENANT", default_value = "default", global = true)]
    pub tenant: String,

    /// Export spans over OTLP/HTTP to this collector (e.g. `http://127.0.0.1:4318`); unset: off.
    #[arg(long, env = "SUBAGENTD_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,

    /// Log format: `text` or `json`.
    #[arg(long, env = "SUBAGENTD_LOG_FORMAT", default_value = "text", global = true)]
    pub log_format: String,
}

impl Config {
    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_seconds.max(1))
    }
    pub fn heartbeat(&self) -> Duration {
        Duration::from_secs(self.heartbeat_seconds.max(1))
    }
    pub fn drain_grace(&self) -> Duration {
        Duration::from_secs(self.drain_grace_seconds)
    }
    /// The HTTP idle timeout; `None` when it is 0 (no bound).
    pub fn http_idle_timeout(&self) -> Option<Duration> {
        Some(self.http_idle_timeout_seconds).filter(|s| *s > 0).map(Duration::from_secs)
    }
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms.max(10))
    }

    /// Defaults for tests and embedders, as if no flag or env var were given.
    pub fn defaults() -> Self {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            c: Config,
        }
        let p: P = clap::Parser::parse_from(["subagentd"]);
        p.c
    }
}

/// The optional TOML file (`--config`): providers, model aliases, prices, retries, tool aliases.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub default_model: Option<String>,
    #[serde(default)]
    pub providers: std::collections::BTreeMap<String, ProviderConfig>,
    #[serde(default)]
    pub aliases: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub pricing: std::collections::BTreeMap<String, PriceConfig>,
    #[serde(default)]
    pub retry: Option<RetryConfig>,
    /// Per `provider/model` (or `provider`): concurrency, requests and tokens per minute.
    #[serde(default)]
    pub limits: std::collections::BTreeMap<String, LimitConfig>,
    /// Tool names as agent definitions write them → the tools they mean here
    /// (`Read = "docs__read"`).
    #[serde(default)]
    pub tool_aliases: std::collections::BTreeMap<String, String>,
}

/// `[limits."provider/model"]` or `[limits.provider]`: a provider's rate limits, per process.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitConfig {
    pub concurrency: Option<u32>,
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    Openai,
    Anthropic,
}

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    /// OpenAI-compatible: up to `/v1` (or the Azure deployment path). Anthropic: the host.
    pub base_url: Option<String>,
    /// Name of the environment variable that holds the key (keys never live in the file).
    pub api_key_env: Option<String>,
    /// Longest wait for the first byte of an answer (a slow server's prompt processing), in
    /// seconds. (`timeout_seconds`, its former name, is read too.)
    #[serde(default = "default_first_byte_timeout", alias = "timeout_seconds")]
    pub first_byte_timeout_seconds: u64,
    /// Longest silence between two chunks of a streamed answer, in seconds.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_seconds: u64,
    /// OpenAI-compatible: `authorization` (Bearer) or e.g. `api-key` (Azure).
    pub auth_header: Option<String>,
    /// OpenAI-compatible: extra query parameters (Azure's `api-version`).
    #[serde(default)]
    pub query: std::collections::BTreeMap<String, String>,
    /// OpenAI-compatible: `max_tokens` or `max_completion_tokens`.
    pub max_tokens_field: Option<String>,
    /// `max_tokens` of this provider's calls (and their reservation); `SUBAGENTD_MAX_OUTPUT_TOKENS`
    /// when unset. (`default_max_tokens`, its former name, is read too.)
    #[serde(alias = "default_max_tokens")]
    pub max_output_tokens: Option<u32>,
    /// Per model, as the provider names it: `max_output_tokens` (wins over the provider's).
    #[serde(default)]
    pub models: std::collections::BTreeMap<String, ModelConfig>,
    /// Stream answers (default true): a first-byte and an idle timeout instead of one for the
    /// whole answer. A server that answers with plain JSON anyway is read as such.
    pub stream: Option<bool>,
    /// Take a whole answer that is a tool call written as text (`{"name": …, "arguments": …}`,
    /// fenced or in `<tool_call>` tags) as that tool call. Default: on, except for the official
    /// OpenAI and Anthropic APIs.
    pub text_tool_calls: Option<bool>,
    /// Bill this provider's models at the shipped list prices (default: only the official APIs;
    /// set it for Azure, OpenRouter, or a test double of an official API).
    pub shipped_prices: Option<bool>,
    /// Its models can call tools (default true). A run with tools never falls back to one that
    /// cannot: it is skipped, with the reason.
    #[serde(default)]
    pub supports_tools: Option<bool>,
    /// Its models can give a structured answer (`output_schema`; default true). Likewise.
    #[serde(default)]
    pub supports_structured_output: Option<bool>,
    /// Use the provider's prompt cache. Anthropic: mark cache breakpoints (`cache_control`) on
    /// every request (default on). OpenAI-compatible: caching is automatic on a byte-stable
    /// prefix, which every request keeps; on, a `prompt_cache_key` per run is sent too, so a
    /// run's turns reach the same cache (default: only for the official API, as other servers
    /// may reject the field).
    pub prompt_caching: Option<bool>,
    /// Calls in flight to this provider at once, per process (default 1,024); calls beyond it
    /// wait their turn. Over HTTP/1.1 each is a connection with its buffers; over HTTP/2
    /// (negotiated with a TLS server that offers it) they share a few connections.
    pub max_connections: Option<u32>,
}

/// One model of a provider.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub max_output_tokens: Option<u32>,
}

fn default_first_byte_timeout() -> u64 {
    120
}

fn default_idle_timeout() -> u64 {
    60
}

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    pub input: rust_decimal::Decimal,
    pub output: rust_decimal::Decimal,
    /// Cache reads, per million tokens (default: the input price).
    #[serde(default)]
    pub cached: Option<rust_decimal::Decimal>,
    /// Cache writes, per million tokens (default: the input price; Anthropic bills 1.25×).
    #[serde(default)]
    pub cache_write: Option<rust_decimal::Decimal>,
    /// One search of the provider's server-side web search, in USD (Anthropic lists $0.01);
    /// default 0 for a configured price.
    #[serde(default)]
    pub web_search: Option<rust_decimal::Decimal>,
}

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    pub max_attempts: Option<u32>,
    pub base_ms: Option<u64>,
    pub cap_ms: Option<u64>,
    pub deadline_seconds: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {message}")]
    File { path: String, message: String },
    #[error("config: {0}")]
    Invalid(String),
}

impl FileConfig {
    pub fn load(path: &std::path::Path) -> Result<FileConfig, ConfigError> {
        let err = |message: String| ConfigError::File { path: path.display().to_string(), message };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        toml::from_str(&text).map_err(|e| err(e.to_string()))
    }
}

/// Where `subagentd healthcheck` asks by default: `/readyz` at the listen address, a wildcard
/// address (`0.0.0.0`, `::`) asked on loopback.
pub fn readyz_url(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}/readyz", SocketAddr::new(ip, listen.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_file_reads() {
        let f: FileConfig = toml::from_str(include_str!("../subagentd.example.toml")).unwrap();
        assert_eq!(f.tool_aliases.get("Read").map(String::as_str), Some("docs__read"));
        assert!(f.providers.contains_key("local"));
    }

    #[test]
    fn the_health_check_asks_a_wildcard_listener_on_loopback() {
        let at = |s: &str| readyz_url(s.parse().unwrap());
        assert_eq!(at("0.0.0.0:8080"), "http://127.0.0.1:8080/readyz");
        assert_eq!(at("[::]:9000"), "http://[::1]:9000/readyz");
        assert_eq!(at("10.1.2.3:80"), "http://10.1.2.3:80/readyz");
    }
}
