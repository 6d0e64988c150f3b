//! Property tests for the gateway's own HTTP/1 reading of the legacy server's responses
//! (`legacy::h1`), standing in for a fuzzer as `fuzz_state` does: any body, framed in chunks
//! of any sizes with any extensions and trailers, and arriving split at any points, decodes
//! to itself and ends where it ends; arbitrary bytes as a head or a chunked body never panic.
//! More cases: `PROPTEST_CASES=1000000 cargo test --release --test it fuzz_h1`.

use bytes::BytesMut;
use http::Method;
use mrtr_gateway::legacy::h1::{Decoder, parse_head};
use proptest::prelude::*;

use crate::fuzz_state::cases;

/// `body` in chunked framing: cut at `cuts`, each size in hex (upper or lower case, maybe
/// zero-padded) with an optional extension, then the last chunk and `trailers`.
fn chunked(body: &[u8], cuts: &[usize], upper: bool, ext: &str, trailers: &[String]) -> Vec<u8> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    points.push(0);
    points.push(body.len());
    points.sort_unstable();
    points.dedup();
    let mut out = Vec::new();
    for pair in points.windows(2) {
        let piece = &body[pair[0]..pair[1]];
        let size = match upper {
            true => format!("{:X}", piece.len()),
            false => format!("0{:x}", piece.len()),
        };
        out.extend_from_slice(size.as_bytes());
        if !ext.is_empty() {
            out.extend_from_slice(format!(";{ext}").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(piece);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n");
    for t in trailers {
        out.extend_from_slice(format!("x-{t}: v\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Decodes `wire` delivered in pieces cut at `splits`: the data, the bytes counted after the
/// end, and whether the body ended.
fn decode_split(mut d: Decoder, wire: &[u8], splits: &[usize]) -> (Vec<u8>, usize, bool) {
    let mut points: Vec<usize> = splits.iter().map(|s| s % (wire.len() + 1)).collect();
    points.push(0);
    points.push(wire.len());
    points.sort_unstable();
    let mut out = BytesMut::new();
    let mut after = 0;
    for pair in points.windows(2) {
        after += d
            .decode(&wire[pair[0]..pair[1]], &mut out)
            .expect("well-formed framing")
            .after_end;
    }
    (out.to_vec(), after, d.is_done())
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn any_chunked_body_split_anywhere_decodes_to_itself(
        body in proptest::collection::vec(any::<u8>(), 0..2048),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
        splits in proptest::collection::vec(any::<usize>(), 0..24),
        upper in any::<bool>(),
        ext in "([a-z]{1,8}(=[a-z0-9]{0,8})?)?",
        trailers in proptest::collection::vec("[a-z]{1,10}", 0..3),
        tail in proptest::collection::vec(any::<u8>(), 0..16),
    ) {
        let mut wire = chunked(&body, &cuts, upper, &ext, &trailers);
        wire.extend_from_slice(&tail);
        let (data, after, done) = decode_split(Decoder::chunked(), &wire, &splits);
        prop_assert!(done);
        prop_assert_eq!(data, body);
        prop_assert_eq!(after, tail.len());
    }

    #[test]
    fn a_body_of_known_length_split_anywhere_decodes_to_itself(
        body in proptest::collection::vec(any::<u8>(), 0..2048),
        tail in proptest::collection::vec(any::<u8>(), 0..16),
        splits in proptest::collection::vec(any::<usize>(), 0..24),
    ) {
        let mut wire = body.clone();
        wire.extend_from_slice(&tail);
        let (data, after, done) = decode_split(Decoder::length(body.len() as u64), &wire, &splits);
        prop_assert!(done);
        prop_assert_eq!(data, body);
        prop_assert_eq!(after, tail.len());
    }

    #[test]
    fn arbitrary_bytes_as_a_chunked_body_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..4096),
        splits in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut points: Vec<usize> = splits.iter().map(|s| s % (bytes.len() + 1)).collect();
        points.push(0);
        points.push(bytes.len());
        points.sort_unstable();
        let mut d = Decoder::chunked();
        let mut out = BytesMut::new();
        for pair in points.windows(2) {
            if d.decode(&bytes[pair[0]..pair[1]], &mut out).is_err() {
                break;
            }
        }
        // What came out is never more than went in.
        prop_assert!(out.len() <= bytes.len());
    }

    #[test]
    fn arbitrary_bytes_as_a_response_head_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        prefix in prop_oneof![Just(""), Just("HTTP/1.1 200 OK\r\n"), Just("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 ")],
    ) {
        let mut wire = prefix.as_bytes().to_vec();
        wire.extend_from_slice(&bytes);
        if let Ok(Some((_, taken))) = parse_head(&wire, &Method::POST) {
            prop_assert!(taken <= wire.len());
        }
    }
}
