//! How the legacy server's certificate is judged: by a CA chain, or by a pinned public key.
//!
//! - [`ChainVerifier`] is rustls' WebPKI verifier (chain to a trusted CA, host name, validity
//!   period, handshake signature) with one addition: when it refuses a certificate that is
//!   itself a CA certificate (`basicConstraints CA:TRUE`, which `openssl req -x509` writes by
//!   default), the refusal says so. WebPKI never accepts a CA certificate as the server's own,
//!   even when that very certificate is the trusted CA, and its own error for it reads like an
//!   unknown issuer; curl and nginx accept such a certificate, so operators are surprised.
//! - [`PinVerifier`] (`upstream.pin_sha256`) replaces the chain with the certificate's public
//!   key: the SHA-256 of its DER `SubjectPublicKeyInfo` must be one of the pins (the value
//!   curl's `--pinnedpubkey sha256//…` and Envoy's `verify_certificate_spki` take). What is
//!   still checked, and why:
//!   - the **handshake signature**, with the key in the certificate: it proves the server holds
//!     the private key of the pinned public key, which is the whole point of a pin;
//!   - the **host name** of `upstream.url` against the certificate's subjectAltName: a pin
//!     names a key, the name check keeps a key reused on another service from answering for
//!     this one, and the certificates operators make for this carry the name anyway;
//!   - the **validity period**: an expired self-signed certificate is one nobody rotated, and
//!     `-days` is the operator's own statement of how long it should be trusted.
//!
//!   Not checked: who signed it, its basic constraints and key usages (a self-signed CA
//!   certificate is exactly what is being trusted), intermediates (ignored), revocation. Only
//!   the server's own certificate (the first one it sends) is compared with the pins.
//!
//! Our own refusals travel inside rustls' `CertificateError::Other` as a [`Refusal`], so that
//! [`super::upstream::TlsFailure`] can tell them apart by type, never by text.

use std::sync::Arc;

use base64::Engine as _;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, OtherError, SignatureScheme};
use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, X509Certificate};

/// A pinned public key: SHA-256 over a certificate's DER `SubjectPublicKeyInfo`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SpkiPin([u8; 32]);

/// Base64 that accepts the value with or without its `=` padding.
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

impl SpkiPin {
    /// Reads a pin as operators copy it: base64 of the 32-byte digest, optionally with
    /// curl's `sha256//` in front.
    pub fn parse(text: &str) -> Result<SpkiPin, String> {
        let b64 = text.trim();
        let b64 = b64.strip_prefix("sha256//").unwrap_or(b64);
        let bytes = BASE64.decode(b64).map_err(|_| {
            format!("{text:?} is not base64; expected the base64 SHA-256 of the certificate's public key (SubjectPublicKeyInfo)")
        })?;
        let digest: [u8; 32] = bytes.try_into().map_err(|b: Vec<u8>| {
            format!(
                "{text:?} decodes to {} bytes; a SHA-256 digest is 32 (base64, 44 characters)",
                b.len()
            )
        })?;
        Ok(SpkiPin(digest))
    }

    /// The pin of a DER `SubjectPublicKeyInfo`.
    pub fn of_spki(spki_der: &[u8]) -> SpkiPin {
        SpkiPin(Sha256::digest(spki_der).into())
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for SpkiPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sha256//{}",
            base64::engine::general_purpose::STANDARD.encode(self.0)
        )
    }
}

/// A certificate refused for a reason rustls has no name for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The server presented a CA certificate (`basicConstraints CA:TRUE`) as its own.
    #[error("the server's certificate is a CA certificate")]
    CaAsServerCertificate,
    /// Pins are configured and the certificate's public key matches none of them.
    #[error("the server's public key matches no configured pin")]
    PinMismatch,
}

impl Refusal {
    /// The refusal as a rustls error (what a verifier returns).
    fn into_error(self) -> Error {
        Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(self))))
    }

    /// The refusal carried by `e`, if it is one of ours.
    pub fn of(e: &CertificateError) -> Option<Refusal> {
        match e {
            CertificateError::Other(OtherError(inner)) => inner.downcast_ref::<Refusal>().copied(),
            _ => None,
        }
    }
}

/// Whether the DER certificate says it is a CA (`basicConstraints cA` true).
fn is_ca_certificate(der: &[u8]) -> bool {
    X509Certificate::from_der(der).is_ok_and(|(_, cert)| {
        cert.basic_constraints()
            .ok()
            .flatten()
            .is_some_and(|bc| bc.value.ca)
    })
}

/// The CA-chain verifier of an upstream without pins: WebPKI's, naming a CA certificate that
/// is presented as the server's own.
#[derive(Debug)]
pub struct ChainVerifier {
    inner: Arc<WebPkiServerVerifier>,
}

impl ChainVerifier {
    pub fn new(
        roots: rustls::RootCertStore,
        provider: Arc<CryptoProvider>,
    ) -> Result<ChainVerifier, String> {
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(ChainVerifier { inner })
    }
}

impl ServerCertVerifier for ChainVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            .map_err(|e| match &e {
                // A wrong name or an expired certificate is said as such; any other refusal of
                // a CA certificate is WebPKI refusing it as a server's own (it checks that
                // before looking for an issuer), whatever its error calls it.
                Error::InvalidCertificate(c)
                    if !is_name_or_time(c) && is_ca_certificate(end_entity) =>
                {
                    Refusal::CaAsServerCertificate.into_error()
                }
                _ => e,
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

fn is_name_or_time(c: &CertificateError) -> bool {
    use CertificateError as C;
    matches!(
        c,
        C::NotValidForName
            | C::NotValidForNameContext { .. }
            | C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. }
    )
}

/// The verifier of an upstream with `pin_sha256`: the pinned public key instead of a chain
/// (see the module documentation for what is still checked).
#[derive(Debug)]
pub struct PinVerifier {
    pins: Vec<SpkiPin>,
    provider: Arc<CryptoProvider>,
}

impl PinVerifier {
    pub fn new(pins: Vec<SpkiPin>, provider: Arc<CryptoProvider>) -> PinVerifier {
        PinVerifier { pins, provider }
    }
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        let pin = SpkiPin::of_spki(parsed.subject_public_key_info().as_ref());
        if !self.pins.contains(&pin) {
            return Err(Refusal::PinMismatch.into_error());
        }
        check_validity(end_entity, now)?;
        rustls::client::verify_server_name(&parsed, server_name)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `notBefore <= now <= notAfter`, as rustls would report it otherwise.
fn check_validity(der: &[u8], now: UnixTime) -> Result<(), Error> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let now_secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let validity = cert.validity();
    if now_secs < validity.not_before.timestamp() {
        return Err(Error::InvalidCertificate(CertificateError::NotValidYet));
    }
    if now_secs > validity.not_after.timestamp() {
        return Err(Error::InvalidCertificate(CertificateError::Expired));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, PublicKeyData};
    use std::time::Duration;

    fn provider() -> Arc<CryptoProvider> {
        crate::tls::provider()
    }

    /// Valid from 2000 to 2100; expired in 2001; valid from 2999.
    const VALID: (i32, i32) = (2000, 2100);
    const EXPIRED: (i32, i32) = (2000, 2001);
    const NOT_YET: (i32, i32) = (2999, 3000);

    /// A self-signed certificate for `names`, a CA one when `ca`, valid over `years`.
    fn cert(names: &[&str], ca: bool, years: (i32, i32)) -> (CertificateDer<'static>, SpkiPin) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        if ca {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        params.not_before = rcgen::date_time_ymd(years.0, 1, 1);
        params.not_after = rcgen::date_time_ymd(years.1, 1, 1);
        let cert = params.self_signed(&key).unwrap();
        let pin = SpkiPin::of_spki(&key.subject_public_key_info());
        (cert.der().clone(), pin)
    }

    fn now() -> UnixTime {
        UnixTime::now()
    }

    fn name(s: &str) -> ServerName<'static> {
        ServerName::try_from(s.to_string()).unwrap()
    }

    fn refusal(r: Result<ServerCertVerified, Error>) -> Error {
        r.expect_err("refused")
    }

    #[test]
    fn pins_are_read_as_operators_copy_them() {
        let digest = [7u8; 32];
        let b64 = base64::engine::general_purpose::STANDARD.encode(digest);
        for text in [
            b64.clone(),
            format!("sha256//{b64}"),
            b64.trim_end_matches('=').to_string(),
            format!(" {b64} "),
        ] {
            assert_eq!(SpkiPin::parse(&text).unwrap().as_bytes(), &digest, "{text}");
        }
        for bad in ["", "not base64!", "sha256//AAAA", "sha1//AAAA"] {
            assert!(SpkiPin::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            format!("{:?}", SpkiPin::parse(&b64).unwrap()),
            format!("sha256//{b64}")
        );
    }

    #[test]
    fn a_pinned_certificate_is_trusted_as_itself_ca_or_not() {
        for ca in [false, true] {
            let (der, pin) = cert(&["localhost", "127.0.0.1"], ca, VALID);
            let v = PinVerifier::new(vec![SpkiPin([0; 32]), pin], provider());
            for host in ["localhost", "127.0.0.1"] {
                assert!(
                    v.verify_server_cert(&der, &[], &name(host), &[], now())
                        .is_ok(),
                    "ca {ca}, {host}"
                );
            }
        }
    }

    #[test]
    fn a_pinned_key_still_needs_the_name_and_the_validity_period() {
        let v = |pin| PinVerifier::new(vec![pin], provider());
        let (der, pin) = cert(&["localhost"], true, VALID);
        let e = refusal(v(pin).verify_server_cert(&der, &[], &name("other.test"), &[], now()));
        assert!(
            matches!(
                e,
                Error::InvalidCertificate(
                    CertificateError::NotValidForName
                        | CertificateError::NotValidForNameContext { .. }
                )
            ),
            "{e:?}"
        );
        let (der, pin) = cert(&["localhost"], true, EXPIRED);
        let e = refusal(v(pin).verify_server_cert(&der, &[], &name("localhost"), &[], now()));
        assert_eq!(e, Error::InvalidCertificate(CertificateError::Expired));
        let (der, pin) = cert(&["localhost"], false, NOT_YET);
        let e = refusal(v(pin).verify_server_cert(&der, &[], &name("localhost"), &[], now()));
        assert_eq!(e, Error::InvalidCertificate(CertificateError::NotValidYet));
        // Judged at the handshake's time: the expired one was fine in 2000.
        let (der, pin) = cert(&["localhost"], true, EXPIRED);
        let in_2000 = UnixTime::since_unix_epoch(Duration::from_secs(946_800_000));
        assert!(
            v(pin)
                .verify_server_cert(&der, &[], &name("localhost"), &[], in_2000)
                .is_ok()
        );
    }

    #[test]
    fn another_key_is_refused_as_a_pin_mismatch() {
        let (der, _) = cert(&["localhost"], false, VALID);
        let (_, other) = cert(&["localhost"], false, VALID);
        let e = refusal(
            PinVerifier::new(vec![other], provider()).verify_server_cert(
                &der,
                &[],
                &name("localhost"),
                &[],
                now(),
            ),
        );
        let Error::InvalidCertificate(c) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(Refusal::of(c), Some(Refusal::PinMismatch));
    }

    #[test]
    fn the_chain_verifier_names_a_ca_certificate_used_as_the_servers_own() {
        let verifier = |trusted: &CertificateDer<'static>| {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(trusted.clone()).unwrap();
            ChainVerifier::new(roots, provider()).unwrap()
        };
        // Trusted as its own CA (what `ca_file` with the server's certificate does).
        let (ca_cert, _) = cert(&["localhost"], true, VALID);
        let e = refusal(verifier(&ca_cert).verify_server_cert(
            &ca_cert,
            &[],
            &name("localhost"),
            &[],
            now(),
        ));
        let Error::InvalidCertificate(c) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(Refusal::of(c), Some(Refusal::CaAsServerCertificate));
        // A self-signed leaf (CA:FALSE) that no trusted CA signed keeps WebPKI's own refusal.
        let (leaf, _) = cert(&["localhost"], false, VALID);
        let e = refusal(verifier(&ca_cert).verify_server_cert(
            &leaf,
            &[],
            &name("localhost"),
            &[],
            now(),
        ));
        let Error::InvalidCertificate(c) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(Refusal::of(c), None, "{e:?}");
        // The same leaf trusted as itself is accepted: only CA:TRUE is the problem.
        assert!(
            verifier(&leaf)
                .verify_server_cert(&leaf, &[], &name("localhost"), &[], now())
                .is_ok()
        );
        // An expired CA certificate is said to be expired first.
        let (old, _) = cert(&["localhost"], true, EXPIRED);
        let e =
            refusal(verifier(&old).verify_server_cert(&old, &[], &name("localhost"), &[], now()));
        let Error::InvalidCertificate(c) = &e else {
            panic!("{e:?}")
        };
        assert!(is_name_or_time(c), "{e:?}");
    }
}
