//! A stdio legacy server as an upstream: how many children may live at once, and when a
//! failing command may be started again.
//!
//! Every session is a fresh child ([`StdioSession`]). Children are bounded by
//! `upstream.stdio_max_children`: a session holds a semaphore permit for as long as its child
//! lives, and opening waits for one at most `upstream.response_timeout` before failing with
//! [`SessionError::Saturated`] (`limit_hits_total{limit="stdio_max_children"}`). A command
//! that fails to start or to initialize is held back by [`SpawnBackoff`]; meanwhile opening
//! fails at once with [`SessionError::Backoff`], naming the command and the last error.

use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::{Instant, timeout};

use super::handshake::VersionMemory;
use super::session::{Inbound, SessionError};
use super::spawn_backoff::SpawnBackoff;
use super::stdio::{StdioSession, StdioSpec};
use crate::config::UpstreamConfig;
use crate::metrics::LimitHits;

pub struct StdioUpstream {
    spec: StdioSpec,
    /// Which protocol version to request in `initialize`.
    pub versions: VersionMemory,
    children: Arc<Semaphore>,
    max_children: usize,
    backoff: Mutex<SpawnBackoff>,
}

impl StdioUpstream {
    pub fn new(cfg: &UpstreamConfig, hits: LimitHits) -> StdioUpstream {
        let stdio = &cfg.stdio;
        StdioUpstream {
            spec: StdioSpec {
                command: stdio.command.clone(),
                env: stdio.env.clone(),
                cwd: stdio.cwd.clone(),
                max_line_bytes: stdio.max_line_bytes,
                response_timeout: cfg.response_timeout,
                idle_timeout: cfg.idle_timeout,
                shutdown_grace: stdio.shutdown_grace,
                client_name: cfg.client_name.clone(),
                hits,
            },
            versions: VersionMemory::new(&cfg.protocol_version),
            children: Arc::new(Semaphore::new(stdio.max_children)),
            max_children: stdio.max_children,
            backoff: Mutex::new(SpawnBackoff::new(stdio.spawn_backoff)),
        }
    }

    /// The command line, for logs.
    pub fn describe(&self) -> String {
        self.spec.describe()
    }

    /// Whether a child could be started now: `Err` while spawn failures hold attempts back.
    pub fn ready(&self) -> Result<(), String> {
        self.backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .check(Instant::now())
            .map_err(|b| {
                format!(
                    "{} failed to start {} time(s) (last: {}); next attempt in {:?}",
                    self.describe(),
                    b.failures,
                    b.last_error,
                    b.retry_in
                )
            })
    }

    /// Whether every child slot is taken.
    pub fn at_capacity(&self) -> bool {
        self.children.available_permits() == 0
    }

    /// Children alive now (each holds a slot until it has exited).
    pub fn live_children(&self) -> usize {
        self.max_children - self.children.available_permits()
    }

    /// Starts a child and initializes it, declaring `capabilities`.
    pub async fn open(
        &self,
        capabilities: Value,
    ) -> Result<(StdioSession, mpsc::Receiver<Inbound>), SessionError> {
        self.backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .check(Instant::now())
            .map_err(|b| SessionError::Backoff {
                command: self.describe(),
                retry_in: b.retry_in,
                failures: b.failures,
                last: b.last_error,
            })?;
        let wait = self.spec.response_timeout;
        let permit = match timeout(wait, self.children.clone().acquire_owned()).await {
            Ok(Ok(p)) => p,
            _ => {
                self.spec.hits.hit(crate::metrics::Limit::StdioMaxChildren);
                return Err(SessionError::Saturated {
                    limit: self.max_children,
                    waited: wait,
                });
            }
        };
        let opened = StdioSession::spawn(&self.spec, &self.versions, capabilities, permit).await;
        let mut backoff = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
        match &opened {
            Ok(_) => backoff.succeeded(),
            Err(e) => backoff.failed(Instant::now(), &e.to_string()),
        }
        opened
    }
}
