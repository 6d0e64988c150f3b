//! The gateway's one shutdown sequence: three phases, one token tree, watched by every part.
//!
//! | phase | who acts on it |
//! |---|---|
//! | [`Drain::begin`] — draining | `/readyz` turns 503, `draining` is 1, pool warm-up stops; new work is still served |
//! | [`Drain::close`] — closing | the listener stops accepting; listen and legacy GET streams send their last event and end |
//! | [`Drain::stop`] — stopped | background tasks (sweepers, reload watcher, admin listener) end |
//!
//! The phases are nested cancellation tokens: `stopped` is the root, `closing` its child and
//! `draining` the grandchild, so a later phase always implies the earlier ones (stopping a
//! gateway that never drained still closes and drains it), and a part that waits for a phase
//! holds a clone of that one token and nothing else.

use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct Drain {
    stopped: CancellationToken,
    closing: CancellationToken,
    draining: CancellationToken,
}

impl Default for Drain {
    fn default() -> Self {
        Drain::new()
    }
}

impl Drain {
    pub fn new() -> Drain {
        let stopped = CancellationToken::new();
        let closing = stopped.child_token();
        let draining = closing.child_token();
        Drain {
            stopped,
            closing,
            draining,
        }
    }

    /// Readiness off; everything is still served.
    pub fn begin(&self) {
        self.draining.cancel();
    }

    /// Stop accepting and end long-lived responses (implies [`Drain::begin`]).
    pub fn close(&self) {
        self.closing.cancel();
    }

    /// End background work (implies [`Drain::close`]).
    pub fn stop(&self) {
        self.stopped.cancel();
    }

    /// Fires once the drain has begun.
    pub fn draining(&self) -> &CancellationToken {
        &self.draining
    }

    /// Fires once the gateway stops accepting.
    pub fn closing(&self) -> &CancellationToken {
        &self.closing
    }

    /// Fires once background work must end.
    pub fn stopped(&self) -> &CancellationToken {
        &self.stopped
    }

    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phases(d: &Drain) -> [bool; 3] {
        [
            d.draining().is_cancelled(),
            d.closing().is_cancelled(),
            d.stopped().is_cancelled(),
        ]
    }

    #[test]
    fn each_phase_implies_the_earlier_ones_and_never_a_later_one() {
        let d = Drain::new();
        assert_eq!(phases(&d), [false, false, false]);
        d.begin();
        assert_eq!(phases(&d), [true, false, false]);
        d.close();
        assert_eq!(phases(&d), [true, true, false]);
        d.stop();
        assert_eq!(phases(&d), [true, true, true]);

        let skipped = Drain::new();
        skipped.stop();
        assert_eq!(
            phases(&skipped),
            [true, true, true],
            "stop alone drains too"
        );

        let closed = Drain::new();
        closed.close();
        assert_eq!(phases(&closed), [true, true, false]);
        assert!(closed.is_draining());
    }

    #[tokio::test]
    async fn a_clone_watches_the_same_phases() {
        let d = Drain::new();
        let watcher = d.clone();
        let waiting = tokio::spawn(async move { watcher.closing().cancelled().await });
        d.close();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the clone saw the phase")
            .unwrap();
    }
}
