//! Drives a task's call through the MRTR engine, as a client would: each `input_required`
//! round becomes the task's `inputRequests`, and the answers given with `tasks/update` go back
//! in a retry with the round's `requestState`.
//!
//! So a task asks nothing of the legacy side that an ordinary call does not: the same capture,
//! policy review, parking and single-use rules apply to every round, and the legacy call
//! itself stays an ordinary blocking call (no legacy tasks are declared upstream).

use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::board::{Board, Entry};
use super::fleet::{FleetTasks, Override};
use super::record::Status;
use crate::error::{Rejection, RejectionKind};
use crate::metrics::{TaskEnd, TaskMetrics};
use crate::mrtr::at_most_once::Render;
use crate::mrtr::deps::Engine;
use crate::mrtr::engine::{self, Call, Sink};

/// What a task runs with.
pub(super) struct Running {
    pub engine: Arc<Engine>,
    pub board: Arc<Board>,
    pub metrics: Arc<TaskMetrics>,
    pub entry: Arc<Entry>,
    pub render: Render,
    /// The fleet store the task's record is kept in, if any.
    pub fleet: Option<Fleet>,
}

/// The fleet store of a task, and how long its runner vouches for it between heartbeats.
pub(super) struct Fleet {
    pub store: FleetTasks,
    pub lease: Duration,
}

impl Fleet {
    pub fn lease_from_now(&self) -> SystemTime {
        SystemTime::now() + self.lease
    }
}

/// Longest pause between two looks for answers in the fleet store.
const ANSWER_POLL_MAX: Duration = Duration::from_millis(250);

/// How a round of the call ended.
enum Step {
    /// The call's result (a tool error included).
    Done(Value),
    /// Questions (maybe none) and the state to retry with.
    Asked(Map<String, Value>, String),
    Failed(Rejection),
}

/// Runs the task's call to its end and records how it ended.
pub(super) async fn run(r: Running, call: Call) {
    let mut call = Arc::new(call);
    let (ttl, task_id, caller) = {
        let t = r.entry.task();
        (t.ttl, t.id.clone(), t.caller.clone())
    };
    let deadline = Instant::now() + ttl;
    // Stops the call: a `tasks/cancel`, or the TTL passing.
    let stop = r.entry.cancel.child_token();
    let heartbeat = r.fleet.as_ref().map(|f| {
        let (entry, store, lease) = (r.entry.clone(), f.store.clone(), f.lease);
        tokio::spawn(beat(entry, store, lease))
    });
    let mut round = 0u32;
    let end = loop {
        let step = one_round(&r, &call, &stop, deadline).await;
        match step {
            Step::Done(result) => break Ok(result),
            Step::Failed(rej) => break Err(rej),
            Step::Asked(questions, state) => {
                let answers = if questions.is_empty() {
                    // A state-only round: the call runs on; follow it at once.
                    Map::new()
                } else {
                    round += 1;
                    r.metrics.input_round();
                    match ask(&r, round, questions, &stop, deadline).await {
                        Some(answers) => answers,
                        None => break Err(stopped(&r.entry)),
                    }
                };
                call = Arc::new(retry(&call, &task_id, round, state, answers));
            }
        }
    };
    if let Some(h) = heartbeat {
        h.abort();
    }
    let end = settle(&r, end);
    // A task another replica declared lost was counted there.
    if record_end(&r).await != Some(Override::Lost) {
        r.metrics.finished(end);
    }
    r.board.finished(&caller);
}

/// With the fleet store: writes the task's final snapshot; what overrode it, if the write was
/// refused.
async fn record_end(r: &Running) -> Option<Override> {
    let f = r.fleet.as_ref()?;
    let snapshot = r.entry.task().clone();
    match f.store.put(&snapshot, SystemTime::now()).await {
        Ok(true) => None,
        Ok(false) => match f.store.read(&snapshot.id).await {
            Ok(Some(stored)) => stored.overridden.map(|(o, _)| o),
            _ => None,
        },
        Err(e) => {
            tracing::warn!(error = %e, "could not write a task's final record");
            None
        }
    }
}

/// With the fleet store: renews the runner's lease (with the current snapshot, progress
/// included) every third of it, and stops the call when the record was overridden (a
/// `tasks/cancel` on another replica).
async fn beat(entry: Arc<Entry>, store: FleetTasks, lease: Duration) {
    let every = (lease / 3).min(Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        let snapshot = entry.task().clone();
        match store.put(&snapshot, SystemTime::now() + lease).await {
            Ok(true) => {}
            Ok(false) => {
                entry.cancel.cancel();
                return;
            }
            // The store is unreachable: keep running; a reader may declare the task lost
            // once the lease runs out, and the next write is refused then.
            Err(e) => tracing::warn!(error = %e, "could not renew a task's lease"),
        }
    }
}

/// With the fleet store: writes the task's snapshot now (a status change); a refused write
/// (cancelled or lost meanwhile) stops the call.
async fn sync(r: &Running) {
    let Some(f) = &r.fleet else { return };
    let snapshot = r.entry.task().clone();
    match f.store.put(&snapshot, f.lease_from_now()).await {
        Ok(true) => {}
        Ok(false) => r.entry.cancel.cancel(),
        Err(e) => tracing::warn!(error = %e, "could not write a task's record"),
    }
}

/// Serves the call once (one round), turning its notifications into the task's status
/// message.
async fn one_round(
    r: &Running,
    call: &Arc<Call>,
    stop: &CancellationToken,
    deadline: Instant,
) -> Step {
    let (tx, mut rx) = mpsc::channel(16);
    let sink = Sink::new(Some(tx));
    let served = engine::serve(&r.engine, call, &sink, stop, r.render);
    tokio::pin!(served);
    let outcome = loop {
        tokio::select! {
            out = &mut served => break out,
            Some(msg) = rx.recv() => note_progress(&r.entry, &msg),
            () = tokio::time::sleep_until(deadline), if !stop.is_cancelled() => stop.cancel(),
        }
    };
    match outcome {
        Ok(v) if v.get("resultType").and_then(Value::as_str) == Some("input_required") => {
            let questions = v
                .get("inputRequests")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            match v.get("requestState").and_then(Value::as_str) {
                Some(state) => Step::Asked(questions, state.to_owned()),
                None => Step::Failed(Rejection::new(
                    RejectionKind::InternalPanic,
                    "a round ended without a requestState",
                )),
            }
        }
        Ok(v) if r.entry.cancel.is_cancelled() && !r.entry.given_up() => {
            // Finished before the cancellation took effect: the task is cancelled all the
            // same (`tasks/cancel` already said so).
            drop(v);
            Step::Failed(stopped(&r.entry))
        }
        Ok(v) => Step::Done(v),
        Err(_) if stop.is_cancelled() => Step::Failed(stopped(&r.entry)),
        Err(rej) => Step::Failed(rej),
    }
}

/// A progress notification's message (and numbers) becomes the status message while working.
fn note_progress(entry: &Entry, msg: &Value) {
    if msg.get("method").and_then(Value::as_str) != Some("notifications/progress") {
        return;
    }
    let p = &msg["params"];
    let numbers = match (p.get("progress"), p.get("total")) {
        (Some(done), Some(total)) => format!("{done}/{total}"),
        (Some(done), None) => format!("{done}"),
        _ => String::new(),
    };
    let text = match p.get("message").and_then(Value::as_str) {
        Some(m) if numbers.is_empty() => m.to_owned(),
        Some(m) => format!("{m} ({numbers})"),
        None => numbers,
    };
    let mut task = entry.task();
    if task.status == Status::Working && !text.is_empty() {
        task.status_message = Some(text);
        task.updated = std::time::SystemTime::now();
    }
}

/// Shows the round's questions under task keys (`{round}-{key}`: unique for the task's life)
/// and waits until every one is answered. `None`: stopped first.
async fn ask(
    r: &Running,
    round: u32,
    questions: Map<String, Value>,
    stop: &CancellationToken,
    deadline: Instant,
) -> Option<Map<String, Value>> {
    let keys: Vec<(String, String)> = questions
        .keys()
        .map(|k| (format!("{round}-{k}"), k.clone()))
        .collect();
    let task_keys: Vec<String> = keys.iter().map(|(t, _)| t.clone()).collect();
    let mut changed = r.entry.watch();
    {
        let mut task = r.entry.task();
        if task.status.is_terminal() {
            return None;
        }
        task.set(Status::InputRequired, None);
        task.input_requests = questions
            .into_iter()
            .map(|(k, v)| (format!("{round}-{k}"), v))
            .collect();
    }
    sync(r).await;
    let answers = match &r.fleet {
        None => loop {
            if let Some(answers) = r.entry.take_answers(&task_keys) {
                break answers;
            }
            tokio::select! {
                res = changed.changed() => if res.is_err() { return None },
                () = stop.cancelled() => return None,
                () = tokio::time::sleep_until(deadline) => return None,
            }
        },
        Some(f) => {
            let (pause, id) = {
                let t = r.entry.task();
                (t.poll_interval.min(ANSWER_POLL_MAX), t.id.clone())
            };
            loop {
                match f.store.take_answers(&id, &task_keys).await {
                    Ok(Some(answers)) => break answers,
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "could not read a task's answers"),
                }
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = stop.cancelled() => return None,
                    () = tokio::time::sleep_until(deadline) => return None,
                }
            }
        }
    };
    {
        let mut task = r.entry.task();
        if task.status.is_terminal() {
            return None;
        }
        task.set(Status::Working, None);
    }
    sync(r).await;
    Some(
        keys.into_iter()
            .filter_map(|(task_key, key)| answers.get(&task_key).map(|v| (key, v.clone())))
            .collect(),
    )
}

/// The retry of `call` carrying the round's answers and state, under a new id.
fn retry(
    call: &Call,
    task_id: &str,
    round: u32,
    state: String,
    answers: Map<String, Value>,
) -> Call {
    let mut next = call.clone();
    next.id = json!(format!("task-{task_id}-{round}"));
    if let Some(params) = next.params.as_object_mut() {
        params.insert("requestState".into(), Value::String(state));
        params.insert("inputResponses".into(), Value::Object(answers));
    }
    next
}

/// Why the call stopped: cancelled, or past its TTL.
fn stopped(entry: &Entry) -> Rejection {
    if entry.cancel.is_cancelled() && entry.given_up() {
        Rejection::new(
            RejectionKind::ShuttingDown,
            "the gateway replica running the task shut down before it finished",
        )
    } else if entry.cancel.is_cancelled() {
        Rejection::new(RejectionKind::ClientCancelled, "the task was cancelled")
    } else {
        Rejection::new(
            RejectionKind::CallTimeout,
            "the task did not finish within its TTL (tasks.ttl)",
        )
    }
}

/// Records the end: `completed` with the result, `cancelled` after `tasks/cancel`, otherwise
/// `failed` with the JSON-RPC error the call would have been answered with.
fn settle(r: &Running, end: Result<Value, Rejection>) -> TaskEnd {
    let cancelled = r.entry.cancel.is_cancelled() && !r.entry.given_up();
    let mut task = r.entry.task();
    if !task.status.is_terminal() {
        match end {
            _ if cancelled => task.set(Status::Cancelled, Some("cancelled by the client".into())),
            Ok(result) => {
                task.result = Some(result);
                task.set(Status::Completed, None);
            }
            Err(rej) => {
                let (_, error) = (r.render)(&rej);
                let message = error.message.clone();
                task.error = serde_json::to_value(error).ok();
                task.set(Status::Failed, Some(message));
            }
        }
    }
    match task.status {
        Status::Completed => TaskEnd::Completed,
        Status::Cancelled => TaskEnd::Cancelled,
        _ => TaskEnd::Failed,
    }
}
