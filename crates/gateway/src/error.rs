//! The one place where a failure becomes an HTTP status and a JSON-RPC error.
//!
//! Every module reports failures as a [`Rejection`]: the JSON-RPC error the client sees, the
//! HTTP status that carries it, whose fault it was (metrics and logs use that), and a short
//! machine-readable reason. The reason is for operators only; for `requestState` failures the
//! client-facing message is deliberately the same whatever the reason.

use http::StatusCode;
use serde_json::{Value, json};

use mrtr_wire::jsonrpc::{ErrorObject, codes};

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

/// A failure on its way to the client.
#[derive(Debug, Clone)]
pub struct Rejection {
    pub status: StatusCode,
    pub error: ErrorObject,
    pub fault: Fault,
    /// Short stable label for metrics and logs (`"header_mismatch"`, `"state_expired"`, …).
    pub reason: &'static str,
    /// Extra HTTP headers (e.g. `Retry-After`, `WWW-Authenticate`).
    pub headers: Vec<(http::HeaderName, String)>,
}

impl Rejection {
    pub fn new(
        status: StatusCode,
        code: i64,
        message: impl Into<String>,
        fault: Fault,
        reason: &'static str,
    ) -> Self {
        Rejection {
            status,
            error: ErrorObject::new(code, message),
            fault,
            reason,
            headers: Vec::new(),
        }
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.error.data = Some(data);
        self
    }

    pub fn with_header(mut self, name: http::HeaderName, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn parse_error(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            codes::PARSE_ERROR,
            message,
            Fault::Client,
            "parse_error",
        )
    }

    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_REQUEST,
            message,
            Fault::Client,
            "invalid_request",
        )
    }

    pub fn invalid_params(message: impl Into<String>, reason: &'static str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_PARAMS,
            message,
            Fault::Client,
            reason,
        )
    }

    pub fn header_mismatch(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            codes::HEADER_MISMATCH,
            message,
            Fault::Client,
            "header_mismatch",
        )
    }

    pub fn unsupported_version(requested: &str, supported: &[&str]) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            codes::UNSUPPORTED_PROTOCOL_VERSION,
            "Unsupported protocol version",
            Fault::Client,
            "unsupported_version",
        )
        .with_data(json!({"supported": supported, "requested": requested}))
    }

    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            codes::METHOD_NOT_FOUND,
            format!("Method not found: {method}"),
            Fault::Client,
            "method_not_found",
        )
    }

    pub fn missing_capability(required: Value, what: &str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            codes::MISSING_REQUIRED_CLIENT_CAPABILITY,
            format!("this request needs a client capability it did not declare: {what}"),
            Fault::Client,
            "missing_client_capability",
        )
        .with_data(json!({"requiredCapabilities": required}))
    }

    /// Every `requestState` failure looks the same to the client; `reason` goes to logs/metrics.
    pub fn bad_state(reason: &'static str) -> Self {
        Self::invalid_params(
            "requestState is invalid, expired or not valid for this request",
            reason,
        )
    }

    pub fn upstream(message: impl Into<String>, reason: &'static str) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            codes::INTERNAL_ERROR,
            message,
            Fault::Upstream,
            reason,
        )
    }

    pub fn upstream_timeout(message: impl Into<String>, reason: &'static str) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            codes::INTERNAL_ERROR,
            message,
            Fault::Upstream,
            reason,
        )
    }

    pub fn internal(message: impl Into<String>, reason: &'static str) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            codes::INTERNAL_ERROR,
            message,
            Fault::Internal,
            reason,
        )
    }

    /// The legacy server ended the call needing something the gateway's policy will not show
    /// the client (a URL elicitation of a legacy -32042 error): like the legacy server's own
    /// errors, a JSON-RPC error over HTTP 200, naming only the policy's reason.
    pub fn policy_refused(message: impl Into<String>, policy_reason: &'static str) -> Self {
        Self::new(
            StatusCode::OK,
            codes::INTERNAL_ERROR,
            message,
            Fault::Upstream,
            "policy_refused",
        )
        .with_data(json!({"policyReason": policy_reason}))
    }

    /// This caller holds its quota of something (429); others are still served. The message
    /// names the quota's key; a `Retry-After` goes with it.
    pub fn caller_quota(message: impl Into<String>, reason: &'static str) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            codes::INTERNAL_ERROR,
            message,
            Fault::Client,
            reason,
        )
    }

    pub fn unavailable(message: impl Into<String>, reason: &'static str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::INTERNAL_ERROR,
            message,
            Fault::Internal,
            reason,
        )
    }
}
