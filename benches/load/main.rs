//! `mrtr-load`: load, soak and parked-call memory measurements of the gateway, run as a
//! `harness = false` bench so cargo builds it (and the gateway binary it starts) in the
//! release profile, and the test suite does not build it at all.
//!
//! ```sh
//! cargo bench --bench load -- --clients 32 --duration 60s --warmup 2s   # direct vs nginx vs gateway
//! cargo bench --bench load -- --clients 16 --json                      # the same, as JSON
//! cargo bench --bench load -- --otlp --clients 32 --duration 40s         # trace export off vs on
//! scripts/soak.sh --duration 2m                                        # --soak
//! scripts/park.sh 10000                                                # --park N
//! cargo bench --bench load -- --park 3000 --upstream-tls                # the same, legacy server over https
//! cargo bench --bench load -- --idle 1000                              # memory per idle connection
//! cargo bench --bench load -- --idle 1000 --idle-over tls              # the same over TLS (or h2, tls-h2)
//! cargo bench --bench load -- --flow plain --sweep 32,256,1024 --duration 18s --distinct-callers --plot docs/performance-sweep.svg
//! ```
//!
//! Everything runs on this machine: the fast legacy server and the clients in this process,
//! the gateway in a child process (see `gateway_child` for why). The default mode compares
//! the direct legacy path with the gateway path for a plain call and a 2-round elicitation,
//! interleaving the six scenarios (direct, a plain nginx hop, the gateway; two flows) in short slices so machine noise hits them all (see
//! `compare`).

mod compare;
mod fixture;
mod gateway_child;
mod idle;
mod legacy_client;
mod machine;
mod nginx;
mod otlp;
mod park;
mod plot;
mod report;
mod samples;
mod soak;

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde_json::json;

use gateway_child::{GatewayChild, GatewayOptions};

#[derive(Parser, Debug)]
#[command(
    name = "mrtr-load",
    about = "Load, soak and parked-call memory runs against the gateway"
)]
struct Args {
    /// Concurrent callers (each with a warm legacy session and a 2026-07-28 client).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Measured time: the whole comparison (split over its six scenarios; default 60s), or
    /// the soak (default 5m).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Warm-up of each scenario before measuring.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Length of one measured slice; scenarios rotate slice by slice.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    slice: Duration,
    /// The gateway's `mrtr.gather_window` (its default is 100ms).
    #[arg(long, default_value = "100ms")]
    gather_window: String,
    /// The gateway's `mrtr.gather_quiet` (its default is 2ms; it may not exceed the window).
    #[arg(long, default_value = "2ms")]
    gather_quiet: String,
    /// The gateway's `log.level` (its default, `info`, writes one access line per request).
    #[arg(long, default_value = "info")]
    log_level: String,
    /// The gateway's `parking.default_policy`: park-then-replay (default) or replay.
    #[arg(long, default_value = "park-then-replay")]
    policy: String,
    /// The gateway's clients declare `roots` (as desktop clients do), not only elicitation.
    #[arg(long)]
    roots: bool,
    /// Make each gateway client a caller of its own, as distinct users are: the gateway
    /// forwards the client's `Authorization` upstream (`auth.upstream_credentials =
    /// "forward"`) and each client sends its own bearer token, so pools key and share
    /// per client. Without it every client is the same anonymous caller.
    #[arg(long)]
    distinct_callers: bool,
    /// nginx writes its default access log (one line per request, to a file), as the
    /// gateway writes its access line at its default `log.level`; without it nginx logs no
    /// request (the stricter reference).
    #[arg(long)]
    nginx_access_log: bool,
    /// Measure only this flow: `plain` or `elicitation` (both by default); for a profile of
    /// one of them, e.g. under `--gateway-prefix`.
    #[arg(long, value_parser = parse_flow)]
    flow: Option<compare::Flow>,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Run the mixed soak instead of the comparison.
    #[arg(long)]
    soak: bool,
    /// How often the soak samples the gateway's VmRSS.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    sample_every: Duration,
    /// Park this many calls and report the gateway's resident memory per parked call.
    #[arg(long)]
    park: Option<usize>,
    /// Open this many client connections, one call each, keep them idle, and report the
    /// gateway's resident memory per idle connection.
    #[arg(long)]
    idle: Option<usize>,
    /// With `--idle`: how the idle clients connect: `http1` (plain HTTP/1.1, the default),
    /// `h2` (HTTP/2 with prior knowledge), `tls` (HTTP/1.1 over TLS) or `tls-h2` (HTTP/2
    /// over TLS, by ALPN). For the TLS ones the gateway gets a self-signed certificate.
    #[arg(long, default_value = "http1", value_parser = idle::Transport::parse)]
    idle_over: idle::Transport,
    /// Run the comparison at each of these numbers of clients (e.g. `32,256,1024`) and print
    /// the plain call's figures side by side.
    #[arg(long, value_delimiter = ',')]
    sweep: Vec<usize>,
    /// With `--sweep`: write an SVG plot of the figures here.
    #[arg(long)]
    plot: Option<String>,
    /// Calls in flight at once while parking.
    #[arg(long, default_value_t = 64)]
    park_concurrency: usize,
    /// With `--park`: keep the calls parked this much longer after the reading, before they
    /// are resumed (time to take a heap profiler's snapshot under `--gateway-prefix`).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    park_hold: Duration,
    /// With `--park`: the gateway reaches the legacy server over `https`, through an nginx
    /// that terminates TLS in front of it (a self-signed certificate for `localhost`, trusted
    /// as `upstream.ca_file`), so each parked call's upstream streams are TLS connections.
    #[arg(long)]
    upstream_tls: bool,
    /// With `--upstream-tls`: the TLS versions that nginx offers (its `ssl_protocols`). The
    /// default is what nginx offers from 1.23.4 on; Debian's nginx 1.22 offers up to TLS 1.2
    /// unless told (`--upstream-tls-protocols TLSv1.2` measures that).
    #[arg(long, default_value = "TLSv1.2 TLSv1.3")]
    upstream_tls_protocols: String,
    /// Compare the gateway with trace export off and on (a second gateway exporting to an
    /// OTLP/HTTP sink in this process), side by side, instead of direct/nginx/gateway.
    #[arg(long)]
    otlp: bool,
    /// Run this gateway binary instead of the one built with the bench (to compare builds).
    #[arg(long)]
    gateway_binary: Option<String>,
    /// Run the gateway under this command, e.g. "valgrind --tool=callgrind".
    #[arg(long)]
    gateway_prefix: Option<String>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn parse_flow(s: &str) -> Result<compare::Flow, String> {
    match s {
        "plain" => Ok(compare::Flow::Plain),
        "elicitation" => Ok(compare::Flow::Elicit),
        _ => Err(format!("{s}: plain or elicitation")),
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("the runtime starts");
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mrtr-load: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let park_mode = args.park.is_some();
    // Parked calls wait on their question far longer than the server's default minute.
    let legacy = fixture::start(if park_mode {
        None
    } else {
        Some(Duration::from_secs(60))
    })
    .await
    .map_err(|e| format!("legacy server: {e}"))?;
    let mut options = GatewayOptions {
        gather_window: args.gather_window.clone(),
        gather_quiet: args.gather_quiet.clone(),
        policy: args.policy.clone(),
        log_level: args.log_level.clone(),
        binary: args.gateway_binary.clone(),
        prefix: args
            .gateway_prefix
            .as_deref()
            .map(|p| p.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default(),
        forward_credentials: args.distinct_callers,
        ..GatewayOptions::default()
    };
    if let Some(n) = args.park {
        options.parking_max_calls = n + 64;
        options.parking_max_per_principal = n + 64;
        options.newcomer_reserve = 0.0;
        options.parking_ttl = "10m".into();
        options.upstream_idle_timeout = "30m".into();
    }
    if args.idle.is_some() {
        // By default an idle HTTP/1 connection is closed after `header_read_timeout` (10 s):
        // the idle run holds its connections longer than that to read the steady state.
        options.header_read_timeout = "60s".into();
        if args.idle_over.is_tls() {
            options.tls = Some(idle::self_signed()?);
        }
    }
    // `--upstream-tls`: nginx terminates TLS in front of the legacy server.
    let tls_front = if args.upstream_tls {
        let (cert, key) = idle::self_signed()?;
        let hop =
            nginx::NginxHop::start_tls(&legacy.url(), &cert, &key, &args.upstream_tls_protocols)
                .await?;
        options.upstream_ca = Some(cert);
        Some(hop)
    } else {
        None
    };
    let upstream_url = tls_front
        .as_ref()
        .map_or_else(|| legacy.url(), |hop| hop.url.clone());
    let gw = GatewayChild::spawn(&upstream_url, &options).await?;
    let outcome = if let Some(n) = args.park {
        park_run(&gw, n, &args).await
    } else if let Some(n) = args.idle {
        idle::run(&gw, n, args.idle_over)
            .await
            .map(|(text, json)| emit(&args, &text, json))
    } else if args.soak {
        soak_run(&legacy, &gw, &args).await
    } else if !args.sweep.is_empty() {
        sweep_run(&legacy, &gw, &args, &options).await
    } else if args.otlp {
        otlp_run(&legacy, &gw, &args, &options).await
    } else {
        compare_run(&legacy, &gw, &args, &options).await
    };
    if outcome.is_err() {
        eprintln!("gateway log tail:\n{}", gw.log_tail());
    }
    gw.stop().await;
    if let Some(hop) = tls_front {
        hop.stop().await;
    }
    legacy.shutdown().await;
    outcome
}

fn emit(args: &Args, text: &str, json: serde_json::Value) {
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json).expect("JSON prints")
        );
    } else {
        print!("{text}");
    }
}

async fn compare_run(
    legacy: &mrtr_testkit::legacy_server::LegacyServer,
    gw: &GatewayChild,
    args: &Args,
    options: &GatewayOptions,
) -> Result<(), String> {
    let (comparison, setup, setup_json) = measure(legacy, gw, args, options, args.clients).await?;
    emit(
        args,
        &report::table(&comparison, &setup),
        report::json(&comparison, setup_json),
    );
    Ok(())
}

/// `--sweep`: the comparison at each number of clients, one after the other, and (with
/// `--plot`) an SVG of throughput and p99 against the number of clients.
async fn sweep_run(
    legacy: &mrtr_testkit::legacy_server::LegacyServer,
    gw: &GatewayChild,
    args: &Args,
    options: &GatewayOptions,
) -> Result<(), String> {
    let mut points = Vec::new();
    for &n in &args.sweep {
        let (comparison, setup, _) = measure(legacy, gw, args, options, n).await?;
        eprintln!("{setup}");
        let plain = comparison
            .flows
            .iter()
            .find(|f| f.flow == compare::Flow::Plain)
            .ok_or("no plain flow measured")?;
        points.push(plot::Point {
            clients: n,
            direct: plain.direct.throughput,
            nginx: plain.nginx.throughput,
            gateway: plain.gateway.throughput,
            gateway_p50_ms: plain.gateway.p50_ms,
            gateway_p99_ms: plain.gateway.p99_ms,
            nginx_cpu_us: plain.nginx.hop_cpu_us_per_call.0 + plain.nginx.hop_cpu_us_per_call.1,
            gateway_cpu_us: plain.gateway.hop_cpu_us_per_call.0
                + plain.gateway.hop_cpu_us_per_call.1,
            direct_load_cpu_us: plain.direct.load_cpu_us_per_call,
        });
    }
    print!("{}", plot::table(&points));
    if let Some(path) = &args.plot {
        std::fs::write(path, plot::svg(&points)).map_err(|e| format!("{path}: {e}"))?;
        println!("plot written to {path}");
    }
    Ok(())
}

/// One comparison with `clients` callers: the comparison, and its setup as text and JSON.
async fn measure(
    legacy: &mrtr_testkit::legacy_server::LegacyServer,
    gw: &GatewayChild,
    args: &Args,
    options: &GatewayOptions,
    clients: usize,
) -> Result<(compare::Comparison, String, serde_json::Value), String> {
    let duration = args.duration.unwrap_or(Duration::from_secs(60));
    let hop = nginx::NginxHop::start(&legacy.url(), args.nginx_access_log).await?;
    // Each round takes one slice of each path, for one flow or both.
    let scenarios = if args.flow.is_some() { 3.0 } else { 6.0 };
    let rounds = ((duration.as_secs_f64() / scenarios) / args.slice.as_secs_f64())
        .round()
        .max(1.0) as usize;
    let mut callers = Vec::with_capacity(clients);
    for i in 0..clients {
        let mut caller =
            compare::Caller::connect(&legacy.url(), &hop.url, &gw.url, args.roots).await?;
        if args.distinct_callers {
            caller = caller.with_credential(&format!("Bearer load-caller-{i}"));
        }
        callers.push(Arc::new(caller));
    }
    let opened_before = gw
        .metric("mrtr_gateway_legacy_sessions_opened_total", &[])
        .await?;
    let discards_before = gw.metric("mrtr_gateway_pool_discards_total", &[]).await?;
    let conns_before = upstream_conns(gw).await?;
    let cpu = |path: compare::Path| match path {
        compare::Path::Direct => (0.0, 0.0),
        compare::Path::Nginx => hop.cpu_seconds(),
        compare::Path::Gateway | compare::Path::GatewayTraced => gw.cpu_seconds(),
    };
    let comparison = compare::run(
        &callers,
        args.warmup,
        args.slice,
        rounds,
        !args.json,
        &cpu,
        args.flow,
    )
    .await;
    for caller in callers {
        if let Ok(c) = Arc::try_unwrap(caller) {
            c.direct.close().await;
            c.via_nginx.close().await;
        }
    }
    hop.stop().await;
    // How many legacy sessions the gateway opened per call it served (warm-up included): a
    // pool that keeps up with the concurrency opens about none.
    let opened = gw
        .metric("mrtr_gateway_legacy_sessions_opened_total", &[])
        .await?
        - opened_before;
    let discarded = gw.metric("mrtr_gateway_pool_discards_total", &[]).await? - discards_before;
    let served: u64 = comparison.flows.iter().map(|f| f.gateway.calls).sum();
    let conns = upstream_conns(gw).await?.since(&conns_before);

    let machine = machine::Machine::read();
    let setup = format!(
        "mrtr-load: {} clients; {} rounds of {:?} slices per scenario after {:?} warm-up each; \
         gateway = child process (release mrtr-gateway serve, gather_window {}, gather_quiet {}, parking {}, log.level {}); \
         legacy server and clients in this process; {}; gateway clients declare {} and are {}; nginx with {}; the gateway opened {} legacy sessions and discarded {} from its pool over {} measured calls; upstream connections {}",
        clients,
        rounds,
        args.slice,
        args.warmup,
        options.gather_window,
        options.gather_quiet,
        options.policy,
        options.log_level,
        machine.describe(),
        if args.roots {
            "elicitation and roots"
        } else {
            "elicitation"
        },
        if args.distinct_callers {
            "distinct callers (own forwarded credential each)"
        } else {
            "one anonymous caller"
        },
        if args.nginx_access_log {
            "its access log on"
        } else {
            "no access log"
        },
        opened,
        discarded,
        served,
        conns.describe(),
    );
    let setup_json = json!({
        "clients": clients,
        "rounds": rounds,
        "slice_s": args.slice.as_secs_f64(),
        "warmup_s": args.warmup.as_secs_f64(),
        "gather_window": options.gather_window,
        "gather_quiet": options.gather_quiet,
        "parking_policy": options.policy,
        "log_level": options.log_level,
        "clients_declare_roots": args.roots,
        "distinct_callers": args.distinct_callers,
        "nginx_access_log": args.nginx_access_log,
        "legacy_sessions_opened": opened,
        "pool_discards": discarded,
        "gateway_calls_measured": served,
        "upstream_connections": conns.to_json(),
        "gateway": "child process: release mrtr-gateway serve",
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "machine": machine.to_json(),
    });
    Ok((comparison, setup, setup_json))
}

/// The gateway's upstream connection counters: opened by method, closed by reason (all zero
/// on a build that does not count them).
struct UpstreamConns {
    opened: Vec<(&'static str, f64)>,
    closed: Vec<(&'static str, f64)>,
}

const OPENED_FOR: [&str; 4] = ["GET", "POST", "DELETE", "other"];
const CLOSED_FOR: [&str; 6] = [
    "unfinished",
    "server_closed",
    "idle_timeout",
    "idle_full",
    "failed",
    "released",
];

async fn upstream_conns(gw: &GatewayChild) -> Result<UpstreamConns, String> {
    Ok(UpstreamConns {
        opened: by_label(
            gw,
            "upstream_connections_opened_total",
            "method",
            &OPENED_FOR,
        )
        .await?,
        closed: by_label(
            gw,
            "upstream_connections_closed_total",
            "reason",
            &CLOSED_FOR,
        )
        .await?,
    })
}

/// The gateway's `mrtr_gateway_<family>` samples for each of `values` of `label`.
async fn by_label(
    gw: &GatewayChild,
    family: &str,
    label: &str,
    values: &[&'static str],
) -> Result<Vec<(&'static str, f64)>, String> {
    let name = format!("mrtr_gateway_{family}");
    let mut out = Vec::with_capacity(values.len());
    for v in values {
        out.push((*v, gw.metric(&name, &[(label, v)]).await?));
    }
    Ok(out)
}

impl UpstreamConns {
    fn since(&self, before: &UpstreamConns) -> UpstreamConns {
        let minus = |now: &[(&'static str, f64)], then: &[(&'static str, f64)]| {
            now.iter()
                .zip(then)
                .map(|((k, a), (_, b))| (*k, a - b))
                .collect()
        };
        UpstreamConns {
            opened: minus(&self.opened, &before.opened),
            closed: minus(&self.closed, &before.closed),
        }
    }

    fn describe(&self) -> String {
        let list = |v: &[(&str, f64)]| {
            v.iter()
                .filter(|(_, n)| *n > 0.0)
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "opened {} ({}), closed {} ({})",
            self.opened.iter().map(|(_, n)| n).sum::<f64>(),
            list(&self.opened),
            self.closed.iter().map(|(_, n)| n).sum::<f64>(),
            list(&self.closed)
        )
    }

    fn to_json(&self) -> serde_json::Value {
        let map = |v: &[(&str, f64)]| {
            v.iter()
                .map(|(k, n)| (k.to_string(), json!(n)))
                .collect::<serde_json::Map<_, _>>()
        };
        json!({"opened": map(&self.opened), "closed": map(&self.closed)})
    }
}

async fn otlp_run(
    legacy: &mrtr_testkit::legacy_server::LegacyServer,
    gw: &GatewayChild,
    args: &Args,
    options: &GatewayOptions,
) -> Result<(), String> {
    let duration = args.duration.unwrap_or(Duration::from_secs(60));
    let (endpoint, sink) = otlp::start_sink().await?;
    let traced = GatewayChild::spawn(
        &legacy.url(),
        &GatewayOptions {
            otlp_endpoint: Some(endpoint),
            ..options.clone()
        },
    )
    .await?;
    let rounds = ((duration.as_secs_f64() / 4.0) / args.slice.as_secs_f64())
        .round()
        .max(1.0) as usize;
    let mut callers = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        // The nginx client is unused here: it talks to the legacy server directly.
        callers.push(Arc::new(
            compare::Caller::connect(&legacy.url(), &legacy.url(), &gw.url, args.roots)
                .await?
                .with_traced(&traced.url),
        ));
    }
    let cpu = |path: compare::Path| match path {
        compare::Path::GatewayTraced => traced.cpu_seconds(),
        compare::Path::Gateway => gw.cpu_seconds(),
        _ => (0.0, 0.0),
    };
    let flows = otlp::run(&callers, args.warmup, args.slice, rounds, !args.json, &cpu).await;
    for caller in callers {
        if let Ok(c) = Arc::try_unwrap(caller) {
            c.direct.close().await;
            c.via_nginx.close().await;
        }
    }
    // Let the last batch go out before counting.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (exported, dropped, failed) = otlp::exported(&traced).await?;
    let requests = sink.requests.load(std::sync::atomic::Ordering::Relaxed);
    let bytes = sink.bytes.load(std::sync::atomic::Ordering::Relaxed);
    traced.stop().await;
    let machine = machine::Machine::read();
    let setup = format!(
        "mrtr-load --otlp: {} clients; {} rounds of {:?} slices per scenario after {:?} warm-up each; \
         two gateway children at the shipped defaults (log.level {}), one with [tracing] otlp_endpoint \
         set to a sink in this process (defaults: batches of up to 512 spans every 5s); {}; \
         the traced gateway exported {exported} spans ({dropped} dropped, {failed} failed) in {requests} \
         export requests, {bytes} bytes",
        args.clients,
        rounds,
        args.slice,
        args.warmup,
        options.log_level,
        machine.describe(),
    );
    let setup_json = json!({
        "clients": args.clients,
        "rounds": rounds,
        "slice_s": args.slice.as_secs_f64(),
        "warmup_s": args.warmup.as_secs_f64(),
        "log_level": options.log_level,
        "spans_exported": exported,
        "spans_dropped": dropped,
        "spans_failed": failed,
        "export_requests": requests,
        "export_bytes": bytes,
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "machine": machine.to_json(),
    });
    emit(
        args,
        &otlp::table(&flows, &setup),
        otlp::json(&flows, setup_json),
    );
    Ok(())
}

async fn soak_run(
    legacy: &mrtr_testkit::legacy_server::LegacyServer,
    gw: &GatewayChild,
    args: &Args,
) -> Result<(), String> {
    let options = soak::SoakOptions {
        clients: args.clients,
        duration: args.duration.unwrap_or(Duration::from_secs(300)),
        sample_every: args.sample_every,
    };
    let (text, json) = soak::run(legacy, gw, &options).await?;
    emit(args, &text, json);
    Ok(())
}

async fn park_run(gw: &GatewayChild, n: usize, args: &Args) -> Result<(), String> {
    let (text, json) = park::run(gw, n, args.park_concurrency, args.park_hold).await?;
    emit(args, &text, json);
    Ok(())
}
