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
//! **Callers.** A quota keyed by principal alone would put every caller of an `auth.mode =
//! "none"` gateway (all `anonymous`) under one quota, so one of them could exhaust it for
//! everyone: anonymous callers are told apart by source address instead (IPv6 per /64, as
//! for the connection caps). Authenticated callers are their principal, whatever address they
//! come from.

use std::net::IpAddr;

use http::{Response, header};
use tokio::sync::OwnedSemaphorePermit;

use super::conn_limits::source_of;
use super::long_lived::is_long_lived;
use super::respond::{self, Body};
use crate::error::Rejection;
use crate::gateway::Gateway;

/// A request slot; dropping it frees the slot.
pub struct RequestSlot {
    _permit: OwnedSemaphorePermit,
    gauge: prometheus::IntGauge,
}

impl Drop for RequestSlot {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// A slot for a request that is now known to be real, or 503 + `Retry-After` when
/// `listen.max_concurrent_requests` are being served (the gateway is full, not this caller).
pub fn take_slot(gw: &Gateway) -> Result<RequestSlot, Rejection> {
    let Some(permit) = gw.try_request_slot() else {
        gw.metrics
            .limit_hits
            .with_label_values(&["max_concurrent_requests"])
            .inc();
        return Err(Rejection::unavailable(
            format!(
                "the gateway is serving its limit of {} requests (listen.max_concurrent_requests); retry shortly",
                gw.config().listen.max_concurrent_requests
            ),
            "overloaded",
        )
        .with_header(header::RETRY_AFTER, "1"));
    };
    gw.metrics.active_requests.inc();
    Ok(RequestSlot {
        _permit: permit,
        gauge: gw.metrics.active_requests.clone(),
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

/// Who a quota counts against: the principal, or for anonymous callers their source.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller(String);

impl Caller {
    /// `anonymous`: whether the principal stands for every unauthenticated caller
    /// (`auth.mode = "none"`).
    pub fn of(principal: &str, peer: IpAddr, anonymous: bool) -> Caller {
        if !anonymous {
            return Caller(principal.to_string());
        }
        Caller(format!("{principal}@{}", source_of(peer)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_callers_are_told_apart_by_source_and_principals_are_not() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            Caller::of("anonymous", ip("127.0.0.1"), true),
            Caller::of("anonymous", ip("::ffff:127.0.0.1"), true)
        );
        assert_ne!(
            Caller::of("anonymous", ip("127.0.0.1"), true),
            Caller::of("anonymous", ip("127.0.0.2"), true)
        );
        assert_eq!(
            Caller::of("anonymous", ip("2001:db8::1"), true),
            Caller::of("anonymous", ip("2001:db8::2"), true)
        );
        assert_eq!(
            Caller::of("iss#alice", ip("127.0.0.1"), false),
            Caller::of("iss#alice", ip("10.0.0.9"), false)
        );
        assert_eq!(
            Caller::of("iss#alice", ip("10.0.0.9"), false).as_str(),
            "iss#alice"
        );
    }
}
