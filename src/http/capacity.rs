//! The replica's descriptor budget: how many connections it may serve at once without starving
//! what else needs a descriptor — the database pool above all, then the LISTEN and presence
//! sessions, providers' and tools' connections at full load, MCP tool-source sessions and
//! webhook deliveries. At start the soft `RLIMIT_NOFILE` is raised to the hard limit; the
//! connection cap is that limit less the reserve (or `SUBAGENTD_MAX_CONNECTIONS`). A connection
//! beyond the cap is answered 503 `at_capacity` at once, so the listener never meets
//! "Too many open files", and the database never lacks a descriptor.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::config::Config;

/// Descriptors a process holds whatever it does: standard streams, the listener, the runtime's
/// epoll and wake-up descriptors, the resolver's, the log.
const FIXED: usize = 32;

/// MCP tool-source sessions one process keeps open at once (`tools::mcp`), each a connection
/// for its calls and one for its stream.
pub const MCP_SESSIONS: usize = crate::tools::mcp::MAX_SESSIONS;

/// Webhook deliveries one process makes at once (`jobs::webhooks`).
pub const WEBHOOKS: usize = 20;

/// Connections answered 503 while over the cap, at once, beyond which the listener waits.
pub const OVER_CAP: usize = 64;

/// What the rest of the process needs, part by part.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Reserve {
    pub fixed: usize,
    /// The database pool, the claim loop's own connection, LISTEN and presence.
    pub database: usize,
    /// One provider call per running sub-agent.
    pub providers: usize,
    /// Tool calls of running sub-agents, `tool_concurrency` each.
    pub tools: usize,
    pub mcp_sessions: usize,
    pub webhooks: usize,
    /// Connections being answered 503 over the cap.
    pub over_cap: usize,
}

impl Reserve {
    pub fn of(cfg: &Config) -> Reserve {
        Reserve {
            fixed: FIXED,
            database: cfg.db_max_connections as usize + 3,
            providers: cfg.max_running,
            tools: cfg.max_running * cfg.tool_concurrency.max(1),
            mcp_sessions: 2 * MCP_SESSIONS,
            webhooks: WEBHOOKS,
            over_cap: OVER_CAP,
        }
    }

    pub fn total(&self) -> usize {
        self.fixed + self.database + self.providers + self.tools + self.mcp_sessions + self.webhooks + self.over_cap
    }
}

/// The budget as planned at start.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    /// The descriptor limit (soft, after raising it to the hard limit).
    pub limit: usize,
    pub reserve: Reserve,
    /// Connections served at once.
    pub cap: usize,
    /// Whether `SUBAGENTD_MAX_CONNECTIONS` set the cap.
    pub configured: bool,
}

impl Plan {
    /// Raise the soft descriptor limit to the hard one, and plan the connection cap.
    pub fn make(cfg: &Config) -> Plan {
        let limit = raise_nofile();
        let reserve = Reserve::of(cfg);
        let left = limit.saturating_sub(reserve.total()).max(1);
        let (cap, configured) = match cfg.max_connections {
            Some(c) => (c.max(1), true),
            None => (left, false),
        };
        Plan { limit, reserve, cap, configured }
    }

    /// A tenant's default `max_streams` on this replica: a quarter of the cap.
    pub fn default_max_streams(&self) -> i32 {
        (self.cap / 4).max(1).min(i32::MAX as usize) as i32
    }

    /// A tenant's default `max_waits` on this replica: half of the cap.
    pub fn default_max_waits(&self) -> i32 {
        (self.cap / 2).max(1).min(i32::MAX as usize) as i32
    }

    /// The configuration with the tenants' held-connection defaults filled in from the cap where
    /// not configured.
    pub fn apply(&self, cfg: &mut Config) {
        cfg.default_max_streams.get_or_insert(self.default_max_streams());
        cfg.default_max_waits.get_or_insert(self.default_max_waits());
    }
}

/// The soft `RLIMIT_NOFILE`, raised to the hard limit first.
fn raise_nofile() -> usize {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit take a valid pointer to an rlimit owned by this frame.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
    }
    usize::try_from(r.rlim_cur).unwrap_or(usize::MAX).min(1 << 30)
}

/// The connections open now, against the cap.
pub struct Connections {
    open: AtomicUsize,
    pub cap: usize,
    /// Above this, `/readyz` says the replica is at capacity (90% of the cap).
    pub high_water: usize,
}

/// One open connection; counted until dropped.
pub struct Open(std::sync::Arc<Connections>);

impl Drop for Open {
    fn drop(&mut self) {
        let n = self.0.open.fetch_sub(1, Ordering::AcqRel) - 1;
        metrics::gauge!("subagentd_connections").set(n as f64);
    }
}

impl Connections {
    pub fn new(cap: usize) -> Connections {
        metrics::gauge!("subagentd_connection_cap").set(cap as f64);
        Connections { open: AtomicUsize::new(0), cap, high_water: (cap * 9 / 10).max(1) }
    }

    /// Count a new connection, unless the cap is reached.
    pub fn admit(self: &std::sync::Arc<Self>) -> Option<Open> {
        let n = self.open.fetch_add(1, Ordering::AcqRel) + 1;
        if n > self.cap {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        metrics::gauge!("subagentd_connections").set(n as f64);
        Some(Open(self.clone()))
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// At or above the high-water mark: not ready for more.
    pub fn crowded(&self) -> bool {
        self.open() >= self.high_water
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_the_limit_less_the_reserve_and_defaults_follow_it() {
        let mut cfg = Config::defaults();
        cfg.db_max_connections = 10;
        cfg.max_running = 4;
        cfg.tool_concurrency = 2;
        let r = Reserve::of(&cfg);
        assert_eq!((r.database, r.providers, r.tools), (13, 4, 8));
        let plan = Plan { limit: 1024, cap: 1024 - r.total(), reserve: r, configured: false };
        assert_eq!(plan.default_max_streams(), (plan.cap / 4) as i32);
        cfg.default_max_waits = Some(7);
        plan.apply(&mut cfg);
        assert_eq!((cfg.default_max_streams, cfg.default_max_waits), (Some(plan.default_max_streams()), Some(7)));
    }

    #[test]
    fn connections_beyond_the_cap_are_not_admitted_and_a_closed_one_frees_its_place() {
        let c = std::sync::Arc::new(Connections::new(2));
        let a = c.admit().unwrap();
        let _b = c.admit().unwrap();
        assert!(c.admit().is_none());
        assert!(c.crowded());
        drop(a);
        assert!(c.admit().is_some());
    }
}
