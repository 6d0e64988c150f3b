//! Property tests standing in for a fuzzer (cargo fuzz needs a nightly toolchain, which this
//! machine does not have): opening attacker-controlled `requestState` strings and validating
//! attacker-controlled `inputResponses` must never panic, and no edit of a genuine token may
//! open. More cases: `PROPTEST_CASES=1000000 cargo test --release --test it fuzz_state`.

use std::time::Duration;

use mrtr_gateway::config::StateKeySpec;
use mrtr_gateway::mrtr::input_response::validate;
use mrtr_gateway::state::{InputKind, StateCodec, now_secs};
use proptest::prelude::*;
use serde_json::{Value, json};

fn codec() -> StateCodec {
    StateCodec::new(
        &[
            StateKeySpec {
                id: "k1".into(),
                secret: [7; 32],
            },
            StateKeySpec {
                id: "k0".into(),
                secret: [8; 32],
            },
        ],
        Duration::from_secs(600),
        4096,
    )
}

fn genuine(c: &StateCodec) -> String {
    let mut p = c.fresh_payload("alice", "origin-digest", now_secs());
    p.ans.insert(
        "elicit-0123456789ab".into(),
        json!({"action": "accept", "content": {"name": "Ada"}}).into(),
    );
    c.seal(&p).unwrap().0
}

/// `default` cases, or `PROPTEST_CASES`; no failure files (shared by the fuzz modules).
pub(crate) fn cases(default: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A token-looking string: the real prefix followed by arbitrary base64url-ish text.
fn token_like() -> impl Strategy<Value = String> {
    prop_oneof![
        ".*",
        "m1\\.k[0-9]\\.[A-Za-z0-9_-]{0,600}",
        "m[0-9]\\.[A-Za-z0-9_-]{0,40}\\.[A-Za-z0-9_+/=-]{0,200}",
    ]
}

proptest! {
    #![proptest_config(cases(20_000))]

    #[test]
    fn arbitrary_strings_never_open_and_never_panic(s in token_like()) {
        let c = codec();
        prop_assert!(c.open(&s, now_secs()).is_err());
    }

    #[test]
    fn no_edit_of_a_genuine_token_opens(
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<u8>()), 1..4)
    ) {
        let c = codec();
        let original = genuine(&c);
        let mut bytes = original.clone().into_bytes();
        for (at, op, b) in edits {
            let b = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."[b as usize % 65];
            match op {
                0 if !bytes.is_empty() => { let i = at.index(bytes.len()); bytes[i] = b; }
                1 => { let i = at.index(bytes.len() + 1); bytes.insert(i, b); }
                _ if !bytes.is_empty() => { let i = at.index(bytes.len()); bytes.remove(i); }
                _ => {}
            }
        }
        let edited = String::from_utf8(bytes).unwrap();
        prop_assume!(edited != original);
        prop_assert!(c.open(&edited, now_secs()).is_err(), "an edited token opened: {edited}");
    }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        prop_oneof![
            Just("accept".to_string()),
            Just("user".to_string()),
            Just("file:///x".to_string()),
            ".{0,12}"
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("action".to_string()),
                    Just("content".to_string()),
                    Just("role".to_string()),
                    Just("model".to_string()),
                    Just("roots".to_string()),
                    Just("uri".to_string()),
                    Just("type".to_string()),
                    Just("name".to_string()),
                    "[a-z]{1,6}"
                ],
                inner,
                0..6,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(cases(20_000))]

    #[test]
    fn input_response_validation_never_panics(v in json_value()) {
        for kind in [InputKind::ElicitForm, InputKind::ElicitUrl, InputKind::Sampling, InputKind::Roots] {
            let _ = validate(kind, &v);
        }
    }
}

#[test]
fn the_generators_reach_valid_answers_too() {
    // Guards against a generator that only ever produces junk (which would make the
    // property above trivially true): known-good shapes do validate.
    assert!(
        validate(
            InputKind::ElicitForm,
            &json!({"action": "accept", "content": {"name": "x"}})
        )
        .is_ok()
    );
    assert!(validate(InputKind::Roots, &json!({"roots": [{"uri": "file:///x"}]})).is_ok());
    let c = codec();
    assert!(c.open(&genuine(&c), now_secs()).is_ok());
}
