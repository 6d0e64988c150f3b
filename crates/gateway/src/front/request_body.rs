//! Reading a request body: within `listen.max_body_bytes`, and by `listen.body_read_timeout`.
//!
//! The deadline covers the whole body, from the moment its headers were read to its last
//! byte, whatever the pace of its frames: a client that trickles one byte a second is as
//! stalled as one that sends nothing. A late body is answered 408 and its connection is
//! closed once the answer is sent (the rest of the body may still come, and must not be read
//! as a next request). The caller does the closing; this module only reads.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;

use crate::error::{Rejection, RejectionKind};
use crate::metrics::{Held, Limit};

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// More than the limit, in bytes.
    TooLarge(usize),
    /// Not complete within the deadline.
    Late(Duration),
    /// The connection failed or the framing was broken.
    Broken(String),
}

impl BodyError {
    /// The limit behind the failure, when a configured one caused it (`limit_hits_total`).
    pub fn limit(&self) -> Option<Limit> {
        match self {
            BodyError::TooLarge(_) => Some(Limit::MaxBodyBytes),
            BodyError::Late(_) => Some(Limit::BodyReadTimeout),
            BodyError::Broken(_) => None,
        }
    }

    /// Whether the connection must be closed after the answer.
    pub fn closes_connection(&self) -> bool {
        matches!(self, BodyError::Late(_))
    }
}

impl From<BodyError> for Rejection {
    fn from(e: BodyError) -> Rejection {
        match e {
            BodyError::TooLarge(limit) => Rejection::new(
                RejectionKind::BodyTooLarge,
                format!("the request body exceeds listen.max_body_bytes ({limit} bytes)"),
            ),
            BodyError::Late(limit) => Rejection::new(
                RejectionKind::BodyReadTimeout,
                format!(
                    "the request body did not arrive within listen.body_read_timeout ({}); the connection is closed",
                    humantime::format_duration(limit)
                ),
            ),
            BodyError::Broken(detail) => {
                Rejection::invalid_request(format!("could not read the request body: {detail}"))
            }
        }
    }
}

/// The whole body, at most `max_bytes`, complete within `deadline`; `_reading` keeps the
/// request counted among those waiting for theirs until it returns.
pub async fn read(
    body: Incoming,
    max_bytes: usize,
    deadline: Duration,
    _reading: Held,
) -> Result<Bytes, BodyError> {
    match tokio::time::timeout(deadline, Limited::new(body, max_bytes).collect()).await {
        Err(_) => Err(BodyError::Late(deadline)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(BodyError::TooLarge(max_bytes)),
        Ok(Err(e)) => Err(BodyError::Broken(e.to_string())),
    }
}
