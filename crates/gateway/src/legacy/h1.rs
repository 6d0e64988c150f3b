//! HTTP/1.1 toward the legacy server as bytes: a request's head, a response's head, and a
//! response body's framing. No I/O here ([`super::http_conns`] does it).
//!
//! The body decoder keeps its place in a few integers and takes its input a slice at a time,
//! consuming all of it. A stream that waits for its next event (a parked call, a GET stream)
//! therefore holds no read buffer: bytes are read into the reader's stack, decoded, and what
//! they carry is copied out as the body's data.

use bytes::{BufMut, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Version, header};

/// The largest response head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// The most header fields a response head may have.
const MAX_HEADERS: usize = 100;
/// The longest chunk-size line (with its extensions) or trailer line accepted.
const MAX_LINE: usize = 4 * 1024;
/// The most trailer bytes accepted after the last chunk.
const MAX_TRAILERS: usize = 16 * 1024;

/// A response the legacy server sent that is not HTTP/1.1 as this client reads it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum H1Error {
    #[error("the response head is larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("malformed response head: {0}")]
    Head(String),
    #[error("malformed chunked body: {0}")]
    Chunk(&'static str),
    #[error("the connection closed before the response ended")]
    Incomplete,
}

/// Writes `req`'s head and body, ready for the socket. The URI is written as it is (the
/// caller gives the origin form); a body goes with its length.
pub fn encode_request(req: &Request<bytes::Bytes>) -> Vec<u8> {
    let body = req.body();
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(req.method().as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        req.uri()
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str)
            .as_bytes(),
    );
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in req.headers() {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let says_length = !body.is_empty()
        || !matches!(
            *req.method(),
            Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS
        );
    if says_length {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// A parsed response head and how its body is framed.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: Decoder,
    /// The connection may carry another request once this response has ended.
    pub keep_alive: bool,
}

/// Parses a response head at the start of `buf`: `Ok(None)` while it is incomplete, or the
/// head and how many bytes of `buf` it took. An interim (1xx) response is skipped, counted in
/// the bytes taken, and `Ok(None)` returned if the final head has not arrived yet: call again
/// with the bytes after it. `request` is the method the response answers.
pub fn parse_head(buf: &[u8], request: &Method) -> Result<Option<(Head, usize)>, H1Error> {
    let mut skipped = 0;
    loop {
        let rest = &buf[skipped..];
        // Room for the most fields a head may have, filled only as far as the head goes.
        let mut fields =
            [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut resp,
            rest,
            &mut fields,
        );
        let taken = match parsed {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if rest.len() > MAX_HEAD => {
                return Err(H1Error::HeadTooLarge);
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(H1Error::Head(e.to_string())),
        };
        if taken > MAX_HEAD {
            return Err(H1Error::HeadTooLarge);
        }
        let code = resp.code.unwrap_or(0);
        let status =
            StatusCode::from_u16(code).map_err(|_| H1Error::Head(format!("status {code}")))?;
        if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
            skipped += taken;
            continue;
        }
        let version = match resp.version {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        let mut headers = HeaderMap::with_capacity(resp.headers.len());
        for f in resp.headers.iter() {
            let name = HeaderName::from_bytes(f.name.as_bytes())
                .map_err(|_| H1Error::Head(format!("header name {:?}", f.name)))?;
            let value = HeaderValue::from_bytes(f.value)
                .map_err(|_| H1Error::Head(format!("value of {name}")))?;
            headers.append(name, value);
        }
        let (body, framed) = framing(status, request, &headers)?;
        let keep_alive = framed && keeps_alive(version, &headers);
        let head = Head {
            status,
            version,
            headers,
            body,
            keep_alive,
        };
        return Ok(Some((head, skipped + taken)));
    }
}

/// How the body of a response is delimited (RFC 9112, section 6.3), and whether that leaves
/// the connection usable after it.
fn framing(
    status: StatusCode,
    request: &Method,
    headers: &HeaderMap,
) -> Result<(Decoder, bool), H1Error> {
    if *request == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((
            Decoder::length(0),
            status != StatusCode::SWITCHING_PROTOCOLS,
        ));
    }
    let codings: Vec<&HeaderValue> = headers.get_all(header::TRANSFER_ENCODING).iter().collect();
    if !codings.is_empty() {
        let last = codings
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(<[u8]>::trim_ascii)
            .rfind(|c| !c.is_empty());
        let chunked = last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
        // With a length beside it, the length is ignored and the connection not reused.
        let lone = headers.get(header::CONTENT_LENGTH).is_none();
        return Ok(match chunked {
            true => (Decoder::chunked(), lone),
            false => (Decoder::until_close(), false),
        });
    }
    let mut length = None;
    for v in headers.get_all(header::CONTENT_LENGTH) {
        for part in v.as_bytes().split(|b| *b == b',') {
            let part = part.trim_ascii();
            let n = std::str::from_utf8(part)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| H1Error::Head("content-length is not a number".into()))?;
            if length.is_some_and(|l| l != n) {
                return Err(H1Error::Head("content-length values differ".into()));
            }
            length = Some(n);
        }
    }
    Ok(match length {
        Some(n) => (Decoder::length(n), true),
        None => (Decoder::until_close(), false),
    })
}

fn keeps_alive(version: Version, headers: &HeaderMap) -> bool {
    let has = |token: &[u8]| {
        headers.get_all(header::CONNECTION).iter().any(|v| {
            v.as_bytes()
                .split(|b| *b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
        })
    };
    match version {
        Version::HTTP_10 => has(b"keep-alive") && !has(b"close"),
        _ => !has(b"close"),
    }
}

/// Where a body's decoding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoder {
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many bytes of body are still to come.
    Length(u64),
    /// Everything until the connection closes.
    UntilClose,
    /// A chunk-size line: the size read so far and its digit count.
    Size {
        size: u64,
        digits: u8,
    },
    /// The rest of a chunk-size line after its digits (extensions), up to its LF.
    SizeRest {
        size: u64,
        seen: usize,
    },
    /// Chunk data still to come.
    Data(u64),
    /// The CR, then the LF, after a chunk's data.
    DataCr,
    DataLf,
    /// A trailer line after the last chunk: bytes on it so far, trailer bytes in all.
    Trailer {
        line: usize,
        total: usize,
    },
    /// The LF ending a trailer line (`empty`: the blank line that ends the body).
    TrailerLf {
        empty: bool,
        total: usize,
    },
    Done,
}

/// What one call to [`Decoder::decode`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Decoded {
    /// Input bytes that came after the body's end (none unless it ended).
    pub after_end: usize,
}

impl Decoder {
    pub fn length(n: u64) -> Decoder {
        Decoder {
            state: match n {
                0 => State::Done,
                n => State::Length(n),
            },
        }
    }

    pub fn chunked() -> Decoder {
        Decoder {
            state: State::Size { size: 0, digits: 0 },
        }
    }

    pub fn until_close() -> Decoder {
        Decoder {
            state: State::UntilClose,
        }
    }

    /// The body has ended.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Whether the connection closing now ends the body cleanly.
    pub fn ends_at_close(&self) -> bool {
        matches!(self.state, State::UntilClose | State::Done)
    }

    /// Decodes all of `input`, appending the body's data to `out`. Bytes past the body's end
    /// are counted, not decoded.
    pub fn decode(&mut self, mut input: &[u8], out: &mut BytesMut) -> Result<Decoded, H1Error> {
        while !input.is_empty() {
            match &mut self.state {
                State::Done => {
                    return Ok(Decoded {
                        after_end: input.len(),
                    });
                }
                State::UntilClose => {
                    out.put_slice(input);
                    input = &[];
                }
                State::Length(left) => {
                    if take(left, &mut input, out) {
                        self.state = State::Done;
                    }
                }
                State::Data(left) => {
                    if take(left, &mut input, out) {
                        self.state = State::DataCr;
                    }
                }
                _ => {
                    self.step(input[0])?;
                    input = &input[1..];
                }
            }
        }
        Ok(Decoded { after_end: 0 })
    }

    /// One byte of the chunked framing outside chunk data.
    fn step(&mut self, b: u8) -> Result<(), H1Error> {
        self.state = match self.state {
            State::Size { size, digits } => match (b as char).to_digit(16) {
                Some(d) if digits < 16 => State::Size {
                    size: size << 4 | u64::from(d),
                    digits: digits + 1,
                },
                Some(_) => return Err(H1Error::Chunk("chunk size too large")),
                None if digits == 0 => return Err(H1Error::Chunk("no chunk size")),
                None => after_size(size, 0, b)?,
            },
            State::SizeRest { size, seen } => after_size(size, seen, b)?,
            State::DataCr if b == b'\r' => State::DataLf,
            State::DataLf if b == b'\n' => State::Size { size: 0, digits: 0 },
            State::DataCr | State::DataLf => {
                return Err(H1Error::Chunk("no line end after chunk data"));
            }
            State::Trailer { line, total } => {
                if total >= MAX_TRAILERS {
                    return Err(H1Error::Chunk("trailers too large"));
                }
                match b {
                    b'\r' => State::TrailerLf {
                        empty: line == 0,
                        total: total + 1,
                    },
                    b'\n' if line == 0 => State::Done,
                    b'\n' => State::Trailer {
                        line: 0,
                        total: total + 1,
                    },
                    _ => State::Trailer {
                        line: line + 1,
                        total: total + 1,
                    },
                }
            }
            State::TrailerLf { empty, total } => match (b, empty) {
                (b'\n', true) => State::Done,
                (b'\n', false) => State::Trailer {
                    line: 0,
                    total: total + 1,
                },
                _ => return Err(H1Error::Chunk("bare CR in trailers")),
            },
            State::Length(_) | State::UntilClose | State::Data(_) | State::Done => {
                unreachable!("data states are decoded in bulk")
            }
        };
        Ok(())
    }
}

/// Moves up to `left` bytes of `input` to `out`; whether that was the last of them.
fn take(left: &mut u64, input: &mut &[u8], out: &mut BytesMut) -> bool {
    let n = (*left).min(input.len() as u64) as usize;
    out.put_slice(&input[..n]);
    *input = &input[n..];
    *left -= n as u64;
    *left == 0
}

/// The state after byte `b` of a chunk-size line once its digits are read (`seen` bytes of
/// whitespace or extensions so far): the line's LF starts the chunk's data, or the trailers
/// after the last (zero-sized) chunk.
fn after_size(size: u64, seen: usize, b: u8) -> Result<State, H1Error> {
    match b {
        b'\n' if size == 0 => Ok(State::Trailer { line: 0, total: 0 }),
        b'\n' => Ok(State::Data(size)),
        // Extensions are skipped; only the line's length is bounded.
        _ if seen >= MAX_LINE => Err(H1Error::Chunk("chunk-size line too long")),
        b'\r' | b';' | b' ' | b'\t' => Ok(State::SizeRest {
            size,
            seen: seen + 1,
        }),
        _ if seen > 0 => Ok(State::SizeRest {
            size,
            seen: seen + 1,
        }),
        _ => Err(H1Error::Chunk("not a chunk size")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` fed in pieces of `step` bytes: the data, and where it ended.
    fn decode_in_steps(
        mut d: Decoder,
        wire: &[u8],
        step: usize,
    ) -> Result<(Vec<u8>, usize), H1Error> {
        let mut out = BytesMut::new();
        let mut after = 0;
        for piece in wire.chunks(step) {
            after += d.decode(piece, &mut out)?.after_end;
        }
        assert!(d.is_done(), "ended");
        Ok((out.to_vec(), after))
    }

    const CHUNKED: &[u8] =
        b"5;name=value\r\nhello\r\n1\r\n \r\n6 \r\nworld!\r\n0\r\nx-trailer: 1\r\n\r\n";

    #[test]
    fn a_chunked_body_decodes_the_same_however_it_is_split() {
        for step in 1..=CHUNKED.len() {
            let (data, after) = decode_in_steps(Decoder::chunked(), CHUNKED, step).unwrap();
            assert_eq!(data, b"hello world!", "pieces of {step}");
            assert_eq!(after, 0);
        }
    }

    #[test]
    fn bytes_after_a_body_are_counted_not_decoded() {
        let mut wire = CHUNKED.to_vec();
        wire.extend_from_slice(b"HTTP/1.1 200");
        let (data, after) = decode_in_steps(Decoder::chunked(), &wire, 7).unwrap();
        assert_eq!(data, b"hello world!");
        assert_eq!(after, 12);
        let (data, after) = decode_in_steps(Decoder::length(3), b"abcdef", 2).unwrap();
        assert_eq!((data.as_slice(), after), (&b"abc"[..], 3));
    }

    #[test]
    fn a_chunked_body_without_trailers_and_with_bare_line_feeds_ends() {
        let (data, _) = decode_in_steps(Decoder::chunked(), b"3\nabc\r\n0\n\n", 1).unwrap();
        assert_eq!(data, b"abc");
        let (data, _) = decode_in_steps(Decoder::chunked(), b"0\r\n\r\n", 2).unwrap();
        assert!(data.is_empty());
    }

    #[test]
    fn broken_chunked_framing_is_refused() {
        let broken: [(&[u8], &str); 5] = [
            (b"zz\r\n", "no chunk size"),
            (b"11111111111111111\r\n", "chunk size too large"),
            (b"3\r\nabcX", "no line end after chunk data"),
            (b"0\r\n\rX", "bare CR in trailers"),
            (b"3 x\r\n", "none"),
        ];
        for (wire, want) in broken {
            let mut d = Decoder::chunked();
            let got = d.decode(wire, &mut BytesMut::new());
            match want {
                "none" => assert!(got.is_ok(), "extension after whitespace is skipped"),
                want => assert_eq!(got, Err(H1Error::Chunk(want)), "{wire:?}"),
            }
        }
        let mut long = b"1;".to_vec();
        long.resize(MAX_LINE + 10, b'a');
        assert_eq!(
            Decoder::chunked().decode(&long, &mut BytesMut::new()),
            Err(H1Error::Chunk("chunk-size line too long"))
        );
        let mut trailers = b"0\r\n".to_vec();
        trailers.resize(MAX_TRAILERS + 10, b'a');
        assert_eq!(
            Decoder::chunked().decode(&trailers, &mut BytesMut::new()),
            Err(H1Error::Chunk("trailers too large"))
        );
    }

    #[test]
    fn a_body_until_close_ends_only_at_the_close() {
        let mut d = Decoder::until_close();
        let mut out = BytesMut::new();
        d.decode(b"all of it", &mut out).unwrap();
        assert!(!d.is_done() && d.ends_at_close());
        assert!(!Decoder::length(4).ends_at_close());
        assert!(!Decoder::chunked().ends_at_close());
        assert_eq!(&out[..], b"all of it");
    }

    fn head(wire: &str, method: Method) -> Result<Option<(Head, usize)>, H1Error> {
        parse_head(wire.as_bytes(), &method)
    }

    #[test]
    fn a_head_is_parsed_with_its_framing() {
        let wire = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\n";
        let (h, taken) = head(wire, Method::POST).unwrap().unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(taken, wire.len() - 3);
        assert_eq!(h.body, Decoder::chunked());
        assert!(h.keep_alive);
        assert_eq!(h.headers["content-type"], "text/event-stream");

        let (h, _) = head(
            "HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n",
            Method::POST,
        )
        .unwrap()
        .unwrap();
        assert!(h.body.is_done() && h.keep_alive);
        let (h, _) = head(
            "HTTP/1.1 200 OK\r\ncontent-length: 7, 7\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.body, Decoder::length(7));
        let (h, _) = head(
            "HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert!(h.body.is_done());
        let (h, _) = head("HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n", Method::HEAD)
            .unwrap()
            .unwrap();
        assert!(h.body.is_done());
    }

    #[test]
    fn a_connection_is_kept_only_when_the_response_allows_it() {
        let kept = |wire: &str| head(wire, Method::GET).unwrap().unwrap().0.keep_alive;
        assert!(!kept(
            "HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 1\r\n\r\n"
        ));
        assert!(!kept("HTTP/1.1 200 OK\r\n\r\n"), "a body until the close");
        assert!(!kept("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n"));
        assert!(kept(
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n"
        ));
        assert!(!kept(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 1\r\n\r\n"
        ));
        assert!(!kept("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n"));
        assert!(kept(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n"
        ));
    }

    #[test]
    fn an_interim_response_is_passed_over() {
        let wire = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let (h, taken) = head(wire, Method::POST).unwrap().unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(&wire[taken..], "ok");
        assert!(
            head("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 2", Method::POST)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_head_may_have_at_most_max_headers_fields() {
        let with = |n: usize| {
            let mut wire = String::from("HTTP/1.1 200 OK\r\n");
            for i in 0..n {
                wire.push_str(&format!("x-field-{i}: {i}\r\n"));
            }
            wire.push_str("\r\n");
            head(&wire, Method::GET)
        };
        let (h, _) = with(MAX_HEADERS).unwrap().unwrap();
        assert_eq!(h.headers.len(), MAX_HEADERS);
        assert_eq!(h.headers["x-field-99"], "99");
        assert!(matches!(with(MAX_HEADERS + 1), Err(H1Error::Head(_))));
    }

    #[test]
    fn bad_or_oversized_heads_are_refused() {
        assert!(
            head("HTTP/1.1 200 OK\r\ncontent-le", Method::GET)
                .unwrap()
                .is_none()
        );
        assert!(matches!(
            head("HTTPS/1.1 200\r\n\r\n", Method::GET),
            Err(H1Error::Head(_))
        ));
        assert!(matches!(
            head(
                "HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\n",
                Method::GET
            ),
            Err(H1Error::Head(_))
        ));
        assert!(matches!(
            head("HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n", Method::GET),
            Err(H1Error::Head(_))
        ));
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD + 1));
        assert_eq!(head(&huge, Method::GET).err(), Some(H1Error::HeadTooLarge));
    }

    #[test]
    fn a_request_is_written_with_its_length() {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/mcp?x=1")
            .header("host", "127.0.0.1:9")
            .header("content-length", "999")
            .body(bytes::Bytes::from_static(b"{}"))
            .unwrap();
        assert_eq!(
            encode_request(&req),
            b"POST /mcp?x=1 HTTP/1.1\r\nhost: 127.0.0.1:9\r\ncontent-length: 2\r\n\r\n{}"
        );
        let get = Request::builder()
            .uri("/mcp")
            .body(bytes::Bytes::new())
            .unwrap();
        assert_eq!(encode_request(&get), b"GET /mcp HTTP/1.1\r\n\r\n");
        let post = Request::builder()
            .method(Method::POST)
            .uri("/mcp")
            .body(bytes::Bytes::new())
            .unwrap();
        assert_eq!(
            encode_request(&post),
            b"POST /mcp HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
        );
    }
}
