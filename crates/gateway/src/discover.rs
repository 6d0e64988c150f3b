//! `server/discover` for one caller, answered from that caller's own legacy session.
//!
//! What a legacy server says in its `InitializeResult` (capabilities, `instructions`,
//! `serverInfo`) may depend on who opened the session: the credential the gateway forwarded,
//! or its static token, or — when callers are told apart — whatever the server attached to the
//! session of that principal. So the gateway keeps no copy of it to share: discover checks out
//! the caller's own session (the one its calls would use: same principal, forwarded
//! credential and declared capabilities; usually a warm one from the pool, so no round trip),
//! reads its `InitializeResult`, and gives the session back. Method routing takes the same
//! view: the engine checks a method's server capability against the session that is about to
//! serve it (`mrtr::run::Run::start`), never against another caller's.
//!
//! With `pool.mode = "per-call"` every discover opens (and closes) a session of its own.

use http::HeaderMap;
use serde_json::Value;

use crate::caller_scope::CallerScope;
use crate::error::Rejection;
use crate::legacy::pool::PoolKey;
use crate::mrtr::deps::Engine;
use crate::translate;
use mrtr_wire::capabilities::Declared;

/// The `InitializeResult` of a session of `scope` declaring `declared`, opened with
/// `headers` (credentials, trace context) if none is warm.
pub async fn caller_init(
    engine: &Engine,
    scope: &CallerScope,
    declared: &Declared,
    headers: HeaderMap,
) -> Result<std::sync::Arc<Value>, Rejection> {
    let key = PoolKey::new(scope, declared);
    let lease = engine.sessions.checkout(&key, declared, headers).await?;
    let init = lease.exchange.session().init_shared();
    engine.sessions.give_back(key, lease).await;
    Ok(init)
}

/// The `server/discover` result for one caller. `listen_supported`: whether listen streams can
/// deliver what the server's `listChanged` / `subscribe` flags promise.
pub async fn serve(
    engine: &Engine,
    scope: &CallerScope,
    declared: &Declared,
    headers: HeaderMap,
    listen_supported: bool,
) -> Result<Value, Rejection> {
    let init = caller_init(engine, scope, declared, headers).await?;
    let cfg = engine.config();
    let hint = translate::scoped_hint(
        cfg.caching.discover,
        engine.auth().answers_depend_on_caller(),
    );
    let mut result = translate::discover(&init, hint, listen_supported);
    if cfg.tasks.enabled {
        advertise(&mut result, crate::tasks::EXTENSION);
    }
    Ok(result)
}

/// Adds `extension` to the result's `capabilities.extensions`.
fn advertise(result: &mut Value, extension: &str) {
    let Some(caps) = result
        .get_mut("capabilities")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let extensions = caps
        .entry("extensions")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(map) = extensions.as_object_mut() {
        map.insert(extension.to_owned(), Value::Object(Default::default()));
    }
}
