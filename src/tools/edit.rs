//! `write_file` and `edit_file`: the model's changes to its task's own copy of the workspace
//! (never the shared tree). A path is relative to the copy's root and never leads outside it:
//! directories on the way are checked one by one (a symbolic link among them must stay inside),
//! and the file itself is opened without following a link. The runner holds the copy's lock
//! around each call, so no command of the task changes the tree between the check and the use.
//! Blocking (file I/O): the runner calls these on a blocking thread.

use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::files::{normalize, relative, resolve};

/// Lines of the edited region `edit_file` shows back.
const SNIPPET_LINES: usize = 8;
/// The largest file `edit_file` takes (a bigger one is rewritten with write_file, or by a command).
const MAX_EDIT_BYTES: u64 = 16 << 20;

/// Give what the service made in the copy to the copy's owner (the sandbox's uid, when the
/// service runs as root), so that commands can change it too.
fn hand_over(root: &Path, made: &Path) {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = root.metadata() {
        let _ = std::os::unix::fs::lchown(made, Some(m.uid()), Some(m.gid()));
    }
}

/// The directory `dirs` names under `root`, made where missing; each existing step checked.
fn make_dirs(root: &Path, dirs: &Path) -> Result<PathBuf, String> {
    let mut cur = root.to_path_buf();
    for c in dirs.components() {
        let next = cur.join(c);
        match next.symlink_metadata() {
            Ok(m) if m.is_dir() => cur = next,
            Ok(m) if m.file_type().is_symlink() => {
                let canon = next
                    .canonicalize()
                    .map_err(|_| format!("{:?} is a symbolic link to nothing", relative(root, &next)))?;
                if !canon.starts_with(root) || !canon.is_dir() {
                    return Err(format!(
                        "{:?} is a symbolic link that leads outside the workspace (or to no directory); nothing \
                         is written through it",
                        relative(root, &next)
                    ));
                }
                cur = canon;
            }
            Ok(_) => return Err(format!("{:?} is a file, not a directory", relative(root, &next))),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                std::fs::create_dir(&next).map_err(|e| format!("{:?} cannot be made: {e}", relative(root, &next)))?;
                hand_over(root, &next);
                cur = next;
            }
            Err(e) => return Err(format!("{:?}: {e}", relative(root, &next))),
        }
    }
    Ok(cur)
}

/// Replace (or create) the file at `path` with `bytes`, not following a link nor waiting on a
/// FIFO: a regular file only.
fn put(root: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let existed = path.symlink_metadata().is_ok();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    f.set_len(0)?;
    f.write_all(bytes)?;
    if !existed {
        hand_over(root, path);
    }
    Ok(())
}

/// `write_file`: the whole file, created with its directories if new.
pub fn write_file(root: &Path, rel: &str, content: &str) -> Result<String, String> {
    let normal = normalize(rel)?;
    let Some(name) = normal.file_name() else {
        return Err(format!("{rel:?} names no file (a path such as \"src/new.rs\")"));
    };
    let dir = make_dirs(root, normal.parent().unwrap_or(Path::new("")))?;
    let mut target = dir.join(name);
    let shown = relative(root, &target);
    let existed = match target.symlink_metadata() {
        Ok(m) if m.is_dir() => return Err(format!("{shown:?} is a directory")),
        Ok(m) if m.file_type().is_symlink() => {
            // Written through only when it points at a file inside.
            let canon = resolve(root, &shown)?;
            if canon.is_dir() {
                return Err(format!("{shown:?} is a link to a directory"));
            }
            target = canon;
            true
        }
        Ok(_) => true,
        Err(_) => false,
    };
    put(root, &target, content.as_bytes()).map_err(|e| format!("{shown:?} cannot be written: {e}"))?;
    Ok(format!(
        "{} {shown:?}: {} bytes, {} lines.",
        if existed { "Replaced" } else { "Created" },
        content.len(),
        content.lines().count()
    ))
}

/// `edit_file`: replace the one occurrence of `old` (or, with `all`, each) by `new`.
pub fn edit_file(root: &Path, rel: &str, old: &str, new: &str, all: bool) -> Result<String, String> {
    let path = resolve(root, rel)?;
    let shown = relative(root, &path);
    if path.is_dir() {
        return Err(format!("{shown:?} is a directory"));
    }
    if old == new {
        return Err("old_string and new_string are the same: nothing would change".into());
    }
    let mut bytes = vec![];
    let mut f = super::files::open_regular(&path).map_err(|e| format!("{shown:?} cannot be read: {e}"))?;
    if f.metadata().map(|m| m.len()).unwrap_or(0) > MAX_EDIT_BYTES {
        return Err(format!("{shown:?} is larger than 16 MiB: rewrite it with write_file or change it with a command"));
    }
    std::io::Read::read_to_end(&mut f, &mut bytes).map_err(|e| format!("{shown:?} cannot be read: {e}"))?;
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{shown:?} is not UTF-8 text; rewrite it with write_file"))?;
    let n = text.matches(old).count();
    if n == 0 {
        return Err(format!(
            "old_string was not found in {shown:?}: it must match the file exactly, whitespace and indentation \
             included (read the file again)"
        ));
    }
    if n > 1 && !all {
        return Err(format!(
            "old_string occurs {n} times in {shown:?}: give more surrounding lines to make it unique, or set \
             replace_all"
        ));
    }
    let at = text.find(old).unwrap_or(0);
    let changed = if all { text.replace(old, new) } else { text.replacen(old, new, 1) };
    put(root, &path, changed.as_bytes()).map_err(|e| format!("{shown:?} cannot be written: {e}"))?;
    // The first edited region as it reads now, its lines numbered.
    let first = text[..at].matches('\n').count();
    let lines: Vec<&str> = changed.lines().collect();
    let span = new.matches('\n').count() + 1;
    let (from, to) = (first.saturating_sub(1), (first + span + 1).min(lines.len()));
    let mut out = format!("Edited {shown:?}: {n} occurrence{} replaced. Now:\n", if n == 1 { "" } else { "s" });
    for (i, l) in lines.iter().enumerate().take(to.min(from + SNIPPET_LINES)).skip(from) {
        out.push_str(&format!("{:>6}\t{l}\n", i + 1));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_edits_stay_inside_and_say_what_they_did() {
        let outside = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join("a.txt"), "one\ntwo\ntwo\n").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("x"), root.join("dangling")).unwrap();
        std::os::unix::fs::symlink("a.txt", root.join("inner")).unwrap();

        assert!(write_file(&root, "src/deep/new.rs", "fn main() {}\n").unwrap().starts_with("Created"));
        assert_eq!(std::fs::read_to_string(root.join("src/deep/new.rs")).unwrap(), "fn main() {}\n");
        for bad in ["../x", "/etc/x", "out/x", "dangling", "src/deep/new.rs/x", "."] {
            assert!(write_file(&root, bad, "x").is_err(), "{bad} was written");
        }
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "nothing was written outside");

        assert!(edit_file(&root, "a.txt", "two", "2", false).unwrap_err().contains("occurs 2 times"));
        assert!(edit_file(&root, "a.txt", "three", "3", false).unwrap_err().contains("not found"));
        assert!(edit_file(&root, "a.txt", "one", "one", false).is_err());
        let out = edit_file(&root, "inner", "one\n", "ONE\n", false).unwrap();
        assert!(out.contains("1\tONE"), "{out}");
        edit_file(&root, "a.txt", "two", "2", true).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("a.txt")).unwrap(), "ONE\n2\n2\n");
        assert!(edit_file(&root, "out/x", "a", "b", false).is_err());
        write_file(&root, "inner", "replaced\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("a.txt")).unwrap(),
            "replaced\n",
            "written through an inside link"
        );
    }
}
