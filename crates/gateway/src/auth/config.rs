//! The `[auth]` configuration section: the raw TOML shape and its validation into typed values.
//!
//! Validation loads everything a request would otherwise touch (PEM public keys, a JWKS file,
//! the upstream token), so a bad file is a startup error naming its key, never a 500 later.
//! Only the section of the active mode is checked in depth: a `[auth.jwt]` block left behind
//! while `mode = "header"` does not stop the gateway, but its key names are still checked by
//! serde (`deny_unknown_fields`).
//!
//! Reloading keys means validating the file again and building a new
//! [`super::Authenticator`] from the result: that re-reads the PEM files, the JWKS file and the
//! upstream token file.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use ipnet::IpNet;
use jsonwebtoken::Algorithm;
use serde::Deserialize;

use super::keys::{self, VerifyKey};
use super::upstream_credentials::{StaticCredential, UpstreamCredentials};
use crate::setting::{ConfigError, parse_duration};

/// Longest `leeway` accepted: a larger tolerance would make `exp` meaningless.
pub const MAX_LEEWAY: Duration = Duration::from_secs(600);

/// `[auth]` as written by operators.
#[derive(Debug, Deserialize, serde::Serialize, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct RawAuth {
    pub mode: String,
    pub upstream_credentials: String,
    pub upstream_token_file: Option<String>,
    pub jwt: RawJwt,
    pub header: RawHeaderAuth,
    pub mtls: RawMtls,
}

impl Default for RawAuth {
    fn default() -> Self {
        RawAuth {
            mode: "none".into(),
            upstream_credentials: "none".into(),
            upstream_token_file: None,
            jwt: RawJwt::default(),
            header: RawHeaderAuth::default(),
            mtls: RawMtls::default(),
        }
    }
}

/// `[auth.jwt]`.
#[derive(Debug, Deserialize, serde::Serialize, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct RawJwt {
    pub issuer: Option<String>,
    pub audiences: Vec<String>,
    pub leeway: String,
    pub principal_claim: String,
    pub keys: Vec<RawJwtKey>,
    pub jwks_file: Option<String>,
    pub jwks_url: Option<String>,
    pub jwks_allow_http: bool,
    pub jwks_refresh: String,
    pub jwks_min_refresh_interval: String,
    pub jwks_fetch_timeout: String,
    pub jwks_max_bytes: u64,
    pub jwks_rsa_algorithm: String,
}

impl Default for RawJwt {
    fn default() -> Self {
        RawJwt {
            issuer: None,
            audiences: Vec::new(),
            leeway: "60s".into(),
            principal_claim: "sub".into(),
            keys: Vec::new(),
            jwks_file: None,
            jwks_url: None,
            jwks_allow_http: false,
            jwks_refresh: "10m".into(),
            jwks_min_refresh_interval: "30s".into(),
            jwks_fetch_timeout: "5s".into(),
            jwks_max_bytes: 256 * 1024,
            jwks_rsa_algorithm: "RS256".into(),
        }
    }
}

/// One `[[auth.jwt.keys]]` entry: a public key in a PEM file, pinned to one algorithm.
#[derive(Debug, Deserialize, serde::Serialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RawJwtKey {
    pub kid: String,
    pub algorithm: String,
    pub pem_file: String,
}

/// `[auth.header]`.
#[derive(Debug, Deserialize, serde::Serialize, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct RawHeaderAuth {
    pub name: String,
    pub trusted_sources: Vec<String>,
    pub prefix: String,
}

impl Default for RawHeaderAuth {
    fn default() -> Self {
        RawHeaderAuth {
            name: "x-authenticated-user".into(),
            trusted_sources: vec!["127.0.0.1/32".into(), "::1/128".into()],
            prefix: String::new(),
        }
    }
}

/// `[auth.mtls]`.
#[derive(Debug, Deserialize, serde::Serialize, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct RawMtls {
    pub identity: String,
}

impl Default for RawMtls {
    fn default() -> Self {
        RawMtls {
            identity: "subject_cn".into(),
        }
    }
}

/// The validated `[auth]` section.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub mode: ModeConfig,
    pub upstream: UpstreamCredentials,
}

impl Default for AuthConfig {
    /// No client authentication, nothing sent upstream.
    fn default() -> Self {
        AuthConfig {
            mode: ModeConfig::None,
            upstream: UpstreamCredentials::None,
        }
    }
}

/// The active mode with its settings.
#[derive(Debug, Clone)]
pub enum ModeConfig {
    None,
    Jwt(JwtConfig),
    Header(HeaderAuthConfig),
    Mtls(MtlsConfig),
}

#[derive(Debug, Clone)]
pub struct JwtConfig {
    pub issuer: String,
    pub audiences: Vec<String>,
    pub leeway: Duration,
    pub principal_claim: String,
    /// Keys known at load time: the PEM files, then the JWKS file.
    pub static_keys: Vec<VerifyKey>,
    pub remote: Option<RemoteJwksConfig>,
}

/// A JWKS document fetched over HTTP(S) and kept fresh.
#[derive(Debug, Clone)]
pub struct RemoteJwksConfig {
    pub url: url::Url,
    pub allow_http: bool,
    pub refresh: Duration,
    pub min_refresh_interval: Duration,
    pub fetch_timeout: Duration,
    pub max_bytes: usize,
    /// Algorithm given to RSA keys whose JWK does not name one.
    pub rsa_algorithm: Algorithm,
}

#[derive(Debug, Clone)]
pub struct HeaderAuthConfig {
    pub name: HeaderName,
    pub trusted_sources: Vec<IpNet>,
    pub prefix: String,
}

/// Which part of the client certificate names the principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertIdentity {
    SubjectCn,
    SanUri,
    SanDns,
    Subject,
}

#[derive(Debug, Clone)]
pub struct MtlsConfig {
    pub identity: CertIdentity,
}

impl AuthConfig {
    /// Validates `[auth]`; relative file names resolve against `base_dir`.
    pub fn from_raw(raw: &RawAuth, base_dir: Option<&Path>) -> Result<AuthConfig, ConfigError> {
        let mode = match raw.mode.as_str() {
            "none" => ModeConfig::None,
            "jwt" => ModeConfig::Jwt(jwt_config(&raw.jwt, base_dir)?),
            "header" => ModeConfig::Header(header_config(&raw.header)?),
            "mtls" => ModeConfig::Mtls(mtls_config(&raw.mtls)?),
            other => {
                return Err(ConfigError::new(
                    "auth.mode",
                    format!("must be \"none\", \"jwt\", \"header\" or \"mtls\", not {other:?}"),
                ));
            }
        };
        let upstream = upstream_config(raw, base_dir)?;
        Ok(AuthConfig { mode, upstream })
    }
}

fn jwt_config(raw: &RawJwt, base_dir: Option<&Path>) -> Result<JwtConfig, ConfigError> {
    let issuer = match raw.issuer.as_deref().map(str::trim) {
        Some(iss) if !iss.is_empty() => iss.to_string(),
        _ => {
            return Err(ConfigError::new(
                "auth.jwt.issuer",
                "required in jwt mode: the `iss` every accepted token must carry",
            ));
        }
    };
    if raw.audiences.is_empty() {
        return Err(ConfigError::new(
            "auth.jwt.audiences",
            "at least one audience is required in jwt mode (the `aud` this gateway answers to)",
        ));
    }
    if let Some(i) = raw.audiences.iter().position(|a| a.trim().is_empty()) {
        return Err(ConfigError::new(
            format!("auth.jwt.audiences[{i}]"),
            "must not be empty",
        ));
    }
    let leeway = duration("auth.jwt.leeway", &raw.leeway)?;
    if leeway > MAX_LEEWAY {
        return Err(ConfigError::new(
            "auth.jwt.leeway",
            "must be at most \"10m\"",
        ));
    }
    if raw.principal_claim.trim().is_empty() {
        return Err(ConfigError::new(
            "auth.jwt.principal_claim",
            "must name a claim, e.g. \"sub\"",
        ));
    }

    let mut static_keys: Vec<VerifyKey> = Vec::new();
    for (i, k) in raw.keys.iter().enumerate() {
        let at = format!("auth.jwt.keys[{i}]");
        if k.kid.is_empty() {
            return Err(ConfigError::new(format!("{at}.kid"), "must not be empty"));
        }
        if static_keys.iter().any(|seen| seen.kid == k.kid) {
            return Err(ConfigError::new(
                format!("{at}.kid"),
                format!("duplicate kid {:?}", k.kid),
            ));
        }
        let algorithm = keys::parse_algorithm(&k.algorithm)
            .map_err(|m| ConfigError::new(format!("{at}.algorithm"), m))?;
        let pem = read_file(&format!("{at}.pem_file"), base_dir, &k.pem_file)?;
        let key = keys::key_from_pem(&k.kid, algorithm, &pem)
            .map_err(|m| ConfigError::new(format!("{at}.pem_file"), m))?;
        static_keys.push(key);
    }
    if let Some(file) = &raw.jwks_file {
        let text = read_file("auth.jwt.jwks_file", base_dir, file)?;
        let rsa_algorithm = rsa_algorithm(&raw.jwks_rsa_algorithm)?;
        let parsed = keys::keys_from_jwks(&text, rsa_algorithm)
            .map_err(|m| ConfigError::new("auth.jwt.jwks_file", m))?;
        if let Some(problem) = parsed.skipped.first() {
            return Err(ConfigError::new("auth.jwt.jwks_file", problem.clone()));
        }
        for key in parsed.keys {
            if static_keys.iter().any(|seen| seen.kid == key.kid) {
                return Err(ConfigError::new(
                    "auth.jwt.jwks_file",
                    format!("kid {:?} is also configured in auth.jwt.keys", key.kid),
                ));
            }
            static_keys.push(key);
        }
    }
    let remote = match &raw.jwks_url {
        None => None,
        Some(url) => Some(remote_config(raw, url)?),
    };
    if static_keys.is_empty() && remote.is_none() {
        return Err(ConfigError::new(
            "auth.jwt",
            "no verification keys: set [[auth.jwt.keys]], jwks_file or jwks_url",
        ));
    }
    Ok(JwtConfig {
        issuer,
        audiences: raw.audiences.iter().map(|a| a.trim().to_string()).collect(),
        leeway,
        principal_claim: raw.principal_claim.trim().to_string(),
        static_keys,
        remote,
    })
}

fn remote_config(raw: &RawJwt, url: &str) -> Result<RemoteJwksConfig, ConfigError> {
    let parsed = url::Url::parse(url)
        .map_err(|e| ConfigError::new("auth.jwt.jwks_url", format!("not a URL: {e}")))?;
    match parsed.scheme() {
        "https" => {}
        "http" if raw.jwks_allow_http => {}
        "http" => {
            return Err(ConfigError::new(
                "auth.jwt.jwks_url",
                "plain http is refused unless auth.jwt.jwks_allow_http = true",
            ));
        }
        other => {
            return Err(ConfigError::new(
                "auth.jwt.jwks_url",
                format!("scheme must be https (or http when allowed), not {other:?}"),
            ));
        }
    }
    if parsed.host_str().is_none() {
        return Err(ConfigError::new("auth.jwt.jwks_url", "has no host"));
    }
    let max_bytes = match raw.jwks_max_bytes {
        0 => {
            return Err(ConfigError::new(
                "auth.jwt.jwks_max_bytes",
                "must be greater than zero",
            ));
        }
        n => usize::try_from(n)
            .map_err(|_| ConfigError::new("auth.jwt.jwks_max_bytes", "too large"))?,
    };
    Ok(RemoteJwksConfig {
        url: parsed,
        allow_http: raw.jwks_allow_http,
        refresh: nonzero_duration("auth.jwt.jwks_refresh", &raw.jwks_refresh)?,
        min_refresh_interval: nonzero_duration(
            "auth.jwt.jwks_min_refresh_interval",
            &raw.jwks_min_refresh_interval,
        )?,
        fetch_timeout: nonzero_duration("auth.jwt.jwks_fetch_timeout", &raw.jwks_fetch_timeout)?,
        max_bytes,
        rsa_algorithm: rsa_algorithm(&raw.jwks_rsa_algorithm)?,
    })
}

fn rsa_algorithm(name: &str) -> Result<Algorithm, ConfigError> {
    let key = "auth.jwt.jwks_rsa_algorithm";
    let alg = keys::parse_algorithm(name).map_err(|m| ConfigError::new(key, m))?;
    if !keys::is_rsa(alg) {
        return Err(ConfigError::new(
            key,
            "must be an RSA algorithm (RS256, RS384, RS512, PS256, PS384, PS512)",
        ));
    }
    Ok(alg)
}

fn header_config(raw: &RawHeaderAuth) -> Result<HeaderAuthConfig, ConfigError> {
    let name = HeaderName::from_bytes(raw.name.trim().as_bytes()).map_err(|_| {
        ConfigError::new(
            "auth.header.name",
            format!("not a valid HTTP header name: {:?}", raw.name),
        )
    })?;
    if name == http::header::AUTHORIZATION || name == http::header::COOKIE {
        return Err(ConfigError::new(
            "auth.header.name",
            "must be a header the auth proxy sets, not a client credential header",
        ));
    }
    if raw.trusted_sources.is_empty() {
        return Err(ConfigError::new(
            "auth.header.trusted_sources",
            "at least one address or range is required: only the auth proxy may set the header",
        ));
    }
    let mut trusted_sources = Vec::with_capacity(raw.trusted_sources.len());
    for (i, s) in raw.trusted_sources.iter().enumerate() {
        let net = parse_source(s.trim()).ok_or_else(|| {
            ConfigError::new(
                format!("auth.header.trusted_sources[{i}]"),
                format!("not an address or CIDR range: {s:?} (e.g. \"10.0.0.0/8\", \"::1/128\")"),
            )
        })?;
        trusted_sources.push(net);
    }
    Ok(HeaderAuthConfig {
        name,
        trusted_sources,
        prefix: raw.prefix.clone(),
    })
}

/// A CIDR range, or a bare address meaning just that host.
fn parse_source(text: &str) -> Option<IpNet> {
    if let Ok(net) = text.parse::<IpNet>() {
        return Some(net.trunc());
    }
    text.parse::<IpAddr>().ok().map(IpNet::from)
}

fn mtls_config(raw: &RawMtls) -> Result<MtlsConfig, ConfigError> {
    let identity = match raw.identity.as_str() {
        "subject_cn" => CertIdentity::SubjectCn,
        "san_uri" => CertIdentity::SanUri,
        "san_dns" => CertIdentity::SanDns,
        "subject" => CertIdentity::Subject,
        other => {
            return Err(ConfigError::new(
                "auth.mtls.identity",
                format!(
                    "must be \"subject_cn\", \"san_uri\", \"san_dns\" or \"subject\", not {other:?}"
                ),
            ));
        }
    };
    Ok(MtlsConfig { identity })
}

fn upstream_config(
    raw: &RawAuth,
    base_dir: Option<&Path>,
) -> Result<UpstreamCredentials, ConfigError> {
    let token_key = "auth.upstream_token_file";
    match raw.upstream_credentials.as_str() {
        "none" | "forward" if raw.upstream_token_file.is_some() => Err(ConfigError::new(
            token_key,
            "only used with upstream_credentials = \"static\"",
        )),
        "none" => Ok(UpstreamCredentials::None),
        "forward" => Ok(UpstreamCredentials::Forward),
        "static" => {
            let Some(file) = &raw.upstream_token_file else {
                return Err(ConfigError::new(
                    token_key,
                    "required with upstream_credentials = \"static\"",
                ));
            };
            let bytes = read_file(token_key, base_dir, file)?;
            let token = std::str::from_utf8(&bytes)
                .map_err(|_| ConfigError::new(token_key, "token is not UTF-8 text"))?
                .trim();
            if token.is_empty() {
                return Err(ConfigError::new(token_key, "the file is empty"));
            }
            let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                ConfigError::new(
                    token_key,
                    "token contains characters not allowed in an HTTP header",
                )
            })?;
            Ok(UpstreamCredentials::Static(StaticCredential::new(value)))
        }
        other => Err(ConfigError::new(
            "auth.upstream_credentials",
            format!("must be \"none\", \"forward\" or \"static\", not {other:?}"),
        )),
    }
}

fn read_file(key: &str, base_dir: Option<&Path>, file: &str) -> Result<Vec<u8>, ConfigError> {
    if file.trim().is_empty() {
        return Err(ConfigError::new(key, "must name a file"));
    }
    let path = resolve(base_dir, file);
    std::fs::read(&path)
        .map_err(|e| ConfigError::new(key, format!("cannot read {}: {e}", path.display())))
}

fn resolve(base_dir: Option<&Path>, file: &str) -> PathBuf {
    let p = Path::new(file);
    match base_dir {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p.to_path_buf(),
    }
}

fn duration(key: &str, text: &str) -> Result<Duration, ConfigError> {
    parse_duration(text).map_err(|m| ConfigError::new(key, m))
}

fn nonzero_duration(key: &str, text: &str) -> Result<Duration, ConfigError> {
    let d = duration(key, text)?;
    if d.is_zero() {
        return Err(ConfigError::new(key, "must be greater than zero"));
    }
    Ok(d)
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
