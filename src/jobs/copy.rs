//! A run's own copy of its workspace (for a run offered `write_file`, `edit_file` or
//! `run_command`): made from the shared tree when the run starts, with the task's saved changes
//! applied (a rescued or resumed run goes on from them); its changes saved with each checkpoint
//! that follows a change; its diff saved when the run ends; removed with the run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sqlx::PgPool;

use crate::store::{diffs, retrying, Fence, StoreError};
use crate::workspace::copy::{self, Changes, Manifest};

/// Where this process keeps its tasks' copies: `<sandbox-dir>/<pid>` (`<data-dir>/sandboxes` by
/// default), so that processes sharing a data directory never remove each other's.
pub fn process_dir(cfg: &crate::config::Config) -> PathBuf {
    let root = cfg.sandbox_dir.clone().unwrap_or_else(|| cfg.data_dir.join("sandboxes"));
    root.join(std::process::id().to_string())
}

pub use crate::tools::leftovers::sweep_gone_processes;

/// What a task's copy may grow to, what its saved changes hold, and what its diff leaves out.
pub struct Limits {
    /// Bytes and entries a run may add to its copy (`SUBAGENTD_SANDBOX_WRITE_MB`, `…_ENTRIES`).
    pub write_bytes: u64,
    pub write_entries: u64,
    /// `SUBAGENTD_SANDBOX_KEEP_MB`, in bytes.
    pub keep_max: u64,
    pub rules: copy::Rules,
}

pub struct TaskCopy {
    /// The shared tree it was made from.
    pub base: PathBuf,
    /// The copy (canonical).
    pub dir: PathBuf,
    manifest: Manifest,
    /// Set by the tools when a call may have changed the copy.
    pub dirty: Arc<AtomicBool>,
    /// The most the copy may hold: its starting usage plus the write allowances (bytes, entries).
    pub max: crate::tools::files::Usage,
    /// What its diff and saved changes leave out, and the diff's caps.
    rules: copy::Rules,
    /// What its saved changes hold at most (`SUBAGENTD_SANDBOX_KEEP_MB`).
    pub keep_max: u64,
}

impl TaskCopy {
    /// The copy of `task` under `root`, made from `base`, with the changes saved for the task
    /// (or, for a resumed task that has none yet, its parent's).
    pub async fn make(
        pool: &PgPool,
        task: uuid::Uuid,
        parent: Option<uuid::Uuid>,
        base: &Path,
        root: &Path,
        limits: Limits,
        owner: Option<u32>,
    ) -> Result<TaskCopy, String> {
        let mut saved = retrying(pool, || diffs::changes_of(pool, task)).await.map_err(|e| e.to_string())?;
        if saved.is_none() {
            if let Some(p) = parent {
                // Only onto the tree they were made over (the resumed ref may have moved since).
                if retrying(pool, || diffs::same_version(pool, task, p)).await.map_err(|e| e.to_string())? {
                    saved = retrying(pool, || diffs::changes_of(pool, p)).await.map_err(|e| e.to_string())?;
                }
            }
        }
        let changed = saved.is_some();
        let (base, dir) = (base.to_path_buf(), root.join(task.to_string()));
        let (b, d) = (base.clone(), dir.clone());
        let (start, manifest, dir) = tokio::task::spawn_blocking(move || {
            if d.symlink_metadata().is_ok() {
                std::fs::remove_dir_all(&d)?;
            }
            let (_, manifest) = copy::make(&b, &d)?;
            if let Some((archive, deleted)) = saved {
                copy::apply(&d, &Changes { archive, deleted, left_out: vec![] })?;
            }
            crate::tools::sandbox::hand_over(&d, owner)?;
            // Counted as the sandbox's watch counts it (directories and links too).
            let start = crate::tools::files::tree_usage(&d, crate::tools::files::Usage::ALL);
            Ok::<_, std::io::Error>((start, manifest, d.canonicalize()?))
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the task's copy of its workspace could not be made: {e}"))?;
        Ok(TaskCopy {
            base,
            dir,
            manifest,
            // A copy rebuilt with changes is saved again at the next checkpoint.
            dirty: Arc::new(AtomicBool::new(changed)),
            max: crate::tools::files::Usage {
                bytes: start.bytes.saturating_add(limits.write_bytes),
                entries: start.entries.saturating_add(limits.write_entries),
            },
            rules: limits.rules,
            keep_max: limits.keep_max,
        })
    }

    /// The copy's changes, if a call may have changed it since they were last taken.
    pub async fn take_changes(self: &Arc<Self>) -> Option<Changes> {
        if !self.dirty.swap(false, Ordering::SeqCst) {
            return None;
        }
        let me = self.clone();
        let max = self.keep_max;
        match tokio::task::spawn_blocking(move || copy::changes(&me.base, &me.dir, &me.manifest, max, &me.rules.ignore))
            .await
        {
            Ok(Ok(Some(c))) => {
                if !c.left_out.is_empty() {
                    tracing::info!(left_out = ?c.left_out, "files past SUBAGENTD_SANDBOX_KEEP_MB are not kept with the task's changes");
                }
                Some(c)
            }
            Ok(Ok(None)) => {
                tracing::warn!(dir = %self.dir.display(), "a task's changes are past its write allowance: not saved");
                None
            }
            failed => {
                let e = failed.map_or_else(|j| j.to_string(), |r| r.err().map(|e| e.to_string()).unwrap_or_default());
                tracing::warn!(error = %e, "a task's changes could not be read");
                self.dirty.store(true, Ordering::SeqCst);
                None
            }
        }
    }

    /// At the run's end: its changes saved (if any since the last checkpoint), then its diff
    /// and the diff's counts. False if the lease is gone.
    pub async fn finish(self: &Arc<Self>, pool: &PgPool, fence: Fence) -> Result<bool, StoreError> {
        if let Some(c) = self.take_changes().await {
            // Retried as every worker write is (a day's partition made on demand among others).
            let saved = retrying(pool, || async {
                let mut conn = pool.acquire().await?;
                diffs::save_changes(&mut conn, fence, &c.archive, &c.deleted).await
            })
            .await?;
            if !saved {
                return Ok(false);
            }
        }
        let me = self.clone();
        let (text, stats) = tokio::task::spawn_blocking(move || copy::diff(&me.base, &me.dir, &me.manifest, &me.rules))
            .await
            .map_err(|e| StoreError::Db(sqlx::Error::Protocol(e.to_string())))?;
        let stats = serde_json::to_value(&stats).unwrap_or_default();
        retrying(pool, || diffs::save_diff(pool, fence, &text, &stats)).await
    }
}

/// The copy goes with its run (its changes are saved; another run rebuilds it from them).
impl Drop for TaskCopy {
    fn drop(&mut self) {
        let dir = std::mem::take(&mut self.dir);
        let remove = move || {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %dir.display(), error = %e, "a task's copy could not be removed");
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => drop(h.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}
