//! Ingress validation per request: `front::ingress::parse_envelope` (JSON and JSON-RPC
//! envelope) followed by `validate` (routing headers against the body, version, `_meta`), on
//! the bodies a 2026-07-28 client sends: a first `tools/call`, and a retry carrying
//! `inputResponses` and a ~1 KB `requestState`.
//!
//! ```sh
//! cargo bench --bench ingress
//! ```

use std::time::Duration;

use bytes::Bytes;
use divan::counter::BytesCount;
use divan::{Bencher, black_box};
use http::HeaderMap;
use mrtr_gateway::front::ingress::{Parsed, parse_envelope, validate};
use mrtr_testkit::client::ModernClient;
use serde_json::{Value, json};

fn main() {
    divan::Divan::default()
        .max_time(Duration::from_millis(700))
        .config_with_args()
        .main();
}

fn request(params: Value) -> (Bytes, HeaderMap) {
    // The URL is never used: only the request-building helpers are.
    let client = ModernClient::new("http://127.0.0.1:1/mcp");
    let body = json!({
        "jsonrpc": "2.0",
        "id": 42,
        "method": "tools/call",
        "params": client.params_with_meta(params),
    });
    let headers = ModernClient::routing_headers(&body);
    (
        serde_json::to_vec(&body).expect("serializes").into(),
        headers,
    )
}

fn first_call() -> (Bytes, HeaderMap) {
    request(json!({
        "name": "plan_trip",
        "arguments": {"destination": "Lisbon", "nights": 4, "notes": "window seat, vegetarian"},
        "_meta": {"progressToken": "t-1"}
    }))
}

fn retry() -> (Bytes, HeaderMap) {
    let state = format!("m1.k1.{}", "A".repeat(1000));
    request(json!({
        "name": "plan_trip",
        "arguments": {"destination": "Lisbon", "nights": 4, "notes": "window seat, vegetarian"},
        "inputResponses": {
            "elicit-3f2a9c1b7d4e": {"action": "accept", "content": {"start": "2026-09-01", "budget": "mid"}}
        },
        "requestState": state
    }))
}

fn bench_body(bencher: Bencher, (body, headers): (Bytes, HeaderMap)) {
    bencher
        .counter(BytesCount::new(body.len()))
        .bench_local(|| match parse_envelope(black_box(&body)) {
            Ok(Parsed::Request(env)) => validate(black_box(&headers), &env).expect("valid"),
            _ => unreachable!("the body is a valid request"),
        });
}

#[divan::bench]
fn first_tools_call(bencher: Bencher) {
    bench_body(bencher, first_call());
}

#[divan::bench]
fn retry_with_state(bencher: Bencher) {
    bench_body(bencher, retry());
}
