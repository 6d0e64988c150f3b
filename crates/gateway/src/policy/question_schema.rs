//! Whether a question is a valid 2026-07-28 `InputRequest`.
//!
//! Checked on the `inputRequests` entry as the client would receive it (`{method, params}`,
//! after the legacy-only members are gone). A client that parses `inputRequests` into typed
//! models, as the official SDKs do, can reject the whole response for one bad entry, so a
//! malformed question must never reach it. The checks are the schema's: required members,
//! their types, the closed value sets (`mode`, `role`, `includeContext`, `toolChoice.mode`,
//! string `format`), and the flat form schema of primitive fields that elicitation allows.
//! Members the schema does not define are left alone (the schema allows them).

use serde_json::{Map, Value};

/// Checks `request` (an `inputRequests` entry); the error says what is wrong.
pub fn validate(request: &Value) -> Result<(), String> {
    let method = request.get("method").and_then(Value::as_str).unwrap_or("");
    let params = request.get("params");
    match method {
        "elicitation/create" => elicitation(object(params, "params")?),
        "sampling/createMessage" => sampling(object(params, "params")?),
        "roots/list" => match params {
            None | Some(Value::Object(_)) => Ok(()),
            Some(_) => Err("`params` must be an object".into()),
        },
        other => Err(format!("{other:?} is not an input request method")),
    }
}

fn object<'a>(v: Option<&'a Value>, what: &str) -> Result<&'a Map<String, Value>, String> {
    v.and_then(Value::as_object)
        .ok_or_else(|| format!("`{what}` must be an object"))
}

fn string(obj: &Map<String, Value>, key: &str) -> Result<(), String> {
    match obj.get(key) {
        Some(Value::String(_)) => Ok(()),
        Some(_) => Err(format!("`{key}` must be a string")),
        None => Err(format!("`{key}` is required")),
    }
}

/// Optional members of a given JSON type.
fn optional(
    obj: &Map<String, Value>,
    key: &str,
    ok: fn(&Value) -> bool,
    what: &str,
) -> Result<(), String> {
    match obj.get(key) {
        Some(v) if !ok(v) => Err(format!("`{key}` must be {what}")),
        _ => Ok(()),
    }
}

fn elicitation(p: &Map<String, Value>) -> Result<(), String> {
    string(p, "message")?;
    match p.get("mode") {
        None => form(p),
        Some(Value::String(m)) if m == "form" => form(p),
        Some(Value::String(m)) if m == "url" => string(p, "url"),
        Some(other) => Err(format!("unknown elicitation `mode` {other}")),
    }
}

fn form(p: &Map<String, Value>) -> Result<(), String> {
    let schema = object(p.get("requestedSchema"), "requestedSchema")?;
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err("`requestedSchema.type` must be \"object\"".into());
    }
    let props = object(schema.get("properties"), "requestedSchema.properties")?;
    for (name, prop) in props {
        primitive(prop).map_err(|m| format!("`requestedSchema.properties.{name}`: {m}"))?;
    }
    if let Some(required) = schema.get("required") {
        let names = required
            .as_array()
            .filter(|a| a.iter().all(Value::is_string))
            .ok_or("`requestedSchema.required` must be an array of strings")?;
        if let Some(missing) = names
            .iter()
            .filter_map(Value::as_str)
            .find(|n| !props.contains_key(*n))
        {
            return Err(format!(
                "`requestedSchema.required` names {missing:?}, which is not a property"
            ));
        }
    }
    Ok(())
}

fn is_string(v: &Value) -> bool {
    v.is_string()
}
fn is_number(v: &Value) -> bool {
    v.is_number()
}
fn is_bool(v: &Value) -> bool {
    v.is_boolean()
}
fn is_count(v: &Value) -> bool {
    v.as_u64().is_some()
}
fn is_object(v: &Value) -> bool {
    v.is_object()
}
fn is_strings(v: &Value) -> bool {
    v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
}

/// `const` + `title` options of titled enums (`oneOf` / `anyOf`).
fn titled_options(v: Option<&Value>, key: &str) -> Result<(), String> {
    let ok = v.and_then(Value::as_array).is_some_and(|opts| {
        !opts.is_empty()
            && opts.iter().all(|o| {
                o.get("const").is_some_and(Value::is_string)
                    && o.get("title").is_none_or(Value::is_string)
            })
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{key}` must be a non-empty array of {{\"const\": string, \"title\": string}}"
        ))
    }
}

/// A `PrimitiveSchemaDefinition`: a string, number, integer, boolean or enum field. Nested
/// objects and arrays of anything but enum strings are not allowed.
fn primitive(prop: &Value) -> Result<(), String> {
    let p = prop.as_object().ok_or("must be an object")?;
    optional(p, "title", is_string, "a string")?;
    optional(p, "description", is_string, "a string")?;
    match p.get("type").and_then(Value::as_str) {
        Some("string") => {
            optional(p, "minLength", is_count, "a non-negative integer")?;
            optional(p, "maxLength", is_count, "a non-negative integer")?;
            optional(p, "default", is_string, "a string")?;
            if let Some(f) = p.get("format")
                && !matches!(f.as_str(), Some("email" | "uri" | "date" | "date-time"))
            {
                return Err(format!(
                    "`format` must be \"email\", \"uri\", \"date\" or \"date-time\", not {f}"
                ));
            }
            if let Some(e) = p.get("enum")
                && !(is_strings(e) && e.as_array().is_some_and(|a| !a.is_empty()))
            {
                return Err("`enum` must be a non-empty array of strings".into());
            }
            optional(p, "enumNames", is_strings, "an array of strings")?;
            if p.contains_key("oneOf") {
                titled_options(p.get("oneOf"), "oneOf")?;
            }
            Ok(())
        }
        Some("number" | "integer") => {
            optional(p, "minimum", is_number, "a number")?;
            optional(p, "maximum", is_number, "a number")?;
            optional(p, "default", is_number, "a number")
        }
        Some("boolean") => optional(p, "default", is_bool, "a boolean"),
        Some("array") => {
            optional(p, "minItems", is_count, "a non-negative integer")?;
            optional(p, "maxItems", is_count, "a non-negative integer")?;
            optional(p, "default", is_strings, "an array of strings")?;
            let items = object(p.get("items"), "items")?;
            if items.contains_key("anyOf") {
                return titled_options(items.get("anyOf"), "items.anyOf");
            }
            let enum_ok = items.get("type").and_then(Value::as_str) == Some("string")
                && items
                    .get("enum")
                    .is_some_and(|e| is_strings(e) && e.as_array().is_some_and(|a| !a.is_empty()));
            if enum_ok {
                Ok(())
            } else {
                Err("an array field must be a multi-select enum of strings".into())
            }
        }
        Some("object") => Err("nested objects are not allowed: the form is flat".into()),
        Some(other) => Err(format!("unknown field type {other:?}")),
        None => Err("`type` is required".into()),
    }
}

fn sampling(p: &Map<String, Value>) -> Result<(), String> {
    let messages = p
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("`messages` must be an array")?;
    for (i, m) in messages.iter().enumerate() {
        message(m).map_err(|e| format!("`messages[{i}]`: {e}"))?;
    }
    match p.get("maxTokens") {
        Some(v) if v.as_u64().is_some_and(|n| n >= 1) => {}
        Some(_) => return Err("`maxTokens` must be a positive integer".into()),
        None => return Err("`maxTokens` is required".into()),
    }
    optional(p, "systemPrompt", is_string, "a string")?;
    optional(p, "temperature", is_number, "a number")?;
    optional(p, "stopSequences", is_strings, "an array of strings")?;
    optional(p, "metadata", is_object, "an object")?;
    if let Some(c) = p.get("includeContext")
        && !matches!(c.as_str(), Some("none" | "thisServer" | "allServers"))
    {
        return Err(format!(
            "`includeContext` must be \"none\", \"thisServer\" or \"allServers\", not {c}"
        ));
    }
    if let Some(prefs) = p.get("modelPreferences") {
        let prefs = prefs
            .as_object()
            .ok_or("`modelPreferences` must be an object")?;
        for key in ["costPriority", "speedPriority", "intelligencePriority"] {
            if let Some(v) = prefs.get(key)
                && !v.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x))
            {
                return Err(format!(
                    "`modelPreferences.{key}` must be a number from 0 to 1"
                ));
            }
        }
        optional(
            prefs,
            "hints",
            |h| h.as_array().is_some_and(|a| a.iter().all(Value::is_object)),
            "an array of objects",
        )?;
    }
    if let Some(tools) = p.get("tools") {
        let ok = tools.as_array().is_some_and(|a| {
            a.iter().all(|t| {
                t.get("name").is_some_and(Value::is_string)
                    && t.get("inputSchema").is_some_and(Value::is_object)
            })
        });
        if !ok {
            return Err("`tools` must be an array of tools with `name` and `inputSchema`".into());
        }
    }
    if let Some(choice) = p.get("toolChoice") {
        let choice = choice.as_object().ok_or("`toolChoice` must be an object")?;
        if let Some(mode) = choice.get("mode")
            && !matches!(mode.as_str(), Some("auto" | "required" | "none"))
        {
            return Err(format!(
                "`toolChoice.mode` must be \"auto\", \"required\" or \"none\", not {mode}"
            ));
        }
    }
    Ok(())
}

fn message(m: &Value) -> Result<(), String> {
    let m = m.as_object().ok_or("must be an object")?;
    if !matches!(
        m.get("role").and_then(Value::as_str),
        Some("user" | "assistant")
    ) {
        return Err("`role` must be \"user\" or \"assistant\"".into());
    }
    let block_ok = |b: &Value| b.get("type").is_some_and(Value::is_string);
    match m.get("content") {
        Some(b @ Value::Object(_)) if block_ok(b) => Ok(()),
        Some(Value::Array(bs)) if bs.iter().all(block_ok) => Ok(()),
        _ => Err("`content` must be a content block or an array of them".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: Value) -> Result<(), String> {
        validate(&v)
    }

    fn elicit(params: Value) -> Value {
        json!({"method": "elicitation/create", "params": params})
    }

    fn sample(params: Value) -> Value {
        json!({"method": "sampling/createMessage", "params": params})
    }

    #[test]
    fn valid_questions_pass() {
        let good = [
            elicit(
                json!({"mode":"form","message":"Name?","requestedSchema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}}),
            ),
            elicit(json!({"message":"m","requestedSchema":{"type":"object","properties":{}}})),
            elicit(
                json!({"mode":"form","message":"m","requestedSchema":{"$schema":"x","type":"object","properties":{
                    "s":{"type":"string","title":"S","minLength":1,"maxLength":9,"format":"email","default":"a@b.c"},
                    "n":{"type":"number","minimum":0,"maximum":1.5,"default":1},
                    "i":{"type":"integer"},
                    "b":{"type":"boolean","default":true},
                    "e":{"type":"string","enum":["a","b"],"enumNames":["A","B"]},
                    "t":{"type":"string","oneOf":[{"const":"a","title":"A"}]},
                    "m":{"type":"array","minItems":1,"items":{"type":"string","enum":["x","y"]},"default":["x"]},
                    "mt":{"type":"array","items":{"anyOf":[{"const":"x","title":"X"}]}}
                }}}),
            ),
            elicit(json!({"mode":"url","message":"Sign in","url":"https://auth.example.com/"})),
            sample(
                json!({"messages":[{"role":"user","content":{"type":"text","text":"hi"}}],"maxTokens":100}),
            ),
            sample(
                json!({"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"maxTokens":1,
                "systemPrompt":"s","includeContext":"none","temperature":0.2,"stopSequences":["x"],"metadata":{},
                "modelPreferences":{"hints":[{"name":"claude"}],"costPriority":0.5},
                "tools":[{"name":"t","inputSchema":{"type":"object"}}],"toolChoice":{"mode":"auto"}}),
            ),
            json!({"method":"roots/list"}),
            json!({"method":"roots/list","params":{}}),
        ];
        for q in good {
            assert_eq!(check(q.clone()), Ok(()), "{q}");
        }
    }

    #[test]
    fn malformed_questions_are_refused_with_a_reason() {
        let bad = [
            (
                elicit(json!({"mode":"form","requestedSchema":{"type":"object","properties":{}}})),
                "`message` is required",
            ),
            (
                elicit(json!({"message":7,"requestedSchema":{"type":"object","properties":{}}})),
                "`message` must be a string",
            ),
            (
                elicit(json!({"mode":"wizard","message":"m"})),
                "unknown elicitation `mode`",
            ),
            (
                elicit(json!({"mode":"form","message":"m"})),
                "`requestedSchema` must be an object",
            ),
            (
                elicit(json!({"message":"m","requestedSchema":{"type":"array"}})),
                "must be \"object\"",
            ),
            (
                elicit(
                    json!({"message":"m","requestedSchema":{"type":"object","properties":{
                "addr":{"type":"object","properties":{"street":{"type":"string"}}}}}}),
                ),
                "nested objects",
            ),
            (
                elicit(
                    json!({"message":"m","requestedSchema":{"type":"object","properties":{
                "list":{"type":"array","items":{"type":"object"}}}}}),
                ),
                "multi-select enum",
            ),
            (
                elicit(
                    json!({"message":"m","requestedSchema":{"type":"object","properties":{"x":{"type":"date"}}}}),
                ),
                "unknown field type",
            ),
            (
                elicit(
                    json!({"message":"m","requestedSchema":{"type":"object","properties":{"x":{"title":"no type"}}}}),
                ),
                "`type` is required",
            ),
            (
                elicit(
                    json!({"message":"m","requestedSchema":{"type":"object","properties":{"x":{"type":"string","format":"hostname"}}}}),
                ),
                "`format`",
            ),
            (
                elicit(
                    json!({"message":"m","requestedSchema":{"type":"object","properties":{"x":{"type":"string","enum":[]}}}}),
                ),
                "`enum`",
            ),
            (
                elicit(
                    json!({"message":"m","requestedSchema":{"type":"object","properties":{"x":{"type":"boolean","default":"yes"}}}}),
                ),
                "`default`",
            ),
            (
                elicit(
                    json!({"message":"m","requestedSchema":{"type":"object","properties":{},"required":["ghost"]}}),
                ),
                "not a property",
            ),
            (
                elicit(json!({"mode":"url","message":"m"})),
                "`url` is required",
            ),
            (
                elicit(json!({"mode":"url","message":"m","url":42})),
                "`url` must be a string",
            ),
            (
                json!({"method":"elicitation/create"}),
                "`params` must be an object",
            ),
            (
                sample(json!({"maxTokens":10})),
                "`messages` must be an array",
            ),
            (sample(json!({"messages":[]})), "`maxTokens` is required"),
            (
                sample(json!({"messages":[],"maxTokens":0})),
                "positive integer",
            ),
            (
                sample(json!({"messages":[],"maxTokens":"10"})),
                "positive integer",
            ),
            (
                sample(
                    json!({"messages":[{"role":"system","content":{"type":"text","text":"x"}}],"maxTokens":1}),
                ),
                "`role`",
            ),
            (
                sample(json!({"messages":[{"role":"user","content":"hi"}],"maxTokens":1})),
                "`content`",
            ),
            (
                sample(json!({"messages":[],"maxTokens":1,"includeContext":"everything"})),
                "`includeContext`",
            ),
            (
                sample(json!({"messages":[],"maxTokens":1,"modelPreferences":{"costPriority":2}})),
                "costPriority",
            ),
            (
                sample(json!({"messages":[],"maxTokens":1,"toolChoice":{"mode":"always"}})),
                "toolChoice.mode",
            ),
            (
                sample(json!({"messages":[],"maxTokens":1,"tools":[{"name":"t"}]})),
                "`tools`",
            ),
            (
                json!({"method":"roots/list","params":[]}),
                "`params` must be an object",
            ),
            (json!({"method":"ping"}), "not an input request method"),
        ];
        for (q, why) in bad {
            let e = check(q.clone()).expect_err(&q.to_string());
            assert!(e.contains(why), "{q}: {e:?} should mention {why:?}");
        }
    }
}
