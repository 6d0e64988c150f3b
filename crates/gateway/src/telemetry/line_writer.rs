//! The log writer: a request appends its line to a shared buffer and goes on; one background
//! thread writes the buffer out.
//!
//! What it costs a request is the point. A channel to a writer thread (what `tracing-appender`
//! does) wakes that thread for every line when lines come slower than it writes them: a
//! `futex` call on the request's path, and a thread switch on a core the request may need.
//! Here the thread is woken only by the first line after it went idle. While lines keep
//! coming it gathers them for [`GATHER`] and writes them in one go, so a steady stream of
//! requests costs a few hundred wake-ups a second, not one per line.
//!
//! Nothing is dropped: a request whose line does not fit in the buffer (`limit` bytes) waits
//! for the writer to make room, as a full channel made it wait. A line is written whole, in
//! the order lines were appended. Dropping the [`WriterGuard`] writes what is left and stops
//! the thread; lines appended after that are dropped (the process is ending).

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// How long the writer gathers lines, once one has come, before it writes them.
pub const GATHER: Duration = Duration::from_millis(5);

struct Queue {
    bytes: Vec<u8>,
    /// The writer waits for a line with no deadline: the next line must wake it.
    idle: bool,
    /// Requests waiting for room: the writer writes at once, without gathering.
    waiting: usize,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the writer (a line after idleness, a full buffer, the end).
    wake: Condvar,
    /// Wakes requests waiting for room.
    room: Condvar,
    limit: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Where log lines go: `tracing_subscriber`'s writer for the line layer.
#[derive(Clone)]
pub struct LineWriter {
    shared: Arc<Shared>,
}

/// Owns the writer thread: dropping it writes what is buffered and ends the thread.
pub struct WriterGuard {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Starts the writer thread `name`, writing to `sink`, buffering at most `limit` bytes.
pub fn spawn<W: Write + Send + 'static>(
    sink: W,
    limit: usize,
    name: &str,
) -> std::io::Result<(LineWriter, WriterGuard)> {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue {
            bytes: Vec::new(),
            idle: false,
            waiting: 0,
            closed: false,
        }),
        wake: Condvar::new(),
        room: Condvar::new(),
        limit: limit.max(1),
    });
    let thread = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || write_out(&shared, sink))?
    };
    Ok((
        LineWriter {
            shared: shared.clone(),
        },
        WriterGuard {
            shared,
            thread: Some(thread),
        },
    ))
}

/// The writer thread: waits for lines, gathers them for [`GATHER`], writes them, until the
/// guard is dropped and nothing is left.
fn write_out<W: Write>(shared: &Shared, mut sink: W) {
    let mut batch = Vec::new();
    loop {
        let mut q = shared.lock();
        while q.bytes.is_empty() && !q.closed {
            q.idle = true;
            q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        q.idle = false;
        if q.bytes.is_empty() {
            // Closed, and everything written.
            return;
        }
        if !q.closed && q.waiting == 0 && q.bytes.len() < shared.limit / 2 {
            // Lines that come meanwhile go in the same write. A full buffer or the end cuts
            // the wait short.
            q = shared
                .wake
                .wait_timeout(q, GATHER)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        std::mem::swap(&mut q.bytes, &mut batch);
        drop(q);
        shared.room.notify_all();
        // Nowhere to report a failed write to but the log itself: the lines are lost, and
        // the next batch tries again.
        let _ = sink.write_all(&batch);
        let _ = sink.flush();
        batch.clear();
    }
}

impl LineWriter {
    fn append(&self, line: &[u8]) {
        let shared = &self.shared;
        let mut q = shared.lock();
        while !q.closed && !q.bytes.is_empty() && q.bytes.len() + line.len() > shared.limit {
            // Full: make sure the writer is on it, and wait for room.
            shared.wake.notify_one();
            q.waiting += 1;
            q = shared.room.wait(q).unwrap_or_else(|e| e.into_inner());
            q.waiting -= 1;
        }
        if q.closed {
            return;
        }
        q.bytes.extend_from_slice(line);
        if q.idle {
            q.idle = false;
            shared.wake.notify_one();
        }
    }
}

impl Write for &LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LineWriter {
    type Writer = &'a LineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

impl Drop for WriterGuard {
    fn drop(&mut self) {
        {
            let mut q = self.shared.lock();
            q.closed = true;
        }
        self.shared.wake.notify_one();
        self.shared.room.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A sink that records each write it gets, optionally slowly.
    #[derive(Clone, Default)]
    struct Recorder {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        delay: Duration,
    }

    impl Write for Recorder {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            std::thread::sleep(self.delay);
            self.writes.lock().unwrap().push(buf.to_vec());
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Recorder {
        fn text(&self) -> String {
            let writes = self.writes.lock().unwrap();
            String::from_utf8(writes.concat()).unwrap()
        }

        fn writes(&self) -> usize {
            self.writes.lock().unwrap().len()
        }
    }

    fn line(w: &LineWriter, text: &str) {
        let mut out = w;
        out.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn lines_come_out_whole_and_in_order_and_the_guard_writes_the_rest() {
        let sink = Recorder::default();
        let (w, guard) = spawn(sink.clone(), 1 << 20, "test-writer").unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..500 {
                        line(&w, &format!("t{t} line {i:04}\n"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let text = sink.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2000, "every line, none twice");
        for t in 0..4 {
            let own: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|l| l.starts_with(&format!("t{t} ")))
                .collect();
            let expected: Vec<String> = (0..500).map(|i| format!("t{t} line {i:04}")).collect();
            assert_eq!(own, expected, "thread {t}'s lines whole and in its order");
        }
    }

    /// The point of the writer: lines that come a little apart, as requests' lines do, share
    /// one write (one wake-up of the thread) instead of waking it one by one.
    #[test]
    fn lines_that_come_close_together_are_written_together() {
        let sink = Recorder::default();
        let (w, guard) = spawn(sink.clone(), 1 << 20, "test-writer").unwrap();
        for i in 0..15 {
            line(&w, &format!("line {i}\n"));
            // Longer than the writer takes to wake and write one line.
            std::thread::sleep(Duration::from_micros(200));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while sink.text().lines().count() < 15 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sink.text().lines().count(), 15, "written without the guard");
        assert!(
            sink.writes() <= 8,
            "15 lines in {} writes: the thread was woken per line",
            sink.writes()
        );
        drop(guard);
    }

    /// A full buffer makes the request wait for room (like a full channel); nothing is lost.
    #[test]
    fn a_full_buffer_waits_for_room_and_loses_nothing() {
        let sink = Recorder {
            delay: Duration::from_millis(2),
            ..Recorder::default()
        };
        // Room for about three lines.
        let (w, guard) = spawn(sink.clone(), 64, "test-writer").unwrap();
        for i in 0..200 {
            line(&w, &format!("a line, {i:05}\n"));
        }
        drop(guard);
        let text = sink.text();
        let expected: String = (0..200).map(|i| format!("a line, {i:05}\n")).collect();
        assert_eq!(text, expected);
        assert!(
            sink.writes() > 10,
            "written as room was made, not all at the end"
        );
    }

    /// A line larger than the whole buffer still goes through (alone), rather than waiting
    /// for room that can never be made.
    #[test]
    fn a_line_larger_than_the_buffer_is_written_whole() {
        let sink = Recorder::default();
        let (w, guard) = spawn(sink.clone(), 16, "test-writer").unwrap();
        let long = format!("{}\n", "x".repeat(100));
        line(&w, "short\n");
        line(&w, &long);
        line(&w, "after\n");
        drop(guard);
        assert_eq!(sink.text(), format!("short\n{long}after\n"));
    }
}
