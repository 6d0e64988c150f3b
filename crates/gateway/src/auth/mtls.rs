//! mTLS mode: the principal is a name from the client certificate.
//!
//! The TLS listener has already verified the certificate chain against its client CA before
//! the request exists; this module only reads the configured identity out of the leaf
//! certificate's DER. When a SAN field holds several values, the first of the requested kind
//! is used, which is how SPIFFE-style certificates (one URI SAN) are meant to be read.
//!
//! Names cannot collide: `subject` is the escaped RFC 4514 rendering of
//! [`super::distinguished_name`] (a common name containing `, O=...` stays one escaped value),
//! and `subject_cn` refuses a certificate with more than one common name instead of picking
//! one of them.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::Principal;
use super::config::CertIdentity;
use super::distinguished_name::rfc4514;
use super::error::AuthFailure;

pub(crate) fn authenticate(
    identity: CertIdentity,
    client_cert_der: Option<&[u8]>,
) -> Result<Principal, AuthFailure> {
    let der = client_cert_der.ok_or(AuthFailure::Missing)?;
    let (_, cert) = X509Certificate::from_der(der).map_err(|_| AuthFailure::Malformed)?;
    let name = match identity {
        CertIdentity::SubjectCn => {
            let mut cns = cert.subject().iter_common_name();
            let first = cns.next();
            if cns.next().is_some() {
                return Err(AuthFailure::AmbiguousIdentity);
            }
            first.and_then(|cn| cn.as_str().ok()).map(str::to_string)
        }
        CertIdentity::Subject => Some(rfc4514(cert.subject()).ok_or(AuthFailure::Malformed)?),
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
        assert_eq!(get(CertIdentity::Subject), "O=Example Org,CN=alice");
    }

    /// A certificate whose subject is exactly `parts`, in order (a custom type with the CN
    /// OID lets one certificate carry two common names, which rcgen's map otherwise merges).
    fn subject_der(parts: &[(&str, &str)]) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (i, (kind, value)) in parts.iter().enumerate() {
            let t = match (*kind, i) {
                ("CN", 0) => DnType::CommonName,
                ("CN", _) => DnType::CustomDnType(vec![2, 5, 4, 3]),
                ("O", _) => DnType::OrganizationName,
                ("OU", _) => DnType::OrganizationalUnitName,
                (other, _) => panic!("no DN type {other} in this table"),
            };
            params.distinguished_name.push(t, *value);
        }
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn identities_cannot_collide() {
        type Case = (
            &'static str,
            CertIdentity,
            &'static [(&'static str, &'static str)],
            Result<&'static str, AuthFailure>,
        );
        let cases: &[Case] = &[
            (
                "a plain subject",
                CertIdentity::Subject,
                &[("O", "Example"), ("CN", "alice")],
                Ok("CN=alice,O=Example"),
            ),
            (
                "a CN holding a forged RDN stays one escaped value",
                CertIdentity::Subject,
                &[("CN", "alice,O=Example")],
                Ok("CN=alice\\,O=Example"),
            ),
            (
                "the same with a space after the comma",
                CertIdentity::Subject,
                &[("CN", "alice, O=Example")],
                Ok("CN=alice\\, O=Example"),
            ),
            (
                "a CN holding a forged multi-valued RDN",
                CertIdentity::Subject,
                &[("CN", "alice+OU=admins")],
                Ok("CN=alice\\+OU=admins"),
            ),
            (
                "the real multi-attribute subject it imitates",
                CertIdentity::Subject,
                &[("OU", "admins"), ("CN", "alice")],
                Ok("CN=alice,OU=admins"),
            ),
            (
                "one CN under subject_cn",
                CertIdentity::SubjectCn,
                &[("CN", "alice"), ("O", "Example")],
                Ok("alice"),
            ),
            (
                "two CNs under subject_cn are refused, not read as the first",
                CertIdentity::SubjectCn,
                &[("CN", "alice"), ("CN", "admin")],
                Err(AuthFailure::AmbiguousIdentity),
            ),
            (
                "two CNs with an RDN between them",
                CertIdentity::SubjectCn,
                &[("CN", "alice"), ("O", "Example"), ("CN", "admin")],
                Err(AuthFailure::AmbiguousIdentity),
            ),
            (
                "two CNs are one escaped subject under subject",
                CertIdentity::Subject,
                &[("CN", "alice"), ("CN", "admin")],
                Ok("CN=admin,CN=alice"),
            ),
        ];
        for (what, identity, parts, want) in cases {
            let der = subject_der(parts);
            let got = authenticate(*identity, Some(&der)).map(|p| p.0);
            assert_eq!(got.as_deref(), want.as_ref().map(|s| *s), "{what}");
        }
        // Forged single-CN subjects never equal the multi-attribute subjects they imitate,
        // in either RDN order (the case: CN `alice, O=Example` against CN=alice, O=Example).
        let subjects: &[&[(&str, &str)]] = &[
            &[("CN", "alice, O=Example")],
            &[("CN", "alice,O=Example")],
            &[("CN", "alice"), ("O", "Example")],
            &[("O", "Example"), ("CN", "alice")],
            &[("CN", "alice+OU=admins")],
            &[("CN", "alice"), ("OU", "admins")],
            &[("OU", "admins"), ("CN", "alice")],
        ];
        let principals: Vec<String> = subjects
            .iter()
            .map(|parts| {
                authenticate(CertIdentity::Subject, Some(&subject_der(parts)))
                    .unwrap()
                    .0
            })
            .collect();
        for (i, a) in principals.iter().enumerate() {
            for b in &principals[i + 1..] {
                assert_ne!(a, b, "two different subjects render the same");
            }
        }
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
