//! Readiness (`/readyz`): not draining, keys loaded, the upstream speaks MCP (the cached
//! check of [`crate::upstream_check`]), the single-use store answers.

use http::HeaderMap;

use crate::auth::upstream_credentials::UpstreamCredentials;
use crate::gateway::Gateway;
use crate::upstream_check::{CheckCredentials, CheckTiming};

/// The result of the readiness checks behind `/readyz`.
#[derive(Debug, Clone)]
pub struct Readiness {
    pub checks: Vec<(&'static str, Result<String, String>)>,
}

impl Readiness {
    pub fn ready(&self) -> bool {
        self.checks.iter().all(|(_, r)| r.is_ok())
    }
}

/// The checks behind `/readyz`: not draining, keys loaded, the upstream speaks MCP, the
/// single-use store answers.
pub async fn evaluate(gw: &Gateway) -> Readiness {
    let mut checks = Vec::new();
    checks.push((
        "draining",
        if gw.is_draining() {
            Err("draining".to_string())
        } else {
            Ok("no".to_string())
        },
    ));
    let ring = gw.codec.ring();
    checks.push((
        "keys",
        Ok(format!(
            "{} key(s), sealing with {}",
            ring.ids().len(),
            ring.sealing_key().id
        )),
    ));
    let cfg = gw.config();
    let credentials = CheckCredentials {
        headers: gw.auth().upstream_headers(&HeaderMap::new()),
        forwarded: matches!(cfg.auth.upstream, UpstreamCredentials::Forward),
    };
    let timing = CheckTiming {
        cache: cfg.admin.upstream_check_cache,
        wait: cfg.admin.upstream_check_wait,
        limit: cfg.upstream.connect_timeout + 2 * cfg.upstream.response_timeout,
    };
    checks.push((
        "upstream",
        gw.sessions.check_upstream(credentials, timing).await,
    ));
    let store = gw.single_use();
    checks.push((
        "single_use",
        store
            .health()
            .await
            .map(|_| store.kind().to_string())
            .map_err(|e| e.to_string()),
    ));
    Readiness { checks }
}
