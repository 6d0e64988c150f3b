//! Admission on the request path: the request slot a request holds while it is served, and
//! the caller key the front's per-principal quotas count under.
//!
//! **Request slots** (`listen.max_concurrent_requests`) bound the requests the gateway serves
//! at once. A request takes its slot only once it is real: after authentication and after its
//! whole body arrived (within `listen.body_read_timeout`). A client that sends headers and
//! then stalls therefore holds a connection (bounded by the connection caps and the body
//! deadline), never a slot. The slot is held until the response body is done — except for
//! long-lived responses (listen streams, passed-through legacy GET streams), which give it
//! back as soon as their stream starts: they are bounded by their own caps and per-principal
//! quotas ([`super::long_lived`]), and would otherwise let a few callers fill the slots for
//! hours. The `active_requests` gauge counts slots in use.
//!
//! **Callers.** Per-caller quotas count against a [`crate::caller_scope::Caller`]: the
//! principal, or for anonymous callers the principal and the source address (IPv6 per /64, as
//! for the connection caps), so one anonymous caller cannot exhaust a quota for everyone.

use http::Response;
use tokio::sync::OwnedSemaphorePermit;

use super::deps::Front;
use super::long_lived::is_long_lived;
use super::respond::{self, Body};
use crate::error::{Rejection, RejectionKind};
use crate::metrics::{Held, Limit};

/// A request slot; dropping it frees the slot.
pub struct RequestSlot {
    _permit: OwnedSemaphorePermit,
    /// Counts the slot in `active_requests` while it is held.
    _counted: Held,
}

/// A slot for a request that is now known to be real, or 503 + `Retry-After` when
/// `listen.max_concurrent_requests` are being served (the gateway is full, not this caller).
pub fn take_slot(front: &Front) -> Result<RequestSlot, Rejection> {
    let Some(permit) = front.request_slots.try_take() else {
        front.limits.hit(Limit::MaxConcurrentRequests);
        return Err(Rejection::new(
            RejectionKind::Overloaded,
            format!(
                "the gateway is serving its limit of {} requests (listen.max_concurrent_requests); retry shortly",
                front.config().listen.max_concurrent_requests
            ),
        ));
    };
    Ok(RequestSlot {
        _permit: permit,
        _counted: front.metrics.slot_taken(),
    })
}

/// `response`, holding `slot` until its body is done; a long-lived response frees the slot
/// now.
pub fn hold_until_done(response: Response<Body>, slot: RequestSlot) -> Response<Body> {
    if is_long_lived(&response) {
        drop(slot);
        response
    } else {
        respond::with_guard(response, slot)
    }
}
