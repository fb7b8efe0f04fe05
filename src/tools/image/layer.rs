//! One image layer applied over a root being built: a tar stream (gzip or not), its entries
//! judged one by one. A layer is untrusted input (whoever pushed the image wrote it), so:
//! - a path is made relative and plain; one with `..` is left out, and nothing is written
//!   through a link: every parent of an entry must be a real directory of the root (a layer's
//!   `dir -> /etc` then `dir/passwd` writes nothing outside);
//! - whiteouts (`.wh.NAME`) remove what lower layers made, and an opaque directory
//!   (`.wh..wh..opq`) empties it of what lower layers put there, as the OCI image spec says;
//! - regular files, directories and symbolic links are kept (a link's target is read inside
//!   the sandbox, whose root this is: an absolute one names the image's own file); a hard link
//!   only to a regular file already inside; device nodes, FIFOs and other kinds are left out;
//! - setuid, setgid and sticky bits and the group's and others' write bits are cleared, owners
//!   are not kept (the service's uid owns the root, mounted read-only under the sandbox);
//! - the caps on unpacked bytes and entries hold as the entries come (every header counts, and
//!   the decoder's output is capped, long names and PAX records included): past one, the pull
//!   fails.
//!
//! An entry is written by removing what was at its path, then creating it anew (never opening
//! an existing file), so a hard link from a lower layer is never written through.

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::tools::capped::{is_over, Capped};

/// What may be unpacked into one root, over all its layers.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub max_bytes: u64,
    pub max_entries: u64,
}

/// What the layers so far have made.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Unpacked {
    /// Regular files' bytes.
    pub bytes: u64,
    pub entries: u64,
    /// Entries left out, with why (the first 20).
    pub dropped: Vec<Dropped>,
    pub dropped_count: u64,
    /// Files whose setuid, setgid or sticky bit was cleared.
    pub bits_cleared: u64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Dropped {
    pub path: String,
    pub reason: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Invalid(String),
}

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

impl Unpacked {
    fn drop_entry(&mut self, path: &[u8], reason: &'static str) {
        self.dropped_count += 1;
        if self.dropped.len() < 20 {
            self.dropped.push(Dropped { path: String::from_utf8_lossy(path).into_owned(), reason });
        }
    }
}

/// An entry's path, relative and plain, or why it is left out (`None`: the root itself).
fn plain(raw: &[u8]) -> Result<Option<PathBuf>, &'static str> {
    let s = std::str::from_utf8(raw).map_err(|_| "its name is not UTF-8")?;
    let mut out = PathBuf::new();
    for c in Path::new(s).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => return Err("a path that leads outside (..)"),
            Component::Prefix(_) => return Err("not a Unix path"),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Are `rel`'s parents real directories of `root` (none a link)? Missing ones are made when
/// `make`, else they answer no.
pub(super) fn parents_are_directories(root: &Path, rel: &Path, make: bool) -> std::io::Result<bool> {
    let mut at = root.to_path_buf();
    let Some(parent) = rel.parent() else { return Ok(true) };
    for c in parent.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !make => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&at)?;
                std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o755))?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Remove whatever is at `p` (a directory with what it holds), never following a link.
pub(super) fn remove(p: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// What a layer's archive may hold beyond its files' bytes (headers, names, PAX records).
const HEADROOM: u64 = 64 << 20;

/// Apply the layer in `input` (a tar, gzip-compressed or not: told by its first bytes) over
/// `root`, adding to `done`, within `caps`.
pub fn apply(input: impl Read, root: &Path, caps: Caps, done: &mut Unpacked) -> Result<(), LayerError> {
    let mut input = std::io::BufReader::new(input);
    let gzip = {
        use std::io::BufRead;
        let head = input.fill_buf().map_err(|e| LayerError::Invalid(format!("the layer cannot be read: {e}")))?;
        if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            return Err(LayerError::Invalid("a zstd-compressed layer: only gzip and plain tar layers are read".into()));
        }
        head.starts_with(&[0x1f, 0x8b])
    };
    let reader: Box<dyn Read> = if gzip { Box::new(flate2::read::MultiGzDecoder::new(input)) } else { Box::new(input) };
    // The whole image's unpacked bytes are capped; this layer's stream may carry at most what is
    // left of that, plus its headers.
    let max = caps.max_bytes.saturating_sub(done.bytes).saturating_add(HEADROOM);
    // (The tar reader holds long names and PAX records whole in memory: they count too.)
    let mut archive = tar::Archive::new(Capped::new(reader, max));
    let bad = |e: std::io::Error| too_large_or(e, caps);
    let io = |p: &Path, e: std::io::Error| LayerError::Invalid(format!("{}: {e}", p.display()));
    // What this layer wrote: an opaque directory keeps it, and removes only lower layers' files.
    let mut written: HashSet<PathBuf> = HashSet::new();
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        // Every entry counts, those left out too.
        done.entries += 1;
        if done.entries > caps.max_entries {
            return Err(LayerError::TooLarge(format!("the image has more than {} entries", caps.max_entries)));
        }
        let raw = entry.path_bytes().into_owned();
        let rel = match plain(&raw) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(why) => {
                done.drop_entry(&raw, why);
                continue;
            }
        };
        let name = rel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !parents_are_directories(root, &rel, true).map_err(|e| io(&rel, e))? {
            done.drop_entry(&raw, "a parent is a link or a file");
            continue;
        }
        if name == OPAQUE {
            let dir = rel.parent().unwrap_or(Path::new(""));
            for child in std::fs::read_dir(root.join(dir)).map_err(|e| io(dir, e))?.flatten() {
                if !written.contains(&dir.join(child.file_name())) {
                    remove(&child.path()).map_err(|e| io(&child.path(), e))?;
                }
            }
            continue;
        }
        if let Some(gone) = name.strip_prefix(WHITEOUT) {
            // `.wh.`, `.wh..` and `.wh...` name no entry (the last two: the directory itself, or
            // its parent).
            if gone.is_empty() || gone == "." || gone == ".." {
                done.drop_entry(&raw, "a whiteout of no entry");
                continue;
            }
            let p = rel.with_file_name(gone);
            // Lower layers' only: what this layer wrote stays.
            if !written.contains(&p) {
                remove(&root.join(&p)).map_err(|e| io(&p, e))?;
            }
            continue;
        }
        if write(&mut entry, root, &rel, &raw, caps, done)? {
            // The entry and the directories it made its way through are this layer's.
            for a in rel.ancestors().filter(|a| !a.as_os_str().is_empty()) {
                if !written.insert(a.to_path_buf()) {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// A read error as the pull reports it: the cap's, or a broken archive.
fn too_large_or(e: std::io::Error, caps: Caps) -> LayerError {
    if is_over(&e) {
        LayerError::TooLarge(format!("the image unpacks to more than {} bytes", caps.max_bytes))
    } else {
        LayerError::Invalid(format!("the layer is not a tar archive: {e}"))
    }
}

/// Write one entry at `rel` (its parents real directories); whether it was kept.
fn write<R: Read>(
    entry: &mut tar::Entry<R>,
    root: &Path,
    rel: &Path,
    raw: &[u8],
    caps: Caps,
    done: &mut Unpacked,
) -> Result<bool, LayerError> {
    let bad = |e: std::io::Error| too_large_or(e, caps);
    let io = |p: &Path, e: std::io::Error| LayerError::Invalid(format!("{}: {e}", p.display()));
    let at = root.join(rel);
    let mode = entry.header().mode().unwrap_or(0o644);
    match entry.header().entry_type() {
        tar::EntryType::Directory => {
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => {}
                _ => {
                    remove(&at).map_err(|e| io(rel, e))?;
                    std::fs::create_dir(&at).map_err(|e| io(rel, e))?;
                }
            }
            // The owner's bits stay, so that later layers can write in it.
            std::fs::set_permissions(&at, std::fs::Permissions::from_mode((mode & 0o755) | 0o700))
                .map_err(|e| io(rel, e))?;
        }
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
            let size = entry.size();
            if done.bytes.saturating_add(size) > caps.max_bytes {
                return Err(LayerError::TooLarge(format!("the image unpacks to more than {} bytes", caps.max_bytes)));
            }
            remove(&at).map_err(|e| io(rel, e))?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&at)
                .map_err(|e| io(rel, e))?;
            let copied = std::io::copy(&mut entry.take(size), &mut f).map_err(bad)?;
            done.bytes += copied;
            drop(f);
            std::fs::set_permissions(&at, std::fs::Permissions::from_mode(mode & 0o755)).map_err(|e| io(rel, e))?;
            if mode & 0o7000 != 0 {
                done.bits_cleared += 1;
            }
        }
        tar::EntryType::Symlink => {
            let Some(target) = entry.link_name_bytes() else {
                done.drop_entry(raw, "a link with no target");
                return Ok(false);
            };
            let target: &std::ffi::OsStr = std::os::unix::ffi::OsStrExt::from_bytes(&target);
            remove(&at).map_err(|e| io(rel, e))?;
            std::os::unix::fs::symlink(target, &at).map_err(|e| io(rel, e))?;
        }
        tar::EntryType::Link => {
            let target = entry.link_name_bytes().map(|t| plain(&t));
            let target = match target {
                Some(Ok(Some(t))) => t,
                _ => {
                    done.drop_entry(raw, "a hard link that leads outside");
                    return Ok(false);
                }
            };
            let inside = parents_are_directories(root, &target, false).map_err(|e| io(&target, e))?
                && std::fs::symlink_metadata(root.join(&target)).is_ok_and(|m| m.is_file());
            if !inside || target == rel {
                done.drop_entry(raw, "a hard link to no regular file of the image");
                return Ok(false);
            }
            remove(&at).map_err(|e| io(rel, e))?;
            std::fs::hard_link(root.join(&target), &at).map_err(|e| io(rel, e))?;
        }
        tar::EntryType::Char | tar::EntryType::Block => {
            done.drop_entry(raw, "a device node");
            return Ok(false);
        }
        tar::EntryType::Fifo => {
            done.drop_entry(raw, "a FIFO");
            return Ok(false);
        }
        _ => {
            done.drop_entry(raw, "an entry of another kind");
            return Ok(false);
        }
    }
    Ok(true)
}
