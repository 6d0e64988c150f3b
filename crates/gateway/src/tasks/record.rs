//! One task as the gateway keeps it, and its two wire shapes: the `CreateTaskResult` a
//! `tools/call` returns and the `DetailedTask` `tasks/get` returns.

use std::time::{Duration, SystemTime};

use serde_json::{Map, Value, json};

use crate::caller_scope::Caller;

/// How long a task that ended at (or near) the end of its TTL stays readable.
const FINISHED_GRACE: Duration = Duration::from_secs(60);

/// A task's status, as the extension names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Working => "working",
            Status::InputRequired => "input_required",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed | Status::Cancelled)
    }
}

/// A task: who owns it, where it stands, and what it holds for its owner.
#[derive(Debug, Clone)]
pub struct Task {
    pub id: String,
    /// Only this principal sees the task; to anyone else it does not exist.
    pub principal: String,
    /// Whom the task counts against (`tasks.max_running_per_principal`).
    pub caller: Caller,
    pub status: Status,
    pub status_message: Option<String>,
    pub created: SystemTime,
    pub updated: SystemTime,
    pub ttl: Duration,
    pub poll_interval: Duration,
    /// The questions outstanding while `input_required`, under the task's own keys.
    pub input_requests: Map<String, Value>,
    /// The call's result, once `completed`.
    pub result: Option<Value>,
    /// The JSON-RPC error the call ended with, once `failed`.
    pub error: Option<Value>,
}

impl Task {
    pub fn new(
        id: String,
        principal: String,
        caller: Caller,
        ttl: Duration,
        poll_interval: Duration,
    ) -> Task {
        let now = SystemTime::now();
        Task {
            id,
            principal,
            caller,
            status: Status::Working,
            status_message: None,
            created: now,
            updated: now,
            ttl,
            poll_interval,
            input_requests: Map::new(),
            result: None,
            error: None,
        }
    }

    /// When the task's TTL ends: an unfinished one fails then.
    pub fn expires(&self) -> SystemTime {
        self.created + self.ttl
    }

    /// When a finished task is forgotten: at the end of its TTL, but not before its client
    /// had a minute to see how it ended (a task failed by its TTL ends just then).
    pub fn forgotten_at(&self) -> SystemTime {
        self.expires().max(self.updated + FINISHED_GRACE)
    }

    /// Moves to `status` now, with `message` (none clears the last one).
    pub fn set(&mut self, status: Status, message: Option<String>) {
        self.status = status;
        self.status_message = message;
        self.updated = SystemTime::now();
        if status != Status::InputRequired {
            self.input_requests.clear();
        }
    }

    /// The members every shape carries.
    fn base(&self, result_type: &str) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("resultType".into(), json!(result_type));
        m.insert("taskId".into(), json!(self.id));
        m.insert("status".into(), json!(self.status.as_str()));
        if let Some(msg) = &self.status_message {
            m.insert("statusMessage".into(), json!(msg));
        }
        m.insert("createdAt".into(), json!(timestamp(self.created)));
        m.insert("lastUpdatedAt".into(), json!(timestamp(self.updated)));
        m.insert("ttlMs".into(), json!(millis(self.ttl)));
        m.insert("pollIntervalMs".into(), json!(millis(self.poll_interval)));
        m
    }

    /// The `CreateTaskResult` (`resultType: "task"`): the task's seed state, no payload.
    pub fn created_result(&self) -> Value {
        Value::Object(self.base("task"))
    }

    /// The `DetailedTask` `tasks/get` returns (`resultType: "complete"`), with the questions,
    /// the result or the error its status carries.
    pub fn detailed(&self) -> Value {
        let mut m = self.base("complete");
        match self.status {
            Status::InputRequired => {
                m.insert(
                    "inputRequests".into(),
                    Value::Object(self.input_requests.clone()),
                );
            }
            Status::Completed => {
                m.insert("result".into(), self.result.clone().unwrap_or(json!({})));
            }
            Status::Failed => {
                m.insert("error".into(), self.error.clone().unwrap_or(json!({})));
            }
            Status::Working | Status::Cancelled => {}
        }
        Value::Object(m)
    }
}

impl Task {
    /// The record as the fleet store keeps it (`tasks::fleet`).
    pub fn to_stored(&self) -> Value {
        json!({
            "taskId": self.id,
            "principal": self.principal,
            "status": self.status.as_str(),
            "statusMessage": self.status_message,
            "created": unix_millis(self.created),
            "updated": unix_millis(self.updated),
            "ttlMs": millis(self.ttl),
            "pollIntervalMs": millis(self.poll_interval),
            "inputRequests": self.input_requests,
            "result": self.result,
            "error": self.error,
        })
    }

    /// A record read back from the fleet store; `None` when it is not one.
    pub fn from_stored(v: &Value) -> Option<Task> {
        let status = match v.get("status")?.as_str()? {
            "working" => Status::Working,
            "input_required" => Status::InputRequired,
            "completed" => Status::Completed,
            "failed" => Status::Failed,
            "cancelled" => Status::Cancelled,
            _ => return None,
        };
        let principal = v.get("principal")?.as_str()?.to_owned();
        let at = |k: &str| v.get(k).and_then(Value::as_u64).map(from_unix_millis);
        let ms = |k: &str| v.get(k).and_then(Value::as_u64).map(Duration::from_millis);
        Some(Task {
            id: v.get("taskId")?.as_str()?.to_owned(),
            // A record read back is shown, never admitted: its quota caller is not stored and
            // this one is never counted against.
            caller: Caller::of(&principal, [0, 0, 0, 0].into(), false, 0),
            principal,
            status,
            status_message: v
                .get("statusMessage")
                .and_then(Value::as_str)
                .map(str::to_owned),
            created: at("created")?,
            updated: at("updated")?,
            ttl: ms("ttlMs")?,
            poll_interval: ms("pollIntervalMs")?,
            input_requests: v
                .get("inputRequests")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            result: v.get("result").filter(|r| !r.is_null()).cloned(),
            error: v.get("error").filter(|e| !e.is_null()).cloned(),
        })
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, millis)
}

fn from_unix_millis(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// ISO 8601 in UTC, to the millisecond.
fn timestamp(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> Task {
        Task::new(
            "t1".into(),
            "alice".into(),
            Caller::of("alice", [127, 0, 0, 1].into(), false, 64),
            Duration::from_secs(60),
            Duration::from_millis(500),
        )
    }

    #[test]
    fn each_status_carries_its_payload_and_only_it() {
        let mut t = task();
        let created = t.created_result();
        assert_eq!(created["resultType"], "task");
        assert_eq!(created["status"], "working");
        assert_eq!(created["ttlMs"], 60_000);
        assert_eq!(created["pollIntervalMs"], 500);
        assert!(created["createdAt"].as_str().unwrap().ends_with('Z'));
        t.input_requests
            .insert("1-a".into(), json!({"method": "roots/list"}));
        t.set(Status::InputRequired, None);
        let d = t.detailed();
        assert_eq!(d["resultType"], "complete");
        assert_eq!(d["inputRequests"]["1-a"]["method"], "roots/list");
        t.result = Some(json!({"content": [], "isError": true}));
        t.set(Status::Completed, None);
        let d = t.detailed();
        assert_eq!(d["result"]["isError"], true);
        assert!(d.get("inputRequests").is_none() && d.get("error").is_none());
        t.error = Some(json!({"code": -32603, "message": "x"}));
        t.set(Status::Failed, Some("x".into()));
        let d = t.detailed();
        assert_eq!(
            (d["error"]["code"].clone(), d["statusMessage"].clone()),
            (json!(-32603), json!("x"))
        );
        assert!(d.get("result").is_none());
    }

    #[test]
    fn the_stored_form_reads_back_the_same_task() {
        let mut t = task();
        t.input_requests
            .insert("1-a".into(), json!({"method": "roots/list"}));
        t.set(Status::InputRequired, Some("waiting".into()));
        let back = Task::from_stored(&t.to_stored()).unwrap();
        assert_eq!(back.detailed(), t.detailed());
        t.result =
            Some(json!({"content": [{"type": "text", "text": "x"}], "n": 12345678901234567u64}));
        t.set(Status::Completed, None);
        let back = Task::from_stored(&t.to_stored()).unwrap();
        assert_eq!(back.detailed(), t.detailed());
        assert!(Task::from_stored(&json!({"status": "done"})).is_none());
    }
}
