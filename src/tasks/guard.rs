//! Holds: the requests that keep a connection open on this replica — event streams and waits —
//! counted per tenant, against the tenant's `max_streams` and `max_waits`, so that one tenant
//! cannot take the replica's connections from the others.
//!
//! A hold is taken by the room's operations that hold (a wait, a live feed) and by a door's own
//! streams, and released when dropped. Each request counts once: as a wait if its hold ends by
//! itself within the wait bound, otherwise as a stream. Counts are this replica's: the limits
//! are per replica.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What a hold is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldKind {
    /// Open until the task ends or the caller leaves: an event stream.
    Stream,
    /// Open at most the wait bound: a waiting request.
    Wait,
}

impl HoldKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldKind::Stream => "max_streams",
            HoldKind::Wait => "max_waits",
        }
    }
}

/// A tenant's open holds on this replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Open {
    pub streams: u32,
    pub waits: u32,
}

impl Open {
    fn of(&mut self, kind: HoldKind) -> &mut u32 {
        match kind {
            HoldKind::Stream => &mut self.streams,
            HoldKind::Wait => &mut self.waits,
        }
    }
}

/// A hold refused: the tenant holds `current` of its `limit` already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtLimit {
    pub kind: HoldKind,
    pub limit: u32,
    pub current: u32,
}

/// The replica's holds.
#[derive(Default)]
pub struct Guard {
    open: Mutex<HashMap<String, Open>>,
}

/// One open hold; released when dropped.
pub struct Hold {
    guard: Arc<Guard>,
    tenant: String,
    kind: HoldKind,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut open = self.guard.open.lock().unwrap_or_else(|e| e.into_inner());
        let now = match open.get_mut(&self.tenant) {
            Some(o) => {
                let n = o.of(self.kind);
                *n = n.saturating_sub(1);
                let left = *n;
                if *o == Open::default() {
                    open.remove(&self.tenant);
                }
                left
            }
            None => 0,
        };
        drop(open);
        gauge(&self.tenant, self.kind, now);
    }
}

fn gauge(tenant: &str, kind: HoldKind, n: u32) {
    let name = match kind {
        HoldKind::Stream => "subagentd_open_streams",
        HoldKind::Wait => "subagentd_open_waits",
    };
    metrics::gauge!(name, "tenant" => tenant.to_string()).set(f64::from(n));
}

impl Guard {
    pub fn new() -> Arc<Guard> {
        Arc::new(Guard::default())
    }

    /// A hold of `kind` for `tenant`, unless it holds `limit` of that kind already (`None`: no
    /// limit; 0: none allowed).
    pub fn take(self: &Arc<Self>, tenant: &str, kind: HoldKind, limit: Option<u32>) -> Result<Hold, AtLimit> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(tenant.to_string()).or_default().of(kind);
        if let Some(limit) = limit.filter(|l| *n >= *l) {
            let current = *n;
            if current == 0 {
                open.remove(tenant);
            }
            drop(open);
            metrics::counter!("subagentd_hold_refusals_total", "tenant" => tenant.to_string(), "limit" => kind.as_str())
                .increment(1);
            return Err(AtLimit { kind, limit, current });
        }
        *n += 1;
        let now = *n;
        drop(open);
        gauge(tenant, kind, now);
        Ok(Hold { guard: self.clone(), tenant: tenant.to_string(), kind })
    }

    /// Every tenant's open holds on this replica, by tenant.
    pub fn open(&self) -> Vec<(String, Open)> {
        let mut v: Vec<(String, Open)> =
            self.open.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(t, o)| (t.clone(), *o)).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_count_per_tenant_and_kind_up_to_the_limit_and_free_a_place_when_dropped() {
        let g = Guard::new();
        let a1 = g.take("a", HoldKind::Stream, Some(2)).unwrap();
        let _a2 = g.take("a", HoldKind::Stream, Some(2)).unwrap();
        assert_eq!(
            g.take("a", HoldKind::Stream, Some(2)).err(),
            Some(AtLimit { kind: HoldKind::Stream, limit: 2, current: 2 })
        );
        // Another kind, another tenant: their own counts.
        let _w = g.take("a", HoldKind::Wait, Some(1)).unwrap();
        let _b = g.take("b", HoldKind::Stream, Some(2)).unwrap();
        assert_eq!(
            g.open(),
            vec![("a".to_string(), Open { streams: 2, waits: 1 }), ("b".to_string(), Open { streams: 1, waits: 0 })]
        );
        drop(a1);
        assert!(g.take("a", HoldKind::Stream, Some(2)).is_ok(), "a place freed");
        assert!(g.take("c", HoldKind::Wait, Some(0)).is_err(), "0: none allowed");
        assert!(g.take("c", HoldKind::Wait, None).is_ok(), "no limit");
    }
}
