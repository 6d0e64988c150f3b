//! What the gateway does with each modern method.

/// How a modern method is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `server/discover`: answered from the cached legacy `InitializeResult`.
    Discover,
    /// `tools/call`, `prompts/get`, `resources/read`: may end in `input_required`.
    Mrtr,
    /// Forwarded as-is through a legacy session; never `input_required`.
    Forward,
    /// `subscriptions/listen`.
    Listen,
    /// `tasks/get`, `tasks/update`, `tasks/cancel` (the Tasks extension): answered by the
    /// gateway from its task records, never sent upstream.
    Tasks,
    /// Removed in 2026-07-28 or never defined: 404 + -32601.
    NotFound,
}

/// The legacy server capability a method needs (`None`: always available).
pub fn required_server_capability(method: &str) -> Option<&'static str> {
    match method {
        "tools/list" | "tools/call" => Some("tools"),
        "prompts/list" | "prompts/get" => Some("prompts"),
        "resources/list" | "resources/templates/list" | "resources/read" => Some("resources"),
        "completion/complete" => Some("completions"),
        _ => None,
    }
}

pub fn route(method: &str) -> Route {
    match method {
        "server/discover" => Route::Discover,
        "tools/call" | "prompts/get" | "resources/read" => Route::Mrtr,
        "tools/list"
        | "prompts/list"
        | "resources/list"
        | "resources/templates/list"
        | "completion/complete" => Route::Forward,
        "subscriptions/listen" => Route::Listen,
        "tasks/get" | "tasks/update" | "tasks/cancel" => Route::Tasks,
        // initialize, ping, logging/setLevel, resources/subscribe, resources/unsubscribe and
        // anything unknown.
        _ => Route::NotFound,
    }
}

/// The body member an `Mcp-Name` header must match, for the methods that have one.
pub fn name_param(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    }
}

/// Results that carry `ttlMs` / `cacheScope`.
pub fn is_cacheable(method: &str) -> bool {
    matches!(
        method,
        "tools/list"
            | "prompts/list"
            | "resources/list"
            | "resources/templates/list"
            | "resources/read"
            | "server/discover"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_methods_are_not_found() {
        for m in [
            "initialize",
            "ping",
            "logging/setLevel",
            "resources/subscribe",
            "resources/unsubscribe",
            "notifications/initialized",
            "bogus/method",
        ] {
            assert_eq!(route(m), Route::NotFound, "{m}");
        }
        assert_eq!(route("tools/call"), Route::Mrtr);
        assert_eq!(route("tools/list"), Route::Forward);
        for m in ["tasks/get", "tasks/update", "tasks/cancel"] {
            assert_eq!(route(m), Route::Tasks, "{m}");
            assert_eq!(name_param(m), Some("taskId"), "{m}");
        }
        assert_eq!(route("tasks/list"), Route::NotFound);
        assert_eq!(route("tasks/result"), Route::NotFound);
    }
}
