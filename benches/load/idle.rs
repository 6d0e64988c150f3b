//! `--idle N [--idle-over http1|h2|tls|tls-h2]`: the gateway's resident memory per idle client
//! connection, over plain HTTP/1.1 (the default), HTTP/2, or either over TLS.
//!
//! After a warm-up, the gateway's VmRSS and descriptors are read; then N clients each open a
//! connection, make one plain call on it and keep it open (HTTP/1.1 keep-alive: each client's
//! pool holds its connection). Once the `active_connections` gauge reads N more and a short
//! settle has passed, VmRSS is read again, and once more after `SETTLED` (the steady state,
//! once the allocator has purged what connections freed as they went to rest): the difference
//! over N is what one idle connection costs. The clients are then dropped, to read VmRSS after
//! the connections closed.

use std::time::Duration;

use mrtr_testkit::client::ModernClient;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use super::gateway_child::GatewayChild;

/// Connections opened at once.
const BATCH: usize = 64;

/// How much longer the connections are held before the steady-state reading.
const SETTLED: Duration = Duration::from_secs(15);

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn one_call(c: &ModernClient) -> Result<(), String> {
    let ex = c
        .request(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "idle"}}),
        )
        .await
        .map_err(|e| e.to_string())?;
    ex.result()
        .map(|_| ())
        .ok_or_else(|| format!("{:?}", ex.message))
}

/// How the idle clients connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Http1,
    H2,
    Tls,
    TlsH2,
}

impl Transport {
    pub fn parse(s: &str) -> Result<Transport, String> {
        match s {
            "http1" => Ok(Transport::Http1),
            "h2" => Ok(Transport::H2),
            "tls" => Ok(Transport::Tls),
            "tls-h2" => Ok(Transport::TlsH2),
            other => Err(format!("{other}: one of http1, h2, tls, tls-h2")),
        }
    }

    pub fn is_tls(self) -> bool {
        matches!(self, Transport::Tls | Transport::TlsH2)
    }

    fn describe(self) -> &'static str {
        match self {
            Transport::Http1 => "HTTP/1.1",
            Transport::H2 => "HTTP/2 (prior knowledge)",
            Transport::Tls => "HTTP/1.1 over TLS",
            Transport::TlsH2 => "HTTP/2 over TLS",
        }
    }
}

/// A certificate for `localhost` and 127.0.0.1 and its key, PEM (the gateway's front TLS).
pub fn self_signed() -> Result<(String, String), String> {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let made = rcgen::generate_simple_self_signed(names).map_err(|e| e.to_string())?;
    Ok((made.cert.pem(), made.signing_key.serialize_pem()))
}

/// An open connection that made one call; dropping it closes the connection.
type Held = Box<dyn std::any::Any + Send>;

/// `n` clients, each with one connection that made one call.
async fn open(gw: &GatewayChild, n: usize, over: Transport) -> Result<Vec<Held>, String> {
    let tls = match over {
        Transport::Tls => Some(tls_connector(gw, b"http/1.1")?),
        Transport::TlsH2 => Some(tls_connector(gw, b"h2")?),
        _ => None,
    };
    let mut clients: Vec<Held> = Vec::with_capacity(n);
    while clients.len() < n {
        let mut batch = JoinSet::new();
        for _ in 0..(n - clients.len()).min(BATCH) {
            let url = gw.url.clone();
            let tls = tls.clone();
            batch.spawn(async move {
                match over {
                    Transport::Http1 => {
                        let c = ModernClient::new(&url);
                        one_call(&c).await.map(|()| Box::new(c) as Held)
                    }
                    _ => raw_call(&url, over, tls).await,
                }
            });
        }
        while let Some(joined) = batch.join_next().await {
            clients.push(joined.map_err(|e| e.to_string())??);
        }
    }
    Ok(clients)
}

/// A TLS client trusting the gateway's certificate, offering `alpn`.
fn tls_connector(gw: &GatewayChild, alpn: &[u8]) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let pem = std::fs::read(gw.dir().join("tls.crt")).map_err(|e| e.to_string())?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&pem) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Ok(tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg)))
}

/// One connection over `over`, one plain call on it; returns what keeps it open.
async fn raw_call(
    url: &str,
    over: Transport,
    tls: Option<tokio_rustls::TlsConnector>,
) -> Result<Held, String> {
    use http_body_util::Full;

    let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let authority = uri.authority().ok_or("no authority")?.to_string();
    let tcp = tokio::net::TcpStream::connect(&authority)
        .await
        .map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let c = ModernClient::new(url);
    let body = json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": c.params_with_meta(json!({"name": "echo", "arguments": {"text": "idle"}})),
    });
    let mut req = http::Request::post(uri.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json, text/event-stream");
    for (name, value) in &ModernClient::routing_headers(&body) {
        req = req.header(name, value);
    }
    if matches!(over, Transport::Tls) {
        req = req.header(http::header::HOST, authority.as_str());
    }
    let req = req
        .body(Full::new(bytes::Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;

    match tls {
        Some(connector) => {
            let name =
                rustls::pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
            let stream = connector
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS handshake: {e}"))?;
            call_on(stream, over == Transport::TlsH2, req).await
        }
        None => call_on(tcp, over == Transport::H2, req).await,
    }
}

/// Sends `req` on `io` with hyper's HTTP/2 (`h2`) or HTTP/1 client connection, reads the
/// answer, and returns what keeps the connection open: its sender and its task.
async fn call_on<T>(
    io: T,
    h2: bool,
    req: http::Request<http_body_util::Full<bytes::Bytes>>,
) -> Result<Held, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use http_body_util::BodyExt;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let io = TokioIo::new(io);
    let (response, held): (http::Response<hyper::body::Incoming>, Held) = if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| e.to_string())?;
        let task = tokio::spawn(conn);
        let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
        (response, Box::new((sender, AbortOnDrop(task))))
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        let task = tokio::spawn(conn);
        let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
        (response, Box::new((sender, AbortOnDrop(task))))
    };
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if status != http::StatusCode::OK {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&bytes)));
    }
    Ok(held)
}

/// A connection's task, stopped (and its connection closed) when the client is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub async fn run(gw: &GatewayChild, n: usize, over: Transport) -> Result<(String, Value), String> {
    // Warm-up: pools and allocator arenas exist before the first reading.
    drop(open(gw, BATCH, over).await?);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let open_before = gw.metric("mrtr_gateway_active_connections", &[]).await?;
    let before = gw.status_kib("VmRSS").unwrap_or(0);
    let fds_before = gw.fds();

    let clients = open(gw, n, over).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let open_with = gw.metric("mrtr_gateway_active_connections", &[]).await?;
    let at_rest = gw.metric("mrtr_gateway_connections_at_rest", &[]).await?;
    let with = gw.status_kib("VmRSS").unwrap_or(0);
    let fds_with = gw.fds();
    // Memory freed by connections that went to rest leaves the resident set only as the
    // allocator purges it (jemalloc: over about ten seconds), so the steady state is read too.
    // What idle connections cost in CPU: the gateway's own, while nothing else happens.
    let cpu_idle_start = gw.cpu_seconds();
    tokio::time::sleep(SETTLED).await;
    let cpu_idle_end = gw.cpu_seconds();
    let with_settled = gw.status_kib("VmRSS").unwrap_or(0);
    let open_settled = gw.metric("mrtr_gateway_active_connections", &[]).await?;

    drop(clients);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let open_after = gw.metric("mrtr_gateway_active_connections", &[]).await?;
    let after = gw.status_kib("VmRSS").unwrap_or(0);

    let idle = (open_with - open_before).max(1.0);
    let per_conn = with.saturating_sub(before) as f64 * 1024.0 / idle;
    let per_conn_settled = with_settled.saturating_sub(before) as f64 * 1024.0 / idle;
    let idle_cpu_ms_per_s =
        ((cpu_idle_end.0 + cpu_idle_end.1) - (cpu_idle_start.0 + cpu_idle_start.1)) * 1000.0
            / SETTLED.as_secs_f64();
    let text = format!(
        "idle connections over {}: {n} opened, the gateway counted {idle} more (active {open_before} -> {open_with}, {open_after} after they closed)\n\
         at rest after 2 s: {at_rest}\n\
         gateway VmRSS before {:.1} MiB, with them {:.1} MiB: {per_conn:.0} bytes per idle connection after 2 s\n\
         {}s later ({open_settled} open) {:.1} MiB: {per_conn_settled:.0} bytes per idle connection (target ≤ 8192 -> {})\n\
         gateway CPU while they were idle: {idle_cpu_ms_per_s:.2} ms per second\n\
         gateway fds before {fds_before}, with them {fds_with}; VmRSS after they closed {:.1} MiB\n",
        over.describe(),
        mib(before),
        mib(with),
        SETTLED.as_secs(),
        mib(with_settled),
        if per_conn_settled <= 8192.0 {
            "met"
        } else {
            "MISSED"
        },
        mib(after),
    );
    let json = json!({
        "requested": n,
        "over": over.describe(),
        "counted": idle,
        "rss_mib": {"before": mib(before), "with": mib(with), "after_close": mib(after)},
        "at_rest": at_rest,
        "bytes_per_idle_connection_after_2s": per_conn,
        "bytes_per_idle_connection": per_conn_settled,
        "rss_mib_settled": mib(with_settled),
        "idle_cpu_ms_per_s": idle_cpu_ms_per_s,
        "fds": {"before": fds_before, "with": fds_with},
    });
    Ok((text, json))
}
