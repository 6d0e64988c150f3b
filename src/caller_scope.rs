//! What separates two callers' views of the legacy server.
//!
//! A legacy server answers each session according to what the session presents: the
//! credential the gateway forwards (or its static token) and, when clients authenticate, the
//! principal the gateway keys that session under. Anything the gateway keeps from one legacy
//! session and could hand to another request — warm sessions, the notifications a session
//! emits, the `InitializeResult` it answered — is therefore kept per [`CallerScope`], never
//! per something coarser.

/// The principal a request is served as and the credential forwarded upstream for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallerScope {
    /// The authenticated principal (`anonymous` with `[auth] mode = "none"`).
    pub principal: String,
    /// A non-secret digest of the credential sent upstream ("" when none is sent); see
    /// [`crate::auth::upstream_credentials::UpstreamCredentials::credential_key`].
    pub credential: String,
}

impl CallerScope {
    pub fn new(principal: impl Into<String>, credential: impl Into<String>) -> CallerScope {
        CallerScope {
            principal: principal.into(),
            credential: credential.into(),
        }
    }
}
