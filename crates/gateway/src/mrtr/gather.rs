//! When a round of questions closes: the gather window and quiet period of `[mrtr]`, or, for a
//! round seen before, as soon as what it asked then has come (`super::round_shapes`).

use super::round_shapes::Shape;
use crate::metrics::RoundClose;
use crate::state::InputKind;

/// When a round of questions closes (see `[mrtr] gather_window` / `gather_quiet`): once the
/// server has been quiet for `quiet` since the last new question, but never later than
/// `window` after the first — and, while a lagging `roots/list` may still come, not before.
/// A round whose shape was learned closes the moment that shape is complete, and waits for a
/// lagging `roots/list` only if the learned round had one.
pub(super) struct Gather {
    pub(super) window: std::time::Duration,
    pub(super) quiet: std::time::Duration,
    pub(super) first: Option<tokio::time::Instant>,
    pub(super) last: Option<tokio::time::Instant>,
    /// The client declared roots, the session has a GET stream, and no `roots/list` has come.
    pub(super) awaiting_roots: bool,
    /// What the same round asked the last time, if it was seen.
    pub(super) expected: Option<Shape>,
    /// What this round has asked so far.
    kinds: Vec<InputKind>,
    roots_came: bool,
}

impl Gather {
    pub(super) fn new(
        window: std::time::Duration,
        quiet: std::time::Duration,
        roots_may_lag: bool,
        expected: Option<Shape>,
    ) -> Gather {
        // A learned round without a roots/list is not held open for one.
        let awaiting_roots = roots_may_lag && expected.as_ref().is_none_or(Shape::roots_came);
        Gather {
            window,
            quiet,
            first: None,
            last: None,
            awaiting_roots,
            expected,
            kinds: Vec::new(),
            roots_came: false,
        }
    }

    pub(super) fn asked(&mut self, kind: InputKind) {
        let now = tokio::time::Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.kinds.push(kind);
        if kind == InputKind::Roots {
            self.roots_arrived();
        }
    }

    /// A `roots/list` came, whatever becomes of it (answered, refused by the policy, asked).
    pub(super) fn roots_arrived(&mut self) {
        self.awaiting_roots = false;
        self.roots_came = true;
    }

    /// What this round has asked so far.
    pub(super) fn shape(&self) -> Shape {
        Shape::new(self.kinds.iter().copied(), self.roots_came)
    }

    /// Everything the learned round asked has come.
    fn complete(&self) -> bool {
        self.expected
            .as_ref()
            .is_some_and(|e| e.complete_in(&self.shape()))
    }

    /// When the round closes, if a question is pending.
    pub(super) fn due(&self) -> Option<tokio::time::Instant> {
        let first = self.first?;
        if self.complete() {
            // Already due: nothing else is expected.
            return Some(self.last.unwrap_or(first));
        }
        let by_window = first + self.window;
        if self.awaiting_roots {
            return Some(by_window);
        }
        Some(by_window.min(self.last.unwrap_or(first) + self.quiet))
    }

    /// What closed the round, once it is due.
    pub(super) fn closed_by(&self) -> RoundClose {
        if self.complete() {
            return RoundClose::Learned;
        }
        match (self.first, self.due()) {
            (Some(first), Some(due)) if due >= first + self.window => RoundClose::Window,
            _ => RoundClose::Quiet,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn gather(awaiting_roots: bool) -> Gather {
        Gather::new(
            Duration::from_millis(100),
            Duration::from_millis(2),
            awaiting_roots,
            None,
        )
    }

    #[test]
    fn a_round_closes_after_the_quiet_period_unless_roots_may_still_come() {
        let mut g = gather(false);
        assert!(g.due().is_none(), "no question, no round");
        g.asked(InputKind::ElicitForm);
        let first = g.first.unwrap();
        assert_eq!(g.due(), Some(first + Duration::from_millis(2)));
        assert_eq!(g.closed_by(), RoundClose::Quiet);

        let mut g = gather(true);
        g.asked(InputKind::ElicitForm);
        let first = g.first.unwrap();
        assert_eq!(
            g.due(),
            Some(first + Duration::from_millis(100)),
            "waits for a lagging roots/list"
        );
        assert_eq!(g.closed_by(), RoundClose::Window);
        g.asked(InputKind::Roots);
        let last = g.last.unwrap();
        assert_eq!(
            g.due(),
            Some((last + Duration::from_millis(2)).min(first + Duration::from_millis(100)))
        );

        // A roots/list that never becomes a question (refused by the policy, or answered
        // from an earlier round) also ends the wait for it.
        let mut g = gather(true);
        g.asked(InputKind::ElicitForm);
        let first = g.first.unwrap();
        g.roots_arrived();
        assert_eq!(g.due(), Some(first + Duration::from_millis(2)));
    }

    #[test]
    fn a_learned_round_closes_once_its_shape_is_complete() {
        let window = Duration::from_secs(60);
        let quiet = Duration::from_secs(30);
        // Learned: one form question and no roots/list. A roots-declaring client's round is
        // not held open for roots, and closes at the question, not after the quiet period.
        let learned = Shape::new([InputKind::ElicitForm], false);
        let mut g = Gather::new(window, quiet, true, Some(learned));
        assert!(!g.awaiting_roots);
        g.asked(InputKind::ElicitForm);
        assert_eq!(g.due(), g.last, "due at once");
        assert_eq!(g.closed_by(), RoundClose::Learned);
        // A second question is more than learned: the usual quiet period again.
        g.asked(InputKind::Sampling);
        assert_eq!(g.due(), Some(g.last.unwrap() + quiet));
        assert_eq!(g.closed_by(), RoundClose::Quiet);

        // Learned with a roots/list: still waits for it, then closes at once.
        let learned = Shape::new([InputKind::ElicitForm], true);
        let mut g = Gather::new(window, quiet, true, Some(learned));
        assert!(g.awaiting_roots);
        g.asked(InputKind::ElicitForm);
        assert_eq!(g.due(), Some(g.first.unwrap() + window));
        g.roots_arrived();
        assert_eq!(g.due(), g.last);
        assert_eq!(g.closed_by(), RoundClose::Learned);
    }
}
