//! Front TLS: certificate, key and client-CA files, reloadable without dropping connections.
//!
//! The acceptor for each new connection is built from the configuration in force at accept
//! time; a reload swaps that configuration, so connections already open keep theirs and new
//! ones get the new certificate. ALPN offers HTTP/2 and HTTP/1.1. Client certificates are
//! verified against `tls.client_ca_file` when `tls.client_auth` asks for them; the verified
//! leaf certificate is handed to the request path (the `mtls` auth mode uses it).

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::{ClientAuth, TlsConfig};

pub use crate::tls::provider;

pub struct TlsReloader {
    files: TlsConfig,
    current: ArcSwap<ServerConfig>,
}

fn build(files: &TlsConfig) -> Result<ServerConfig, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert_file)
        .map_err(|e| format!("tls.cert_file {}: {e}", files.cert_file.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls.cert_file {}: {e}", files.cert_file.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "tls.cert_file {}: no certificate in it",
            files.cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key_file)
        .map_err(|e| format!("tls.key_file {}: {e}", files.key_file.display()))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match (&files.client_ca_file, files.client_auth) {
        (Some(ca), mode) if mode != ClientAuth::None => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca)
                .map_err(|e| format!("tls.client_ca_file {}: {e}", ca.display()))?
            {
                let cert = cert.map_err(|e| format!("tls.client_ca_file {}: {e}", ca.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("tls.client_ca_file {}: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            let verifier = if mode == ClientAuth::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| e.to_string())?)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls.cert_file / tls.key_file do not form a usable pair: {e}"))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

impl TlsReloader {
    pub fn load(files: &TlsConfig) -> Result<TlsReloader, String> {
        Ok(TlsReloader {
            current: ArcSwap::from_pointee(build(files)?),
            files: files.clone(),
        })
    }

    /// Re-reads the files; on error the previous configuration stays in force.
    pub fn reload(&self) -> Result<(), String> {
        let cfg = build(&self.files)?;
        self.current.store(Arc::new(cfg));
        Ok(())
    }

    /// The configuration a connection accepted now is served with.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.load_full()
    }

    /// The files whose change should trigger [`TlsReloader::reload`].
    pub fn watched_files(&self) -> Vec<PathBuf> {
        let mut v = vec![self.files.cert_file.clone(), self.files.key_file.clone()];
        v.extend(self.files.client_ca_file.clone());
        v
    }
}
