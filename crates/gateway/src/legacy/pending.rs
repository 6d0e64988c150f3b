//! The requests of ours a single-stream transport (stdio, HTTP+SSE) is waiting on.
//!
//! Streamable HTTP gives every request its own response stream, whose end says "this call is
//! over". stdio and HTTP+SSE have one stream for everything, so the session keeps the book
//! itself: which ids are in flight and for which method, where each response goes (the
//! session's channel as `Call(id)`, or a one-shot reply for `initialize`), and, once the
//! stream is gone, the reason, which every request in flight then ends with.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use super::session::{Delivery, Inbound, StreamTag, deliver};
use super::wire::response_id;

/// Where a response goes when it is not for the channel.
pub type Reply = oneshot::Sender<Result<Value, String>>;

struct Waiter {
    method: String,
    reply: Option<Reply>,
}

#[derive(Default)]
struct Book {
    pending: HashMap<i64, Waiter>,
    gone: Option<String>,
    last_request: Option<Instant>,
}

#[derive(Default)]
pub struct PendingCalls {
    book: Mutex<Book>,
    /// Signalled when a request is registered (a watchdog re-arms its idle clock).
    pub sent: Notify,
}

impl PendingCalls {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records request `id` before it is sent. `Err` (the reason) once the stream is gone.
    pub fn register(&self, id: i64, method: &str, reply: Option<Reply>) -> Result<(), String> {
        let mut book = self.book();
        if let Some(what) = &book.gone {
            return Err(what.clone());
        }
        book.pending.insert(
            id,
            Waiter {
                method: method.to_string(),
                reply,
            },
        );
        book.last_request = Some(Instant::now());
        drop(book);
        self.sent.notify_one();
        Ok(())
    }

    /// Stops waiting for `id` (it failed to go out, or was cancelled).
    pub fn forget(&self, id: i64) {
        self.book().pending.remove(&id);
    }

    /// Why the stream is gone, once it is.
    pub fn gone(&self) -> Option<String> {
        self.book().gone.clone()
    }

    /// When the newest request in flight went out; `None` when nothing is in flight.
    pub fn busy_since(&self) -> Option<Instant> {
        let book = self.book();
        if book.pending.is_empty() {
            None
        } else {
            book.last_request
        }
    }

    /// The method of some request in flight (for messages).
    pub fn some_method(&self) -> Option<String> {
        let book = self.book();
        book.pending
            .iter()
            .min_by_key(|(id, _)| **id)
            .map(|(_, w)| w.method.clone())
    }

    /// Delivers one message: a response to a request in flight goes to its waiter (or the
    /// channel as `Call(id)`), server requests and notifications to the channel as `Get`,
    /// a response to nothing in flight (a cancelled request) is dropped. What is left to
    /// await is the channel's, and only when it is full (see [`deliver`]).
    pub fn route<'a>(&self, msg: Value, tx: &'a mpsc::Sender<Inbound>) -> Delivery<'a> {
        let Some(id) = response_id(&msg) else {
            return deliver(tx, Inbound::message(StreamTag::Get, msg));
        };
        let waiter = self.book().pending.remove(&id);
        match waiter {
            Some(Waiter {
                reply: Some(reply), ..
            }) => {
                let _ = reply.send(Ok(msg));
                Delivery::Done(Ok(()))
            }
            Some(_) => deliver(tx, Inbound::message(StreamTag::Call(id), msg)),
            None => {
                tracing::debug!(id, "dropping a legacy response to no pending request");
                Delivery::Done(Ok(()))
            }
        }
    }

    /// Marks the stream gone and ends every request in flight with "`what` during
    /// `method``detail`", then the `Get` stream with `what` (`None`: a clean close, which
    /// `closed` describes).
    pub async fn fail_all(
        &self,
        what: Option<String>,
        detail: &str,
        closed: &str,
        tx: &mpsc::Sender<Inbound>,
    ) {
        let mut drained: Vec<(i64, Waiter)> = {
            let mut book = self.book();
            book.gone.get_or_insert_with(|| match &what {
                Some(w) => format!("{w}{detail}"),
                None => closed.to_string(),
            });
            book.pending.drain().collect()
        };
        drained.sort_by_key(|(id, _)| *id);
        let base = what.as_deref().unwrap_or(closed);
        for (id, waiter) in drained {
            let message = format!("{base} during {}{detail}", waiter.method);
            match waiter.reply {
                Some(reply) => {
                    let _ = reply.send(Err(message));
                }
                None => {
                    let _ = deliver(tx, Inbound::ended(StreamTag::Call(id), Some(message))).await;
                }
            }
        }
        let end = Inbound::ended(StreamTag::Get, what.map(|w| format!("{w}{detail}")));
        let _ = deliver(tx, end).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn responses_go_to_their_waiters_and_the_end_reaches_everyone_left() {
        let book = PendingCalls::default();
        let (tx, mut rx) = mpsc::channel(16);
        let (reply, answered) = oneshot::channel();
        book.register(0, "initialize", Some(reply)).unwrap();
        book.register(1, "tools/call", None).unwrap();
        book.register(2, "prompts/get", None).unwrap();
        let routed = book.route(json!({"jsonrpc": "2.0", "id": 0, "result": {}}), &tx);
        assert_eq!(routed.await, Ok(()));
        assert!(answered.await.unwrap().is_ok());
        // A server request with the same id as ours is not our response.
        let request = json!({"jsonrpc": "2.0", "id": 1, "method": "roots/list"});
        assert_eq!(book.route(request, &tx).await, Ok(()));
        assert!(matches!(
            rx.recv().await,
            Some(Inbound::Message(StreamTag::Get, _))
        ));
        let routed = book.route(json!({"jsonrpc": "2.0", "id": 1, "result": {}}), &tx);
        assert_eq!(routed.await, Ok(()));
        assert!(matches!(
            rx.recv().await,
            Some(Inbound::Message(StreamTag::Call(1), _))
        ));
        book.fail_all(Some("it died".into()), " (why)", "closed", &tx)
            .await;
        match rx.recv().await {
            Some(Inbound::Ended(end)) => {
                assert_eq!(end.stream, StreamTag::Call(2));
                assert_eq!(
                    end.error.as_deref(),
                    Some("it died during prompts/get (why)")
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            rx.recv().await,
            Some(Inbound::Ended(end)) if end.stream == StreamTag::Get
        ));
        assert_eq!(
            book.register(3, "tools/call", None),
            Err("it died (why)".into())
        );
    }
}
