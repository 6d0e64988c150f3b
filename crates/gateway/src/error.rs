//! What went wrong, in the gateway's own terms: a [`Rejection`] of one [`RejectionKind`].
//!
//! Every module reports a failure as a `Rejection`: its kind (the failure class), the sentence
//! the client reads, optional `error.data`, and the typed values some answers carry (the
//! `WWW-Authenticate` challenge). The kind gives the stable `reason` label for metrics and
//! logs, and whose [`Fault`] it was. How a kind is answered — the HTTP status, the JSON-RPC
//! code, the extra headers — is not decided here or at the site that fails: the front's table
//! (`front::error_map`) is the only place that chooses them.
//!
//! The reason is for operators only; for `requestState` failures the client-facing message is
//! deliberately the same whatever the reason.

use std::time::Duration;

use serde_json::{Value, json};

use mrtr_wire::jsonrpc::codes;

/// Whose fault a failure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The modern client sent something wrong.
    Client,
    /// The legacy server failed, misbehaved or could not be reached.
    Upstream,
    /// The gateway itself (a bug, or a local resource such as a store).
    Internal,
}

impl Fault {
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Client => "client",
            Fault::Upstream => "upstream",
            Fault::Internal => "internal",
        }
    }

    /// The fault named by [`Fault::as_str`]'s label.
    pub fn from_label(label: &str) -> Option<Fault> {
        [Fault::Client, Fault::Upstream, Fault::Internal]
            .into_iter()
            .find(|f| f.as_str() == label)
    }
}

/// Whose fault a legacy server's JSON-RPC error is, by its code as the modern client gets it
/// (after `translate::map_legacy_error`): the standard codes that say the *request* was wrong —
/// invalid request, method not found, invalid params (which a legacy "resource not found"
/// becomes) — are the client's: it called a tool that does not exist, or with arguments the
/// server refuses, or subscribed to a resource the server does not have. Anything else is the
/// legacy server's.
pub fn legacy_error_fault(code: i64) -> Fault {
    match code {
        codes::INVALID_REQUEST | codes::METHOD_NOT_FOUND | codes::INVALID_PARAMS => Fault::Client,
        _ => Fault::Upstream,
    }
}

/// What a duplicate presentation of a `requestState` replays: how the first presentation's
/// error was answered, as recorded with its outcome (`mrtr::at_most_once`). The numbers were
/// chosen by the front's table when the first answer was given; they are carried, not chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// The HTTP status of the first answer.
    pub status: u16,
    /// Its JSON-RPC error code.
    pub code: i64,
    pub fault: Fault,
}

/// The failure classes, one per `reason` label. Some labels are shared by two kinds that are
/// answered differently (each says so); a kind carries data only where its answer depends on
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectionKind {
    // Client input.
    /// The body is not JSON.
    ParseError,
    /// Not a JSON-RPC request the gateway serves (a batch, a response, no method, …).
    InvalidRequest,
    /// `params` is not an object.
    InvalidParams,
    /// A `_meta` member the request needs is missing or malformed.
    MissingMeta,
    /// The routing headers are missing or disagree with the body.
    HeaderMismatch,
    UnsupportedVersion,
    MethodNotFound,
    /// The request needs a client capability it did not declare.
    MissingClientCapability,
    /// An `inputResponses` entry is malformed or does not answer its question.
    BadInputResponse,
    /// Not the MCP endpoint's path.
    WrongPath,
    /// Not POST (and not a legacy session's GET or DELETE).
    MethodNotAllowed,
    /// The body exceeds `listen.max_body_bytes`.
    BodyTooLarge,
    /// The body did not arrive within `listen.body_read_timeout`.
    BodyReadTimeout,
    /// A browser `Origin` outside `listen.allowed_origins`.
    OriginForbidden,
    /// The client went away during the call.
    ClientCancelled,
    /// The user declined (or cancelled) a URL step the legacy server requires.
    UrlElicitationDeclined,
    /// The client's answers do not fit in the next `requestState` (`state.max_bytes`).
    InputResponseTooLarge,
    /// `subscriptions/listen` with a malformed `params.notifications`, or too many URIs.
    InvalidListenFilter,
    /// `subscriptions/listen` without `text/event-stream` in `Accept`.
    ListenNeedsSse,
    /// A legacy client's session id that this gateway did not issue (or cannot open).
    LegacySessionUnknown,
    /// A sealed legacy session id that opened but cannot be sent upstream (label
    /// `legacy_session_unknown`, like [`RejectionKind::LegacySessionUnknown`], but the
    /// gateway's fault).
    LegacySessionUnsendable,
    /// A legacy client's session id issued to another principal.
    LegacySessionWrongPrincipal,
    /// A legacy `initialize` while the upstream is not Streamable HTTP.
    LegacyPassthroughUnavailable,
    /// A legacy client's session whose upstream is no longer Streamable HTTP (label
    /// `legacy_passthrough_unavailable`; answered like an unknown session).
    LegacySessionTransportChanged,

    // Caller quotas: this caller holds its share; others are still served.
    ListenStreamQuota,
    LegacyGetStreamQuota,
    ParkingQuota,
    SingleUsePrincipalQuota {
        /// When the caller's entries are next swept.
        retry_after: Duration,
    },

    // `requestState`.
    StateMalformed,
    StateOversize,
    StateUnknownKey,
    StateAuthFailed,
    StateBadPayload,
    StateExpired,
    StateWrongOrigin,
    StateWrongPrincipal,
    StateNotAString,
    /// Another presentation of the same state is still running.
    StateInProgress,
    /// The state was used and its outcome was not kept.
    StateAlreadyUsed,
    /// The state was used and its outcome was lost with its replica.
    StateOutcomeLost,
    /// The legacy server's questions do not fit in a `requestState`.
    StateTooLarge,
    /// A duplicate presentation of a state whose first presentation ended in an error.
    DuplicateOfError(Recorded),
    /// A park-only call whose parked call is gone.
    ParkOnlyLost,
    /// A park-only call the parking lot cannot take.
    ParkingFull,

    // Tasks (the Tasks extension).
    /// `tasks/*` naming a task this caller does not have (never created, another caller's,
    /// or forgotten past its `ttlMs`), or without a `taskId`.
    TaskUnknown,
    /// The caller has its share of the replica's unfinished tasks.
    TaskQuota,
    /// The replica runs `tasks.max_running` unfinished tasks.
    TasksFull,
    /// The replica running a task stopped before it finished (its lease ran out): the task
    /// failed with this; it never runs again.
    TaskLost,

    // Authentication (`auth::AuthFailure`).
    AuthMissing,
    AuthMalformed,
    AuthExpired,
    AuthNotYetValid,
    AuthBadAudience,
    AuthBadIssuer,
    AuthBadAlgorithm,
    AuthUnknownKid,
    AuthBadSignature,
    AuthMissingClaim,
    AuthUntrustedSource,
    AuthNoIdentity,
    AuthAmbiguousIdentity,
    /// No verification keys could be obtained (the gateway's fault, not the caller's).
    AuthKeysUnavailable,

    // The legacy server.
    /// The legacy server's own JSON-RPC error to a call, passed on; its code as the client gets
    /// it (after `translate::map_legacy_error`).
    LegacyError(i64),
    /// The legacy server's JSON-RPC error to a listen stream's `resources/subscribe`, mapped
    /// (and its fault decided) the same way.
    ListenSubscribeRefused(i64),
    /// The legacy server ended the call needing a URL step the gateway's policy refuses.
    PolicyRefused,
    UpstreamUnreachable,
    /// A legacy session did not answer within `upstream.response_timeout`.
    UpstreamTimeout,
    /// The call did not finish within `upstream.call_timeout`.
    CallTimeout,
    /// `resources/subscribe` not confirmed within `upstream.response_timeout`.
    ListenSubscribeTimeout,
    UpstreamHttpError,
    UpstreamTlsFailed,
    UpstreamInitializeFailed,
    UpstreamSessionExpired,
    UpstreamProtocolError,
    UpstreamStreamBroken,
    UpstreamTooLarge,
    UpstreamSpawnFailed,
    /// The stdio server keeps failing to start; the next attempt is due in `retry_after`.
    UpstreamSpawnBackoff {
        retry_after: Duration,
    },
    /// All `upstream.stdio_max_children` children stayed busy.
    StdioMaxChildren,
    /// The legacy server asked for input in more than `state.max_rounds` rounds.
    MaxRounds,
    /// The legacy server's session id is too long to seal.
    LegacySessionTooLarge,

    // The gateway.
    /// `listen.max_concurrent_requests` requests in flight.
    Overloaded,
    MaxListenStreams,
    MaxLegacyGetStreams,
    ShuttingDown,
    SingleUseFull {
        /// When room is likely to appear.
        retry_after: Duration,
    },
    SingleUseUnavailable,
    SingleUseCorrupt,
    SingleUseInvalidId,
    /// The task serving the request panicked.
    InternalPanic,
}

impl RejectionKind {
    /// The stable label for metrics (`rejections_total{reason}`) and logs.
    pub fn reason(self) -> &'static str {
        use RejectionKind as K;
        match self {
            K::ParseError => "parse_error",
            K::InvalidRequest => "invalid_request",
            K::InvalidParams => "invalid_params",
            K::MissingMeta => "missing_meta",
            K::HeaderMismatch => "header_mismatch",
            K::UnsupportedVersion => "unsupported_version",
            K::MethodNotFound => "method_not_found",
            K::MissingClientCapability => "missing_client_capability",
            K::BadInputResponse => "bad_input_response",
            K::WrongPath => "wrong_path",
            K::MethodNotAllowed => "method_not_allowed",
            K::BodyTooLarge => "body_too_large",
            K::BodyReadTimeout => "body_read_timeout",
            K::OriginForbidden => "origin_forbidden",
            K::ClientCancelled => "client_cancelled",
            K::UrlElicitationDeclined => "url_elicitation_declined",
            K::InputResponseTooLarge => "input_response_too_large",
            K::InvalidListenFilter => "invalid_listen_filter",
            K::ListenNeedsSse => "listen_needs_sse",
            K::LegacySessionUnknown | K::LegacySessionUnsendable => "legacy_session_unknown",
            K::LegacySessionWrongPrincipal => "legacy_session_wrong_principal",
            K::LegacyPassthroughUnavailable | K::LegacySessionTransportChanged => {
                "legacy_passthrough_unavailable"
            }
            K::ListenStreamQuota => "listen_stream_quota",
            K::LegacyGetStreamQuota => "legacy_get_stream_quota",
            K::ParkingQuota => "parking_quota",
            K::SingleUsePrincipalQuota { .. } => "single_use_principal_quota",
            K::StateMalformed => "state_malformed",
            K::StateOversize => "state_oversize",
            K::StateUnknownKey => "state_unknown_key",
            K::StateAuthFailed => "state_auth_failed",
            K::StateBadPayload => "state_bad_payload",
            K::StateExpired => "state_expired",
            K::StateWrongOrigin => "state_wrong_origin",
            K::StateWrongPrincipal => "state_wrong_principal",
            K::StateNotAString => "state_not_a_string",
            K::StateInProgress => "state_in_progress",
            K::StateAlreadyUsed => "state_already_used",
            K::StateOutcomeLost => "state_outcome_lost",
            K::StateTooLarge => "state_too_large",
            K::DuplicateOfError(_) => "duplicate_of_error",
            K::ParkOnlyLost => "park_only_lost",
            K::ParkingFull => "parking_full",
            K::TaskUnknown => "task_unknown",
            K::TaskQuota => "task_quota",
            K::TasksFull => "tasks_full",
            K::TaskLost => "task_lost",
            K::AuthMissing => "auth_missing",
            K::AuthMalformed => "auth_malformed",
            K::AuthExpired => "auth_expired",
            K::AuthNotYetValid => "auth_not_yet_valid",
            K::AuthBadAudience => "auth_bad_audience",
            K::AuthBadIssuer => "auth_bad_issuer",
            K::AuthBadAlgorithm => "auth_bad_algorithm",
            K::AuthUnknownKid => "auth_unknown_kid",
            K::AuthBadSignature => "auth_bad_signature",
            K::AuthMissingClaim => "auth_missing_claim",
            K::AuthUntrustedSource => "auth_untrusted_source",
            K::AuthNoIdentity => "auth_no_identity",
            K::AuthAmbiguousIdentity => "auth_ambiguous_identity",
            K::AuthKeysUnavailable => "auth_keys_unavailable",
            K::LegacyError(_) => "legacy_error",
            K::ListenSubscribeRefused(_) => "listen_subscribe_refused",
            K::PolicyRefused => "policy_refused",
            K::UpstreamUnreachable => "upstream_unreachable",
            K::UpstreamTimeout => "upstream_timeout",
            K::CallTimeout => "call_timeout",
            K::ListenSubscribeTimeout => "listen_subscribe_timeout",
            K::UpstreamHttpError => "upstream_http_error",
            K::UpstreamTlsFailed => "upstream_tls_failed",
            K::UpstreamInitializeFailed => "upstream_initialize_failed",
            K::UpstreamSessionExpired => "upstream_session_expired",
            K::UpstreamProtocolError => "upstream_protocol_error",
            K::UpstreamStreamBroken => "upstream_stream_broken",
            K::UpstreamTooLarge => "upstream_too_large",
            K::UpstreamSpawnFailed => "upstream_spawn_failed",
            K::UpstreamSpawnBackoff { .. } => "upstream_spawn_backoff",
            K::StdioMaxChildren => "stdio_max_children",
            K::MaxRounds => "max_rounds",
            K::LegacySessionTooLarge => "legacy_session_too_large",
            K::Overloaded => "overloaded",
            K::MaxListenStreams => "max_listen_streams",
            K::MaxLegacyGetStreams => "max_legacy_get_streams",
            K::ShuttingDown => "shutting_down",
            K::SingleUseFull { .. } => "single_use_full",
            K::SingleUseUnavailable => "single_use_unavailable",
            K::SingleUseCorrupt => "single_use_corrupt",
            K::SingleUseInvalidId => "single_use_invalid_id",
            K::InternalPanic => "internal_panic",
        }
    }

    /// One kind of every reason with each fault it can be counted under: the series of
    /// `rejections_total{reason, fault}` that exist from the start (at 0). The kinds whose
    /// fault depends on their data appear once per fault they can take.
    pub fn catalogue() -> Vec<RejectionKind> {
        use RejectionKind as K;
        let later = Duration::from_secs(1);
        let duplicate = |fault| {
            K::DuplicateOfError(Recorded {
                status: 500,
                code: codes::INTERNAL_ERROR,
                fault,
            })
        };
        vec![
            K::ParseError,
            K::InvalidRequest,
            K::InvalidParams,
            K::MissingMeta,
            K::HeaderMismatch,
            K::UnsupportedVersion,
            K::MethodNotFound,
            K::MissingClientCapability,
            K::BadInputResponse,
            K::WrongPath,
            K::MethodNotAllowed,
            K::BodyTooLarge,
            K::BodyReadTimeout,
            K::OriginForbidden,
            K::ClientCancelled,
            K::UrlElicitationDeclined,
            K::InputResponseTooLarge,
            K::InvalidListenFilter,
            K::ListenNeedsSse,
            K::LegacySessionUnknown,
            K::LegacySessionUnsendable,
            K::LegacySessionWrongPrincipal,
            K::LegacyPassthroughUnavailable,
            K::ListenStreamQuota,
            K::LegacyGetStreamQuota,
            K::ParkingQuota,
            K::SingleUsePrincipalQuota { retry_after: later },
            K::StateMalformed,
            K::StateOversize,
            K::StateUnknownKey,
            K::StateAuthFailed,
            K::StateBadPayload,
            K::StateExpired,
            K::StateWrongOrigin,
            K::StateWrongPrincipal,
            K::StateNotAString,
            K::StateInProgress,
            K::StateAlreadyUsed,
            K::StateOutcomeLost,
            K::StateTooLarge,
            duplicate(Fault::Client),
            duplicate(Fault::Upstream),
            duplicate(Fault::Internal),
            K::ParkOnlyLost,
            K::ParkingFull,
            K::TaskUnknown,
            K::TaskQuota,
            K::TasksFull,
            K::TaskLost,
            K::AuthMissing,
            K::AuthMalformed,
            K::AuthExpired,
            K::AuthNotYetValid,
            K::AuthBadAudience,
            K::AuthBadIssuer,
            K::AuthBadAlgorithm,
            K::AuthUnknownKid,
            K::AuthBadSignature,
            K::AuthMissingClaim,
            K::AuthUntrustedSource,
            K::AuthNoIdentity,
            K::AuthAmbiguousIdentity,
            K::AuthKeysUnavailable,
            K::LegacyError(codes::INVALID_PARAMS),
            K::LegacyError(codes::INTERNAL_ERROR),
            K::ListenSubscribeRefused(codes::INVALID_PARAMS),
            K::ListenSubscribeRefused(codes::INTERNAL_ERROR),
            K::PolicyRefused,
            K::UpstreamUnreachable,
            K::UpstreamTimeout,
            K::CallTimeout,
            K::ListenSubscribeTimeout,
            K::UpstreamHttpError,
            K::UpstreamTlsFailed,
            K::UpstreamInitializeFailed,
            K::UpstreamSessionExpired,
            K::UpstreamProtocolError,
            K::UpstreamStreamBroken,
            K::UpstreamTooLarge,
            K::UpstreamSpawnFailed,
            K::UpstreamSpawnBackoff { retry_after: later },
            K::StdioMaxChildren,
            K::MaxRounds,
            K::LegacySessionTooLarge,
            K::Overloaded,
            K::MaxListenStreams,
            K::MaxLegacyGetStreams,
            K::ShuttingDown,
            K::SingleUseFull { retry_after: later },
            K::SingleUseUnavailable,
            K::SingleUseCorrupt,
            K::SingleUseInvalidId,
            K::InternalPanic,
        ]
    }

    /// The kinds a legacy session that cannot be opened is counted under
    /// (`legacy_sessions_failed_total{reason}`, from the start): the classes
    /// `upstream_error::kind` sorts a session failure into.
    pub const SESSION_FAILURES: &'static [RejectionKind] = &[
        RejectionKind::UpstreamTimeout,
        RejectionKind::UpstreamUnreachable,
        RejectionKind::UpstreamTlsFailed,
        RejectionKind::UpstreamTooLarge,
        RejectionKind::UpstreamHttpError,
        RejectionKind::UpstreamInitializeFailed,
        RejectionKind::UpstreamSessionExpired,
        RejectionKind::UpstreamProtocolError,
        RejectionKind::UpstreamSpawnFailed,
        RejectionKind::UpstreamStreamBroken,
        RejectionKind::UpstreamSpawnBackoff {
            retry_after: Duration::ZERO,
        },
        RejectionKind::StdioMaxChildren,
    ];

    /// Whose fault this failure is (`rejections_total{fault}`, the access log).
    pub fn fault(self) -> Fault {
        use RejectionKind as K;
        match self {
            K::ParseError
            | K::InvalidRequest
            | K::InvalidParams
            | K::MissingMeta
            | K::HeaderMismatch
            | K::UnsupportedVersion
            | K::MethodNotFound
            | K::MissingClientCapability
            | K::BadInputResponse
            | K::WrongPath
            | K::MethodNotAllowed
            | K::BodyTooLarge
            | K::BodyReadTimeout
            | K::OriginForbidden
            | K::ClientCancelled
            | K::UrlElicitationDeclined
            | K::InputResponseTooLarge
            | K::InvalidListenFilter
            | K::ListenNeedsSse
            | K::LegacySessionUnknown
            | K::LegacySessionWrongPrincipal
            | K::LegacyPassthroughUnavailable
            | K::LegacySessionTransportChanged
            | K::ListenStreamQuota
            | K::LegacyGetStreamQuota
            | K::ParkingQuota
            | K::SingleUsePrincipalQuota { .. }
            | K::StateMalformed
            | K::StateOversize
            | K::StateUnknownKey
            | K::StateAuthFailed
            | K::StateBadPayload
            | K::StateExpired
            | K::StateWrongOrigin
            | K::StateWrongPrincipal
            | K::StateNotAString
            | K::StateInProgress
            | K::StateAlreadyUsed
            | K::StateOutcomeLost
            | K::ParkOnlyLost
            | K::TaskUnknown
            | K::TaskQuota
            | K::AuthMissing
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
            | K::AuthAmbiguousIdentity => Fault::Client,
            K::LegacyError(code) | K::ListenSubscribeRefused(code) => legacy_error_fault(code),
            K::StateTooLarge
            | K::PolicyRefused
            | K::UpstreamUnreachable
            | K::UpstreamTimeout
            | K::CallTimeout
            | K::ListenSubscribeTimeout
            | K::UpstreamHttpError
            | K::UpstreamTlsFailed
            | K::UpstreamInitializeFailed
            | K::UpstreamSessionExpired
            | K::UpstreamProtocolError
            | K::UpstreamStreamBroken
            | K::UpstreamTooLarge
            | K::UpstreamSpawnFailed
            | K::UpstreamSpawnBackoff { .. }
            | K::MaxRounds
            | K::LegacySessionTooLarge => Fault::Upstream,
            K::DuplicateOfError(first) => first.fault,
            K::LegacySessionUnsendable
            | K::ParkingFull
            | K::TasksFull
            | K::TaskLost
            | K::AuthKeysUnavailable
            | K::StdioMaxChildren
            | K::Overloaded
            | K::MaxListenStreams
            | K::MaxLegacyGetStreams
            | K::ShuttingDown
            | K::SingleUseFull { .. }
            | K::SingleUseUnavailable
            | K::SingleUseCorrupt
            | K::SingleUseInvalidId
            | K::InternalPanic => Fault::Internal,
        }
    }
}

/// A failure on its way to the client.
#[derive(Debug, Clone)]
pub struct Rejection {
    kind: RejectionKind,
    message: String,
    data: Option<Value>,
    challenge: Option<String>,
}

impl Rejection {
    /// A failure of `kind`; `message` is what the client reads (never upstream text).
    pub fn new(kind: RejectionKind, message: impl Into<String>) -> Self {
        Rejection {
            kind,
            message: message.into(),
            data: None,
            challenge: None,
        }
    }

    /// Sets `error.data`.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// Adds `key` to `error.data`: to the object already there, or as a new object when there
    /// is none (data that is not an object is left as it is).
    pub fn with_data_member(mut self, key: &str, value: Value) -> Self {
        match self.data.as_mut() {
            Some(Value::Object(map)) => {
                map.insert(key.to_owned(), value);
            }
            Some(_) => {}
            None => self.data = Some(json!({ key: value })),
        }
        self
    }

    /// The `WWW-Authenticate` challenge that tells the client how to authenticate (sent with
    /// the kinds the front's table answers with a challenge).
    pub fn with_challenge(mut self, challenge: impl Into<String>) -> Self {
        self.challenge = Some(challenge.into());
        self
    }

    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// Short stable label for metrics and logs (`"header_mismatch"`, `"state_expired"`, …).
    pub fn reason(&self) -> &'static str {
        self.kind.reason()
    }

    pub fn fault(&self) -> Fault {
        self.kind.fault()
    }

    /// The client-facing message (`error.message`).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// `error.data`, if any.
    pub fn data(&self) -> Option<&Value> {
        self.data.as_ref()
    }

    pub fn challenge(&self) -> Option<&str> {
        self.challenge.as_deref()
    }

    pub fn parse_error(message: impl Into<String>) -> Self {
        Self::new(RejectionKind::ParseError, message)
    }

    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(RejectionKind::InvalidRequest, message)
    }

    pub fn header_mismatch(message: impl Into<String>) -> Self {
        Self::new(RejectionKind::HeaderMismatch, message)
    }

    pub fn unsupported_version(requested: &str, supported: &[&str]) -> Self {
        Self::new(
            RejectionKind::UnsupportedVersion,
            "Unsupported protocol version",
        )
        .with_data(json!({"supported": supported, "requested": requested}))
    }

    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            RejectionKind::MethodNotFound,
            format!("Method not found: {method}"),
        )
    }

    pub fn missing_capability(required: Value, what: &str) -> Self {
        Self::new(
            RejectionKind::MissingClientCapability,
            format!("this request needs a client capability it did not declare: {what}"),
        )
        .with_data(json!({"requiredCapabilities": required}))
    }

    /// Every `requestState` failure looks the same to the client; `kind` goes to logs/metrics.
    pub fn bad_state(kind: RejectionKind) -> Self {
        Self::new(
            kind,
            "requestState is invalid, expired or not valid for this request",
        )
    }

    /// The legacy server ended the call needing something the gateway's policy will not show
    /// the client (a URL elicitation of a legacy -32042 error); the data names only the
    /// policy's reason.
    pub fn policy_refused(message: impl Into<String>, policy_reason: &'static str) -> Self {
        Self::new(RejectionKind::PolicyRefused, message)
            .with_data(json!({"policyReason": policy_reason}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The labels `RejectionKind::reason` can return, read from its source: a new reason
    /// added there and not to the catalogue fails here.
    fn reasons_in_source() -> BTreeSet<&'static str> {
        let src = include_str!("error.rs");
        let start = src.find("pub fn reason(self)").expect("reason()");
        let body = &src[start..];
        let body = &body[..body.find("\n    }\n").expect("end of reason()")];
        // Every string literal in the body is a label.
        body.split('"').skip(1).step_by(2).collect()
    }

    #[test]
    fn the_catalogue_has_every_reason_and_each_fault_of_the_data_dependent_ones() {
        let catalogue = RejectionKind::catalogue();
        let reasons: BTreeSet<&str> = catalogue.iter().map(|k| k.reason()).collect();
        let in_source = reasons_in_source();
        assert!(in_source.len() > 80, "{in_source:?}");
        assert_eq!(reasons, in_source);
        let pairs: BTreeSet<(&str, &str)> = catalogue
            .iter()
            .map(|k| (k.reason(), k.fault().as_str()))
            .collect();
        for (reason, faults) in [
            ("legacy_error", &["client", "upstream"][..]),
            ("listen_subscribe_refused", &["client", "upstream"]),
            ("duplicate_of_error", &["client", "upstream", "internal"]),
            ("legacy_session_unknown", &["client", "internal"]),
        ] {
            for fault in faults {
                assert!(pairs.contains(&(reason, fault)), "{reason} {fault}");
            }
        }
    }

    #[test]
    fn every_reason_is_documented() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/metrics.md"),
        )
        .unwrap();
        let section = &doc[doc.find("## Rejection reasons").unwrap()..];
        let documented: BTreeSet<&str> = section.split('`').skip(1).step_by(2).collect();
        let missing: Vec<&str> = reasons_in_source()
            .into_iter()
            .filter(|r| !documented.contains(r))
            .collect();
        assert!(missing.is_empty(), "not in docs/metrics.md: {missing:?}");
    }

    #[test]
    fn session_failures_are_upstream_or_gateway_reasons() {
        for k in RejectionKind::SESSION_FAILURES {
            assert!(
                k.reason().starts_with("upstream_") || *k == RejectionKind::StdioMaxChildren,
                "{k:?}"
            );
        }
    }
}
