//! The handler registry: tools, prompts, resources, resource templates,
//! completion and custom request methods, each backed by an async closure
//! `Fn(ToolContext, Value) -> Future<Output = Result<Value, RpcError>>`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::context::ToolContext;
use super::jsonrpc::RpcError;

/// What a handler returns: the JSON-RPC `result` object, or an error.
pub type HandlerResult = Result<Value, RpcError>;
/// The boxed future of a handler.
pub type HandlerFuture = BoxFuture<'static, HandlerResult>;
/// A type-erased handler.
pub type Handler = Arc<dyn Fn(ToolContext, Value) -> HandlerFuture + Send + Sync>;

fn erase<F, Fut>(f: F) -> Handler
where
    F: Fn(ToolContext, Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    Arc::new(move |ctx, params| f(ctx, params).boxed())
}

#[derive(Clone)]
pub(crate) struct Entry {
    /// The listing entry (`Tool`, `Prompt`, `Resource`, `ResourceTemplate`).
    pub(crate) definition: Value,
    pub(crate) handler: Handler,
}

#[derive(Clone)]
pub(crate) struct TemplateEntry {
    pub(crate) entry: Entry,
    template: UriTemplate,
}

/// Everything the server can answer beyond the protocol basics.
///
/// ```
/// use mrtr_testkit::legacy_server::Handlers;
/// use serde_json::json;
///
/// let handlers = Handlers::new().tool(
///     "greet",
///     "Say hello",
///     json!({"type": "object"}),
///     |_ctx, args| async move {
///         let text = format!("hi {}", args["name"]);
///         Ok(json!({"content": [{"type": "text", "text": text}]}))
///     },
/// );
/// # let _ = handlers;
/// ```
#[derive(Clone, Default)]
pub struct Handlers {
    tools: Vec<Entry>,
    prompts: Vec<Entry>,
    resources: Vec<Entry>,
    templates: Vec<TemplateEntry>,
    completion: Option<Handler>,
    methods: HashMap<String, Handler>,
}

fn upsert(list: &mut Vec<Entry>, key: &str, key_field: &str, entry: Entry) {
    match list
        .iter_mut()
        .find(|e| e.definition.get(key_field).and_then(Value::as_str) == Some(key))
    {
        Some(slot) => *slot = entry,
        None => list.push(entry),
    }
}

impl Handlers {
    pub fn new() -> Self {
        Self::default()
    }

    /// Register a tool. Its handler gets the call's `arguments` (`{}` when
    /// absent) and returns a `CallToolResult` object.
    #[must_use]
    pub fn tool<F, Fut>(
        self,
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
        handler: F,
    ) -> Self
    where
        F: Fn(ToolContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        let definition = json!({
            "name": name.into(),
            "description": description.into(),
            "inputSchema": input_schema,
        });
        self.tool_definition(definition, handler)
    }

    /// Register a tool from a full `Tool` definition object (with `name`,
    /// and e.g. `title`, `outputSchema`, `annotations`).
    #[must_use]
    pub fn tool_definition<F, Fut>(mut self, definition: Value, handler: F) -> Self
    where
        F: Fn(ToolContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        let name = definition["name"].as_str().unwrap_or_default().to_owned();
        let entry = Entry {
            definition,
            handler: erase(handler),
        };
        upsert(&mut self.tools, &name, "name", entry);
        self
    }

    /// Register a prompt. `arguments` is the `PromptArgument` array; the
    /// handler gets the `arguments` object of `prompts/get` and returns a
    /// `GetPromptResult`.
    #[must_use]
    pub fn prompt<F, Fut>(
        mut self,
        name: impl Into<String>,
        description: impl Into<String>,
        arguments: Value,
        handler: F,
    ) -> Self
    where
        F: Fn(ToolContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        let name = name.into();
        let entry = Entry {
            definition: json!({
                "name": name,
                "description": description.into(),
                "arguments": arguments,
            }),
            handler: erase(handler),
        };
        upsert(&mut self.prompts, &name, "name", entry);
        self
    }

    /// Register a fixed resource. The handler gets the `resources/read`
    /// params (`{"uri": ...}`) and returns a `ReadResourceResult`.
    #[must_use]
    pub fn resource<F, Fut>(
        mut self,
        uri: impl Into<String>,
        name: impl Into<String>,
        mime_type: Option<&str>,
        handler: F,
    ) -> Self
    where
        F: Fn(ToolContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        let uri = uri.into();
        let mut definition = json!({"uri": uri, "name": name.into()});
        if let Some(mime) = mime_type {
            definition["mimeType"] = json!(mime);
        }
        let entry = Entry {
            definition,
            handler: erase(handler),
        };
        upsert(&mut self.resources, &uri, "uri", entry);
        self
    }

    /// Register a resource template such as `profile://{user}`. The handler
    /// gets `{"uri": <concrete uri>, "variables": {"user": ...}}`.
    #[must_use]
    pub fn resource_template<F, Fut>(
        mut self,
        uri_template: impl Into<String>,
        name: impl Into<String>,
        handler: F,
    ) -> Self
    where
        F: Fn(ToolContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        let uri_template = uri_template.into();
        let template = UriTemplate::parse(&uri_template);
        self.templates
            .retain(|t| t.entry.definition["uriTemplate"] != uri_template.as_str());
        self.templates.push(TemplateEntry {
            entry: Entry {
                definition: json!({"uriTemplate": uri_template, "name": name.into()}),
                handler: erase(handler),
            },
            template,
        });
        self
    }

    /// Answer `completion/complete` (params passed through); without one the
    /// server answers with an empty completion.
    #[must_use]
    pub fn completion<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(ToolContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.completion = Some(erase(handler));
        self
    }

    /// Answer an arbitrary request method (params passed through). Takes
    /// precedence over the built-in handling of that method, except for
    /// `initialize`.
    #[must_use]
    pub fn method<F, Fut>(mut self, method: impl Into<String>, handler: F) -> Self
    where
        F: Fn(ToolContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.methods.insert(method.into(), erase(handler));
        self
    }

    // ----- lookups (crate-internal) -------------------------------------

    pub(crate) fn tool_entry(&self, name: &str) -> Option<&Entry> {
        self.tools
            .iter()
            .find(|e| e.definition["name"].as_str() == Some(name))
    }

    pub(crate) fn prompt_entry(&self, name: &str) -> Option<&Entry> {
        self.prompts
            .iter()
            .find(|e| e.definition["name"].as_str() == Some(name))
    }

    /// The handler for a URI, and the variables a template extracted.
    pub(crate) fn resource_entry(&self, uri: &str) -> Option<(&Entry, Option<Map<String, Value>>)> {
        if let Some(e) = self
            .resources
            .iter()
            .find(|e| e.definition["uri"].as_str() == Some(uri))
        {
            return Some((e, None));
        }
        self.templates
            .iter()
            .find_map(|t| t.template.matches(uri).map(|vars| (&t.entry, Some(vars))))
    }

    pub(crate) fn method_handler(&self, method: &str) -> Option<&Handler> {
        self.methods.get(method)
    }

    pub(crate) fn completion_handler(&self) -> Option<&Handler> {
        self.completion.as_ref()
    }

    pub(crate) fn tool_list(&self) -> Vec<Value> {
        self.tools.iter().map(|e| e.definition.clone()).collect()
    }

    pub(crate) fn prompt_list(&self) -> Vec<Value> {
        self.prompts.iter().map(|e| e.definition.clone()).collect()
    }

    pub(crate) fn resource_list(&self) -> Vec<Value> {
        self.resources
            .iter()
            .map(|e| e.definition.clone())
            .collect()
    }

    pub(crate) fn template_list(&self) -> Vec<Value> {
        self.templates
            .iter()
            .map(|t| t.entry.definition.clone())
            .collect()
    }

    /// Server capabilities implied by what is registered.
    pub(crate) fn derived_capabilities(&self) -> Value {
        let mut caps = Map::new();
        caps.insert("logging".into(), json!({}));
        caps.insert("tools".into(), json!({"listChanged": true}));
        if !self.prompts.is_empty() {
            caps.insert("prompts".into(), json!({"listChanged": true}));
        }
        if !self.resources.is_empty() || !self.templates.is_empty() {
            caps.insert(
                "resources".into(),
                json!({"subscribe": true, "listChanged": true}),
            );
        }
        if self.completion.is_some() {
            caps.insert("completions".into(), json!({}));
        }
        Value::Object(caps)
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Part {
    Literal(String),
    Var(String),
}

/// A level-1 URI template (`{name}` expansions only); a variable matches a
/// non-empty run of characters without `/`.
#[derive(Clone, Debug)]
struct UriTemplate {
    parts: Vec<Part>,
}

impl UriTemplate {
    fn parse(template: &str) -> Self {
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else {
                break;
            };
            if open > 0 {
                parts.push(Part::Literal(rest[..open].to_owned()));
            }
            parts.push(Part::Var(rest[open + 1..open + close].to_owned()));
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_owned()));
        }
        UriTemplate { parts }
    }

    fn matches(&self, uri: &str) -> Option<Map<String, Value>> {
        let mut vars = Map::new();
        let mut rest = uri;
        let mut parts = self.parts.iter().peekable();
        while let Some(part) = parts.next() {
            match part {
                Part::Literal(lit) => rest = rest.strip_prefix(lit.as_str())?,
                Part::Var(name) => {
                    let end = match parts.peek() {
                        Some(Part::Literal(next)) => rest.find(next.as_str())?,
                        _ => rest.len(),
                    };
                    let value = &rest[..end];
                    if value.is_empty() || value.contains('/') {
                        return None;
                    }
                    vars.insert(name.clone(), Value::String(value.to_owned()));
                    rest = &rest[end..];
                }
            }
        }
        rest.is_empty().then_some(vars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_templates_extract_variables() {
        let t = UriTemplate::parse("profile://{user}/posts/{post}");
        let vars = t.matches("profile://ada/posts/7").unwrap();
        assert_eq!(vars["user"], "ada");
        assert_eq!(vars["post"], "7");
        assert!(t.matches("profile://ada/posts/").is_none());
        assert!(t.matches("profile://a/b/posts/7").is_none());
        assert!(t.matches("other://ada/posts/7").is_none());
        let single = UriTemplate::parse("profile://{user}");
        assert_eq!(single.matches("profile://bob").unwrap()["user"], "bob");
    }

    #[test]
    fn registration_replaces_same_name_and_derives_capabilities() {
        let h = Handlers::new()
            .tool("t", "one", json!({"type":"object"}), |_c, _a| async {
                Ok(json!(1))
            })
            .tool("t", "two", json!({"type":"object"}), |_c, _a| async {
                Ok(json!(2))
            })
            .resource_template("profile://{user}", "profile", |_c, p| async move { Ok(p) });
        assert_eq!(h.tool_list().len(), 1);
        assert_eq!(h.tool_list()[0]["description"], "two");
        let (_, vars) = h.resource_entry("profile://zed").unwrap();
        assert_eq!(vars.unwrap()["user"], "zed");
        let caps = h.derived_capabilities();
        assert!(caps.get("resources").is_some());
        assert!(caps.get("prompts").is_none());
    }
}
