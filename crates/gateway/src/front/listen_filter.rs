//! The notifications a `subscriptions/listen` stream carries: the client's request
//! (`params.notifications`), parsed strictly, and what the legacy server's capabilities let
//! the gateway agree to.

use serde_json::{Map, Value, json};

use crate::error::{Rejection, RejectionKind};

/// The notifications a listen stream carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub tools: bool,
    pub prompts: bool,
    pub resources: bool,
    /// Resource URIs for `notifications/resources/updated` (no duplicates, request order).
    pub uris: Vec<String>,
}

pub(super) fn bad_filter(message: String) -> Rejection {
    Rejection::new(RejectionKind::InvalidListenFilter, message)
}

impl Filter {
    /// Reads `params.notifications`; every member is optional and off unless set.
    pub fn parse(params: &Value) -> Result<Filter, Rejection> {
        let Some(n) = params.get("notifications") else {
            return Err(bad_filter(
                "subscriptions/listen needs params.notifications (an object; each member opts in)"
                    .into(),
            ));
        };
        let Some(n) = n.as_object() else {
            return Err(bad_filter("params.notifications must be an object".into()));
        };
        let flag = |key: &str| match n.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(bad_filter(format!(
                "params.notifications.{key} must be a boolean"
            ))),
        };
        let mut uris: Vec<String> = Vec::new();
        match n.get("resourceSubscriptions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                for item in items {
                    match item.as_str() {
                        Some(u) if !u.is_empty() => {
                            if !uris.iter().any(|have| have == u) {
                                uris.push(u.to_string());
                            }
                        }
                        _ => {
                            return Err(bad_filter(
                                "params.notifications.resourceSubscriptions must hold non-empty URI strings"
                                    .into(),
                            ));
                        }
                    }
                }
            }
            Some(_) => {
                return Err(bad_filter(
                    "params.notifications.resourceSubscriptions must be an array of URIs".into(),
                ));
            }
        }
        Ok(Filter {
            tools: flag("toolsListChanged")?,
            prompts: flag("promptsListChanged")?,
            resources: flag("resourcesListChanged")?,
            uris,
        })
    }

    /// What of this filter a legacy server with `capabilities` can deliver.
    pub fn agreed(&self, capabilities: &Value) -> Filter {
        let declared = |section: &str, member: &str| {
            capabilities.pointer(&format!("/{section}/{member}")) == Some(&Value::Bool(true))
        };
        Filter {
            tools: self.tools && declared("tools", "listChanged"),
            prompts: self.prompts && declared("prompts", "listChanged"),
            resources: self.resources && declared("resources", "listChanged"),
            uris: if declared("resources", "subscribe") {
                self.uris.clone()
            } else {
                Vec::new()
            },
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.tools && !self.prompts && !self.resources && self.uris.is_empty()
    }

    /// The wire form: only the members that are on.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        for (key, on) in [
            ("toolsListChanged", self.tools),
            ("promptsListChanged", self.prompts),
            ("resourcesListChanged", self.resources),
        ] {
            if on {
                m.insert(key.into(), Value::Bool(true));
            }
        }
        if !self.uris.is_empty() {
            m.insert("resourceSubscriptions".into(), json!(self.uris));
        }
        Value::Object(m)
    }

    /// Whether the legacy notification `msg` belongs on the stream.
    pub fn admits(&self, msg: &Value) -> bool {
        match msg.get("method").and_then(Value::as_str) {
            Some("notifications/tools/list_changed") => self.tools,
            Some("notifications/prompts/list_changed") => self.prompts,
            Some("notifications/resources/list_changed") => self.resources,
            Some("notifications/resources/updated") => msg
                .pointer("/params/uri")
                .and_then(Value::as_str)
                .is_some_and(|u| self.uris.iter().any(|have| have == u)),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::listen::{SUBSCRIPTION_ID, tagged};
    use mrtr_wire::jsonrpc::codes;

    #[test]
    fn filters_parse_strictly_and_default_to_off() {
        let f = Filter::parse(&json!({"notifications": {
            "toolsListChanged": true, "promptsListChanged": false,
            "resourceSubscriptions": ["a://1", "a://2", "a://1"], "future": 1
        }}))
        .unwrap();
        assert!(f.tools && !f.prompts && !f.resources);
        assert_eq!(f.uris, ["a://1", "a://2"]);
        assert!(
            Filter::parse(&json!({"notifications": {}}))
                .unwrap()
                .is_empty()
        );
        for bad in [
            json!({}),
            json!({"notifications": []}),
            json!({"notifications": {"toolsListChanged": "yes"}}),
            json!({"notifications": {"resourceSubscriptions": "a://1"}}),
            json!({"notifications": {"resourceSubscriptions": [1]}}),
            json!({"notifications": {"resourceSubscriptions": [""]}}),
        ] {
            let e = Filter::parse(&bad).unwrap_err();
            assert_eq!(e.kind(), RejectionKind::InvalidListenFilter, "{bad}");
            let answer = crate::front::error_map::answer(&e);
            assert_eq!(answer.error.code, codes::INVALID_PARAMS, "{bad}");
        }
    }

    #[test]
    fn the_agreed_filter_is_what_the_server_declares() {
        let asked = Filter {
            tools: true,
            prompts: true,
            resources: true,
            uris: vec!["a://1".into()],
        };
        let caps = json!({"tools": {"listChanged": true}, "prompts": {"listChanged": false},
                          "resources": {"subscribe": true}});
        let agreed = asked.agreed(&caps);
        assert_eq!(
            agreed.to_json(),
            json!({"toolsListChanged": true, "resourceSubscriptions": ["a://1"]})
        );
        assert!(asked.agreed(&json!({})).is_empty());
    }

    #[test]
    fn only_agreed_notifications_pass_and_they_are_tagged() {
        let f = Filter {
            tools: true,
            uris: vec!["a://1".into()],
            ..Default::default()
        };
        let n = |m: &str, p: Value| json!({"jsonrpc": "2.0", "method": m, "params": p});
        assert!(f.admits(&n("notifications/tools/list_changed", json!({}))));
        assert!(!f.admits(&n("notifications/prompts/list_changed", json!({}))));
        assert!(f.admits(&n(
            "notifications/resources/updated",
            json!({"uri": "a://1"})
        )));
        assert!(!f.admits(&n(
            "notifications/resources/updated",
            json!({"uri": "a://2"})
        )));
        assert!(!f.admits(&n("notifications/progress", json!({"progressToken": 1}))));
        assert!(!f.admits(&n("notifications/message", json!({"level": "info"}))));
        let t = tagged(
            json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
            &json!("L1"),
        );
        assert_eq!(t["params"]["_meta"][SUBSCRIPTION_ID], "L1");
        let t = tagged(
            n(
                "notifications/resources/updated",
                json!({"uri": "a://1", "_meta": {"x": 1}}),
            ),
            &json!(7),
        );
        assert_eq!(t["params"]["_meta"], json!({"x": 1, SUBSCRIPTION_ID: 7}));
        assert_eq!(t["params"]["uri"], "a://1");
    }
}
