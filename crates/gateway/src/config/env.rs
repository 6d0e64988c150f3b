//! Environment overrides: `MRTR_GATEWAY__<SECTION>__<KEY>=value` sets `<section>.<key>`.
//!
//! The rule: the prefix `MRTR_GATEWAY__`, then the key path with `__` between levels, upper
//! case (matched case-insensitively; `-` in a key is written `_`). The value is read as a TOML
//! value when it parses as one (`8080`, `true`, `["a","b"]`), otherwise as a string, so
//! `MRTR_GATEWAY__STATE__TTL=30s` and `MRTR_GATEWAY__STATE__MAX_ROUNDS=8` both work. Arrays of
//! tables (`state.keys`) cannot be set this way. `MRTR_GATEWAY_CONFIG` (one underscore) is the
//! config file path, not an override.

use std::collections::HashMap;

use super::ConfigError;

pub const PREFIX: &str = "MRTR_GATEWAY__";

/// Which variable set which dotted key, for error messages.
#[derive(Debug, Default)]
pub struct Origins(HashMap<String, String>);

impl Origins {
    pub fn var_for(&self, key: &str) -> Option<String> {
        self.0.get(key).cloned()
    }
}

/// Applies every `MRTR_GATEWAY__…` variable in `vars` onto `tree`.
pub fn apply_overrides(
    tree: &mut toml::Table,
    vars: &[(String, String)],
) -> Result<Origins, ConfigError> {
    let mut origins = Origins::default();
    let mut sorted: Vec<&(String, String)> =
        vars.iter().filter(|(k, _)| k.starts_with(PREFIX)).collect();
    sorted.sort();
    for (var, value) in sorted {
        let path: Vec<String> = var[PREFIX.len()..]
            .split("__")
            .map(|p| p.to_ascii_lowercase())
            .collect();
        if path.iter().any(String::is_empty) {
            return Err(ConfigError {
                key: "(environment)".into(),
                env_var: Some(var.clone()),
                message: "empty key segment in variable name".into(),
            });
        }
        let dotted = path.join(".");
        let parsed = parse_value(value);
        set_path(tree, &path, parsed).map_err(|message| ConfigError {
            key: dotted.clone(),
            env_var: Some(var.clone()),
            message,
        })?;
        origins.0.insert(dotted, var.clone());
    }
    Ok(origins)
}

fn parse_value(text: &str) -> toml::Value {
    let doc = format!("v = {text}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(text.into())),
        Err(_) => toml::Value::String(text.to_string()),
    }
}

fn set_path(tree: &mut toml::Table, path: &[String], value: toml::Value) -> Result<(), String> {
    let (last, parents) = path.split_last().expect("non-empty path");
    let mut node = tree;
    for p in parents {
        let entry = node
            .entry(p.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(format!("{p} is not a table; it cannot hold {last}")),
        };
    }
    node.insert(last.clone(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_typed_when_they_parse_and_strings_otherwise() {
        let mut t = toml::Table::new();
        let vars = vec![
            (
                "MRTR_GATEWAY__STATE__MAX_ROUNDS".to_string(),
                "8".to_string(),
            ),
            ("MRTR_GATEWAY__STATE__TTL".to_string(), "30s".to_string()),
            ("UNRELATED".to_string(), "x".to_string()),
        ];
        let origins = apply_overrides(&mut t, &vars).unwrap();
        assert_eq!(t["state"]["max_rounds"].as_integer(), Some(8));
        assert_eq!(t["state"]["ttl"].as_str(), Some("30s"));
        assert_eq!(
            origins.var_for("state.ttl").as_deref(),
            Some("MRTR_GATEWAY__STATE__TTL")
        );
    }
}
