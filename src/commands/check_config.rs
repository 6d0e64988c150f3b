//! `mrtr-gateway check-config`: validate a file, report the first problem by key, and warn
//! about what is valid but will not work here (a stdio command not found).

use std::path::{Path, PathBuf};

use mrtr_gateway::config::redact::redacted_url;
use mrtr_gateway::config::{Config, UpstreamTransport};
use mrtr_gateway::descriptor_budget;

/// What `check-config` found in a valid file.
#[derive(Debug)]
pub struct Report {
    /// One line: the listener, the upstream (URL userinfo redacted), the keys.
    pub summary: String,
    /// Problems that do not make the file invalid, each naming its key.
    pub warnings: Vec<String>,
}

/// Validates `path`; on success returns a one-line summary and any warnings.
pub fn check(path: &Path) -> Result<Report, mrtr_gateway::config::ConfigError> {
    let c = Config::load(path)?;
    let upstream = match c.upstream.transport {
        UpstreamTransport::StreamableHttp => redacted_url(&c.upstream.url),
        UpstreamTransport::Sse => format!("{} (HTTP+SSE)", redacted_url(&c.upstream.url)),
        UpstreamTransport::Stdio => format!("stdio: {}", c.upstream.stdio.command.join(" ")),
    };
    let summary = format!(
        "config OK: listen {}{}, upstream {}, {} state key(s) (sealing with {:?}), state ttl {:?}",
        c.listen.addr,
        c.listen.path,
        upstream,
        c.state.keys.len(),
        c.state.keys[0].id,
        c.state.ttl
    );
    let mut warnings = Vec::new();
    let example = mrtr_gateway::config::decode_secret(mrtr_gateway::config::EXAMPLE_SECRET).ok();
    for (i, k) in c.state.keys.iter().enumerate() {
        if Some(k.secret) == example {
            let key = match &c.state.keys_dir {
                Some(dir) => format!("state.keys_dir ({}/{})", dir.display(), k.id),
                None => format!("state.keys[{i}].secret"),
            };
            warnings.push(format!(
                "{key}: key {:?} is the public example secret from config/gateway.toml; anyone \
                 can seal a requestState with it. Generate a key with `mrtr-gateway keygen`",
                k.id
            ));
        }
    }
    // A per-caller share so wide it never binds leaves newcomers only the reserve.
    warnings.extend(mrtr_gateway::config::ineffective_quotas(&c));
    let (_, hard) = descriptor_budget::limits();
    if let Some(warning) = descriptor_budget::shortfall(&descriptor_budget::need(&c), hard) {
        warnings.push(warning);
    }
    if c.upstream.transport == UpstreamTransport::Stdio {
        let env_path = c
            .upstream
            .stdio
            .env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var("PATH").ok())
            .unwrap_or_default();
        if let Some(program) = c.upstream.stdio.command.first()
            && let Err(why) = find_program(program, &env_path, c.upstream.stdio.cwd.as_deref())
        {
            warnings.push(format!(
                "upstream.command[0] (MRTR_GATEWAY__UPSTREAM__COMMAND): {why}; the gateway will \
                 start, but every session and /readyz will fail"
            ));
        }
    }
    Ok(Report { summary, warnings })
}

/// Where the child's program would be found: a path (relative to `cwd`) when it has a `/`,
/// otherwise the first executable file of that name in `path_var`.
fn find_program(program: &str, path_var: &str, cwd: Option<&Path>) -> Result<PathBuf, String> {
    if program.contains('/') {
        let p = match cwd {
            Some(dir) if Path::new(program).is_relative() => dir.join(program),
            _ => PathBuf::from(program),
        };
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(format!("`{program}` is not an executable file"))
        };
    }
    std::env::split_paths(path_var)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
        .ok_or_else(|| format!("`{program}` is not found on PATH"))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Validates `path` and renders the effective configuration with secrets redacted.
pub fn print(path: &Path) -> Result<String, mrtr_gateway::config::ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        mrtr_gateway::config::ConfigError::new(
            "(file)",
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    let vars: Vec<(String, String)> = std::env::vars().collect();
    Config::effective_toml(&text, &vars, path.parent())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_looked_up_like_the_child_would() {
        let path = std::env::var("PATH").unwrap_or_default();
        assert!(find_program("sh", &path, None).is_ok());
        let missing = find_program("no-such-mcp-server-xyz", &path, None).unwrap_err();
        assert!(missing.contains("not found on PATH"), "{missing}");
        assert!(find_program("/bin/sh", "", None).is_ok());
        assert!(find_program("./sh", "", Some(Path::new("/bin"))).is_ok());
        assert!(find_program("./nothing-here", "", Some(Path::new("/bin"))).is_err());
        // A directory on PATH named like the program is not it.
        assert!(find_program("bin", "/", None).is_err());
    }
}
