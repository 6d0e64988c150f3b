//! Caller isolation: what one caller's legacy session holds or says never reaches another.
//!
//! - pooled sessions are made to ask each new client for its roots (the TypeScript reference
//!   server caches roots per session; FastMCP asks inside each tool and is learned not to need
//!   the wait);
//! - lists run on a session declaring the request's capabilities (the reference server
//!   registers tools per capability);
//! - `server/discover`, `serverInfo`, routing and `cacheScope` come from the caller's own
//!   session (a legacy server whose answer depends on the token);
//! - list-change notifications reach only the listen streams of the caller whose session heard
//!   them;
//! - the configured upstream credential is on every session the gateway opens.
//!
//! (`initialize` sent as a 2026-07-28 request, issue 11's last point, is in `front.rs`.)

use std::sync::Arc;
use std::time::Duration;

use crate::support::peers::{
    EverythingServer, PyLegacyServer, legacy_client, modern_scenario, result_text,
};
use crate::support::*;
use http::HeaderValue;
use mrtr_gateway::front::listener::Running;
use mrtr_gateway::gateway::Gateway;
use mrtr_testkit::client::{ClientError, EventStream, ModernClient};
use mrtr_testkit::legacy_server::{CredentialView, Handlers, LegacyServer, LegacyServerConfig};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);
const ACK: &str = "notifications/subscriptions/acknowledged";

fn roots_answer(uri: &str) -> impl FnMut(&str, &Value) -> Result<Value, String> + Send + '_ {
    move |_key, req| match req["method"].as_str() {
        Some("roots/list") => Ok(json!({"roots": [{"uri": uri, "name": "r"}]})),
        other => Err(format!("unexpected input request {other:?}")),
    }
}

/// Calls `tool` as a client whose roots are `[uri]`, answering every round; returns the text.
async fn call_with_roots(c: &ModernClient, tool: &str, uri: &str) -> String {
    let mut answer = roots_answer(uri);
    let (_, ex) = c
        .call_with_input(
            "tools/call",
            json!({"name": tool, "arguments": {}}),
            &mut answer,
            8,
        )
        .await
        .unwrap();
    text(
        ex.result()
            .unwrap_or_else(|| panic!("{tool} as {uri}: {:?}", ex.message)),
    )
}

fn roots_client(url: &str) -> ModernClient {
    ModernClient::new(url).with_capabilities(json!({"roots": {}}))
}

// ----- 1. pooled sessions and the roots a server caches per session -------------------------

/// The issue's scenario with real peers on both sides: three Python 2026-07-28 clients whose
/// roots are /srv/alice, /srv/bob and /srv/carol call the reference server's `get-roots-list`
/// in turn through one gateway. The server caches roots per legacy session; with a pooled
/// session each must still see its own (today: all three see /srv/alice).
#[tokio::test]
async fn three_clients_in_turn_each_see_their_own_roots_on_a_pooled_session() {
    three_clients_in_turn("pooled").await;
}

/// A refresh the policy refuses must not leave the earlier client's roots in place: the
/// reference server keeps a session's last roots when its `roots/list` fails, so the call goes
/// to a fresh session (which has none) instead of the reused one. Alice's call caches her roots
/// on a pooled session; ops then forbid roots for the tool; Bob's call must not show them.
#[tokio::test]
async fn a_refused_roots_refresh_never_shows_the_earlier_clients_roots() {
    let everything = EverythingServer::start().await;
    let pool = "[pool]\nroots_refresh_wait = \"10s\"\n";
    let (gw, running, url) = start_gateway(config(&everything.url(), "", "", pool)).await;
    let alice = call_with_roots(&roots_client(&url), "get-roots-list", "file:///srv/alice").await;
    assert!(alice.contains("/srv/alice"), "{alice}");
    let no_roots = format!(
        "{pool}[[policy.rules]]\nmethod = \"tools/call\"\nname = \"get-roots-list\"\nallow = []\n"
    );
    gw.apply_config(config(&everything.url(), "", "", &no_roots))
        .unwrap();
    let bob = call_with_roots(&roots_client(&url), "get-roots-list", "file:///srv/bob").await;
    assert!(
        !bob.contains("/srv/alice"),
        "bob was shown alice's roots: {bob}"
    );
    assert!(!bob.contains("/srv/bob"), "the policy refuses roots: {bob}");
    assert_metric!(
        &gw,
        "roots_refreshes_total",
        &[("outcome", "reasked")],
        1.0,
        "bob's call reused alice's session and the server asked again"
    );
    running.stop().await;
    everything.kill().await;
}

/// `pool.mode = "per-call"` keeps working: a fresh session per call, asked every time.
#[tokio::test]
async fn three_clients_in_turn_each_see_their_own_roots_per_call() {
    three_clients_in_turn("per-call").await;
}

async fn three_clients_in_turn(mode: &str) {
    let everything = EverythingServer::start().await;
    let (gw, running, url) = start_gateway(config(
        &everything.url(),
        "",
        "",
        &format!("[pool]\nmode = \"{mode}\"\nroots_refresh_wait = \"10s\"\n"),
    ))
    .await;
    for who in ["alice", "bob", "carol"] {
        let root = format!("file:///srv/{who}");
        let report = modern_scenario(
            &url,
            "call",
            &["--tool", "get-roots-list", "--roots", &root],
        )
        .await;
        assert_eq!(report["ok"], true, "{who}: {report:#}");
        let text = result_text(&report);
        assert!(text.contains(&root), "{who} sees {text:?}");
        for other in ["alice", "bob", "carol"].iter().filter(|o| **o != who) {
            assert!(
                !text.contains(&format!("/srv/{other}")),
                "{who} sees {other}'s roots: {text:?}"
            );
        }
        assert!(
            report["callbacks"]["roots"].as_u64().unwrap() >= 1,
            "{who} was asked for its roots: {report:#}"
        );
    }
    if mode == "pooled" {
        assert!(
            metric(
                &gw,
                "mrtr_gateway_roots_refreshes_total",
                &[("outcome", "reasked")]
            ) >= 2.0,
            "bob's and carol's requests reused a session and made the server ask again"
        );
    }
    running.stop().await;
    everything.kill().await;
}

/// The refresh's `roots/list` is the request's own question: on the retry it is answered from
/// the answers the client gave, and the call then runs on the reused session.
#[tokio::test]
async fn a_retry_on_a_reused_session_answers_the_refresh_from_the_client_answers() {
    let everything = EverythingServer::start().await;
    let (gw, running, url) = start_gateway(config(
        &everything.url(),
        "",
        "",
        "[pool]\nroots_refresh_wait = \"10s\"\n",
    ))
    .await;
    let c = roots_client(&url);
    // Two sessions asked for roots, both back in the pool: the first call's session stays
    // parked (its round unanswered) while the second opens its own.
    let call = json!({"name": "get-roots-list", "arguments": {}});
    let first = c.request("tools/call", call.clone()).await.unwrap();
    let second = c.request("tools/call", call.clone()).await.unwrap();
    for ex in [first, second] {
        assert_eq!(ex.result_type(), Some("input_required"), "{:?}", ex.message);
        let mut answer = roots_answer("file:///srv/alice");
        let r = ex.result().unwrap();
        let mut responses = serde_json::Map::new();
        for (key, req) in r["inputRequests"].as_object().unwrap() {
            responses.insert(key.clone(), answer(key, req).unwrap());
        }
        let mut retry = call.as_object().unwrap().clone();
        retry.insert("inputResponses".into(), Value::Object(responses));
        retry.insert("requestState".into(), r["requestState"].clone());
        let (_, done) = c
            .call_with_input("tools/call", Value::Object(retry), &mut answer, 8)
            .await
            .unwrap();
        assert!(text(done.result().unwrap()).contains("/srv/alice"));
    }
    assert!(metric_reaches(&gw, "mrtr_gateway_pool_idle_sessions", &[], 2.0, WAIT).await);

    // Bob: his first round is the reused session's roots/list (that session is closed); his
    // retry takes the other warm session, whose roots/list is answered from his answers
    // before the call is sent.
    let hits = metric(
        &gw,
        "mrtr_gateway_pool_checkouts_total",
        &[("result", "hit")],
    );
    let mut answer = roots_answer("file:///srv/bob");
    let (rounds, done) = c
        .call_with_input("tools/call", call.clone(), &mut answer, 8)
        .await
        .unwrap();
    let text = text(done.result().unwrap());
    assert!(
        text.contains("/srv/bob") && !text.contains("alice"),
        "{text}"
    );
    assert_eq!(rounds.len(), 1, "one round: the reused session's question");
    assert_metric!(
        &gw,
        "pool_checkouts_total",
        &[("result", "hit")],
        hits + 2.0,
        "both of bob's attempts ran on warm sessions"
    );
    assert_metric!(&gw, "roots_refreshes_total", &[("outcome", "reasked")], 2.0);
    running.stop().await;
    everything.kill().await;
}

/// FastMCP 1.x asks for roots inside each tool and ignores `notifications/roots/list_changed`:
/// its reused sessions are waited for `pool.roots_refresh_probes` times, then never again.
/// Every caller still sees its own roots.
#[tokio::test]
async fn a_server_that_never_reasks_is_learned_and_no_longer_waited_for() {
    let py = PyLegacyServer::start(&[]).await;
    let (gw, running, url) = start_gateway(config(
        &py.url(),
        "",
        "",
        "[pool]\nroots_refresh_wait = \"300ms\"\nroots_refresh_probes = 2\n",
    ))
    .await;
    let c = roots_client(&url);
    for who in ["alice", "bob", "carol", "dave", "erin"] {
        let root = format!("file:///srv/{who}");
        assert_eq!(call_with_roots(&c, "list_my_roots", &root).await, root);
    }
    let refreshes = |outcome| {
        metric(
            &gw,
            "mrtr_gateway_roots_refreshes_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(refreshes("reasked"), 0.0);
    assert_eq!(refreshes("timeout"), 2.0, "waited for twice");
    assert_eq!(refreshes("not_waited"), 2.0, "then learned");

    // A reload that leaves [upstream] as it was keeps what was learned: no new waits.
    gw.apply_config(gw.config().as_ref().clone()).unwrap();
    assert_eq!(
        call_with_roots(&c, "list_my_roots", "file:///srv/fay").await,
        "file:///srv/fay"
    );
    assert_eq!(refreshes("timeout"), 2.0, "not re-learned");
    assert_eq!(refreshes("not_waited"), 3.0);

    // One that changes it starts over (another server, or an upgraded one): the pool is
    // emptied (in the background), so at the latest the second call reuses a session of the
    // new upstream and is waited for again.
    let mut changed = gw.config().as_ref().clone();
    changed.upstream.response_timeout += std::time::Duration::from_secs(1);
    gw.apply_config(changed).unwrap();
    for who in ["gus", "hal"] {
        let root = format!("file:///srv/{who}");
        assert_eq!(call_with_roots(&c, "list_my_roots", &root).await, root);
    }
    assert!(refreshes("timeout") >= 3.0, "waited for again");
    running.stop().await;
    py.kill().await;
}

// ----- 2. lists on a session declaring the request's capabilities --------------------------

/// The reference server registers its elicitation, sampling and roots tools only on sessions
/// that declared those capabilities. A Python 2026-07-28 client declaring all three sees
/// through the gateway exactly the tools a Python legacy client declaring them sees directly;
/// one declaring none sees fewer (and the two do not share a session).
#[tokio::test]
async fn tools_list_shows_what_a_legacy_client_declaring_the_same_sees() {
    let everything = EverythingServer::start().await;
    let (_gw, running, url) = start_gateway(config(&everything.url(), "", "", "")).await;
    let names = |v: &Value| -> Vec<String> {
        let mut n: Vec<String> = v["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{v:#}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    };
    let direct = legacy_client(&everything.url(), &["--list-tools"]).await;
    assert_eq!(direct["ok"], true, "{direct:#}");
    let direct = names(&direct["result"]);
    assert!(direct.iter().any(|n| n == "get-roots-list"), "{direct:?}");

    let all = modern_scenario(&url, "list_tools", &[]).await;
    assert_eq!(all["ok"], true, "{all:#}");
    assert_eq!(names(&all["result"]), direct);

    let none = modern_scenario(&url, "list_tools", &["--capabilities", "none"]).await;
    assert_eq!(none["ok"], true, "{none:#}");
    let none = names(&none["result"]);
    for gated in [
        "get-roots-list",
        "trigger-elicitation-request",
        "trigger-sampling-request",
    ] {
        assert!(!none.contains(&gated.to_string()), "{gated} in {none:?}");
    }
    assert!(none.len() < direct.len());
    running.stop().await;
    everything.kill().await;
}

// ----- 3. discover, serverInfo, routing and cacheScope per caller --------------------------

fn tool_handlers() -> Handlers {
    Handlers::new().tool("t", "", json!({"type": "object"}), |_, _| async move {
        Ok(tool_text("ok"))
    })
}

/// A legacy server that answers `initialize` per token: alice gets tools and her
/// instructions, bob no tools and his, a session without a known token the server-wide view.
async fn per_token_server() -> LegacyServer {
    let config = LegacyServerConfig {
        instructions: Some("instructions for nobody in particular".into()),
        credentials_optional: true,
        credentials: vec![
            CredentialView {
                authorization: "Bearer alice-token".into(),
                instructions: Some("instructions for alice".into()),
                capabilities: Some(json!({"tools": {"listChanged": true}})),
            },
            CredentialView {
                authorization: "Bearer bob-token".into(),
                instructions: Some("instructions for bob".into()),
                capabilities: Some(json!({"prompts": {}})),
            },
        ],
        ..Default::default()
    };
    LegacyServer::start(config, tool_handlers()).await.unwrap()
}

fn with_header(url: &str, pairs: &[(&'static str, &str)]) -> ModernClient {
    let mut c = ModernClient::new(url);
    for (name, value) in pairs {
        c.headers
            .insert(*name, HeaderValue::from_str(value).unwrap());
    }
    c
}

/// A gateway in front of `legacy` that forwards each caller's own token, and two callers:
/// alice and bob, with bearer tokens `alice-token` and `bob-token`. The caller keeps the
/// gateway handle for the whole test: dropping the last one starts the gateway's drain, and a
/// draining gateway turns listen streams away.
async fn forwarding_gateway(
    legacy: &LegacyServer,
) -> (Arc<Gateway>, Running, ModernClient, ModernClient) {
    let extra = "[auth]\nupstream_credentials = \"forward\"\n";
    let (gw, running, url) = start_gateway(config(&legacy.url(), "", "", extra)).await;
    let alice = with_header(&url, &[("authorization", "Bearer alice-token")]);
    let bob = with_header(&url, &[("authorization", "Bearer bob-token")]);
    (gw, running, alice, bob)
}

async fn discover(c: &ModernClient) -> Value {
    let d = c.request("server/discover", json!({})).await.unwrap();
    d.result()
        .unwrap_or_else(|| panic!("discover: {:?}", d.message))
        .clone()
}

/// Two callers forwarding two tokens: each discover shows the caller's own server view, marked
/// private; bob, whose view has no tools, gets 404 for tools/list, and that changes nothing for
/// alice (today: a gateway-wide cache, refreshed by whichever session opened last, and the
/// discover session is opened without any token at all).
#[tokio::test]
async fn discover_and_routing_follow_the_callers_own_forwarded_token() {
    let legacy = per_token_server().await;
    let (_gw, running, alice, bob) = forwarding_gateway(&legacy).await;
    check_per_caller_views(&alice, &bob).await;
    running.stop().await;
    legacy.shutdown().await;
}

/// The same with two authenticated principals (a trusted proxy's header), each forwarding its
/// own token.
#[tokio::test]
async fn discover_and_routing_follow_the_callers_principal() {
    let legacy = per_token_server().await;
    let (_gw, running, url) = start_gateway(config(
        &legacy.url(),
        "",
        "",
        "[auth]\nmode = \"header\"\nupstream_credentials = \"forward\"\n",
    ))
    .await;
    let alice = with_header(
        &url,
        &[
            ("x-authenticated-user", "alice"),
            ("authorization", "Bearer alice-token"),
        ],
    );
    let bob = with_header(
        &url,
        &[
            ("x-authenticated-user", "bob"),
            ("authorization", "Bearer bob-token"),
        ],
    );
    check_per_caller_views(&alice, &bob).await;
    running.stop().await;
    legacy.shutdown().await;
}

async fn check_per_caller_views(alice: &ModernClient, bob: &ModernClient) {
    // Bob first: his view (no tools) must not become anyone else's.
    let b = discover(bob).await;
    assert_eq!(b["instructions"], "instructions for bob");
    assert!(b["capabilities"].get("tools").is_none(), "{b:#}");
    assert_eq!(b["cacheScope"], "private");
    let list = bob.request("tools/list", json!({})).await.unwrap();
    assert_eq!(list.status.as_u16(), 404, "{:?}", list.message);
    assert_eq!(list.error_code(), Some(-32601));

    let a = discover(alice).await;
    assert_eq!(a["instructions"], "instructions for alice");
    assert!(a["capabilities"]["tools"].is_object(), "{a:#}");
    assert_eq!(a["cacheScope"], "private");
    let list = alice.request("tools/list", json!({})).await.unwrap();
    let r = list
        .result()
        .unwrap_or_else(|| panic!("alice's tools/list: {:?}", list.message));
    assert_eq!(r["tools"][0]["name"], "t");
    assert_eq!(r["cacheScope"], "private");
    let call = call_tool(alice, "t").await;
    assert_eq!(text(call.result().unwrap()), "ok");

    // And bob's view is still his own.
    assert_eq!(discover(bob).await["instructions"], "instructions for bob");
    let call = call_tool(bob, "t").await;
    assert_eq!(call.status.as_u16(), 404, "{:?}", call.message);
}

/// Where every caller gets the same answer (no client authentication, a static upstream
/// token), the configured scope stands.
#[tokio::test]
async fn discover_keeps_the_configured_scope_when_callers_cannot_differ() {
    let legacy = LegacyServer::start(LegacyServerConfig::default(), tool_handlers())
        .await
        .unwrap();
    let (_gw, running, url) = start_gateway(config(&legacy.url(), "", "", "")).await;
    let d = discover(&ModernClient::new(&url)).await;
    assert_eq!(d["cacheScope"], "public");
    running.stop().await;
    legacy.shutdown().await;
}

// ----- 4. notifications relayed to the listen streams of their caller only -----------------

/// A legacy server announcing tool and resource list changes, with [`notifying_handlers`].
async fn notifying_server() -> LegacyServer {
    LegacyServer::start(
        LegacyServerConfig {
            capabilities: Some(json!({"tools": {"listChanged": true},
                                      "resources": {"listChanged": true}})),
            ..Default::default()
        },
        notifying_handlers(),
    )
    .await
    .unwrap()
}

fn notifying_handlers() -> Handlers {
    Handlers::new().tool(
        "change",
        "",
        json!({"type": "object"}),
        |ctx, _| async move {
            // During the call, and after it (when its session idles in the pool).
            ctx.notify("notifications/tools/list_changed", json!({}));
            let late = ctx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                late.notify_get_stream("notifications/resources/list_changed", json!({}));
            });
            Ok(tool_text("changed"))
        },
    )
}

async fn listen(c: &ModernClient) -> EventStream {
    let mut s = c
        .open_stream(
            "subscriptions/listen",
            json!({"notifications": {"toolsListChanged": true, "resourcesListChanged": true}}),
        )
        .await
        .unwrap();
    assert_eq!(s.status.as_u16(), 200);
    let first = s.next_within(WAIT).await.unwrap().expect("acknowledged");
    assert_eq!(first["method"], ACK, "{first}");
    s
}

async fn quiet(s: &mut EventStream) -> bool {
    matches!(
        s.next_within(Duration::from_millis(500)).await,
        Err(ClientError::Timeout)
    )
}

async fn only_the_caller_hears(alice: &ModernClient, bob: &ModernClient) {
    let mut a = listen(alice).await;
    let mut b = listen(bob).await;
    let r = call_tool(alice, "change").await;
    assert_eq!(text(r.result().unwrap()), "changed");
    for method in [
        "notifications/tools/list_changed",
        "notifications/resources/list_changed",
    ] {
        let n = a.next_within(WAIT).await.unwrap().expect("a notification");
        assert_eq!(n["method"], method, "{n}");
    }
    assert!(quiet(&mut b).await, "bob's stream heard alice's session");
}

/// Alice's call session announces a change during the call and after it; alice's listen
/// stream gets both, bob's (another principal) neither.
#[tokio::test]
async fn a_change_heard_on_one_principals_session_reaches_only_that_principals_streams() {
    let legacy = notifying_server().await;
    let (_gw, running, url) =
        start_gateway(config(&legacy.url(), "", "", "[auth]\nmode = \"header\"\n")).await;
    let alice = with_header(&url, &[("x-authenticated-user", "alice")]);
    let bob = with_header(&url, &[("x-authenticated-user", "bob")]);
    only_the_caller_hears(&alice, &bob).await;
    running.stop().await;
    legacy.shutdown().await;
}

/// The same for one principal forwarding two credentials: the credential is part of the scope.
#[tokio::test]
async fn a_change_heard_under_one_forwarded_token_stays_with_that_token() {
    let legacy = notifying_server().await;
    let (_gw, running, alice, bob) = forwarding_gateway(&legacy).await;
    only_the_caller_hears(&alice, &bob).await;
    running.stop().await;
    legacy.shutdown().await;
}

// ----- 5. the configured upstream credential on every session ------------------------------

/// A legacy server that refuses any request without its token.
async fn token_requiring_server() -> LegacyServer {
    let handlers =
        tool_handlers().tool("ask", "", json!({"type": "object"}), |ctx, _| async move {
            let a = ctx.elicit_form("name?", form("name")).await?;
            Ok(tool_text(format!(
                "hi {}",
                a["content"]["name"].as_str().unwrap_or("?")
            )))
        });
    LegacyServer::start(
        LegacyServerConfig {
            credentials: vec![CredentialView {
                authorization: "Bearer service-token".into(),
                instructions: Some("for the service".into()),
                capabilities: Some(json!({"tools": {"listChanged": true}})),
            }],
            ..Default::default()
        },
        handlers,
    )
    .await
    .unwrap()
}

/// `[auth]` with the static token in a file (kept alive by the returned directory).
fn static_token_auth() -> (crate::support::peers::tempdir::TempDir, String) {
    let dir = crate::support::peers::tempdir::TempDir::new("mrtr-token");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "service-token\n").unwrap();
    let auth = format!(
        "[auth]\nupstream_credentials = \"static\"\nupstream_token_file = \"{}\"\n",
        token_file.display()
    );
    (dir, auth)
}

/// A gateway configured with the server's token (`static`): discover, lists, calls (and their
/// retries) and listen all open their sessions with it. (Today the discover session, opened
/// before any routed request, goes without it: every request fails with 502.)
#[tokio::test]
async fn every_kind_of_session_carries_the_static_token() {
    let legacy = token_requiring_server().await;
    let (_dir, auth) = static_token_auth();
    let (_gw, running, url) = start_gateway(config(&legacy.url(), "", "", &auth)).await;
    let c = ModernClient::new(&url).with_capabilities(json!({}));
    // Discover.
    assert_eq!(discover(&c).await["instructions"], "for the service");
    // Lists.
    let list = c.request("tools/list", json!({})).await.unwrap();
    assert!(list.result().is_some(), "{:?}", list.message);
    // A call over two rounds (its retry takes a session too).
    let asker = ModernClient::new(&url);
    let (rounds, done) = asker
        .call_with_input(
            "tools/call",
            json!({"name": "ask", "arguments": {}}),
            &mut answer,
            4,
        )
        .await
        .unwrap();
    assert_eq!(rounds.len(), 1);
    assert_eq!(text(done.result().unwrap()), "hi name-answer");
    // Listen.
    let mut s = c
        .open_stream(
            "subscriptions/listen",
            json!({"notifications": {"toolsListChanged": true}}),
        )
        .await
        .unwrap();
    let ack = s.next_within(WAIT).await.unwrap().expect("acknowledged");
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true})
    );
    drop(s);
    assert_eq!(
        legacy.stats().http_errors(401),
        0,
        "no request went without the token"
    );
    running.stop().await;
    legacy.shutdown().await;
}

/// Warm-up sessions carry the token too, and the first request is served by one.
#[tokio::test]
async fn warm_up_sessions_carry_the_static_token() {
    let legacy = token_requiring_server().await;
    let (_dir, auth) = static_token_auth();
    let (gw, running, url) = start_gateway(config(
        &legacy.url(),
        "",
        "",
        &format!("{auth}[pool]\nwarm_up = 1\n"),
    ))
    .await;
    assert!(
        metric_reaches(&gw, "mrtr_gateway_pool_idle_sessions", &[], 1.0, WAIT).await,
        "the warm-up session opened"
    );
    let c = ModernClient::new(&url).with_capabilities(json!({}));
    let r = call_tool(&c, "t").await;
    assert_eq!(text(r.result().unwrap()), "ok");
    assert_metric!(
        &gw,
        "pool_checkouts_total",
        &[("result", "hit")],
        1.0,
        "served by the warm session"
    );
    assert_eq!(legacy.stats().http_errors(401), 0);
    running.stop().await;
    legacy.shutdown().await;
}
