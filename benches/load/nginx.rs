//! The cheapest hop to compare with: Debian's nginx as a plain reverse proxy in front of the
//! same legacy server, with a keep-alive upstream pool and no buffering either way (SSE
//! answers pass as they come). One worker process, no master, so its CPU time is one
//! process's; started on a free loopback port with everything in a temporary directory,
//! killed when dropped. `scripts/test.sh` installs `nginx-light`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use super::gateway_child::proc_cpu_seconds;

pub struct NginxHop {
    child: Child,
    pid: u32,
    pub url: String,
    dir: PathBuf,
}

fn binary() -> Result<PathBuf, String> {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| "nginx is not installed (scripts/test.sh installs nginx-light)".into())
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

fn config(dir: &Path, port: u16, backend: &str) -> String {
    let d = dir.display();
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream legacy {{
        server {backend};
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://legacy;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_cache off;
            proxy_read_timeout 120s;
        }}
    }}
}}
"#
    )
}

impl NginxHop {
    /// A proxy to `backend_url` (`http://127.0.0.1:PORT/mcp`); the hop's URL keeps the path.
    pub async fn start(backend_url: &str) -> Result<NginxHop, String> {
        let uri: http::Uri = backend_url
            .parse()
            .map_err(|e| format!("backend URL {backend_url}: {e}"))?;
        let backend = uri
            .authority()
            .ok_or("the backend URL has no authority")?
            .to_string();
        let mut last = String::new();
        // A port found free can be taken before nginx binds it: a few tries.
        for _ in 0..5 {
            match Self::try_start(&backend, uri.path()).await {
                Ok(hop) => return Ok(hop),
                Err(e) => last = e,
            }
        }
        Err(format!("nginx did not start: {last}"))
    }

    async fn try_start(backend: &str, path: &str) -> Result<NginxHop, String> {
        let dir = std::env::temp_dir().join(format!(
            "mrtr-load-nginx-{}-{}",
            std::process::id(),
            free_port()?
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let port = free_port()?;
        std::fs::write(dir.join("nginx.conf"), config(&dir, port, backend))
            .map_err(|e| e.to_string())?;
        let child = Command::new(binary()?)
            .arg("-p")
            .arg(&dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run nginx: {e}"))?;
        let pid = child.id().ok_or("nginx exited at once")?;
        let mut hop = NginxHop {
            child,
            pid,
            url: format!("http://127.0.0.1:{port}{path}"),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = hop.child.try_wait() {
                let log = std::fs::read_to_string(hop.dir.join("error.log")).unwrap_or_default();
                return Err(format!("nginx exited with {status}: {log}"));
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(hop);
            }
            if Instant::now() > deadline {
                return Err("nginx did not listen within 10 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// CPU seconds (user, system) the nginx process has used so far.
    pub fn cpu_seconds(&self) -> (f64, f64) {
        proc_cpu_seconds(self.pid).unwrap_or((0.0, 0.0))
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
