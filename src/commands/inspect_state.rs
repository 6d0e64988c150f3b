//! `mrtr-gateway inspect-state`: what a `requestState` holds, for operators.
//!
//! Opens a token with the configured key ring and prints its non-secret fields: key id,
//! round, times, principal, origin digest, pending questions, answer keys and sizes, the
//! parking reference. Answers themselves are user data and are printed only with
//! `--show-answers`.

use std::fmt::Write as _;

use mrtr_gateway::config::Config;
use mrtr_gateway::state::{StateCodec, now_secs};

/// Renders the report, or says why the token does not open.
pub fn inspect(config: &Config, token: &str, show_answers: bool) -> Result<String, String> {
    let codec = StateCodec::new(&config.state.keys, config.state.ttl, config.state.max_bytes)
        .with_clock_skew(config.state.clock_skew);
    let token = token.trim();
    let (p, kid) = codec.open_ignoring_expiry(token).map_err(|e| {
        format!(
            "the state does not open with the configured keys: {}",
            e.reason()
        )
    })?;
    let now = now_secs();
    let mut out = String::new();
    let _ = writeln!(out, "key id:        {kid}");
    let _ = writeln!(out, "format:        {}", mrtr_gateway::state::seal::VERSION);
    let _ = writeln!(out, "token bytes:   {}", token.len());
    let _ = writeln!(out, "state id:      {}", p.id);
    let _ = writeln!(out, "round:         {}", p.rnd);
    let _ = writeln!(out, "issued at:     {} (unix seconds)", p.iat);
    let status = if now > p.exp + config.state.clock_skew.as_secs() {
        format!("expired {}s ago", now - p.exp)
    } else {
        format!("valid for {}s more", p.exp.saturating_sub(now))
    };
    let _ = writeln!(out, "expires at:    {} ({status})", p.exp);
    let _ = writeln!(out, "principal:     {}", p.prn);
    let _ = writeln!(out, "origin digest: {}", p.org);
    match &p.park {
        Some(r) => {
            let _ = writeln!(
                out,
                "parked on:     instance {} (handle {})",
                r.instance, r.handle
            );
        }
        None => {
            let _ = writeln!(out, "parked on:     -");
        }
    }
    let _ = writeln!(out, "pending ({}):", p.pnd.len());
    for (k, v) in &p.pnd {
        let extra = v
            .elicitation_id
            .as_deref()
            .map(|e| format!(", elicitationId {e}"))
            .unwrap_or_default();
        let _ = writeln!(out, "  {k}: {}{extra}", v.kind.as_str());
    }
    let _ = writeln!(out, "answers ({}):", p.ans.len());
    for (k, v) in &p.ans {
        let text = v.json();
        if show_answers {
            let _ = writeln!(out, "  {k}: {text}");
        } else {
            let _ = writeln!(
                out,
                "  {k}: {} bytes (hidden; --show-answers prints it)",
                text.len()
            );
        }
    }
    Ok(out)
}
