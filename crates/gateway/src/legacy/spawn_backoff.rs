//! When to try starting a stdio legacy server again after it failed to start.
//!
//! A server that cannot start (a missing interpreter, a crash on import, an `initialize` that
//! never comes) would otherwise be spawned again by every request, each one paying the full
//! start-up and timeout. After `n` consecutive failures the next attempt waits
//! `min(100 ms × 2^(n-1), upstream.stdio_spawn_backoff)`; until then opening fails at once with
//! an error naming the command. One success resets the count.

use std::time::Duration;

use tokio::time::Instant;

const FIRST_DELAY: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub struct SpawnBackoff {
    max: Duration,
    failures: u32,
    not_before: Option<Instant>,
    last_error: String,
}

/// Why an attempt may not be made yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackingOff {
    pub retry_in: Duration,
    pub failures: u32,
    pub last_error: String,
}

impl SpawnBackoff {
    pub fn new(max: Duration) -> SpawnBackoff {
        SpawnBackoff {
            max,
            failures: 0,
            not_before: None,
            last_error: String::new(),
        }
    }

    /// `Err` while an earlier failure still holds attempts back.
    pub fn check(&self, now: Instant) -> Result<(), BackingOff> {
        match self.not_before {
            Some(t) if now < t => Err(BackingOff {
                retry_in: t - now,
                failures: self.failures,
                last_error: self.last_error.clone(),
            }),
            _ => Ok(()),
        }
    }

    pub fn failed(&mut self, now: Instant, error: &str) {
        self.failures = self.failures.saturating_add(1);
        self.last_error = error.to_string();
        self.not_before = Some(now + self.delay());
    }

    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.not_before = None;
        self.last_error.clear();
    }

    /// The wait after the current run of failures.
    fn delay(&self) -> Duration {
        let doublings = self.failures.saturating_sub(1).min(20);
        FIRST_DELAY.saturating_mul(1u32 << doublings).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets_on_success() {
        let t0 = Instant::now();
        let mut b = SpawnBackoff::new(Duration::from_millis(500));
        assert!(b.check(t0).is_ok());
        b.failed(t0, "boom");
        let held = b.check(t0).unwrap_err();
        assert_eq!(held.retry_in, Duration::from_millis(100));
        assert_eq!((held.failures, held.last_error.as_str()), (1, "boom"));
        assert!(b.check(t0 + Duration::from_millis(100)).is_ok());
        b.failed(t0, "boom");
        assert_eq!(
            b.check(t0).unwrap_err().retry_in,
            Duration::from_millis(200)
        );
        b.failed(t0, "boom");
        assert_eq!(
            b.check(t0).unwrap_err().retry_in,
            Duration::from_millis(400)
        );
        for _ in 0..40 {
            b.failed(t0, "boom");
        }
        assert_eq!(
            b.check(t0).unwrap_err().retry_in,
            Duration::from_millis(500)
        );
        b.succeeded();
        assert!(b.check(t0).is_ok());
        b.failed(t0, "again");
        assert_eq!(
            b.check(t0).unwrap_err().retry_in,
            Duration::from_millis(100)
        );
    }
}
