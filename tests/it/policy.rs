//! The policy stage (issue 19) end to end: what a legacy server may ask the client.
//!
//! The legacy server is the Python FastMCP server (`tests/peers/legacy_server.py`, mcp
//! 1.30.0) wherever it can show the case: URL elicitations with unsafe URLs (asked
//! mid-call and carried by a -32042 error), a sampling request with a huge `maxTokens`, a
//! tool that reads roots, malformed questions sent raw through its session, a result with
//! forged MRTR fields. The modern client is the project's own `ModernClient`, so every round
//! can be inspected; metrics are read from the in-process gateway's registry and the WARN
//! line from a log subscriber scoped to the test. The in-repo scripted server covers a URL
//! elicitation on the standalone GET stream.

use std::sync::Arc;

use crate::support::peers::PyLegacyServer;
use crate::support::*;
use mrtr_gateway::front::listener::Running;
use mrtr_gateway::gateway::Gateway;
use mrtr_testkit::client::{Exchange, ModernClient};
use mrtr_testkit::legacy_server::{Handlers, LegacyServerConfig};
use serde_json::{Value, json};

/// The twelve URLs of the issue, each with the reason the default policy refuses it.
const BAD_URLS: [(&str, &str); 12] = [
    ("javascript:alert(document.cookie)", "url_scheme"),
    ("file:///etc/passwd", "url_scheme"),
    ("data:text/html,<script>alert(1)</script>", "url_scheme"),
    ("http://auth.example.com/login", "url_scheme"),
    ("https://127.0.0.1/admin", "url_non_public_address"),
    (
        "https://169.254.169.254/latest/meta-data/",
        "url_non_public_address",
    ),
    ("https://10.0.0.8/", "url_non_public_address"),
    ("https://192.168.1.10/", "url_non_public_address"),
    ("https://[::1]/", "url_non_public_address"),
    ("https://localhost:8443/", "url_localhost"),
    ("https://user:pass@auth.example.com/", "url_userinfo"),
    ("https://0x7f000001/", "url_non_public_address"),
];

const GOOD_URL: &str = "https://auth.example.com/authorize?state=abc";

/// The policy the issue's "Done when" uses.
const ISSUE_POLICY: &str = "[policy.url]\nallow_hosts = [\"auth.example.com\"]\n\
    [policy.sampling]\nmax_tokens = 1024\n\
    [[policy.rules]]\nmethod = \"tools/call\"\nname = \"where\"\nallow = [\"elicitation\"]\n";

struct Setup {
    legacy: PyLegacyServer,
    gw: Arc<Gateway>,
    running: Running,
    url: String,
}

/// A FastMCP server and a gateway in front of it, with `extra` TOML sections.
async fn start(extra: &str) -> Setup {
    let legacy = PyLegacyServer::start(&[]).await;
    let (gw, running, url) = start_gateway(gateway_config(&legacy, extra)).await;
    Setup {
        legacy,
        gw,
        running,
        url,
    }
}

fn gateway_config(legacy: &PyLegacyServer, extra: &str) -> mrtr_gateway::config::Config {
    // FastMCP sends roots/list on the GET stream tens of milliseconds after call-stream
    // requests; a generous window keeps rounds stable on a busy machine.
    config(
        &legacy.url(),
        "",
        "",
        &format!("[mrtr]\ngather_window = \"400ms\"\n{extra}"),
    )
}

impl Setup {
    fn client(&self) -> ModernClient {
        ModernClient::new(&self.url).with_capabilities(
            json!({"elicitation": {"form": {}, "url": {}}, "sampling": {}, "roots": {}}),
        )
    }

    async fn call(&self, tool: &str, args: Value) -> Exchange {
        self.client()
            .request("tools/call", json!({"name": tool, "arguments": args}))
            .await
            .expect("the gateway answers")
    }

    fn refusals(&self, kind: &str, reason: &str) -> f64 {
        metric(
            &self.gw,
            "mrtr_gateway_policy_refusals_total",
            &[("kind", kind), ("reason", reason)],
        )
    }

    async fn stop(self) {
        self.running.stop().await;
        self.legacy.kill().await;
    }
}

/// A complete result (HTTP 200, no MRTR round); returns its text.
fn complete_text(ex: &Exchange) -> String {
    assert_eq!(ex.status, 200, "{:?}", ex.message);
    assert_eq!(ex.result_type(), Some("complete"), "{:?}", ex.message);
    let r = ex.result().unwrap();
    assert!(r.get("inputRequests").is_none() && r.get("requestState").is_none());
    text(r)
}

/// [`complete_text`], asserting that it begins with `prefix` (the failure shows it whole).
fn complete_text_starting(ex: &Exchange, prefix: &str) -> String {
    let text = complete_text(ex);
    assert!(text.starts_with(prefix), "{text}");
    text
}

/// The only `inputRequests` entry of an `input_required` result.
fn only_question(ex: &Exchange) -> Value {
    assert_eq!(ex.result_type(), Some("input_required"), "{:?}", ex.message);
    let reqs = ex.result().unwrap()["inputRequests"].as_object().unwrap();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    reqs.values().next().unwrap().clone()
}

fn accept_all(key: &str, req: &Value) -> Result<Value, String> {
    if req.pointer("/params/mode") == Some(&json!("url")) {
        return Ok(json!({"action": "accept"}));
    }
    answer(key, req)
}

#[tokio::test]
async fn default_policy_shows_a_safe_url_and_holds_back_the_twelve_unsafe_ones() {
    let s = start("").await;

    // The good URL reaches the client as a URL request, exactly as asked.
    let first = s.call("open_url", json!({"url": GOOD_URL})).await;
    let q = only_question(&first);
    assert_eq!(q["method"], "elicitation/create");
    assert_eq!(q["params"]["mode"], "url");
    assert_eq!(q["params"]["url"], GOOD_URL);
    let (rounds, last) = s
        .client()
        .call_with_input(
            "tools/call",
            json!({"name": "open_url", "arguments": {"url": GOOD_URL}}),
            &mut accept_all,
            4,
        )
        .await
        .unwrap();
    assert_eq!(rounds.len(), 1);
    assert_eq!(complete_text(&last), "url:accept");

    // None of the bad ones does: the legacy server is told "decline" and its call finishes.
    for (url, reason) in BAD_URLS {
        let before = s.refusals("elicitation_url", reason);
        let ex = s.call("open_url", json!({"url": url})).await;
        assert_eq!(complete_text(&ex), "url:decline", "{url}");
        assert!(
            !String::from_utf8_lossy(&ex.raw_body).contains(url),
            "{url} reached the client"
        );
        assert_eq!(
            s.refusals("elicitation_url", reason),
            before + 1.0,
            "{url} counted as {reason}"
        );
    }

    // The same URLs carried by a legacy -32042 error: the good one becomes a round, each bad
    // one ends the call with a JSON-RPC error (HTTP 200, never 5xx) that names the policy's
    // reason and not the URL.
    let ex = s.call("url_required", json!({"url": GOOD_URL})).await;
    assert_eq!(only_question(&ex)["params"]["url"], GOOD_URL);
    for (url, reason) in BAD_URLS {
        let ex = s.call("url_required", json!({"url": url})).await;
        assert_eq!(ex.status, 200, "{url}: {:?}", ex.message);
        let err = ex
            .error()
            .unwrap_or_else(|| panic!("{url}: {:?}", ex.message));
        assert_eq!(err["code"], -32603, "{url}");
        assert_eq!(err["data"]["policyReason"], reason, "{url}");
        assert!(err["message"].as_str().unwrap().contains("policy"), "{err}");
        assert!(
            !String::from_utf8_lossy(&ex.raw_body).contains(url),
            "{url}"
        );
    }
    assert_metric!(
        &s.gw,
        "rejections_total",
        &[("reason", "policy_refused")],
        12.0
    );

    // The gateway keeps serving.
    let ex = s.call("add", json!({"a": 2, "b": 3})).await;
    assert_eq!(complete_text(&ex), "5");
    s.stop().await;
}

#[tokio::test]
async fn the_issue_policy_caps_sampling_keeps_roots_from_where_and_applies_the_allow_list() {
    let s = start(ISSUE_POLICY).await;

    // Sampling reaches the client with maxTokens 1024 (asked: 100000), and completes.
    let first = s.call("sample_big", json!({})).await;
    let q = only_question(&first);
    assert_eq!(q["method"], "sampling/createMessage");
    assert_eq!(q["params"]["maxTokens"], 1024);
    let (_, last) = s
        .client()
        .call_with_input("tools/call", json!({"name": "sample_big"}), &mut answer, 4)
        .await
        .unwrap();
    assert_eq!(complete_text(&last), "sampled: sampled");
    assert!(metric(&s.gw, "mrtr_gateway_policy_max_tokens_clamped_total", &[]) >= 2.0);

    // `where` may only elicit: its roots/list is refused (the server hears why) and it goes
    // on to its next question, which the client does see.
    let mut never_roots = |key: &str, req: &Value| {
        assert_ne!(req["method"], "roots/list", "roots reached the client");
        answer(key, req)
    };
    let (rounds, last) = s
        .client()
        .call_with_input("tools/call", json!({"name": "where"}), &mut never_roots, 4)
        .await
        .unwrap();
    assert_eq!(rounds.len(), 1);
    let text = complete_text(&last);
    assert!(
        text.starts_with("city-answer | roots error -1: refused by the gateway's policy"),
        "{text}"
    );
    assert!(s.refusals("roots", "kind_not_allowed") >= 1.0);

    // The allow-list: only auth.example.com.
    let ex = s.call("open_url", json!({"url": GOOD_URL})).await;
    assert_eq!(only_question(&ex)["params"]["url"], GOOD_URL);
    for url in [
        "https://evil.auth.example.com/authorize",
        "https://auth.example.com.evil.example/",
        "https://example.org/",
    ] {
        let ex = s.call("open_url", json!({"url": url})).await;
        assert_eq!(complete_text(&ex), "url:decline", "{url}");
    }
    assert_eq!(s.refusals("elicitation_url", "url_host_not_allowed"), 3.0);
    s.stop().await;
}

/// Rules refuse each kind: a refused form elicitation is declined, a refused sampling
/// request gets an error naming the gateway's policy; other tools are untouched.
#[tokio::test]
async fn rules_refuse_elicitation_and_sampling_per_tool() {
    let s = start(
        "[[policy.rules]]\nmethod = \"tools/call\"\nname = \"greet\"\nallow = [\"sampling\"]\n\
         [[policy.rules]]\nmethod = \"tools/call\"\nname = \"sample_big\"\nallow = [\"elicitation\", \"roots\"]\n",
    )
    .await;
    let ex = s.call("greet", json!({})).await;
    assert_eq!(complete_text(&ex), "greet: decline");
    assert_eq!(s.refusals("elicitation_form", "kind_not_allowed"), 1.0);

    let ex = s.call("sample_big", json!({})).await;
    complete_text_starting(&ex, "sampling error -1: refused by the gateway's policy");
    assert_eq!(s.refusals("sampling", "kind_not_allowed"), 1.0);

    // A tool no rule names may still ask.
    let ex = s.call("sample_only", json!({})).await;
    assert_eq!(only_question(&ex)["method"], "sampling/createMessage");
    s.stop().await;
}

/// A client that declares roots makes a round wait (up to the gather window) for the
/// `roots/list` FastMCP sends late on the GET stream. A refused one has still come: the round
/// must not wait for it. With a window longer than the call timeout, waiting would end the
/// call with a timeout instead of the round.
#[tokio::test]
async fn a_refused_roots_request_does_not_hold_the_round_open() {
    let legacy = PyLegacyServer::start(&[]).await;
    let cfg = config(
        &legacy.url(),
        "",
        "",
        "[mrtr]\ngather_window = \"60s\"\ngather_quiet = \"5ms\"\n\
         [[policy.rules]]\nmethod = \"tools/call\"\nname = \"where\"\nallow = [\"elicitation\"]\n",
    );
    let (_gw, running, url) = start_gateway(cfg).await;
    let ex = ModernClient::new(&url)
        .request("tools/call", json!({"name": "where"}))
        .await
        .unwrap();
    assert_eq!(only_question(&ex)["params"]["message"], "Which city?");
    running.stop().await;
    legacy.kill().await;
}

#[tokio::test]
async fn malformed_questions_never_reach_the_client() {
    let s = start("").await;

    // The issue's case: no `message` and a nested form schema. The server gets -32602.
    let ex = s.call("malformed_elicit", json!({})).await;
    complete_text_starting(
        &ex,
        "malformed: error -32602: mrtr-gateway refused a malformed request",
    );
    assert_eq!(s.refusals("elicitation_form", "malformed"), 1.0);

    let msg = json!([{"role": "user", "content": {"type": "text", "text": "hi"}}]);
    let cases = [
        (
            "elicitation/create",
            json!({"mode": "wizard", "message": "m"}),
            "elicitation_form",
        ),
        // An unknown mode with an otherwise valid form is still not a form.
        (
            "elicitation/create",
            json!({"mode": "wizard", "message": "m", "requestedSchema": {"type": "object", "properties": {}}}),
            "elicitation_form",
        ),
        (
            "elicitation/create",
            json!({"message": "m", "requestedSchema": {"type": "object", "properties": {
                "tags": {"type": "array", "items": {"type": "object"}}}}}),
            "elicitation_form",
        ),
        (
            "elicitation/create",
            json!({"mode": "url", "message": "m"}),
            "elicitation_url",
        ),
        (
            "sampling/createMessage",
            json!({"messages": msg}),
            "sampling",
        ),
        (
            "sampling/createMessage",
            json!({"maxTokens": 10}),
            "sampling",
        ),
    ];
    for (method, params, kind) in cases {
        let before = s.refusals(kind, "malformed");
        let ex = s
            .call(
                "raw_ask",
                json!({"method": method, "params": params.to_string()}),
            )
            .await;
        let text = complete_text(&ex);
        assert!(
            text.starts_with("error -32602: "),
            "{method} {params}: {text}"
        );
        assert_eq!(s.refusals(kind, "malformed"), before + 1.0, "{params}");
    }

    // The same raw path with well-formed questions reaches the client (the check is not
    // refusing everything sent raw).
    let ok_form = json!({"message": "m", "requestedSchema": {"type": "object", "properties": {"x": {"type": "string"}}}});
    let ex = s
        .call(
            "raw_ask",
            json!({"method": "elicitation/create", "params": ok_form.to_string()}),
        )
        .await;
    assert_eq!(only_question(&ex)["params"]["message"], "m");
    let ok_sampling = json!({"messages": msg, "maxTokens": 10});
    let ex = s
        .call(
            "raw_ask",
            json!({"method": "sampling/createMessage", "params": ok_sampling.to_string()}),
        )
        .await;
    assert_eq!(only_question(&ex)["params"]["maxTokens"], 10);

    let ex = s.call("add", json!({"a": 1, "b": 1})).await;
    assert_eq!(complete_text(&ex), "2");
    s.stop().await;
}

/// URLs written into a question's text are links in most clients: the message, a field's
/// description and its default are judged by the URL rules too (`policy.url.review_text`),
/// and a question carrying an unsafe one never reaches the client.
#[tokio::test]
async fn unsafe_urls_in_a_questions_text_hold_the_question_back() {
    let s = start("").await;
    let form = |message: &str, field: Value| {
        json!({"method": "elicitation/create", "params": json!({
            "message": message,
            "requestedSchema": {"type": "object", "properties": {"site": field}}
        }).to_string()})
    };
    let plain = json!({"type": "string"});
    let cases = [
        form(
            "Sign in at https://169.254.169.254/latest/meta-data first",
            plain.clone(),
        ),
        form(
            "Paste this: javascript:alert(document.cookie)",
            plain.clone(),
        ),
        form(
            "Which site?",
            json!({"type": "string", "description": "e.g. https://metadata.google.internal/"}),
        ),
        form(
            "Which site?",
            json!({"type": "string", "default": "https://127.0.0.1:8080/steal"}),
        ),
    ];
    for (i, args) in cases.into_iter().enumerate() {
        let ex = s.call("raw_ask", args).await;
        // Refused: the legacy server was told "decline", and no question came to the client.
        assert!(complete_text(&ex).contains("decline"), "case {i}");
        assert_eq!(
            s.refusals("elicitation_form", "url_in_text"),
            (i + 1) as f64
        );
    }
    // A safe link in the text passes, as written.
    let ex = s
        .call(
            "raw_ask",
            form("Read https://auth.example.com/help first", plain),
        )
        .await;
    assert_eq!(
        only_question(&ex)["params"]["message"],
        "Read https://auth.example.com/help first"
    );
    s.stop().await;

    // Off: the same question reaches the client.
    let s = start("[policy.url]\nreview_text = false\n").await;
    let ex = s
        .call(
            "raw_ask",
            form("Paste this: javascript:alert(1)", json!({"type": "string"})),
        )
        .await;
    assert_eq!(
        only_question(&ex)["params"]["message"],
        "Paste this: javascript:alert(1)"
    );
    s.stop().await;
}

/// A POST of `body` on the passed-through legacy session `session` (a 2025-11-25 client).
async fn on_legacy_session(c: &ModernClient, session: &str, body: Value) -> Exchange {
    c.send_raw(
        http::Method::POST,
        headers(&[
            ("mcp-session-id", session),
            ("mcp-protocol-version", "2025-11-25"),
        ]),
        bytes::Bytes::from(body.to_string()),
    )
    .await
    .unwrap()
}

/// A legacy error's `data` goes to the client as it is, unless it carries a URL the policy
/// refuses: then it is dropped (code and message still go through) and counted. The same on
/// both paths: a 2026-07-28 client's call, and a legacy client's session passed through.
#[tokio::test]
async fn a_legacy_errors_data_with_an_unsafe_url_is_dropped() {
    let handlers = Handlers::new()
        .tool(
            "bad_help",
            "fails with a bad link",
            json!({"type": "object"}),
            |_c, _a| async {
                Err(mrtr_testkit::legacy_server::RpcError::new(-32000, "broken")
                    .with_data(json!({"help": ["see", "http://10.0.0.1/admin"]})))
            },
        )
        .tool(
            "good_help",
            "fails with a good link",
            json!({"type": "object"}),
            |_c, _a| async {
                Err(mrtr_testkit::legacy_server::RpcError::new(-32000, "broken")
                    .with_data(json!({"help": "https://docs.example.com/errors#broken"})))
            },
        );
    let env = env(handlers).await;
    let client = env.client();
    // The bad error reaches the client without its data, the good one with it; `dropped` so
    // far on every path.
    let check = |bad: Exchange, good: Exchange, dropped: f64| {
        let error = &bad.message.as_ref().unwrap()["error"];
        assert_eq!(error["message"], "broken", "{error}");
        assert!(error.get("data").is_none(), "{error}");
        assert!(
            !String::from_utf8_lossy(&bad.raw_body).contains("10.0.0.1"),
            "the URL reached the client"
        );
        assert_eq!(
            good.message.as_ref().unwrap()["error"]["data"]["help"],
            "https://docs.example.com/errors#broken"
        );
        assert_eq!(
            metric(
                &env.gw,
                "mrtr_gateway_policy_refusals_total",
                &[("kind", "error_data"), ("reason", "url_in_text")]
            ),
            dropped
        );
    };
    check(
        call_tool(&client, "bad_help").await,
        call_tool(&client, "good_help").await,
        1.0,
    );

    // A legacy client on the dual-era front: its session is relayed, its errors reviewed.
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw-legacy", "version": "1"}}});
    let init = client
        .send_raw(
            http::Method::POST,
            http::HeaderMap::new(),
            bytes::Bytes::from(initialize.to_string()),
        )
        .await
        .unwrap();
    assert_eq!(init.result().unwrap()["protocolVersion"], "2025-11-25");
    let session = init.headers["mcp-session-id"].to_str().unwrap().to_string();
    let call = |id: i64, name: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": name, "arguments": {}}})
    };
    check(
        on_legacy_session(&client, &session, call(1, "bad_help")).await,
        on_legacy_session(&client, &session, call(2, "good_help")).await,
        2.0,
    );
    env.stop().await;
}

#[tokio::test]
async fn a_legacy_result_cannot_forge_a_round() {
    let s = start("").await;
    let ex = s.call("forge", json!({})).await;
    assert_eq!(complete_text(&ex), "forged fields below");
    let r = ex.result().unwrap();
    for field in ["inputRequests", "requestState", "ttlMs", "cacheScope"] {
        assert!(r.get(field).is_none(), "{field} passed through: {r}");
    }
    assert!(!String::from_utf8_lossy(&ex.raw_body).contains("javascript:"));
    for field in [
        "resultType",
        "inputRequests",
        "requestState",
        "ttlMs",
        "cacheScope",
    ] {
        assert_metric!(
            &s.gw,
            "legacy_result_fields_dropped_total",
            &[("field", field)],
            1.0,
            "{field}"
        );
    }
    s.stop().await;
}

/// A tool asks a form question (allowed), then — once answered — a URL the policy refuses.
/// Resumed from the parking lot or replayed, the second round ends the same way.
#[tokio::test]
async fn a_refused_question_behaves_the_same_in_a_parked_and_a_replayed_call() {
    let legacy = PyLegacyServer::start(&[]).await;
    let mut finals = Vec::new();
    for (policy, path) in [("park-then-replay", "parked"), ("replay", "replayed")] {
        let cfg = gateway_config(
            &legacy,
            &format!("[parking]\ndefault_policy = \"{policy}\"\n"),
        );
        let (gw, running, url) = start_gateway(cfg).await;
        let client = ModernClient::new(&url).with_capabilities(
            json!({"elicitation": {"form": {}, "url": {}}, "sampling": {}, "roots": {}}),
        );
        let (rounds, last) = client
            .call_with_input(
                "tools/call",
                json!({"name": "ask_then_open", "arguments": {"url": "https://169.254.169.254/latest/meta-data/"}}),
                &mut accept_all,
                4,
            )
            .await
            .unwrap();
        assert_eq!(rounds.len(), 1, "{policy}: only the name is asked");
        assert_eq!(
            rounds[0].input_requests.values().next().unwrap()["params"]["mode"],
            "form"
        );
        assert_eq!(
            metric(&gw, "mrtr_gateway_retries_total", &[("path", path)]),
            1.0,
            "{policy}"
        );
        assert_eq!(
            metric(
                &gw,
                "mrtr_gateway_policy_refusals_total",
                &[
                    ("kind", "elicitation_url"),
                    ("reason", "url_non_public_address")
                ]
            ),
            1.0,
            "{policy}"
        );
        finals.push(complete_text(&last));
        running.stop().await;
    }
    assert_eq!(finals[0], "name-answer:decline");
    assert_eq!(finals[0], finals[1]);
    legacy.kill().await;
}

/// Runs on the test's single thread, so the thread-local subscriber sees every task.
#[tokio::test(flavor = "current_thread")]
async fn a_refusal_is_logged_with_request_id_tool_kind_reason_and_only_scheme_and_host() {
    let (logs, _guard) = crate::support::logs::on_this_thread();

    let s = start("").await;
    let ex = s
        .call(
            "open_url",
            json!({"url": "https://0x7f000001/admin/panel?token=SECRET-TOKEN"}),
        )
        .await;
    assert_eq!(complete_text(&ex), "url:decline");
    s.stop().await;

    let lines = logs.lines();
    let refusal: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("policy refused"))
        .collect();
    assert_eq!(refusal.len(), 1, "{lines:#?}");
    let line = refusal[0];
    assert!(line.contains(" WARN "), "{line}");
    for part in [
        "tool=\"open_url\"",
        "kind=\"elicitation_url\"",
        "reason=\"url_non_public_address\"",
        "url_scheme=\"https\"",
        "url_host=\"127.0.0.1\"",
    ] {
        assert!(line.contains(part), "{part} missing: {line}");
    }
    for secret in ["/admin", "panel", "token", "SECRET"] {
        assert!(!line.contains(secret), "{secret} logged: {line}");
    }
    // The request id is the one of the request's own access-log line.
    let id = line
        .split("request_id=")
        .nth(1)
        .and_then(|rest| rest.split([' ', '}']).next())
        .unwrap_or_else(|| panic!("no request id: {line}"));
    let access = lines
        .iter()
        .find(|l| l.contains("request done") && l.contains(&format!("request_id={id}")))
        .unwrap_or_else(|| panic!("no access line for {id}: {lines:#?}"));
    // The access line names what was called and how long it took, and nothing of the call's
    // arguments.
    assert!(access.contains("call_target=\"open_url\""), "{access}");
    assert!(access.contains("duration_ms="), "{access}");
    assert!(!access.contains("SECRET"), "{access}");
}

#[tokio::test]
async fn reload_applies_a_new_policy_to_new_questions() {
    let s = start("").await;
    let ex = s.call("sample_big", json!({})).await;
    assert_eq!(only_question(&ex)["params"]["maxTokens"], 100000);
    s.gw
        .apply_config(gateway_config(
            &s.legacy,
            "[policy.sampling]\nmax_tokens = 64\n[[policy.rules]]\nmethod = \"tools/call\"\nname = \"open_url\"\nallow = []\n",
        ))
        .unwrap();
    let ex = s.call("sample_big", json!({})).await;
    assert_eq!(only_question(&ex)["params"]["maxTokens"], 64);
    let ex = s.call("open_url", json!({"url": GOOD_URL})).await;
    assert_eq!(complete_text(&ex), "url:decline");
    assert_eq!(s.refusals("elicitation_url", "kind_not_allowed"), 1.0);
    s.stop().await;
}

/// Edge case with the in-repo server: a URL elicitation on the standalone GET stream, and a
/// sampling request there, go through the same stage.
#[tokio::test]
async fn questions_on_the_standalone_get_stream_are_reviewed_too() {
    let handlers = Handlers::new().tool(
        "get_stream_asks",
        "URL elicitation and sampling on the GET stream",
        json!({"type": "object"}),
        |ctx, _args| async move {
            let url = ctx
                .request_on_get_stream(
                    "elicitation/create",
                    json!({"mode": "url", "message": "m", "url": "https://[::ffff:7f00:1]/", "elicitationId": "g1"}),
                )
                .await;
            let sampling = ctx
                .request_on_get_stream(
                    "sampling/createMessage",
                    json!({"messages": [{"role": "user", "content": {"type": "text", "text": "x"}}], "maxTokens": 5}),
                )
                .await;
            let describe = |r: Result<Value, _>| match r {
                Ok(v) => v.to_string(),
                Err(e) => format!("{e:?}"),
            };
            Ok(tool_text(format!(
                "url {} | sampling {}",
                describe(url),
                describe(sampling)
            )))
        },
    );
    let env = env_with(
        LegacyServerConfig::default(),
        handlers,
        "",
        "[[policy.rules]]\nmethod = \"tools/call\"\nallow = [\"elicitation\"]\n",
    )
    .await;
    let ex = env
        .client()
        .with_capabilities(json!({"elicitation": {"form": {}, "url": {}}, "sampling": {}}))
        .request("tools/call", json!({"name": "get_stream_asks"}))
        .await
        .unwrap();
    let text = complete_text_starting(&ex, "url {\"action\":\"decline\"} | sampling ");
    assert!(text.contains("refused by the gateway's policy"), "{text}");
    assert_metric!(
        &env.gw,
        "policy_refusals_total",
        &[("kind", "sampling"), ("reason", "kind_not_allowed")],
        1.0
    );
    env.stop().await;
}

#[test]
fn check_config_names_the_policy_key_and_variable() {
    let dir = crate::support::peers::tempdir::TempDir::new("mrtr-policy-config");
    let path = dir.path().join("g.toml");
    let keys = format!("[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n");
    let run = |text: &str, vars: &[(&str, &str)]| {
        std::fs::write(&path, format!("{keys}{text}")).unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mrtr-gateway"));
        cmd.args(["check-config", "--config"]).arg(&path);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    for (text, key) in [
        (
            "[policy.url]\nallow_hosts = [\"https://auth.example.com\"]\n",
            "policy.url.allow_hosts[0]",
        ),
        (
            "[[policy.rules]]\nmethod = \"tools/call\"\nallow = [\"everything\"]\n",
            "policy.rules[0].allow[0]",
        ),
        (
            "[[policy.rules]]\nname = \"where\"\nallow = [\"roots\"]\n",
            "policy.rules[0].method",
        ),
    ] {
        let (code, err) = run(text, &[]);
        assert_eq!(code, Some(64), "{text}: {err}");
        assert!(err.contains(key), "{text}: {err}");
    }
    let (code, err) = run(
        "",
        &[(
            "MRTR_GATEWAY__POLICY__URL__DENY_HOSTS",
            "[\"*.ok.example\", \"a*b\"]",
        )],
    );
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("policy.url.deny_hosts[1]")
            && err.contains("MRTR_GATEWAY__POLICY__URL__DENY_HOSTS"),
        "{err}"
    );
    let (code, err) = run(ISSUE_POLICY, &[]);
    assert_eq!(code, Some(0), "{err}");
}
