//! Debian's nginx as a real TLS terminator in front of a legacy server: started per test on a
//! free loopback port with a configuration in a temporary directory (one process, no daemon,
//! nothing written outside that directory). `scripts/test.sh` installs it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use super::peers::tempdir::TempDir;
use super::tls::Leaf;

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

fn nginx_binary() -> PathBuf {
    for p in ["/usr/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!("nginx is not installed: run scripts/test.sh (it installs Debian's nginx-light)");
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
        let conf = format!(
            r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port} ssl;
        server_name localhost;
        ssl_certificate {d}/server.crt;
        ssl_certificate_key {d}/server.key;
        {client_auth}
        location / {{
            {bearer}
            proxy_pass http://127.0.0.1:{backend_port};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_cache off;
            proxy_read_timeout 120s;
        }}
    }}
}}
"#,
            d = d.display()
        );
        std::fs::write(d.join("nginx.conf"), conf).unwrap();
        let mut child = Command::new(nginx_binary())
            .arg("-p")
            .arg(d)
            .arg("-e")
            .arg(d.join("error.log"))
            .arg("-c")
            .arg(d.join("nginx.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run nginx: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(d.join("error.log")).unwrap_or_default();
                return Err(format!("nginx exited with {status}: {log}"));
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(Nginx { child, port, dir });
            }
            if Instant::now() > deadline {
                let _ = child.kill().await;
                return Err("nginx did not listen within 15 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// nginx's error log so far (for assertion messages).
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
