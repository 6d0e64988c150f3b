//! `subscriptions/listen`: the acknowledgement first with the agreed filter, only the agreed
//! notifications (tagged with the subscription id), resource subscriptions, the legacy session's
//! lifetime following the stream's, graceful shutdown, the stream limit, keep-alives; against the
//! in-repo legacy server and against FastMCP.

use std::time::Duration;

use crate::support::peers::PyLegacyServer;
use crate::support::*;
use bytes::Bytes;
use http::{HeaderValue, Method};
use mrtr_testkit::client::{ClientError, EventStream, Exchange, ModernClient};
use mrtr_testkit::legacy_server::{Handlers, LegacyServer, LegacyServerConfig, RpcError};
use serde_json::{Value, json};

const SUB: &str = "io.modelcontextprotocol/subscriptionId";
const ACK: &str = "notifications/subscriptions/acknowledged";
const WAIT: Duration = Duration::from_secs(10);

fn ok_tool(h: Handlers) -> Handlers {
    h.tool("t", "", json!({"type": "object"}), |_, _| async move {
        Ok(tool_text("ok"))
    })
}

fn with_prompt(h: Handlers) -> Handlers {
    h.prompt("p", "", json!([]), |_, _| async move {
        Ok(json!({"messages": []}))
    })
}

fn with_resources(h: Handlers) -> Handlers {
    let read = |_, args: Value| async move {
        Ok(json!({"contents": [{"uri": args["uri"], "text": "x"}]}))
    };
    h.resource("file:///a", "a", None, read)
        .resource("file:///b", "b", None, read)
}

async fn listen(c: &ModernClient, filter: Value) -> EventStream {
    let s = c
        .open_stream("subscriptions/listen", json!({"notifications": filter}))
        .await
        .unwrap();
    assert_eq!(s.status.as_u16(), 200);
    assert!(s.streamed, "{:?}", s.headers);
    s
}

/// A `toolsListChanged` stream whose acknowledgement has been read and checked.
async fn acked_tools_stream(c: &ModernClient) -> EventStream {
    let mut s = listen(c, json!({"toolsListChanged": true})).await;
    ack(&mut s).await;
    s
}

/// A gateway with `settings` in its `[subscriptions]` section, in front of a server with
/// one plain tool.
async fn subscriptions_env(settings: &str) -> Env {
    let extra = format!("[subscriptions]\n{settings}");
    env_with(
        LegacyServerConfig::default(),
        ok_tool(Handlers::new()),
        "",
        &extra,
    )
    .await
}

/// A `subscriptions/listen` with `filter` that is expected to be answered without a stream
/// (the caller checks the status); the exchange.
async fn listen_refused(c: &ModernClient, filter: Value) -> Exchange {
    c.request("subscriptions/listen", json!({"notifications": filter}))
        .await
        .unwrap()
}

/// Reads the first message, checks it is this stream's acknowledgement, returns the filter.
async fn ack(s: &mut EventStream) -> Value {
    let first = s
        .next_within(WAIT)
        .await
        .unwrap()
        .expect("an acknowledgement");
    assert_eq!(first["method"], ACK, "{first}");
    assert_eq!(
        &first["params"]["_meta"][SUB],
        s.request_id.as_ref().unwrap()
    );
    first["params"]["notifications"].clone()
}

/// The next message, which must be `method`, tagged with this stream's id.
async fn expect_tagged(s: &mut EventStream, method: &str) -> Value {
    let n = s.next_within(WAIT).await.unwrap().expect("a notification");
    assert_eq!(n["method"], method, "{n}");
    assert!(n.get("id").is_none(), "{n}");
    assert_eq!(&n["params"]["_meta"][SUB], s.request_id.as_ref().unwrap());
    n
}

#[tokio::test]
async fn the_acknowledgement_comes_first_then_only_agreed_notifications_tagged() {
    let env = env(ok_tool(Handlers::new())).await;
    let c = env.client();
    let mut s = listen(
        &c,
        json!({"toolsListChanged": true, "promptsListChanged": true,
               "resourcesListChanged": true, "resourceSubscriptions": ["file:///x"]}),
    )
    .await;
    assert!(s.headers.get("mcp-session-id").is_none());
    // No prompts, no resources on this server: only the tools kind is agreed.
    assert_eq!(ack(&mut s).await, json!({"toolsListChanged": true}));

    // The listen session is the only one with a GET stream. Everything before the tools
    // notification rides the same stream, so had any of it been forwarded it would come first.
    let send = |m: &str, p: Value| env.legacy.notify_all_get_streams(m, p);
    assert_eq!(
        send(
            "notifications/message",
            json!({"level": "error", "data": "x"})
        ),
        1
    );
    send(
        "notifications/progress",
        json!({"progressToken": 1, "progress": 1}),
    );
    send("notifications/prompts/list_changed", json!({}));
    send(
        "notifications/resources/updated",
        json!({"uri": "file:///x"}),
    );
    assert_eq!(send("notifications/tools/list_changed", json!({})), 1);
    expect_tagged(&mut s, "notifications/tools/list_changed").await;

    // Server requests on the listen session are refused upstream; ping is answered.
    let ids = env.legacy.session_ids();
    assert_eq!(ids.len(), 1, "only the listen session is open");
    let refused = env
        .legacy
        .request_on_get_stream(&ids[0], "roots/list", json!({}))
        .await
        .unwrap_err();
    assert_eq!(refused.code, RpcError::INVALID_PARAMS);
    let pong = env
        .legacy
        .request_on_get_stream(&ids[0], "ping", json!({}))
        .await
        .unwrap();
    assert_eq!(pong, json!({}));
    // The stream is still delivering after that.
    send("notifications/tools/list_changed", json!({}));
    expect_tagged(&mut s, "notifications/tools/list_changed").await;
    assert_metric!(
        &env.gw,
        "requests_total",
        &[("method", "subscriptions/listen"), ("outcome", "complete")],
        1.0
    );
    drop(s);
    env.stop().await;
}

#[tokio::test]
async fn a_prompts_only_stream_gets_nothing_of_tools() {
    let env = env(with_prompt(ok_tool(Handlers::new()))).await;
    let c = env.client();
    let mut prompts = listen(&c, json!({"promptsListChanged": true})).await;
    assert_eq!(ack(&mut prompts).await, json!({"promptsListChanged": true}));
    let mut tools = listen(&c, json!({"toolsListChanged": true})).await;
    assert_eq!(ack(&mut tools).await, json!({"toolsListChanged": true}));

    let told = env
        .legacy
        .notify_all_get_streams("notifications/tools/list_changed", json!({}));
    assert_eq!(told, 2, "both listen sessions hold a GET stream");
    // Delivery works: the parallel stream gets it.
    expect_tagged(&mut tools, "notifications/tools/list_changed").await;
    // The prompts-only stream gets nothing within a bounded wait...
    assert!(matches!(
        prompts.next_within(Duration::from_millis(300)).await,
        Err(ClientError::Timeout)
    ));
    // ...and is alive: its own kind comes next, so the tools one was never queued before it.
    env.legacy
        .notify_all_get_streams("notifications/prompts/list_changed", json!({}));
    expect_tagged(&mut prompts, "notifications/prompts/list_changed").await;
    env.stop().await;
}

#[tokio::test]
async fn resource_updates_arrive_only_for_subscribed_uris() {
    let env = env(with_resources(ok_tool(Handlers::new()))).await;
    let c = env.client();
    let mut s = listen(&c, json!({"resourceSubscriptions": ["file:///a"]})).await;
    assert_eq!(
        ack(&mut s).await,
        json!({"resourceSubscriptions": ["file:///a"]})
    );
    // The gateway subscribed on the legacy session before acknowledging.
    let ids = env.legacy.session_ids();
    assert_eq!(ids.len(), 1);
    assert_eq!(
        env.legacy.session(&ids[0]).unwrap().subscriptions,
        ["file:///a"]
    );
    let send = |m: &str, p: Value| env.legacy.notify_all_get_streams(m, p);
    send(
        "notifications/resources/updated",
        json!({"uri": "file:///b"}),
    );
    send("notifications/resources/list_changed", json!({}));
    send(
        "notifications/resources/updated",
        json!({"uri": "file:///a"}),
    );
    let n = expect_tagged(&mut s, "notifications/resources/updated").await;
    assert_eq!(n["params"]["uri"], "file:///a");
    env.stop().await;
}

#[tokio::test]
async fn a_refused_subscription_is_an_error_before_any_streaming() {
    let handlers = with_resources(ok_tool(Handlers::new())).method(
        "resources/subscribe",
        |_, params: Value| async move {
            Err(RpcError::new(-32002, "Resource not found")
                .with_data(json!({"uri": params["uri"]})))
        },
    );
    let env = env(handlers).await;
    let c = env.client();
    let before = env.legacy.stats().sessions_live();
    let ex = listen_refused(
        &c,
        json!({"toolsListChanged": true, "resourceSubscriptions": ["file:///nope"]}),
    )
    .await;
    assert!(!ex.streamed, "an error, not a stream");
    assert_eq!(ex.error_code(), Some(-32602), "{:?}", ex.message);
    assert_eq!(ex.error().unwrap()["data"]["uri"], "file:///nope");
    // The client named a resource the server does not have: like any legacy error that says
    // the request was wrong, it is the client's fault.
    assert_metric!(
        &env.gw,
        "rejections_total",
        &[("reason", "listen_subscribe_refused"), ("fault", "client")],
        1.0
    );
    assert!(
        env.legacy
            .stats()
            .wait_until(|s| s.sessions_live() == before, WAIT)
            .await,
        "the listen session was closed"
    );
    assert_eq!(
        metric(&env.gw, "mrtr_gateway_listen_streams", &[]),
        0.0,
        "the place was given back"
    );
    env.stop().await;
}

#[tokio::test]
async fn the_legacy_session_closes_when_the_client_goes_away() {
    let env = env(ok_tool(Handlers::new())).await;
    let c = env.client();
    let stats = env.legacy.stats_handle();
    assert!(stats.wait_until(|s| s.sessions_live() == 0, WAIT).await);
    let deleted = stats.sessions_deleted();
    let s = acked_tools_stream(&c).await;
    assert_eq!(stats.sessions_live(), 1);
    assert_eq!(metric(&env.gw, "mrtr_gateway_listen_streams", &[]), 1.0);
    drop(s);
    assert!(
        stats
            .wait_until(
                |s| s.sessions_live() == 0 && s.sessions_deleted() == deleted + 1,
                WAIT
            )
            .await,
        "the legacy session is DELETEd when the client disconnects"
    );
    assert!(metric_reaches(&env.gw, "mrtr_gateway_listen_streams", &[], 0.0, WAIT).await);
    env.stop().await;
}

#[tokio::test]
async fn shutdown_ends_each_stream_with_the_graceful_response() {
    let env = env(ok_tool(Handlers::new())).await;
    let c = env.client();
    let mut s = acked_tools_stream(&c).await;
    env.gw.drain.close();
    let last = s
        .next_within(WAIT)
        .await
        .unwrap()
        .expect("a final response");
    assert_eq!(&last["id"], s.request_id.as_ref().unwrap());
    assert_eq!(last["result"]["resultType"], "complete");
    assert_eq!(
        &last["result"]["_meta"][SUB],
        s.request_id.as_ref().unwrap()
    );
    assert_eq!(
        last["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "legacy-mcp-server"
    );
    assert_eq!(s.next_within(WAIT).await.unwrap(), None, "then it closes");
    assert!(
        env.legacy
            .stats()
            .wait_until(|s| s.sessions_live() == 0, WAIT)
            .await
    );
    // A listen request during the shutdown is turned away.
    let ex = listen_refused(&c, json!({"toolsListChanged": true})).await;
    assert_eq!(ex.status.as_u16(), 503);
    assert!(ex.headers.get("retry-after").is_some());
    env.stop().await;
}

#[tokio::test]
async fn streams_beyond_max_streams_get_503() {
    let env = subscriptions_env("max_streams = 1\n").await;
    let c = env.client();
    let first = acked_tools_stream(&c).await;
    let ex = listen_refused(&c, json!({"toolsListChanged": true})).await;
    assert_eq!(ex.status.as_u16(), 503);
    assert_eq!(ex.error_code(), Some(-32603));
    assert!(
        ex.message.as_ref().unwrap()["id"].is_i64(),
        "the id is echoed"
    );
    assert!(
        ex.error().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("subscriptions.max_streams")
    );
    assert_eq!(ex.headers.get("retry-after").unwrap(), "5");
    assert_metric!(
        &env.gw,
        "limit_hits_total",
        &[("limit", "max_listen_streams")],
        1.0
    );
    assert_eq!(metric(&env.gw, "mrtr_gateway_listen_streams", &[]), 1.0);
    drop(first);
    assert!(metric_reaches(&env.gw, "mrtr_gateway_listen_streams", &[], 0.0, WAIT).await);
    let _again = acked_tools_stream(&c).await;
    env.stop().await;
}

#[tokio::test]
async fn an_idle_stream_gets_keep_alive_comments() {
    let env = subscriptions_env("keepalive = \"100ms\"\n").await;
    let c = env.client();
    let mut s = acked_tools_stream(&c).await;
    tokio::time::timeout(WAIT, s.wait_for_comments(2))
        .await
        .expect("two keep-alives within the wait")
        .unwrap();
    // Comments carry no message.
    env.legacy
        .notify_all_get_streams("notifications/tools/list_changed", json!({}));
    expect_tagged(&mut s, "notifications/tools/list_changed").await;
    env.stop().await;
}

#[tokio::test]
async fn a_dead_legacy_session_ends_the_stream_without_the_final_response() {
    let legacy = LegacyServer::start(LegacyServerConfig::default(), ok_tool(Handlers::new()))
        .await
        .unwrap();
    // Reconnects after the GET stream closes come quickly; the server answers them 404.
    let cfg = config(&legacy.url(), "resume_max_delay = \"50ms\"\n", "", "");
    let (_gw, running, url) = start_gateway(cfg).await;
    let c = ModernClient::new(&url);
    let mut s = acked_tools_stream(&c).await;
    assert_eq!(legacy.faults().expire_all_sessions(), 1);
    // The stream just ends: no response, so the client knows to listen again.
    assert_eq!(s.next_within(WAIT).await.unwrap(), None);
    running.stop().await;
    legacy.shutdown().await;
}

#[tokio::test]
async fn bad_filters_and_limits_are_refused_with_their_codes() {
    let env = env_with(
        LegacyServerConfig::default(),
        with_resources(ok_tool(Handlers::new())),
        "",
        "[subscriptions]\nmax_resource_subscriptions = 2\n",
    )
    .await;
    let c = env.client();
    for params in [
        json!({}),
        json!({"notifications": true}),
        json!({"notifications": {"toolsListChanged": 1}}),
        json!({"notifications": {"resourceSubscriptions": [1]}}),
        json!({"notifications": {"resourceSubscriptions": ["a://1", "a://2", "a://3"]}}),
    ] {
        let ex = c
            .request("subscriptions/listen", params.clone())
            .await
            .unwrap();
        assert_eq!(ex.status.as_u16(), 400, "{params}");
        assert_eq!(ex.error_code(), Some(-32602), "{params}");
    }
    assert_metric!(
        &env.gw,
        "limit_hits_total",
        &[("limit", "max_resource_subscriptions")],
        1.0
    );
    // A client that cannot take SSE is told so.
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen",
                      "params": c.params_with_meta(json!({"notifications": {"toolsListChanged": true}}))});
    let mut headers = ModernClient::routing_headers(&body);
    headers.insert("accept", HeaderValue::from_static("application/json"));
    let ex = c
        .send_raw(
            Method::POST,
            headers,
            Bytes::from(serde_json::to_vec(&body).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(ex.status.as_u16(), 406);
    assert_eq!(ex.error_code(), Some(-32600));
    assert_eq!(env.legacy.stats().sessions_live(), 0, "nothing was opened");
    env.stop().await;
}

/// The proof with a real legacy server: FastMCP's `add_tool` changes its tool list
/// and notifies its sessions. The listen stream gets the acknowledgement first, then the
/// tagged `tools/list_changed`; a prompts-only stream gets nothing (FastMCP cannot notify
/// prompt changes, so nothing is agreed for it).
#[tokio::test]
async fn fastmcp_tool_list_change_reaches_the_tools_stream_only() {
    let py = PyLegacyServer::start(&[]).await;
    let (gw, running, url) = start_gateway(config(&py.url(), "", "", "")).await;
    let c = ModernClient::new(&url);
    let d = c.request("server/discover", json!({})).await.unwrap();
    assert_eq!(
        d.result().unwrap()["capabilities"]["tools"]["listChanged"],
        true,
        "discover advertises what listen can deliver"
    );
    let mut tools = listen(
        &c,
        json!({"toolsListChanged": true, "promptsListChanged": true}),
    )
    .await;
    assert_eq!(ack(&mut tools).await, json!({"toolsListChanged": true}));
    let mut prompts = listen(&c, json!({"promptsListChanged": true})).await;
    assert_eq!(ack(&mut prompts).await, json!({}));

    let added = c
        .request(
            "tools/call",
            json!({"name": "add_tool", "arguments": {"name": "extra"}}),
        )
        .await
        .unwrap();
    assert_eq!(added.result_type(), Some("complete"), "{:?}", added.message);
    assert!(text(added.result().unwrap()).starts_with("added extra"));
    expect_tagged(&mut tools, "notifications/tools/list_changed").await;
    assert!(matches!(
        prompts.next_within(Duration::from_millis(500)).await,
        Err(ClientError::Timeout)
    ));
    let list = c.request("tools/list", json!({})).await.unwrap();
    assert!(
        list.result().unwrap()["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "extra")
    );
    drop((tools, prompts));
    assert!(metric_reaches(&gw, "mrtr_gateway_listen_streams", &[], 0.0, WAIT).await);
    running.stop().await;
    py.kill().await;
}

/// Many legacy servers (FastMCP among them) tell only the session whose request changed
/// something. The gateway relays such notifications from its call sessions — during the call,
/// and after it while the session waits in the pool — to this replica's listen streams.
#[tokio::test]
async fn changes_announced_only_to_a_call_session_reach_listen_streams() {
    let h = Handlers::new()
        .tool(
            "during",
            "",
            json!({"type": "object"}),
            |ctx, _| async move {
                ctx.notify("notifications/tools/list_changed", json!({}));
                Ok(tool_text("changed"))
            },
        )
        .tool(
            "after",
            "",
            json!({"type": "object"}),
            |ctx, _| async move {
                let late = ctx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    late.notify_get_stream("notifications/tools/list_changed", json!({}));
                });
                Ok(tool_text("will change"))
            },
        );
    let env = env(h).await;
    let c = env.client();
    let mut s = listen(&c, json!({"toolsListChanged": true})).await;
    assert_eq!(ack(&mut s).await, json!({"toolsListChanged": true}));
    let r = call_tool(&c, "during").await;
    assert_eq!(text(r.result().unwrap()), "changed");
    expect_tagged(&mut s, "notifications/tools/list_changed").await;
    // A change announced after the call ended (its session idles in the pool by then)
    // arrives too.
    let r = call_tool(&c, "after").await;
    assert_eq!(text(r.result().unwrap()), "will change");
    expect_tagged(&mut s, "notifications/tools/list_changed").await;
    // One change is one notification, however many sessions saw it.
    assert!(matches!(
        s.next_within(Duration::from_millis(300)).await,
        Err(ClientError::Timeout)
    ));
    drop(s);
    env.stop().await;
}
