//! When a round of questions closes: the gather window and quiet period of `[mrtr]`.

use crate::state::InputKind;

/// When a round of questions closes (see `[mrtr] gather_window` / `gather_quiet`): once the
/// server has been quiet for `quiet` since the last new question, but never later than
/// `window` after the first — and, while a lagging `roots/list` may still come, not before.
pub(super) struct Gather {
    pub(super) window: std::time::Duration,
    pub(super) quiet: std::time::Duration,
    pub(super) first: Option<tokio::time::Instant>,
    pub(super) last: Option<tokio::time::Instant>,
    /// The client declared roots, the session has a GET stream, and no `roots/list` has come.
    pub(super) awaiting_roots: bool,
}

impl Gather {
    pub(super) fn asked(&mut self, kind: InputKind) {
        let now = tokio::time::Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        if kind == InputKind::Roots {
            self.awaiting_roots = false;
        }
    }

    /// A `roots/list` came, whatever becomes of it (answered, refused by the policy, asked).
    pub(super) fn roots_arrived(&mut self) {
        self.awaiting_roots = false;
    }

    /// When the round closes, if a question is pending.
    pub(super) fn due(&self) -> Option<tokio::time::Instant> {
        let first = self.first?;
        let by_window = first + self.window;
        if self.awaiting_roots {
            return Some(by_window);
        }
        Some(by_window.min(self.last.unwrap_or(first) + self.quiet))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn gather(awaiting_roots: bool) -> Gather {
        Gather {
            window: Duration::from_millis(100),
            quiet: Duration::from_millis(2),
            first: None,
            last: None,
            awaiting_roots,
        }
    }

    #[test]
    fn a_round_closes_after_the_quiet_period_unless_roots_may_still_come() {
        let mut g = gather(false);
        assert!(g.due().is_none(), "no question, no round");
        g.asked(InputKind::ElicitForm);
        let first = g.first.unwrap();
        assert_eq!(g.due(), Some(first + Duration::from_millis(2)));

        let mut g = gather(true);
        g.asked(InputKind::ElicitForm);
        let first = g.first.unwrap();
        assert_eq!(
            g.due(),
            Some(first + Duration::from_millis(100)),
            "waits for a lagging roots/list"
        );
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
}
