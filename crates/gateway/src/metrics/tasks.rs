//! What the Tasks extension records: tasks created and how they ended, the ones unfinished now,
//! and the rounds of questions they asked.

use prometheus::{IntCounter, IntCounterVec, IntGauge};

use super::Registrar;

/// How a task ended (`tasks_finished_total{status}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEnd {
    Completed,
    Failed,
    Cancelled,
}

impl TaskEnd {
    const ALL: [TaskEnd; 3] = [TaskEnd::Completed, TaskEnd::Failed, TaskEnd::Cancelled];

    pub fn label(self) -> &'static str {
        match self {
            TaskEnd::Completed => "completed",
            TaskEnd::Failed => "failed",
            TaskEnd::Cancelled => "cancelled",
        }
    }
}

pub struct TaskMetrics {
    created: IntCounter,
    finished: IntCounterVec,
    running: IntGauge,
    input_rounds: IntCounter,
}

impl TaskMetrics {
    pub fn created(&self) {
        self.created.inc();
    }

    pub fn finished(&self, end: TaskEnd) {
        self.finished.with_label_values(&[end.label()]).inc();
    }

    /// The gauge of unfinished tasks on this replica (the board keeps it).
    pub fn running(&self) -> IntGauge {
        self.running.clone()
    }

    /// A task asked the client a round of questions (`input_required`).
    pub fn input_round(&self) {
        self.input_rounds.inc();
    }

    pub(super) fn register(r: &Registrar) -> Self {
        let labels: Vec<&str> = TaskEnd::ALL.iter().map(|e| e.label()).collect();
        TaskMetrics {
            created: r.register(
                IntCounter::new("tasks_created_total", "Tool calls turned into tasks.")
                    .expect("valid metric"),
            ),
            finished: r.counter_vec_from_start(
                "tasks_finished_total",
                "Tasks that reached a terminal status, by status (completed, failed, cancelled).",
                &["status"],
                &[&labels],
            ),
            running: r.gauge("tasks_running", "Unfinished tasks on this replica now."),
            input_rounds: r.register(
                IntCounter::new(
                    "task_input_rounds_total",
                    "Rounds of questions tasks asked through tasks/get (status input_required).",
                )
                .expect("valid metric"),
            ),
        }
    }
}
