//! The one rustls crypto provider (aws-lc-rs) that every TLS configuration of the gateway is
//! built with: the front listener's (`front::tls`) and the upstream client's
//! (`legacy::upstream_tls`, `legacy::http`) alike.

use std::sync::Arc;

/// The crypto provider every rustls configuration of the gateway uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}
