//! What of the host a sandbox without an image sees (both runtimes: bubblewrap's binds, gVisor's
//! skeleton and mounts).

use std::path::{Path, PathBuf};

/// A part of the host a sandbox without an image sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPart {
    /// A directory or file of the host, read-only at the same path.
    Bind(PathBuf),
    /// A link at `at` to `to` (merged-`/usr` hosts' `/bin -> usr/bin`).
    Link { at: PathBuf, to: PathBuf },
}

/// What of the host a sandbox without an image sees: `/usr`, the merged-`/usr` links (or the
/// directories themselves where they are real), and of `/etc` what the programs need: the
/// loader's cache and Debian's alternatives (`awk`, `editor`…). Not passwd, not the host's name or
/// addresses.
pub fn host_parts() -> Vec<HostPart> {
    let mut parts = vec![HostPart::Bind("/usr".into())];
    for d in ["bin", "sbin", "lib", "lib32", "lib64"] {
        let host = Path::new("/").join(d);
        match std::fs::read_link(&host) {
            Ok(to) => parts.push(HostPart::Link { at: host, to }),
            Err(_) if host.is_dir() => parts.push(HostPart::Bind(host)),
            Err(_) => {}
        }
    }
    for f in ["/etc/ld.so.cache", "/etc/alternatives"] {
        if Path::new(f).exists() {
            parts.push(HostPart::Bind(f.into()));
        }
    }
    parts
}
