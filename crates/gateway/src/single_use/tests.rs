//! Tests of [`SingleUseStore`]: counters, ids it refuses, and what a reload keeps (the memory
//! store and its claims) or replaces.

use super::*;

const MINUTE: Duration = Duration::from_secs(60);

fn memory_config(max_entries: usize) -> SingleUseConfig {
    let raw = config::RawSingleUse {
        max_entries: max_entries as u64,
        max_entries_per_principal: Some(max_entries as u64),
        ..Default::default()
    };
    SingleUseConfig::from_raw(&raw, None, Default::default()).unwrap()
}

async fn memory_store(metrics: &SingleUseMetrics, max_entries: usize) -> SingleUseStore {
    SingleUseStore::from_config(&memory_config(max_entries), metrics.clone())
        .await
        .unwrap()
}

fn owner() -> Owner {
    Owner::new("p")
}

#[tokio::test]
async fn every_claim_completion_and_error_is_counted() {
    let m = SingleUseMetrics::unregistered();
    // Two entries, one per caller.
    let raw = config::RawSingleUse {
        max_entries: 2,
        max_entries_per_principal: Some(1),
        ..Default::default()
    };
    let cfg = SingleUseConfig::from_raw(&raw, None, Default::default()).unwrap();
    let s = SingleUseStore::from_config(&cfg, m.clone()).await.unwrap();
    assert_eq!(s.kind(), "memory");
    let o = owner();
    assert_eq!(s.claim("id1", &o, MINUTE).await.unwrap(), Claim::Acquired);
    assert_eq!(
        s.claim("id1", &owner(), MINUTE).await.unwrap(),
        Claim::InProgress
    );
    assert_eq!(m.entries(), 1);
    assert!(matches!(
        s.claim("id2", &owner(), MINUTE).await,
        Err(StoreError::PrincipalQuota { limit: 1, .. })
    ));
    assert_eq!(
        s.claim("id2", &Owner::new("q"), MINUTE).await.unwrap(),
        Claim::Acquired
    );
    assert!(matches!(
        s.claim("id3", &Owner::new("r"), MINUTE).await,
        Err(StoreError::Full { .. })
    ));
    assert!(s.start("id1", &o, MINUTE).await.unwrap());
    assert_eq!(
        s.complete("id1", &o, Some(b"{}"), MINUTE).await.unwrap(),
        Completion::Kept
    );
    assert_eq!(
        s.claim("id1", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"{}"))
    );
    assert_eq!(m.claims("acquired"), 2);
    assert_eq!(m.claims("in_progress"), 1);
    assert_eq!(m.claims("done"), 1);
    assert_eq!(m.errors("full"), 1);
    assert_eq!(m.errors("principal_quota"), 1);
    assert_eq!(m.outcomes("kept"), 1);
    assert_eq!(s.entries(), Some(2));
    s.health().await.unwrap();
}

/// The engine runs requests on spawned tasks, so every store future must be `Send`.
#[tokio::test]
async fn store_futures_are_send() {
    fn assert_send<T: Send>(_: &T) {}
    let s = memory_store(&SingleUseMetrics::unregistered(), 10).await;
    let o = owner();
    assert_send(&s.claim("a", &o, MINUTE));
    assert_send(&s.start("a", &o, MINUTE));
    assert_send(&s.complete("a", &o, None, MINUTE));
    assert_send(&s.release("a", &o));
    assert_send(&s.complete_eventually("a", &o, None, Instant::now()));
    assert_send(&s.release_eventually("a", &o, Instant::now()));
    assert_send(&s.health());
}

#[tokio::test]
async fn ids_the_gateway_never_mints_are_refused() {
    let m = SingleUseMetrics::unregistered();
    let s = memory_store(&m, 10).await;
    for bad in ["", "a{b}", "with space", &"x".repeat(65)] {
        assert_eq!(
            s.claim(bad, &owner(), MINUTE).await,
            Err(StoreError::InvalidId)
        );
    }
    assert_eq!(m.errors("invalid_id"), 4);
    assert_eq!(s.entries(), Some(0));
    assert!(valid_id("AAECAwQFBgcICQoLDA0ODw"));
}

#[tokio::test]
async fn a_reload_that_changes_only_limits_keeps_the_memory_store_and_its_claims() {
    let m = SingleUseMetrics::unregistered();
    let s = memory_store(&m, 10).await;
    let o = owner();
    s.claim("kept", &o, MINUTE).await.unwrap();
    assert!(s.start("kept", &o, MINUTE).await.unwrap());
    assert!(
        s.reconfigured(&memory_config(10), MINUTE)
            .unwrap()
            .is_none(),
        "nothing changed"
    );
    let reloaded = s.reconfigured(&memory_config(20), MINUTE).unwrap().unwrap();
    assert_eq!(reloaded.kind(), "memory");
    assert_eq!(
        reloaded.claim("kept", &owner(), MINUTE).await.unwrap(),
        Claim::InProgress
    );
    // The claim settles through the store that granted it and the reloaded one sees it.
    s.complete("kept", &o, Some(b"1"), MINUTE).await.unwrap();
    assert_eq!(
        reloaded.claim("kept", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"1"))
    );
    assert_eq!(reloaded.retired_stores(), 0);
}

#[tokio::test]
async fn a_new_redis_password_is_a_new_store() {
    let cfg = |url: &str| {
        let mut raw = config::RawSingleUse {
            store: "redis".into(),
            ..Default::default()
        };
        raw.redis.urls = vec![url.into()];
        SingleUseConfig::from_raw(&raw, None, Default::default()).unwrap()
    };
    let s = SingleUseStore::build(
        &cfg("redis://:old@127.0.0.1:1/0"),
        SingleUseMetrics::unregistered(),
    )
    .unwrap();
    assert!(
        s.reconfigured(&cfg("redis://:old@127.0.0.1:1/0"), MINUTE)
            .unwrap()
            .is_none()
    );
    // The same servers and prefix: the claims are where they were, nothing is retired.
    let new = s
        .reconfigured(&cfg("redis://:new@127.0.0.1:1/0"), MINUTE)
        .unwrap()
        .unwrap();
    assert_eq!(new.retired_stores(), 0);
}

#[tokio::test]
async fn a_reload_that_moves_redis_claims_retires_the_old_target_for_the_horizon() {
    let cfg = |url: &str, prefix: &str| {
        let mut raw = config::RawSingleUse {
            store: "redis".into(),
            ..Default::default()
        };
        raw.redis.urls = vec![url.into()];
        raw.redis.key_prefix = prefix.into();
        SingleUseConfig::from_raw(&raw, None, Default::default()).unwrap()
    };
    let a = cfg("redis://127.0.0.1:1/0", "mrtr:");
    let s = SingleUseStore::build(&a, SingleUseMetrics::unregistered()).unwrap();
    // (the new configuration, what is retired once back on the first target)
    for (moved, retired_back) in [
        (cfg("redis://127.0.0.1:2/0", "mrtr:"), 1),
        (cfg("redis://127.0.0.1:1/0", "other:"), 1),
        (memory_config(10), 0), // an empty memory store holds nothing to ask
    ] {
        let r = s.reconfigured(&moved, MINUTE).unwrap().unwrap();
        assert_eq!(r.retired_stores(), 1);
        // Back to the first target: it is the backend again, not a retired store.
        let back = r.reconfigured(&a, MINUTE).unwrap().unwrap();
        assert_eq!(back.retired_stores(), retired_back);
        assert!(back.reconfigured(&a, MINUTE).unwrap().is_none());
    }
    // With no time left to live, a retired target is not kept.
    let r = s
        .reconfigured(&cfg("redis://127.0.0.1:2/0", "mrtr:"), Duration::ZERO)
        .unwrap()
        .unwrap();
    assert_eq!(r.retired_stores(), 0);
}

#[tokio::test]
async fn a_reload_to_another_backend_still_honours_the_claims_held_in_memory() {
    let m = SingleUseMetrics::unregistered();
    let s = memory_store(&m, 10).await;
    let done = owner();
    s.claim("done", &done, MINUTE).await.unwrap();
    s.start("done", &done, MINUTE).await.unwrap();
    s.complete("done", &done, Some(b"{}"), MINUTE)
        .await
        .unwrap();
    let running = owner();
    s.claim("running", &running, MINUTE).await.unwrap();
    s.start("running", &running, MINUTE).await.unwrap();
    // A Redis that is not there: the retired memory store answers without asking it.
    let mut raw = config::RawSingleUse {
        store: "redis".into(),
        ..Default::default()
    };
    raw.redis.urls = vec!["redis://127.0.0.1:1/0".into()];
    raw.redis.command_timeout = "100ms".into();
    raw.redis.connect_timeout = "100ms".into();
    let cfg = SingleUseConfig::from_raw(&raw, None, Default::default()).unwrap();
    let switched = s.reconfigured(&cfg, MINUTE).unwrap().unwrap();
    assert_eq!(switched.kind(), "redis");
    assert_eq!(switched.retired_stores(), 1);
    assert_eq!(
        switched.claim("done", &owner(), MINUTE).await.unwrap(),
        Claim::Done(Bytes::from_static(b"{}"))
    );
    assert_eq!(
        switched.claim("running", &owner(), MINUTE).await.unwrap(),
        Claim::InProgress
    );
    // An id the memory store never saw goes to the new backend (unreachable: fail closed).
    assert!(
        switched
            .claim("fresh", &owner(), MINUTE)
            .await
            .unwrap_err()
            .may_have_landed()
    );
}
