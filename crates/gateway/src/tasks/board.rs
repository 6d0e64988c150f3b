//! The tasks this replica holds: their records, the answers waiting for their calls, and the
//! bounds on how many there are.
//!
//! Unfinished tasks are bounded per replica and per caller (`tasks.max_running`, one caller's
//! share of it); records, finished ones included, by `tasks.max_kept`, the oldest finished one
//! making room for a new task. A finished record is forgotten `tasks.ttl` after its creation
//! (and at least a minute after it ended).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use dashmap::DashMap;
use prometheus::IntGauge;
use serde_json::{Map, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::record::{Status, Task};
use crate::caller_scope::Caller;
use crate::config::TasksConfig;
use crate::error::{Rejection, RejectionKind};
use crate::fair_share::ShareRefusal;
use crate::metrics::{Limit, LimitHits};

/// The answer for a task id this caller does not have: the same whether it never existed, is
/// another principal's, or has been forgotten.
pub fn unknown() -> Rejection {
    Rejection::new(
        RejectionKind::TaskUnknown,
        "Failed to retrieve task: no such task (it never existed, or has expired)",
    )
}

/// One task on this replica.
pub struct Entry {
    task: Mutex<Task>,
    /// Answers given with `tasks/update`, by task key, not yet taken by the call.
    answers: Mutex<Map<String, Value>>,
    /// Bumped whenever answers arrive or the task is cancelled: the call waiting on the client
    /// looks again.
    changed: watch::Sender<u64>,
    /// `tasks/cancel` (or the drain giving up): the call stops.
    pub cancel: CancellationToken,
    giving_up: CancellationToken,
}

impl Entry {
    /// Whether the drain gave up on this task (rather than its client cancelling it).
    pub fn given_up(&self) -> bool {
        self.giving_up.is_cancelled()
    }

    pub fn task(&self) -> MutexGuard<'_, Task> {
        self.task.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn answers(&self) -> MutexGuard<'_, Map<String, Value>> {
        self.answers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the answers to outstanding questions; the rest are ignored (keys never issued,
    /// already answered, or of an earlier round). Returns how many were kept.
    pub fn give_answers(&self, given: Map<String, Value>) -> usize {
        let outstanding: Vec<String> = {
            let task = self.task();
            if task.status != Status::InputRequired {
                return 0;
            }
            task.input_requests.keys().cloned().collect()
        };
        let mut kept = 0;
        {
            let mut answers = self.answers();
            for (key, value) in given {
                if outstanding.contains(&key) && !answers.contains_key(&key) {
                    answers.insert(key, value);
                    kept += 1;
                }
            }
        }
        if kept > 0 {
            self.changed.send_modify(|n| *n += 1);
        }
        kept
    }

    /// The answers to every key of `keys`, taken, once all have come.
    pub fn take_answers(&self, keys: &[String]) -> Option<Map<String, Value>> {
        let mut answers = self.answers();
        if !keys.iter().all(|k| answers.contains_key(k)) {
            return None;
        }
        Some(
            keys.iter()
                .filter_map(|k| answers.remove(k).map(|v| (k.clone(), v)))
                .collect(),
        )
    }

    /// A receiver woken when answers arrive.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[derive(Default)]
struct Counts {
    running: usize,
    per_caller: HashMap<Caller, usize>,
}

pub struct Board {
    entries: DashMap<String, Arc<Entry>>,
    counts: Mutex<Counts>,
    running_gauge: IntGauge,
    limits: LimitHits,
    /// The drain gave up on the unfinished tasks: every entry's `cancel` is a child of it.
    giving_up: CancellationToken,
}

impl Board {
    pub fn new(running_gauge: IntGauge, limits: LimitHits) -> Board {
        Board {
            entries: DashMap::new(),
            counts: Mutex::new(Counts::default()),
            running_gauge,
            limits,
            giving_up: CancellationToken::new(),
        }
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Unfinished tasks here now.
    pub fn running(&self) -> usize {
        self.counts().running
    }

    /// Takes a place for a new task of `task.caller` and keeps the task, or says why not.
    pub fn admit(&self, task: Task, cfg: &TasksConfig) -> Result<Arc<Entry>, Rejection> {
        {
            let mut c = self.counts();
            let mine = c.per_caller.get(&task.caller).copied().unwrap_or(0);
            if let Err(refusal) = cfg.running.admit(c.running, mine) {
                return Err(self.refused(refusal));
            }
            c.running += 1;
            *c.per_caller.entry(task.caller.clone()).or_default() += 1;
        }
        self.running_gauge.inc();
        self.make_room(cfg.max_kept);
        let (changed, _) = watch::channel(0);
        let entry = Arc::new(Entry {
            task: Mutex::new(task),
            answers: Mutex::new(Map::new()),
            changed,
            cancel: self.giving_up.child_token(),
            giving_up: self.giving_up.clone(),
        });
        let id = entry.task().id.clone();
        self.entries.insert(id, entry.clone());
        Ok(entry)
    }

    fn refused(&self, refusal: ShareRefusal) -> Rejection {
        match refusal {
            ShareRefusal::Full => {
                self.limits.hit(Limit::TasksMaxRunning);
                Rejection::new(
                    RejectionKind::TasksFull,
                    "this gateway runs as many tasks as it may (tasks.max_running); try again later",
                )
            }
            ShareRefusal::CallerShare | ShareRefusal::Reserve => {
                self.limits.hit(Limit::TasksPerPrincipal);
                Rejection::new(
                    RejectionKind::TaskQuota,
                    "you have as many unfinished tasks as you may (tasks.max_running_per_principal)",
                )
            }
        }
    }

    /// Forgets expired records, then the oldest finished ones while there are `max_kept` or
    /// more (there is always a finished one: `max_kept` is at least `max_running`).
    fn make_room(&self, max_kept: usize) {
        let now = SystemTime::now();
        self.entries.retain(|_, e| {
            let t = e.task();
            !(t.status.is_terminal() && t.forgotten_at() <= now)
        });
        while self.entries.len() >= max_kept {
            let oldest = self
                .entries
                .iter()
                .filter_map(|e| {
                    let t = e.task();
                    t.status.is_terminal().then(|| (t.updated, e.key().clone()))
                })
                .min();
            let Some((_, id)) = oldest else { return };
            self.entries.remove(&id);
            self.limits.hit(Limit::TasksMaxKept);
        }
    }

    /// The task `id` of `principal`. Another principal's task, an unknown one and one past its
    /// TTL are all "unknown": nobody learns that someone else's task exists.
    pub fn lookup(&self, id: &str, principal: &str) -> Result<Arc<Entry>, Rejection> {
        let entry = self.entries.get(id).map(|e| e.value().clone());
        let visible = entry.filter(|e| {
            let t = e.task();
            t.principal == principal
                && (!t.status.is_terminal() || t.forgotten_at() > SystemTime::now())
        });
        visible.ok_or_else(unknown)
    }

    /// Forgets the record `id` (a task whose creation failed).
    pub fn forget(&self, id: &str) {
        self.entries.remove(id);
    }

    /// A task's call has ended: its place is free.
    pub fn finished(&self, caller: &Caller) {
        let mut c = self.counts();
        c.running = c.running.saturating_sub(1);
        if let Some(n) = c.per_caller.get_mut(caller) {
            *n -= 1;
            if *n == 0 {
                c.per_caller.remove(caller);
            }
        }
        drop(c);
        self.running_gauge.dec();
    }

    /// Stops every unfinished task: they end `failed` (a drain that gives up on them).
    pub fn give_up(&self) {
        self.giving_up.cancel();
    }

    /// Whether the drain gave up on the unfinished tasks.
    pub fn given_up(&self) -> bool {
        self.giving_up.is_cancelled()
    }
}
