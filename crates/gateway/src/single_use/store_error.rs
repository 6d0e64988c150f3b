//! Why a claim could not be made, and how each failure reaches the client.
//!
//! The store fails closed: whenever it cannot say for sure that an id is unclaimed, the call
//! is refused rather than run, because running it might run it twice. Store failures are the
//! gateway's fault (`Fault::Internal`) and answered with HTTP 503, which tells a client (and
//! any proxy in between) that retrying the same request later is safe: nothing was executed.
//! One refusal is the caller's doing: a principal over its share of the memory store
//! (`single_use.max_entries_per_principal`) gets HTTP 429 (`Fault::Client`).

use std::time::Duration;

use crate::error::{Rejection, RejectionKind};

/// A single-use store failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The memory store holds `max_entries` live ids, or Redis refused a write for lack of
    /// memory. No live claim is ever evicted to make room.
    #[error("the single-use store is full")]
    Full {
        /// A hint for `Retry-After`: when room is likely to appear.
        retry_after: Duration,
    },
    /// The caller's principal already holds `single_use.max_entries_per_principal` ids in the
    /// memory store; others are unaffected.
    #[error("this caller holds its limit of {limit} single-use entries")]
    PrincipalQuota {
        limit: usize,
        /// A hint for `Retry-After`: when its entries are next swept.
        retry_after: Duration,
    },
    /// The caller holds ids already and only the ids kept for callers holding none are left
    /// (`quotas.newcomer_reserve`), memory store; callers new to the store are still served.
    #[error("only the {reserve} single-use entries kept for new callers are left")]
    NewcomerReserve {
        reserve: usize,
        /// A hint for `Retry-After`: when entries are next swept.
        retry_after: Duration,
    },
    /// The store could not be reached or answered with an error.
    #[error("the single-use store is unavailable: {0}")]
    Unavailable(String),
    /// The store did not answer within the configured command timeout.
    #[error("the single-use store did not answer within {0:?}")]
    Timeout(Duration),
    /// The id is not one the gateway mints (a bug in the caller, never client input).
    #[error("the claim id is not 1-64 characters of A-Z a-z 0-9 _ -")]
    InvalidId,
}

impl StoreError {
    /// The `reason` label of `single_use_errors_total`.
    pub fn metric_reason(&self) -> &'static str {
        match self {
            StoreError::Full { .. } => "full",
            StoreError::PrincipalQuota { .. } => "principal_quota",
            StoreError::NewcomerReserve { .. } => "newcomer_reserve",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Timeout(_) => "timeout",
            StoreError::InvalidId => "invalid_id",
        }
    }

    /// Whether a write that failed this way may still have been applied (the command was
    /// sent, its answer never came): the caller then cannot tell what the store holds.
    pub fn may_have_landed(&self) -> bool {
        matches!(self, StoreError::Timeout(_) | StoreError::Unavailable(_))
    }
}

impl From<StoreError> for Rejection {
    fn from(e: StoreError) -> Rejection {
        match e {
            StoreError::Full { retry_after } => Rejection::new(
                RejectionKind::SingleUseFull { retry_after },
                "the gateway's replay guard is at capacity, so the call was refused without \
                 running it; retry later",
            ),
            StoreError::PrincipalQuota { limit, retry_after } => Rejection::new(
                RejectionKind::SingleUsePrincipalQuota { retry_after },
                format!(
                    "this caller already holds {limit} retries in the gateway's replay guard \
                     (single_use.max_entries_per_principal); nothing was run. Retry later, \
                     once earlier ones have expired"
                ),
            ),
            StoreError::NewcomerReserve {
                reserve,
                retry_after,
            } => Rejection::new(
                RejectionKind::SingleUsePrincipalQuota { retry_after },
                format!(
                    "the gateway's replay guard is nearly full and its last {reserve} entries are \
                     kept for callers holding none (quotas.newcomer_reserve); this caller holds \
                     some already, so nothing was run. Retry later, once earlier ones have expired"
                ),
            ),
            StoreError::Unavailable(_) | StoreError::Timeout(_) => Rejection::new(
                RejectionKind::SingleUseUnavailable,
                "the gateway's replay guard is unavailable, so the call was refused without \
                 running it rather than risk running it twice; retry later",
            ),
            StoreError::InvalidId => Rejection::new(
                RejectionKind::SingleUseInvalidId,
                "the gateway could not check whether this requestState was already used",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Fault;
    use crate::front::error_map::{Answer, answer};
    use http::StatusCode;
    use mrtr_wire::jsonrpc::codes;

    fn retry_after(a: &Answer) -> Option<&str> {
        a.headers
            .iter()
            .find(|(n, _)| n == http::header::RETRY_AFTER)
            .map(|(_, v)| v.to_str().unwrap())
    }

    #[test]
    fn full_is_503_with_retry_after() {
        let rej = Rejection::from(StoreError::Full {
            retry_after: Duration::from_millis(4500),
        });
        let r = answer(&rej);
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(rej.reason(), "single_use_full");
        assert_eq!(rej.fault(), Fault::Internal);
        assert_eq!(r.error.code, codes::INTERNAL_ERROR);
        assert_eq!(retry_after(&r), Some("5"));
        let r = answer(&Rejection::from(StoreError::Full {
            retry_after: Duration::from_millis(10),
        }));
        assert_eq!(retry_after(&r), Some("1"));
        let r = answer(&Rejection::from(StoreError::Full {
            retry_after: Duration::from_secs(3),
        }));
        assert_eq!(retry_after(&r), Some("3"));
    }

    #[test]
    fn a_principal_over_its_quota_is_a_429_and_its_own_fault() {
        let rej = Rejection::from(StoreError::PrincipalQuota {
            limit: 7,
            retry_after: Duration::from_millis(1500),
        });
        let r = answer(&rej);
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(rej.fault(), Fault::Client);
        assert_eq!(rej.reason(), "single_use_principal_quota");
        assert!(r.error.message.contains("max_entries_per_principal"));
        assert!(r.error.message.contains("7"));
        assert_eq!(retry_after(&r), Some("2"));
    }

    #[test]
    fn a_holder_refused_the_newcomers_reserve_is_a_429_and_its_own_fault() {
        let e = StoreError::NewcomerReserve {
            reserve: 3,
            retry_after: Duration::from_secs(5),
        };
        assert_eq!(e.metric_reason(), "newcomer_reserve");
        assert!(!e.may_have_landed());
        let rej = Rejection::from(e);
        let r = answer(&rej);
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(rej.fault(), Fault::Client);
        assert!(r.error.message.contains("quotas.newcomer_reserve"));
    }

    #[test]
    fn unreachable_and_slow_stores_fail_closed_with_503() {
        for e in [
            StoreError::Unavailable("connection refused".into()),
            StoreError::Timeout(Duration::from_millis(500)),
        ] {
            let rej = Rejection::from(e);
            let r = answer(&rej);
            assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(rej.reason(), "single_use_unavailable");
            assert!(r.error.message.contains("replay guard is unavailable"));
            assert!(r.error.message.contains("refused"));
            // The operator detail (addresses, Redis errors) stays out of the client's view.
            assert!(!r.error.message.contains("connection refused"));
        }
    }
}
