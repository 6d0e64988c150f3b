//! The parking lot: blocked legacy calls kept alive until their retry comes back.
//!
//! When the engine ends a request with `input_required`, it may park the legacy call instead
//! of cancelling it: the session, its streams and the server requests still waiting for
//! answers. A retry that reaches this replica while the call is parked takes it back out
//! ([`ParkingLot::take`], once) and answers the waiting requests — the tool body is not run
//! again. Everything the legacy server sends meanwhile is buffered (up to
//! `parking.max_buffered_bytes`); a parked call whose stream ends, whose buffer overflows, or
//! whose `parking.ttl` passes is cancelled upstream (`notifications/cancelled` + session end)
//! and dropped. Limits: `parking.max_calls` in all, divided between callers (the principal;
//! for anonymous callers, the source address too) as [`crate::fair_share::FairShare`] says:
//! `parking.max_per_principal` per caller from its first parked call (unset, a quarter of the
//! lot), the last few places kept for callers holding none (`quotas.newcomer_reserve`), and,
//! for stdio sessions, `upstream.stdio_max_children` less
//! `parking.stdio_reserved_children`: a parked stdio call keeps its child process, and without
//! that reserve a few parked calls (even of one caller) would hold every child, so that no
//! fresh call could start until `parking.ttl` passed. When a limit is reached new calls are
//! simply not parked (their retry replays; `park-only` calls fail: 429 when it is the
//! caller's quota, 503 when the lot or the children are full).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::input_key::KeyMinter;
use super::run::Question;
use crate::caller_scope::Caller;
use crate::error::{Rejection, RejectionKind};
use crate::fair_share::{FairShare, ShareRefusal};
use crate::legacy::exchange::Reader;
use crate::legacy::session::{Inbound, LegacySession, StreamTag};
use crate::metrics::{Limit, ParkingMetrics};

/// What a parked call needs to resume.
pub struct ParkedCall {
    pub session: LegacySession,
    pub call_id: i64,
    /// Questions the legacy server is blocked on, with their server-request ids.
    pub waiting: Vec<Question>,
    pub minter: KeyMinter,
    /// The request `method` and its target name, for logs.
    pub what: String,
    /// Where the session goes after the resumed call completes cleanly.
    pub pool_key: crate::legacy::pool::PoolKey,
    /// The server has asked this session for roots (see `legacy::roots_refresh`).
    pub roots_asked: bool,
}

/// A call taken back out of the lot, with everything that arrived while it was parked (the
/// reader's backlog).
pub struct Resumed {
    pub call: ParkedCall,
    pub reader: Reader,
}

/// Why a parked call left the lot without being resumed (metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    Expired,
    Overflow,
    StreamEnded,
    Shutdown,
}

impl Eviction {
    pub fn as_str(self) -> &'static str {
        match self {
            Eviction::Expired => "expired",
            Eviction::Overflow => "overflow",
            Eviction::StreamEnded => "stream_ended",
            Eviction::Shutdown => "shutdown",
        }
    }
}

/// How the buffering task stopped.
enum Watch {
    /// Asked to stop (resume or eviction).
    Stopped,
    Broken(Eviction),
}

/// The limits a call is parked under (from `[parking]` and `[upstream]`).
#[derive(Debug, Clone, Copy)]
pub struct ParkLimits {
    pub ttl: Duration,
    /// `parking.max_calls` and how it is divided between callers.
    pub share: FairShare,
    pub max_buffered_bytes: usize,
    /// Stdio sessions that may be parked at once: `upstream.stdio_max_children` less
    /// `parking.stdio_reserved_children`.
    pub max_stdio: usize,
}

/// Which limit kept a call out of the lot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkRefusal {
    /// `parking.max_calls` are parked.
    Full,
    /// This principal holds `parking.max_per_principal`.
    PrincipalQuota,
    /// This principal holds parked calls and only the places kept for callers holding none
    /// are left (`quotas.newcomer_reserve`).
    NewcomerReserve,
    /// Parking this stdio call would leave fewer than `parking.stdio_reserved_children`
    /// children for fresh calls.
    StdioReserve,
}

impl ParkRefusal {
    /// The limit that was hit (`limit_hits_total`).
    pub fn limit(self) -> Limit {
        match self {
            ParkRefusal::Full => Limit::ParkingFull,
            ParkRefusal::PrincipalQuota => Limit::ParkingPerPrincipal,
            ParkRefusal::NewcomerReserve => Limit::ParkingNewcomerReserve,
            ParkRefusal::StdioReserve => Limit::ParkingStdioReserve,
        }
    }

    /// The answer to a `park-only` call that could not be parked (`what` names the call):
    /// the caller's own quota, or the gateway full.
    pub fn park_only_rejection(self, what: &str) -> Rejection {
        match self {
            ParkRefusal::Full => Rejection::new(
                RejectionKind::ParkingFull,
                format!(
                    "{what} is park-only and the parking lot is full (parking.max_calls); \
                     the call was cancelled rather than left to re-execute on retry"
                ),
            ),
            ParkRefusal::PrincipalQuota => Rejection::new(
                RejectionKind::ParkingQuota,
                format!(
                    "{what} is park-only and you already hold parking.max_per_principal parked calls; \
                     the call was cancelled rather than left to re-execute on retry: finish or abandon one first"
                ),
            ),
            ParkRefusal::NewcomerReserve => Rejection::new(
                RejectionKind::ParkingQuota,
                format!(
                    "{what} is park-only and the parking lot's last places are kept for callers holding none \
                     (quotas.newcomer_reserve), while you hold parked calls; the call was cancelled rather than \
                     left to re-execute on retry: finish or abandon one first"
                ),
            ),
            ParkRefusal::StdioReserve => Rejection::new(
                RejectionKind::ParkingFull,
                format!(
                    "{what} is park-only and parking it would take one of the stdio children kept for fresh calls \
                     (parking.stdio_reserved_children); the call was cancelled rather than left to re-execute on retry"
                ),
            ),
        }
    }
}

/// A call the lot did not take, given back with why.
pub struct Refused {
    pub call: ParkedCall,
    pub reader: Reader,
    pub reason: ParkRefusal,
}

struct Slot {
    call: ParkedCall,
    stdio: bool,
    /// Who may take it back.
    principal: String,
    /// Whom it counts against (`parking.max_per_principal`).
    caller: Caller,
    expires: Instant,
    stop: CancellationToken,
    watcher: tokio::task::JoinHandle<(Reader, Watch)>,
}

#[derive(Default)]
struct Inner {
    /// Boxed: the table keeps room for up to twice as many entries as it holds, and a slot
    /// is over 500 bytes.
    slots: HashMap<String, Box<Slot>>,
    per_principal: HashMap<Caller, usize>,
    /// Parked calls holding a stdio child.
    stdio: usize,
}

pub struct ParkingLot {
    inner: Mutex<Inner>,
    metrics: Arc<ParkingMetrics>,
}

/// Buffers what a parked call receives; stops on request, on overflow or when the call's
/// stream ends (the legacy server gave up or crashed).
async fn buffer(
    mut reader: Reader,
    call_id: i64,
    limit: usize,
    stop: CancellationToken,
) -> (Reader, Watch) {
    let mut bytes = 0usize;
    let watch = loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break Watch::Stopped,
            item = reader.keep_next() => match item {
                None => break Watch::Broken(Eviction::StreamEnded),
                Some(item) => {
                    if let Inbound::Message(_, m) = item {
                        bytes += m.to_string().len();
                    }
                    if matches!(&item, Inbound::Ended(end) if end.stream == StreamTag::Call(call_id)) {
                        break Watch::Broken(Eviction::StreamEnded);
                    }
                    if bytes > limit {
                        break Watch::Broken(Eviction::Overflow);
                    }
                }
            }
        }
    };
    (reader, watch)
}

impl ParkingLot {
    pub fn new(metrics: Arc<ParkingMetrics>) -> Arc<ParkingLot> {
        Arc::new(ParkingLot {
            inner: Mutex::new(Inner::default()),
            metrics,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Parks `call` for `principal` (who alone may take it back) under a fresh handle,
    /// counted against `caller`'s quota, or gives it back when a limit is reached.
    pub fn park(
        &self,
        call: ParkedCall,
        reader: Reader,
        principal: &str,
        caller: &Caller,
        limits: &ParkLimits,
    ) -> Result<String, Box<Refused>> {
        let mut inner = self.lock();
        let mine = inner.per_principal.get(caller).copied().unwrap_or(0);
        let stdio = matches!(call.session, LegacySession::Stdio(_));
        let refusal = match limits.share.admit(inner.slots.len(), mine) {
            Err(ShareRefusal::Full) => Some(ParkRefusal::Full),
            Err(ShareRefusal::CallerShare) => Some(ParkRefusal::PrincipalQuota),
            Err(ShareRefusal::Reserve) => Some(ParkRefusal::NewcomerReserve),
            Ok(()) if stdio && inner.stdio >= limits.max_stdio => Some(ParkRefusal::StdioReserve),
            Ok(()) => None,
        };
        if let Some(reason) = refusal {
            return Err(Box::new(Refused {
                call,
                reader,
                reason,
            }));
        }
        let handle = crate::state::payload::random_id();
        let stop = CancellationToken::new();
        let watcher = tokio::spawn(buffer(
            reader,
            call.call_id,
            limits.max_buffered_bytes,
            stop.clone(),
        ));
        inner.slots.insert(
            handle.clone(),
            Box::new(Slot {
                call,
                stdio,
                principal: principal.to_string(),
                caller: caller.clone(),
                expires: Instant::now() + limits.ttl,
                stop,
                watcher,
            }),
        );
        *inner.per_principal.entry(caller.clone()).or_insert(0) += 1;
        inner.stdio += usize::from(stdio);
        self.metrics.parked_now(inner.slots.len());
        Ok(handle)
    }

    fn remove(&self, handle: &str) -> Option<Box<Slot>> {
        let mut inner = self.lock();
        let slot = inner.slots.remove(handle)?;
        inner.stdio -= usize::from(slot.stdio);
        if let Some(n) = inner.per_principal.get_mut(&slot.caller) {
            *n -= 1;
            if *n == 0 {
                inner.per_principal.remove(&slot.caller);
            }
        }
        self.metrics.parked_now(inner.slots.len());
        Some(slot)
    }

    /// Takes a parked call back out for `principal`: at most once per handle. `None` when it
    /// is unknown, expired, broken, or parked for someone else.
    pub async fn take(&self, handle: &str, principal: &str) -> Option<Resumed> {
        {
            let inner = self.lock();
            let slot = inner.slots.get(handle)?;
            if slot.principal != principal {
                return None;
            }
        }
        let slot = self.remove(handle)?;
        let expired = slot.expires <= Instant::now();
        slot.stop.cancel();
        let (reader, watch) = slot.watcher.await.ok()?;
        let reason = match watch {
            Watch::Broken(r) => Some(r),
            Watch::Stopped if expired => Some(Eviction::Expired),
            Watch::Stopped => None,
        };
        match reason {
            None => Some(Resumed {
                call: slot.call,
                reader,
            }),
            Some(r) => {
                self.release(slot.call, r).await;
                None
            }
        }
    }

    /// Cancels a call upstream and ends its session.
    async fn release(&self, call: ParkedCall, why: Eviction) {
        self.metrics.evicted(why.as_str());
        tracing::info!(call = %call.what, reason = why.as_str(), "parked call released");
        let _ = call.session.cancel(call.call_id, why.as_str()).await;
        call.session.close().await;
    }

    /// Evicts expired or broken calls; returns how many left.
    pub async fn sweep(&self) -> usize {
        let now = Instant::now();
        let due: Vec<(String, Option<Eviction>)> = self
            .lock()
            .slots
            .iter()
            .filter_map(|(h, s)| {
                if s.expires <= now {
                    Some((h.clone(), Some(Eviction::Expired)))
                } else if s.watcher.is_finished() {
                    Some((h.clone(), None))
                } else {
                    None
                }
            })
            .collect();
        let mut n = 0;
        for (handle, reason) in due {
            let Some(slot) = self.remove(&handle) else {
                continue;
            };
            slot.stop.cancel();
            let why = match slot.watcher.await {
                Ok((_, Watch::Broken(r))) => r,
                _ => reason.unwrap_or(Eviction::Expired),
            };
            self.release(slot.call, why).await;
            n += 1;
        }
        n
    }

    /// Cancels every parked call (shutdown).
    pub async fn clear(&self) {
        let handles: Vec<String> = self.lock().slots.keys().cloned().collect();
        for h in handles {
            if let Some(slot) = self.remove(&h) {
                slot.stop.cancel();
                let _ = slot.watcher.await;
                self.release(slot.call, Eviction::Shutdown).await;
            }
        }
    }

    /// Sweeps every `period` until `shutdown`, then clears the lot.
    pub async fn run_sweeper(self: Arc<Self>, period: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.clear().await;
                    return;
                }
                _ = tick.tick() => {
                    self.sweep().await;
                }
            }
        }
    }
}
