//! Serving one accepted connection (HTTP/1.1 or HTTP/2) under its time limits.
//!
//! Both listeners serve connections through [`serve`]. What bounds a connection:
//! - **its first request**: its headers must start arriving — and, over HTTP/1, be complete —
//!   within `header_read_timeout` of the accept. hyper's own HTTP/1 header timer only runs
//!   once the protocol is known, and `auto` learns the protocol by reading the first bytes
//!   without any deadline, so a connection that sends nothing would otherwise be held until
//!   the idle timeout; an HTTP/2 connection that opens no stream likewise.
//! - **HTTP/1 headers** of every request: hyper's header timer (`header_read_timeout`), which
//!   needs a timer on the builder (without one hyper ignores its default and panics on a
//!   configured value). hyper starts that clock as soon as the connection is ready for its
//!   next request, so a keep-alive connection waiting for one is closed by it too.
//! - **idleness**: a connection with no request in flight for `idle_timeout` is closed
//!   gracefully. A request whose body never comes is *in flight*, which is why neither timer
//!   ended stalled bodies: the request path bounds the body itself
//!   (`listen.body_read_timeout`) and then asks for the connection to be closed through
//!   [`ConnInfo::close`](super::listener::ConnInfo).
//! - **HTTP/2 streams**: at most `http2_max_concurrent_streams` at once per connection
//!   (advertised in SETTINGS; hyper refuses streams beyond it).
//! - **shutdown**: graceful (in-flight requests finish; HTTP/2 gets GOAWAY).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::respond::{self, Body};
use crate::metrics::{Limit, LimitHits};

/// The time limits and stream cap of one connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnPolicy {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub http2_max_concurrent_streams: u32,
}

/// Where a connection closed by a limit is counted, and under which limits (the MCP and admin
/// listeners name theirs apart).
#[derive(Clone)]
pub struct LimitCounter {
    pub hits: LimitHits,
    /// No request started within `header_read_timeout`, or (HTTP/1) a request's headers did
    /// not arrive in time.
    pub header_timeout: Limit,
    /// No request in flight for `idle_timeout`.
    pub idle: Limit,
}

impl LimitCounter {
    fn hit(&self, limit: Limit) {
        self.hits.hit(limit);
    }
}

/// Requests in flight on one connection, whether any ever came, and when it last went quiet.
struct Activity {
    started: Instant,
    seen: AtomicBool,
    inflight: AtomicUsize,
    quiet_since_ms: AtomicU64,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            started: Instant::now(),
            seen: AtomicBool::new(false),
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

    /// Whether the connection is still waiting for its first request after `limit`.
    fn first_request_late(&self, limit: Duration) -> bool {
        !self.seen.load(Ordering::Acquire) && self.started.elapsed() >= limit
    }
}

/// Held by a response body; marks the connection busy until the body is done.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(a: &Arc<Activity>) -> Busy {
        a.seen.store(true, Ordering::Release);
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

/// Whether a connection error is hyper's HTTP/1 header timeout.
fn is_header_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<hyper::Error>()
        .is_some_and(hyper::Error::is_timeout)
}

/// Serves `io` with `handle` until the client leaves, a limit closes it, `shutdown` fires
/// (graceful), or `close` is cancelled by the request path (graceful: the current responses
/// are finished first).
pub async fn serve<I, H, F>(
    io: I,
    policy: ConnPolicy,
    counter: &LimitCounter,
    shutdown: CancellationToken,
    close: CancellationToken,
    handle: H,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(policy.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(policy.http2_max_concurrent_streams);
    let activity = Activity::new();
    let svc_activity = activity.clone();
    let svc = service_fn(move |req| {
        let busy = Busy::new(&svc_activity);
        // Boxed: hyper keeps the service's future inside the connection's own state, so an
        // unboxed request future would make every connection as large as the largest request
        // path, for as long as the connection stays open (idle ones included).
        let response = Box::pin(handle(req));
        async move { Ok::<_, Infallible>(respond::with_guard(response.await, busy)) }
    });
    let conn = builder.serve_connection(TokioIo::new(io), svc).into_owned();
    let mut conn = std::pin::pin!(conn);
    // How late a first-request or idle deadline may fire: at most half a second.
    let tick_every = Duration::from_millis(500)
        .min(policy.idle_timeout)
        .min(policy.header_read_timeout);
    let mut tick = tokio::time::interval(tick_every);
    let mut closing = false;
    loop {
        tokio::select! {
            res = conn.as_mut() => {
                match res {
                    Ok(()) => {}
                    Err(e) if is_header_timeout(&*e) => counter.hit(counter.header_timeout),
                    Err(e) => tracing::debug!(error = %e, "connection ended with an error"),
                }
                return;
            }
            _ = shutdown.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = close.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tick.tick(), if !closing => {
                if activity.first_request_late(policy.header_read_timeout) {
                    counter.hit(counter.header_timeout);
                    return;
                }
                if activity.idle_for().is_some_and(|d| d >= policy.idle_timeout) {
                    closing = true;
                    counter.hit(counter.idle);
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}
