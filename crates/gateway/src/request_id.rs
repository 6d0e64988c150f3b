//! The id of one modern request: in its tracing span (every log line of the request carries
//! it), and in the error a client gets when something failed that only the logs explain.
//!
//! The id travels with the request as a task-local, set by the front for the request's task and
//! carried into the task that does the work ([`RequestId::carry`]), so the code that turns an
//! upstream failure into a client error can name it without every layer passing it down.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    static CURRENT: RequestId;
}

/// A random id: 8 bytes, hex (request ids, and replica ids when none is configured).
pub fn random_id() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS random source failed");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(Arc<str>);

impl RequestId {
    /// A fresh random id: 8 bytes, hex.
    pub fn new() -> RequestId {
        RequestId(random_id().into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id of the request being served by this task, if any.
    pub fn current() -> Option<RequestId> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// Runs `f` as part of this request.
    pub async fn scope<F: Future>(self, f: F) -> F::Output {
        CURRENT.scope(self, f).await
    }

    /// `f` as part of the current request, if there is one (for work spawned on its behalf).
    pub fn carry<F: Future>(f: F) -> impl Future<Output = F::Output> {
        let current = Self::current();
        async move {
            match current {
                Some(id) => CURRENT.scope(id, f).await,
                None => f.await,
            }
        }
    }
}

impl Default for RequestId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_id_is_seen_inside_its_scope_and_in_carried_tasks_only() {
        assert_eq!(RequestId::current(), None);
        let id = RequestId::new();
        let seen = id
            .clone()
            .scope(async {
                let inside = RequestId::current();
                let spawned = tokio::spawn(RequestId::carry(async { RequestId::current() }));
                let not_carried = tokio::spawn(async { RequestId::current() });
                (inside, spawned.await.unwrap(), not_carried.await.unwrap())
            })
            .await;
        assert_eq!(seen, (Some(id.clone()), Some(id), None));
    }
}
