//! A loopback HTTP server (port 0) that serves a JWKS document and counts how often it is
//! fetched. Responses can be held back until the test releases them, to line up concurrent
//! requests behind one fetch or to make a fetch time out.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::Semaphore;

struct Shared {
    body: Mutex<String>,
    status: Mutex<http::StatusCode>,
    fetches: AtomicUsize,
    hold: AtomicBool,
    release: Semaphore,
}

pub(crate) struct JwksServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl JwksServer {
    pub(crate) async fn start(body: String) -> JwksServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            body: Mutex::new(body),
            status: Mutex::new(http::StatusCode::OK),
            fetches: AtomicUsize::new(0),
            hold: AtomicBool::new(false),
            release: Semaphore::new(0),
        });
        let s = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let s = Arc::clone(&s);
                tokio::spawn(async move {
                    let service = service_fn(move |_req| {
                        let s = Arc::clone(&s);
                        async move {
                            s.fetches.fetch_add(1, Ordering::SeqCst);
                            if s.hold.load(Ordering::SeqCst) {
                                s.release.acquire().await.unwrap().forget();
                            }
                            let body = s.body.lock().unwrap().clone();
                            let status = *s.status.lock().unwrap();
                            let resp = http::Response::builder()
                                .status(status)
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(body)))
                                .unwrap();
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        JwksServer { addr, shared, task }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/jwks.json", self.addr)
    }

    /// Requests received so far (counted on arrival, before any hold).
    pub(crate) fn fetches(&self) -> usize {
        self.shared.fetches.load(Ordering::SeqCst)
    }

    pub(crate) fn set_body(&self, body: String) {
        *self.shared.body.lock().unwrap() = body;
    }

    pub(crate) fn set_status(&self, status: http::StatusCode) {
        *self.shared.status.lock().unwrap() = status;
    }

    /// From now on, each response waits for one [`Self::release`].
    pub(crate) fn hold_responses(&self) {
        self.shared.hold.store(true, Ordering::SeqCst);
    }

    pub(crate) fn release(&self, responses: usize) {
        self.shared.release.add_permits(responses);
    }

    /// Waits (bounded) until `cond` holds, checking between short pauses.
    pub(crate) async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for: {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A JWKS document holding the given JWKs.
pub(crate) fn jwks(keys: &[&serde_json::Value]) -> String {
    serde_json::json!({ "keys": keys }).to_string()
}
