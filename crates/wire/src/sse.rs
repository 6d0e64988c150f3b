//! An incremental Server-Sent Events decoder with size limits.
//!
//! Legacy servers frame SSE two ways in the wild: the Python SDK ends lines with `\r\n` and
//! sends no ids; the TypeScript SDK ends lines with `\n`, gives every event an `id`, and opens
//! each stream with a "priming" event whose `data` is empty. The decoder follows the WHATWG
//! parsing rules (CR, LF and CRLF line ends; `data` lines joined with LF; comments ignored;
//! a leading BOM dropped) and never assumes a chunk boundary falls anywhere in particular.
//!
//! Two limits keep a misbehaving server from exhausting memory: `max_event` bounds the bytes
//! buffered for one event (its data plus the current line), `max_stream` bounds the bytes
//! read from the whole stream.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event` field; `None` means the default type, "message".
    pub event: Option<String>,
    pub data: String,
    pub id: Option<String>,
    /// A `retry` field in this event, in milliseconds.
    pub retry: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseError {
    EventTooLarge { limit: usize },
    StreamTooLarge { limit: usize },
    NotUtf8,
}

impl std::fmt::Display for SseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SseError::EventTooLarge { limit } => write!(f, "an SSE event exceeded {limit} bytes"),
            SseError::StreamTooLarge { limit } => {
                write!(f, "an SSE stream exceeded {limit} bytes")
            }
            SseError::NotUtf8 => write!(f, "an SSE line was not UTF-8"),
        }
    }
}

impl std::error::Error for SseError {}

#[derive(Debug)]
pub struct SseDecoder {
    /// The start of a line whose end has not arrived yet.
    partial: Vec<u8>,
    /// The previous chunk ended in CR; an LF at the start of the next one belongs to it.
    after_cr: bool,
    started: bool,
    data: String,
    has_data: bool,
    event: Option<String>,
    id: Option<String>,
    retry: Option<u64>,
    event_bytes: usize,
    stream_bytes: usize,
    max_event: usize,
    max_stream: usize,
}

impl SseDecoder {
    pub fn new(max_event: usize, max_stream: usize) -> Self {
        SseDecoder {
            partial: Vec::new(),
            after_cr: false,
            started: false,
            data: String::new(),
            has_data: false,
            event: None,
            id: None,
            retry: None,
            event_bytes: 0,
            stream_bytes: 0,
            max_event,
            max_stream,
        }
    }

    /// Feeds a chunk; every event completed by it is appended to `out`.
    ///
    /// A line that arrives whole within a chunk is parsed where it lies; only a line split
    /// across chunks is gathered, and its buffer is let go once the line is complete, so a
    /// decoder between events holds no buffer (a stream may wait for hours between them).
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        self.stream_bytes += chunk.len();
        if self.stream_bytes > self.max_stream {
            return Err(SseError::StreamTooLarge {
                limit: self.max_stream,
            });
        }
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        while !chunk.is_empty() {
            let Some(pos) = chunk.iter().position(|&b| b == b'\n' || b == b'\r') else {
                self.count_line_bytes(chunk.len())?;
                self.partial.extend_from_slice(chunk);
                break;
            };
            self.count_line_bytes(pos)?;
            let (line, rest) = chunk.split_at(pos);
            let was_cr = rest[0] == b'\r';
            chunk = &rest[1..];
            if was_cr {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            if self.partial.is_empty() {
                self.end_line(line, out)?;
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                self.end_line(&whole, out)?;
            }
        }
        Ok(())
    }

    fn count_line_bytes(&mut self, n: usize) -> Result<(), SseError> {
        self.event_bytes += n;
        if self.event_bytes > self.max_event {
            return Err(SseError::EventTooLarge {
                limit: self.max_event,
            });
        }
        Ok(())
    }

    fn end_line(&mut self, mut line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if !self.started {
            self.started = true;
            if let Some(rest) = line.strip_prefix(b"\xEF\xBB\xBF") {
                line = rest;
            }
        }
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        let line = std::str::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_string()),
            "id" if !value.contains('\0') => self.id = Some(value.to_string()),
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry = value.parse().ok();
            }
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        self.event_bytes = 0;
        // An event with neither data nor id nor retry is only a separator.
        if !self.has_data && self.id.is_none() && self.retry.is_none() {
            self.event = None;
            return;
        }
        out.push(SseEvent {
            event: self.event.take(),
            data: std::mem::take(&mut self.data),
            id: self.id.take(),
            retry: self.retry.take(),
        });
        self.has_data = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PYTHON: &str = "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"elicitation/create\"}\r\n\r\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":0,\"result\":{}}\r\n\r\n";
    const TYPESCRIPT: &str = "id: 1_0\ndata: \n\nid: 1_1\nevent: message\ndata: {\"a\":1}\n\n: keep-alive\n\nid: 1_2\ndata: {\"b\":\ndata: 2}\nretry: 1500\n\n";

    fn decode_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut d = SseDecoder::new(1 << 20, 1 << 24);
        let mut out = Vec::new();
        for c in chunks {
            d.feed(c, &mut out).unwrap();
        }
        out
    }

    fn expected_python() -> Vec<SseEvent> {
        vec![
            SseEvent {
                event: Some("message".into()),
                data: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"elicitation/create\"}".into(),
                ..Default::default()
            },
            SseEvent {
                event: Some("message".into()),
                data: "{\"jsonrpc\":\"2.0\",\"id\":0,\"result\":{}}".into(),
                ..Default::default()
            },
        ]
    }

    fn expected_typescript() -> Vec<SseEvent> {
        vec![
            SseEvent {
                id: Some("1_0".into()),
                ..Default::default()
            },
            SseEvent {
                event: Some("message".into()),
                data: "{\"a\":1}".into(),
                id: Some("1_1".into()),
                ..Default::default()
            },
            SseEvent {
                data: "{\"b\":\n2}".into(),
                id: Some("1_2".into()),
                retry: Some(1500),
                ..Default::default()
            },
        ]
    }

    #[test]
    fn both_framings_decode_whole() {
        assert_eq!(decode_all(&[PYTHON.as_bytes()]), expected_python());
        assert_eq!(decode_all(&[TYPESCRIPT.as_bytes()]), expected_typescript());
    }

    #[test]
    fn both_framings_decode_split_at_every_byte_boundary() {
        for (text, want) in [
            (PYTHON, expected_python()),
            (TYPESCRIPT, expected_typescript()),
        ] {
            let b = text.as_bytes();
            for i in 0..=b.len() {
                assert_eq!(decode_all(&[&b[..i], &b[i..]]), want, "split at {i}");
            }
            // And one byte at a time.
            let singles: Vec<&[u8]> = b.chunks(1).collect();
            assert_eq!(decode_all(&singles), want);
        }
    }

    #[test]
    fn bare_cr_line_ends_and_bom() {
        let got = decode_all(&[b"\xEF\xBB\xBFdata: x\r\rdata: y\n\n"]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].data, "x");
        assert_eq!(got[1].data, "y");
    }

    #[test]
    fn a_decoder_between_events_holds_no_buffer() {
        let mut d = SseDecoder::new(1 << 20, 1 << 24);
        let mut out = Vec::new();
        // Whole lines are parsed where they lie.
        d.feed(PYTHON.as_bytes(), &mut out).unwrap();
        assert_eq!(d.partial.capacity(), 0);
        // A line split across chunks is gathered, then its buffer let go.
        let (a, b) = TYPESCRIPT.as_bytes().split_at(40);
        d.feed(a, &mut out).unwrap();
        assert!(!d.partial.is_empty(), "the split line waits for its end");
        d.feed(b, &mut out).unwrap();
        assert_eq!(d.partial.capacity(), 0);
        assert_eq!(out.len(), 5);
    }

    #[test]
    fn limits_are_enforced() {
        let mut d = SseDecoder::new(16, 1 << 20);
        let mut out = Vec::new();
        assert_eq!(
            d.feed(b"data: 0123456789abcdef\n\n", &mut out),
            Err(SseError::EventTooLarge { limit: 16 })
        );
        // The event limit is per event: many small events are fine.
        let mut d = SseDecoder::new(16, 1 << 20);
        for _ in 0..100 {
            d.feed(b"data: small\n\n", &mut out).unwrap();
        }
        let mut d = SseDecoder::new(1024, 32);
        assert_eq!(
            d.feed(&[b'a'; 33], &mut out),
            Err(SseError::StreamTooLarge { limit: 32 })
        );
    }
}
