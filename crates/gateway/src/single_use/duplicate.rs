//! The two answers a duplicate presentation of a `requestState` can get besides the kept
//! outcome.
//!
//! Unlike the uniform "requestState is invalid" error, these are deliberately specific: by the
//! time a claim is made the state has been opened and authenticated, so saying *why* it cannot
//! run leaks nothing, and the client needs to know whether to wait or to start over.
//!
//! How the front's table answers them, and why:
//! - **Retry in progress → HTTP 409, JSON-RPC -32603, `Retry-After: 1`.** The request conflicts
//!   with the current state of the resource (the first presentation still owns the id); 409 is
//!   what the IETF Idempotency-Key draft prescribes for a concurrent duplicate. 429 would blame
//!   the client's request rate, which is not the problem. No MCP or JSON-RPC code means "busy,
//!   retry": -32000..-32019 should not be used and -32020..-32099 are reserved by the MCP spec,
//!   so the generic -32603 is used and the status plus `Retry-After` carry the retry hint.
//!   Presenting the same state again later returns the first presentation's outcome.
//! - **Already used (or its outcome lost) → HTTP 409, JSON-RPC -32602.** The state is spent and its outcome was not
//!   kept (too large, or the call ended without a result). From the JSON-RPC view the params
//!   are no longer acceptable and repeating them can never succeed, which is what -32602 says
//!   (the same code as every other unusable `requestState`); 409 rather than 400 because the
//!   request itself is well formed and only conflicts with what the gateway already did. The
//!   client must start the request again without `requestState`.

use crate::error::{Rejection, RejectionKind};

/// Another presentation of this state is running and has not finished.
pub fn in_progress() -> Rejection {
    Rejection::new(
        RejectionKind::StateInProgress,
        "a retry with this requestState is already in progress; send it again once that one \
         has finished to receive its result",
    )
}

/// This state was already used and its outcome cannot be repeated.
pub fn already_used() -> Rejection {
    Rejection::new(
        RejectionKind::StateAlreadyUsed,
        "this requestState has already been used and its result was not kept; send the \
         request again without requestState",
    )
}

/// This state's first presentation started its call, but its outcome was never recorded
/// (its replica went away mid-call): the call may have run, so it does not run again.
pub fn outcome_lost() -> Rejection {
    Rejection::new(
        RejectionKind::StateOutcomeLost,
        "this requestState has already been used, and the outcome of that call was lost; send \
         the request again without requestState",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::error_map::answer;
    use http::StatusCode;
    use mrtr_wire::jsonrpc::codes;

    #[test]
    fn in_progress_asks_the_client_to_wait() {
        let rej = in_progress();
        let r = answer(&rej);
        assert_eq!(r.status, StatusCode::CONFLICT);
        assert_eq!(r.error.code, codes::INTERNAL_ERROR);
        assert_eq!(rej.reason(), "state_in_progress");
        assert!(
            r.headers
                .iter()
                .any(|(n, v)| n == http::header::RETRY_AFTER && v == "1")
        );
        assert!(r.error.message.contains("in progress"));
    }

    #[test]
    fn already_used_asks_the_client_to_start_over() {
        let rej = already_used();
        let r = answer(&rej);
        assert_eq!(r.status, StatusCode::CONFLICT);
        assert_eq!(r.error.code, codes::INVALID_PARAMS);
        assert_eq!(rej.reason(), "state_already_used");
        assert!(r.error.message.contains("already been used"));
        assert!(r.error.message.contains("without requestState"));
    }
}
