//! `--idle N`: the gateway's resident memory per idle client connection.
//!
//! After a warm-up, the gateway's VmRSS and descriptors are read; then N clients each open a
//! connection, make one plain call on it and keep it open (HTTP/1.1 keep-alive: each client's
//! pool holds its connection). Once the `active_connections` gauge reads N more and a short
//! settle has passed, VmRSS is read again, and once more after `SETTLED` (the steady state,
//! once the allocator has purged what connections freed as they went to rest): the difference
//! over N is what one idle connection costs. The clients are then dropped, to read VmRSS after
//! the connections closed.

use std::time::Duration;

use mrtr_testkit::client::ModernClient;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use super::gateway_child::GatewayChild;

/// Connections opened at once.
const BATCH: usize = 64;

/// How much longer the connections are held before the steady-state reading.
const SETTLED: Duration = Duration::from_secs(15);

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn one_call(c: &ModernClient) -> Result<(), String> {
    let ex = c
        .request(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "idle"}}),
        )
        .await
        .map_err(|e| e.to_string())?;
    ex.result()
        .map(|_| ())
        .ok_or_else(|| format!("{:?}", ex.message))
}

/// `n` clients, each with one connection that made one call.
async fn open(url: &str, n: usize) -> Result<Vec<ModernClient>, String> {
    let mut clients = Vec::with_capacity(n);
    while clients.len() < n {
        let mut batch = JoinSet::new();
        for _ in 0..(n - clients.len()).min(BATCH) {
            let url = url.to_owned();
            batch.spawn(async move {
                let c = ModernClient::new(&url);
                one_call(&c).await.map(|()| c)
            });
        }
        while let Some(joined) = batch.join_next().await {
            clients.push(joined.map_err(|e| e.to_string())??);
        }
    }
    Ok(clients)
}

pub async fn run(gw: &GatewayChild, n: usize) -> Result<(String, Value), String> {
    // Warm-up: pools and allocator arenas exist before the first reading.
    drop(open(&gw.url, BATCH).await?);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let open_before = gw.metric("mrtr_gateway_active_connections", &[]).await?;
    let before = gw.status_kib("VmRSS").unwrap_or(0);
    let fds_before = gw.fds();

    let clients = open(&gw.url, n).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let open_with = gw.metric("mrtr_gateway_active_connections", &[]).await?;
    let at_rest = gw.metric("mrtr_gateway_connections_at_rest", &[]).await?;
    let with = gw.status_kib("VmRSS").unwrap_or(0);
    let fds_with = gw.fds();
    // Memory freed by connections that went to rest leaves the resident set only as the
    // allocator purges it (jemalloc: over about ten seconds), so the steady state is read too.
    tokio::time::sleep(SETTLED).await;
    let with_settled = gw.status_kib("VmRSS").unwrap_or(0);
    let open_settled = gw.metric("mrtr_gateway_active_connections", &[]).await?;

    drop(clients);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let open_after = gw.metric("mrtr_gateway_active_connections", &[]).await?;
    let after = gw.status_kib("VmRSS").unwrap_or(0);

    let idle = (open_with - open_before).max(1.0);
    let per_conn = with.saturating_sub(before) as f64 * 1024.0 / idle;
    let per_conn_settled = with_settled.saturating_sub(before) as f64 * 1024.0 / idle;
    let text = format!(
        "idle connections: {n} opened, the gateway counted {idle} more (active {open_before} -> {open_with}, {open_after} after they closed)\n\
         at rest after 2 s: {at_rest}\n\
         gateway VmRSS before {:.1} MiB, with them {:.1} MiB: {per_conn:.0} bytes per idle connection after 2 s\n\
         {}s later ({open_settled} open) {:.1} MiB: {per_conn_settled:.0} bytes per idle connection (target ≤ 8192 -> {})\n\
         gateway fds before {fds_before}, with them {fds_with}; VmRSS after they closed {:.1} MiB\n",
        mib(before),
        mib(with),
        SETTLED.as_secs(),
        mib(with_settled),
        if per_conn_settled <= 8192.0 {
            "met"
        } else {
            "MISSED"
        },
        mib(after),
    );
    let json = json!({
        "requested": n,
        "counted": idle,
        "rss_mib": {"before": mib(before), "with": mib(with), "after_close": mib(after)},
        "at_rest": at_rest,
        "bytes_per_idle_connection_after_2s": per_conn,
        "bytes_per_idle_connection": per_conn_settled,
        "rss_mib_settled": mib(with_settled),
        "fds": {"before": fds_before, "with": fds_with},
    });
    Ok((text, json))
}
