//! Reloading at run time: the config file (and with it the key ring, limits, upstream URL and
//! log level), the key directory, the front's TLS files and the `https` upstream's CA and
//! client-certificate files — on file change and on SIGHUP.
//!
//! Watches are on *directories* (the config file's parent, the key directory and its parent,
//! the parents of both sets of TLS files): Kubernetes updates mounted ConfigMaps and Secrets
//! by swapping a `..data` symlink, which a watch on the file itself would miss. Events are
//! debounced. A reload that fails validation keeps the running configuration and counts
//! `mrtr_gateway_config_reloads_total{result="error"}`. What cannot change without a restart:
//! `listen.addr`, `admin.addr`, turning TLS on or off, `log.format`, `replica.id`, `[tracing]`,
//! `[runtime]`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::front::tls::TlsReloader;
use crate::gateway::Gateway;
use crate::telemetry::LevelHandle;

/// The `https` upstream's CA and client-certificate files: a change re-reads the config,
/// whose upstream TLS identity then differs, so a new upstream client is swapped in.
fn upstream_tls_files(cfg: &Config) -> Vec<PathBuf> {
    cfg.upstream
        .tls
        .as_ref()
        .map(|t| t.files.paths())
        .unwrap_or_default()
}

/// The sections of the configuration a reload changed (names only: never values, which may
/// hold secrets).
pub fn changed_sections(old: &Config, new: &Config) -> Vec<&'static str> {
    let differs =
        |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?}") != format!("{b:?}");
    let sections: [(&'static str, bool); 22] = [
        ("listen", differs(&old.listen, &new.listen)),
        ("upstream", differs(&old.upstream, &new.upstream)),
        ("state", differs(&old.state, &new.state)),
        ("mrtr", differs(&old.mrtr, &new.mrtr)),
        ("discover", differs(&old.discover, &new.discover)),
        ("caching", differs(&old.caching, &new.caching)),
        ("log", differs(&old.log, &new.log)),
        ("admin", differs(&old.admin, &new.admin)),
        ("tls", differs(&old.tls, &new.tls)),
        ("drain", differs(&old.drain, &new.drain)),
        ("replica", differs(&old.replica, &new.replica)),
        ("parking", differs(&old.parking, &new.parking)),
        ("pool", differs(&old.pool, &new.pool)),
        ("single_use", differs(&old.single_use, &new.single_use)),
        ("auth", differs(&old.auth, &new.auth)),
        (
            "subscriptions",
            differs(&old.subscriptions, &new.subscriptions),
        ),
        ("policy", differs(&old.policy, &new.policy)),
        (
            "legacy_clients",
            differs(&old.legacy_clients, &new.legacy_clients),
        ),
        ("long_calls", differs(&old.long_calls, &new.long_calls)),
        ("tracing", differs(&old.tracing, &new.tracing)),
        ("runtime", differs(&old.runtime, &new.runtime)),
        ("keys", differs(&old.state.keys, &new.state.keys)),
    ];
    sections
        .into_iter()
        .filter_map(|(name, changed)| changed.then_some(name))
        .collect()
}

pub struct Reloader {
    pub gw: Arc<Gateway>,
    pub config_path: PathBuf,
    pub tls: Option<Arc<TlsReloader>>,
    pub log: Option<LevelHandle>,
}

impl Reloader {
    /// Reloads everything once; returns what failed, if anything.
    pub fn reload_now(&self) -> Result<(), String> {
        let mut errors = Vec::new();
        let mut changed = Vec::new();
        match Config::load(&self.config_path) {
            Ok(new) => {
                let old = self.gw.config();
                changed = changed_sections(&old, &new);
                let restart_only = [
                    ("listen.addr", old.listen.addr != new.listen.addr),
                    ("admin.addr", old.admin.addr != new.admin.addr),
                    ("tls", old.tls.is_some() != new.tls.is_some()),
                    ("log.format", old.log.format != new.log.format),
                    ("replica.id", old.replica.id != new.replica.id),
                    ("tracing", old.tracing != new.tracing),
                    ("runtime", old.runtime != new.runtime),
                ];
                for (key, changed) in restart_only {
                    if changed {
                        tracing::warn!(
                            key,
                            "changed in the config file; takes effect after a restart"
                        );
                    }
                }
                if let Some(h) = &self.log
                    && old.log.level != new.log.level
                    && let Ok(f) = tracing_subscriber::EnvFilter::try_new(&new.log.level)
                {
                    let _ = h.modify(|current| *current = f);
                }
                if let Err(e) = self.gw.apply_config(new) {
                    errors.push(e);
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
        if let Some(tls) = &self.tls
            && let Err(e) = tls.reload()
        {
            errors.push(e);
        }
        self.gw.metrics.process().reloaded(errors.is_empty());
        if errors.is_empty() {
            let ring = self.gw.codec.ring();
            tracing::info!(
                keys = ?ring.ids(),
                changed = ?changed,
                "configuration reloaded"
            );
            Ok(())
        } else {
            let msg = errors.join("; ");
            tracing::error!(error = %msg, "reload failed; the previous configuration stays in force");
            Err(msg)
        }
    }

    /// The directories to watch.
    fn watch_dirs(&self) -> BTreeSet<PathBuf> {
        fn parent(p: &Path) -> PathBuf {
            match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            }
        }
        let mut dirs = BTreeSet::new();
        let config_path =
            std::path::absolute(&self.config_path).unwrap_or(self.config_path.clone());
        dirs.insert(parent(&config_path));
        let cfg = self.gw.config();
        if let Some(dir) = &cfg.state.keys_dir {
            dirs.insert(parent(dir));
            dirs.insert(dir.clone());
        }
        if let Some(tls) = &self.tls {
            for f in tls.watched_files() {
                dirs.insert(parent(&f));
            }
        }
        for f in upstream_tls_files(&cfg) {
            dirs.insert(parent(&f));
        }
        dirs
    }

    /// The files whose change matters (other files in the watched directories are ignored).
    fn relevant_files(&self) -> Vec<PathBuf> {
        let mut v = vec![self.config_path.clone()];
        if let Some(dir) = &self.gw.config().state.keys_dir {
            v.push(dir.clone());
        }
        if let Some(tls) = &self.tls {
            v.extend(tls.watched_files());
        }
        v.extend(upstream_tls_files(&self.gw.config()));
        // Events carry absolute paths; compare like with like (without resolving symlinks,
        // which would point into Kubernetes' timestamped directories).
        v.into_iter()
            .map(|p| std::path::absolute(&p).unwrap_or(p))
            .collect()
    }

    /// Watches files and SIGHUP until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let (tx, mut rx) = mpsc::channel::<()>(16);
        let watcher_tx = tx.clone();
        let relevant = self.relevant_files();
        let matters = move |p: &Path| {
            // Kubernetes' atomic swap shows up as `..data` / `..<timestamp>` entries.
            let k8s_swap = p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".."));
            k8s_swap
                || relevant.iter().any(|r| {
                    p == r
                        || p.starts_with(r)
                        || (p.file_name().is_some()
                            && p.file_name() == r.file_name()
                            && p.parent() == r.parent())
                })
        };
        let mut watcher =
            match notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
                // Reads (our own reload included) are not changes.
                if let Ok(ev) = ev
                    && !matches!(ev.kind, notify::EventKind::Access(_))
                    && ev.paths.iter().any(|p| matters(p))
                {
                    let _ = watcher_tx.try_send(());
                }
            }) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(error = %e, "file watching unavailable; reload with SIGHUP");
                    None
                }
            };
        if let Some(w) = watcher.as_mut() {
            for dir in self.watch_dirs() {
                if let Err(e) = w.watch(&dir, RecursiveMode::NonRecursive) {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot watch");
                }
            }
        }
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = async { match hup.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {
                    tracing::info!("SIGHUP: reloading");
                    let _ = self.reload_now();
                }
                Some(()) = rx.recv() => {
                    // Debounce: editors and Kubernetes produce bursts of events.
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    while rx.try_recv().is_ok() {}
                    let _ = self.reload_now();
                }
            }
        }
    }
}

#[cfg(test)]
mod changed_tests {
    use super::*;

    #[test]
    fn a_reload_names_the_sections_it_changed_and_no_values() {
        let text = "[[state.keys]]\nid = \"k1\"\nsecret = \"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"\n";
        let old = Config::from_toml_str(text, &[], None).unwrap();
        assert!(changed_sections(&old, &old.clone()).is_empty());
        let mut new = old.clone();
        new.mrtr.gather_window = Duration::from_millis(250);
        new.upstream.response_timeout += Duration::from_secs(1);
        assert_eq!(changed_sections(&old, &new), ["upstream", "mrtr"]);
    }
}
