//! `--park N`: the gateway's resident memory per parked legacy call.
//!
//! After a warm-up (plain calls and complete flows, so pools and allocator arenas exist),
//! the gateway's VmRSS and open descriptors are read; then N `ask` calls are started and each
//! ends with `input_required`, leaving its legacy call parked (a legacy session with its GET
//! stream and call stream open, a buffering task, the waiting question). Once the
//! `parked_calls` gauge reads N and a short settle has passed, VmRSS is read again: the
//! difference over N is the cost of one parked call. Every parked call is then resumed
//! (answered; after `--park-hold`, when given, so that a heap profiler can take its snapshot
//! of the parked calls) to check the lot empties and to read VmRSS after release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mrtr_testkit::client::ModernClient;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::fixture::{answer_form, text_of};
use super::gateway_child::GatewayChild;

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Round one of `ask`: the answers to give and the state to send back.
async fn park_one(c: &ModernClient) -> Result<(Value, String), String> {
    let ex = c
        .request("tools/call", json!({"name": "ask", "arguments": {}}))
        .await
        .map_err(|e| e.to_string())?;
    if ex.result_type() != Some("input_required") {
        return Err(format!("HTTP {} {:?}", ex.status, ex.message));
    }
    let r = ex.result().cloned().unwrap_or_default();
    let answers: serde_json::Map<String, Value> = r["inputRequests"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, req)| (k.clone(), answer_form(req)))
        .collect();
    Ok((
        Value::Object(answers),
        r["requestState"].as_str().unwrap_or_default().to_string(),
    ))
}

async fn resume_one(c: &ModernClient, answers: Value, state: String) -> Result<(), String> {
    let ex = c
        .request(
            "tools/call",
            json!({"name": "ask", "arguments": {}, "inputResponses": answers, "requestState": state}),
        )
        .await
        .map_err(|e| e.to_string())?;
    match ex.result() {
        Some(r) if text_of(r) == "Hello, name-answer" => Ok(()),
        _ => Err(format!("HTTP {} {:?}", ex.status, ex.message)),
    }
}

/// Runs `f` for 0..n with at most `width` at once over `clients`; returns the successes and
/// the first error.
async fn fan_out<T, F, Fut>(
    n: usize,
    width: usize,
    clients: &[Arc<ModernClient>],
    f: F,
) -> (Vec<T>, usize, Option<String>)
where
    T: Send + 'static,
    F: Fn(Arc<ModernClient>, usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>> + Send + 'static,
{
    let gate = Arc::new(Semaphore::new(width));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let permit = gate.clone().acquire_owned().await.expect("never closed");
        let fut = f(clients[i % clients.len()].clone(), i);
        tasks.push(tokio::spawn(async move {
            let out = fut.await;
            drop(permit);
            out
        }));
    }
    let (mut ok, mut errors, mut first) = (Vec::with_capacity(n), 0, None);
    for t in tasks {
        match t.await.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(v) => ok.push(v),
            Err(e) => {
                errors += 1;
                first.get_or_insert(e);
            }
        }
    }
    (ok, errors, first)
}

pub async fn run(
    gw: &GatewayChild,
    n: usize,
    width: usize,
    hold: Duration,
) -> Result<(String, Value), String> {
    let clients: Vec<Arc<ModernClient>> = (0..width.clamp(1, 256))
        .map(|_| Arc::new(ModernClient::new(&gw.url)))
        .collect();
    // Warm-up: complete flows, so nothing is left parked.
    let (_, warm_errors, warm_first) = fan_out(200, width, &clients, |c, i| async move {
        if i % 4 == 0 {
            let (answers, state) = park_one(&c).await?;
            resume_one(&c, answers, state).await
        } else {
            let ex = c
                .request(
                    "tools/call",
                    json!({"name": "echo", "arguments": {"text": "w"}}),
                )
                .await
                .map_err(|e| e.to_string())?;
            ex.result()
                .map(|_| ())
                .ok_or_else(|| format!("{:?}", ex.message))
        }
    })
    .await;
    if warm_errors > 0 {
        return Err(format!(
            "warm-up failed {warm_errors} times: {warm_first:?}"
        ));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = gw.status_kib("VmRSS").unwrap_or(0);
    let fds_before = gw.fds();

    let t0 = Instant::now();
    let (parked, errors, first_error) =
        fan_out(n, width, &clients, |c, _| async move { park_one(&c).await }).await;
    let park_secs = t0.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut gauge = gw.metric("mrtr_gateway_parked_calls", &[]).await?;
    while gauge < parked.len() as f64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        gauge = gw.metric("mrtr_gateway_parked_calls", &[]).await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = gw.status_kib("VmRSS").unwrap_or(0);
    let fds_after = gw.fds();
    let sessions = gw
        .metric("mrtr_gateway_legacy_sessions_active", &[])
        .await?;
    tokio::time::sleep(hold).await;

    let count = parked.len();
    let t1 = Instant::now();
    let (resumed, resume_errors, resume_first) = fan_out(count, width, &clients, |c, i| {
        let (answers, state) = parked[i].clone();
        async move { resume_one(&c, answers, state).await }
    })
    .await;
    let resume_secs = t1.elapsed().as_secs_f64();
    let resumed_parked = gw
        .metric("mrtr_gateway_retries_total", &[("path", "parked")])
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let released = gw.status_kib("VmRSS").unwrap_or(0);
    let left = gw.metric("mrtr_gateway_parked_calls", &[]).await?;

    let per_call = (after.saturating_sub(before) as f64 * 1024.0) / count.max(1) as f64;
    let projected_10k_mib = mib(before) + per_call * 10_000.0 / (1024.0 * 1024.0);
    let text = format!(
        "parked calls: {count} of {n} parked in {park_secs:.1} s ({errors} failed{}); gauge {gauge}, legacy sessions {sessions}\n\
         gateway VmRSS before {:.1} MiB, with {count} parked {:.1} MiB: {per_call:.0} bytes per parked call\n\
         gateway fds before {fds_before}, with parked calls {fds_after} ({:.2} per parked call)\n\
         projected for 10,000 parked calls: {projected_10k_mib:.0} MiB resident (target ≤ 256 MiB -> {})\n\
         resumed {} in {resume_secs:.1} s ({resume_errors} failed{}; {resumed_parked} served from the lot); \
         parked calls left {left}; VmRSS after release {:.1} MiB\n",
        first_error
            .map(|e| format!(", first: {e}"))
            .unwrap_or_default(),
        mib(before),
        mib(after),
        (fds_after as f64 - fds_before as f64) / count.max(1) as f64,
        if projected_10k_mib <= 256.0 {
            "met"
        } else {
            "MISSED"
        },
        resumed.len(),
        resume_first
            .map(|e| format!(", first: {e}"))
            .unwrap_or_default(),
        mib(released),
    );
    let json = json!({
        "requested": n,
        "parked": count,
        "park_errors": errors,
        "park_seconds": park_secs,
        "rss_mib": {"before": mib(before), "parked": mib(after), "after_release": mib(released)},
        "bytes_per_parked_call": per_call,
        "fds": {"before": fds_before, "parked": fds_after},
        "projected_10k_mib": projected_10k_mib,
        "resumed": resumed.len(),
        "resume_errors": resume_errors,
        "resumed_from_lot": resumed_parked,
        "parked_left": left,
    });
    Ok((text, json))
}
