//! Calls that outlive a front timeout (`[long_calls]`, `mrtr::long_call`): a call still running
//! after `round_after` ends its request with a state-only `input_required` round; retries
//! with that state collect the outcome, on any replica sharing the store, and the tool body
//! runs once.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::peers::{PyLegacyServer, modern_scenario, result_text};
use crate::support::procs::start_redis;
use crate::support::*;
use mrtr_gateway::front::listener;
use mrtr_gateway::gateway::Gateway;
use mrtr_testkit::client::ModernClient;
use mrtr_testkit::legacy_server::{Handlers, LegacyServerConfig};
use mrtr_testkit::nginx::ProxyConf;

const ROUND_AFTER: &str = "[long_calls]\nround_after = \"300ms\"\n";

/// `slow`: sleeps `ms` (an argument), then answers "slept"; `slow_ask`: sleeps, then asks a
/// name and greets it.
fn slow_handlers() -> Handlers {
    Handlers::new()
        .tool(
            "slow",
            "sleeps, then answers",
            json!({"type": "object"}),
            |_ctx, args| async move {
                let ms = args["ms"].as_u64().unwrap_or(1000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(tool_text(format!("slept {ms}")))
            },
        )
        .tool(
            "slow_ask",
            "sleeps, then asks a name",
            json!({"type": "object"}),
            |ctx, args| async move {
                let ms = args["ms"].as_u64().unwrap_or(1000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let a = ctx.elicit_form("What is your name?", form("name")).await?;
                Ok(tool_text(format!(
                    "Hello, {}!",
                    a["content"]["name"].as_str().unwrap_or("?")
                )))
            },
        )
}

/// The in-repo legacy server with [`slow_handlers`] behind a gateway with [`ROUND_AFTER`].
async fn slow_env() -> Env {
    env_with(
        LegacyServerConfig::default(),
        slow_handlers(),
        "",
        ROUND_AFTER,
    )
    .await
}

/// Calls `slow` for `ms` through `client`; its first answer, which must be a state-only round.
async fn slow_first_round(client: &ModernClient, args: &Value) -> Value {
    let first = client
        .request("tools/call", json!({"name": "slow", "arguments": args}))
        .await
        .unwrap();
    let first = first.result().unwrap().clone();
    assert!(is_state_only(&first), "{first}");
    first
}

fn is_state_only(result: &Value) -> bool {
    result["resultType"] == "input_required"
        && result.get("inputRequests").is_none()
        && result["requestState"].is_string()
}

fn state_only_step(gw: &Gateway, step: &str) -> f64 {
    metric(
        gw,
        "mrtr_gateway_state_only_rounds_total",
        &[("step", step)],
    )
}

/// Presents `state` for `tool` until the result is not a state-only round; how many
/// state-only rounds came back meanwhile, and the last result.
async fn collect(client: &ModernClient, tool: &str, args: &Value, first: &Value) -> (u32, Value) {
    let mut rounds = 0;
    let mut result = first.clone();
    while is_state_only(&result) {
        rounds += 1;
        assert!(rounds < 100, "no outcome after {rounds} rounds");
        let ex = client
            .request(
                "tools/call",
                json!({"name": tool, "arguments": args, "requestState": result["requestState"]}),
            )
            .await
            .unwrap();
        result = ex
            .result()
            .cloned()
            .unwrap_or_else(|| ex.message.clone().unwrap_or_default());
    }
    (rounds, result)
}

#[tokio::test]
async fn a_call_past_round_after_ends_its_request_and_completes_through_retries_once() {
    let env = slow_env().await;
    let client = env.client();
    let args = json!({"ms": 1500});

    let started = Instant::now();
    let first = client
        .request("tools/call", json!({"name": "slow", "arguments": args}))
        .await
        .unwrap();
    let waited = started.elapsed();
    let first = first.result().unwrap().clone();
    assert!(is_state_only(&first), "{first}");
    assert!(
        waited < Duration::from_millis(1200),
        "the request ended at round_after, not with the call: {waited:?}"
    );
    assert_eq!(state_only_step(&env.gw, "detached"), 1.0);

    let (rounds, last) = collect(&client, "slow", &args, &first).await;
    assert_eq!(text(&last), "slept 1500");
    assert!(rounds >= 2, "the retries waited round_after each: {rounds}");
    assert_eq!(state_only_step(&env.gw, "collected"), 1.0);
    assert!(state_only_step(&env.gw, "still_running") >= 1.0);
    assert_eq!(env.legacy.stats().tool_starts("slow"), 1);

    // The state is a handle on the call's kept outcome: presented again, the same result, and
    // the tool does not run again.
    let again = client
        .request(
            "tools/call",
            json!({"name": "slow", "arguments": args, "requestState": first["requestState"]}),
        )
        .await
        .unwrap();
    assert_eq!(again.result().unwrap(), &last);
    assert_eq!(env.legacy.stats().tool_starts("slow"), 1);
    env.stop().await;
}

#[tokio::test]
async fn a_call_that_ends_before_round_after_is_answered_in_its_request() {
    let env = slow_env().await;
    let ex = env
        .client()
        .request(
            "tools/call",
            json!({"name": "slow", "arguments": {"ms": 10}}),
        )
        .await
        .unwrap();
    assert_eq!(text(ex.result().unwrap()), "slept 10");
    assert_eq!(state_only_step(&env.gw, "detached"), 0.0);
    env.stop().await;
}

#[tokio::test]
async fn a_question_after_a_state_only_round_is_a_normal_round_and_the_body_runs_once() {
    let env = slow_env().await;
    let client = env.client();
    let (rounds, ex) = client
        .call_with_input(
            "tools/call",
            json!({"name": "slow_ask", "arguments": {"ms": 800}}),
            &mut answer,
            20,
        )
        .await
        .unwrap();
    assert_eq!(text(ex.result().unwrap()), "Hello, name-answer!");
    let asked: Vec<usize> = rounds.iter().map(|r| r.input_requests.len()).collect();
    assert_eq!(
        asked.first(),
        Some(&0),
        "a state-only round first: {asked:?}"
    );
    assert_eq!(asked.last(), Some(&1), "then the question: {asked:?}");
    assert_eq!(env.legacy.stats().tool_starts("slow_ask"), 1);
    env.stop().await;
}

#[tokio::test]
async fn a_client_that_comes_back_late_finds_the_outcome_kept() {
    let env = slow_env().await;
    let client = env.client();
    let args = json!({"ms": 600});
    let first = slow_first_round(&client, &args).await;
    // Gone for longer than the call runs.
    assert!(
        eventually(Duration::from_secs(5), || env
            .legacy
            .stats()
            .tool_finishes("slow")
            == 1)
        .await
    );
    let started = Instant::now();
    let (rounds, last) = collect(&client, "slow", &args, &first).await;
    assert_eq!(rounds, 1, "one presentation collects it");
    assert!(started.elapsed() < Duration::from_millis(300));
    assert_eq!(text(&last), "slept 600");
    assert_eq!(env.legacy.stats().tool_starts("slow"), 1);
    env.stop().await;
}

/// Detached calls hold no request slot, so they are bounded: past a caller's share, its next
/// long call is not detached and its request waits for the outcome, as without state-only
/// rounds.
#[tokio::test]
async fn a_caller_past_its_share_of_detached_calls_keeps_its_request() {
    let limits = format!("{ROUND_AFTER}max_running = 4\nmax_running_per_principal = 1\n");
    let env = env_with(LegacyServerConfig::default(), slow_handlers(), "", &limits).await;
    let client = env.client();
    let call = json!({"name": "slow", "arguments": {"ms": 1200}});
    let first = client.request("tools/call", call.clone()).await.unwrap();
    assert!(is_state_only(first.result().unwrap()));
    let second = client.request("tools/call", call).await.unwrap();
    assert_eq!(
        text(second.result().unwrap()),
        "slept 1200",
        "held, not detached"
    );
    assert_eq!(state_only_step(&env.gw, "not_detached"), 1.0);
    assert_eq!(
        metric(
            &env.gw,
            "mrtr_gateway_limit_hits_total",
            &[("limit", "long_calls_max_running_per_principal")]
        ),
        1.0
    );
    assert_eq!(env.legacy.stats().tool_starts("slow"), 2);
    env.stop().await;
}

#[tokio::test]
async fn a_state_only_state_is_bound_to_its_call() {
    let env = slow_env().await;
    let client = env.client();
    let first = slow_first_round(&client, &json!({"ms": 600})).await;
    let state = first["requestState"].clone();
    // Other arguments: another origin, refused before anything runs.
    let other = client
        .request(
            "tools/call",
            json!({"name": "slow", "arguments": {"ms": 1}, "requestState": state}),
        )
        .await
        .unwrap();
    assert_eq!(other.status, http::StatusCode::BAD_REQUEST);
    assert_eq!(other.message.unwrap()["error"]["code"], -32602);
    assert_eq!(env.legacy.stats().tool_starts("slow"), 1);
    env.stop().await;
}

/// The Python SDK's client against a tool that reports progress once a second: progress goes
/// on reaching it while it retries state-only rounds (each retry under a progress token of its
/// own, which the relayed notifications carry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_reaches_the_client_through_its_state_only_retries() {
    let legacy = PyLegacyServer::start(&[]).await;
    let extra = "[long_calls]\nround_after = \"1500ms\"\n";
    let (gw, running, url) = start_gateway(config(&legacy.url(), "", "", extra)).await;
    let report = modern_scenario(
        &url,
        "call",
        &["--tool", "slow_task", "--args", r#"{"seconds": 6}"#],
    )
    .await;
    assert_eq!(result_text(&report), "slow done after 6.0s", "{report}");
    assert!(report["rounds"].as_array().unwrap().len() >= 3, "{report}");
    let progress = crate::support::peers::progress_values(&report);
    assert!(
        progress.iter().any(|p| *p >= 4.0),
        "progress after the first request reached the client: {progress:?}"
    );
    assert_eq!(legacy.starts("slow_task"), 1);
    assert!(state_only_step(&gw, "still_running") >= 1.0);
    running.stop().await;
    legacy.kill().await;
}

/// Two gateways sharing a real Redis: the call runs on the first, every retry goes to the
/// second, which collects the outcome through the store and never runs the tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_another_replica_collects_the_outcome_through_redis() {
    let redis = start_redis().await;
    let legacy = mrtr_testkit::legacy_server::LegacyServer::start(
        LegacyServerConfig::default(),
        slow_handlers(),
    )
    .await
    .unwrap();
    let extra = format!(
        "{ROUND_AFTER}[single_use]\nstore = \"redis\"\n[single_use.redis]\nurls = [\"redis://127.0.0.1:{}\"]\n",
        redis.port
    );
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let gw = Gateway::new(config(&legacy.url(), "", "", &extra));
        let running = listener::start(gw.front.clone(), gw.config().listen.addr)
            .await
            .unwrap();
        let url = format!("http://{}{}", running.addr, gw.config().listen.path);
        replicas.push((gw, running, url));
    }
    let args = json!({"ms": 1200});
    let first = slow_first_round(&ModernClient::new(&replicas[0].2), &args).await;

    let (rounds, last) = collect(&ModernClient::new(&replicas[1].2), "slow", &args, &first).await;
    assert_eq!(text(&last), "slept 1200");
    assert!(rounds >= 1);
    assert_eq!(state_only_step(&replicas[1].0, "collected"), 1.0);
    assert_eq!(state_only_step(&replicas[1].0, "detached"), 0.0);
    assert_eq!(legacy.stats().tool_starts("slow"), 1);
    for (_, running, _) in replicas {
        running.stop().await;
    }
    legacy.shutdown().await;
}

/// The case the feature exists for: nginx with a 5 s `proxy_read_timeout` in front of the
/// gateway, a silent 12 s tool on the Python SDK's FastMCP server, and the Python SDK's
/// 2026-07-28 client, which retries state-only rounds by itself. Without state-only rounds
/// nginx cuts the call (504); with them it completes, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_longer_than_the_proxy_timeout_completes_through_state_only_rounds_once() {
    let legacy = PyLegacyServer::start(&[]).await;
    let call = [
        "--tool",
        "slow_task",
        "--args",
        r#"{"seconds": 12, "progress": false}"#,
        "--timeout",
        "60",
    ];
    for (round_after, completes) in [("0s", false), ("2s", true)] {
        let extra = format!("[long_calls]\nround_after = \"{round_after}\"\n");
        let (gw, running, _url) = start_gateway(config(&legacy.url(), "", "", &extra)).await;
        let dir = crate::support::peers::tempdir::TempDir::new("mrtr-long-nginx");
        let port = free_port();
        let backend = running.addr.to_string();
        let conf = ProxyConf {
            dir: dir.path(),
            listen: format!("127.0.0.1:{port}"),
            backend: &backend,
            keepalive: 0,
            server_extra: "",
            location_extra: "",
            log_level: "warn",
            read_timeout: "5s",
        };
        let mut nginx = conf.start(port).await.expect("nginx starts");
        let url = format!("http://127.0.0.1:{port}/mcp");
        let before = legacy.starts("slow_task");
        let report = modern_scenario(&url, "call", &call).await;
        let _ = nginx.kill().await;
        assert_eq!(legacy.starts("slow_task"), before + 1, "{report}");
        if completes {
            assert_eq!(result_text(&report), "slow done after 12.0s", "{report}");
            let rounds = report["rounds"].as_array().unwrap();
            assert!(rounds.len() >= 4, "state-only rounds: {report}");
            assert!(rounds.iter().all(|r| r["status"] == 200), "{report}");
            assert!(state_only_step(&gw, "still_running") >= 2.0);
        } else {
            assert!(report["result"].is_null(), "nginx cut the call: {report}");
        }
        running.stop().await;
    }
    legacy.kill().await;
}

/// A drain waits for a detached call (it holds no connection) and keeps its outcome; one still
/// running at the drain's deadline is cancelled and recorded as lost at once, so its retries are
/// not told "still running" until the run lease ends.
#[tokio::test]
async fn a_drain_keeps_a_detached_calls_outcome_or_records_it_lost_at_its_deadline() {
    let env = slow_env().await;
    let client = env.client();
    let start = |ms: u64| {
        let client = ModernClient::new(&env.url);
        async move {
            let args = json!({"ms": ms});
            let first = slow_first_round(&client, &args).await;
            (args, first)
        }
    };
    let (short_args, short) = start(900).await;
    let (long_args, long) = start(30_000).await;

    let finished = env
        .gw
        .finish_claimed_runs(tokio::time::Instant::now() + Duration::from_secs(3))
        .await;
    assert_eq!((finished.settled, finished.given_up), (1, 1));

    let (_, done) = collect(&client, "slow", &short_args, &short).await;
    assert_eq!(text(&done), "slept 900");
    let started = Instant::now();
    let lost = client
        .request(
            "tools/call",
            json!({"name": "slow", "arguments": long_args, "requestState": long["requestState"]}),
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "told at once"
    );
    assert_eq!(
        lost.status,
        http::StatusCode::CONFLICT,
        "{:?}",
        lost.message
    );
    // The given-up call was cancelled upstream.
    assert!(
        env.legacy
            .stats()
            .wait_until(|s| s.cancellations().len() == 1, Duration::from_secs(5))
            .await,
        "{:?}",
        env.legacy.stats().cancellations()
    );
    assert_eq!(env.legacy.stats().tool_starts("slow"), 2);
    env.stop().await;
}

/// The access line says which round a request served and how: fresh, following a running
/// call (state-only rounds), resumed from the parking lot (or replayed).
/// Runs on the test's single thread, so the thread-local subscriber sees every task.
#[tokio::test(flavor = "current_thread")]
async fn the_access_line_names_the_round_and_the_path() {
    let (logs, _guard) = crate::support::logs::on_this_thread();

    let env = slow_env().await;
    let (_, ex) = env
        .client()
        .call_with_input(
            "tools/call",
            json!({"name": "slow_ask", "arguments": {"ms": 700}}),
            &mut answer,
            20,
        )
        .await
        .unwrap();
    assert_eq!(text(ex.result().unwrap()), "Hello, name-answer!");
    env.stop().await;

    let access = logs.access_lines("call_target=\"slow_ask\"");
    let has = |part: &str| access.iter().any(|l| l.contains(part));
    assert!(has("round=1") && has("path=\"fresh\""), "{access:#?}");
    assert!(has("path=\"following\""), "{access:#?}");
    assert!(has("round=2") && has("path=\"resumed\""), "{access:#?}");
}
