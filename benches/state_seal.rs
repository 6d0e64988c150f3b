//! `requestState` sealing and opening at 512 B, 4 KiB and 64 KiB of payload.
//!
//! `codec_*` go through [`StateCodec`] as the engine does (JSON encoding of the payload, size
//! cap, expiry check); `raw_seal_open` is the token layer alone (`state::seal`: XAES-256-GCM
//! and base64url, no JSON) on the same number of bytes, so the JSON share can be read off
//! the difference.
//!
//! Target: `codec_seal_open` at 4096 ≤ 5 µs.
//!
//! ```sh
//! cargo bench --bench state_seal
//! ```

use std::time::Duration;

use divan::counter::BytesCount;
use divan::{Bencher, black_box};
use mrtr_gateway::config::StateKeySpec;
use mrtr_gateway::state::{
    InputKind, KeyRing, ParkRef, Pending, StateCodec, StatePayload, now_secs, seal,
};
use serde_json::json;

/// The shipped binary's allocator (`src/main.rs`), so allocation costs are the ones it pays.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Plaintext sizes, in bytes of payload JSON.
const SIZES: [usize; 3] = [512, 4096, 65536];

fn main() {
    println!("target: codec_seal_open at 4096 B ≤ 5 µs (median column)");
    divan::Divan::default()
        .max_time(Duration::from_millis(500))
        .config_with_args()
        .main();
}

fn spec() -> StateKeySpec {
    StateKeySpec {
        id: "k1".into(),
        secret: [7; 32],
    }
}

fn codec() -> StateCodec {
    // Large enough that the 64 KiB payload (about 87 KiB as a token) is not refused.
    StateCodec::new(&[spec()], Duration::from_secs(600), 1 << 20)
}

/// A payload whose JSON is `size` bytes: a realistic skeleton (one answered form, one
/// pending question, a parking reference) padded through the answer's content.
fn payload_of(codec: &StateCodec, size: usize) -> StatePayload {
    let mut p = codec.fresh_payload("anonymous", "0123456789abcdef0123456789abcdef", now_secs());
    p.rnd = 1;
    p.park = Some(ParkRef {
        instance: "9f86d081884c7d65".into(),
        handle: "q2lQf3b8Y0k1sJm9d5W7xA".into(),
    });
    p.pnd.insert(
        "elicit-3f2a9c1b7d4e".into(),
        Pending {
            kind: InputKind::ElicitForm,
            elicitation_id: None,
            shape: Some("5c1d2e3f4a5b".into()),
        },
    );
    let mut pad = 0usize;
    loop {
        p.ans.insert(
            "elicit-a1b2c3d4e5f6".into(),
            json!({"action": "accept", "content": {"note": "x".repeat(pad)}}).into(),
        );
        let len = serde_json::to_vec(&p).expect("serializes").len();
        if len >= size {
            assert_eq!(len, size, "padding overshot");
            return p;
        }
        pad += size - len;
    }
}

#[divan::bench(args = SIZES)]
fn codec_seal(bencher: Bencher, size: usize) {
    let c = codec();
    let p = payload_of(&c, size);
    bencher
        .counter(BytesCount::new(size))
        .bench_local(|| c.seal(black_box(&p)).expect("fits"));
}

#[divan::bench(args = SIZES)]
fn codec_open(bencher: Bencher, size: usize) {
    let c = codec();
    let (token, _) = c.seal(&payload_of(&c, size)).expect("fits");
    let now = now_secs();
    bencher
        .counter(BytesCount::new(size))
        .bench_local(|| c.open(black_box(&token), now).expect("opens"));
}

#[divan::bench(args = SIZES)]
fn codec_seal_open(bencher: Bencher, size: usize) {
    let c = codec();
    let p = payload_of(&c, size);
    let now = now_secs();
    bencher.counter(BytesCount::new(size)).bench_local(|| {
        let (token, _) = c.seal(black_box(&p)).expect("fits");
        c.open(&token, now).expect("opens")
    });
}

#[divan::bench(args = SIZES)]
fn raw_seal_open(bencher: Bencher, size: usize) {
    let ring = KeyRing::new(&[spec()]);
    let plain = vec![b'x'; size];
    bencher.counter(BytesCount::new(size)).bench_local(|| {
        let (token, _) = seal::seal(&ring, black_box(&plain));
        seal::open(&ring, &token, 1 << 20).expect("opens")
    });
}
