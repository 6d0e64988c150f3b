//! Rounds that close as soon as what they ask has come (`mrtr::round_shapes`), against the
//! Python SDK's FastMCP server, which sends `roots/list` on its GET stream behind the
//! questions on the call's stream, so a round for a client that declares roots waits for it.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::peers::PyLegacyServer;
use crate::support::*;
use mrtr_testkit::client::ModernClient;

/// A window long enough that a round waiting for it cannot be mistaken for one that did not.
const WINDOW: Duration = Duration::from_secs(3);

fn roots_declaring_client(url: &str) -> ModernClient {
    ModernClient::new(url)
        .with_capabilities(json!({"elicitation": {"form": {}}, "roots": {"listChanged": true}}))
}

/// Sends `greet` and checks its first round is the one form question; returns how long the
/// round took.
async fn first_round(client: &ModernClient) -> Duration {
    let started = Instant::now();
    let ex = client
        .request("tools/call", json!({"name": "greet"}))
        .await
        .unwrap();
    assert_eq!(ex.result_type(), Some("input_required"));
    let requests: Vec<Value> = ex.result().unwrap()["inputRequests"]
        .as_object()
        .unwrap()
        .values()
        .cloned()
        .collect();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0]["method"], "elicitation/create");
    started.elapsed()
}

fn closed_by(gw: &mrtr_gateway::gateway::Gateway, by: &str) -> f64 {
    metric(gw, "mrtr_gateway_rounds_closed_total", &[("by", by)])
}

/// `greet` asks one form question and never `roots/list`. The first round for a client that
/// declares roots is held open for a `roots/list` that might lag (the whole window); the
/// gateway then knows the round, so the same call's next first round closes at its question.
#[tokio::test]
async fn a_known_round_closes_at_its_question_instead_of_waiting_for_roots() {
    let legacy = PyLegacyServer::start(&[]).await;
    let mrtr = format!(
        "[mrtr]\ngather_window = \"{}s\"\ngather_quiet = \"20ms\"\n",
        WINDOW.as_secs()
    );
    let (gw, running, url) = start_gateway(config(&legacy.url(), "", "", &mrtr)).await;
    let client = roots_declaring_client(&url);

    let unknown = first_round(&client).await;
    assert!(
        unknown >= WINDOW,
        "an unknown round waits for roots: {unknown:?}"
    );
    assert_eq!(closed_by(&gw, "window"), 1.0);
    assert_eq!(
        metric(&gw, "mrtr_gateway_learned_rounds", &[]),
        1.0,
        "the round was learned"
    );

    let known = first_round(&client).await;
    assert!(known < WINDOW, "a known round does not wait: {known:?}");
    assert_eq!(closed_by(&gw, "learned"), 1.0);
    assert_eq!(closed_by(&gw, "window"), 1.0, "no second wait");

    // Closing early changes nothing the client sees: the flow completes as before.
    let (rounds, ex) = client
        .call_with_input("tools/call", json!({"name": "greet"}), &mut answer, 4)
        .await
        .unwrap();
    assert_eq!(rounds.len(), 1);
    assert_eq!(text(ex.result().unwrap()), "Hello, name-answer!");
    running.stop().await;
    legacy.kill().await;
}
