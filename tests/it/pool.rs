//! The legacy session pool: warm reuse, exclusive checkout, keys, discards, expiry.

use std::time::Duration;

use crate::support::*;
use mrtr_testkit::client::ModernClient;
use mrtr_testkit::legacy_server::{Handlers, LegacyServerConfig};
use serde_json::json;

fn handlers() -> Handlers {
    Handlers::new()
        .tool("echo", "", json!({"type": "object"}), |_, a| async move {
            Ok(tool_text(a["m"].as_str().unwrap_or("").to_string()))
        })
        .tool("slow", "", json!({"type": "object"}), |ctx, _| async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(tool_text(ctx.session_id().unwrap_or("?").to_string()))
        })
        .tool(
            "whoami",
            "",
            json!({"type": "object"}),
            |ctx, _| async move { Ok(tool_text(ctx.session_id().unwrap_or("?").to_string())) },
        )
}

async fn call(env: &Env, name: &str) -> String {
    let r = env
        .client()
        .request("tools/call", json!({"name": name, "arguments": {"m": "x"}}))
        .await
        .unwrap();
    text(r.result().unwrap_or_else(|| panic!("{:?}", r.message)))
}

/// A gateway in `pool.mode = "per-call"` (every session closed after its call) in front of
/// a legacy server configured by `legacy`.
async fn per_call_env(legacy: LegacyServerConfig) -> Env {
    env_with(legacy, handlers(), "", "[pool]\nmode = \"per-call\"\n").await
}

/// Calls `whoami` as `client`; returns the legacy session id that served it.
async fn whoami(client: &ModernClient) -> String {
    let r = call_tool(client, "whoami").await;
    text(r.result().unwrap_or_else(|| panic!("{:?}", r.message)))
}

#[tokio::test]
async fn sequential_calls_reuse_one_warm_session() {
    let env = env(handlers()).await;
    let first = call(&env, "whoami").await;
    let opened = env.legacy.stats().sessions_opened();
    for _ in 0..5 {
        assert_eq!(
            call(&env, "whoami").await,
            first,
            "the same legacy session served every call"
        );
    }
    assert_eq!(env.legacy.stats().sessions_opened(), opened);
    assert_metric!(&env.gw, "pool_checkouts_total", &[("result", "hit")], 5.0);
    assert_eq!(metric(&env.gw, "mrtr_gateway_pool_idle_sessions", &[]), 1.0);
    env.stop().await;
}

#[tokio::test]
async fn concurrent_calls_never_share_a_session() {
    let env = env(handlers()).await;
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let c = env.client();
        tasks.push(tokio::spawn(async move {
            let r = call_tool(&c, "slow").await;
            text(r.result().unwrap())
        }));
    }
    let mut sessions = std::collections::BTreeSet::new();
    for t in tasks {
        sessions.insert(t.await.unwrap());
    }
    assert_eq!(
        sessions.len(),
        5,
        "each in-flight call had a session of its own"
    );
    assert_eq!(metric(&env.gw, "mrtr_gateway_pool_idle_sessions", &[]), 5.0);
    env.stop().await;
}

#[tokio::test]
async fn different_capability_sets_get_different_sessions() {
    let env = env(handlers()).await;
    let none = env.client().with_capabilities(json!({}));
    let elicit = env.client().with_capabilities(json!({"elicitation": {}}));
    let a = whoami(&none).await;
    let b = whoami(&elicit).await;
    assert_ne!(a, b);
    let a2 = whoami(&none).await;
    assert_eq!(a, a2);
    // The elicitation-capable session declared elicitation; the other did not.
    let caps = |sid: &str| env.legacy.session(sid).unwrap().client_capabilities.clone();
    assert_eq!(caps(&a), json!({}));
    assert_eq!(caps(&b)["elicitation"], json!({"form": {}}));
    env.stop().await;
}

/// `pool.idle_read_after` settings that put the next call's checkout on each path: the idle
/// session read by a task from the start ("0s"), by default, and still resting unread when the
/// next call takes it ("1s"), so the checkout itself handles what arrived.
const IDLE_READING: [&str; 3] = [
    "[pool]\nidle_read_after = \"0s\"\n",
    "",
    "[pool]\nidle_read_after = \"1s\"\n",
];

async fn pool_env(pool: &str) -> Env {
    env_with(LegacyServerConfig::default(), handlers(), "", pool).await
}

#[tokio::test]
async fn a_server_request_arriving_while_idle_discards_the_session() {
    for pool in IDLE_READING {
        let env = pool_env(pool).await;
        let sid = call(&env, "whoami").await;
        // The legacy server asks something out of the blue on the idle session's GET stream.
        let ask = tokio::time::timeout(
            Duration::from_secs(5),
            env.legacy
                .request_on_get_stream(&sid, "roots/list", json!({})),
        );
        let next_call = async {
            assert!(
                env.legacy
                    .stats()
                    .wait_until(
                        |s| s.sent_requests().iter().any(|r| r.method == "roots/list"),
                        Duration::from_secs(3)
                    )
                    .await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
            call(&env, "whoami").await
        };
        let (asked, next) = tokio::join!(ask, next_call);
        assert_ne!(
            next, sid,
            "{pool}: the session with an unowned request was not reused"
        );
        assert_metric!(
            &env.gw,
            "pool_discards_total",
            &[("reason", "unattributed_request")],
            1.0
        );
        // Nobody answered it: the session was closed instead.
        assert!(matches!(asked, Ok(Err(_))), "{pool}: {asked:?}");
        env.stop().await;
    }
}

/// A `ping` is the one request an idle session can answer by itself: the server's keep-alive
/// must not cost the session its place in the pool. A session resting unread is read by a
/// task after `pool.idle_read_after`, so its ping is answered then.
#[tokio::test]
async fn a_ping_while_idle_is_answered_and_the_session_stays_warm() {
    for pool in IDLE_READING {
        let env = pool_env(pool).await;
        let sid = call(&env, "whoami").await;
        let answered = tokio::time::timeout(
            Duration::from_secs(5),
            env.legacy.request_on_get_stream(&sid, "ping", json!({})),
        )
        .await
        .unwrap_or_else(|_| panic!("{pool}: the ping was not answered in time"));
        assert_eq!(answered.unwrap(), json!({}), "{pool}");
        assert_eq!(
            call(&env, "whoami").await,
            sid,
            "{pool}: the same warm session"
        );
        assert_metric!(&env.gw, "pool_checkouts_total", &[("result", "hit")], 1.0);
        assert_metric!(
            &env.gw,
            "pool_discards_total",
            &[("reason", "unattributed_request")],
            0.0
        );
        env.stop().await;
    }
}

/// A ping that arrives while the session rests, and a call that takes the session before any
/// task reads it: the ping is answered then, and does not cost the session its place.
#[tokio::test]
async fn a_ping_to_a_resting_session_is_answered_when_a_call_takes_it() {
    let env = pool_env("[pool]\nidle_read_after = \"1s\"\n").await;
    let sid = call(&env, "whoami").await;
    let started = std::time::Instant::now();
    let ping = env.legacy.request_on_get_stream(&sid, "ping", json!({}));
    let next_call = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        call(&env, "whoami").await
    };
    let (answered, next) = tokio::join!(ping, next_call);
    assert_eq!(answered.unwrap(), json!({}));
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "answered when the call took the session, not after idle_read_after: {:?}",
        started.elapsed()
    );
    assert_eq!(next, sid, "the same warm session");
    env.stop().await;
}

#[tokio::test]
async fn a_session_the_server_expired_is_replaced_transparently() {
    let env = env(handlers()).await;
    let first = call(&env, "whoami").await;
    assert_eq!(env.legacy.faults().expire_all_sessions(), 1);
    let second = call(&env, "whoami").await;
    assert_ne!(first, second);
    assert_eq!(env.legacy.stats().http_errors(404), 1);
    env.stop().await;
}

#[tokio::test]
async fn a_cancelled_call_does_not_return_its_session() {
    let env = env(handlers()).await;
    let mut c = env.client();
    c.timeout = Duration::from_millis(100);
    assert!(
        c.request("tools/call", json!({"name": "slow", "arguments": {}}))
            .await
            .is_err()
    );
    assert!(
        env.legacy
            .stats()
            .wait_until(|s| s.sessions_live() == 0, Duration::from_secs(3))
            .await,
        "the cancelled call's session was closed"
    );
    assert_eq!(metric(&env.gw, "mrtr_gateway_pool_idle_sessions", &[]), 0.0);
    env.stop().await;
}

#[tokio::test]
async fn per_call_mode_opens_and_deletes_a_session_per_call() {
    let env = per_call_env(LegacyServerConfig::default()).await;
    let a = call(&env, "whoami").await;
    let b = call(&env, "whoami").await;
    assert_ne!(a, b);
    assert!(
        env.legacy
            .stats()
            .wait_until(|s| s.sessions_live() == 0, Duration::from_secs(3))
            .await
    );
    assert_eq!(metric(&env.gw, "mrtr_gateway_pool_idle_sessions", &[]), 0.0);
    env.stop().await;
}

#[tokio::test]
async fn a_calls_answer_does_not_wait_for_its_sessions_delete() {
    // Per-call mode closes every session after its call; a server slow to delete it must
    // not hold the call's answer.
    let env = per_call_env(LegacyServerConfig {
        delete_delay: Duration::from_secs(3),
        ..LegacyServerConfig::default()
    })
    .await;
    call(&env, "whoami").await;
    assert_eq!(
        env.legacy.stats().sessions_deleted(),
        0,
        "the answer came while the DELETE was still held"
    );
    assert!(
        env.legacy
            .stats()
            .wait_until(|s| s.sessions_deleted() == 1, Duration::from_secs(10))
            .await,
        "the session was still deleted"
    );
    env.stop().await;
}

#[tokio::test]
async fn a_closed_sessions_get_stream_connection_is_reused() {
    // Every session holds a GET stream, whose connection a close used to throw away (HTTP/1
    // cannot reuse a connection mid-response). The server ends the stream when the DELETE
    // ends the session; read to that end, the connection serves the next session.
    let env = per_call_env(LegacyServerConfig::default()).await;
    const CALLS: usize = 8;
    for i in 1..=CALLS {
        call(&env, "whoami").await;
        assert!(
            env.legacy
                .stats()
                .wait_until(|s| s.sessions_deleted() == i as u64, Duration::from_secs(5))
                .await
        );
    }
    let (opened, unfinished) = upstream_connections(&env.gw);
    // A session's requests overlap on two connections (the GET stream's, the call's); the
    // others reuse them. A close that lost its GET stream's connection costs one more each
    // time (nine in all); a GET stream whose end came late costs one (allowed twice here).
    assert!(
        opened <= 4.0 && unfinished <= 2.0,
        "{opened} connections opened, {unfinished} closed mid-response, for {CALLS} sessions"
    );
    env.stop().await;
}

#[tokio::test]
async fn idle_sessions_expire() {
    let env = env_with(
        LegacyServerConfig::default(),
        handlers(),
        "",
        "[pool]\nidle_timeout = \"1s\"\n",
    )
    .await;
    call(&env, "whoami").await;
    assert_eq!(metric(&env.gw, "mrtr_gateway_pool_idle_sessions", &[]), 1.0);
    assert!(
        env.legacy
            .stats()
            .wait_until(
                |s| s.sessions_live() == 0 && s.sessions_deleted() >= 1,
                Duration::from_secs(5)
            )
            .await,
        "the idle session was not closed"
    );
    assert_eq!(metric(&env.gw, "mrtr_gateway_pool_idle_sessions", &[]), 0.0);
    env.stop().await;
}

#[tokio::test]
async fn warm_up_opens_sessions_at_start_that_matching_calls_use() {
    let env = env_with(
        LegacyServerConfig::default(),
        handlers(),
        "",
        "[pool]\nwarm_up = 2\nwarm_up_capabilities = [\"elicitation\", \"roots\"]\n",
    )
    .await;
    assert!(
        metric_reaches(
            &env.gw,
            "mrtr_gateway_pool_idle_sessions",
            &[],
            2.0,
            Duration::from_secs(5)
        )
        .await,
        "two sessions were warmed before any request"
    );
    assert_eq!(env.legacy.stats().sessions_opened(), 2);

    // A request declaring exactly the warmed set takes a warm session: no new initialize.
    let warm = env
        .client()
        .with_capabilities(json!({"roots": {}, "elicitation": {}}));
    let sid = whoami(&warm).await;
    assert_eq!(env.legacy.stats().sessions_opened(), 2);
    assert_metric!(&env.gw, "pool_checkouts_total", &[("result", "hit")], 1.0);
    assert_eq!(
        env.legacy.session(&sid).unwrap().client_capabilities,
        json!({"roots": {"listChanged": true}, "elicitation": {"form": {}}}),
        "the warm session declared the configured capabilities"
    );

    // Any other set does not match the warm sessions.
    whoami(&env.client().with_capabilities(json!({"sampling": {}}))).await;
    assert_eq!(env.legacy.stats().sessions_opened(), 3);
    env.stop().await;
}

#[test]
fn warm_up_is_refused_where_its_key_cannot_be_known() {
    use mrtr_gateway::config::Config;
    let base =
        format!("[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n[pool]\nwarm_up = 1\n");
    let err = |extra: &str| {
        Config::from_toml_str(&format!("{base}{extra}"), &[], None)
            .expect_err("refused")
            .to_string()
    };
    assert!(Config::from_toml_str(&base, &[], None).is_ok());
    assert!(err("mode = \"per-call\"\n").contains("pool.warm_up"));
    assert!(err("max_idle_per_key = 0\n").contains("pool.warm_up"));
    assert!(err("warm_up_capabilities = [\"telepathy\"]\n").contains("pool.warm_up_capabilities"));
    assert!(
        err("[auth]\nupstream_credentials = \"forward\"\n").contains("pool.warm_up"),
        "forwarded credentials key the pool"
    );
    assert!(
        err("[auth]\nmode = \"header\"\n[auth.header]\nname = \"x-user\"\ntrusted_sources = [\"127.0.0.1\"]\n")
            .contains("pool.warm_up"),
        "authenticated principals key the pool"
    );
}

/// `concurrency` `slow` calls at once; the legacy sessions opened meanwhile.
async fn burst(env: &Env, concurrency: usize) -> u64 {
    let before = env.legacy.stats().sessions_opened();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let c = env.client();
        tasks.push(tokio::spawn(async move {
            assert!(call_tool(&c, "slow").await.result().is_some());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    env.legacy.stats().sessions_opened() - before
}

/// `max_idle_per_key` is where a key starts: a key whose calls run 12 at a time comes to keep
/// 12 warm sessions, so later bursts open none (with a fixed ceiling of 2, each burst would
/// open 10 new ones and discard them as `pool_full`).
#[tokio::test]
async fn the_pool_follows_the_concurrency_it_sees() {
    let env = env_with(
        LegacyServerConfig::default(),
        handlers(),
        "",
        "[pool]\nmax_idle_per_key = 2\n",
    )
    .await;
    assert_eq!(burst(&env, 12).await, 12, "a cold key opens one per call");
    // The allowance grows one session per miss; a few bursts settle it.
    let mut opened = Vec::new();
    for _ in 0..4 {
        opened.push(burst(&env, 12).await);
    }
    assert_eq!(opened.last(), Some(&0), "bursts opened {opened:?}");
    assert_eq!(
        metric(&env.gw, "mrtr_gateway_pool_idle_sessions", &[]),
        12.0
    );
    // Bounded by the caller's share of max_idle all the same.
    env.stop().await;
}

#[tokio::test]
async fn a_growing_key_stays_within_the_callers_share() {
    let env = env_with(
        LegacyServerConfig::default(),
        handlers(),
        "",
        "[pool]\nmax_idle_per_key = 2\nmax_idle = 64\nmax_idle_per_principal = 5\n",
    )
    .await;
    for _ in 0..4 {
        burst(&env, 12).await;
    }
    assert_eq!(metric(&env.gw, "mrtr_gateway_pool_idle_sessions", &[]), 5.0);
    assert!(
        metric(
            &env.gw,
            "mrtr_gateway_pool_discards_total",
            &[("reason", "pool_full")]
        ) > 0.0
    );
    env.stop().await;
}
