//! `[tasks]`: which tool calls the gateway turns into tasks (the Tasks extension,
//! `io.modelcontextprotocol/tasks`), and the bounds on the tasks it keeps.

use std::time::Duration;

use super::check::{duration, positive_size};
use super::{ConfigError, raw::RawTasks};
use crate::fair_share::{FairShare, Fractions};
use crate::setting::call_rule::{self, CallRule, check_rule_target};

/// Whether a call becomes a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSupport {
    /// Never: the call is answered in its request (the default).
    Forbidden,
    /// A task when the client declared the extension on this request; otherwise an ordinary
    /// call.
    Optional,
    /// Only as a task: a client that did not declare the extension gets -32003.
    Required,
}

/// One `[[tasks.rules]]` entry.
#[derive(Debug, Clone)]
pub struct TaskRule {
    pub method: String,
    /// The tool's name; `None` matches every tool.
    pub name: Option<String>,
    pub support: TaskSupport,
}

impl CallRule for TaskRule {
    fn method(&self) -> &str {
        &self.method
    }
    fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

#[derive(Debug, Clone)]
pub struct TasksConfig {
    /// Whether `server/discover` advertises the extension and `tasks/*` are served.
    pub enabled: bool,
    pub rules: Vec<TaskRule>,
    /// How long a task is kept from its creation (`ttlMs`); past it, an unfinished task fails
    /// and any task is forgotten.
    pub ttl: Duration,
    /// The `pollIntervalMs` clients are asked to keep between two `tasks/get`.
    pub poll_interval: Duration,
    /// With the fleet store: how long a replica vouches for a task it runs without renewing
    /// (it renews every third of it); a task whose lease ran out is failed by whoever reads it.
    pub lease: Duration,
    /// Unfinished tasks on this replica, and one caller's share of them.
    pub running: FairShare,
    /// Task records kept on this replica, finished ones included (the oldest finished one
    /// makes room for a new task).
    pub max_kept: usize,
}

impl TasksConfig {
    /// What the first matching rule says (`Forbidden` when tasks are off or the method is not
    /// `tools/call`); `None` when no rule matches.
    pub fn rule_for(&self, method: &str, name: Option<&str>) -> Option<TaskSupport> {
        if !self.enabled || method != "tools/call" {
            return Some(TaskSupport::Forbidden);
        }
        call_rule::first_match(&self.rules, method, name).map(|r| r.support)
    }
}

pub(super) fn tasks_config(
    raw: &RawTasks,
    fractions: Fractions,
) -> Result<TasksConfig, ConfigError> {
    let mut rules = Vec::with_capacity(raw.rules.len());
    for (i, r) in raw.rules.iter().enumerate() {
        let key = format!("tasks.rules[{i}]");
        check_rule_target(&key, &r.method, r.name.as_deref())?;
        if r.method != "tools/call" {
            return Err(ConfigError::new(
                format!("{key}.method"),
                "only \"tools/call\" can become a task",
            ));
        }
        let support = match r.support.as_str() {
            "forbidden" => TaskSupport::Forbidden,
            "optional" => TaskSupport::Optional,
            "required" => TaskSupport::Required,
            other => {
                return Err(ConfigError::new(
                    format!("{key}.support"),
                    format!("{other:?}: expected \"optional\", \"required\" or \"forbidden\""),
                ));
            }
        };
        rules.push(TaskRule {
            method: r.method.clone(),
            name: r.name.clone(),
            support,
        });
    }
    let ttl = duration("tasks.ttl", &raw.ttl)?;
    if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(7 * 24 * 3600) {
        return Err(ConfigError::new(
            "tasks.ttl",
            "must be between \"1s\" and \"7d\"",
        ));
    }
    let poll_interval = duration("tasks.poll_interval", &raw.poll_interval)?;
    if poll_interval < Duration::from_millis(10) || poll_interval > ttl {
        return Err(ConfigError::new(
            "tasks.poll_interval",
            "must be at least \"10ms\" and at most tasks.ttl",
        ));
    }
    let lease = duration("tasks.lease", &raw.lease)?;
    if lease < Duration::from_secs(1) || lease > Duration::from_secs(600) {
        return Err(ConfigError::new(
            "tasks.lease",
            "must be between \"1s\" and \"10m\"",
        ));
    }
    let max_running = positive_size("tasks.max_running", raw.max_running)?;
    let per_principal = raw
        .max_running_per_principal
        .map(|n| positive_size("tasks.max_running_per_principal", n))
        .transpose()?;
    let max_kept = positive_size("tasks.max_kept", raw.max_kept)?;
    if max_kept < max_running {
        return Err(ConfigError::new(
            "tasks.max_kept",
            format!("must be at least tasks.max_running ({max_running})"),
        ));
    }
    Ok(TasksConfig {
        enabled: raw.enabled,
        rules,
        ttl,
        poll_interval,
        lease,
        running: FairShare::of(max_running, per_principal, fractions),
        max_kept,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::raw::RawTaskRule;

    fn rule(name: Option<&str>, support: &str) -> RawTaskRule {
        RawTaskRule {
            method: "tools/call".into(),
            name: name.map(str::to_owned),
            support: support.into(),
        }
    }

    #[test]
    fn the_first_matching_rule_decides_and_without_one_the_descriptor_does() {
        let raw = RawTasks {
            rules: vec![
                rule(Some("quick"), "forbidden"),
                rule(Some("build"), "required"),
                rule(None, "optional"),
            ],
            ..Default::default()
        };
        let c = tasks_config(&raw, Fractions::default()).unwrap();
        assert_eq!(
            c.rule_for("tools/call", Some("quick")),
            Some(TaskSupport::Forbidden)
        );
        assert_eq!(
            c.rule_for("tools/call", Some("build")),
            Some(TaskSupport::Required)
        );
        assert_eq!(
            c.rule_for("tools/call", Some("other")),
            Some(TaskSupport::Optional)
        );
        assert_eq!(
            c.rule_for("prompts/get", Some("build")),
            Some(TaskSupport::Forbidden)
        );
        let none = tasks_config(&RawTasks::default(), Fractions::default()).unwrap();
        // No rule: the tool's own descriptor decides (`Tasks::support`), forbidden unless it
        // says otherwise.
        assert_eq!(none.rule_for("tools/call", Some("x")), None);
        let off = tasks_config(
            &RawTasks {
                enabled: false,
                ..raw
            },
            Fractions::default(),
        )
        .unwrap();
        assert_eq!(
            off.rule_for("tools/call", Some("build")),
            Some(TaskSupport::Forbidden)
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let bad = |raw: RawTasks| tasks_config(&raw, Fractions::default()).unwrap_err().key;
        assert_eq!(
            bad(RawTasks {
                rules: vec![rule(Some("x"), "sometimes")],
                ..Default::default()
            }),
            "tasks.rules[0].support"
        );
        let mut prompt = rule(Some("x"), "optional");
        prompt.method = "prompts/get".into();
        assert_eq!(
            bad(RawTasks {
                rules: vec![prompt],
                ..Default::default()
            }),
            "tasks.rules[0].method"
        );
        assert_eq!(
            bad(RawTasks {
                ttl: "0s".into(),
                ..Default::default()
            }),
            "tasks.ttl"
        );
        assert_eq!(
            bad(RawTasks {
                poll_interval: "2h".into(),
                ..Default::default()
            }),
            "tasks.poll_interval"
        );
        assert_eq!(
            bad(RawTasks {
                lease: "100ms".into(),
                ..Default::default()
            }),
            "tasks.lease"
        );
        assert_eq!(
            bad(RawTasks {
                max_kept: 1,
                ..Default::default()
            }),
            "tasks.max_kept"
        );
    }
}
