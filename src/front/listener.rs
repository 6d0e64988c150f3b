//! The TCP listener: accepts connections, serves HTTP/1.1 and HTTP/2, drains on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::handler::handle;
use crate::gateway::Gateway;

/// Serves `listener` until `shutdown` fires, then waits up to `drain` for open connections.
pub async fn serve(
    gw: Arc<Gateway>,
    listener: TcpListener,
    shutdown: CancellationToken,
    drain: Duration,
) {
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
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
        let svc = service_fn(move |req| {
            let gw = gw.clone();
            async move { Ok::<_, std::convert::Infallible>(handle(gw, req, peer).await) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), svc);
        let watched = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            if let Err(e) = watched.await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(?drain, "connections still open after the drain deadline");
    }
}

/// A running gateway listener (used by `serve`, the demo and tests).
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

/// Binds `addr` and serves in the background.
pub async fn start(gw: Arc<Gateway>, addr: SocketAddr) -> std::io::Result<Running> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve(
        gw,
        listener,
        shutdown.clone(),
        Duration::from_secs(10),
    ));
    Ok(Running {
        addr,
        shutdown,
        task,
    })
}
