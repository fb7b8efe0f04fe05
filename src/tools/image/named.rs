//! Named environments (issue 63): a tenant's image with a setup script, built once per
//! (definition, image digest): the replica that runs the setup keeps its layer for the others
//! (`shared`), which apply it rather than run the setup again. The setup runs in the sandbox over a
//! writable copy of the image's root, as uid 0 of the sandbox's own user namespace with no
//! capability and no network; the root it leaves is kept in the image cache beside the image's,
//! and later tasks' commands run in it read-only. The definition's row says what the latest
//! build did (`building`, `ready`, `failed`, the exit code, the tail of the output).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use sha2::Digest;
use sqlx::PgPool;

use super::{ImageError, ImageRoot, Images};
use crate::store::environments::{self as store, Built, EnvironmentRow};
use crate::tools::egress::Policy;
use crate::tools::files::Usage;
use crate::tools::sandbox::{self, Outcome, Place, Sandbox};
use crate::tools::ssrf::AllowList;

/// The most of a setup's output kept (its tail).
const TAIL: usize = 4096;

/// The hash of a definition (`sha256:` of its image, its setup and its network).
pub fn definition_hash(image: &str, setup: &str, allow: &[String], in_runs: bool) -> String {
    let mut h = sha2::Sha256::new();
    for part in [image, setup] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    for a in allow {
        h.update(a.as_bytes());
        h.update([0]);
    }
    h.update([in_runs as u8]);
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// What a build ran, for the task's event.
#[derive(Debug, Clone, Default)]
pub struct SetupRun {
    pub exit_code: Option<i32>,
    pub output_tail: String,
    pub millis: u64,
}

/// Why an environment cannot be had.
#[derive(Debug, Clone)]
pub enum BuildError {
    /// Its image.
    Image(ImageError),
    /// Its setup failed (what it ran, when it ran), or the cache could not keep what it made.
    Setup(String, Option<SetupRun>),
}

impl BuildError {
    pub fn code(&self) -> crate::kinds::FailureCode {
        match self {
            BuildError::Image(e) => e.code(),
            BuildError::Setup(..) => crate::kinds::FailureCode::EnvironmentFailed,
        }
    }
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::Image(e) => write!(f, "{e}"),
            BuildError::Setup(m, _) => write!(f, "{m}"),
        }
    }
}

/// The last `TAIL` bytes of `s`, cut at a character boundary.
fn tail(s: &str) -> String {
    let mut at = s.len().saturating_sub(TAIL);
    while !s.is_char_boundary(at) {
        at += 1;
    }
    s[at..].to_string()
}

/// Copy the tree at `from` to `to` (made): directories, regular files (their modes), symbolic
/// links as links; nothing else is in an unpacked root.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for e in walkdir::WalkDir::new(from).follow_links(false) {
        let e = e.map_err(std::io::Error::other)?;
        let rel = e.path().strip_prefix(from).map_err(std::io::Error::other)?;
        let dest = to.join(rel);
        let t = e.file_type();
        if t.is_dir() {
            if !dest.exists() {
                std::fs::create_dir(&dest)?;
            }
            let mode = e.metadata().map_err(std::io::Error::other)?.permissions().mode();
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode | 0o700))?;
        } else if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path())?, &dest)?;
        } else if t.is_file() {
            std::fs::copy(e.path(), &dest)?;
        }
    }
    Ok(())
}

/// What a setup left made safe to keep: anything but directories, regular files and links
/// removed (FIFOs, sockets: a setup runs as uid 0 of its namespace), setuid, setgid and sticky
/// bits and the group's and others' write bits cleared, and every entry given back to this
/// process's uid (it was the sandbox's while the setup ran), so that no other host user can
/// change a root later runs execute.
fn settle(root: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: geteuid/getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut specials = vec![];
    for e in walkdir::WalkDir::new(root).follow_links(false) {
        let e = e.map_err(std::io::Error::other)?;
        let m = e.path().symlink_metadata()?;
        let t = m.file_type();
        if !(t.is_dir() || t.is_file() || t.is_symlink()) {
            specials.push(e.path().to_path_buf());
            continue;
        }
        if m.uid() != uid || m.gid() != gid {
            std::os::unix::fs::lchown(e.path(), Some(uid), Some(gid))?;
        }
        if !t.is_symlink() && m.mode() & 0o7022 != 0 {
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(m.mode() & 0o755))?;
        }
    }
    for p in specials {
        std::fs::remove_file(p)?;
    }
    Ok(())
}

impl Images {
    /// `base` with `setup` run over it: from the cache, from the layer another replica kept
    /// (`shared`: the database and the environment's name), or built now (what the setup did
    /// then; its layer then kept for the others).
    #[allow(clippy::too_many_arguments)]
    pub async fn with_setup(
        &self,
        sandbox: &Sandbox,
        tenant: &str,
        base: &Arc<ImageRoot>,
        hash: &str,
        setup: &str,
        net: Option<&Arc<Policy>>,
        shared: Option<(&PgPool, &str)>,
    ) -> Result<(Arc<ImageRoot>, Option<SetupRun>), BuildError> {
        let key = {
            // Per tenant: a definition is a tenant's, and its base may be a private image.
            let mut h = sha2::Sha256::new();
            h.update(tenant.as_bytes());
            h.update([0]);
            h.update(hash.as_bytes());
            h.update([0]);
            h.update(base.digest.as_bytes());
            format!("env-{}", hex::encode(h.finalize()))
        };
        if let Some(r) = self.cached(&key) {
            return Ok((r, None));
        }
        let lock = self.pulling.lock().unwrap().entry(key.clone()).or_default().clone();
        let _building = lock.lock().await;
        if let Some(r) = self.cached(&key) {
            return Ok((r, None));
        }
        if let Some((pool, _)) = shared {
            match self.with_kept_layer(pool, base, &key).await {
                Ok(Some(root)) => {
                    self.pulling.lock().unwrap().remove(&key);
                    let root = Arc::new(root);
                    self.keep(key, root.clone());
                    return Ok((root, None));
                }
                Ok(None) => {}
                // The setup runs here then.
                Err(e) => tracing::warn!(error = %e, "an environment's kept layer could not be applied"),
            }
        }
        let built = self.build(sandbox, tenant, base, setup, &key, net).await;
        self.pulling.lock().unwrap().remove(&key);
        let (root, run) = built?;
        let root = Arc::new(root);
        self.keep(key.clone(), root.clone());
        // Its layer kept for the other replicas, after the fact: a task waits for its root only.
        if let Some((pool, name)) = shared {
            let (pool, base, built) = (pool.clone(), base.clone(), root.clone());
            let (tenant, name, hash, dir) = (tenant.to_string(), name.to_string(), hash.to_string(), self.build_dir());
            tokio::spawn(async move {
                let kept = async {
                    let dir = dir.map_err(|e| e.to_string())?;
                    let file = dir.path().join("layer.tar.gz");
                    let (f, b, r) = (file.clone(), base.rootfs.clone(), built.rootfs.clone());
                    tokio::task::spawn_blocking(move || super::shared::pack(&b, &r, &f))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.to_string())?;
                    let layer = store::Layer {
                        key: &key,
                        tenant: &tenant,
                        name: &name,
                        definition_hash: &hash,
                        digest: &base.digest,
                    };
                    super::shared::publish(&pool, &layer, &file).await
                };
                if let Err(e) = kept.await {
                    tracing::warn!(error = %e, environment = %name, "an environment's layer could not be kept for the other replicas");
                }
            });
        }
        Ok((root, Some(run)))
    }

    /// `base` with the layer kept under `key` applied (the safe unpacker of every image layer),
    /// if one is kept.
    async fn with_kept_layer(&self, pool: &PgPool, base: &ImageRoot, key: &str) -> Result<Option<ImageRoot>, String> {
        let dir = self.build_dir().map_err(|e| format!("the image cache: {e}"))?;
        let file = dir.path().join("layer.tar.gz");
        if !super::shared::fetch(pool, key, &file).await? {
            return Ok(None);
        }
        let (from, to) = (base.rootfs.clone(), dir.path().join("rootfs"));
        let caps = super::layer::Caps { max_bytes: self.settings.max_bytes, max_entries: self.settings.max_entries };
        tokio::task::spawn_blocking(move || {
            copy_tree(&from, &to).map_err(|e| format!("copying the image: {e}"))?;
            let layer = std::fs::File::open(&file).map_err(|e| e.to_string())?;
            let mut done = super::layer::Unpacked::default();
            super::layer::apply(layer, &to, caps, &mut done).map_err(|e| e.to_string())?;
            std::fs::remove_file(&file).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())??;
        let root =
            self.finish(dir, &base.digest, base.env.clone(), key).map_err(|e| format!("the image cache: {e}"))?;
        Ok(Some(root))
    }

    async fn build(
        &self,
        sandbox: &Sandbox,
        tenant: &str,
        base: &ImageRoot,
        setup: &str,
        key: &str,
        net: Option<&Arc<Policy>>,
    ) -> Result<(ImageRoot, SetupRun), BuildError> {
        let started = Instant::now();
        let cache = |e: std::io::Error| BuildError::Setup(format!("the image cache: {e}"), None);
        let dir = self.build_dir().map_err(cache)?;
        let rootfs = dir.path().join("rootfs");
        let (from, to, uid) = (base.rootfs.clone(), rootfs.clone(), sandbox.uid());
        tokio::task::spawn_blocking(move || copy_tree(&from, &to).and_then(|_| sandbox::hand_over(&to, uid)))
            .await
            .map_err(|e| BuildError::Setup(format!("copying the image: {e}"), None))?
            .map_err(cache)?;
        let max = Usage { bytes: self.settings.max_bytes, entries: self.settings.max_entries };
        let place = Place { copy: &rootfs, max_copy: max, image: Some(base), setup: true, net };
        let (out, outcome) = sandbox.run(tenant, place, setup, sandbox.max_timeout(), 64 * 1024).await;
        let exit_code = out.detail.as_ref().and_then(|d| d.get("exit_code")).and_then(|c| c.as_i64()).map(|c| c as i32);
        let run = SetupRun { exit_code, output_tail: tail(&out.content), millis: started.elapsed().as_millis() as u64 };
        // The sandbox not starting (or shutting down) says nothing of the setup: no run to tell.
        if outcome == Outcome::Limit && exit_code.is_none() && out.content.starts_with("the sandbox ") {
            return Err(BuildError::Setup(out.content.clone(), None));
        }
        if outcome != Outcome::Ok {
            let how = exit_code.map_or_else(|| outcome.as_str().to_string(), |c| format!("exit code {c}"));
            return Err(BuildError::Setup(format!("the setup failed ({how}): {}", run.output_tail), Some(run)));
        }
        let to = rootfs.clone();
        tokio::task::spawn_blocking(move || settle(&to))
            .await
            .map_err(|e| BuildError::Setup(format!("settling the root: {e}"), None))?
            .map_err(|e| BuildError::Setup(format!("settling the root: {e}"), None))?;
        let root = self
            .finish(dir, &base.digest, base.env.clone(), key)
            .map_err(|e| BuildError::Setup(e.to_string(), None))?;
        Ok((root, run))
    }
}

/// The egress policy of `row`'s network for `tenant`: its allow-list, under the operator's guard
/// and ports (`SUBAGENTD_SANDBOX_EGRESS_ALLOW`: private addresses only where a CIDR there allows
/// them; `SUBAGENTD_SANDBOX_EGRESS_PORTS`).
pub fn network(row: &EnvironmentRow, tenant: &str, images: &Images) -> Option<Arc<Policy>> {
    if row.network_allow.is_empty() {
        return None;
    }
    let allow = AllowList::parse(&row.network_allow.join(",")).ok()?.named("the environment's network.allow");
    Some(Arc::new(Policy {
        allow: Arc::new(allow),
        guard: Some(images.egress_guard()),
        ports: images.egress_ports(),
        purpose: "environment",
        tenant: Some(tenant.to_string()),
    }))
}

/// The named environment `row` of `tenant` built (or found) on this replica for `digest` (its
/// image's, recorded by the caller, pulled with `access`), its row updated with what a build did.
/// Its setup reaches the network `network` gives it. The pull's figures (when it pulled) come
/// back beside the root and the setup's.
pub async fn build(
    pool: &PgPool,
    images: &Images,
    sandbox: &Sandbox,
    tenant: &str,
    row: &EnvironmentRow,
    digest: &str,
    access: &super::Access,
) -> Result<(Arc<ImageRoot>, Option<SetupRun>, Option<super::PullStats>), BuildError> {
    let net = network(row, tenant, images);
    let mut pulled = None;
    let built = match images.root(&row.image, digest, access).await {
        Err(e) => Err(BuildError::Image(e)),
        Ok((base, stats)) => {
            pulled = stats;
            if row.setup.trim().is_empty() {
                Ok((base, None))
            } else {
                let shared = Some((pool, row.name.as_str()));
                images.with_setup(sandbox, tenant, &base, &row.definition_hash, &row.setup, net.as_ref(), shared).await
            }
        }
    };
    match &built {
        // Found in this replica's cache: the row already says so, unless it was built elsewhere.
        Ok((root, run)) if run.is_some() || row.status != "ready" || row.digest.as_deref() != Some(digest) => {
            let r = run.clone().unwrap_or_default();
            let b = Built {
                status: "ready",
                digest: Some(digest),
                exit_code: r.exit_code,
                output_tail: run.as_ref().map(|r| r.output_tail.as_str()),
                size_bytes: Some(root.bytes as i64),
            };
            record(pool, tenant, row, &b).await;
        }
        Ok(_) => {}
        // Only what the definition itself causes is `failed`: its setup failing, or an image that
        // is not there, too large, or refused. A registry out of reach, the sandbox not starting
        // or the cache failing leave the status as it is (a task says why; the next one tries).
        Err(BuildError::Image(ImageError::Unavailable(_)) | BuildError::Setup(_, None)) => {}
        Err(e) => {
            let run = match e {
                BuildError::Setup(_, run) => run.clone(),
                BuildError::Image(_) => None,
            };
            let text = run.as_ref().map_or_else(|| tail(&e.to_string()), |r| r.output_tail.clone());
            let b = Built {
                status: "failed",
                digest: Some(digest),
                exit_code: run.and_then(|r| r.exit_code),
                output_tail: Some(&text),
                size_bytes: None,
            };
            record(pool, tenant, row, &b).await;
        }
    }
    built.map(|(root, run)| (root, run, pulled))
}

async fn record(pool: &PgPool, tenant: &str, row: &EnvironmentRow, b: &Built<'_>) {
    if let Err(e) = store::record_build(pool, tenant, &row.name, &row.definition_hash, b).await {
        tracing::warn!(error = %e, environment = %row.name, "an environment's build could not be recorded");
    }
}
