//! A fresh state key in the config's TOML shape (`mrtr-gateway keygen`, the demo, tests).

use base64::Engine;

/// A new key id and 32-byte secret, as a `[[state.keys]]` TOML entry.
pub fn new_key_toml() -> String {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).expect("the OS random source failed");
    let mut idb = [0u8; 4];
    getrandom::fill(&mut idb).expect("the OS random source failed");
    let id: String = idb.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "[[state.keys]]\nid = \"k-{id}\"\nsecret = \"{}\"\n",
        base64::engine::general_purpose::STANDARD.encode(secret)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn output_is_a_loadable_key_and_fresh_each_time() {
        let a = new_key_toml();
        let c = Config::from_toml_str(&a, &[], None).unwrap();
        assert!(c.state.keys[0].id.starts_with("k-"));
        assert_ne!(a, new_key_toml());
    }
}
