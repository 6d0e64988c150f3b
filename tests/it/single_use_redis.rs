//! The Redis single-use store against a real `redis-server` on a free loopback port.
//!
//! Each test starts its own server (no persistence, bound to 127.0.0.1), waits until it
//! answers PING, and kills it when the test ends (`kill_on_drop`). Two `SingleUseStore` values
//! built from one configuration stand for two gateway replicas sharing that Redis.
//!
//! The last tests run whole gateways (in process, in front of the in-repo legacy server,
//! which counts tool executions) against that Redis: two replicas whose clocks differ, a
//! Redis that stalls past the command timeout (`CLIENT PAUSE`), and reloads that move the
//! claims to another key prefix and to another Redis server (two servers).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mrtr_gateway::error::Rejection;
use mrtr_gateway::front::error_map;
use mrtr_gateway::single_use::config::RawSingleUse;
use mrtr_gateway::single_use::{
    Claim, Completion, Owner, SingleUseConfig, SingleUseMetrics, SingleUseStore, StoreError,
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
            let port = crate::support::free_port();
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
    SingleUseConfig::from_raw(&raw, None, Default::default()).unwrap()
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

fn owner() -> Owner {
    Owner::new("alice")
}

/// Claims and starts `id` for a fresh owner, as the engine does before it runs a call.
async fn run(s: &SingleUseStore, id: &str, ttl: Duration) -> Owner {
    let o = owner();
    assert!(s.claim(id, &o, ttl).await.unwrap().owned());
    assert!(s.start(id, &o, MINUTE).await.unwrap());
    o
}

fn fails_closed(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(_) | StoreError::Timeout(_))
}

#[tokio::test]
async fn claim_progress_outcome_and_release() {
    let redis = RedisServer::start(&[]).await;
    let (s, metrics) = store(&config(&redis.url(), |_| {})).await;
    s.health().await.unwrap();

    let a = owner();
    assert_eq!(s.claim("a", &a, MINUTE).await.unwrap(), Claim::Acquired);
    assert_eq!(
        s.claim("a", &owner(), MINUTE).await.unwrap(),
        Claim::InProgress
    );
    // Only the owner starts it, once.
    assert!(!s.start("a", &owner(), MINUTE).await.unwrap());
    assert!(s.start("a", &a, MINUTE).await.unwrap());
    assert!(!s.start("a", &a, MINUTE).await.unwrap());
    assert_eq!(
        s.claim("a", &owner(), MINUTE).await.unwrap(),
        Claim::InProgress
    );
    let result = br#"{"content":[{"type":"text","text":"\u00e9 \"q\""}],"isError":false}"#;
    assert_eq!(
        s.complete("a", &owner(), Some(result), MINUTE)
            .await
            .unwrap(),
        Completion::NoClaim,
        "another owner cannot complete it"
    );
    assert_eq!(
        s.complete("a", &a, Some(result), MINUTE).await.unwrap(),
        Completion::Kept
    );
    // Byte for byte, escapes included.
    assert_eq!(
        s.claim("a", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(result))
    );
    // A finished claim is neither completed again nor released.
    assert_eq!(
        s.complete("a", &a, Some(b"{}"), MINUTE).await.unwrap(),
        Completion::NoClaim
    );
    assert!(!s.release("a", &a).await.unwrap());
    assert_eq!(
        s.claim("a", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(result))
    );

    // Too large for max_outcome_bytes (128), or no outcome at all: not kept.
    let big = run(&s, "big", MINUTE).await;
    assert_eq!(
        s.complete("big", &big, Some(&[b'x'; 129]), MINUTE)
            .await
            .unwrap(),
        Completion::TooLarge
    );
    assert_eq!(
        s.claim("big", &owner(), MINUTE).await.unwrap(),
        Claim::DoneNotKept
    );
    let none = run(&s, "none", MINUTE).await;
    assert_eq!(
        s.complete("none", &none, None, MINUTE).await.unwrap(),
        Completion::NoOutcome
    );
    assert_eq!(
        s.claim("none", &owner(), MINUTE).await.unwrap(),
        Claim::DoneNotKept
    );
    // An empty outcome is still an outcome.
    let empty = run(&s, "empty", MINUTE).await;
    s.complete("empty", &empty, Some(b""), MINUTE)
        .await
        .unwrap();
    assert_eq!(
        s.claim("empty", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::new())
    );

    // Release gives the owner's claim back, claimed or started, and nobody else's.
    let r = owner();
    s.claim("r", &r, MINUTE).await.unwrap();
    assert!(!s.release("r", &owner()).await.unwrap());
    assert!(s.release("r", &r).await.unwrap());
    let r = run(&s, "r", MINUTE).await;
    assert!(s.release("r", &r).await.unwrap());
    assert_eq!(
        s.claim("r", &owner(), MINUTE).await.unwrap(),
        Claim::Acquired
    );
    assert!(!s.release("never-claimed", &r).await.unwrap());

    // The keys share the {id} hash tag and carry the state's remaining lifetime.
    let mut admin = redis.admin().await;
    for key in ["mrtr:{a}:claim", "mrtr:{a}:outcome"] {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(pttl > 0 && pttl <= 60_000, "{key} PTTL {pttl}");
    }
    let lease: Option<Vec<u8>> = redis::cmd("GET")
        .arg("mrtr:{a}:lease")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(lease, None, "a finished claim holds no lease");
    let none: Option<Vec<u8>> = redis::cmd("GET")
        .arg("mrtr:{big}:outcome")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(none, None, "an outcome that is not kept is not stored");

    let count = |label: &str| metrics.claims(label);
    assert_eq!(count("acquired"), 7);
    assert_eq!(count("in_progress"), 2);
    assert_eq!(count("done"), 3);
    assert_eq!(count("not_kept"), 2);
}

#[tokio::test]
async fn unstarted_claims_are_taken_over_after_the_lease_and_started_ones_never() {
    let redis = RedisServer::start(&[]).await;
    let (s, metrics) = store(&config(&redis.url(), |raw| {
        raw.claim_lease = "200ms".into();
    }))
    .await;
    let (first, second) = (owner(), owner());
    assert_eq!(s.claim("c", &first, MINUTE).await.unwrap(), Claim::Acquired);
    assert_eq!(
        s.claim("c", &second, MINUTE).await.unwrap(),
        Claim::InProgress
    );
    // The first owner never starts (its reply was lost, or it died): after the lease the
    // claim is taken over, and the first owner can no longer start it.
    eventually(Duration::from_secs(5), || async {
        s.claim("c", &second, MINUTE).await.unwrap() == Claim::TakenOver
    })
    .await;
    assert!(!s.start("c", &first, MINUTE).await.unwrap());
    assert!(
        s.start("c", &second, Duration::from_millis(300))
            .await
            .unwrap()
    );
    // Started: in progress while its run lease lasts, never taken over; after it, with no
    // outcome recorded, the outcome is lost (never re-run).
    assert_eq!(
        s.claim("c", &owner(), MINUTE).await.unwrap(),
        Claim::InProgress
    );
    eventually(Duration::from_secs(5), || async {
        s.claim("c", &owner(), MINUTE).await.unwrap() == Claim::Lost
    })
    .await;
    // A late outcome still lands and is served from then on.
    assert_eq!(
        s.complete("c", &second, Some(b"late"), MINUTE)
            .await
            .unwrap(),
        Completion::Kept
    );
    assert_eq!(
        s.claim("c", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"late"))
    );
    assert_eq!(metrics.claims("taken_over"), 1);
    assert!(metrics.claims("lost") >= 1);
}

#[tokio::test]
async fn claims_and_outcomes_expire_with_the_state() {
    let redis = RedisServer::start(&[]).await;
    let (s, _) = store(&config(&redis.url(), |_| {})).await;
    let ttl = Duration::from_millis(300);

    let started = Instant::now();
    assert_eq!(s.claim("p", &owner(), ttl).await.unwrap(), Claim::Acquired);
    assert_eq!(
        s.claim("p", &owner(), MINUTE).await.unwrap(),
        Claim::InProgress
    );
    eventually(Duration::from_secs(5), || async {
        s.claim("p", &owner(), MINUTE).await.unwrap() == Claim::Acquired
    })
    .await;
    assert!(started.elapsed() >= ttl, "claim gone before its ttl");

    let started = Instant::now();
    let d = run(&s, "d", MINUTE).await;
    s.complete("d", &d, Some(b"{}"), ttl).await.unwrap();
    assert_eq!(
        s.claim("d", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"{}"))
    );
    eventually(Duration::from_secs(5), || async {
        s.claim("d", &owner(), MINUTE).await.unwrap() == Claim::Acquired
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
            let o = owner();
            let claim = g.claim("raced", &o, MINUTE).await.unwrap();
            (i % 2, claim, o)
        });
    }
    let results = tasks.join_all().await;
    let winners: Vec<(usize, Owner)> = results
        .iter()
        .filter(|(_, c, _)| *c == Claim::Acquired)
        .map(|(g, _, o)| (*g, o.clone()))
        .collect();
    assert_eq!(winners.len(), 1);
    assert!(
        results
            .iter()
            .all(|(_, c, _)| matches!(c, Claim::Acquired | Claim::InProgress))
    );

    let (w, winner_owner) = &winners[0];
    let (winner, other) = (&gateways[*w], &gateways[1 - *w]);
    assert!(winner.start("raced", winner_owner, MINUTE).await.unwrap());
    winner
        .complete("raced", winner_owner, Some(br#"{"n":1}"#), MINUTE)
        .await
        .unwrap();
    assert_eq!(
        other.claim("raced", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(br#"{"n":1}"#))
    );
    // And the other way round for a claim the second gateway won.
    let second = owner();
    assert_eq!(
        other.claim("second", &second, MINUTE).await.unwrap(),
        Claim::Acquired
    );
    assert_eq!(
        winner.claim("second", &owner(), MINUTE).await.unwrap(),
        Claim::InProgress
    );
    assert!(other.start("second", &second, MINUTE).await.unwrap());
    other
        .complete("second", &second, Some(b"[2]"), MINUTE)
        .await
        .unwrap();
    assert_eq!(
        winner.claim("second", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"[2]"))
    );
}

#[tokio::test]
async fn fails_closed_while_redis_is_down_and_recovers_after_a_restart() {
    let mut redis = RedisServer::start(&[]).await;
    let (s, metrics) = store(&config(&redis.url(), |_| {})).await;
    let before = run(&s, "before", MINUTE).await;

    redis.stop().await;
    for id in ["down1", "down2", "down3"] {
        let started = Instant::now();
        let err = s.claim(id, &owner(), MINUTE).await.unwrap_err();
        assert!(fails_closed(&err), "{err:?}");
        assert!(
            started.elapsed() <= COMMAND_TIMEOUT + SLACK,
            "took {:?}",
            started.elapsed()
        );
        let rejection = Rejection::from(err);
        assert_eq!(
            error_map::answer(&rejection).status,
            http::StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(rejection.reason(), "single_use_unavailable");
    }
    let started = Instant::now();
    assert!(fails_closed(&s.health().await.unwrap_err()));
    assert!(started.elapsed() <= COMMAND_TIMEOUT + SLACK);
    assert!(s.complete("before", &before, None, MINUTE).await.is_err());
    assert!(s.release("before", &before).await.is_err());
    let errors: u64 = ["unavailable", "timeout"]
        .iter()
        .map(|r| metrics.errors(r))
        .sum();
    assert_eq!(errors, 5);

    redis.restart().await;
    eventually(Duration::from_secs(10), || async {
        s.claim("after", &owner(), MINUTE).await == Ok(Claim::Acquired)
    })
    .await;
    s.health().await.unwrap();
    assert_eq!(
        s.claim("after", &owner(), MINUTE).await.unwrap(),
        Claim::InProgress
    );
}

#[tokio::test]
async fn a_gateway_started_before_redis_refuses_until_redis_is_up() {
    let port = crate::support::free_port();
    let (s, _) = store(&config(&format!("redis://127.0.0.1:{port}/0"), |_| {})).await;
    let started = Instant::now();
    let err = s.claim("early", &owner(), MINUTE).await.unwrap_err();
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
        s.claim("early", &owner(), MINUTE).await == Ok(Claim::Acquired)
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
    assert_eq!(
        s.claim("first", &owner(), MINUTE).await.unwrap(),
        Claim::Acquired
    );
    let outcome = vec![b'x'; 512 * 1024];
    let mut full = None;
    for i in 0..64 {
        let id = format!("fill{i}");
        let o = owner();
        let step = match s.claim(&id, &o, MINUTE).await {
            Ok(Claim::Acquired) => match s.start(&id, &o, MINUTE).await {
                Ok(_) => s
                    .complete(&id, &o, Some(&outcome), MINUTE)
                    .await
                    .map(|_| ()),
                Err(e) => Err(e),
            },
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
    assert_eq!(rejection.reason(), "single_use_full");
    assert!(
        error_map::answer(&rejection)
            .headers
            .iter()
            .any(|(n, _)| n == http::header::RETRY_AFTER)
    );
    assert_eq!(metrics.errors("full"), 1);
    // Nothing was evicted: the first claim is still held.
    assert_eq!(
        s.claim("first", &owner(), MINUTE).await.unwrap(),
        Claim::InProgress
    );
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
    let c = owner();
    assert_eq!(g1.claim("c", &c, MINUTE).await.unwrap(), Claim::Acquired);
    assert_eq!(
        g2.claim("c", &owner(), MINUTE).await.unwrap(),
        Claim::InProgress
    );
    assert!(g1.start("c", &c, MINUTE).await.unwrap());
    assert_eq!(
        g1.complete("c", &c, Some(b"{\"ok\":true}"), MINUTE)
            .await
            .unwrap(),
        Completion::Kept
    );
    assert_eq!(
        g2.claim("c", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"{\"ok\":true}"))
    );
    let d = owner();
    assert_eq!(g2.claim("d", &d, MINUTE).await.unwrap(), Claim::Acquired);
    assert!(g2.release("d", &d).await.unwrap());
    assert_eq!(
        g1.claim("d", &owner(), MINUTE).await.unwrap(),
        Claim::Acquired
    );
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
    let tls_port = crate::support::free_port().to_string();
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
    let t = run(&trusting, "t", MINUTE).await;
    trusting
        .complete("t", &t, Some(b"{\"tls\":1}"), MINUTE)
        .await
        .unwrap();
    assert_eq!(
        trusting.claim("t", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"{\"tls\":1}"))
    );

    // Trusting only the system roots: the certificate is refused, and so is the claim.
    let (doubting, _) = store(&config(&url, |_| {})).await;
    let err = doubting.claim("t", &owner(), MINUTE).await.unwrap_err();
    assert!(fails_closed(&err), "{err:?}");
    let _ = std::fs::remove_dir_all(&pki);
}

// ---- whole gateways sharing the Redis -------------------------------------------------------

use mrtr_gateway::clock::Clock;
use mrtr_gateway::front::listener::{self, Running};
use mrtr_gateway::gateway::Gateway;
use mrtr_testkit::client::ModernClient;
use mrtr_testkit::legacy_server::{Handlers, LegacyServer, LegacyServerConfig};
use serde_json::{Value, json};

/// `pay`: asks for confirmation, then (the first `held` times it gets there) waits for the
/// test to open `gate`, then answers. `reached` is notified when it waits.
struct Pay {
    gate: Arc<tokio::sync::Semaphore>,
    reached: Arc<tokio::sync::Notify>,
}

impl Pay {
    fn new(open: bool) -> Pay {
        let permits = if open {
            tokio::sync::Semaphore::MAX_PERMITS
        } else {
            0
        };
        Pay {
            gate: Arc::new(tokio::sync::Semaphore::new(permits)),
            reached: Arc::new(tokio::sync::Notify::new()),
        }
    }

    fn handlers(&self) -> Handlers {
        let (gate, reached) = (self.gate.clone(), self.reached.clone());
        Handlers::new().tool(
            "pay",
            "moves money once",
            json!({"type": "object"}),
            move |ctx, _| {
                let (gate, reached) = (gate.clone(), reached.clone());
                async move {
                    let ok = ctx
                        .elicit_form("Confirm the payment?", crate::support::form("confirm"))
                        .await?;
                    reached.notify_one();
                    gate.acquire().await.expect("gate open").forget();
                    Ok(crate::support::tool_text(format!(
                        "paid ({})",
                        ok["content"]["confirm"].as_str().unwrap_or("?")
                    )))
                }
            },
        )
    }
}

/// The configuration of a gateway in front of `legacy` claiming in `redis` (`redis_extra`:
/// more `[single_use.redis]` lines).
fn gateway_config(
    legacy: &LegacyServer,
    redis: &RedisServer,
    state: &str,
    single_use: &str,
    redis_extra: &str,
) -> mrtr_gateway::config::Config {
    let extra = format!(
        "[single_use]\nstore = \"redis\"\n{single_use}\n[single_use.redis]\nurls = [\"{}\"]\n\
         command_timeout = \"{}ms\"\nconnect_timeout = \"300ms\"\n{redis_extra}\n",
        redis.url(),
        COMMAND_TIMEOUT.as_millis()
    );
    crate::support::config(&legacy.url(), "", state, &extra)
}

/// An in-process gateway in front of `legacy`, claiming in `redis`, reading `clock`.
async fn gateway(
    legacy: &LegacyServer,
    redis: &RedisServer,
    state: &str,
    single_use: &str,
    clock: Clock,
) -> (Arc<Gateway>, Running, String) {
    let cfg = gateway_config(legacy, redis, state, single_use, "");
    let gw = Gateway::try_new_with_clock(cfg, clock).unwrap();
    let running = listener::start(gw.front.clone(), gw.config().listen.addr)
        .await
        .unwrap();
    let url = format!("http://{}{}", running.addr, gw.config().listen.path);
    (gw, running, url)
}

/// Round 1 of `pay`: its result (state and question).
async fn pay_round_one(url: &str) -> Value {
    let r = crate::support::call_tool(&ModernClient::new(url), "pay").await;
    assert_eq!(r.result_type(), Some("input_required"), "{:?}", r.message);
    r.result().unwrap().clone()
}

fn pay_retry(first: &Value) -> Value {
    let key = crate::support::input_key(first);
    json!({"name": "pay", "arguments": {}, "requestState": first["requestState"],
           "inputResponses": {key: {"action": "accept", "content": {"confirm": "yes"}}}})
}

/// Presents `params` until it completes, waiting as `Retry-After` says while the answer is
/// 409 "in progress" or 503; fails on anything else, or after `limit`.
async fn present_until_done(url: &str, params: &Value, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    let mut answers = Vec::new();
    loop {
        let ex = ModernClient::new(url)
            .request("tools/call", params.clone())
            .await
            .unwrap();
        if let Some(result) = ex.result() {
            eprintln!(
                "presented {} times: {answers:?} then the result",
                answers.len() + 1
            );
            return result.clone();
        }
        let status = ex.status.as_u16();
        assert!(
            (status == 409 && ex.error_code() == Some(-32603)) || status == 503,
            "neither done nor worth waiting for: {status} {:?} (before: {answers:?})",
            ex.message
        );
        answers.push(status);
        assert!(
            Instant::now() < deadline,
            "still not done after {limit:?}: {answers:?}"
        );
        let wait: u64 = ex
            .headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1);
        tokio::time::sleep(Duration::from_millis(200).max(Duration::from_secs(wait) / 4)).await;
    }
}

async fn pause_redis(redis: &RedisServer, millis: u64, mode: &str) {
    let mut admin = redis.admin().await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(millis)
        .arg(mode)
        .query_async(&mut admin)
        .await
        .unwrap();
}

/// Two replicas share Redis; B's clock is `clock_skew` (2 s) behind A's. A runs the state's
/// final round. Once the claim would have expired under the old rule (`exp + skew` by A's
/// clock), B still accepts the state by its own clock, so a duplicate presented to B must
/// still find the claim and get A's outcome: the claim lives until `exp + 2·skew + 1`.
#[tokio::test]
async fn a_claim_outlives_the_state_on_a_replica_whose_clock_is_behind() {
    let redis = RedisServer::start(&[]).await;
    let pay = Pay::new(true);
    let legacy = LegacyServer::start(LegacyServerConfig::default(), pay.handlers())
        .await
        .unwrap();
    let state = "ttl = \"1s\"\nclock_skew = \"2s\"";
    let (_a, a_running, url_a) = gateway(&legacy, &redis, state, "", Clock::system()).await;
    let (_b, b_running, url_b) = gateway(&legacy, &redis, state, "", Clock::offset(-2)).await;

    let first = pay_round_one(&url_a).await;
    let codec = mrtr_gateway::state::StateCodec::new(
        &[mrtr_gateway::config::StateKeySpec {
            id: "k1".into(),
            secret: base64::Engine::decode(
                &base64::engine::general_purpose::STANDARD,
                crate::support::TEST_KEY,
            )
            .unwrap()
            .try_into()
            .unwrap(),
        }],
        Duration::from_secs(1),
        65536,
    );
    let (payload, _) = codec
        .open_ignoring_expiry(first["requestState"].as_str().unwrap())
        .unwrap();
    let retry = pay_retry(&first);
    let done = ModernClient::new(&url_a)
        .request("tools/call", retry.clone())
        .await
        .unwrap();
    assert_eq!(
        crate::support::text(done.result().unwrap()),
        "paid (yes)",
        "{:?}",
        done.message
    );
    let executions = legacy.stats().tool_finishes("pay");
    assert_eq!(executions, 1);

    // exp + 3.5 s by the system clock: A's claim rule of old (exp + skew, by A's clock) has
    // run out; A refuses the state as expired; B (2 s behind) accepts it until exp + 5.
    let at = std::time::UNIX_EPOCH + Duration::from_millis(payload.exp * 1000 + 3500);
    if let Ok(wait) = at.duration_since(std::time::SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
    let on_a = ModernClient::new(&url_a)
        .request("tools/call", retry.clone())
        .await
        .unwrap();
    assert_eq!(on_a.error_code(), Some(-32602), "A: {:?}", on_a.message);
    let on_b = ModernClient::new(&url_b)
        .request("tools/call", retry)
        .await
        .unwrap();
    assert_eq!(
        on_b.result(),
        done.result(),
        "B accepted the state and must answer with A's outcome: {:?}",
        on_b.message
    );
    assert_eq!(
        legacy.stats().tool_finishes("pay"),
        executions,
        "the tool ran again on the replica whose clock is behind"
    );
    eprintln!(
        "skew: state exp {}, duplicate on B (2 s behind) at exp + 3.5 s: A's outcome; executions {}",
        payload.exp,
        legacy.stats().tool_finishes("pay")
    );
    a_running.stop().await;
    b_running.stop().await;
    legacy.shutdown().await;
}

/// Redis stalls (`CLIENT PAUSE`) past the command timeout while a retry claims its state: the
/// gateway refuses that retry (503, nothing run), the claim lands in Redis afterwards anyway.
/// It must not stay "in progress" for the state's whole life: the retry, presented again,
/// runs — exactly once.
#[tokio::test]
async fn a_claim_that_lands_after_a_stall_does_not_lock_the_state() {
    let redis = RedisServer::start(&[]).await;
    let pay = Pay::new(true);
    let legacy = LegacyServer::start(LegacyServerConfig::default(), pay.handlers())
        .await
        .unwrap();
    let (_gw, running, url) =
        gateway(&legacy, &redis, "", "claim_lease = \"1s\"", Clock::system()).await;
    // One full flow first, so that Redis has the scripts cached (a first EVALSHA answered
    // NOSCRIPT after the stall would never be followed by its EVAL: nothing would land).
    let warm = pay_round_one(&url).await;
    let warm = present_until_done(&url, &pay_retry(&warm), Duration::from_secs(5)).await;
    assert_eq!(crate::support::text(&warm), "paid (yes)");
    let first = pay_round_one(&url).await;
    let retry = pay_retry(&first);
    let finished = legacy.stats().tool_finishes("pay");

    pause_redis(&redis, 1500, "ALL").await;
    let refused = ModernClient::new(&url)
        .request("tools/call", retry.clone())
        .await
        .unwrap();
    assert_eq!(refused.status.as_u16(), 503, "{:?}", refused.message);
    assert_eq!(legacy.stats().tool_finishes("pay"), finished);

    let result = present_until_done(&url, &retry, Duration::from_secs(15)).await;
    assert_eq!(crate::support::text(&result), "paid (yes)");
    assert_eq!(
        legacy.stats().tool_finishes("pay"),
        finished + 1,
        "ran exactly once"
    );
    // And it stays done: a duplicate gets the same outcome.
    let dup = present_until_done(&url, &retry, Duration::from_secs(5)).await;
    assert_eq!(dup, result);
    assert_eq!(legacy.stats().tool_finishes("pay"), finished + 1);
    running.stop().await;
    legacy.shutdown().await;
}

/// Redis stalls while the outcome of a completed call is recorded, and the connection that
/// carried the write is lost with it (`CLIENT PAUSE WRITE`, then `CLIENT KILL`): the client
/// still gets its result, and the outcome is recorded in the background once Redis is back,
/// so a duplicate gets it (not "in progress" for the state's whole life, and not a rerun).
#[tokio::test]
async fn an_outcome_lost_in_a_stall_is_recorded_once_redis_is_back() {
    let redis = RedisServer::start(&[]).await;
    let pay = Pay::new(false);
    let legacy = LegacyServer::start(LegacyServerConfig::default(), pay.handlers())
        .await
        .unwrap();
    let (gw, running, url) = gateway(&legacy, &redis, "", "", Clock::system()).await;
    gw.single_use().health().await.unwrap();
    let first = pay_round_one(&url).await;
    let retry = pay_retry(&first);

    let call = {
        let (url, retry) = (url.clone(), retry.clone());
        tokio::spawn(async move {
            ModernClient::new(&url)
                .request("tools/call", retry)
                .await
                .unwrap()
        })
    };
    // The call is past its claim and start, inside the tool: stall Redis's writes, then let
    // the tool answer, so that recording its outcome times out.
    tokio::time::timeout(Duration::from_secs(10), pay.reached.notified())
        .await
        .expect("the retry reached the tool");
    pause_redis(&redis, 5000, "WRITE").await;
    pay.gate.add_permits(1);
    let done = call.await.unwrap();
    assert_eq!(
        crate::support::text(done.result().expect("the client still gets its result")),
        "paid (yes)"
    );
    // The write never lands: its connection goes, then Redis resumes.
    let mut admin = redis.admin().await;
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut admin)
        .await
        .unwrap();

    let dup = present_until_done(&url, &retry, Duration::from_secs(15)).await;
    assert_eq!(&dup, done.result().unwrap());
    assert_eq!(legacy.stats().tool_finishes("pay"), 1, "ran exactly once");
    assert_metric!(
        &gw,
        "single_use_writes_retried_total",
        &[("op", "complete")],
        1.0
    );
    running.stop().await;
    legacy.shutdown().await;
}

/// Keys in `redis`'s database 0.
async fn key_count(redis: &RedisServer) -> u64 {
    redis::cmd("DBSIZE")
        .query_async(&mut redis.admin().await)
        .await
        .unwrap()
}

/// A reload that moves the claims — another `key_prefix`, then another Redis server — keeps
/// asking where they were: a completed state presented again after each move gets its first
/// outcome and the tool does not run again. New claims go only to the store in force.
#[tokio::test]
async fn a_reload_that_moves_the_redis_store_never_forgets_a_claim() {
    let a = RedisServer::start(&[]).await;
    let b = RedisServer::start(&[]).await;
    let pay = Pay::new(true);
    let legacy = LegacyServer::start(LegacyServerConfig::default(), pay.handlers())
        .await
        .unwrap();
    let runs = || legacy.stats().tool_finishes("pay");
    let (gw, running, url) = gateway(&legacy, &a, "", "", Clock::system()).await;
    let flow = || async {
        let retry = pay_retry(&pay_round_one(&url).await);
        let done = present_until_done(&url, &retry, Duration::from_secs(5)).await;
        assert_eq!(crate::support::text(&done), "paid (yes)");
        (retry, done)
    };
    let presented_again = |retry: Value| async {
        let ex = ModernClient::new(&url)
            .request("tools/call", retry)
            .await
            .unwrap();
        ex.result()
            .cloned()
            .unwrap_or_else(|| panic!("{:?}", ex.message))
    };

    // Claimed under the default prefix on A; the reload moves claims to another prefix on A.
    let (first, first_done) = flow().await;
    assert_eq!(runs(), 1);
    gw.apply_config(gateway_config(
        &legacy,
        &a,
        "",
        "",
        "key_prefix = \"moved:\"",
    ))
    .unwrap();
    assert_eq!(presented_again(first.clone()).await, first_done);
    assert_eq!(
        runs(),
        1,
        "the tool ran again after a reload to another key_prefix"
    );
    assert_eq!(gw.single_use().retired_stores(), 1);

    // Claimed under the new prefix; the next reload moves claims to another server, B.
    let (second, second_done) = flow().await;
    assert_eq!(runs(), 2);
    gw.apply_config(gateway_config(&legacy, &b, "", "", ""))
        .unwrap();
    assert_eq!(presented_again(second).await, second_done);
    assert_eq!(presented_again(first).await, first_done);
    assert_eq!(
        runs(),
        2,
        "the tool ran again after a reload to another Redis"
    );
    assert_eq!(gw.single_use().retired_stores(), 2);

    // A new state is claimed in B only: A, retired, is asked, never written.
    let on_a = key_count(&a).await;
    let on_b = key_count(&b).await;
    let (third, third_done) = flow().await;
    assert_eq!(presented_again(third).await, third_done);
    assert_eq!(runs(), 3);
    assert_eq!(
        key_count(&a).await,
        on_a,
        "a claim was made in the retired Redis"
    );
    assert!(
        key_count(&b).await > on_b,
        "no claim was made in the Redis in force"
    );
    eprintln!(
        "moved twice (prefix, then server): {} tool runs for 3 states, each presented again",
        runs()
    );
    running.stop().await;
    legacy.shutdown().await;
}

/// A retired Redis store is asked, never claimed in: an unstarted claim whose lease is gone is
/// removed there (its owner can no longer start) so the state can be claimed in the new store;
/// a started one still counts; and once the horizon has passed the old store is not asked.
#[tokio::test]
async fn a_retired_redis_store_answers_lookups_and_fences_abandoned_claims() {
    let a = RedisServer::start(&[]).await;
    let b = RedisServer::start(&[]).await;
    let cfg_a = config(&a.url(), |r| r.claim_lease = "200ms".into());
    let (s, _) = store(&cfg_a).await;
    // Claims that live 2 s (the longest this store granted: the old store is asked that long).
    let ttl = Duration::from_secs(2);
    let abandoned = owner();
    assert!(s.claim("abandoned", &abandoned, ttl).await.unwrap().owned());
    let running = run(&s, "running", ttl).await;
    let done = run(&s, "done", ttl).await;
    s.complete("done", &done, Some(b"{}"), MINUTE)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // the claim lease passes

    let moved = s
        .reconfigured(&config(&b.url(), |_| {}), Duration::from_secs(2))
        .unwrap()
        .unwrap();
    assert_eq!(moved.retired_stores(), 1);
    assert_eq!(
        moved.claim("done", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"{}"))
    );
    assert_eq!(
        moved.claim("running", &owner(), MINUTE).await.unwrap(),
        Claim::InProgress
    );
    assert_eq!(
        moved.claim("abandoned", &owner(), MINUTE).await.unwrap(),
        Claim::Acquired
    );
    // Its first owner, late, cannot start it in the old store any more.
    assert!(!s.start("abandoned", &abandoned, MINUTE).await.unwrap());
    // The running claim settles in the store that granted it, and the new store sees that.
    s.complete("running", &running, Some(b"1"), MINUTE)
        .await
        .unwrap();
    assert_eq!(
        moved.claim("running", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"1"))
    );
    // No claim made in the old store since the switch.
    let mut admin = a.admin().await;
    let claims: Vec<String> = redis::cmd("KEYS")
        .arg("*:claim")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(claims.len(), 2, "{claims:?}");

    // Once nothing in the old store can be live, it is not asked (even when it is down).
    let mut a = a;
    a.stop().await;
    assert!(fails_closed(
        &moved.claim("fresh", &owner(), MINUTE).await.unwrap_err()
    ));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(moved.retired_stores(), 0);
    assert_eq!(
        moved.claim("fresh", &owner(), MINUTE).await.unwrap(),
        Claim::Acquired
    );
}
