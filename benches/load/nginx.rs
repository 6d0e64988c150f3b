//! The cheapest hop to compare with: Debian's nginx as a plain reverse proxy in front of the
//! same legacy server, with a keep-alive upstream pool and no buffering either way (SSE
//! answers pass as they come). One worker process, no master, so its CPU time is one
//! process's; started on a free loopback port with everything in a temporary directory,
//! killed when dropped. `scripts/test.sh` installs `nginx-light`.

use std::path::PathBuf;

use mrtr_testkit::nginx::{ProxyConf, free_port};
use tokio::process::Child;

use super::gateway_child::proc_cpu_seconds;

pub struct NginxHop {
    child: Child,
    pid: u32,
    pub url: String,
    dir: PathBuf,
}

impl NginxHop {
    /// A proxy to `backend_url` (`http://127.0.0.1:PORT/mcp`); the hop's URL keeps the path.
    /// `access_log`: nginx writes its default access log (one line per request, unbuffered,
    /// as Debian's stock configuration does) to a file in its directory; otherwise none.
    pub async fn start(backend_url: &str, access_log: bool) -> Result<NginxHop, String> {
        Self::start_with(backend_url, access_log, None).await
    }

    /// The same proxy serving TLS with `cert` and `key` (PEM, valid for `localhost`): its URL
    /// is `https://localhost:PORT/…` (`--upstream-tls`, the gateway's legacy server over
    /// `https`), offering the TLS versions in `protocols` (nginx's `ssl_protocols`).
    pub async fn start_tls(
        backend_url: &str,
        cert: &str,
        key: &str,
        protocols: &str,
    ) -> Result<NginxHop, String> {
        Self::start_with(backend_url, false, Some((cert, key, protocols))).await
    }

    async fn start_with(
        backend_url: &str,
        access_log: bool,
        tls: Option<(&str, &str, &str)>,
    ) -> Result<NginxHop, String> {
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
            match Self::try_start(&backend, uri.path(), access_log, tls).await {
                Ok(hop) => return Ok(hop),
                Err(e) => last = e,
            }
        }
        Err(format!("nginx did not start: {last}"))
    }

    async fn try_start(
        backend: &str,
        path: &str,
        access_log: bool,
        tls: Option<(&str, &str, &str)>,
    ) -> Result<NginxHop, String> {
        let dir = std::env::temp_dir().join(format!(
            "mrtr-load-nginx-{}-{}",
            std::process::id(),
            free_port()?
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let port = free_port()?;
        let mut server_extra = if access_log {
            format!("access_log {}/access.log;", dir.display())
        } else {
            String::new()
        };
        let (listen, scheme, host) = match tls {
            Some((cert, key, protocols)) => {
                std::fs::write(dir.join("tls.crt"), cert).map_err(|e| e.to_string())?;
                std::fs::write(dir.join("tls.key"), key).map_err(|e| e.to_string())?;
                server_extra.push_str(&format!(
                    " ssl_certificate {0}/tls.crt; ssl_certificate_key {0}/tls.key; ssl_protocols {protocols};",
                    dir.display()
                ));
                (format!("127.0.0.1:{port} ssl"), "https", "localhost")
            }
            None => (format!("127.0.0.1:{port}"), "http", "127.0.0.1"),
        };
        let conf = ProxyConf {
            dir: &dir,
            listen,
            backend,
            keepalive: 256,
            server_extra: &server_extra,
            location_extra: "",
            log_level: "warn",
            read_timeout: "120s",
        };
        let started = conf.start(port).await;
        let child = match started {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let pid = child.id().ok_or("nginx exited at once")?;
        Ok(NginxHop {
            child,
            pid,
            url: format!("{scheme}://{host}:{port}{path}"),
            dir,
        })
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
