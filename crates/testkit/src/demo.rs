//! The demo (`cargo run -- demo`): the whole bridge in one process.
//!
//! It starts the in-repo legacy server (2025-11-25 Streamable HTTP, sessions, SSE, server
//! requests on the call stream and on the GET stream) with the demo tools, puts the gateway in
//! front of it on a loopback port, and runs a scripted 2026-07-28 client through `plan_trip`:
//! a form elicitation, then sampling, then one round with a parallel `roots/list` and a
//! confirmation. Every round's `inputRequests` and the size of its `requestState` are printed,
//! then the final result. The demo fails (non-zero exit) if any step does not behave.

use serde_json::{Value, json};

use crate::client::ModernClient;
use crate::legacy_server::{LegacyServer, LegacyServerConfig, demo_handlers};
use mrtr_gateway::config::Config;
use mrtr_gateway::front::listener;
use mrtr_gateway::gateway::Gateway;

/// The scripted user and model of the demo.
fn answer(_key: &str, req: &Value) -> Result<Value, String> {
    let method = req["method"].as_str().unwrap_or_default();
    match method {
        "elicitation/create" => {
            let props = req
                .pointer("/params/requestedSchema/properties")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let mut content = serde_json::Map::new();
            for name in props.keys() {
                let v = match name.as_str() {
                    "name" => json!("Ada"),
                    "destination" => json!("Lisbon"),
                    "confirm" => json!(true),
                    _ => json!("yes"),
                };
                content.insert(name.clone(), v);
            }
            Ok(json!({"action": "accept", "content": content}))
        }
        "sampling/createMessage" => Ok(json!({
            "role": "assistant",
            "content": {"type": "text", "text": "Ride tram 28 up to the Alfama at sunset."},
            "model": "demo-model",
            "stopReason": "endTurn"
        })),
        "roots/list" => Ok(json!({"roots": [{"uri": "file:///home/ada/trips", "name": "trips"}]})),
        other => Err(format!("the demo client cannot answer {other}")),
    }
}

fn demo_config(upstream: &str) -> Result<Config, String> {
    let text = format!(
        "[listen]\naddr = \"127.0.0.1:0\"\n[upstream]\nurl = \"{upstream}\"\n[log]\nformat = \"text\"\n{}",
        mrtr_gateway::config::new_key::new_key_toml()
    );
    Config::from_toml_str(&text, &[], None).map_err(|e| e.to_string())
}

pub async fn run() -> Result<(), String> {
    let legacy = LegacyServer::start(LegacyServerConfig::default(), demo_handlers())
        .await
        .map_err(|e| format!("cannot start the demo legacy server: {e}"))?;
    println!(
        "legacy server (2025-11-25, Streamable HTTP): {}",
        legacy.url()
    );

    let gw = Gateway::new(demo_config(&legacy.url())?);
    let running = listener::start(gw.front.clone(), gw.config().listen.addr)
        .await
        .map_err(|e| format!("cannot start the gateway: {e}"))?;
    let url = format!("http://{}{}", running.addr, gw.config().listen.path);
    println!("gateway (2026-07-28, stateless MRTR):        {url}\n");

    let client = ModernClient::new(&url);
    let discover = client
        .request("server/discover", json!({}))
        .await
        .map_err(|e| e.to_string())?;
    let server_name = discover
        .result()
        .and_then(|r| r.pointer("/_meta/io.modelcontextprotocol~1serverInfo/name"))
        .cloned()
        .unwrap_or(Value::Null);
    println!("server/discover -> serverInfo.name {server_name}");

    let params = json!({"name": "plan_trip", "arguments": {}, "_meta": {"progressToken": "demo"}});
    let (rounds, last) = client
        .call_with_input("tools/call", params, &mut answer, 8)
        .await
        .map_err(|e| e.to_string())?;
    for (i, round) in rounds.iter().enumerate() {
        println!(
            "round {}: input_required, requestState {} bytes, {} progress notification(s)",
            i + 1,
            round.request_state_len,
            round.exchange.notifications.len()
        );
        for (key, req) in &round.input_requests {
            let summary = match req["method"].as_str() {
                Some("elicitation/create") => {
                    format!(
                        "elicitation: {}",
                        req.pointer("/params/message").unwrap_or(&Value::Null)
                    )
                }
                Some("sampling/createMessage") => format!(
                    "sampling: {}",
                    req.pointer("/params/messages/0/content/text")
                        .unwrap_or(&Value::Null)
                ),
                Some(m) => m.to_string(),
                None => "?".into(),
            };
            println!("  {key:<22} {summary}");
        }
    }
    let text = last
        .result()
        .and_then(|r| r.pointer("/content/0/text"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let outcome = match (&text, last.result_type()) {
        (Some(t), Some("complete")) => {
            println!("\nfinal result after {} round(s): {t}", rounds.len());
            let expected_rounds = 3;
            if rounds.len() != expected_rounds
                || !t.contains("Confirmed: yes")
                || !t.contains("file:///home/ada/trips")
            {
                Err(format!(
                    "unexpected flow: {} rounds, result {t:?}",
                    rounds.len()
                ))
            } else {
                Ok(())
            }
        }
        _ => Err(format!(
            "the call did not complete: HTTP {} {}",
            last.status,
            String::from_utf8_lossy(&last.raw_body)
        )),
    };
    println!(
        "legacy tool executions: {} (1 when every retry resumed the call parked on this replica; a retry\n  \
         that lands on another replica replays the call there, one more execution per round)",
        legacy.stats().tool_starts("plan_trip")
    );
    running.stop().await;
    legacy.shutdown().await;
    outcome
}
