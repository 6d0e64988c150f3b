//! The TCP (optionally TLS) listener: accepts connections within the connection caps, serves
//! HTTP/1.1 and HTTP/2 under the connection limits, and drains on shutdown.
//!
//! Per connection: the caps (`listen.max_connections`, `listen.max_connections_per_source`)
//! are applied at accept ([`super::accept`]); the TLS handshake (when configured) is bounded
//! by `listen.header_read_timeout`; then [`super::connection`] bounds the first request, HTTP/1
//! headers, idleness and HTTP/2 streams. Shutdown stops accepting, asks every connection to
//! finish its in-flight requests, and waits up to the drain deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::accept::{Accepted, Acceptor, CapLabels};
use super::conn_limits::Caps;
use super::connection::{self, ConnPolicy, LimitCounter};
use super::deps::Front;
use super::handler::handle;
use super::tls::TlsReloader;
use crate::metrics::{Held, Limit};
use crate::tls::stream::ServerStream;

/// What the request path knows about the connection a request came on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    /// DER of the verified client certificate (front TLS with client auth only).
    pub client_cert_der: Option<Arc<Vec<u8>>>,
    /// Cancelled by the request path to close the connection once its current responses are
    /// sent (a request whose body did not arrive in time: the rest of it may still come, and
    /// would be read as the next request). A child of the gateway's shutdown token, so
    /// shutdown cancels it too: the connection watches this token alone.
    pub close: CancellationToken,
}

/// A front TLS connection's stream, as its connection's future holds it.
type TlsIo = Box<ServerStream>;

async fn serve_connection<I>(front: Arc<Front>, io: I, info: Arc<ConnInfo>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let cfg = front.config();
    let policy = ConnPolicy {
        header_read_timeout: cfg.listen.header_read_timeout,
        idle_timeout: cfg.listen.idle_timeout,
        http2_max_concurrent_streams: cfg.listen.http2_max_concurrent_streams,
        release_idle_after: cfg.listen.idle_release_after,
    };
    drop(cfg);
    let counter = LimitCounter {
        hits: front.limits.clone(),
        header_timeout: Limit::HeaderReadTimeout,
        idle: Limit::IdleTimeout,
        at_rest: Some(front.metrics.connections_at_rest()),
    };
    let close = info.close.clone();
    let svc_front = front.clone();
    let handler = move |req| handle(svc_front.clone(), req, info.clone());
    connection::serve(io, policy, &counter, close, handler).await;
}

/// One accepted connection, from its TLS handshake (when the listener has TLS) to its end.
/// Its task holds this future for as long as the connection is open, rests included.
async fn connection_task(
    front: Arc<Front>,
    accepted: Accepted,
    tls: Option<Arc<TlsReloader>>,
    shutdown: CancellationToken,
    opened: Held,
) {
    let _opened = opened;
    let Accepted {
        stream,
        peer,
        permit: _permit,
    } = accepted;
    match tls {
        None => {
            let info = Arc::new(ConnInfo {
                peer,
                client_cert_der: None,
                close: shutdown.child_token(),
            });
            serve_connection(front, stream, info).await;
        }
        Some(tls) => {
            // Boxed, so that its state (the TLS stream inline, over a kilobyte) goes once
            // the handshake is done instead of staying in the task for the connection's life.
            let Some((io, client_cert_der)) =
                Box::pin(tls_handshake(&front, &tls, stream, peer)).await
            else {
                return;
            };
            let info = Arc::new(ConnInfo {
                peer,
                client_cert_der,
                close: shutdown.child_token(),
            });
            serve_connection(front, io, info).await;
        }
    }
}

/// The TLS handshake of a connection, bounded by `listen.header_read_timeout`: the stream,
/// boxed, and the client's certificate when it sent one. `None` when it failed (counted when
/// it timed out).
async fn tls_handshake(
    front: &Front,
    tls: &TlsReloader,
    stream: TcpStream,
    peer: SocketAddr,
) -> Option<(TlsIo, Option<Arc<Vec<u8>>>)> {
    let limit = front.config().listen.header_read_timeout;
    let tls_stream =
        match tokio::time::timeout(limit, ServerStream::accept(stream, tls.config())).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, %peer, "TLS handshake failed");
                return None;
            }
            Err(_) => {
                front.limits.hit(Limit::TlsHandshakeTimeout);
                return None;
            }
        };
    let client_cert_der = tls_stream
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| Arc::new(c.as_ref().to_vec()));
    // The stream boxed: the connection's future holds its stream in several places (the
    // protocol sniff, HTTP/1 and its rests, HTTP/2), and a TLS stream is over a kilobyte.
    Some((Box::new(tls_stream), client_cert_der))
}

const CAP_LABELS: CapLabels = CapLabels {
    total: Limit::MaxConnections,
    per_source: Limit::MaxConnectionsPerSource,
};

/// Serves `listener` until `shutdown` fires, then waits up to `drain` for open connections.
pub async fn serve(
    front: Arc<Front>,
    listener: TcpListener,
    tls: Option<Arc<TlsReloader>>,
    shutdown: CancellationToken,
    drain: Duration,
) {
    let tracker = TaskTracker::new();
    let mut acceptor = Acceptor::new(
        listener,
        "mcp",
        CAP_LABELS,
        &front.metrics,
        front.limits.clone(),
    );
    let caps_front = front.clone();
    let caps = move || {
        let l = &caps_front.config().listen;
        Caps {
            total: l.max_connections,
            per_source: Some(l.max_connections_per_source),
            ipv6_prefix: l.ipv6_source_prefix,
        }
    };
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            a = acceptor.next(&caps) => a,
        };
        let _ = accepted.stream.set_nodelay(true);
        let opened = front.metrics.connection_opened();
        tracker.spawn(connection_task(
            front.clone(),
            accepted,
            tls.clone(),
            shutdown.clone(),
            opened,
        ));
    }
    drop(acceptor);
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
pub async fn start(front: Arc<Front>, addr: SocketAddr) -> std::io::Result<Running> {
    let tls = match &front.config().tls {
        Some(files) => Some(Arc::new(
            TlsReloader::load(files).map_err(std::io::Error::other)?,
        )),
        None => None,
    };
    start_with_tls(front, addr, tls).await
}

pub async fn start_with_tls(
    front: Arc<Front>,
    addr: SocketAddr,
    tls: Option<Arc<TlsReloader>>,
) -> std::io::Result<Running> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve(
        front,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::future_size;

    #[test]
    fn a_connection_task_is_no_larger_than_its_connection_future() {
        // The task holds this future from accept to close. With the TLS handshake awaited
        // inline it kept the handshake's state, and a moved-from copy of the TLS stream
        // beside the connection's future, for the connection's whole life: 3,888 bytes
        // against 2,440 for a plain connection's future (release build).
        let task = future_size::returned5(connection_task);
        let plain = future_size::returned3(serve_connection::<tokio::net::TcpStream>);
        assert!(
            task <= plain + 256,
            "a connection's task is {task} bytes, a plain connection's future {plain}"
        );
    }

    #[test]
    fn a_tls_connection_future_is_no_larger_than_a_plain_one() {
        // Each open connection's task holds this future for as long as the connection stays
        // open, at rest included. With the TLS stream inline it was 4.6 times a plain one's
        // (11,240 bytes against 2,440 in a release build): the stream sits in each of the
        // future's states.
        let plain = future_size::returned3(serve_connection::<tokio::net::TcpStream>);
        let tls = future_size::returned3(serve_connection::<TlsIo>);
        assert!(
            tls <= plain + 64,
            "a TLS connection's future is {tls} bytes, a plain one's {plain}"
        );
    }
}
