//! Building HTTP responses: JSON bodies, SSE streams, and errors with JSON-RPC bodies.
//!
//! A request starts as a plain JSON exchange and switches to SSE only when there is
//! something to stream before the result (progress, logs). The work is polled in the request's
//! task while the answer is plain JSON, and moves into a task of its own once it streams or the
//! request is dropped; the response (or its streaming body) holds a guard whose drop cancels
//! that work, so a client that goes away cancels the legacy call.

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::error_map;
use crate::error::{Rejection, RejectionKind};
use crate::mrtr::engine::Sink;
use mrtr_wire::jsonrpc;

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

pub fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = status;
    r
}

pub fn json(status: StatusCode, v: &impl serde::Serialize) -> Response<Body> {
    let mut r = Response::new(full(
        serde_json::to_vec(v).expect("JSON-RPC messages serialize"),
    ));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// An error response, as the front's table answers `rej`: its status, headers, and a JSON-RPC
/// error body.
pub fn rejection(id: Option<&Value>, rej: &Rejection) -> Response<Body> {
    let answer = error_map::answer(rej);
    let mut r = json(answer.status, &jsonrpc::error_response(id, &answer.error));
    for (name, value) in answer.headers {
        r.headers_mut().append(name, value);
    }
    r
}

/// One SSE `message` event carrying `msg`.
pub fn sse_event(msg: &impl serde::Serialize) -> Bytes {
    let mut buf = Vec::with_capacity(128);
    buf.extend_from_slice(b"event: message\ndata: ");
    serde_json::to_writer(&mut buf, msg).expect("JSON-RPC messages serialize");
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}

fn sse_frame(event: Bytes) -> Result<Frame<Bytes>, Infallible> {
    Ok(Frame::data(event))
}

/// A `200 text/event-stream` response around `body`, neither cached nor buffered by proxies.
pub fn sse_response(body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// The final JSON-RPC message of a request, as an SSE event.
fn final_event(id: &Value, outcome: &Result<Value, Rejection>) -> Bytes {
    match outcome {
        Ok(result) => sse_event(&jsonrpc::OutgoingResult::new(id, result)),
        Err(rej) => sse_event(&jsonrpc::error_response(
            Some(id),
            &error_map::error_object(rej),
        )),
    }
}

fn join_failure() -> Rejection {
    Rejection::new(
        RejectionKind::InternalPanic,
        "the gateway failed while serving this request",
    )
}

/// The request's work while it answers with plain JSON: polled in the request's own task, so
/// a call that streams nothing crosses no task of its own. If the request is dropped before
/// the work ends (the client went away), what is left of the work moves into a task and runs
/// on, as it would have in a task from the start: the cancellation reaches it there and it
/// cleans up (cancels the legacy call, settles its claim). A panic in it ends the request with
/// the internal error, as a panicking task did.
struct Inline<F: Future<Output = Result<Value, Rejection>> + Send + 'static> {
    work: Option<std::pin::Pin<Box<F>>>,
}

impl<F: Future<Output = Result<Value, Rejection>> + Send + 'static> Inline<F> {
    /// The work, still running, to go on in a task of its own.
    fn into_task(mut self) -> tokio::task::JoinHandle<Result<Value, Rejection>> {
        let work = self.work.take().expect("the work is still running");
        tokio::spawn(work)
    }
}

impl<F: Future<Output = Result<Value, Rejection>> + Send + 'static> Future for Inline<F> {
    type Output = Result<Value, Rejection>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let work = self.work.as_mut().expect("polled after it ended");
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.as_mut().poll(cx)));
        match polled {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(outcome)) => {
                self.work = None;
                std::task::Poll::Ready(outcome)
            }
            Err(_) => {
                self.work = None;
                std::task::Poll::Ready(Err(join_failure()))
            }
        }
    }
}

impl<F: Future<Output = Result<Value, Rejection>> + Send + 'static> Drop for Inline<F> {
    fn drop(&mut self) {
        if let Some(work) = self.work.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(work);
        }
    }
}

/// How a streamed answer learns its outcome: from the work's task, or already known (the work
/// ended in the poll that emitted its first notifications).
enum Ending {
    Task(tokio::task::JoinHandle<Result<Value, Rejection>>),
    Done(Result<Value, Rejection>),
}

/// Runs `work` and answers with JSON, or with SSE once `work` emits a notification first.
/// `on_done` sees the outcome once (for metrics), whichever way it is delivered, and always
/// in the request's context (a streamed answer ends outside the request's task).
pub async fn run<W, Fut>(
    id: Value,
    accepts_sse: bool,
    work: W,
    on_done: impl FnOnce(&Result<Value, Rejection>) + Send + 'static,
) -> Response<Body>
where
    W: FnOnce(Sink, CancellationToken) -> Fut,
    Fut: Future<Output = Result<Value, Rejection>> + Send + 'static,
{
    let cancel = CancellationToken::new();
    let guard = cancel.clone().drop_guard();
    let (tx, mut rx) = mpsc::channel::<Value>(64);
    let sink = Sink::new(accepts_sse.then_some(tx));
    // The work is still part of this request (its failures name the request id). Declared
    // after `guard`, so dropped before it: what is left of the work is in a task by the time
    // the guard cancels it.
    let mut work = Inline {
        work: Some(Box::pin(crate::request_id::RequestId::carry(work(
            sink, cancel,
        )))),
    };

    let (first, ending) = tokio::select! {
        biased;
        n = rx.recv(), if accepts_sse => (n, None),
        outcome = &mut work => match rx.try_recv() {
            // The work emitted notifications and ended in the same poll (its stream's events
            // arrived together): they go out before the outcome, as if it had yielded between.
            Ok(first) if accepts_sse => (Some(first), Some(Ending::Done(outcome))),
            _ => {
                on_done(&outcome);
                return match outcome {
                    Ok(result) => {
                        json(StatusCode::OK, &jsonrpc::OutgoingResult::new(&id, &result))
                    }
                    Err(rej) => rejection(Some(&id), &rej),
                };
            }
        },
    };
    let Some(first) = first else {
        // The work ended without streaming anything (its sink is gone): plain JSON.
        let outcome = (&mut work).await;
        on_done(&outcome);
        return match outcome {
            Ok(result) => json(StatusCode::OK, &jsonrpc::OutgoingResult::new(&id, &result)),
            Err(rej) => rejection(Some(&id), &rej),
        };
    };
    // Streaming from here: the work goes on in a task of its own, so it does not wait on how
    // fast the client reads the stream (the stream's channel holds what it has not read).
    let ending = ending.unwrap_or_else(|| Ending::Task(work.into_task()));

    struct StreamState<D> {
        first: Option<Value>,
        rx: mpsc::Receiver<Value>,
        ending: Option<Ending>,
        id: Value,
        on_done: Option<D>,
        /// The request's context, for `on_done`: the body is polled outside its task.
        cx: Option<std::sync::Arc<crate::request_id::RequestContext>>,
        _guard: DropGuard,
    }
    let state = StreamState {
        first: Some(first),
        rx,
        ending: Some(ending),
        id,
        on_done: Some(on_done),
        cx: crate::request_id::RequestContext::current(),
        _guard: guard,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        if let Some(f) = st.first.take() {
            return Some((sse_frame(sse_event(&f)), st));
        }
        if let Some(n) = st.rx.recv().await {
            return Some((sse_frame(sse_event(&n)), st));
        }
        let outcome = match st.ending.take()? {
            Ending::Task(task) => task.await.unwrap_or_else(|_| Err(join_failure())),
            Ending::Done(outcome) => outcome,
        };
        if let Some(done) = st.on_done.take() {
            match &st.cx {
                Some(cx) => cx.in_scope(|| done(&outcome)),
                None => done(&outcome),
            }
        }
        let frame = sse_frame(final_event(&st.id, &outcome));
        Some((frame, st))
    });
    sse_response(BodyExt::boxed_unsync(StreamBody::new(stream)))
}

/// A body that keeps `guard` alive until the body is dropped (its last byte sent, or the
/// client gone): request slots and per-connection activity counters live that long.
struct Guarded {
    inner: Body,
    _guard: Box<dyn Send>,
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Ties `guard`'s lifetime to the response body.
pub fn with_guard(resp: Response<Body>, guard: impl Send + 'static) -> Response<Body> {
    resp.map(|inner| {
        Guarded {
            inner,
            _guard: Box::new(guard),
        }
        .boxed_unsync()
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::BodyExt;

    use super::*;

    async fn body_json(r: Response<Body>) -> Value {
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn a_panicking_work_ends_the_request_with_the_internal_error() {
        let done = std::sync::Arc::new(std::sync::Mutex::new(None));
        let seen = done.clone();
        let r = run(
            Value::from(7),
            false,
            |_sink, _cancel| async {
                tokio::task::yield_now().await;
                panic!("a bug in the work")
            },
            move |outcome| {
                *seen.lock().unwrap() = Some(outcome.as_ref().err().map(Rejection::reason));
            },
        )
        .await;
        let row = error_map::row(RejectionKind::InternalPanic);
        assert_eq!(r.status(), row.status);
        let body = body_json(r).await;
        assert_eq!(body["id"], 7);
        assert_eq!(body["error"]["code"], row.code);
        assert_eq!(*done.lock().unwrap(), Some(Some("internal_panic")));
    }

    #[tokio::test]
    async fn work_left_by_a_dropped_request_runs_on_and_sees_the_cancellation() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let request = run(
            Value::from(1),
            false,
            |_sink, cancel| async move {
                cancel.cancelled().await;
                // Cleanup after the cancellation still runs.
                tokio::task::yield_now().await;
                let _ = tx.send("cleaned up");
                Err(Rejection::new(RejectionKind::InternalPanic, "cancelled"))
            },
            |_| {},
        );
        // The request is dropped while its work waits (the client went away).
        assert!(
            tokio::time::timeout(Duration::from_millis(50), request)
                .await
                .is_err()
        );
        let cleaned = tokio::time::timeout(Duration::from_secs(5), rx).await;
        assert_eq!(cleaned.unwrap().unwrap(), "cleaned up");
    }
}
