//! Host patterns of `policy.url.allow_hosts` / `deny_hosts`: `"example.com"` matches that
//! host only, `"*.example.com"` matches its subdomains at any depth (not `example.com`
//! itself). An exact pattern may also be an IP address (`"203.0.113.7"`, `"[2001:db8::1]"`).
//!
//! Patterns go through the same host parsing as the URLs they are matched against (lower
//! case, internationalised names to punycode, one trailing dot dropped), so
//! `"Bücher.Example."` and `"xn--bcher-kva.example"` are the same pattern.

use url::Host;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// This host only (a name, or an IP address in its canonical text form).
    Exact(String),
    /// Any host ending in `.<suffix>`.
    Subdomains(String),
}

/// A host name as compared: lower case, without one trailing dot.
pub fn normalize_host(host: &str) -> String {
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

impl HostPattern {
    /// Parses a pattern; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let (wildcard, rest) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        if rest.is_empty() {
            return Err("empty host".into());
        }
        if rest.contains(['*', '/', '@', '?', '#', '%', '\\'])
            || rest.chars().any(char::is_whitespace)
        {
            return Err(
                "a host pattern is a host name (\"example.com\"), \"*.\" and a host name \
                 (\"*.example.com\"), or an IP address; no scheme, port, path or other \"*\""
                    .into(),
            );
        }
        let host = Host::parse(rest).map_err(|e| format!("not a host name: {e}"))?;
        match host {
            Host::Domain(d) => {
                // `Host::parse` accepts a bare port-like tail ("a:1") as part of no name it
                // knows; refuse ports outright.
                if d.contains(':') {
                    return Err("no port: a pattern names a host only".into());
                }
                let name = normalize_host(&d);
                if name.is_empty() || name.split('.').any(str::is_empty) {
                    return Err("not a host name: empty label".into());
                }
                Ok(if wildcard {
                    HostPattern::Subdomains(name)
                } else {
                    HostPattern::Exact(name)
                })
            }
            Host::Ipv4(_) | Host::Ipv6(_) if wildcard => {
                Err("\"*.\" goes before a host name, not an IP address".into())
            }
            Host::Ipv4(ip) => Ok(HostPattern::Exact(ip.to_string())),
            Host::Ipv6(ip) => Ok(HostPattern::Exact(ip.to_string())),
        }
    }

    /// Whether `host` (normalized: see `normalize_host`; IPv6 without brackets) matches.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(name) => host == name,
            HostPattern::Subdomains(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_and_match() {
        let exact = HostPattern::parse("Auth.Example.com.").unwrap();
        assert_eq!(exact, HostPattern::Exact("auth.example.com".into()));
        assert!(exact.matches("auth.example.com"));
        assert!(!exact.matches("evil.auth.example.com"));
        assert!(!exact.matches("auth.example.com.evil"));

        let sub = HostPattern::parse("*.example.com").unwrap();
        assert!(sub.matches("a.example.com"));
        assert!(sub.matches("a.b.example.com"));
        assert!(!sub.matches("example.com"));
        assert!(!sub.matches("badexample.com"));
        assert!(!sub.matches(".example.com"));

        assert_eq!(
            HostPattern::parse("bücher.example").unwrap(),
            HostPattern::Exact("xn--bcher-kva.example".into())
        );
        assert_eq!(
            HostPattern::parse("0x7f000001").unwrap(),
            HostPattern::Exact("127.0.0.1".into())
        );
        assert_eq!(
            HostPattern::parse("[2001:DB8::1]").unwrap(),
            HostPattern::Exact("2001:db8::1".into())
        );
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in [
            "",
            "*.",
            "*",
            "**.example.com",
            "a.*.example.com",
            "https://example.com",
            "example.com/path",
            "example.com:443",
            "user@example.com",
            "exa mple.com",
            "a..b",
            "*.10.0.0.1",
            "[::1",
            "%6cocalhost",
        ] {
            assert!(
                HostPattern::parse(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
    }
}
