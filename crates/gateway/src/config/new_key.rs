//! A fresh state key: in the config's TOML shape (`mrtr-gateway keygen`, the demo, tests), or
//! as a date-named file for `state.keys_dir` (`mrtr-gateway keygen --dir DIR`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;

fn new_secret() -> String {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).expect("the OS random source failed");
    base64::engine::general_purpose::STANDARD.encode(secret)
}

/// A new key id and 32-byte secret, as a `[[state.keys]]` TOML entry.
pub fn new_key_toml() -> String {
    let mut idb = [0u8; 4];
    getrandom::fill(&mut idb).expect("the OS random source failed");
    let id: String = idb.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "[[state.keys]]\nid = \"k-{id}\"\nsecret = \"{}\"\n",
        new_secret()
    )
}

/// Writes a new key into `dir` as the file `k<today>` (UTC, `k2026-12-05`; `k2026-12-05-2`
/// and so on when today's name is taken), readable by its owner only. In a key directory the
/// greatest id seals (unless a `primary` file says otherwise), so the new key becomes the
/// sealing key and the older ones keep opening what they sealed. Returns the file's path.
pub fn write_key_file(dir: &Path) -> std::io::Result<PathBuf> {
    let stamp = humantime::format_rfc3339(std::time::SystemTime::now()).to_string();
    let today = &stamp[..10];
    for n in 1..100u32 {
        let name = match n {
            1 => format!("k{today}"),
            _ => format!("k{today}-{n}"),
        };
        let path = dir.join(&name);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path);
        match file {
            Ok(mut f) => {
                writeln!(f, "{}", new_secret())?;
                f.sync_all()?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", path.display()),
                ));
            }
        }
    }
    Err(std::io::Error::other(format!(
        "{}: 99 keys were already written today",
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn key_files_are_date_named_private_and_make_a_loadable_ring_whose_newest_seals() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("mrtr-keygen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = write_key_file(&dir).unwrap();
        let second = write_key_file(&dir).unwrap();
        let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(name(&first).len(), "k2026-12-05".len(), "{first:?}");
        assert_eq!(name(&second), format!("{}-2", name(&first)));
        let mode = std::fs::metadata(&first).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let ring = crate::config::load_keys_dir(&dir).unwrap();
        assert_eq!(ring.len(), 2);
        assert_eq!(ring[0].id, name(&second), "the newest key seals");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn output_is_a_loadable_key_and_fresh_each_time() {
        let a = new_key_toml();
        let c = Config::from_toml_str(&a, &[], None).unwrap();
        assert!(c.state.keys[0].id.starts_with("k-"));
        assert_ne!(a, new_key_toml());
    }
}
