//! How a run starts: a session (warm or new) that offers the method, the request's log
//! level, the roots refresh a reused session may need, then the call — on one fresh session
//! if the server forgot the first.

use serde_json::{Value, json};

use super::call::LegacyParams;
use super::deps::Engine;
use super::run::{Call, Handled, Mode, Question, Run};
use crate::error::{Rejection, RejectionKind};
use crate::legacy::http::HttpError;
use crate::legacy::pool::{Lease, PoolKey};
use crate::legacy::roots_refresh::{self, Observed};
use crate::legacy::session::SessionError;
use crate::metrics::RootsRefresh;
use crate::upstream_error::session_rejection;
use mrtr_wire::capabilities::Declared;
use mrtr_wire::protocol::methods::required_server_capability;

/// How a run began.
pub enum Start<'g> {
    /// The call is on its way.
    Sent(Box<Run<'g>>),
    /// Before the call went out, the reused session's server asked for roots that this
    /// request's client must give (see [`crate::legacy::roots_refresh`]): that is the round's
    /// question. The call was never sent and the session is closed, so nothing is parked.
    Asked {
        question: Question,
        /// The identity of the server that asked.
        server_info: Value,
    },
}

/// The call id of a run whose call has not been sent yet.
pub(super) const NO_CALL: i64 = i64::MIN;

/// Why a run could not start.
pub struct StartError {
    pub rejection: Rejection,
    /// Whether the call may have reached the legacy server (then it may have run).
    pub call_sent: bool,
}

/// Why the roots refresh before a call failed.
enum Refresh {
    Session(SessionError),
    /// The server's `roots/list` could not be answered (a bad answer in the book).
    Refused(Rejection),
    /// The server's `roots/list` was refused (the policy, or a request the call may not make):
    /// the server still holds the earlier client's roots, so this session must not serve the
    /// call.
    Stale,
}

/// What the roots refresh before a call leaves to do.
enum AfterRefresh<'g> {
    Send(Box<Run<'g>>),
    /// Start again on a fresh session.
    Retry,
    Done(Result<Start<'g>, StartError>),
}

impl<'g> Run<'g> {
    /// Takes a session declaring `declared` (a warm one, or a new one), checks that its server
    /// offers the method, makes a reused session ask for this client's roots when it may hold
    /// an earlier client's (MRTR methods only; the server's `roots/list` is handled as `mode`
    /// handles any server request), and sends the call — on one fresh session if the server
    /// forgot the first before the call arrived. On failure, says whether the call may have
    /// reached the legacy server.
    pub async fn start(
        engine: &'g Engine,
        call: &Call,
        declared: &Declared,
        mode: &mut Mode<'_>,
    ) -> Result<Start<'g>, StartError> {
        let params = LegacyParams(&call.params);
        let pool_key = PoolKey::new(&call.scope(), declared);
        let not_sent = |rejection| StartError {
            rejection,
            call_sent: false,
        };
        for attempt in 0..2 {
            let mut run = Run::lease(engine, &pool_key, declared, call, attempt)
                .await
                .map_err(not_sent)?;
            // Routing: the method must be offered by the session that would serve it — this
            // caller's own — not by whatever another caller's session once answered.
            if !run.offers(&call.method) {
                // Boxed: rare, and as large as the rest of the start.
                Box::pin(run.finish()).await;
                return Err(not_sent(Rejection::method_not_found(&call.method)));
            }
            // Both boxed, and only entered when they have something to do: each is larger
            // than the rest of a start, and most calls need neither.
            if let Some(level) = run.log_level_to_set(call) {
                Box::pin(run.set_log_level(level)).await;
            }
            let refreshed = if run.refreshes_roots(declared, mode) {
                Box::pin(run.refresh_roots(call, mode)).await
            } else {
                Ok(None)
            };
            let mut run = match run.after_refresh(refreshed, attempt).await {
                AfterRefresh::Send(run) => *run,
                AfterRefresh::Retry => continue,
                AfterRefresh::Done(outcome) => return outcome,
            };
            match run.session_mut().request(&call.method, Some(&params)).await {
                Ok(call_id) => {
                    run.call_id = call_id;
                    return Ok(Start::Sent(Box::new(run)));
                }
                Err(SessionError::Expired) if attempt == 0 => {
                    tracing::info!("legacy session expired before the call; re-initializing once");
                    run.discard_expired();
                }
                Err(e) => {
                    run.close().await;
                    // A refused connection never carried the call; anything later might have.
                    let call_sent = !matches!(
                        e,
                        SessionError::Http(HttpError::Connect(_) | HttpError::Tls { .. })
                    );
                    return Err(StartError {
                        rejection: session_rejection(&e),
                        call_sent,
                    });
                }
            }
        }
        Err(not_sent(Rejection::new(
            RejectionKind::UpstreamSessionExpired,
            "the legacy server expired two fresh sessions in a row",
        )))
    }

    /// A session for attempt `attempt` of a call: a warm one first; after a 404, always a
    /// fresh one.
    async fn lease(
        engine: &'g Engine,
        pool_key: &PoolKey,
        declared: &Declared,
        call: &Call,
        attempt: u32,
    ) -> Result<Run<'g>, Rejection> {
        let lease = if attempt == 0 {
            engine
                .sessions
                .checkout(pool_key, declared, call.upstream_headers.clone())
                .await?
        } else {
            Lease::fresh(
                engine
                    .sessions
                    .open(declared, call.upstream_headers.clone())
                    .await?,
            )
        };
        Ok(Run {
            engine,
            pool_key: pool_key.clone(),
            roots_asked: lease.roots_asked,
            exchange: Some(lease.exchange),
            call_id: NO_CALL,
        })
    }

    /// Whether this session's server offers `method` (its capability in `initialize`).
    fn offers(&self, method: &str) -> bool {
        required_server_capability(method).is_none_or(|cap| {
            self.init_result()
                .get("capabilities")
                .and_then(|c| c.get(cap))
                .is_some()
        })
    }

    /// A per-call session's level is this request's `logLevel`, when the server logs.
    fn log_level_to_set<'c>(&self, call: &'c Call) -> Option<&'c str> {
        let level = call.meta.log_level.as_deref()?;
        self.init_result()
            .pointer("/capabilities/logging")
            .is_some()
            .then_some(level)
    }

    async fn set_log_level(&mut self, level: &str) {
        let _ = self
            .session_mut()
            .request("logging/setLevel", Some(&json!({"level": level})))
            .await;
    }

    /// What the roots refresh before the call decided: send the call on this session, try a
    /// fresh one (attempt 0 only), or end the start here.
    async fn after_refresh(
        mut self,
        refreshed: Result<Option<Question>, Refresh>,
        attempt: u32,
    ) -> AfterRefresh<'g> {
        let not_sent = |rejection| {
            AfterRefresh::Done(Err(StartError {
                rejection,
                call_sent: false,
            }))
        };
        match refreshed {
            Ok(None) => AfterRefresh::Send(Box::new(self)),
            Ok(Some(question)) => {
                let server_info = crate::translate::server_info(Some(self.init_result())).clone();
                self.close().await;
                AfterRefresh::Done(Ok(Start::Asked {
                    question,
                    server_info,
                }))
            }
            Err(Refresh::Session(SessionError::Expired)) if attempt == 0 => {
                tracing::info!("legacy session expired before the call; re-initializing once");
                self.discard_expired();
                AfterRefresh::Retry
            }
            Err(Refresh::Session(e)) => {
                self.close().await;
                not_sent(session_rejection(&e))
            }
            Err(Refresh::Refused(rejection)) => {
                self.close().await;
                not_sent(rejection)
            }
            Err(Refresh::Stale) if attempt == 0 => {
                // The server kept the earlier client's roots: serve this call on a fresh
                // session, which has none.
                tracing::info!(
                    "a reused legacy session's roots/list was refused; the call goes to a fresh session"
                );
                self.close().await;
                AfterRefresh::Retry
            }
            Err(Refresh::Stale) => {
                self.close().await;
                not_sent(Rejection::new(
                    RejectionKind::UpstreamProtocolError,
                    "a fresh legacy session still needed its roots refreshed",
                ))
            }
        }
    }

    /// Whether this call's start refreshes the session's roots (below).
    fn refreshes_roots(&self, declared: &Declared, mode: &Mode<'_>) -> bool {
        self.roots_asked && declared.roots && matches!(mode, Mode::Mrtr { .. })
    }

    /// Before the call of an MRTR request declaring roots, on a reused session whose server
    /// has asked an earlier client for roots: `notifications/roots/list_changed`, then (unless
    /// this upstream was learned to ignore it) a bounded wait for the server's `roots/list`,
    /// which is answered from the answers book or becomes this request's question.
    async fn refresh_roots(
        &mut self,
        call: &Call,
        mode: &mut Mode<'_>,
    ) -> Result<Option<Question>, Refresh> {
        let cfg = self.engine.config();
        let memory = self.engine.sessions.pool().roots_memory();
        let probes = cfg.pool.roots_refresh_probes;
        let wait = if memory.should_wait(probes) {
            cfg.pool.roots_refresh_wait
        } else {
            std::time::Duration::ZERO
        };
        let asked = roots_refresh::notify_and_wait(self.exchange_mut(), wait)
            .await
            .map_err(Refresh::Session)?;
        let counted = &self.engine.metrics;
        let Some(msg) = asked else {
            if wait.is_zero() {
                counted.roots_refresh(RootsRefresh::NotWaited);
            } else {
                counted.roots_refresh(RootsRefresh::Timeout);
                if memory.record(Observed::Timeout, probes) {
                    tracing::info!(
                        waits = probes,
                        "the legacy server never asked for roots again after notifications/roots/list_changed; \
                         no longer waiting for it on reused sessions (until the next reload). If it caches \
                         roots per session, use pool.mode = \"per-call\""
                    );
                }
            }
            return Ok(None);
        };
        counted.roots_refresh(RootsRefresh::Reasked);
        memory.record(Observed::Reasked, probes);
        match self
            .on_server_request(call, &msg, mode)
            .await
            .map_err(Refresh::Refused)?
        {
            Handled::Answered => Ok(None),
            Handled::Asked(question) => Ok(Some(question)),
            Handled::Refused => Err(Refresh::Stale),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::future_size;

    #[test]
    fn a_calls_start_and_capture_keep_their_rare_steps_boxed() {
        // Every call's execution is boxed with these inside it. A roots refresh (only for a
        // reused session of a roots-declaring client) awaited inline sat beside the run in
        // the start's state: 3,480 bytes against 2,808 (release build). A server request's
        // handling (only when the server asks something) inline made the capture 2,832
        // against 1,248.
        let start = future_size::returned4(Run::start);
        let refresh = future_size::returned3(Run::refresh_roots);
        let beside = std::mem::size_of::<Run>() + std::mem::size_of::<PoolKey>();
        assert!(
            start < refresh + beside,
            "a start is {start} bytes; a roots refresh {refresh}"
        );
        let capture = future_size::returned7(Run::capture);
        let server_request = future_size::returned4(Run::on_server_request);
        assert!(
            capture < server_request,
            "a capture is {capture} bytes; a server request's handling {server_request}"
        );
    }
}
