//! `tenants` (limits), `api_keys`, and the usage report dashboards read (`usage_daily`).

use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::StoreError;

/// A tenant's own limits; `None` means the configured default (and no default: unlimited).
/// The same shape in the admin API (JSON), the table, and `subagentd tenants set` (flags).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[arg(long)]
    #[serde(default, deserialize_with = "usd")]
    pub usd_per_day: Option<Decimal>,
    #[arg(long)]
    #[serde(default, deserialize_with = "usd")]
    pub usd_per_month: Option<Decimal>,
    #[arg(long)]
    pub tokens_per_day: Option<i64>,
    /// Running tasks at once (across replicas). The flag is `--tenant-max-running`: `--max-running`
    /// is the process's own setting, which every subcommand takes.
    #[arg(long = "tenant-max-running", id = "tenant_max_running")]
    pub max_running: Option<i32>,
    #[arg(long)]
    pub max_queued: Option<i32>,
    #[arg(long)]
    #[serde(default, deserialize_with = "usd")]
    pub max_task_cost_usd: Option<Decimal>,
    #[arg(long)]
    pub max_task_tokens: Option<i64>,
    #[arg(long)]
    pub max_task_turns: Option<i32>,
    /// The longest `timeout_seconds` a task may ask for (`--tenant-max-task-timeout-seconds`:
    /// `--max-task-timeout-seconds` is the process's own).
    #[arg(long = "tenant-max-task-timeout-seconds", id = "tenant_max_task_timeout_seconds")]
    pub max_task_timeout_seconds: Option<i32>,
    /// The tenant's default approval mode: `none`, `propose` or `all`.
    #[arg(long)]
    pub approval: Option<String>,
    /// API requests per second this tenant may make, counted by each process on its own.
    #[arg(long)]
    pub requests_per_second: Option<f64>,
    /// Requests beyond the rate a tenant may make at once (default: one second's worth).
    #[arg(long)]
    pub request_burst: Option<i32>,
    /// Event streams this tenant may hold open at once, per replica (0: none).
    #[arg(long)]
    pub max_streams: Option<i32>,
    /// Waiting requests this tenant may hold at once, per replica (0: none; beyond it a wait
    /// is answered at once, as if it had run out).
    #[arg(long)]
    pub max_waits: Option<i32>,
    /// The models a call moves to, in order, when its own cannot serve it (unless the task or
    /// its agent definition names its own); `provider/model` or an alias, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub fallback_models: Option<Vec<String>>,
    /// Tasks waiting for their start time (`run_at`) the tenant may have at once.
    #[arg(long)]
    pub max_scheduled: Option<i32>,
    /// The tenant's default task priority: `high`, `normal` or `low`.
    #[arg(long)]
    pub priority: Option<String>,
    /// Built-in tools turned off for this tenant (`web_fetch`, `web_search`), comma-separated
    /// (`--tenant-builtin-tools-off`: `--builtin-tools-off` is the process's own).
    #[arg(long = "tenant-builtin-tools-off", id = "tenant_builtin_tools_off", value_delimiter = ',')]
    pub builtin_tools_off: Option<Vec<String>>,
    /// The web tools' policy for this tenant: `auto` (read-only, the default) or `propose` (a
    /// side-effecting tool: with approval `propose` or `all`, each call waits for a decision).
    #[arg(long)]
    pub web_tools_policy: Option<String>,
    /// `web_fetch` calls per minute, across replicas (0: none).
    #[arg(long)]
    pub web_fetches_per_minute: Option<i32>,
    /// The only domains `web_fetch` may reach for this tenant (`example.com` also allows its
    /// subdomains), comma-separated; unset: wherever the service allows.
    #[arg(long, value_delimiter = ',')]
    pub web_fetch_domains: Option<Vec<String>>,
    /// Whether a task over a private workspace (an upload, or a repository read with a secret)
    /// is offered the web tools: `never` (the default: a fetched URL could carry the code out),
    /// `task` (when the task's `workspace.web` asks), `always`.
    #[arg(long)]
    pub private_workspace_web: Option<String>,
}

/// A USD limit as JSON gives it: a number, none negative (however small: -1e-100 is refused, not
/// rounded to zero).
fn usd<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Decimal>, D::Error> {
    use serde::de::Error;
    match Option::<f64>::deserialize(d)? {
        None => Ok(None),
        Some(v) if v < 0.0 => Err(D::Error::custom("must not be negative")),
        Some(v) => Decimal::try_from(v).map(Some).map_err(|_| D::Error::custom("must be at most 1000000000")),
    }
}

pub async fn ensure(pool: &PgPool, tenant: &str) -> Result<(), StoreError> {
    sqlx::query!(r#"INSERT INTO tenants (name) VALUES ($1) ON CONFLICT DO NOTHING"#, tenant).execute(pool).await?;
    Ok(())
}

pub async fn limits(conn: &mut PgConnection, tenant: &str, lock: bool) -> Result<Option<Limits>, StoreError> {
    // The same columns twice: a macro's statement is one literal.
    Ok(if lock {
        sqlx::query_as!(
            Limits,
            "SELECT usd_per_day, usd_per_month, tokens_per_day, max_running, max_queued, max_task_cost_usd,
                    max_task_tokens, max_task_turns, max_task_timeout_seconds, approval, requests_per_second,
                    request_burst, max_streams, max_waits, fallback_models, max_scheduled, priority, builtin_tools_off,
                    web_tools_policy, web_fetches_per_minute, web_fetch_domains, private_workspace_web
             FROM tenants WHERE name = $1 FOR UPDATE",
            tenant
        )
        .fetch_optional(conn)
        .await?
    } else {
        sqlx::query_as!(
            Limits,
            "SELECT usd_per_day, usd_per_month, tokens_per_day, max_running, max_queued, max_task_cost_usd,
                    max_task_tokens, max_task_turns, max_task_timeout_seconds, approval, requests_per_second,
                    request_burst, max_streams, max_waits, fallback_models, max_scheduled, priority, builtin_tools_off,
                    web_tools_policy, web_fetches_per_minute, web_fetch_domains, private_workspace_web
             FROM tenants WHERE name = $1",
            tenant
        )
        .fetch_optional(conn)
        .await?
    })
}

/// Set a tenant's limits (creating it); true when created.
pub async fn put_limits(pool: &PgPool, tenant: &str, l: &Limits) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar!(r#"INSERT INTO tenants (name, usd_per_day, usd_per_month, tokens_per_day, max_running, max_queued,
             max_task_cost_usd, max_task_tokens, max_task_turns, max_task_timeout_seconds, approval,
             requests_per_second, request_burst, max_streams, max_waits, fallback_models, max_scheduled, priority,
             builtin_tools_off, web_tools_policy, web_fetches_per_minute, web_fetch_domains, private_workspace_web)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)
         ON CONFLICT (name) DO UPDATE SET usd_per_day = EXCLUDED.usd_per_day, usd_per_month = EXCLUDED.usd_per_month,
             tokens_per_day = EXCLUDED.tokens_per_day, max_running = EXCLUDED.max_running,
             max_queued = EXCLUDED.max_queued, max_task_cost_usd = EXCLUDED.max_task_cost_usd,
             max_task_tokens = EXCLUDED.max_task_tokens, max_task_turns = EXCLUDED.max_task_turns,
             max_task_timeout_seconds = EXCLUDED.max_task_timeout_seconds, approval = EXCLUDED.approval,
             requests_per_second = EXCLUDED.requests_per_second, request_burst = EXCLUDED.request_burst,
             max_streams = EXCLUDED.max_streams, max_waits = EXCLUDED.max_waits,
             fallback_models = EXCLUDED.fallback_models, max_scheduled = EXCLUDED.max_scheduled,
             priority = EXCLUDED.priority, builtin_tools_off = EXCLUDED.builtin_tools_off,
             web_tools_policy = EXCLUDED.web_tools_policy, web_fetches_per_minute = EXCLUDED.web_fetches_per_minute,
             web_fetch_domains = EXCLUDED.web_fetch_domains,
             private_workspace_web = EXCLUDED.private_workspace_web, updated_at = now()
         RETURNING (xmax = 0) AS "created!""#, tenant, l.usd_per_day, l.usd_per_month, l.tokens_per_day, l.max_running, l.max_queued, l.max_task_cost_usd, l.max_task_tokens, l.max_task_turns, l.max_task_timeout_seconds, l.approval, l.requests_per_second, l.request_burst, l.max_streams, l.max_waits, l.fallback_models.as_deref(), l.max_scheduled, l.priority, l.builtin_tools_off.as_deref(), l.web_tools_policy, l.web_fetches_per_minute, l.web_fetch_domains.as_deref(), l.private_workspace_web)
    .fetch_one(pool)
    .await?)
}

pub async fn names(pool: &PgPool) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar!(r#"SELECT name FROM tenants ORDER BY name"#).fetch_all(pool).await?)
}

#[derive(Debug, Clone, Serialize)]
pub struct KeyRow {
    pub id: Uuid,
    pub tenant: String,
    pub prefix: String,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A new key for `tenant`: returns the row and the key itself (shown once, stored hashed).
pub async fn create_key(pool: &PgPool, tenant: &str, name: Option<&str>) -> Result<(KeyRow, String), StoreError> {
    use rand::RngCore;
    use sha2::{Digest, Sha256};
    let mut b = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut b);
    let secret = hex::encode(b);
    let prefix = format!("sk_{}", &secret[..8]);
    let key = format!("{prefix}_{}", &secret[8..]);
    let hash = hex::encode(Sha256::digest(key.as_bytes()));
    ensure(pool, tenant).await?;
    let row: KeyRow = sqlx::query_as!(
        KeyRow,
        r#"INSERT INTO api_keys (id, tenant, prefix, key_hash, name) VALUES ($1, $2, $3, $4, $5)
         RETURNING id, tenant, prefix, name, created_at, revoked_at"#,
        Uuid::now_v7(),
        tenant,
        prefix,
        hash,
        name
    )
    .fetch_one(pool)
    .await?;
    Ok((row, key))
}

pub async fn list_keys(pool: &PgPool, tenant: Option<&str>) -> Result<Vec<KeyRow>, StoreError> {
    Ok(sqlx::query_as!(
        KeyRow,
        r#"SELECT id, tenant, prefix, name, created_at, revoked_at FROM api_keys
         WHERE $1::text IS NULL OR tenant = $1 ORDER BY created_at"#,
        tenant
    )
    .fetch_all(pool)
    .await?)
}

/// Revoke by id or prefix; the revoked key, if it existed.
pub async fn revoke_key(pool: &PgPool, id_or_prefix: &str) -> Result<Option<KeyRow>, StoreError> {
    let id: Option<Uuid> = id_or_prefix.parse().ok();
    Ok(sqlx::query_as!(
        KeyRow,
        r#"UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 OR prefix = $2
         RETURNING id, tenant, prefix, name, created_at, revoked_at"#,
        id,
        id_or_prefix
    )
    .fetch_optional(pool)
    .await?)
}

/// The tenant of an active key, found by its prefix and checked against its hash.
pub async fn tenant_of_key(pool: &PgPool, key: &str) -> Result<Option<String>, StoreError> {
    use sha2::{Digest, Sha256};
    let Some(prefix) = key.rsplit_once('_').map(|(p, _)| p) else { return Ok(None) };
    let row = sqlx::query!("SELECT tenant, key_hash FROM api_keys WHERE prefix = $1 AND revoked_at IS NULL", prefix)
        .fetch_optional(pool)
        .await?;
    let hash = hex::encode(Sha256::digest(key.as_bytes()));
    Ok(row.filter(|r| constant_time_eq(r.key_hash.as_bytes(), hash.as_bytes())).map(|r| r.tenant))
}

pub async fn any_active_key(pool: &PgPool) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar!(r#"SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL) AS "any!""#)
        .fetch_one(pool)
        .await?)
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One row of `GET /usage`.
#[derive(Debug, Clone, Serialize)]
pub struct UsageRow {
    pub day: Option<NaiveDate>,
    pub tenant: Option<String>,
    pub model: Option<String>,
    pub agent_type: Option<String>,
    /// The prefix of the API key the tasks were submitted with (`""`: none).
    pub api_key: Option<String>,
    pub calls: i64,
    pub ok: i64,
    pub failed: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cached_tokens: i64,
    pub cost_usd: Decimal,
    /// Calls whose usage is an estimate (their answer never came, or the provider gave none).
    pub estimated_calls: i64,
    /// Prompt tokens written to the provider's cache (part of `input_tokens`).
    pub cache_write_tokens: i64,
}

/// Aggregates of the daily rollup over `[from, to]`, grouped by the named columns
/// (`day`, `tenant`, `model`, `agent_type`). `tenant = None`: every tenant.
pub async fn usage(
    pool: &PgPool,
    tenant: Option<&str>,
    from: NaiveDate,
    to: NaiveDate,
    group_by: &[&str],
) -> Result<Vec<UsageRow>, StoreError> {
    let by = |c: &str| group_by.contains(&c);
    let grouped = ["day", "tenant", "model", "agent_type", "api_key"].iter().any(|c| by(c));
    // Each column is grouped by when asked for, else NULL (one group for all).
    let rows = sqlx::query_as!(
        UsageRow,
        r#"SELECT CASE WHEN $4 THEN day END AS day, CASE WHEN $5 THEN tenant END AS tenant,
                CASE WHEN $6 THEN model END AS model, CASE WHEN $7 THEN agent_type END AS agent_type,
                CASE WHEN $8 THEN api_key END AS api_key,
                coalesce(sum(calls), 0)::bigint AS "calls!", coalesce(sum(ok), 0)::bigint AS "ok!",
                coalesce(sum(failed), 0)::bigint AS "failed!", coalesce(sum(input_tokens), 0)::bigint AS "input_tokens!",
                coalesce(sum(output_tokens), 0)::bigint AS "output_tokens!",
                coalesce(sum(cached_tokens), 0)::bigint AS "cached_tokens!", coalesce(sum(cost_usd), 0) AS "cost_usd!",
                coalesce(sum(estimated_calls), 0)::bigint AS "estimated_calls!",
                coalesce(sum(cache_write_tokens), 0)::bigint AS "cache_write_tokens!"
         FROM usage_daily WHERE ($1::text IS NULL OR tenant = $1) AND day BETWEEN $2 AND $3
         GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5"#,
        tenant,
        from,
        to,
        by("day"),
        by("tenant"),
        by("model"),
        by("agent_type"),
        by("api_key")
    )
    .fetch_all(pool)
    .await?;
    // With no grouping and no data, sum() gives one row of NULLs: report nothing instead.
    Ok(rows.into_iter().filter(|r| r.calls > 0 || grouped).collect())
}

/// Usage rows as CSV (RFC 4180), the same columns as the JSON.
pub fn usage_csv(rows: &[UsageRow]) -> String {
    fn field(s: &str) -> String {
        if s.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    }
    let mut out = String::from(
        "day,tenant,model,agent_type,api_key,calls,ok,failed,input_tokens,output_tokens,cached_tokens,cost_usd,estimated_calls,\
         cache_write_tokens\r\n",
    );
    for r in rows {
        let text = |v: &Option<String>| field(v.as_deref().unwrap_or(""));
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{}\r\n",
            r.day.map(|d| d.to_string()).unwrap_or_default(),
            text(&r.tenant),
            text(&r.model),
            text(&r.agent_type),
            text(&r.api_key),
            r.calls,
            r.ok,
            r.failed,
            r.input_tokens,
            r.output_tokens,
            r.cached_tokens,
            r.cost_usd.normalize(),
            r.estimated_calls,
            r.cache_write_tokens
        ));
    }
    out
}

/// Count one web fetch of `tenant` in this minute; false (and nothing counted) when the minute
/// already holds `limit` of them. One statement, so that replicas share the count.
pub async fn take_web_fetch(pool: &PgPool, tenant: &str, limit: i32) -> Result<bool, StoreError> {
    let n: Option<i32> = sqlx::query_scalar!(
        r#"INSERT INTO web_fetch_minutes AS w (tenant, minute, n) VALUES ($1, date_trunc('minute', now()), 1)
         ON CONFLICT (tenant, minute) DO UPDATE SET n = w.n + 1 WHERE w.n < $2
         RETURNING n"#,
        tenant,
        limit
    )
    .fetch_optional(pool)
    .await?;
    Ok(n.is_some_and(|n| n <= limit))
}
