//! `mrtr-gateway serve`: run the gateway until SIGTERM or SIGINT.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::front::listener;
use crate::gateway::Gateway;

pub async fn run(config: Config) -> std::io::Result<()> {
    let gw = Gateway::new(config);
    let listener = tokio::net::TcpListener::bind(gw.config().listen.addr).await?;
    let addr = listener.local_addr()?;
    tracing::info!(
        %addr,
        path = %gw.config().listen.path,
        upstream = %gw.upstream().describe(),
        instance_id = %gw.instance_id,
        "mrtr-gateway listening"
    );
    let example = crate::config::decode_secret(crate::config::EXAMPLE_SECRET).ok();
    for k in &gw.config().state.keys {
        if Some(k.secret) == example {
            tracing::warn!(key_id = %k.id, "state key uses the public example secret from config/gateway.toml; generate one with `mrtr-gateway keygen`");
        }
    }
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "listening on a non-loopback address without authentication");
    }
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received; draining");
        signals.cancel();
    });
    listener::serve(gw, listener, shutdown, Duration::from_secs(30)).await;
    tracing::info!("mrtr-gateway stopped");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("can listen for SIGTERM");
    let mut int = signal(SignalKind::interrupt()).expect("can listen for SIGINT");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
