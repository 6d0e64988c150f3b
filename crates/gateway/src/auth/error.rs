//! Why a request was not authenticated, and how that reaches the client.
//!
//! Every failure is answered (by the front's error table) with HTTP 401, the failure's
//! `WWW-Authenticate` challenge and a JSON-RPC `-32600` error, except
//! [`AuthFailure::KeysUnavailable`] (the gateway could not obtain any verification keys: HTTP
//! 503 without a challenge, the gateway's fault). Messages and challenge parameters are
//! fixed strings per failure class: they may say "expired" or "wrong audience", but they never
//! carry anything taken from the request, so a token can never be echoed back or logged through
//! them.

use crate::error::{Rejection, RejectionKind};

/// The protection space named in every challenge.
pub const REALM: &str = "mrtr-gateway";

/// A failed authentication: what went wrong and which challenge to answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", failure.message())]
pub struct AuthError {
    pub failure: AuthFailure,
    pub challenge: Challenge,
}

/// The failure classes; each has a stable `reason` for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No credentials at all (no bearer token, no header, no client certificate).
    Missing,
    /// Credentials present but not parseable (not a JWT, several values, bad certificate).
    Malformed,
    Expired,
    NotYetValid,
    BadAudience,
    BadIssuer,
    /// The token's `alg` is not the one pinned to its key, or not accepted at all.
    BadAlgorithm,
    UnknownKid,
    BadSignature,
    /// A claim the gateway needs (`exp`, `iss`, `aud`, the principal claim) is absent.
    MissingClaim,
    /// Header mode: the peer is not one of the trusted auth proxies.
    UntrustedSource,
    /// mTLS mode: the certificate has no value for the configured identity field.
    NoIdentity,
    /// mTLS mode: the certificate has several values for an identity field that must have
    /// one (`subject_cn` with two common names).
    AmbiguousIdentity,
    /// JWT mode: no verification keys could be obtained (the JWKS endpoint is failing).
    KeysUnavailable,
}

impl AuthFailure {
    /// The failure class.
    pub fn kind(self) -> RejectionKind {
        match self {
            AuthFailure::Missing => RejectionKind::AuthMissing,
            AuthFailure::Malformed => RejectionKind::AuthMalformed,
            AuthFailure::Expired => RejectionKind::AuthExpired,
            AuthFailure::NotYetValid => RejectionKind::AuthNotYetValid,
            AuthFailure::BadAudience => RejectionKind::AuthBadAudience,
            AuthFailure::BadIssuer => RejectionKind::AuthBadIssuer,
            AuthFailure::BadAlgorithm => RejectionKind::AuthBadAlgorithm,
            AuthFailure::UnknownKid => RejectionKind::AuthUnknownKid,
            AuthFailure::BadSignature => RejectionKind::AuthBadSignature,
            AuthFailure::MissingClaim => RejectionKind::AuthMissingClaim,
            AuthFailure::UntrustedSource => RejectionKind::AuthUntrustedSource,
            AuthFailure::NoIdentity => RejectionKind::AuthNoIdentity,
            AuthFailure::AmbiguousIdentity => RejectionKind::AuthAmbiguousIdentity,
            AuthFailure::KeysUnavailable => RejectionKind::AuthKeysUnavailable,
        }
    }

    pub fn reason(self) -> &'static str {
        self.kind().reason()
    }

    /// The client-facing text (also used as the RFC 6750 `error_description`).
    pub fn message(self) -> &'static str {
        match self {
            AuthFailure::Missing => "authentication required",
            AuthFailure::Malformed => "credentials are malformed",
            AuthFailure::Expired => "token has expired",
            AuthFailure::NotYetValid => "token is not valid yet",
            AuthFailure::BadAudience => "token is not intended for this audience",
            AuthFailure::BadIssuer => "token issuer is not accepted",
            AuthFailure::BadAlgorithm => "token algorithm is not accepted for its key",
            AuthFailure::UnknownKid => "token signing key is not known",
            AuthFailure::BadSignature => "token signature is invalid",
            AuthFailure::MissingClaim => "token lacks a required claim",
            AuthFailure::UntrustedSource => {
                "request did not come through the trusted authentication proxy"
            }
            AuthFailure::NoIdentity => "client certificate carries no usable identity",
            AuthFailure::AmbiguousIdentity => {
                "client certificate carries more than one value for its identity field"
            }
            AuthFailure::KeysUnavailable => "token verification keys are unavailable",
        }
    }
}

/// The `WWW-Authenticate` scheme that tells the client how it should have authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Challenge {
    /// RFC 6750 bearer tokens (jwt mode; also used for mode-independent failures).
    Bearer,
    /// Header mode: credentials are established by the auth proxy in front of the gateway.
    TrustedProxy,
    /// mTLS mode: a client certificate on the TLS connection.
    ClientCertificate,
}

impl Challenge {
    pub fn scheme(self) -> &'static str {
        match self {
            Challenge::Bearer => "Bearer",
            Challenge::TrustedProxy => "TrustedProxy",
            Challenge::ClientCertificate => "ClientCertificate",
        }
    }
}

impl AuthError {
    pub fn new(failure: AuthFailure, challenge: Challenge) -> Self {
        AuthError { failure, challenge }
    }

    pub fn reason(&self) -> &'static str {
        self.failure.reason()
    }

    /// The `WWW-Authenticate` value. Bearer challenges for presented-but-bad tokens carry
    /// `error="invalid_token"` (RFC 6750 §3.1); a request without credentials gets the bare
    /// challenge, as that section asks.
    pub fn www_authenticate(&self) -> String {
        let scheme = self.challenge.scheme();
        match (self.challenge, self.failure) {
            (_, AuthFailure::Missing)
            | (Challenge::TrustedProxy | Challenge::ClientCertificate, _) => {
                format!("{scheme} realm=\"{REALM}\"")
            }
            (Challenge::Bearer, failure) => format!(
                "{scheme} realm=\"{REALM}\", error=\"invalid_token\", error_description=\"{}\"",
                failure.message()
            ),
        }
    }
}

impl From<AuthError> for Rejection {
    fn from(e: AuthError) -> Rejection {
        Rejection::new(e.failure.kind(), e.failure.message()).with_challenge(e.www_authenticate())
    }
}
