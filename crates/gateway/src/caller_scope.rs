//! Who a caller is, in the two senses the gateway needs.
//!
//! [`CallerScope`] is what separates two callers' views of the legacy server.
//!
//! A legacy server answers each session according to what the session presents: the
//! credential the gateway forwards (or its static token) and, when clients authenticate, the
//! principal the gateway keys that session under. Anything the gateway keeps from one legacy
//! session and could hand to another request — warm sessions, the notifications a session
//! emits, the `InitializeResult` it answered — is therefore kept per [`CallerScope`], never
//! per something coarser.

use std::net::{IpAddr, Ipv6Addr};

/// The principal a request is served as and the credential forwarded upstream for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallerScope {
    /// The authenticated principal (`anonymous` with `[auth] mode = "none"`).
    pub principal: String,
    /// A non-secret digest of the credential sent upstream ("" when none is sent); see
    /// [`crate::auth::upstream_credentials::UpstreamCredentials::credential_key`].
    pub credential: String,
}

impl CallerScope {
    pub fn new(principal: impl Into<String>, credential: impl Into<String>) -> CallerScope {
        CallerScope {
            principal: principal.into(),
            credential: credential.into(),
        }
    }
}

/// Whom a per-caller quota counts against (parked calls, single-use entries, listen streams,
/// passed-through legacy GET streams; see [`crate::fair_share`]): the principal, or, for
/// anonymous callers, the principal and the source address. Every caller of an
/// `auth.mode = "none"` gateway is `anonymous`; a quota keyed by that alone would let one of
/// them exhaust it for everyone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller(String);

impl Caller {
    /// `anonymous`: whether the principal stands for every unauthenticated caller, who is then
    /// told apart by source: IPv6 sources by their first `ipv6_prefix` bits
    /// (`listen.ipv6_source_prefix`, see [`source_of`]).
    pub fn of(principal: &str, peer: IpAddr, anonymous: bool, ipv6_prefix: u8) -> Caller {
        if !anonymous {
            return Caller(principal.to_string());
        }
        let mut key = String::with_capacity(principal.len() + 16);
        key.push_str(principal);
        key.push('@');
        match source_of(peer, ipv6_prefix) {
            // As `Ipv4Addr` displays itself, without the formatting machinery (every anonymous
            // request makes one).
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        key.push('.');
                    }
                    if octet >= 100 {
                        key.push(char::from(b'0' + octet / 100));
                    }
                    if octet >= 10 {
                        key.push(char::from(b'0' + octet / 10 % 10));
                    }
                    key.push(char::from(b'0' + octet % 10));
                }
            }
            v6 => {
                use std::fmt::Write as _;
                let _ = write!(key, "{v6}");
            }
        }
        Caller(key)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Default `listen.ipv6_source_prefix`: one host commonly holds a whole /64.
pub const DEFAULT_IPV6_SOURCE_PREFIX: u8 = 64;

/// The unit a source address is counted in: the address itself for IPv4 (IPv4-mapped IPv6
/// included), its first `ipv6_prefix` bits (1 to 128) for IPv6.
pub fn source_of(ip: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u32::from(ipv6_prefix.clamp(1, 128));
            let mask = u128::MAX << (128 - bits);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_callers_are_told_apart_by_source_and_principals_are_not() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let of = |p: &str, s: &str, anon: bool| Caller::of(p, ip(s), anon, 64);
        assert_eq!(
            of("anonymous", "127.0.0.1", true),
            of("anonymous", "::ffff:127.0.0.1", true)
        );
        assert_ne!(
            of("anonymous", "127.0.0.1", true),
            of("anonymous", "127.0.0.2", true)
        );
        assert_eq!(
            of("anonymous", "2001:db8::1", true),
            of("anonymous", "2001:db8::2", true)
        );
        assert_eq!(
            of("iss#alice", "127.0.0.1", false),
            of("iss#alice", "10.0.0.9", false)
        );
        assert_eq!(of("iss#alice", "10.0.0.9", false).as_str(), "iss#alice");
    }

    #[test]
    fn an_anonymous_key_names_its_source_as_the_address_displays_itself() {
        for source in [
            "0.0.0.0",
            "9.99.100.0",
            "10.0.0.9",
            "100.20.3.255",
            "255.255.255.255",
            "2001:db8::",
        ] {
            let ip = source.parse::<IpAddr>().unwrap();
            assert_eq!(
                Caller::of("anonymous", ip, true, 64).as_str(),
                format!("anonymous@{source}")
            );
        }
    }

    #[test]
    fn the_ipv6_aggregation_prefix_is_the_configured_one() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let a = ip("2001:db8:0:1:aaaa::1");
        let b = ip("2001:db8:0:1:bbbb::1");
        let c = ip("2001:db8:0:2::1");
        assert_eq!(source_of(a, 64), source_of(b, 64));
        assert_ne!(source_of(a, 128), source_of(b, 128));
        assert_eq!(source_of(a, 128), a);
        assert_ne!(source_of(a, 64), source_of(c, 64));
        assert_eq!(source_of(a, 48), source_of(c, 48));
        assert_eq!(source_of(a, 48), ip("2001:db8::"));
        // IPv4 is never aggregated, mapped or not.
        assert_eq!(source_of(ip("::ffff:10.0.0.7"), 48), ip("10.0.0.7"));
    }
}
