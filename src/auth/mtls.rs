//! mTLS mode: the principal is a name from the client certificate.
//!
//! The TLS listener has already verified the certificate chain against its client CA before
//! the request exists; this module only reads the configured identity out of the leaf
//! certificate's DER. When a field can hold several values (SAN entries), the first of the
//! requested kind is used, which is how SPIFFE-style certificates (one URI SAN) are meant to
//! be read.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::Principal;
use super::config::CertIdentity;
use super::error::AuthFailure;

pub(crate) fn authenticate(
    identity: CertIdentity,
    client_cert_der: Option<&[u8]>,
) -> Result<Principal, AuthFailure> {
    let der = client_cert_der.ok_or(AuthFailure::Missing)?;
    let (_, cert) = X509Certificate::from_der(der).map_err(|_| AuthFailure::Malformed)?;
    let name = match identity {
        CertIdentity::SubjectCn => cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_string),
        CertIdentity::Subject => Some(cert.subject().to_string()),
        CertIdentity::SanUri | CertIdentity::SanDns => {
            let san = cert
                .subject_alternative_name()
                .map_err(|_| AuthFailure::Malformed)?;
            san.and_then(|ext| {
                ext.value
                    .general_names
                    .iter()
                    .find_map(|n| match (identity, n) {
                        (CertIdentity::SanUri, GeneralName::URI(u)) => Some(u.to_string()),
                        (CertIdentity::SanDns, GeneralName::DNSName(d)) => Some(d.to_string()),
                        _ => None,
                    })
            })
        }
    };
    match name {
        Some(n) if !n.trim().is_empty() => Ok(Principal(n)),
        _ => Err(AuthFailure::NoIdentity),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    fn cert_der(cn: Option<&str>, sans: Vec<SanType>) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Example Org");
        params.subject_alt_names = sans;
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn full_cert() -> Vec<u8> {
        cert_der(
            Some("alice"),
            vec![
                SanType::DnsName("client.example.com".try_into().unwrap()),
                SanType::URI("spiffe://example.org/ns/prod/sa/alice".try_into().unwrap()),
                SanType::URI("spiffe://example.org/second".try_into().unwrap()),
            ],
        )
    }

    #[test]
    fn each_identity_field_is_read_from_the_certificate() {
        let der = full_cert();
        let get = |id| authenticate(id, Some(&der)).unwrap().0;
        assert_eq!(get(CertIdentity::SubjectCn), "alice");
        assert_eq!(
            get(CertIdentity::SanUri),
            "spiffe://example.org/ns/prod/sa/alice"
        );
        assert_eq!(get(CertIdentity::SanDns), "client.example.com");
        let subject = get(CertIdentity::Subject);
        assert!(subject.contains("CN=alice"), "{subject}");
        assert!(subject.contains("O=Example Org"), "{subject}");
    }

    #[test]
    fn different_certificates_give_different_principals() {
        let bob = cert_der(Some("bob"), vec![]);
        let alice = full_cert();
        assert_ne!(
            authenticate(CertIdentity::SubjectCn, Some(&alice)).unwrap(),
            authenticate(CertIdentity::SubjectCn, Some(&bob)).unwrap()
        );
    }

    #[test]
    fn missing_certificate_or_field_is_refused() {
        assert_eq!(
            authenticate(CertIdentity::SubjectCn, None).unwrap_err(),
            AuthFailure::Missing
        );
        let no_cn = cert_der(None, vec![]);
        assert_eq!(
            authenticate(CertIdentity::SubjectCn, Some(&no_cn)).unwrap_err(),
            AuthFailure::NoIdentity
        );
        assert_eq!(
            authenticate(CertIdentity::SanUri, Some(&no_cn)).unwrap_err(),
            AuthFailure::NoIdentity
        );
        assert_eq!(
            authenticate(CertIdentity::SubjectCn, Some(b"not a certificate")).unwrap_err(),
            AuthFailure::Malformed
        );
    }
}
