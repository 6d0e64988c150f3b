//! Verification keys: each one a public key bound to exactly one signature algorithm.
//!
//! Pinning the algorithm to the key, rather than trusting the token's `alg` header, is what
//! stops algorithm confusion: a token that says `HS256` (hoping the RSA public key will be used
//! as an HMAC secret), `none`, or `PS256` for a key configured as `RS256` is refused before any
//! signature check. Symmetric algorithms are not accepted at all: an HMAC secret shared with
//! the gateway would let every holder mint tokens for any principal.
//!
//! Keys come from PEM files (`[[auth.jwt.keys]]`) or from JWKS documents (a file or a URL);
//! both paths end in a [`VerifyKey`].

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;

/// The algorithms the gateway verifies, by their JOSE names.
pub const SUPPORTED_ALGORITHMS: &[(&str, Algorithm)] = &[
    ("RS256", Algorithm::RS256),
    ("RS384", Algorithm::RS384),
    ("RS512", Algorithm::RS512),
    ("PS256", Algorithm::PS256),
    ("PS384", Algorithm::PS384),
    ("PS512", Algorithm::PS512),
    ("ES256", Algorithm::ES256),
    ("ES384", Algorithm::ES384),
    ("EdDSA", Algorithm::EdDSA),
];

/// A public key and the one algorithm it verifies.
#[derive(Clone)]
pub struct VerifyKey {
    pub kid: String,
    pub algorithm: Algorithm,
    pub(crate) key: DecodingKey,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyKey")
            .field("kid", &self.kid)
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

/// Looks up a supported algorithm by its JOSE name (case-sensitive, as in tokens).
pub fn algorithm_by_name(name: &str) -> Option<Algorithm> {
    SUPPORTED_ALGORITHMS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, a)| *a)
}

/// Parses an algorithm name from the configuration, explaining refusals.
pub fn parse_algorithm(name: &str) -> Result<Algorithm, String> {
    if let Some(alg) = algorithm_by_name(name) {
        return Ok(alg);
    }
    if name.starts_with("HS") {
        return Err(format!(
            "{name:?} is refused: symmetric (HMAC) secrets would let any holder mint principals; \
             use an asymmetric algorithm"
        ));
    }
    let names: Vec<&str> = SUPPORTED_ALGORITHMS.iter().map(|(n, _)| *n).collect();
    Err(format!(
        "unknown algorithm {name:?}; expected one of {names:?}"
    ))
}

pub fn is_rsa(alg: Algorithm) -> bool {
    matches!(
        alg,
        Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::PS256
            | Algorithm::PS384
            | Algorithm::PS512
    )
}

/// Builds a key from a PEM public key (`BEGIN PUBLIC KEY`, or `BEGIN RSA PUBLIC KEY`).
pub fn key_from_pem(kid: &str, algorithm: Algorithm, pem: &[u8]) -> Result<VerifyKey, String> {
    if pem.windows(11).any(|w| w == b"PRIVATE KEY") {
        return Err(
            "this is a private key; give the public key (openssl pkey -pubout) and keep the \
             private one away from the gateway"
                .into(),
        );
    }
    let parsed = match algorithm {
        Algorithm::ES256 | Algorithm::ES384 => DecodingKey::from_ec_pem(pem),
        Algorithm::EdDSA => DecodingKey::from_ed_pem(pem),
        _ => DecodingKey::from_rsa_pem(pem),
    };
    let key = parsed.map_err(|e| format!("not a PEM public key usable with {algorithm:?}: {e}"))?;
    Ok(VerifyKey {
        kid: kid.to_string(),
        algorithm,
        key,
    })
}

/// Keys read from a JWKS document, and the entries that could not be used.
#[derive(Debug, Default)]
pub struct JwksKeys {
    pub keys: Vec<VerifyKey>,
    /// One line per unusable entry (encryption keys are ignored silently, not listed).
    pub skipped: Vec<String>,
}

#[derive(Deserialize)]
struct JwksDocument {
    keys: Vec<serde_json::Value>,
}

/// Reads a JWKS document (`{"keys": [...]}`). Entries are judged one by one so that a key type
/// the gateway does not support does not hide the usable keys next to it.
///
/// An entry's algorithm is its `alg` when present; otherwise it follows from the curve (EC,
/// OKP), or is `rsa_algorithm` for RSA keys, which often omit `alg`.
pub fn keys_from_jwks(json: &[u8], rsa_algorithm: Algorithm) -> Result<JwksKeys, String> {
    let doc: JwksDocument =
        serde_json::from_slice(json).map_err(|e| format!("not a JWKS document: {e}"))?;
    let mut out = JwksKeys::default();
    for (i, entry) in doc.keys.into_iter().enumerate() {
        let jwk: Jwk = match serde_json::from_value(entry) {
            Ok(jwk) => jwk,
            Err(e) => {
                out.skipped.push(format!("keys[{i}]: unsupported key: {e}"));
                continue;
            }
        };
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        match key_from_jwk(&jwk, rsa_algorithm) {
            Ok(key) if out.keys.iter().any(|k| k.kid == key.kid) => {
                out.skipped
                    .push(format!("keys[{i}]: duplicate kid {:?}", key.kid));
            }
            Ok(key) => out.keys.push(key),
            Err(m) => out.skipped.push(format!("keys[{i}]: {m}")),
        }
    }
    Ok(out)
}

fn key_from_jwk(jwk: &Jwk, rsa_algorithm: Algorithm) -> Result<VerifyKey, String> {
    let kid = match jwk.common.key_id.as_deref() {
        Some(kid) if !kid.is_empty() => kid.to_string(),
        _ => return Err("no kid".into()),
    };
    let stated = match jwk.common.key_algorithm {
        None => None,
        Some(ka) => Some(jwk_algorithm(ka).ok_or_else(|| {
            format!("kid {kid:?}: algorithm {ka:?} is not accepted for signatures")
        })?),
    };
    let algorithm = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => {
            let alg = stated.unwrap_or(rsa_algorithm);
            if !is_rsa(alg) {
                return Err(format!("kid {kid:?}: RSA key with algorithm {alg:?}"));
            }
            alg
        }
        AlgorithmParameters::EllipticCurve(p) => {
            let by_curve = match p.curve {
                EllipticCurve::P256 => Algorithm::ES256,
                EllipticCurve::P384 => Algorithm::ES384,
                ref other => return Err(format!("kid {kid:?}: unsupported EC curve {other:?}")),
            };
            if stated.is_some_and(|s| s != by_curve) {
                return Err(format!(
                    "kid {kid:?}: algorithm {stated:?} does not match curve {:?}",
                    p.curve
                ));
            }
            by_curve
        }
        AlgorithmParameters::OctetKeyPair(p) => {
            if p.curve != EllipticCurve::Ed25519 {
                return Err(format!("kid {kid:?}: unsupported OKP curve {:?}", p.curve));
            }
            if stated.is_some_and(|s| s != Algorithm::EdDSA) {
                return Err(format!(
                    "kid {kid:?}: Ed25519 key with algorithm {stated:?}"
                ));
            }
            Algorithm::EdDSA
        }
        AlgorithmParameters::OctetKey(_) => {
            return Err(format!(
                "kid {kid:?}: symmetric (oct) keys are not accepted"
            ));
        }
        _ => return Err(format!("kid {kid:?}: unsupported key type")),
    };
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("kid {kid:?}: {e}"))?;
    Ok(VerifyKey {
        kid,
        algorithm,
        key,
    })
}

/// A JWK `alg` value, when it is one of the signature algorithms the gateway verifies.
fn jwk_algorithm(ka: KeyAlgorithm) -> Option<Algorithm> {
    Some(match ka {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ec_jwk(kid: &str, crv: &str, alg: Option<&str>) -> serde_json::Value {
        // Coordinates are not checked when a JWK is read, only when a signature is verified.
        let mut k = json!({"kty": "EC", "crv": crv, "kid": kid, "x": "AQ", "y": "AQ"});
        if let Some(alg) = alg {
            k["alg"] = json!(alg);
        }
        k
    }

    fn read(keys: Vec<serde_json::Value>, rsa: Algorithm) -> JwksKeys {
        keys_from_jwks(json!({ "keys": keys }).to_string().as_bytes(), rsa).unwrap()
    }

    #[test]
    fn algorithms_are_pinned_from_alg_curve_or_the_rsa_default() {
        let got = read(
            vec![
                ec_jwk("p256", "P-256", None),
                ec_jwk("p384", "P-384", Some("ES384")),
                json!({"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": "AQ"}),
                json!({"kty": "RSA", "kid": "rsa-default", "n": "AQAB", "e": "AQAB"}),
                json!({"kty": "RSA", "kid": "rsa-ps", "alg": "PS384", "n": "AQAB", "e": "AQAB"}),
            ],
            Algorithm::PS256,
        );
        assert!(got.skipped.is_empty(), "{:?}", got.skipped);
        let alg_of = |kid: &str| got.keys.iter().find(|k| k.kid == kid).unwrap().algorithm;
        assert_eq!(alg_of("p256"), Algorithm::ES256);
        assert_eq!(alg_of("p384"), Algorithm::ES384);
        assert_eq!(alg_of("ed"), Algorithm::EdDSA);
        assert_eq!(alg_of("rsa-default"), Algorithm::PS256);
        assert_eq!(alg_of("rsa-ps"), Algorithm::PS384);
    }

    #[test]
    fn unusable_entries_are_skipped_and_named() {
        let got = read(
            vec![
                json!({"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"}),
                json!({"kty": "RSA", "kid": "rsa-hs", "alg": "HS256", "n": "AQAB", "e": "AQAB"}),
                json!({"kty": "RSA", "kid": "rsa-oaep", "alg": "RSA-OAEP", "n": "AQAB", "e": "AQAB"}),
                ec_jwk("mismatch", "P-256", Some("ES384")),
                ec_jwk("p521", "P-521", None),
                ec_jwk("", "P-256", None),
                json!({"kty": "EC", "crv": "P-256", "x": "AQ", "y": "AQ"}),
                ec_jwk("good", "P-256", None),
                ec_jwk("good", "P-256", None),
                json!({"kty": "EC", "crv": "P-256", "kid": "enc", "use": "enc", "x": "AQ", "y": "AQ"}),
                json!({"kty": "weird", "kid": "w"}),
            ],
            Algorithm::RS256,
        );
        let kids: Vec<&str> = got.keys.iter().map(|k| k.kid.as_str()).collect();
        assert_eq!(kids, vec!["good"]);
        // Everything but the accepted key and the encryption key is reported.
        assert_eq!(got.skipped.len(), 9, "{:#?}", got.skipped);
        assert!(got.skipped.iter().any(|s| s.contains("symmetric")));
        assert!(got.skipped.iter().any(|s| s.contains("duplicate")));
    }

    #[test]
    fn configuration_names_are_exact_and_hmac_is_refused_with_a_reason() {
        assert_eq!(parse_algorithm("EdDSA").unwrap(), Algorithm::EdDSA);
        assert!(parse_algorithm("es256").is_err());
        assert!(parse_algorithm("none").is_err());
        assert!(parse_algorithm("HS512").unwrap_err().contains("symmetric"));
        assert!(algorithm_by_name("HS256").is_none());
    }
}
