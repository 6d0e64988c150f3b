//! Debian's nginx as a real TLS terminator in front of a legacy server: started per test on a
//! free loopback port with a configuration in a temporary directory (one process, no daemon,
//! nothing written outside that directory). `scripts/test.sh` installs it.

use tokio::process::Child;

use super::peers::tempdir::TempDir;
use super::tls::Leaf;
use mrtr_testkit::nginx::ProxyConf;

/// What the TLS front presents and asks for.
pub struct NginxTls<'a> {
    /// The server certificate and key nginx presents.
    pub server: &'a Leaf,
    /// When set, a client certificate signed by this CA (PEM) is required.
    pub client_ca_pem: Option<&'a str>,
    /// When set, requests without `Authorization: Bearer <this>` get 401 from nginx.
    pub require_bearer: Option<&'a str>,
}

/// A running nginx; killed when dropped.
pub struct Nginx {
    child: Child,
    pub port: u16,
    dir: TempDir,
}

impl Nginx {
    /// Terminates TLS on `127.0.0.1:<free port>` and proxies everything to
    /// `http://127.0.0.1:<backend_port>`, unbuffered both ways (SSE streams pass as they come).
    pub async fn start(tls: NginxTls<'_>, backend_port: u16) -> Nginx {
        // A port picked free can be taken before nginx binds it: try a few.
        let mut last = String::new();
        for _ in 0..5 {
            match Self::try_start(&tls, backend_port).await {
                Ok(n) => return n,
                Err(e) => last = e,
            }
        }
        panic!("nginx did not start: {last}");
    }

    async fn try_start(tls: &NginxTls<'_>, backend_port: u16) -> Result<Nginx, String> {
        let dir = TempDir::new("mrtr-nginx");
        let d = dir.path();
        std::fs::write(d.join("server.crt"), &tls.server.cert_pem).unwrap();
        std::fs::write(d.join("server.key"), &tls.server.key_pem).unwrap();
        let client_auth = match tls.client_ca_pem {
            Some(ca) => {
                std::fs::write(d.join("client-ca.crt"), ca).unwrap();
                format!(
                    "ssl_client_certificate {}/client-ca.crt;\n        ssl_verify_client on;",
                    d.display()
                )
            }
            None => String::new(),
        };
        let bearer = match tls.require_bearer {
            Some(token) => {
                format!("if ($http_authorization != \"Bearer {token}\") {{ return 401; }}")
            }
            None => String::new(),
        };
        let port = super::free_port();
        let server_extra = format!(
            "ssl_certificate {d}/server.crt;\n        ssl_certificate_key {d}/server.key;\n        {client_auth}",
            d = d.display()
        );
        let backend = format!("127.0.0.1:{backend_port}");
        let conf = ProxyConf {
            dir: d,
            listen: format!("127.0.0.1:{port} ssl"),
            backend: &backend,
            keepalive: 0,
            server_extra: &server_extra,
            location_extra: &bearer,
            log_level: "info",
            read_timeout: "120s",
        };
        let child = conf.start(port).await?;
        Ok(Nginx { child, port, dir })
    }

    /// nginx's error log so far (for assertion messages).
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
