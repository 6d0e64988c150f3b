//! A round-robin HTTP proxy on loopback (port 0): each request goes to the next backend in
//! turn, so consecutive requests of one client land on different replicas. Bodies stream both
//! ways (SSE included). Every request is logged with the backend that served it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// One proxied request.
#[derive(Debug, Clone)]
pub struct Hit {
    /// Index into the backends.
    pub backend: usize,
    /// The `Mcp-Session-Id` the client sent.
    pub session: Option<String>,
}

pub struct RoundRobin {
    pub addr: SocketAddr,
    hits: Arc<Mutex<Vec<Hit>>>,
    stop: CancellationToken,
}

impl RoundRobin {
    /// Proxies to `backends` (`host:port`), starting with the first.
    pub async fn start(backends: Vec<String>) -> RoundRobin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let client: Client<HttpConnector, Incoming> =
            Client::builder(TokioExecutor::new()).build_http();
        let next = Arc::new(AtomicUsize::new(0));
        let backends = Arc::new(backends);
        let (log, until) = (hits.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    _ = until.cancelled() => return,
                    a = listener.accept() => a.unwrap(),
                };
                let (client, next, backends, log) =
                    (client.clone(), next.clone(), backends.clone(), log.clone());
                let svc = service_fn(move |req: Request<Incoming>| {
                    let backend = next.fetch_add(1, Ordering::SeqCst) % backends.len();
                    log.lock().unwrap().push(Hit {
                        backend,
                        session: req
                            .headers()
                            .get("mcp-session-id")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string),
                    });
                    let target = format!(
                        "http://{}{}",
                        backends[backend],
                        req.uri().path_and_query().map_or("/", |p| p.as_str())
                    );
                    let client = client.clone();
                    async move {
                        let (mut parts, body) = req.into_parts();
                        parts.uri = target.parse().unwrap();
                        parts.headers.remove("host");
                        parts.headers.remove("connection");
                        let resp = match client.request(Request::from_parts(parts, body)).await {
                            Ok(r) => r.map(http_body_util::Either::Left),
                            Err(_) => {
                                let mut r = Response::new(http_body_util::Either::Right(
                                    http_body_util::Empty::new(),
                                ));
                                *r.status_mut() = StatusCode::BAD_GATEWAY;
                                r
                            }
                        };
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        RoundRobin { addr, hits, stop }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
