//! Test material: freshly generated signing keys, their public forms (PEM, JWK), signed and
//! hand-forged tokens, and a scratch directory for key files.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::KeyPair;
use serde_json::{Value, json};

pub(crate) const ISSUER: &str = "https://issuer.example";
pub(crate) const AUDIENCE: &str = "mcp-gateway";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A generated key pair, with the algorithm it signs with by default.
pub(crate) struct TestKey {
    pub kid: String,
    pub alg: Algorithm,
    pub public_pem: String,
    /// The public key as a JWK (EC and Ed25519 keys only).
    pub jwk: Option<Value>,
    encoding: EncodingKey,
}

impl TestKey {
    pub(crate) fn es256(kid: &str) -> TestKey {
        let kp = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let raw = kp.public_key_raw();
        assert_eq!(raw.len(), 65, "uncompressed P-256 point");
        let jwk = json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
            "x": b64(&raw[1..33]), "y": b64(&raw[33..]),
        });
        TestKey {
            kid: kid.into(),
            alg: Algorithm::ES256,
            public_pem: kp.public_key_pem(),
            jwk: Some(jwk),
            encoding: EncodingKey::from_ec_pem(kp.serialize_pem().as_bytes()).unwrap(),
        }
    }

    pub(crate) fn ed25519(kid: &str) -> TestKey {
        let kp = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let jwk = json!({
            "kty": "OKP", "crv": "Ed25519", "kid": kid, "x": b64(kp.public_key_raw()),
        });
        TestKey {
            kid: kid.into(),
            alg: Algorithm::EdDSA,
            public_pem: kp.public_key_pem(),
            jwk: Some(jwk),
            encoding: EncodingKey::from_ed_pem(kp.serialize_pem().as_bytes()).unwrap(),
        }
    }

    pub(crate) fn rs256(kid: &str) -> TestKey {
        let kp =
            KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048).unwrap();
        TestKey {
            kid: kid.into(),
            alg: Algorithm::RS256,
            public_pem: kp.public_key_pem(),
            jwk: None,
            encoding: EncodingKey::from_rsa_pem(kp.serialize_pem().as_bytes()).unwrap(),
        }
    }

    /// A token signed with this key's algorithm, naming this key's kid.
    pub(crate) fn sign(&self, claims: &Value) -> String {
        self.sign_as(self.alg, Some(&self.kid), claims)
    }

    /// A token signed with this key under another `alg` and/or `kid`.
    pub(crate) fn sign_as(&self, alg: Algorithm, kid: Option<&str>, claims: &Value) -> String {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_string);
        jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
    }
}

pub(crate) fn now() -> i64 {
    i64::try_from(jsonwebtoken::get_current_timestamp()).unwrap()
}

/// Claims accepted by the test configuration: right issuer and audience, valid for an hour.
pub(crate) fn good_claims(sub: &str) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now(), "exp": now() + 3600})
}

/// `good_claims` with some fields replaced (or removed, with `Value::Null`).
pub(crate) fn claims_with(sub: &str, changes: Value) -> Value {
    let mut c = good_claims(sub);
    for (k, v) in changes.as_object().unwrap() {
        if v.is_null() {
            c.as_object_mut().unwrap().remove(k);
        } else {
            c[k] = v.clone();
        }
    }
    c
}

/// A token with an arbitrary header and an HMAC-SHA256 signature under `secret` (or an empty
/// signature when `secret` is `None`), for forging `alg: none` / HS256 confusion attempts.
pub(crate) fn forged_token(header: &Value, claims: &Value, secret: Option<&[u8]>) -> String {
    let signing_input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    // HMAC through jsonwebtoken itself: exactly what an attacker's library would produce.
    let signature = match secret {
        None => String::new(),
        Some(secret) => jsonwebtoken::crypto::sign(
            signing_input.as_bytes(),
            &EncodingKey::from_secret(secret).unwrap(),
            Algorithm::HS256,
        )
        .unwrap(),
    };
    format!("{signing_input}.{signature}")
}

/// A scratch directory removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new() -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).unwrap();
        let dir = std::env::temp_dir().join(format!(
            "mrtr-auth-test-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            u64::from_le_bytes(nonce)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `name` in the directory and returns its full path as a string.
    pub(crate) fn write(&self, name: &str, contents: &str) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, contents).unwrap();
        p.to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
