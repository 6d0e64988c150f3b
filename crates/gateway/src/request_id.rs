//! The id of one modern request and the fields its log lines carry.
//!
//! A request's [`RequestContext`] (its id, the instance id, and what the engine learns of the
//! call: `call_target`, `round`, `path`, `parked`) travels with the request as a task-local,
//! set by the front for the request's task and carried into the tasks that work for it
//! ([`RequestId::carry`]). Every log line written inside it names the request
//! (`telemetry::lines` reads the context), and the code that turns an upstream failure into a
//! client error names the id in the error, without every layer passing it down.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

tokio::task_local! {
    // `None` inside [`RequestId::carry`] of work that belongs to no request.
    static CURRENT: Option<Arc<RequestContext>>;
}

/// A random id: 8 bytes, hex (request ids, and replica ids when none is configured).
pub fn random_id() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS random source failed");
    let mut id = String::with_capacity(16);
    for x in b {
        id.push(char::from(HEX[usize::from(x >> 4)]));
        id.push(char::from(HEX[usize::from(x & 0xf)]));
    }
    id
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
        CURRENT
            .try_with(|c| c.as_ref().map(|c| c.id.clone()))
            .ok()
            .flatten()
    }

    /// `f` as part of the current request, if there is one (for work spawned on its behalf).
    ///
    /// Not an `async fn` (nor is [`RequestContext::scope`]): an async wrapper would keep `f`
    /// twice in its state, once as its argument and once inside the scope it awaits, and the
    /// futures these wrap are the largest of a call.
    pub fn carry<F: Future>(f: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(RequestContext::current(), f)
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

/// What the engine records about a call while serving it (each `None` until recorded).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The tool or prompt name, or the resource URI.
    pub call_target: Option<Box<str>>,
    /// The MRTR round the request serves (1 for a first call).
    pub round: Option<u32>,
    /// How its legacy call began: `fresh`, `resumed`, `replayed`, `following`.
    pub path: Option<&'static str>,
    /// Whether the round ended with the legacy call parked here.
    pub parked: Option<bool>,
}

/// One request as its log lines name it.
#[derive(Debug)]
pub struct RequestContext {
    id: RequestId,
    instance_id: Arc<str>,
    recorded: Mutex<Recorded>,
}

impl RequestContext {
    pub fn new(id: RequestId, instance_id: Arc<str>) -> Arc<RequestContext> {
        Arc::new(RequestContext {
            id,
            instance_id,
            recorded: Mutex::new(Recorded::default()),
        })
    }

    pub fn id(&self) -> &RequestId {
        &self.id
    }

    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// A copy of what was recorded so far.
    #[cfg(test)]
    fn recorded(&self) -> Recorded {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        // A panic while recording leaves plain data behind: still fit to log.
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `f` as part of this request.
    pub fn scope<F: Future>(self: Arc<Self>, f: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(Some(self), f)
    }

    /// Runs `f` (synchronous) as part of this request: for code that ends a request outside
    /// its task, such as the last frame of a streamed response.
    pub fn in_scope<R>(self: &Arc<Self>, f: impl FnOnce() -> R) -> R {
        CURRENT.sync_scope(Some(Arc::clone(self)), f)
    }

    /// The context of the request this task serves, if any.
    pub fn current() -> Option<Arc<RequestContext>> {
        CURRENT.try_with(Option::clone).ok().flatten()
    }

    /// Calls `f` with the current request's context and what it recorded, if there is one,
    /// without copying either (the log line formatter).
    pub fn with_current<R>(f: impl FnOnce(&RequestContext, &Recorded) -> R) -> Option<R> {
        CURRENT
            .try_with(|cx| cx.as_deref().map(|cx| f(cx, &cx.lock())))
            .ok()
            .flatten()
    }

    /// Records into the current request's context, if there is one.
    pub fn record(f: impl FnOnce(&mut Recorded)) {
        let _ = CURRENT.try_with(|cx| cx.as_deref().map(|cx| f(&mut cx.lock())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_id_is_seen_inside_its_scope_and_in_carried_tasks_only() {
        assert_eq!(RequestId::current(), None);
        let id = RequestId::new();
        let seen = RequestContext::new(id.clone(), "i1".into())
            .scope(async {
                let inside = RequestId::current();
                let spawned = tokio::spawn(RequestId::carry(async { RequestId::current() }));
                let not_carried = tokio::spawn(async { RequestId::current() });
                (inside, spawned.await.unwrap(), not_carried.await.unwrap())
            })
            .await;
        assert_eq!(seen, (Some(id.clone()), Some(id), None));
    }

    #[tokio::test]
    async fn records_from_carried_work_reach_the_request_and_nothing_else() {
        let cx = RequestContext::new(RequestId::new(), "i1".into());
        let other = RequestContext::new(RequestId::new(), "i1".into());
        cx.clone()
            .scope(async {
                tokio::spawn(RequestId::carry(async {
                    RequestContext::record(|r| r.round = Some(3));
                }))
                .await
                .unwrap();
                RequestContext::record(|r| r.path = Some("fresh"));
            })
            .await;
        // Outside any request, a record goes nowhere.
        RequestContext::record(|r| r.parked = Some(true));
        assert_eq!(cx.recorded().round, Some(3));
        assert_eq!(cx.recorded().path, Some("fresh"));
        assert_eq!(cx.recorded().parked, None);
        assert_eq!(other.recorded(), Recorded::default());
        // A synchronous end of the request (a streamed answer's last frame) sees it too.
        let seen = cx.in_scope(|| RequestContext::with_current(|c, r| (c.id().clone(), r.round)));
        assert_eq!(seen, Some((cx.id().clone(), Some(3))));
        assert!(RequestContext::with_current(|_, _| ()).is_none());
    }

    #[test]
    fn ids_are_sixteen_lowercase_hex_digits() {
        let id = random_id();
        assert_eq!(id.len(), 16);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_ne!(random_id(), id);
    }
}
