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
//!
//! **Rest.** An HTTP/1 connection quiet for `idle_release_after` is taken back from hyper,
//! which keeps two 8 KiB buffers and its state for as long as a connection stays open: the
//! connection then waits for its next bytes with nothing but its socket, and a new hyper
//! connection serves it when they come (with the bytes already read, and what is left of the
//! header deadline that started when it went quiet). A client sees the same connection and
//! the same limits. HTTP/1.0 and `Connection: close` requests are never rested: hyper closes
//! those connections to end their responses.
//!
//! **The watch's clock.** The deadlines above are checked by one timer per connection. While
//! a request is in flight it ticks twice a second; a quiet connection's is set to its next
//! deadline instead, so an idle connection, rested or not, is woken only by its client or by
//! that deadline.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use futures_util::FutureExt;
use http::{Request, Response, Version, header};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus::IntGauge;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Interval;
use tokio_util::sync::CancellationToken;

use super::respond::{self, Body};
use crate::metrics::{Held, Limit, LimitHits};

/// The time limits and stream cap of one connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnPolicy {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub http2_max_concurrent_streams: u32,
    /// How long an HTTP/1 connection stays quiet before it is rested; `None`: never.
    pub release_idle_after: Option<Duration>,
}

/// Where a connection's limits and rests are counted (the MCP and admin listeners name their
/// limits apart).
#[derive(Clone)]
pub struct LimitCounter {
    pub hits: LimitHits,
    /// No request started within `header_read_timeout`, or (HTTP/1) a request's headers did
    /// not arrive in time.
    pub header_timeout: Limit,
    /// No request in flight for `idle_timeout`.
    pub idle: Limit,
    /// Connections at rest now, if this listener shows them.
    pub at_rest: Option<IntGauge>,
}

impl LimitCounter {
    fn hit(&self, limit: Limit) {
        self.hits.hit(limit);
    }
}

/// Requests in flight on one connection, whether any ever came, when it last went quiet, and
/// whether it may be rested.
struct Activity {
    started: Instant,
    seen: AtomicBool,
    inflight: AtomicUsize,
    quiet_since_ms: AtomicU64,
    /// Cleared by a request after which hyper closes the connection to end the response
    /// (HTTP/1.0, `Connection: close`): taking it back would leave the client waiting.
    may_rest: AtomicBool,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            started: Instant::now(),
            seen: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
            quiet_since_ms: AtomicU64::new(0),
            may_rest: AtomicBool::new(true),
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

    /// How long until the first request is late by `limit`; `None` once one came.
    fn first_request_left(&self, limit: Duration) -> Option<Duration> {
        (!self.seen.load(Ordering::Acquire)).then(|| limit.saturating_sub(self.started.elapsed()))
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

/// Whether hyper ends the connection after answering `req` (so it must not be rested).
fn closes_after<B>(req: &Request<B>) -> bool {
    req.version() < Version::HTTP_11
        || req.headers().get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
        })
}

/// Whether a connection error is hyper's HTTP/1 header timeout.
fn is_header_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<hyper::Error>()
        .is_some_and(hyper::Error::is_timeout)
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How much a resting connection reads when its next request starts; hyper reads the rest.
const WAKE_READ: usize = 512;

/// Reads at most `max` bytes (no more than [`WAKE_READ`]); empty at the end of the stream.
/// The buffer lives on the stack of each poll, not in the future: a connection waiting here
/// (at rest, or before its first bytes) holds no buffer.
fn read_some<I: AsyncRead + Unpin>(
    io: &mut I,
    max: usize,
) -> impl Future<Output = std::io::Result<Bytes>> + '_ {
    std::future::poll_fn(move |cx| {
        let mut buf = [0u8; WAKE_READ];
        let mut filled = ReadBuf::new(&mut buf[..max.min(WAKE_READ)]);
        std::task::ready!(Pin::new(&mut *io).poll_read(cx, &mut filled))?;
        Poll::Ready(Ok(Bytes::copy_from_slice(filled.filled())))
    })
}

/// A connection with the bytes already read from it, which are read again first.
struct Prefixed<I> {
    prefix: Bytes,
    io: I,
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.prefix.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.prefix.len().min(buf.remaining());
        buf.put_slice(&self.prefix[..n]);
        self.prefix.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The bytes of a connection that hyper gave back unparsed: `read` (in its read buffer) then
/// `given` (handed to it but not read), nothing held when both are empty. Both are dropped
/// here, so a connection at rest keeps neither allocation.
fn unread(read: Bytes, given: Bytes) -> Bytes {
    match (read.is_empty(), given.is_empty()) {
        (true, true) => Bytes::new(),
        (true, false) => given,
        (false, true) => read,
        (false, false) => [read, given].concat().into(),
    }
}

/// The value out of its box, the box's allocation freed on return.
#[expect(
    clippy::boxed_local,
    reason = "taking the box is the point: it is freed here"
)]
fn unbox<T>(boxed: Box<T>) -> T {
    *boxed
}

type Reply = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

/// A request's future as hyper holds it, the connection's busy mark riding on its response.
///
/// Boxed: hyper keeps the service's future inside the connection's own state, so an unboxed
/// request future would make every connection as large as the largest request path, for as
/// long as the connection stays open. Mapped, not wrapped in an `async` block: the block
/// would hold the request's future twice (captured, and again while awaited), which doubled
/// the largest allocation every request makes (9,520 bytes against 4,752).
fn reply<F>(response: F, busy: Busy) -> Reply
where
    F: Future<Output = Response<Body>> + Send + 'static,
{
    Box::pin(response.map(move |response| Ok(respond::with_guard(response, busy))))
}

/// One connection's watchers: its limits, its stop token, and the clock that checks them.
struct Watch<'a> {
    policy: ConnPolicy,
    counter: &'a LimitCounter,
    stop: &'a CancellationToken,
    activity: Arc<Activity>,
    tick: Interval,
}

/// The protocol a connection speaks, told by its first bytes.
enum Protocol {
    Http1,
    Http2,
}

impl Watch<'_> {
    /// What ends a wait for the next request, and after how much quiet: the header deadline
    /// (which, as in hyper, starts when the connection goes quiet) or `idle_timeout`,
    /// whichever is shorter.
    fn quiet_limit(&self) -> (Duration, Limit) {
        let p = &self.policy;
        if p.header_read_timeout <= p.idle_timeout {
            (p.header_read_timeout, self.counter.header_timeout)
        } else {
            (p.idle_timeout, self.counter.idle)
        }
    }

    /// Sets the watch's clock to the next moment a check can find something due, once the
    /// connection is quiet: its first request's deadline (until one came), `idle_timeout`, or
    /// `rest_after` (HTTP/1, when it may rest). A quiet connection is then woken once, at that
    /// moment, instead of at every tick. A request that comes and goes meanwhile only moves
    /// these later (its end starts the quiet again), so the clock fires early, never late, and
    /// the check sets it again. While a request is in flight the clock keeps its period.
    fn next_check(&mut self, rest_after: Option<Duration>) {
        let Some(quiet) = self.activity.idle_for() else {
            return;
        };
        let p = &self.policy;
        let mut due = p.idle_timeout.saturating_sub(quiet);
        if let Some(after) = rest_after {
            due = due.min(after.saturating_sub(quiet));
        }
        if let Some(left) = self.activity.first_request_left(p.header_read_timeout) {
            due = due.min(left);
        }
        self.tick.reset_after(due.max(Duration::from_millis(1)));
    }

    /// Waits for bytes on `io`, reading at most `max`. `None` when the connection ends
    /// instead: the client left, a limit closed it (counted here), or shutdown or the request
    /// path closed it (gracefully, as `idle_timeout` does).
    async fn next_bytes<I>(&mut self, mut io: I, max: usize) -> Option<Prefixed<I>>
    where
        I: AsyncRead + AsyncWrite + Unpin,
    {
        // Nothing is in flight while a connection waits here (before its first request, or at
        // rest), so its quiet time only grows and the deadline is known now: the watch's clock
        // is set to it, instead of ticking twice a second to check (which woke every waiting
        // connection for nothing).
        let (after, limit) = self.quiet_limit();
        let quiet = self.activity.idle_for().unwrap_or_default();
        self.tick.reset_after(after.saturating_sub(quiet));
        tokio::select! {
            read = read_some(&mut io, max) => {
                // Back to ticking; a tick that came with the bytes is not a reason to rest
                // the connection before hyper has read them.
                self.tick.reset();
                return match read {
                    Ok(prefix) if !prefix.is_empty() => Some(Prefixed { prefix, io }),
                    Ok(_) | Err(_) => None,
                };
            }
            _ = self.stop.cancelled() => {}
            _ = self.tick.tick() => {
                self.counter.hit(limit);
                if limit != self.counter.idle {
                    return None;
                }
            }
        }
        let _ = io.shutdown().await;
        None
    }

    /// Reads the first bytes and tells HTTP/2 (its preface) from HTTP/1.
    async fn protocol<I>(&mut self, mut io: I) -> Option<(Protocol, Prefixed<I>)>
    where
        I: AsyncRead + AsyncWrite + Unpin,
    {
        let mut seen = Vec::with_capacity(H2_PREFACE.len());
        loop {
            let more = H2_PREFACE.len() - seen.len();
            let got = self.next_bytes(io, more).await?;
            seen.extend_from_slice(&got.prefix);
            io = got.io;
            let protocol = if H2_PREFACE[..seen.len()] != seen[..] {
                Protocol::Http1
            } else if seen.len() == H2_PREFACE.len() {
                Protocol::Http2
            } else {
                continue;
            };
            let prefix = seen.into();
            return Some((protocol, Prefixed { prefix, io }));
        }
    }

    /// Serves HTTP/2 until the client leaves, a limit closes it, or shutdown.
    async fn serve_h2<I, S>(&mut self, io: Prefixed<I>, svc: S)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: hyper::service::HttpService<Incoming, ResBody = Body> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.policy.http2_max_concurrent_streams);
        let mut conn = Box::pin(builder.serve_connection(TokioIo::new(io), svc));
        let mut closing = false;
        loop {
            tokio::select! {
                res = conn.as_mut() => {
                    if let Err(e) = res {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    return;
                }
                _ = self.stop.cancelled(), if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
                _ = self.tick.tick(), if !closing => {
                    if self.activity.first_request_late(self.policy.header_read_timeout) {
                        self.counter.hit(self.counter.header_timeout);
                        return;
                    }
                    if self.activity.idle_for().is_some_and(|d| d >= self.policy.idle_timeout) {
                        closing = true;
                        self.counter.hit(self.counter.idle);
                        conn.as_mut().graceful_shutdown();
                    } else {
                        self.next_check(None);
                    }
                }
            }
        }
    }

    /// Serves HTTP/1, resting the connection whenever it stays quiet long enough.
    async fn serve_h1<I, S>(&mut self, mut io: Prefixed<I>, mut svc: S)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: hyper::service::HttpService<Incoming, ResBody = Body> + Unpin + Send + 'static,
        S::Future: Unpin + Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut header_timeout = self.policy.header_read_timeout;
        loop {
            // Boxed: a resting connection's task then holds no hyper state at all. The
            // builder is scoped to the box's making, so the future keeps no room for it.
            let mut conn = Box::new({
                let mut builder = http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_timeout);
                builder.serve_connection(TokioIo::new(io), svc)
            });
            let mut closing = false;
            let mut resting = false;
            let res = loop {
                tokio::select! {
                    res = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => break res,
                    _ = self.stop.cancelled(), if !closing => {
                        closing = true;
                        Pin::new(&mut *conn).graceful_shutdown();
                    }
                    _ = self.tick.tick(), if !closing && !resting => {
                        if self.activity.first_request_late(self.policy.header_read_timeout) {
                            self.counter.hit(self.counter.header_timeout);
                            return;
                        }
                        let quiet = self.activity.idle_for();
                        if quiet.is_some_and(|d| d >= self.policy.idle_timeout) {
                            closing = true;
                            self.counter.hit(self.counter.idle);
                            Pin::new(&mut *conn).graceful_shutdown();
                        } else if quiet.zip(self.policy.release_idle_after).is_some_and(|(d, after)| d >= after)
                            && self.activity.may_rest.load(Ordering::Acquire)
                        {
                            // hyper closes an idle connection at once, and one that is still
                            // flushing once it is done; without shutting the socket down.
                            resting = true;
                            Pin::new(&mut *conn).graceful_shutdown();
                        } else {
                            let may_rest = self.activity.may_rest.load(Ordering::Acquire);
                            self.next_check(self.policy.release_idle_after.filter(|_| may_rest));
                        }
                    }
                }
            };
            if let Err(e) = res {
                if is_header_timeout(&e) {
                    self.counter.hit(self.counter.header_timeout);
                } else {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            // Taken out of its box here, not by moving out of `*conn`: a box moved out of
            // keeps its allocation until the end of the loop's turn, across the rest.
            let parts = unbox(conn).into_parts();
            let mut rested = parts.io.into_inner();
            if closing || !resting || !self.activity.may_rest.load(Ordering::Acquire) {
                // Ended by the client, by hyper (the response needed it), or gracefully:
                // shut the socket down as hyper would have.
                let _ = rested.shutdown().await;
                return;
            }
            svc = parts.service;
            // What hyper read but did not parse comes first, then what it had not yet read
            // of the bytes it was given: a connection woken by its next request can be asked
            // to rest again before hyper has read them all (a tick ready at the wake), and
            // those bytes are the request's. An empty read buffer still holds hyper's whole
            // allocation: let it go.
            rested.prefix = unread(parts.read_buf, std::mem::take(&mut rested.prefix));
            if rested.prefix.is_empty() {
                let _rest = self.counter.at_rest.as_ref().map(|g| Held::new(g.clone()));
                let Some(woken) = self.next_bytes(rested.io, WAKE_READ).await else {
                    return;
                };
                rested = woken;
            }
            // hyper's header deadline starts when the connection goes quiet; the new
            // connection gets what is left of it.
            let quiet = self.activity.idle_for().unwrap_or_default();
            header_timeout = self
                .policy
                .header_read_timeout
                .saturating_sub(quiet)
                .max(Duration::from_millis(1));
            io = rested;
        }
    }
}

/// Serves `io` with `handle` until the client leaves, a limit closes it, or `stop` is
/// cancelled (graceful: the current responses are finished first).
///
/// `stop` is the connection's own token: a child of the gateway's shutdown token, which the
/// request path may also cancel to close this connection alone. One token of its own, and not
/// the shutdown token itself: the connection's task checks it each time it runs, and a token
/// every connection shares is a lock every wake of every connection would take.
pub async fn serve<I, H, F>(
    io: I,
    policy: ConnPolicy,
    counter: &LimitCounter,
    stop: CancellationToken,
    handle: H,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + Unpin + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let activity = Activity::new();
    let svc_activity = activity.clone();
    let svc = service_fn(move |req: Request<Incoming>| -> Reply {
        let busy = Busy::new(&svc_activity);
        if closes_after(&req) {
            svc_activity.may_rest.store(false, Ordering::Release);
        }
        reply(handle(req), busy)
    });
    // The watch's period while a request is in flight. A quiet connection's clock is set to
    // its next deadline instead; one that falls due before the first tick after a request
    // ended (a rest shorter than this) fires at that tick, at most half a second late.
    let tick_every = Duration::from_millis(500)
        .min(policy.idle_timeout)
        .min(policy.header_read_timeout);
    let mut watch = Watch {
        policy,
        counter,
        stop: &stop,
        activity,
        tick: tokio::time::interval(tick_every),
    };
    match watch.protocol(io).await {
        Some((Protocol::Http2, io)) => watch.serve_h2(io, svc).await,
        Some((Protocol::Http1, io)) => watch.serve_h1(io, svc).await,
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::AsyncReadExt;

    #[test]
    fn a_request_is_boxed_once_at_its_own_size() {
        // The box hyper keeps per request holds the request's future and the busy mark, and
        // nothing twice. As an `async move` block awaiting the future, it held the future
        // both as captured and as awaited: 9,520 bytes for a 4,752-byte request future.
        let state = [7u8; 4096];
        let request = async move {
            tokio::task::yield_now().await;
            std::hint::black_box(&state);
            Response::new(Body::default())
        };
        let inner = std::mem::size_of_val(&request);
        let boxed = reply(request, Busy::new(&Activity::new()));
        let size = std::mem::size_of_val(&*boxed);
        assert!(
            inner >= 4096,
            "the test's future should hold its state: {inner}"
        );
        assert!(
            size <= inner + 64,
            "a request's box is {size} bytes for a {inner}-byte request future"
        );
    }

    /// A counter that counts limits nowhere (and rests in `at_rest`, when given).
    fn uncounted(at_rest: Option<IntGauge>) -> LimitCounter {
        LimitCounter {
            hits: LimitHits::none(),
            header_timeout: Limit::HeaderReadTimeout,
            idle: Limit::IdleTimeout,
            at_rest,
        }
    }

    /// Answers `got N` for a request body of N bytes.
    async fn count_body(req: Request<Incoming>) -> Response<Body> {
        let n = req
            .into_body()
            .collect()
            .await
            .map_or(0, |b| b.to_bytes().len());
        Response::new(respond::full(format!("got {n}")))
    }

    /// The connection's watch ticks every 500 ms from when it was served (`t0`): sends
    /// `cycles` requests of 700 bytes on `io`, each at a tick after the one that rested the
    /// connection, and checks every answer.
    async fn send_at_ticks(mut io: tokio::io::DuplexStream, t0: tokio::time::Instant, cycles: u32) {
        let tick = Duration::from_millis(500);
        let body = "x".repeat(700);
        let req = format!(
            "POST /mcp HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut k = 1;
        for i in 0..cycles {
            // A tick at least 50 ms after the last answer has rested the connection (5 ms of
            // quiet); the request goes out at the tick after that one.
            let now = tokio::time::Instant::now();
            while t0 + tick * k < now + Duration::from_millis(50) {
                k += 1;
            }
            k += 1;
            tokio::time::sleep_until(t0 + tick * k).await;
            io.write_all(req.as_bytes()).await.unwrap();
            let mut got = Vec::new();
            let mut chunk = [0u8; 1024];
            let answered = tokio::time::timeout(Duration::from_secs(5), async {
                while !got.ends_with(b"got 700") {
                    let n = io.read(&mut chunk).await.unwrap();
                    assert!(
                        n > 0,
                        "request {i}: closed: {}",
                        String::from_utf8_lossy(&got)
                    );
                    got.extend_from_slice(&chunk[..n]);
                    assert!(
                        got.starts_with(b"HTTP/1.1 200") || got.len() < 12,
                        "request {i}: {}",
                        String::from_utf8_lossy(&got)
                    );
                }
            })
            .await;
            assert!(answered.is_ok(), "request {i}: no answer");
        }
    }

    #[test]
    fn unread_bytes_keep_their_order_and_nothing_is_held_for_none() {
        let read = Bytes::from_static(b"POST /mcp HT");
        let given = Bytes::from_static(b"TP/1.1\r\n");
        assert_eq!(
            unread(read.clone(), given.clone()),
            "POST /mcp HTTP/1.1\r\n"
        );
        assert_eq!(unread(read.clone(), Bytes::new()), read);
        assert_eq!(unread(Bytes::new(), given.clone()), given);
        // An empty slice of a large buffer keeps the buffer alive; what comes back for two
        // empty ones owns nothing.
        let mut big = Bytes::from(vec![0u8; 8192]);
        big.advance(8192);
        let kept = unread(big.clone(), big);
        assert!(kept.is_empty());
        assert_eq!(kept.as_ptr(), Bytes::new().as_ptr(), "a fresh empty value");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_that_wakes_a_resting_connection_is_read_whole_even_when_asked_to_rest_again()
    {
        // A tick ready when a resting connection's next request arrived asked the new hyper
        // connection to rest before it had read the bytes it was given, and they were
        // dropped: hyper then parsed the middle of the body as a request (400, "invalid HTTP
        // method"). Here every request arrives on a tick.
        let policy = ConnPolicy {
            header_read_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
            http2_max_concurrent_streams: 8,
            release_idle_after: Some(Duration::from_millis(5)),
        };
        let counter = uncounted(None);
        let mut clients = Vec::new();
        for _ in 0..64 {
            let (client, server) = tokio::io::duplex(64 * 1024);
            let counter = counter.clone();
            let t0 = tokio::time::Instant::now();
            tokio::spawn(async move {
                serve(
                    server,
                    policy,
                    &counter,
                    CancellationToken::new(),
                    count_body,
                )
                .await;
            });
            clients.push(tokio::spawn(send_at_ticks(client, t0, 4)));
        }
        for c in clients {
            c.await.unwrap();
        }
    }

    /// A stream that counts the reads asked of it.
    struct CountingIo {
        inner: tokio::io::DuplexStream,
        reads: Arc<AtomicUsize>,
    }

    impl AsyncRead for CountingIo {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for CountingIo {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            Pin::new(&mut self.inner).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// Sends one keep-alive `GET` and reads its answer (`count_body`'s `got 0`) whole.
    async fn get_answered(client: &mut tokio::io::DuplexStream) {
        client
            .write_all(b"GET /mcp HTTP/1.1\r\nhost: test\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 256];
        while !got.ends_with(b"got 0") {
            let n = client.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&chunk[..n]);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resting_connection_wakes_for_its_client_and_its_deadline_only() {
        // A resting connection used to be polled at every tick of its watch (twice a second)
        // to check its deadlines: 1,000 idle connections cost the gateway 9 ms of CPU per
        // second. It now sleeps until its deadline, which still closes it.
        let policy = ConnPolicy {
            header_read_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(60),
            http2_max_concurrent_streams: 8,
            release_idle_after: Some(Duration::from_millis(5)),
        };
        let at_rest = IntGauge::new("at_rest", "connections at rest").unwrap();
        let counter = uncounted(Some(at_rest.clone()));
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let reads = Arc::new(AtomicUsize::new(0));
        let io = CountingIo {
            inner: server,
            reads: reads.clone(),
        };
        tokio::spawn(async move {
            serve(io, policy, &counter, CancellationToken::new(), count_body).await;
        });
        get_answered(&mut client).await;
        let answered = Instant::now();
        let mut chunk = [0u8; 256];
        let deadline = answered + Duration::from_secs(5);
        while at_rest.get() != 1 {
            assert!(Instant::now() < deadline, "the connection did not rest");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let before = reads.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1600)).await;
        let woken = reads.load(Ordering::SeqCst) - before;
        assert!(
            woken <= 1,
            "a resting connection was read {woken} times in 1.6 s with nothing sent"
        );

        // Its header deadline (3 s of quiet) still closes it, and not before.
        let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut chunk))
            .await
            .expect("still open 5 s after the header deadline")
            .unwrap();
        assert_eq!(n, 0, "closed without a byte");
        // The quiet began before the client had the answer, and the check before the sleep
        // ended at most 2.2 s after it: 2.5 s tells the deadline from an early close.
        let closed_after = answered.elapsed();
        assert!(
            closed_after >= Duration::from_millis(2500),
            "closed {closed_after:?} after its last answer, before its 3 s deadline"
        );
        // The rest's count goes once the connection's task has let go of it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while at_rest.get() != 0 {
            assert!(
                Instant::now() < deadline,
                "still counted at rest after closing"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Serves `io` in a task and counts the polls of the connection's future: each is a wake.
    fn serve_counting_polls(io: tokio::io::DuplexStream, policy: ConnPolicy) -> Arc<AtomicUsize> {
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = polls.clone();
        tokio::spawn(async move {
            let counter = uncounted(None);
            let fut = serve(io, policy, &counter, CancellationToken::new(), count_body);
            let mut fut = std::pin::pin!(fut);
            std::future::poll_fn(|cx| {
                counted.fetch_add(1, Ordering::SeqCst);
                fut.as_mut().poll(cx)
            })
            .await;
        });
        polls
    }

    /// How often the connection's task was woken in 1.6 s, starting 0.7 s from now (the
    /// watch's first tick after the last answer has run by then).
    async fn wakes_while_quiet(polls: &AtomicUsize) -> usize {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let before = polls.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1600)).await;
        polls.load(Ordering::SeqCst) - before
    }

    const QUIET_FOR_LONG: ConnPolicy = ConnPolicy {
        header_read_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        http2_max_concurrent_streams: 8,
        release_idle_after: None,
    };

    // The watch ticked twice a second for every open connection, quiet or not, to check its
    // deadlines; a quiet one now sleeps until the first of them. HTTP/1 without rests
    // (`idle_release_after = "0s"`) and HTTP/2 (never rested) both wait in hyper.

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quiet_http1_connection_that_does_not_rest_is_not_woken_by_its_watch() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let polls = serve_counting_polls(server, QUIET_FOR_LONG);
        get_answered(&mut client).await;
        let woken = wakes_while_quiet(&polls).await;
        assert!(
            woken <= 1,
            "a quiet HTTP/1 connection was woken {woken} times in 1.6 s"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quiet_http2_connection_is_not_woken_by_its_watch() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let polls = serve_counting_polls(server, QUIET_FOR_LONG);
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(client))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = Request::get("http://test/mcp")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let answer = sender.send_request(req).await.unwrap();
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "got 0");
        let woken = wakes_while_quiet(&polls).await;
        assert!(
            woken <= 1,
            "a quiet HTTP/2 connection was woken {woken} times in 1.6 s"
        );
    }
}
