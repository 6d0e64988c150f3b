//! What a round of a known call asks, learned, so the round closes as soon as that has come.
//!
//! A legacy server may ask several questions for one step of a tool, and a Python SDK server
//! sends `roots/list` on the GET stream tens of milliseconds behind the questions on the call's
//! stream. Without knowing the tool, the gateway can only wait: `mrtr.gather_quiet` after the
//! last question and, for a client that declares roots, until `roots/list` has come or
//! `mrtr.gather_window` has passed. Most tools ask the same kinds of question in the same
//! round every time, so the gateway remembers, per caller, call (method and tool, prompt or
//! resource) and round, what the last such round asked: the kinds of its questions and
//! whether a `roots/list` came. The next time, the round closes the moment that set is
//! complete; when the learned round had no `roots/list`, it does not wait for one.
//!
//! Correctness never rests on the guess. A question that comes after a round closed early is
//! asked in the next round (parked calls buffer it, replayed calls ask it again), and what
//! the round really asked replaces what was learned. A round that asks more than was learned
//! closes by the usual quiet period and window.
//!
//! The memory is per caller (principal and forwarded credential): one caller's rounds never
//! shape another's. It holds at most `mrtr.learned_rounds_max` entries (the oldest learned
//! goes first), lives on one replica, and is forgotten when a reload changes the upstream.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::caller_scope::CallerScope;
use crate::state::InputKind;

/// Which round of which call, for whom.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShapeKey {
    pub scope: CallerScope,
    pub method: String,
    pub target: Option<String>,
    /// 1 for the first round.
    pub round: u32,
    /// Whether the request declared roots (a server asks `roots/list` only of a client that
    /// did).
    pub roots_declared: bool,
}

/// What one round asked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shape {
    /// The kinds of the questions the client was asked, sorted.
    kinds: Vec<&'static str>,
    /// A `roots/list` came during the round (asked, answered from the book, or refused).
    roots_came: bool,
}

impl Shape {
    pub fn new(kinds: impl IntoIterator<Item = InputKind>, roots_came: bool) -> Shape {
        let mut kinds: Vec<&'static str> = kinds.into_iter().map(InputKind::as_str).collect();
        kinds.sort_unstable();
        Shape { kinds, roots_came }
    }

    /// Whether a round that has gathered `so_far` holds everything this shape asked.
    pub fn complete_in(&self, so_far: &Shape) -> bool {
        so_far.kinds == self.kinds && (so_far.roots_came || !self.roots_came)
    }

    /// Whether a `roots/list` came in this round.
    pub fn roots_came(&self) -> bool {
        self.roots_came
    }
}

#[derive(Default)]
struct Learned {
    shapes: HashMap<ShapeKey, Shape>,
    /// Keys in the order they were first learned (the oldest is dropped first).
    order: VecDeque<ShapeKey>,
}

#[derive(Default)]
pub struct RoundShapes {
    learned: Mutex<Learned>,
}

impl RoundShapes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Learned> {
        self.learned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the round `key` asked the last time, if it is known.
    pub fn expected(&self, key: &ShapeKey) -> Option<Shape> {
        self.lock().shapes.get(key).cloned()
    }

    /// Records what the round `key` asked, keeping at most `max` entries
    /// (`mrtr.learned_rounds_max`, read at each call so a reload applies at once). Returns
    /// how many entries are kept.
    pub fn learn(&self, key: ShapeKey, shape: Shape, max: usize) -> usize {
        let mut l = self.lock();
        if l.shapes.insert(key.clone(), shape).is_none() {
            l.order.push_back(key);
        }
        while l.order.len() > max {
            if let Some(old) = l.order.pop_front() {
                l.shapes.remove(&old);
            }
        }
        l.shapes.len()
    }

    /// Forgets everything (the upstream changed).
    pub fn clear(&self) {
        *self.lock() = Learned::default();
    }

    pub fn len(&self) -> usize {
        self.lock().shapes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(principal: &str, round: u32) -> ShapeKey {
        ShapeKey {
            scope: CallerScope::new(principal, ""),
            method: "tools/call".into(),
            target: Some("ask".into()),
            round,
            roots_declared: true,
        }
    }

    #[test]
    fn a_round_is_complete_when_its_kinds_and_its_roots_have_come() {
        let learned = Shape::new([InputKind::ElicitForm, InputKind::Sampling], true);
        let partial = Shape::new([InputKind::Sampling], true);
        assert!(!learned.complete_in(&partial));
        let no_roots_yet = Shape::new([InputKind::Sampling, InputKind::ElicitForm], false);
        assert!(!learned.complete_in(&no_roots_yet), "roots/list still due");
        let all = Shape::new([InputKind::Sampling, InputKind::ElicitForm], true);
        assert!(learned.complete_in(&all), "order does not matter");
        let more = Shape::new(
            [
                InputKind::Sampling,
                InputKind::ElicitForm,
                InputKind::ElicitForm,
            ],
            true,
        );
        assert!(
            !learned.complete_in(&more),
            "more than learned: not this shape"
        );
        // A round learned without roots does not wait for them.
        let plain = Shape::new([InputKind::ElicitForm], false);
        assert!(plain.complete_in(&Shape::new([InputKind::ElicitForm], false)));
    }

    #[test]
    fn shapes_are_per_caller_and_round_and_the_oldest_goes_first() {
        let shapes = RoundShapes::default();
        let one = Shape::new([InputKind::ElicitForm], false);
        shapes.learn(key("alice", 1), one.clone(), 2);
        assert_eq!(shapes.expected(&key("alice", 1)), Some(one.clone()));
        assert_eq!(shapes.expected(&key("bob", 1)), None, "another caller");
        assert_eq!(shapes.expected(&key("alice", 2)), None, "another round");
        shapes.learn(key("alice", 2), one.clone(), 2);
        assert_eq!(shapes.learn(key("bob", 1), one.clone(), 2), 2, "bounded");
        assert_eq!(shapes.expected(&key("alice", 1)), None, "the oldest went");
        // Learning a known key again replaces it and evicts nothing.
        let two = Shape::new([InputKind::Roots], true);
        shapes.learn(key("bob", 1), two.clone(), 2);
        assert_eq!(shapes.expected(&key("bob", 1)), Some(two));
        assert_eq!(shapes.expected(&key("alice", 2)), Some(one.clone()));
        assert_eq!(
            shapes.learn(key("carol", 1), one, 1),
            1,
            "a smaller limit after a reload applies at once"
        );
        shapes.clear();
        assert!(shapes.is_empty());
    }
}
