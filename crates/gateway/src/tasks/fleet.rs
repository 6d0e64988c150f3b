//! Tasks in the fleet store (Redis, shared with the single-use store: same connection, key
//! prefix and timeouts), so that any replica answers `tasks/get`, `tasks/update` and
//! `tasks/cancel` for a task another replica runs.
//!
//! One hash per task, `PREFIX task:{ID}`, and one for the answers waiting for its call,
//! `PREFIX task:{ID}:answers` (the `{ID}` hash tag keeps both in one cluster slot):
//!
//! - `rec`, `prn`, `st`, `keys`, `lease`: written only by the replica running the call (a
//!   snapshot of the task, its principal, status, outstanding question keys, and until when
//!   the runner vouches for it); rewritten on every change and on a heartbeat;
//! - `ovr` (`cancelled` or `lost`) and `ovr_at`: written by anyone, once: a `tasks/cancel`
//!   on any replica, or a reader that finds the runner's lease run out (its replica died).
//!   Once set, the runner's writes are refused; the runner sees that on its next heartbeat and
//!   stops the call. A lost task is never run again.
//!
//! Answers are added by `tasks/update` on any replica only for the keys outstanding now (a
//! script checks `keys`), and taken by the runner, which polls for them. Polling rather than
//! pub/sub: the runner already writes a heartbeat, a poll needs no subscriber connection to
//! keep and re-establish, and its cost is bounded by `tasks.poll_interval`.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use redis::Script;
use serde_json::{Map, Value};

use super::record::{Status, Task, unix_millis};
use crate::single_use::{RedisStore, StoreError};

/// What overrode the runner's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Override {
    /// `tasks/cancel`.
    Cancelled,
    /// The runner's lease ran out: its replica stopped.
    Lost,
}

/// A task as read from the fleet store.
pub struct Stored {
    pub task: Task,
    pub overridden: Option<(Override, SystemTime)>,
    /// Until when the runner vouches for the task.
    pub lease: SystemTime,
}

const PUT: &str = r"
if redis.call('HEXISTS', KEYS[1], 'ovr') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'rec', ARGV[1], 'prn', ARGV[2], 'st', ARGV[3], 'keys', ARGV[4], 'lease', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[6]) end
return 1
";

const READ: &str = r"return redis.call('HGETALL', KEYS[1])";

const TERMINAL: &str = r"
local function finished(k)
  local st = redis.call('HGET', k, 'st')
  return st == 'completed' or st == 'failed' or st == 'cancelled' or redis.call('HEXISTS', k, 'ovr') == 1
end
";

const CANCEL: &str = r"
local prn = redis.call('HGET', KEYS[1], 'prn')
if not prn or prn ~= ARGV[1] then return 0 end
if not finished(KEYS[1]) then redis.call('HSET', KEYS[1], 'ovr', 'cancelled', 'ovr_at', ARGV[2]) end
return 1
";

const ANSWER: &str = r"
local prn = redis.call('HGET', KEYS[1], 'prn')
if not prn or prn ~= ARGV[1] then return -1 end
if redis.call('HGET', KEYS[1], 'st') ~= 'input_required' or finished(KEYS[1]) then return 0 end
local outstanding = {}
for k in string.gmatch(redis.call('HGET', KEYS[1], 'keys') or '', '%S+') do outstanding[k] = true end
local kept = 0
for i = 2, #ARGV, 2 do
  if outstanding[ARGV[i]] then kept = kept + redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1]) end
end
local ttl = redis.call('PTTL', KEYS[1])
if kept > 0 and ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return kept
";

const TAKE: &str = r"
local vals = redis.call('HMGET', KEYS[1], unpack(ARGV))
for i = 1, #ARGV do if not vals[i] then return {} end end
redis.call('HDEL', KEYS[1], unpack(ARGV))
return vals
";

const LOST: &str = r"
if not redis.call('HGET', KEYS[1], 'st') or finished(KEYS[1]) then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'lease')) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'ovr', 'lost', 'ovr_at', ARGV[1])
return 1
";

/// The scripts, hashed once.
struct Scripts {
    put: Script,
    read: Script,
    cancel: Script,
    answer: Script,
    take: Script,
    lost: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    put: Script::new(PUT),
    read: Script::new(READ),
    cancel: Script::new(&format!("{TERMINAL}{CANCEL}")),
    answer: Script::new(&format!("{TERMINAL}{ANSWER}")),
    take: Script::new(TAKE),
    lost: Script::new(&format!("{TERMINAL}{LOST}")),
});

/// The tasks' side of the fleet store.
#[derive(Clone)]
pub struct FleetTasks {
    store: RedisStore,
}

/// Why `tasks/update` was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Answered {
    Kept(i64),
    UnknownTask,
}

impl FleetTasks {
    pub fn new(store: RedisStore) -> FleetTasks {
        FleetTasks { store }
    }

    fn keys(&self, id: &str) -> (String, String) {
        let task = self.store.prefixed(&format!("task:{{{id}}}"));
        let answers = format!("{task}:answers");
        (task, answers)
    }

    /// Writes the runner's snapshot, vouched for until `lease`; `false` when the task was
    /// cancelled or declared lost meanwhile (the runner stops).
    pub async fn put(&self, task: &Task, lease: SystemTime) -> Result<bool, StoreError> {
        let (k, a) = self.keys(&task.id);
        let outstanding: Vec<&str> = task.input_requests.keys().map(String::as_str).collect();
        let keep_until = if task.status.is_terminal() {
            task.forgotten_at()
        } else {
            task.expires().max(lease) + Duration::from_secs(60)
        };
        let px = keep_until
            .duration_since(SystemTime::now())
            .unwrap_or_default()
            .as_millis()
            .max(1)
            .to_string();
        let rec = task.to_stored().to_string();
        let lease = unix_millis(lease).to_string();
        let written: i64 = self
            .store
            .eval(
                &SCRIPTS.put,
                &[&k, &a],
                &[
                    rec.as_bytes(),
                    task.principal.as_bytes(),
                    task.status.as_str().as_bytes(),
                    outstanding.join(" ").as_bytes(),
                    lease.as_bytes(),
                    px.as_bytes(),
                ],
            )
            .await?;
        Ok(written == 1)
    }

    /// The task `id`, if the store holds one.
    pub async fn read(&self, id: &str) -> Result<Option<Stored>, StoreError> {
        let (k, _) = self.keys(id);
        let flat: Vec<Vec<u8>> = self.store.eval(&SCRIPTS.read, &[&k], &[]).await?;
        let mut fields: HashMap<String, String> = HashMap::new();
        let mut it = flat.into_iter();
        while let (Some(f), Some(v)) = (it.next(), it.next()) {
            fields.insert(
                String::from_utf8_lossy(&f).into_owned(),
                String::from_utf8_lossy(&v).into_owned(),
            );
        }
        let Some(task) = fields
            .get("rec")
            .and_then(|r| serde_json::from_str::<Value>(r).ok())
            .and_then(|r| Task::from_stored(&r))
        else {
            return Ok(None);
        };
        let at = |k: &str| {
            let ms = fields
                .get(k)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
        };
        let overridden = match fields.get("ovr").map(String::as_str) {
            Some("cancelled") => Some((Override::Cancelled, at("ovr_at"))),
            Some("lost") => Some((Override::Lost, at("ovr_at"))),
            _ => None,
        };
        Ok(Some(Stored {
            task,
            overridden,
            lease: at("lease"),
        }))
    }

    /// Marks the task `id` of `principal` cancelled (if it is not finished); `false` when
    /// there is no such task of that principal.
    pub async fn cancel(&self, id: &str, principal: &str) -> Result<bool, StoreError> {
        let (k, _) = self.keys(id);
        let now = unix_millis(SystemTime::now()).to_string();
        let found: i64 = self
            .store
            .eval(
                &SCRIPTS.cancel,
                &[&k],
                &[principal.as_bytes(), now.as_bytes()],
            )
            .await?;
        Ok(found == 1)
    }

    /// Keeps the answers to the task's outstanding questions.
    pub async fn answer(
        &self,
        id: &str,
        principal: &str,
        answers: &Map<String, Value>,
    ) -> Result<Answered, StoreError> {
        let (k, a) = self.keys(id);
        let encoded: Vec<(String, String)> = answers
            .iter()
            .map(|(key, v)| (key.clone(), v.to_string()))
            .collect();
        let mut args: Vec<&[u8]> = vec![principal.as_bytes()];
        for (key, v) in &encoded {
            args.push(key.as_bytes());
            args.push(v.as_bytes());
        }
        let kept: i64 = self.store.eval(&SCRIPTS.answer, &[&k, &a], &args).await?;
        Ok(if kept < 0 {
            Answered::UnknownTask
        } else {
            Answered::Kept(kept)
        })
    }

    /// The answers to every key of `keys`, taken, once all have come.
    pub async fn take_answers(
        &self,
        id: &str,
        keys: &[String],
    ) -> Result<Option<Map<String, Value>>, StoreError> {
        let (_, a) = self.keys(id);
        let args: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        let vals: Vec<Vec<u8>> = self.store.eval(&SCRIPTS.take, &[&a], &args).await?;
        if vals.len() != keys.len() {
            return Ok(None);
        }
        Ok(Some(
            keys.iter()
                .zip(vals)
                .map(|(k, v)| {
                    let v = serde_json::from_slice(&v).unwrap_or(Value::Null);
                    (k.clone(), v)
                })
                .collect(),
        ))
    }

    /// Declares the task lost if its runner's lease has run out (its replica stopped);
    /// `true` when this call did.
    pub async fn declare_lost(&self, id: &str) -> Result<bool, StoreError> {
        let (k, _) = self.keys(id);
        let now = unix_millis(SystemTime::now()).to_string();
        let declared: i64 = self
            .store
            .eval(&SCRIPTS.lost, &[&k], &[now.as_bytes()])
            .await?;
        Ok(declared == 1)
    }
}

impl Stored {
    /// Whether the runner's lease has run out on an unfinished task.
    pub fn lease_lapsed(&self) -> bool {
        self.overridden.is_none()
            && !self.task.status.is_terminal()
            && self.lease < SystemTime::now()
    }

    /// The task as clients see it: an override's status applied to the runner's snapshot.
    /// `lost_error` is the JSON-RPC error a lost task carries.
    pub fn view(mut self, lost_error: impl FnOnce() -> (String, Value)) -> Task {
        match self.overridden {
            Some((Override::Cancelled, at)) if !self.task.status.is_terminal() => {
                self.task
                    .set(Status::Cancelled, Some("cancelled by the client".into()));
                self.task.updated = at;
            }
            Some((Override::Lost, at)) if !self.task.status.is_terminal() => {
                let (message, error) = lost_error();
                self.task.error = Some(error);
                self.task.set(Status::Failed, Some(message));
                self.task.updated = at;
            }
            _ => {}
        }
        self.task
    }
}
