//! Which URLs a client may be asked to open (URL-mode elicitation).
//!
//! A pure classifier: [`check`] reads the URL the way a browser does (the WHATWG URL parser
//! of the `url` crate) and says whether it passes the policy, or why not. Nothing is resolved
//! or fetched: the client opens the URL, and a public name can point anywhere in DNS, so the
//! checks below only stop what is recognisably unsafe *in the URL itself*; an allow-list of
//! hosts is the control that holds against DNS.
//!
//! In order, a URL is refused when it:
//! 1. is longer than `max_length` bytes, or contains a control character (C0, DEL, C1) or a
//!    Unicode format character (`Cf`: bidi controls, zero-width characters, soft hyphen,
//!    tags) anywhere, or leading/trailing whitespace (a browser
//!    strips or ignores some of these, so what the user reads is not what opens);
//! 2. does not parse, or has no host;
//! 3. is not `https` (`http` only with `allow_http`);
//! 4. carries userinfo (`https://user:pass@host/`: credentials, or a host-spoofing prefix);
//! 5. writes its host with percent-escapes (`https://%6c%6f%63%61%6c%68%6f%73%74/`): no real
//!    URL needs them and clients disagree on decoding them;
//! 6. names `localhost` or a `*.localhost` host (any case, with or without a trailing dot);
//! 7. is an IP literal outside public unicast space: IPv4 in any form a browser accepts
//!    (`2130706433`, `0x7f000001`, `0177.0.0.1`, `127.1` all parse to 127.0.0.1), IPv6, and
//!    IPv6 forms that embed an IPv4 address (mapped `::ffff:a.b.c.d`, NAT64 `64:ff9b::/96`,
//!    6to4 `2002::/16`), which are judged by that address; the IPv6 special-use blocks that
//!    no public web server lives in (Teredo, benchmarking, ORCHID, both documentation
//!    prefixes, SRv6 segment identifiers) are refused with the private ranges;
//! 8. matches `deny_hosts`; or is a single-label name (`https://router/`) or a name under
//!    `.internal`, `.local`, `.svc`, `.cluster.local` or `.home.arpa`
//!    (`metadata.google.internal`, `kubernetes.default.svc`) that `allow_hosts` does not
//!    list: such names lead into the client's own network (an explicit allow wins, a deny
//!    still beats it); or `allow_hosts` is non-empty and the host matches none of it;
//! 9. reads differently to a plain RFC 3986 parser (Python's `urllib` and `httpx`, curl, most
//!    HTTP libraries) than to the WHATWG parser: the scheme, host or port found in the text as
//!    written must be the ones the WHATWG parser judged. `https://a.example\@127.0.0.1/` is
//!    host `a.example` to a browser (a backslash ends the authority) but host `127.0.0.1` to
//!    `httpx` (everything before the `@` is userinfo); it is refused (`url_parser_mismatch`).
//!
//! A URL that passes is shown to the client as the WHATWG parser serialises it ([`Judged::
//! shown`]), never as the legacy server wrote it, so the client opens the URL that was judged
//! even where the two texts differ in ways the checks above let through (a backslash in the
//! path, an IPv4 address written as one number, a host in Unicode).
//!
//! Host names are compared in the form the parser yields: lower case, internationalised
//! names in their ASCII (punycode) form, one trailing dot ignored. A look-alike name in
//! another script therefore never matches an ASCII allow-list entry.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use url::{Host, Url};

use super::host_pattern::{HostPattern, normalize_host};

/// The URL section of the policy, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlPolicy {
    /// Non-empty: only hosts matching one of these pass.
    pub allow_hosts: Vec<HostPattern>,
    /// Hosts that never pass.
    pub deny_hosts: Vec<HostPattern>,
    /// Whether plain `http` URLs pass.
    pub allow_http: bool,
    /// Longest URL accepted, bytes.
    pub max_length: usize,
    /// Whether URLs written in a question's text and in legacy error data are judged too.
    pub review_text: bool,
}

impl Default for UrlPolicy {
    fn default() -> Self {
        UrlPolicy {
            allow_hosts: Vec::new(),
            deny_hosts: Vec::new(),
            allow_http: false,
            max_length: 2048,
            review_text: true,
        }
    }
}

/// Why a URL was refused; `reason()` is the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlRefusal {
    TooLong,
    ControlCharacters,
    Invalid,
    Scheme,
    Userinfo,
    EncodedHost,
    Localhost,
    NonPublicAddress(&'static str),
    HostDenied,
    InternalName,
    HostNotAllowed,
    ParserMismatch,
}

impl UrlRefusal {
    /// One refusal of each reason.
    pub const ALL: &'static [UrlRefusal] = &[
        UrlRefusal::TooLong,
        UrlRefusal::ControlCharacters,
        UrlRefusal::Invalid,
        UrlRefusal::Scheme,
        UrlRefusal::Userinfo,
        UrlRefusal::EncodedHost,
        UrlRefusal::Localhost,
        UrlRefusal::NonPublicAddress("loopback"),
        UrlRefusal::HostDenied,
        UrlRefusal::InternalName,
        UrlRefusal::HostNotAllowed,
        UrlRefusal::ParserMismatch,
    ];

    pub fn reason(self) -> &'static str {
        match self {
            UrlRefusal::TooLong => "url_too_long",
            UrlRefusal::ControlCharacters => "url_control_characters",
            UrlRefusal::Invalid => "url_invalid",
            UrlRefusal::Scheme => "url_scheme",
            UrlRefusal::Userinfo => "url_userinfo",
            UrlRefusal::EncodedHost => "url_encoded_host",
            UrlRefusal::Localhost => "url_localhost",
            UrlRefusal::NonPublicAddress(_) => "url_non_public_address",
            UrlRefusal::HostDenied => "url_host_denied",
            UrlRefusal::InternalName => "url_internal_name",
            UrlRefusal::HostNotAllowed => "url_host_not_allowed",
            UrlRefusal::ParserMismatch => "url_parser_mismatch",
        }
    }

    /// A sentence for operators (logs), naming the rule that refused the URL.
    pub fn describe(self, policy: &UrlPolicy) -> String {
        match self {
            UrlRefusal::TooLong => format!(
                "the URL is longer than policy.url.max_length ({} bytes)",
                policy.max_length
            ),
            UrlRefusal::ControlCharacters => {
                "the URL contains control, invisible format (incl. bidi) or surrounding \
                 whitespace characters"
                    .into()
            }
            UrlRefusal::Invalid => "the URL does not parse or has no host".into(),
            UrlRefusal::Scheme if policy.allow_http => "only http and https URLs pass".into(),
            UrlRefusal::Scheme => {
                "only https URLs pass (http needs policy.url.allow_http = true)".into()
            }
            UrlRefusal::Userinfo => "the URL carries a user name or password".into(),
            UrlRefusal::EncodedHost => "the URL's host is written with percent-escapes".into(),
            UrlRefusal::Localhost => "the URL names localhost".into(),
            UrlRefusal::NonPublicAddress(range) => {
                format!("the URL's host is an IP address in a non-public range ({range})")
            }
            UrlRefusal::HostDenied => "the host matches policy.url.deny_hosts".into(),
            UrlRefusal::InternalName => {
                "the host is a single-label or internal name (.internal, .local, .svc, \
                 .home.arpa, ...); list it in policy.url.allow_hosts to let it through"
                    .into()
            }
            UrlRefusal::HostNotAllowed => "the host is not in policy.url.allow_hosts".into(),
            UrlRefusal::ParserMismatch => {
                "the URL's scheme, host or port reads differently to other URL parsers \
                 (a backslash, an '@' or an escape in the authority)"
                    .into()
            }
        }
    }
}

/// What of a URL may be logged: its scheme and host, never its path or query (they can carry
/// tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlOrigin {
    pub scheme: String,
    pub host: String,
}

/// A refused URL, with its scheme and host when it parsed far enough to have them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub refusal: UrlRefusal,
    pub origin: Option<UrlOrigin>,
}

/// A URL that passed: what may be logged of it, and the text to show the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    pub origin: UrlOrigin,
    /// The WHATWG serialisation of the URL that was judged.
    pub shown: String,
}

/// Checks `raw` against `policy`; on success returns what may be logged of it.
pub fn check(raw: &str, policy: &UrlPolicy) -> Result<UrlOrigin, Refused> {
    judge(raw, policy).map(|j| j.origin)
}

/// Checks `raw` against `policy`; on success returns what may be logged of it and the
/// normalised text the client is to be shown.
pub fn judge(raw: &str, policy: &UrlPolicy) -> Result<Judged, Refused> {
    let refuse = |refusal, origin| Err(Refused { refusal, origin });
    if raw.len() > policy.max_length {
        return refuse(UrlRefusal::TooLong, None);
    }
    if raw.chars().any(is_deceptive_char) || raw.trim() != raw {
        return refuse(UrlRefusal::ControlCharacters, None);
    }
    let Ok(url) = Url::parse(raw) else {
        return refuse(UrlRefusal::Invalid, None);
    };
    let origin = UrlOrigin {
        scheme: url.scheme().to_string(),
        host: url.host_str().unwrap_or_default().to_string(),
    };
    let scheme_ok = match url.scheme() {
        "https" => true,
        "http" => policy.allow_http,
        _ => false,
    };
    if !scheme_ok {
        return refuse(UrlRefusal::Scheme, Some(origin));
    }
    let Some(host) = url.host() else {
        return refuse(UrlRefusal::Invalid, Some(origin));
    };
    if !url.username().is_empty() || url.password().is_some() {
        return refuse(UrlRefusal::Userinfo, Some(origin));
    }
    if raw_authority(raw).contains('%') {
        return refuse(UrlRefusal::EncodedHost, Some(origin));
    }
    let mut internal = false;
    let name = match host {
        Host::Domain(d) => {
            let name = normalize_host(d);
            if name == "localhost" || name.ends_with(".localhost") {
                return refuse(UrlRefusal::Localhost, Some(origin));
            }
            internal = is_internal_name(&name);
            name
        }
        Host::Ipv4(ip) => {
            if let Some(range) = non_public(IpAddr::V4(ip)) {
                return refuse(UrlRefusal::NonPublicAddress(range), Some(origin));
            }
            ip.to_string()
        }
        Host::Ipv6(ip) => {
            if let Some(range) = non_public(IpAddr::V6(ip)) {
                return refuse(UrlRefusal::NonPublicAddress(range), Some(origin));
            }
            ip.to_string()
        }
    };
    if policy.deny_hosts.iter().any(|p| p.matches(&name)) {
        return refuse(UrlRefusal::HostDenied, Some(origin));
    }
    let listed = policy.allow_hosts.iter().any(|p| p.matches(&name));
    if internal && !listed {
        return refuse(UrlRefusal::InternalName, Some(origin));
    }
    if !policy.allow_hosts.is_empty() && !listed {
        return refuse(UrlRefusal::HostNotAllowed, Some(origin));
    }
    if !plain_reading_agrees(raw, &url) {
        return refuse(UrlRefusal::ParserMismatch, Some(origin));
    }
    Ok(Judged {
        origin,
        shown: url.as_str().to_string(),
    })
}

/// Whether a plain RFC 3986 reading of `raw` — `scheme://authority` with the authority ending
/// at the first `/`, `?` or `#`, userinfo up to the last `@`, the port after the last `:` —
/// finds the scheme, host and port the WHATWG parser found in `url`. The host as written is
/// put through the WHATWG host parser before comparing, so spellings that mean the same host
/// to everyone (case, a trailing dot, an IPv4 address as one number, Unicode) agree.
fn plain_reading_agrees(raw: &str, url: &Url) -> bool {
    let Some((scheme, rest)) = raw.split_once("://") else {
        // `https:host` and `https:/host` are host URLs to WHATWG, hostless to RFC 3986.
        return false;
    };
    if !scheme.eq_ignore_ascii_case(url.scheme()) {
        return false;
    }
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    // A backslash, a second `@` or an escape in the authority is read differently by
    // different parsers; WHATWG-only spellings have no place in a URL shown to a client.
    if authority.contains(['\\', '@', '%']) {
        return false;
    }
    let (host, port) = if let Some(v6_end) = authority.strip_prefix('[').and_then(|a| a.find(']')) {
        let after = &authority[v6_end + 2..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return false,
        };
        (&authority[..v6_end + 2], port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port_agrees = match port {
        None | Some("") => url.port().is_none(),
        Some(p) => {
            p.bytes().all(|b| b.is_ascii_digit())
                && p.parse::<u16>().ok() == url.port_or_known_default()
        }
    };
    if !port_agrees {
        return false;
    }
    let Ok(parsed) = Host::parse(host) else {
        return false;
    };
    let judged = url.host().map(|h| h.to_owned());
    match (parsed, judged) {
        (Host::Domain(a), Some(Host::Domain(b))) => normalize_host(&a) == normalize_host(&b),
        (a, Some(b)) => a == b,
        (_, None) => false,
    }
}

/// Name suffixes that only resolve inside a site, a cluster or a home network (and the
/// zones themselves). `localhost` is refused earlier under its own reason.
const INTERNAL_SUFFIXES: &[&str] = &[
    "internal",
    "local",
    "localhost",
    "svc",
    "cluster.local",
    "home.arpa",
];

/// Whether `name` (normalised) is a single label (`router`) or sits under one of
/// [`INTERNAL_SUFFIXES`] (`metadata.google.internal`, `kubernetes.default.svc`): names that
/// point into the client's own network, whatever public DNS says.
fn is_internal_name(name: &str) -> bool {
    !name.contains('.')
        || INTERNAL_SUFFIXES.iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|head| head.is_empty() || head.ends_with('.'))
        })
}

/// Control characters (C0, DEL, C1: general category `Cc`) and format characters (`Cf`),
/// which include every bidirectional control (marks, embeddings, overrides, isolates, the
/// Arabic letter mark U+061C) and the invisible ones (zero-width space and joiners, soft
/// hyphen, word joiner, BOM, tag characters). None belongs in a URL a person reads before
/// opening it.
fn is_deceptive_char(c: char) -> bool {
    c.is_control() || is_format_char(c)
}

/// Every code point of general category `Cf` (format), as of Unicode 16.0, as inclusive
/// ranges in ascending order. The standard library has no query for it (`char::is_control`
/// is `Cc` only), and the list is short and rarely changes, so it is kept here rather than
/// in a dependency; the test `format_table_is_sorted_and_complete` checks its shape.
const FORMAT_CHARS: &[(char, char)] = &[
    ('\u{00AD}', '\u{00AD}'),   // soft hyphen
    ('\u{0600}', '\u{0605}'),   // Arabic number signs
    ('\u{061C}', '\u{061C}'),   // Arabic letter mark (bidi)
    ('\u{06DD}', '\u{06DD}'),   // Arabic end of ayah
    ('\u{070F}', '\u{070F}'),   // Syriac abbreviation mark
    ('\u{0890}', '\u{0891}'),   // Arabic pound / piastre mark above
    ('\u{08E2}', '\u{08E2}'),   // Arabic disputed end of ayah
    ('\u{180E}', '\u{180E}'),   // Mongolian vowel separator
    ('\u{200B}', '\u{200F}'),   // zero-width space, ZWNJ, ZWJ, LRM, RLM
    ('\u{202A}', '\u{202E}'),   // bidi embeddings and overrides
    ('\u{2060}', '\u{2064}'),   // word joiner, invisible operators
    ('\u{2066}', '\u{206F}'),   // bidi isolates, deprecated format controls
    ('\u{FEFF}', '\u{FEFF}'),   // zero-width no-break space (BOM)
    ('\u{FFF9}', '\u{FFFB}'),   // interlinear annotation controls
    ('\u{110BD}', '\u{110BD}'), // Kaithi number sign
    ('\u{110CD}', '\u{110CD}'), // Kaithi number sign above
    ('\u{13430}', '\u{1343F}'), // Egyptian hieroglyph format controls
    ('\u{1BCA0}', '\u{1BCA3}'), // shorthand format controls
    ('\u{1D173}', '\u{1D17A}'), // musical symbol format controls
    ('\u{E0001}', '\u{E0001}'), // language tag
    ('\u{E0020}', '\u{E007F}'), // tag characters
];

/// Whether `c` is of general category `Cf`.
fn is_format_char(c: char) -> bool {
    FORMAT_CHARS
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// The host (and port) as written: between `scheme://` (and any userinfo) and the path.
fn raw_authority(raw: &str) -> &str {
    let Some((_, rest)) = raw.split_once("://") else {
        return "";
    };
    let end = rest.find(['/', '?', '#', '\\']).unwrap_or(rest.len());
    let authority = &rest[..end];
    authority.rsplit_once('@').map_or(authority, |(_, h)| h)
}

const V4_RANGES: &[(&str, &str)] = &[
    ("0.0.0.0/8", "this network / unspecified"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared address space (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved / broadcast"),
];

const V6_RANGES: &[(&str, &str)] = &[
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("::ffff:0:0:0/96", "IPv4-translated (SIIT)"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("2001::/32", "Teredo tunnelling"),
    ("2001:2::/48", "benchmarking"),
    ("2001:10::/28", "ORCHID (deprecated)"),
    ("2001:20::/28", "ORCHIDv2 identifiers"),
    ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "SRv6 segment identifiers"),
    ("fc00::/7", "unique local (ULA)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
];

/// The non-public range `ip` falls in, if any. IPv6 addresses that carry an IPv4 address
/// (mapped, NAT64, 6to4) are judged by that address.
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => V4_RANGES.iter().find_map(|(net, name)| {
            let net: Ipv4Net = net.parse().expect("valid IPv4 range");
            net.contains(&v4).then_some(*name)
        }),
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return non_public(IpAddr::V4(v4));
            }
            V6_RANGES.iter().find_map(|(net, name)| {
                let net: Ipv6Net = net.parse().expect("valid IPv6 range");
                net.contains(&v6).then_some(*name)
            })
        }
    }
}

/// The IPv4 address inside an IPv4-mapped (`::ffff:0:0/96`), NAT64 (`64:ff9b::/96`) or
/// 6to4 (`2002::/16`) address.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff {
        return Some(tail);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> UrlPolicy {
        UrlPolicy::default()
    }

    /// Checks every `(url, reason)` row and reports all the rows that disagree at once.
    fn check_table(p: &UrlPolicy, table: &[(&str, &str)]) {
        let mut wrong = Vec::new();
        for (url, want) in table {
            let got = reason(url, p);
            if got != *want {
                wrong.push(format!("{url:?}: want {want}, got {got}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    fn reason(url: &str, p: &UrlPolicy) -> &'static str {
        match check(url, p) {
            Ok(_) => "pass",
            Err(r) => r.refusal.reason(),
        }
    }

    #[test]
    fn default_policy_table() {
        let p = policy();
        let table: &[(&str, &str)] = &[
            // Good URLs, including public IP literals in every family and form.
            ("https://auth.example.com/authorize?state=abc", "pass"),
            ("https://AUTH.Example.COM./x", "pass"),
            ("https://auth.example.com:8443/x", "pass"),
            ("https://93.184.216.34/", "pass"),
            ("https://1572395042/", "pass"), // 93.184.216.34 as one decimal number
            ("https://[2606:4700:4700::1111]/", "pass"),
            ("https://[::ffff:8.8.8.8]/", "pass"),
            ("https://[64:ff9b::808:808]/", "pass"),
            ("https://xn--bcher-kva.example/", "pass"),
            ("https://bücher.example/", "pass"),
            // Schemes.
            ("javascript:alert(document.cookie)", "url_scheme"),
            ("JavaScript://%0aalert(1)", "url_scheme"),
            ("file:///etc/passwd", "url_scheme"),
            ("file://server/share", "url_scheme"),
            ("data:text/html,<script>alert(1)</script>", "url_scheme"),
            ("http://auth.example.com/", "url_scheme"),
            ("ftp://example.com/", "url_scheme"),
            ("ws://example.com/", "url_scheme"),
            // Userinfo.
            ("https://user:pass@example.com/", "url_userinfo"),
            ("https://user@example.com/", "url_userinfo"),
            ("https://:pass@example.com/", "url_userinfo"),
            ("https://example.com@evil.example/", "url_userinfo"),
            // Control characters, bidi controls, surrounding whitespace, length.
            ("https://exa\tmple.com/", "url_control_characters"),
            ("https://example.com/\n", "url_control_characters"),
            (" https://example.com/", "url_control_characters"),
            ("https://example.com/\u{7f}", "url_control_characters"),
            ("https://example.com/\u{85}", "url_control_characters"),
            (
                "https://example.com/\u{202e}gpj.exe",
                "url_control_characters",
            ),
            ("https://example.com/\0", "url_control_characters"),
            // Unparseable or hostless.
            ("not a url", "url_invalid"),
            ("https://", "url_invalid"),
            ("https://[::1/", "url_invalid"),
            ("https://1.2.3.4.5/", "url_invalid"),
            // Percent-encoded hosts.
            ("https://%6c%6f%63%61%6c%68%6f%73%74/", "url_encoded_host"),
            ("https://exa%6dple.com/", "url_encoded_host"),
            // localhost.
            ("https://localhost:8443/", "url_localhost"),
            ("https://LOCALHOST/", "url_localhost"),
            ("https://localhost./", "url_localhost"),
            ("https://app.localhost/", "url_localhost"),
            ("https://App.LocalHost./", "url_localhost"),
            // IPv4 in every form a browser accepts.
            ("https://127.0.0.1/admin", "url_non_public_address"),
            ("https://127.0.0.1./", "url_non_public_address"),
            ("https://2130706433/", "url_non_public_address"),
            ("https://0x7f000001/", "url_non_public_address"),
            ("https://0X7F.0.0.1/", "url_non_public_address"),
            ("https://0177.0.0.1/", "url_non_public_address"),
            ("https://0177.1/", "url_non_public_address"),
            ("https://127.1/", "url_non_public_address"),
            ("https://127.0.1/", "url_non_public_address"),
            (
                "https://169.254.169.254/latest/meta-data/",
                "url_non_public_address",
            ),
            ("https://10.1.2.3/", "url_non_public_address"),
            ("https://172.16.0.1/", "url_non_public_address"),
            ("https://172.31.255.255/", "url_non_public_address"),
            ("https://192.168.1.1/", "url_non_public_address"),
            ("https://100.64.0.1/", "url_non_public_address"),
            ("https://100.127.255.255/", "url_non_public_address"),
            ("https://0.0.0.0/", "url_non_public_address"),
            ("https://0/", "url_non_public_address"),
            ("https://224.0.0.1/", "url_non_public_address"),
            ("https://239.255.255.250/", "url_non_public_address"),
            ("https://255.255.255.255/", "url_non_public_address"),
            ("https://198.18.0.1/", "url_non_public_address"),
            ("https://192.0.2.1/", "url_non_public_address"),
            // Just outside the ranges: public.
            ("https://172.32.0.1/", "pass"),
            ("https://100.128.0.1/", "pass"),
            ("https://169.255.0.1/", "pass"),
            ("https://11.0.0.1/", "pass"),
            ("https://223.255.255.255/", "pass"),
            // IPv6.
            ("https://[::1]/", "url_non_public_address"),
            ("https://[0:0:0:0:0:0:0:1]/", "url_non_public_address"),
            ("https://[::]/", "url_non_public_address"),
            ("https://[fc00::1]/", "url_non_public_address"),
            ("https://[fd12:3456:789a::1]/", "url_non_public_address"),
            ("https://[fe80::1]/", "url_non_public_address"),
            ("https://[FEBF::1]/", "url_non_public_address"),
            ("https://[fec0::1]/", "url_non_public_address"),
            ("https://[ff02::1]/", "url_non_public_address"),
            ("https://[2001:db8::1]/", "url_non_public_address"),
            ("https://[::ffff:127.0.0.1]/", "url_non_public_address"),
            ("https://[::ffff:7f00:1]/", "url_non_public_address"),
            (
                "https://[::ffff:169.254.169.254]/",
                "url_non_public_address",
            ),
            ("https://[::ffff:a00:1]/", "url_non_public_address"),
            ("https://[::127.0.0.1]/", "url_non_public_address"),
            ("https://[64:ff9b::7f00:1]/", "url_non_public_address"),
            ("https://[64:ff9b::a9fe:a9fe]/", "url_non_public_address"),
            ("https://[2002:7f00:1::1]/", "url_non_public_address"),
            ("https://[2002:c0a8:101::1]/", "url_non_public_address"),
            ("https://[2002:808:808::1]/", "pass"),
            ("https://[fbff::1]/", "pass"),
            // Texts other parsers read with another scheme, host or port.
            (
                "https://auth.example.com\\@127.0.0.1:8443/steal",
                "url_parser_mismatch",
            ),
            ("https://example.com\\@evil.example/", "url_parser_mismatch"),
            ("https://example.com\\.evil.example/", "url_parser_mismatch"),
            ("https:example.com/", "url_parser_mismatch"),
            ("https:/example.com/", "url_parser_mismatch"),
            ("https:\\\\example.com/", "url_parser_mismatch"),
            ("https:///example.com/", "url_parser_mismatch"),
            ("https://example.com:0x1bb/", "url_invalid"),
            // Spellings every parser agrees on.
            ("https://example.com:443/", "pass"),
            ("https://example.com:/", "pass"),
            ("https://example.com:08443/", "pass"),
            ("https://example.com/a\\b", "pass"),
            ("https://[2606:4700:4700::1111]:8443/", "pass"),
            ("HTTPS://Example.com/", "pass"),
        ];
        check_table(&p, table);
    }

    /// IPv6 special-use blocks beyond loopback/ULA/link-local: each is refused, and the
    /// address just outside it passes.
    #[test]
    fn ipv6_special_use_ranges() {
        let table: &[(&str, &str)] = &[
            // IPv4-mapped (::ffff:0:0/96): judged by the IPv4 address it carries.
            ("https://[::ffff:0:0]/", "url_non_public_address"),
            ("https://[::ffff:c0a8:101]/", "url_non_public_address"),
            ("https://[::ffff:192.0.2.1]/", "url_non_public_address"),
            ("https://[::ffff:5db8:d822]/", "pass"),
            // IPv4-translated (::ffff:0:0:0/96, one group further left): only meaningful
            // inside a translator, refused whatever address it carries.
            ("https://[::ffff:0:7f00:1]/", "url_non_public_address"),
            ("https://[::ffff:0:5db8:d822]/", "url_non_public_address"),
            ("https://[::1:ffff:0:5db8:d822]/", "pass"),
            // Teredo 2001::/32.
            ("https://[2001::1]/", "url_non_public_address"),
            (
                "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
                "url_non_public_address",
            ),
            ("https://[2001:1::1]/", "pass"),
            // Benchmarking 2001:2::/48.
            ("https://[2001:2::1]/", "url_non_public_address"),
            ("https://[2001:2:0:ffff::1]/", "url_non_public_address"),
            ("https://[2001:2:1::1]/", "pass"),
            // ORCHID 2001:10::/28 and ORCHIDv2 2001:20::/28.
            ("https://[2001:10::1]/", "url_non_public_address"),
            ("https://[2001:1f:ffff::1]/", "url_non_public_address"),
            ("https://[2001:20::1]/", "url_non_public_address"),
            ("https://[2001:2f:ffff::1]/", "url_non_public_address"),
            ("https://[2001:30::1]/", "pass"),
            // Documentation 3fff::/20 (besides 2001:db8::/32).
            ("https://[3fff::1]/", "url_non_public_address"),
            ("https://[3fff:fff:ffff::1]/", "url_non_public_address"),
            ("https://[3fff:1000::1]/", "pass"),
            // SRv6 segment identifiers 5f00::/16.
            ("https://[5f00::1]/", "url_non_public_address"),
            ("https://[5f00:ffff::1]/", "url_non_public_address"),
            ("https://[5f01::1]/", "pass"),
            ("https://[2a00:1450:4001::200e]/", "pass"),
        ];
        check_table(&policy(), table);
    }

    #[test]
    fn internal_and_single_label_names() {
        let table: &[(&str, &str)] = &[
            ("https://router/", "url_internal_name"),
            ("https://Router./admin", "url_internal_name"),
            ("https://intranet:8443/", "url_internal_name"),
            (
                "https://metadata.google.internal/computeMetadata/v1/",
                "url_internal_name",
            ),
            ("https://a.b.INTERNAL./", "url_internal_name"),
            ("https://internal/", "url_internal_name"),
            ("https://printer.local/", "url_internal_name"),
            (
                "https://api.default.svc.cluster.local/",
                "url_internal_name",
            ),
            ("https://kubernetes.default.svc/", "url_internal_name"),
            ("https://nas.home.arpa/", "url_internal_name"),
            ("https://home.arpa/", "url_internal_name"),
            // localhost keeps its own reason.
            ("https://app.localhost/", "url_localhost"),
            // Look-alikes that are public names.
            ("https://internal.example.com/", "pass"),
            ("https://myinternal.com/", "pass"),
            ("https://local.example/", "pass"),
            ("https://notsvc.example/", "pass"),
            ("https://svc.example/", "pass"),
            ("https://arpa.example/", "pass"),
            ("https://xinternal/", "url_internal_name"),
        ];
        check_table(&policy(), table);

        // An explicit allow wins; a deny still beats it; unlisted internal names keep
        // their own reason under an allow-list.
        let p = UrlPolicy {
            allow_hosts: vec![
                HostPattern::parse("router").unwrap(),
                HostPattern::parse("*.corp.internal").unwrap(),
                HostPattern::parse("auth.example.com").unwrap(),
            ],
            deny_hosts: vec![HostPattern::parse("vault.corp.internal").unwrap()],
            ..policy()
        };
        let table: &[(&str, &str)] = &[
            ("https://router/", "pass"),
            ("https://ROUTER./x", "pass"),
            ("https://sso.corp.internal/", "pass"),
            ("https://vault.corp.internal/", "url_host_denied"),
            ("https://corp.internal/", "url_internal_name"),
            ("https://switch/", "url_internal_name"),
            ("https://metadata.google.internal/", "url_internal_name"),
            ("https://auth.example.com/", "pass"),
            ("https://other.example.com/", "url_host_not_allowed"),
        ];
        check_table(&p, table);
        assert_eq!(
            judge("https://router/", &policy())
                .unwrap_err()
                .refusal
                .reason(),
            "url_internal_name"
        );
    }

    #[test]
    fn format_and_bidi_characters_are_refused() {
        let p = policy();
        // Every bidi control, wherever it sits in the URL.
        let bidi = [
            '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}',
            '\u{202E}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
        ];
        // The other format characters, one from each range of the table.
        let other = [
            '\u{00AD}',
            '\u{0600}',
            '\u{0605}',
            '\u{06DD}',
            '\u{070F}',
            '\u{0890}',
            '\u{08E2}',
            '\u{180E}',
            '\u{200B}',
            '\u{200C}',
            '\u{200D}',
            '\u{2060}',
            '\u{2064}',
            '\u{206F}',
            '\u{FEFF}',
            '\u{FFF9}',
            '\u{FFFB}',
            '\u{110BD}',
            '\u{110CD}',
            '\u{13430}',
            '\u{1343F}',
            '\u{1BCA0}',
            '\u{1D173}',
            '\u{E0001}',
            '\u{E0020}',
            '\u{E007F}',
        ];
        for c in bidi.iter().chain(&other) {
            for url in [
                format!("https://example.com/{c}x"),
                format!("https://exa{c}mple.com/"),
                format!("https://example.com/?q={c}"),
                format!("https://example.com/#{c}"),
            ] {
                assert_eq!(
                    reason(&url, &p),
                    "url_control_characters",
                    "U+{:04X} in {url:?}",
                    *c as u32
                );
            }
        }
        // Neighbours of the ranges are ordinary characters.
        for c in [
            '\u{00AC}',
            '\u{061B}',
            '\u{061D}',
            '\u{200A}',
            '\u{2010}',
            '\u{2065}',
            '\u{FEFE}',
            '\u{FFFC}',
            '\u{E0000}',
            '\u{E0080}',
            'é',
            '日',
        ] {
            assert!(!is_deceptive_char(c), "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn format_table_is_sorted_and_complete() {
        // Ascending, non-overlapping and not adjacent (adjacent ranges would be one range).
        for w in FORMAT_CHARS.windows(2) {
            assert!(
                w[0].0 <= w[0].1 && (w[0].1 as u32) + 1 < w[1].0 as u32,
                "{w:?}"
            );
        }
        let total: u32 = FORMAT_CHARS
            .iter()
            .map(|&(lo, hi)| hi as u32 - lo as u32 + 1)
            .sum();
        // Unicode 16.0 has 170 code points of category Cf.
        assert_eq!(total, 170);
        for &(lo, hi) in FORMAT_CHARS {
            assert!(is_format_char(lo) && is_format_char(hi));
        }
    }

    #[test]
    fn idn_hosts_are_shown_in_punycode() {
        let shown = |url| judge(url, &policy()).unwrap().shown;
        // Whole-script and mixed-script look-alikes of apple.com / auth.example.com: the
        // client sees the xn-- form, which looks like nothing it trusts.
        let cases = [
            (
                "https://\u{430}\u{440}\u{440}\u{4cf}\u{435}.com/login",
                "https://xn--80ak6aa92e.com/login",
            ),
            ("https://\u{430}pple.com/", "https://xn--pple-43d.com/"),
            (
                "https://\u{430}uth.example.com/authorize?state=\u{430}",
                "https://xn--uth-5cd.example.com/authorize?state=%D0%B0",
            ),
            (
                "https://B\u{dc}CHER.example/",
                "https://xn--bcher-kva.example/",
            ),
            // Full-width letters map to ASCII under IDNA.
            (
                "https://\u{ff25}\u{ff38}\u{ff21}\u{ff2d}\u{ff30}\u{ff2c}\u{ff25}.com/",
                "https://example.com/",
            ),
        ];
        for (raw, want) in cases {
            let got = shown(raw);
            assert_eq!(got, want, "{raw:?}");
            assert!(got.is_ascii(), "{got:?}");
        }
    }

    #[test]
    fn the_client_is_shown_what_was_judged() {
        let shown = |url| judge(url, &policy()).unwrap().shown;
        assert_eq!(shown("https://example.com/a\\b"), "https://example.com/a/b");
        assert_eq!(shown("https://1572395042/x"), "https://93.184.216.34/x");
        assert_eq!(
            shown("https://bücher.example/"),
            "https://xn--bcher-kva.example/"
        );
        assert_eq!(
            shown("HTTPS://Example.COM:443/p?q#f"),
            "https://example.com/p?q#f"
        );
        let p = UrlPolicy {
            allow_hosts: vec![HostPattern::parse("auth.example.com").unwrap()],
            ..policy()
        };
        let r = judge("https://auth.example.com\\@127.0.0.1:8443/steal", &p).unwrap_err();
        assert_eq!(r.refusal, UrlRefusal::ParserMismatch);
        assert_eq!(r.origin.unwrap().host, "auth.example.com");
    }

    #[test]
    fn length_is_counted_in_bytes() {
        let p = UrlPolicy {
            max_length: 30,
            ..policy()
        };
        assert_eq!(reason("https://example.com/abcdefghij", &p), "pass"); // 30 bytes
        assert_eq!(
            reason("https://example.com/abcdefghijk", &p),
            "url_too_long"
        );
        // 26 characters, 32 bytes.
        assert_eq!(reason("https://example.com/éééééé", &p), "url_too_long");
    }

    #[test]
    fn allow_http_opens_http_only() {
        let p = UrlPolicy {
            allow_http: true,
            ..policy()
        };
        assert_eq!(reason("http://auth.example.com/", &p), "pass");
        assert_eq!(reason("http://127.0.0.1/", &p), "url_non_public_address");
        assert_eq!(reason("ftp://auth.example.com/", &p), "url_scheme");
        assert_eq!(reason("javascript://x/%0aalert(1)", &p), "url_scheme");
    }

    #[test]
    fn allow_and_deny_lists() {
        let p = UrlPolicy {
            allow_hosts: vec![
                HostPattern::parse("auth.example.com").unwrap(),
                HostPattern::parse("*.idp.example").unwrap(),
                HostPattern::parse("BÜCHER.example").unwrap(),
            ],
            deny_hosts: vec![HostPattern::parse("bad.idp.example").unwrap()],
            ..policy()
        };
        assert_eq!(
            reason("https://auth.example.com/authorize?state=abc", &p),
            "pass"
        );
        assert_eq!(reason("https://AUTH.example.com./", &p), "pass");
        assert_eq!(
            reason("https://evil.auth.example.com/", &p),
            "url_host_not_allowed"
        );
        assert_eq!(reason("https://example.com/", &p), "url_host_not_allowed");
        assert_eq!(
            reason("https://auth.example.com.evil.example/", &p),
            "url_host_not_allowed"
        );
        // A Cyrillic "а" is another host.
        assert_eq!(
            reason("https://\u{430}uth.example.com/", &p),
            "url_host_not_allowed"
        );
        assert_eq!(reason("https://login.idp.example/", &p), "pass");
        assert_eq!(reason("https://a.b.idp.example/", &p), "pass");
        assert_eq!(reason("https://idp.example/", &p), "url_host_not_allowed");
        assert_eq!(reason("https://bad.idp.example/", &p), "url_host_denied");
        assert_eq!(reason("https://xn--bcher-kva.example/", &p), "pass");
        // Listing a host never re-opens what is refused before the lists.
        assert_eq!(
            reason("http://auth.example.com/", &p),
            "url_scheme",
            "allow_http stays off"
        );
        let p = UrlPolicy {
            deny_hosts: vec![
                HostPattern::parse("*.internal").unwrap(),
                HostPattern::parse("93.184.216.34").unwrap(),
            ],
            ..policy()
        };
        assert_eq!(reason("https://metadata.internal/", &p), "url_host_denied");
        assert_eq!(reason("https://1572395042/", &p), "url_host_denied");
        assert_eq!(reason("https://example.com/", &p), "pass");
    }

    #[test]
    fn only_scheme_and_host_are_kept_for_logs() {
        let ok = check("https://Auth.Example.com/authorize?token=SECRET", &policy()).unwrap();
        assert_eq!(
            ok,
            UrlOrigin {
                scheme: "https".into(),
                host: "auth.example.com".into()
            }
        );
        let refused = check("https://0x7f000001/admin?token=SECRET", &policy()).unwrap_err();
        assert_eq!(refused.origin.unwrap().host, "127.0.0.1");
        let refused = check("https://[::ffff:7f00:1]/x", &policy()).unwrap_err();
        assert_eq!(refused.origin.unwrap().host, "[::ffff:7f00:1]");
        assert_eq!(
            check("https://exa\nmple.com/?token=SECRET", &policy())
                .unwrap_err()
                .origin,
            None
        );
    }
}
