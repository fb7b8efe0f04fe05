//! A sandbox's network by allow-list (issue 63): the sandbox never gets the host's network. Its
//! network namespace is made before bubblewrap starts (in the child, between fork and exec:
//! `unshare(CLONE_NEWUSER | CLONE_NEWNET)`, its own uid mapped to itself), holding only a
//! loopback, and a listener is bound there on `127.0.0.1:3128` and handed to the service over a
//! socket pair. bubblewrap then starts inside that namespace (without `--unshare-net`), so the
//! sandbox's commands reach the listener and nothing else; the service serves it as the egress
//! proxy (`egress::accept`), each connection it makes onward judged by the environment's
//! allow-list and the operator's guard, from the host's namespace. `HTTP_PROXY`, `HTTPS_PROXY`,
//! their lower-case forms and `NO_PROXY` point the commands' tools (pip, npm, cargo, go, apt,
//! curl, wget) at it.
//!
//! Made this way, it needs no privilege: an unprivileged process may make a user namespace and,
//! in it, a network namespace, and bring its loopback up.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Where the proxy listens in the sandbox.
pub const PROXY_PORT: u16 = 3128;

/// The proxy variables a sandbox's commands get.
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let mut v: Vec<(String, String)> = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
        .iter()
        .map(|k| (k.to_string(), url.clone()))
        .collect();
    // The sandbox's own loopback (a server a command starts itself) is reached directly.
    for k in ["NO_PROXY", "no_proxy"] {
        v.push((k.to_string(), "localhost,127.0.0.1,::1".to_string()));
    }
    v
}

/// What the child needs, made before the fork (no allocation after it).
pub struct Prepared {
    /// The child's end of the socket pair the listener is sent over.
    child: OwnedFd,
    /// The parent's end.
    parent: OwnedFd,
    uid_map: CString,
    gid_map: CString,
    setgroups: CString,
    uid_map_path: CString,
    gid_map_path: CString,
    /// Whether the child binds the proxy's listener (else the namespace is all it makes: gVisor's
    /// runsc started in one of its own, so that its control socket, an abstract Unix socket, is
    /// not in the host's namespace).
    listen: bool,
}

impl Prepared {
    /// For a child that will run as `uid`/`gid` (after any setuid of its own), binding the
    /// proxy's listener when `listen`.
    pub fn new(uid: u32, gid: u32, listen: bool) -> std::io::Result<Prepared> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: socketpair with a valid array; both descriptors are owned below.
        if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fresh descriptors from socketpair.
        let (parent, child) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let c = |s: String| CString::new(s).map_err(std::io::Error::other);
        Ok(Prepared {
            child,
            parent,
            uid_map: c(format!("{uid} {uid} 1"))?,
            gid_map: c(format!("{gid} {gid} 1"))?,
            setgroups: c("deny".into())?,
            uid_map_path: c("/proc/self/uid_map".into())?,
            gid_map_path: c("/proc/self/gid_map".into())?,
            listen,
        })
    }

    /// In the child, between fork and exec: the namespaces, the loopback up, the listener bound
    /// and sent. Only async-signal-safe calls.
    ///
    /// # Safety
    /// Call only in a forked child before exec.
    pub unsafe fn in_child(&self) -> std::io::Result<()> {
        let err = std::io::Error::last_os_error;
        // A process that changed its uid (root becoming the sandbox's) is not dumpable, and its
        // /proc/self files are root's then: made its own again, so that it may write its maps.
        libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
        if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) != 0 {
            return Err(err());
        }
        let write = |path: &CString, text: &CString| -> std::io::Result<()> {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(err());
            }
            let bytes = text.as_bytes();
            let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
            libc::close(fd);
            if n != bytes.len() as isize {
                return Err(err());
            }
            Ok(())
        };
        let setgroups_path = c"/proc/self/setgroups";
        let fd = libc::open(setgroups_path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            let b = self.setgroups.as_bytes();
            libc::write(fd, b.as_ptr().cast(), b.len());
            libc::close(fd);
        }
        write(&self.uid_map_path, &self.uid_map)?;
        write(&self.gid_map_path, &self.gid_map)?;
        // The loopback up (the namespace's creator holds CAP_NET_ADMIN in it until exec).
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err(err());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        let up = libc::ioctl(s, libc::SIOCSIFFLAGS, &req);
        libc::close(s);
        if up != 0 {
            return Err(err());
        }
        if !self.listen {
            return Ok(());
        }
        let l = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if l < 0 {
            return Err(err());
        }
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_port = PROXY_PORT.to_be();
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(l, (&addr as *const libc::sockaddr_in).cast(), len) != 0 || libc::listen(l, 64) != 0 {
            return Err(err());
        }
        // The listener to the parent, as SCM_RIGHTS.
        // u64s: a cmsghdr is read and written in place, aligned.
        let mut space = [0u64; 8];
        let mut data = [0u8; 1];
        let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: 1 };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::copy_nonoverlapping(
            (&l as *const RawFd).cast::<u8>(),
            libc::CMSG_DATA(cmsg),
            std::mem::size_of::<RawFd>(),
        );
        let sent = libc::sendmsg(self.child.as_raw_fd(), &msg, 0);
        libc::close(l);
        if sent != 1 {
            return Err(err());
        }
        Ok(())
    }

    /// In the parent, once the child has been spawned: the listener it sent.
    pub fn listener(&self) -> std::io::Result<std::net::TcpListener> {
        // u64s: a cmsghdr is read and written in place, aligned.
        let mut space = [0u64; 8];
        let mut data = [0u8; 1];
        let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: 1 };
        // SAFETY: a msghdr over buffers of this frame; the descriptor read is checked below.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = space.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&space) as _;
            let tv = libc::timeval { tv_sec: 10, tv_usec: 0 };
            libc::setsockopt(
                self.parent.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
            if libc::recvmsg(self.parent.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) != 1 {
                return Err(std::io::Error::other("the sandbox's network was not made"));
            }
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            if cmsg.is_null() || (*cmsg).cmsg_level != libc::SOL_SOCKET || (*cmsg).cmsg_type != libc::SCM_RIGHTS {
                return Err(std::io::Error::other("the sandbox's network sent no listener"));
            }
            let mut fd: RawFd = -1;
            std::ptr::copy_nonoverlapping(
                libc::CMSG_DATA(cmsg),
                (&mut fd as *mut RawFd).cast::<u8>(),
                std::mem::size_of::<RawFd>(),
            );
            let l = std::net::TcpListener::from_raw_fd(fd);
            l.set_nonblocking(true)?;
            Ok(l)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child makes its namespaces and sends the listener; the parent gets it, bound there.
    #[test]
    fn a_child_sends_a_listener_bound_in_its_own_network_namespace() {
        let p =
            std::sync::Arc::new(Prepared::new(unsafe { libc::geteuid() }, unsafe { libc::getegid() }, true).unwrap());
        let c = p.clone();
        let mut cmd = std::process::Command::new("true");
        // SAFETY: in_child is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || c.in_child());
        }
        let status = cmd.status().unwrap();
        assert!(status.success(), "{status:?}");
        let l = p.listener().unwrap();
        assert_eq!(l.local_addr().unwrap().port(), PROXY_PORT);
    }
}
