//! The SSRF guard for tool endpoints, MCP servers and webhooks: an operator allow-list of hosts
//! and CIDRs; private, loopback, link-local and other special addresses are refused unless a
//! CIDR allows them; names are resolved once and the address connected to is the one checked.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// `SUBAGENTD_TOOL_ALLOW`: comma-separated entries — `*` (any host with a public address),
/// `example.com`, `*.example.com`, `10.0.0.0/8`, `127.0.0.1/32`, `::1/128`.
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    any_public: bool,
    hosts: Vec<String>,
    nets: Vec<(IpAddr, u8)>,
    /// The setting it was read from, as refusals name it (default `SUBAGENTD_TOOL_ALLOW`).
    setting: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Denied(pub String);

impl AllowList {
    pub fn parse(spec: &str) -> Result<AllowList, String> {
        let mut a = AllowList::default();
        for e in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if e == "*" {
                a.any_public = true;
            } else if let Some((ip, bits)) = e.split_once('/') {
                let ip: IpAddr = ip.parse().map_err(|_| format!("{e:?} is not a CIDR"))?;
                let max = if ip.is_ipv4() { 32 } else { 128 };
                let bits: u8 =
                    bits.parse().ok().filter(|b| *b <= max).ok_or_else(|| format!("{e:?}: bad prefix length"))?;
                a.nets.push((ip, bits));
            } else if let Ok(ip) = e.parse::<IpAddr>() {
                a.nets.push((ip, if ip.is_ipv4() { 32 } else { 128 }));
            } else {
                a.hosts.push(e.to_ascii_lowercase());
            }
        }
        Ok(a)
    }

    /// The same list, its refusals naming `setting` (e.g. `SUBAGENTD_WEB_FETCH_ALLOW`).
    pub fn named(mut self, setting: &'static str) -> AllowList {
        self.setting = Some(setting);
        self
    }

    fn setting(&self) -> &'static str {
        self.setting.unwrap_or("SUBAGENTD_TOOL_ALLOW")
    }

    fn in_nets(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|(net, bits)| in_cidr(ip, *net, *bits))
    }

    fn host_listed(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.hosts.iter().any(|h| match h.strip_prefix("*.") {
            Some(suffix) => host.ends_with(&format!(".{suffix}")),
            None => *h == host,
        })
    }

    /// May `host` be contacted at all (before resolution)?
    pub fn check_host(&self, host: &str) -> Result<(), Denied> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return self.check_ip(host, ip);
        }
        if self.any_public || self.host_listed(bare) || !self.nets.is_empty() {
            Ok(())
        } else {
            Err(Denied(format!("host {host} is not on the allow-list ({})", self.setting())))
        }
    }

    /// May this resolved address of `host` be connected to?
    pub fn check_ip(&self, host: &str, ip: IpAddr) -> Result<(), Denied> {
        if self.in_nets(ip) {
            return Ok(());
        }
        if is_special(ip) {
            return Err(Denied(format!(
                "{host} resolves to {ip}, a private, loopback or link-local address; allow it with a CIDR in {}",
                self.setting()
            )));
        }
        let host_ok =
            host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_err() && self.host_listed(host);
        if self.any_public || host_ok {
            Ok(())
        } else {
            Err(Denied(format!("{host} ({ip}) is not on the allow-list ({})", self.setting())))
        }
    }

    /// Check a URL's scheme and host (IP literals fully; names again at connect time).
    pub fn check_url(&self, raw: &str) -> Result<url::Url, Denied> {
        let u = url::Url::parse(raw).map_err(|e| Denied(format!("{raw:?} is not a URL: {e}")))?;
        if !matches!(u.scheme(), "http" | "https") {
            return Err(Denied(format!("{raw:?}: only http and https URLs are allowed")));
        }
        if !u.username().is_empty() || u.password().is_some() {
            return Err(Denied(format!("{raw:?}: credentials in URLs are not allowed; use headers")));
        }
        let host = u.host_str().ok_or_else(|| Denied(format!("{raw:?} has no host")))?;
        self.check_host(host)?;
        Ok(u)
    }
}

fn in_cidr(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V4(_)) => a.to_ipv4_mapped().is_some_and(|v4| in_cidr(IpAddr::V4(v4), net, bits)),
        _ => false,
    }
}

/// Loopback, private, link-local, CGNAT, unspecified, multicast, documentation, ULA…
pub fn is_special(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v) => {
            let o = v.octets();
            v.is_loopback()
                || v.is_private()
                || v.is_link_local()
                || v.is_unspecified()
                || v.is_broadcast()
                || v.is_multicast()
                || v.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (64..128).contains(&o[1]))
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                || o[0] >= 240
        }
        IpAddr::V6(v) => {
            if let Some(v4) = v.to_ipv4_mapped() {
                return is_special(IpAddr::V4(v4));
            }
            let s = v.segments();
            // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address: judge that one.
            // 64:ff9b:1::/48, the local-use NAT64 prefix, leads into a local network: refused.
            if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
                return true;
            }
            if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
                let o = v.octets();
                return is_special(IpAddr::V4(std::net::Ipv4Addr::new(o[12], o[13], o[14], o[15])));
            }
            // IPv4-compatible (::a.b.c.d, deprecated): judge the IPv4 address it carries.
            if s[..6] == [0, 0, 0, 0, 0, 0] && !v.is_loopback() && !v.is_unspecified() {
                let o = v.octets();
                return is_special(IpAddr::V4(std::net::Ipv4Addr::new(o[12], o[13], o[14], o[15])));
            }
            if s[0] == 0x2002 {
                let o = v.octets();
                return is_special(IpAddr::V4(std::net::Ipv4Addr::new(o[2], o[3], o[4], o[5])));
            }
            v.is_loopback()
                || v.is_unspecified()
                || v.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0x2001 && s[1] == 0xdb8)
        }
    }
}

/// The DNS resolver of the tool client: resolves once, keeps only allowed addresses, and
/// hands those to the connector — so a name cannot be re-resolved to an internal address.
pub struct GuardedResolver {
    pub allow: Arc<AllowList>,
}

/// Why a name gave no address to connect to.
#[derive(Debug)]
pub enum Unresolved {
    /// The lookup failed.
    Lookup(std::io::Error),
    /// It gave no address.
    Nothing,
    /// Every address it gave was refused (the last refusal).
    Refused(Denied),
}

/// `host`'s addresses (with `port`) that every list in `lists` allows, in the resolver's order:
/// the one resolve-and-check of every outbound connection (the HTTP tools' resolver, the egress
/// proxy's connections).
pub async fn allowed_addrs(host: &str, port: u16, lists: &[&AllowList]) -> Result<Vec<SocketAddr>, Unresolved> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await.map_err(Unresolved::Lookup)?.collect();
    let (mut ok, mut last) = (vec![], None);
    for a in addrs {
        match lists.iter().try_for_each(|l| l.check_ip(host, a.ip())) {
            Ok(()) => ok.push(a),
            Err(e) => last = Some(e),
        }
    }
    match (ok.is_empty(), last) {
        (false, _) => Ok(ok),
        (true, Some(e)) => Err(Unresolved::Refused(e)),
        (true, None) => Err(Unresolved::Nothing),
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let e = match allowed_addrs(&host, 0, &[&allow]).await {
                Ok(ok) => return Ok(Box::new(ok.into_iter()) as reqwest::dns::Addrs),
                Err(Unresolved::Lookup(e)) => Box::new(e) as Box<dyn std::error::Error + Send + Sync>,
                Err(Unresolved::Refused(d)) => Box::new(d),
                Err(Unresolved::Nothing) => Box::new(Denied(format!("{host} did not resolve"))),
            };
            Err(e)
        })
    }
}

/// A client for outbound calls to tenant-supplied URLs: guarded DNS, no redirects, and no
/// proxy (a proxy would resolve the name itself, past the guard).
pub fn guarded_client(allow: Arc<AllowList>) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .dns_resolver(Arc::new(GuardedResolver { allow }))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| format!("cannot build the tool HTTP client: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_hosts_pass_a_star_and_private_addresses_need_a_cidr() {
        let a = AllowList::parse("*").unwrap();
        assert!(a.check_url("https://api.example.com/x").is_ok());
        assert!(a.check_url("http://127.0.0.1:8080/x").is_err());
        assert!(a.check_url("http://10.1.2.3/x").is_err());
        assert!(a.check_url("http://169.254.169.254/latest/meta-data").is_err());
        assert!(a.check_url("http://[::1]/x").is_err());
        assert!(a.check_url("http://[::ffff:127.0.0.1]/x").is_err());
        assert!(a.check_url("http://[64:ff9b::a9fe:a9fe]/x").is_err(), "NAT64 of 169.254.169.254");
        assert!(a.check_url("http://[2002:0a00:0001::1]/x").is_err(), "6to4 of 10.0.0.1");
        assert!(a.check_url("http://198.18.0.1/x").is_err(), "benchmarking range");
        assert!(a.check_url("http://[64:ff9b:1::a00:1]/x").is_err(), "local-use NAT64");
        assert!(a.check_url("http://198.19.255.1/x").is_err());
        assert!(a.check_url("http://198.20.0.1/x").is_ok());
        assert!(a.check_ip("evil.example", "192.168.1.1".parse().unwrap()).is_err());
        let b = AllowList::parse("*, 127.0.0.0/8").unwrap();
        assert!(b.check_url("http://127.0.0.1:8080/x").is_ok());
        assert!(b.check_url("http://10.0.0.1/x").is_err());
    }

    #[test]
    fn without_a_star_only_listed_hosts_pass() {
        let a = AllowList::parse("tools.example.com, *.corp.example").unwrap();
        assert!(a.check_url("https://tools.example.com/a").is_ok());
        assert!(a.check_url("https://x.corp.example/a").is_ok());
        assert!(a.check_url("https://other.example.com/a").is_err());
        assert!(a.check_ip("tools.example.com", "93.184.216.34".parse().unwrap()).is_ok());
        assert!(
            a.check_ip("tools.example.com", "10.0.0.5".parse().unwrap()).is_err(),
            "a listed name may not point inside"
        );
    }

    #[test]
    fn schemes_credentials_and_bad_entries_are_refused() {
        let a = AllowList::parse("*").unwrap();
        assert!(a.check_url("file:///etc/passwd").is_err());
        assert!(a.check_url("https://u:p@example.com/").is_err());
        assert!(AllowList::parse("10.0.0.0/99").is_err());
    }
}
