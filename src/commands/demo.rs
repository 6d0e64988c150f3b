//! `mrtr-gateway demo` (written once the in-repo legacy server lands).

pub async fn run() -> Result<(), String> {
    Err("not yet available".into())
}
