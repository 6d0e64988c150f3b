//! The bridge over every legacy transport: the interop flows through a FastMCP server
//! (`mcp==1.30.0`) spoken to over stdio and over the 2024-11-05 HTTP+SSE transport; stdio
//! children that crash, hang, babble or cannot start; and the Streamable HTTP details (SSE
//! polling and resumption, a GET stream that breaks, a stateless server).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::peers::tempdir::TempDir;
use crate::support::peers::{
    PyLegacyServer, assert_ok, input_rounds, legacy_python, modern_scenario, progress_values,
    python_stdio_command, repo, result_text, starts_in,
};
use crate::support::*;
use mrtr_gateway::front::listener::Running;
use mrtr_gateway::gateway::Gateway;
use mrtr_gateway::legacy::upstream::Upstream;
use mrtr_testkit::client::ModernClient;
use mrtr_testkit::legacy_server::{CallStreamFault, Handlers, LegacyServer, LegacyServerConfig};
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Stdio,
    Sse,
}

/// A gateway in front of FastMCP over `Kind`.
struct Bridge {
    /// The HTTP+SSE server process (stdio children belong to the gateway).
    legacy: Option<PyLegacyServer>,
    count_file: PathBuf,
    _dir: TempDir,
    gw: Arc<Gateway>,
    running: Running,
    url: String,
}

async fn bridge(kind: Kind) -> Bridge {
    let dir = TempDir::new("mrtr-transports");
    // Generous gather window and quiet period, as in the interop tests: on a busy machine the
    // siblings of a parallel round can arrive more than the default 2 ms apart, and the tests
    // below check how questions are grouped into rounds.
    let extra = "[mrtr]\ngather_window = \"400ms\"\ngather_quiet = \"100ms\"\n";
    let (legacy, count_file, upstream) = match kind {
        Kind::Stdio => {
            let count_file = dir.path().join("counts");
            let command =
                python_stdio_command(&["--count-file", count_file.to_string_lossy().as_ref()]);
            // Every round starts a Python interpreter: allow for a slow start.
            let upstream = format!(
                "transport = \"stdio\"\ncommand = {command}\nresponse_timeout = \"60s\"\ncall_timeout = \"60s\"\n"
            );
            (None, count_file, upstream)
        }
        Kind::Sse => {
            let legacy = PyLegacyServer::start(&["--transport", "sse"]).await;
            let upstream = format!(
                "transport = \"sse\"\nurl = \"{}\"\nresponse_timeout = \"30s\"\ncall_timeout = \"30s\"\n",
                legacy.sse_url()
            );
            let count_file = legacy.count_file.clone();
            (Some(legacy), count_file, upstream)
        }
    };
    let (gw, running, url) = start_gateway(config_with_upstream(&upstream, "", extra)).await;
    Bridge {
        legacy,
        count_file,
        _dir: dir,
        gw,
        running,
        url,
    }
}

impl Bridge {
    async fn run(&self, scenario: &str, extra: &[&str]) -> Value {
        modern_scenario(&self.url, scenario, extra).await
    }

    /// Runs one interop flow and checks what it must produce.
    async fn flow(&self, name: &str) {
        let rounds = |r: &Value| input_rounds(r);
        let v = |methods: &[&[&str]]| -> Vec<Vec<String>> {
            methods
                .iter()
                .map(|r| r.iter().map(|m| m.to_string()).collect())
                .collect()
        };
        match name {
            "greet" => {
                let r = self.run("greet", &["--raw"]).await;
                assert_ok(&r);
                assert_eq!(result_text(&r), "Hello, Ada!");
                assert_eq!(rounds(&r), v(&[&["elicitation/create"]]));
            }
            "two_step" => {
                let r = self.run("two_step", &["--raw"]).await;
                assert_ok(&r);
                assert_eq!(result_text(&r), "Ada likes blue");
                assert_eq!(
                    rounds(&r),
                    v(&[&["elicitation/create"], &["elicitation/create"]])
                );
            }
            "elicit_then_sample" => {
                let r = self.run("elicit_then_sample", &["--raw"]).await;
                assert_ok(&r);
                assert_eq!(result_text(&r), "rust: sampled: Write a haiku about ");
                assert_eq!(
                    rounds(&r),
                    v(&[&["elicitation/create"], &["sampling/createMessage"]])
                );
            }
            "sample_only" => {
                let r = self.run("sample_only", &[]).await;
                assert_ok(&r);
                assert_eq!(result_text(&r), "Paris");
                assert_eq!(r["callbacks"]["sampling"], 1);
            }
            "list_my_roots" => {
                let r = self.run("list_my_roots", &["--raw"]).await;
                assert_ok(&r);
                assert_eq!(
                    result_text(&r),
                    "file:///tmp/project-a,file:///tmp/project-b"
                );
                assert_eq!(rounds(&r), v(&[&["roots/list"]]));
            }
            "parallel_three" => {
                let r = self.run("parallel_three", &["--raw"]).await;
                assert_ok(&r);
                assert_eq!(
                    result_text(&r),
                    "Ada|7|file:///tmp/project-a,file:///tmp/project-b"
                );
                assert_eq!(
                    rounds(&r),
                    v(&[&["elicitation/create", "roots/list", "sampling/createMessage"]])
                );
            }
            "prompt" => {
                let r = self.run("prompt", &["--raw"]).await;
                assert_ok(&r);
                assert_eq!(result_text(&r), "Review this code in a terse style:\nx=1");
                assert_eq!(rounds(&r), v(&[&["elicitation/create"]]));
            }
            "resource" => {
                let r = self.run("resource", &["--raw"]).await;
                assert_ok(&r);
                assert_eq!(result_text(&r), "Hi, ada");
                assert_eq!(r["result"]["ttlMs"], 0);
            }
            "progress_task" => {
                let r = self.run("progress_task", &[]).await;
                assert_ok(&r);
                assert_eq!(result_text(&r), "done 3");
                assert_eq!(progress_values(&r), vec![1.0, 2.0, 3.0]);
            }
            "declined" => {
                let r = self.run("declined", &["--raw"]).await;
                assert_ok(&r);
                assert_eq!(result_text(&r), "greet: decline");
            }
            "no_elicitation" => {
                let r = self.run("no_elicitation", &[]).await;
                assert_eq!(r["error"]["code"], -32021, "{r:#}");
                assert_eq!(r["callbacks"]["elicitation"], 0);
            }
            other => panic!("no flow {other}"),
        }
    }

    /// Every legacy session has ended, and (stdio) every child is gone, once the warm
    /// sessions the pool keeps on purpose are closed.
    async fn assert_all_closed(&self) {
        let gw = self.gw.clone();
        gw.sessions.pool().clear().await;
        assert!(
            eventually(Duration::from_secs(15), || {
                metric(&gw, "mrtr_gateway_legacy_sessions_active", &[]) == 0.0
                    && live_children(&gw) == 0
            })
            .await,
            "sessions still open: {} (children {})",
            metric(&gw, "mrtr_gateway_legacy_sessions_active", &[]),
            live_children(&gw)
        );
    }

    async fn stop(self) {
        self.assert_all_closed().await;
        self.running.stop().await;
        if let Some(l) = self.legacy {
            l.kill().await;
        }
    }
}

/// stdio children alive now (0 for other transports).
fn live_children(gw: &Gateway) -> usize {
    match &*gw.sessions.upstream() {
        Upstream::Stdio(s) => s.live_children(),
        _ => 0,
    }
}

async fn flows(kind: Kind, names: &[&str]) {
    let b = bridge(kind).await;
    for name in names {
        eprintln!("{kind:?}: {name}");
        b.flow(name).await;
    }
    // The body of a tool that asked one question ran twice (first round, then the retry).
    if names.contains(&"greet") {
        assert!(starts_in(&b.count_file, "greet") >= 2);
    }
    b.stop().await;
}

macro_rules! flow_tests {
    ($($test:ident: $kind:expr => [$($flow:literal),+];)+) => {$(
        #[tokio::test]
        async fn $test() {
            flows($kind, &[$($flow),+]).await;
        }
    )+};
}

flow_tests! {
    stdio_elicitation_flows: Kind::Stdio => ["greet", "two_step", "declined", "no_elicitation"];
    stdio_sampling_and_roots_flows: Kind::Stdio => ["elicit_then_sample", "sample_only", "list_my_roots", "parallel_three"];
    stdio_prompt_resource_and_progress_flows: Kind::Stdio => ["prompt", "resource", "progress_task"];
    sse_elicitation_flows: Kind::Sse => ["greet", "two_step", "declined", "no_elicitation"];
    sse_sampling_and_roots_flows: Kind::Sse => ["elicit_then_sample", "sample_only", "list_my_roots", "parallel_three"];
    sse_prompt_resource_and_progress_flows: Kind::Sse => ["prompt", "resource", "progress_task"];
}

// ---------------------------------------------------------------- stdio faults

/// A gateway whose stdio upstream is `tests/peers/stdio_faults.py --mode <mode>`.
struct Faulty {
    dir: TempDir,
    gw: Arc<Gateway>,
    running: Running,
    url: String,
}

async fn faulty(mode: &str, upstream_extra: &str) -> Faulty {
    let dir = TempDir::new("mrtr-stdio-faults");
    let command = toml_strings(&[
        legacy_python().to_string_lossy().as_ref(),
        repo()
            .join("tests/peers/stdio_faults.py")
            .to_string_lossy()
            .as_ref(),
        "--mode",
        mode,
        "--state-dir",
        dir.path().to_string_lossy().as_ref(),
    ]);
    faulty_command(dir, &command, upstream_extra).await
}

async fn faulty_command(dir: TempDir, command: &str, upstream_extra: &str) -> Faulty {
    let upstream = format!(
        "transport = \"stdio\"\ncommand = {command}\nstdio_shutdown_grace = \"200ms\"\n{upstream_extra}\n"
    );
    let upstream = if upstream_extra.contains("response_timeout") {
        upstream
    } else {
        format!("{upstream}response_timeout = \"10s\"\n")
    };
    let upstream = if upstream_extra.contains("call_timeout") {
        upstream
    } else {
        format!("{upstream}call_timeout = \"20s\"\n")
    };
    let (gw, running, url) = start_gateway(config_with_upstream(&upstream, "", "")).await;
    Faulty {
        dir,
        gw,
        running,
        url,
    }
}

impl Faulty {
    async fn call(&self) -> mrtr_testkit::client::Exchange {
        ModernClient::new(&self.url)
            .request("tools/call", json!({"name": "work", "arguments": {}}))
            .await
            .expect("the gateway answers")
    }

    /// Pids of every child started so far, in order.
    fn pids(&self) -> Vec<u32> {
        pids_in(self.dir.path())
    }

    async fn stop(self) {
        let gw = self.gw.clone();
        // Warm sessions are kept on purpose; anything else left would be a leak.
        gw.sessions.pool().clear().await;
        assert!(
            eventually(Duration::from_secs(10), || live_children(&gw) == 0).await,
            "children left: {}",
            live_children(&gw)
        );
        self.running.stop().await;
    }
}

fn pids_in(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Whether `pid` is a running (not exited) process.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name; Z is a zombie (exited).
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

async fn assert_gone(pid: u32) {
    assert!(
        eventually(Duration::from_secs(10), || !alive(pid)).await,
        "process {pid} is still alive"
    );
}

fn error_message(ex: &mrtr_testkit::client::Exchange) -> String {
    ex.error()
        .and_then(|e| e["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Where a failure's explanation goes.
enum Expect<'a> {
    /// In the client's error message (the gateway's own words, e.g. its timeouts).
    Told(&'a str),
    /// Only in the WARN log line with the client's request id (what the child said or did).
    Logged(&'a str),
}

/// The first call's child misbehaves as `mode`; the call fails as `expected` says, the child
/// is gone, and the next call works on a fresh child. Returns the WARN lines of the failure.
async fn fails_then_recovers(f: &Faulty, expected: Expect<'_>, status: u16) -> Vec<String> {
    let before = f.pids().len();
    let first = f.call().await;
    assert_eq!(first.status.as_u16(), status, "{:?}", first.message);
    assert_eq!(first.error_code(), Some(-32603), "{:?}", first.message);
    let error = first.error().unwrap().clone();
    let warned = match expected {
        Expect::Told(part) => {
            let msg = error_message(&first);
            assert!(msg.contains(part), "{msg}");
            Vec::new()
        }
        Expect::Logged(detail) => {
            crate::support::logs::assert_detail_logged_not_told(&error, detail)
        }
    };
    let pids = f.pids();
    assert_eq!(pids.len(), before + 1, "one child for the call: {pids:?}");
    assert_gone(pids[before]).await;
    let second = f.call().await;
    let pids = f.pids();
    assert_eq!(pids.len(), before + 2, "a fresh child: {pids:?}");
    assert_eq!(
        text(second.result().expect("the next call succeeds")),
        format!("ok from pid {}", pids[before + 1])
    );
    warned
}

#[tokio::test]
async fn a_child_that_crashes_mid_call_fails_that_call_clearly_and_is_replaced() {
    let f = faulty("crash", "").await;
    let warned = fails_then_recovers(
        &f,
        Expect::Logged("exited with status 1 during tools/call"),
        502,
    )
    .await;
    // Its last stderr line, which says why, is in the log line (never told to the client,
    // which the helper checked for the exit status; the same holds for the stderr line).
    assert!(
        warned.iter().any(|l| l.contains("crashing on purpose")),
        "{warned:#?}"
    );
    f.stop().await;
}

#[tokio::test]
async fn a_child_that_hangs_is_killed_when_the_call_times_out() {
    // It ignores stdin closing and SIGTERM: only the final SIGKILL of close() ends it.
    let f = faulty("hang", "call_timeout = \"2s\"").await;
    fails_then_recovers(
        &f,
        Expect::Told("did not finish tools/call within upstream.call_timeout"),
        504,
    )
    .await;
    f.stop().await;
}

#[tokio::test]
async fn a_silent_child_is_killed_after_the_idle_timeout() {
    let f = faulty("hang", "idle_timeout = \"1s\"").await;
    fails_then_recovers(
        &f,
        Expect::Logged("sent nothing for 1s (upstream.idle_timeout) during tools/call"),
        502,
    )
    .await;
    f.stop().await;
}

#[tokio::test]
async fn a_child_that_writes_garbage_is_killed() {
    let f = faulty("garbage", "").await;
    fails_then_recovers(
        &f,
        Expect::Logged("wrote a line that is not JSON-RPC: \"this is not json\""),
        502,
    )
    .await;
    f.stop().await;
}

#[tokio::test]
async fn a_stdout_line_over_the_cap_is_refused_and_counted() {
    let f = faulty("huge", "max_line_bytes = 4096").await;
    fails_then_recovers(
        &f,
        Expect::Logged(
            "wrote a stdout line longer than 4096 bytes (upstream.max_line_bytes) during tools/call",
        ),
        502,
    )
    .await;
    assert_metric!(
        &f.gw,
        "limit_hits_total",
        &[("limit", "upstream_max_line_bytes")],
        1.0
    );
    f.stop().await;
}

#[tokio::test]
async fn a_command_that_cannot_start_is_backed_off_with_a_clear_error() {
    let dir = TempDir::new("mrtr-stdio-missing");
    let missing = dir.path().join("no-such-server");
    let command = toml_strings(&[missing.to_string_lossy().as_ref()]);
    let f = faulty_command(dir, &command, "stdio_spawn_backoff = \"30s\"").await;
    let first = f.call().await;
    assert_eq!(first.status.as_u16(), 502);
    // The command line is an internal: the log names it, the client does not hear it.
    let warned = crate::support::logs::assert_detail_logged_not_told(
        first.error().unwrap(),
        "no-such-server",
    );
    assert!(
        warned.iter().any(|l| l.contains("cannot start")),
        "{warned:#?}"
    );
    assert!(
        error_message(&first).contains("could not be started"),
        "{:?}",
        first.message
    );
    // Failures double the wait (100 ms, 200 ms, …): some attempt soon lands inside it.
    let mut held_back = None;
    for _ in 0..12 {
        let ex = f.call().await;
        if ex.status.as_u16() == 503 {
            held_back = Some(ex);
            break;
        }
        assert_eq!(ex.status.as_u16(), 502, "{:?}", ex.message);
    }
    let held_back = held_back.expect("a call arrives while the command is backed off");
    crate::support::logs::assert_detail_logged_not_told(
        held_back.error().unwrap(),
        "no-such-server",
    );
    assert!(
        error_message(&held_back).contains("the next attempt is in"),
        "{:?}",
        held_back.message
    );
    assert!(held_back.headers.contains_key("retry-after"));
    f.stop().await;
}

#[tokio::test]
async fn a_2024_11_05_server_is_spoken_to_in_its_version() {
    let dir = TempDir::new("mrtr-stdio-2024");
    // A call already counted: this server behaves from the start.
    std::fs::write(dir.path().join("calls"), "0\n").unwrap();
    let command = toml_strings(&[
        legacy_python().to_string_lossy().as_ref(),
        repo()
            .join("tests/peers/stdio_faults.py")
            .to_string_lossy()
            .as_ref(),
        "--mode",
        "crash",
        "--state-dir",
        dir.path().to_string_lossy().as_ref(),
    ]);
    let f = faulty_command(dir, &command, "protocol_version = \"2024-11-05\"").await;
    let ex = f.call().await;
    let pids = f.pids();
    assert_eq!(
        text(ex.result().expect("the call completes")),
        format!("ok from pid {}", pids[pids.len() - 1])
    );
    f.stop().await;
}

#[tokio::test]
async fn children_are_bounded_by_stdio_max_children() {
    let f = faulty(
        "hang",
        "stdio_max_children = 1\nresponse_timeout = \"1s\"\ncall_timeout = \"4s\"",
    )
    .await;
    // The first call's child hangs and holds the only slot until the call times out.
    let url = f.url.clone();
    let busy = tokio::spawn(async move {
        ModernClient::new(&url)
            .request("tools/call", json!({"name": "work", "arguments": {}}))
            .await
            .expect("the gateway answers")
    });
    let calls = f.dir.path().join("calls");
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(&calls)
            .is_ok_and(|c| !c.is_empty()))
        .await
    );
    let second = f.call().await;
    assert_eq!(second.status.as_u16(), 503, "{:?}", second.message);
    assert!(
        error_message(&second).contains("upstream.stdio_max_children"),
        "{:?}",
        second.message
    );
    assert_metric!(
        &f.gw,
        "limit_hits_total",
        &[("limit", "stdio_max_children")],
        1.0
    );
    assert_eq!(busy.await.unwrap().status.as_u16(), 504);
    // The slot is free again.
    assert!(f.call().await.result().is_some());
    f.stop().await;
}

/// A descriptor the gateway inherited without close-on-exec (fd 5, opened by the shell that
/// starts the gateway binary) stays open in the gateway but never reaches a stdio child: the
/// FastMCP child lists its own descriptors, and none of them is the inherited file.
#[tokio::test]
async fn stdio_children_do_not_inherit_descriptors_the_gateway_inherited() {
    let dir = TempDir::new("mrtr-stdio-fds");
    let marker = dir.path().join("inherited-by-the-gateway");
    std::fs::write(&marker, "the gateway's parent opened this on fd 5\n").unwrap();
    let command = python_stdio_command(&[]);
    let config = format!(
        "[upstream]\ntransport = \"stdio\"\ncommand = {command}\nresponse_timeout = \"60s\"\n\
         call_timeout = \"60s\"\n[log]\nformat = \"text\"\n\
         [[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n"
    );
    // `exec 5<FILE` leaves fd 5 open without FD_CLOEXEC, then the shell becomes the gateway.
    let marker_arg = marker.to_string_lossy().into_owned();
    let launcher = [
        "sh",
        "-c",
        "exec 5<\"$1\"; shift; exec \"$@\"",
        "sh",
        marker_arg.as_str(),
    ];
    let (child, url, _admin) =
        crate::support::procs::spawn_gateway_via(&launcher, &config, dir.path(), "fds").await;
    let pid = child.id().expect("the gateway runs");
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/fd/5")).ok(),
        Some(marker.clone()),
        "the launcher did not hand the gateway an open fd 5"
    );

    let ex = call_tool(&ModernClient::new(&url), "open_files").await;
    let listing: std::collections::BTreeMap<String, String> = serde_json::from_str(&text(
        ex.result()
            .unwrap_or_else(|| panic!("open_files failed: {:?}", ex.message)),
    ))
    .unwrap();
    eprintln!("the stdio child's descriptors: {listing:?}");
    assert!(
        listing.contains_key("0") && listing.contains_key("1") && listing.contains_key("2"),
        "{listing:?}"
    );
    let leaked: Vec<_> = listing
        .iter()
        .filter(|(_, target)| Path::new(target.as_str()) == marker)
        .collect();
    assert!(
        leaked.is_empty(),
        "the child inherited the gateway's descriptor: {leaked:?}"
    );
    // More generally, beyond its three pipes the child shares nothing the gateway holds
    // (nextest's jobserver pipe, for one, is inherited by the gateway too). Anonymous inodes
    // (epoll, eventfd) read the same in every process and say nothing about sharing.
    let gateway_holds: std::collections::BTreeSet<String> =
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|t| t.to_string_lossy().into_owned())
            .collect();
    let shared: Vec<_> = listing
        .iter()
        .filter(|(fd, target)| {
            !["0", "1", "2"].contains(&fd.as_str())
                && !target.starts_with("anon_inode:")
                && gateway_holds.contains(*target)
        })
        .collect();
    assert!(
        shared.is_empty(),
        "the child shares the gateway's descriptors: {shared:?}"
    );
    // The gateway itself still holds fd 5: it was marked close-on-exec, not closed.
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/fd/5")).ok(),
        Some(marker)
    );
    drop(child);
}

// ------------------------------------------------------- Streamable HTTP details

#[tokio::test]
async fn a_polled_call_stream_is_resumed_with_last_event_id() {
    // Replay (no parking), so both rounds open a call stream of their own.
    let env = env_with(
        Default::default(),
        greet_handlers(),
        "",
        "[parking]\ndefault_policy = \"replay\"\n",
    )
    .await;
    // Both rounds' call streams are cut right after their priming event.
    for _ in 0..2 {
        env.legacy
            .faults()
            .next_call_stream(CallStreamFault::Poll { retry_ms: 20 });
    }
    let (rounds, last) = greet_flow(&env.client(), 4).await;
    assert_eq!(
        rounds.len(),
        1,
        "the question arrived on the resumed stream"
    );
    assert_eq!(text(last.result().unwrap()), "Hello, name-answer!");
    assert!(env.legacy.stats().resumptions() >= 2);
    env.stop().await;
}

#[tokio::test]
async fn a_broken_get_stream_is_reopened_and_its_requests_still_arrive() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let (g, n) = (gate.clone(), runs.clone());
    let handlers = Handlers::new().tool(
        "roots",
        "lists roots after a signal",
        json!({"type": "object"}),
        move |ctx, _| {
            let (gate, runs) = (g.clone(), n.clone());
            async move {
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    gate.notified().await;
                }
                let roots = ctx.list_roots().await?;
                Ok(tool_text(roots["roots"][0]["uri"].as_str().unwrap_or("?")))
            }
        },
    );
    let legacy = LegacyServer::start(LegacyServerConfig::default(), handlers)
        .await
        .unwrap();
    let cfg = config(&legacy.url(), "resume_max_delay = \"50ms\"", "", "");
    let (_gw, running, url) = start_gateway(cfg).await;
    let client_url = url.clone();
    let call = tokio::spawn(async move {
        ModernClient::new(&client_url)
            .call_with_input(
                "tools/call",
                json!({"name": "roots", "arguments": {}}),
                &mut answer,
                4,
            )
            .await
            .unwrap()
    });
    assert!(
        legacy
            .stats()
            .wait_until(
                |s| s.tool_starts("roots") == 1 && s.get_streams_open() == 1,
                Duration::from_secs(5)
            )
            .await
    );
    // Mid-call, the server drops the GET stream; the gateway must reopen it.
    assert_eq!(legacy.faults().close_all_get_streams(), 1);
    assert!(
        legacy
            .stats()
            .wait_until(|s| s.get_streams_opened() >= 2, Duration::from_secs(5))
            .await,
        "the GET stream was reopened"
    );
    gate.notify_one();
    let (rounds, last) = call.await.unwrap();
    assert_eq!(rounds.len(), 1);
    assert_eq!(
        rounds[0].input_requests.values().next().unwrap()["method"],
        "roots/list"
    );
    assert_eq!(text(last.result().unwrap()), "file:///work/project");
    running.stop().await;
    legacy.shutdown().await;
}

/// Whether some session of `legacy` has a client on its GET stream.
fn get_stream_attached(legacy: &LegacyServer) -> bool {
    legacy
        .session_ids()
        .iter()
        .any(|id| legacy.session(id).is_some_and(|s| s.get_stream_open))
}

#[tokio::test]
async fn a_get_stream_that_keeps_breaking_is_given_up_after_resume_attempts() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let handlers = Handlers::new().tool(
        "wait",
        "returns once signalled",
        json!({"type": "object"}),
        move |_, _| {
            let gate = g.clone();
            async move {
                gate.notified().await;
                Ok(tool_text("done"))
            }
        },
    );
    let legacy = LegacyServer::start(LegacyServerConfig::default(), handlers)
        .await
        .unwrap();
    let cfg = config(
        &legacy.url(),
        "resume_attempts = 2\nresume_max_delay = \"20ms\"",
        "",
        "",
    );
    let (gw, running, url) = start_gateway(cfg).await;
    let call = tokio::spawn(async move { call_tool(&ModernClient::new(&url), "wait").await });
    let stats = legacy.stats();
    assert!(
        stats
            .wait_until(
                |s| s.tool_starts("wait") == 1 && s.get_streams_open() == 1,
                Duration::from_secs(5)
            )
            .await
    );
    let hits = || {
        metric(
            &gw,
            "mrtr_gateway_limit_hits_total",
            &[("limit", "upstream_resume_attempts")],
        )
    };
    let base = stats.get_streams_opened();
    // Two silent breaks are reopened; the third in a row is one too many.
    for reopened in 1..=2 {
        assert_eq!(legacy.faults().close_all_get_streams(), 1);
        assert!(
            eventually(Duration::from_secs(5), || stats.get_streams_opened()
                == base + reopened
                && get_stream_attached(&legacy))
            .await
        );
        assert_eq!(hits(), 0.0);
    }
    assert_eq!(legacy.faults().close_all_get_streams(), 1);
    let gw2 = gw.clone();
    assert!(eventually(Duration::from_secs(5), move || hits() == 1.0).await);
    assert_eq!(stats.get_streams_opened(), base + 2);
    // The call itself is unaffected.
    gate.notify_one();
    assert_eq!(text(call.await.unwrap().result().unwrap()), "done");
    drop(gw2);
    running.stop().await;
    legacy.shutdown().await;
}

#[tokio::test]
async fn a_stateless_server_that_asks_for_input_fails_fast_with_a_clear_error() {
    let legacy = PyLegacyServer::start(&["--stateless"]).await;
    let cfg = config(&legacy.url(), "", "", "");
    let (_gw, running, url) = start_gateway(cfg).await;
    let client = ModernClient::new(&url);
    // A call that asks nothing completes.
    let add = client
        .request(
            "tools/call",
            json!({"name": "add", "arguments": {"a": 2, "b": 3}}),
        )
        .await
        .unwrap();
    assert_eq!(text(add.result().expect("add completes")), "5");
    // One that asks for input ends at once instead of waiting for a timeout.
    let started = Instant::now();
    let greet = call_tool(&client, "greet").await;
    assert_eq!(greet.status.as_u16(), 502);
    // The client hears that the stream ended; why (the server has no sessions) is for the
    // operator, in the WARN line with the client's request id.
    assert!(
        error_message(&greet).contains("without a response"),
        "{:?}",
        greet.message
    );
    let warned = crate::support::logs::assert_detail_logged_not_told(
        greet.error().unwrap(),
        "runs without sessions",
    );
    assert!(
        warned.iter().any(|l| l.contains("elicitation/create")),
        "{warned:#?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    running.stop().await;
    legacy.kill().await;
}
