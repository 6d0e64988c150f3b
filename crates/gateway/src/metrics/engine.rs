//! What the MRTR engine records: `input_required` rounds, retries, rounds past the limit,
//! questions that will not converge, time spent upstream, roots refreshes on reused sessions,
//! and the `requestState` tokens it seals and opens. The policy stage it runs counts into
//! [`crate::policy::PolicyMetrics`], handed along with these.

use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge};

use super::{Registrar, method_label};
use crate::policy::PolicyMetrics;

/// How a retry carrying a `requestState` was served (`retries_total{path}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Resumed from this replica's parking lot.
    Parked,
    /// Replayed on a fresh legacy execution.
    Replayed,
}

/// What became of a roots refresh on a reused session (`roots_refreshes_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootsRefresh {
    /// The server asked for roots again within the wait.
    Reasked,
    /// It did not.
    Timeout,
    /// This upstream was learned to ignore the notification; no wait.
    NotWaited,
}

/// What closed a round of questions (`rounds_closed_total{by}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundClose {
    /// Everything the same round asked last time had come (`mrtr::round_shapes`).
    Learned,
    /// The server was quiet for `mrtr.gather_quiet`.
    Quiet,
    /// `mrtr.gather_window` passed.
    Window,
}

/// A step of a long call's state-only rounds (`state_only_rounds_total{step}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateOnly {
    /// A running call ended its request with a state-only round (`long_calls.round_after`).
    Detached,
    /// `round_after` passed, but the outcome could not be given a claim (the single-use
    /// store refused): the request kept waiting instead.
    NotDetached,
    /// A retry with a state-only state waited `round_after` and got another one.
    StillRunning,
    /// A retry with a state-only state got the call's outcome.
    Collected,
    /// A retry with a state-only state found no outcome and no running call (its replica
    /// died, the store lost it, or it was too large to keep).
    Lost,
}

impl StateOnly {
    const ALL: [StateOnly; 5] = [
        StateOnly::Detached,
        StateOnly::NotDetached,
        StateOnly::StillRunning,
        StateOnly::Collected,
        StateOnly::Lost,
    ];

    fn label(self) -> &'static str {
        match self {
            StateOnly::Detached => "detached",
            StateOnly::NotDetached => "not_detached",
            StateOnly::StillRunning => "still_running",
            StateOnly::Collected => "collected",
            StateOnly::Lost => "lost",
        }
    }
}

/// The engine's families, held by [`crate::mrtr::deps::Engine`].
pub struct EngineMetrics {
    input_required: IntCounterVec,
    retries: IntCounterVec,
    max_rounds_exceeded: IntCounterVec,
    volatile_questions: IntCounterVec,
    upstream_duration: HistogramVec,
    roots_refreshes: IntCounterVec,
    state_seals: IntCounterVec,
    state_opens: IntCounterVec,
    state_bytes: Histogram,
    rounds_closed: IntCounterVec,
    learned_rounds: IntGauge,
    state_only_rounds: IntCounterVec,
    policy: PolicyMetrics,
}

impl EngineMetrics {
    /// An `input_required` result was returned for `method`.
    pub fn input_required(&self, method: &str) {
        self.input_required
            .with_label_values(&[method_label(method)])
            .inc();
    }

    /// A retry carrying a `requestState` was served by `path`.
    pub fn retried(&self, path: Retry) {
        let label = match path {
            Retry::Parked => "parked",
            Retry::Replayed => "replayed",
        };
        self.retries.with_label_values(&[label]).inc();
    }

    /// A call of `method` was ended past `state.max_rounds`.
    pub fn max_rounds_exceeded(&self, method: &str) {
        self.max_rounds_exceeded
            .with_label_values(&[method_label(method)])
            .inc();
    }

    /// A replayed question of `method` differed from last round's only in volatile details.
    pub fn volatile_question(&self, method: &str) {
        self.volatile_questions
            .with_label_values(&[method_label(method)])
            .inc();
    }

    /// A modern request of `method` spent `spent` on the legacy server.
    pub fn upstream_time(&self, method: &str, spent: Duration) {
        self.upstream_duration
            .with_label_values(&[method_label(method)])
            .observe(spent.as_secs_f64());
    }

    /// A roots refresh on a reused session ended as `outcome`.
    pub fn roots_refresh(&self, outcome: RootsRefresh) {
        let label = match outcome {
            RootsRefresh::Reasked => "reasked",
            RootsRefresh::Timeout => "timeout",
            RootsRefresh::NotWaited => "not_waited",
        };
        self.roots_refreshes.with_label_values(&[label]).inc();
    }

    /// A `requestState` of `bytes` bytes was sealed with key `key_id`.
    pub fn state_sealed(&self, key_id: &str, bytes: usize) {
        self.state_seals.with_label_values(&[key_id]).inc();
        self.state_bytes.observe(bytes as f64);
    }

    /// The ring's keys: each has its `state_seals_total` series from now on (at 0 until it
    /// seals), so a new key shows in `/metrics` as soon as it is loaded.
    pub fn state_keys<'k>(&self, key_ids: impl IntoIterator<Item = &'k str>) {
        for id in key_ids {
            self.state_seals.with_label_values(&[id]);
        }
    }

    /// A presented `requestState` opened.
    pub fn state_opened(&self) {
        self.state_opens.with_label_values(&["ok"]).inc();
    }

    /// A presented `requestState` was refused for `reason` (a `state_*` reason).
    pub fn state_refused(&self, reason: &'static str) {
        self.state_opens.with_label_values(&[reason]).inc();
    }

    /// A round of questions closed, by what closed it.
    pub fn round_closed(&self, by: RoundClose) {
        let label = match by {
            RoundClose::Learned => "learned",
            RoundClose::Quiet => "quiet",
            RoundClose::Window => "window",
        };
        self.rounds_closed.with_label_values(&[label]).inc();
    }

    /// How many round shapes this replica remembers now.
    pub fn learned_rounds(&self, n: usize) {
        self.learned_rounds.set(n as i64);
    }

    /// A long call's state-only rounds took `step`.
    pub fn state_only(&self, step: StateOnly) {
        self.state_only_rounds
            .with_label_values(&[step.label()])
            .inc();
    }

    /// Where the policy stage run by the engine counts its refusals and rewrites.
    pub fn policy(&self) -> &PolicyMetrics {
        &self.policy
    }

    pub(super) fn register(r: &Registrar, policy: PolicyMetrics) -> Self {
        let input_required = r.counter_vec_from_start(
            "input_required_total",
            "input_required results returned, by method.",
            &["method"],
            &[super::MRTR_METHODS],
        );
        let retries = r.counter_vec_from_start(
            "retries_total",
            "Retries carrying a requestState, by how they were served (replayed, parked).",
            &["path"],
            &[&["parked", "replayed"]],
        );
        let max_rounds_exceeded = r.counter_vec_from_start(
            "max_rounds_exceeded_total",
            "Calls ended because the legacy server kept asking past state.max_rounds, by method.",
            &["method"],
            &[super::MRTR_METHODS],
        );
        let volatile_questions = r.counter_vec_from_start(
            "volatile_questions_total",
            "Replays where a question differed from the previous round's only in volatile content.",
            &["method"],
            &[super::MRTR_METHODS],
        );
        let upstream_duration = r.register(
            HistogramVec::new(
                HistogramOpts::new(
                    "upstream_duration_seconds",
                    "Time spent on the legacy server per modern request, by method.",
                )
                .buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0,
                ]),
                &["method"],
            )
            .expect("valid metric"),
        );
        for method in super::KNOWN_METHODS {
            upstream_duration.with_label_values(&[method]);
        }
        let roots_refreshes = r.counter_vec_from_start(
            "roots_refreshes_total",
            "Pooled sessions reused for a request declaring roots after the server had asked an earlier client's roots: notifications/roots/list_changed sent, then the server re-asked within pool.roots_refresh_wait (reasked), did not (timeout), or was not waited for because this upstream was learned to ignore the notification (not_waited).",
            &["outcome"],
            &[&["reasked", "timeout", "not_waited"]],
        );
        let rounds_closed = r.counter_vec_from_start(
            "rounds_closed_total",
            "Rounds of questions closed, by what closed them: everything the same round asked last time had come (learned), mrtr.gather_quiet (quiet) or mrtr.gather_window (window).",
            &["by"],
            &[&["learned", "quiet", "window"]],
        );
        let learned_rounds = r.gauge(
            "learned_rounds",
            "Round shapes (per caller, call and round: the kinds of question asked, and whether roots/list came) this replica remembers; at most mrtr.learned_rounds_max.",
        );
        let state_seals = r.counter_vec(
            "state_seals_total",
            "requestState tokens sealed, by key id.",
            &["key_id"],
        );
        let state_opens = r.counter_vec_from_start(
            "state_opens_total",
            "requestState tokens presented, by result (ok, or the rejection reason).",
            &["result"],
            &[&["ok"]],
        );
        let state_bytes = r.register(
            Histogram::with_opts(
                HistogramOpts::new(
                    "state_bytes",
                    "Size of sealed requestState tokens in bytes.",
                )
                .buckets(vec![
                    256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0,
                ]),
            )
            .expect("valid metric"),
        );
        let state_only_rounds = r.counter_vec(
            "state_only_rounds_total",
            "State-only input_required rounds of long calls (long_calls.round_after), by step: a running call ended its request with one (detached) or could not and kept the request open (not_detached); a retry with such a state got another (still_running), the outcome (collected), or found it lost (lost).",
            &["step"],
        );
        for step in StateOnly::ALL {
            state_only_rounds.with_label_values(&[step.label()]);
        }
        EngineMetrics {
            state_only_rounds,
            input_required,
            retries,
            max_rounds_exceeded,
            volatile_questions,
            upstream_duration,
            roots_refreshes,
            state_seals,
            state_opens,
            state_bytes,
            rounds_closed,
            learned_rounds,
            policy,
        }
    }
}
