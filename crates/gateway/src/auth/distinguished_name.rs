//! A certificate subject as an RFC 4514 string, escaped so that two different subjects can
//! never render the same.
//!
//! The `subject` identity of the `mtls` auth mode is this rendering. A plain "join the parts
//! with commas" rendering lets a certificate whose single common name is `alice, O=Example`
//! pass for the subject `CN=alice, O=Example`; here every character that could end a value
//! (`,` `+`) or that RFC 4514 reserves (`"` `;` `<` `>` `\`, a leading `#` or space, a trailing
//! space, control characters) is escaped, so the string parses back to exactly one sequence
//! of attributes.
//!
//! As RFC 4514 asks: the relative distinguished names are written last to first (the most
//! specific one, usually `CN`, comes first), the attributes of a multi-valued one are joined
//! with `+`, the types RFC 4514 names (`CN`, `L`, `ST`, `O`, `OU`, `C`, `STREET`, `DC`,
//! `UID`) are written by name and every other type as its dotted OID, and a value that is not a
//! character string is written as `#` followed by the hex of its DER encoding.

use std::fmt::Write;

use x509_parser::asn1_rs::{Tag, ToDer};
use x509_parser::prelude::{AttributeTypeAndValue, X509Name};

/// The RFC 4514 short names, by dotted OID.
const SHORT_NAMES: &[(&str, &str)] = &[
    ("2.5.4.3", "CN"),
    ("2.5.4.7", "L"),
    ("2.5.4.8", "ST"),
    ("2.5.4.10", "O"),
    ("2.5.4.11", "OU"),
    ("2.5.4.6", "C"),
    ("2.5.4.9", "STREET"),
    ("0.9.2342.19200300.100.1.25", "DC"),
    ("0.9.2342.19200300.100.1.1", "UID"),
];

/// `name` as an RFC 4514 string; `None` when a value cannot be encoded at all (a certificate
/// the parser accepted but whose name does not re-encode; refused rather than guessed).
pub fn rfc4514(name: &X509Name<'_>) -> Option<String> {
    let rdns: Vec<_> = name.iter_rdn().collect();
    let mut out = String::new();
    for (i, rdn) in rdns.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, attr) in rdn.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            write_attribute(&mut out, attr)?;
        }
    }
    Some(out)
}

fn write_attribute(out: &mut String, attr: &AttributeTypeAndValue<'_>) -> Option<()> {
    let oid = attr.attr_type().to_id_string();
    match SHORT_NAMES.iter().find(|(id, _)| *id == oid) {
        Some((_, short)) => out.push_str(short),
        None => out.push_str(&oid),
    }
    out.push('=');
    match string_value(attr) {
        Some(s) => escape_into(out, &s),
        None => {
            let der = attr.attr_value().to_der_vec().ok()?;
            out.push('#');
            for b in der {
                let _ = write!(out, "{b:02x}");
            }
        }
    }
    Some(())
}

/// The value as text, for the directory string types.
fn string_value(attr: &AttributeTypeAndValue<'_>) -> Option<String> {
    let value = attr.attr_value();
    match value.tag() {
        Tag::Utf8String | Tag::PrintableString | Tag::Ia5String | Tag::NumericString => {
            std::str::from_utf8(value.data).ok().map(str::to_string)
        }
        Tag::BmpString => {
            if value.data.len() % 2 != 0 {
                return None;
            }
            let units = value
                .data
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]));
            char::decode_utf16(units)
                .collect::<Result<String, _>>()
                .ok()
        }
        Tag::UniversalString => {
            if value.data.len() % 4 != 0 {
                return None;
            }
            value
                .data
                .chunks_exact(4)
                .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
                .collect()
        }
        _ => None,
    }
}

/// Appends `value` with the RFC 4514 escapes (section 2.4), plus control characters as hex
/// pairs so a principal never carries a raw newline into a log line.
fn escape_into(out: &mut String, value: &str) {
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        match c {
            '"' | '+' | ',' | ';' | '<' | '>' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '#' if i == 0 => out.push_str("\\#"),
            ' ' if i == 0 || i == last => out.push_str("\\ "),
            c if c.is_control() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "\\{b:02X}");
                }
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, DnValue, KeyPair};
    use x509_parser::prelude::{FromDer, X509Certificate};

    fn subject_of(parts: &[(DnType, DnValue)]) -> String {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        for (t, v) in parts {
            params.distinguished_name.push(t.clone(), v.clone());
        }
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let der = params.self_signed(&key).unwrap().der().to_vec();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        rfc4514(cert.subject()).unwrap()
    }

    fn utf8(s: &str) -> DnValue {
        DnValue::Utf8String(s.to_string())
    }

    #[test]
    fn renders_and_escapes_per_rfc4514() {
        let cases: &[(&[(DnType, DnValue)], &str)] = &[
            (
                &[
                    (DnType::CommonName, utf8("alice")),
                    (DnType::OrganizationName, utf8("Example")),
                ],
                // Last RDN first.
                "O=Example,CN=alice",
            ),
            (
                &[(DnType::CommonName, utf8("alice, O=Example"))],
                "CN=alice\\, O=Example",
            ),
            (
                &[(DnType::CommonName, utf8("a+b;c<d>e\"f\\g"))],
                "CN=a\\+b\\;c\\<d\\>e\\\"f\\\\g",
            ),
            (&[(DnType::CommonName, utf8("#tag"))], "CN=\\#tag"),
            (&[(DnType::CommonName, utf8(" pad "))], "CN=\\ pad\\ "),
            (&[(DnType::CommonName, utf8("a#b c"))], "CN=a#b c"),
            (
                &[(DnType::CommonName, utf8("line\nbreak"))],
                "CN=line\\0Abreak",
            ),
            (
                &[(
                    DnType::CommonName,
                    DnValue::PrintableString("bob".try_into().unwrap()),
                )],
                "CN=bob",
            ),
            (
                &[(
                    DnType::CommonName,
                    DnValue::BmpString("zoë".try_into().unwrap()),
                )],
                "CN=zoë",
            ),
            (
                &[
                    (
                        DnType::CountryName,
                        DnValue::PrintableString("DE".try_into().unwrap()),
                    ),
                    (DnType::CustomDnType(vec![1, 2, 3, 4]), utf8("x")),
                ],
                "1.2.3.4=x,C=DE",
            ),
        ];
        for (parts, want) in cases {
            assert_eq!(subject_of(parts), *want, "{parts:?}");
        }
    }

    #[test]
    fn a_comma_inside_a_common_name_cannot_pass_for_another_subject() {
        let forged = subject_of(&[(DnType::CommonName, utf8("alice,O=Example"))]);
        let real = subject_of(&[
            (DnType::OrganizationName, utf8("Example")),
            (DnType::CommonName, utf8("alice")),
        ]);
        assert_eq!(real, "CN=alice,O=Example");
        assert_ne!(forged, real);
    }
}
