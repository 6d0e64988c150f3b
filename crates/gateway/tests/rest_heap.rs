//! The heap an HTTP/1 client connection holds while it is at rest, counted by dhat's
//! allocator. This binary has its own global allocator, so it is a test target of its own.
//!
//! A rested connection keeps its task, its stream and its watch (tick, stop token, activity), and
//! nothing of hyper's. Three things it kept before this test; this test's reading (debug
//! build) was 3,808 bytes with all three, and is 1,816 without them; with one put back:
//! - the box of the hyper connection it had been taken out of, until the connection woke
//!   again: a box moved out of is freed at the end of its variable's scope, and that scope
//!   spanned the rest (2,496 bytes);
//! - hyper's HTTP/2 connection inline in the connection's future, which HTTP/1 connections
//!   then carry too, at the size of the largest state (3,112);
//! - the 512-byte buffer its waiting read was given, inline in the future (2,328).
//!
//! The same over TLS: a rested connection keeps its TLS session (rustls's state and record
//! keys, the stream boxed once) and none of the stream's buffers. Its reading (debug build)
//! is 3,834 bytes, and 7,930 when the stream keeps 4 KiB of its incoming buffer at rest, as
//! rustls's buffered connection kept its own (checked).

#![forbid(unsafe_code)]

use std::future::Future;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, Response};
use mrtr_gateway::config::{ClientAuth, TlsConfig};
use mrtr_gateway::front::connection::{self, ConnPolicy, LimitCounter};
use mrtr_gateway::front::respond::{self, Body};
use mrtr_gateway::front::tls::TlsReloader;
use mrtr_gateway::metrics::{Limit, LimitHits};
use mrtr_gateway::tls::stream::ServerStream;
use prometheus::IntGauge;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// Connections opened and closed before the first reading (the runtime's and the I/O
/// driver's first allocations come with them), then connections held at rest.
const WARM: usize = 16;
const HELD: usize = 100;

/// The heap each rested connection may hold, beyond what the test's own clients hold: 1,698
/// bytes here (debug build; 1,816 when this test was written). Each of the three things above, put back, takes it past the
/// budget (checked one by one).
const BUDGET: usize = 2_100;

/// The same for a rested TLS connection: 3,834 bytes here (debug build), 7,930 when the
/// stream keeps 4 KiB of its incoming buffer.
const TLS_BUDGET: usize = 4_500;

/// dhat counts the whole process's heap and runs one profiler at a time, so under a harness
/// that runs tests as threads of one process these two take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn ok(_req: Request<Incoming>) -> Response<Body> {
    Response::new(respond::full("ok"))
}

/// One keep-alive request on `s`, its answer read whole.
fn exchange(s: &mut (impl Read + Write)) {
    s.write_all(b"GET /mcp HTTP/1.1\r\nhost: test\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 256];
    while !got.ends_with(b"ok") {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
}

/// A blocking client socket to `addr`.
fn connect(addr: SocketAddr) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// One keep-alive request on a new blocking client socket.
fn one_request(addr: SocketAddr) -> std::net::TcpStream {
    let mut s = connect(addr);
    exchange(&mut s);
    s
}

/// A TLS client connection to `addr` after one request: its socket and its TLS state.
fn one_tls_request(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
) -> (std::net::TcpStream, rustls::ClientConnection) {
    let mut sock = connect(addr);
    let name = ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
    exchange(&mut rustls::Stream::new(&mut conn, &mut sock));
    (sock, conn)
}

/// Serves loopback connections as the gateway's listener does: each accepted socket through
/// `wrap` (a TLS handshake, or nothing), then `connection::serve` with connections resting
/// after 5 ms. Returns the address, the at-rest gauge and the token that stops it.
async fn start<W, F, I>(wrap: W) -> (SocketAddr, IntGauge, CancellationToken)
where
    W: Fn(TcpStream) -> F + Send + 'static,
    F: Future<Output = I> + Send + 'static,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let policy = ConnPolicy {
        header_read_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        http2_max_concurrent_streams: 8,
        release_idle_after: Some(Duration::from_millis(5)),
    };
    let at_rest = IntGauge::new("at_rest", "connections at rest").unwrap();
    let counter = LimitCounter {
        hits: LimitHits::none(),
        header_timeout: Limit::HeaderReadTimeout,
        idle: Limit::IdleTimeout,
        at_rest: Some(at_rest.clone()),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let accept_shutdown = shutdown.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let counter = counter.clone();
            let stop = accept_shutdown.child_token();
            // Boxed, as the listener boxes its handshake: the connection's future keeps no
            // room for it once it is done.
            let io = Box::pin(wrap(stream));
            tokio::spawn(async move {
                connection::serve(io.await, policy, &counter, stop, ok).await;
            });
        }
    });
    (addr, at_rest, shutdown)
}

/// Checks the heap the `HELD` connections added since `before` (dhat's reading then), per
/// connection, against `budget`.
fn within_budget(what: &str, before: usize, budget: usize) {
    let with = dhat::HeapStats::get().curr_bytes;
    let per_connection = with.saturating_sub(before) / HELD;
    eprintln!("heap per rested {what}: {per_connection} bytes");
    assert!(
        per_connection <= budget,
        "a rested {what} holds {per_connection} bytes of heap (budget {budget})"
    );
}

/// Waits until `gauge` reads `want` (the connections have gone to rest).
async fn settle(gauge: &IntGauge, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while gauge.get() != want {
        assert!(
            Instant::now() < deadline,
            "{} of {want} connections at rest",
            gauge.get()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The tick that rested the last one may still be finishing its turn.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_rested_http1_connection_holds_no_more_heap_than_its_budget() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let _profiler = dhat::Profiler::builder().testing().build();
    let (addr, at_rest, shutdown) = start(|stream| async move { stream }).await;

    let warm = tokio::task::spawn_blocking(move || (0..WARM).map(|_| one_request(addr)).collect())
        .await
        .unwrap();
    settle(&at_rest, WARM as i64).await;
    drop::<Vec<std::net::TcpStream>>(warm);
    settle(&at_rest, 0).await;
    // Room for the held clients' sockets, so that the vector's growth is not counted.
    let mut held: Vec<std::net::TcpStream> = Vec::with_capacity(HELD);
    let before = dhat::HeapStats::get().curr_bytes;

    held = tokio::task::spawn_blocking(move || {
        held.extend((0..HELD).map(|_| one_request(addr)));
        held
    })
    .await
    .unwrap();
    settle(&at_rest, HELD as i64).await;
    within_budget("connection", before, BUDGET);

    // Still served after the rest: the reading above was of live connections.
    tokio::task::spawn_blocking(move || {
        for s in held.iter_mut() {
            s.write_all(b"GET /mcp HTTP/1.1\r\nhost: test\r\n\r\n")
                .unwrap();
        }
        for s in held.iter_mut() {
            let mut got = Vec::new();
            let mut chunk = [0u8; 256];
            while !got.ends_with(b"ok") {
                let n = s.read(&mut chunk).unwrap();
                assert!(n > 0, "closed after the rest");
                got.extend_from_slice(&chunk[..n]);
            }
        }
    })
    .await
    .unwrap();
    shutdown.cancel();
}

/// A self-signed certificate for `localhost` in PEM files under a fresh temporary folder, as
/// the gateway's `tls.cert_file` and `tls.key_file`, and a client configuration trusting it
/// (no session resumption, so every connection makes a full handshake).
fn tls_material() -> (TlsReloader, Arc<rustls::ClientConfig>) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let dir = std::env::temp_dir().join(format!("rest-heap-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files = TlsConfig {
        cert_file: dir.join("cert.pem"),
        key_file: dir.join("key.pem"),
        client_ca_file: None,
        client_auth: ClientAuth::None,
    };
    std::fs::write(&files.cert_file, cert.pem()).unwrap();
    std::fs::write(&files.key_file, key.serialize_pem()).unwrap();
    let reloader = TlsReloader::load(&files).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let mut client = rustls::ClientConfig::builder_with_provider(mrtr_gateway::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.resumption = rustls::client::Resumption::disabled();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    (reloader, Arc::new(client))
}

/// Warm-up TLS connections: enough to fill the server's session cache (256 sessions, two
/// tickets sent per connection), whose growth would otherwise be counted.
const TLS_WARM: usize = 140;
/// Of those, kept open with their TLS state, to check after the reading that a rested TLS
/// connection still serves.
const TLS_KEPT: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_rested_tls_connection_holds_its_session_and_no_buffer() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let _profiler = dhat::Profiler::builder().testing().build();
    let (reloader, client) = tls_material();
    let (addr, at_rest, shutdown) = start(move |stream| {
        let config = reloader.config();
        async move {
            // As the listener keeps it: boxed once.
            Box::new(ServerStream::accept(stream, config).await.unwrap())
        }
    })
    .await;

    let warm_client = client.clone();
    let mut kept = tokio::task::spawn_blocking(move || {
        let mut all: Vec<_> = (0..TLS_WARM)
            .map(|_| one_tls_request(addr, &warm_client))
            .collect();
        all.split_off(TLS_WARM - TLS_KEPT)
    })
    .await
    .unwrap();
    settle(&at_rest, TLS_KEPT as i64).await;
    // The held clients keep their sockets but not their TLS state, which lives in this
    // process too and would be counted with the server's.
    let mut held: Vec<std::net::TcpStream> = Vec::with_capacity(HELD);
    let before = dhat::HeapStats::get().curr_bytes;

    held = tokio::task::spawn_blocking(move || {
        held.extend((0..HELD).map(|_| one_tls_request(addr, &client).0));
        held
    })
    .await
    .unwrap();
    settle(&at_rest, (TLS_KEPT + HELD) as i64).await;
    within_budget("TLS connection", before, TLS_BUDGET);

    // Rested TLS connections still serve, their sessions intact.
    kept = tokio::task::spawn_blocking(move || {
        for (sock, conn) in kept.iter_mut() {
            exchange(&mut rustls::Stream::new(conn, sock));
        }
        kept
    })
    .await
    .unwrap();
    drop((kept, held));
    shutdown.cancel();
}
