//! Tests of the `[auth]` section: defaults, key names in errors, key files, JWKS sources and
//! the upstream token, through whole configuration files.

use super::*;
use crate::auth::test_tokens::{TempDir, TestKey};
use crate::config::Config;

const STATE_KEY: &str =
    "[[state.keys]]\nid = \"k1\"\nsecret = \"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"\n";

/// Loads a whole gateway config whose `[auth]` part is `auth`, with files under `dir`.
fn load(auth: &str, dir: Option<&TempDir>) -> Result<Config, ConfigError> {
    Config::from_toml_str(&format!("{STATE_KEY}{auth}"), &[], dir.map(|d| d.path()))
}

fn err(auth: &str, dir: Option<&TempDir>) -> ConfigError {
    load(auth, dir).expect_err("config should be refused")
}

const JWT_HEAD: &str =
    "[auth]\nmode = \"jwt\"\n[auth.jwt]\nissuer = \"https://iss\"\naudiences = [\"gw\"]\n";

#[test]
fn absent_section_means_no_authentication() {
    let c = load("", None).unwrap();
    assert!(matches!(c.auth.mode, ModeConfig::None));
    assert!(matches!(c.auth.upstream, UpstreamCredentials::None));
}

#[test]
fn the_example_file_loads_with_auth_off() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/gateway.toml");
    let c = Config::load(&path).unwrap();
    assert!(matches!(c.auth.mode, ModeConfig::None));
    let text = std::fs::read_to_string(&path).unwrap();
    let tree: toml::Table = text.parse().unwrap();
    let written = tree["auth"].as_table().unwrap();
    assert_eq!(written["mode"].as_str(), Some("none"));
}

#[test]
fn unknown_keys_are_named() {
    let e = err("[auth]\nbogus = 1\n", None);
    assert!(e.key.starts_with("auth"), "{e}");
    assert!(e.message.contains("bogus"), "{e}");
    let e = err("[auth.jwt]\njwks_ur = \"https://x\"\n", None);
    assert!(e.key.starts_with("auth.jwt"), "{e}");
    assert!(e.message.contains("jwks_ur"), "{e}");
    let e = err(
        "[[auth.jwt.keys]]\nkid = \"a\"\nalgorithm = \"ES256\"\npem_file = \"x\"\nextra = 1\n",
        None,
    );
    assert!(e.key.starts_with("auth.jwt.keys"), "{e}");
}

#[test]
fn bad_values_name_their_key() {
    let cases: &[(&str, &str)] = &[
        ("[auth]\nmode = \"kerberos\"\n", "auth.mode"),
        ("[auth]\nmode = \"jwt\"\n", "auth.jwt.issuer"),
        (
            "[auth]\nmode = \"jwt\"\n[auth.jwt]\nissuer = \"https://iss\"\n",
            "auth.jwt.audiences",
        ),
        (JWT_HEAD, "auth.jwt"),
        (&format!("{JWT_HEAD}leeway = \"1h\"\n"), "auth.jwt.leeway"),
        (&format!("{JWT_HEAD}leeway = \"60\"\n"), "auth.jwt.leeway"),
        (
            &format!("{JWT_HEAD}jwks_url = \"http://idp.internal/jwks\"\n"),
            "auth.jwt.jwks_url",
        ),
        (
            &format!("{JWT_HEAD}jwks_url = \"ftp://idp/jwks\"\njwks_allow_http = true\n"),
            "auth.jwt.jwks_url",
        ),
        (
            &format!("{JWT_HEAD}jwks_url = \"https://idp/jwks\"\njwks_refresh = \"0s\"\n"),
            "auth.jwt.jwks_refresh",
        ),
        (
            &format!("{JWT_HEAD}jwks_url = \"https://idp/jwks\"\njwks_max_bytes = 0\n"),
            "auth.jwt.jwks_max_bytes",
        ),
        (
            &format!("{JWT_HEAD}jwks_url = \"https://idp/jwks\"\njwks_rsa_algorithm = \"ES256\"\n"),
            "auth.jwt.jwks_rsa_algorithm",
        ),
        (
            &format!("{JWT_HEAD}jwks_file = \"/nonexistent/jwks.json\"\n"),
            "auth.jwt.jwks_file",
        ),
        (
            "[auth]\nmode = \"header\"\n[auth.header]\nname = \"bad name\"\n",
            "auth.header.name",
        ),
        (
            "[auth]\nmode = \"header\"\n[auth.header]\nname = \"authorization\"\n",
            "auth.header.name",
        ),
        (
            "[auth]\nmode = \"header\"\n[auth.header]\ntrusted_sources = []\n",
            "auth.header.trusted_sources",
        ),
        (
            "[auth]\nmode = \"header\"\n[auth.header]\ntrusted_sources = [\"10.0.0.0/8\", \"nope\"]\n",
            "auth.header.trusted_sources[1]",
        ),
        (
            "[auth]\nmode = \"mtls\"\n[auth.mtls]\nidentity = \"email\"\n",
            "auth.mtls.identity",
        ),
        (
            "[auth]\nupstream_credentials = \"kerberos\"\n",
            "auth.upstream_credentials",
        ),
        (
            "[auth]\nupstream_credentials = \"static\"\n",
            "auth.upstream_token_file",
        ),
        (
            "[auth]\nupstream_credentials = \"static\"\nupstream_token_file = \"/nonexistent/t\"\n",
            "auth.upstream_token_file",
        ),
        (
            "[auth]\nupstream_credentials = \"forward\"\nupstream_token_file = \"t\"\n",
            "auth.upstream_token_file",
        ),
    ];
    for (text, key) in cases {
        let e = err(text, None);
        assert_eq!(&e.key, key, "for {text:?}: {e}");
    }
}

fn key_entry(i_kid: &str, alg: &str, file: &str) -> String {
    format!("[[auth.jwt.keys]]\nkid = \"{i_kid}\"\nalgorithm = \"{alg}\"\npem_file = \"{file}\"\n")
}

#[test]
fn jwt_key_problems_name_the_entry() {
    let dir = TempDir::new();
    let ec = TestKey::es256("a");
    dir.write("ec.pem", &ec.public_pem);

    let e = err(
        &format!("{JWT_HEAD}{}", key_entry("a", "HS256", "ec.pem")),
        Some(&dir),
    );
    assert_eq!(e.key, "auth.jwt.keys[0].algorithm");
    assert!(e.message.contains("symmetric"), "{e}");
    let e = err(
        &format!("{JWT_HEAD}{}", key_entry("a", "RS999", "ec.pem")),
        Some(&dir),
    );
    assert_eq!(e.key, "auth.jwt.keys[0].algorithm");
    let e = err(
        &format!(
            "{JWT_HEAD}{}{}",
            key_entry("a", "ES256", "ec.pem"),
            key_entry("b", "ES256", "missing.pem")
        ),
        Some(&dir),
    );
    assert_eq!(e.key, "auth.jwt.keys[1].pem_file");
    assert!(e.message.contains("missing.pem"), "{e}");
    let e = err(
        &format!(
            "{JWT_HEAD}{}{}",
            key_entry("a", "ES256", "ec.pem"),
            key_entry("a", "ES256", "ec.pem")
        ),
        Some(&dir),
    );
    assert_eq!(e.key, "auth.jwt.keys[1].kid");

    // A key file that is not a key of the pinned type.
    dir.write(
        "junk.pem",
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    );
    let e = err(
        &format!("{JWT_HEAD}{}", key_entry("a", "ES256", "junk.pem")),
        Some(&dir),
    );
    assert_eq!(e.key, "auth.jwt.keys[0].pem_file");
    let rsa_as_ec = TestKey::rs256("r");
    dir.write("rsa.pem", &rsa_as_ec.public_pem);
    let e = err(
        &format!("{JWT_HEAD}{}", key_entry("a", "ES256", "rsa.pem")),
        Some(&dir),
    );
    assert_eq!(e.key, "auth.jwt.keys[0].pem_file");

    // A private key is refused outright.
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    dir.write("private.pem", &kp.serialize_pem());
    let e = err(
        &format!("{JWT_HEAD}{}", key_entry("a", "ES256", "private.pem")),
        Some(&dir),
    );
    assert_eq!(e.key, "auth.jwt.keys[0].pem_file");
    assert!(e.message.contains("private key"), "{e}");

    // The good entry loads, relative to the config directory.
    let c = load(
        &format!("{JWT_HEAD}{}", key_entry("a", "ES256", "ec.pem")),
        Some(&dir),
    )
    .unwrap();
    let ModeConfig::Jwt(jwt) = c.auth.mode else {
        panic!("jwt mode expected")
    };
    assert_eq!(jwt.static_keys.len(), 1);
    assert_eq!(jwt.static_keys[0].algorithm, Algorithm::ES256);
    assert_eq!(jwt.leeway, Duration::from_secs(60));
    assert_eq!(jwt.principal_claim, "sub");
}

#[test]
fn jwks_file_with_an_unusable_key_is_refused() {
    let dir = TempDir::new();
    dir.write(
        "jwks.json",
        r#"{"keys":[{"kty":"oct","kid":"shared","k":"c2VjcmV0"}]}"#,
    );
    let e = err(
        &format!("{JWT_HEAD}jwks_file = \"jwks.json\"\n"),
        Some(&dir),
    );
    assert_eq!(e.key, "auth.jwt.jwks_file");
    assert!(e.message.contains("symmetric"), "{e}");
    dir.write("bad.json", "{\"not\": \"a jwks\"}");
    let e = err(&format!("{JWT_HEAD}jwks_file = \"bad.json\"\n"), Some(&dir));
    assert_eq!(e.key, "auth.jwt.jwks_file");
}

#[test]
fn remote_jwks_defaults() {
    let c = load(
        &format!("{JWT_HEAD}jwks_url = \"https://idp.example/jwks\"\n"),
        None,
    )
    .unwrap();
    let ModeConfig::Jwt(jwt) = c.auth.mode else {
        panic!("jwt mode expected")
    };
    let r = jwt.remote.unwrap();
    assert_eq!(r.refresh, Duration::from_secs(600));
    assert_eq!(r.min_refresh_interval, Duration::from_secs(30));
    assert_eq!(r.fetch_timeout, Duration::from_secs(5));
    assert_eq!(r.max_bytes, 256 * 1024);
    assert_eq!(r.rsa_algorithm, Algorithm::RS256);
    assert!(!r.allow_http);
}

#[test]
fn header_and_mtls_sections_parse() {
    let c = load(
        "[auth]\nmode = \"header\"\n[auth.header]\ntrusted_sources = [\"10.0.0.7\", \"fd00::/8\"]\nprefix = \"proxy:\"\n",
        None,
    )
    .unwrap();
    let ModeConfig::Header(h) = c.auth.mode else {
        panic!("header mode expected")
    };
    assert_eq!(h.name.as_str(), "x-authenticated-user");
    assert_eq!(h.trusted_sources[0].to_string(), "10.0.0.7/32");
    assert_eq!(h.prefix, "proxy:");
    let c = load(
        "[auth]\nmode = \"mtls\"\n[auth.mtls]\nidentity = \"san_uri\"\n",
        None,
    )
    .unwrap();
    let ModeConfig::Mtls(m) = c.auth.mode else {
        panic!("mtls mode expected")
    };
    assert_eq!(m.identity, CertIdentity::SanUri);
}

#[test]
fn static_upstream_token_is_read_and_trimmed() {
    let dir = TempDir::new();
    dir.write("token", "  s3rvice-token\n");
    let c = load(
        "[auth]\nupstream_credentials = \"static\"\nupstream_token_file = \"token\"\n",
        Some(&dir),
    )
    .unwrap();
    let out = c.auth.upstream.upstream_headers(&http::HeaderMap::new());
    assert_eq!(
        out.get(http::header::AUTHORIZATION).unwrap(),
        "Bearer s3rvice-token"
    );
    assert!(!format!("{:?}", c.auth).contains("s3rvice-token"));
    dir.write("empty", "\n");
    let e = err(
        "[auth]\nupstream_credentials = \"static\"\nupstream_token_file = \"empty\"\n",
        Some(&dir),
    );
    assert_eq!(e.key, "auth.upstream_token_file");
}

#[test]
fn environment_overrides_reach_the_auth_section() {
    let vars = vec![("MRTR_GATEWAY__AUTH__MODE".to_string(), "jwt".to_string())];
    let e = Config::from_toml_str(STATE_KEY, &vars, None).unwrap_err();
    assert_eq!(e.key, "auth.jwt.issuer");
}
