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
/// passed-through legacy GET streams): the principal, or, for anonymous callers, the principal
/// and the source address. Every caller of an `auth.mode = "none"` gateway is `anonymous`; a
/// quota keyed by that alone would let one of them exhaust it for everyone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller(String);

impl Caller {
    /// `anonymous`: whether the principal stands for every unauthenticated caller.
    pub fn of(principal: &str, peer: IpAddr, anonymous: bool) -> Caller {
        if !anonymous {
            return Caller(principal.to_string());
        }
        Caller(format!("{principal}@{}", source_of(peer)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The unit a source address is counted in: the address itself for IPv4 (IPv4-mapped IPv6
/// included), its /64 for IPv6, since one host commonly holds a whole /64.
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
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
        assert_eq!(
            Caller::of("anonymous", ip("127.0.0.1"), true),
            Caller::of("anonymous", ip("::ffff:127.0.0.1"), true)
        );
        assert_ne!(
            Caller::of("anonymous", ip("127.0.0.1"), true),
            Caller::of("anonymous", ip("127.0.0.2"), true)
        );
        assert_eq!(
            Caller::of("anonymous", ip("2001:db8::1"), true),
            Caller::of("anonymous", ip("2001:db8::2"), true)
        );
        assert_eq!(
            Caller::of("iss#alice", ip("127.0.0.1"), false),
            Caller::of("iss#alice", ip("10.0.0.9"), false)
        );
        assert_eq!(
            Caller::of("iss#alice", ip("10.0.0.9"), false).as_str(),
            "iss#alice"
        );
    }
}
