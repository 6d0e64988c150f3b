//! `mrtr-gateway serve`: run the gateway, reload on change, drain on SIGTERM/SIGINT.
//!
//! The drain sequence: `/readyz` turns 503 at once (endpoints controllers stop sending new
//! traffic), after `drain.readiness_delay` the listener stops accepting and long-lived
//! responses end (listen streams with their final response), in-flight requests and claimed
//! retries whose client went away get up to `drain.deadline` to finish (a claimed retry still
//! running then is recorded as outcome lost at once), then the process exits 0. A second signal during the
//! drain exits at once.

use std::path::PathBuf;
use std::sync::Arc;

use mrtr_gateway::admin;
use mrtr_gateway::config::Config;
use mrtr_gateway::descriptor_budget;
use mrtr_gateway::front::listener;
use mrtr_gateway::front::tls::TlsReloader;
use mrtr_gateway::gateway::Gateway;
use mrtr_gateway::reload::Reloader;
use mrtr_gateway::telemetry::LevelHandle;

pub async fn run(
    config: Config,
    config_path: PathBuf,
    log: Option<LevelHandle>,
) -> std::io::Result<()> {
    // Before any child can be started: descriptors inherited from whoever started the gateway
    // must not leak into stdio legacy servers.
    mrtr_gateway::inherited_fds::keep_from_children();
    // Before anything opens a descriptor: room for the caps (see descriptor_budget).
    let raised = descriptor_budget::raise_soft_limit();
    if raised.after != raised.before {
        tracing::info!(before = ?raised.before, after = ?raised.after, "raised the open-file limit to its hard limit");
    }
    if let Some(warning) =
        descriptor_budget::shortfall(&descriptor_budget::need(&config), raised.after)
    {
        tracing::warn!("{warning}");
    }
    for warning in mrtr_gateway::config::ineffective_quotas(&config) {
        tracing::warn!("{warning}");
    }
    let gw = Gateway::try_new(config).map_err(std::io::Error::other)?;
    let cfg = gw.config();
    let tls = match &cfg.tls {
        Some(files) => Some(Arc::new(
            TlsReloader::load(files).map_err(std::io::Error::other)?,
        )),
        None => None,
    };
    let listener = bind("listen.addr", cfg.listen.addr).await?;
    let addr = listener.local_addr()?;
    // Admin and reload run until the drain's last phase.
    let background = gw.drain.stopped().clone();
    if let Some(admin_addr) = cfg.admin.addr {
        let admin_listener = bind("admin.addr", admin_addr).await?;
        tracing::info!(addr = %admin_listener.local_addr()?, "admin listening (/metrics, /healthz, /readyz)");
        tokio::spawn(admin::serve(gw.clone(), admin_listener, background.clone()));
    }
    tracing::info!(
        %addr,
        path = %cfg.listen.path,
        tls = tls.is_some(),
        upstream = %gw.sessions.upstream().describe(),
        instance_id = %gw.instance_id,
        "mrtr-gateway listening"
    );
    if let Some(otlp) = &cfg.tracing.otlp {
        tracing::info!(
            endpoint = %otlp.endpoint,
            service_name = %otlp.service_name,
            sample_ratio = otlp.sample_ratio,
            "exporting traces over OTLP/HTTP"
        );
    }
    if gw.single_use().per_replica() {
        mrtr_gateway::single_use::warn_per_replica();
    }
    let example = mrtr_gateway::config::decode_secret(mrtr_gateway::config::EXAMPLE_SECRET).ok();
    for k in &cfg.state.keys {
        if Some(k.secret) == example {
            tracing::warn!(key_id = %k.id, "state key uses the public example secret from config/gateway.toml; generate one with `mrtr-gateway keygen`");
        }
    }
    if !addr.ip().is_loopback() && gw.auth().needs_loopback_warning() {
        tracing::warn!(%addr, "listening on a non-loopback address with [auth] mode = \"none\": every caller is \"anonymous\"");
    }
    let reloader = Reloader {
        gw: gw.clone(),
        config_path,
        tls: tls.clone(),
        log,
    };
    tokio::spawn(reloader.run(background.clone()));

    let drain_gw = gw.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        drain_gw.start_draining();
        let delay = drain_gw.config().drain.readiness_delay;
        tracing::info!(?delay, "shutdown signal: readiness off, draining");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = wait_for_signal() => {
                exit_now();
            }
        }
        tracing::info!("no longer accepting connections; finishing in-flight requests");
        // The listener stops accepting; listen streams send their final response and end, and
        // legacy GET streams end, instead of holding the drain until its deadline.
        drain_gw.drain.close();
        wait_for_signal().await;
        exit_now();
    });
    let deadline = cfg.drain.deadline;
    drop(cfg);
    let closing = gw.drain.closing().clone();
    let (_, closed_at) = tokio::join!(
        listener::serve(gw.front.clone(), listener, tls, closing.clone(), deadline),
        async {
            closing.cancelled().await;
            tokio::time::Instant::now()
        }
    );
    // Claimed retries whose client went away hold no connection, so the listener did not wait
    // for them: their outcome is what the state's next presentation gets. They get what is
    // left of the same deadline; those still running then are recorded as outcome lost.
    let finished = gw.finish_claimed_runs(closed_at + deadline).await;
    if finished != Default::default() {
        tracing::info!(
            settled = finished.settled,
            given_up = finished.given_up,
            "claimed retries handled"
        );
    }
    // Tasks hold no connection either: they get the same deadline, and those still running
    // then end `failed`.
    let given_up = gw.finish_tasks(closed_at + deadline).await;
    if given_up > 0 {
        tracing::warn!(given_up, "unfinished tasks failed at the drain's deadline");
    }
    // Parked calls will never be resumed by this process: cancel them upstream.
    gw.release_parked().await;
    gw.drain.stop();
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

/// Binds a listener; a failure names the setting and the address ("listen.addr 0.0.0.0:8080:
/// Address already in use"), not only the OS error.
async fn bind(key: &str, addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {key} {addr}: {e}")))
}

/// A second signal: exit at once. The log writer's queue is not flushed by `exit`, so the
/// reason goes to stderr directly as well.
fn exit_now() -> ! {
    tracing::warn!("second signal: exiting now");
    eprintln!("mrtr-gateway: second signal: exiting now");
    std::process::exit(1);
}
