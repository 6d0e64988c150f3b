//! The Tasks extension (`io.modelcontextprotocol/tasks`) in front of a legacy server.
//!
//! A `tools/call` that `[[tasks.rules]]` (or, where no rule matches, the legacy server's own
//! descriptor, `execution.taskSupport`, learned per caller from `tools/list`) make
//! task-supporting, from a client that declared the extension on that request, returns at
//! once with a `CreateTaskResult`; the call runs on in a task of this replica (`runner`),
//! driven through the MRTR engine like any call. While the legacy server waits on a question,
//! `tasks/get` shows it as `inputRequests` (status `input_required`) and `tasks/update` answers
//! it; `tasks/cancel` stops the call (the legacy call is cancelled upstream as for a client
//! that goes away). A tool error ends `completed` with the tool's result (`isError`); a
//! JSON-RPC failure ends `failed` with the error the call would have been answered with.
//!
//! Tasks are bound to the principal that created them: to anyone else a task id is unknown
//! (-32602), exactly like one that never existed. A required-task tool called by a client that
//! did not declare the extension gets -32021 naming the extension.
//!
//! The call runs on the replica that created the task ([`board`] bounds them there). Where
//! its record lives depends on the single-use store: with the memory store, on that replica
//! only (`tasks/*` must reach it; the spec's `Mcp-Name: <taskId>` header is there for
//! routing); with Redis, in the fleet store ([`fleet`]), so any replica answers `tasks/*`, a
//! cancel or an answer given elsewhere reaches the runner, and a task whose replica died is
//! failed by the next reader once the runner's lease runs out (it never runs twice).

pub mod board;
pub mod fleet;
pub mod record;
mod runner;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::{Config, TaskSupport};
use crate::error::{Rejection, RejectionKind};
use crate::legacy::pool::PoolKey;
use crate::metrics::{LimitHits, TaskMetrics};
use crate::mrtr::at_most_once::Render;
use crate::mrtr::deps::Engine;
use crate::mrtr::engine::Call;
use crate::request_id::RequestId;
use board::Board;
use fleet::FleetTasks;
use record::{Status, Task};

/// The extension's identifier, in capabilities.
pub const EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// What to do with a call.
#[derive(Debug)]
pub enum Plan {
    /// Serve it in its request, as ever.
    Call,
    /// Make it a task.
    Task,
}

/// The tasks of this replica.
pub struct Tasks {
    board: Arc<Board>,
    metrics: Arc<TaskMetrics>,
    /// The replica drains: it takes no new task.
    draining: CancellationToken,
    /// What the legacy server's own descriptors say (`execution.taskSupport` in a 2025-11-25
    /// `tools/list`), per tool and per what its sessions are keyed by (principal, forwarded
    /// credential, declared capabilities): learned from the lists passed on to that caller, as
    /// a server may describe its tools differently to each.
    declared: Mutex<HashMap<(PoolKey, String), TaskSupport>>,
}

/// Tools whose declared task support is remembered per replica; past it, the memory starts
/// over (the next `tools/list` of each caller fills it again).
const DECLARED_MAX: usize = 4096;

impl Tasks {
    pub fn new(metrics: Arc<TaskMetrics>, limits: LimitHits, draining: CancellationToken) -> Tasks {
        Tasks {
            board: Arc::new(Board::new(metrics.running(), limits)),
            metrics,
            draining,
            declared: Mutex::new(HashMap::new()),
        }
    }

    /// Learns the task support the legacy server declared for its tools from a `tools/list`
    /// result passed on to a caller whose sessions are keyed `key`.
    pub fn learn(&self, key: &PoolKey, list: &Value) {
        let Some(tools) = list.get("tools").and_then(Value::as_array) else {
            return;
        };
        let mut declared = self.declared.lock().unwrap_or_else(|e| e.into_inner());
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            let support = match tool
                .pointer("/execution/taskSupport")
                .and_then(Value::as_str)
            {
                Some("optional") => TaskSupport::Optional,
                Some("required") => TaskSupport::Required,
                _ => TaskSupport::Forbidden,
            };
            let key = (key.clone(), name.to_owned());
            if support == TaskSupport::Forbidden {
                declared.remove(&key);
                continue;
            }
            if declared.len() >= DECLARED_MAX && !declared.contains_key(&key) {
                declared.clear();
            }
            declared.insert(key, support);
        }
    }

    /// Forgets every declared task support (another legacy server, or an upgraded one, may
    /// describe its tools otherwise): each caller's next `tools/list` teaches it again.
    pub fn forget_declared(&self) {
        self.declared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// The task support of `call`'s tool: the first matching `[[tasks.rules]]` entry, or else
    /// what the legacy server declared to this caller.
    fn support(&self, cfg: &Config, call: &Call) -> TaskSupport {
        if let Some(ruled) = cfg.tasks.rule_for(&call.method, call.target()) {
            return ruled;
        }
        let Some(name) = call.target() else {
            return TaskSupport::Forbidden;
        };
        let declared = self.declared.lock().unwrap_or_else(|e| e.into_inner());
        if declared.is_empty() {
            // No server described a task tool (the usual case): no key to build.
            return TaskSupport::Forbidden;
        }
        declared
            .get(&(tools_key(call), name.to_owned()))
            .copied()
            .unwrap_or(TaskSupport::Forbidden)
    }

    /// Unfinished tasks on this replica.
    pub fn running(&self) -> usize {
        self.board.running()
    }

    /// The drain's wait for unfinished tasks: until none is left or `deadline`; those still
    /// running then are stopped and end `failed`. Returns how many were given up.
    pub async fn finish(&self, deadline: tokio::time::Instant) -> usize {
        while self.running() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let left = self.running();
        if left > 0 {
            self.board.give_up();
            // The calls stop and record their end (a moment: each cancels its legacy call).
            let settle = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
            while self.running() > 0 && tokio::time::Instant::now() < settle {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        left
    }

    /// Whether `call` becomes a task: `tasks.rules` (or the tool's own descriptor) say whether
    /// its tool may (or must), and the client's declaration on this request whether it can.
    pub fn plan(&self, cfg: &Config, call: &Call) -> Result<Plan, Rejection> {
        let declared = declares_extension(&call.meta.client_capabilities);
        match (self.support(cfg, call), declared) {
            (TaskSupport::Forbidden, _) | (TaskSupport::Optional, false) => Ok(Plan::Call),
            (TaskSupport::Optional | TaskSupport::Required, true) => Ok(Plan::Task),
            (TaskSupport::Required, false) => Err(Rejection::new(
                RejectionKind::MissingClientCapability,
                format!(
                    "{} runs only as a task: declare the {EXTENSION} extension in this request's client capabilities",
                    call.describe()
                ),
            )
            .with_data(json!({"requiredCapabilities": {"extensions": {EXTENSION: {}}}}))),
        }
    }

    /// Creates a task for `call` and starts it; returns its `CreateTaskResult` once a
    /// `tasks/get` for it would find it (with the fleet store: once it is written there).
    /// `render` is how the front answers an error (a failed task carries that error).
    pub async fn create(
        &self,
        engine: &Arc<Engine>,
        mut call: Call,
        render: Render,
    ) -> Result<Value, Rejection> {
        if self.draining.is_cancelled() {
            // 503 with Retry-After: the client's retry reaches a replica that stays.
            return Err(Rejection::new(
                RejectionKind::ShuttingDown,
                "this gateway replica is shutting down and takes no new task; retry",
            ));
        }
        let cfg = engine.config();
        let task = Task::new(
            crate::state::payload::random_id(),
            call.principal.clone(),
            call.caller.clone(),
            cfg.tasks.ttl,
            cfg.tasks.poll_interval,
        );
        let caller = task.caller.clone();
        let entry = self.board.admit(task, &cfg.tasks)?;
        let fleet = engine.single_use().redis().map(|r| runner::Fleet {
            store: FleetTasks::new(r),
            lease: cfg.tasks.lease,
        });
        if let Some(f) = &fleet {
            let snapshot = entry.task().clone();
            if let Err(e) = f.store.put(&snapshot, f.lease_from_now()).await {
                self.board.forget(&snapshot.id);
                self.board.finished(&caller);
                return Err(e.into());
            }
        }
        // The legacy server reports progress only under a token: the task asks for it (its
        // messages become the status message), under the client's own token if it sent one.
        if call.meta.progress_token.is_none() {
            let token = json!(format!("task-{}", entry.task().id));
            if let Some(params) = call.params.as_object_mut() {
                let meta = params
                    .entry("_meta")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert("progressToken".into(), token.clone());
                }
            }
            call.meta.progress_token = Some(token);
        }
        let created = entry.task().created_result();
        self.metrics.created();
        tracing::info!(
            call = %call.describe(),
            task_id = created["taskId"].as_str().unwrap_or(""),
            fleet = fleet.is_some(),
            "a tool call became a task"
        );
        let running = runner::Running {
            engine: engine.clone(),
            board: self.board.clone(),
            metrics: self.metrics.clone(),
            entry,
            render,
            fleet,
        };
        tokio::spawn(RequestId::carry(
            runner::run(running, call).in_current_span(),
        ));
        Ok(created)
    }

    /// Serves `tasks/get`, `tasks/update` or `tasks/cancel` for `principal`: from the fleet
    /// store when there is one (any replica answers), otherwise from this replica's tasks.
    pub async fn serve(
        &self,
        engine: &Engine,
        method: &str,
        params: &Value,
        principal: &str,
        render: Render,
    ) -> Result<Value, Rejection> {
        let id = params
            .get("taskId")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                Rejection::new(
                    RejectionKind::InvalidParams,
                    "params.taskId must be a string",
                )
            })?;
        let answers = || match params.get("inputResponses") {
            Some(Value::Object(m)) => Ok(m.clone()),
            _ => Err(Rejection::new(
                RejectionKind::BadInputResponse,
                "params.inputResponses must be an object keyed like inputRequests",
            )),
        };
        if let Some(redis) = engine.single_use().redis() {
            let fleet = FleetTasks::new(redis);
            return match method {
                "tasks/get" => Ok(self
                    .read_fleet(&fleet, id, principal, render)
                    .await?
                    .detailed()),
                "tasks/update" => match fleet.answer(id, principal, &answers()?).await? {
                    fleet::Answered::UnknownTask => Err(board::unknown()),
                    fleet::Answered::Kept(_) => Ok(ack()),
                },
                "tasks/cancel" => {
                    if !fleet.cancel(id, principal).await? {
                        return Err(board::unknown());
                    }
                    // Running here: stop it now rather than at its next heartbeat.
                    if let Ok(entry) = self.board.lookup(id, principal) {
                        entry.cancel.cancel();
                    }
                    Ok(ack())
                }
                other => Err(Rejection::method_not_found(other)),
            };
        }
        let entry = self.board.lookup(id, principal)?;
        match method {
            "tasks/get" => Ok(entry.task().detailed()),
            "tasks/update" => {
                let kept = entry.give_answers(answers()?);
                tracing::debug!(task_id = id, kept, "tasks/update");
                Ok(ack())
            }
            "tasks/cancel" => {
                {
                    let mut task = entry.task();
                    if !task.status.is_terminal() {
                        task.set(Status::Cancelled, Some("cancelled by the client".into()));
                    }
                }
                entry.cancel.cancel();
                Ok(ack())
            }
            other => Err(Rejection::method_not_found(other)),
        }
    }

    /// The task `id` of `principal` from the fleet store; one whose runner's lease ran out is
    /// declared lost first (and fails: it never runs again).
    async fn read_fleet(
        &self,
        fleet: &FleetTasks,
        id: &str,
        principal: &str,
        render: Render,
    ) -> Result<Task, Rejection> {
        let mut stored = fleet.read(id).await?;
        if stored.as_ref().is_some_and(|s| s.lease_lapsed()) {
            if fleet.declare_lost(id).await? {
                self.metrics.finished(crate::metrics::TaskEnd::Failed);
                tracing::warn!(
                    task_id = id,
                    "a task's replica stopped before it finished: failed"
                );
            }
            stored = fleet.read(id).await?;
        }
        let stored = stored
            .filter(|s| s.task.principal == principal)
            .ok_or_else(board::unknown)?;
        Ok(stored.view(|| {
            let (_, error) = render(&Rejection::new(
                RejectionKind::TaskLost,
                "the gateway replica running this task stopped before it finished; the call's outcome is unknown",
            ));
            let message = error.message.clone();
            (message, serde_json::to_value(error).unwrap_or_default())
        }))
    }
}

/// The key a call's sessions, and so the tool lists it is shown, are kept under.
pub fn tools_key(call: &Call) -> PoolKey {
    PoolKey::new(
        &call.scope(),
        &mrtr_wire::capabilities::Declared::from_modern(&call.meta.client_capabilities),
    )
}

/// Whether a request's client capabilities declare the extension.
pub fn declares_extension(caps: &Value) -> bool {
    caps.get("extensions")
        .and_then(|e| e.get(EXTENSION))
        .is_some_and(Value::is_object)
}

/// The empty acknowledgement of `tasks/update` and `tasks/cancel`.
fn ack() -> Value {
    let mut m = Map::new();
    m.insert("resultType".into(), json!("complete"));
    Value::Object(m)
}
