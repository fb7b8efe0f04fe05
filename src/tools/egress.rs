//! The egress proxy: an HTTP proxy on loopback that outbound connections of code the service
//! does not write go through, so that each one is judged by the address guard (`ssrf`) where
//! the connection is made, whatever the client did before it (its redirects, its own resolver).
//! Image pulls use it: `oci-client` builds its own HTTP client, and this proxy is how its every
//! connection — a registry's redirect to blob storage too — passes the guard.
//!
//! It speaks `CONNECT host:port` (TLS passes through it unread) and plain HTTP in absolute form
//! (`GET http://host:port/path`). A connection names one host, checked against the allow-list
//! (`AllowList::check_host`), resolved here and connected to an address that `check_ip` allows;
//! anything else is answered `403` with the guard's sentence, logged and counted
//! (`subagentd_egress_refused_total`). It listens on `127.0.0.1` and asks for a token
//! (`Proxy-Authorization: Basic`) made at its start, so that no other local process borrows it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::ssrf::AllowList;

/// The most a request's head (its line and headers) may take.
const MAX_HEAD: usize = 16 * 1024;
/// Connections one proxy serves at once (each holds two of the service's descriptors); more
/// wait in the listener's backlog.
const MAX_CONNECTIONS: usize = 64;
/// How long a client has to send its head, and the proxy to connect onwards.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a proxy lets through: hosts `allow` names (its CIDRs, addresses), each address passing
/// `guard` too where there is one (the operator's, under a tenant's list).
#[derive(Debug)]
pub struct Policy {
    pub allow: Arc<AllowList>,
    pub guard: Option<Arc<AllowList>>,
    /// Names it in logs and metrics (`image_pull`, `environment`).
    pub purpose: &'static str,
    /// Whose connections, for the refusals' count.
    pub tenant: Option<String>,
    /// The ports connections may go to (`None`: any).
    pub ports: Option<Vec<u16>>,
}

/// A running proxy (stopped when dropped).
pub struct Egress {
    addr: SocketAddr,
    token: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress").field("addr", &self.addr).finish()
    }
}

impl Egress {
    /// A proxy on a free loopback port for connections allowed by `allow`; `purpose` names it
    /// in logs and metrics (`image_pull`).
    pub async fn start(allow: Arc<AllowList>, purpose: &'static str) -> std::io::Result<Egress> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let token = uuid::Uuid::new_v4().simple().to_string();
        let expected =
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("subagentd:{token}")));
        let policy = Arc::new(Policy { allow, guard: None, purpose, tenant: None, ports: None });
        let task = tokio::spawn(accept(listener, policy, Some(expected.into())));
        Ok(Egress { addr, token, task })
    }

    /// The proxy's URL with its credentials, as HTTP clients take it (`http://user:token@host:port`).
    pub fn url(&self) -> String {
        format!("http://subagentd:{}@{}", self.token, self.addr)
    }
}

/// Serve the connections `listener` accepts under `policy` (and, with `token`, only those that
/// carry it), until the task is aborted: its connections end with it.
pub async fn accept(listener: TcpListener, policy: Arc<Policy>, token: Option<Arc<str>>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            a = listener.accept(), if conns.len() < MAX_CONNECTIONS => {
                let Ok((conn, _)) = a else {
                    // Out of descriptors, say: a pause rather than a spin.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let (policy, token) = (policy.clone(), token.clone());
                conns.spawn(async move {
                    if let Err(why) = serve(conn, &policy, token.as_deref()).await {
                        tracing::debug!(purpose = policy.purpose, error = %why, "egress connection ended");
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Headers that concern one connection, never passed on.
const HOP_BY_HOP: [&str; 5] = ["connection", "keep-alive", "te", "trailer", "upgrade"];

/// Where a request goes, read from its head.
#[derive(Debug, PartialEq)]
struct Target {
    connect: bool,
    host: String,
    port: u16,
    /// For plain HTTP: the head to send on, in origin form, without the proxy's headers.
    head: Vec<u8>,
}

/// Parse a request's head (up to and with its blank line).
fn parse(head: &[u8], expected_auth: Option<&str>) -> Result<Target, (u16, String)> {
    let text = std::str::from_utf8(head).map_err(|_| (400, "the request's head is not UTF-8".to_string()))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, target, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v), None) if v.starts_with("HTTP/1.") => (m, t, v),
        _ => return Err((400, format!("not an HTTP/1 request line: {line:?}"))),
    };
    let mut authorized = false;
    let mut headers = Vec::new();
    for h in lines.filter(|l| !l.is_empty()) {
        let Some((name, value)) = h.split_once(':') else {
            return Err((400, format!("not a header: {h:?}")));
        };
        let lower = name.trim().to_ascii_lowercase();
        if lower == "proxy-authorization" {
            authorized |= Some(value.trim()) == expected_auth;
        } else if !HOP_BY_HOP.contains(&lower.as_str()) && !lower.starts_with("proxy-") && lower != "host" {
            // The host is the request line's (a client's own Host could name another site on an
            // allowed address); hop-by-hop headers stop here.
            headers.push(h);
        }
    }
    if !authorized && expected_auth.is_some() {
        return Err((407, "this proxy asks for its credentials".to_string()));
    }
    if method == "CONNECT" {
        let (host, port) = split_host_port(target, None).ok_or((400, format!("not host:port: {target:?}")))?;
        return Ok(Target { connect: true, host, port, head: vec![] });
    }
    let url = url::Url::parse(target).map_err(|_| (400, format!("not an absolute URL: {target:?}")))?;
    if url.scheme() != "http" {
        return Err((400, format!("{:?}: plain HTTP only here; HTTPS goes by CONNECT", url.scheme())));
    }
    let host = url.host_str().ok_or((400, format!("{target:?} has no host")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let port = url.port_or_known_default().unwrap_or(80);
    let mut path = url.path().to_string();
    if let Some(q) = url.query() {
        path = format!("{path}?{q}");
    }
    let authority = match (url.port(), host.contains(':')) {
        (Some(p), true) => format!("[{host}]:{p}"),
        (Some(p), false) => format!("{host}:{p}"),
        (None, true) => format!("[{host}]"),
        (None, false) => host.clone(),
    };
    // One request a connection: what a client sends after it would reach this host whatever it
    // names, so the upstream is asked to close after its answer.
    let mut out = format!("{method} {path} {version}\r\nHost: {authority}\r\n");
    for h in headers {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok(Target { connect: false, host, port, head: out.into_bytes() })
}

/// `host:port` (with `[v6]:port`), or `host` with the default port.
fn split_host_port(s: &str, default: Option<u16>) -> Option<(String, u16)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default?,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && !h.contains(':') => Some((h.to_string(), p.parse().ok()?)),
        None if !s.is_empty() => Some((s.to_string(), default?)),
        _ => None,
    }
}

/// Why no connection was made.
#[derive(Debug)]
pub enum NotConnected {
    /// The guard said no (the sentence names the setting).
    Refused(String),
    /// The name did not resolve, or no allowed address answered.
    Failed(String),
}

/// Resolve `host` and connect to its first address the policy allows.
pub async fn connect_guarded(policy: &Policy, host: &str, port: u16) -> Result<TcpStream, NotConnected> {
    let (allow, guard) = (&policy.allow, policy.guard.as_deref());
    if policy.ports.as_ref().is_some_and(|p| !p.contains(&port)) {
        return Err(NotConnected::Refused(format!("port {port} is not one an environment's network may reach")));
    }
    allow.check_host(host).map_err(|e| NotConnected::Refused(e.0))?;
    if let Some(g) = guard {
        g.check_host(host).map_err(|e| NotConnected::Refused(e.0))?;
    }
    let lists: Vec<&AllowList> = std::iter::once(allow.as_ref()).chain(guard).collect();
    let addrs = super::ssrf::allowed_addrs(host, port, &lists).await.map_err(|e| match e {
        super::ssrf::Unresolved::Lookup(e) => NotConnected::Failed(format!("{host} did not resolve: {e}")),
        super::ssrf::Unresolved::Nothing => NotConnected::Failed(format!("{host} did not resolve")),
        super::ssrf::Unresolved::Refused(d) => NotConnected::Refused(d.0),
    })?;
    let mut last = NotConnected::Failed(format!("{host} did not resolve"));
    for a in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = NotConnected::Failed(format!("{host} ({a}): {e}")),
            Err(_) => {
                last = NotConnected::Failed(format!("{host} ({a}): no answer in {} s", CONNECT_TIMEOUT.as_secs()))
            }
        }
    }
    Err(last)
}

async fn answer(conn: &mut TcpStream, status: u16, why: &str) {
    let reason = match status {
        403 => "Forbidden",
        407 => "Proxy Authentication Required",
        502 => "Bad Gateway",
        _ => "Bad Request",
    };
    let auth = if status == 407 { "Proxy-Authenticate: Basic realm=\"subagentd\"\r\n" } else { "" };
    let body = format!("{why}\n");
    let msg = format!(
        "HTTP/1.1 {status} {reason}\r\n{auth}Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(msg.as_bytes()).await;
}

async fn serve(mut conn: TcpStream, policy: &Policy, expected_auth: Option<&str>) -> Result<(), String> {
    let purpose = policy.purpose;
    let mut buf = Vec::with_capacity(1024);
    let end = tokio::time::timeout(HEAD_TIMEOUT, async {
        let mut chunk = [0u8; 2048];
        loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                return Ok(i + 4);
            }
            if buf.len() > MAX_HEAD {
                return Err("a head over 16 KiB".to_string());
            }
            let n = conn.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("closed before its head ended".to_string());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .map_err(|_| "no head in time".to_string())??;
    let target = match parse(&buf[..end], expected_auth) {
        Ok(t) => t,
        Err((status, why)) => {
            answer(&mut conn, status, &why).await;
            return Err(why);
        }
    };
    let mut upstream = match connect_guarded(policy, &target.host, target.port).await {
        Ok(s) => s,
        Err(NotConnected::Refused(why)) => {
            let tenant = policy.tenant.clone().unwrap_or_default();
            metrics::counter!("subagentd_egress_refused_total", "purpose" => purpose, "tenant" => tenant.clone())
                .increment(1);
            tracing::info!(purpose, tenant, host = %target.host, port = target.port, reason = %why, "egress refused");
            answer(&mut conn, 403, &why).await;
            return Err(why);
        }
        Err(NotConnected::Failed(why)) => {
            answer(&mut conn, 502, &why).await;
            return Err(why);
        }
    };
    if target.connect {
        conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.map_err(|e| e.to_string())?;
    } else {
        upstream.write_all(&target.head).await.map_err(|e| e.to_string())?;
    }
    // What the client sent past its head (the start of its body, or of its TLS) goes on.
    upstream.write_all(&buf[end..]).await.map_err(|e| e.to_string())?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await.map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_read_strictly_and_the_proxys_own_headers_go_no_further() {
        let auth = Some("Basic x");
        let t =
            parse(b"CONNECT registry.example:443 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic x\r\n\r\n", auth)
                .unwrap();
        assert_eq!((t.connect, t.host.as_str(), t.port), (true, "registry.example", 443));
        let t = parse(
            b"GET http://[::1]:5000/v2/?a=1 HTTP/1.1\r\nHost: [::1]:5000\r\nProxy-Authorization: Basic x\r\nProxy-Connection: keep-alive\r\n\r\n",
            auth,
        )
        .unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 5000));
        assert_eq!(
            String::from_utf8(t.head).unwrap(),
            "GET /v2/?a=1 HTTP/1.1\r\nHost: [::1]:5000\r\nConnection: close\r\n\r\n"
        );
        // A client's own Host (another site on the allowed address) and its hop-by-hop headers
        // go no further: the request line's host does.
        let t = parse(
            b"GET http://allowed.example/x HTTP/1.1\r\nHost: other.site\r\nConnection: keep-alive\r\nUpgrade: h2c\r\nX-Kept: 1\r\nProxy-Authorization: Basic x\r\n\r\n",
            auth,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(t.head).unwrap(),
            "GET /x HTTP/1.1\r\nHost: allowed.example\r\nX-Kept: 1\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(parse(b"CONNECT a:1 HTTP/1.1\r\n\r\n", auth).unwrap_err().0, 407);
        assert_eq!(parse(b"CONNECT a:1 HTTP/1.1\r\nProxy-Authorization: Basic y\r\n\r\n", auth).unwrap_err().0, 407);
        let bad = |h: &[u8]| parse(h, auth).unwrap_err().0;
        assert_eq!(bad(b"GET https://a/ HTTP/1.1\r\nProxy-Authorization: Basic x\r\n\r\n"), 400);
        assert_eq!(bad(b"GET /relative HTTP/1.1\r\nProxy-Authorization: Basic x\r\n\r\n"), 400);
        assert_eq!(bad(b"CONNECT a HTTP/1.1\r\nProxy-Authorization: Basic x\r\n\r\n"), 400);
        assert_eq!(bad(b"GARBAGE\r\n\r\n"), 400);
    }

    /// A listener on `ip` that answers every connection with `hello from {ip}` and closes.
    async fn hello(ip: &str) -> u16 {
        let l = TcpListener::bind((ip, 0)).await.unwrap();
        let port = l.local_addr().unwrap().port();
        let ip = ip.to_string();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                let mut b = [0u8; 1024];
                let _ = c.read(&mut b).await;
                let body = format!("hello from {ip}");
                let msg =
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                let _ = c.write_all(msg.as_bytes()).await;
            }
        });
        port
    }

    #[tokio::test]
    async fn an_allowed_host_is_reached_and_another_is_refused_with_the_guards_sentence() {
        let allowed = hello("127.0.0.1").await;
        let other = hello("127.0.0.2").await;
        let proxy = Egress::start(Arc::new(AllowList::parse("127.0.0.1/32").unwrap()), "test").await.unwrap();
        let client = reqwest::Client::builder().proxy(reqwest::Proxy::all(proxy.url()).unwrap()).build().unwrap();
        let r = client.get(format!("http://127.0.0.1:{allowed}/x")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), "hello from 127.0.0.1");
        let r = client.get(format!("http://127.0.0.2:{other}/x")).send().await.unwrap();
        assert_eq!(r.status(), 403);
        assert!(r.text().await.unwrap().contains("loopback"), "the guard's sentence");
        // CONNECT too (an https URL goes by CONNECT; the refusal comes before any TLS).
        let e = client.get(format!("https://127.0.0.2:{other}/x")).send().await.unwrap_err();
        assert!(format!("{e:?}").contains("403") || e.is_connect(), "{e:?}");
        // Without the token: 407, and nothing reached.
        let bare = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(format!("http://{}", proxy.addr)).unwrap())
            .build()
            .unwrap();
        assert_eq!(bare.get(format!("http://127.0.0.1:{allowed}/x")).send().await.unwrap().status(), 407);

        // A policy of ports: another port of an allowed host is refused.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let allow = Arc::new(AllowList::parse("127.0.0.1/32").unwrap());
        let policy = Policy { allow, guard: None, purpose: "test", tenant: None, ports: Some(vec![allowed + 1]) };
        let _serving = tokio::spawn(accept(l, Arc::new(policy), None));
        let ported =
            reqwest::Client::builder().proxy(reqwest::Proxy::all(format!("http://{addr}")).unwrap()).build().unwrap();
        let r = ported.get(format!("http://127.0.0.1:{allowed}/x")).send().await.unwrap();
        assert_eq!(r.status(), 403);
        assert!(r.text().await.unwrap().contains(&format!("port {allowed}")));
    }
}
