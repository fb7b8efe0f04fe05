//! gVisor (`runsc`), the sandbox's second runtime (`SUBAGENTD_SANDBOX_RUNTIME=gvisor`, issue 63).
//!
//! bubblewrap puts a command in namespaces of the host's kernel: every system call it makes is the
//! host kernel's to answer. gVisor answers them itself: the command runs on gVisor's kernel (the
//! Sentry, a user-space process under a seccomp filter), and its files are reached through a
//! second process (the Gofer), so that a flaw in the host kernel's system calls is not one the
//! command can reach.
//!
//! A command is one OCI bundle: a `config.json` written here, its root the image's (read-only) or,
//! without an image, a skeleton binding the host's `/usr` read-only as bubblewrap does; the copy
//! bound at `/workspace`; `/tmp` and `/dev/shm` tmpfs of their own; rlimits in the spec, enforced
//! by gVisor's kernel. `runsc --rootless` runs it as the sandbox's host uid: gVisor's user
//! namespace maps that uid to 0, so the copy's files are uid 0's there and the command runs as
//! uid 0 of gVisor's kernel, with no capability (an empty bounding set, no new privileges). runsc
//! always starts in a network namespace of its own (`netns`), so that its control socket (an
//! abstract Unix socket) is not in the host's, where any local process could reach it. No
//! network: `--network=none` (a loopback of gVisor's own); with an environment's allow-list,
//! `--network=host` in that namespace (only the proxy's listener there).
//! The state directory is the bundle's own, removed with it.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::hostfs::{host_parts, HostPart};

/// The library every gVisor command preloads (`gvisor_compat/statx.c`, built by build.rs; empty
/// where it could not be built): Debian's runsc refuses `AT_NO_AUTOMOUNT`, which coreutils' `ls`,
/// `stat`, `du` and `cp` give, and the library drops it.
const COMPAT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gvisor-statx.so"));

/// Where the sandbox sees it: in its own `/dev` (a tmpfs of the sandbox's). runsc binds it over a
/// file of the root (its mount point, made with the root: `mount_point`).
const COMPAT_AT: &str = "/dev/.subagentd-statx.so";

/// Make the library's mount point in a root (the skeleton, an image's root as it is unpacked):
/// an empty file of its own. Whatever an image put there (a link to a host file, say) is removed
/// first, never followed, and the file is made new (`O_EXCL`, `O_NOFOLLOW`). `root/dev` is a
/// real directory (the caller made it so).
pub fn mount_point(root: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let at = root.join(COMPAT_AT.trim_start_matches('/'));
    match std::fs::symlink_metadata(&at) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&at)?,
        Ok(_) => std::fs::remove_file(&at)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&at)
        .map(drop)
}

/// The library written under `dir` (a file of this sandbox's own: an older binary's is never
/// used), if it was built.
pub fn compat(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    if COMPAT.is_empty() {
        return Ok(None);
    }
    let new = tempfile::Builder::new().prefix("gvisor-statx-").suffix(".so").tempfile_in(dir)?;
    std::fs::write(new.path(), COMPAT)?;
    std::fs::set_permissions(new.path(), std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    let (_, path) = new.keep().map_err(|e| e.error)?;
    Ok(Some(path))
}

/// The root of sandboxes without an image, made under `dir` (the caller removes it when done):
/// the mount points of `host_parts`, the links, and `/workspace`, `/tmp`, `/proc`, `/dev`.
/// Read-only to the sandbox.
pub fn skeleton(dir: &Path) -> std::io::Result<PathBuf> {
    // A root of this sandbox's own, made now: one an earlier process left (the same pid in a
    // container restarted) may be of another host layout.
    let new = tempfile::Builder::new().prefix("gvisor-root-").tempdir_in(dir)?;
    for d in ["workspace", "tmp", "proc", "dev", "etc", "sys"] {
        std::fs::create_dir_all(new.path().join(d))?;
    }
    mount_point(new.path())?;
    for p in host_parts() {
        match p {
            HostPart::Bind(host) => {
                let at = new.path().join(host.strip_prefix("/").unwrap_or(&host));
                if host.is_dir() {
                    std::fs::create_dir_all(&at)?;
                } else {
                    std::fs::write(&at, b"")?;
                }
            }
            HostPart::Link { at, to } => {
                std::os::unix::fs::symlink(to, new.path().join(at.strip_prefix("/").unwrap_or(&at)))?;
            }
        }
    }
    let mode = |p: &Path, m| std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m));
    for e in walkdir::WalkDir::new(new.path()).follow_links(false) {
        let e = e.map_err(std::io::Error::other)?;
        if e.file_type().is_dir() {
            mode(e.path(), 0o755)?;
        } else if e.file_type().is_file() {
            mode(e.path(), 0o644)?;
        }
    }
    Ok(new.keep())
}

/// One command's spec.
pub struct Spec<'a> {
    /// The root: an image's, a setup's copy, or the skeleton.
    pub root: &'a Path,
    /// Writable only for a setup (the copy of an image's root).
    pub root_writable: bool,
    /// Without an image: the host's programs bound in.
    pub host: bool,
    /// The task's copy, at `/workspace` (none for a setup).
    pub workspace: Option<&'a Path>,
    /// The network namespace runsc starts in (`netns`'s) is the command's: no new one.
    pub net: bool,
    pub env: &'a [(String, String)],
    /// `compat`'s library, preloaded.
    pub preload: Option<&'a Path>,
    pub command: &'a str,
    pub tmp_bytes: u64,
    /// (`RLIMIT_*`, value).
    pub rlimits: &'a [(&'static str, u64)],
}

impl Spec<'_> {
    /// The OCI runtime spec (`config.json`).
    pub fn config(&self) -> Value {
        let tmpfs = |at: &str| {
            json!({"destination": at, "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", format!("size={}", self.tmp_bytes.max(1 << 20)), "mode=1777"]})
        };
        let mut mounts = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc"}),
            json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]}),
            tmpfs("/dev/shm"),
            tmpfs("/tmp"),
        ];
        if self.host {
            for p in host_parts() {
                if let HostPart::Bind(host) = p {
                    mounts.push(json!({"destination": host, "type": "bind", "source": host,
                                       "options": ["rbind", "ro", "nosuid", "nodev"]}));
                }
            }
        }
        if let Some(w) = self.workspace {
            mounts.push(json!({"destination": "/workspace", "type": "bind", "source": w,
                               "options": ["rbind", "rw", "nosuid", "nodev"]}));
        }
        let mut env: Vec<(String, String)> = self.env.to_vec();
        // Not in a root made before the mount point was (an image cached by an older version).
        let preload = self.preload.filter(|_| self.root.join(COMPAT_AT.trim_start_matches('/')).is_file());
        if let Some(lib) = preload {
            mounts.push(json!({"destination": COMPAT_AT, "type": "bind", "source": lib,
                               "options": ["bind", "ro", "nosuid", "nodev"]}));
            // Before the image's own (a jemalloc, say), in the one variable.
            match env.iter_mut().find(|(k, _)| k == "LD_PRELOAD") {
                Some((_, v)) => *v = format!("{COMPAT_AT}:{v}"),
                None => env.push(("LD_PRELOAD".into(), COMPAT_AT.into())),
            }
        }
        let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let rlimits: Vec<Value> = self.rlimits.iter().map(|(t, n)| json!({"type": t, "hard": n, "soft": n})).collect();
        let mut namespaces =
            vec![json!({"type": "pid"}), json!({"type": "ipc"}), json!({"type": "uts"}), json!({"type": "mount"})];
        if !self.net {
            namespaces.push(json!({"type": "network"}));
        }
        json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                // The copy's owner in gVisor's user namespace (see the module's comment).
                "user": {"uid": 0, "gid": 0},
                "args": ["/bin/sh", "-c", self.command],
                "env": env,
                "cwd": if self.workspace.is_some() { "/workspace" } else { "/" },
                "capabilities": {"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []},
                "rlimits": rlimits,
                "noNewPrivileges": true
            },
            "root": {"path": self.root, "readonly": !self.root_writable},
            "hostname": "sandbox",
            "mounts": mounts,
            "linux": {"namespaces": namespaces}
        })
    }
}

/// A command's bundle: a directory of its own under the sandbox's, with the spec and runsc's state
/// directory; removed when dropped.
pub struct Bundle {
    dir: tempfile::TempDir,
}

impl Bundle {
    /// Write `spec` in a new bundle under `parent`, reachable by `uid` (the sandbox's host uid,
    /// when this process runs as root).
    pub fn write(parent: &Path, spec: &Spec<'_>, uid: Option<u32>) -> std::io::Result<Bundle> {
        let dir = tempfile::Builder::new().prefix("gvisor-").tempdir_in(parent)?;
        std::fs::write(dir.path().join("config.json"), serde_json::to_vec(&spec.config())?)?;
        std::fs::create_dir(dir.path().join("state"))?;
        let mode = |p: &Path, m| std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m));
        mode(dir.path(), 0o755)?;
        mode(&dir.path().join("config.json"), 0o644)?;
        mode(&dir.path().join("state"), 0o700)?;
        if let Some(uid) = uid {
            std::os::unix::fs::chown(dir.path().join("state"), Some(uid), Some(uid))?;
        }
        Ok(Bundle { dir })
    }

    /// runsc's arguments for this bundle: rootless, no cgroups of its own (the command's cgroup
    /// holds runsc whole), the network namespace's (`host`: made by `netns`) or none.
    pub fn args(&self, net: bool) -> Vec<String> {
        let d = self.dir.path();
        vec![
            "--rootless".into(),
            format!("--network={}", if net { "host" } else { "none" }),
            "--ignore-cgroups".into(),
            "--root".into(),
            d.join("state").to_string_lossy().into_owned(),
            "run".into(),
            "--bundle".into(),
            d.to_string_lossy().into_owned(),
            // The container's name: the bundle's. Unique: runsc names its control socket by it, in
            // the abstract namespace that every sandbox without a network of its own shares.
            d.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_binds_the_copy_and_the_hosts_programs_read_only_and_grants_no_capability() {
        let env = vec![("PATH".to_string(), "/usr/bin".to_string())];
        let spec = Spec {
            root: Path::new("/r"),
            root_writable: false,
            host: true,
            workspace: Some(Path::new("/copy")),
            net: false,
            env: &env,
            preload: None,
            command: "make test",
            tmp_bytes: 4 << 20,
            rlimits: &[("RLIMIT_CPU", 11)],
        };
        let c = spec.config();
        assert_eq!(c["root"]["readonly"], true);
        assert_eq!(c["process"]["args"], json!(["/bin/sh", "-c", "make test"]));
        assert_eq!(c["process"]["capabilities"]["bounding"], json!([]));
        assert_eq!(c["process"]["noNewPrivileges"], true);
        let mounts = c["mounts"].as_array().unwrap();
        let at = |d: &str| mounts.iter().find(|m| m["destination"] == d).unwrap().clone();
        assert_eq!(at("/workspace")["source"], "/copy");
        assert!(at("/usr")["options"].as_array().unwrap().contains(&json!("ro")));
        assert!(at("/tmp")["options"].as_array().unwrap().contains(&json!("size=4194304")));
        assert_eq!(c["process"]["rlimits"][0], json!({"type": "RLIMIT_CPU", "hard": 11, "soft": 11}));
    }
}
