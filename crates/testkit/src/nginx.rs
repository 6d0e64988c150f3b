//! Debian's nginx as a reverse proxy for the tests and the load bench: one process (no daemon,
//! no master), its configuration, logs and temporary files in one directory the caller owns.
//! `scripts/test.sh` installs `nginx-light`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// The nginx binary, if it is installed.
pub fn binary() -> Result<PathBuf, String> {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| "nginx is not installed (scripts/test.sh installs nginx-light)".into())
}

/// A loopback port that was free a moment ago (nginx binds it later: callers retry).
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// One `server` that proxies everything to `backend`, unbuffered both ways (SSE streams pass
/// as they come).
pub struct ProxyConf<'a> {
    /// Where the configuration, logs and temporary files go.
    pub dir: &'a Path,
    /// The arguments of `listen`, e.g. `127.0.0.1:8443 ssl`.
    pub listen: String,
    /// `host:port` of the backend.
    pub backend: &'a str,
    /// Idle keep-alive connections kept to the backend; 0 opens one per request.
    pub keepalive: usize,
    /// More directives for the `server` block (certificates) and its `location` (checks).
    pub server_extra: &'a str,
    pub location_extra: &'a str,
    /// `error_log` level: `info` shows TLS handshake failures, `warn` keeps a bench quiet.
    pub log_level: &'a str,
    /// `proxy_read_timeout`: how long nginx waits between two reads from the backend before it
    /// answers 504 (a front timeout, as ingresses have).
    pub read_timeout: &'a str,
}

impl ProxyConf<'_> {
    pub fn render(&self) -> String {
        let d = self.dir.display();
        let (upstream, target) = if self.keepalive > 0 {
            (
                format!(
                    "upstream backend {{ server {}; keepalive {}; }}",
                    self.backend, self.keepalive
                ),
                "backend".to_string(),
            )
        } else {
            (String::new(), self.backend.to_string())
        };
        format!(
            r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log {log_level};
events {{ worker_connections 16384; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    {upstream}
    server {{
        listen {listen};
        server_name localhost;
        keepalive_requests 1000000;
        {server_extra}
        location / {{
            {location_extra}
            proxy_pass http://{target};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_cache off;
            proxy_read_timeout {read_timeout};
        }}
    }}
}}
"#,
            listen = self.listen,
            server_extra = self.server_extra,
            location_extra = self.location_extra,
            log_level = self.log_level,
            read_timeout = self.read_timeout,
        )
    }

    /// Writes the configuration and starts nginx on it; returns once `port` accepts
    /// connections (within 15 s), or why it did not.
    pub async fn start(&self, port: u16) -> Result<Child, String> {
        let d = self.dir;
        std::fs::write(d.join("nginx.conf"), self.render()).map_err(|e| e.to_string())?;
        let mut child = Command::new(binary()?)
            .arg("-p")
            .arg(d)
            .arg("-e")
            .arg(d.join("error.log"))
            .arg("-c")
            .arg(d.join("nginx.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
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
                return Ok(child);
            }
            if Instant::now() > deadline {
                let _ = child.kill().await;
                return Err("nginx did not listen within 15 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
