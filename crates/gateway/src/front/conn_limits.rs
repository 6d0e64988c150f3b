//! Connection caps: how many client connections a listener holds at once, in all and per
//! source address, counted from accept to close.
//!
//! A connection over a cap is closed as soon as it is accepted, before any byte is read: it
//! costs its descriptor for an instant instead of for a timeout. Sources are compared as the
//! peer sees them: an IPv4-mapped IPv6 address counts as the IPv4 address, and IPv6 sources
//! count per prefix of `listen.ipv6_source_prefix` bits (/64 by default: one host usually owns
//! the whole prefix, so counting single addresses would not bound it).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

pub use crate::caller_scope::source_of;

/// The caps in force for one accept (read from the configuration each time, so a reload
/// applies to the next connection).
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub total: usize,
    /// `None`: no per-source cap.
    pub per_source: Option<usize>,
    /// Leading bits of an IPv6 address that make one source (`listen.ipv6_source_prefix`).
    pub ipv6_prefix: u8,
}

/// Which cap refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Total,
    PerSource,
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_source: HashMap<IpAddr, usize>,
}

/// The open connections of one listener.
#[derive(Default)]
pub struct ConnLimits {
    counts: Mutex<Counts>,
}

/// One admitted connection; dropping it gives its place back.
pub struct ConnPermit {
    limits: Arc<ConnLimits>,
    source: IpAddr,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut c = self.limits.lock();
        c.total -= 1;
        if let Some(n) = c.per_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                c.per_source.remove(&self.source);
            }
        }
    }
}

impl ConnLimits {
    pub fn new() -> Arc<ConnLimits> {
        Arc::new(ConnLimits::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a connection from `peer`, or which cap is full.
    pub fn admit(self: &Arc<Self>, peer: IpAddr, caps: Caps) -> Result<ConnPermit, Refusal> {
        let source = source_of(peer, caps.ipv6_prefix);
        let mut c = self.lock();
        if c.total >= caps.total {
            return Err(Refusal::Total);
        }
        let mine = c.per_source.get(&source).copied().unwrap_or(0);
        if caps.per_source.is_some_and(|max| mine >= max) {
            return Err(Refusal::PerSource);
        }
        c.total += 1;
        *c.per_source.entry(source).or_insert(0) += 1;
        Ok(ConnPermit {
            limits: self.clone(),
            source,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.lock().total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn caps_count_in_all_and_per_source_and_free_on_drop() {
        let l = ConnLimits::new();
        let caps = Caps {
            total: 3,
            per_source: Some(2),
            ipv6_prefix: 64,
        };
        let a1 = l.admit(ip("127.0.0.1"), caps).unwrap();
        let _a2 = l.admit(ip("::ffff:127.0.0.1"), caps).unwrap();
        assert_eq!(
            l.admit(ip("127.0.0.1"), caps).err(),
            Some(Refusal::PerSource)
        );
        let _b = l.admit(ip("127.0.0.2"), caps).unwrap();
        assert_eq!(l.admit(ip("127.0.0.3"), caps).err(), Some(Refusal::Total));
        drop(a1);
        assert_eq!(l.open(), 2);
        assert!(l.admit(ip("127.0.0.1"), caps).is_ok());
        assert_eq!(l.open(), 2, "the permit above was dropped at once");
    }

    #[test]
    fn ipv6_sources_count_per_configured_prefix() {
        let l = ConnLimits::new();
        let caps = Caps {
            total: 10,
            per_source: Some(1),
            ipv6_prefix: 64,
        };
        let _a = l.admit(ip("2001:db8:1:2::1"), caps).unwrap();
        assert_eq!(
            l.admit(ip("2001:db8:1:2:ffff::9"), caps).err(),
            Some(Refusal::PerSource)
        );
        assert!(l.admit(ip("2001:db8:1:3::1"), caps).is_ok());
        let unbounded = Caps {
            total: 10,
            per_source: None,
            ipv6_prefix: 64,
        };
        let _b = l.admit(ip("2001:db8:1:2::1"), unbounded).unwrap();
        // Per address: the two hosts of one /64 are two sources.
        let per_address = Caps {
            ipv6_prefix: 128,
            ..caps
        };
        let l = ConnLimits::new();
        let _c = l.admit(ip("2001:db8:1:2::1"), per_address).unwrap();
        assert!(l.admit(ip("2001:db8:1:2:ffff::9"), per_address).is_ok());
    }
}
