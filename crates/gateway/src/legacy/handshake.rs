//! The legacy `initialize` exchange, the same on every transport: the request the gateway
//! sends, the checks on the answer, and the memory of which version the server chose.
//!
//! Capability shapes depend on the protocol version (see [`mrtr_wire::capabilities`]), and the
//! capabilities go out in the very `initialize` that negotiates the version. So the gateway
//! remembers the version a server answered with last time and asks for that one next time;
//! a server that speaks only an older version costs one mis-shaped `initialize`, once.
//!
//! Every session keeps the server's `InitializeResult` (what discover and `server/info`
//! answer from). Sessions to one server nearly always get the same one, so the memory keeps
//! the last and a session whose answer equals it shares it: a few kilobytes per session,
//! idle in the pool or parked, held once. An answer that differs (per caller, say) is kept
//! apart, as it came.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::session::SessionError;
use crate::config::LEGACY_VERSIONS;

/// The version to request next: the configured one, or the older one the server chose; and
/// the server's last `InitializeResult`, to share.
#[derive(Debug)]
pub struct VersionMemory {
    configured: String,
    learned: Mutex<Option<String>>,
    last_result: Mutex<Option<Arc<Value>>>,
}

impl VersionMemory {
    pub fn new(configured: &str) -> VersionMemory {
        VersionMemory {
            configured: configured.to_string(),
            learned: Mutex::new(None),
            last_result: Mutex::new(None),
        }
    }

    /// `result`, shared with the last one when they are equal.
    fn share(&self, result: Value) -> Arc<Value> {
        let mut last = self.last_result.lock().unwrap_or_else(|e| e.into_inner());
        match &*last {
            Some(l) if **l == result => l.clone(),
            _ => {
                let fresh = Arc::new(result);
                *last = Some(fresh.clone());
                fresh
            }
        }
    }

    /// The version to put in the next `initialize`.
    pub fn request_version(&self) -> String {
        self.learned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| self.configured.clone())
    }

    /// Records the version a server negotiated (only an older one is worth remembering).
    pub fn learn(&self, negotiated: &str) {
        let mut learned = self.learned.lock().unwrap_or_else(|e| e.into_inner());
        *learned = (negotiated < self.configured.as_str()).then(|| negotiated.to_string());
    }
}

/// `params` of the gateway's `initialize` request.
pub fn initialize_params(version: &str, capabilities: Value, client_name: &str) -> Value {
    json!({
        "protocolVersion": version,
        "capabilities": capabilities,
        "clientInfo": {"name": client_name, "version": env!("CARGO_PKG_VERSION")},
    })
}

/// A checked `InitializeResult`.
#[derive(Debug)]
pub struct Initialized {
    pub negotiated_version: String,
    pub init_result: Arc<Value>,
}

/// Checks the JSON-RPC response to `initialize` and learns its version.
pub fn accept(response: &Value, versions: &VersionMemory) -> Result<Initialized, SessionError> {
    if let Some(err) = response.get("error") {
        return Err(SessionError::Initialize(format!("JSON-RPC error {err}")));
    }
    let result = response
        .get("result")
        .cloned()
        .ok_or_else(|| SessionError::Initialize("response carries no result".into()))?;
    let version = result
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if !LEGACY_VERSIONS.contains(&version.as_str()) {
        return Err(SessionError::Initialize(format!(
            "the server chose protocol version {version:?}, which this gateway does not speak"
        )));
    }
    versions.learn(&version);
    Ok(Initialized {
        negotiated_version: version,
        init_result: versions.share(result),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_answer_is_remembered_and_a_newer_one_forgets_it() {
        let v = VersionMemory::new("2025-11-25");
        assert_eq!(v.request_version(), "2025-11-25");
        let older = json!({"result": {"protocolVersion": "2025-03-26"}});
        assert_eq!(accept(&older, &v).unwrap().negotiated_version, "2025-03-26");
        assert_eq!(v.request_version(), "2025-03-26");
        let current = json!({"result": {"protocolVersion": "2025-11-25"}});
        accept(&current, &v).unwrap();
        assert_eq!(v.request_version(), "2025-11-25");
    }

    #[test]
    fn equal_answers_share_one_copy_and_a_different_one_is_its_own() {
        let v = VersionMemory::new("2025-11-25");
        let answer = |name: &str| json!({"result": {"protocolVersion": "2025-11-25", "serverInfo": {"name": name}}});
        let a = accept(&answer("one"), &v).unwrap().init_result;
        let b = accept(&answer("one"), &v).unwrap().init_result;
        assert!(Arc::ptr_eq(&a, &b), "shared");
        let c = accept(&answer("two"), &v).unwrap().init_result;
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(c["serverInfo"]["name"], "two");
        assert_eq!(a["serverInfo"]["name"], "one");
    }

    #[test]
    fn unknown_versions_and_errors_are_refused() {
        let v = VersionMemory::new("2025-11-25");
        let odd = json!({"result": {"protocolVersion": "1999-01-01"}});
        assert!(matches!(accept(&odd, &v), Err(SessionError::Initialize(_))));
        let err = json!({"error": {"code": -32600, "message": "no"}});
        assert!(matches!(accept(&err, &v), Err(SessionError::Initialize(_))));
        assert_eq!(v.request_version(), "2025-11-25");
    }
}
