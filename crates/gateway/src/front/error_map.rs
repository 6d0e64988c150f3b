//! The one place where a failure becomes an HTTP status, a JSON-RPC error and headers.
//!
//! Every other module builds a typed [`Rejection`]; [`row`] is the table that says how each
//! [`RejectionKind`] is answered, and [`answer`] applies it. `respond` answers every error
//! through here, and the single-use store records what it gives for duplicates.

use std::time::Duration;

use http::{HeaderName, HeaderValue, StatusCode, header};

use crate::error::{Rejection, RejectionKind};
use mrtr_wire::jsonrpc::{ErrorObject, codes};

/// How one kind is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub status: StatusCode,
    /// The JSON-RPC `error.code`.
    pub code: i64,
    /// `Retry-After`, in whole seconds rounded up (at least 1).
    pub retry_after: Option<Duration>,
    /// `Allow`: the HTTP methods the endpoint accepts.
    pub allow: Option<&'static str>,
    /// Whether the rejection's `WWW-Authenticate` challenge is sent.
    pub challenge: bool,
}

const fn row_of(status: StatusCode, code: i64) -> Row {
    Row {
        status,
        code,
        retry_after: None,
        allow: None,
        challenge: false,
    }
}

impl Row {
    const fn retry_after(mut self, d: Duration) -> Row {
        self.retry_after = Some(d);
        self
    }
}

const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The table: how each kind of failure is answered.
pub fn row(kind: RejectionKind) -> Row {
    use RejectionKind as K;
    use codes::{
        HEADER_MISMATCH, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND,
        MISSING_REQUIRED_CLIENT_CAPABILITY, PARSE_ERROR, UNSUPPORTED_PROTOCOL_VERSION,
    };
    const BAD_REQUEST: StatusCode = StatusCode::BAD_REQUEST;
    const NOT_FOUND: StatusCode = StatusCode::NOT_FOUND;
    const CONFLICT: StatusCode = StatusCode::CONFLICT;
    const TOO_MANY: StatusCode = StatusCode::TOO_MANY_REQUESTS;
    const BAD_GATEWAY: StatusCode = StatusCode::BAD_GATEWAY;
    const TIMEOUT: StatusCode = StatusCode::GATEWAY_TIMEOUT;
    const UNAVAILABLE: StatusCode = StatusCode::SERVICE_UNAVAILABLE;
    const INTERNAL: StatusCode = StatusCode::INTERNAL_SERVER_ERROR;
    match kind {
        K::ParseError => row_of(BAD_REQUEST, PARSE_ERROR),
        K::InvalidRequest => row_of(BAD_REQUEST, INVALID_REQUEST),
        K::InvalidParams
        | K::MissingMeta
        | K::BadInputResponse
        | K::UrlElicitationDeclined
        | K::InvalidListenFilter
        | K::StateMalformed
        | K::StateOversize
        | K::StateUnknownKey
        | K::StateAuthFailed
        | K::StateBadPayload
        | K::StateExpired
        | K::StateWrongOrigin
        | K::StateWrongPrincipal
        | K::StateNotAString
        | K::TaskUnknown => row_of(BAD_REQUEST, INVALID_PARAMS),
        K::TaskQuota => row_of(TOO_MANY, INTERNAL_ERROR).retry_after(secs(5)),
        K::HeaderMismatch => row_of(BAD_REQUEST, HEADER_MISMATCH),
        K::UnsupportedVersion | K::LegacyPassthroughUnavailable => {
            row_of(BAD_REQUEST, UNSUPPORTED_PROTOCOL_VERSION)
        }
        K::MissingClientCapability => row_of(BAD_REQUEST, MISSING_REQUIRED_CLIENT_CAPABILITY),
        K::ClientCancelled => row_of(BAD_REQUEST, INTERNAL_ERROR),
        K::MethodNotFound => row_of(NOT_FOUND, METHOD_NOT_FOUND),
        K::WrongPath
        | K::LegacySessionUnknown
        | K::LegacySessionWrongPrincipal
        | K::LegacySessionTransportChanged => row_of(NOT_FOUND, INVALID_REQUEST),
        K::MethodNotAllowed => Row {
            allow: Some("POST"),
            ..row_of(StatusCode::METHOD_NOT_ALLOWED, INVALID_REQUEST)
        },
        K::OriginForbidden => row_of(StatusCode::FORBIDDEN, INVALID_REQUEST),
        K::ListenNeedsSse => row_of(StatusCode::NOT_ACCEPTABLE, INVALID_REQUEST),
        K::BodyReadTimeout => row_of(StatusCode::REQUEST_TIMEOUT, INVALID_REQUEST),
        K::BodyTooLarge => row_of(StatusCode::PAYLOAD_TOO_LARGE, INVALID_REQUEST),
        K::InputResponseTooLarge => row_of(StatusCode::PAYLOAD_TOO_LARGE, INVALID_PARAMS),
        K::ListenStreamQuota | K::LegacyGetStreamQuota => {
            row_of(TOO_MANY, INTERNAL_ERROR).retry_after(secs(5))
        }
        K::ParkingQuota => row_of(TOO_MANY, INTERNAL_ERROR).retry_after(secs(1)),
        K::SingleUsePrincipalQuota { retry_after } => {
            row_of(TOO_MANY, INTERNAL_ERROR).retry_after(retry_after)
        }
        // Why a duplicate presentation gets 409 and these codes: `single_use::duplicate`.
        K::StateInProgress => row_of(CONFLICT, INTERNAL_ERROR).retry_after(secs(1)),
        K::StateAlreadyUsed | K::StateOutcomeLost => row_of(CONFLICT, INVALID_PARAMS),
        K::DuplicateOfError(first) => row_of(
            StatusCode::from_u16(first.status).unwrap_or(StatusCode::OK),
            first.code,
        ),
        K::ParkOnlyLost => row_of(StatusCode::GONE, INTERNAL_ERROR),
        K::AuthMissing
        | K::AuthMalformed
        | K::AuthExpired
        | K::AuthNotYetValid
        | K::AuthBadAudience
        | K::AuthBadIssuer
        | K::AuthBadAlgorithm
        | K::AuthUnknownKid
        | K::AuthBadSignature
        | K::AuthMissingClaim
        | K::AuthUntrustedSource
        | K::AuthNoIdentity
        | K::AuthAmbiguousIdentity => Row {
            challenge: true,
            ..row_of(StatusCode::UNAUTHORIZED, INVALID_REQUEST)
        },
        K::LegacyError(code) | K::ListenSubscribeRefused(code) => {
            // The legacy server answered: its error goes over 200, as a legacy server sends
            // it, except "method not found", which is the modern side's 404.
            let status = if code == METHOD_NOT_FOUND {
                NOT_FOUND
            } else {
                StatusCode::OK
            };
            row_of(status, code)
        }
        K::PolicyRefused => row_of(StatusCode::OK, INTERNAL_ERROR),
        K::StateTooLarge
        | K::UpstreamUnreachable
        | K::UpstreamHttpError
        | K::UpstreamTlsFailed
        | K::UpstreamInitializeFailed
        | K::UpstreamSessionExpired
        | K::UpstreamProtocolError
        | K::UpstreamStreamBroken
        | K::UpstreamTooLarge
        | K::UpstreamSpawnFailed
        | K::MaxRounds
        | K::LegacySessionTooLarge => row_of(BAD_GATEWAY, INTERNAL_ERROR),
        K::UpstreamTimeout | K::CallTimeout | K::ListenSubscribeTimeout => {
            row_of(TIMEOUT, INTERNAL_ERROR)
        }
        K::UpstreamSpawnBackoff { retry_after } | K::SingleUseFull { retry_after } => {
            row_of(UNAVAILABLE, INTERNAL_ERROR).retry_after(retry_after)
        }
        K::ParkingFull
        | K::TasksFull
        | K::StdioMaxChildren
        | K::Overloaded
        | K::ShuttingDown
        | K::SingleUseUnavailable => row_of(UNAVAILABLE, INTERNAL_ERROR).retry_after(secs(1)),
        K::MaxListenStreams | K::MaxLegacyGetStreams => {
            row_of(UNAVAILABLE, INTERNAL_ERROR).retry_after(secs(5))
        }
        K::AuthKeysUnavailable => row_of(UNAVAILABLE, INTERNAL_ERROR),
        K::LegacySessionUnsendable
        | K::TaskLost
        | K::SingleUseCorrupt
        | K::SingleUseInvalidId
        | K::InternalPanic => row_of(INTERNAL, INTERNAL_ERROR),
    }
}

/// A rejection as the client receives it.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub error: ErrorObject,
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// `rej` answered by the table.
pub fn answer(rej: &Rejection) -> Answer {
    let row = row(rej.kind());
    let mut headers = Vec::new();
    if let Some(d) = row.retry_after {
        headers.push((header::RETRY_AFTER, HeaderValue::from(whole_seconds(d))));
    }
    if let Some(allow) = row.allow {
        headers.push((header::ALLOW, HeaderValue::from_static(allow)));
    }
    if row.challenge
        && let Some(v) = rej.challenge().and_then(|c| HeaderValue::from_str(c).ok())
    {
        headers.push((header::WWW_AUTHENTICATE, v));
    }
    Answer {
        status: row.status,
        error: error_object(rej),
        headers,
    }
}

/// The JSON-RPC error the client receives for `rej`.
pub fn error_object(rej: &Rejection) -> ErrorObject {
    ErrorObject {
        code: row(rej.kind()).code,
        message: rej.message().to_owned(),
        data: rej.data().cloned(),
    }
}

/// The HTTP status and JSON-RPC error of `rej`: what a duplicate presentation of a
/// `requestState` gets again (see `mrtr::at_most_once`).
pub fn status_and_error(rej: &Rejection) -> (StatusCode, ErrorObject) {
    (row(rej.kind()).status, error_object(rej))
}

/// Whole seconds, rounded up, at least 1.
fn whole_seconds(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Fault, Recorded};
    use std::collections::BTreeSet;

    /// A distinct number per variant, so the walk below can tell it missed one. (A new
    /// variant does not compile here until it is numbered, and then fails the walk until it
    /// has a row.)
    fn variant_number(kind: RejectionKind) -> usize {
        use RejectionKind as K;
        match kind {
            K::ParseError => 0,
            K::InvalidRequest => 1,
            K::InvalidParams => 2,
            K::MissingMeta => 3,
            K::HeaderMismatch => 4,
            K::UnsupportedVersion => 5,
            K::MethodNotFound => 6,
            K::MissingClientCapability => 7,
            K::BadInputResponse => 8,
            K::WrongPath => 9,
            K::MethodNotAllowed => 10,
            K::BodyTooLarge => 11,
            K::BodyReadTimeout => 12,
            K::OriginForbidden => 13,
            K::ClientCancelled => 14,
            K::UrlElicitationDeclined => 15,
            K::InputResponseTooLarge => 16,
            K::InvalidListenFilter => 17,
            K::ListenNeedsSse => 18,
            K::LegacySessionUnknown => 19,
            K::LegacySessionUnsendable => 20,
            K::LegacySessionWrongPrincipal => 21,
            K::LegacyPassthroughUnavailable => 22,
            K::LegacySessionTransportChanged => 23,
            K::ListenStreamQuota => 24,
            K::LegacyGetStreamQuota => 25,
            K::ParkingQuota => 26,
            K::SingleUsePrincipalQuota { .. } => 27,
            K::StateMalformed => 28,
            K::StateOversize => 29,
            K::StateUnknownKey => 30,
            K::StateAuthFailed => 31,
            K::StateBadPayload => 32,
            K::StateExpired => 33,
            K::StateWrongOrigin => 34,
            K::StateWrongPrincipal => 35,
            K::StateNotAString => 36,
            K::StateInProgress => 37,
            K::StateAlreadyUsed => 38,
            K::StateOutcomeLost => 39,
            K::StateTooLarge => 40,
            K::DuplicateOfError(_) => 41,
            K::ParkOnlyLost => 42,
            K::ParkingFull => 43,
            K::AuthMissing => 44,
            K::AuthMalformed => 45,
            K::AuthExpired => 46,
            K::AuthNotYetValid => 47,
            K::AuthBadAudience => 48,
            K::AuthBadIssuer => 49,
            K::AuthBadAlgorithm => 50,
            K::AuthUnknownKid => 51,
            K::AuthBadSignature => 52,
            K::AuthMissingClaim => 53,
            K::AuthUntrustedSource => 54,
            K::AuthNoIdentity => 55,
            K::AuthAmbiguousIdentity => 56,
            K::AuthKeysUnavailable => 57,
            K::LegacyError(_) => 58,
            K::ListenSubscribeRefused(_) => 59,
            K::PolicyRefused => 60,
            K::UpstreamUnreachable => 61,
            K::UpstreamTimeout => 62,
            K::CallTimeout => 63,
            K::ListenSubscribeTimeout => 64,
            K::UpstreamHttpError => 65,
            K::UpstreamTlsFailed => 66,
            K::UpstreamInitializeFailed => 67,
            K::UpstreamSessionExpired => 68,
            K::UpstreamProtocolError => 69,
            K::UpstreamStreamBroken => 70,
            K::UpstreamTooLarge => 71,
            K::UpstreamSpawnFailed => 72,
            K::UpstreamSpawnBackoff { .. } => 73,
            K::StdioMaxChildren => 74,
            K::MaxRounds => 75,
            K::LegacySessionTooLarge => 76,
            K::Overloaded => 77,
            K::MaxListenStreams => 78,
            K::MaxLegacyGetStreams => 79,
            K::ShuttingDown => 80,
            K::SingleUseFull { .. } => 81,
            K::SingleUseUnavailable => 82,
            K::SingleUseCorrupt => 83,
            K::SingleUseInvalidId => 84,
            K::InternalPanic => 85,
            K::TaskUnknown => 86,
            K::TaskQuota => 87,
            K::TasksFull => 88,
            K::TaskLost => 89,
        }
    }
    const VARIANTS: usize = 90;

    /// Kind, HTTP status, JSON-RPC code, reason, fault, `Retry-After` seconds.
    type Expected = (RejectionKind, u16, i64, &'static str, Fault, Option<u64>);

    /// Every kind as the gateway answered it before the table existed (except the fault of a
    /// refused subscription, now decided by its code as for every legacy error). A changed
    /// answer must change this list.
    #[rustfmt::skip]
    fn expected() -> Vec<Expected> {
        use Fault::{Client, Internal, Upstream};
        use RejectionKind as K;
        let ms = Duration::from_millis;
        vec![
            (K::ParseError, 400, -32700, "parse_error", Client, None),
            (K::InvalidRequest, 400, -32600, "invalid_request", Client, None),
            (K::InvalidParams, 400, -32602, "invalid_params", Client, None),
            (K::MissingMeta, 400, -32602, "missing_meta", Client, None),
            (K::HeaderMismatch, 400, -32020, "header_mismatch", Client, None),
            (K::UnsupportedVersion, 400, -32022, "unsupported_version", Client, None),
            (K::MethodNotFound, 404, -32601, "method_not_found", Client, None),
            (K::MissingClientCapability, 400, -32021, "missing_client_capability", Client, None),
            (K::BadInputResponse, 400, -32602, "bad_input_response", Client, None),
            (K::WrongPath, 404, -32600, "wrong_path", Client, None),
            (K::MethodNotAllowed, 405, -32600, "method_not_allowed", Client, None),
            (K::BodyTooLarge, 413, -32600, "body_too_large", Client, None),
            (K::BodyReadTimeout, 408, -32600, "body_read_timeout", Client, None),
            (K::OriginForbidden, 403, -32600, "origin_forbidden", Client, None),
            (K::ClientCancelled, 400, -32603, "client_cancelled", Client, None),
            (K::UrlElicitationDeclined, 400, -32602, "url_elicitation_declined", Client, None),
            (K::InputResponseTooLarge, 413, -32602, "input_response_too_large", Client, None),
            (K::InvalidListenFilter, 400, -32602, "invalid_listen_filter", Client, None),
            (K::ListenNeedsSse, 406, -32600, "listen_needs_sse", Client, None),
            (K::LegacySessionUnknown, 404, -32600, "legacy_session_unknown", Client, None),
            (K::LegacySessionUnsendable, 500, -32603, "legacy_session_unknown", Internal, None),
            (K::LegacySessionWrongPrincipal, 404, -32600, "legacy_session_wrong_principal", Client, None),
            (K::LegacyPassthroughUnavailable, 400, -32022, "legacy_passthrough_unavailable", Client, None),
            (K::LegacySessionTransportChanged, 404, -32600, "legacy_passthrough_unavailable", Client, None),
            (K::ListenStreamQuota, 429, -32603, "listen_stream_quota", Client, Some(5)),
            (K::LegacyGetStreamQuota, 429, -32603, "legacy_get_stream_quota", Client, Some(5)),
            (K::ParkingQuota, 429, -32603, "parking_quota", Client, Some(1)),
            (K::SingleUsePrincipalQuota { retry_after: ms(1500) }, 429, -32603, "single_use_principal_quota", Client, Some(2)),
            (K::StateMalformed, 400, -32602, "state_malformed", Client, None),
            (K::StateOversize, 400, -32602, "state_oversize", Client, None),
            (K::StateUnknownKey, 400, -32602, "state_unknown_key", Client, None),
            (K::StateAuthFailed, 400, -32602, "state_auth_failed", Client, None),
            (K::StateBadPayload, 400, -32602, "state_bad_payload", Client, None),
            (K::StateExpired, 400, -32602, "state_expired", Client, None),
            (K::StateWrongOrigin, 400, -32602, "state_wrong_origin", Client, None),
            (K::StateWrongPrincipal, 400, -32602, "state_wrong_principal", Client, None),
            (K::StateNotAString, 400, -32602, "state_not_a_string", Client, None),
            (K::StateInProgress, 409, -32603, "state_in_progress", Client, Some(1)),
            (K::StateAlreadyUsed, 409, -32602, "state_already_used", Client, None),
            (K::StateOutcomeLost, 409, -32602, "state_outcome_lost", Client, None),
            (K::StateTooLarge, 502, -32603, "state_too_large", Upstream, None),
            (K::DuplicateOfError(Recorded { status: 413, code: -32602, fault: Client }), 413, -32602, "duplicate_of_error", Client, None),
            (K::DuplicateOfError(Recorded { status: 0, code: -32001, fault: Upstream }), 200, -32001, "duplicate_of_error", Upstream, None),
            (K::ParkOnlyLost, 410, -32603, "park_only_lost", Client, None),
            (K::ParkingFull, 503, -32603, "parking_full", Internal, Some(1)),
            (K::TaskUnknown, 400, -32602, "task_unknown", Client, None),
            (K::TaskQuota, 429, -32603, "task_quota", Client, Some(5)),
            (K::TasksFull, 503, -32603, "tasks_full", Internal, Some(1)),
            (K::TaskLost, 500, -32603, "task_lost", Internal, None),
            (K::AuthMissing, 401, -32600, "auth_missing", Client, None),
            (K::AuthMalformed, 401, -32600, "auth_malformed", Client, None),
            (K::AuthExpired, 401, -32600, "auth_expired", Client, None),
            (K::AuthNotYetValid, 401, -32600, "auth_not_yet_valid", Client, None),
            (K::AuthBadAudience, 401, -32600, "auth_bad_audience", Client, None),
            (K::AuthBadIssuer, 401, -32600, "auth_bad_issuer", Client, None),
            (K::AuthBadAlgorithm, 401, -32600, "auth_bad_algorithm", Client, None),
            (K::AuthUnknownKid, 401, -32600, "auth_unknown_kid", Client, None),
            (K::AuthBadSignature, 401, -32600, "auth_bad_signature", Client, None),
            (K::AuthMissingClaim, 401, -32600, "auth_missing_claim", Client, None),
            (K::AuthUntrustedSource, 401, -32600, "auth_untrusted_source", Client, None),
            (K::AuthNoIdentity, 401, -32600, "auth_no_identity", Client, None),
            (K::AuthAmbiguousIdentity, 401, -32600, "auth_ambiguous_identity", Client, None),
            (K::AuthKeysUnavailable, 503, -32603, "auth_keys_unavailable", Internal, None),
            (K::LegacyError(-32602), 200, -32602, "legacy_error", Client, None),
            (K::LegacyError(-32601), 404, -32601, "legacy_error", Client, None),
            (K::LegacyError(-32600), 200, -32600, "legacy_error", Client, None),
            (K::LegacyError(-32603), 200, -32603, "legacy_error", Upstream, None),
            (K::LegacyError(-32001), 200, -32001, "legacy_error", Upstream, None),
            (K::LegacyError(-32700), 200, -32700, "legacy_error", Upstream, None),
            (K::ListenSubscribeRefused(-32602), 200, -32602, "listen_subscribe_refused", Client, None),
            (K::ListenSubscribeRefused(-32601), 404, -32601, "listen_subscribe_refused", Client, None),
            (K::ListenSubscribeRefused(-32603), 200, -32603, "listen_subscribe_refused", Upstream, None),
            (K::PolicyRefused, 200, -32603, "policy_refused", Upstream, None),
            (K::UpstreamUnreachable, 502, -32603, "upstream_unreachable", Upstream, None),
            (K::UpstreamTimeout, 504, -32603, "upstream_timeout", Upstream, None),
            (K::CallTimeout, 504, -32603, "call_timeout", Upstream, None),
            (K::ListenSubscribeTimeout, 504, -32603, "listen_subscribe_timeout", Upstream, None),
            (K::UpstreamHttpError, 502, -32603, "upstream_http_error", Upstream, None),
            (K::UpstreamTlsFailed, 502, -32603, "upstream_tls_failed", Upstream, None),
            (K::UpstreamInitializeFailed, 502, -32603, "upstream_initialize_failed", Upstream, None),
            (K::UpstreamSessionExpired, 502, -32603, "upstream_session_expired", Upstream, None),
            (K::UpstreamProtocolError, 502, -32603, "upstream_protocol_error", Upstream, None),
            (K::UpstreamStreamBroken, 502, -32603, "upstream_stream_broken", Upstream, None),
            (K::UpstreamTooLarge, 502, -32603, "upstream_too_large", Upstream, None),
            (K::UpstreamSpawnFailed, 502, -32603, "upstream_spawn_failed", Upstream, None),
            (K::UpstreamSpawnBackoff { retry_after: secs(3) }, 503, -32603, "upstream_spawn_backoff", Upstream, Some(3)),
            (K::StdioMaxChildren, 503, -32603, "stdio_max_children", Internal, Some(1)),
            (K::MaxRounds, 502, -32603, "max_rounds", Upstream, None),
            (K::LegacySessionTooLarge, 502, -32603, "legacy_session_too_large", Upstream, None),
            (K::Overloaded, 503, -32603, "overloaded", Internal, Some(1)),
            (K::MaxListenStreams, 503, -32603, "max_listen_streams", Internal, Some(5)),
            (K::MaxLegacyGetStreams, 503, -32603, "max_legacy_get_streams", Internal, Some(5)),
            (K::ShuttingDown, 503, -32603, "shutting_down", Internal, Some(1)),
            (K::SingleUseFull { retry_after: ms(4500) }, 503, -32603, "single_use_full", Internal, Some(5)),
            (K::SingleUseFull { retry_after: ms(10) }, 503, -32603, "single_use_full", Internal, Some(1)),
            (K::SingleUseUnavailable, 503, -32603, "single_use_unavailable", Internal, Some(1)),
            (K::SingleUseCorrupt, 500, -32603, "single_use_corrupt", Internal, None),
            (K::SingleUseInvalidId, 500, -32603, "single_use_invalid_id", Internal, None),
            (K::InternalPanic, 500, -32603, "internal_panic", Internal, None),
        ]
    }

    #[test]
    fn every_kind_is_answered_as_before() {
        let rows = expected();
        let seen: BTreeSet<usize> = rows.iter().map(|r| variant_number(r.0)).collect();
        let missing: Vec<usize> = (0..VARIANTS).filter(|n| !seen.contains(n)).collect();
        assert!(missing.is_empty(), "kinds without a row here: {missing:?}");
        for (kind, status, code, reason, fault, retry_after) in rows {
            let rej = Rejection::new(kind, "m").with_challenge("Bearer realm=\"r\"");
            let a = answer(&rej);
            let header = |name: &HeaderName| {
                a.headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.to_str().unwrap().to_owned())
            };
            assert_eq!(
                (a.status.as_u16(), a.error.code, kind.reason(), kind.fault()),
                (status, code, reason, fault),
                "{kind:?}"
            );
            assert_eq!(
                header(&header::RETRY_AFTER),
                retry_after.map(|s| s.to_string()),
                "{kind:?}"
            );
            assert_eq!(
                header(&header::ALLOW).is_some(),
                kind == RejectionKind::MethodNotAllowed,
                "{kind:?}"
            );
            assert_eq!(
                header(&header::WWW_AUTHENTICATE).is_some(),
                status == 401,
                "{kind:?}: a challenge goes with every 401 and nothing else"
            );
        }
    }

    #[test]
    fn the_answer_carries_the_message_and_data() {
        let rej = Rejection::new(RejectionKind::MethodNotAllowed, "POST only")
            .with_data(serde_json::json!({"x": 1}));
        let a = answer(&rej);
        assert_eq!(a.error.message, "POST only");
        assert_eq!(a.error.data, Some(serde_json::json!({"x": 1})));
        assert_eq!(
            a.headers,
            vec![(header::ALLOW, HeaderValue::from_static("POST"))]
        );
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_secs(3)), 3);
        assert_eq!(whole_seconds(Duration::from_millis(3001)), 4);
    }
}
