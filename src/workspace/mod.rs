//! Workspaces: the trees a task's read tools work in — a git repository at one commit
//! (`git.rs`) or a tenant's uploaded archive (`archive.rs`) — written out as plain files in a
//! disk cache of this process's own, one tree per tenant and version, shared by that tenant's
//! tasks. The first task to need a tree fills it while the others wait on the same fill; a tree
//! is complete before its directory has its name (filled aside, then renamed), so a reader never
//! sees half of one. Past the size bound, the trees least recently used and not in use are
//! removed: the cache is disposable.

pub mod archive;
pub mod binary_patch;
pub mod copy;
pub mod git;

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::kinds::FailureCode;
use crate::tools::ssrf::AllowList;

/// A fetch's and a tree's caps.
#[derive(Debug, Clone)]
pub struct Caps {
    pub timeout: Duration,
    pub max_fetch_bytes: u64,
    pub max_files: u64,
    pub max_bytes: u64,
}

/// What filling a tree took.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub fetched_bytes: u64,
    pub files: u64,
    pub bytes: u64,
    pub millis: u64,
    pub dropped: Vec<String>,
}

/// Why a task's workspace could not be made ready: each a failure code of its own.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkspaceError {
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    RefNotFound(String),
    #[error("{0}")]
    Unreachable(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Gone(String),
    #[error("{0}")]
    Internal(String),
}

impl WorkspaceError {
    pub fn code(&self) -> FailureCode {
        match self {
            WorkspaceError::Refused(_) => FailureCode::WorkspaceRefused,
            WorkspaceError::RefNotFound(_) => FailureCode::WorkspaceRefNotFound,
            WorkspaceError::Unreachable(_) => FailureCode::WorkspaceUnreachable,
            WorkspaceError::TooLarge(_) => FailureCode::WorkspaceTooLarge,
            WorkspaceError::Gone(_) => FailureCode::WorkspaceGone,
            WorkspaceError::Internal(_) => FailureCode::Internal,
        }
    }
}

/// This process's workspace cache and what fetching needs.
pub struct Workspaces {
    dir: PathBuf,
    max_cache_bytes: u64,
    pub caps: Caps,
    /// The address guard of git fetches.
    pub allow: Arc<AllowList>,
    /// Extra CA certificates (PEM) for git servers.
    pub ca: Option<Arc<Vec<u8>>>,
    /// One fill per tree at a time: the others wait on it.
    fills: Mutex<HashMap<PathBuf, Weak<tokio::sync::Mutex<()>>>>,
    /// Trees tasks read now (never evicted).
    in_use: Mutex<HashMap<PathBuf, usize>>,
}

/// A tree in use by a task: not evicted until dropped.
pub struct InUse {
    ws: Arc<Workspaces>,
    entry: PathBuf,
    /// The tree's root (canonical).
    pub root: PathBuf,
}

impl InUse {
    /// The tree's bytes, as written when it was filled (not walked again).
    pub fn bytes(&self) -> u64 {
        std::fs::read_to_string(self.entry.join("size")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        if let Ok(mut m) = self.ws.in_use.lock() {
            if let Some(n) = m.get_mut(&self.entry) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&self.entry);
                }
            }
        }
    }
}

impl Workspaces {
    pub fn from_config(cfg: &crate::config::Config) -> Result<Workspaces, String> {
        let (spec, setting) = match cfg.workspace_git_allow.as_deref() {
            Some(own) => (own, "SUBAGENTD_WORKSPACE_GIT_ALLOW"),
            None => (cfg.tool_allow.as_str(), "SUBAGENTD_TOOL_ALLOW"),
        };
        let allow = AllowList::parse(spec).map_err(|e| format!("{setting}: {e}"))?.named(setting);
        let dir = cfg.workspace_dir.clone().unwrap_or_else(|| cfg.data_dir.join("workspaces"));
        let caps = Caps {
            timeout: Duration::from_secs(cfg.workspace_fetch_timeout_seconds.max(1)),
            max_fetch_bytes: cfg.workspace_fetch_max_mb.max(1) << 20,
            max_files: cfg.workspace_max_files.max(1),
            max_bytes: cfg.workspace_max_mb.max(1) << 20,
        };
        let ca = match &cfg.workspace_ca_file {
            Some(p) => {
                let pem = std::fs::read(p).map_err(|e| format!("SUBAGENTD_WORKSPACE_CA_FILE: {}: {e}", p.display()))?;
                reqwest::Certificate::from_pem_bundle(&pem)
                    .map_err(|e| format!("SUBAGENTD_WORKSPACE_CA_FILE: {}: not PEM certificates: {e}", p.display()))?;
                Some(Arc::new(pem))
            }
            None => None,
        };
        let mut ws = Workspaces::new(dir, cfg.workspace_cache_mb << 20, caps, Arc::new(allow));
        ws.ca = ca;
        Ok(ws)
    }

    pub fn new(dir: PathBuf, max_cache_bytes: u64, caps: Caps, allow: Arc<AllowList>) -> Workspaces {
        // A fill a crash cut short is left aside under a name of its own: gone at start.
        for tenant in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            for e in std::fs::read_dir(tenant.path()).into_iter().flatten().flatten() {
                if e.file_name().to_string_lossy().contains(".tmp-") {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        Workspaces { dir, max_cache_bytes, caps, allow, ca: None, fills: Mutex::default(), in_use: Mutex::default() }
    }

    /// Where `tenant`'s tree of this version lives: a directory per tenant (named by a hash of
    /// the tenant, so that no tenant name can lead elsewhere), then `{source}-{version}`.
    pub fn entry(&self, tenant: &str, source: &str, version: &str) -> PathBuf {
        let t = hex::encode(&Sha256::digest(tenant.as_bytes())[..12]);
        let v: String = version.chars().filter(|c| c.is_ascii_alphanumeric()).take(80).collect();
        self.dir.join(t).join(format!("{source}-{v}"))
    }

    fn mark_in_use(self: &Arc<Self>, entry: &Path) -> Result<InUse, WorkspaceError> {
        // Counted before the tree is looked at, under the lock eviction decides under: a tree
        // found here is not taken away while the task reads it.
        let mut in_use = self.in_use.lock().map_err(|_| WorkspaceError::Internal("poisoned".into()))?;
        let root = entry
            .join("tree")
            .canonicalize()
            .map_err(|e| WorkspaceError::Internal(format!("the cached tree cannot be read: {e}")))?;
        *in_use.entry(entry.to_path_buf()).or_default() += 1;
        drop(in_use);
        // The entry's time is its last use: eviction takes the oldest first.
        if let Ok(f) = std::fs::File::open(entry) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        Ok(InUse { ws: self.clone(), entry: entry.to_path_buf(), root })
    }

    /// The tree at `entry`, filled by `fill` (into the directory it is given: the tree goes in
    /// its `tree/`, anything else there is scratch) unless the cache has it. `None` stats: it
    /// was cached (or another task filled it while this one waited).
    pub async fn ready<F, Fut>(
        self: &Arc<Self>,
        entry: PathBuf,
        fill: F,
    ) -> Result<(InUse, Option<Stats>), WorkspaceError>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: Future<Output = Result<Stats, WorkspaceError>>,
    {
        if entry.join("tree").is_dir() {
            metrics::counter!("subagentd_workspace_cache_hits_total").increment(1);
            return Ok((self.mark_in_use(&entry)?, None));
        }
        let lock = {
            let mut fills = self.fills.lock().map_err(|_| WorkspaceError::Internal("poisoned".into()))?;
            fills.retain(|_, w| w.strong_count() > 0);
            match fills.get(&entry).and_then(Weak::upgrade) {
                Some(l) => l,
                None => {
                    let l = Arc::new(tokio::sync::Mutex::new(()));
                    fills.insert(entry.clone(), Arc::downgrade(&l));
                    l
                }
            }
        };
        let _filling = lock.lock().await;
        if entry.join("tree").is_dir() {
            metrics::counter!("subagentd_workspace_cache_hits_total").increment(1);
            return Ok((self.mark_in_use(&entry)?, None));
        }
        let io = |e: std::io::Error| WorkspaceError::Internal(format!("the workspace cache cannot be written: {e}"));
        let parent = entry.parent().unwrap_or(&self.dir).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(io)?;
        let name = entry.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let aside = parent.join(format!("{name}.tmp-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&aside).map_err(io)?;
        let filled = fill(aside.clone()).await;
        let stats = match filled {
            Ok(s) => s,
            Err(e) => {
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(aside)).await;
                return Err(e);
            }
        };
        let (a, e2) = (aside.clone(), entry.clone());
        let moved = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            for e in std::fs::read_dir(&a)?.flatten() {
                if e.file_name() != "tree" {
                    std::fs::remove_dir_all(e.path()).or_else(|_| std::fs::remove_file(e.path()))?;
                }
            }
            std::fs::write(a.join("size"), git::dir_size(&a.join("tree")).to_string())?;
            std::fs::rename(&a, &e2)
        })
        .await
        .map_err(|e| WorkspaceError::Internal(e.to_string()))?;
        if let Err(e) = moved {
            let _ = std::fs::remove_dir_all(&aside);
            return Err(io(e));
        }
        let held = self.mark_in_use(&entry)?;
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || me.evict()).await;
        Ok((held, Some(stats)))
    }

    /// Remove the least recently used trees not in use until the cache is within its bound;
    /// the cache's size goes to the `subagentd_workspace_cache_bytes` gauge.
    pub fn evict(&self) {
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = vec![];
        for tenant in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            for e in std::fs::read_dir(tenant.path()).into_iter().flatten().flatten() {
                let p = e.path();
                // A fill in progress (or a tree being removed) is not a cached tree.
                if e.file_name().to_string_lossy().contains(".tmp-") {
                    continue;
                }
                let Ok(size) = std::fs::read_to_string(p.join("size")) else { continue };
                let used = e.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
                entries.push((used, size.trim().parse().unwrap_or(0), p));
            }
        }
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort();
        // Held while trees are chosen and moved aside: none is marked in use meanwhile.
        let Ok(busy) = self.in_use.lock() else { return };
        for (_, size, p) in entries {
            if total <= self.max_cache_bytes {
                break;
            }
            if busy.contains_key(&p) {
                continue;
            }
            // Renamed aside first, so that a reader never finds half a tree under its name.
            let gone = p.with_file_name(format!(
                "{}.tmp-evicted-{}",
                p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                uuid::Uuid::new_v4().simple()
            ));
            if std::fs::rename(&p, &gone).is_ok() {
                let _ = std::fs::remove_dir_all(&gone);
                total -= size;
                metrics::counter!("subagentd_workspace_evictions_total").increment(1);
            }
        }
        metrics::gauge!("subagentd_workspace_cache_bytes").set(total as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Caps {
        Caps { timeout: Duration::from_secs(5), max_fetch_bytes: 1 << 20, max_files: 100, max_bytes: 1 << 20 }
    }

    #[tokio::test]
    async fn concurrent_first_readers_share_one_fill_and_eviction_spares_trees_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Arc::new(Workspaces::new(dir.path().to_path_buf(), 150, caps(), Arc::default()));
        let fills = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let entry = ws.entry("acme", "upload", "sha256:aa");
        let fill = |n: Arc<std::sync::atomic::AtomicUsize>| {
            move |aside: PathBuf| async move {
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                std::fs::create_dir_all(aside.join("tree")).unwrap();
                std::fs::write(aside.join("tree/f"), [b'x'; 100]).unwrap();
                Ok(Stats { files: 1, bytes: 100, ..Stats::default() })
            }
        };
        let (a, b) =
            tokio::join!(ws.ready(entry.clone(), fill(fills.clone())), ws.ready(entry.clone(), fill(fills.clone())));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(fills.load(std::sync::atomic::Ordering::SeqCst), 1, "one fill for both");
        assert_eq!(a.1.is_some() as u8 + b.1.is_some() as u8, 1, "one of them filled, the other found it");
        assert_eq!(std::fs::read(a.0.root.join("f")).unwrap().len(), 100);
        // Another tenant's tree of the same version is its own.
        assert_ne!(ws.entry("other", "upload", "sha256:aa"), entry);
        // A second tree passes the bound: the first is in use and stays.
        let second = ws.entry("acme", "upload", "sha256:bb");
        let (c, _) = ws.ready(second.clone(), fill(fills.clone())).await.unwrap();
        assert!(entry.join("tree").is_dir() && second.join("tree").is_dir());
        drop((a, b));
        ws.evict();
        assert!(!entry.join("tree").exists(), "the least recently used tree not in use went");
        assert!(second.join("tree").is_dir(), "the tree in use stays");
        drop(c);
        let failed =
            ws.ready(ws.entry("acme", "git", "cc"), |_| async { Err(WorkspaceError::RefNotFound("no".into())) }).await;
        assert!(matches!(failed, Err(WorkspaceError::RefNotFound(_))));
        let names: Vec<String> = std::fs::read_dir(entry.parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp-")), "a failed fill leaves nothing: {names:?}");
    }
}
