//! A drain and the claimed retries whose client went away (issue 23, point 7): the process
//! waits for them up to `drain.deadline` and keeps their outcome in the single-use store, so a
//! duplicate presented to another replica sharing that store gets it; one still running at
//! the deadline is recorded as outcome lost at once, so its duplicates are told to start over
//! without waiting for the run lease. Two gateway processes share a real `redis-server`.

use std::time::Duration;

use crate::support::procs::{spawn_gateway, start_redis};
use crate::support::*;
use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mrtr_testkit::client::ModernClient;
use mrtr_testkit::legacy_server::{Handlers, LegacyServer, LegacyServerConfig};
use serde_json::{Value, json};

/// `transfer` asks for a confirmation, reports progress, then works for `work_ms`.
fn confirm_then_work(work_ms: u64) -> Handlers {
    Handlers::new().tool(
        "transfer",
        "asks, then works",
        json!({"type": "object"}),
        move |ctx, _| async move {
            let ok = ctx.elicit_form("Transfer?", form("confirm")).await?;
            ctx.progress(1.0, Some(2.0), Some("working"));
            tokio::time::sleep(Duration::from_millis(work_ms)).await;
            Ok(tool_text(format!(
                "transferred ({})",
                ok["content"]["confirm"].as_str().unwrap_or("?")
            )))
        },
    )
}

struct Fleet {
    legacy: LegacyServer,
    /// The replica that drains.
    a: tokio::process::Child,
    url_a: String,
    /// The replica that stays.
    url_b: String,
    _b: tokio::process::Child,
    _redis: crate::support::procs::Redis,
    dir: std::path::PathBuf,
}

async fn fleet(name: &str, work_ms: u64, deadline: &str) -> Fleet {
    let redis = start_redis().await;
    let legacy = LegacyServer::start(LegacyServerConfig::default(), confirm_then_work(work_ms))
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("mrtr-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shared = format!(
        "[upstream]\nurl = \"{}\"\ncall_timeout = \"60s\"\n\
         [single_use]\nstore = \"redis\"\n[single_use.redis]\nurls = [\"redis://127.0.0.1:{}/0\"]\n\
         [drain]\nreadiness_delay = \"100ms\"\ndeadline = \"{deadline}\"\n\
         [log]\nformat = \"text\"\n[[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n",
        legacy.url(),
        redis.port
    );
    let (a, url_a, _) = spawn_gateway(&shared, &dir, "gw-a").await;
    let (b, url_b, _) = spawn_gateway(&shared, &dir, "gw-b").await;
    Fleet {
        legacy,
        a,
        url_a,
        url_b,
        _b: b,
        _redis: redis,
        dir,
    }
}

/// Round 1 on replica A, then the retry with its answer on A, whose client leaves as soon as
/// the call reports progress (the tool body is running); returns the retry's params.
async fn retry_then_leave(f: &Fleet) -> Value {
    let c = ModernClient::new(&f.url_a);
    let meta = json!({"progressToken": "t"});
    let round1 = c
        .request(
            "tools/call",
            json!({"name": "transfer", "arguments": {}, "_meta": meta}),
        )
        .await
        .unwrap();
    let first = round1.result().expect("round 1 asks").clone();
    let key = input_key(&first);
    let retry = json!({"name": "transfer", "arguments": {}, "_meta": meta,
        "requestState": first["requestState"],
        "inputResponses": {&key: {"action": "accept", "content": {"confirm": "yes"}}}});
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": c.params_with_meta(retry.clone())});
    let raw = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = Request::post(&f.url_a)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    req.headers_mut()
        .extend(ModernClient::routing_headers(&body));
    let resp = raw.request(req).await.unwrap();
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut stream = resp.into_body();
    let progress = stream.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(
        String::from_utf8_lossy(&progress).contains("notifications/progress"),
        "{progress:?}"
    );
    drop(stream);
    drop(raw);
    retry
}

fn sigterm(child: &tokio::process::Child) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn a_drain_finishes_a_retry_whose_client_left_and_another_replica_gets_its_outcome() {
    let mut f = fleet("drain-keeps", 1500, "20s").await;
    let retry = retry_then_leave(&f).await;
    // The client is gone, so no connection holds the drain: only the claimed run does.
    sigterm(&f.a);
    let status = tokio::time::timeout(Duration::from_secs(15), f.a.wait())
        .await
        .expect("replica A exits within its drain")
        .unwrap();
    assert!(status.success(), "{status:?}");
    // Replica B shares the store: the first presentation gets the kept outcome, never
    // "in progress" (the run died with its process) and never a second run.
    let again = ModernClient::new(&f.url_b)
        .request("tools/call", retry)
        .await
        .unwrap();
    assert_eq!(
        again.result().map(text).as_deref(),
        Some("transferred (yes)"),
        "{} {:?}",
        again.status,
        again.message
    );
    let stats = f.legacy.stats();
    assert_eq!(
        stats.tool_starts("transfer"),
        1,
        "resumed, never re-executed"
    );
    assert_eq!(stats.tool_finishes("transfer"), 1);
    let log = std::fs::read_to_string(f.dir.join("gw-a.log")).unwrap();
    assert!(
        log.contains("waiting for claimed retries"),
        "the drain did not say it waited:\n{log}"
    );
    let _ = std::fs::remove_dir_all(&f.dir);
    f.legacy.shutdown().await;
}

#[tokio::test]
async fn a_retry_that_outlives_the_drain_deadline_is_outcome_lost_at_once() {
    let mut f = fleet("drain-loses", 30_000, "1s").await;
    let retry = retry_then_leave(&f).await;
    let t0 = std::time::Instant::now();
    sigterm(&f.a);
    let status = tokio::time::timeout(Duration::from_secs(15), f.a.wait())
        .await
        .expect("replica A exits at its drain deadline")
        .unwrap();
    assert!(status.success(), "{status:?}");
    eprintln!("replica A exited {:?} after SIGTERM", t0.elapsed());
    // At once, on the other replica: the outcome was lost (start over), not "in progress"
    // until the run lease (call_timeout 60s + claim_lease) ran out.
    let dup = ModernClient::new(&f.url_b)
        .request("tools/call", retry)
        .await
        .unwrap();
    assert_eq!(dup.status.as_u16(), 409, "{:?}", dup.message);
    assert_eq!(
        dup.error_code(),
        Some(-32602),
        "told to wait instead of to start over: {:?}",
        dup.message
    );
    let message = dup.error().unwrap()["message"].as_str().unwrap().to_owned();
    assert!(message.contains("lost"), "{message}");
    // The call was cancelled upstream rather than cut off.
    assert!(
        f.legacy
            .stats()
            .wait_until(|s| !s.cancellations().is_empty(), Duration::from_secs(5))
            .await,
        "the legacy call was not cancelled"
    );
    assert_eq!(f.legacy.stats().tool_finishes("transfer"), 0);
    let log = std::fs::read_to_string(f.dir.join("gw-a.log")).unwrap();
    assert!(log.contains("recorded as outcome lost"), "{log}");
    let _ = std::fs::remove_dir_all(&f.dir);
    f.legacy.shutdown().await;
}
