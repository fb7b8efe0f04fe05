//! A small per-process cache with a time-to-live, for values read on every request or run that
//! change rarely (tenant limits, tool catalogs, signing secrets). Another replica's change is
//! seen within the TTL; this replica's own changes invalidate at once.
//!
//! A leaf: imports nothing of this crate.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Entries past which a `put` of a new key drops the expired ones first.
const PRUNE_AT: usize = 4096;

pub struct TtlCache<V> {
    ttl: Duration,
    map: Mutex<HashMap<String, (V, Instant)>>,
}

impl<V: Clone> TtlCache<V> {
    pub fn new(ttl: Duration) -> Self {
        TtlCache { ttl, map: Mutex::new(HashMap::new()) }
    }

    pub fn get(&self, key: &str) -> Option<V> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key).filter(|(_, at)| at.elapsed() < self.ttl).map(|(v, _)| v.clone())
    }

    pub fn put(&self, key: &str, v: V) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // Keys that come and go (sessions) do not pile up: past a size, the stale ones go.
        if map.len() >= PRUNE_AT && !map.contains_key(key) {
            let ttl = self.ttl;
            map.retain(|_, (_, at)| at.elapsed() < ttl);
        }
        map.insert(key.to_string(), (v, Instant::now()));
    }

    pub fn remove(&self, key: &str) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_and_can_be_removed() {
        let c = TtlCache::new(Duration::from_millis(30));
        c.put("a", 1);
        assert_eq!(c.get("a"), Some(1));
        c.remove("a");
        assert_eq!(c.get("a"), None);
        c.put("b", 2);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(c.get("b"), None);
    }
}
