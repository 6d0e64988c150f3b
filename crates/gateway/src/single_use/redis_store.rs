//! The shared claim store: Redis, so that every replica sees every claim.
//!
//! Keys, for claim id `I` and prefix `P` (default `mrtr:`):
//! - `P{I}:claim` — `c:<owner>` while claimed and not started, `s:<owner>` once the owner's
//!   call may have run, `d` when done with a kept outcome, `n` when done without one; set with
//!   `PX` = the claim's lifetime (see [`super`]).
//! - `P{I}:lease` — present while the owner is expected to act: after a claim, for
//!   `single_use.claim_lease` (to start its call); after a start, for the run lease (to record
//!   its outcome). Expiry is Redis's own, so replicas' clocks do not matter.
//! - `P{I}:outcome` — the kept outcome bytes, same expiry as the claim.
//!
//! The `{I}` hash tag puts the keys in one cluster slot, so each operation below is one Lua
//! script touching one slot: atomic on a single server and on Redis Cluster alike.
//! - **claim**: an absent claim becomes `c:<owner>` with a claim lease; a `c:` claim whose
//!   lease is gone is taken over the same way (its owner never started); otherwise the script
//!   reports what it found (a started claim without a lease: its outcome was lost).
//! - **start**: only if the claim is still `c:<owner>`, it becomes `s:<owner>` with the run
//!   lease. A claim that was taken over is not the owner's any more: the owner must not run.
//! - **complete**: only if the claim is `s:<owner>`, store the outcome and flip the claim to
//!   `d`/`n`, both with the new `PX`, and drop the lease.
//! - **release**: delete the claim only if it is still the owner's (`c:` or `s:`).
//! - **lookup** (a store retired by a reload, see [`super::SingleUseStore::reconfigured`]):
//!   report what holds the id as the claim script would, without claiming it. A `c:` claim
//!   whose lease is gone is deleted instead (its owner never started, and now never can: its
//!   start finds no claim), so the id can be claimed in the store in force.
//! - **abandon**: only if the claim is `s:<owner>`, drop its lease now: the call's outcome is
//!   lost, and the next claim says so at once (a drain giving up a call it cannot wait for).
//!
//! Every call is bounded by `command_timeout` (the connection wait included), and any failure
//! is an error, never a guess: the caller refuses the request (fail closed). Redis answering
//! `OOM` (configure `maxmemory-policy noeviction`: an evicting policy could drop a live claim
//! and reopen the replay window) is reported as [`StoreError::Full`].
//!
//! Connections: one URL gives a [`ConnectionManager`] (one multiplexed connection, rebuilt in
//! the background after a failure); several URLs or `cluster = true` give a cluster
//! connection. Both are created lazily, so the gateway starts while Redis is still down and
//! its readiness probe ([`RedisStore::health`]) reports the outage. `rediss://` URLs use TLS
//! (rustls), trusting the platform's roots or, when `ca_file` is set, only the CAs in it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, RedisError, Script, ScriptInvocation, TlsCertificates};

use super::config::RedisConfig;
use super::{Claim, Completion, Owner, StoreError};

/// Longest wait between two reconnection attempts while Redis is down.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);
/// `Retry-After` hint when Redis is out of memory.
const OOM_RETRY_AFTER: Duration = Duration::from_secs(1);

// Shared by the claim and lookup scripts (KEYS: claim, outcome, lease): what a claim value
// says, or nil when nobody holds the id any more (claimed, never started, its lease gone).
const READ_CLAIM: &str = r"
local function read(current)
  if current == 'd' then
    local outcome = redis.call('GET', KEYS[2])
    if outcome then
      return {'d', outcome}
    end
    return {'n'}
  end
  if current == 'n' then
    return {'n'}
  end
  if redis.call('EXISTS', KEYS[3]) == 1 then
    return {'p'}
  end
  if string.sub(current, 1, 2) == 's:' then
    return {'l'}
  end
  return nil
end
";

// KEYS: claim, outcome, lease. ARGV: ttl ms, claim lease ms, owner token.
// Replies: {'a'} acquired, {'t'} taken over, {'p'} in progress, {'l'} started but its outcome
// lost, {'d', outcome} done and kept, {'n'} done without a kept outcome.
const CLAIM_SCRIPT: &str = r"
local current = redis.call('GET', KEYS[1])
if current then
  local held = read(current)
  if held then
    return held
  end
end
redis.call('SET', KEYS[1], 'c:' .. ARGV[3], 'PX', ARGV[1])
redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
if current then
  return {'t'}
end
return {'a'}
";

// KEYS: claim, lease. ARGV: owner token, run lease ms. 1 when the owner's claim is now started.
const START_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) ~= 'c:' .. ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], 's:' .. ARGV[1], 'KEEPTTL')
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 1
";

// KEYS: claim, outcome, lease. ARGV: ttl ms, 'd' or 'n', outcome, owner token.
const COMPLETE_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) ~= 's:' .. ARGV[4] then
  return 0
end
if ARGV[2] == 'd' then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[1])
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[1])
redis.call('DEL', KEYS[3])
return 1
";

// KEYS: claim, lease. ARGV: owner token. 1 when the owner's claim (claimed or started) went.
const RELEASE_SCRIPT: &str = r"
local current = redis.call('GET', KEYS[1])
if current == 'c:' .. ARGV[1] or current == 's:' .. ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
return 0
";

// KEYS: claim, outcome, lease. Replies as CLAIM_SCRIPT's, or {} when nothing live holds the
// id (an unstarted claim whose lease is gone is deleted: its owner can no longer start).
const LOOKUP_SCRIPT: &str = r"
local current = redis.call('GET', KEYS[1])
if not current then
  return {}
end
local held = read(current)
if held then
  return held
end
redis.call('DEL', KEYS[1])
return {}
";

// KEYS: claim, lease. ARGV: owner token. 1 when the owner's started claim lost its lease.
const ABANDON_SCRIPT: &str = r"
if redis.call('GET', KEYS[1]) ~= 's:' .. ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
return 1
";

/// Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    prefix: Arc<str>,
    command_timeout: Duration,
    claim_lease: Duration,
    max_outcome_bytes: usize,
    scripts: Arc<Scripts>,
}

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

struct Scripts {
    claim: Script,
    start: Script,
    complete: Script,
    release: Script,
    lookup: Script,
    abandon: Script,
}

impl RedisStore {
    /// Prepares the client without connecting; must be called inside a Tokio runtime.
    pub fn new(
        cfg: &RedisConfig,
        max_outcome_bytes: usize,
        claim_lease: Duration,
    ) -> Result<RedisStore, StoreError> {
        let invalid = |e: RedisError| StoreError::Unavailable(format!("invalid Redis setup: {e}"));
        let roots = || TlsCertificates {
            client_tls: None,
            root_cert: cfg.ca.as_ref().map(|ca| ca.pem().to_vec()),
        };
        let conn = if cfg.cluster {
            let mut builder = ClusterClientBuilder::new(cfg.urls.iter().map(|u| u.as_str()));
            if cfg.ca.is_some() {
                builder = builder.certs(roots());
            }
            let client = builder.build().map_err(invalid)?;
            // The connection config overrides the client's timeouts for every node connection.
            Connection::Cluster(
                client.get_pending_async_connection_with_config(
                    ClusterConfig::new()
                        .set_connection_timeout(cfg.connect_timeout)
                        .set_response_timeout(cfg.command_timeout),
                ),
            )
        } else {
            let url = cfg.urls[0].as_str();
            let client = if cfg.ca.is_some() {
                redis::Client::build_with_tls(url, roots())
            } else {
                redis::Client::open(url)
            }
            .map_err(invalid)?;
            let manager = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(cfg.connect_timeout))
                .set_response_timeout(Some(cfg.command_timeout))
                .set_max_delay(MAX_RECONNECT_DELAY);
            Connection::Single(
                ConnectionManager::new_lazy_with_config(client, manager).map_err(invalid)?,
            )
        };
        Ok(RedisStore {
            conn,
            prefix: cfg.key_prefix.as_str().into(),
            command_timeout: cfg.command_timeout,
            claim_lease,
            max_outcome_bytes,
            scripts: Arc::new(Scripts {
                claim: Script::new(&format!("{READ_CLAIM}{CLAIM_SCRIPT}")),
                start: Script::new(START_SCRIPT),
                complete: Script::new(COMPLETE_SCRIPT),
                release: Script::new(RELEASE_SCRIPT),
                lookup: Script::new(&format!("{READ_CLAIM}{LOOKUP_SCRIPT}")),
                abandon: Script::new(ABANDON_SCRIPT),
            }),
        })
    }

    pub async fn claim(&self, id: &str, owner: &Owner, ttl: Duration) -> Result<Claim, StoreError> {
        let keys = self.keys(id);
        let reply: Vec<Vec<u8>> = self
            .invoke(
                self.scripts
                    .claim
                    .key(&keys.claim)
                    .key(&keys.outcome)
                    .key(&keys.lease)
                    .arg(ttl_millis(ttl))
                    .arg(ttl_millis(self.claim_lease))
                    .arg(owner.token()),
            )
            .await?;
        match found(reply)? {
            Some(claim) => Ok(claim),
            None => Err(StoreError::Unavailable(
                "unexpected reply from the claim script".into(),
            )),
        }
    }

    /// What holds `id` in this store, without claiming it (`None`: nothing live): for a store
    /// a reload retired, and for the retries of a state-only round reading their call's outcome
    /// (`SingleUseStore::peek`). An unstarted claim whose lease is gone is removed (see the
    /// module documentation), so that the id can be claimed elsewhere.
    pub async fn lookup(&self, id: &str) -> Result<Option<Claim>, StoreError> {
        let keys = self.keys(id);
        let reply: Vec<Vec<u8>> = self
            .invoke(
                self.scripts
                    .lookup
                    .key(&keys.claim)
                    .key(&keys.outcome)
                    .key(&keys.lease),
            )
            .await?;
        match found(reply)? {
            Some(Claim::Acquired | Claim::TakenOver) => Err(StoreError::Unavailable(
                "unexpected reply from the lookup script".into(),
            )),
            other => Ok(other),
        }
    }

    pub async fn start(
        &self,
        id: &str,
        owner: &Owner,
        run_lease: Duration,
    ) -> Result<bool, StoreError> {
        let keys = self.keys(id);
        let started: i64 = self
            .invoke(
                self.scripts
                    .start
                    .key(&keys.claim)
                    .key(&keys.lease)
                    .arg(owner.token())
                    .arg(ttl_millis(run_lease)),
            )
            .await?;
        Ok(started == 1)
    }

    pub async fn complete(
        &self,
        id: &str,
        owner: &Owner,
        outcome: Option<&[u8]>,
        ttl: Duration,
    ) -> Result<Completion, StoreError> {
        let keys = self.keys(id);
        let (kept, result): (&[u8], _) = match outcome {
            None => (&[], Completion::NoOutcome),
            Some(b) if b.len() > self.max_outcome_bytes => (&[], Completion::TooLarge),
            Some(b) => (b, Completion::Kept),
        };
        let flag = if result == Completion::Kept { "d" } else { "n" };
        let updated: i64 = self
            .invoke(
                self.scripts
                    .complete
                    .key(&keys.claim)
                    .key(&keys.outcome)
                    .key(&keys.lease)
                    .arg(ttl_millis(ttl))
                    .arg(flag)
                    .arg(kept)
                    .arg(owner.token()),
            )
            .await?;
        Ok(if updated == 1 {
            result
        } else {
            Completion::NoClaim
        })
    }

    pub async fn release(&self, id: &str, owner: &Owner) -> Result<bool, StoreError> {
        let keys = self.keys(id);
        let removed: i64 = self
            .invoke(
                self.scripts
                    .release
                    .key(&keys.claim)
                    .key(&keys.lease)
                    .arg(owner.token()),
            )
            .await?;
        Ok(removed == 1)
    }

    pub async fn abandon(&self, id: &str, owner: &Owner) -> Result<bool, StoreError> {
        let keys = self.keys(id);
        let ended: i64 = self
            .invoke(
                self.scripts
                    .abandon
                    .key(&keys.claim)
                    .key(&keys.lease)
                    .arg(owner.token()),
            )
            .await?;
        Ok(ended == 1)
    }

    /// PING, bounded by the command timeout.
    pub async fn health(&self) -> Result<(), StoreError> {
        let ping = redis::cmd("PING");
        let answer: String = self
            .bounded(async {
                match &self.conn {
                    Connection::Single(c) => ping.query_async(&mut c.clone()).await,
                    Connection::Cluster(c) => ping.query_async(&mut c.clone()).await,
                }
            })
            .await?;
        if answer == "PONG" {
            Ok(())
        } else {
            Err(StoreError::Unavailable(format!("PING answered {answer:?}")))
        }
    }

    /// `name` under this store's key prefix (other records sharing the fleet store).
    pub fn prefixed(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Runs `script` with `keys` and `args`, bounded by the command timeout (other records
    /// sharing the fleet store).
    pub async fn eval<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<T, StoreError> {
        let mut invocation = script.prepare_invoke();
        for k in keys {
            invocation.key(*k);
        }
        for a in args {
            invocation.arg(*a);
        }
        self.invoke(&invocation).await
    }

    fn keys(&self, id: &str) -> Keys {
        let prefix = &self.prefix;
        Keys {
            claim: format!("{prefix}{{{id}}}:claim"),
            outcome: format!("{prefix}{{{id}}}:outcome"),
            lease: format!("{prefix}{{{id}}}:lease"),
        }
    }

    async fn invoke<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.bounded(async {
            match &self.conn {
                Connection::Single(c) => run(script, &mut c.clone()).await,
                Connection::Cluster(c) => run(script, &mut c.clone()).await,
            }
        })
        .await
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.command_timeout, call).await {
            Err(_) => Err(StoreError::Timeout(self.command_timeout)),
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(store_error(&e, self.command_timeout)),
        }
    }
}

/// A claim or lookup script's reply: `None` for the empty reply (nothing live).
fn found(reply: Vec<Vec<u8>>) -> Result<Option<Claim>, StoreError> {
    let mut parts = reply.into_iter();
    Ok(Some(match (parts.next().as_deref(), parts.next()) {
        (None, None) => return Ok(None),
        (Some(b"a"), None) => Claim::Acquired,
        (Some(b"t"), None) => Claim::TakenOver,
        (Some(b"p"), None) => Claim::InProgress,
        (Some(b"l"), None) => Claim::Lost,
        (Some(b"d"), Some(outcome)) => Claim::Done(Bytes::from(outcome)),
        (Some(b"n"), None) => Claim::DoneNotKept,
        _ => {
            return Err(StoreError::Unavailable(
                "unexpected reply from a single-use script".into(),
            ));
        }
    }))
}

/// The keys of one claim id; all three share its `{id}` hash tag (one cluster slot).
struct Keys {
    claim: String,
    outcome: String,
    lease: String,
}

async fn run<T: FromRedisValue>(
    script: &ScriptInvocation<'_>,
    conn: &mut (impl ConnectionLike + Send),
) -> Result<T, RedisError> {
    script.invoke_async(conn).await
}

fn store_error(e: &RedisError, timeout: Duration) -> StoreError {
    if e.code() == Some("OOM") || e.to_string().contains("OOM command not allowed") {
        StoreError::Full {
            retry_after: OOM_RETRY_AFTER,
        }
    } else if e.is_timeout() {
        StoreError::Timeout(timeout)
    } else {
        StoreError::Unavailable(e.to_string())
    }
}

/// Milliseconds for `PX`: at least 1 (Redis refuses 0).
fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}
