//! `https` upstreams through a real TLS terminator: Debian's nginx in front of the Python
//! FastMCP legacy server (`mcp==1.30.0`), with certificates made by rcgen, and self-signed ones
//! made by the `openssl` command line as operators make them. Covers both HTTP transports, the
//! CA file, the system store refusing an unknown CA, host-name verification, mTLS to the
//! upstream, a rotated CA file picked up by the file watcher, and the self-signed certificate:
//! refused through `ca_file` with its real cause named, trusted through `pin_sha256`.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::nginx::{Nginx, NginxTls};
use crate::support::peers::tempdir::TempDir;
use crate::support::peers::{PyLegacyServer, assert_ok, modern_scenario, result_text};
use crate::support::tls::{Ca, Leaf, openssl_self_signed, openssl_spki_pin};
use crate::support::*;
use mrtr_gateway::config::Config;
use mrtr_gateway::gateway::Gateway;
use mrtr_gateway::reload::Reloader;
use serde_json::{Value, json};

/// The upstream's CA, the certificate nginx presents (for `localhost`), and a directory
/// holding `ca.pem`.
struct Pki {
    ca: Ca,
    server: crate::support::tls::Leaf,
    dir: TempDir,
}

impl Pki {
    fn new() -> Pki {
        let ca = Ca::new("upstream CA");
        let server = ca.leaf("legacy upstream", &["localhost"]);
        let dir = TempDir::new("mrtr-upstream-pki");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { ca, server, dir }
    }

    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

fn ca_line(pki: &Pki) -> String {
    format!("ca_file = {:?}\n", pki.file("ca.pem"))
}

/// `tools/list` through the gateway: the HTTP status and the JSON-RPC message.
async fn tools_list(url: &str) -> (u16, Value) {
    let ex = mrtr_testkit::client::ModernClient::new(url)
        .request("tools/list", json!({}))
        .await
        .unwrap();
    (ex.status.as_u16(), ex.message.unwrap_or(Value::Null))
}

async fn upstream_check(gw: &Gateway) -> (bool, String) {
    let r = mrtr_gateway::readiness::evaluate(gw).await;
    let (_, check) = r
        .checks
        .iter()
        .find(|(name, _)| *name == "upstream")
        .expect("an upstream check");
    match check {
        Ok(d) => (true, d.clone()),
        Err(d) => (false, d.clone()),
    }
}

/// nginx terminating TLS with the test PKI's server certificate in front of `legacy`
/// (no client certificate, no bearer token required).
async fn tls_in_front(pki: &Pki, legacy: &PyLegacyServer) -> Nginx {
    let tls = NginxTls {
        server: &pki.server,
        client_ca_pem: None,
        require_bearer: None,
    };
    Nginx::start(tls, legacy.port).await
}

/// Through the gateway at `url`, the greet scenario completes with "Hello, Ada!" (nginx's
/// error log is shown if not), and `gw`'s upstream check passes.
async fn assert_greets_and_ready(url: &str, gw: &Gateway, nginx: &Nginx) {
    let report = modern_scenario(url, "greet", &[]).await;
    assert_ok(&report);
    assert_eq!(result_text(&report), "Hello, Ada!", "{}", nginx.error_log());
    assert!(upstream_check(gw).await.0);
}

#[tokio::test]
async fn both_http_transports_run_a_flow_through_nginx_with_ca_file() {
    let pki = Pki::new();
    // Streamable HTTP.
    let legacy = PyLegacyServer::start(&[]).await;
    let nginx = tls_in_front(&pki, &legacy).await;
    let upstream = format!("https://localhost:{}/mcp", nginx.port);
    let cfg = config(&upstream, &ca_line(&pki), "", "");
    let (gw, running, url) = start_gateway(cfg).await;
    assert_greets_and_ready(&url, &gw, &nginx).await;
    running.stop().await;
    nginx.stop().await;
    legacy.kill().await;

    // HTTP+SSE (2024-11-05): the SSE stream and the POSTs both go through nginx.
    let legacy = PyLegacyServer::start(&["--transport", "sse"]).await;
    let nginx = tls_in_front(&pki, &legacy).await;
    let cfg = config_with_upstream(
        &format!(
            "transport = \"sse\"\nurl = \"https://localhost:{}/sse\"\nprotocol_version = \"2024-11-05\"\nresponse_timeout = \"5s\"\n{}",
            nginx.port,
            ca_line(&pki)
        ),
        "",
        "",
    );
    let (gw, running, url) = start_gateway(cfg).await;
    assert_greets_and_ready(&url, &gw, &nginx).await;
    running.stop().await;
    nginx.stop().await;
    legacy.kill().await;
}

#[tokio::test]
async fn an_unknown_ca_or_a_wrong_name_is_a_clear_502_and_not_ready() {
    let pki = Pki::new();
    let legacy = PyLegacyServer::start(&[]).await;
    let nginx = tls_in_front(&pki, &legacy).await;

    // No ca_file: the system store does not know this CA.
    let cfg = config(&format!("https://localhost:{}/mcp", nginx.port), "", "", "");
    let (gw, running, url) = start_gateway(cfg).await;
    let (status, msg) = tools_list(&url).await;
    assert_eq!(status, 502, "{msg}");
    let text = msg["error"]["message"].as_str().unwrap_or_default();
    assert!(text.contains("not signed by a CA"), "{msg}");
    assert!(!text.contains(&nginx.port.to_string()), "{msg}");
    assert_metric!(
        &gw,
        "rejections_total",
        &[("reason", "upstream_tls_failed"), ("fault", "upstream")],
        1.0
    );
    let (ready, detail) = upstream_check(&gw).await;
    assert!(!ready, "{detail}");
    assert!(detail.contains("TLS"), "{detail}");
    running.stop().await;

    // The right CA, but the URL names 127.0.0.1 and the certificate is for localhost only.
    let cfg = config(
        &format!("https://127.0.0.1:{}/mcp", nginx.port),
        &ca_line(&pki),
        "",
        "",
    );
    let (gw, running, url) = start_gateway(cfg).await;
    let (status, msg) = tools_list(&url).await;
    assert_eq!(status, 502, "{msg}");
    assert!(
        msg["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not valid for the host name"),
        "{msg}"
    );
    assert!(!upstream_check(&gw).await.0);
    running.stop().await;

    // The same CA and the name on the certificate: served.
    let cfg = config(
        &format!("https://localhost:{}/mcp", nginx.port),
        &ca_line(&pki),
        "",
        "",
    );
    let (_gw, running, url) = start_gateway(cfg).await;
    let (status, msg) = tools_list(&url).await;
    assert_eq!(status, 200, "{msg}");
    running.stop().await;
    nginx.stop().await;
    legacy.kill().await;
}

#[tokio::test]
async fn an_upstream_requiring_a_client_certificate() {
    let pki = Pki::new();
    let client_ca = Ca::new("upstream client CA");
    let gateway_cert = client_ca.leaf("mrtr-gateway", &[]);
    std::fs::write(pki.dir.path().join("client.pem"), &gateway_cert.cert_pem).unwrap();
    std::fs::write(pki.dir.path().join("client.key"), &gateway_cert.key_pem).unwrap();
    // A certificate from a CA the upstream does not accept.
    let stranger = Ca::new("stranger CA").leaf("mrtr-gateway", &[]);
    std::fs::write(pki.dir.path().join("stranger.pem"), &stranger.cert_pem).unwrap();
    std::fs::write(pki.dir.path().join("stranger.key"), &stranger.key_pem).unwrap();
    let legacy = PyLegacyServer::start(&[]).await;
    let nginx = Nginx::start(
        NginxTls {
            server: &pki.server,
            client_ca_pem: Some(&client_ca.pem()),
            require_bearer: None,
        },
        legacy.port,
    )
    .await;
    let upstream = format!("https://localhost:{}/mcp", nginx.port);

    // Without a client certificate: refused, and not ready.
    let (gw, running, url) = start_gateway(config(&upstream, &ca_line(&pki), "", "")).await;
    let (status, msg) = tools_list(&url).await;
    assert_eq!(status, 502, "{msg}");
    assert!(!upstream_check(&gw).await.0);
    running.stop().await;

    // With a certificate the upstream does not trust: refused.
    let stranger_lines = format!(
        "{}client_cert_file = {:?}\nclient_key_file = {:?}\n",
        ca_line(&pki),
        pki.file("stranger.pem"),
        pki.file("stranger.key")
    );
    let (_gw, running, url) = start_gateway(config(&upstream, &stranger_lines, "", "")).await;
    let (status, msg) = tools_list(&url).await;
    assert_eq!(status, 502, "{msg}");
    running.stop().await;

    // With client_cert_file / client_key_file: a whole flow works.
    let lines = format!(
        "{}client_cert_file = {:?}\nclient_key_file = {:?}\n",
        ca_line(&pki),
        pki.file("client.pem"),
        pki.file("client.key")
    );
    let (gw, running, url) = start_gateway(config(&upstream, &lines, "", "")).await;
    assert_greets_and_ready(&url, &gw, &nginx).await;
    running.stop().await;
    nginx.stop().await;
    legacy.kill().await;
}

/// The CA file is watched like the front's TLS files: replacing its content (same path) swaps
/// in an upstream client that trusts the new CA, without a restart.
#[tokio::test]
async fn a_rotated_ca_file_is_picked_up_without_a_restart() {
    let pki = Pki::new();
    let legacy = PyLegacyServer::start(&[]).await;
    let nginx = tls_in_front(&pki, &legacy).await;
    let dir = TempDir::new("mrtr-upstream-reload");
    let ca_path = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_path, Ca::new("old CA").pem()).unwrap();
    let cfg_path = dir.path().join("gateway.toml");
    std::fs::write(
        &cfg_path,
        format!(
            "[listen]\naddr = \"127.0.0.1:0\"\n[upstream]\nurl = \"https://localhost:{}/mcp\"\nca_file = \"upstream-ca.pem\"\nresponse_timeout = \"5s\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n",
            nginx.port
        ),
    )
    .unwrap();
    let (gw, running, url) = start_gateway(Config::load(&cfg_path).unwrap()).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(
        Reloader {
            gw: gw.clone(),
            config_path: cfg_path.clone(),
            tls: None,
            log: None,
        }
        .run(shutdown.clone()),
    );
    let (status, msg) = tools_list(&url).await;
    assert_eq!(status, 502, "{msg}");

    // The Secret is updated: the same file now holds the CA that signed nginx's certificate.
    tokio::time::sleep(Duration::from_millis(200)).await; // let the watch register
    write_atomically(&ca_path, &pki.ca.pem());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, msg) = tools_list(&url).await;
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rotated CA file was not picked up: {msg}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    running.stop().await;
    nginx.stop().await;
    legacy.kill().await;
}

fn write_atomically(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

// ---- self-signed certificates as operators make them (openssl req -x509) -------------------

/// nginx presenting `server` in front of `legacy`.
async fn nginx_presenting(server: &Leaf, legacy: &PyLegacyServer) -> Nginx {
    let tls = NginxTls {
        server,
        client_ca_pem: None,
        require_bearer: None,
    };
    Nginx::start(tls, legacy.port).await
}

/// `openssl req -x509 … -addext subjectAltName=DNS:localhost,IP:127.0.0.1` in `dir`
/// (`server.crt`, `server.key`); OpenSSL 3 marks it CA:TRUE, which the test checks.
fn operators_certificate(dir: &TempDir) -> Leaf {
    let leaf = openssl_self_signed(
        dir.path(),
        "server",
        "localhost",
        "DNS:localhost,IP:127.0.0.1",
        &[],
    );
    let text = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-ext", "basicConstraints", "-in"])
        .arg(dir.path().join("server.crt"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("CA:TRUE"),
        "openssl req -x509 made a certificate without CA:TRUE: the test would prove nothing"
    );
    leaf
}

fn pins_line(pins: &[&str]) -> String {
    format!("pin_sha256 = {pins:?}\n")
}

/// The certificate `openssl req -x509` makes, trusted through `ca_file`: rustls refuses a CA
/// certificate as the server's own. The client, `/readyz` and the log all name that cause and
/// the two ways out, instead of "not signed by a CA the gateway trusts" (which it is).
#[tokio::test]
async fn a_self_signed_ca_certificate_in_ca_file_is_refused_naming_the_cause() {
    crate::support::logs::capture();
    let dir = TempDir::new("mrtr-openssl-ca-leaf");
    let server = operators_certificate(&dir);
    let legacy = PyLegacyServer::start(&[]).await;
    let nginx = nginx_presenting(&server, &legacy).await;
    let ca = format!(
        "ca_file = {:?}\n",
        dir.path().join("server.crt").display().to_string()
    );
    let cfg = config(
        &format!("https://localhost:{}/mcp", nginx.port),
        &ca,
        "",
        "",
    );
    let (gw, running, url) = start_gateway(cfg).await;

    let (status, msg) = tools_list(&url).await;
    assert_eq!(status, 502, "{msg}");
    let told = msg["error"]["message"].as_str().unwrap_or_default();
    for needle in [
        "is a CA certificate",
        "leaf certificate",
        "upstream.pin_sha256",
    ] {
        assert!(told.contains(needle), "{needle:?} not in {msg}");
    }
    assert!(!told.contains("not signed by a CA"), "{msg}");
    assert_metric!(
        &gw,
        "rejections_total",
        &[("reason", "upstream_tls_failed"), ("fault", "upstream")],
        1.0
    );
    let warned =
        crate::support::logs::warn_lines(&crate::support::logs::request_id_of(&msg["error"]));
    assert!(
        warned.iter().any(|l| l.contains("is a CA certificate")),
        "{warned:#?}"
    );
    let (ready, detail) = upstream_check(&gw).await;
    assert!(!ready, "{detail}");
    assert!(detail.contains("is a CA certificate"), "{detail}");
    running.stop().await;
    nginx.stop().await;

    // The advice works: the same line with CA:FALSE makes a leaf that ca_file can trust.
    let leaf = openssl_self_signed(
        dir.path(),
        "leaf",
        "localhost",
        "DNS:localhost,IP:127.0.0.1",
        &["-addext", "basicConstraints=critical,CA:FALSE"],
    );
    let nginx = nginx_presenting(&leaf, &legacy).await;
    let ca = format!(
        "ca_file = {:?}\n",
        dir.path().join("leaf.crt").display().to_string()
    );
    let cfg = config(
        &format!("https://localhost:{}/mcp", nginx.port),
        &ca,
        "",
        "",
    );
    let (gw, running, url) = start_gateway(cfg).await;
    assert_greets_and_ready(&url, &gw, &nginx).await;
    running.stop().await;
    nginx.stop().await;
    legacy.kill().await;
}

/// The same certificate trusted by its public key (`pin_sha256`, computed with openssl as
/// curl's documentation gives it): a whole flow runs and the upstream is ready, by host name and
/// by the IP address in its subjectAltName, with the pin in either spelling.
#[tokio::test]
async fn a_pinned_self_signed_certificate_is_trusted_as_itself() {
    let dir = TempDir::new("mrtr-openssl-pinned");
    let server = operators_certificate(&dir);
    let pin = openssl_spki_pin(&dir.path().join("server.crt"));
    let legacy = PyLegacyServer::start(&[]).await;
    let nginx = nginx_presenting(&server, &legacy).await;
    let bare = pin.trim_start_matches("sha256//");
    openssl_self_signed(dir.path(), "other", "localhost", "DNS:localhost", &[]);
    let other = openssl_spki_pin(&dir.path().join("other.crt"));
    for (host, pins) in [
        ("localhost", vec![pin.as_str()]),
        // The next key listed beside the current one, as for a rotation.
        ("127.0.0.1", vec![other.as_str(), bare]),
    ] {
        let cfg = config(
            &format!("https://{host}:{}/mcp", nginx.port),
            &pins_line(&pins),
            "",
            "",
        );
        let (gw, running, url) = start_gateway(cfg).await;
        assert_greets_and_ready(&url, &gw, &nginx).await;
        running.stop().await;
    }
    nginx.stop().await;
    legacy.kill().await;
}

/// Pins that do not match the server's key are refused (and say so), and a matching pin does
/// not excuse a host name the certificate does not carry.
#[tokio::test]
async fn a_wrong_pin_or_a_wrong_name_is_refused() {
    let dir = TempDir::new("mrtr-openssl-wrong-pin");
    let server = operators_certificate(&dir);
    openssl_self_signed(dir.path(), "other", "localhost", "DNS:localhost", &[]);
    let wrong = openssl_spki_pin(&dir.path().join("other.crt"));
    let legacy = PyLegacyServer::start(&[]).await;
    let nginx = nginx_presenting(&server, &legacy).await;

    let cfg = config(
        &format!("https://localhost:{}/mcp", nginx.port),
        &pins_line(&[&wrong]),
        "",
        "",
    );
    let (gw, running, url) = start_gateway(cfg).await;
    let (status, msg) = tools_list(&url).await;
    assert_eq!(status, 502, "{msg}");
    assert!(
        msg["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("matches none of upstream.pin_sha256"),
        "{msg}"
    );
    let (ready, detail) = upstream_check(&gw).await;
    assert!(!ready && detail.contains("pin_sha256"), "{detail}");
    running.stop().await;

    // The right pin, but the URL names a host that is not in the certificate.
    let named = openssl_self_signed(dir.path(), "named", "localhost", "DNS:legacy.example", &[]);
    let right = openssl_spki_pin(&dir.path().join("named.crt"));
    let nginx_named = nginx_presenting(&named, &legacy).await;
    let cfg = config(
        &format!("https://localhost:{}/mcp", nginx_named.port),
        &pins_line(&[&right]),
        "",
        "",
    );
    let (gw, running, url) = start_gateway(cfg).await;
    let (status, msg) = tools_list(&url).await;
    assert_eq!(status, 502, "{msg}");
    assert!(
        msg["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not valid for the host name"),
        "{msg}"
    );
    assert!(!upstream_check(&gw).await.0);
    running.stop().await;
    nginx_named.stop().await;
    nginx.stop().await;
    legacy.kill().await;
}
