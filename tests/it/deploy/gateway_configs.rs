//! Loading the TOML configurations the artifacts carry with the gateway's own loader
//! (`Config::from_toml_str`), the way a pod would: the pod's environment overrides applied,
//! key material from a directory of freshly generated keys.

use std::path::Path;

use base64::Engine;
use mrtr_gateway::config::{Config, ConfigError};

use crate::support::TempDir;

/// A directory holding one fresh key, standing in for the mounted Secret.
pub struct KeyDir(TempDir);

impl KeyDir {
    pub fn new() -> KeyDir {
        let dir = TempDir::new("mrtr-deploy-keys");
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).unwrap();
        let text = base64::engine::general_purpose::STANDARD.encode(secret);
        std::fs::write(dir.path().join("k2026-12-02"), text).unwrap();
        KeyDir(dir)
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// A configuration as the gateway would load it, with its raw table.
pub struct Loaded {
    pub config: Config,
    pub table: toml::Table,
}

/// Loads `text` with `env` as the environment. When the file sets `state.keys_dir` (a mounted
/// Secret that does not exist here), `MRTR_GATEWAY__STATE__KEYS_DIR` points it at `keys`.
pub fn load(
    text: &str,
    base_dir: Option<&Path>,
    env: &[(String, String)],
    keys: &KeyDir,
) -> Result<Loaded, ConfigError> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::new("(file)", e.to_string()))?;
    let mut vars = env.to_vec();
    if table.get("state").and_then(|s| s.get("keys_dir")).is_some() {
        vars.push((
            "MRTR_GATEWAY__STATE__KEYS_DIR".into(),
            keys.path().display().to_string(),
        ));
    }
    let config = Config::from_toml_str(text, &vars, base_dir)?;
    Ok(Loaded { config, table })
}

/// Every `*.toml` under `dir`, recursively, sorted.
pub fn toml_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "toml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}
