//! TLS below every layer that speaks it: the one rustls crypto provider (aws-lc-rs) that every
//! TLS configuration of the gateway is built with — the front listener's (`front::tls`) and
//! the upstream client's alike — and the upstream client's TLS configuration ([`upstream`]:
//! CA file, system store or pinned keys, client certificate, handshake failures as classes),
//! which the configuration loader builds and the legacy HTTP client uses, how the server's
//! certificate is judged ([`server_verifier`]), and the TLS stream both ends use, the front
//! listener's connections and the legacy server's over `https` ([`stream`]: rustls's
//! unbuffered connection, the buffers the gateway's own, so a quiet connection holds none).

pub mod server_verifier;
pub mod stream;
pub mod upstream;

use std::sync::Arc;

/// The crypto provider every rustls configuration of the gateway uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}
