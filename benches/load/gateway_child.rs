//! The gateway under test, as a child process: the real `mrtr-gateway serve` binary (built
//! by cargo alongside this bench, in the same profile) with a generated configuration.
//!
//! A separate process because that is how the gateway runs in production (a sidecar next to
//! the legacy server), because its resident memory must be its own for the soak and parking
//! measurements, and because it lets a profiler wrap just the gateway (`--gateway-prefix`).
//! It logs at its shipped default (`info`, JSON: one access line per request) unless told
//! otherwise, to a file outside its configuration's folder (as a container runtime would
//! keep it), whose last lines go into error messages.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::process::{Child, Command};

/// The configuration knobs the modes set.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    pub gather_window: String,
    pub gather_quiet: String,
    pub policy: String,
    pub parking_max_calls: usize,
    pub parking_max_per_principal: usize,
    /// `quotas.newcomer_reserve`: the park run parks every call as one caller, so it turns the
    /// reserve for other callers off.
    pub newcomer_reserve: f64,
    pub parking_ttl: String,
    pub upstream_idle_timeout: String,
    pub max_concurrent_requests: usize,
    /// `listen.header_read_timeout`, which also closes an HTTP/1 keep-alive connection waiting
    /// that long for its next request.
    pub header_read_timeout: String,
    /// `log.level` (the shipped default is `info`).
    pub log_level: String,
    /// Another build of the gateway to run instead of the one cargo built with this bench.
    pub binary: Option<String>,
    /// A command the gateway runs under (e.g. a profiler), split on spaces.
    pub prefix: Vec<String>,
    /// `tracing.otlp_endpoint` (trace export off when `None`, the shipped default).
    pub otlp_endpoint: Option<String>,
    /// `auth.upstream_credentials = "forward"`: each client's own `Authorization` goes
    /// upstream, so clients sending different ones are different callers to every pool.
    pub forward_credentials: bool,
    /// Front TLS: the certificate and key (PEM) the gateway serves with (`[tls]`; plain HTTP
    /// when `None`, the shipped default).
    pub tls: Option<(String, String)>,
    /// The legacy server's certificate (PEM), trusted as `upstream.ca_file`, when the
    /// legacy server is reached over `https` (`--upstream-tls`).
    pub upstream_ca: Option<String>,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        // The gateway's shipped defaults (config/gateway.toml), so plain runs measure them.
        GatewayOptions {
            gather_window: "100ms".into(),
            gather_quiet: "2ms".into(),
            policy: "park-then-replay".into(),
            parking_max_calls: 1000,
            parking_max_per_principal: 100,
            newcomer_reserve: 0.125,
            parking_ttl: "2m".into(),
            upstream_idle_timeout: "5m".into(),
            max_concurrent_requests: 1024,
            header_read_timeout: "10s".into(),
            log_level: "info".into(),
            binary: None,
            prefix: Vec::new(),
            otlp_endpoint: None,
            forward_credentials: false,
            tls: None,
            upstream_ca: None,
        }
    }
}

pub struct GatewayChild {
    child: Child,
    pid: u32,
    /// The 2026-07-28 endpoint.
    pub url: String,
    admin: String,
    dir: PathBuf,
    log: PathBuf,
    http: Client<HttpConnector, Full<Bytes>>,
}

/// A loopback port nothing listens on right now (a tiny race with other processes, fine for
/// a local benchmark).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn random_secret() -> String {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).expect("the OS random source works");
    base64::engine::general_purpose::STANDARD.encode(key)
}

/// Retries one run may claim (`single_use.max_entries` and its per-caller share): a
/// million, about 150 MB at most.
const SINGLE_USE_CLAIMS: u64 = 1_000_000;

fn config_text(legacy_url: &str, port: u16, admin_port: u16, o: &GatewayOptions) -> String {
    let tracing = o
        .otlp_endpoint
        .as_deref()
        .map(|e| format!("[tracing]\notlp_endpoint = \"{e}\"\n"))
        .unwrap_or_default();
    let mut text = format!(
        "[listen]\naddr = \"127.0.0.1:{port}\"\nmax_concurrent_requests = {max}\nheader_read_timeout = \"{hrt}\"\n\
         [upstream]\nurl = \"{legacy_url}\"\nidle_timeout = \"{idle}\"\n{upstream_ca}\
         [state]\nttl = \"10m\"\n\
         [[state.keys]]\nid = \"load\"\nsecret = \"{secret}\"\n\
         [mrtr]\ngather_window = \"{gather}\"\ngather_quiet = \"{quiet}\"\n\
         [parking]\ndefault_policy = \"{policy}\"\nmax_calls = {calls}\nmax_per_principal = {per}\nttl = \"{ttl}\"\n\
         [log]\nlevel = \"{log_level}\"\n\
         [admin]\naddr = \"127.0.0.1:{admin_port}\"\n\
         [drain]\nreadiness_delay = \"0s\"\ndeadline = \"2s\"\n\
         [quotas]\nnewcomer_reserve = {reserve}\n\
         [single_use]\nmax_entries = {claims}\nmax_entries_per_principal = {claims}\n",
        max = o.max_concurrent_requests,
        hrt = o.header_read_timeout,
        idle = o.upstream_idle_timeout,
        upstream_ca = if o.upstream_ca.is_some() {
            "ca_file = \"upstream-ca.crt\"\n"
        } else {
            ""
        },
        secret = random_secret(),
        gather = o.gather_window,
        quiet = o.gather_quiet,
        policy = o.policy,
        calls = o.parking_max_calls,
        per = o.parking_max_per_principal,
        ttl = o.parking_ttl,
        log_level = o.log_level,
        reserve = o.newcomer_reserve,
        // Every client of a run is one caller, and a retry's claim is held until its state
        // expires (`state.ttl` above): at the flow's rate the default share (25,000) fills
        // within seconds and the rest of the run measures refusals. Room for a whole run.
        claims = SINGLE_USE_CLAIMS,
    );
    text.push_str(&tracing);
    if o.forward_credentials {
        text.push_str("[auth]\nupstream_credentials = \"forward\"\n");
    }
    if o.tls.is_some() {
        text.push_str("[tls]\ncert_file = \"tls.crt\"\nkey_file = \"tls.key\"\n");
    }
    text
}

impl GatewayChild {
    /// The directory holding the gateway's configuration (and its TLS files).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Writes the configuration, starts the gateway and waits until `/readyz` says ready.
    pub async fn spawn(legacy_url: &str, options: &GatewayOptions) -> Result<GatewayChild, String> {
        let port = free_port().map_err(|e| e.to_string())?;
        let admin_port = free_port().map_err(|e| e.to_string())?;
        let dir = std::env::temp_dir().join(format!("mrtr-load-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let config = dir.join("gateway.toml");
        let log = dir.with_extension("log");
        std::fs::write(&config, config_text(legacy_url, port, admin_port, options))
            .map_err(|e| e.to_string())?;
        if let Some(ca) = &options.upstream_ca {
            std::fs::write(dir.join("upstream-ca.crt"), ca).map_err(|e| e.to_string())?;
        }
        if let Some((cert, key)) = &options.tls {
            std::fs::write(dir.join("tls.crt"), cert).map_err(|e| e.to_string())?;
            std::fs::write(dir.join("tls.key"), key).map_err(|e| e.to_string())?;
        }
        let binary = options
            .binary
            .as_deref()
            .unwrap_or(env!("CARGO_BIN_EXE_mrtr-gateway"));
        let mut command = match options.prefix.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(binary);
                c
            }
            None => Command::new(binary),
        };
        command
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?,
            ))
            .kill_on_drop(true);
        let child = command
            .spawn()
            .map_err(|e| format!("spawn {binary}: {e}"))?;
        let pid = child.id().ok_or("the gateway exited at once")?;
        let gw = GatewayChild {
            child,
            pid,
            url: format!(
                "{}://127.0.0.1:{port}/mcp",
                if options.tls.is_some() {
                    "https"
                } else {
                    "http"
                }
            ),
            admin: format!("http://127.0.0.1:{admin_port}"),
            dir,
            log,
            http: Client::builder(TokioExecutor::new()).build_http(),
        };
        // A profiler makes start-up slow.
        let patience = if options.prefix.is_empty() { 30 } else { 300 };
        gw.wait_ready(Duration::from_secs(patience)).await?;
        Ok(gw)
    }

    async fn wait_ready(&self, patience: Duration) -> Result<(), String> {
        let deadline = Instant::now() + patience;
        loop {
            if let Ok((StatusCode::OK, _)) = self.admin_get("/readyz").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the gateway was not ready within {patience:?}; its last log lines:\n{}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last 20 lines the gateway logged.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    async fn admin_get(&self, path: &str) -> Result<(StatusCode, String), String> {
        let req = Request::get(format!("{}{path}", self.admin))
            .body(Full::new(Bytes::new()))
            .expect("valid request");
        let resp = tokio::time::timeout(Duration::from_secs(5), self.http.request(req))
            .await
            .map_err(|_| "admin request timed out".to_string())?
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// The sum of a metric's samples whose labels include every `labels` pair.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Result<f64, String> {
        let (_, text) = self.admin_get("/metrics").await?;
        Ok(metric_sum(&text, name, labels))
    }

    /// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`).
    pub fn status_kib(&self, field: &str) -> Option<u64> {
        proc_status_kib(self.pid, field)
    }

    /// CPU seconds (user, system) the process has used so far.
    pub fn cpu_seconds(&self) -> (f64, f64) {
        proc_cpu_seconds(self.pid).unwrap_or((0.0, 0.0))
    }

    /// Open file descriptors.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid)).map_or(0, |d| d.count())
    }

    /// SIGTERM, then wait (bounded) for the drain to finish.
    pub async fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status();
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.log);
    }
}

pub use mrtr_testkit::proc::{cpu_seconds as proc_cpu_seconds, status_kib as proc_status_kib};

pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
