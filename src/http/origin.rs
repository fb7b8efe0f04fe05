//! Where a request came from and where the service is: the `Origin` a browser (or an MCP
//! client) sends, against the address clients reach the service at — `SUBAGENTD_PUBLIC_URL`,
//! or the `Host` (`X-Forwarded-Host`) and scheme (`X-Forwarded-Proto`) the request came with,
//! as a proxy passes them on.

use axum::http::{header, HeaderMap};

/// `host[:port]` of a URL or a Host header, lower-cased, without the scheme's default port.
fn authority(scheme: &str, host_port: &str) -> String {
    let hp = host_port.trim().to_ascii_lowercase();
    let default = match scheme {
        "https" => ":443",
        _ => ":80",
    };
    hp.strip_suffix(default).map(str::to_string).unwrap_or(hp)
}

/// The scheme and `host[:port]` of `url` (`https://a.example.com:8443/x`).
fn split(url: &str) -> Option<(String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let host = rest.split(['/', '?', '#']).next()?;
    let scheme = scheme.to_ascii_lowercase();
    let host = authority(&scheme, host);
    (!host.is_empty()).then_some((scheme, host))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(|v| v.split(',').next().unwrap_or(v).trim())
}

/// The scheme and authority the request was sent to, as the client saw it.
fn reached(headers: &HeaderMap) -> Option<(String, String)> {
    let scheme = header_str(headers, "x-forwarded-proto").unwrap_or("http").to_ascii_lowercase();
    let host = header_str(headers, "x-forwarded-host").or_else(|| header_str(headers, header::HOST.as_str()))?;
    Some((scheme.clone(), authority(&scheme, host)))
}

/// Whether `origin` is the service's own: its public URL's when one is configured (only that:
/// a page on a rebound name sends an `Origin` that matches its own `Host`), else the address the
/// request came to.
pub fn is_own(origin: &str, headers: &HeaderMap, public_url: Option<&str>) -> bool {
    let Some((_, o)) = split(origin) else { return false };
    if let Some((_, p)) = public_url.and_then(split) {
        return p == o;
    }
    reached(headers).is_some_and(|(_, h)| h == o)
}

/// Whether the request was addressed to this machine: by a loopback name (`localhost`,
/// `127.0.0.1`, `[::1]`, any port), by a name of one label (the machine's own host name, as on
/// a LAN), or by the public URL's host. A request without a `Host` (HTTP/1.0) counts as addressed
/// here. Single-user mode answers only such requests: a web page whose name an attacker rebinds
/// to 127.0.0.1 reaches the port, but with its own (dotted, registered) name as `Host`.
pub fn addressed_locally(headers: &HeaderMap, public_url: Option<&str>) -> bool {
    let Some(host) = header_str(headers, header::HOST.as_str()) else { return true };
    let host = host.to_ascii_lowercase();
    if public_url.and_then(split).is_some_and(|(scheme, p)| p == authority(&scheme, &host)) {
        return true;
    }
    // The name without its port (an IPv6 literal keeps its brackets).
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default().to_string(),
        None => host.rsplit_once(':').map_or(host.as_str(), |(n, _)| n).to_string(),
    };
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => !name.is_empty() && (!name.contains('.') || name.ends_with(".localhost")),
    }
}

/// The base URL clients reach the service at (no trailing slash).
pub fn base_url(headers: &HeaderMap, public_url: Option<&str>) -> String {
    if let Some(p) = public_url {
        return p.trim_end_matches('/').to_string();
    }
    match reached(headers) {
        Some((scheme, host)) => format!("{scheme}://{host}"),
        None => "http://localhost".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn an_origin_is_the_services_own_when_it_is_the_public_url_or_the_host_it_reached() {
        let h = headers(&[("host", "agents.example.com")]);
        assert!(is_own("https://agents.example.com", &h, None));
        assert!(is_own("https://Agents.Example.com:443", &h, None));
        assert!(!is_own("https://evil.example.com", &h, None));
        assert!(!is_own("null", &h, None));
        let proxied = headers(&[("host", "10.0.0.5:8080"), ("x-forwarded-host", "agents.example.com")]);
        assert!(is_own("https://agents.example.com", &proxied, None));
        assert!(is_own("https://public.example.com", &h, Some("https://public.example.com/")));
        assert_eq!(
            base_url(&headers(&[("host", "a.example.com"), ("x-forwarded-proto", "https")]), None),
            "https://a.example.com"
        );
        assert_eq!(base_url(&h, Some("https://p.example.com/")), "https://p.example.com");
        // With a public URL, only its origin: a rebound name's page sends Origin == Host.
        let rebound = headers(&[("host", "evil.example.com")]);
        assert!(!is_own("http://evil.example.com", &rebound, Some("https://public.example.com")));
        assert!(is_own("http://evil.example.com", &rebound, None));
    }

    #[test]
    fn a_request_is_addressed_locally_by_a_loopback_name_or_the_public_urls_host() {
        for host in [
            "localhost:8080",
            "127.0.0.1:8080",
            "127.0.0.1",
            "[::1]:8080",
            "app.localhost:80",
            "LOCALHOST",
            "mybox:8080",
        ] {
            assert!(addressed_locally(&headers(&[("host", host)]), None), "{host}");
        }
        for host in ["evil.example.com:8080", "10.0.0.5:8080", "localhost.evil.com", "[::2]:80"] {
            assert!(!addressed_locally(&headers(&[("host", host)]), None), "{host}");
        }
        assert!(addressed_locally(&HeaderMap::new(), None));
        let public = Some("https://agents.example.com");
        assert!(addressed_locally(&headers(&[("host", "agents.example.com")]), public));
        assert!(!addressed_locally(&headers(&[("host", "other.example.com")]), public));
    }
}
