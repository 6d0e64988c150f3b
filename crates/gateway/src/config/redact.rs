//! Secrets out of printed and logged configuration: URL userinfo (a password, or a token in
//! the user name) becomes `<redacted>`.

/// What replaces a secret value.
pub const REDACTED: &str = "<redacted>";

/// `url` with its user name and password replaced, for logs and `check-config`.
pub fn redacted_url(url: &url::Url) -> String {
    let mut u = url.clone();
    if !u.username().is_empty() {
        let _ = u.set_username(REDACTED);
    }
    if u.password().is_some() {
        let _ = u.set_password(Some(REDACTED));
    }
    u.to_string()
}

/// Like [`redacted_url`] for a URL still in text form; text that is not a URL is kept.
pub fn redacted_url_text(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(u) if !u.username().is_empty() || u.password().is_some() => redacted_url(&u),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_replaced_and_the_rest_kept() {
        for (given, secret) in [
            (
                "https://svc:pa55w0rd@legacy.internal:8443/mcp?x=1",
                "pa55w0rd",
            ),
            ("https://tok3n@legacy.internal/mcp", "tok3n"),
            ("redis://:hunter2@redis:6379/0", "hunter2"),
        ] {
            let shown = redacted_url_text(given);
            assert!(!shown.contains(secret), "{shown}");
            assert!(
                shown.contains("legacy.internal") || shown.contains("redis:6379"),
                "{shown}"
            );
        }
        assert_eq!(
            redacted_url_text("http://127.0.0.1:9001/mcp"),
            "http://127.0.0.1:9001/mcp"
        );
        assert_eq!(redacted_url_text("not a url"), "not a url");
    }
}
