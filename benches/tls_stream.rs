//! The front's TLS stream against tokio-rustls's, side by side in one process.
//!
//! The gateway serves front TLS with its own stream over rustls's unbuffered connection
//! (`tls::stream`), so that a quiet connection holds no buffer. This measures what that
//! costs per exchange against tokio-rustls (which the front used before) on the same
//! machine, in alternated rounds: `--clients` connections over loopback each send a 700-byte
//! request and read a 400-byte answer, `--exchanges` times, and the process's CPU time per
//! exchange (clients included, the same for both) is reported for each server, with the
//! ratio. A second part times full handshakes.
//!
//! `--idle N` measures the client side instead (the gateway's connections to an `https`
//! legacy server): N connections, each after one exchange, held idle by tokio-rustls's client
//! and by the gateway's `ClientStream`, each count in a fresh process, alternated, the server
//! side the same for both; the growth of VmRSS per connection is printed for each.
//!
//! ```sh
//! cargo bench --bench tls_stream                       # 32 clients, 2,000 exchanges each, 5 rounds
//! cargo bench --bench tls_stream -- --clients 8 --exchanges 5000 --rounds 3
//! cargo bench --bench tls_stream -- --idle 2000 --rounds 3
//! ```

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Instant;

use mrtr_gateway::tls::stream::{ClientStream, ServerStream};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The shipped binary's allocator (`src/main.rs`), so allocation costs are the ones it pays.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const REQUEST: usize = 700;
const ANSWER: usize = 400;

#[derive(Clone, Copy, PartialEq)]
enum Server {
    Gateway,
    TokioRustls,
}

impl Server {
    fn label(self) -> &'static str {
        match self {
            Server::Gateway => "gateway stream",
            Server::TokioRustls => "tokio-rustls",
        }
    }
}

/// The CPU time the process's live threads have had so far, in seconds: the sum of each
/// thread's scheduler run time (nanoseconds, `/proc/self/task/*/schedstat`), finer than the
/// clock ticks of `/proc/self/stat`. The runtime's threads live for the whole run.
fn cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let mut ns = 0u64;
    for task in tasks.flatten() {
        let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    ns as f64 / 1e9
}

fn configs() -> (
    Arc<rustls::ServerConfig>,
    tokio_rustls::TlsConnector,
    Arc<rustls::ClientConfig>,
) {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let cert: CertificateDer<'static> = cert.der().clone();
    let key: PrivateKeyDer<'static> = PrivatePkcs8KeyDer::from(key.serialize_der()).into();
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    let client = Arc::new(client);
    (
        Arc::new(server),
        tokio_rustls::TlsConnector::from(client.clone()),
        client,
    )
}

/// Answers each request of `REQUEST` bytes with `ANSWER` bytes, reading as hyper does (into a
/// larger buffer, whatever has come).
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
    let mut buf = vec![0u8; 8192];
    let answer = [b'a'; ANSWER];
    let mut have = 0;
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => have += n,
        }
        while have >= REQUEST {
            have -= REQUEST;
            if s.write_all(&answer).await.is_err() || s.flush().await.is_err() {
                return;
            }
        }
    }
}

/// Serves every connection of `listener` with `server`'s stream.
fn serve(listener: TcpListener, server: Server, config: Arc<rustls::ServerConfig>) {
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let _ = tcp.set_nodelay(true);
            let config = config.clone();
            tokio::spawn(async move {
                match server {
                    Server::Gateway => {
                        if let Ok(s) = ServerStream::accept(tcp, config).await {
                            answer(s).await;
                        }
                    }
                    Server::TokioRustls => {
                        let acceptor = tokio_rustls::TlsAcceptor::from(config);
                        if let Ok(s) = acceptor.accept(tcp).await {
                            answer(s).await;
                        }
                    }
                }
            });
        }
    });
}

async fn connect(
    addr: std::net::SocketAddr,
    connector: &tokio_rustls::TlsConnector,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// CPU seconds and wall seconds for `clients` connections doing `exchanges` each.
async fn exchanges(
    addr: std::net::SocketAddr,
    connector: &tokio_rustls::TlsConnector,
    clients: usize,
    exchanges: usize,
) -> (f64, f64) {
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(connect(addr, connector).await);
    }
    let cpu = cpu_seconds();
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let request = [b'r'; REQUEST];
                let mut got = [0u8; ANSWER];
                for _ in 0..exchanges {
                    c.write_all(&request).await.unwrap();
                    c.flush().await.unwrap();
                    c.read_exact(&mut got).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (cpu_seconds() - cpu, start.elapsed().as_secs_f64())
}

/// CPU seconds for `n` handshakes, one after another, each closed after one exchange.
async fn handshakes(
    addr: std::net::SocketAddr,
    connector: &tokio_rustls::TlsConnector,
    n: usize,
) -> f64 {
    let cpu = cpu_seconds();
    for _ in 0..n {
        let mut c = connect(addr, connector).await;
        c.write_all(&[b'r'; REQUEST]).await.unwrap();
        let mut got = [0u8; ANSWER];
        c.read_exact(&mut got).await.unwrap();
    }
    cpu_seconds() - cpu
}

/// The process's resident memory now, in bytes.
fn vm_rss() -> u64 {
    mrtr_testkit::proc::status_kib(std::process::id(), "VmRSS").unwrap_or(0) * 1024
}

/// One exchange on `c`, which then stays open.
async fn one_exchange<C: AsyncRead + AsyncWrite + Unpin>(mut c: C) -> C {
    c.write_all(&[b'r'; REQUEST]).await.unwrap();
    c.flush().await.unwrap();
    let mut got = [0u8; ANSWER];
    c.read_exact(&mut got).await.unwrap();
    c
}

/// The growth of VmRSS per connection with `n` idle client connections to `addr` (served by
/// the gateway's stream), opened by the gateway's `ClientStream` or by tokio-rustls's client.
async fn idle_clients(
    addr: std::net::SocketAddr,
    n: usize,
    gateway: bool,
    connector: &tokio_rustls::TlsConnector,
    client: &Arc<rustls::ClientConfig>,
) -> f64 {
    let before = vm_rss();
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for _ in 0..n {
        if gateway {
            let tcp = TcpStream::connect(addr).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            let s = ClientStream::connect(tcp, client.clone(), name)
                .await
                .unwrap();
            ours.push(one_exchange(s).await);
        } else {
            theirs.push(one_exchange(connect(addr, connector).await).await);
        }
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let grown = vm_rss().saturating_sub(before) as f64 / n as f64;
    drop(ours);
    drop(theirs);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    grown
}

/// `--idle`: each measurement in a process of its own (memory freed by one round would
/// otherwise be reused by the next, and its growth read as nothing), alternated.
fn idle_rounds(n: usize, rounds: usize) {
    let exe = std::env::current_exe().expect("the bench's own path");
    let measure = |which: &str| -> f64 {
        let out = std::process::Command::new(&exe)
            .args(["--idle", &n.to_string(), "--idle-child", which])
            .output()
            .expect("the bench runs itself");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(f64::NAN)
    };
    println!(
        "{n} idle client connections (one exchange each), each count in a fresh process, the \
         server side the gateway's stream for both; VmRSS growth per connection, both sides:"
    );
    for round in 1..=rounds {
        let theirs = measure("tokio-rustls");
        let ours = measure("gateway");
        println!(
            "round {round}: tokio-rustls client {theirs:.0} bytes, gateway ClientStream {ours:.0} \
             bytes (difference {:.0})",
            theirs - ours
        );
    }
}

/// The value after `name` on the command line.
fn arg_str<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).map(String::as_str)
}

fn arg(args: &[String], name: &str, default: usize) -> usize {
    arg_str(args, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let clients = arg(&args, "--clients", 32);
    let per_client = arg(&args, "--exchanges", 2_000);
    let rounds = arg(&args, "--rounds", 5);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let idle = arg(&args, "--idle", 0);
    let idle_child = arg_str(&args, "--idle-child").map(str::to_string);
    if idle > 0 && idle_child.is_none() {
        idle_rounds(idle, rounds);
        return;
    }
    runtime.block_on(async move {
        let (config, connector, client) = configs();
        if let Some(which) = idle_child {
            // One measurement in a fresh process (see `idle_rounds`).
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            serve(listener, Server::Gateway, config.clone());
            // Warm-up: the allocator's and the runtime's first growth.
            idle_clients(addr, idle / 10 + 1, which == "gateway", &connector, &client).await;
            let grown = idle_clients(addr, idle, which == "gateway", &connector, &client).await;
            println!("{grown:.0}");
            return;
        }
        let mut addrs = Vec::new();
        for server in [Server::Gateway, Server::TokioRustls] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            addrs.push((server, listener.local_addr().unwrap()));
            serve(listener, server, config.clone());
        }
        // Warm-up: both paths, allocator and caches.
        for (_, addr) in &addrs {
            exchanges(*addr, &connector, clients, per_client / 10 + 1).await;
        }
        println!(
            "{clients} clients × {per_client} exchanges ({REQUEST} B request, {ANSWER} B answer), \
             {rounds} alternated rounds; CPU is the whole process's (clients included)"
        );
        println!("round  server           µs CPU/exchange  exchanges/s");
        let mut per = [Vec::new(), Vec::new()];
        for round in 1..=rounds {
            for (i, (server, addr)) in addrs.iter().enumerate() {
                let (cpu, wall) = exchanges(*addr, &connector, clients, per_client).await;
                let n = (clients * per_client) as f64;
                per[i].push(cpu / n * 1e6);
                println!(
                    "{round:>5}  {:<15}  {:>15.2}  {:>11.0}",
                    server.label(),
                    cpu / n * 1e6,
                    n / wall
                );
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (g, t) = (median(&mut per[0]), median(&mut per[1]));
        println!(
            "median µs CPU per exchange: gateway stream {g:.2}, tokio-rustls {t:.2} (ratio {:.3})",
            g / t
        );
        let n = 1_000;
        let mut hs = [Vec::new(), Vec::new()];
        for _ in 0..rounds {
            for (i, (_, addr)) in addrs.iter().enumerate() {
                hs[i].push(handshakes(*addr, &connector, n).await / n as f64 * 1e6);
            }
        }
        let (g, t) = (median(&mut hs[0]), median(&mut hs[1]));
        println!(
            "median µs CPU per handshake (both sides, {n} per round): gateway stream {g:.0}, \
             tokio-rustls {t:.0} (ratio {:.3})",
            g / t
        );
    });
}
