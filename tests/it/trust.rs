//! requestState you can trust: the tamper matrix, single use under duplicate races (memory,
//! and Redis shared by two gateway processes), and identity binding with JWT.

use std::time::Duration;

use crate::support::procs::{spawn_gateway, start_redis};
use crate::support::*;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use mrtr_gateway::config::StateKeySpec;
use mrtr_gateway::state::StateCodec;
use mrtr_testkit::client::{Exchange, ModernClient};
use mrtr_testkit::legacy_server::{Handlers, LegacyServer, LegacyServerConfig};
use serde_json::{Value, json};

fn handlers() -> Handlers {
    Handlers::new()
        .tool(
            "pay",
            "moves money",
            json!({"type": "object"}),
            |ctx, a| async move {
                let ok = ctx
                    .elicit_form("Confirm the payment?", form("confirm"))
                    .await?;
                // Slow enough that concurrent duplicates overlap the first execution.
                tokio::time::sleep(Duration::from_millis(150)).await;
                Ok(tool_text(format!(
                    "paid {} ({})",
                    a["amount"].as_i64().unwrap_or(0),
                    ok["content"]["confirm"].as_str().unwrap_or("?")
                )))
            },
        )
        .tool("other", "", json!({"type": "object"}), |_, _| async move {
            Ok(tool_text("other"))
        })
        .prompt("p", "", json!([]), |_, _| async move {
            Ok(json!({"messages": []}))
        })
        .resource("file:///r", "r", None, |_, _| async move {
            Ok(json!({"contents": [{"uri": "file:///r", "text": "r"}]}))
        })
}

/// Round 1 of `pay`: the state and the key of its question.
async fn first_round(c: &ModernClient) -> (String, String) {
    let r = c
        .request(
            "tools/call",
            json!({"name": "pay", "arguments": {"amount": 10}}),
        )
        .await
        .unwrap();
    let res = r.result().expect("an input_required result");
    let key = input_key(res);
    (res["requestState"].as_str().unwrap().to_string(), key)
}

fn retry_params(state: Value, key: &str) -> Value {
    json!({"name": "pay", "arguments": {"amount": 10}, "requestState": state,
           "inputResponses": {key: {"action": "accept", "content": {"confirm": "yes"}}}})
}

fn b64_flip(token: &str, i: usize) -> String {
    let (prefix, body) = token.rsplit_once('.').unwrap();
    let mut raw = URL_SAFE_NO_PAD.decode(body).unwrap();
    raw[i] ^= 0x01;
    format!("{prefix}.{}", URL_SAFE_NO_PAD.encode(raw))
}

#[tokio::test]
async fn tamper_matrix_every_case_is_one_error_and_the_legacy_server_sees_nothing() {
    let env = env(handlers()).await;
    let c = env.client();
    let (state, key) = first_round(&c).await;
    let (version, rest) = state.split_once('.').unwrap();
    let (kid, body) = rest.split_once('.').unwrap();
    let raw_len = URL_SAFE_NO_PAD.decode(body).unwrap().len();

    // Build the cases: (class, params of the retry).
    let mut cases: Vec<(&str, Value)> = Vec::new();
    let with_state = |s: Value| retry_params(s, &key);
    for i in 0..version.len() {
        let mut v: Vec<u8> = version.bytes().collect();
        v[i] = if v[i] == b'x' { b'y' } else { b'x' };
        cases.push((
            "version byte",
            with_state(json!(format!(
                "{}.{kid}.{body}",
                String::from_utf8(v).unwrap()
            ))),
        ));
    }
    for i in 0..kid.len() {
        let mut k: Vec<u8> = kid.bytes().collect();
        k[i] = if k[i] == b'z' { b'y' } else { b'z' };
        cases.push((
            "key id byte",
            with_state(json!(format!(
                "{version}.{}.{body}",
                String::from_utf8(k).unwrap()
            ))),
        ));
    }
    for i in 0..raw_len {
        let class = if i < 24 {
            "nonce byte"
        } else if i >= raw_len - 16 {
            "tag byte"
        } else {
            "ciphertext byte"
        };
        cases.push((class, with_state(json!(b64_flip(&state, i)))));
    }
    for cut in [
        0,
        version.len(),
        version.len() + 1,
        version.len() + 1 + kid.len() + 1,
        state.len() - 22,
        state.len() - 1,
    ] {
        cases.push(("truncated", with_state(json!(state[..cut].to_string()))));
    }
    for suffix in ["A", "AAAA", ".x", " ", "=="] {
        cases.push(("appended", with_state(json!(format!("{state}{suffix}")))));
    }
    // Sealed by a foreign key under the same id, and by a key id the ring does not have.
    let real = StateCodec::new(
        &[StateKeySpec {
            id: "k1".into(),
            secret: base64::engine::general_purpose::STANDARD
                .decode(TEST_KEY)
                .unwrap()
                .try_into()
                .unwrap(),
        }],
        Duration::from_secs(600),
        65536,
    );
    let (payload, _) = real.open(&state, mrtr_gateway::state::now_secs()).unwrap();
    let foreign = StateCodec::new(
        &[StateKeySpec {
            id: "k1".into(),
            secret: [9; 32],
        }],
        Duration::from_secs(600),
        65536,
    );
    cases.push((
        "foreign key",
        with_state(json!(foreign.seal(&payload).unwrap().0)),
    ));
    let unknown = StateCodec::new(
        &[StateKeySpec {
            id: "k9".into(),
            secret: [9; 32],
        }],
        Duration::from_secs(600),
        65536,
    );
    cases.push((
        "unknown key id",
        with_state(json!(unknown.seal(&payload).unwrap().0)),
    ));
    // Expired: the same key, the same binding, only the times moved into the past.
    let mut old = payload.clone();
    old.iat -= 7200;
    old.exp -= 7200;
    cases.push(("expired", with_state(json!(real.seal(&old).unwrap().0))));
    // Another principal.
    let mut someone = payload.clone();
    someone.prn = "someone-else".into();
    cases.push((
        "another principal",
        with_state(json!(real.seal(&someone).unwrap().0)),
    ));
    // Another tool, other arguments, another method, another prompt / URI.
    let s = json!(state);
    cases.push((
        "another tool",
        json!({"name": "other", "arguments": {"amount": 10}, "requestState": s}),
    ));
    cases.push((
        "other arguments",
        json!({"name": "pay", "arguments": {"amount": 9999}, "requestState": s}),
    ));
    cases.push(("no arguments", json!({"name": "pay", "requestState": s})));
    // Oversize, not base64url, empty, not a string.
    cases.push((
        "over max_bytes",
        with_state(json!(format!("m1.k1.{}", "A".repeat(70_000)))),
    ));
    cases.push((
        "not base64url",
        with_state(json!(format!(
            "{version}.{kid}.{}",
            body.replace('A', "+").replace('B', "/")
        ))),
    ));
    cases.push(("empty", with_state(json!(""))));
    for v in [
        json!(123),
        json!({"state": state}),
        json!([state]),
        json!(true),
        Value::Null,
    ] {
        cases.push(("not a string", with_state(v)));
    }

    env.legacy
        .stats()
        .wait_until(|s| s.sessions_live() <= 1, Duration::from_secs(2))
        .await;
    let before = env.legacy.stats().messages_received();
    let mut classes = std::collections::BTreeMap::<&str, usize>::new();
    let mut messages = std::collections::BTreeSet::new();
    for (class, params) in &cases {
        let ex = c.request("tools/call", params.clone()).await.unwrap();
        assert_eq!(ex.status.as_u16(), 400, "{class}: {:?}", ex.message);
        assert_eq!(ex.error_code(), Some(-32602), "{class}: {:?}", ex.message);
        messages.insert(ex.error().unwrap()["message"].as_str().unwrap().to_string());
        *classes.entry(class).or_default() += 1;
    }
    // Another method and another prompt / URI with the same state.
    for (method, params) in [
        ("prompts/get", json!({"name": "p", "requestState": state})),
        (
            "resources/read",
            json!({"uri": "file:///r", "requestState": state}),
        ),
    ] {
        let ex = c.request(method, params).await.unwrap();
        assert_eq!(
            (ex.status.as_u16(), ex.error_code()),
            (400, Some(-32602)),
            "{method}"
        );
        messages.insert(ex.error().unwrap()["message"].as_str().unwrap().to_string());
        *classes.entry("another method / prompt / URI").or_default() += 1;
    }
    assert_eq!(
        env.legacy.stats().messages_received(),
        before,
        "a tampered state reached the legacy server"
    );
    assert_eq!(
        messages.len(),
        1,
        "the reason must not leak to the client: {messages:?}"
    );
    let total: usize = classes.values().sum();
    eprintln!(
        "tamper matrix: {total} cases in {} classes: {classes:?}",
        classes.len()
    );
    assert!(classes.len() >= 15 && total > 200);
    // The untampered state still works afterwards (nothing was consumed by the attempts).
    let ok = c
        .request("tools/call", retry_params(json!(state), &key))
        .await
        .unwrap();
    assert_eq!(text(ok.result().unwrap()), "paid 10 (yes)");
    env.stop().await;
}

/// Fires `n` concurrent presentations of `params` at the given gateways (round robin).
async fn race(urls: &[String], params: Value, n: usize) -> Vec<Exchange> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let url = urls[i % urls.len()].clone();
        let params = params.clone();
        tasks.push(tokio::spawn(async move {
            ModernClient::new(&url)
                .request("tools/call", params)
                .await
                .unwrap()
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Every duplicate got the winner's result, byte for byte, or the in-progress error.
fn check_race(results: &[Exchange]) -> (usize, usize) {
    let result_text = |ex: &Exchange| -> Option<String> {
        ex.result().map(|r| serde_json::to_string(r).unwrap())
    };
    let winners: Vec<String> = results.iter().filter_map(result_text).collect();
    assert!(!winners.is_empty(), "nobody completed");
    assert!(
        winners.iter().all(|w| w == &winners[0]),
        "duplicates got different results"
    );
    assert!(winners[0].contains("paid 10 (yes)"));
    let in_progress = results
        .iter()
        .filter(|ex| ex.error().is_some())
        .inspect(|ex| {
            assert_eq!(ex.status.as_u16(), 409, "{:?}", ex.message);
            assert!(
                ex.error().unwrap()["message"]
                    .as_str()
                    .unwrap()
                    .contains("already in progress")
            );
        })
        .count();
    (winners.len(), in_progress)
}

const REPLAY: &str = "[parking]\ndefault_policy = \"replay\"\n";

#[tokio::test]
async fn duplicate_race_in_memory_runs_the_tool_once() {
    let env = env_with(LegacyServerConfig::default(), handlers(), "", REPLAY).await;
    let c = env.client();
    let (state, key) = first_round(&c).await;
    let results = race(
        std::slice::from_ref(&env.url),
        retry_params(json!(state), &key),
        50,
    )
    .await;
    let (same, in_progress) = check_race(&results);
    eprintln!(
        "memory duplicate race: 50 presentations, {same} got the result, {in_progress} got 'in progress'"
    );
    // Round 1 ran the tool once; the final round ran it exactly once more.
    assert_eq!(env.legacy.stats().tool_starts("pay"), 2);
    assert_eq!(env.legacy.stats().tool_finishes("pay"), 1);
    // After the first finished, a duplicate gets the same outcome byte for byte.
    let late = c
        .request("tools/call", retry_params(json!(state), &key))
        .await
        .unwrap();
    let winner = results
        .iter()
        .find_map(|e| e.result().map(|r| serde_json::to_string(r).unwrap()))
        .unwrap();
    assert_eq!(
        serde_json::to_string(late.result().unwrap()).unwrap(),
        winner
    );
    assert_eq!(env.legacy.stats().tool_starts("pay"), 2);
    assert!(
        metric(
            &env.gw,
            "mrtr_gateway_single_use_claims_total",
            &[("result", "acquired")]
        ) == 1.0
    );
    env.stop().await;
}

#[tokio::test]
async fn duplicate_race_across_two_gateway_processes_sharing_redis_runs_the_tool_once() {
    let redis = start_redis().await;
    let legacy = LegacyServer::start(LegacyServerConfig::default(), handlers())
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("mrtr-trust-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shared = format!(
        "[upstream]\nurl = \"{}\"\n[single_use]\nstore = \"redis\"\n[single_use.redis]\nurls = [\"redis://127.0.0.1:{}/0\"]\n{REPLAY}[log]\nformat = \"text\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n",
        legacy.url(),
        redis.port
    );
    let (a, url_a, _) = spawn_gateway(&shared, &dir, "gw-a").await;
    let (b, url_b, _) = spawn_gateway(&shared, &dir, "gw-b").await;
    let (state, key) = first_round(&ModernClient::new(&url_a)).await;
    let results = race(
        &[url_a.clone(), url_b.clone()],
        retry_params(json!(state), &key),
        50,
    )
    .await;
    let (same, in_progress) = check_race(&results);
    eprintln!(
        "redis duplicate race (two processes): 50 presentations, {same} got the result, {in_progress} got 'in progress'"
    );
    assert_eq!(
        legacy.stats().tool_starts("pay"),
        2,
        "the final round ran exactly once across both replicas"
    );
    // A late duplicate on either replica gets the kept outcome.
    for url in [&url_a, &url_b] {
        let late = ModernClient::new(url)
            .request("tools/call", retry_params(json!(state), &key))
            .await
            .unwrap();
        assert!(
            late.result().is_some_and(|r| text(r) == "paid 10 (yes)"),
            "{:?}",
            late.message
        );
    }
    assert_eq!(legacy.stats().tool_starts("pay"), 2);
    let log = std::fs::read_to_string(dir.join("gw-a.log")).unwrap();
    assert!(
        !log.contains("per replica"),
        "a Redis-backed replica warned about per-replica claims:\n{log}"
    );
    drop((a, b, redis));
    let _ = std::fs::remove_dir_all(&dir);
    legacy.shutdown().await;
}

/// One caller cannot fill the memory single-use store and lock everyone else out: past its
/// `single_use.max_entries_per_principal` its retries get 429 (its own fault, nothing run),
/// while another caller's retries still run.
/// `parking.max_per_principal` counts anonymous callers per source address too, from the
/// first parked call: a caller's second blocked call is not parked (its retry would replay)
/// although the lot has room, while another anonymous caller's still is.
#[tokio::test]
async fn anonymous_callers_have_parking_quotas_of_their_own() {
    let env = env_with(
        LegacyServerConfig::default(),
        handlers(),
        "",
        "[parking]\nmax_calls = 4\nmax_per_principal = 1\n",
    )
    .await;
    let from = |ip: &str| env.client().from_local_address(ip.parse().unwrap());
    let parked = || env.gw.parking.len();
    let first = from("127.0.0.1");
    first_round(&first).await;
    assert_eq!(parked(), 1);
    first_round(&first).await;
    assert_eq!(
        parked(),
        1,
        "the quota of 1 holds from the first parked call"
    );
    let refused = metric(
        &env.gw,
        "mrtr_gateway_limit_hits_total",
        &[("limit", "parking_per_principal")],
    );
    assert_eq!(refused, 1.0);
    first_round(&from("127.0.0.2")).await;
    assert_eq!(parked(), 2, "another anonymous caller parks its own");
    env.stop().await;
}

/// The same with `auth.mode = "none"`, where every caller is `anonymous`: the quota counts
/// per source address, so one anonymous caller filling its share leaves another's retries
/// served (a quota keyed by the principal alone would lock out every anonymous caller).
#[tokio::test]
async fn one_anonymous_caller_cannot_fill_the_single_use_store_for_everyone() {
    let extra = format!("[single_use]\nmax_entries = 4\nmax_entries_per_principal = 3\n{REPLAY}");
    let env = env_with(LegacyServerConfig::default(), handlers(), "", &extra).await;
    let from = |ip: &str| env.client().from_local_address(ip.parse().unwrap());
    let first = from("127.0.0.1");
    for _ in 0..3 {
        let (state, key) = first_round(&first).await;
        let done = first
            .request("tools/call", retry_params(json!(state), &key))
            .await
            .unwrap();
        assert_eq!(text(done.result().unwrap()), "paid 10 (yes)");
    }
    let (state, key) = first_round(&first).await;
    let refused = first
        .request("tools/call", retry_params(json!(state), &key))
        .await
        .unwrap();
    assert_eq!(refused.status.as_u16(), 429, "{:?}", refused.message);
    // Another anonymous caller (another source address) is still served.
    let other = from("127.0.0.2");
    let (state, key) = first_round(&other).await;
    let done = other
        .request("tools/call", retry_params(json!(state), &key))
        .await
        .unwrap();
    assert_eq!(
        text(
            done.result()
                .expect("the other anonymous caller is not locked out")
        ),
        "paid 10 (yes)"
    );
    env.stop().await;
}

#[tokio::test]
async fn one_caller_cannot_fill_the_single_use_store_for_everyone() {
    let extra = format!(
        "[auth]\nmode = \"header\"\n[single_use]\nmax_entries = 4\nmax_entries_per_principal = 3\n{REPLAY}"
    );
    let env = env_with(LegacyServerConfig::default(), handlers(), "", &extra).await;
    let as_user = |user: &str| {
        let mut c = env.client();
        c.headers.insert(
            "x-authenticated-user",
            http::HeaderValue::from_str(user).unwrap(),
        );
        c
    };
    let mallory = as_user("mallory");
    for _ in 0..3 {
        let (state, key) = first_round(&mallory).await;
        let done = mallory
            .request("tools/call", retry_params(json!(state), &key))
            .await
            .unwrap();
        assert_eq!(text(done.result().unwrap()), "paid 10 (yes)");
    }
    // The fourth would still fit the store, but not mallory's share of it.
    let (state, key) = first_round(&mallory).await;
    let runs = env.legacy.stats().tool_finishes("pay");
    let refused = mallory
        .request("tools/call", retry_params(json!(state), &key))
        .await
        .unwrap();
    assert_eq!(refused.status.as_u16(), 429, "{:?}", refused.message);
    assert!(refused.headers.contains_key(http::header::RETRY_AFTER));
    assert!(
        refused.error().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("single_use.max_entries_per_principal")
    );
    assert_eq!(env.legacy.stats().tool_finishes("pay"), runs, "nothing ran");
    // Someone else is still served.
    let alice = as_user("alice");
    let (state, key) = first_round(&alice).await;
    let done = alice
        .request("tools/call", retry_params(json!(state), &key))
        .await
        .unwrap();
    assert_eq!(
        text(done.result().expect("alice is not locked out")),
        "paid 10 (yes)"
    );
    assert_metric!(
        &env.gw,
        "limit_hits_total",
        &[("limit", "single_use_max_entries_per_principal")],
        1.0
    );
    assert_eq!(
        metric(
            &env.gw,
            "mrtr_gateway_rejections_total",
            &[
                ("reason", "single_use_principal_quota"),
                ("fault", "client")
            ]
        ),
        1.0
    );
    env.stop().await;
}

#[tokio::test]
async fn an_unreachable_redis_fails_closed_and_readiness_says_so() {
    let legacy = LegacyServer::start(LegacyServerConfig::default(), handlers())
        .await
        .unwrap();
    let port = free_port();
    let cfg = config(
        &legacy.url(),
        "",
        "",
        &format!(
            "[single_use]\nstore = \"redis\"\n[single_use.redis]\nurls = [\"redis://127.0.0.1:{port}/0\"]\ncommand_timeout = \"300ms\"\nconnect_timeout = \"300ms\"\n"
        ),
    );
    let (gw, running, url) = start_gateway(cfg).await;
    let c = ModernClient::new(&url);
    let (state, key) = first_round(&c).await;
    let before = legacy.stats().tool_starts("pay");
    let r = c
        .request("tools/call", retry_params(json!(state), &key))
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 503, "{:?}", r.message);
    assert_eq!(
        legacy.stats().tool_starts("pay"),
        before,
        "nothing ran without the replay guard"
    );
    let readiness = mrtr_gateway::readiness::evaluate(&gw).await;
    assert!(!readiness.ready());
    assert!(
        readiness
            .checks
            .iter()
            .any(|(n, r)| *n == "single_use" && r.is_err())
    );
    running.stop().await;
    legacy.shutdown().await;
}

// ---- JWT binding --------------------------------------------------------------------------

struct Jwt {
    key: jsonwebtoken::EncodingKey,
    other_key: jsonwebtoken::EncodingKey,
    dir: std::path::PathBuf,
}

fn jwt_material() -> Jwt {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let dir =
        std::env::temp_dir().join(format!("mrtr-jwt-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("k1.pem"), kp.public_key_pem()).unwrap();
    Jwt {
        key: jsonwebtoken::EncodingKey::from_ec_pem(kp.serialize_pem().as_bytes()).unwrap(),
        other_key: jsonwebtoken::EncodingKey::from_ec_pem(other.serialize_pem().as_bytes())
            .unwrap(),
        dir,
    }
}

fn rand_suffix() -> String {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn token(
    key: &jsonwebtoken::EncodingKey,
    kid: &str,
    sub: &str,
    aud: &str,
    exp_offset: i64,
) -> String {
    let now = mrtr_gateway::state::now_secs() as i64;
    let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    h.kid = Some(kid.into());
    jsonwebtoken::encode(
        &h,
        &json!({"iss": "https://issuer.example", "sub": sub, "aud": aud, "iat": now, "exp": now + exp_offset}),
        key,
    )
    .unwrap()
}

#[tokio::test]
async fn jwt_mode_rejects_bad_tokens_with_401_and_binds_states_to_the_subject() {
    let m = jwt_material();
    let legacy = LegacyServer::start(LegacyServerConfig::default(), handlers())
        .await
        .unwrap();
    let cfg = config(
        &legacy.url(),
        "",
        "",
        &format!(
            "[auth]\nmode = \"jwt\"\n[auth.jwt]\nissuer = \"https://issuer.example\"\naudiences = [\"mrtr\"]\nleeway = \"5s\"\n[[auth.jwt.keys]]\nkid = \"k1\"\nalgorithm = \"ES256\"\npem_file = \"{}\"\n",
            m.dir.join("k1.pem").display()
        ),
    );
    let (gw, running, url) = start_gateway(cfg).await;
    let as_user = |tok: String| {
        let mut c = ModernClient::new(&url);
        c.headers
            .insert("authorization", format!("Bearer {tok}").parse().unwrap());
        c
    };
    let alice = as_user(token(&m.key, "k1", "alice", "mrtr", 300));
    let bob = as_user(token(&m.key, "k1", "bob", "mrtr", 300));
    let list = json!({});
    for (what, c) in [
        ("no token", ModernClient::new(&url)),
        (
            "expired",
            as_user(token(&m.key, "k1", "alice", "mrtr", -120)),
        ),
        (
            "wrong audience",
            as_user(token(&m.key, "k1", "alice", "other", 300)),
        ),
        (
            "wrong key / signature",
            as_user(token(&m.other_key, "k1", "alice", "mrtr", 300)),
        ),
        (
            "unknown kid",
            as_user(token(&m.key, "k2", "alice", "mrtr", 300)),
        ),
        (
            "wrong algorithm",
            as_user({
                let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
                h.kid = Some("k1".into());
                jsonwebtoken::encode(&h, &json!({"iss": "https://issuer.example", "sub": "alice", "aud": "mrtr", "exp": mrtr_gateway::state::now_secs() + 300}), &jsonwebtoken::EncodingKey::from_secret(b"k1").unwrap()).unwrap()
            }),
        ),
    ] {
        let r = c.request("tools/list", list.clone()).await.unwrap();
        assert_eq!(r.status.as_u16(), 401, "{what}: {:?}", r.message);
        assert!(r.headers.get("www-authenticate").is_some(), "{what}");
        assert_eq!(r.error_code(), Some(-32600), "{what}");
    }
    let ok = alice.request("tools/list", list).await.unwrap();
    assert_eq!(ok.status.as_u16(), 200);
    // A state issued to alice is refused for bob, and the legacy server never hears of it.
    let (state, key) = first_round(&alice).await;
    let before = legacy.stats().messages_received();
    let stolen = bob
        .request("tools/call", retry_params(json!(state), &key))
        .await
        .unwrap();
    assert_eq!(
        (stolen.status.as_u16(), stolen.error_code()),
        (400, Some(-32602))
    );
    assert_eq!(legacy.stats().messages_received(), before);
    assert_metric!(
        &gw,
        "state_opens_total",
        &[("result", "state_wrong_principal")],
        1.0
    );
    let mine = alice
        .request("tools/call", retry_params(json!(state), &key))
        .await
        .unwrap();
    assert_eq!(text(mine.result().unwrap()), "paid 10 (yes)");
    running.stop().await;
    legacy.shutdown().await;
    let _ = std::fs::remove_dir_all(&m.dir);
}

#[tokio::test]
async fn inspect_state_shows_fields_but_hides_answers_unless_asked() {
    let env = env_with(LegacyServerConfig::default(), handlers(), "", REPLAY).await;
    let c = env.client();
    let (state, key) = first_round(&c).await;
    // A second round so the state carries an answer: answer, then get asked again is not
    // possible for `pay`, so build a state with an answer directly under the same key.
    let codec = &env.gw.codec;
    let (mut payload, _) = codec.open(&state, mrtr_gateway::state::now_secs()).unwrap();
    payload.ans.insert(
        key.clone(),
        json!({"action": "accept", "content": {"confirm": "secret-yes"}}).into(),
    );
    let with_answer = codec.seal(&payload).unwrap().0;
    let dir = std::env::temp_dir().join(format!("mrtr-inspect-{}", rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("g.toml");
    std::fs::write(
        &cfg,
        format!("[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n"),
    )
    .unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_mrtr-gateway"))
            .args(["inspect-state", "--config"])
            .arg(&cfg)
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&[&with_answer]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("key id:        k1"), "{text}");
    assert!(text.contains("round:         1"), "{text}");
    assert!(text.contains(&key), "{text}");
    assert!(text.contains("elicitation (form)"), "{text}");
    assert!(
        !text.contains("secret-yes"),
        "answers are hidden by default: {text}"
    );
    let shown = String::from_utf8_lossy(&run(&["--show-answers", &with_answer]).stdout).to_string();
    assert!(shown.contains("secret-yes"));
    let bad = run(&["m1.k1.AAAA"]);
    assert_eq!(bad.status.code(), Some(65));
    let _ = std::fs::remove_dir_all(&dir);
    env.stop().await;
}
