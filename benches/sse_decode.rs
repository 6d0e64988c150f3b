//! SSE decoding throughput (`legacy::sse::SseDecoder`) for both framings seen in the wild:
//! the Python SDK's (`\r\n` line ends, no ids) and the TypeScript SDK's (`\n` line ends, an
//! id on every event, an empty priming event first). Event sizes are what a legacy call
//! stream carries: ~150 B progress notifications, ~2 KiB tool results, 64 KiB results.
//! Each stream is about 1 MiB and is fed in 16 KiB chunks, as socket reads arrive; the
//! throughput column is in MB/s of wire bytes.
//!
//! ```sh
//! cargo bench --bench sse_decode
//! ```

use std::time::Duration;

use divan::counter::BytesCount;
use divan::{Bencher, black_box};
use mrtr_wire::sse::SseDecoder;
use serde_json::json;

const EVENT_SIZES: [usize; 3] = [150, 2048, 65536];
const STREAM_BYTES: usize = 1 << 20;
const CHUNK: usize = 16 * 1024;

fn main() {
    divan::Divan::default()
        .max_time(Duration::from_millis(700))
        .config_with_args()
        .main();
}

#[derive(Clone, Copy)]
enum Framing {
    Python,
    TypeScript,
}

/// A JSON-RPC message whose `data` line is about `size` bytes.
fn message(size: usize, n: usize) -> String {
    let skeleton = json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": n, "progress": n, "message": ""}})
    .to_string();
    let pad = size.saturating_sub(skeleton.len());
    json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": n, "progress": n, "message": "p".repeat(pad)}})
    .to_string()
}

/// About `STREAM_BYTES` of events of `size` bytes in `framing`.
fn stream(framing: Framing, size: usize) -> Vec<u8> {
    let mut out = String::with_capacity(STREAM_BYTES + size + 64);
    if let Framing::TypeScript = framing {
        out.push_str("id: 1_0\ndata: \n\n");
    }
    let mut n = 1;
    while out.len() < STREAM_BYTES {
        let data = message(size, n);
        match framing {
            Framing::Python => {
                out.push_str("event: message\r\ndata: ");
                out.push_str(&data);
                out.push_str("\r\n\r\n");
            }
            Framing::TypeScript => {
                out.push_str(&format!("event: message\nid: 1_{n}\ndata: "));
                out.push_str(&data);
                out.push_str("\n\n");
            }
        }
        n += 1;
    }
    out.into_bytes()
}

fn decode_all(bytes: &[u8]) -> usize {
    let mut dec = SseDecoder::new(4 << 20, 64 << 20);
    let mut events = Vec::new();
    let mut count = 0;
    for chunk in bytes.chunks(CHUNK) {
        dec.feed(chunk, &mut events).expect("well-formed stream");
        count += events.len();
        events.clear();
    }
    count
}

fn bench_framing(bencher: Bencher, framing: Framing, size: usize) {
    let bytes = stream(framing, size);
    bencher
        .counter(BytesCount::new(bytes.len()))
        .bench_local(|| decode_all(black_box(&bytes)));
}

#[divan::bench(args = EVENT_SIZES)]
fn python_crlf_no_ids(bencher: Bencher, event_bytes: usize) {
    bench_framing(bencher, Framing::Python, event_bytes);
}

#[divan::bench(args = EVENT_SIZES)]
fn typescript_lf_with_ids(bencher: Bencher, event_bytes: usize) {
    bench_framing(bencher, Framing::TypeScript, event_bytes);
}
