//! A request the legacy server sent, read once for every reader of a session (the capture
//! loop, listen streams): its id, method and params, and `ping`, answered here and nowhere
//! else.

use serde_json::{Value, json};

use super::session::{LegacySession, SessionError};

/// The parts of a server request the gateway reads.
pub struct ServerRequest<'m> {
    /// The server's id (its own id space), to answer with.
    pub id: Value,
    pub method: &'m str,
    /// `None` when absent or null.
    pub params: Option<&'m Value>,
}

impl<'m> ServerRequest<'m> {
    pub fn of(msg: &'m Value) -> ServerRequest<'m> {
        ServerRequest {
            id: msg.get("id").cloned().unwrap_or(Value::Null),
            method: msg
                .get("method")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            params: msg.get("params").filter(|p| !p.is_null()),
        }
    }

    /// Answers `ping` with `{}` (any reader, any session); `None` for every other method,
    /// which the reader answers itself.
    pub async fn answer_ping(&self, session: &LegacySession) -> Option<Result<(), SessionError>> {
        (self.method == "ping").then_some(())?;
        Some(session.respond(&self.id, Ok(json!({}))).await)
    }
}
