//! The TCP (optionally TLS) listener: accepts connections, serves HTTP/1.1 and HTTP/2,
//! enforces the connection-level limits, and drains on shutdown.
//!
//! Per connection: the TLS handshake (when configured) is bounded by
//! `listen.header_read_timeout`; HTTP/1 request headers must arrive within that timeout too;
//! a connection with no request in flight for `listen.idle_timeout` is closed gracefully.
//! Shutdown stops accepting, asks every connection to finish its in-flight requests, and waits
//! up to the drain deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::handler::handle;
use super::respond;
use super::tls::TlsReloader;
use crate::gateway::Gateway;

/// What the request path knows about the connection a request came on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    /// DER of the verified client certificate (front TLS with client auth only).
    pub client_cert_der: Option<Arc<Vec<u8>>>,
}

/// Requests in flight on one connection, and when it last went quiet.
struct Activity {
    started: Instant,
    inflight: AtomicUsize,
    quiet_since_ms: AtomicU64,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            started: Instant::now(),
            inflight: AtomicUsize::new(0),
            quiet_since_ms: AtomicU64::new(0),
        })
    }

    fn idle_for(&self) -> Option<Duration> {
        if self.inflight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = Duration::from_millis(self.quiet_since_ms.load(Ordering::Acquire));
        Some(self.started.elapsed().saturating_sub(since))
    }
}

/// Held by a response body; marks the connection busy until the body is done.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(a: &Arc<Activity>) -> Busy {
        a.inflight.fetch_add(1, Ordering::AcqRel);
        Busy(a.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let now = self.0.started.elapsed().as_millis() as u64;
        self.0.quiet_since_ms.store(now, Ordering::Release);
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

struct ConnGauge(prometheus::IntGauge);

impl Drop for ConnGauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}

async fn serve_connection<I>(
    gw: Arc<Gateway>,
    io: I,
    info: Arc<ConnInfo>,
    shutdown: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let cfg = gw.config();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.listen.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let activity = Activity::new();
    let svc_activity = activity.clone();
    let svc_gw = gw.clone();
    let svc = service_fn(move |req| {
        let gw = svc_gw.clone();
        let info = info.clone();
        let busy = Busy::new(&svc_activity);
        async move {
            let resp = handle(gw, req, &info).await;
            Ok::<_, std::convert::Infallible>(respond::with_guard(resp, busy))
        }
    });
    let conn = builder.serve_connection(TokioIo::new(io), svc).into_owned();
    let mut conn = std::pin::pin!(conn);
    let idle_limit = cfg.listen.idle_timeout;
    let mut tick = tokio::time::interval(Duration::from_millis(500).min(idle_limit));
    let mut shutting_down = false;
    loop {
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = shutdown.cancelled(), if !shutting_down => {
                shutting_down = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tick.tick(), if !shutting_down => {
                if activity.idle_for().is_some_and(|d| d >= idle_limit) {
                    shutting_down = true;
                    gw.metrics.limit_hits.with_label_values(&["idle_timeout"]).inc();
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Serves `listener` until `shutdown` fires, then waits up to `drain` for open connections.
pub async fn serve(
    gw: Arc<Gateway>,
    listener: TcpListener,
    tls: Option<Arc<TlsReloader>>,
    shutdown: CancellationToken,
    drain: Duration,
) {
    let tracker = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let gw = gw.clone();
        let tls = tls.clone();
        let shutdown = shutdown.clone();
        gw.metrics.active_connections.inc();
        let gauge = ConnGauge(gw.metrics.active_connections.clone());
        tracker.spawn(async move {
            let _gauge = gauge;
            match tls {
                None => {
                    let info = Arc::new(ConnInfo {
                        peer,
                        client_cert_der: None,
                    });
                    serve_connection(gw, stream, info, shutdown).await;
                }
                Some(tls) => {
                    let limit = gw.config().listen.header_read_timeout;
                    let tls_stream =
                        match tokio::time::timeout(limit, tls.acceptor().accept(stream)).await {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, %peer, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                gw.metrics
                                    .limit_hits
                                    .with_label_values(&["tls_handshake_timeout"])
                                    .inc();
                                return;
                            }
                        };
                    let client_cert_der = tls_stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| Arc::new(c.as_ref().to_vec()));
                    let info = Arc::new(ConnInfo {
                        peer,
                        client_cert_der,
                    });
                    serve_connection(gw, tls_stream, info, shutdown).await;
                }
            }
        });
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(drain, tracker.wait()).await.is_err() {
        tracing::warn!(?drain, "connections still open after the drain deadline");
    }
}

/// A running gateway listener (used by the demo and tests).
pub struct Running {
    pub addr: SocketAddr,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

impl Running {
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// Binds `addr` and serves in the background (plain HTTP, or TLS per the configuration).
pub async fn start(gw: Arc<Gateway>, addr: SocketAddr) -> std::io::Result<Running> {
    let tls = match &gw.config().tls {
        Some(files) => Some(Arc::new(
            TlsReloader::load(files).map_err(std::io::Error::other)?,
        )),
        None => None,
    };
    start_with_tls(gw, addr, tls).await
}

pub async fn start_with_tls(
    gw: Arc<Gateway>,
    addr: SocketAddr,
    tls: Option<Arc<TlsReloader>>,
) -> std::io::Result<Running> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve(
        gw,
        listener,
        tls,
        shutdown.clone(),
        Duration::from_secs(10),
    ));
    Ok(Running {
        addr,
        shutdown,
        task,
    })
}
