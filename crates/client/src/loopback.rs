//! Whether a URL's host is this machine: the only place a bearer token may
//! travel over plaintext `http://` without the caller saying so.

use std::net::IpAddr;

/// True for `localhost` and loopback addresses (127.0.0.0/8, `::1`, and
/// `::ffff:127.x.y.z`). Any other name, even one that resolves to a
/// loopback address, is not: what it resolves to can change.
pub(crate) fn is_loopback(host: &str) -> bool {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    host.parse::<IpAddr>()
        .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// The host of `url` when the URL is plaintext (not `https://`) and does
/// not name this machine; `None` when a token may be sent to it (or the
/// URL has no scheme or does not parse, which connecting reports).
pub(crate) fn plaintext_remote(url: &str) -> Option<String> {
    if url.starts_with("https://") || !url.contains("://") {
        return None;
    }
    let uri: tonic::codegen::http::Uri = url.parse().ok()?;
    let host = uri.host()?;
    (!is_loopback(host)).then(|| host.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for host in [
            "localhost",
            "LocalHost",
            "127.0.0.1",
            "127.8.9.10",
            "::1",
            "[::1]",
            "[::ffff:127.0.0.1]",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "10.0.0.1",
            "0.0.0.0",
            "[::]",
            "jobs.internal",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "128.0.0.1",
            "[fe80::1]",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn plaintext_urls_to_other_hosts() {
        assert_eq!(
            plaintext_remote("http://jobs.internal:50051").as_deref(),
            Some("jobs.internal")
        );
        assert_eq!(
            plaintext_remote("http://10.1.2.3:50051/").as_deref(),
            Some("10.1.2.3")
        );
        assert_eq!(
            plaintext_remote("http://[2001:db8::1]:50051").as_deref(),
            Some("[2001:db8::1]")
        );
        for url in [
            "https://jobs.internal:50051",
            "jobs.internal:50051",
            "http://127.0.0.1:50051",
            "http://localhost:50051",
            "http://[::1]:50051",
        ] {
            assert_eq!(plaintext_remote(url), None, "{url}");
        }
    }
}
