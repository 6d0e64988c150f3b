//! End-to-end tests of the legacy server over loopback HTTP, driven by the
//! raw client in `test_client`.

use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};

use super::test_client::{SseReader, TestClient, json_body, result_text, tool_call};
use super::*;

fn text(t: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": t.into()}]})
}

fn test_handlers() -> Handlers {
    let object = json!({"type": "object"});
    Handlers::new()
        .tool("greet", "Asks for a name", object.clone(), |ctx, _| async move {
            let answer = ctx
                .elicit_form(
                    "Your name?",
                    json!({"type": "object", "properties": {"name": {"type": "string"}}}),
                )
                .await?;
            Ok(text(format!("Hello {}", answer["content"]["name"].as_str().unwrap_or("?"))))
        })
        .tool("roots", "Lists roots", object.clone(), |ctx, _| async move {
            let roots = ctx.list_roots().await?;
            Ok(text(roots["roots"][0]["uri"].as_str().unwrap_or("none")))
        })
        .tool("three", "Three requests at once", object.clone(), |ctx, _| async move {
            let (a, b, c) = tokio::join!(
                ctx.elicit_form("a?", json!({"type": "object"})),
                ctx.create_message(json!({"messages": [], "maxTokens": 5})),
                ctx.ping(),
            );
            Ok(text(format!("{} {} {}", a?["n"], b?["n"], c?["n"])))
        })
        .tool("wait", "Waits until cancelled", object.clone(), |ctx, _| async move {
            ctx.cancelled().await;
            Ok(text("cancelled"))
        })
        .tool("try_elicit", "Reports elicitation errors", object.clone(), |ctx, _| async move {
            Ok(match ctx.elicit_form("x?", json!({"type": "object"})).await {
                Ok(_) => text("elicited"),
                Err(e) => json!({"content": [{"type": "text", "text": e.message}], "isError": true}),
            })
        })
        .tool("log", "Logs twice", object.clone(), |ctx, _| async move {
            ctx.log("info", json!("quiet"));
            ctx.log("error", json!("loud"));
            ctx.progress(1.0, Some(2.0), None);
            Ok(text("logged"))
        })
        .tool("notify_get", "Notifies on the GET stream", object.clone(), |ctx, _| async move {
            let sent = ctx.notify_get_stream("notifications/tools/list_changed", Value::Null);
            Ok(text(sent.to_string()))
        })
        .tool("caps", "Reports session facts", object, |ctx, _| async move {
            Ok(text(format!(
                "{} {} {}",
                ctx.client_capabilities()["sampling"].is_object(),
                ctx.protocol_version(),
                ctx.request_id()
            )))
        })
        .resource_template("profile://{user}", "profile", |_ctx, params| async move {
            Ok(json!({"contents": [{"uri": params["uri"], "text": params["variables"]["user"]}]}))
        })
}

async fn start(config: LegacyServerConfig) -> (LegacyServer, TestClient) {
    let server = LegacyServer::start(config, test_handlers()).await.unwrap();
    let client = TestClient::new(server.url());
    (server, client)
}

async fn start_default() -> (LegacyServer, TestClient) {
    start(LegacyServerConfig::default()).await
}

#[tokio::test]
async fn initialize_negotiates_and_issues_session() {
    let (server, mut client) = start_default().await;
    assert!(server.url().starts_with("http://127.0.0.1:"));
    let init = client
        .initialize_with("2025-06-18", json!({"sampling": {}}))
        .await;
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(init["result"]["serverInfo"]["name"], "legacy-mcp-server");
    assert!(init["result"]["capabilities"]["tools"].is_object());
    let session = client.session.clone().expect("session id");
    assert!(session.bytes().all(|b| (0x21..=0x7e).contains(&b)));
    assert_eq!(server.session_ids(), vec![session.clone()]);
    assert_eq!(server.stats().sessions_opened(), 1);
    let received = server.stats().received();
    assert_eq!(received.len(), 2);
    assert_eq!(received[0].method.as_deref(), Some("initialize"));
    assert_eq!(
        received[1].method.as_deref(),
        Some("notifications/initialized")
    );
    assert_eq!(received[1].session_id.as_deref(), Some(session.as_str()));
    let caps = client.call(&tool_call(1, "caps", json!({}))).await;
    assert_eq!(result_text(&caps), "true 2025-06-18 1");

    let mut other = TestClient::new(server.url());
    let init = other.initialize_with("1999-01-01", json!({})).await;
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25");
    server.shutdown().await;
}

#[tokio::test]
async fn session_and_version_headers_are_enforced() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    let ping = json!({"jsonrpc": "2.0", "id": 9, "method": "ping"});
    assert_eq!(client.call(&ping).await["result"], json!({}));

    let mut wrong_version = TestClient::new(server.url());
    wrong_version.session = client.session.clone();
    wrong_version.version = Some("2025-03-26".into());
    assert_eq!(
        wrong_version.post(&ping).await.status(),
        StatusCode::BAD_REQUEST
    );

    let missing = TestClient::new(server.url());
    assert_eq!(missing.post(&ping).await.status(), StatusCode::BAD_REQUEST);

    let mut unknown = TestClient::new(server.url());
    unknown.session = Some("nope".into());
    let response = unknown.post(&ping).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        json_body(response).await["error"]["code"],
        RpcError::SESSION_NOT_FOUND
    );
    assert_eq!(server.stats().http_errors(404), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn form_elicitation_round_trip_on_call_stream_python_framing() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    let mut sse = SseReader::new(client.post(&tool_call(1, "greet", json!({}))).await);
    let first = sse.next_event().await.unwrap();
    assert_eq!(first.event.as_deref(), Some("message"));
    assert!(first.id.is_none());
    let request = first.json();
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["mode"], "form");
    assert_eq!(request["id"], 0);
    client
        .answer(
            &request["id"],
            json!({"action": "accept", "content": {"name": "Ada"}}),
        )
        .await;
    let reply = sse.next_message().await.unwrap();
    assert_eq!(reply["id"], 1);
    assert_eq!(result_text(&reply), "Hello Ada");
    sse.expect_end().await;
    assert!(sse.raw.starts_with("event: message\r\ndata: {"));
    assert!(sse.raw.ends_with("}\r\n\r\n"));
    assert!(!sse.raw.contains("id:"));
    assert_eq!(server.stats().tool_starts("greet"), 1);
    assert_eq!(server.stats().tool_finishes("greet"), 1);
    assert_eq!(server.stats().responses_received().len(), 1);
    let sent = server.stats().sent_requests();
    assert_eq!(sent.len(), 1);
    assert!(!sent[0].on_get_stream);
    server.shutdown().await;
}

#[tokio::test]
async fn roots_list_goes_to_the_get_stream() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    let mut get = SseReader::new(client.open_get().await);
    assert_eq!(server.stats().get_streams_open(), 1);
    let mut call = SseReader::new(client.post(&tool_call(2, "roots", json!({}))).await);
    let request = get.next_message().await.unwrap();
    assert_eq!(request["method"], "roots/list");
    assert!(request.get("params").is_none());
    client
        .answer(
            &request["id"],
            json!({"roots": [{"uri": "file:///home/ada"}]}),
        )
        .await;
    let reply = call.next_message().await.unwrap();
    assert_eq!(result_text(&reply), "file:///home/ada");
    call.expect_end().await;
    assert!(server.stats().sent_requests()[0].on_get_stream);

    // A second GET stream is refused while the first is open.
    assert_eq!(client.open_get().await.status(), StatusCode::CONFLICT);
    // Server-side closing ends it; the client may then reopen.
    assert!(
        server
            .faults()
            .close_get_stream(client.session.as_deref().unwrap())
    );
    get.expect_end().await;
    assert!(
        server
            .stats()
            .wait_until(|s| s.get_streams_open() == 0, Duration::from_secs(1))
            .await
    );
    let _again = SseReader::new(client.open_get().await);
    assert_eq!(server.stats().get_streams_opened(), 2);
    server.shutdown().await;
}

#[tokio::test]
async fn get_stream_request_waits_for_late_stream() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    let mut call = SseReader::new(client.post(&tool_call(2, "roots", json!({}))).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut get = SseReader::new(client.open_get().await);
    let request = get.next_message().await.unwrap();
    client.answer(&request["id"], json!({"roots": []})).await;
    assert_eq!(result_text(&call.next_message().await.unwrap()), "none");
    server.shutdown().await;
}

#[tokio::test]
async fn typescript_framing_primes_and_numbers_events() {
    let config = LegacyServerConfig {
        framing: SseFraming::TypeScript,
        ..Default::default()
    };
    let (server, mut client) = start(config).await;
    client.initialize().await;
    let mut sse = SseReader::new(client.post(&tool_call(1, "greet", json!({}))).await);
    let priming = sse.next_event().await.unwrap();
    assert!(priming.is_priming());
    let request = sse.next_event().await.unwrap();
    client
        .answer(
            &request.json()["id"],
            json!({"action": "accept", "content": {"name": "Bo"}}),
        )
        .await;
    let reply = sse.next_event().await.unwrap();
    assert_eq!(result_text(&reply.json()), "Hello Bo");
    sse.expect_end().await;
    let ids = [&priming, &request, &reply].map(|e| e.id.clone().expect("event id"));
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
    assert!(sse.raw.starts_with(&format!("id: {}\ndata: \n\n", ids[0])));
    assert!(!sse.raw.contains('\r'));
    // The GET stream is primed too, with an id not used before.
    let mut get = SseReader::new(client.open_get().await);
    let get_priming = get.next_event().await.unwrap();
    assert!(get_priming.is_priming());
    assert!(!ids.contains(get_priming.id.as_ref().unwrap()));
    server.shutdown().await;
}

#[tokio::test]
async fn three_server_requests_in_flight_at_once() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    let mut sse = SseReader::new(client.post(&tool_call(1, "three", json!({}))).await);
    let mut requests = Vec::new();
    for _ in 0..3 {
        requests.push(sse.next_message().await.unwrap());
    }
    let mut methods: Vec<_> = requests
        .iter()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    methods.sort_unstable();
    assert_eq!(
        methods,
        ["elicitation/create", "ping", "sampling/createMessage"]
    );
    // Answer in reverse order.
    for (n, request) in requests.iter().rev().enumerate() {
        client.answer(&request["id"], json!({"n": n})).await;
    }
    let reply = sse.next_message().await.unwrap();
    let words: Vec<&str> = result_text(&reply).split(' ').collect();
    assert_eq!(words.len(), 3);
    assert_eq!(server.stats().sent_requests().len(), 3);
    server.shutdown().await;
}

#[tokio::test]
async fn json_response_mode_answers_json_and_refuses_call_stream_requests() {
    let config = LegacyServerConfig {
        json_response: true,
        ..Default::default()
    };
    let (server, mut client) = start(config).await;
    client.initialize().await;
    let response = client.post(&tool_call(1, "try_elicit", json!({}))).await;
    assert_eq!(response.headers()["content-type"], "application/json");
    let reply = json_body(response).await;
    assert_eq!(reply["result"]["isError"], true);
    assert!(result_text(&reply).contains("JSON response mode"));
    // The GET stream still works for server requests.
    let mut get = SseReader::new(client.open_get().await);
    let call = {
        let client = client.clone();
        tokio::spawn(async move { client.call(&tool_call(2, "roots", json!({}))).await })
    };
    let request = get.next_message().await.unwrap();
    client
        .answer(&request["id"], json!({"roots": [{"uri": "file:///r"}]}))
        .await;
    let reply = tokio::time::timeout(Duration::from_secs(2), call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(result_text(&reply), "file:///r");
    server.shutdown().await;
}

#[tokio::test]
async fn expired_session_gets_404() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    let session = client.session.clone().unwrap();
    assert!(server.faults().expire_session(&session));
    let response = client
        .post(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(server.live_sessions(), 0);
    assert_eq!(server.stats().sessions_expired(), 1);
    // A fresh session works, and expire_all ends it too.
    client.initialize().await;
    assert_eq!(server.faults().expire_all_sessions(), 1);
    assert_eq!(client.open_get().await.status(), StatusCode::NOT_FOUND);
    server.shutdown().await;
}

#[tokio::test]
async fn cancellation_stops_the_handler_and_closes_the_stream() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    let mut sse = SseReader::new(client.post(&tool_call(5, "wait", json!({}))).await);
    assert!(
        server
            .stats()
            .wait_until(|s| s.tool_starts("wait") == 1, Duration::from_secs(1))
            .await
    );
    let status = client
        .post(
            &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 5, "reason": "user"}}),
        )
        .await
        .status();
    assert_eq!(status, StatusCode::ACCEPTED);
    sse.expect_end().await;
    assert_eq!(server.stats().cancellations(), vec![json!(5)]);
    assert_eq!(server.stats().tool_finishes("wait"), 0);
    server.shutdown().await;
}

#[tokio::test]
async fn delete_ends_session_and_in_flight_calls() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    let mut get = SseReader::new(client.open_get().await);
    let mut sse = SseReader::new(client.post(&tool_call(1, "greet", json!({}))).await);
    let request = sse.next_message().await.unwrap();
    assert_eq!(client.delete().await, StatusCode::OK);
    sse.expect_end().await;
    get.expect_end().await;
    assert_eq!(server.stats().sessions_deleted(), 1);
    assert_eq!(server.stats().sessions_live(), 0);
    assert_eq!(server.live_sessions(), 0);
    let late = client
        .post(&json!({"jsonrpc": "2.0", "id": request["id"], "result": {}}))
        .await;
    assert_eq!(late.status(), StatusCode::NOT_FOUND);
    assert_eq!(client.delete().await, StatusCode::NOT_FOUND);
    server.shutdown().await;
}

#[tokio::test]
async fn stateless_mode_has_no_sessions_or_server_requests() {
    let config = LegacyServerConfig {
        stateless: true,
        ..Default::default()
    };
    let (server, mut client) = start(config).await;
    client.initialize().await;
    assert!(client.session.is_none());
    assert_eq!(
        client.open_get().await.status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
    let reply = client.call(&tool_call(1, "try_elicit", json!({}))).await;
    assert!(result_text(&reply).contains("stateless"));
    assert_eq!(server.live_sessions(), 0);
    server.shutdown().await;
}

#[tokio::test]
async fn log_level_filters_and_progress_is_sent() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    let set = json!({"jsonrpc": "2.0", "id": 1, "method": "logging/setLevel",
        "params": {"level": "warning"}});
    assert_eq!(client.call(&set).await["result"], json!({}));
    let info = server.session(client.session.as_deref().unwrap()).unwrap();
    assert_eq!(info.log_level.as_deref(), Some("warning"));
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "log", "arguments": {}, "_meta": {"progressToken": "p1"}}});
    let mut sse = SseReader::new(client.post(&call).await);
    let log = sse.next_message().await.unwrap();
    assert_eq!(log["method"], "notifications/message");
    assert_eq!(log["params"]["data"], "loud");
    let progress = sse.next_message().await.unwrap();
    assert_eq!(progress["method"], "notifications/progress");
    assert_eq!(progress["params"]["progressToken"], "p1");
    assert_eq!(result_text(&sse.next_message().await.unwrap()), "logged");
    server.shutdown().await;
}

#[tokio::test]
async fn listings_resources_and_errors() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    let list = client
        .call(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .await;
    assert!(
        list["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "greet")
    );
    let read = client
        .call(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read",
            "params": {"uri": "profile://ada"}}),
        )
        .await;
    assert_eq!(read["result"]["contents"][0]["text"], "ada");
    let unknown = client.call(&tool_call(3, "missing", json!({}))).await;
    assert_eq!(unknown["error"]["code"], RpcError::INVALID_PARAMS);
    let bogus = client
        .call(&json!({"jsonrpc": "2.0", "id": 4, "method": "bogus/method"}))
        .await;
    assert_eq!(bogus["error"]["code"], RpcError::METHOD_NOT_FOUND);
    server.shutdown().await;
}

#[tokio::test]
async fn notify_on_get_stream_and_broadcast() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    let info = server.session(client.session.as_deref().unwrap()).unwrap();
    assert!(info.initialized);
    assert!(!info.get_stream_open);
    assert_eq!(info.client_info["name"], "test-client");
    let mut get = SseReader::new(client.open_get().await);
    let info = server.session(client.session.as_deref().unwrap()).unwrap();
    assert!(info.get_stream_open);
    let reply = client.call(&tool_call(1, "notify_get", json!({}))).await;
    assert_eq!(result_text(&reply), "true");
    assert_eq!(
        get.next_message().await.unwrap()["method"],
        "notifications/tools/list_changed"
    );
    assert_eq!(
        server.notify_all_get_streams("notifications/resources/list_changed", Value::Null),
        1
    );
    assert_eq!(
        get.next_message().await.unwrap()["method"],
        "notifications/resources/list_changed"
    );
    let session = client.session.clone().unwrap();
    let ping = tokio::spawn({
        let stats = server.stats_handle();
        async move {
            stats
                .wait_until(
                    |s| s.responses_received().len() == 1,
                    Duration::from_secs(2),
                )
                .await
        }
    });
    let (answer, request) = tokio::join!(
        server.request_on_get_stream(&session, "ping", Value::Null),
        async {
            let request = get.next_message().await.unwrap();
            client.answer(&request["id"], json!({})).await;
            request
        }
    );
    assert_eq!(request["method"], "ping");
    assert_eq!(answer.unwrap(), json!({}));
    assert!(ping.await.unwrap());
    server.shutdown().await;
}

#[tokio::test]
async fn initialize_failure_fault_returns_500() {
    let (server, client) = start_default().await;
    server.faults().fail_initialize(Some(500));
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    assert_eq!(
        client.post(&init).await.status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    server.faults().reset();
    assert_eq!(client.post(&init).await.status(), StatusCode::OK);
    server.faults().fail_next_posts(503, 1);
    assert_eq!(
        client.post(&init).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(server.stats().sessions_opened(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn call_stream_faults_break_the_stream_as_asked() {
    let (server, mut client) = start_default().await;
    client.initialize().await;

    server
        .faults()
        .next_call_stream(CallStreamFault::MalformedEvent);
    let mut sse = SseReader::new(client.post(&tool_call(1, "caps", json!({}))).await);
    let bad = sse.next_event().await.unwrap();
    assert!(serde_json::from_str::<Value>(&bad.data).is_err());
    assert_eq!(
        result_text(&sse.next_message().await.unwrap())
            .split(' ')
            .count(),
        3
    );

    server
        .faults()
        .next_call_stream(CallStreamFault::OversizeEvent(10_000));
    let mut sse = SseReader::new(client.post(&tool_call(2, "caps", json!({}))).await);
    let big = sse.next_event().await.unwrap();
    assert_eq!(big.data.len(), 10_000);

    server
        .faults()
        .next_call_stream(CallStreamFault::CloseAfterHeaders);
    let mut sse = SseReader::new(client.post(&tool_call(3, "caps", json!({}))).await);
    assert!(sse.next_event().await.is_none());
    assert!(sse.raw.is_empty());

    server
        .faults()
        .next_call_stream(CallStreamFault::CloseAfterFirstEvent);
    let mut sse = SseReader::new(client.post(&tool_call(4, "greet", json!({}))).await);
    let request = sse.next_message().await.unwrap();
    assert_eq!(request["method"], "elicitation/create");
    sse.expect_end().await;

    server
        .faults()
        .next_call_stream(CallStreamFault::HangAfterHeaders);
    let mut sse = SseReader::new(client.post(&tool_call(5, "caps", json!({}))).await);
    assert!(
        sse.next_event_within(Duration::from_millis(200))
            .await
            .is_err()
    );
    assert!(
        server
            .stats()
            .wait_until(|s| s.tool_finishes("caps") == 4, Duration::from_secs(1))
            .await
    );
    // Ending the session releases the hanging stream.
    server.faults().expire_all_sessions();
    sse.expect_end().await;
    server.shutdown().await;
}

#[tokio::test]
async fn sse_polling_resumes_with_last_event_id() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    server
        .faults()
        .next_call_stream(CallStreamFault::Poll { retry_ms: 25 });
    let mut sse = SseReader::new(client.post(&tool_call(7, "greet", json!({}))).await);
    let priming = sse.next_event().await.unwrap();
    assert!(priming.is_priming());
    assert_eq!(priming.retry, Some(25));
    sse.expect_end().await;
    assert!(sse.raw.contains("\r\n"), "Python framing is kept");

    let last = priming.id.unwrap();
    let mut resumed = SseReader::new(client.resume(&last).await);
    let request_event = resumed.next_event().await.unwrap();
    let after_request = request_event
        .id
        .clone()
        .expect("resumable events carry ids");
    let request = request_event.json();
    assert_eq!(request["method"], "elicitation/create");
    // Drop the connection again and resume after the request.
    drop(resumed);
    client
        .answer(
            &request["id"],
            json!({"action": "accept", "content": {"name": "Cy"}}),
        )
        .await;
    let mut again = SseReader::new(client.resume(&after_request).await);
    let reply = again.next_message().await.unwrap();
    assert_eq!(reply["id"], 7);
    assert_eq!(result_text(&reply), "Hello Cy");
    again.expect_end().await;
    assert_eq!(server.stats().resumptions(), 2);
    assert_eq!(
        client.resume("99_99").await.status(),
        StatusCode::BAD_REQUEST
    );
    server.shutdown().await;
}

#[tokio::test]
async fn mirrored_server_request_ids_collide_with_call_ids() {
    let config = LegacyServerConfig {
        server_request_ids: ServerRequestIds::MirrorCallId { start: 1 },
        ..Default::default()
    };
    let (server, mut client) = start(config).await;
    client.initialize().await;
    let mut sse = SseReader::new(client.post(&tool_call(1, "greet", json!({}))).await);
    let request = sse.next_message().await.unwrap();
    assert_eq!(request["id"], 1);
    client
        .answer(
            &json!(1),
            json!({"action": "accept", "content": {"name": "Di"}}),
        )
        .await;
    let reply = sse.next_message().await.unwrap();
    assert_eq!(reply["id"], 1);
    assert_eq!(result_text(&reply), "Hello Di");
    server.shutdown().await;
}

#[tokio::test]
async fn batches_only_under_2025_03_26() {
    let (server, mut client) = start_default().await;
    client.initialize_with("2025-03-26", json!({})).await;
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "caps"}},
    ]);
    let mut sse = SseReader::new(client.post(&batch).await);
    let mut ids = vec![
        sse.next_message().await.unwrap()["id"].as_i64().unwrap(),
        sse.next_message().await.unwrap()["id"].as_i64().unwrap(),
    ];
    ids.sort_unstable();
    assert_eq!(ids, [1, 2]);
    sse.expect_end().await;

    let mut modern = TestClient::new(server.url());
    modern.initialize().await;
    assert_eq!(modern.post(&batch).await.status(), StatusCode::BAD_REQUEST);
    server.shutdown().await;
}

#[tokio::test]
async fn demo_plan_trip_runs_end_to_end() {
    let server = LegacyServer::start(LegacyServerConfig::default(), demo_handlers())
        .await
        .unwrap();
    let mut client = TestClient::new(server.url());
    client.initialize().await;
    let add = client
        .call(&tool_call(1, "add", json!({"a": 2, "b": 3})))
        .await;
    assert_eq!(result_text(&add), "5");
    let echo = client
        .call(&tool_call(2, "echo", json!({"message": "hi"})))
        .await;
    assert_eq!(result_text(&echo), "hi");

    let mut get = SseReader::new(client.open_get().await);
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "plan_trip", "arguments": {}, "_meta": {"progressToken": 42}}});
    let mut sse = SseReader::new(client.post(&call).await);
    let next_request = async |sse: &mut SseReader| loop {
        let m = sse.next_message().await.unwrap();
        if m["method"] != "notifications/progress" {
            return m;
        }
    };
    let details = next_request(&mut sse).await;
    assert_eq!(details["method"], "elicitation/create");
    assert!(details["params"]["requestedSchema"]["properties"]["destination"].is_object());
    client
        .answer(
            &details["id"],
            json!({"action": "accept",
            "content": {"name": "Ada", "destination": "Lisbon"}}),
        )
        .await;
    let sample = next_request(&mut sse).await;
    assert_eq!(sample["method"], "sampling/createMessage");
    assert!(
        sample["params"]["messages"][0]["content"]["text"]
            .as_str()
            .unwrap()
            .contains("Lisbon")
    );
    client
        .answer(
            &sample["id"],
            json!({"role": "assistant", "model": "m",
            "content": {"type": "text", "text": "Ride tram 28."}}),
        )
        .await;
    let (confirm, roots) = tokio::join!(next_request(&mut sse), get.next_message());
    let roots = roots.unwrap();
    assert_eq!(roots["method"], "roots/list");
    assert_eq!(confirm["method"], "elicitation/create");
    assert!(confirm["params"]["requestedSchema"]["properties"]["confirm"].is_object());
    client
        .answer(&roots["id"], json!({"roots": [{"uri": "file:///trips"}]}))
        .await;
    client
        .answer(
            &confirm["id"],
            json!({"action": "accept", "content": {"confirm": true}}),
        )
        .await;
    let reply = next_request(&mut sse).await;
    let text = result_text(&reply);
    for needle in [
        "Ada",
        "Lisbon",
        "Ride tram 28.",
        "file:///trips",
        "Confirmed: yes",
    ] {
        assert!(text.contains(needle), "{needle} missing from {text}");
    }
    assert_eq!(server.stats().tool_starts("plan_trip"), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_closes_streams_and_cancels_handlers() {
    let (server, mut client) = start_default().await;
    client.initialize().await;
    let mut get = SseReader::new(client.open_get().await);
    let mut sse = SseReader::new(client.post(&tool_call(1, "wait", json!({}))).await);
    let stats = server.stats_handle();
    assert!(
        stats
            .wait_until(|s| s.tool_starts("wait") == 1, Duration::from_secs(1))
            .await
    );
    tokio::time::timeout(Duration::from_secs(3), server.shutdown())
        .await
        .expect("shutdown is bounded");
    assert!(
        sse.next_event_within(Duration::from_secs(1))
            .await
            .is_ok_and(|e| e.is_none())
    );
    assert!(
        get.next_event_within(Duration::from_secs(1))
            .await
            .is_ok_and(|e| e.is_none())
    );
    assert_eq!(stats.tool_finishes("wait"), 0);
}

#[tokio::test]
async fn accept_and_content_type_are_checked() {
    let (server, client) = start_default().await;
    let request = http::Request::builder()
        .method("POST")
        .uri(server.url())
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    assert_eq!(
        client.send(request).await.status(),
        StatusCode::NOT_ACCEPTABLE
    );
    let request = http::Request::builder()
        .method("POST")
        .uri(server.url())
        .header("content-type", "text/plain")
        .header("accept", "application/json, text/event-stream")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    assert_eq!(
        client.send(request).await.status(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    let request = http::Request::builder()
        .method("PUT")
        .uri(server.url())
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let response = client.send(request).await;
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(response.headers()["allow"], "POST, GET, DELETE");
    server.shutdown().await;
}

#[tokio::test]
async fn get_stream_resumes_under_typescript_framing() {
    let config = LegacyServerConfig {
        framing: SseFraming::TypeScript,
        ..Default::default()
    };
    let (server, mut client) = start(config).await;
    client.initialize().await;
    let mut get = SseReader::new(client.open_get().await);
    let priming = get.next_event().await.unwrap();
    assert!(priming.is_priming());
    drop(get);
    assert!(
        server
            .stats()
            .wait_until(|s| s.get_streams_open() == 0, Duration::from_secs(1))
            .await
    );
    // The tool waits for a GET stream; resuming the old one satisfies it.
    let mut call = SseReader::new(client.post(&tool_call(1, "roots", json!({}))).await);
    let mut resumed = SseReader::new(client.resume(priming.id.as_deref().unwrap()).await);
    let request = resumed.next_message().await.unwrap();
    assert_eq!(request["method"], "roots/list");
    client
        .answer(&request["id"], json!({"roots": [{"uri": "file:///x"}]}))
        .await;
    assert_eq!(
        result_text(&call.next_message().await.unwrap()),
        "file:///x"
    );
    assert_eq!(server.stats().resumptions(), 1);
    assert_eq!(server.stats().get_streams_open(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn cancelled_calls_can_still_get_an_error_response() {
    let config = LegacyServerConfig {
        respond_to_cancelled: true,
        ..Default::default()
    };
    let (server, mut client) = start(config).await;
    client.initialize().await;
    let mut sse = SseReader::new(client.post(&tool_call(3, "wait", json!({}))).await);
    assert!(
        server
            .stats()
            .wait_until(|s| s.tool_starts("wait") == 1, Duration::from_secs(1))
            .await
    );
    client
        .post(
            &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 3}}),
        )
        .await;
    let reply = sse.next_message().await.unwrap();
    assert_eq!(reply["id"], 3);
    assert_eq!(reply["error"]["code"], RpcError::REQUEST_CANCELLED);
    sse.expect_end().await;
    server.shutdown().await;
}

#[tokio::test]
async fn json_mode_cancellation_answers_with_an_error() {
    let config = LegacyServerConfig {
        json_response: true,
        ..Default::default()
    };
    let (server, mut client) = start(config).await;
    client.initialize().await;
    let pending = {
        let client = client.clone();
        tokio::spawn(async move { client.call(&tool_call(4, "wait", json!({}))).await })
    };
    assert!(
        server
            .stats()
            .wait_until(|s| s.tool_starts("wait") == 1, Duration::from_secs(1))
            .await
    );
    client
        .post(
            &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 4}}),
        )
        .await;
    let reply = tokio::time::timeout(Duration::from_secs(2), pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply["error"]["code"], RpcError::REQUEST_CANCELLED);
    server.shutdown().await;
}
