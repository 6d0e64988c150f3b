//! JWT mode through the public API: configuration text in, principals or rejections out.
//! Keys are generated per test; JWKS URLs point at a loopback server on port 0.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode, header::AUTHORIZATION, header::WWW_AUTHENTICATE};
use jsonwebtoken::Algorithm;
use serde_json::json;

use super::jwks::RemoteJwks;
use super::jwks_test_server::{JwksServer, jwks};
use super::test_tokens::{
    AUDIENCE, ISSUER, TempDir, TestKey, claims_with, forged_token, good_claims, now,
};
use super::*;
use crate::error::Rejection;

/// A jwt-mode authenticator; `body` continues the `[jwt]` table (scalars, then key tables).
fn jwt_auth(dir: &TempDir, body: &str) -> Authenticator {
    let text = format!(
        "mode = \"jwt\"\n[jwt]\nissuer = \"{ISSUER}\"\naudiences = [\"{AUDIENCE}\", \"second-aud\"]\n{body}"
    );
    let raw: RawAuth = toml::from_str(&text).unwrap();
    Authenticator::new(AuthConfig::from_raw(&raw, Some(dir.path())).unwrap()).unwrap()
}

/// A `[[jwt.keys]]` entry for `key`'s public PEM, pinned to `alg`, under `kid`.
fn pem_entry(dir: &TempDir, key: &TestKey, kid: &str, alg: &str) -> String {
    let file = format!("{kid}.pem");
    dir.write(&file, &key.public_pem);
    format!("[[jwt.keys]]\nkid = \"{kid}\"\nalgorithm = \"{alg}\"\npem_file = \"{file}\"\n")
}

fn bearer(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    h
}

async fn check(a: &Authenticator, headers: &HeaderMap) -> Result<Principal, AuthError> {
    a.authenticate(AuthRequest {
        headers,
        peer: "127.0.0.1:50000".parse().unwrap(),
        client_cert_der: None,
    })
    .await
}

async fn reason(a: &Authenticator, token: &str) -> &'static str {
    match check(a, &bearer(token)).await {
        Ok(p) => panic!("token unexpectedly accepted as {p}"),
        Err(e) => e.reason(),
    }
}

fn remote(a: &Authenticator) -> &Arc<RemoteJwks> {
    match &a.verifier {
        Verifier::Jwt(v) => v.remote().expect("a JWKS URL is configured"),
        _ => panic!("not jwt mode"),
    }
}

#[tokio::test]
async fn valid_token_gives_issuer_hash_subject() {
    let dir = TempDir::new();
    let ec = TestKey::es256("ec-1");
    let ed = TestKey::ed25519("ed-1");
    let a = jwt_auth(
        &dir,
        &format!(
            "{}{}",
            pem_entry(&dir, &ec, "ec-1", "ES256"),
            pem_entry(&dir, &ed, "ed-1", "EdDSA")
        ),
    );
    assert_eq!(a.mode(), AuthMode::Jwt);
    assert!(!a.needs_loopback_warning());

    let alice = check(&a, &bearer(&ec.sign(&good_claims("alice"))))
        .await
        .unwrap();
    assert_eq!(alice.as_str(), "https://issuer.example#alice");
    let bob = check(&a, &bearer(&ed.sign(&good_claims("bob"))))
        .await
        .unwrap();
    assert_eq!(bob.as_str(), "https://issuer.example#bob");
    assert_ne!(alice, bob);

    // aud may be a list; one accepted entry is enough.
    let listed = claims_with("alice", json!({"aud": ["someone-else", "second-aud"]}));
    assert_eq!(check(&a, &bearer(&ec.sign(&listed))).await.unwrap(), alice);
    // The scheme name is case-insensitive.
    let mut lower = HeaderMap::new();
    let token = ec.sign(&good_claims("alice"));
    lower.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("bearer {token}")).unwrap(),
    );
    assert_eq!(check(&a, &lower).await.unwrap(), alice);
}

#[tokio::test]
async fn principal_claim_is_configurable() {
    let dir = TempDir::new();
    let ec = TestKey::es256("ec-1");
    let a = jwt_auth(
        &dir,
        &format!(
            "principal_claim = \"email\"\n{}",
            pem_entry(&dir, &ec, "ec-1", "ES256")
        ),
    );
    let claims = claims_with("alice", json!({"email": "alice@example.com"}));
    let p = check(&a, &bearer(&ec.sign(&claims))).await.unwrap();
    assert_eq!(p.as_str(), "https://issuer.example#alice@example.com");
    // Without the claim there is no principal.
    assert_eq!(
        reason(&a, &ec.sign(&good_claims("alice"))).await,
        "auth_missing_claim"
    );
}

#[tokio::test]
async fn time_claims_are_checked_with_leeway() {
    let dir = TempDir::new();
    let ec = TestKey::es256("ec-1");
    let a = jwt_auth(
        &dir,
        &format!(
            "leeway = \"60s\"\n{}",
            pem_entry(&dir, &ec, "ec-1", "ES256")
        ),
    );
    let expired = claims_with("alice", json!({"exp": now() - 120}));
    assert_eq!(reason(&a, &ec.sign(&expired)).await, "auth_expired");
    let just_expired = claims_with("alice", json!({"exp": now() - 30}));
    assert!(check(&a, &bearer(&ec.sign(&just_expired))).await.is_ok());

    let future = claims_with("alice", json!({"nbf": now() + 300}));
    assert_eq!(reason(&a, &ec.sign(&future)).await, "auth_not_yet_valid");
    let nearly = claims_with("alice", json!({"nbf": now() + 30}));
    assert!(check(&a, &bearer(&ec.sign(&nearly))).await.is_ok());

    let no_exp = claims_with("alice", json!({"exp": null}));
    assert_eq!(reason(&a, &ec.sign(&no_exp)).await, "auth_missing_claim");
}

#[tokio::test]
async fn issuer_and_audience_must_match_and_be_present() {
    let dir = TempDir::new();
    let ec = TestKey::es256("ec-1");
    let a = jwt_auth(&dir, &pem_entry(&dir, &ec, "ec-1", "ES256"));
    let sign = |changes| ec.sign(&claims_with("alice", changes));
    assert_eq!(
        reason(&a, &sign(json!({"aud": "another-service"}))).await,
        "auth_bad_audience"
    );
    assert_eq!(
        reason(&a, &sign(json!({"aud": ["x", "y"]}))).await,
        "auth_bad_audience"
    );
    assert_eq!(
        reason(&a, &sign(json!({"iss": "https://evil.example"}))).await,
        "auth_bad_issuer"
    );
    assert_eq!(
        reason(&a, &sign(json!({"iss": null}))).await,
        "auth_missing_claim"
    );
    assert_eq!(
        reason(&a, &sign(json!({"aud": null}))).await,
        "auth_missing_claim"
    );
}

#[tokio::test]
async fn algorithm_is_pinned_per_key() {
    let dir = TempDir::new();
    let ec = TestKey::es256("ec-1");
    let ed = TestKey::ed25519("ed-1");
    let rsa = TestKey::rs256("rsa-rs");
    // The same RSA public key twice: once pinned to RS256, once to PS256.
    let a = jwt_auth(
        &dir,
        &format!(
            "{}{}{}",
            pem_entry(&dir, &ec, "ec-1", "ES256"),
            pem_entry(&dir, &rsa, "rsa-rs", "RS256"),
            pem_entry(&dir, &rsa, "rsa-ps", "PS256"),
        ),
    );
    let claims = good_claims("alice");

    // Another key and algorithm under the pinned kid.
    let other = ed.sign_as(Algorithm::EdDSA, Some("ec-1"), &claims);
    assert_eq!(reason(&a, &other).await, "auth_bad_algorithm");

    // `alg: none`, unsigned.
    let none = forged_token(
        &json!({"alg": "none", "typ": "JWT", "kid": "ec-1"}),
        &claims,
        None,
    );
    assert_eq!(reason(&a, &none).await, "auth_bad_algorithm");
    let none_rsa = forged_token(&json!({"alg": "none", "kid": "rsa-rs"}), &claims, None);
    assert_eq!(reason(&a, &none_rsa).await, "auth_bad_algorithm");

    // HS256 keyed with the public key's own bytes (the classic confusion attack).
    for (kid, pem) in [("ec-1", &ec.public_pem), ("rsa-rs", &rsa.public_pem)] {
        let hs = forged_token(
            &json!({"alg": "HS256", "typ": "JWT", "kid": kid}),
            &claims,
            Some(pem.as_bytes()),
        );
        assert_eq!(reason(&a, &hs).await, "auth_bad_algorithm", "{kid}");
    }

    // PS256 signed with the right RSA private key, presented under the RS256-pinned kid: the
    // key could verify it, but the pin refuses it...
    let ps = rsa.sign_as(Algorithm::PS256, Some("rsa-rs"), &claims);
    assert_eq!(reason(&a, &ps).await, "auth_bad_algorithm");
    // ...while the PS256-pinned kid for the same key accepts it, and RS256 works on its own kid.
    let ps_ok = rsa.sign_as(Algorithm::PS256, Some("rsa-ps"), &claims);
    assert!(check(&a, &bearer(&ps_ok)).await.is_ok());
    assert!(check(&a, &bearer(&rsa.sign(&claims))).await.is_ok());

    // Right algorithm, wrong key.
    let impostor = TestKey::es256("ec-1");
    assert_eq!(
        reason(&a, &impostor.sign(&claims)).await,
        "auth_bad_signature"
    );
}

#[tokio::test]
async fn kid_selects_the_key() {
    let dir = TempDir::new();
    let ec = TestKey::es256("ec-1");
    let two = TestKey::es256("ec-2");
    let a = jwt_auth(
        &dir,
        &format!(
            "{}{}",
            pem_entry(&dir, &ec, "ec-1", "ES256"),
            pem_entry(&dir, &two, "ec-2", "ES256")
        ),
    );
    let claims = good_claims("alice");
    assert_eq!(
        reason(&a, &ec.sign_as(Algorithm::ES256, Some("nope"), &claims)).await,
        "auth_unknown_kid"
    );
    // With several keys, a token must say which one it used.
    assert_eq!(
        reason(&a, &ec.sign_as(Algorithm::ES256, None, &claims)).await,
        "auth_unknown_kid"
    );

    // With exactly one key, a token without kid is verified with it.
    let dir1 = TempDir::new();
    let single = jwt_auth(&dir1, &pem_entry(&dir1, &ec, "ec-1", "ES256"));
    let p = check(
        &single,
        &bearer(&ec.sign_as(Algorithm::ES256, None, &claims)),
    )
    .await
    .unwrap();
    assert_eq!(p.as_str(), "https://issuer.example#alice");
}

#[tokio::test]
async fn missing_and_malformed_credentials() {
    let dir = TempDir::new();
    let ec = TestKey::es256("ec-1");
    let a = jwt_auth(&dir, &pem_entry(&dir, &ec, "ec-1", "ES256"));

    let e = check(&a, &HeaderMap::new()).await.unwrap_err();
    assert_eq!(e.failure, AuthFailure::Missing);
    assert_eq!(e.www_authenticate(), "Bearer realm=\"mrtr-gateway\"");

    let mut basic = HeaderMap::new();
    basic.insert(
        AUTHORIZATION,
        HeaderValue::from_static("Basic YWxpY2U6cHc="),
    );
    assert_eq!(
        check(&a, &basic).await.unwrap_err().failure,
        AuthFailure::Missing
    );

    for garbage in ["not-a-jwt", "a.b", "a.b.c.d", "!!!.e30.sig", "e30.e30.sig"] {
        assert_eq!(reason(&a, garbage).await, "auth_malformed", "{garbage}");
    }
    let mut empty = HeaderMap::new();
    empty.insert(AUTHORIZATION, HeaderValue::from_static("Bearer "));
    assert_eq!(
        check(&a, &empty).await.unwrap_err().failure,
        AuthFailure::Malformed
    );

    // A critical header extension the gateway does not understand.
    let claims = good_claims("alice");
    let crit = forged_token(
        &json!({"alg": "ES256", "kid": "ec-1", "crit": ["exp"], "exp": 1}),
        &claims,
        None,
    );
    assert_eq!(reason(&a, &crit).await, "auth_malformed");
}

#[tokio::test]
async fn rejection_is_a_401_challenge_that_never_echoes_the_token() {
    let dir = TempDir::new();
    let ec = TestKey::es256("ec-1");
    let a = jwt_auth(&dir, &pem_entry(&dir, &ec, "ec-1", "ES256"));
    let expired = ec.sign(&claims_with("alice", json!({"exp": now() - 3600})));
    let bad_sig = TestKey::es256("ec-1").sign(&good_claims("alice"));
    for token in [expired, bad_sig, "e30.e30.c2ln".to_string()] {
        let err = check(&a, &bearer(&token)).await.unwrap_err();
        let rej = Rejection::from(err);
        assert_eq!(rej.fault(), crate::error::Fault::Client);
        let r = crate::front::error_map::answer(&rej);
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(r.error.code, -32600);
        let challenge = r
            .headers
            .iter()
            .find(|(n, _)| *n == WWW_AUTHENTICATE)
            .expect("WWW-Authenticate present")
            .1
            .to_str()
            .unwrap();
        assert!(challenge.starts_with("Bearer realm=\"mrtr-gateway\", error=\"invalid_token\""));
        assert!(challenge.contains("error_description=\""), "{challenge}");
        assert!(HeaderValue::from_str(challenge).is_ok());
        let everything = format!("{challenge} {} {:?}", r.error.message, r.error.data);
        for part in token.split('.').filter(|p| p.len() > 3) {
            assert!(
                !everything.contains(part),
                "token part leaked: {everything}"
            );
        }
    }
    let expired = check(&a, &bearer(&ec.sign(&claims_with("a", json!({"exp": 1})))))
        .await
        .unwrap_err();
    assert_eq!(Rejection::from(expired).message(), "token has expired");
}

#[tokio::test]
async fn jwks_file_keys_are_loaded_at_startup() {
    let dir = TempDir::new();
    let ec = TestKey::es256("file-ec");
    let ed = TestKey::ed25519("file-ed");
    let mut enc_key = ec.jwk.clone().unwrap();
    enc_key["kid"] = json!("encryption-only");
    enc_key["use"] = json!("enc");
    dir.write(
        "keys.json",
        &jwks(&[ec.jwk.as_ref().unwrap(), ed.jwk.as_ref().unwrap(), &enc_key]),
    );
    let a = jwt_auth(&dir, "jwks_file = \"keys.json\"\n");
    assert!(
        check(&a, &bearer(&ec.sign(&good_claims("a"))))
            .await
            .is_ok()
    );
    assert!(
        check(&a, &bearer(&ed.sign(&good_claims("b"))))
            .await
            .is_ok()
    );
    let via_enc = ec.sign_as(Algorithm::ES256, Some("encryption-only"), &good_claims("a"));
    assert_eq!(reason(&a, &via_enc).await, "auth_unknown_kid");
}

fn url_config(server: &JwksServer, extra: &str) -> String {
    format!(
        "jwks_url = \"{}\"\njwks_allow_http = true\njwks_min_refresh_interval = \"30s\"\n{extra}",
        server.url()
    )
}

#[tokio::test]
async fn unknown_kid_fetches_once_per_interval_and_finds_rotated_keys() {
    let a_key = TestKey::es256("kid-a");
    let b_key = TestKey::es256("kid-b");
    let server = JwksServer::start(jwks(&[a_key.jwk.as_ref().unwrap()])).await;
    let dir = TempDir::new();
    let a = jwt_auth(&dir, &url_config(&server, ""));
    let claims = good_claims("alice");

    // First use loads the set.
    assert!(check(&a, &bearer(&a_key.sign(&claims))).await.is_ok());
    assert_eq!(server.fetches(), 1);
    // A known kid does not fetch again.
    assert!(check(&a, &bearer(&a_key.sign(&claims))).await.is_ok());
    assert_eq!(server.fetches(), 1);

    // Past the minimum interval, an unknown kid triggers exactly one fetch.
    remote(&a).age_by(Duration::from_secs(31)).await;
    assert_eq!(reason(&a, &b_key.sign(&claims)).await, "auth_unknown_kid");
    assert_eq!(server.fetches(), 2);

    // Within the interval, other unknown kids (and the same one) fetch nothing.
    let c_key = TestKey::es256("kid-c");
    assert_eq!(reason(&a, &c_key.sign(&claims)).await, "auth_unknown_kid");
    server.set_body(jwks(&[
        a_key.jwk.as_ref().unwrap(),
        b_key.jwk.as_ref().unwrap(),
    ]));
    assert_eq!(reason(&a, &b_key.sign(&claims)).await, "auth_unknown_kid");
    assert_eq!(server.fetches(), 2);
    assert_eq!(a.counters().snapshot().unknown_kid_rate_limited, 2);

    // Once the interval has passed, the rotated-in key is fetched and accepted.
    remote(&a).age_by(Duration::from_secs(31)).await;
    let p = check(&a, &bearer(&b_key.sign(&claims))).await.unwrap();
    assert_eq!(p.as_str(), "https://issuer.example#alice");
    assert_eq!(server.fetches(), 3);
    assert_eq!(a.counters().snapshot().fetch_ok, 3);
}

#[tokio::test]
async fn concurrent_unknown_kids_share_one_fetch() {
    let key = TestKey::es256("kid-a");
    let server = JwksServer::start(jwks(&[key.jwk.as_ref().unwrap()])).await;
    server.hold_responses();
    let dir = TempDir::new();
    let a = Arc::new(jwt_auth(&dir, &url_config(&server, "")));
    let token = key.sign(&good_claims("alice"));

    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let a = Arc::clone(&a);
            let token = token.clone();
            tokio::spawn(async move { check(&a, &bearer(&token)).await })
        })
        .collect();
    // One request is fetching (the server holds its response), four wait behind it.
    JwksServer::until("one fetch in flight and four waiters", || {
        server.fetches() == 1 && remote(&a).waiting() == 4
    })
    .await;
    server.release(1);
    for t in tasks {
        let p = t.await.unwrap().unwrap();
        assert_eq!(p.as_str(), "https://issuer.example#alice");
    }
    assert_eq!(server.fetches(), 1);
}

#[tokio::test]
async fn stale_key_set_is_refreshed_in_the_background() {
    let a_key = TestKey::es256("kid-a");
    let b_key = TestKey::es256("kid-b");
    let server = JwksServer::start(jwks(&[a_key.jwk.as_ref().unwrap()])).await;
    let dir = TempDir::new();
    let a = jwt_auth(&dir, &url_config(&server, "jwks_refresh = \"10m\"\n"));
    assert!(a.prefetch_keys().await);
    assert_eq!(server.fetches(), 1);

    server.set_body(jwks(&[
        a_key.jwk.as_ref().unwrap(),
        b_key.jwk.as_ref().unwrap(),
    ]));
    // Not stale yet: a request does not refresh.
    assert!(
        check(&a, &bearer(&a_key.sign(&good_claims("x"))))
            .await
            .is_ok()
    );
    assert_eq!(server.fetches(), 1);

    // Stale: the request is answered from the cache and a refresh starts behind it.
    remote(&a).age_by(Duration::from_secs(601)).await;
    assert!(
        check(&a, &bearer(&a_key.sign(&good_claims("x"))))
            .await
            .is_ok()
    );
    JwksServer::until("background refresh", || {
        a.counters().snapshot().fetch_ok == 2
    })
    .await;
    assert_eq!(server.fetches(), 2);

    // The refreshed set already has kid-b: no unknown-kid fetch is needed.
    assert!(
        check(&a, &bearer(&b_key.sign(&good_claims("y"))))
            .await
            .is_ok()
    );
    assert_eq!(server.fetches(), 2);
}

#[tokio::test]
async fn failing_jwks_endpoint_is_a_503_not_the_clients_fault() {
    let key = TestKey::es256("kid-a");
    let server = JwksServer::start(jwks(&[key.jwk.as_ref().unwrap()])).await;
    server.set_status(StatusCode::INTERNAL_SERVER_ERROR);
    let dir = TempDir::new();
    let a = jwt_auth(&dir, &url_config(&server, ""));
    let err = check(&a, &bearer(&key.sign(&good_claims("a"))))
        .await
        .unwrap_err();
    assert_eq!(err.failure, AuthFailure::KeysUnavailable);
    let r = Rejection::from(err);
    let answer = crate::front::error_map::answer(&r);
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        answer.headers.iter().all(|(n, _)| n != WWW_AUTHENTICATE),
        "no challenge: the caller did nothing wrong"
    );
    assert_eq!(r.fault(), crate::error::Fault::Internal);
    assert_eq!(r.reason(), "auth_keys_unavailable");
    assert_eq!(a.counters().snapshot().fetch_bad_status, 1);
    assert!(!a.prefetch_keys().await, "rate-limited, still no keys");
    assert_eq!(server.fetches(), 1);
}

#[tokio::test]
async fn jwks_body_size_is_bounded() {
    let key = TestKey::es256("kid-a");
    let server = JwksServer::start(jwks(&[key.jwk.as_ref().unwrap()])).await;
    let dir = TempDir::new();
    let a = jwt_auth(&dir, &url_config(&server, "jwks_max_bytes = 64\n"));
    assert_eq!(
        reason(&a, &key.sign(&good_claims("a"))).await,
        "auth_keys_unavailable"
    );
    assert_eq!(a.counters().snapshot().fetch_too_large, 1);
    assert_eq!(a.counters().snapshot().fetch_ok, 0);
}

#[tokio::test]
async fn jwks_fetch_is_bounded_in_time() {
    let key = TestKey::es256("kid-a");
    let server = JwksServer::start(jwks(&[key.jwk.as_ref().unwrap()])).await;
    server.hold_responses();
    let dir = TempDir::new();
    let a = jwt_auth(
        &dir,
        &url_config(&server, "jwks_fetch_timeout = \"200ms\"\n"),
    );
    let started = std::time::Instant::now();
    assert_eq!(
        reason(&a, &key.sign(&good_claims("a"))).await,
        "auth_keys_unavailable"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(a.counters().snapshot().fetch_timeout, 1);
}

#[tokio::test]
async fn alg_none_and_hs256_never_cause_a_jwks_fetch() {
    let key = TestKey::es256("kid-a");
    let server = JwksServer::start(jwks(&[key.jwk.as_ref().unwrap()])).await;
    let dir = TempDir::new();
    let a = jwt_auth(&dir, &url_config(&server, ""));
    let claims = good_claims("a");
    let none = forged_token(&json!({"alg": "none", "kid": "fresh-kid"}), &claims, None);
    assert_eq!(reason(&a, &none).await, "auth_bad_algorithm");
    let hs = forged_token(
        &json!({"alg": "HS256", "kid": "other"}),
        &claims,
        Some(b"secret"),
    );
    assert_eq!(reason(&a, &hs).await, "auth_bad_algorithm");
    assert_eq!(server.fetches(), 0);
}

#[tokio::test]
async fn a_request_that_goes_away_does_not_cancel_the_fetch() {
    let key = TestKey::es256("kid-a");
    let server = JwksServer::start(jwks(&[key.jwk.as_ref().unwrap()])).await;
    server.hold_responses();
    let dir = TempDir::new();
    let a = Arc::new(jwt_auth(&dir, &url_config(&server, "")));
    let token = key.sign(&good_claims("alice"));

    let first = {
        let (a, token) = (Arc::clone(&a), token.clone());
        tokio::spawn(async move { check(&a, &bearer(&token)).await })
    };
    JwksServer::until("fetch in flight", || server.fetches() == 1).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    server.release(1);
    JwksServer::until("fetch completed", || a.counters().snapshot().fetch_ok == 1).await;

    // The keys the abandoned request was waiting for are in place; no second fetch.
    assert!(check(&a, &bearer(&token)).await.is_ok());
    assert_eq!(server.fetches(), 1);
    assert_eq!(remote(&a).waiting(), 0);
}
