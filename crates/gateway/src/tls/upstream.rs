//! TLS toward an `https` legacy server: which certificates to trust, which client certificate
//! to show, and how a failed handshake is told.
//!
//! Trust comes from one of three places: `upstream.pin_sha256` (the SHA-256 of the server
//! certificate's public key, for a self-signed certificate trusted as itself: no chain, see
//! [`super::server_verifier`]), else `upstream.ca_file` (a PEM bundle of CAs), else the system's
//! CA store. The name in `upstream.url` must match the server's certificate in every case
//! (no way to turn it off). `upstream.client_cert_file` and `upstream.client_key_file` give the
//! gateway a certificate for upstreams that ask for one (mTLS). The files are read when the
//! configuration is validated, so `check-config` refuses a file that does not parse, and a
//! reload that finds them (or the pins) changed (their content is part of the configuration's
//! identity, see [`UpstreamTls`]'s `Debug`) swaps in a new upstream client.
//!
//! A handshake failure becomes a [`TlsFailure`]: a short class the client may be told (the
//! certificate is not trusted, is a CA certificate used as the server's own, does not match the
//! pins, is not valid for the name, expired; the upstream refused the gateway's certificate),
//! never the peer's certificate or the files' paths.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};

use super::server_verifier::{ChainVerifier, PinVerifier, Refusal, SpkiPin};

/// The configured TLS files for an `https` upstream (paths already resolved).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamTlsFiles {
    pub ca_file: Option<PathBuf>,
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
}

impl UpstreamTlsFiles {
    /// Every file whose change should reload the upstream client.
    pub fn paths(&self) -> Vec<PathBuf> {
        [&self.ca_file, &self.client_cert_file, &self.client_key_file]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }
}

/// A loaded client TLS configuration for the legacy server.
#[derive(Clone)]
pub struct UpstreamTls {
    pub files: UpstreamTlsFiles,
    /// `upstream.pin_sha256`: when not empty, the server's certificate is trusted by its public
    /// key instead of a CA chain.
    pub pins: Vec<SpkiPin>,
    config: Arc<ClientConfig>,
    /// SHA-256 over the files' bytes and the pins: a rotated certificate under the same path,
    /// or another pin, is a change.
    fingerprint: [u8; 32],
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex: String = self
            .fingerprint
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        f.debug_struct("UpstreamTls")
            .field("files", &self.files)
            .field("pins", &self.pins)
            .field("fingerprint", &hex)
            .finish()
    }
}

/// A problem with one of the TLS files, named by its config key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFileError {
    pub key: &'static str,
    pub message: String,
}

fn file_error(key: &'static str, path: &Path, what: impl std::fmt::Display) -> TlsFileError {
    TlsFileError {
        key,
        message: format!("{}: {what}", path.display()),
    }
}

fn read(key: &'static str, path: &Path, hash: &mut Sha256) -> Result<Vec<u8>, TlsFileError> {
    let bytes = std::fs::read(path).map_err(|e| file_error(key, path, e))?;
    hash.update((bytes.len() as u64).to_be_bytes());
    hash.update(&bytes);
    Ok(bytes)
}

fn certificates(
    key: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(key, path, e))?;
    if certs.is_empty() {
        return Err(file_error(key, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

impl UpstreamTls {
    /// Reads and checks the files; trusts `pins` when there are any, else `ca_file`, else the
    /// system CA store.
    pub fn load(files: &UpstreamTlsFiles, pins: &[SpkiPin]) -> Result<UpstreamTls, TlsFileError> {
        let mut hash = Sha256::new();
        let mut roots = rustls::RootCertStore::empty();
        hash.update((pins.len() as u64).to_be_bytes());
        for pin in pins {
            hash.update(pin.as_bytes());
        }
        match (&files.ca_file, pins.is_empty()) {
            (Some(_), false) => {
                return Err(TlsFileError {
                    key: "upstream.pin_sha256",
                    message: "replaces the CA check, so upstream.ca_file must not be set with it \
                              (remove one of the two)"
                        .into(),
                });
            }
            // Pinned: no CA is trusted at all.
            (None, false) => {}
            (Some(path), true) => {
                let pem = read("upstream.ca_file", path, &mut hash)?;
                for cert in certificates("upstream.ca_file", path, &pem)? {
                    roots
                        .add(cert)
                        .map_err(|e| file_error("upstream.ca_file", path, e))?;
                }
            }
            (None, true) => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(TlsFileError {
                        key: "upstream.ca_file",
                        message: "the system has no usable CA certificates; set upstream.ca_file \
                                  to the PEM bundle that signs the legacy server's certificate"
                            .into(),
                    });
                }
            }
        }
        let provider = crate::tls::provider();
        let verifier: Arc<dyn rustls::client::danger::ServerCertVerifier> = if pins.is_empty() {
            Arc::new(
                ChainVerifier::new(roots, provider.clone()).map_err(|message| TlsFileError {
                    key: "upstream.ca_file",
                    message,
                })?,
            )
        } else {
            Arc::new(PinVerifier::new(pins.to_vec(), provider.clone()))
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsFileError {
                key: "upstream.url",
                message: e.to_string(),
            })?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&files.client_cert_file, &files.client_key_file) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert_path), Some(key_path)) => {
                let pem = read("upstream.client_cert_file", cert_path, &mut hash)?;
                let chain = certificates("upstream.client_cert_file", cert_path, &pem)?;
                let key_pem = read("upstream.client_key_file", key_path, &mut hash)?;
                let key = PrivateKeyDer::from_pem_slice(&key_pem)
                    .map_err(|e| file_error("upstream.client_key_file", key_path, e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| TlsFileError {
                        key: "upstream.client_key_file",
                        message: format!(
                            "upstream.client_cert_file and upstream.client_key_file do not form a usable pair: {e}"
                        ),
                    })?
            }
            (Some(_), None) => {
                return Err(TlsFileError {
                    key: "upstream.client_key_file",
                    message: "required with upstream.client_cert_file".into(),
                });
            }
            (None, Some(_)) => {
                return Err(TlsFileError {
                    key: "upstream.client_cert_file",
                    message: "required with upstream.client_key_file".into(),
                });
            }
        };
        // ALPN is left to the connector (hyper-rustls sets it from the HTTP versions it enables).
        Ok(UpstreamTls {
            files: files.clone(),
            pins: pins.to_vec(),
            config: Arc::new(config),
            fingerprint: hash.finalize().into(),
        })
    }

    /// The rustls configuration for connections to the legacy server.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }
}

/// Why a TLS connection to the legacy server failed, in terms a client may be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TlsFailure {
    #[error("its certificate is not signed by a CA the gateway trusts")]
    UntrustedCertificate,
    #[error(
        "its certificate is a CA certificate (basicConstraints CA:TRUE, as `openssl req -x509` \
         makes by default), which is never accepted as a server's own certificate: make it a \
         leaf certificate (CA:FALSE; with openssl add `-addext basicConstraints=critical,CA:FALSE`, \
         or have a CA sign it), or trust this one by its public key with upstream.pin_sha256"
    )]
    CaCertificateAsServerCertificate,
    #[error("its certificate's public key matches none of upstream.pin_sha256")]
    PinMismatch,
    #[error("its certificate is not valid for the host name the gateway connects to")]
    WrongName,
    #[error("its certificate has expired or is not valid yet")]
    Expired,
    #[error("it refused the gateway's client certificate, or the gateway presented none")]
    ClientCertificateRefused,
    #[error("the TLS handshake failed")]
    Handshake,
}

impl TlsFailure {
    /// The TLS failure somewhere in `e`'s chain of causes, if there is one.
    pub fn find(e: &(dyn std::error::Error + 'static)) -> Option<TlsFailure> {
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(tls) = err.downcast_ref::<rustls::Error>() {
                return Some(Self::classify(tls));
            }
            // `io::Error::source` skips the error it wraps (and connectors wrap io errors in
            // io errors): step into the wrapped one instead.
            cur = match err
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
                None => err.source(),
            };
        }
        None
    }

    fn classify(e: &rustls::Error) -> TlsFailure {
        use rustls::AlertDescription as A;
        use rustls::CertificateError as C;
        match e {
            rustls::Error::InvalidCertificate(c) => match c {
                C::Other(_) if Refusal::of(c) == Some(Refusal::CaAsServerCertificate) => {
                    TlsFailure::CaCertificateAsServerCertificate
                }
                C::Other(_) if Refusal::of(c) == Some(Refusal::PinMismatch) => {
                    TlsFailure::PinMismatch
                }
                C::NotValidForName | C::NotValidForNameContext { .. } => TlsFailure::WrongName,
                C::Expired
                | C::ExpiredContext { .. }
                | C::NotValidYet
                | C::NotValidYetContext { .. } => TlsFailure::Expired,
                _ => TlsFailure::UntrustedCertificate,
            },
            rustls::Error::AlertReceived(
                A::CertificateRequired
                | A::BadCertificate
                | A::UnknownCA
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::AccessDenied,
            ) => TlsFailure::ClientCertificateRefused,
            _ => TlsFailure::Handshake,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let mut b = [0u8; 6];
        getrandom::fill(&mut b).unwrap();
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        let d = std::env::temp_dir().join(format!("mrtr-upstream-tls-{tag}-{hex}"));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn self_signed(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn files_are_checked_and_named_by_key() {
        let dir = temp_dir("check");
        let (cert, key) = self_signed("upstream.test");
        let (_, other_key) = self_signed("other.test");
        let p = |n: &str| dir.join(n);
        std::fs::write(p("ca.pem"), &cert).unwrap();
        std::fs::write(p("client.pem"), &cert).unwrap();
        std::fs::write(p("client.key"), &key).unwrap();
        std::fs::write(p("other.key"), &other_key).unwrap();
        std::fs::write(p("empty.pem"), "not pem at all").unwrap();
        let files = |ca: Option<&str>, cert: Option<&str>, key: Option<&str>| UpstreamTlsFiles {
            ca_file: ca.map(p),
            client_cert_file: cert.map(p),
            client_key_file: key.map(p),
        };
        let ok = UpstreamTls::load(
            &files(Some("ca.pem"), Some("client.pem"), Some("client.key")),
            &[],
        );
        assert!(ok.is_ok(), "{ok:?}");
        let cases = [
            (files(Some("missing.pem"), None, None), "upstream.ca_file"),
            (files(Some("empty.pem"), None, None), "upstream.ca_file"),
            (
                files(Some("ca.pem"), Some("client.pem"), None),
                "upstream.client_key_file",
            ),
            (
                files(Some("ca.pem"), None, Some("client.key")),
                "upstream.client_cert_file",
            ),
            (
                files(Some("ca.pem"), Some("empty.pem"), Some("client.key")),
                "upstream.client_cert_file",
            ),
            (
                files(Some("ca.pem"), Some("client.pem"), Some("empty.pem")),
                "upstream.client_key_file",
            ),
            (
                files(Some("ca.pem"), Some("client.pem"), Some("other.key")),
                "upstream.client_key_file",
            ),
        ];
        for (f, key) in cases {
            let e = UpstreamTls::load(&f, &[]).unwrap_err();
            assert_eq!(e.key, key, "{f:?}: {e:?}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn pins_replace_the_ca_file_and_are_part_of_the_identity() {
        let dir = temp_dir("pins");
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, self_signed("a.test").0).unwrap();
        let pin = |b: u8| SpkiPin::of_spki(&[b]);
        let with_ca = UpstreamTlsFiles {
            ca_file: Some(ca),
            ..Default::default()
        };
        let e = UpstreamTls::load(&with_ca, &[pin(1)]).unwrap_err();
        assert_eq!(e.key, "upstream.pin_sha256", "{e:?}");
        assert!(e.message.contains("upstream.ca_file"), "{e:?}");
        let none = UpstreamTlsFiles::default();
        let one = format!("{:?}", UpstreamTls::load(&none, &[pin(1)]).unwrap());
        assert_eq!(
            one,
            format!("{:?}", UpstreamTls::load(&none, &[pin(1)]).unwrap())
        );
        assert_ne!(
            one,
            format!("{:?}", UpstreamTls::load(&none, &[pin(2)]).unwrap())
        );
        assert_ne!(
            one,
            format!("{:?}", UpstreamTls::load(&none, &[pin(1), pin(2)]).unwrap())
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_rotated_file_under_the_same_path_changes_the_identity() {
        let dir = temp_dir("rotate");
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, self_signed("a.test").0).unwrap();
        let files = UpstreamTlsFiles {
            ca_file: Some(ca.clone()),
            ..Default::default()
        };
        let first = format!("{:?}", UpstreamTls::load(&files, &[]).unwrap());
        assert_eq!(
            first,
            format!("{:?}", UpstreamTls::load(&files, &[]).unwrap())
        );
        std::fs::write(&ca, self_signed("b.test").0).unwrap();
        assert_ne!(
            first,
            format!("{:?}", UpstreamTls::load(&files, &[]).unwrap())
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn handshake_errors_are_classified_through_io_errors() {
        // As hyper-rustls reports it: an io error around tokio-rustls' io error around rustls'.
        let wrapped = std::io::Error::other(std::io::Error::other(
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        ));
        assert_eq!(
            TlsFailure::find(&wrapped),
            Some(TlsFailure::UntrustedCertificate)
        );
        let name = rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName);
        assert_eq!(TlsFailure::find(&name), Some(TlsFailure::WrongName));
        let alert = std::io::Error::other(rustls::Error::AlertReceived(
            rustls::AlertDescription::CertificateRequired,
        ));
        assert_eq!(
            TlsFailure::find(&alert),
            Some(TlsFailure::ClientCertificateRefused)
        );
        assert_eq!(
            TlsFailure::find(&std::io::Error::other("connection refused")),
            None
        );
        // The verifiers' own refusals, told apart by type.
        for (refusal, failure) in [
            (
                Refusal::CaAsServerCertificate,
                TlsFailure::CaCertificateAsServerCertificate,
            ),
            (Refusal::PinMismatch, TlsFailure::PinMismatch),
        ] {
            let e = std::io::Error::other(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Other(rustls::OtherError(Arc::new(refusal))),
            ));
            assert_eq!(TlsFailure::find(&e), Some(failure));
        }
        // Someone else's `Other` stays an untrusted certificate.
        let other = rustls::Error::InvalidCertificate(rustls::CertificateError::Other(
            rustls::OtherError(Arc::new(std::io::Error::other("x"))),
        ));
        assert_eq!(
            TlsFailure::find(&other),
            Some(TlsFailure::UntrustedCertificate)
        );
    }
}
