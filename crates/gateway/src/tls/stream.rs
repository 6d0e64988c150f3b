//! A TLS stream over rustls's unbuffered connection, so that the gateway holds the buffers and
//! a quiet connection holds none: the front's connections ([`ServerStream`]) and the legacy
//! server's over `https` ([`ClientStream`]).
//!
//! rustls's buffered connection (what tokio-rustls wraps) reads into a buffer of its own that
//! is never smaller than 4 KiB once the first byte has come, for as long as the connection
//! lives. A front connection at rest, an idle pooled upstream connection or a parked call's
//! stream would keep that buffer for nothing. Here the ciphertext waits in [`TlsStream`]'s own
//! vectors, which are freed whenever they are emptied:
//! - `incoming`: what was read and rustls could not yet use (part of a record, or a handshake
//!   message split over records). It is allocated when the socket is readable, not before.
//! - `plain`: decrypted bytes the reader had no room for.
//! - `outgoing`: records encoded and not yet written.
//!
//! What stays for the connection's life is rustls's state and keys, and the socket.
//!
//! The ciphertext read and not yet used is bounded by what rustls allows a peer to send at
//! once: one record (18 KiB at most), or a handshake message of up to 64 KiB in parts.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use std::ops::DerefMut;

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::pki_types::ServerName;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncodeTlsData, EncryptError, InsufficientSizeError,
    UnbufferedConnectionCommon, UnbufferedStatus, WriteTraffic,
};
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// What a read into an empty buffer may take: a record of the largest size rustls accepts
/// (18,436 bytes with its header) fits whole.
const READ_SIZE: usize = 20 * 1024;

/// What a read past part of a record adds at least, so that a record that came in parts
/// grows its buffer by steps this size, not by doubling.
const MORE_READ: usize = 4 * 1024;

/// The ciphertext a peer may leave unusable at once: a handshake message of up to 64 KiB
/// (rustls' own bound) in records, and the record it ends in.
const MAX_INCOMING: usize = 0x1_0000 + READ_SIZE;

/// What one write encrypts at most; the rest is the caller's to write again.
const MAX_WRITE: usize = 64 * 1024;

/// Unsent ciphertext past which a write waits for the socket first.
const MAX_OUTGOING: usize = 64 * 1024;

/// The room records take beyond their payload: header, content type, tag and explicit nonce
/// (TLS 1.2), with margin. For each started 16 KiB of payload.
const RECORD_OVERHEAD: usize = 64;

/// The side of a connection a [`TlsStream`] drives: rustls's unbuffered server or client
/// connection.
pub trait Side: DerefMut<Target = UnbufferedConnectionCommon<Self::Data>> + Send + Unpin {
    type Data;
    /// rustls's `process_tls_records` for this side.
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
}

impl Side for UnbufferedServerConnection {
    type Data = ServerConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ServerConnectionData> {
        self.process_tls_records(incoming)
    }
}

impl Side for UnbufferedClientConnection {
    type Data = ClientConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ClientConnectionData> {
        self.process_tls_records(incoming)
    }
}

/// A front connection's TLS stream.
pub type ServerStream = TlsStream<UnbufferedServerConnection>;

/// A TLS stream to the legacy server.
pub type ClientStream = TlsStream<UnbufferedClientConnection>;

/// A TLS connection over a TCP stream, its handshake done.
pub struct TlsStream<S> {
    io: TcpStream,
    conn: S,
    /// Ciphertext read and not yet used by rustls.
    incoming: Vec<u8>,
    /// Decrypted bytes not yet read: `plain[plain_at..]`.
    plain: Vec<u8>,
    plain_at: usize,
    /// Records encoded and not yet written: `outgoing[out_at..]`.
    outgoing: Vec<u8>,
    out_at: usize,
    /// The peer has closed its side: a close_notify, or the end of the TCP stream.
    read_closed: bool,
    /// A close_notify is to be queued at the next chance (shutdown asked for it).
    close_wanted: bool,
    /// A close_notify has been queued; nothing more may be written.
    close_sent: bool,
    /// rustls reported a failure: the connection is done.
    failed: bool,
}

/// A rustls error as the I/O error a stream reports.
fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Grows `out` by `need` bytes of room and hands it to `fill`, keeping what `fill` wrote.
/// When the room was too small, `fill`'s error says how much it needs (`room_wanted`) and it is
/// asked once more.
fn append_with<E: std::fmt::Display>(
    out: &mut Vec<u8>,
    mut need: usize,
    mut fill: impl FnMut(&mut [u8]) -> Result<usize, E>,
    room_wanted: impl Fn(&E) -> Option<usize>,
) -> io::Result<()> {
    let start = out.len();
    loop {
        out.resize(start + need, 0);
        match fill(&mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                return Ok(());
            }
            Err(e) => {
                out.truncate(start);
                match room_wanted(&e) {
                    Some(required) if required > need => need = required,
                    _ => return Err(io::Error::other(e.to_string())),
                }
            }
        }
    }
}

/// The room an encryption asks for, when it failed for want of room.
fn encrypt_room(e: &EncryptError) -> Option<usize> {
    match e {
        EncryptError::InsufficientSize(InsufficientSizeError { required_size }) => {
            Some(*required_size)
        }
        _ => None,
    }
}

/// Encrypts `data` as application data at the end of `out`.
fn encrypt_into<D>(
    traffic: &mut WriteTraffic<'_, D>,
    data: &[u8],
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let records = data.len().div_ceil(16 * 1024).max(1);
    let need = data.len() + records * RECORD_OVERHEAD;
    append_with(out, need, |room| traffic.encrypt(data, room), encrypt_room)
}

/// Encodes the record rustls asks to send (a handshake message, an alert) at the end of `out`.
fn encode_into<D>(encode: &mut EncodeTlsData<'_, D>, out: &mut Vec<u8>) -> io::Result<()> {
    let room_wanted = |e: &EncodeError| match e {
        EncodeError::InsufficientSize(InsufficientSizeError { required_size }) => {
            Some(*required_size)
        }
        EncodeError::AlreadyEncoded => None,
    };
    append_with(out, 1024, |room| encode.encode(room), room_wanted)
}

impl ServerStream {
    /// Runs the server's side of a handshake on `io`. The caller bounds it in time.
    pub async fn accept(io: TcpStream, config: Arc<ServerConfig>) -> io::Result<ServerStream> {
        let conn = UnbufferedServerConnection::new(config).map_err(tls_error)?;
        TlsStream::handshake(io, conn).await
    }

    /// The certificates the client presented (client authentication only).
    pub fn peer_certificates(&self) -> Option<&[rustls_pki_types::CertificateDer<'static>]> {
        self.conn.peer_certificates()
    }
}

impl ClientStream {
    /// Runs the client's side of a handshake with `name` on `io`. The caller bounds it in
    /// time.
    pub async fn connect(
        io: TcpStream,
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
    ) -> io::Result<ClientStream> {
        let conn = UnbufferedClientConnection::new(config, name).map_err(tls_error)?;
        TlsStream::handshake(io, conn).await
    }
}

impl<S: Side> TlsStream<S> {
    /// Runs `conn`'s handshake on `io`.
    async fn handshake(io: TcpStream, conn: S) -> io::Result<TlsStream<S>> {
        let mut s = TlsStream {
            io,
            conn,
            incoming: Vec::new(),
            plain: Vec::new(),
            plain_at: 0,
            outgoing: Vec::new(),
            out_at: 0,
            read_closed: false,
            close_wanted: false,
            close_sent: false,
            failed: false,
        };
        loop {
            let turned = s.turn(None, None);
            // What rustls asked to send goes first, an alert for a failure included.
            std::future::poll_fn(|cx| s.poll_send(cx)).await?;
            turned?;
            if !s.conn.is_handshaking() {
                return Ok(s);
            }
            if s.read_closed {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed during the TLS handshake",
                ));
            }
            let n = std::future::poll_fn(|cx| s.poll_fill(cx)).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed during the TLS handshake",
                ));
            }
        }
    }

    /// How many bytes the stream holds in buffers of its own (not rustls's): none once it has
    /// nothing waiting in either direction.
    #[cfg(test)]
    fn buffered_capacity(&self) -> usize {
        self.incoming.capacity() + self.plain.capacity() + self.outgoing.capacity()
    }

    /// Gives rustls the ciphertext read so far, until it needs more: decrypted data goes to
    /// `read` (as much as fits) and then to `plain`; records to send go to `outgoing`; `write`,
    /// when given, is encrypted once rustls allows it. Returns whether `write` was encrypted.
    /// What rustls used is dropped from `incoming`, and `incoming` is freed once empty.
    fn turn(
        &mut self,
        mut read: Option<&mut ReadBuf<'_>>,
        write: Option<&[u8]>,
    ) -> io::Result<bool> {
        if self.failed {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the TLS connection has failed",
            ));
        }
        let mut write = write;
        let mut wrote = false;
        let mut used = 0;
        let result = 'turns: loop {
            let UnbufferedStatus { discard, state } = self.conn.process(&mut self.incoming[used..]);
            let state = match state {
                Ok(state) => state,
                Err(e) => {
                    used += discard;
                    break Err(tls_error(e));
                }
            };
            let stop = match state {
                ConnectionState::ReadTraffic(mut traffic) => {
                    while let Some(record) = traffic.next_record() {
                        let record = match record {
                            Ok(r) => r,
                            Err(e) => break 'turns Err(tls_error(e)),
                        };
                        let payload = record.payload;
                        let mut rest = payload;
                        if let Some(buf) = read.as_deref_mut()
                            && self.plain_at == self.plain.len()
                        {
                            let n = buf.remaining().min(rest.len());
                            buf.put_slice(&rest[..n]);
                            rest = &rest[n..];
                        }
                        self.plain.extend_from_slice(rest);
                        used += record.discard;
                    }
                    false
                }
                ConnectionState::EncodeTlsData(mut encode) => {
                    if let Err(e) = encode_into(&mut encode, &mut self.outgoing) {
                        break Err(e);
                    }
                    false
                }
                ConnectionState::TransmitTlsData(mut transmit) => {
                    // The encoded records are in `outgoing` now; sending them is this
                    // stream's, in order, before anything encrypted after them.
                    if let Some(data) = write
                        && let Some(mut traffic) = transmit.may_encrypt_app_data()
                    {
                        if let Err(e) = encrypt_into(&mut traffic, data, &mut self.outgoing) {
                            break Err(e);
                        }
                        write = None;
                        wrote = true;
                    }
                    transmit.done();
                    false
                }
                ConnectionState::WriteTraffic(mut traffic) => {
                    if let Some(data) = write.take() {
                        if let Err(e) = encrypt_into(&mut traffic, data, &mut self.outgoing) {
                            break Err(e);
                        }
                        wrote = true;
                    }
                    if self.close_wanted && !self.close_sent {
                        let queued = append_with(
                            &mut self.outgoing,
                            64,
                            |room| traffic.queue_close_notify(room),
                            encrypt_room,
                        );
                        if let Err(e) = queued {
                            break Err(e);
                        }
                        self.close_sent = true;
                    }
                    true
                }
                ConnectionState::PeerClosed => {
                    self.read_closed = true;
                    false
                }
                ConnectionState::Closed => {
                    self.read_closed = true;
                    true
                }
                ConnectionState::BlockedHandshake => true,
                // Early data is not enabled (the configuration leaves it off).
                _ => {
                    break Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "unexpected TLS state",
                    ));
                }
            };
            used += discard;
            if stop {
                break Ok(wrote);
            }
        };
        self.incoming.drain(..used);
        if self.incoming.is_empty() {
            self.incoming = Vec::new();
        }
        if self.plain_at == self.plain.len() {
            self.plain = Vec::new();
            self.plain_at = 0;
        }
        if result.is_err() {
            self.failed = true;
            self.queue_alert();
        }
        result
    }

    /// After a failure, encodes the alert rustls queued for the peer, so that it can be sent
    /// before the connection closes. Called once: rustls is not asked again after a failure
    /// (it would read the same bytes again and fail a second time).
    fn queue_alert(&mut self) {
        // The unused ciphertext is given again: rustls keeps its place in it (a handshake
        // message in parts) and would read past the end of a shorter buffer.
        let UnbufferedStatus { state, .. } = self.conn.process(&mut self.incoming[..]);
        if let Ok(ConnectionState::EncodeTlsData(mut encode)) = state {
            let _ = encode_into(&mut encode, &mut self.outgoing);
        }
    }

    /// Copies what waits in `plain` into `buf`; whether anything was copied.
    fn take_plain(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        let waiting = &self.plain[self.plain_at..];
        if waiting.is_empty() || buf.remaining() == 0 {
            return false;
        }
        let n = waiting.len().min(buf.remaining());
        buf.put_slice(&waiting[..n]);
        self.plain_at += n;
        if self.plain_at == self.plain.len() {
            self.plain = Vec::new();
            self.plain_at = 0;
        }
        true
    }

    /// Reads what the socket has into `incoming`, without holding a buffer while it waits.
    /// `Ok(0)`: the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.incoming.len() >= MAX_INCOMING {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a TLS message larger than the peer may send",
            )));
        }
        // Readable first (no system call when the last read found the socket drained), and
        // only then room to read into.
        ready!(self.io.poll_read_ready(cx))?;
        if self.incoming.capacity() - self.incoming.len() < MORE_READ {
            let room = if self.incoming.is_empty() {
                READ_SIZE
            } else {
                MORE_READ
            };
            self.incoming.reserve_exact(room);
        }
        // Through `poll_read`, which takes a short read as the socket drained (the next read
        // waits for readiness instead of finding nothing), as tokio-rustls's reads did.
        let read = tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.incoming);
        if read.is_pending() && self.incoming.is_empty() {
            self.incoming = Vec::new();
        }
        read
    }

    /// Writes `outgoing` to the socket; ready once all of it is written (and then freed).
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.out_at < self.outgoing.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.outgoing[self.out_at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out_at += n;
        }
        self.outgoing = Vec::new();
        self.out_at = 0;
        Poll::Ready(Ok(()))
    }

    /// Sends what waits without waiting for the socket: a failure is reported, a full socket is
    /// not (the next write or flush sends the rest; its waker is registered).
    fn send_what_fits(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.poll_send(cx) {
            Poll::Ready(Err(e)) => Err(e),
            _ => Ok(()),
        }
    }
}

impl<S: Side> AsyncRead for TlsStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.take_plain(buf) || buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.read_closed {
                return Poll::Ready(Ok(()));
            }
            let n = ready!(this.poll_fill(cx))?;
            if n == 0 {
                this.read_closed = true;
                if !this.incoming.is_empty() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed in the middle of a TLS record",
                    )));
                }
                return Poll::Ready(Ok(()));
            }
            let before = buf.filled().len();
            let turned = this.turn(Some(buf), None);
            // A reply rustls owes the peer (a key update, or the alert for a failure) goes out
            // now, or with the next write if the socket cannot take it now.
            let sent = this.send_what_fits(cx);
            turned?;
            sent?;
            if buf.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<S: Side> AsyncWrite for TlsStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.outgoing.len() - this.out_at >= MAX_OUTGOING {
            ready!(this.poll_send(cx))?;
        }
        if this.close_sent || this.close_wanted {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let data = &buf[..buf.len().min(MAX_WRITE)];
        let turned = this.turn(None, Some(data));
        if turned.is_err() {
            let _ = this.send_what_fits(cx);
        }
        if !turned? {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "TLS connection not ready for data",
            )));
        }
        this.send_what_fits(cx)?;
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_sent {
            this.close_wanted = true;
            this.turn(None, None)?;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A self-signed certificate for `localhost`: its DER and its key's.
    fn self_signed() -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (
            cert.der().clone(),
            PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
    }

    fn server_config(
        cert: &CertificateDer<'static>,
        key: &PrivateKeyDer<'static>,
    ) -> Arc<ServerConfig> {
        let mut cfg = ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key.clone_key())
            .unwrap();
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(cfg)
    }

    fn client_config(
        cert: &CertificateDer<'static>,
        version: &'static rustls::SupportedProtocolVersion,
        alpn: &[u8],
    ) -> Arc<ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.clone()).unwrap();
        let mut cfg = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![alpn.to_vec()];
        Arc::new(cfg)
    }

    fn connector(
        cert: &CertificateDer<'static>,
        version: &'static rustls::SupportedProtocolVersion,
        alpn: &[u8],
    ) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(client_config(cert, version, alpn))
    }

    /// A loopback listener with a fresh certificate whose first connection runs the server's
    /// handshake and is handed to `serve`: its address, the certificate, and `serve`'s task.
    async fn serve_one<T, F>(
        serve: impl FnOnce(io::Result<ServerStream>) -> F + Send + 'static,
    ) -> (
        std::net::SocketAddr,
        CertificateDer<'static>,
        tokio::task::JoinHandle<T>,
    )
    where
        T: Send + 'static,
        F: std::future::Future<Output = T> + Send + 'static,
    {
        let (cert, key) = self_signed();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = server_config(&cert, &key);
        let task = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            serve(ServerStream::accept(tcp, config).await).await
        });
        (addr, cert, task)
    }

    /// A listener on loopback, the server stream its next connection makes, and a client
    /// connected to it over `version`.
    /// Everything `r` reads up to its end, within 30 s.
    async fn read_to_end_in_time(r: &mut (impl AsyncRead + Unpin)) -> io::Result<Vec<u8>> {
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), r.read_to_end(&mut got))
            .await
            .expect("the peer ended its stream in time")?;
        Ok(got)
    }

    async fn pair(
        version: &'static rustls::SupportedProtocolVersion,
        alpn: &[u8],
    ) -> (ServerStream, tokio_rustls::client::TlsStream<TcpStream>) {
        let (addr, cert, server) = serve_one(|accepted| async move { accepted }).await;
        let tcp = TcpStream::connect(addr).await.unwrap();
        let client = connector(&cert, version, alpn)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .expect("client handshake");
        let server = server.await.unwrap().expect("server handshake");
        (server, client)
    }

    /// A megabyte each way, sent by the client and echoed by the server as it comes, then a
    /// close from each side: on both TLS versions the gateway serves.
    #[tokio::test]
    async fn a_megabyte_goes_each_way_and_each_side_closes_cleanly_over_tls13_and_tls12() {
        for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
            let (mut server, client) = pair(version, b"http/1.1").await;
            let sent: Vec<u8> = (0..1_000_003u32).map(|i| (i % 251) as u8).collect();
            let echo = tokio::spawn(async move {
                let mut chunk = vec![0u8; 7_000];
                let mut total = 0;
                loop {
                    let n = server.read(&mut chunk).await.expect("server read");
                    if n == 0 {
                        break;
                    }
                    total += n;
                    server.write_all(&chunk[..n]).await.expect("server write");
                }
                server.shutdown().await.expect("server shutdown");
                (total, server.buffered_capacity())
            });
            let (mut rd, mut wr) = tokio::io::split(client);
            let to_send = sent.clone();
            let writer = tokio::spawn(async move {
                wr.write_all(&to_send).await.unwrap();
                wr.shutdown().await.unwrap();
            });
            // A clean end: tokio-rustls reports a close without close_notify as an error.
            let got = read_to_end_in_time(&mut rd)
                .await
                .unwrap_or_else(|e| panic!("{version:?}: the client's read ended with {e}"));
            writer.await.unwrap();
            let (total, held) = echo.await.unwrap();
            assert_eq!(total, sent.len(), "{version:?}");
            assert!(
                got == sent,
                "{version:?}: the echo differs from what was sent"
            );
            assert_eq!(held, 0, "{version:?}: buffers kept after the exchange");
        }
    }

    /// A stream waiting for its peer holds no buffer of its own, after a request and its answer
    /// (rustls's own connection kept a 4 KiB read buffer for the connection's life).
    #[tokio::test]
    async fn a_stream_waiting_for_its_peer_holds_no_buffer() {
        let (mut server, mut client) = pair(&rustls::version::TLS13, b"h2").await;
        assert_eq!(server.conn.alpn_protocol(), Some(&b"h2"[..]));
        assert!(server.peer_certificates().is_none());
        client.write_all(&[7u8; 20_000]).await.unwrap();
        client.flush().await.unwrap();
        let mut got = vec![0u8; 20_000];
        server.read_exact(&mut got).await.unwrap();
        assert!(got.iter().all(|b| *b == 7));
        server.write_all(b"answer").await.unwrap();
        server.flush().await.unwrap();
        let mut answer = [0u8; 6];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"answer");
        let mut buf = [0u8; 64];
        let waited = tokio::time::timeout(Duration::from_millis(100), server.read(&mut buf)).await;
        assert!(waited.is_err(), "nothing was sent: {waited:?}");
        assert_eq!(server.buffered_capacity(), 0);
        // And still served after the wait.
        client.write_all(b"more").await.unwrap();
        client.flush().await.unwrap();
        let n = server.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"more");
    }

    /// A record sent in part holds the server's buffer at about the record's size while the
    /// rest is awaited, not at twice it (a buffer that grows by doubling).
    #[tokio::test]
    async fn a_record_sent_in_part_holds_about_its_own_size() {
        let (mut server, mut client) = pair(&rustls::version::TLS13, b"http/1.1").await;
        // Beneath the client's TLS: a record header for the largest record a peer may send,
        // then all of it but its last byte, in pieces.
        let tcp = &mut client.get_mut().0;
        tcp.write_all(&[0x17, 0x03, 0x03, 0x47, 0xff])
            .await
            .unwrap();
        for piece in 0..9 {
            let len = if piece == 8 { 2046 } else { 2048 };
            tcp.write_all(&[0u8; 2048][..len]).await.unwrap();
            tcp.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
            let mut buf = [0u8; 64];
            let waited =
                tokio::time::timeout(Duration::from_millis(20), server.read(&mut buf)).await;
            assert!(waited.is_err(), "part of a record is not data: {waited:?}");
        }
        let held = server.buffered_capacity();
        assert!(
            (18_435..=READ_SIZE + MORE_READ).contains(&held),
            "{held} bytes held for 18,435 bytes of a record"
        );
    }

    /// The client side (the legacy server's connections over `https`): a request and its
    /// answer over TLS 1.3 and 1.2, then a stream waiting for its server holds no buffer, and
    /// the server's close_notify reads as the end.
    #[tokio::test]
    async fn a_client_stream_waiting_for_its_server_holds_no_buffer() {
        for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
            let (cert, key) = self_signed();
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(server_config(&cert, &key));
            let server = tokio::spawn(async move {
                let (tcp, _) = listener.accept().await.unwrap();
                let mut s = acceptor.accept(tcp).await.expect("server handshake");
                let mut request = vec![0u8; 30_000];
                s.read_exact(&mut request).await.unwrap();
                s.write_all(&[9u8; 25_000]).await.unwrap();
                s.flush().await.unwrap();
                // The client waits; then the server closes.
                tokio::time::sleep(Duration::from_millis(300)).await;
                s.shutdown().await.unwrap();
            });
            let tcp = TcpStream::connect(addr).await.unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            let mut client =
                ClientStream::connect(tcp, client_config(&cert, version, b"http/1.1"), name)
                    .await
                    .expect("client handshake");
            client.write_all(&[1u8; 30_000]).await.unwrap();
            client.flush().await.unwrap();
            let mut answer = vec![0u8; 25_000];
            client.read_exact(&mut answer).await.unwrap();
            assert!(answer.iter().all(|b| *b == 9), "{version:?}");
            let mut buf = [0u8; 64];
            let waited =
                tokio::time::timeout(Duration::from_millis(100), client.read(&mut buf)).await;
            assert!(waited.is_err(), "{version:?}: nothing was sent: {waited:?}");
            assert_eq!(client.buffered_capacity(), 0, "{version:?}");
            let end = tokio::time::timeout(Duration::from_secs(10), client.read(&mut buf))
                .await
                .expect("the server's close came");
            assert_eq!(end.unwrap(), 0, "{version:?}: a clean end");
            server.await.unwrap();
        }
    }

    /// A client that updates its keys (and asks the server to update its own) is read across
    /// the update, and reads what the server writes after it: the server's own key update
    /// must reach the client before that data.
    #[tokio::test]
    async fn data_flows_both_ways_across_a_key_update() {
        let (mut server, mut client) = pair(&rustls::version::TLS13, b"http/1.1").await;
        for round in 0..3u8 {
            client.get_mut().1.refresh_traffic_keys().unwrap();
            client.write_all(&[round; 3_000]).await.unwrap();
            client.flush().await.unwrap();
            let mut got = vec![0u8; 3_000];
            server.read_exact(&mut got).await.unwrap();
            assert!(got.iter().all(|b| *b == round), "round {round}");
            server.write_all(&[round + 100; 5_000]).await.unwrap();
            server.flush().await.unwrap();
            let mut back = vec![0u8; 5_000];
            tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut back))
                .await
                .expect("the answer came")
                .unwrap();
            assert!(back.iter().all(|b| *b == round + 100), "round {round}");
        }
    }

    /// The handshake and the data that follows, trickled to the server a few bytes at a time
    /// (each piece its own TCP segment), arrive whole: every read finds part of a record, or
    /// part of a handshake message, and what rustls has not used must be kept in order.
    #[tokio::test]
    async fn a_client_trickled_a_few_bytes_at_a_time_is_read_whole() {
        let (addr, cert, server) = serve_one(|accepted| async move {
            let mut s = accepted.expect("server handshake");
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.expect("server read");
            s.write_all(&(got.len() as u64).to_be_bytes())
                .await
                .unwrap();
            s.shutdown().await.unwrap();
            got
        })
        .await;
        // A relay between the client and the server that passes the client's bytes on in
        // pieces of 1 to 13 bytes, and the server's as they come.
        let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_addr = relay.local_addr().unwrap();
        tokio::spawn(async move {
            let (from_client, _) = relay.accept().await.unwrap();
            let to_server = TcpStream::connect(addr).await.unwrap();
            to_server.set_nodelay(true).unwrap();
            let (mut client_rd, mut client_wr) = from_client.into_split();
            let (mut server_rd, mut server_wr) = to_server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_rd, &mut client_wr).await;
                let _ = client_wr.shutdown().await;
            });
            let mut buf = [0u8; 4096];
            let mut piece = 1usize;
            loop {
                let n = client_rd.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    let _ = server_wr.shutdown().await;
                    return;
                }
                for part in buf[..n].chunks(piece) {
                    server_wr.write_all(part).await.unwrap();
                    piece = piece % 13 + 1;
                    tokio::task::yield_now().await;
                }
            }
        });
        let tcp = TcpStream::connect(relay_addr).await.unwrap();
        let mut client = connector(&cert, &rustls::version::TLS13, b"http/1.1")
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .expect("client handshake through the relay");
        let sent: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8).collect();
        client.write_all(&sent).await.unwrap();
        client.shutdown().await.unwrap();
        let count = read_to_end_in_time(&mut client).await.unwrap();
        assert_eq!(count, (sent.len() as u64).to_be_bytes());
        let got = server.await.unwrap();
        assert!(
            got == sent,
            "the server read {} bytes, not what was sent",
            got.len()
        );
    }

    /// Plain HTTP sent to the TLS listener fails the handshake at once.
    #[tokio::test]
    async fn plain_http_fails_the_handshake() {
        let (addr, _, server) = serve_one(|accepted| async move { accepted.map(|_| ()) }).await;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let res = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the handshake failed in time")
            .unwrap();
        assert_eq!(res.unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    /// A handshake message that claims more than a peer may send is refused before the
    /// server has kept more than its bound of it: the client is cut off long before it has
    /// sent all it meant to.
    #[tokio::test]
    async fn an_endless_handshake_message_is_cut_off_within_the_bound() {
        let (addr, _, server) = serve_one(|accepted| async move { accepted.map(|_| ()) }).await;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        // A ClientHello whose header claims 16 MiB, then handshake records of 16 KiB.
        let mut first = vec![0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0xff, 0xff, 0xff];
        first.resize(5 + 0x4000, 0);
        let mut record = vec![0x16, 0x03, 0x01, 0x40, 0x00];
        record.resize(5 + 0x4000, 0);
        // 10 MiB: more than the loopback socket's buffers hold, so that a server that kept
        // reading would take it all, and a server that refused closes the socket under it.
        let mut sent = 0usize;
        let mut cut_off = false;
        for i in 0..640 {
            let chunk = if i == 0 { &first } else { &record };
            if tcp.write_all(chunk).await.is_err() {
                cut_off = true;
                break;
            }
            sent += chunk.len();
        }
        let res = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the handshake failed in time")
            .unwrap();
        let err = res.expect_err("a 16 MiB ClientHello was accepted");
        eprintln!("refused with: {err}; the client sent {sent} bytes before the cut");
        assert!(cut_off, "the server took all {sent} bytes");
    }
}
