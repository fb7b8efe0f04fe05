//! Images for the sandbox (issue 63): a task's environment names an OCI image, and its commands
//! run in that image's root instead of the host's `/usr`.
//!
//! - A reference's tag is resolved to a manifest digest once (the task records it: every later
//!   attempt, on any replica, runs in the same digest), and the image is pulled by digest with
//!   `oci-client`, whose every connection goes through the egress proxy (`egress`): the
//!   registry's host and each address passed the guard, redirects to blob storage too. Hosts in
//!   `SUBAGENTD_INSECURE_REGISTRIES` are reached over plain HTTP.
//! - Layers are streamed to a file (their digest checked by the client as they come, the
//!   compressed bytes capped), then applied in order over one root (`layer::apply`: whiteouts,
//!   no device nodes, no setuid, nothing outside, caps on bytes and entries).
//! - The cache is one root per manifest digest under `<dir>/roots/<hex>`. A root is built under
//!   `<dir>/tmp/<pid>/…` and renamed into place only whole, so a kill -9 mid-pull leaves nothing
//!   a later task would use (the next start removes what gone processes left). Concurrent first
//!   users of a digest wait on one pull. Past the cache's size bound, the roots used longest ago
//!   are removed, never one in use.

pub mod layer;
pub mod named;
pub mod shared;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;
use tokio::io::AsyncWriteExt;

use super::egress::Egress;
use super::ssrf::AllowList;

/// The operator's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The cache's directory.
    pub dir: PathBuf,
    /// Registry hosts (and the addresses they resolve to) that may be pulled from.
    pub allow: Arc<AllowList>,
    /// `host:port` entries reached over plain HTTP.
    pub insecure: Vec<String>,
    /// An image's compressed bytes, and its unpacked bytes, at most.
    pub max_bytes: u64,
    pub max_entries: u64,
    /// The cache's size bound (unpacked bytes of the roots kept).
    pub cache_bytes: u64,
    /// A pull's time at most.
    pub pull_timeout: Duration,
    /// Where an environment's network may reach at all (`SUBAGENTD_SANDBOX_EGRESS_ALLOW`), and
    /// on which ports (`None`: any).
    pub egress: Arc<AllowList>,
    pub egress_ports: Option<Vec<u16>>,
}

impl Settings {
    pub fn from_config(cfg: &crate::config::Config) -> Result<Settings, String> {
        let (spec, setting) = match cfg.registry_allow.as_deref() {
            Some(s) => (s, "SUBAGENTD_REGISTRY_ALLOW"),
            None => (cfg.tool_allow.as_str(), "SUBAGENTD_TOOL_ALLOW"),
        };
        let allow = AllowList::parse(spec).map_err(|e| format!("{setting}: {e}"))?.named(setting);
        Ok(Settings {
            dir: cfg.image_dir.clone().unwrap_or_else(|| cfg.data_dir.join("images")),
            allow: Arc::new(allow),
            insecure: cfg
                .insecure_registries
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            max_bytes: cfg.image_max_mb.max(1) << 20,
            max_entries: cfg.image_max_entries.max(1),
            cache_bytes: cfg.image_cache_mb << 20,
            pull_timeout: Duration::from_secs(cfg.image_pull_timeout_seconds.max(1)),
            egress: Arc::new(
                AllowList::parse(&cfg.sandbox_egress_allow)
                    .map_err(|e| format!("SUBAGENTD_SANDBOX_EGRESS_ALLOW: {e}"))?
                    .named("SUBAGENTD_SANDBOX_EGRESS_ALLOW"),
            ),
            egress_ports: match cfg.sandbox_egress_ports.trim() {
                "*" => None,
                list => Some(
                    list.split(',')
                        .map(|p| p.trim().parse::<u16>())
                        .collect::<Result<_, _>>()
                        .map_err(|e| format!("SUBAGENTD_SANDBOX_EGRESS_PORTS: {e}"))?,
                ),
            },
        })
    }
}

/// Why an image is not there.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ImageError {
    /// Not a reference, or its registry is not allowed.
    #[error("{0}")]
    Refused(String),
    /// The registry says it has no such image (unknown repository, tag or digest).
    #[error("{0}")]
    NotFound(String),
    /// Over a cap.
    #[error("{0}")]
    TooLarge(String),
    /// The registry could not be reached, or sent what is not an image.
    #[error("{0}")]
    Unavailable(String),
}

impl ImageError {
    /// The task's error code when its environment cannot be had.
    pub fn code(&self) -> crate::kinds::FailureCode {
        use crate::kinds::FailureCode as F;
        match self {
            ImageError::Refused(_) => F::EnvironmentRefused,
            ImageError::NotFound(_) => F::EnvironmentNotFound,
            ImageError::TooLarge(_) => F::EnvironmentTooLarge,
            ImageError::Unavailable(_) => F::EnvironmentUnavailable,
        }
    }
}

/// An image's root, ready for commands; the cache keeps it while this is held.
#[derive(Debug)]
pub struct ImageRoot {
    /// The manifest digest it was pulled by (`sha256:…`).
    pub digest: String,
    /// Its root directory (read-only under the sandbox).
    pub rootfs: PathBuf,
    /// The image config's `Env` (`KEY=VALUE`).
    pub env: Vec<String>,
    /// Unpacked bytes.
    pub bytes: u64,
}

/// A run's environment: the root its commands run in, and their network (the environment's
/// allow-list through the egress proxy) when it gives them one.
#[derive(Debug, Clone)]
pub struct RunEnvironment {
    pub root: Arc<ImageRoot>,
    pub net: Option<Arc<super::egress::Policy>>,
}

/// What a pull took, for the task's event.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PullStats {
    pub layers: usize,
    /// Compressed bytes fetched.
    pub fetched_bytes: u64,
    pub unpacked: layer::Unpacked,
    pub millis: u64,
}

/// The root's record beside it (`meta.json`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Meta {
    digest: String,
    env: Vec<String>,
    bytes: u64,
}

struct Cached {
    root: Arc<ImageRoot>,
    used: Instant,
}

/// The service's images.
pub struct Images {
    settings: Settings,
    /// The client of anonymous pulls (its tokens shared: public images only).
    client: oci_client::Client,
    egress: Egress,
    roots: Mutex<HashMap<String, Cached>>,
    /// One lock per digest being pulled: its first users wait on one pull.
    pulling: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for Images {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Images").field("dir", &self.settings.dir).finish()
    }
}

/// An OCI client whose every connection goes through `egress`.
fn new_client(
    settings: &Settings,
    egress: &Egress,
) -> Result<oci_client::Client, oci_client::errors::OciDistributionError> {
    oci_client::Client::try_from(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(settings.insecure.clone()),
        http_proxy: Some(egress.url()),
        https_proxy: Some(egress.url()),
        connect_timeout: Some(Duration::from_secs(10)),
        read_timeout: Some(Duration::from_secs(60)),
        max_concurrent_download: 4,
        ..Default::default()
    })
}

/// Whose pull: anonymous (public images, one root per digest for every tenant), or a tenant's
/// with its credentials for the registry (a client of its own, whose tokens no other tenant's pull
/// reuses, and roots kept under the tenant: never served to another by their digest).
#[derive(Clone)]
pub enum Access {
    Anonymous,
    Tenant { tenant: String, auth: RegistryAuth },
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Access::Anonymous => f.write_str("Anonymous"),
            Access::Tenant { tenant, .. } => write!(f, "Tenant({tenant})"),
        }
    }
}

impl Access {
    /// The cache's name for `hex` (a digest's) under this access.
    fn key(&self, hex: &str) -> String {
        match self {
            Access::Anonymous => hex.to_string(),
            Access::Tenant { tenant, .. } => {
                use sha2::Digest;
                format!("t-{}-{hex}", &hex::encode(sha2::Sha256::digest(tenant.as_bytes()))[..16])
            }
        }
    }

    fn auth(&self) -> RegistryAuth {
        match self {
            Access::Anonymous => RegistryAuth::Anonymous,
            Access::Tenant { auth, .. } => auth.clone(),
        }
    }
}

/// The registry's host of `r` (without its port, brackets or case) and its port, if named.
fn registry_host(r: &Reference) -> (String, Option<u16>) {
    let registry = r.resolve_registry();
    let (host, port) = match registry.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => (h, p.parse().ok()),
        _ => (registry, None),
    };
    (host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase(), port)
}

/// The access of `tenant`'s pulls of `reference`: its secret for the registry's host
/// (`PUT /secrets/{name}` with that `host`; a value `user:password`, or a token sent as the
/// password of the user `token`), else anonymous.
pub async fn access(pool: &sqlx::PgPool, tenant: &str, reference: &str) -> Result<Access, ImageError> {
    let r: Reference =
        reference.parse().map_err(|e| ImageError::Refused(format!("{reference:?} is not an image reference: {e}")))?;
    let (host, _) = registry_host(&r);
    let secret = crate::store::workspaces::secret_for_host(pool, tenant, &host)
        .await
        .map_err(|e| ImageError::Unavailable(format!("the tenant's registry secret: {e}")))?;
    Ok(match secret {
        None => Access::Anonymous,
        Some(v) => {
            let (user, pass) =
                v.split_once(':').map_or(("token".to_string(), v.clone()), |(u, p)| (u.into(), p.into()));
            Access::Tenant { tenant: tenant.to_string(), auth: RegistryAuth::Basic(user, pass) }
        }
    })
}

/// The mount points the sandbox needs in a root (made real directories whatever the image had).
const MOUNT_POINTS: [&str; 4] = ["proc", "dev", "tmp", "workspace"];

impl Images {
    /// Open the cache (removing what gone processes left half-built) and start the egress proxy
    /// pulls go through.
    pub async fn open(settings: Settings) -> Result<Images, String> {
        let (roots_dir, tmp) = (settings.dir.join("roots"), settings.dir.join("tmp"));
        for d in [&settings.dir, &roots_dir, &tmp] {
            use std::os::unix::fs::PermissionsExt;
            // The sandbox's uid reads the roots: 0755 down to them.
            std::fs::create_dir_all(d)
                .and_then(|_| std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)))
                .map_err(|e| format!("{}: {e}", d.display()))?;
        }
        super::leftovers::sweep_gone_processes(&tmp, "");
        // A process before this one with the same pid (pid 1 in a container, say) left its own.
        let _ = std::fs::remove_dir_all(tmp.join(std::process::id().to_string()));
        let mut roots = HashMap::new();
        for e in std::fs::read_dir(&roots_dir).map_err(|e| format!("{}: {e}", roots_dir.display()))?.flatten() {
            let meta =
                std::fs::read(e.path().join("meta.json")).ok().and_then(|b| serde_json::from_slice::<Meta>(&b).ok());
            match meta {
                Some(m) => {
                    let root =
                        ImageRoot { digest: m.digest, rootfs: e.path().join("rootfs"), env: m.env, bytes: m.bytes };
                    roots.insert(
                        e.file_name().to_string_lossy().into_owned(),
                        Cached { root: Arc::new(root), used: Instant::now() },
                    );
                }
                None => {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let egress = Egress::start(settings.allow.clone(), "image_pull")
            .await
            .map_err(|e| format!("the egress proxy for image pulls: {e}"))?;
        let client = new_client(&settings, &egress).map_err(|e| format!("the OCI client: {e}"))?;
        let images = Images { settings, client, egress, roots: Mutex::new(roots), pulling: Default::default() };
        images.report_size();
        Ok(images)
    }

    /// `reference` parsed, its registry allowed: the check at submission, before any network.
    pub fn check(&self, reference: &str) -> Result<Reference, ImageError> {
        let r: Reference = reference
            .parse()
            .map_err(|e| ImageError::Refused(format!("{reference:?} is not an image reference: {e}")))?;
        let (host, _) = registry_host(&r);
        let registry = r.resolve_registry();
        self.settings
            .allow
            .check_host(&host)
            .map_err(|e| ImageError::Refused(format!("registry {registry}: {}", e.0)))?;
        Ok(r)
    }

    /// `reference` checked, and its registry's name resolved to an address the guard allows:
    /// a refusal in the guard's own words (the egress proxy refuses the same connection, but a
    /// refused `CONNECT` reaches the client as a bare failure).
    async fn guarded(&self, reference: &str) -> Result<Reference, ImageError> {
        let r = self.check(reference)?;
        let registry = r.resolve_registry();
        let (host, port) = registry_host(&r);
        let host = host.as_str();
        let addrs: Vec<std::net::SocketAddr> = match tokio::net::lookup_host((host, port.unwrap_or(443))).await {
            Ok(a) => a.collect(),
            Err(e) => return Err(ImageError::Unavailable(format!("registry {registry}: {host} did not resolve: {e}"))),
        };
        let mut refused = None;
        for a in &addrs {
            match self.settings.allow.check_ip(host, a.ip()) {
                Ok(()) => return Ok(r),
                Err(e) => refused = Some(e.0),
            }
        }
        let why = refused.unwrap_or_else(|| format!("{host} did not resolve"));
        Err(ImageError::Refused(format!("registry {registry}: {why}")))
    }

    /// The manifest digest `reference` names now (itself, when it names one).
    pub async fn resolve(&self, reference: &str, access: &Access) -> Result<String, ImageError> {
        let r = self.guarded(reference).await?;
        if let Some(d) = r.digest() {
            return Ok(d.to_string());
        }
        let client = self.client_for(access)?;
        tokio::time::timeout(self.settings.pull_timeout, client.fetch_manifest_digest(&r, &access.auth()))
            .await
            .map_err(|_| {
                ImageError::Unavailable(format!("{reference}: no answer in {} s", self.settings.pull_timeout.as_secs()))
            })?
            .map_err(|e| classify(reference, e))
    }

    /// The root of `reference` at `digest`, from the cache or pulled now (the stats then).
    pub async fn root(
        &self,
        reference: &str,
        digest: &str,
        access: &Access,
    ) -> Result<(Arc<ImageRoot>, Option<PullStats>), ImageError> {
        let key = access.key(&key_of(digest)?);
        if let Some(r) = self.cached(&key) {
            metrics::counter!("subagentd_image_cache_hits_total").increment(1);
            return Ok((r, None));
        }
        let lock = self.pulling.lock().unwrap().entry(key.clone()).or_default().clone();
        let _pulling = lock.lock().await;
        if let Some(r) = self.cached(&key) {
            metrics::counter!("subagentd_image_cache_hits_total").increment(1);
            return Ok((r, None));
        }
        let started = Instant::now();
        let pulled = tokio::time::timeout(self.settings.pull_timeout, self.pull(reference, digest, &key, access)).await;
        self.pulling.lock().unwrap().remove(&key);
        let pulled = pulled.unwrap_or_else(|_| {
            Err(ImageError::Unavailable(format!(
                "{reference}: the pull took over {} s",
                self.settings.pull_timeout.as_secs()
            )))
        });
        let outcome = match &pulled {
            Ok(_) => "ok",
            Err(e) => e.code().as_str().trim_start_matches("environment_"),
        };
        metrics::counter!("subagentd_image_pulls_total", "outcome" => outcome).increment(1);
        let (root, mut stats) = pulled?;
        stats.millis = started.elapsed().as_millis() as u64;
        metrics::counter!("subagentd_image_pull_bytes_total").increment(stats.fetched_bytes);
        let root = Arc::new(root);
        self.keep(key, root.clone());
        Ok((root, Some(stats)))
    }

    fn cached(&self, key: &str) -> Option<Arc<ImageRoot>> {
        let mut roots = self.roots.lock().unwrap();
        let c = roots.get_mut(key)?;
        c.used = Instant::now();
        Some(c.root.clone())
    }

    /// The client of `access`'s pulls: the shared one, or a tenant's own.
    fn client_for(&self, access: &Access) -> Result<oci_client::Client, ImageError> {
        match access {
            Access::Anonymous => Ok(self.client.clone()),
            Access::Tenant { .. } => new_client(&self.settings, &self.egress)
                .map_err(|e| ImageError::Unavailable(format!("the OCI client: {e}"))),
        }
    }

    async fn pull(
        &self,
        reference: &str,
        digest: &str,
        key: &str,
        access: &Access,
    ) -> Result<(ImageRoot, PullStats), ImageError> {
        let r = self.guarded(reference).await?;
        let by_digest =
            Reference::with_digest(r.registry().to_string(), r.repository().to_string(), digest.to_string());
        let client = self.client_for(access)?;
        let (manifest, _) =
            client.pull_image_manifest(&by_digest, &access.auth()).await.map_err(|e| classify(reference, e))?;
        let declared: i64 = manifest.layers.iter().map(|l| l.size.max(0)).fold(0i64, i64::saturating_add);
        if declared as u64 > self.settings.max_bytes {
            return Err(ImageError::TooLarge(format!(
                "{reference}: its layers are {declared} bytes compressed, over the cap of {} (SUBAGENTD_IMAGE_MAX_MB)",
                self.settings.max_bytes
            )));
        }
        let env = self.env_of(&client, reference, &by_digest, &manifest.config).await?;
        let build = self.build_dir().map_err(|e| ImageError::Unavailable(format!("the image cache: {e}")))?;
        let rootfs = build.path().join("rootfs");
        std::fs::create_dir(&rootfs).map_err(|e| ImageError::Unavailable(format!("the image cache: {e}")))?;
        let mut stats = PullStats { layers: manifest.layers.len(), ..Default::default() };
        for (i, l) in manifest.layers.iter().enumerate() {
            let file = build.path().join(format!("layer-{i}"));
            self.layer(&client, reference, &by_digest, l, &file, &rootfs, &mut stats).await?;
        }
        let root = self
            .finish(build, digest, env, key)
            .map_err(|e| ImageError::Unavailable(format!("the image cache: {e}")))?;
        Ok((root, stats))
    }

    /// The image config's `Env` (`KEY=VALUE` entries), the config read up to 1 MiB.
    async fn env_of(
        &self,
        client: &oci_client::Client,
        reference: &str,
        by_digest: &Reference,
        config: &oci_client::manifest::OciDescriptor,
    ) -> Result<Vec<String>, ImageError> {
        let mut bytes = Vec::new();
        let mut s = client.pull_blob_stream(by_digest, config).await.map_err(|e| classify(reference, e))?;
        while let Some(chunk) = s.stream.next().await {
            bytes.extend_from_slice(
                &chunk.map_err(|e| ImageError::Unavailable(format!("{reference}: its config: {e}")))?,
            );
            if bytes.len() > 1 << 20 {
                return Err(ImageError::TooLarge(format!("{reference}: its config is over 1 MiB")));
            }
        }
        let config: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ImageError::Unavailable(format!("{reference}: its config is not JSON: {e}")))?;
        Ok(config["config"]["Env"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).filter(|v| v.contains('=')).collect())
            .unwrap_or_default())
    }

    /// One layer streamed to `file` (its digest checked by the client as the bytes come, the
    /// compressed bytes capped), then applied over `rootfs`.
    #[allow(clippy::too_many_arguments)]
    async fn layer(
        &self,
        client: &oci_client::Client,
        reference: &str,
        by_digest: &Reference,
        l: &oci_client::manifest::OciDescriptor,
        file: &Path,
        rootfs: &Path,
        stats: &mut PullStats,
    ) -> Result<(), ImageError> {
        let cache = |e: std::io::Error| ImageError::Unavailable(format!("the image cache: {e}"));
        let mut out = tokio::fs::File::create(file).await.map_err(cache)?;
        let mut s = client.pull_blob_stream(by_digest, l).await.map_err(|e| classify(reference, e))?;
        while let Some(chunk) = s.stream.next().await {
            // A wrong digest ends the stream in an error.
            let chunk = chunk.map_err(|e| ImageError::Unavailable(format!("{reference}: layer {}: {e}", l.digest)))?;
            stats.fetched_bytes += chunk.len() as u64;
            if stats.fetched_bytes > self.settings.max_bytes {
                return Err(ImageError::TooLarge(format!(
                    "{reference}: over {} bytes compressed (SUBAGENTD_IMAGE_MAX_MB)",
                    self.settings.max_bytes
                )));
            }
            out.write_all(&chunk).await.map_err(cache)?;
        }
        out.flush().await.map_err(cache)?;
        drop(out);
        let caps = layer::Caps { max_bytes: self.settings.max_bytes, max_entries: self.settings.max_entries };
        let (file, rootfs, mut done) = (file.to_path_buf(), rootfs.to_path_buf(), std::mem::take(&mut stats.unpacked));
        let (applied, done) = tokio::task::spawn_blocking(move || {
            let f = std::fs::File::open(&file)?;
            let r = layer::apply(f, &rootfs, caps, &mut done);
            let _ = std::fs::remove_file(&file);
            Ok::<_, std::io::Error>((r, done))
        })
        .await
        .map_err(|e| ImageError::Unavailable(format!("unpacking: {e}")))?
        .map_err(cache)?;
        stats.unpacked = done;
        applied.map_err(|e| match e {
            layer::LayerError::TooLarge(m) => {
                ImageError::TooLarge(format!("{reference}: {m} (SUBAGENTD_IMAGE_MAX_MB, SUBAGENTD_IMAGE_MAX_ENTRIES)"))
            }
            layer::LayerError::Invalid(m) => ImageError::Unavailable(format!("{reference}: layer {}: {m}", l.digest)),
        })
    }

    /// A directory of this process's to build a root in (removed when dropped, or by the next
    /// start after a kill), with its `rootfs/` made.
    fn build_dir(&self) -> std::io::Result<tempfile::TempDir> {
        let mine = self.settings.dir.join("tmp").join(std::process::id().to_string());
        std::fs::create_dir_all(&mine)?;
        let dir = tempfile::Builder::new().prefix("build-").tempdir_in(&mine)?;
        Ok(dir)
    }

    /// The root built in `build` put in place as `roots/<key>`: its mount points made, readable by
    /// the sandbox's uid, its record written, then renamed whole (its appearance).
    fn finish(
        &self,
        build: tempfile::TempDir,
        digest: &str,
        env: Vec<String>,
        key: &str,
    ) -> std::io::Result<ImageRoot> {
        use std::os::unix::fs::PermissionsExt;
        let rootfs = build.path().join("rootfs");
        for m in MOUNT_POINTS {
            let p = rootfs.join(m);
            if !std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                let _ = layer::remove(&p);
                std::fs::create_dir(&p)?;
            }
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
        }
        crate::tools::gvisor::mount_point(&rootfs)?;
        let (bytes, _) = super::files::tree_walk(&rootfs, super::files::Usage { bytes: u64::MAX, entries: u64::MAX });
        let meta = Meta { digest: digest.to_string(), env: env.clone(), bytes: bytes.bytes };
        std::fs::write(build.path().join("meta.json"), serde_json::to_vec(&meta).unwrap_or_default())?;
        std::fs::set_permissions(build.path(), std::fs::Permissions::from_mode(0o755))?;
        std::fs::set_permissions(&rootfs, std::fs::Permissions::from_mode(0o755))?;
        let dest = self.settings.dir.join("roots").join(key);
        let built = build.keep();
        if let Err(e) = std::fs::rename(&built, &dest) {
            let _ = std::fs::remove_dir_all(&built);
            // Another pull of the same key finished first (a waiter that came after a failed
            // one): its root, whole, is this one.
            if dest.join("meta.json").is_file() {
                return Ok(ImageRoot {
                    digest: digest.to_string(),
                    rootfs: dest.join("rootfs"),
                    env,
                    bytes: meta.bytes,
                });
            }
            return Err(e);
        }
        Ok(ImageRoot { digest: digest.to_string(), rootfs: dest.join("rootfs"), env, bytes: meta.bytes })
    }

    /// Keep `root` in the cache as `key`, then keep the cache within its bound.
    fn keep(&self, key: String, root: Arc<ImageRoot>) {
        self.roots.lock().unwrap().insert(key, Cached { root, used: Instant::now() });
        self.evict();
    }

    /// Remove the roots used longest ago, none in use, until the cache is within its bound.
    fn evict(&self) {
        let mut roots = self.roots.lock().unwrap();
        let mut total: u64 = roots.values().map(|c| c.root.bytes).sum();
        while total > self.settings.cache_bytes {
            let oldest = roots
                .iter()
                .filter(|(_, c)| Arc::strong_count(&c.root) == 1)
                .min_by_key(|(_, c)| c.used)
                .map(|(k, _)| k.clone());
            let Some(k) = oldest else { break };
            // Out of `roots/` first (one rename), so that a kill -9 mid-removal leaves no half root there.
            let aside = self
                .settings
                .dir
                .join("tmp")
                .join(std::process::id().to_string())
                .join(format!("evicted-{k}-{}", uuid::Uuid::new_v4().simple()));
            let dir = self.settings.dir.join("roots").join(&k);
            let _ = std::fs::create_dir_all(aside.parent().unwrap_or(&aside));
            if let Err(e) = std::fs::rename(&dir, &aside) {
                // Kept, and counted: a root that cannot be moved is still there.
                tracing::warn!(root = %dir.display(), error = %e, "an image root could not be evicted");
                break;
            }
            let gone = roots.remove(&k).expect("listed");
            total -= gone.root.bytes;
            // Removed on a thread of its own: a root of gigabytes is not a task's to wait for.
            std::thread::spawn(move || {
                let _ = std::fs::remove_dir_all(&aside);
            });
            metrics::counter!("subagentd_image_evictions_total").increment(1);
        }
        drop(roots);
        self.report_size();
    }

    fn report_size(&self) {
        let total: u64 = self.roots.lock().unwrap().values().map(|c| c.root.bytes).sum();
        metrics::gauge!("subagentd_image_cache_bytes").set(total as f64);
    }

    /// The digests cached now (for tests and the operator).
    pub fn cached_digests(&self) -> Vec<String> {
        self.roots.lock().unwrap().values().map(|c| c.root.digest.clone()).collect()
    }

    /// Where an environment's network may reach at all.
    pub fn egress_guard(&self) -> Arc<AllowList> {
        self.settings.egress.clone()
    }

    /// The ports an environment's network may reach (`None`: any).
    pub fn egress_ports(&self) -> Option<Vec<u16>> {
        self.settings.egress_ports.clone()
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.settings.dir
    }
}

/// The cache's name for a digest (its hex), or a refusal of what is not a sha256 digest.
fn key_of(digest: &str) -> Result<String, ImageError> {
    match digest.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) => {
            Ok(h.to_string())
        }
        _ => Err(ImageError::Refused(format!("{digest:?} is not a sha256 digest"))),
    }
}

/// A client error as the task is told it.
fn classify(reference: &str, e: oci_client::errors::OciDistributionError) -> ImageError {
    use oci_client::errors::OciDistributionError as E;
    // The error and its causes (a connection's failure is in a source, not in the text).
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    match &e {
        E::ImageManifestNotFoundError(_) => ImageError::NotFound(format!("{reference}: no such image ({text})")),
        E::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|x| {
                matches!(
                    x.code,
                    oci_client::errors::OciErrorCode::ManifestUnknown
                        | oci_client::errors::OciErrorCode::NameUnknown
                        | oci_client::errors::OciErrorCode::NotFound
                )
            }) =>
        {
            ImageError::NotFound(format!("{reference}: no such image ({text})"))
        }
        E::ServerError { code: 404, .. } => ImageError::NotFound(format!("{reference}: no such image ({text})")),
        E::ServerError { code: 403, message, .. } if message.contains("allow-list") || message.contains("address") => {
            ImageError::Refused(format!("{reference}: {}", message.trim()))
        }
        _ => ImageError::Unavailable(format!("{reference}: {text}")),
    }
}
