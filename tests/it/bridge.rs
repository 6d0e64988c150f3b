//! The MRTR bridge against the scripted in-repo legacy server: capture, replay, rounds,
//! id spaces, streams, limits and the legacy transport's corner cases.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::support::*;
use mrtr_testkit::legacy_server::{
    Handlers, LegacyServerConfig, MessageKind, RpcError, ServerRequestIds, SseFraming,
};
use serde_json::{Value, json};

#[tokio::test]
async fn one_elicitation_round_then_complete() {
    let env = env(greet_handlers()).await;
    let (rounds, last) = greet_flow(&env.client(), 8).await;
    assert_eq!(rounds.len(), 1);
    let r1 = &rounds[0];
    assert_eq!(r1.input_requests.len(), 1);
    let (key, req) = r1.input_requests.iter().next().unwrap();
    assert!(key.starts_with("elicit-"), "{key}");
    assert_eq!(req["method"], "elicitation/create");
    assert_eq!(req["params"]["mode"], "form");
    assert!(req.get("jsonrpc").is_none() && req.get("id").is_none());
    assert!(
        r1.exchange.result().unwrap().get("ttlMs").is_none(),
        "interim results carry no cache hints"
    );
    assert_eq!(last.result_type(), Some("complete"));
    assert_eq!(text(last.result().unwrap()), "Hello, name-answer!");
    let info = &last.result().unwrap()["_meta"]["io.modelcontextprotocol/serverInfo"];
    assert_eq!(info["name"], "legacy-mcp-server");
    // Parked by default and resumed on this replica: the tool body ran once.
    assert_eq!(env.legacy.stats().tool_starts("greet"), 1);
    assert_eq!(
        metric(&env.gw, "mrtr_gateway_retries_total", &[("path", "parked")]),
        1.0
    );
    assert_eq!(metric(&env.gw, "mrtr_gateway_parked_calls", &[]), 0.0);
    env.stop().await;
}

/// A legacy server that pings its client mid-call gets `{}` from the gateway at once; the
/// call goes on and ends without a round for the client.
#[tokio::test]
async fn a_ping_from_the_legacy_server_mid_call_is_answered_and_the_call_completes() {
    let handlers = Handlers::new().tool(
        "pinger",
        "pings its client",
        json!({"type": "object"}),
        |ctx, _| async move {
            let pong = ctx.ping().await?;
            Ok(tool_text(format!("pong: {pong}")))
        },
    );
    let env = env(handlers).await;
    let (rounds, last) = env
        .client()
        .call_with_input(
            "tools/call",
            json!({"name": "pinger", "arguments": {}}),
            &mut answer,
            2,
        )
        .await
        .expect("the call runs");
    assert!(rounds.is_empty(), "a ping is never the client's question");
    assert_eq!(last.result_type(), Some("complete"));
    assert_eq!(text(last.result().unwrap()), "pong: {}");
    env.stop().await;
}

const REPLAY: &str = "[parking]\ndefault_policy = \"replay\"\n";

#[tokio::test]
async fn without_parking_every_round_replays_the_tool() {
    let env = env_with(LegacyServerConfig::default(), greet_handlers(), "", REPLAY).await;
    let (rounds, last) = greet_flow(&env.client(), 8).await;
    assert_eq!(rounds.len(), 1);
    assert_eq!(text(last.result().unwrap()), "Hello, name-answer!");
    assert_eq!(env.legacy.stats().tool_starts("greet"), 2);
    assert_metric!(&env.gw, "retries_total", &[("path", "replayed")], 1.0);
    env.stop().await;
}

#[tokio::test]
async fn an_abandoned_calls_answer_does_not_wait_for_its_get_streams_end() {
    // Without parking, a round's answer follows the legacy call's cancel and its session's
    // DELETE. The session's GET stream is then given a moment in the background to end (so
    // its connection can be reused); a server that keeps it open must not hold the answer
    // for that moment. Its connection is closed mid-response only once the moment is over,
    // after the answer.
    let env = env_with(
        LegacyServerConfig {
            get_stream_outlives_delete: true,
            ..LegacyServerConfig::default()
        },
        greet_handlers(),
        "",
        REPLAY,
    )
    .await;
    let unfinished = |env: &Env| upstream_connections(&env.gw).1;
    let before = unfinished(&env);
    let first = call_tool(&env.client(), "greet").await;
    assert_eq!(first.result_type(), Some("input_required"));
    assert_eq!(
        unfinished(&env),
        before,
        "the answer came while the GET stream's reader still waited"
    );
    assert!(
        eventually(Duration::from_secs(5), || unfinished(&env) > before).await,
        "the GET stream's connection was closed after the wait"
    );
    env.stop().await;
}

#[tokio::test]
async fn the_legacy_call_is_cancelled_and_its_session_deleted_when_input_is_required() {
    let env = env_with(LegacyServerConfig::default(), greet_handlers(), "", REPLAY).await;
    let first = call_tool(&env.client(), "greet").await;
    assert_eq!(first.result_type(), Some("input_required"));
    let stats = env.legacy.stats_handle();
    assert!(
        stats
            .wait_until(
                |s| !s.cancellations().is_empty() && s.sessions_live() == 0,
                Duration::from_secs(3)
            )
            .await,
        "cancellations {:?}, live sessions {}",
        stats.cancellations(),
        stats.sessions_live()
    );
    let cancelled = stats.received_with_method("notifications/cancelled");
    let call = stats.received_with_method("tools/call");
    assert_eq!(
        cancelled[0].raw["params"]["requestId"],
        call[0].id.clone().unwrap()
    );
    assert_eq!(
        metric(&env.gw, "mrtr_gateway_legacy_sessions_active", &[]),
        0.0
    );
    env.stop().await;
}

#[tokio::test]
async fn server_request_ids_are_their_own_id_space() {
    // The server's first request reuses the gateway's call id: the gateway must not take the
    // server's request for the call's response, nor answer it as anything but a request.
    let cfg = LegacyServerConfig {
        server_request_ids: ServerRequestIds::MirrorCallId { start: 1 },
        ..Default::default()
    };
    let env = env_with(cfg, greet_handlers(), "", "").await;
    let (rounds, last) = greet_flow(&env.client(), 8).await;
    assert_eq!(rounds.len(), 1);
    assert_eq!(text(last.result().unwrap()), "Hello, name-answer!");
    let stats = env.legacy.stats();
    let calls = stats.received_with_method("tools/call");
    let sent = stats.sent_requests();
    let last_call_id = calls.last().unwrap().id.clone().unwrap();
    assert!(
        sent.iter()
            .any(|s| s.id == last_call_id && s.method == "elicitation/create"),
        "the collision was not exercised: calls {calls:?}, sent {sent:?}"
    );
    env.stop().await;
}

#[tokio::test]
async fn requests_on_the_get_stream_are_captured_and_answered() {
    let h = Handlers::new().tool(
        "roots",
        "lists roots",
        json!({"type": "object"}),
        |ctx, _| async move {
            let r = ctx.list_roots().await?;
            Ok(tool_text(
                r["roots"][0]["uri"].as_str().unwrap_or("none").to_string(),
            ))
        },
    );
    let env = env(h).await;
    let (rounds, last) = env
        .client()
        .call_with_input(
            "tools/call",
            json!({"name": "roots", "arguments": {}}),
            &mut answer,
            4,
        )
        .await
        .unwrap();
    assert_eq!(rounds.len(), 1);
    assert_eq!(
        rounds[0].input_requests.values().next().unwrap(),
        &json!({"method": "roots/list"})
    );
    assert_eq!(text(last.result().unwrap()), "file:///work/project");
    assert!(
        env.legacy
            .stats()
            .sent_requests()
            .iter()
            .all(|s| s.on_get_stream)
    );
    env.stop().await;
}

fn parallel_handlers() -> Handlers {
    Handlers::new().tool("three", "asks three things at once", json!({"type": "object"}), |ctx, _| async move {
        let (a, b, c) = tokio::join!(
            ctx.elicit_form("Name?", form("name")),
            ctx.create_message(json!({"messages": [{"role": "user", "content": {"type": "text", "text": "Pick"}}], "maxTokens": 5})),
            ctx.list_roots(),
        );
        let (a, b, c) = (a?, b?, c?);
        Ok(tool_text(format!(
            "{}|{}|{}",
            a["content"]["name"].as_str().unwrap_or("?"),
            b["content"]["text"].as_str().unwrap_or("?"),
            c["roots"][0]["uri"].as_str().unwrap_or("?")
        )))
    })
}

#[tokio::test]
async fn three_parallel_requests_come_back_in_one_round() {
    let env = env(parallel_handlers()).await;
    let (rounds, last) = env
        .client()
        .call_with_input(
            "tools/call",
            json!({"name": "three", "arguments": {}}),
            &mut answer,
            4,
        )
        .await
        .unwrap();
    assert_eq!(rounds.len(), 1, "all three questions in one round");
    let methods: Vec<&str> = rounds[0]
        .input_requests
        .values()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    assert_eq!(methods.len(), 3);
    for m in ["elicitation/create", "sampling/createMessage", "roots/list"] {
        assert!(methods.contains(&m), "{methods:?}");
    }
    assert_eq!(
        text(last.result().unwrap()),
        "name-answer|sampled|file:///work/project"
    );
    assert_eq!(
        env.legacy.stats().tool_starts("three"),
        1,
        "resumed from the parking lot"
    );
    env.stop().await;
}

#[tokio::test]
async fn a_server_that_asks_something_new_every_time_ends_at_max_rounds() {
    let counter = Arc::new(AtomicU64::new(0));
    let c = counter.clone();
    let h = Handlers::new().tool(
        "restless",
        "never converges",
        json!({"type": "object"}),
        move |ctx, _| {
            let n = c.fetch_add(1, Ordering::SeqCst);
            async move {
                // A timestamp-like value makes every execution's question new.
                ctx.elicit_form(&format!("Question asked at tick {n}"), form("x"))
                    .await?;
                Ok(tool_text("unreachable"))
            }
        },
    );
    let env = env_with(LegacyServerConfig::default(), h, "max_rounds = 3", REPLAY).await;
    let (rounds, last) = env
        .client()
        .call_with_input(
            "tools/call",
            json!({"name": "restless", "arguments": {}}),
            &mut answer,
            10,
        )
        .await
        .unwrap();
    assert_eq!(rounds.len(), 3);
    assert_eq!(last.error_code(), Some(-32603));
    let msg = last.error().unwrap()["message"].as_str().unwrap();
    assert!(
        msg.contains("tool \"restless\"") && msg.contains("state.max_rounds"),
        "{msg}"
    );
    assert_metric!(
        &env.gw,
        "max_rounds_exceeded_total",
        &[("method", "tools/call")],
        1.0
    );
    env.stop().await;
}

#[tokio::test]
async fn json_only_legacy_responses_work_for_plain_calls_and_lists() {
    let cfg = LegacyServerConfig {
        json_response: true,
        ..Default::default()
    };
    let h = Handlers::new().tool(
        "add",
        "adds",
        json!({"type": "object"}),
        |_, a| async move {
            Ok(tool_text(
                (a["a"].as_i64().unwrap_or(0) + a["b"].as_i64().unwrap_or(0)).to_string(),
            ))
        },
    );
    let env = env_with(cfg, h, "", "").await;
    let c = env.client();
    let r = c
        .request(
            "tools/call",
            json!({"name": "add", "arguments": {"a": 2, "b": 3}}),
        )
        .await
        .unwrap();
    assert_eq!(text(r.result().unwrap()), "5");
    assert_eq!(r.result_type(), Some("complete"));
    let l = c.request("tools/list", json!({})).await.unwrap();
    assert_eq!(l.result().unwrap()["tools"][0]["name"], "add");
    assert_eq!(l.result().unwrap()["cacheScope"], "private");
    assert_eq!(l.result().unwrap()["ttlMs"], 60000);
    env.stop().await;
}

#[tokio::test]
async fn a_session_lost_before_the_call_is_reinitialized_once() {
    let h = Handlers::new().tool(
        "add",
        "adds",
        json!({"type": "object"}),
        |_, _| async move { Ok(tool_text("ok")) },
    );
    let env = env(h).await;
    let c = env.client();
    let inits_before = env.legacy.stats().count_method("initialize");
    env.legacy.faults().expire_session_before("tools/call");
    let r = call_tool(&c, "add").await;
    assert_eq!(text(r.result().unwrap()), "ok", "{:?}", r.message);
    let stats = env.legacy.stats();
    assert_eq!(
        stats.count_method("initialize") - inits_before,
        2,
        "the call's session, then one fresh initialize after the 404"
    );
    assert_eq!(stats.count_method("tools/call"), 2);
    assert_eq!(stats.http_errors(404), 1);
    env.stop().await;
}

#[tokio::test]
async fn both_sse_framings_are_understood() {
    for framing in [SseFraming::Python, SseFraming::TypeScript] {
        let cfg = LegacyServerConfig {
            framing,
            ..Default::default()
        };
        let env = env_with(cfg, greet_handlers(), "", "").await;
        let (rounds, last) = greet_flow(&env.client(), 8).await;
        assert_eq!(rounds.len(), 1, "{framing:?}");
        assert_eq!(
            text(last.result().unwrap()),
            "Hello, name-answer!",
            "{framing:?}"
        );
        env.stop().await;
    }
}

#[tokio::test]
async fn an_unanswered_question_is_asked_again() {
    let env = env(greet_handlers()).await;
    let c = env.client();
    let first = call_tool(&c, "greet").await;
    let state = first.result().unwrap()["requestState"]
        .as_str()
        .unwrap()
        .to_string();
    let key = input_key(first.result().unwrap());
    // The retry carries the state but no answer (and an unrelated extra key, which is ignored).
    let again = c
        .request(
            "tools/call",
            json!({"name": "greet", "arguments": {}, "requestState": state, "inputResponses": {"unrelated": {"x": 1}}}),
        )
        .await
        .unwrap();
    assert_eq!(again.result_type(), Some("input_required"));
    assert!(again.result().unwrap()["inputRequests"].get(&key).is_some());
    env.stop().await;
}

#[tokio::test]
async fn an_invalid_answer_is_refused_naming_its_key_before_anything_reaches_the_server() {
    let env = env(greet_handlers()).await;
    let c = env.client();
    let first = call_tool(&c, "greet").await;
    let res = first.result().unwrap();
    let key = input_key(res);
    let state = res["requestState"].clone();
    env.legacy
        .stats()
        .wait_until(|s| s.sessions_live() == 0, Duration::from_secs(2))
        .await;
    let before = env.legacy.stats().messages_received();
    let bad = c
        .request(
            "tools/call",
            json!({"name": "greet", "arguments": {}, "requestState": state,
                   "inputResponses": {key.clone(): {"action": "perhaps"}}}),
        )
        .await
        .unwrap();
    assert_eq!(bad.status, 400);
    assert_eq!(bad.error_code(), Some(-32602));
    assert!(
        bad.error().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains(&key)
    );
    assert_eq!(
        env.legacy.stats().messages_received(),
        before,
        "nothing reached the legacy server"
    );
    env.stop().await;
}

#[tokio::test]
async fn answers_sent_before_they_are_asked_are_used() {
    // The server names its question with the gateway's key hint, so a client can anticipate it.
    let h = Handlers::new().tool(
        "named",
        "asks user_name",
        json!({"type": "object"}),
        |ctx, _| async move {
            let params = json!({"mode": "form", "message": "Name?", "requestedSchema": form("name"),
                            "_meta": {"io.mrtr-gateway/inputKey": "user_name"}});
            let a = ctx.request("elicitation/create", params).await?;
            Ok(tool_text(
                a["content"]["name"].as_str().unwrap_or("?").to_string(),
            ))
        },
    );
    let env = env(h).await;
    let c = env.client();
    let r1 = call_tool(&c, "named").await;
    let keys: Vec<&String> = r1.result().unwrap()["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(keys, vec!["user_name"]);
    assert!(
        r1.result().unwrap()["inputRequests"]["user_name"]["params"]
            .get("_meta")
            .is_none()
    );
    let direct = c
        .request(
            "tools/call",
            json!({"name": "named", "arguments": {},
                   "inputResponses": {"user_name": {"action": "accept", "content": {"name": "octocat"}}}}),
        )
        .await
        .unwrap();
    assert_eq!(direct.result_type(), Some("complete"));
    assert_eq!(text(direct.result().unwrap()), "octocat");
    env.stop().await;
}

#[tokio::test]
async fn a_question_the_client_cannot_answer_is_a_missing_capability() {
    let env = env(greet_handlers()).await;
    let c = env.client().with_capabilities(json!({"sampling": {}}));
    let r = call_tool(&c, "greet").await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error_code(), Some(-32021));
    assert_eq!(
        r.error().unwrap()["data"]["requiredCapabilities"],
        json!({"elicitation": {"form": {}}})
    );
    // The legacy session declared exactly what the request declared.
    let init = env.legacy.stats().received_with_method("initialize");
    assert_eq!(
        init.last().unwrap().raw["params"]["capabilities"],
        json!({"sampling": {}})
    );
    env.stop().await;
}

#[tokio::test]
async fn progress_streams_over_sse_and_logs_follow_the_requested_level() {
    let h = Handlers::new()
        .tool(
            "slow",
            "reports progress",
            json!({"type": "object"}),
            |ctx, _| async move {
                for i in 1..=3 {
                    ctx.progress(i as f64, Some(3.0), Some("step"));
                }
                Ok(tool_text("done"))
            },
        )
        .tool(
            "chatty",
            "logs",
            json!({"type": "object"}),
            |ctx, _| async move {
                for level in ["debug", "info", "warning", "error"] {
                    ctx.log(level, json!(format!("{level} line")));
                }
                Ok(tool_text("logged"))
            },
        );
    let env = env(h).await;
    let c = env.client();
    let r = c
        .request(
            "tools/call",
            json!({"name": "slow", "arguments": {}, "_meta": {"progressToken": "p1"}}),
        )
        .await
        .unwrap();
    assert!(r.streamed);
    assert_eq!(r.notifications.len(), 3);
    assert!(
        r.notifications
            .iter()
            .all(|n| n["params"]["progressToken"] == "p1")
    );
    assert_eq!(text(r.result().unwrap()), "done");
    let quiet = call_tool(&c, "slow").await;
    assert!(
        !quiet.streamed,
        "nothing to stream without a progress token"
    );
    let no_logs = call_tool(&c, "chatty").await;
    assert!(no_logs.notifications.is_empty() && !no_logs.streamed);
    let logs = c
        .request(
            "tools/call",
            json!({"name": "chatty", "arguments": {}, "_meta": {"io.modelcontextprotocol/logLevel": "warning"}}),
        )
        .await
        .unwrap();
    let levels: Vec<&str> = logs
        .notifications
        .iter()
        .map(|n| n["params"]["level"].as_str().unwrap())
        .collect();
    assert_eq!(levels, vec!["warning", "error"]);
    env.stop().await;
}

/// A streamed answer ends outside the request's task (its last frame is written as hyper
/// polls the body): its access line still names the request and the call.
/// Runs on the test's single thread, so the thread-local subscriber sees every task.
#[tokio::test(flavor = "current_thread")]
async fn a_streamed_answers_access_line_names_its_request() {
    let (logs, _guard) = crate::support::logs::on_this_thread();
    let h = Handlers::new().tool(
        "stepper",
        "reports progress",
        json!({"type": "object"}),
        |ctx, _| async move {
            ctx.progress(1.0, Some(1.0), Some("step"));
            Ok(tool_text("done"))
        },
    );
    let env = env(h).await;
    let r = env
        .client()
        .request(
            "tools/call",
            json!({"name": "stepper", "arguments": {}, "_meta": {"progressToken": "p1"}}),
        )
        .await
        .unwrap();
    assert!(
        r.streamed,
        "the answer must be streamed for this test to mean anything"
    );
    env.stop().await;
    let access = logs.access_lines("method=\"tools/call\"");
    assert_eq!(access.len(), 1, "{access:#?}");
    assert!(access[0].contains("request{request_id="), "{}", access[0]);
    assert!(
        access[0].contains("call_target=\"stepper\""),
        "{}",
        access[0]
    );
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_legacy_call() {
    let h = Handlers::new().tool(
        "sleepy",
        "waits",
        json!({"type": "object"}),
        |ctx, _| async move {
            ctx.cancelled().await;
            Ok(tool_text("cancelled"))
        },
    );
    let env = env(h).await;
    let mut c = env.client();
    c.timeout = Duration::from_millis(300);
    let r = c
        .request("tools/call", json!({"name": "sleepy", "arguments": {}}))
        .await;
    assert!(r.is_err(), "the client gave up");
    let stats = env.legacy.stats_handle();
    assert_cancelled_upstream(&stats, |_| true).await;
    assert!(
        metric_reaches(
            &env.gw,
            "mrtr_gateway_active_requests",
            &[],
            0.0,
            Duration::from_secs(2)
        )
        .await
    );
    env.stop().await;
}

#[tokio::test]
async fn server_requests_during_non_mrtr_methods_are_refused_upstream() {
    let h = Handlers::new()
        .tool("t", "", json!({"type": "object"}), |_, _| async move {
            Ok(tool_text("x"))
        })
        .method("tools/list", |ctx, _| async move {
            let outcome = ctx.elicit_form("Who?", form("name")).await;
            let note = match outcome {
                Ok(_) => "answered".to_string(),
                Err(e) => format!("refused {}", e.code),
            };
            Ok(json!({"tools": [], "note": note}))
        });
    let env = env(h).await;
    let r = env.client().request("tools/list", json!({})).await.unwrap();
    assert_eq!(r.result_type(), Some("complete"));
    assert_eq!(r.result().unwrap()["note"], "refused -32602");
    let errs: Vec<_> = env
        .legacy
        .stats()
        .responses_received()
        .into_iter()
        .filter(|m| m.kind == MessageKind::ErrorResponse)
        .collect();
    assert_eq!(errs.len(), 1);
    env.stop().await;
}

#[tokio::test]
async fn legacy_resource_not_found_becomes_invalid_params_with_the_uri() {
    let h = Handlers::new().resource_template("file:///{path}", "files", |_, _| async move {
        Err::<Value, _>(RpcError::new(-32002, "Resource not found"))
    });
    let env = env(h).await;
    let r = env
        .client()
        .request("resources/read", json!({"uri": "file:///missing"}))
        .await
        .unwrap();
    assert_eq!(r.error_code(), Some(-32602));
    assert_eq!(r.error().unwrap()["data"]["uri"], "file:///missing");
    env.stop().await;
}

#[tokio::test]
async fn a_2025_06_18_server_gets_legacy_shapes_and_its_elicitations_become_forms() {
    let cfg = LegacyServerConfig {
        protocol_versions: vec!["2025-06-18".into()],
        ..Default::default()
    };
    let env = env_with(cfg, greet_handlers(), "", "").await;
    // The first session of all asks for the configured 2025-11-25 and learns the server's
    // older version; declaring nothing, it has no capability to mis-shape.
    let l0 = env
        .client()
        .with_capabilities(json!({}))
        .request("tools/list", json!({}))
        .await
        .unwrap();
    assert!(l0.result().is_some(), "{:?}", l0.message);
    let (rounds, last) = greet_flow(&env.client(), 8).await;
    assert_eq!(
        rounds[0].input_requests.values().next().unwrap()["params"]["mode"],
        "form"
    );
    assert_eq!(text(last.result().unwrap()), "Hello, name-answer!");
    let stats = env.legacy.stats();
    let init = stats.received_with_method("initialize");
    assert_eq!(
        init.last().unwrap().raw["params"]["capabilities"]["elicitation"],
        json!({})
    );
    let calls = stats.received_with_method("tools/call");
    assert_eq!(
        calls.last().unwrap().protocol_version_header.as_deref(),
        Some("2025-06-18")
    );
    env.stop().await;
}

#[tokio::test]
async fn discover_is_synthesized_from_a_warm_session_and_stamped() {
    let env = env(greet_handlers()).await;
    let c = env.client();
    let d = c.request("server/discover", json!({})).await.unwrap();
    let r = d.result().unwrap();
    assert_eq!(r["resultType"], "complete");
    assert_eq!(r["supportedVersions"], json!(["2026-07-28"]));
    assert!(r["capabilities"]["tools"].is_object());
    assert_eq!(
        r["capabilities"]["tools"]["listChanged"], true,
        "listen streams deliver what the legacy server declares"
    );
    assert_eq!(r["cacheScope"], "public");
    assert_eq!(r["ttlMs"], 300000);
    assert_eq!(
        r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "legacy-mcp-server"
    );
    let inits = env.legacy.stats().count_method("initialize");
    c.request("server/discover", json!({})).await.unwrap();
    assert_eq!(
        env.legacy.stats().count_method("initialize"),
        inits,
        "served from the caller's warm session, no new initialize"
    );
    // A method the legacy server does not offer is not found.
    let p = c.request("prompts/list", json!({})).await.unwrap();
    assert_eq!((p.status.as_u16(), p.error_code()), (404, Some(-32601)));
    env.stop().await;
}

fn url_handlers() -> Handlers {
    let runs = Arc::new(AtomicU64::new(0));
    Handlers::new()
        .tool("link", "asks the user to visit a URL", json!({"type": "object"}), |ctx, _| async move {
            let a = ctx
                .elicit_url("Authorize the app", "https://auth.example/start?x=1", "eid-123")
                .await?;
            Ok(tool_text(format!("link: {}", a["action"].as_str().unwrap_or("?"))))
        })
        .tool("needs_url", "fails with -32042 until the URL step was done", json!({"type": "object"}), move |_, _| {
            let n = runs.fetch_add(1, Ordering::SeqCst);
            async move {
                // Every other execution needs the URL step (the first, the third, ...).
                if n.is_multiple_of(2) {
                    return Err(RpcError::new(-32042, "URL elicitation required").with_data(json!({
                        "elicitations": [{"mode": "url", "elicitationId": "eid-9", "url": "https://pay.example/3ds", "message": "Confirm the payment"}]
                    })));
                }
                Ok(tool_text("paid"))
            }
        })
        .tool("sample_tools", "sampling with tools", json!({"type": "object"}), |ctx, _| async move {
            let r = ctx
                .create_message(json!({"messages": [{"role": "user", "content": {"type": "text", "text": "weather?"}}],
                    "maxTokens": 5, "tools": [{"name": "get_weather", "inputSchema": {"type": "object"}}], "toolChoice": {"mode": "auto"}}))
                .await?;
            Ok(tool_text(r["content"]["text"].as_str().unwrap_or("?").to_string()))
        })
}

fn url_answer(_key: &str, req: &Value) -> Result<Value, String> {
    if req["params"]["mode"] == "url" {
        return Ok(json!({"action": "accept"}));
    }
    answer(_key, req)
}

#[tokio::test]
async fn url_mode_elicitation_becomes_a_url_input_request_only_when_declared() {
    let env = env(url_handlers()).await;
    let with_url = env
        .client()
        .with_capabilities(json!({"elicitation": {"form": {}, "url": {}}}));
    let (rounds, last) = with_url
        .call_with_input(
            "tools/call",
            json!({"name": "link", "arguments": {}}),
            &mut url_answer,
            4,
        )
        .await
        .unwrap();
    assert_eq!(rounds.len(), 1);
    let req = rounds[0].input_requests.values().next().unwrap();
    assert_eq!(
        req["params"],
        json!({"mode": "url", "message": "Authorize the app", "url": "https://auth.example/start?x=1"})
    );
    assert_eq!(text(last.result().unwrap()), "link: accept");
    // The legacy elicitationId travels in the sealed state, not in the request.
    let state = rounds[0].exchange.result().unwrap()["requestState"]
        .as_str()
        .unwrap()
        .to_string();
    let (payload, _) = env
        .gw
        .codec
        .open(&state, mrtr_gateway::state::now_secs())
        .unwrap();
    assert_eq!(
        payload
            .pnd
            .values()
            .next()
            .unwrap()
            .elicitation_id
            .as_deref(),
        Some("eid-123")
    );

    let form_only = env.client().with_capabilities(json!({"elicitation": {}}));
    let r = call_tool(&form_only, "link").await;
    assert_eq!(r.error_code(), Some(-32021));
    assert_eq!(
        r.error().unwrap()["data"]["requiredCapabilities"],
        json!({"elicitation": {"url": {}}})
    );
    env.stop().await;
}

#[tokio::test]
async fn legacy_error_32042_becomes_an_input_required_round_and_never_reaches_the_client() {
    let env = env(url_handlers()).await;
    let with_url = env
        .client()
        .with_capabilities(json!({"elicitation": {"url": {}}}));
    let (rounds, last) = with_url
        .call_with_input(
            "tools/call",
            json!({"name": "needs_url", "arguments": {}}),
            &mut url_answer,
            4,
        )
        .await
        .unwrap();
    assert_eq!(rounds.len(), 1);
    let req = rounds[0].input_requests.values().next().unwrap();
    assert_eq!(req["method"], "elicitation/create");
    assert_eq!(req["params"]["url"], "https://pay.example/3ds");
    assert!(req["params"].get("elicitationId").is_none());
    assert_eq!(text(last.result().unwrap()), "paid");
    assert!(!String::from_utf8_lossy(&rounds[0].exchange.raw_body).contains("-32042"));

    // Without elicitation.url the client is told what it lacks.
    let form_only = env.client().with_capabilities(json!({"elicitation": {}}));
    let r = call_tool(&form_only, "needs_url").await;
    assert_eq!(r.error_code(), Some(-32021), "{:?}", r.message);
    assert_eq!(
        r.error().unwrap()["data"]["requiredCapabilities"],
        json!({"elicitation": {"url": {}}})
    );
    env.stop().await;
}

#[tokio::test]
async fn sampling_with_tools_needs_sampling_tools() {
    let env = env(url_handlers()).await;
    let plain = env.client().with_capabilities(json!({"sampling": {}}));
    let r = plain
        .request(
            "tools/call",
            json!({"name": "sample_tools", "arguments": {}}),
        )
        .await
        .unwrap();
    assert_eq!(r.error_code(), Some(-32021));
    assert_eq!(
        r.error().unwrap()["data"]["requiredCapabilities"],
        json!({"sampling": {"tools": {}}})
    );
    let tools = env
        .client()
        .with_capabilities(json!({"sampling": {"tools": {}}}));
    let (rounds, last) = tools
        .call_with_input(
            "tools/call",
            json!({"name": "sample_tools", "arguments": {}}),
            &mut answer,
            4,
        )
        .await
        .unwrap();
    assert_eq!(
        rounds[0].input_requests.values().next().unwrap()["params"]["tools"][0]["name"],
        "get_weather"
    );
    assert_eq!(text(last.result().unwrap()), "sampled");
    let init = env.legacy.stats().received_with_method("initialize");
    assert_eq!(
        init.last().unwrap().raw["params"]["capabilities"]["sampling"],
        json!({"tools": {}})
    );
    env.stop().await;
}

#[tokio::test]
async fn trace_context_reaches_the_legacy_server_from_headers_or_meta() {
    let env = env(greet_handlers()).await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r = env
        .client()
        .request("tools/list", json!({"_meta": {"traceparent": tp}}))
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200);
    let got = env.legacy.stats().received_with_method("tools/list");
    assert_eq!(
        got.last().unwrap().raw["params"]["_meta"]["traceparent"],
        tp
    );
    assert_eq!(
        got.last().unwrap().traceparent.as_deref(),
        Some(tp),
        "the header too"
    );
    env.stop().await;
}
