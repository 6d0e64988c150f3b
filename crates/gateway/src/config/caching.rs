//! `[caching]`: the cache hints (`ttlMs`, `cacheScope`) the gateway puts on discover, list
//! and read results.

use std::time::Duration;

use super::check::duration;
use super::{ConfigError, raw::RawCaching};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheScope {
    Public,
    Private,
}

impl CacheScope {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheScope::Public => "public",
            CacheScope::Private => "private",
        }
    }
}

/// A `ttlMs` / `cacheScope` pair.
#[derive(Debug, Clone, Copy)]
pub struct CacheHint {
    pub ttl: Duration,
    pub scope: CacheScope,
}

#[derive(Debug, Clone)]
pub struct CachingConfig {
    pub discover: CacheHint,
    pub list: CacheHint,
    pub read: CacheHint,
}

pub(super) fn caching_config(c: &RawCaching) -> Result<CachingConfig, ConfigError> {
    Ok(CachingConfig {
        discover: cache_hint("caching.discover", &c.discover_ttl, &c.discover_scope)?,
        list: cache_hint("caching.list", &c.list_ttl, &c.list_scope)?,
        read: cache_hint("caching.read", &c.read_ttl, &c.read_scope)?,
    })
}

fn cache_hint(prefix: &str, ttl: &str, scope: &str) -> Result<CacheHint, ConfigError> {
    let ttl = duration(&format!("{prefix}_ttl"), ttl)?;
    let scope = match scope {
        "public" => CacheScope::Public,
        "private" => CacheScope::Private,
        other => {
            return Err(ConfigError::new(
                format!("{prefix}_scope"),
                format!("must be \"public\" or \"private\", not {other:?}"),
            ));
        }
    };
    Ok(CacheHint { ttl, scope })
}
