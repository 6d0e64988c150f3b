//! The demo tool set behind `mrtr-gateway demo`: `plan_trip` (form
//! elicitation, sampling, then a parallel round of `roots/list` on the GET
//! stream and a confirmation elicitation on the call stream), `add` and
//! `echo`.

use serde_json::{Value, json};

use super::context::ToolContext;
use super::handlers::{HandlerResult, Handlers};
use super::jsonrpc::RpcError;

fn text_result(text: String) -> Value {
    json!({"content": [{"type": "text", "text": text}]})
}

fn tool_error(text: String) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

/// The handlers used by `mrtr-gateway demo`.
pub fn demo_handlers() -> Handlers {
    Handlers::new()
        .tool(
            "plan_trip",
            "Plan a trip: asks who is travelling where, asks the model for an idea, \
             checks the client's roots and asks for confirmation.",
            json!({"type": "object", "properties": {}}),
            |ctx, _args| plan_trip(ctx),
        )
        .tool(
            "add",
            "Add two numbers.",
            json!({
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            }),
            |_ctx, args| async move {
                let (Some(a), Some(b)) = (args["a"].as_f64(), args["b"].as_f64()) else {
                    return Err(RpcError::invalid_params("a and b must be numbers"));
                };
                let sum = a + b;
                let mut result = text_result(format_number(sum));
                result["structuredContent"] = json!({"sum": sum});
                Ok(result)
            },
        )
        .tool(
            "echo",
            "Echo the message back.",
            json!({
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
            }),
            |_ctx, args| async move {
                let message = args["message"].as_str().unwrap_or_default().to_owned();
                Ok(text_result(message))
            },
        )
}

fn format_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

/// The text of a sampling result (`content` may be one block or an array).
fn sampled_text(result: &Value) -> Option<String> {
    let content = &result["content"];
    let block = match content {
        Value::Array(blocks) => blocks.iter().find(|b| b["type"] == "text")?,
        other => other,
    };
    block["text"].as_str().map(str::to_owned)
}

fn accepted_content(answer: &Value) -> Option<&Value> {
    (answer["action"] == "accept").then(|| &answer["content"])
}

async fn plan_trip(ctx: ToolContext) -> HandlerResult {
    let caps = ctx.client_capabilities().clone();
    if caps.get("elicitation").is_none() || caps.get("sampling").is_none() {
        return Ok(tool_error(
            "plan_trip needs a client that supports elicitation and sampling".into(),
        ));
    }
    let steps = 4.0;
    ctx.progress(0.0, Some(steps), Some("asking for traveller details"));

    let details = ctx
        .elicit_form(
            "Who is travelling, and where to?",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "title": "Traveller name"},
                    "destination": {"type": "string", "title": "Destination"},
                },
                "required": ["name", "destination"],
            }),
        )
        .await?;
    let Some(content) = accepted_content(&details) else {
        return Ok(text_result(format!(
            "Trip planning stopped: the traveller chose to {}.",
            details["action"].as_str().unwrap_or("not answer")
        )));
    };
    let name = content["name"].as_str().unwrap_or("traveller").to_owned();
    let destination = content["destination"]
        .as_str()
        .unwrap_or("somewhere")
        .to_owned();
    ctx.progress(1.0, Some(steps), Some("asking the model for an idea"));

    let sample = ctx
        .create_message(json!({
            "messages": [{
                "role": "user",
                "content": {
                    "type": "text",
                    "text": format!("Suggest a one-line trip idea for {destination}."),
                },
            }],
            "maxTokens": 100,
        }))
        .await?;
    let suggestion = sampled_text(&sample).unwrap_or_else(|| "(no suggestion)".into());
    ctx.progress(
        2.0,
        Some(steps),
        Some("checking roots and asking for confirmation"),
    );

    let wants_roots = caps.get("roots").is_some();
    let roots = async {
        if wants_roots {
            Some(ctx.list_roots().await)
        } else {
            None
        }
    };
    let question = format!("Book the trip to {destination} for {name}?");
    let confirm = ctx.elicit_form(
        &question,
        json!({
            "type": "object",
            "properties": {"confirm": {"type": "boolean", "title": "Confirm booking"}},
            "required": ["confirm"],
        }),
    );
    let (roots, confirm) = tokio::join!(roots, confirm);
    let confirmation = confirm?;
    let confirmed = accepted_content(&confirmation)
        .and_then(|c| c["confirm"].as_bool())
        .unwrap_or(false);
    let roots_text = match roots {
        None => "not supported by the client".to_owned(),
        Some(Err(e)) => format!("unavailable ({})", e.message),
        Some(Ok(list)) => {
            let uris: Vec<&str> = list["roots"]
                .as_array()
                .map(|a| a.iter().filter_map(|r| r["uri"].as_str()).collect())
                .unwrap_or_default();
            if uris.is_empty() {
                "none".to_owned()
            } else {
                uris.join(", ")
            }
        }
    };
    ctx.progress(steps, Some(steps), Some("done"));
    Ok(text_result(format!(
        "Trip for {name} to {destination}: {suggestion} Roots: {roots_text}. Confirmed: {}.",
        if confirmed { "yes" } else { "no" }
    )))
}
