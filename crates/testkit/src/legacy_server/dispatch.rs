//! Answers one client request (everything but `initialize`): the built-in
//! protocol methods and the registered tool/prompt/resource handlers, run
//! under the call's cancellation token.

use serde_json::{Value, json};

use super::context::ToolContext;
use super::handlers::HandlerResult;
use super::jsonrpc::RpcError;

/// Run a request until it finishes or is cancelled (`None`).
pub(crate) async fn run_cancellable(
    ctx: ToolContext,
    method: &str,
    params: Value,
) -> Option<HandlerResult> {
    let token = ctx.cancel_token().clone();
    tokio::select! {
        biased;
        _ = token.cancelled() => None,
        outcome = execute(ctx, method, params) => Some(outcome),
    }
}

fn str_param<'a>(params: &'a Value, key: &str) -> Result<&'a str, RpcError> {
    params
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params(format!("missing string parameter \"{key}\"")))
}

async fn execute(ctx: ToolContext, method: &str, params: Value) -> HandlerResult {
    let shared = ctx.shared().clone();
    let handlers = shared.handlers();
    if let Some(handler) = handlers.method_handler(method) {
        return handler(ctx, params).await;
    }
    match method {
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": handlers.tool_list()})),
        "tools/call" => {
            let name = str_param(&params, "name")?;
            let entry = handlers
                .tool_entry(name)
                .ok_or_else(|| RpcError::invalid_params(format!("Unknown tool: {name}")))?;
            let arguments = match params.get("arguments") {
                Some(Value::Null) | None => json!({}),
                Some(args) => args.clone(),
            };
            shared.stats.record_tool_start(name);
            let outcome = (entry.handler)(ctx, arguments).await;
            shared.stats.record_tool_finish(name);
            outcome
        }
        "prompts/list" => Ok(json!({"prompts": handlers.prompt_list()})),
        "prompts/get" => {
            let name = str_param(&params, "name")?;
            let entry = handlers
                .prompt_entry(name)
                .ok_or_else(|| RpcError::invalid_params(format!("Unknown prompt: {name}")))?;
            let arguments = params.get("arguments").cloned().unwrap_or(json!({}));
            (entry.handler)(ctx, arguments).await
        }
        "resources/list" => Ok(json!({"resources": handlers.resource_list()})),
        "resources/templates/list" => Ok(json!({"resourceTemplates": handlers.template_list()})),
        "resources/read" => {
            let uri = str_param(&params, "uri")?;
            let (entry, variables) = handlers.resource_entry(uri).ok_or_else(|| {
                RpcError::new(-32002, format!("Resource not found: {uri}"))
                    .with_data(json!({"uri": uri}))
            })?;
            let arg = match variables {
                Some(vars) => json!({"uri": uri, "variables": vars}),
                None => json!({"uri": uri}),
            };
            (entry.handler)(ctx, arg).await
        }
        "resources/subscribe" | "resources/unsubscribe" => {
            let uri = str_param(&params, "uri")?;
            ctx.session()
                .subscribe(uri, method == "resources/subscribe");
            Ok(json!({}))
        }
        "completion/complete" => match handlers.completion_handler() {
            Some(handler) => handler(ctx, params).await,
            None => Ok(json!({"completion": {"values": [], "hasMore": false}})),
        },
        "logging/setLevel" => {
            let level = str_param(&params, "level")?;
            if ctx.session().set_log_level(level) {
                Ok(json!({}))
            } else {
                Err(RpcError::invalid_params(format!(
                    "unknown log level {level}"
                )))
            }
        }
        other => Err(RpcError::method_not_found(other)),
    }
}
