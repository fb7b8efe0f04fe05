//! What processes that were killed left behind: directories named by a pid (a task's copies,
//! an image being pulled), removed by the next process to start on the same directory.

/// Remove the entries of `dir` whose names start with `prefix` and go on with anything but the
/// pid of a live process (what processes that were killed left behind); the others stay.
pub fn sweep_gone_processes(dir: &std::path::Path, prefix: &str) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        let alive = rest.parse::<i32>().is_ok_and(|pid| {
            // SAFETY: kill(2) with signal 0 only asks whether the process exists.
            unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
        });
        if !alive {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
