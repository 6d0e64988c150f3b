//! JWT mode: `Authorization: Bearer <JWT>` signed by a configured key.
//!
//! The order of checks is deliberate:
//! 1. Take the token from the `Authorization` header (another scheme counts as no token).
//! 2. Read the JOSE header ourselves and refuse an `alg` the gateway does not verify (`none`,
//!    `HS*`) before anything else, so such tokens cannot even cause a JWKS fetch; refuse `crit`
//!    (no extension is understood, RFC 7515 §4.1.11).
//! 3. Find the key by `kid` (static keys, then the JWKS cache, then the unknown-kid fetch).
//! 4. The token's `alg` must equal the key's pinned algorithm, even when the key could verify
//!    another one (an RSA key verifies both RS256 and PS256).
//! 5. Verify the signature, then `exp`/`nbf` (with leeway), `iss` and `aud`; all four claims
//!    are required. Claims are only read after the signature holds, so the failure class a
//!    client learns (expired, wrong audience) is never about a forged token.
//! 6. The principal is `"{issuer}#{claim}"`, the claim being `principal_claim` (`sub`).

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use http::HeaderMap;
use http::header::AUTHORIZATION;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde::Deserialize;

use super::Principal;
use super::config::JwtConfig;
use super::error::AuthFailure;
use super::jwks::{JwksCounters, Lookup, RemoteJwks};
use super::keys::{self, VerifyKey};

pub(crate) struct JwtVerifier {
    issuer: String,
    principal_claim: String,
    static_keys: HashMap<String, Arc<VerifyKey>>,
    /// The key used for tokens without `kid`: only when exactly one key can ever exist.
    sole_key: Option<Arc<VerifyKey>>,
    remote: Option<Arc<RemoteJwks>>,
    /// One prepared validation per supported algorithm, built once.
    validations: Vec<(Algorithm, Validation)>,
}

/// The parts of the JOSE header the gateway reads before verifying.
#[derive(Deserialize)]
struct JoseHeader {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

impl JwtVerifier {
    pub(crate) fn new(cfg: &JwtConfig, counters: Arc<JwksCounters>) -> Result<Self, String> {
        let static_keys: HashMap<String, Arc<VerifyKey>> = cfg
            .static_keys
            .iter()
            .map(|k| (k.kid.clone(), Arc::new(k.clone())))
            .collect();
        let sole_key = match (cfg.static_keys.as_slice(), &cfg.remote) {
            ([only], None) => static_keys.get(&only.kid).cloned(),
            _ => None,
        };
        let remote = match &cfg.remote {
            Some(r) => Some(Arc::new(RemoteJwks::new(r, counters)?)),
            None => None,
        };
        let validations = keys::SUPPORTED_ALGORITHMS
            .iter()
            .map(|(_, alg)| (*alg, validation_for(*alg, cfg)))
            .collect();
        Ok(JwtVerifier {
            issuer: cfg.issuer.clone(),
            principal_claim: cfg.principal_claim.clone(),
            static_keys,
            sole_key,
            remote,
            validations,
        })
    }

    pub(crate) fn remote(&self) -> Option<&Arc<RemoteJwks>> {
        self.remote.as_ref()
    }

    pub(crate) async fn verify(&self, headers: &HeaderMap) -> Result<Principal, AuthFailure> {
        let token = bearer_token(headers)?;
        let header = jose_header(token)?;
        let alg = keys::algorithm_by_name(&header.alg).ok_or(AuthFailure::BadAlgorithm)?;
        let key = self.find_key(header.kid.as_deref()).await?;
        if key.algorithm != alg {
            return Err(AuthFailure::BadAlgorithm);
        }
        let validation = self
            .validations
            .iter()
            .find(|(a, _)| *a == alg)
            .map(|(_, v)| v)
            .ok_or(AuthFailure::BadAlgorithm)?;
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token, &key.key, validation,
        )
        .map_err(|e| classify(&e, &key))?;
        let subject = data
            .claims
            .get(&self.principal_claim)
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or(AuthFailure::MissingClaim)?;
        Ok(Principal(format!("{}#{subject}", self.issuer)))
    }

    async fn find_key(&self, kid: Option<&str>) -> Result<Arc<VerifyKey>, AuthFailure> {
        let Some(kid) = kid else {
            return self.sole_key.clone().ok_or(AuthFailure::UnknownKid);
        };
        if let Some(k) = self.static_keys.get(kid) {
            return Ok(Arc::clone(k));
        }
        let Some(remote) = &self.remote else {
            return Err(AuthFailure::UnknownKid);
        };
        remote.refresh_if_stale();
        if let Some(k) = remote.get(kid) {
            return Ok(k);
        }
        match remote.lookup_after_refresh(kid).await {
            Lookup::Found(k) => Ok(k),
            Lookup::NotFound => Err(AuthFailure::UnknownKid),
            Lookup::Unavailable => Err(AuthFailure::KeysUnavailable),
        }
    }
}

fn validation_for(alg: Algorithm, cfg: &JwtConfig) -> Validation {
    let mut v = Validation::new(alg);
    v.leeway = cfg.leeway.as_secs();
    v.validate_exp = true;
    v.validate_nbf = true;
    v.validate_aud = true;
    v.set_issuer(&[cfg.issuer.as_str()]);
    v.set_audience(&cfg.audiences);
    // Without these, a token that simply omits `iss` or `aud` would skip those checks.
    v.set_required_spec_claims(&["exp", "iss", "aud"]);
    v
}

/// The bearer token, if the request carries one.
fn bearer_token(headers: &HeaderMap) -> Result<&str, AuthFailure> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(AuthFailure::Missing);
    };
    if values.next().is_some() {
        return Err(AuthFailure::Malformed);
    }
    let value = value.to_str().map_err(|_| AuthFailure::Malformed)?.trim();
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        // Some other scheme: for this gateway, no credentials (RFC 6750 §3.1).
        return Err(AuthFailure::Missing);
    }
    let token = rest.trim();
    if token.is_empty() {
        return Err(AuthFailure::Malformed);
    }
    Ok(token)
}

fn jose_header(token: &str) -> Result<JoseHeader, AuthFailure> {
    let mut parts = token.split('.');
    let (Some(header), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(AuthFailure::Malformed);
    };
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| AuthFailure::Malformed)?;
    let header: JoseHeader = serde_json::from_slice(&json).map_err(|_| AuthFailure::Malformed)?;
    if header.crit.is_some() {
        return Err(AuthFailure::Malformed);
    }
    Ok(header)
}

fn classify(e: &jsonwebtoken::errors::Error, key: &VerifyKey) -> AuthFailure {
    match e.kind() {
        ErrorKind::ExpiredSignature => AuthFailure::Expired,
        ErrorKind::ImmatureSignature => AuthFailure::NotYetValid,
        ErrorKind::InvalidAudience => AuthFailure::BadAudience,
        ErrorKind::InvalidIssuer => AuthFailure::BadIssuer,
        ErrorKind::InvalidAlgorithm => AuthFailure::BadAlgorithm,
        ErrorKind::InvalidSignature => AuthFailure::BadSignature,
        ErrorKind::MissingRequiredClaim(_) => AuthFailure::MissingClaim,
        ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidEddsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidKeyFormat => {
            // The configured or fetched key itself is unusable: the operator must know.
            tracing::warn!(kid = %key.kid, error = %e, "JWT verification key is unusable");
            AuthFailure::BadSignature
        }
        _ => AuthFailure::Malformed,
    }
}
