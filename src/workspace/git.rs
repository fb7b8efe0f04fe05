//! A repository at one commit, over git's smart HTTP with gix (no `git` program): the ref
//! resolved by listing the remote's refs, then that commit alone fetched at depth 1 (no history,
//! no tags, no submodules; LFS files stay their pointers, as no filter runs) into a scratch bare
//! repository, and its tree written out as plain files. Every connection goes through gix's
//! reqwest backend configured here: the address guard's resolver (a name is resolved once and only
//! allowed addresses are connected to), no proxy, no redirects, and the host of an IP-literal URL
//! checked before any connection. The time cap interrupts the pack's stream; the byte cap is
//! checked on what has reached the disk. Blocking: run on a blocking thread.

use std::num::NonZeroU32;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gix::protocol::transport::client::blocking_io::http;

use super::{Caps, Stats, WorkspaceError};
use crate::tools::ssrf::{AllowList, GuardedResolver};

/// What a fetch needs besides the URL and the commit.
pub struct Remote<'a> {
    pub url: &'a str,
    /// The token of a private repository (sent as HTTP Basic, never in the URL).
    pub token: Option<&'a str>,
    pub allow: Arc<AllowList>,
    /// Extra CA certificates (PEM) the server's certificate may chain to.
    pub ca: Option<Arc<Vec<u8>>>,
}

/// Is `r` a full commit id (40 hex digits)?
pub fn is_commit_id(r: &str) -> bool {
    r.len() == 40 && r.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `r` reads as an abbreviated commit id (git shows 7 or more hex digits).
fn is_short_commit_id(r: &str) -> bool {
    (4..40).contains(&r.len()) && r.bytes().all(|b| b.is_ascii_hexdigit())
}

fn scratch_repo(dir: &Path) -> Result<gix::Repository, WorkspaceError> {
    let opts = gix::open::Options::isolated().config_overrides(["gitoxide.objects.allocLimit=268435456"]);
    gix::ThreadSafeRepository::init_opts(dir, gix::create::Kind::Bare, gix::create::Options::default(), opts)
        .map(|r| r.to_thread_local())
        .map_err(|e| WorkspaceError::Internal(format!("cannot create a scratch repository: {e}")))
}

/// gix's HTTP options with our guard in its client.
fn transport_options(allow: Arc<AllowList>, ca: Option<Arc<Vec<u8>>>, caps: &Caps) -> http::Options {
    let connect = caps.timeout.min(Duration::from_secs(20));
    let backend = http::reqwest::Options {
        configure_client: Some(Box::new(move |b: reqwest::blocking::ClientBuilder| {
            let b = b
                .dns_resolver(Arc::new(GuardedResolver { allow: allow.clone() }))
                .no_proxy()
                .connect_timeout(connect)
                .timeout(Duration::from_secs(60));
            Ok(match ca.as_deref().map(|pem| reqwest::Certificate::from_pem_bundle(pem)) {
                Some(Ok(certs)) => b.tls_certs_merge(certs),
                _ => b,
            })
        })),
        configure_request: None,
    };
    http::Options {
        follow_redirects: http::options::FollowRedirects::None,
        user_agent: Some(format!("subagentd/{} (workspace)", env!("CARGO_PKG_VERSION"))),
        connect_timeout: Some(connect),
        backend: Some(Arc::new(std::sync::Mutex::new(backend))),
        ..Default::default()
    }
}

/// A refusal, a missing ref, an unreachable host or a failed login, from gix's error text.
fn classify(url: &str, e: &gix::Error) -> WorkspaceError {
    let text = format!("{e:?}");
    let lower = text.to_ascii_lowercase();
    if lower.contains("clear text") {
        WorkspaceError::Refused(format!("{url}: a secret is sent only over https"))
    } else if lower.contains("allow-list") || lower.contains("loopback or link-local") {
        let why = text.lines().find(|l| l.contains("allow-list") || l.contains("link-local")).unwrap_or(&text);
        WorkspaceError::Refused(format!("{url}: {}", why.trim()))
    } else if lower.contains("401") || lower.contains("authentication") || lower.contains("credentials") {
        WorkspaceError::Unreachable(format!("{url}: the server asked for credentials that were not accepted"))
    } else {
        let first = text.lines().next().unwrap_or(&text);
        WorkspaceError::Unreachable(format!("{url} could not be fetched: {}", first.trim()))
    }
}

fn connect<'r>(
    remote: &'r gix::Remote<'r>,
    r: &Remote<'_>,
    caps: &Caps,
) -> Result<
    gix::remote::Connection<'r, 'static, 'r, Box<dyn gix::protocol::transport::client::blocking_io::Transport + Send>>,
    WorkspaceError,
> {
    let mut conn = remote.connect(gix::remote::Direction::Fetch).map_err(|e| classify(r.url, &e))?;
    conn.set_transport_options(Box::new(transport_options(r.allow.clone(), r.ca.clone(), caps)));
    if let Some(token) = r.token {
        let account = gix::sec::identity::Account {
            username: "x-access-token".into(),
            password: token.into(),
            oauth_refresh_token: None,
        };
        conn.transport_mut()
            .set_identity(account)
            .map_err(|e| WorkspaceError::Internal(format!("cannot set the credentials: {e}")))?;
    }
    conn.set_credentials(|_| Ok(None));
    Ok(conn)
}

/// The remote at `url` to fetch from: no URL rewriting, no tags.
fn fetching_from<'r>(repo: &'r gix::Repository, url: &str) -> Result<gix::Remote<'r>, WorkspaceError> {
    Ok(repo
        .remote_at_without_url_rewrite(url)
        .map_err(|e| WorkspaceError::Refused(format!("{url}: {e}")))?
        .with_fetch_tags(gix::remote::fetch::Tags::None))
}

/// A fetch refspec of one source (a ref name or a commit id), with no destination.
fn refspec(source: &str) -> Result<gix::refspec::RefSpec, String> {
    gix::refspec::parse(source.into(), gix::refspec::parse::Operation::Fetch)
        .map(|s| s.to_owned())
        .map_err(|e| e.to_string())
}

fn check_url(r: &Remote<'_>) -> Result<(), WorkspaceError> {
    // An IP literal is connected to without the resolver: check it here (names at connect).
    r.allow.check_url(r.url).map(|_| ()).map_err(|e| WorkspaceError::Refused(e.0))
}

/// The commit `git_ref` names at the remote (`None`, or `HEAD` as git names it: its default
/// branch). A branch wins over a tag of the same name; an annotated tag is peeled to its commit.
/// A short commit id is looked for as a branch or tag and is otherwise refused: git servers send
/// a commit asked for by its full id only.
pub fn resolve(r: &Remote<'_>, git_ref: Option<&str>, caps: &Caps, scratch: &Path) -> Result<String, WorkspaceError> {
    check_url(r)?;
    if let Some(id) = git_ref.filter(|g| is_commit_id(g)) {
        return Ok(id.to_ascii_lowercase());
    }
    let git_ref = git_ref.filter(|g| *g != "HEAD");
    let repo = scratch_repo(scratch)?;
    let remote = fetching_from(&repo, r.url)?;
    let names: Vec<String> = match git_ref {
        None => vec!["HEAD".into()],
        Some(n) if n.starts_with("refs/") => vec![n.to_string()],
        Some(n) => vec![format!("refs/heads/{n}"), format!("refs/tags/{n}")],
    };
    let specs = names
        .iter()
        .map(|n| refspec(n).map_err(|e| WorkspaceError::RefNotFound(format!("{n:?} is not a ref name: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let conn = connect(&remote, r, caps)?;
    let opts = gix::remote::ref_map::Options { extra_refspecs: specs, ..Default::default() };
    let (map, _) = conn.ref_map(gix::progress::Discard, opts).map_err(|e| classify(r.url, &e))?;
    for n in &names {
        let hit = map.mappings.iter().find(|m| m.remote.as_name().is_some_and(|name| name == n.as_bytes()));
        if let Some(id) = hit.and_then(|m| m.remote.peeled_id()) {
            return Ok(id.to_string());
        }
    }
    Err(WorkspaceError::RefNotFound(match git_ref {
        Some(g) if is_short_commit_id(g) => format!(
            "{}: no branch or tag named {g:?}; if it is an abbreviated commit id, give all 40 hex digits (git \
             servers send a commit by its full id only)",
            r.url
        ),
        Some(g) => format!("{}: no branch or tag named {g:?}", r.url),
        None => format!("{}: the repository has no default branch", r.url),
    }))
}

/// Fetch `commit` into the scratch repository at `scratch` and write its tree into `dest`.
pub fn fetch(r: &Remote<'_>, commit: &str, caps: &Caps, scratch: &Path, dest: &Path) -> Result<Stats, WorkspaceError> {
    check_url(r)?;
    let started = Instant::now();
    let repo = scratch_repo(scratch)?;
    let remote = fetching_from(&repo, r.url)?;
    let spec = refspec(commit).map_err(|e| WorkspaceError::RefNotFound(format!("{commit:?}: {e}")))?;
    let interrupt = Arc::new(AtomicBool::new(false));
    let over = Arc::new(std::sync::Mutex::new(None::<WorkspaceError>));
    let watchdog = watch(scratch.to_path_buf(), caps.clone(), interrupt.clone(), over.clone());
    let result = (|| {
        let conn = connect(&remote, r, caps)?;
        let opts = gix::remote::ref_map::Options { extra_refspecs: vec![spec], ..Default::default() };
        conn.prepare_fetch(gix::progress::Discard, opts)
            .map_err(|e| classify(r.url, &e))?
            .with_shallow(gix::remote::fetch::Shallow::DepthAtRemote(NonZeroU32::MIN))
            .receive(gix::progress::Discard, &interrupt)
            .map_err(|e| classify(r.url, &e))
    })();
    watchdog.stop();
    if let Some(e) = over.lock().ok().and_then(|mut o| o.take()) {
        return Err(e);
    }
    result?;
    let fetched = dir_size(scratch);
    let id = gix::ObjectId::from_hex(commit.as_bytes())
        .map_err(|e| WorkspaceError::RefNotFound(format!("{commit:?} is not a commit id: {e}")))?;
    let tree = repo
        .find_object(id)
        .ok()
        .and_then(|o| o.peel_to_commit().ok())
        .and_then(|c| c.tree().ok())
        .ok_or_else(|| WorkspaceError::RefNotFound(format!("{}: commit {commit} was not found", r.url)))?;
    let mut out =
        Checkout { repo: &repo, caps, started, entries: 0, files: 0, bytes: 0, dropped: vec![], links: vec![] };
    std::fs::create_dir_all(dest).map_err(|e| WorkspaceError::Internal(format!("cannot write the tree: {e}")))?;
    out.tree(&tree, dest, Path::new(""), 0)?;
    out.links(dest)?;
    Ok(Stats {
        fetched_bytes: fetched,
        files: out.files,
        bytes: out.bytes,
        millis: started.elapsed().as_millis() as u64,
        dropped: out.dropped,
    })
}

/// Watches a fetch: past the time cap, or once the scratch repository holds more than the
/// byte cap, it interrupts the pack's stream and says why.
struct Watchdog {
    done: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn stop(mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn watch(
    dir: PathBuf,
    caps: Caps,
    interrupt: Arc<AtomicBool>,
    over: Arc<std::sync::Mutex<Option<WorkspaceError>>>,
) -> Watchdog {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let handle = std::thread::spawn(move || {
        let start = Instant::now();
        while !d.load(Ordering::Relaxed) {
            let why = if start.elapsed() > caps.timeout {
                Some(WorkspaceError::TooLarge(format!("the fetch took longer than {} s", caps.timeout.as_secs())))
            } else if dir_size(&dir) > caps.max_fetch_bytes {
                Some(WorkspaceError::TooLarge(format!(
                    "the repository is over {} bytes at this commit",
                    caps.max_fetch_bytes
                )))
            } else {
                None
            };
            if let Some(e) = why {
                if let Ok(mut o) = over.lock() {
                    *o = Some(e);
                }
                interrupt.store(true, Ordering::Relaxed);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    Watchdog { done, handle: Some(handle) }
}

/// Bytes of the files under `dir`.
pub fn dir_size(dir: &Path) -> u64 {
    crate::tools::files::tree_bytes(dir)
}

/// Writes a tree out: directories and files first, each created new (never through anything
/// already there), then the symbolic links, each only if its target stays inside without passing
/// through another link. Submodules, unsafe or repeated names and links leading out are left out
/// and named. Entries, bytes and time are capped as the tree is written.
struct Checkout<'a> {
    repo: &'a gix::Repository,
    caps: &'a Caps,
    started: Instant,
    entries: u64,
    files: u64,
    bytes: u64,
    dropped: Vec<String>,
    /// Links to write once every file is: (path relative to the root, target).
    links: Vec<(PathBuf, String)>,
}

/// Entries named in `dropped` at most (then a count).
const MAX_DROPPED: usize = 100;

impl Checkout<'_> {
    fn drop_entry(&mut self, what: String) {
        if self.dropped.len() < MAX_DROPPED {
            self.dropped.push(what);
        } else if self.dropped.len() == MAX_DROPPED {
            self.dropped.push("…and more entries left out".into());
        }
    }

    fn count(&mut self, bytes: u64) -> Result<(), WorkspaceError> {
        self.entries += 1;
        self.bytes += bytes;
        if self.entries > self.caps.max_files || self.bytes > self.caps.max_bytes {
            return Err(WorkspaceError::TooLarge(format!(
                "the tree is over {} entries or {} bytes",
                self.caps.max_files, self.caps.max_bytes
            )));
        }
        if self.started.elapsed() > self.caps.timeout {
            return Err(WorkspaceError::TooLarge(format!(
                "writing the tree took longer than {} s",
                self.caps.timeout.as_secs()
            )));
        }
        Ok(())
    }

    fn tree(&mut self, tree: &gix::Tree<'_>, dir: &Path, rel: &Path, depth: usize) -> Result<(), WorkspaceError> {
        if depth > 64 {
            return Err(WorkspaceError::TooLarge("the tree is nested more than 64 levels deep".into()));
        }
        let io = |e: std::io::Error| WorkspaceError::Internal(format!("cannot write the tree: {e}"));
        let mut seen = std::collections::HashSet::new();
        for entry in tree.iter() {
            let entry = entry.map_err(|e| WorkspaceError::Internal(format!("a tree cannot be read: {e}")))?;
            let name = entry.filename();
            let kind = entry.mode().kind();
            let is_link = matches!(kind, gix::object::tree::EntryKind::Link);
            let opts = gix::validate::path::component::Options::default();
            let mode = is_link.then_some(gix::validate::path::component::Mode::Symlink);
            let lossy = String::from_utf8_lossy(name).into_owned();
            let shown = rel.join(&lossy);
            let Ok(name_str) = std::str::from_utf8(name) else {
                self.drop_entry(format!("{}: its name is not UTF-8", shown.display()));
                continue;
            };
            if gix::validate::path::component(name, mode, opts).is_err() || name_str.contains(['/', '\\']) {
                self.drop_entry(format!("{}: not a safe file name", shown.display()));
                continue;
            }
            if !seen.insert(name_str.to_string()) {
                self.drop_entry(format!("{}: a name the tree repeats", shown.display()));
                continue;
            }
            let path = dir.join(name_str);
            match kind {
                gix::object::tree::EntryKind::Tree => {
                    self.count(0)?;
                    std::fs::create_dir(&path).map_err(io)?;
                    let sub = self
                        .repo
                        .find_object(entry.oid())
                        .ok()
                        .and_then(|o| o.try_into_tree().ok())
                        .ok_or_else(|| WorkspaceError::Internal(format!("tree {} is missing", shown.display())))?;
                    self.tree(&sub, &path, &shown, depth + 1)?;
                }
                gix::object::tree::EntryKind::Commit => {
                    self.drop_entry(format!("{}: a submodule (not fetched)", shown.display()));
                }
                _ => {
                    let blob = self
                        .repo
                        .find_object(entry.oid())
                        .map_err(|e| WorkspaceError::Internal(format!("{} is missing: {e}", shown.display())))?;
                    self.count(blob.data.len() as u64)?;
                    if is_link {
                        match std::str::from_utf8(&blob.data) {
                            Ok(target) => self.links.push((shown, target.to_string())),
                            Err(_) => self.drop_entry(format!("{}: a link whose target is not UTF-8", shown.display())),
                        }
                        continue;
                    }
                    self.files += 1;
                    use std::io::Write;
                    use std::os::unix::fs::OpenOptionsExt;
                    let exec = matches!(kind, gix::object::tree::EntryKind::BlobExecutable);
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .custom_flags(libc::O_NOFOLLOW)
                        .mode(if exec { 0o755 } else { 0o644 })
                        .open(&path)
                        .map_err(io)?;
                    f.write_all(&blob.data).map_err(io)?;
                }
            }
        }
        Ok(())
    }

    /// The links, last: each whose target stays inside and passes through no other link.
    fn links(&mut self, root: &Path) -> Result<(), WorkspaceError> {
        let all: std::collections::HashSet<PathBuf> = self.links.iter().map(|(p, _)| p.clone()).collect();
        for (at, target) in std::mem::take(&mut self.links) {
            if !link_stays_inside(&at, &target) || passes_through(&at, &target, &all) {
                self.drop_entry(format!("{}: a symbolic link leading outside", at.display()));
                continue;
            }
            let path = root.join(&at);
            if path.symlink_metadata().is_ok() {
                self.drop_entry(format!("{}: a name the tree repeats", at.display()));
                continue;
            }
            std::os::unix::fs::symlink(&target, &path)
                .map_err(|e| WorkspaceError::Internal(format!("cannot write the tree: {e}")))?;
        }
        Ok(())
    }
}

/// Does the link at `at` reach its target through another of the tree's links (whose own target
/// a lexical reading cannot see)?
pub fn passes_through(at: &Path, target: &str, links: &std::collections::HashSet<PathBuf>) -> bool {
    let mut cur: Vec<&std::ffi::OsStr> =
        at.parent().map(|p| p.components().map(|c| c.as_os_str()).collect()).unwrap_or_default();
    let parts: Vec<Component> = Path::new(target).components().collect();
    for (i, c) in parts.iter().enumerate() {
        match c {
            Component::Normal(n) => {
                cur.push(n);
                let here: PathBuf = cur.iter().collect();
                if i + 1 < parts.len() && links.contains(&here) {
                    return true;
                }
            }
            Component::ParentDir => {
                cur.pop();
            }
            _ => {}
        }
    }
    false
}

/// Does a link at `at` (relative to the root) pointing to `target` stay under the root, read
/// lexically? (With `passes_through`, a link is judged without following others; every read
/// resolves the path again and checks it.)
pub fn link_stays_inside(at: &Path, target: &str) -> bool {
    if target.is_empty() || target.contains('\0') || Path::new(target).is_absolute() {
        return false;
    }
    let mut depth: i64 = at.parent().map_or(0, |p| p.components().count() as i64);
    for c in Path::new(target).components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_judged_from_where_they_are() {
        assert!(link_stays_inside(Path::new("a/b/l"), "../c"));
        assert!(link_stays_inside(Path::new("a/l"), "../c"));
        assert!(!link_stays_inside(Path::new("l"), "../c"));
        assert!(!link_stays_inside(Path::new("a/l"), "../../etc/passwd"));
        assert!(!link_stays_inside(Path::new("a/l"), "/etc/passwd"));
        assert!(!link_stays_inside(Path::new("a/l"), ""));
        assert!(is_commit_id("0123456789abcdef0123456789abcdef01234567") && !is_commit_id("main"));
        // A link that climbs through another link is judged by that link, not by its text.
        let links: std::collections::HashSet<PathBuf> = [PathBuf::from("a/b/l")].into();
        assert!(link_stays_inside(Path::new("a/b/l"), "../.."));
        assert!(
            link_stays_inside(Path::new("a/b/m"), "l/../../../etc")
                && passes_through(Path::new("a/b/m"), "l/../../../etc", &links)
        );
        assert!(!passes_through(Path::new("a/b/m"), "l", &links), "a link to a link is itself no climb");
        assert!(!passes_through(Path::new("a/b/m"), "../c/d", &links));
    }
}
