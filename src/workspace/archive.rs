//! Uploaded workspaces: a `tar.gz` read as a stream, every entry judged, and what is kept
//! written again as a clean archive (regular files, directories, symbolic links that stay
//! inside; fixed owners, times and modes) whose uncompressed bytes give the content hash. The
//! caps hold while reading: the uncompressed bytes are counted as they come out of the decoder,
//! so a small archive that inflates to gigabytes stops at the cap, having written nothing but
//! the clean archive's compressed prefix.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::tools::capped::{is_over, Capped};

/// The operator's caps on an upload.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Uncompressed bytes (the tar stream, headers included).
    pub max_bytes: u64,
    pub max_entries: u64,
}

/// An entry left out, and why.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Dropped {
    pub path: String,
    pub reason: &'static str,
}

/// What a clean archive holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Cleaned {
    /// `sha256:` and the hex SHA-256 of the clean archive's uncompressed bytes.
    pub content_hash: String,
    pub files: u64,
    /// The files' bytes.
    pub bytes: u64,
    pub dropped: Vec<Dropped>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ArchiveError {
    /// Over a cap: the upload is refused.
    #[error("{0}")]
    TooLarge(String),
    /// Not a gzip-compressed tar archive.
    #[error("{0}")]
    Invalid(String),
}

/// Hashes what passes on its way to `inner`.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// An entry's path made relative and plain, or why it is left out.
fn plain(raw: &[u8]) -> Result<Option<PathBuf>, &'static str> {
    let s = std::str::from_utf8(raw).map_err(|_| "its name is not UTF-8")?;
    let p = Path::new(s);
    if p.is_absolute() {
        return Err("an absolute path");
    }
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) if n == ".git" => return Err(".git is not kept"),
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err("a path that leads outside (..)"),
            Component::RootDir | Component::Prefix(_) => return Err("an absolute path"),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Entries that are kept as themselves (their paths then cannot be links).
fn kind_is_kept(t: tar::EntryType) -> bool {
    matches!(t, tar::EntryType::Directory | tar::EntryType::Regular | tar::EntryType::Continuous)
}

/// Read the `tar.gz` in `input`, write the clean archive (gzip) to `out`.
pub fn clean(input: impl Read, out: impl Write, limits: Limits) -> Result<Cleaned, ArchiveError> {
    let decoder = Capped::new(flate2::read::GzDecoder::new(input), limits.max_bytes);
    let mut archive = tar::Archive::new(decoder);
    let hashing =
        Hashing { inner: flate2::write::GzEncoder::new(out, flate2::Compression::default()), hash: Sha256::new() };
    let mut builder = tar::Builder::new(hashing);
    builder.follow_symlinks(false);
    let mut c = Cleaned { content_hash: String::new(), files: 0, bytes: 0, dropped: vec![] };
    // Links are written last, each judged against every link and every kept path.
    let mut links: HashSet<PathBuf> = HashSet::new();
    let mut pending: Vec<(PathBuf, String, String)> = vec![];
    let mut kept: HashSet<PathBuf> = HashSet::new();
    let mut files_kept: HashSet<PathBuf> = HashSet::new();
    let read_err = |e: std::io::Error| {
        if is_over(&e) {
            ArchiveError::TooLarge(format!("the archive is over {} bytes uncompressed", limits.max_bytes))
        } else {
            ArchiveError::Invalid(format!("not a gzip-compressed tar archive: {e}"))
        }
    };
    let write_err = |e: std::io::Error| ArchiveError::Invalid(format!("the archive cannot be stored: {e}"));
    let mut entries = 0u64;
    for entry in archive.entries().map_err(read_err)? {
        let mut entry = entry.map_err(read_err)?;
        entries += 1;
        if entries > limits.max_entries {
            return Err(ArchiveError::TooLarge(format!("the archive has over {} entries", limits.max_entries)));
        }
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let mut drop = |reason: &'static str| c.dropped.push(Dropped { path: shown.clone(), reason });
        let path = match plain(&raw) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(reason) => {
                drop(reason);
                continue;
            }
        };
        if path.ancestors().skip(1).any(|a| links.contains(a)) {
            drop("a path through a symbolic link");
            continue;
        }
        let kind_here = entry.header().entry_type();
        if kind_is_kept(kind_here) {
            // A file where a directory is, a directory (or a file) under a file, a file twice.
            let is_file = kind_here != tar::EntryType::Directory;
            let clash = path.ancestors().skip(1).any(|a| files_kept.contains(a))
                || files_kept.contains(&path)
                || (is_file && kept.contains(&path));
            if clash {
                drop("a name the archive repeats");
                continue;
            }
            kept.extend(path.ancestors().filter(|a| !a.as_os_str().is_empty()).map(Path::to_path_buf));
            if is_file {
                files_kept.insert(path.clone());
            }
        }
        let kind = entry.header().entry_type();
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        match kind {
            tar::EntryType::Directory => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                builder.append_data(&mut h, &path, std::io::empty()).map_err(write_err)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = entry.header().size().map_err(read_err)?;
                let exec = entry.header().mode().map(|m| m & 0o111 != 0).unwrap_or(false);
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(if exec { 0o755 } else { 0o644 });
                h.set_size(size);
                builder.append_data(&mut h, &path, &mut entry).map_err(|e| {
                    if is_over(&e) {
                        read_err(e)
                    } else {
                        write_err(e)
                    }
                })?;
                c.files += 1;
                c.bytes += size;
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name_bytes().map(|t| String::from_utf8_lossy(&t).into_owned());
                match target {
                    Some(t) if super::git::link_stays_inside(&path, &t) => {
                        links.insert(path.clone());
                        pending.push((path, t, shown.clone()));
                    }
                    _ => drop("a symbolic link that leads outside"),
                }
            }
            tar::EntryType::Link => drop("a hard link (not kept)"),
            tar::EntryType::Char | tar::EntryType::Block => drop("a device file"),
            tar::EntryType::Fifo => drop("a FIFO"),
            tar::EntryType::XGlobalHeader => {}
            _ => drop("an entry of an unsupported type"),
        }
    }
    append_links(&mut builder, pending, &links, &kept, &mut c.dropped).map_err(write_err)?;
    let hashing = builder.into_inner().map_err(write_err)?;
    c.content_hash = format!("sha256:{}", hex::encode(hashing.hash.finalize()));
    hashing.inner.finish().map_err(write_err)?.flush().map_err(write_err)?;
    Ok(c)
}

/// The links, after every other entry: each that passes through no other link and takes no
/// kept entry's name.
fn append_links<W: Write>(
    builder: &mut tar::Builder<W>,
    pending: Vec<(PathBuf, String, String)>,
    links: &HashSet<PathBuf>,
    kept: &HashSet<PathBuf>,
    dropped: &mut Vec<Dropped>,
) -> std::io::Result<()> {
    for (path, target, shown) in pending {
        let reason = if super::git::passes_through(&path, &target, links) {
            Some("a symbolic link that leads outside")
        } else if kept.contains(&path) {
            Some("a name the archive repeats")
        } else {
            None
        };
        if let Some(reason) = reason {
            dropped.push(Dropped { path: shown, reason });
            continue;
        }
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        builder.append_link(&mut h, &path, &target)?;
    }
    Ok(())
}

/// Unpack a clean archive into `dest` (which exists). Its entries were judged when it was
/// cleaned; `tar`'s own checks (no `..`, nothing written through a link) hold again here.
pub fn unpack(archive: &[u8], dest: &Path) -> std::io::Result<()> {
    let mut a = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    a.set_preserve_permissions(false);
    a.set_unpack_xattrs(false);
    a.set_preserve_mtime(false);
    a.unpack(dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_gz(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        let tar = b.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        gz.finish().unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        // Written raw: the builder's own path checks would refuse `..`.
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn link(b: &mut tar::Builder<Vec<u8>>, path: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
        h.set_cksum();
        b.append(&h, std::io::empty()).unwrap();
    }

    const LIMITS: Limits = Limits { max_bytes: 1 << 20, max_entries: 100 };

    #[test]
    fn escapes_are_dropped_and_named() {
        let gz = tar_gz(|b| {
            file(b, "src/a.rs", b"fn a() {}\n");
            file(b, "../evil", b"x");
            file(b, "/etc/cron.d/x", b"x");
            file(b, ".git/config", b"x");
            link(b, "passwd", "/etc/passwd");
            link(b, "up", "../../x");
            link(b, "src/here", "a.rs");
            link(b, "dir", ".");
            file(b, "dir/through", b"x");
            link(b, "a/b/l", "../..");
            link(b, "a/b/m", "l/../../../etc");
            file(b, "src/a.rs/x", b"x");
            file(b, "late/f", b"x");
            link(b, "late", "src");
        });
        let mut out = Vec::new();
        let c = clean(&gz[..], &mut out, LIMITS).unwrap();
        let reasons: Vec<(&str, &str)> = c.dropped.iter().map(|d| (d.path.as_str(), d.reason)).collect();
        assert_eq!(
            reasons,
            [
                ("../evil", "a path that leads outside (..)"),
                ("/etc/cron.d/x", "an absolute path"),
                (".git/config", ".git is not kept"),
                ("passwd", "a symbolic link that leads outside"),
                ("up", "a symbolic link that leads outside"),
                ("dir/through", "a path through a symbolic link"),
                ("src/a.rs/x", "a name the archive repeats"),
                ("a/b/m", "a symbolic link that leads outside"),
                ("late", "a name the archive repeats"),
            ]
        );
        assert_eq!((c.files, c.bytes), (2, 11));
        let dir = tempfile::tempdir().unwrap();
        unpack(&out, dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("src/here")).unwrap(), "fn a() {}\n");
        assert!(!dir.path().join("passwd").exists() && !dir.path().parent().unwrap().join("evil").exists());
        // The same content gives the same hash, whatever the archive's own owners and times.
        let again = clean(&gz[..], Vec::new(), LIMITS).unwrap();
        assert_eq!(again.content_hash, c.content_hash);
    }

    #[test]
    fn a_bomb_stops_at_the_cap() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(64 << 20);
        h.set_mode(0o644);
        b.append_data(&mut h, "zeros", std::io::repeat(0).take(64 << 20)).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&b.into_inner().unwrap()).unwrap();
        let gz = gz.finish().unwrap();
        assert!(gz.len() < 200_000, "{}", gz.len());
        let mut out = Vec::new();
        let e = clean(&gz[..], &mut out, LIMITS).unwrap_err();
        assert!(matches!(&e, ArchiveError::TooLarge(m) if m.contains("uncompressed")), "{e:?}");
        assert!(out.len() < 64 << 10, "what was written stays small: {}", out.len());
        let e = clean(&b"not gzip"[..], Vec::new(), LIMITS).unwrap_err();
        assert!(matches!(e, ArchiveError::Invalid(_)), "{e:?}");
    }
}
