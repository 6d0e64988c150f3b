//! Shared pieces of the integration tests: a gateway in front of the in-repo legacy server,
//! configurations, and the scripted answers a test client gives.

/// `assert_eq!` on one sample of scraped Prometheus text:
/// `assert_sample!(&text, name, labels, want)`, the name without its `mrtr_gateway_` prefix (as
/// `deploy::metric_names` lists them), with an optional message as `assert_eq!` takes.
macro_rules! assert_sample {
    ($text:expr, $name:literal, $labels:expr, $want:expr $(, $($msg:tt)+)?) => {
        assert_eq!(
            $crate::support::sample($text, concat!("mrtr_gateway_", $name), $labels),
            $want
            $(, $($msg)+)?
        )
    };
}

/// `assert_sample!` on a gateway's own metrics: `assert_metric!(&gw, name, labels, want)`.
macro_rules! assert_metric {
    ($gw:expr, $($rest:tt)+) => {
        assert_sample!(&($gw).metrics.render(), $($rest)+)
    };
}

pub mod admin;
pub mod logs;
pub mod nginx;
pub mod peers;
pub mod procs;
pub mod round_robin;
pub mod tls;

pub use peers::tempdir::TempDir;

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use mrtr_gateway::config::Config;
use mrtr_gateway::front::listener::{self, Running};
use mrtr_gateway::gateway::Gateway;
use mrtr_testkit::client::{Exchange, ModernClient, Round};
use mrtr_testkit::legacy_server::{Handlers, LegacyServer, LegacyServerConfig, ServerStats};
use serde_json::{Value, json};

pub const TEST_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// A gateway configuration for `upstream`, with `extra` TOML sections appended (they may
/// not repeat `[listen]`, `[upstream]` or `[state]`; use `upstream_extra`/`state_extra`).
pub fn config(upstream: &str, upstream_extra: &str, state_extra: &str, extra: &str) -> Config {
    config_with_upstream(
        &format!(
            "url = \"{upstream}\"\nresponse_timeout = \"5s\"\ncall_timeout = \"20s\"\n{upstream_extra}"
        ),
        state_extra,
        extra,
    )
}

/// A gateway configuration whose whole `[upstream]` table is `upstream` (for transports and
/// timeouts other than the defaults `config` writes).
pub fn config_with_upstream(upstream: &str, state_extra: &str, extra: &str) -> Config {
    let text = format!(
        "[listen]\naddr = \"127.0.0.1:0\"\n\
         [upstream]\n{upstream}\n\
         [state]\n{state_extra}\n\
         [[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n\
         {extra}\n"
    );
    Config::from_toml_str(&text, &[], None).unwrap_or_else(|e| panic!("test config: {e}\n{text}"))
}

/// `items` as a TOML array of strings.
pub fn toml_strings<S: AsRef<str>>(items: &[S]) -> String {
    let v: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
    // JSON string escapes are valid TOML basic-string escapes.
    serde_json::to_string(&v).expect("strings serialize")
}

pub struct Env {
    pub legacy: LegacyServer,
    pub gw: Arc<Gateway>,
    pub running: Running,
    pub url: String,
}

impl Env {
    /// A gateway with `cfg` in front of `legacy` (which `cfg` should point at).
    pub async fn start(legacy: LegacyServer, cfg: Config) -> Env {
        let (gw, running, url) = start_gateway(cfg).await;
        Env {
            legacy,
            gw,
            running,
            url,
        }
    }

    pub fn client(&self) -> ModernClient {
        ModernClient::new(&self.url)
    }

    pub async fn stop(self) {
        // As `serve` does when it stops accepting: long-lived streams end instead of holding
        // the drain.
        self.gw.drain.close();
        self.running.stop().await;
        self.legacy.shutdown().await;
    }
}

pub async fn start_gateway(cfg: Config) -> (Arc<Gateway>, Running, String) {
    // WARN lines are kept, so a test can find a failure's detail by the client's request id.
    logs::capture();
    let gw = Gateway::new(cfg);
    let running = listener::start(gw.front.clone(), gw.config().listen.addr)
        .await
        .expect("gateway binds");
    let url = format!("http://{}{}", running.addr, gw.config().listen.path);
    (gw, running, url)
}

/// The in-repo legacy server with `handlers`, and a gateway in front of it.
pub async fn env_with(
    server: LegacyServerConfig,
    handlers: Handlers,
    state_extra: &str,
    extra: &str,
) -> Env {
    let legacy = LegacyServer::start(server, handlers)
        .await
        .expect("legacy server starts");
    let cfg = config(&legacy.url(), "", state_extra, extra);
    Env::start(legacy, cfg).await
}

pub async fn env(handlers: Handlers) -> Env {
    env_with(LegacyServerConfig::default(), handlers, "", "").await
}

/// A port that was free a moment ago, for a server started in another process.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The key of the first input request in an `input_required` result.
pub fn input_key(result: &Value) -> String {
    result["inputRequests"]
        .as_object()
        .expect("an input_required result has inputRequests")
        .keys()
        .next()
        .expect("at least one input request")
        .clone()
}

/// Adds a `greet` tool that asks for a name with a one-field form (`prompt`) and answers
/// `reply(name)` ("?" when the answer has no name).
pub fn name_asking_tool(
    handlers: Handlers,
    description: &'static str,
    prompt: &'static str,
    reply: fn(&str) -> String,
) -> Handlers {
    handlers.tool(
        "greet",
        description,
        json!({"type": "object"}),
        move |ctx, _| async move {
            let a = ctx.elicit_form(prompt, form("name")).await?;
            Ok(tool_text(reply(
                a["content"]["name"].as_str().unwrap_or("?"),
            )))
        },
    )
}

/// The `greet` tool most modules share: "What is your name?", then "Hello, <name>!".
pub fn greet_handlers() -> Handlers {
    name_asking_tool(
        Handlers::new(),
        "asks a name",
        "What is your name?",
        |name| format!("Hello, {name}!"),
    )
}

/// Calls the tool `name` with no arguments through `c` (one request, no answers).
pub async fn call_tool(c: &ModernClient, name: &str) -> Exchange {
    c.request("tools/call", json!({"name": name, "arguments": {}}))
        .await
        .expect("the request gets an answer")
}

/// Calls `greet` through `c`, answering its questions with [`answer`], in at most
/// `max_rounds` rounds; the rounds and the last exchange.
pub async fn greet_flow(c: &ModernClient, max_rounds: u32) -> (Vec<Round>, Exchange) {
    c.call_with_input(
        "tools/call",
        json!({"name": "greet", "arguments": {}}),
        &mut answer,
        max_rounds,
    )
    .await
    .expect("the greet flow runs")
}

/// A header map of `pairs` (names and values as given).
pub fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

/// A one-field form schema.
pub fn form(field: &str) -> Value {
    json!({"type": "object", "properties": {field: {"type": "string"}}, "required": [field]})
}

pub fn text(result: &Value) -> String {
    result
        .pointer("/content/0/text")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

pub fn tool_text(s: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": s.into()}]})
}

/// Answers as a cooperative user and model would: form fields get `"<field>-answer"`,
/// sampling says "sampled", roots are one project directory.
pub fn answer(_key: &str, req: &Value) -> Result<Value, String> {
    match req["method"].as_str() {
        Some("elicitation/create") => {
            let mut content = serde_json::Map::new();
            if let Some(props) = req
                .pointer("/params/requestedSchema/properties")
                .and_then(Value::as_object)
            {
                for k in props.keys() {
                    content.insert(k.clone(), json!(format!("{k}-answer")));
                }
            }
            Ok(json!({"action": "accept", "content": content}))
        }
        Some("sampling/createMessage") => Ok(json!({
            "role": "assistant", "content": {"type": "text", "text": "sampled"},
            "model": "m", "stopReason": "endTurn"
        })),
        Some("roots/list") => Ok(json!({"roots": [{"uri": "file:///work/project", "name": "p"}]})),
        other => Err(format!("unexpected input request {other:?}")),
    }
}

/// Polls `cond` until it holds or `timeout` passes.
pub async fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits up to `within` for a sample of the gateway's metrics to equal `want`; whether it did.
pub async fn metric_reaches(
    gw: &Gateway,
    name: &str,
    labels: &[(&str, &str)],
    want: f64,
    within: Duration,
) -> bool {
    eventually(within, || metric(gw, name, labels) == want).await
}

/// Asserts that within 5 s the legacy server has seen exactly one cancellation, holds no live
/// session, and `also` holds; the failure shows the cancellations and live sessions.
pub async fn assert_cancelled_upstream(stats: &ServerStats, also: impl Fn(&ServerStats) -> bool) {
    assert!(
        stats
            .wait_until(
                |s| s.cancellations().len() == 1 && s.sessions_live() == 0 && also(s),
                Duration::from_secs(5)
            )
            .await,
        "cancellations {:?}, live {}",
        stats.cancellations(),
        stats.sessions_live()
    );
}

/// Upstream HTTP connections the gateway opened (for any method), and closed mid-response
/// (`unfinished`), so far.
pub fn upstream_connections(gw: &Gateway) -> (f64, f64) {
    let opened = ["GET", "POST", "DELETE", "other"]
        .iter()
        .map(|m| {
            metric(
                gw,
                "mrtr_gateway_upstream_connections_opened_total",
                &[("method", m)],
            )
        })
        .sum();
    let unfinished = metric(
        gw,
        "mrtr_gateway_upstream_connections_closed_total",
        &[("reason", "unfinished")],
    );
    (opened, unfinished)
}

/// The value of a metric sample line, e.g. `mrtr_gateway_requests_total{method="tools/call",outcome="complete"}`.
pub fn metric(gw: &Gateway, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(&gw.metrics.render(), name, labels)
}

/// The first sample of `name` whose labels include `labels`, in Prometheus text; 0 if none.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    for line in text.lines() {
        if line.starts_with('#') || !line.starts_with(name) {
            continue;
        }
        let rest = &line[name.len()..];
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if labels
            .iter()
            .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
        {
            return line.rsplit(' ').next().unwrap().parse().unwrap();
        }
    }
    0.0
}
