//! Stateless in fact: retries on any replica, replicas that die, backends that restart,
//! parking that saves re-execution, no cross-talk under load, and parked calls that expire.
//! Replicas are separate gateway processes sharing state keys.

use std::time::Duration;

use crate::support::peers::PyLegacyServer;
use crate::support::procs::{remote_metric, spawn_gateway};
use crate::support::*;
use mrtr_testkit::client::ModernClient;
use mrtr_testkit::legacy_server::{Handlers, LegacyServer, LegacyServerConfig};
use serde_json::{Value, json};

fn shared(upstream: &str, extra: &str) -> String {
    format!(
        "[upstream]\nurl = \"{upstream}\"\n{extra}[log]\nformat = \"text\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n"
    )
}

const COUNTER: &str = "counter_flow";

async fn first_round(url: &str) -> Value {
    let r = ModernClient::new(url)
        .request("tools/call", json!({"name": COUNTER, "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(r.result_type(), Some("input_required"), "{:?}", r.message);
    r.result().unwrap().clone()
}

/// Retries `first` at `url` and asserts the counter flow completed with its answer, 42.
async fn retry_answers_42(url: &str, first: &Value) {
    let done = retry(url, first).await;
    assert_eq!(text(done.result().unwrap()), "42", "{:?}", done.message);
}

async fn retry(url: &str, first: &Value) -> mrtr_testkit::client::Exchange {
    let key = input_key(first);
    ModernClient::new(url)
        .request(
            "tools/call",
            json!({"name": COUNTER, "arguments": {}, "requestState": first["requestState"],
                   "inputResponses": {key: {"action": "accept", "content": {"answer": "42"}}}}),
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn any_replica_completes_and_parking_saves_re_execution() {
    let legacy = PyLegacyServer::start(&[]).await;
    let dir = TempDir::new("mrtr-replicas");
    let cfg = shared(&legacy.url(), "");
    let (_a, url_a, admin_a) = spawn_gateway(&cfg, dir.path(), "rep-a").await;
    let (_b, url_b, admin_b) = spawn_gateway(&cfg, dir.path(), "rep-b").await;

    // Retried on the replica that parked it: the tool body ran once.
    let first = first_round(&url_a).await;
    retry_answers_42(&url_a, &first).await;
    assert_eq!(legacy.starts(COUNTER), 1, "resumed, not re-executed");
    assert_eq!(
        remote_metric(admin_a, "mrtr_gateway_retries_total", &[("path", "parked")]).await,
        1.0
    );

    // Retried on the other replica: B never saw round 1, and completes by replay (twice in all).
    let first = first_round(&url_a).await;
    retry_answers_42(&url_b, &first).await;
    assert_eq!(
        legacy.starts(COUNTER),
        3,
        "one more execution for round 1, one for the replay"
    );
    assert_eq!(
        remote_metric(
            admin_b,
            "mrtr_gateway_requests_total",
            &[("method", "tools/call"), ("outcome", "input_required")]
        )
        .await,
        0.0,
        "B served no first round"
    );
    assert_eq!(
        remote_metric(
            admin_b,
            "mrtr_gateway_retries_total",
            &[("path", "replayed")]
        )
        .await,
        1.0
    );
    eprintln!("executions: same replica 1, other replica 2");
    // Both replicas keep their single-use claims in memory, and say at start that those are
    // per replica.
    for name in ["rep-a", "rep-b"] {
        let log = std::fs::read_to_string(dir.path().join(format!("{name}.log"))).unwrap();
        assert!(
            log.contains("single-use claims are kept per replica"),
            "{name} did not warn about its per-replica store:\n{log}"
        );
    }
}

#[tokio::test]
async fn park_only_never_re_executes_on_another_replica() {
    let legacy = PyLegacyServer::start(&[]).await;
    let dir = TempDir::new("mrtr-park-only");
    let rule = format!(
        "[[parking.rules]]\nmethod = \"tools/call\"\nname = \"{COUNTER}\"\npolicy = \"park-only\"\n"
    );
    let cfg = shared(&legacy.url(), &rule);
    let (_c, url_c, _) = spawn_gateway(&cfg, dir.path(), "po-c").await;
    let (_d, url_d, _) = spawn_gateway(&cfg, dir.path(), "po-d").await;
    let first = first_round(&url_c).await;
    let refused = retry(&url_d, &first).await;
    assert_eq!(refused.status.as_u16(), 410, "{:?}", refused.message);
    let msg = refused.error().unwrap()["message"].as_str().unwrap();
    assert!(
        msg.contains("park-only") && msg.contains("Nothing was re-executed"),
        "{msg}"
    );
    assert_eq!(
        legacy.starts(COUNTER),
        1,
        "the tool body ran once, for round 1 only"
    );
    // On its own replica it still resumes.
    retry_answers_42(&url_c, &first).await;
    assert_eq!(legacy.starts(COUNTER), 1);
}

#[tokio::test]
async fn a_replica_killed_between_rounds_does_not_lose_the_call() {
    let legacy = PyLegacyServer::start(&[]).await;
    let dir = TempDir::new("mrtr-killed");
    let cfg = shared(&legacy.url(), "");
    let (mut a, url_a, _) = spawn_gateway(&cfg, dir.path(), "kill-a").await;
    let (_b, url_b, _) = spawn_gateway(&cfg, dir.path(), "kill-b").await;
    let first = first_round(&url_a).await;
    std::process::Command::new("kill")
        .args(["-KILL", &a.id().unwrap().to_string()])
        .status()
        .unwrap();
    let _ = a.wait().await;
    retry_answers_42(&url_b, &first).await;
}

#[tokio::test]
async fn a_legacy_backend_restarted_between_rounds_completes_by_replay() {
    let legacy = PyLegacyServer::start(&[]).await;
    let port = legacy.port;
    let (gw, running, url) = start_gateway(config(&legacy.url(), "", "", "")).await;
    let first = first_round(&url).await;
    legacy.kill().await;
    let legacy = PyLegacyServer::start_on(port, &[]).await;
    assert_eq!(legacy.port, port);
    retry_answers_42(&url, &first).await;
    assert_eq!(
        legacy.starts(COUNTER),
        1,
        "the restarted server ran the tool once, by replay"
    );
    assert_eq!(
        metric(&gw, "mrtr_gateway_retries_total", &[("path", "replayed")]),
        1.0
    );
    assert_eq!(metric(&gw, "mrtr_gateway_parked_calls", &[]), 0.0);
    running.stop().await;
}

fn unique_handlers() -> Handlers {
    Handlers::new().tool("unique", "three rounds", json!({"type": "object"}), |ctx, a| async move {
        let tag = a["tag"].as_str().unwrap_or("?").to_string();
        let first = ctx.elicit_form(&format!("First for {tag}?"), form("first")).await?;
        let first = first["content"]["first"].as_str().unwrap_or("?").to_string();
        let second = ctx.elicit_form(&format!("Second after {first}?"), form("second")).await?;
        let second = second["content"]["second"].as_str().unwrap_or("?").to_string();
        let sampled = ctx
            .create_message(json!({"messages": [{"role": "user", "content": {"type": "text", "text": format!("{first} {second} {tag}")}}], "maxTokens": 5}))
            .await?;
        let sampled = sampled["content"]["text"].as_str().unwrap_or("?").to_string();
        Ok(tool_text(format!("{tag}:{first}:{second}:{sampled}")))
    })
}

#[tokio::test]
async fn no_cross_talk_with_200_clients_retrying_on_random_replicas() {
    let legacy = LegacyServer::start(
        LegacyServerConfig {
            record_messages: false,
            ..Default::default()
        },
        unique_handlers(),
    )
    .await
    .unwrap();
    let dir = TempDir::new("mrtr-crosstalk");
    // A short parking TTL: calls parked on one replica whose retry went to the other are
    // released within it, so the lots drain by the end.
    let cfg = shared(&legacy.url(), "[parking]\nttl = \"3s\"\n");
    let (_a, url_a, admin_a) = spawn_gateway(&cfg, dir.path(), "ct-a").await;
    let (_b, url_b, admin_b) = spawn_gateway(&cfg, dir.path(), "ct-b").await;
    let urls = [url_a, url_b];
    let clients = 200;
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..clients {
        let urls = urls.clone();
        tasks.push(tokio::spawn(async move {
            let tag = format!("c{i}");
            let mut rng = i as u64 * 2654435761 + 1;
            let mut pick = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng % 2) as usize
            };
            let params = json!({"name": "unique", "arguments": {"tag": tag}});
            let mut ex = ModernClient::new(&urls[pick()]).request("tools/call", params.clone()).await.unwrap();
            let mut rounds = 0;
            while ex.result_type() == Some("input_required") {
                rounds += 1;
                let res = ex.result().unwrap().clone();
                let mut answers = serde_json::Map::new();
                for (key, req) in res["inputRequests"].as_object().unwrap() {
                    let a = match req["method"].as_str().unwrap() {
                        "elicitation/create" => {
                            let field = req["params"]["requestedSchema"]["properties"].as_object().unwrap().keys().next().unwrap().clone();
                            let n = if field == "first" { 1 } else { 2 };
                            json!({"action": "accept", "content": {field: format!("{tag}-{n}")}})
                        }
                        _ => json!({"role": "assistant", "content": {"type": "text", "text": format!("s-{tag}")}, "model": "m"}),
                    };
                    answers.insert(key.clone(), a);
                }
                let mut retry = params.as_object().unwrap().clone();
                retry.insert("inputResponses".into(), Value::Object(answers));
                retry.insert("requestState".into(), res["requestState"].clone());
                ex = ModernClient::new(&urls[pick()]).request("tools/call", Value::Object(retry)).await.unwrap();
            }
            let got = ex.result().map(text).unwrap_or_else(|| format!("error {:?}", ex.message));
            (tag, rounds, got)
        }));
    }
    let mut errors = 0;
    for t in tasks {
        let (tag, rounds, got) = tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("bounded")
            .unwrap();
        let want = format!("{tag}:{tag}-1:{tag}-2:s-{tag}");
        if got != want || rounds != 3 {
            errors += 1;
            eprintln!("{tag}: {rounds} rounds, got {got:?}");
        }
    }
    let elapsed = started.elapsed();
    let parked_a = remote_metric(admin_a, "mrtr_gateway_retries_total", &[("path", "parked")])
        .await
        + remote_metric(admin_b, "mrtr_gateway_retries_total", &[("path", "parked")]).await;
    let replayed = remote_metric(
        admin_a,
        "mrtr_gateway_retries_total",
        &[("path", "replayed")],
    )
    .await
        + remote_metric(
            admin_b,
            "mrtr_gateway_retries_total",
            &[("path", "replayed")],
        )
        .await;
    eprintln!(
        "cross-talk: {clients} clients x 3 rounds in {elapsed:?}, {errors} errors, retries resumed {parked_a}, replayed {replayed}"
    );
    assert_eq!(errors, 0);
    assert_eq!(parked_a + replayed, (clients * 3) as f64);
    // Every parked call is resumed or released within the parking TTL.
    let mut drained = false;
    for _ in 0..60 {
        let left = remote_metric(admin_a, "mrtr_gateway_parked_calls", &[]).await
            + remote_metric(admin_b, "mrtr_gateway_parked_calls", &[]).await;
        if left == 0.0 {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(drained, "parking lots did not drain");
    legacy.shutdown().await;
}

#[tokio::test]
async fn an_expired_parked_call_is_cancelled_upstream_and_released() {
    let env = env_with(
        LegacyServerConfig::default(),
        Handlers::new().tool("wait", "", json!({"type": "object"}), |ctx, _| async move {
            ctx.elicit_form("Go?", form("go")).await?;
            Ok(tool_text("went"))
        }),
        "",
        "[parking]\nttl = \"1s\"\n",
    )
    .await;
    let first = call_tool(&env.client(), "wait").await;
    assert_eq!(first.result_type(), Some("input_required"));
    assert_eq!(metric(&env.gw, "mrtr_gateway_parked_calls", &[]), 1.0);
    let stats = env.legacy.stats_handle();
    assert_eq!(
        stats.sessions_live(),
        1,
        "the parked call keeps its session"
    );
    assert_cancelled_upstream(&stats, |s| s.sessions_deleted() >= 1).await;
    assert!(
        metric_reaches(
            &env.gw,
            "mrtr_gateway_parked_calls",
            &[],
            0.0,
            Duration::from_secs(2)
        )
        .await
    );
    assert_metric!(
        &env.gw,
        "parked_evictions_total",
        &[("reason", "expired")],
        1.0
    );
    assert_eq!(
        metric(&env.gw, "mrtr_gateway_legacy_sessions_active", &[]),
        0.0
    );
    // The state is still valid (state.ttl > parking.ttl): its retry replays.
    let key = input_key(first.result().unwrap());
    let done = env
        .client()
        .request(
            "tools/call",
            json!({"name": "wait", "arguments": {}, "requestState": first.result().unwrap()["requestState"],
                   "inputResponses": {key: {"action": "accept", "content": {"go": "y"}}}}),
        )
        .await
        .unwrap();
    assert_eq!(text(done.result().unwrap()), "went");
    assert_metric!(&env.gw, "retries_total", &[("path", "replayed")], 1.0);
    env.stop().await;
}
