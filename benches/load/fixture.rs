//! The fast legacy server every mode calls: the in-repo `legacy_server` with per-message
//! recording off, and the tools the load runs need.
//!
//! - `echo` returns its `text` argument (the plain `tools/call`);
//! - `ask` asks one form question on the call stream, then returns the answer (two MRTR
//!   rounds through the gateway; one inline answer on the direct path);
//! - `ask_twice` asks two questions one after the other (three MRTR rounds);
//! - `slow` sends one progress notification, then waits until cancelled (at most a minute):
//!   the tool that client disconnects abandon.

use std::time::Duration;

use mrtr_testkit::legacy_server::{Handlers, LegacyServer, LegacyServerConfig};
use serde_json::{Value, json};

/// What `ask` and `ask_twice` ask for.
pub fn form(field: &str) -> Value {
    json!({"type": "object", "properties": {field: {"type": "string"}}, "required": [field]})
}

fn text(s: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": s.into()}]})
}

/// The text of a `CallToolResult`.
pub fn text_of(result: &Value) -> &str {
    result
        .pointer("/content/0/text")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Answers a form elicitation (a legacy server request, or a modern `inputRequests` entry:
/// both carry `params.requestedSchema`) with `"<field>-answer"` for every field, and a
/// `roots/list` (asked only of clients run with `--roots`) with no roots.
pub fn answer_form(request: &Value) -> Value {
    if request["method"] == "roots/list" {
        return json!({"roots": []});
    }
    let mut content = serde_json::Map::new();
    if let Some(props) = request
        .pointer("/params/requestedSchema/properties")
        .and_then(Value::as_object)
    {
        for k in props.keys() {
            content.insert(k.clone(), json!(format!("{k}-answer")));
        }
    }
    json!({"action": "accept", "content": content})
}

fn answered(a: &Value, field: &str) -> String {
    a["content"][field].as_str().unwrap_or("?").to_owned()
}

pub fn handlers() -> Handlers {
    let object = json!({"type": "object"});
    Handlers::new()
        .tool(
            "echo",
            "returns its text",
            object.clone(),
            |_ctx, args| async move { Ok(text(args["text"].as_str().unwrap_or_default())) },
        )
        .tool("ask", "asks a name", object.clone(), |ctx, _| async move {
            let a = ctx.elicit_form("Your name?", form("name")).await?;
            Ok(text(format!("Hello, {}", answered(&a, "name"))))
        })
        .tool(
            "ask_twice",
            "asks a name, then a city",
            object.clone(),
            |ctx, _| async move {
                let a = ctx.elicit_form("Your name?", form("name")).await?;
                let b = ctx.elicit_form("Your city?", form("city")).await?;
                Ok(text(format!(
                    "{} from {}",
                    answered(&a, "name"),
                    answered(&b, "city")
                )))
            },
        )
        .tool(
            "slow",
            "waits until cancelled",
            object,
            |ctx, _| async move {
                ctx.progress(0.0, Some(1.0), Some("started"));
                tokio::select! {
                    _ = ctx.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                }
                Ok(text("done"))
            },
        )
}

/// Starts the server. `server_request_timeout: None` lets questions wait for ever (parked
/// calls must outlive the server's default minute).
pub async fn start(server_request_timeout: Option<Duration>) -> std::io::Result<LegacyServer> {
    let config = LegacyServerConfig {
        record_messages: false,
        server_request_timeout,
        ..Default::default()
    };
    LegacyServer::start(config, handlers()).await
}
