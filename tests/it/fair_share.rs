//! Pools every caller draws from leave room for the next caller (issue 23, point 4): each
//! caller's share holds from its first place, a reserve is kept for callers holding nothing
//! yet, and the idle-session pool evicts the least recently used session instead of refusing
//! newcomers. Anonymous callers (`auth.mode = "none"`) are told apart by source address:
//! 127.0.0.2, 127.0.0.3, … are all loopback on Linux.

use std::time::Duration;

use crate::support::*;
use mrtr_testkit::client::{EventStream, ModernClient};
use mrtr_testkit::legacy_server::{Handlers, LegacyServerConfig};
use serde_json::{Value, json};

fn handlers() -> Handlers {
    Handlers::new()
        .tool(
            "pay",
            "asks, then pays",
            json!({"type": "object"}),
            |ctx, _| async move {
                let ok = ctx
                    .elicit_form("Confirm the payment?", form("confirm"))
                    .await?;
                Ok(tool_text(format!(
                    "paid ({})",
                    ok["content"]["confirm"].as_str().unwrap_or("?")
                )))
            },
        )
        .tool("plain", "", json!({"type": "object"}), |_, _| async move {
            Ok(tool_text("plain"))
        })
}

fn from(env: &Env, ip: &str) -> ModernClient {
    env.client().from_local_address(ip.parse().unwrap())
}

/// Round 1 of `pay`: its `input_required` result.
async fn ask(c: &ModernClient) -> Value {
    let r = c
        .request("tools/call", json!({"name": "pay", "arguments": {}}))
        .await
        .unwrap();
    r.result()
        .unwrap_or_else(|| panic!("round 1 asks: {:?}", r.message))
        .clone()
}

/// Round 2 of `pay` for `round1`: the whole exchange.
async fn answer_round(c: &ModernClient, round1: &Value) -> mrtr_testkit::client::Exchange {
    let key = input_key(round1);
    c.request(
        "tools/call",
        json!({"name": "pay", "arguments": {}, "requestState": round1["requestState"],
               "inputResponses": {key: {"action": "accept", "content": {"confirm": "yes"}}}}),
    )
    .await
    .unwrap()
}

async fn listen(c: &ModernClient) -> EventStream {
    c.open_stream(
        "subscriptions/listen",
        json!({"notifications": {"toolsListChanged": true}}),
    )
    .await
    .unwrap()
}

fn limit_hits(env: &Env, limit: &str) -> f64 {
    metric(
        &env.gw,
        "mrtr_gateway_limit_hits_total",
        &[("limit", limit)],
    )
}

/// The case: listen streams and parked calls, 8 each and 2 per caller. Three sources
/// take what they can; a fourth still gets a listen stream and a parking place (it got 503 for
/// both while a caller's quota applied only once half a pool was taken).
#[tokio::test]
async fn a_fourth_source_gets_a_listen_stream_and_a_parking_place_when_three_hold_theirs() {
    let env = env_with(
        LegacyServerConfig::default(),
        handlers(),
        "",
        "[subscriptions]\nmax_streams = 8\nmax_streams_per_principal = 2\n\
         [parking]\nmax_calls = 8\nmax_per_principal = 2\n",
    )
    .await;
    let mut streams = Vec::new();
    for ip in ["127.0.0.1", "127.0.0.2", "127.0.0.3"] {
        let c = from(&env, ip);
        let mut got = 0;
        // Each tries for twice its share; it is held to its share from the first stream.
        for _ in 0..4 {
            let s = listen(&c).await;
            match s.status.as_u16() {
                200 => {
                    got += 1;
                    streams.push(s);
                }
                429 => {}
                other => panic!("{ip}: listen answered {other}"),
            }
        }
        assert_eq!(got, 2, "{ip} holds its share of listen streams, no more");
        let before = env.gw.parking.len();
        for _ in 0..4 {
            ask(&c).await;
        }
        assert_eq!(
            env.gw.parking.len() - before,
            2,
            "{ip} parks its share of calls, no more (the others replay on retry)"
        );
    }
    assert_eq!(env.gw.long_lived.listen_streams(), 6);
    let newcomer = from(&env, "127.0.0.4");
    let stream = listen(&newcomer).await;
    assert_eq!(
        stream.status.as_u16(),
        200,
        "the fourth source got no listen stream"
    );
    let parked = env.gw.parking.len();
    ask(&newcomer).await;
    assert_eq!(
        env.gw.parking.len(),
        parked + 1,
        "the fourth source's call was not parked"
    );
    assert_eq!(limit_hits(&env, "max_listen_streams_per_principal"), 6.0);
    assert_eq!(limit_hits(&env, "parking_per_principal"), 6.0);
    assert_eq!(limit_hits(&env, "max_listen_streams"), 0.0);
    assert_eq!(limit_hits(&env, "parking_full"), 0.0);
    // The newcomer's second stream would take the last place, kept for callers holding none.
    let second = listen(&newcomer).await;
    assert_eq!(second.status.as_u16(), 429);
    assert_eq!(limit_hits(&env, "listen_streams_newcomer_reserve"), 1.0);
    let fifth = listen(&from(&env, "127.0.0.5")).await;
    assert_eq!(fifth.status.as_u16(), 200, "the reserve went to a newcomer");
    drop((streams, stream, second, fifth));
    env.stop().await;
}

/// `single_use.max_entries = 20` with the per-caller key unset: the default share is a
/// quarter of the store (5), not the default absolute clamped to the store (20, which let one
/// caller fill it and every other retry got 503).
#[tokio::test]
async fn one_caller_cannot_fill_a_small_single_use_store_with_the_default_share() {
    let env = env_with(
        LegacyServerConfig::default(),
        handlers(),
        "",
        "[single_use]\nmax_entries = 20\n[parking]\ndefault_policy = \"replay\"\n",
    )
    .await;
    let busy = from(&env, "127.0.0.1");
    let mut served = 0;
    let refused = loop {
        let round1 = ask(&busy).await;
        let done = answer_round(&busy, &round1).await;
        if done.result().is_none() {
            break done;
        }
        served += 1;
        assert!(served <= 20, "one caller claimed the whole store");
    };
    assert_eq!(served, 5, "a quarter of the store");
    assert_eq!(refused.status.as_u16(), 429, "{:?}", refused.message);
    assert_eq!(
        limit_hits(&env, "single_use_max_entries_per_principal"),
        1.0
    );
    let other = from(&env, "127.0.0.2");
    let round1 = ask(&other).await;
    let done = answer_round(&other, &round1).await;
    assert_eq!(
        text(done.result().unwrap_or_else(|| panic!(
            "another caller's retry was refused: {} {:?}",
            done.status, done.message
        ))),
        "paid (yes)"
    );
    env.stop().await;
}

/// One principal cycling through many capability sets keeps a share of the idle pool, not
/// all of it: another principal's calls still find a warm session (they paid a legacy
/// `initialize` each once the pool was full of the first principal's sessions).
#[tokio::test]
async fn one_principals_capability_sets_leave_room_in_the_idle_pool_for_others() {
    let env = env_with(
        LegacyServerConfig::default(),
        handlers(),
        "",
        "[auth]\nmode = \"header\"\n[pool]\nmax_idle = 8\n",
    )
    .await;
    let as_user = |user: &str, caps: Value| {
        let mut c = env.client().with_capabilities(caps);
        c.headers.insert(
            "x-authenticated-user",
            http::HeaderValue::from_str(user).unwrap(),
        );
        c
    };
    // Eight capability sets: every subset of roots, sampling and form elicitation.
    let mut sets = Vec::new();
    for bits in 0..8u8 {
        let mut caps = serde_json::Map::new();
        if bits & 1 != 0 {
            caps.insert("roots".into(), json!({}));
        }
        if bits & 2 != 0 {
            caps.insert("sampling".into(), json!({}));
        }
        if bits & 4 != 0 {
            caps.insert("elicitation".into(), json!({"form": {}}));
        }
        sets.push(Value::Object(caps));
    }
    let call = |c: ModernClient| async move {
        let r = c
            .request("tools/call", json!({"name": "plain", "arguments": {}}))
            .await
            .unwrap();
        assert_eq!(text(r.result().expect("plain answers")), "plain");
    };
    for caps in &sets {
        call(as_user("alice", caps.clone())).await;
    }
    let pool = env.gw.sessions.pool();
    let alice = mrtr_gateway::caller_scope::CallerScope::new("alice", "");
    assert!(
        eventually(Duration::from_secs(5), || pool.idle_of(&alice) == 2).await,
        "alice holds {} idle sessions, not her share of 2",
        pool.idle_of(&alice)
    );
    assert_eq!(
        metric(
            &env.gw,
            "mrtr_gateway_pool_discards_total",
            &[("reason", "caller_share")]
        ),
        6.0
    );
    // Bob's calls: the first opens a session, the next ones reuse it.
    let before = env.legacy.stats().count_method("initialize");
    for _ in 0..3 {
        call(as_user("bob", sets[7].clone())).await;
        // The session goes back to the pool after the response.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let paid = env.legacy.stats().count_method("initialize") - before;
    assert_eq!(paid, 1, "bob paid a legacy handshake on {paid} of 3 calls");
    env.stop().await;
}
