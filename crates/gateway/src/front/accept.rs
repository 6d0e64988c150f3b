//! Accepting connections: caps applied at accept, and accept errors that back off.
//!
//! Both listeners (MCP and admin) accept through [`Acceptor`]. A connection over a cap
//! ([`super::conn_limits`]) is closed at once and counted in
//! `limit_hits_total{limit=<the cap's name>}`. An accept error that concerns one connection
//! (aborted or reset before it was accepted) is skipped. Any other error, above all running
//! out of descriptors (`EMFILE`, `ENFILE`) or memory, would repeat at once if retried: the
//! acceptor sleeps first, 5 ms doubling to 1 s while the errors last, so a listener that
//! cannot accept waits for descriptors to come back instead of spinning a core; the kernel
//! keeps new connections in the listen backlog meanwhile. Errors are counted in
//! `accept_errors_total{listener}` and logged once per streak.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use super::conn_limits::{Caps, ConnLimits, ConnPermit, Refusal};
use crate::metrics::{FrontMetrics, Limit, LimitHits};

/// Metric labels of one listener's caps.
#[derive(Debug, Clone, Copy)]
pub struct CapLabels {
    pub total: Limit,
    pub per_source: Limit,
}

/// A connection the caps admitted.
pub struct Accepted {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    /// Holds the connection's place until dropped.
    pub permit: ConnPermit,
}

/// The delay before the next accept after `streak` errors in a row that were not about one
/// connection: 5 ms, doubling, at most 1 s.
pub fn backoff_after(streak: u32) -> Duration {
    let ms = 5u64.saturating_mul(1u64 << streak.saturating_sub(1).min(10));
    Duration::from_millis(ms.min(1000))
}

/// Whether an accept error concerns only the connection being accepted.
fn per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

pub struct Acceptor {
    listener: TcpListener,
    limits: Arc<ConnLimits>,
    name: &'static str,
    labels: CapLabels,
    errors: prometheus::IntCounter,
    hits: LimitHits,
    streak: u32,
}

impl Acceptor {
    /// `name` labels the listener in logs and in `accept_errors_total`.
    pub fn new(
        listener: TcpListener,
        name: &'static str,
        labels: CapLabels,
        metrics: &FrontMetrics,
        hits: LimitHits,
    ) -> Acceptor {
        Acceptor {
            listener,
            limits: ConnLimits::new(),
            name,
            labels,
            errors: metrics.accept_errors(name),
            hits,
            streak: 0,
        }
    }

    /// The next connection the caps admit (`caps` is asked at each accept). Cancel-safe.
    pub async fn next(&mut self, caps: impl Fn() -> Caps) -> Accepted {
        loop {
            if self.streak > 0 {
                tokio::time::sleep(backoff_after(self.streak)).await;
            }
            let (stream, peer) = match self.listener.accept().await {
                Ok(a) => {
                    if self.streak > 0 {
                        tracing::info!(
                            listener = self.name,
                            errors = self.streak,
                            "accepting again"
                        );
                        self.streak = 0;
                    }
                    a
                }
                Err(e) if per_connection(&e) => {
                    tracing::debug!(listener = self.name, error = %e, "a connection was lost before it was accepted");
                    continue;
                }
                Err(e) => {
                    self.errors.inc();
                    if self.streak == 0 {
                        tracing::warn!(listener = self.name, error = %e, "accept failed; backing off until it succeeds");
                    }
                    self.streak = self.streak.saturating_add(1);
                    continue;
                }
            };
            match self.limits.admit(peer.ip(), caps()) {
                Ok(permit) => {
                    return Accepted {
                        stream,
                        peer,
                        permit,
                    };
                }
                Err(refusal) => {
                    let limit = match refusal {
                        Refusal::Total => self.labels.total,
                        Refusal::PerSource => self.labels.per_source,
                    };
                    self.hits.hit(limit);
                    tracing::debug!(listener = self.name, %peer, limit = limit.label(), "connection refused at accept");
                    drop(stream);
                }
            }
        }
    }

    /// Connections this acceptor admitted that are still open.
    pub fn open(&self) -> usize {
        self.limits.open()
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_5ms_to_1s() {
        let ms = |n| backoff_after(n).as_millis();
        assert_eq!([ms(1), ms(2), ms(3), ms(8)], [5, 10, 20, 640]);
        assert_eq!(ms(9), 1000);
        assert_eq!(ms(u32::MAX), 1000);
    }

    #[test]
    fn only_errors_about_one_connection_are_retried_at_once() {
        assert!(per_connection(&io::Error::from(
            io::ErrorKind::ConnectionAborted
        )));
        // EMFILE: retrying at once would spin.
        assert!(!per_connection(&io::Error::from_raw_os_error(24)));
        assert!(!per_connection(&io::Error::from_raw_os_error(23)));
    }
}
