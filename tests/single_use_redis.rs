//! The Redis single-use store against a real `redis-server` on a free loopback port.
//!
//! Each test starts its own server (no persistence, bound to 127.0.0.1), waits until it
//! answers PING, and kills it when the test ends (`kill_on_drop`). Two `SingleUseStore` values
//! built from one configuration stand for two gateway replicas sharing that Redis.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mrtr_gateway::error::Rejection;
use mrtr_gateway::single_use::config::RawSingleUse;
use mrtr_gateway::single_use::{
    Claim, Completion, SingleUseConfig, SingleUseMetrics, SingleUseStore, StoreError,
};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const MINUTE: Duration = Duration::from_secs(60);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);
/// Scheduling slack allowed on top of the command timeout on a busy 2-core machine.
const SLACK: Duration = Duration::from_millis(400);

/// A `redis-server` child process.
struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    async fn start(extra: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        // A free port can be taken between probing and binding; try a few.
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("single_use_redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let mut server = RedisServer {
                child: None,
                port,
                dir,
                extra: extra.clone(),
            };
            match server.spawn().await {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    async fn spawn(&mut self) -> Result<(), String> {
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("redis-server exited: {status}"));
            }
            if ping(self.port).await {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("redis-server did not answer PING within 10 s".into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
        assert!(!ping(self.port).await, "redis-server still answers");
    }

    async fn restart(&mut self) {
        self.spawn().await.expect("restart on the same port");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    async fn admin(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// True when something on `port` answers PING with PONG within a second.
async fn ping(port: u16) -> bool {
    let attempt = async {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/0")).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let pong: String = redis::cmd("PING").query_async(&mut conn).await.ok()?;
        Some(pong == "PONG")
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

fn config(url: &str, tweak: impl FnOnce(&mut RawSingleUse)) -> SingleUseConfig {
    let mut raw = RawSingleUse {
        store: "redis".into(),
        max_outcome_bytes: 128,
        ..Default::default()
    };
    raw.redis.urls = vec![url.to_string()];
    raw.redis.connect_timeout = "300ms".into();
    raw.redis.command_timeout = format!("{}ms", COMMAND_TIMEOUT.as_millis());
    tweak(&mut raw);
    SingleUseConfig::from_raw(&raw, None).unwrap()
}

async fn store(cfg: &SingleUseConfig) -> (SingleUseStore, SingleUseMetrics) {
    let metrics = SingleUseMetrics::unregistered();
    let store = SingleUseStore::from_config(cfg, metrics.clone())
        .await
        .unwrap();
    assert_eq!(store.kind(), "redis");
    (store, metrics)
}

/// Awaits `probe` returning true, trying every 50 ms, failing after `limit`.
async fn eventually<F: Future<Output = bool>>(limit: Duration, mut probe: impl FnMut() -> F) {
    tokio::time::timeout(limit, async {
        while !probe().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("condition not reached in time");
}

fn fails_closed(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(_) | StoreError::Timeout(_))
}

#[tokio::test]
async fn claim_progress_outcome_and_release() {
    let redis = RedisServer::start(&[]).await;
    let (s, metrics) = store(&config(&redis.url(), |_| {})).await;
    s.health().await.unwrap();

    assert_eq!(s.claim("a", MINUTE).await.unwrap(), Claim::Acquired);
    assert_eq!(s.claim("a", MINUTE).await.unwrap(), Claim::InProgress);
    let result = br#"{"content":[{"type":"text","text":"\u00e9 \"q\""}],"isError":false}"#;
    assert_eq!(
        s.complete("a", Some(result), MINUTE).await.unwrap(),
        Completion::Kept
    );
    // Byte for byte, escapes included.
    assert_eq!(
        s.claim("a", MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(result))
    );
    // A finished claim is neither completed again nor released.
    assert_eq!(
        s.complete("a", Some(b"{}"), MINUTE).await.unwrap(),
        Completion::NoClaim
    );
    assert!(!s.release("a").await.unwrap());
    assert_eq!(
        s.claim("a", MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(result))
    );

    // Too large for max_outcome_bytes (128), or no outcome at all: not kept.
    s.claim("big", MINUTE).await.unwrap();
    assert_eq!(
        s.complete("big", Some(&[b'x'; 129]), MINUTE).await.unwrap(),
        Completion::TooLarge
    );
    assert_eq!(s.claim("big", MINUTE).await.unwrap(), Claim::DoneNotKept);
    s.claim("none", MINUTE).await.unwrap();
    assert_eq!(
        s.complete("none", None, MINUTE).await.unwrap(),
        Completion::NoOutcome
    );
    assert_eq!(s.claim("none", MINUTE).await.unwrap(), Claim::DoneNotKept);
    // An empty outcome is still an outcome.
    s.claim("empty", MINUTE).await.unwrap();
    s.complete("empty", Some(b""), MINUTE).await.unwrap();
    assert_eq!(
        s.claim("empty", MINUTE).await.unwrap(),
        Claim::Done(Bytes::new())
    );

    // Release gives a running claim back.
    s.claim("r", MINUTE).await.unwrap();
    assert!(s.release("r").await.unwrap());
    assert_eq!(s.claim("r", MINUTE).await.unwrap(), Claim::Acquired);
    assert!(!s.release("never-claimed").await.unwrap());

    // Both keys share the {id} hash tag and carry the state's remaining lifetime.
    let mut admin = redis.admin().await;
    for key in ["mrtr:{a}:claim", "mrtr:{a}:outcome"] {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(pttl > 0 && pttl <= 60_000, "{key} PTTL {pttl}");
    }
    let none: Option<Vec<u8>> = redis::cmd("GET")
        .arg("mrtr:{big}:outcome")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(none, None, "an outcome that is not kept is not stored");

    let count = |label: &str| metrics.claims.with_label_values(&[label]).get();
    assert_eq!(count("acquired"), 6);
    assert_eq!(count("in_progress"), 1);
    assert_eq!(count("done"), 3);
    assert_eq!(count("not_kept"), 2);
}

#[tokio::test]
async fn claims_and_outcomes_expire_with_the_state() {
    let redis = RedisServer::start(&[]).await;
    let (s, _) = store(&config(&redis.url(), |_| {})).await;
    let ttl = Duration::from_millis(300);

    let started = Instant::now();
    assert_eq!(s.claim("p", ttl).await.unwrap(), Claim::Acquired);
    assert_eq!(s.claim("p", MINUTE).await.unwrap(), Claim::InProgress);
    eventually(Duration::from_secs(5), || async {
        s.claim("p", MINUTE).await.unwrap() == Claim::Acquired
    })
    .await;
    assert!(started.elapsed() >= ttl, "claim gone before its ttl");

    let started = Instant::now();
    s.claim("d", MINUTE).await.unwrap();
    s.complete("d", Some(b"{}"), ttl).await.unwrap();
    assert_eq!(
        s.claim("d", MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"{}"))
    );
    eventually(Duration::from_secs(5), || async {
        s.claim("d", MINUTE).await.unwrap() == Claim::Acquired
    })
    .await;
    assert!(started.elapsed() >= ttl, "outcome gone before its ttl");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_racing_fifty_claims_run_it_once_and_share_the_outcome() {
    let redis = RedisServer::start(&[]).await;
    let cfg = config(&redis.url(), |_| {});
    let (g1, _) = store(&cfg).await;
    let (g2, _) = store(&cfg).await;
    let gateways = [g1, g2];
    // Connect both before the race so that it is a race between claims, not connections.
    for g in &gateways {
        g.health().await.unwrap();
    }

    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let (g, barrier) = (gateways[i % 2].clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            (i % 2, g.claim("raced", MINUTE).await.unwrap())
        });
    }
    let results = tasks.join_all().await;
    let winners: Vec<usize> = results
        .iter()
        .filter(|(_, c)| *c == Claim::Acquired)
        .map(|(g, _)| *g)
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert!(
        results
            .iter()
            .all(|(_, c)| matches!(c, Claim::Acquired | Claim::InProgress))
    );

    let (winner, other) = (&gateways[winners[0]], &gateways[1 - winners[0]]);
    winner
        .complete("raced", Some(br#"{"n":1}"#), MINUTE)
        .await
        .unwrap();
    assert_eq!(
        other.claim("raced", MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(br#"{"n":1}"#))
    );
    // And the other way round for a claim the second gateway won.
    assert_eq!(
        other.claim("second", MINUTE).await.unwrap(),
        Claim::Acquired
    );
    assert_eq!(
        winner.claim("second", MINUTE).await.unwrap(),
        Claim::InProgress
    );
    other
        .complete("second", Some(b"[2]"), MINUTE)
        .await
        .unwrap();
    assert_eq!(
        winner.claim("second", MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"[2]"))
    );
}

#[tokio::test]
async fn fails_closed_while_redis_is_down_and_recovers_after_a_restart() {
    let mut redis = RedisServer::start(&[]).await;
    let (s, metrics) = store(&config(&redis.url(), |_| {})).await;
    assert_eq!(s.claim("before", MINUTE).await.unwrap(), Claim::Acquired);

    redis.stop().await;
    for id in ["down1", "down2", "down3"] {
        let started = Instant::now();
        let err = s.claim(id, MINUTE).await.unwrap_err();
        assert!(fails_closed(&err), "{err:?}");
        assert!(
            started.elapsed() <= COMMAND_TIMEOUT + SLACK,
            "took {:?}",
            started.elapsed()
        );
        let rejection = Rejection::from(err);
        assert_eq!(rejection.status, http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(rejection.reason, "single_use_unavailable");
    }
    let started = Instant::now();
    assert!(fails_closed(&s.health().await.unwrap_err()));
    assert!(started.elapsed() <= COMMAND_TIMEOUT + SLACK);
    assert!(s.complete("before", None, MINUTE).await.is_err());
    assert!(s.release("before").await.is_err());
    let errors: u64 = ["unavailable", "timeout"]
        .iter()
        .map(|r| metrics.errors.with_label_values(&[r]).get())
        .sum();
    assert_eq!(errors, 5);

    redis.restart().await;
    eventually(Duration::from_secs(10), || async {
        s.claim("after", MINUTE).await == Ok(Claim::Acquired)
    })
    .await;
    s.health().await.unwrap();
    assert_eq!(s.claim("after", MINUTE).await.unwrap(), Claim::InProgress);
}

#[tokio::test]
async fn a_gateway_started_before_redis_refuses_until_redis_is_up() {
    let port = free_port();
    let (s, _) = store(&config(&format!("redis://127.0.0.1:{port}/0"), |_| {})).await;
    let started = Instant::now();
    let err = s.claim("early", MINUTE).await.unwrap_err();
    assert!(fails_closed(&err), "{err:?}");
    assert!(started.elapsed() <= COMMAND_TIMEOUT + SLACK);
    assert!(s.health().await.is_err());

    let mut redis = RedisServer {
        child: None,
        port,
        dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("single_use_redis-{}-{port}", std::process::id())),
        extra: Vec::new(),
    };
    std::fs::create_dir_all(&redis.dir).unwrap();
    redis
        .spawn()
        .await
        .expect("redis-server on the probed port");
    eventually(Duration::from_secs(10), || async {
        s.claim("early", MINUTE).await == Ok(Claim::Acquired)
    })
    .await;
}

#[tokio::test]
async fn an_out_of_memory_redis_is_reported_full_and_keeps_live_claims() {
    let redis =
        RedisServer::start(&["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"]).await;
    let (s, metrics) = store(&config(&redis.url(), |raw| {
        raw.max_outcome_bytes = 1024 * 1024;
    }))
    .await;
    assert_eq!(s.claim("first", MINUTE).await.unwrap(), Claim::Acquired);
    let outcome = vec![b'x'; 512 * 1024];
    let mut full = None;
    for i in 0..64 {
        let id = format!("fill{i}");
        let step = match s.claim(&id, MINUTE).await {
            Ok(Claim::Acquired) => s.complete(&id, Some(&outcome), MINUTE).await.map(|_| ()),
            Ok(other) => panic!("fresh id {id} found {other:?}"),
            Err(e) => Err(e),
        };
        if let Err(e) = step {
            full = Some(e);
            break;
        }
    }
    let err = full.expect("4 MiB of Redis memory never ran out");
    assert!(matches!(err, StoreError::Full { .. }), "{err:?}");
    let rejection = Rejection::from(err);
    assert_eq!(rejection.reason, "single_use_full");
    assert!(
        rejection
            .headers
            .iter()
            .any(|(n, _)| n == http::header::RETRY_AFTER)
    );
    assert_eq!(metrics.errors.with_label_values(&["full"]).get(), 1);
    // Nothing was evicted: the first claim is still held.
    assert_eq!(s.claim("first", MINUTE).await.unwrap(), Claim::InProgress);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_keeps_each_claim_in_one_slot() {
    let nodes_file = format!("nodes-{}.conf", std::process::id());
    let redis = RedisServer::start(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        &nodes_file,
    ])
    .await;
    // A one-node cluster owning every slot. Redis Cluster still refuses a script whose keys
    // hash to different slots (CROSSSLOT), so this checks the {id} hash tag.
    let mut admin = redis.admin().await;
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query_async(&mut admin)
        .await
        .unwrap();
    eventually(Duration::from_secs(10), || {
        let mut admin = admin.clone();
        async move {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut admin)
                .await
                .unwrap();
            info.contains("cluster_state:ok")
        }
    })
    .await;

    let cfg = config(&redis.url(), |raw| raw.redis.cluster = true);
    assert!(cfg.redis.cluster);
    let (g1, _) = store(&cfg).await;
    let (g2, _) = store(&cfg).await;
    g1.health().await.unwrap();
    assert_eq!(g1.claim("c", MINUTE).await.unwrap(), Claim::Acquired);
    assert_eq!(g2.claim("c", MINUTE).await.unwrap(), Claim::InProgress);
    assert_eq!(
        g1.complete("c", Some(b"{\"ok\":true}"), MINUTE)
            .await
            .unwrap(),
        Completion::Kept
    );
    assert_eq!(
        g2.claim("c", MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"{\"ok\":true}"))
    );
    assert_eq!(g2.claim("d", MINUTE).await.unwrap(), Claim::Acquired);
    assert!(g2.release("d").await.unwrap());
    assert_eq!(g1.claim("d", MINUTE).await.unwrap(), Claim::Acquired);
}

/// A private CA and a server certificate for 127.0.0.1, written as PEM files into `dir`.
fn write_test_pki(dir: &std::path::Path) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "single-use test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&server_key, &ca)
        .unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), server.pem()).unwrap();
    std::fs::write(dir.join("server.key"), server_key.serialize_pem()).unwrap();
}

#[tokio::test]
async fn rediss_urls_speak_tls_and_verify_the_server() {
    let pki = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("single_use_tls-{}", std::process::id()));
    write_test_pki(&pki);
    let tls_port = free_port().to_string();
    let file = |name: &str| pki.join(name).to_string_lossy().into_owned();
    let (cert, key, ca) = (file("server.pem"), file("server.key"), file("ca.pem"));
    // The plain port stays open for the harness's PING; the stores use only the TLS port.
    let _redis = RedisServer::start(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ])
    .await;
    let url = format!("rediss://127.0.0.1:{tls_port}/0");

    // Trusting the private CA: claims work over TLS.
    let (trusting, _) = store(&config(&url, |raw| raw.redis.ca_file = Some(ca.clone()))).await;
    trusting.health().await.unwrap();
    assert_eq!(trusting.claim("t", MINUTE).await.unwrap(), Claim::Acquired);
    trusting
        .complete("t", Some(b"{\"tls\":1}"), MINUTE)
        .await
        .unwrap();
    assert_eq!(
        trusting.claim("t", MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"{\"tls\":1}"))
    );

    // Trusting only the system roots: the certificate is refused, and so is the claim.
    let (doubting, _) = store(&config(&url, |_| {})).await;
    let err = doubting.claim("t", MINUTE).await.unwrap_err();
    assert!(fails_closed(&err), "{err:?}");
    let _ = std::fs::remove_dir_all(&pki);
}
