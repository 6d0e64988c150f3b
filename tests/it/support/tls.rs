//! Certificates made inside the tests (rcgen) and a minimal TLS HTTP client.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use tokio::net::TcpStream;

pub struct Ca {
    pub issuer: CertifiedIssuer<'static, KeyPair>,
}

pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf certificate for `cn` with the given DNS / URI subject alternative names.
    pub fn leaf(&self, cn: &str, dns: &[&str]) -> Leaf {
        self.leaf_with_subject(&[(DnType::CommonName, cn)], dns)
    }

    /// A leaf certificate whose subject is `subject`, in that order (`DnType::CustomDnType`
    /// with the CN OID `[2, 5, 4, 3]` adds a second common name).
    pub fn leaf_with_subject(&self, subject: &[(DnType, &str)], dns: &[&str]) -> Leaf {
        let mut params =
            CertificateParams::new(dns.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in subject {
            params.distinguished_name.push(t.clone(), *v);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

/// A TLS connection to `addr` (ALPN http/1.1), trusting `ca_pem`, optionally with a client
/// certificate; nothing is sent on it yet.
pub async fn connect(
    addr: SocketAddr,
    ca_pem: &str,
    client: Option<&Leaf>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    connect_alpn(addr, ca_pem, client, b"http/1.1").await
}

/// [`connect`], offering `alpn` alone.
pub async fn connect_alpn(
    addr: SocketAddr,
    ca_pem: &str,
    client: Option<&Leaf>,
    alpn: &[u8],
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut cfg = match client {
        Some(leaf) => {
            let certs: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
                    .map(Result::unwrap)
                    .collect();
            let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))
}

/// One HTTPS POST (HTTP/1.1) to `addr`, trusting `ca_pem`, optionally with a client certificate.
/// Returns the status, the body, and the DER of the certificate the server presented.
pub async fn post(
    addr: SocketAddr,
    ca_pem: &str,
    client: Option<&Leaf>,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, Bytes, Vec<u8>), String> {
    let tls = connect(addr, ca_pem, client).await?;
    let server_cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .unwrap_or_default();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| format!("http handshake: {e}"))?;
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method("POST")
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = sender
        .send_request(req.body(Full::new(Bytes::copy_from_slice(body))).unwrap())
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body, server_cert))
}

/// A self-signed certificate made as operators make one, with the `openssl` command line:
/// `openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=<cn> -addext subjectAltName=<san>`
/// (OpenSSL 3 marks it `CA:TRUE`), plus `extra` arguments. Its files are written into `dir` as
/// `<name>.crt` and `<name>.key`.
pub fn openssl_self_signed(
    dir: &std::path::Path,
    name: &str,
    cn: &str,
    san: &str,
    extra: &[&str],
) -> Leaf {
    let crt = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    let out = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .args(["-subj", &format!("/CN={cn}"), "-addext"])
        .arg(format!("subjectAltName={san}"))
        .args(extra)
        .output()
        .expect("the openssl command line is installed");
    assert!(
        out.status.success(),
        "openssl req: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cert_pem = std::fs::read_to_string(&crt).unwrap();
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
        .unwrap()
        .to_vec();
    Leaf {
        cert_pem,
        key_pem: std::fs::read_to_string(&key).unwrap(),
        der,
    }
}

/// The `sha256//…` pin of the certificate file at `crt`, computed by the `openssl` command line
/// the way curl's documentation gives it (public key → DER → SHA-256 → base64).
pub fn openssl_spki_pin(crt: &std::path::Path) -> String {
    let script = "openssl x509 -in \"$1\" -pubkey -noout | openssl pkey -pubin -outform der \
                  | openssl dgst -sha256 -binary | base64";
    let out = std::process::Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(crt)
        .output()
        .expect("sh and openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!("sha256//{}", String::from_utf8(out.stdout).unwrap().trim())
}

/// A gateway serving TLS in front of `legacy_url` (a leaf for `localhost` from a fresh CA),
/// with `listen` keys in `[listen]`. Returns the gateway, its listener, the CA its clients
/// trust, and the directory holding the certificate (removed when dropped).
pub async fn tls_gateway(
    legacy_url: &str,
    listen: &str,
) -> (
    Arc<mrtr_gateway::gateway::Gateway>,
    mrtr_gateway::front::listener::Running,
    Ca,
    super::TempDir,
) {
    let dir = super::TempDir::new("mrtr-tls");
    let ca = Ca::new("test CA");
    let leaf = ca.leaf("gateway", &["localhost"]);
    std::fs::write(dir.path().join("tls.crt"), &leaf.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &leaf.key_pem).unwrap();
    let text = format!(
        "[listen]\naddr = \"127.0.0.1:0\"\n{listen}\n\
         [upstream]\nurl = \"{legacy_url}\"\n[tls]\ncert_file = \"tls.crt\"\nkey_file = \"tls.key\"\n\
         [[state.keys]]\nid = \"k1\"\nsecret = \"{}\"\n",
        super::TEST_KEY
    );
    let cfg = mrtr_gateway::config::Config::from_toml_str(&text, &[], Some(dir.path()))
        .unwrap_or_else(|e| panic!("TLS test config: {e}\n{text}"));
    let (gw, running, _) = super::start_gateway(cfg).await;
    (gw, running, ca, dir)
}
