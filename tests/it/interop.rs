//! Interop with the official SDKs as they ship: Python `mcp==1.30.0` FastMCP as the legacy
//! server behind the gateway, Python `mcp==2.3.0` `Client` as the 2026-07-28 client.
//! Each flow runs with the SDK's automatic input loop, and again in "raw" mode where the
//! client drives the rounds itself and checks every round's shape.

use crate::support::peers::{
    PyLegacyServer, assert_ok, input_rounds, modern_scenario, progress_values, result_text,
};
use crate::support::*;
use serde_json::Value;

struct Interop {
    legacy: PyLegacyServer,
    running: mrtr_gateway::front::listener::Running,
    url: String,
}

/// A FastMCP server and a gateway in front of it. The gather window is generous: FastMCP
/// sends GET-stream requests tens of milliseconds after call-stream ones, and this 2-core
/// machine may be busy; the window is what keeps a parallel burst in one round.
async fn interop() -> Interop {
    let legacy = PyLegacyServer::start(&[]).await;
    let cfg = config(
        &legacy.url(),
        "",
        "",
        "[mrtr]\ngather_window = \"400ms\"\ngather_quiet = \"100ms\"\n",
    );
    let (_gw, running, url) = start_gateway(cfg).await;
    Interop {
        legacy,
        running,
        url,
    }
}

impl Interop {
    async fn run(&self, scenario: &str, extra: &[&str]) -> Value {
        let report = modern_scenario(&self.url, scenario, extra).await;
        let largest = report["rounds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["requestStateLength"].as_u64())
            .max()
            .unwrap_or(0);
        eprintln!(
            "interop {scenario} {extra:?}: ok={} largest requestState={largest} bytes",
            report["ok"]
        );
        report
    }

    async fn stop(self) {
        self.running.stop().await;
        self.legacy.kill().await;
    }
}

#[tokio::test]
async fn form_elicitation() {
    let it = interop().await;
    for mode in [&[][..], &["--raw"][..]] {
        let r = it.run("greet", mode).await;
        assert_ok(&r);
        assert_eq!(result_text(&r), "Hello, Ada!");
        assert_eq!(r["callbacks"]["elicitation"], 1);
    }
    let raw = it.run("greet", &["--raw"]).await;
    assert_eq!(input_rounds(&raw), vec![vec!["elicitation/create"]]);
    it.stop().await;
}

#[tokio::test]
async fn two_dependent_elicitations() {
    let it = interop().await;
    let r = it.run("two_step", &["--raw"]).await;
    assert_ok(&r);
    assert_eq!(result_text(&r), "Ada likes blue");
    let rounds = input_rounds(&r);
    assert_eq!(
        rounds,
        vec![vec!["elicitation/create"], vec!["elicitation/create"]]
    );
    // The second question depends on the first answer, which the gateway replayed.
    let second = r["rounds"][1]["inputRequests"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap();
    assert_eq!(second["params"]["message"], "Favourite colour, Ada?");
    assert_ok(&it.run("two_step", &[]).await);
    it.stop().await;
}

#[tokio::test]
async fn elicitation_then_sampling() {
    let it = interop().await;
    let r = it.run("elicit_then_sample", &["--raw"]).await;
    assert_ok(&r);
    assert_eq!(result_text(&r), "rust: sampled: Write a haiku about ");
    assert_eq!(
        input_rounds(&r),
        vec![vec!["elicitation/create"], vec!["sampling/createMessage"]]
    );
    assert_ok(&it.run("elicit_then_sample", &[]).await);
    it.stop().await;
}

#[tokio::test]
async fn sampling() {
    let it = interop().await;
    let r = it.run("sample_only", &[]).await;
    assert_ok(&r);
    assert_eq!(result_text(&r), "Paris");
    assert_eq!(r["callbacks"]["sampling"], 1);
    assert_ok(&it.run("sample_only", &["--raw"]).await);
    it.stop().await;
}

#[tokio::test]
async fn roots_requested_on_the_get_stream() {
    let it = interop().await;
    let r = it.run("list_my_roots", &["--raw"]).await;
    assert_ok(&r);
    assert_eq!(
        result_text(&r),
        "file:///tmp/project-a,file:///tmp/project-b"
    );
    assert_eq!(input_rounds(&r), vec![vec!["roots/list"]]);
    it.stop().await;
}

#[tokio::test]
async fn three_parallel_requests_answered_in_one_round() {
    let it = interop().await;
    let r = it.run("parallel_three", &["--raw"]).await;
    assert_ok(&r);
    assert_eq!(
        result_text(&r),
        "Ada|7|file:///tmp/project-a,file:///tmp/project-b"
    );
    assert_eq!(
        input_rounds(&r),
        vec![vec![
            "elicitation/create",
            "roots/list",
            "sampling/createMessage"
        ]]
    );
    assert_ok(&it.run("parallel_three", &[]).await);
    it.stop().await;
}

#[tokio::test]
async fn elicitation_inside_prompts_get_and_templated_resources_read() {
    let it = interop().await;
    let p = it.run("prompt", &["--raw"]).await;
    assert_ok(&p);
    assert_eq!(result_text(&p), "Review this code in a terse style:\nx=1");
    assert_eq!(input_rounds(&p), vec![vec!["elicitation/create"]]);
    let res = it.run("resource", &["--raw"]).await;
    assert_ok(&res);
    assert_eq!(result_text(&res), "Hi, ada");
    // A resources/read reached through a retry is never cacheable.
    assert_eq!(res["result"]["ttlMs"], 0);
    assert_eq!(res["result"]["cacheScope"], "private");
    assert_ok(&it.run("resource", &[]).await);
    it.stop().await;
}

#[tokio::test]
async fn progress_notifications_reach_the_client() {
    let it = interop().await;
    let r = it.run("progress_task", &[]).await;
    assert_ok(&r);
    assert_eq!(result_text(&r), "done 3");
    assert_eq!(progress_values(&r), vec![1.0, 2.0, 3.0]);
    it.stop().await;
}

#[tokio::test]
async fn a_declined_elicitation_reaches_the_tool() {
    let it = interop().await;
    let r = it.run("declined", &["--raw"]).await;
    assert_ok(&r);
    assert_eq!(result_text(&r), "greet: decline");
    it.stop().await;
}

#[tokio::test]
async fn a_client_without_elicitation_gets_missing_capability() {
    let it = interop().await;
    let r = it.run("no_elicitation", &[]).await;
    assert_eq!(r["error"]["code"], -32021, "{r:#}");
    assert_eq!(
        r["error"]["data"]["requiredCapabilities"]["elicitation"],
        serde_json::json!({"form": {}})
    );
    assert_eq!(r["callbacks"]["elicitation"], 0);
    it.stop().await;
}

#[tokio::test]
async fn a_closed_sessions_get_stream_connection_is_reused_by_fastmcp() {
    // FastMCP ends a session's GET stream when the DELETE ends the session (tens of
    // milliseconds after answering it); read to that end, the stream's connection serves the
    // next session instead of being closed mid-response.
    let legacy = PyLegacyServer::start(&[]).await;
    let cfg = config(&legacy.url(), "", "", "[pool]\nmode = \"per-call\"\n");
    let (gw, running, url) = start_gateway(cfg).await;
    let client = mrtr_testkit::client::ModernClient::new(&url);
    const CALLS: usize = 6;
    for _ in 0..CALLS {
        let r = client
            .request(
                "tools/call",
                serde_json::json!({"name": "add", "arguments": {"a": 2, "b": 3}}),
            )
            .await
            .expect("an answer");
        assert!(r.result().is_some(), "{:?}", r.message);
        // Each session's close ends before the next call, as between a person's calls.
        let closing = |gw: &mrtr_gateway::gateway::Gateway| {
            metric(gw, "mrtr_gateway_legacy_sessions_active", &[]) == 0.0
        };
        assert!(eventually(std::time::Duration::from_secs(5), || closing(&gw)).await);
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let (opened, unfinished) = upstream_connections(&gw);
    // Two connections serve every session (the GET stream's and the call's); a close that
    // lost its GET stream's connection costs one more each time (seven in all).
    assert!(
        opened <= 3.0 && unfinished <= 1.0,
        "{opened} connections opened, {unfinished} closed mid-response, for {CALLS} sessions"
    );
    running.stop().await;
    legacy.kill().await;
}

#[tokio::test]
async fn discover_lists_and_plain_calls() {
    let it = interop().await;
    let d = it.run("discover", &[]).await;
    assert_ok(&d);
    let disc = &d["result"]["discover"];
    assert_eq!(disc["supportedVersions"], serde_json::json!(["2026-07-28"]));
    assert_eq!(
        disc["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "legacy-peer"
    );
    let t = it.run("list_tools", &[]).await;
    assert_ok(&t);
    assert!(
        t["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "parallel_three")
    );
    let a = it.run("add", &[]).await;
    assert_ok(&a);
    assert_eq!(result_text(&a), "5");
    assert_eq!(it.legacy.starts("add"), 1);
    it.stop().await;
}

#[tokio::test]
async fn a_rested_connection_carries_the_python_clients_next_call() {
    // The 2.x `Client` keeps its connection in httpx's pool between calls. Quiet for longer
    // than idle_release_after, the connection rests in the gateway, and the next call comes
    // on that same connection (same local port).
    let legacy = PyLegacyServer::start(&[]).await;
    let text = format!(
        "[listen]\naddr = \"127.0.0.1:0\"\nidle_release_after = \"200ms\"\n\
         [upstream]\nurl = \"{}\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n",
        legacy.url()
    );
    let cfg = mrtr_gateway::config::Config::from_toml_str(&text, &[], None).unwrap();
    let (gw, running, url) = start_gateway(cfg).await;
    let watch = gw.clone();
    let seen_at_rest = tokio::spawn(async move {
        eventually(std::time::Duration::from_secs(60), || {
            metric(&watch, "mrtr_gateway_connections_at_rest", &[]) >= 1.0
        })
        .await
    });
    let r = modern_scenario(&url, "add", &["--repeat-after", "2", "--wire"]).await;
    assert_ok(&r);
    assert_eq!(result_text(&r), "5");
    assert_eq!(
        r["firstResult"]["content"][0]["text"], "5",
        "{:?}",
        r["firstResult"]
    );
    assert!(
        seen_at_rest.await.unwrap(),
        "the connection rested between the calls"
    );
    let ports: Vec<&Value> = r["http"]
        .as_array()
        .expect("--wire lists the exchanges")
        .iter()
        .map(|e| &e["clientPort"])
        .collect();
    assert!(ports.len() >= 2, "{ports:?}");
    assert!(
        ports[0].is_u64() && ports.iter().all(|p| *p == ports[0]),
        "every exchange on one connection: {ports:?}"
    );
    running.stop().await;
    legacy.kill().await;
}
