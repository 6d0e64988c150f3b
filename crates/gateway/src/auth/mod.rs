//! Client authentication and the credentials the gateway presents upstream.
//!
//! One mode per deployment (`[auth] mode`):
//!
//! | mode     | credential (module)                           | principal                 |
//! |----------|-----------------------------------------------|---------------------------|
//! | `none`   | nothing                                       | `anonymous`               |
//! | `jwt`    | `Authorization: Bearer <JWT>` (`jwt.rs`)      | `{iss}#{sub}`             |
//! | `header` | a header set by a trusted proxy (`header.rs`) | `{prefix}{header value}`  |
//! | `mtls`   | the verified client certificate (`mtls.rs`)   | CN, a SAN, or the subject |
//!
//! A failure is an [`AuthError`]; `Rejection::from` turns it into a rejection of the failure's
//! kind carrying its `WWW-Authenticate` challenge, which the front answers with HTTP 401.
//!
//! Separately, [`Authenticator::upstream_headers`] says what to send to the legacy server
//! (nothing, the client's `Authorization`, or a static token) and
//! [`Authenticator::credential_key`] names that credential for pooling.
//!
//! **Reloading keys**: build a new `Authenticator` from a freshly validated [`AuthConfig`]
//! and swap it in (e.g. behind an `ArcSwap`). Validation re-reads the PEM files, the JWKS file
//! and the upstream token file; a JWKS fetched from a URL is fetched again on first use (or by
//! [`Authenticator::prefetch_keys`]). Pass the old instance's [`Authenticator::counters`] to
//! [`Authenticator::with_counters`] to keep the JWKS counters monotonic across rebuilds.

pub mod config;
mod distinguished_name;
pub mod error;
mod header;
mod jwks;
mod jwks_fetch;
mod jwt;
pub mod keys;
mod mtls;
pub mod upstream_credentials;

#[cfg(test)]
mod jwks_test_server;
#[cfg(test)]
mod jwt_tests;
#[cfg(test)]
mod test_tokens;

use std::net::SocketAddr;
use std::sync::Arc;

use http::HeaderMap;

pub use config::{AuthConfig, RawAuth};
pub use error::{AuthError, AuthFailure, Challenge};
pub use jwks::{JwksCounters, JwksCountersSnapshot};

use crate::setting::ConfigError;
use config::{CertIdentity, HeaderAuthConfig, ModeConfig};
use jwt::JwtVerifier;
use upstream_credentials::UpstreamCredentials;

/// The principal of an anonymous request (mode `none`).
pub const ANONYMOUS: &str = "anonymous";

/// Who a request acts for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

impl Principal {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the authenticator may look at for one request. (No `Debug`: the headers hold the
/// client's credentials, which must not reach logs.)
#[derive(Clone, Copy)]
pub struct AuthRequest<'a> {
    pub headers: &'a HeaderMap,
    /// The TCP peer (the auth proxy, in header mode).
    pub peer: SocketAddr,
    /// DER of the client certificate the TLS listener verified, if any.
    pub client_cert_der: Option<&'a [u8]>,
}

/// The configured mode, for logs and startup checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    None,
    Jwt,
    Header,
    Mtls,
}

impl AuthMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthMode::None => "none",
            AuthMode::Jwt => "jwt",
            AuthMode::Header => "header",
            AuthMode::Mtls => "mtls",
        }
    }
}

enum Verifier {
    None,
    Jwt(JwtVerifier),
    Header(HeaderAuthConfig),
    Mtls(CertIdentity),
}

/// Authenticates requests and prepares upstream credentials; build once per configuration.
pub struct Authenticator {
    verifier: Verifier,
    upstream: UpstreamCredentials,
    counters: Arc<JwksCounters>,
}

impl Authenticator {
    /// Builds the authenticator (and, for a JWKS URL, its HTTP client; the first fetch happens
    /// on first use or in [`Self::prefetch_keys`]).
    pub fn new(cfg: AuthConfig) -> Result<Authenticator, ConfigError> {
        Self::with_counters(cfg, Arc::default())
    }

    /// Like [`Self::new`], counting JWKS fetches into existing counters.
    pub fn with_counters(
        cfg: AuthConfig,
        counters: Arc<JwksCounters>,
    ) -> Result<Authenticator, ConfigError> {
        let verifier = match cfg.mode {
            ModeConfig::None => Verifier::None,
            ModeConfig::Jwt(jwt) => Verifier::Jwt(
                JwtVerifier::new(&jwt, Arc::clone(&counters))
                    .map_err(|m| ConfigError::new("auth.jwt.jwks_url", m))?,
            ),
            ModeConfig::Header(h) => Verifier::Header(h),
            ModeConfig::Mtls(m) => Verifier::Mtls(m.identity),
        };
        Ok(Authenticator {
            verifier,
            upstream: cfg.upstream,
            counters,
        })
    }

    pub fn mode(&self) -> AuthMode {
        match self.verifier {
            Verifier::None => AuthMode::None,
            Verifier::Jwt(_) => AuthMode::Jwt,
            Verifier::Header(_) => AuthMode::Header,
            Verifier::Mtls(_) => AuthMode::Mtls,
        }
    }

    /// True when every request is served as anonymous: the caller should warn at startup if
    /// the listener is reachable beyond loopback.
    pub fn needs_loopback_warning(&self) -> bool {
        matches!(self.verifier, Verifier::None)
    }

    /// Establishes the principal of one request.
    pub async fn authenticate(&self, req: AuthRequest<'_>) -> Result<Principal, AuthError> {
        let (result, challenge) = match &self.verifier {
            Verifier::None => return Ok(Principal(ANONYMOUS.to_string())),
            Verifier::Jwt(v) => (v.verify(req.headers).await, Challenge::Bearer),
            Verifier::Header(cfg) => (
                header::authenticate(cfg, req.headers, req.peer),
                Challenge::TrustedProxy,
            ),
            Verifier::Mtls(identity) => (
                mtls::authenticate(*identity, req.client_cert_der),
                Challenge::ClientCertificate,
            ),
        };
        result.map_err(|failure| AuthError::new(failure, challenge))
    }

    /// Headers to add to requests sent to the legacy server for this client.
    pub fn upstream_headers(&self, incoming: &HeaderMap) -> HeaderMap {
        self.upstream.upstream_headers(incoming)
    }

    /// Whether the legacy server's answers may differ from one caller to the next: callers are
    /// told apart (any mode but `none`: sessions are kept per principal), or each forwards its
    /// own credential. Results are then never `cacheScope: "public"`.
    pub fn answers_depend_on_caller(&self) -> bool {
        !matches!(self.verifier, Verifier::None)
            || matches!(self.upstream, UpstreamCredentials::Forward)
    }

    /// Non-secret name of the upstream credential (empty when none is sent), for pool keys.
    pub fn credential_key(&self, incoming: &HeaderMap) -> String {
        self.upstream.credential_key(incoming)
    }

    /// In jwt mode with a JWKS URL, fetches the key set now (subject to
    /// `jwks_min_refresh_interval`) so the first request does not wait for it. Returns whether
    /// keys are loaded; `true` when there is no JWKS URL.
    pub async fn prefetch_keys(&self) -> bool {
        match &self.verifier {
            Verifier::Jwt(v) => match v.remote() {
                Some(remote) => remote.prefetch().await,
                None => true,
            },
            _ => true,
        }
    }

    /// The JWKS fetch counters (all zero unless a JWKS URL is configured).
    pub fn counters(&self) -> &Arc<JwksCounters> {
        &self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Rejection;
    use crate::front::error_map::answer;
    use http::{HeaderValue, StatusCode};

    fn peer() -> SocketAddr {
        "127.0.0.1:40000".parse().unwrap()
    }

    #[tokio::test]
    async fn mode_none_is_anonymous_and_asks_for_the_loopback_warning() {
        let a = Authenticator::new(AuthConfig::default()).unwrap();
        assert_eq!(a.mode(), AuthMode::None);
        assert!(a.needs_loopback_warning());
        let headers = HeaderMap::new();
        let p = a
            .authenticate(AuthRequest {
                headers: &headers,
                peer: peer(),
                client_cert_der: None,
            })
            .await
            .unwrap();
        assert_eq!(p.to_string(), "anonymous");
    }

    #[tokio::test]
    async fn header_mode_end_to_end_maps_to_a_401_with_a_challenge() {
        let raw: RawAuth =
            toml::from_str("mode = \"header\"\n[header]\nname = \"x-user\"\nprefix = \"proxy:\"\n")
                .unwrap();
        let a = Authenticator::new(AuthConfig::from_raw(&raw, None).unwrap()).unwrap();
        assert_eq!(a.mode(), AuthMode::Header);
        assert!(!a.needs_loopback_warning());
        let mut headers = HeaderMap::new();
        headers.insert("x-user", HeaderValue::from_static("carol"));
        let ok = a
            .authenticate(AuthRequest {
                headers: &headers,
                peer: "[::1]:1".parse().unwrap(),
                client_cert_der: None,
            })
            .await
            .unwrap();
        assert_eq!(ok.as_str(), "proxy:carol");

        let err = a
            .authenticate(AuthRequest {
                headers: &headers,
                peer: "192.0.2.7:1".parse().unwrap(),
                client_cert_der: None,
            })
            .await
            .unwrap_err();
        let rej = Rejection::from(err);
        assert_eq!(rej.reason(), "auth_untrusted_source");
        let r = answer(&rej);
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(r.error.code, mrtr_wire::jsonrpc::codes::INVALID_REQUEST);
        let (_, challenge) = r
            .headers
            .iter()
            .find(|(n, _)| n == http::header::WWW_AUTHENTICATE)
            .unwrap();
        assert_eq!(challenge, "TrustedProxy realm=\"mrtr-gateway\"");
    }

    #[tokio::test]
    async fn mtls_mode_without_a_certificate_is_a_401() {
        let raw: RawAuth = toml::from_str("mode = \"mtls\"\n").unwrap();
        let a = Authenticator::new(AuthConfig::from_raw(&raw, None).unwrap()).unwrap();
        let headers = HeaderMap::new();
        let err = a
            .authenticate(AuthRequest {
                headers: &headers,
                peer: peer(),
                client_cert_der: None,
            })
            .await
            .unwrap_err();
        assert_eq!(err.failure, AuthFailure::Missing);
        let r = Rejection::from(err);
        assert_eq!(answer(&r).status, StatusCode::UNAUTHORIZED);
        assert_eq!(r.reason(), "auth_missing");
    }
}
