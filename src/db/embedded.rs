//! The embedded Postgres bootstrap: a private cluster started from the server binaries
//! installed on the machine, used when no `DATABASE_URL` is given.
//!
//! `initdb` runs once into the data directory; each start picks a free loopback port,
//! runs `postgres` as a child process and stops it on shutdown. Postgres refuses to run as
//! root, so under root the cluster belongs to the `postgres` user if there is one, else
//! `nobody` (the data directory's parents must be reachable by that user). The child gets
//! a parent-death signal, so it never outlives this process, even after `kill -9`.

use std::fs;
use std::io::Read;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(
        "PostgreSQL server binaries (initdb, postgres) were not found on PATH, via `pg_config --bindir`, \
         or in /usr/lib/postgresql/*/bin. Install them (Debian/Ubuntu: `apt-get install postgresql`; \
         Fedora: `dnf install postgresql-server`; macOS: `brew install postgresql@16`), point \
         SUBAGENTD_PG_BIN_DIR at them, or set DATABASE_URL to an existing database."
    )]
    NoBinaries,
    #[error("embedded postgres: {0}")]
    Failed(String),
}

fn failed(what: impl std::fmt::Display) -> BootstrapError {
    BootstrapError::Failed(what.to_string())
}

#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    pub data_dir: PathBuf,
    pub bin_dir: Option<PathBuf>,
    /// Trade durability for speed (fsync off): for throwaway test clusters only.
    pub fast_unsafe: bool,
    pub max_connections: u32,
    /// More server settings (`name=value`), passed as `-c` flags.
    pub settings: Vec<String>,
}

/// A running private cluster. Dropping it stops the server.
pub struct EmbeddedPostgres {
    child: Option<Child>,
    pub port: u16,
    password: String,
    pub data_dir: PathBuf,
    /// The directory of the server's Unix socket, when it has one.
    socket_dir: Option<PathBuf>,
}

impl EmbeddedPostgres {
    /// URL of `database` on this cluster, over TCP on loopback.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres:{}@127.0.0.1:{}/{}", self.password, self.port, database)
    }

    /// URL of `database` over the server's Unix socket when it has one and this process can
    /// reach it (cheaper per statement than loopback TCP, for both sides), else over TCP.
    pub fn local_url(&self, database: &str) -> String {
        let reachable = self
            .socket_dir
            .as_ref()
            .filter(|d| std::os::unix::net::UnixStream::connect(d.join(format!(".s.PGSQL.{}", self.port))).is_ok());
        match reachable.and_then(|d| d.to_str()) {
            Some(dir) => format!(
                "postgres://postgres:{}@localhost:{}/{}?host={}",
                self.password,
                self.port,
                database,
                encode_path(dir)
            ),
            None => self.url(database),
        }
    }

    pub fn start(opts: &EmbeddedOptions) -> Result<Self, BootstrapError> {
        let bin = find_bin_dir(opts.bin_dir.as_deref()).ok_or(BootstrapError::NoBinaries)?;
        let owner = run_as_user()?;
        let data_dir = absolute(&opts.data_dir)?;
        let parent = data_dir.parent().ok_or_else(|| failed("data dir has no parent"))?;
        fs::create_dir_all(parent).map_err(|e| failed(format!("create {}: {e}", parent.display())))?;
        let pw_path = data_dir.with_extension("password");

        if !data_dir.join("PG_VERSION").exists() {
            init_cluster(&bin, &data_dir, &pw_path, owner)?;
        }
        let password = fs::read_to_string(&pw_path)
            .map_err(|e| failed(format!("read {}: {e}", pw_path.display())))?
            .trim()
            .to_string();

        // The socket lives in the data directory (private to the server's user, and to root), if
        // its path fits a socket address. Should the server fail to start with it (a filesystem
        // without Unix sockets), it starts again on TCP only.
        let socket_dir = data_dir
            .to_str()
            .filter(|d| d.len() + "/.s.PGSQL.65535".len() < 100 && !d.contains(','))
            .map(|_| data_dir.clone());
        let port = free_port()?;
        match Self::spawn(opts, &bin, owner, &data_dir, &password, socket_dir.clone(), port) {
            Err(e) if socket_dir.is_some() => {
                tracing::warn!(error = %e, "embedded postgres did not start with a Unix socket; retrying on TCP only");
                Self::spawn(opts, &bin, owner, &data_dir, &password, None, port)
            }
            r => r,
        }
    }

    /// A crash of the database (for fault tests): the postmaster is told to shut down at once
    /// (`pg_ctl stop -m immediate`: no checkpoint; the next start recovers from the WAL).
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGQUIT);
            }
            let _ = child.wait();
        }
    }

    /// Start the server again after `crash` or `stop`, on the same port and socket.
    pub fn start_again(&mut self, opts: &EmbeddedOptions) -> Result<(), BootstrapError> {
        self.stop();
        let bin = find_bin_dir(opts.bin_dir.as_deref()).ok_or(BootstrapError::NoBinaries)?;
        let owner = run_as_user()?;
        let again = Self::spawn(opts, &bin, owner, &self.data_dir, &self.password, self.socket_dir.clone(), self.port)?;
        *self = again;
        Ok(())
    }

    fn spawn(
        opts: &EmbeddedOptions,
        bin: &Path,
        owner: Option<(u32, u32)>,
        data_dir: &Path,
        password: &str,
        socket_dir: Option<PathBuf>,
        port: u16,
    ) -> Result<Self, BootstrapError> {
        let log_path = data_dir.with_extension("log");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| failed(format!("open {}: {e}", log_path.display())))?;
        let log_err = log.try_clone().map_err(failed)?;
        let sockets = socket_dir.as_ref().map_or(String::new(), |d| d.display().to_string());
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D")
            .arg(data_dir)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", &format!("unix_socket_directories={sockets}")])
            .args(["-c", &format!("max_connections={}", opts.max_connections)]);
        if opts.fast_unsafe {
            cmd.args(["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]);
        }
        for s in &opts.settings {
            cmd.args(["-c", s]);
        }
        cmd.stdin(Stdio::null()).stdout(log).stderr(log_err);
        as_owner(&mut cmd, owner);
        // SAFETY: prctl is async-signal-safe; it runs in the child between fork and exec,
        // after the uid change (which would otherwise clear it).
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = spawn_from_long_lived_thread(cmd)?;
        let mut pg = EmbeddedPostgres {
            child: Some(child),
            port,
            password: password.to_string(),
            data_dir: data_dir.to_path_buf(),
            socket_dir,
        };
        pg.wait_ready(&log_path)?;
        Ok(pg)
    }

    fn wait_ready(&mut self, log_path: &Path) -> Result<(), BootstrapError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(failed(format!(
                        "postgres exited with {status} during start; log {}:\n{}",
                        log_path.display(),
                        tail(log_path)
                    )));
                }
            }
            if TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok() {
                // Accepting TCP is not yet accepting queries; pg_isready semantics come from
                // the pool's first connect, which retries (see db::connect).
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(failed(format!("postgres did not start within 60 s; log:\n{}", tail(log_path))));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Fast shutdown: SIGINT, then wait for the postmaster to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGINT);
            }
            let _ = child.wait();
        }
    }
}

impl Drop for EmbeddedPostgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The parent-death signal fires when the *thread* that forked exits, so the child is
/// spawned from a thread that lives as long as the process.
fn spawn_from_long_lived_thread(mut cmd: Command) -> Result<Child, BootstrapError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("embedded-postgres".into())
        .spawn(move || {
            let _ = tx.send(cmd.spawn());
            loop {
                std::thread::park();
            }
        })
        .map_err(failed)?;
    rx.recv().map_err(failed)?.map_err(|e| failed(format!("spawn postgres: {e}")))
}

fn init_cluster(bin: &Path, data_dir: &Path, pw_path: &Path, owner: Option<(u32, u32)>) -> Result<(), BootstrapError> {
    use rand::Rng;
    let password: String =
        rand::thread_rng().sample_iter(&rand::distributions::Alphanumeric).take(32).map(char::from).collect();
    fs::write(pw_path, &password).map_err(|e| failed(format!("write {}: {e}", pw_path.display())))?;
    fs::set_permissions(pw_path, fs::Permissions::from_mode(0o600)).map_err(failed)?;
    // initdb (running as the owner) reads the password from a file it can open.
    let tmp_pw = data_dir.with_extension("initpw");
    fs::write(&tmp_pw, &password).map_err(failed)?;
    fs::set_permissions(&tmp_pw, fs::Permissions::from_mode(0o600)).map_err(failed)?;
    if data_dir.exists() {
        fs::remove_dir_all(data_dir).map_err(|e| failed(format!("clear half-made {}: {e}", data_dir.display())))?;
    }
    fs::create_dir_all(data_dir).map_err(failed)?;
    fs::set_permissions(data_dir, fs::Permissions::from_mode(0o700)).map_err(failed)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(data_dir, Some(uid), Some(gid)).map_err(failed)?;
        std::os::unix::fs::chown(&tmp_pw, Some(uid), Some(gid)).map_err(failed)?;
    }
    let mut cmd = Command::new(bin.join("initdb"));
    cmd.arg("-D")
        .arg(data_dir)
        .args(["-U", "postgres", "-E", "UTF8", "--no-locale", "--auth=scram-sha-256"])
        .arg(format!("--pwfile={}", tmp_pw.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    as_owner(&mut cmd, owner);
    let out = cmd.output().map_err(|e| failed(format!("run initdb: {e}")));
    let _ = fs::remove_file(&tmp_pw);
    let out = out?;
    if !out.status.success() {
        let _ = fs::remove_dir_all(data_dir);
        return Err(failed(format!(
            "initdb failed ({}): {}{}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout),
            if owner.is_some() {
                "\n(running as root: the cluster belongs to an unprivileged user, who must be able to \
                 reach the data directory; choose --data-dir under /var/lib or /tmp, or set DATABASE_URL)"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

fn as_owner(cmd: &mut Command, owner: Option<(u32, u32)>) {
    if let Some((uid, gid)) = owner {
        cmd.uid(uid).gid(gid);
        cmd.env("HOME", "/tmp");
    }
}

/// `None` when not root; else the uid/gid of `postgres` or `nobody`.
fn run_as_user() -> Result<Option<(u32, u32)>, BootstrapError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let passwd = fs::read_to_string("/etc/passwd").map_err(failed)?;
    for wanted in ["postgres", "nobody"] {
        for line in passwd.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() > 3 && f[0] == wanted {
                if let (Ok(uid), Ok(gid)) = (f[2].parse(), f[3].parse()) {
                    return Ok(Some((uid, gid)));
                }
            }
        }
    }
    Err(failed("running as root and neither a `postgres` nor a `nobody` user exists to own the cluster"))
}

pub fn find_bin_dir(explicit: Option<&Path>) -> Option<PathBuf> {
    let ok = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    if let Some(d) = explicit {
        return ok(d).then(|| d.to_path_buf());
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            if ok(&d) {
                return Some(d);
            }
        }
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && ok(&d) {
            return Some(d);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let d = e.path().join("bin");
            ok(&d).then_some((v, d))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, d)| d)
}

fn free_port() -> Result<u16, BootstrapError> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(failed)?;
    Ok(l.local_addr().map_err(failed)?.port())
}

fn absolute(p: &Path) -> Result<PathBuf, BootstrapError> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir().map_err(failed)?.join(p))
    }
}

fn tail(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let start = s.len().saturating_sub(2000);
    let start = (start..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
    s[start..].to_string()
}

/// Percent-encode a filesystem path for a URL's query string.
fn encode_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
