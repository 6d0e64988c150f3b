//! Header mode: an auth proxy in front of the gateway authenticates the user and names them in
//! a request header.
//!
//! The header is only as trustworthy as the connection it arrives on, so it is believed only
//! when the TCP peer is one of the configured proxy addresses. Any other peer is refused even
//! when it sends the header: otherwise a client that reaches the gateway directly could name
//! itself anyone.

use std::net::SocketAddr;

use http::HeaderMap;

use super::Principal;
use super::config::HeaderAuthConfig;
use super::error::AuthFailure;

pub(crate) fn authenticate(
    cfg: &HeaderAuthConfig,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<Principal, AuthFailure> {
    // A dual-stack listener reports IPv4 peers as ::ffff:a.b.c.d; compare the IPv4 form.
    let ip = peer.ip().to_canonical();
    if !cfg.trusted_sources.iter().any(|net| net.contains(&ip)) {
        return Err(AuthFailure::UntrustedSource);
    }
    let mut values = headers.get_all(&cfg.name).iter();
    let Some(value) = values.next() else {
        return Err(AuthFailure::Missing);
    };
    if values.next().is_some() {
        // Two identities for one request: refuse rather than pick one.
        return Err(AuthFailure::Malformed);
    }
    let name = std::str::from_utf8(value.as_bytes())
        .map_err(|_| AuthFailure::Malformed)?
        .trim();
    if name.is_empty() {
        return Err(AuthFailure::Missing);
    }
    let mut principal = String::with_capacity(cfg.prefix.len() + name.len());
    principal.push_str(&cfg.prefix);
    principal.push_str(name);
    Ok(Principal(principal))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    fn cfg(prefix: &str) -> HeaderAuthConfig {
        HeaderAuthConfig {
            name: HeaderName::from_static("x-authenticated-user"),
            trusted_sources: vec![
                "127.0.0.1/32".parse().unwrap(),
                "10.1.0.0/16".parse().unwrap(),
            ],
            prefix: prefix.into(),
        }
    }

    fn headers(user: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(u) = user {
            h.insert("x-authenticated-user", HeaderValue::from_str(u).unwrap());
        }
        h
    }

    fn peer(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn trusted_peer_with_header_is_the_named_principal() {
        let p = authenticate(&cfg(""), &headers(Some("alice")), peer("127.0.0.1:5000")).unwrap();
        assert_eq!(p.0, "alice");
        let p = authenticate(&cfg("proxy:"), &headers(Some("bob")), peer("10.1.2.3:1")).unwrap();
        assert_eq!(p.0, "proxy:bob");
    }

    #[test]
    fn ipv4_mapped_peer_of_a_dual_stack_listener_is_recognized() {
        let p = authenticate(
            &cfg(""),
            &headers(Some("alice")),
            peer("[::ffff:127.0.0.1]:5000"),
        );
        assert_eq!(p.unwrap().0, "alice");
    }

    #[test]
    fn untrusted_peer_is_refused_even_with_the_header() {
        for addr in ["127.0.0.2:5000", "10.2.0.1:80", "[::1]:5000"] {
            let e = authenticate(&cfg(""), &headers(Some("alice")), peer(addr)).unwrap_err();
            assert_eq!(e, AuthFailure::UntrustedSource, "{addr}");
        }
    }

    #[test]
    fn trusted_peer_without_a_usable_header_is_refused() {
        let e = authenticate(&cfg(""), &headers(None), peer("127.0.0.1:1")).unwrap_err();
        assert_eq!(e, AuthFailure::Missing);
        let e = authenticate(&cfg(""), &headers(Some("  ")), peer("127.0.0.1:1")).unwrap_err();
        assert_eq!(e, AuthFailure::Missing);
        let mut two = headers(Some("alice"));
        two.append("x-authenticated-user", HeaderValue::from_static("mallory"));
        let e = authenticate(&cfg(""), &two, peer("127.0.0.1:1")).unwrap_err();
        assert_eq!(e, AuthFailure::Malformed);
    }
}
