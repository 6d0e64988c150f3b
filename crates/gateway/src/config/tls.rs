//! `[tls]`: front TLS, the certificate the MCP listener serves and whether (and against which
//! CA) it asks clients for theirs.

use std::path::{Path, PathBuf};

use super::check::resolve;
use super::{ConfigError, raw::RawTls};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    Optional,
    Required,
}

#[derive(Debug, Clone)]
pub struct TlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_ca_file: Option<PathBuf>,
    pub client_auth: ClientAuth,
}

pub(super) fn tls_config(
    raw: &RawTls,
    base_dir: Option<&Path>,
) -> Result<Option<TlsConfig>, ConfigError> {
    let client_auth = match raw.client_auth.as_str() {
        "none" => ClientAuth::None,
        "optional" => ClientAuth::Optional,
        "required" => ClientAuth::Required,
        other => {
            return Err(ConfigError::new(
                "tls.client_auth",
                format!("must be \"none\", \"optional\" or \"required\", not {other:?}"),
            ));
        }
    };
    let (cert, key) = match (&raw.cert_file, &raw.key_file) {
        (None, None) => {
            if raw.client_ca_file.is_some() || client_auth != ClientAuth::None {
                return Err(ConfigError::new(
                    "tls.cert_file",
                    "client certificates need front TLS: set tls.cert_file and tls.key_file",
                ));
            }
            return Ok(None);
        }
        (Some(c), Some(k)) => (resolve(base_dir, c), resolve(base_dir, k)),
        (Some(_), None) => {
            return Err(ConfigError::new(
                "tls.key_file",
                "required with tls.cert_file",
            ));
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                "tls.cert_file",
                "required with tls.key_file",
            ));
        }
    };
    for (key_name, path) in [("tls.cert_file", &cert), ("tls.key_file", &key)] {
        if !path.is_file() {
            return Err(ConfigError::new(
                key_name,
                format!("cannot read {}", path.display()),
            ));
        }
    }
    let client_ca_file = raw.client_ca_file.as_ref().map(|f| resolve(base_dir, f));
    if let Some(ca) = &client_ca_file
        && !ca.is_file()
    {
        return Err(ConfigError::new(
            "tls.client_ca_file",
            format!("cannot read {}", ca.display()),
        ));
    }
    if client_auth != ClientAuth::None && client_ca_file.is_none() {
        return Err(ConfigError::new(
            "tls.client_ca_file",
            "required when tls.client_auth is \"optional\" or \"required\"",
        ));
    }
    Ok(Some(TlsConfig {
        cert_file: cert,
        key_file: key,
        client_ca_file,
        client_auth,
    }))
}
