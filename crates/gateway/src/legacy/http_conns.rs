//! The HTTP/1 connections to the legacy server, each driven by whoever reads its response.
//!
//! A hyper client connection is a future that does the connection's I/O. hyper-util's pooled
//! client spawns it as a task of its own, so every upstream request crossed two tasks (the
//! caller's and the connection's) and every response frame came back through a channel, with
//! a wake-up between threads each way; and it spawned one more task per request to return the
//! connection to its pool. Here the connection future travels with the request instead:
//!
//! - sending polls the connection in the sender's task until the response head arrives;
//! - the response body ([`ConnBody`]) owns the connection and polls it before each frame, so
//!   the task that reads the body (the call's, the parking lot's, the GET stream's) does the
//!   connection's reads;
//! - a body read to its end, or dropped when it had nothing left, gives its connection back to
//!   the idle set, which the next request takes it from (most recently returned first);
//! - a body dropped before its end first takes, without waiting, what has already arrived; a
//!   response to a POST or DELETE (a stream that ends right after its last message, which a
//!   reader stops at) then gets [`FINISH_WITHIN`] (20 ms) in a task to end and give its connection
//!   back. Otherwise, a GET stream above all, the connection is closed: HTTP/1 cannot reuse
//!   it mid-response. Without that, a session closed right after its call (a full pool at
//!   1,024 distinct callers) closed its call's connection too, and every new session opened
//!   more: the listen queue overflowed and p99 went from 0.65 s to 1.2 s.
//!
//! The connections all go to one origin (scheme and authority: the configured server's); a
//! request for another is refused rather than sent on a connection to a different server
//! (the HTTP+SSE transport already refuses an `endpoint` on another origin).
//!
//! An idle connection is polled by nobody, so a close by the server shows only when the
//! connection is taken: [`Conns::take`] polls it once without waiting and passes over one that
//! ended. A request that found its connection closed before a byte of it was written goes
//! once more on a new connection; one that may have reached the server does not.
//! Idle connections are kept within [`IdleLimits`] (how long, how many). A
//! task looks over the idle ones every [`REAP_EVERY`] and closes those the server closed or
//! that waited too long, so a quiet gateway keeps no half-closed sockets; it ends with the
//! connections (when a reload replaces the upstream).
//!
//! Every connection is counted when it opens (by the method of the request that found no idle
//! one) and when it closes, by why ([`ConnClose`]): a close is counted where the connection is
//! dropped, whichever path drops it, so opened minus closed is always what is open.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tower_service::Service;

use crate::metrics::{ConnClose, ConnMetrics};

/// How long idle connections are kept, and how many (`upstream.connection_idle_timeout`,
/// `upstream.max_idle_connections`). The server's own keep-alive is often shorter; a
/// connection it closed is passed over when taken. One given back beyond `max` is closed
/// (the least recently given back goes first).
#[derive(Debug, Clone, Copy)]
pub struct IdleLimits {
    pub max: usize,
    pub for_at_most: Duration,
}

/// How often idle connections are looked over.
pub const REAP_EVERY: Duration = Duration::from_secs(2);

type Io = MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>;

/// One connection: the handle requests go through and the future that does its I/O.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    io: Connection<Io, Full<Bytes>>,
    /// Counted closed when dropped, for the reason last set.
    closing: Closing,
}

/// Counts its connection closed when dropped: every connection is dropped once, wherever.
struct Closing {
    metrics: ConnMetrics,
    why: ConnClose,
}

impl Drop for Closing {
    fn drop(&mut self) {
        self.metrics.closed(self.why);
    }
}

impl Conn {
    /// Why the connection cannot take a request now, if it cannot: polled once, without
    /// waiting, it has ended or is still busy with the last one.
    fn unusable(&mut self) -> Option<ConnClose> {
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut self.io).poll(&mut cx) {
            Poll::Ready(r) => Some(ended(r)),
            Poll::Pending if self.sender.is_closed() || !self.sender.is_ready() => {
                Some(ConnClose::ServerClosed)
            }
            Poll::Pending => None,
        }
    }

    /// Closes the connection (drops it), counted for `why`.
    fn close(mut self: Box<Self>, why: ConnClose) {
        self.closing.why = why;
    }
}

/// Why a connection whose future returned `r` ended.
fn ended(r: hyper::Result<()>) -> ConnClose {
    match r {
        Ok(()) => ConnClose::ServerClosed,
        Err(_) => ConnClose::Failed,
    }
}

struct IdleConn {
    conn: Box<Conn>,
    since: Instant,
}

impl IdleConn {
    /// Why this idle connection should be closed rather than kept or reused, if it should:
    /// idle too long, or (polled once) ended or busy.
    fn spent(&mut self, for_at_most: Duration) -> Option<ConnClose> {
        match self.since.elapsed() >= for_at_most {
            true => Some(ConnClose::IdleTimeout),
            false => self.conn.unusable(),
        }
    }
}

/// The connections to one legacy server, and how to open more.
pub struct Conns {
    connector: HttpsConnector<HttpConnector>,
    /// The scheme and authority every request goes to.
    origin: (Option<http::uri::Scheme>, Option<http::uri::Authority>),
    idle: Mutex<VecDeque<IdleConn>>,
    limits: IdleLimits,
    metrics: ConnMetrics,
}

/// Why a request did not get a response head.
#[derive(Debug)]
pub enum SendError {
    /// Opening a connection failed.
    Connect(Box<dyn std::error::Error + Send + Sync>),
    /// The exchange failed on an open connection.
    Http(hyper::Error),
}

impl Conns {
    /// Connections to the origin of `server`, idle ones kept within `limits`, counted in
    /// `metrics`.
    pub fn new(
        connector: HttpsConnector<HttpConnector>,
        server: &http::Uri,
        limits: IdleLimits,
        metrics: ConnMetrics,
    ) -> Arc<Conns> {
        Self::reaped_every(connector, server, limits, metrics, REAP_EVERY)
    }

    fn reaped_every(
        connector: HttpsConnector<HttpConnector>,
        server: &http::Uri,
        limits: IdleLimits,
        metrics: ConnMetrics,
        every: Duration,
    ) -> Arc<Conns> {
        let conns = Arc::new(Conns {
            connector,
            origin: (server.scheme().cloned(), server.authority().cloned()),
            idle: Mutex::new(VecDeque::new()),
            limits,
            metrics,
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&conns);
            rt.spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    match weak.upgrade() {
                        Some(conns) => conns.reap(),
                        None => return,
                    }
                }
            });
        }
        conns
    }

    /// Closes the idle connections the server closed or that waited too long.
    fn reap(&self) {
        let mut closed = Vec::new();
        {
            let mut idle = self.idle();
            let mut keep = VecDeque::with_capacity(idle.len());
            for mut c in idle.drain(..) {
                match c.spent(self.limits.for_at_most) {
                    None => keep.push_back(c),
                    Some(why) => {
                        c.conn.closing.why = why;
                        closed.push(c);
                    }
                }
            }
            *idle = keep;
        }
        // Closed outside the lock.
        drop(closed);
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, VecDeque<IdleConn>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Idle connections now.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle().len()
    }

    /// The most recently given back idle connection that is still open.
    fn take(&self) -> Option<Box<Conn>> {
        let mut idle = self.idle();
        while let Some(mut c) = idle.pop_back() {
            match c.spent(self.limits.for_at_most) {
                Some(why) => c.conn.close(why),
                None => {
                    c.conn.closing.why = ConnClose::Unfinished;
                    return Some(c.conn);
                }
            }
        }
        None
    }

    fn give_back(&self, mut conn: Box<Conn>) {
        if let Some(why) = conn.unusable() {
            // The server closed it, or said it would (`Connection: close`).
            conn.close(why);
            return;
        }
        // Counted so if it is still idle when these connections are let go.
        conn.closing.why = ConnClose::Released;
        let mut idle = self.idle();
        while idle
            .front()
            .is_some_and(|c| c.since.elapsed() >= self.limits.for_at_most)
        {
            if let Some(c) = idle.pop_front() {
                c.conn.close(ConnClose::IdleTimeout);
            }
        }
        if self.limits.max == 0 {
            drop(idle);
            conn.close(ConnClose::IdleFull);
            return;
        }
        while idle.len() >= self.limits.max
            && let Some(c) = idle.pop_front()
        {
            c.conn.close(ConnClose::IdleFull);
        }
        idle.push_back(IdleConn {
            conn,
            since: Instant::now(),
        });
    }

    /// Opens a connection. The connector's future is not `Sync`, which the futures that read
    /// a session must be, so it runs as a task of its own (only when no idle connection was
    /// there), stopped if the caller gives up.
    async fn connect(
        &self,
        uri: &http::Uri,
        method: &http::Method,
    ) -> Result<Box<Conn>, SendError> {
        let mut connector = self.connector.clone();
        let uri = uri.clone();
        let metrics = self.metrics.clone();
        let method = method.clone();
        let opening = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            std::future::poll_fn(|cx| connector.poll_ready(cx))
                .await
                .map_err(SendError::Connect)?;
            let io = connector.call(uri).await.map_err(SendError::Connect)?;
            let (sender, io) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(SendError::Http)?;
            metrics.opened(&method);
            Ok(Box::new(Conn {
                sender,
                io,
                closing: Closing {
                    metrics,
                    why: ConnClose::Unfinished,
                },
            }))
        }));
        match opening.await {
            Ok(r) => r,
            Err(e) => Err(SendError::Connect(Box::new(e))),
        }
    }

    /// Sends `req` (its URI in origin form, with a `Host` header) to the server `uri` names,
    /// on an idle connection or a new one, and returns the response once its head arrived.
    pub async fn send(
        self: &Arc<Self>,
        uri: &http::Uri,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<ConnBody>, SendError> {
        if (uri.scheme(), uri.authority()) != (self.origin.0.as_ref(), self.origin.1.as_ref()) {
            return Err(SendError::Connect(
                format!("{uri} is not on the legacy server's origin").into(),
            ));
        }
        let finishes = req.method() != http::Method::GET;
        // A reused connection may have been closed under us; a new one is tried once.
        let mut reused = true;
        loop {
            let mut conn = match self.take() {
                Some(c) => c,
                None => {
                    reused = false;
                    self.connect(uri, req.method()).await?
                }
            };
            let sent = conn.sender.try_send_request(req);
            tokio::pin!(sent);
            let head = std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = sent.as_mut().poll(cx) {
                    return Poll::Ready(Ok(r));
                }
                match Pin::new(&mut conn.io).poll(cx) {
                    // The connection ended; the request's future now says how.
                    Poll::Ready(r) => Poll::Ready(Err(ended(r))),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await;
            let head = match head {
                Ok(r) => r,
                Err(why) => {
                    conn.closing.why = why;
                    sent.await
                }
            };
            match head {
                Ok(resp) => {
                    let (parts, body) = resp.into_parts();
                    return Ok(Response::from_parts(
                        parts,
                        ConnBody {
                            body: Some(body),
                            conn: Some(conn),
                            conns: self.clone(),
                            finishes,
                        },
                    ));
                }
                Err(mut e) => match e.take_message() {
                    Some(back) if reused => {
                        // Closed under us before the request was written.
                        conn.close(ConnClose::ServerClosed);
                        req = back;
                        reused = false;
                    }
                    _ => {
                        if conn.closing.why == ConnClose::Unfinished {
                            conn.closing.why = ConnClose::Failed;
                        }
                        return Err(SendError::Http(e.into_error()));
                    }
                },
            }
        }
    }
}

/// A response body that drives its connection, and gives the connection back when done.
pub struct ConnBody {
    /// `None` only once a drop has handed it on.
    body: Option<Incoming>,
    /// `None` once the connection has ended or been given back. Boxed: the connection's
    /// state is large (its I/O type has room for a TLS session even over plain TCP), and a
    /// body is moved and held inline by the futures that read it.
    conn: Option<Box<Conn>>,
    conns: Arc<Conns>,
    /// The response ends on its own (not a GET stream): dropped before its end, it is read
    /// to its end for a moment (see [`FINISH_WITHIN`]).
    finishes: bool,
}

impl ConnBody {
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.conns.give_back(conn);
        }
    }
}

impl Body for ConnBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(conn) = &mut this.conn
            && let Poll::Ready(r) = Pin::new(&mut conn.io).poll(cx)
        {
            // Ended: what it read is in the body already, and the body says how it ended.
            conn.closing.why = ended(r);
            this.conn = None;
        }
        let Some(body) = &mut this.body else {
            return Poll::Ready(None);
        };
        let frame = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            this.finish();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

/// Frames a dropped body may still take, without waiting, to reach its end.
const DRAIN_ON_DROP: usize = 8;

/// How long a dropped response to a POST or DELETE may take to end (in a task) before its
/// connection is closed instead of given back; such a stream ends right after its last
/// message, so this waits only for bytes already on their way. Short, because a stream that
/// is not about to end (a call abandoned while the server waits) should close promptly: the
/// server learns of it by the close. 500 ms measured worse at 1,024 distinct callers.
pub const FINISH_WITHIN: Duration = Duration::from_millis(20);

/// The most a dropped response may still bring in that time.
const FINISH_BYTES: usize = 64 * 1024;

impl Drop for ConnBody {
    fn drop(&mut self) {
        // A body dropped with its end already arrived (the last event's terminator usually
        // comes with it; a 202 or an empty 200 has nothing at all) gives its connection back.
        // What is there is read without waiting; a body whose end has not arrived closes its
        // connection, as HTTP/1 cannot be reused mid-response.
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..DRAIN_ON_DROP {
            let Some(body) = &mut self.body else { return };
            if self.conn.is_none() || body.is_end_stream() {
                break;
            }
            if let Some(conn) = &mut self.conn
                && let Poll::Ready(r) = Pin::new(&mut conn.io).poll(&mut cx)
            {
                conn.closing.why = ended(r);
                self.conn = None;
                break;
            }
            let Some(body) = &mut self.body else { return };
            match Pin::new(body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(_))) => continue,
                Poll::Ready(None) => break,
                Poll::Ready(Some(Err(_))) => return,
                Poll::Pending => break,
            }
        }
        if Body::is_end_stream(self) {
            self.finish();
            return;
        }
        // A stream that ends on its own (not a GET stream) gets a moment to do so in a task,
        // as a connection's own task would have read its end.
        if self.finishes
            && let Some(conn) = self.conn.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let rest = ConnBody {
                body: self.body.take(),
                conn: Some(conn),
                conns: self.conns.clone(),
                finishes: false,
            };
            rt.spawn(async move {
                use http_body_util::BodyExt;
                let mut rest = rest;
                let mut seen = 0usize;
                let _ = tokio::time::timeout(FINISH_WITHIN, async {
                    while let Some(Ok(frame)) = rest.frame().await {
                        seen += frame.data_ref().map_or(0, Bytes::len);
                        if seen > FINISH_BYTES {
                            return;
                        }
                    }
                })
                .await;
                // Given back by its end, or closed here.
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A keep-alive HTTP/1 server on loopback answering every request with `body`, on a
    /// runtime of its own (so the test's runtime holds only the client's tasks); counts the
    /// connections it accepted. After `close_after` requests on a connection it closes it,
    /// 100 ms after the last response.
    fn server(body: &'static str, close_after: usize) -> (String, Arc<AtomicUsize>) {
        server_with(body, close_after, None)
    }

    /// [`server`], sending the second half of each body `tail_after` after the first.
    fn server_with(
        body: &'static str,
        close_after: usize,
        tail_after: Option<Duration>,
    ) -> (String, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let (mut s, _) = listener.accept().await.unwrap();
                    count.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(async move {
                        let mut buf = Vec::new();
                        let mut served = 0;
                        let mut chunk = [0u8; 4096];
                        loop {
                            let n = match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            buf.extend_from_slice(&chunk[..n]);
                            // Requests here carry no body: one ends at the blank line.
                            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                buf.drain(..end + 4);
                                let resp = format!(
                                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                                    body.len()
                                );
                                let split = match tail_after {
                                    Some(_) => resp.len() - body.len() / 2,
                                    None => resp.len(),
                                };
                                if s.write_all(&resp.as_bytes()[..split]).await.is_err() {
                                    return;
                                }
                                if let Some(wait) = tail_after {
                                    tokio::time::sleep(wait).await;
                                    if s.write_all(&resp.as_bytes()[split..]).await.is_err() {
                                        return;
                                    }
                                }
                                served += 1;
                                if served == close_after {
                                    // A moment later, as a server's keep-alive timer would.
                                    tokio::time::sleep(Duration::from_millis(100)).await;
                                    return;
                                }
                            }
                        }
                    });
                }
            });
        });
        (format!("http://{addr}/mcp"), accepted)
    }

    fn conns(server: &http::Uri) -> Arc<Conns> {
        conns_reaped_every(server, REAP_EVERY)
    }

    fn conns_reaped_every(server: &http::Uri, every: Duration) -> Arc<Conns> {
        counted_conns(server, ConnMetrics::none(), every)
    }

    /// The defaults of `upstream.max_idle_connections` and `connection_idle_timeout`.
    const LIMITS: IdleLimits = IdleLimits {
        max: 1024,
        for_at_most: Duration::from_secs(30),
    };

    fn counted_conns(server: &http::Uri, metrics: ConnMetrics, every: Duration) -> Arc<Conns> {
        limited_conns(server, LIMITS, metrics, every)
    }

    fn limited_conns(
        server: &http::Uri,
        limits: IdleLimits,
        metrics: ConnMetrics,
        every: Duration,
    ) -> Arc<Conns> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        Conns::reaped_every(
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_or_http()
                .enable_http1()
                .wrap_connector(http),
            server,
            limits,
            metrics,
            every,
        )
    }

    fn get(uri: &http::Uri) -> Request<Full<Bytes>> {
        Request::builder()
            .uri(uri.path())
            .header(http::header::HOST, uri.authority().unwrap().as_str())
            .body(Full::new(Bytes::new()))
            .unwrap()
    }

    async fn read_all(resp: Response<ConnBody>) -> Bytes {
        use http_body_util::BodyExt;
        resp.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_connection_read_to_its_end_serves_the_next_request() {
        let (url, accepted) = server("hello", usize::MAX);
        let uri: http::Uri = url.parse().unwrap();
        let conns = conns(&uri);
        for _ in 0..5 {
            let resp = conns.send(&uri, get(&uri)).await.unwrap();
            assert_eq!(read_all(resp).await, "hello");
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for all five"
        );
        assert_eq!(conns.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_its_connection() {
        let (url, accepted) = server_with(
            "a longer body than nobody reads",
            usize::MAX,
            Some(Duration::from_millis(200)),
        );
        let uri: http::Uri = url.parse().unwrap();
        let metrics = ConnMetrics::counting();
        let conns = counted_conns(&uri, metrics.clone(), REAP_EVERY);
        let resp = conns.send(&uri, get(&uri)).await.unwrap();
        drop(resp);
        assert_eq!(conns.idle_count(), 0, "not given back mid-response");
        assert_eq!(metrics.counts("GET", ConnClose::Unfinished), (1, 1, 0));
        let resp = conns.send(&uri, get(&uri)).await.unwrap();
        assert_eq!(read_all(resp).await, "a longer body than nobody reads");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_body_whose_end_has_arrived_gives_its_connection_back_when_dropped() {
        let (url, accepted) = server("all of it is here", usize::MAX);
        let uri: http::Uri = url.parse().unwrap();
        let conns = conns(&uri);
        for _ in 0..3 {
            let resp = conns.send(&uri, get(&uri)).await.unwrap();
            // The whole response is on the socket by now; nobody reads it.
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(resp);
            assert_eq!(conns.idle_count(), 1, "given back");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_post_response_dropped_before_its_end_is_finished_and_given_back() {
        // A call's response stream ends right after its last message; a reader that stops at
        // the message drops it a moment before the end arrives.
        let (url, accepted) = server_with(
            "the end comes a moment later",
            usize::MAX,
            Some(Duration::from_millis(2)),
        );
        let uri: http::Uri = url.parse().unwrap();
        let conns = conns(&uri);
        let mut post = get(&uri);
        *post.method_mut() = http::Method::POST;
        let resp = conns.send(&uri, post).await.unwrap();
        drop(resp);
        let deadline = Instant::now() + Duration::from_secs(5);
        while conns.idle_count() == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(conns.idle_count(), 1, "finished and given back");
        let resp = conns.send(&uri, get(&uri)).await.unwrap();
        drop(resp);
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "the same connection");
    }

    #[tokio::test]
    async fn an_empty_body_dropped_unread_gives_its_connection_back() {
        let (url, accepted) = server("", usize::MAX);
        let uri: http::Uri = url.parse().unwrap();
        let conns = conns(&uri);
        for _ in 0..3 {
            let resp = conns.send(&uri, get(&uri)).await.unwrap();
            assert_eq!(resp.status(), 200);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_passed_over() {
        // The server closes each connection after one response, as a server with a short
        // keep-alive does between calls.
        let (url, accepted) = server("once", 1);
        let uri: http::Uri = url.parse().unwrap();
        let conns = conns(&uri);
        for _ in 0..3 {
            let resp = conns.send(&uri, get(&uri)).await.unwrap();
            assert_eq!(read_all(resp).await, "once");
            // Let the server's close arrive.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn idle_connections_the_server_closed_are_closed_without_traffic() {
        let (url, _) = server("bye", 1);
        let uri: http::Uri = url.parse().unwrap();
        let conns = conns_reaped_every(&uri, Duration::from_millis(20));
        let resp = conns.send(&uri, get(&uri)).await.unwrap();
        assert_eq!(read_all(resp).await, "bye");
        // Given back while the server's close is still on its way.
        assert_eq!(conns.idle_count(), 1);
        let deadline = Instant::now() + Duration::from_secs(5);
        while conns.idle_count() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(conns.idle_count(), 0, "the closed connection is gone");
    }

    #[test]
    fn a_body_holds_its_connection_by_pointer() {
        // The futures that read a body hold it inline, some in more than one state; a body
        // that held the connection's state inline (1,776 bytes here) is copied with them.
        assert!(std::mem::size_of::<ConnBody>() <= 128);
    }

    #[tokio::test]
    async fn a_request_for_another_origin_is_refused() {
        let (url, accepted) = server("here", usize::MAX);
        let uri: http::Uri = url.parse().unwrap();
        let conns = conns(&uri);
        let resp = conns.send(&uri, get(&uri)).await.unwrap();
        assert_eq!(read_all(resp).await, "here");
        let (other, other_accepted) = server("elsewhere", usize::MAX);
        let other: http::Uri = other.parse().unwrap();
        let e = conns
            .send(&other, get(&other))
            .await
            .err()
            .expect("refused");
        assert!(format!("{e:?}").contains("origin"), "{e:?}");
        assert_eq!(other_accepted.load(Ordering::SeqCst), 0);
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_body_is_read_in_the_readers_task() {
        // No task of the connection's own: sending spawns nothing, and the body still arrives
        // whole (the connection is polled by whoever reads the body).
        let (url, _) = server("driven", usize::MAX);
        let uri: http::Uri = url.parse().unwrap();
        let conns = conns(&uri);
        let before = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        let resp = conns.send(&uri, get(&uri)).await.unwrap();
        assert_eq!(
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks(),
            before,
            "sending spawned no task"
        );
        assert_eq!(read_all(resp).await, "driven");
    }

    #[tokio::test]
    async fn a_connection_is_counted_open_until_it_is_let_go() {
        let (url, accepted) = server("hello", usize::MAX);
        let uri: http::Uri = url.parse().unwrap();
        let metrics = ConnMetrics::counting();
        let conns = counted_conns(&uri, metrics.clone(), REAP_EVERY);
        for _ in 0..3 {
            let resp = conns.send(&uri, get(&uri)).await.unwrap();
            assert_eq!(read_all(resp).await, "hello");
        }
        let mut post = get(&uri);
        *post.method_mut() = http::Method::POST;
        assert_eq!(
            read_all(conns.send(&uri, post).await.unwrap()).await,
            "hello"
        );
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(metrics.counts("GET", ConnClose::Released), (1, 0, 1));
        assert_eq!(metrics.counts("POST", ConnClose::Unfinished), (0, 0, 1));
        drop(conns);
        assert_eq!(metrics.counts("GET", ConnClose::Released), (1, 1, 0));
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_counted_so() {
        let (url, _) = server("bye", 1);
        let uri: http::Uri = url.parse().unwrap();
        let metrics = ConnMetrics::counting();
        let conns = counted_conns(&uri, metrics.clone(), Duration::from_millis(20));
        assert_eq!(
            read_all(conns.send(&uri, get(&uri)).await.unwrap()).await,
            "bye"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while conns.idle_count() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(metrics.counts("GET", ConnClose::ServerClosed), (1, 1, 0));
        assert_eq!(metrics.counts("GET", ConnClose::Released), (1, 0, 0));
    }

    #[tokio::test]
    async fn idle_connections_are_kept_within_their_limits() {
        let (url, accepted) = server("kept", usize::MAX);
        let uri: http::Uri = url.parse().unwrap();
        // Three responses held at once need three connections; one is kept idle after.
        let metrics = ConnMetrics::counting();
        let one = IdleLimits { max: 1, ..LIMITS };
        let conns = limited_conns(&uri, one, metrics.clone(), REAP_EVERY);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(conns.send(&uri, get(&uri)).await.unwrap());
        }
        for resp in held {
            assert_eq!(read_all(resp).await, "kept");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        assert_eq!(conns.idle_count(), 1);
        assert_eq!(metrics.counts("GET", ConnClose::IdleFull), (3, 2, 1));
        // None kept: every request opens a connection.
        let none = IdleLimits { max: 0, ..LIMITS };
        let conns = limited_conns(&uri, none, ConnMetrics::none(), REAP_EVERY);
        for _ in 0..2 {
            let resp = conns.send(&uri, get(&uri)).await.unwrap();
            assert_eq!(read_all(resp).await, "kept");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 5);
        // Kept for a moment only: the next request opens another.
        let brief = IdleLimits {
            for_at_most: Duration::from_millis(50),
            ..LIMITS
        };
        let conns = limited_conns(&uri, brief, ConnMetrics::none(), REAP_EVERY);
        let resp = conns.send(&uri, get(&uri)).await.unwrap();
        assert_eq!(read_all(resp).await, "kept");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let resp = conns.send(&uri, get(&uri)).await.unwrap();
        assert_eq!(read_all(resp).await, "kept");
        assert_eq!(accepted.load(Ordering::SeqCst), 7);
    }
}
