//! A task's own copy of its workspace, where `write_file`, `edit_file` and `run_command` work:
//! made from the shared (read-only) tree by copying each file (`copy_file_range`, so the
//! filesystem shares the blocks where it can: btrfs, XFS), rebuilt on another replica from the
//! task's saved changes, and compared with the starting tree for the task's diff.
//!
//! The comparison leaves out `.git` directories, what the tree's `.gitignore` files ignore, and
//! what the service's own ignore patterns name (`Rules::ignore`: build output such as
//! `__pycache__/` or `target/`, left out even from a tree with no `.gitignore`), except files
//! the starting tree has. A file whose size and modification time are those it was copied with
//! is unchanged without being read.
//! Blocking (file I/O): callers run these on a blocking thread.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

/// How each copied file looked when copied: unchanged files are known without reading them.
#[derive(Debug, Default)]
pub struct Manifest(HashMap<PathBuf, (u64, i64, i64)>);

fn stamp(m: &std::fs::Metadata) -> (u64, i64, i64) {
    (m.len(), m.mtime(), m.mtime_nsec())
}

/// Copy the tree at `from` into `to` (which must not exist): its bytes, and each file's stamp.
pub fn make(from: &Path, to: &Path) -> std::io::Result<(u64, Manifest)> {
    std::fs::create_dir_all(to.parent().unwrap_or(Path::new("/")))?;
    std::fs::create_dir(to)?;
    let (mut bytes, mut manifest) = (0u64, Manifest::default());
    for e in walkdir::WalkDir::new(from).follow_links(false).min_depth(1) {
        let e = e.map_err(std::io::Error::other)?;
        let rel = e.path().strip_prefix(from).map_err(std::io::Error::other)?;
        let dest = to.join(rel);
        let t = e.file_type();
        if t.is_dir() {
            std::fs::create_dir(&dest)?;
        } else if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path())?, &dest)?;
        } else if t.is_file() {
            bytes += std::fs::copy(e.path(), &dest)?;
            manifest.0.insert(rel.to_path_buf(), stamp(&dest.symlink_metadata()?));
        }
    }
    Ok((bytes, manifest))
}

/// What rebuilds a copy from its starting tree: the changed and new files and links (tar.gz),
/// and the paths deleted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    pub archive: Vec<u8>,
    pub deleted: Vec<String>,
    /// Files too large for what may be kept, left out of `archive`: each named with its size
    /// and SHA-256 (a rescued run's copy does not have them).
    pub left_out: Vec<String>,
}

/// One path's state in a tree.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    File { executable: bool },
    Link(PathBuf),
}

/// The size of the entry at `rel` under `root` (a link's own), 0 where there is none.
fn size_under(root: &Path, rel: &Path) -> u64 {
    under(root, rel).and_then(|p| p.symlink_metadata().ok()).map_or(0, |m| m.len())
}

/// `root/rel`, if every directory on the way is a real directory (not a link): a command in the
/// sandbox may have put a link where the other tree has a directory, and nothing here follows one.
fn under(root: &Path, rel: &Path) -> Option<PathBuf> {
    let mut cur = root.to_path_buf();
    for c in rel.parent().unwrap_or(Path::new("")).components() {
        match c {
            std::path::Component::Normal(n) => cur.push(n),
            _ => return None,
        }
        if !cur.symlink_metadata().ok()?.is_dir() {
            return None;
        }
    }
    rel.file_name().map(|n| cur.join(n))
}

/// The bytes of the regular file `root/rel` (no link followed, no FIFO waited on), at most `max`.
fn read_under(root: &Path, rel: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let p = under(root, rel).ok_or_else(|| std::io::Error::other("a link on the way"))?;
    let mut f = crate::tools::files::open_regular(&p)?;
    let mut out = vec![];
    (&mut f).take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// What `rel` is in the tree at `root` (nothing, if a link stands on the way).
fn node(root: &Path, rel: &Path) -> Option<Node> {
    let p = under(root, rel)?;
    let m = p.symlink_metadata().ok()?;
    if m.file_type().is_symlink() {
        return std::fs::read_link(&p).ok().map(Node::Link);
    }
    m.is_file().then(|| Node::File { executable: m.permissions().mode() & 0o111 != 0 })
}

/// The paths of the starting tree, every file and link (not `.git`).
fn all_paths(root: &Path) -> BTreeSet<PathBuf> {
    walkdir::WalkDir::new(root)
        .follow_links(false)
        .min_depth(1)
        .into_iter()
        .filter_entry(|e| e.file_name() != ".git")
        .filter_map(Result::ok)
        .filter(|e| !e.file_type().is_dir())
        .filter_map(|e| e.path().strip_prefix(root).ok().map(Path::to_path_buf))
        .collect()
}

/// What a task's diff and saved changes leave out, and the diff's caps.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The diff's bytes at most (`SUBAGENTD_SANDBOX_DIFF_MAX_KB`).
    pub diff_max: u64,
    /// A binary file's bytes at most to be in the diff, in git's binary form
    /// (`SUBAGENTD_SANDBOX_DIFF_BINARY_KB`); a larger one is named in `omitted`.
    pub binary_max: u64,
    /// gitignore patterns read as a `.gitignore` at the tree's root, before the tree's own
    /// (which may un-ignore with `!`): `SUBAGENTD_SANDBOX_IGNORE`.
    pub ignore: Vec<String>,
}

/// What git leaves out of a fresh checkout's status only through a `.gitignore` nearly every
/// project of these languages has: Python's bytecode, Rust's and Node's build output. The
/// default of `SUBAGENTD_SANDBOX_IGNORE` (tests/api/sandbox.rs checks they agree).
pub const DEFAULT_IGNORE: &str = "__pycache__/,*.pyc,target/,node_modules/";

impl Rules {
    /// The rules with the default binary cap and ignore patterns, and `diff_max`.
    pub fn with_max(diff_max: u64) -> Rules {
        Rules { diff_max, binary_max: 256 << 10, ignore: patterns(DEFAULT_IGNORE) }
    }
}

/// Comma-separated gitignore patterns (blank ones dropped).
pub fn patterns(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_string).collect()
}

/// The paths of the copy that neither `ignore` (read as a root `.gitignore` before the tree's
/// own) nor its `.gitignore` files ignore (not `.git`). The rules are read here (regular files
/// only, 1 MiB at most each), never through a link.
fn kept_paths(root: &Path, ignore: &[String]) -> BTreeSet<PathBuf> {
    use ignore::gitignore::{Gitignore, GitignoreBuilder};
    let ignored = |rules: &[(PathBuf, Gitignore)], rel: &Path, dir: bool| {
        let mut out = false;
        for (at, g) in rules {
            if let Ok(sub) = rel.strip_prefix(at) {
                match g.matched(sub, dir) {
                    ignore::Match::Ignore(_) => out = true,
                    ignore::Match::Whitelist(_) => out = false,
                    ignore::Match::None => {}
                }
            }
        }
        out
    };
    let (mut rules, mut out) = (Vec::<(PathBuf, Gitignore)>::new(), BTreeSet::new());
    let mut own = GitignoreBuilder::new(root);
    for line in ignore {
        let _ = own.add_line(None, line);
    }
    if let Ok(g) = own.build() {
        rules.push((PathBuf::new(), g));
    }
    let mut it = walkdir::WalkDir::new(root).follow_links(false).sort_by_file_name().into_iter();
    while let Some(entry) = it.next() {
        let Ok(e) = entry else { continue };
        let Ok(rel) = e.path().strip_prefix(root).map(Path::to_path_buf) else { continue };
        let dir = e.file_type().is_dir();
        if e.depth() > 0 && (e.file_name() == ".git" || ignored(&rules, &rel, dir)) {
            if dir {
                it.skip_current_dir();
            }
            continue;
        }
        if !dir {
            out.insert(rel);
            continue;
        }
        if let Ok(text) = read_under(root, &rel.join(".gitignore"), 1 << 20) {
            let mut b = GitignoreBuilder::new(e.path());
            for line in String::from_utf8_lossy(&text).lines() {
                let _ = b.add_line(None, line);
            }
            if let Ok(g) = b.build() {
                rules.push((rel, g));
            }
        }
    }
    out
}

/// How a path differs between the starting tree and the copy.
#[derive(Debug, Clone, PartialEq)]
enum Change {
    Added(Node),
    Deleted(Node),
    Modified(Node, Node),
}

/// Every changed path, in order. Unchanged files (same stamp as copied, or same bytes) are not.
fn compare(base: &Path, copy: &Path, manifest: &Manifest, ignore: &[String]) -> BTreeMap<PathBuf, Change> {
    let before = all_paths(base);
    let mut out = BTreeMap::new();
    for rel in before.iter().chain(kept_paths(copy, ignore).difference(&before)) {
        let (a, b) = (node(base, rel), node(copy, rel));
        let change = match (a, b) {
            (None, Some(n)) => Change::Added(n),
            (Some(n), None) => Change::Deleted(n),
            (Some(x), Some(y)) if x != y => Change::Modified(x, y),
            (Some(Node::File { .. }), Some(n @ Node::File { .. })) => {
                let same_stamp = manifest.0.get(rel).is_some_and(|s| {
                    under(copy, rel).and_then(|p| p.symlink_metadata().ok()).is_some_and(|m| stamp(&m) == *s)
                });
                if same_stamp || same_bytes(base, copy, rel) {
                    continue;
                }
                Change::Modified(n.clone(), n)
            }
            _ => continue,
        };
        out.insert(rel.clone(), change);
    }
    out
}

fn same_bytes(base: &Path, copy: &Path, rel: &Path) -> bool {
    matches!((read_under(base, rel, u64::MAX), read_under(copy, rel, u64::MAX)), (Ok(x), Ok(y)) if x == y)
}

/// The copy's changes since it was made from `base` (or rebuilt), to save with a checkpoint.
/// Their files hold at most `max` bytes: a file that does not fit is left out, named with its
/// size and hash (`left_out`), never read whole; so what a checkpoint sends, and this process's
/// memory, stay under `max` whatever a command wrote. `None` is no longer returned for size.
/// What `ignore` names (see `Rules::ignore`) is left out, as from the diff.
pub fn changes(
    base: &Path,
    copy: &Path,
    manifest: &Manifest,
    max: u64,
    ignore: &[String],
) -> std::io::Result<Option<Changes>> {
    let mut b = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    let (mut deleted, mut links, mut size, mut left_out) = (vec![], vec![], 0u64, vec![]);
    for (rel, c) in compare(base, copy, manifest, ignore) {
        match &c {
            Change::Deleted(_) => deleted.push(rel.to_string_lossy().into_owned()),
            Change::Added(Node::Link(t)) | Change::Modified(_, Node::Link(t)) => {
                // A link replacing a file: the file goes first (a link is written last).
                deleted.push(rel.to_string_lossy().into_owned());
                links.push((rel, t.clone()));
            }
            Change::Added(Node::File { executable }) | Change::Modified(_, Node::File { executable }) => {
                if matches!(c, Change::Modified(Node::Link(_), _)) {
                    deleted.push(rel.to_string_lossy().into_owned());
                }
                let len = size_under(copy, &rel);
                if size.saturating_add(len) > max {
                    left_out.push(format!("{} ({len} bytes, sha256 {})", rel.display(), hash_under(copy, &rel)));
                    continue;
                }
                let data = read_under(copy, &rel, max.saturating_add(1) - size)?;
                size += data.len() as u64;
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(if *executable { 0o755 } else { 0o644 });
                h.set_mtime(0);
                h.set_entry_type(tar::EntryType::Regular);
                b.append_data(&mut h, &rel, data.as_slice())?;
            }
        }
    }
    for (rel, target) in links {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        b.append_link(&mut h, &rel, &target)?;
    }
    let archive = b.into_inner()?.finish()?;
    Ok(Some(Changes { archive, deleted, left_out }))
}

/// The SHA-256 of the regular file `root/rel`, read in blocks (hex; `?` if it cannot be read).
fn hash_under(root: &Path, rel: &Path) -> String {
    use sha2::Digest;
    let Some(p) = under(root, rel) else { return "?".into() };
    let Ok(mut f) = crate::tools::files::open_regular(&p) else { return "?".into() };
    let (mut h, mut buf) = (sha2::Sha256::new(), vec![0u8; 64 * 1024]);
    loop {
        match f.read(&mut buf) {
            Ok(0) => return hex::encode(h.finalize()),
            Ok(n) => h.update(&buf[..n]),
            Err(_) => return "?".into(),
        }
    }
}

/// Apply saved `changes` to a fresh copy: its deletions, then its files and links (`tar`'s own
/// checks: nothing written outside, nothing through a link).
pub fn apply(copy: &Path, changes: &Changes) -> std::io::Result<()> {
    for rel in &changes.deleted {
        let p = crate::tools::files::normalize(rel).map_err(std::io::Error::other)?;
        let full = under(copy, &p).ok_or_else(|| std::io::Error::other(format!("{rel}: a link on the way")))?;
        match full.symlink_metadata() {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&full)?,
            Ok(_) => std::fs::remove_file(&full)?,
            Err(_) => {}
        }
    }
    if changes.archive.is_empty() {
        return Ok(());
    }
    let mut a = tar::Archive::new(flate2::read::GzDecoder::new(changes.archive.as_slice()));
    a.set_preserve_permissions(false);
    a.set_unpack_xattrs(false);
    a.set_overwrite(true);
    for entry in a.entries()? {
        let mut e = entry?;
        let executable = e.header().mode().unwrap_or(0o644) & 0o111 != 0;
        let path = e.path()?.into_owned();
        if !e.unpack_in(copy)? {
            return Err(std::io::Error::other(format!("{} leads outside the copy", path.display())));
        }
        let full = copy.join(&path);
        if e.header().entry_type().is_file() {
            std::fs::set_permissions(&full, std::fs::Permissions::from_mode(if executable { 0o755 } else { 0o644 }))?;
        }
    }
    Ok(())
}

/// The counts a task shows of its diff.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stats {
    pub files_changed: u64,
    pub lines_added: u64,
    pub lines_removed: u64,
    /// Binary files changed (named in the diff, not inlined).
    pub binary_files: u64,
    /// The diff's bytes.
    pub bytes: u64,
    /// Files left out of the diff, each with why: its size cap, a link leading outside the
    /// tree, a name git would quote (counted in `files_changed`). At most `MAX_OMITTED` named.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub omitted: Vec<String>,
    /// Files left out beyond the ones `omitted` names.
    #[serde(skip_serializing_if = "is_zero")]
    pub omitted_more: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Files `Stats::omitted` names at most; the rest are counted (`omitted_more`).
pub const MAX_OMITTED: usize = 100;

impl Stats {
    fn omit(&mut self, what: String) {
        if self.omitted.len() < MAX_OMITTED {
            self.omitted.push(what);
        } else {
            self.omitted_more += 1;
        }
    }
}

/// Does a link at `rel` with `target` lead outside the tree: absolute, or up past its root?
fn leads_outside(rel: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return true;
    }
    let mut depth = rel.components().count() as i64 - 1;
    for c in target.components() {
        match c {
            std::path::Component::ParentDir => depth -= 1,
            std::path::Component::Normal(_) => depth += 1,
            std::path::Component::CurDir => {}
            _ => return true,
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

/// `git diff`'s mode of a node.
fn mode(n: &Node) -> &'static str {
    match n {
        Node::Link(_) => "120000",
        Node::File { executable: true } => "100755",
        Node::File { executable: false } => "100644",
    }
}

/// A node's contents as a diff shows them: a link's target, a file's text; `None` if binary
/// (or `max` bytes or more: never read further).
fn contents(root: &Path, rel: &Path, n: &Node, max: u64) -> Option<String> {
    match n {
        Node::Link(t) => Some(t.to_string_lossy().into_owned()),
        Node::File { .. } => {
            let bytes = read_under(root, rel, max).ok()?;
            // Binary: a NUL anywhere (a diff is text, and the store refuses a NUL in text).
            if bytes.len() as u64 >= max || bytes.contains(&0) {
                return None;
            }
            String::from_utf8(bytes).ok()
        }
    }
}

/// The unified diff (as `git diff --binary --full-index` writes it, so `git apply` takes it)
/// from the starting tree `base` to `copy`, with its counts. Binary files are in git's binary
/// form up to `rules.binary_max`; whole files past that, or past `rules.diff_max`, are left out
/// and named.
pub fn diff(base: &Path, copy: &Path, manifest: &Manifest, rules: &Rules) -> (String, Stats) {
    let max = rules.diff_max;
    let (mut out, mut stats) = (String::new(), Stats::default());
    for (rel, c) in compare(base, copy, manifest, &rules.ignore) {
        let name = rel.to_string_lossy().into_owned();
        // A name git would quote (a newline could forge a section of the patch) is named, not diffed.
        if name.chars().any(|ch| ch.is_control() || ch == '"' || ch == '\\') || rel.to_str().is_none() {
            stats.files_changed += 1;
            stats.omit(format!("{name:?} (a name git would quote)"));
            continue;
        }
        let (a, b) = match &c {
            Change::Added(n) => (None, Some(n)),
            Change::Deleted(n) => (Some(n), None),
            Change::Modified(x, y) => (Some(x), Some(y)),
        };
        // A link made to lead outside the tree is never in a patch: `git apply` would make it in
        // the caller's checkout.
        if let Some(Node::Link(t)) = b {
            if leads_outside(&rel, t) {
                stats.files_changed += 1;
                stats.omit(format!("{name} (a symbolic link leading outside the tree)"));
                continue;
            }
        }
        // Too large to be in the diff: named without being read.
        let size = |root: &Path| size_under(root, &rel);
        if size(base).max(size(copy)) > max {
            stats.files_changed += 1;
            stats.omit(format!("{name} (over the diff's size cap)"));
            continue;
        }
        // A link replaced by a file (or the reverse) is a deletion and an addition.
        if let (Some(x), Some(y)) = (a, b) {
            if matches!(x, Node::Link(_)) != matches!(y, Node::Link(_)) {
                let mut part = section(&name, (base, copy, &rel), Some(x), None, &mut stats, rules);
                part.push_str(&section(&name, (base, copy, &rel), None, Some(y), &mut stats, rules));
                stats.files_changed += 1;
                push(&mut out, &mut stats, part, &name, max);
                continue;
            }
        }
        let part = section(&name, (base, copy, &rel), a, b, &mut stats, rules);
        stats.files_changed += 1;
        push(&mut out, &mut stats, part, &name, max);
    }
    stats.bytes = out.len() as u64;
    (out, stats)
}

fn push(out: &mut String, stats: &mut Stats, part: String, name: &str, max: u64) {
    if (out.len() + part.len()) as u64 > max {
        stats.omit(format!("{name} (over the diff's size cap)"));
    } else {
        out.push_str(&part);
    }
}

/// One path's part of the diff; counts its lines into `stats`.
fn section(
    name: &str,
    (old, new, rel): (&Path, &Path, &Path),
    a: Option<&Node>,
    b: Option<&Node>,
    stats: &mut Stats,
    rules: &Rules,
) -> String {
    let max = rules.diff_max;
    let mut s = format!("diff --git a/{name} b/{name}\n");
    match (a, b) {
        (None, Some(n)) => s.push_str(&format!("new file mode {}\n", mode(n))),
        (Some(n), None) => s.push_str(&format!("deleted file mode {}\n", mode(n))),
        (Some(x), Some(y)) if mode(x) != mode(y) => {
            s.push_str(&format!("old mode {}\nnew mode {}\n", mode(x), mode(y)));
        }
        _ => {}
    }
    let text = |root: &Path, n: Option<&Node>| match n {
        None => Some(String::new()),
        Some(n) => contents(root, rel, n, max),
    };
    let (Some(x), Some(y)) = (text(old, a), text(new, b)) else {
        stats.binary_files += 1;
        // Each side's bytes (`Some(None)`: not there), `None` past the cap.
        let bytes = |root: &Path, n: Option<&Node>| match n {
            None => Some(None),
            Some(_) => read_under(root, rel, rules.binary_max.saturating_add(1))
                .ok()
                .filter(|d| d.len() as u64 <= rules.binary_max)
                .map(Some),
        };
        let (Some(x), Some(y)) = (bytes(old, a), bytes(new, b)) else {
            // Named by the side that is over the cap (the new one where both are).
            let size = |root: &Path| size_under(root, rel);
            let at = if b.is_some() && size(new) > rules.binary_max { new } else { old };
            stats.omit(format!(
                "{name} (binary, {} bytes, sha256 {}: over the diff's binary cap)",
                size(at),
                hash_under(at, rel)
            ));
            return String::new();
        };
        // Only its mode changed: the mode lines say it all, as git writes them.
        if x.is_some() && x == y {
            return s;
        }
        let same_mode = matches!((a, b), (Some(p), Some(q)) if mode(p) == mode(q));
        let m = same_mode.then(|| b.map(mode)).flatten();
        s.push_str(&super::binary_patch::section(x.as_deref(), y.as_deref(), m));
        return s;
    };
    if x == y {
        return s;
    }
    let d = similar::TextDiff::from_lines(&x, &y);
    for c in d.iter_all_changes() {
        match c.tag() {
            similar::ChangeTag::Insert => stats.lines_added += 1,
            similar::ChangeTag::Delete => stats.lines_removed += 1,
            similar::ChangeTag::Equal => {}
        }
    }
    let l = if a.is_some() { format!("a/{name}") } else { "/dev/null".into() };
    let r = if b.is_some() { format!("b/{name}") } else { "/dev/null".into() };
    let body = d.unified_diff().context_radius(3).missing_newline_hint(true).header(&l, &r).to_string();
    s.push_str(&body);
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// Write `changes` for a test or a tool: a helper that tars one file.
#[cfg(test)]
fn write(p: &Path, s: &str) {
    use std::io::Write;
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::File::create(p).unwrap().write_all(s.as_bytes()).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_its_changes_rebuild_it_and_its_diff_applies_with_git() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        write(&base.join("src/lib.rs"), "fn a() {}\nfn b() {}\n");
        write(&base.join("gone.txt"), "bye\n");
        write(&base.join(".gitignore"), "target/\n");
        write(&base.join("run.sh"), "echo hi\n");
        let copy = dir.path().join("copy");
        let (bytes, manifest) = make(&base, &copy).unwrap();
        assert_eq!(bytes, 40);
        assert!(changes(&base, &copy, &manifest, 1 << 20, &[]).unwrap().unwrap().deleted.is_empty());

        write(&copy.join("src/lib.rs"), "fn a() {}\nfn b2() {}\n");
        write(&copy.join("new/file.txt"), "new\n");
        write(&copy.join("target/debug/out"), "build output\n");
        std::fs::remove_file(copy.join("gone.txt")).unwrap();
        std::fs::set_permissions(copy.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(copy.join("blob.bin"), [0u8, 1, 2]).unwrap();

        let c = changes(&base, &copy, &manifest, 1 << 20, &[]).unwrap().unwrap();
        assert_eq!(c.deleted, ["gone.txt"]);
        let rebuilt = dir.path().join("rebuilt");
        let (_, m2) = make(&base, &rebuilt).unwrap();
        apply(&rebuilt, &c).unwrap();
        let (d1, s1) = diff(&base, &copy, &manifest, &Rules::with_max(1 << 20));
        let (d2, _) = diff(&base, &rebuilt, &m2, &Rules::with_max(1 << 20));
        assert_eq!(d1, d2, "the rebuilt copy has the same diff");
        assert!(!d1.contains("target/"), "ignored output left out:\n{d1}");
        assert_eq!((s1.files_changed, s1.lines_added, s1.lines_removed, s1.binary_files), (5, 2, 2, 1), "{d1}");
        assert!(d1.contains("old mode 100644\nnew mode 100755"), "{d1}");
        let capped = changes(&base, &copy, &manifest, 4, &[]).unwrap().unwrap();
        assert_eq!(capped.deleted, ["gone.txt"], "past the cap, deletions are still kept");
        assert!(capped.left_out.iter().any(|l| l.starts_with("src/lib.rs (21 bytes, sha256 ")), "{capped:?}");
        let (small, s) = diff(&base, &copy, &manifest, &Rules::with_max(200));
        assert!(!s.omitted.is_empty() && small.len() <= 200, "{small}");

        // git apply takes it, the binary file too.
        let (patch, _) = diff(&base, &copy, &manifest, &Rules::with_max(1 << 20));
        let git = std::process::Command::new("git").arg("--version").output();
        if git.is_err() {
            eprintln!("git not found: the apply check is skipped");
            return;
        }
        std::fs::write(dir.path().join("p.diff"), &patch).unwrap();
        let out = std::process::Command::new("git")
            .args(["apply", "--check", "-v"])
            .arg(dir.path().join("p.diff"))
            .current_dir(&base)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}\n{patch}", String::from_utf8_lossy(&out.stderr));
    }

    #[test]
    fn build_output_is_left_out_by_the_setting_and_a_trees_own_gitignore_can_take_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        write(&base.join("app.py"), "x = 1\n");
        write(&base.join("vendor/keep.pyc"), "in the starting tree\n");
        let copy = dir.path().join("copy");
        let (_, manifest) = make(&base, &copy).unwrap();
        for f in ["__pycache__/app.cpython-311.pyc", "lib/x.pyc", "target/out", "node_modules/m/i.js", "new.py"] {
            write(&copy.join(f), "made\n");
        }
        write(&copy.join("vendor/keep.pyc"), "changed\n");
        let names = |rules: &Rules| {
            let (d, _) = diff(&base, &copy, &manifest, rules);
            d.lines()
                .filter_map(|l| l.strip_prefix("diff --git a/"))
                .map(|l| l.split(' ').next().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        // The defaults: only what is not build output, and a file the starting tree had.
        assert_eq!(names(&Rules::with_max(1 << 20)), ["new.py", "vendor/keep.pyc"]);
        let saved = changes(&base, &copy, &manifest, 1 << 20, &Rules::with_max(0).ignore).unwrap().unwrap();
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(saved.archive.as_slice()));
        let kept: Vec<String> =
            tar.entries().unwrap().map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(kept, ["new.py", "vendor/keep.pyc"], "saved changes leave out the same");
        // The setting emptied: everything.
        let none = Rules { ignore: vec![], ..Rules::with_max(1 << 20) };
        assert_eq!(names(&none).len(), 6);
        // A tree's own `.gitignore` may take a default back.
        write(&copy.join(".gitignore"), "!target/\n");
        assert_eq!(names(&Rules::with_max(1 << 20)), [".gitignore", "new.py", "target/out", "vendor/keep.pyc"]);
    }

    #[test]
    fn links_leading_outside_are_left_out_of_the_patch_and_omitted_is_capped() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        write(&base.join("a/keep.txt"), "k\n");
        let copy = dir.path().join("copy");
        let (_, manifest) = make(&base, &copy).unwrap();
        std::os::unix::fs::symlink("/", copy.join("rootl")).unwrap();
        std::os::unix::fs::symlink("../../../etc/passwd", copy.join("a/up")).unwrap();
        std::os::unix::fs::symlink("../../x", copy.join("a/away")).unwrap();
        std::os::unix::fs::symlink("keep.txt", copy.join("a/inside")).unwrap();
        let (d, s) = diff(&base, &copy, &manifest, &Rules::with_max(1 << 20));
        assert!(
            d.contains("b/a/inside") && !d.contains("rootl") && !d.contains("a/up") && !d.contains("a/away"),
            "{d}"
        );
        for name in ["rootl", "a/up", "a/away"] {
            assert!(s.omitted.contains(&format!("{name} (a symbolic link leading outside the tree)")), "{s:?}");
        }
        assert_eq!(s.files_changed, 4);
        for i in 0..(MAX_OMITTED + 7) {
            std::os::unix::fs::symlink("/etc", copy.join(format!("l{i}"))).unwrap();
        }
        let (_, s) = diff(&base, &copy, &manifest, &Rules::with_max(1 << 20));
        assert_eq!((s.omitted.len(), s.omitted_more), (MAX_OMITTED, 10), "3 + 107 left out, 100 named");
    }

    #[test]
    fn saved_changes_never_write_outside_the_copy() {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("copy");
        std::fs::create_dir(&copy).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, copy.join("out")).unwrap();
        let mut b = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        b.append_data(&mut h, "out/x", &b"x"[..]).unwrap();
        let archive = b.into_inner().unwrap().finish().unwrap();
        assert!(apply(&copy, &Changes { archive, deleted: vec![], left_out: vec![] }).is_err());
        assert!(
            apply(&copy, &Changes { archive: vec![], deleted: vec!["../outside".into()], left_out: vec![] }).is_err()
        );
        std::fs::write(outside.join("keep"), "k").unwrap();
        assert!(apply(&copy, &Changes { archive: vec![], deleted: vec!["out/keep".into()], left_out: vec![] }).is_err());
        assert!(outside.join("keep").exists(), "nothing deleted through a link");
    }

    #[test]
    fn links_fifos_and_linked_rules_in_the_copy_are_never_followed_on_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let (base, copy, secret) = (dir.path().join("base"), dir.path().join("copy"), dir.path().join("secret"));
        write(&base.join("d/x.txt"), "in the tree\n");
        write(&secret.join("x.txt"), "host secret\n");
        let (_, manifest) = make(&base, &copy).unwrap();
        // A command swaps a directory for a link out, makes a FIFO and links its rules to /dev/zero.
        std::fs::remove_dir_all(copy.join("d")).unwrap();
        std::os::unix::fs::symlink(&secret, copy.join("d")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", copy.join(".gitignore")).unwrap();
        let fifo = std::ffi::CString::new(copy.join("pipe").to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let (d, _) = diff(&base, &copy, &manifest, &Rules::with_max(1 << 20));
        assert!(!d.contains("host secret"), "{d}");
        assert!(d.contains("deleted file mode 100644") && d.contains("-in the tree"), "{d}");
        let c = changes(&base, &copy, &manifest, 1 << 20, &[]).unwrap().unwrap();
        assert!(c.deleted.contains(&"d/x.txt".to_string()), "{:?}", c.deleted);
        write(&copy.join("bad\nname"), "x\n");
        let (d, s) = diff(&base, &copy, &manifest, &Rules::with_max(1 << 20));
        assert!(!d.contains("bad\nname") && s.omitted.iter().any(|o| o.contains("git would quote")), "{d}");
    }
}
