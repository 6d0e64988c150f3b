//! The HTTP/1 connections to the legacy server, each driven by whoever reads its response.
//!
//! The exchange is the gateway's own ([`super::h1`] frames the bytes), done in the task of
//! whoever needs it: sending writes the request and reads the response head in the sender's
//! task; the response body ([`ConnBody`]) reads its connection when it is polled, so the task
//! that reads the body (the call's, the parking lot's, the GET stream's) does the
//! connection's reads. There is no task of the connection's own and no channel between it and
//! the reader (hyper-util's pooled client had both, and a wake-up between threads each way).
//!
//! A body holds no read buffer between reads. Each poll reads into the reader's stack, decodes
//! the framing there, and copies out the data it carried; the decoder keeps its place in a few
//! integers. A stream that waits for the server (a parked call's, a session's GET stream)
//! holds its socket and little else. hyper's client connection kept an 8 KiB write buffer and
//! an 8 KiB read buffer for as long as it was open, which was most of what a parked call held.
//!
//! - a body read to its end gives its connection back to the idle set, which the next request
//!   takes it from (most recently returned first); a response that arrived whole with its head
//!   gives it back at once, before its body is read;
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
//! An idle connection is read by nobody, so a close by the server shows only when the
//! connection is taken: `Conns::take` polls it once without waiting and passes over one that
//! ended. A request whose write failed before a byte of it was taken, on a connection that had
//! served before, goes once more; one that may have reached the server does not.
//! Idle connections are kept within [`IdleLimits`] (how long, how many). A
//! task looks over the idle ones every [`REAP_EVERY`] and closes those the server closed or
//! that waited too long, so a quiet gateway keeps no half-closed sockets; it ends with the
//! connections (when a reload replaces the upstream).
//!
//! Every connection is counted when it opens (by the method of the request that found no idle
//! one) and when it closes, by why ([`ConnClose`]): a close is counted where the connection is
//! dropped, whichever path drops it, so opened minus closed is always what is open.

use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tower_service::Service;

use super::h1::{self, Decoder, H1Error};
use crate::metrics::{ConnClose, ConnMetrics};
use crate::tls::stream::ClientStream;

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

/// The most bytes one read of a response takes (on the reader's stack).
const READ_CHUNK: usize = 16 * 1024;

/// A connection's socket. A TLS session's state is a kilobyte or more; boxed, it costs a
/// plain connection nothing (inline, every connection had room for one). The TLS stream is
/// the gateway's own ([`ClientStream`]): it holds no buffer while the connection waits, so an
/// idle or parked connection over `https` keeps only its TLS state and keys (tokio-rustls's
/// stream kept a 4 KiB read buffer for the connection's life).
enum Io {
    Plain(tokio::net::TcpStream),
    Tls(Box<ClientStream>),
}

/// How connections to the legacy server are opened: TCP through hyper-util's connector (its
/// connect timeout, `TCP_NODELAY`), then, for an `https` server, a TLS handshake with `tls`.
#[derive(Clone)]
pub struct Connector {
    pub tcp: HttpConnector,
    pub tls: Arc<rustls::ClientConfig>,
}

impl Connector {
    /// A connection to the server `uri` names.
    async fn open(mut self, uri: http::Uri) -> Result<Io, SendError> {
        fn connect(e: impl std::error::Error + Send + Sync + 'static) -> SendError {
            SendError::Connect(Box::new(e))
        }
        std::future::poll_fn(|cx| self.tcp.poll_ready(cx))
            .await
            .map_err(connect)?;
        let tcp = self
            .tcp
            .call(uri.clone())
            .await
            .map_err(connect)?
            .into_inner();
        if uri.scheme() != Some(&http::uri::Scheme::HTTPS) {
            return Ok(Io::Plain(tcp));
        }
        let host = uri.host().unwrap_or_default();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let name = ServerName::try_from(host.to_owned()).map_err(connect)?;
        let tls = ClientStream::connect(tcp, self.tls, name)
            .await
            .map_err(connect)?;
        Ok(Io::Tls(Box::new(tls)))
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

/// One connection: its socket, where its current response's body stands, and its count.
struct Conn {
    io: Io,
    body: Decoder,
    /// The current response lets the connection carry another request after it.
    keep_alive: bool,
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
    /// Why the idle connection cannot take a request now, if it cannot: read once, without
    /// waiting, it has ended, failed, or sent bytes nobody asked for.
    fn unusable(&mut self) -> Option<ConnClose> {
        let mut cx = Context::from_waker(Waker::noop());
        let mut probe = [MaybeUninit::<u8>::uninit(); 64];
        let mut buf = ReadBuf::uninit(&mut probe);
        match Pin::new(&mut self.io).poll_read(&mut cx, &mut buf) {
            Poll::Pending => None,
            Poll::Ready(Ok(())) if buf.filled().is_empty() => Some(ConnClose::ServerClosed),
            Poll::Ready(Ok(())) => Some(ConnClose::Failed),
            Poll::Ready(Err(_)) => Some(ConnClose::Failed),
        }
    }

    /// Closes the connection (drops it), counted for `why`.
    fn close(mut self, why: ConnClose) {
        self.closing.why = why;
    }
}

struct IdleConn {
    conn: Box<Conn>,
    since: Instant,
}

impl IdleConn {
    /// Why this idle connection should be closed rather than kept or reused, if it should:
    /// idle too long, or (read once) ended.
    fn spent(&mut self, for_at_most: Duration) -> Option<ConnClose> {
        match self.since.elapsed() >= for_at_most {
            true => Some(ConnClose::IdleTimeout),
            false => self.conn.unusable(),
        }
    }
}

/// The connections to one legacy server, and how to open more.
pub struct Conns {
    connector: Connector,
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
    /// Writing the request failed before the connection took all of it: the server cannot
    /// have it whole.
    Unsent(std::io::Error),
    /// The connection took the whole request, then the exchange failed: the server may have
    /// acted on it.
    Exchange(ExchangeError),
}

/// A connection that failed mid-exchange: its socket, or the bytes the server sent.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("the connection failed")]
    Io(#[source] std::io::Error),
    #[error(transparent)]
    Protocol(#[from] H1Error),
}

impl Conns {
    /// Connections to the origin of `server`, idle ones kept within `limits`, counted in
    /// `metrics`.
    pub fn new(
        connector: Connector,
        server: &http::Uri,
        limits: IdleLimits,
        metrics: ConnMetrics,
    ) -> Arc<Conns> {
        Self::reaped_every(connector, server, limits, metrics, REAP_EVERY)
    }

    fn reaped_every(
        connector: Connector,
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

    /// Takes back a connection whose response has ended.
    fn give_back(&self, mut conn: Box<Conn>) {
        if !conn.keep_alive {
            // The server said it would close it (`Connection: close`, or a body that ends
            // at the close).
            conn.close(ConnClose::ServerClosed);
            return;
        }
        if let Some(why) = conn.unusable() {
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
        let connector = self.connector.clone();
        let uri = uri.clone();
        let metrics = self.metrics.clone();
        let method = method.clone();
        let opening = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            let io = connector.open(uri).await?;
            metrics.opened(&method);
            Ok(Box::new(Conn {
                io,
                body: Decoder::length(0),
                keep_alive: true,
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
        req: Request<Bytes>,
    ) -> Result<Response<ConnBody>, SendError> {
        if (uri.scheme(), uri.authority()) != (self.origin.0.as_ref(), self.origin.1.as_ref()) {
            return Err(SendError::Connect(
                format!("{uri} is not on the legacy server's origin").into(),
            ));
        }
        let finishes = req.method() != http::Method::GET;
        let wire = h1::encode_request(&req);
        let method = req.method();
        // A connection that served before may have been closed under us: the request goes
        // once more if not a byte of it was taken.
        let mut retried = false;
        let mut conn = loop {
            let (mut conn, reused) = match self.take() {
                Some(c) => (c, true),
                None => (self.connect(uri, method).await?, false),
            };
            match write_all(&mut conn.io, &wire).await {
                Ok(()) => break conn,
                Err((0, _)) if reused && !retried => {
                    conn.close(ConnClose::ServerClosed);
                    retried = true;
                }
                Err((_, e)) => {
                    conn.close(ConnClose::Failed);
                    return Err(SendError::Unsent(e));
                }
            }
        };
        let (head, first) = match read_head(&mut conn, method).await {
            Ok(r) => r,
            Err(e) => {
                conn.close(ConnClose::Failed);
                return Err(SendError::Exchange(e));
            }
        };
        conn.body = head.body;
        conn.keep_alive = head.keep_alive;
        let mut body = ConnBody {
            first,
            conn: Some(conn),
            conns: self.clone(),
            finishes,
        };
        if body.conn.as_ref().is_some_and(|c| c.body.is_done()) {
            // The whole response came with its head: the connection is free already.
            body.finish();
        }
        let mut resp = Response::new(body);
        *resp.status_mut() = head.status;
        *resp.version_mut() = head.version;
        *resp.headers_mut() = head.headers;
        Ok(resp)
    }
}

/// Writes `bytes`; on failure, how many were taken and why.
async fn write_all(io: &mut Io, bytes: &[u8]) -> Result<(), (usize, std::io::Error)> {
    let mut sent = 0;
    while sent < bytes.len() {
        match io.write(&bytes[sent..]).await {
            Ok(0) => return Err((sent, std::io::ErrorKind::WriteZero.into())),
            Ok(n) => sent += n,
            Err(e) => return Err((sent, e)),
        }
    }
    io.flush().await.map_err(|e| (sent, e))
}

/// Reads a response head on `conn`, and decodes the body bytes that came with it.
async fn read_head(
    conn: &mut Conn,
    method: &http::Method,
) -> Result<(h1::Head, Option<Bytes>), ExchangeError> {
    let mut buf = Vec::with_capacity(1024);
    loop {
        if buf.len() == buf.capacity() {
            buf.reserve(buf.len());
        }
        let n = conn
            .io
            .read_buf(&mut buf)
            .await
            .map_err(ExchangeError::Io)?;
        if n == 0 {
            return Err(H1Error::Incomplete.into());
        }
        if let Some((mut head, taken)) = h1::parse_head(&buf, method)? {
            let mut data = BytesMut::new();
            let rest = head.body.decode(&buf[taken..], &mut data)?;
            if rest.after_end > 0 {
                // Bytes nobody asked for: the connection cannot be trusted with another.
                head.keep_alive = false;
            }
            let first = (!data.is_empty()).then(|| data.freeze());
            return Ok((head, first));
        }
    }
}

/// A response body that reads its connection, and gives the connection back when done.
pub struct ConnBody {
    /// Body bytes that came with the head, not yet taken.
    first: Option<Bytes>,
    /// `None` once the connection has ended or been given back. Boxed: a body is moved and
    /// held inline by the futures that read it.
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

    /// Reads and decodes what has arrived on the connection, until some data or the end.
    fn poll_read_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, ExchangeError>>> {
        loop {
            let Some(conn) = &mut self.conn else {
                return Poll::Ready(None);
            };
            if conn.body.is_done() {
                self.finish();
                return Poll::Ready(None);
            }
            let mut stack = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
            let mut buf = ReadBuf::uninit(&mut stack);
            let read = std::task::ready!(Pin::new(&mut conn.io).poll_read(cx, &mut buf));
            let outcome = match read {
                Err(e) => Err((ConnClose::Failed, ExchangeError::Io(e))),
                Ok(()) if buf.filled().is_empty() => match conn.body.ends_at_close() {
                    true => {
                        conn.closing.why = ConnClose::ServerClosed;
                        self.conn = None;
                        return Poll::Ready(None);
                    }
                    false => Err((ConnClose::ServerClosed, H1Error::Incomplete.into())),
                },
                Ok(()) => {
                    let mut data = BytesMut::with_capacity(buf.filled().len());
                    match conn.body.decode(buf.filled(), &mut data) {
                        Ok(d) => {
                            if d.after_end > 0 {
                                conn.keep_alive = false;
                            }
                            if conn.body.is_done() {
                                self.finish();
                            }
                            Ok(data)
                        }
                        Err(e) => Err((ConnClose::Failed, e.into())),
                    }
                }
            };
            match outcome {
                Ok(data) if data.is_empty() => continue,
                Ok(data) => return Poll::Ready(Some(Ok(data.freeze()))),
                Err((why, e)) => {
                    if let Some(conn) = self.conn.take() {
                        conn.close(why);
                    }
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }
}

impl Body for ConnBody {
    type Data = Bytes;
    type Error = ExchangeError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        self.poll_read_data(cx)
            .map(|r| r.map(|r| r.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.conn.as_ref().is_none_or(|c| c.body.is_done())
    }

    fn size_hint(&self) -> SizeHint {
        match self.is_end_stream() {
            true => SizeHint::with_exact(0),
            false => SizeHint::default(),
        }
    }
}

/// Reads a dropped body may still make, without waiting, to reach its end.
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
        // comes with it) gives its connection back. What is there is read without waiting;
        // a body whose end has not arrived closes its connection, as HTTP/1 cannot be reused
        // mid-response.
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..DRAIN_ON_DROP {
            match self.poll_read_data(&mut cx) {
                Poll::Ready(Some(Ok(_))) => continue,
                Poll::Ready(_) | Poll::Pending => break,
            }
        }
        let Some(conn) = self.conn.take() else {
            return;
        };
        // A stream that ends on its own (not a GET stream) gets a moment to do so in a task.
        if self.finishes
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let rest = ConnBody {
                first: None,
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
            return;
        }
        conn.close(ConnClose::Unfinished);
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

    /// A server on loopback, on a runtime of its own (so the test's runtime holds only the
    /// client's tasks), serving each connection it accepts with `conn`; counts them.
    fn loopback<F, Fut>(conn: F) -> (std::net::SocketAddr, Arc<AtomicUsize>)
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
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
                    let (s, _) = listener.accept().await.unwrap();
                    count.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(conn(s));
                }
            });
        });
        (addr, accepted)
    }

    /// [`server`], sending the second half of each body `tail_after` after the first.
    fn server_with(
        body: &'static str,
        close_after: usize,
        tail_after: Option<Duration>,
    ) -> (String, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (addr, accepted) = loopback(move |mut s| async move {
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
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        Conns::reaped_every(
            Connector {
                tcp,
                tls: Arc::new(tls),
            },
            server,
            limits,
            metrics,
            every,
        )
    }

    fn get(uri: &http::Uri) -> Request<Bytes> {
        Request::builder()
            .uri(uri.path())
            .header(http::header::HOST, uri.authority().unwrap().as_str())
            .body(Bytes::new())
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

    #[test]
    fn a_plain_connection_has_no_room_for_a_tls_session() {
        // Every open connection (two for each parked call) holds this; with the TLS state
        // inline it was about 1.1 KB whether or not the connection used TLS.
        let size = std::mem::size_of::<Conn>();
        assert!(size <= 128, "{size} bytes");
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
    async fn a_response_that_came_whole_with_its_head_frees_its_connection_at_once() {
        // Held unread, such responses still share one connection: their bodies were read
        // with their heads.
        let (url, accepted) = server("small", usize::MAX);
        let uri: http::Uri = url.parse().unwrap();
        let conns = conns(&uri);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(conns.send(&uri, get(&uri)).await.unwrap());
            assert_eq!(conns.idle_count(), 1, "given back before its body is read");
        }
        for resp in held {
            assert_eq!(read_all(resp).await, "small");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn idle_connections_are_kept_within_their_limits() {
        // Each body's second half comes a moment after its head, so a response held
        // unread holds its connection.
        let (url, accepted) = server_with("kept", usize::MAX, Some(Duration::from_millis(20)));
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

    /// A server on loopback that answers each request on a connection with the next script:
    /// its pieces written one by one, `gap` apart; after the last script it closes. Counts
    /// the connections it accepted.
    fn scripted(scripts: Vec<Vec<&'static [u8]>>, gap: Duration) -> (http::Uri, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (addr, accepted) = loopback(move |mut s| {
            let scripts = scripts.clone();
            async move {
                let mut buf = Vec::new();
                for script in scripts {
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.clear();
                    for piece in script {
                        if s.write_all(piece).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(gap).await;
                    }
                }
            }
        });
        (format!("http://{addr}/mcp").parse().unwrap(), accepted)
    }

    #[tokio::test]
    async fn a_chunked_stream_trickled_in_pieces_is_read_whole_and_its_connection_reused() {
        // Pieces that carry only framing (a size line, a line end) bring no data: the body
        // reads on rather than ending or stalling.
        let stream: Vec<&'static [u8]> = vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
            b"1",
            b"3\r\ndata: hello",
            b" world\r\n",
            b"\r",
            b"\n",
            b"0\r\n",
            b"\r\n",
        ];
        let again: Vec<&'static [u8]> = vec![b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nagain"];
        let (uri, accepted) = scripted(vec![stream, again], Duration::from_millis(5));
        let conns = conns(&uri);
        let resp = conns.send(&uri, get(&uri)).await.unwrap();
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        assert_eq!(read_all(resp).await, "data: hello world\r\n");
        assert_eq!(conns.idle_count(), 1, "given back at the last chunk");
        let resp = conns.send(&uri, get(&uri)).await.unwrap();
        assert_eq!(read_all(resp).await, "again");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_stream_cut_mid_body_is_an_error_and_its_connection_is_closed() {
        let cut: Vec<&'static [u8]> = vec![
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            b"10\r\nonly part",
        ];
        let (uri, _) = scripted(vec![cut], Duration::from_millis(5));
        let metrics = ConnMetrics::counting();
        let conns = counted_conns(&uri, metrics.clone(), REAP_EVERY);
        let resp = conns.send(&uri, get(&uri)).await.unwrap();
        use http_body_util::BodyExt;
        let e = resp.into_body().collect().await.expect_err("an error");
        assert!(
            e.to_string().contains("closed before the response ended"),
            "{e}"
        );
        assert_eq!(conns.idle_count(), 0);
        assert_eq!(metrics.counts("GET", ConnClose::ServerClosed), (1, 1, 0));
    }

    #[tokio::test]
    async fn a_bad_or_oversized_head_fails_the_request_and_closes_its_connection() {
        let huge: &'static [u8] = Box::leak(
            format!(
                "HTTP/1.1 200 OK\r\nx-big: {}\r\n\r\n",
                "a".repeat(h1::MAX_HEAD)
            )
            .into_bytes()
            .into_boxed_slice(),
        );
        for (script, want) in [
            (vec![huge], "larger than"),
            (
                vec![&b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"[..]],
                "content-length",
            ),
            (vec![&b"garbage\r\n\r\n"[..]], "malformed"),
        ] {
            let (uri, _) = scripted(vec![script], Duration::ZERO);
            let metrics = ConnMetrics::counting();
            let conns = counted_conns(&uri, metrics.clone(), REAP_EVERY);
            let e = conns.send(&uri, get(&uri)).await.err().expect("refused");
            let SendError::Exchange(e) = e else {
                panic!("{e:?}")
            };
            assert!(e.to_string().contains(want), "{e}");
            assert_eq!(metrics.counts("GET", ConnClose::Failed), (1, 1, 0));
        }
    }

    #[tokio::test]
    async fn a_response_that_says_close_does_not_keep_its_connection() {
        let close: Vec<&'static [u8]> =
            vec![b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 3\r\n\r\nbye"];
        let (uri, accepted) = scripted(vec![close.clone()], Duration::ZERO);
        let conns = conns(&uri);
        for _ in 0..2 {
            let resp = conns.send(&uri, get(&uri)).await.unwrap();
            assert_eq!(read_all(resp).await, "bye");
            assert_eq!(conns.idle_count(), 0);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
