//! Budgets: a tenant's limits, their configured defaults and the merge of the two; the
//! validation the admin API and the CLI share; the admission checks (queue and spend windows)
//! that submission (`tasks::submit`) runs with the tenant's row locked; the waking of budget
//! waiters; and the metrics of each provider call's reservation, which the run store makes
//! (through the group committer) before every call.
//!
//! The SQL side lives in `store::budget` (the tenant's use, and `budget_reserve_call`, the
//! PL/pgSQL function of migration 0008 that locks the tenant's row while it checks and reserves
//! in one statement) and `store::runs::commit_turns` (settlement, with the turn's checkpoint).
//!
//! May import: `store`, `config`, `cache`. Never the engine, `jobs`, `tasks` or `http`.

use rust_decimal::Decimal;
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};

use crate::cache::TtlCache;
use crate::config::Config;
use crate::store::budget::{self as sql, Reserve, SpendDefaults};
pub use crate::store::tenants::Limits;
use crate::store::{tenants, StoreError};

/// Why a budget or limit refuses, or a limit is not acceptable.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    /// A limit or tenant name that cannot be set.
    #[error("{field}: {message}")]
    Invalid { field: &'static str, message: String },
    /// `max_queued` tasks are already queued.
    #[error("{detail}")]
    QueueFull { max: i32, queued: i64, detail: String },
    /// `max_scheduled` tasks already wait for their time.
    #[error("{detail}")]
    ScheduledFull { max: i32, scheduled: i64, detail: String },
    /// A spend window is used up (including the calls in flight).
    #[error("{detail}")]
    Exhausted { limit: &'static str, value: Value, current: Value, detail: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The configured limits of tenants that set none.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Defaults {
    pub usd_per_day: Option<Decimal>,
    pub usd_per_month: Option<Decimal>,
    pub tokens_per_day: Option<i64>,
    pub max_running: Option<i32>,
    pub max_queued: Option<i32>,
    pub requests_per_second: Option<f64>,
    pub request_burst: Option<i32>,
    /// Held connections per tenant and replica (computed from the connection cap when not
    /// configured: see `http::capacity`).
    pub max_streams: Option<i32>,
    pub max_waits: Option<i32>,
    pub max_scheduled: i32,
    pub web_fetches_per_minute: i32,
}

impl Defaults {
    pub fn from_config(c: &Config) -> Defaults {
        Defaults {
            usd_per_day: c.default_usd_per_day,
            usd_per_month: c.default_usd_per_month,
            tokens_per_day: c.default_tokens_per_day,
            max_running: c.default_max_running,
            max_queued: c.default_max_queued,
            requests_per_second: c.default_requests_per_second,
            request_burst: c.default_request_burst,
            max_streams: c.default_max_streams,
            max_waits: c.default_max_waits,
            max_scheduled: c.default_max_scheduled,
            web_fetches_per_minute: c.default_web_fetches_per_minute,
        }
    }

    /// The spend limits, as `budget_reserve` takes them.
    pub fn spend(&self) -> SpendDefaults {
        SpendDefaults {
            usd_per_day: self.usd_per_day,
            usd_per_month: self.usd_per_month,
            tokens_per_day: self.tokens_per_day,
        }
    }
}

/// A tenant's own limits with the configured defaults filled in where it sets none. (The
/// per-task caps have no configured default.)
pub fn effective(own: Limits, d: &Defaults) -> Limits {
    Limits {
        usd_per_day: own.usd_per_day.or(d.usd_per_day),
        usd_per_month: own.usd_per_month.or(d.usd_per_month),
        tokens_per_day: own.tokens_per_day.or(d.tokens_per_day),
        max_running: own.max_running.or(d.max_running),
        max_queued: own.max_queued.or(d.max_queued),
        // A rate and its burst go together: a tenant's own rate without a burst takes one
        // second of that rate, not the default burst.
        requests_per_second: own.requests_per_second.or(d.requests_per_second),
        request_burst: if own.requests_per_second.is_some() { own.request_burst } else { d.request_burst },
        max_streams: own.max_streams.or(d.max_streams),
        max_waits: own.max_waits.or(d.max_waits),
        max_scheduled: own.max_scheduled.or(Some(d.max_scheduled)),
        web_fetches_per_minute: own.web_fetches_per_minute.or(Some(d.web_fetches_per_minute)),
        ..own
    }
}

/// Does admission have anything to check for a tenant with these limits? (If not, a task is
/// inserted without locking the tenant's row.)
pub fn guards_admission(l: &Limits) -> bool {
    l.max_queued.is_some() || l.usd_per_day.is_some() || l.usd_per_month.is_some() || l.tokens_per_day.is_some()
}

/// Tenant names: what API keys, the admin API and the CLI accept.
pub fn check_tenant_name(name: &str) -> Result<(), BudgetError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(BudgetError::Invalid {
            field: "tenant",
            message: "must be 1-64 characters of a-z, A-Z, 0-9, '-', '_' and '.'".into(),
        })
    }
}

/// The largest spend limit in USD (a billion: beyond any real budget; the columns hold less
/// than ten billion).
pub const MAX_USD: i64 = 1_000_000_000;

/// Limits that can be set: none negative.
pub fn validate(l: &Limits) -> Result<(), BudgetError> {
    let negative = |field| Err(BudgetError::Invalid { field, message: "must not be negative".into() });
    let usd = [
        ("usd_per_day", l.usd_per_day),
        ("usd_per_month", l.usd_per_month),
        ("max_task_cost_usd", l.max_task_cost_usd),
    ];
    for (f, v) in usd {
        if v.is_some_and(|v| v.is_sign_negative() && !v.is_zero()) {
            return negative(f);
        }
        if v.is_some_and(|v| v > Decimal::from(MAX_USD)) {
            return Err(BudgetError::Invalid { field: f, message: format!("must be at most {MAX_USD}") });
        }
    }
    let ints = [
        ("tokens_per_day", l.tokens_per_day),
        ("max_task_tokens", l.max_task_tokens),
        ("max_running", l.max_running.map(i64::from)),
        ("max_queued", l.max_queued.map(i64::from)),
        ("max_task_turns", l.max_task_turns.map(i64::from)),
        ("max_task_timeout_seconds", l.max_task_timeout_seconds.map(i64::from)),
        ("max_streams", l.max_streams.map(i64::from)),
        ("max_waits", l.max_waits.map(i64::from)),
        ("max_scheduled", l.max_scheduled.map(i64::from)),
    ];
    for (f, v) in ints {
        if v.is_some_and(|v| v < 0) {
            return negative(f);
        }
    }
    if l.priority.as_deref().is_some_and(|p| crate::kinds::Priority::parse(p).is_none()) {
        return Err(BudgetError::Invalid { field: "priority", message: "must be one of high, normal, low".into() });
    }
    if let Some(models) = &l.fallback_models {
        crate::llm::check_fallback_models(models)
            .map_err(|message| BudgetError::Invalid { field: "fallback_models", message })?;
    }
    if l.requests_per_second.is_some_and(|r| !(0.001..=1_000_000.0).contains(&r)) {
        return Err(BudgetError::Invalid {
            field: "requests_per_second",
            message: "must be a number from 0.001 to 1000000".into(),
        });
    }
    if l.request_burst.is_some_and(|b| !(1..=1_000_000).contains(&b)) {
        return Err(BudgetError::Invalid { field: "request_burst", message: "must be from 1 to 1000000".into() });
    }
    if let Some(off) = &l.builtin_tools_off {
        if let Some((i, dup)) = off.iter().enumerate().find(|(i, n)| off[..*i].contains(n)) {
            return Err(BudgetError::Invalid {
                field: "builtin_tools_off",
                message: format!("[{i}] {dup:?} is named twice"),
            });
        }
        if let Some(bad) = off.iter().find(|n| crate::kinds::BuiltinTool::parse(n).is_none()) {
            let names: Vec<&str> = crate::kinds::BuiltinTool::ALL.iter().map(|b| b.as_str()).collect();
            return Err(BudgetError::Invalid {
                field: "builtin_tools_off",
                message: format!("{bad:?} is not a built-in tool; they are {}", names.join(", ")),
            });
        }
    }
    if l.private_workspace_web.as_deref().is_some_and(|p| !matches!(p, "never" | "task" | "always")) {
        return Err(BudgetError::Invalid {
            field: "private_workspace_web",
            message: "must be one of never, task, always".into(),
        });
    }
    if l.web_tools_policy.as_deref().is_some_and(|p| !matches!(p, "auto" | "propose")) {
        return Err(BudgetError::Invalid { field: "web_tools_policy", message: "must be one of auto, propose".into() });
    }
    if l.web_fetches_per_minute.is_some_and(|n| n < 0) {
        return negative("web_fetches_per_minute");
    }
    if let Some(domains) = &l.web_fetch_domains {
        let ok = |d: &str| {
            !d.is_empty()
                && d.len() <= 253
                && d.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'))
                && !d.starts_with('.')
                && !d.ends_with('.')
        };
        if let Some(bad) = domains.iter().find(|d| !ok(d)) {
            return Err(BudgetError::Invalid {
                field: "web_fetch_domains",
                message: format!("{bad:?} is not a domain name (example.com; its subdomains are allowed with it)"),
            });
        }
    }
    if l.approval.as_deref().is_some_and(|a| !matches!(a, "none" | "propose" | "all")) {
        return Err(BudgetError::Invalid { field: "approval", message: "must be one of none, propose, all".into() });
    }
    Ok(())
}

/// Set a tenant's limits (creating the tenant), after the checks both the admin API and the
/// CLI make. True when the tenant was created.
pub async fn set_limits(pool: &PgPool, tenant: &str, l: &Limits) -> Result<bool, BudgetError> {
    check_tenant_name(tenant)?;
    validate(l)?;
    Ok(tenants::put_limits(pool, tenant, l).await?)
}

/// The tenant's limits with the configured defaults filled in, cached for the cache's time to
/// live; the tenant's row is created on first sight.
pub async fn effective_limits(
    pool: &PgPool,
    cache: &TtlCache<Limits>,
    defaults: &Defaults,
    tenant: &str,
) -> Result<Limits, StoreError> {
    if let Some(l) = cache.get(tenant) {
        return Ok(l);
    }
    let mut conn = pool.acquire().await?;
    let found = tenants::limits(&mut conn, tenant, false).await?;
    // Back to the pool before `ensure` takes one: holding one connection while waiting for
    // another deadlocks the pool when a burst of first requests for a new tenant fills it.
    drop(conn);
    let own = match found {
        Some(l) => l,
        None => {
            tenants::ensure(pool, tenant).await?;
            Limits::default()
        }
    };
    let l = effective(own, defaults);
    cache.put(tenant, l.clone());
    Ok(l)
}

fn refused(limit: &str, stage: &'static str) {
    metrics::counter!("subagentd_budget_refusals_total", "limit" => limit.to_string(), "stage" => stage).increment(1);
}

/// The queue and spend limits, checked with the tenant's row locked (in `conn`'s
/// transaction, which the caller commits with the insert). `smallest`: the task's smallest
/// first call, which what is left after the settled spend must cover.
pub async fn admission_checks(
    conn: &mut PgConnection,
    limits: &Limits,
    tenant: &str,
    smallest: Smallest,
    scheduled: bool,
) -> Result<(), BudgetError> {
    tenants::limits(&mut *conn, tenant, true).await?;
    let used = sql::usage_now(&mut *conn, tenant).await?;
    // A task waiting for its time counts against `max_scheduled`, not the queue.
    if let (true, Some(max)) = (scheduled, limits.max_scheduled) {
        let n = sql::scheduled(&mut *conn, tenant, i64::from(max)).await?;
        if n >= i64::from(max) {
            refused("max_scheduled", "admission");
            return Err(BudgetError::ScheduledFull {
                max,
                scheduled: n,
                detail: format!("{n} tasks wait for their time; the limit is {max}: retry when some have started"),
            });
        }
    }
    if let (false, Some(max)) = (scheduled, limits.max_queued) {
        if used.queued >= i64::from(max) {
            refused("max_queued", "admission");
            return Err(BudgetError::QueueFull {
                max,
                queued: used.queued,
                detail: format!("{} tasks are queued; the limit is {max}: retry when some have started", used.queued),
            });
        }
    }
    // Busy is not exhausted: what calls in flight hold will mostly come back, and a run that
    // needs it waits for it. Refused here is a budget whose settled spend leaves less than the
    // task's smallest call.
    let spend = [
        ("usd_per_day", limits.usd_per_day, used.usd_today),
        ("usd_per_month", limits.usd_per_month, used.usd_this_month),
    ];
    for (name, limit, current) in spend {
        if let Some(limit) = limit {
            if current + smallest.usd > limit || current >= limit {
                refused(name, "admission");
                return Err(BudgetError::Exhausted {
                    limit: name,
                    value: json!(limit),
                    current: json!(current.normalize()),
                    detail: format!(
                        "{name}: {} USD spent of {limit}, which leaves less than this task's smallest call (about {} USD)",
                        current.normalize(),
                        smallest.usd.round_dp(6).normalize()
                    ),
                });
            }
        }
    }
    if let Some(limit) = limits.tokens_per_day {
        let current = used.tokens_today;
        if current + smallest.tokens > limit || current >= limit {
            refused("tokens_per_day", "admission");
            return Err(BudgetError::Exhausted {
                limit: "tokens_per_day",
                value: json!(limit),
                current: json!(current),
                detail: format!(
                    "tokens_per_day: {current} tokens used of {limit}, which leaves less than this task's smallest call \
                     (about {} tokens)",
                    smallest.tokens
                ),
            });
        }
    }
    Ok(())
}

/// The smallest first call a task can make: its prompt, estimated, and the output floor.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Smallest {
    pub usd: Decimal,
    pub tokens: i64,
}

/// The fewest output tokens a call may be lowered to when the budget cannot afford its whole
/// `max_tokens` (a call that asks for fewer keeps what it asks for): below this an answer is
/// rarely useful, so a budget with less left ends the run instead.
pub const OUTPUT_FLOOR: u32 = 256;

/// Count a reservation's answer in the metrics (a refusal, a wait).
pub fn counted(r: &Reserve) {
    match r {
        Reserve::Refused(limit) => refused(limit, "in_flight"),
        Reserve::Wait { limit, .. } => {
            metrics::counter!("subagentd_budget_waits_total", "limit" => limit.clone()).increment(1)
        }
        _ => {}
    }
}

/// Wake the tenant's waiters that the budget now fits (oldest first); returns how many.
pub async fn wake(pool: &PgPool, tenant: &str, defaults: SpendDefaults) -> Result<usize, StoreError> {
    let woken = sql::wake(pool, tenant, defaults).await?;
    for (_, waited) in &woken {
        metrics::histogram!("subagentd_budget_wait_seconds").record(*waited);
    }
    Ok(woken.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_own_limits_win_over_the_defaults_and_task_caps_have_none() {
        let d = Defaults {
            usd_per_day: Some(Decimal::from(5)),
            max_queued: Some(10),
            tokens_per_day: Some(1000),
            ..Defaults::default()
        };
        let own = Limits { usd_per_day: Some(Decimal::from(2)), max_task_turns: Some(3), ..Limits::default() };
        let l = effective(own, &d);
        assert_eq!(l.usd_per_day, Some(Decimal::from(2)));
        assert_eq!(l.max_queued, Some(10));
        assert_eq!(l.tokens_per_day, Some(1000));
        assert_eq!(l.max_task_turns, Some(3));
        assert_eq!(l.max_task_cost_usd, None);
        assert!(guards_admission(&l));
        assert!(!guards_admission(&Limits { max_running: Some(1), ..Limits::default() }));
    }

    #[test]
    fn negative_limits_and_bad_tenant_names_are_refused_naming_the_field() {
        let bad = Limits { max_task_tokens: Some(-1), ..Limits::default() };
        assert!(matches!(validate(&bad), Err(BudgetError::Invalid { field: "max_task_tokens", .. })));
        let bad = Limits { usd_per_month: Some(Decimal::new(-1, 2)), ..Limits::default() };
        assert!(matches!(validate(&bad), Err(BudgetError::Invalid { field: "usd_per_month", .. })));
        assert!(validate(&Limits { usd_per_day: Some(Decimal::ZERO), ..Limits::default() }).is_ok());
        assert!(check_tenant_name("acme.eu-1").is_ok());
        assert!(matches!(check_tenant_name("no spaces"), Err(BudgetError::Invalid { field: "tenant", .. })));
        assert!(check_tenant_name(&"x".repeat(65)).is_err());
    }

    #[test]
    fn a_usd_limit_read_from_json_is_refused_when_negative_however_small() {
        let read = |j: &str| serde_json::from_str::<Limits>(j);
        let err = read(r#"{"usd_per_month": -2.2e-110}"#).unwrap_err().to_string();
        assert!(err.contains("must not be negative"), "{err}");
        assert!(read(r#"{"max_task_cost_usd": -1}"#).is_err());
        assert_eq!(read(r#"{"usd_per_day": 12.5}"#).unwrap().usd_per_day, Some(Decimal::new(125, 1)));
        assert_eq!(read(r#"{"usd_per_day": 0, "usd_per_month": null}"#).unwrap().usd_per_day, Some(Decimal::ZERO));
        assert_eq!(read("{}").unwrap().usd_per_month, None);
        // Fallback models are taken as written: a name with spaces is not trimmed into one.
        let spaced = Limits { fallback_models: Some(vec![" mock/a".into()]), ..Limits::default() };
        assert!(matches!(validate(&spaced), Err(BudgetError::Invalid { field: "fallback_models", .. })));
    }
}
