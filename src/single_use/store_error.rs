//! Why a claim could not be made, and how each failure reaches the client.
//!
//! The store fails closed: whenever it cannot say for sure that an id is unclaimed, the call
//! is refused rather than run, because running it might run it twice. All of these are the
//! gateway's fault (`Fault::Internal`) and answered with HTTP 503, which tells a client (and
//! any proxy in between) that retrying the same request later is safe: nothing was executed.

use std::time::Duration;

use http::StatusCode;

use crate::error::{Fault, Rejection};
use crate::jsonrpc::codes;

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
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Timeout(_) => "timeout",
            StoreError::InvalidId => "invalid_id",
        }
    }
}

/// Whole seconds for `Retry-After`, never 0.
fn retry_after_secs(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

impl From<StoreError> for Rejection {
    fn from(e: StoreError) -> Rejection {
        match e {
            StoreError::Full { retry_after } => Rejection::new(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::INTERNAL_ERROR,
                "the gateway's replay guard is at capacity, so the call was refused without \
                 running it; retry later",
                Fault::Internal,
                "single_use_full",
            )
            .with_header(
                http::header::RETRY_AFTER,
                retry_after_secs(retry_after).to_string(),
            ),
            StoreError::Unavailable(_) | StoreError::Timeout(_) => Rejection::new(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::INTERNAL_ERROR,
                "the gateway's replay guard is unavailable, so the call was refused without \
                 running it rather than risk running it twice; retry later",
                Fault::Internal,
                "single_use_unavailable",
            )
            .with_header(http::header::RETRY_AFTER, "1"),
            StoreError::InvalidId => Rejection::internal(
                "the gateway could not check whether this requestState was already used",
                "single_use_invalid_id",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry_after(r: &Rejection) -> Option<&str> {
        r.headers
            .iter()
            .find(|(n, _)| n == http::header::RETRY_AFTER)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn full_is_503_with_retry_after() {
        let r = Rejection::from(StoreError::Full {
            retry_after: Duration::from_millis(4500),
        });
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.reason, "single_use_full");
        assert_eq!(r.fault, Fault::Internal);
        assert_eq!(r.error.code, codes::INTERNAL_ERROR);
        assert_eq!(retry_after(&r), Some("5"));
        let r = Rejection::from(StoreError::Full {
            retry_after: Duration::from_millis(10),
        });
        assert_eq!(retry_after(&r), Some("1"));
        let r = Rejection::from(StoreError::Full {
            retry_after: Duration::from_secs(3),
        });
        assert_eq!(retry_after(&r), Some("3"));
    }

    #[test]
    fn unreachable_and_slow_stores_fail_closed_with_503() {
        for e in [
            StoreError::Unavailable("connection refused".into()),
            StoreError::Timeout(Duration::from_millis(500)),
        ] {
            let r = Rejection::from(e);
            assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(r.reason, "single_use_unavailable");
            assert!(r.error.message.contains("replay guard is unavailable"));
            assert!(r.error.message.contains("refused"));
            // The operator detail (addresses, Redis errors) stays out of the client's view.
            assert!(!r.error.message.contains("connection refused"));
        }
    }
}
