//! The log's writer: lines go into a bounded buffer in memory and one
//! thread of their own writes them to stderr, so a request never waits on
//! the log's output, and a log that cannot keep up (a full pipe, a stalled
//! collector, a slow disk) loses lines, counted, instead of holding up
//! requests.
//!
//! The writer thread sleeps until a line arrives, gathers lines for
//! [`LINGER`], and writes all of them in one call, as nginx's `access_log
//! ... buffer= flush=` does: at most one wake-up and one write per
//! [`LINGER`] however busy the gateway is. Lines still in the buffer when
//! the process ends are written by [`flush`] (`main` calls it on the way
//! out); a killed process loses at most the last [`LINGER`] of them.
//!
//! A line can also be pushed unformatted ([`LogWriter::push_deferred`]): its
//! fields in a compact binary form and the function that formats them,
//! which the writer thread calls. The access log goes that way, so the
//! request path only copies a hundred bytes or so, and formatting, like
//! writing, costs the log's thread and never a request.
//!
//! Why not `tracing-appender`'s non-blocking writer: it hands each line to
//! its thread through a channel, one allocation and, whenever that thread
//! has gone idle, one wake-up per line, which at tens of thousands of lines
//! a second cost more than the write it saves.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// How long the writer gathers lines under load before writing them.
pub const LINGER: Duration = Duration::from_millis(10);

/// Default buffer size (`--log-buffer`): at about 400 bytes an access line,
/// some 10,000 lines, or a second at 10k requests a second.
pub const DEFAULT_CAPACITY: usize = 4 << 20;

/// The process's log writer, made on first use.
static WRITER: OnceLock<LogWriter> = OnceLock::new();
/// Its buffer size, if set before it is made.
static CAPACITY: AtomicUsize = AtomicUsize::new(DEFAULT_CAPACITY);

/// A handle on the process's log buffer; cheap to clone.
#[derive(Clone, Debug)]
pub struct LogWriter {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the writer thread: a line arrived while it was idle, or a
    /// flush was asked for.
    wake: Condvar,
    /// Wakes [`flush`]ers: the buffer was written.
    written: Condvar,
    capacity: usize,
    dropped: AtomicU64,
}

/// Formats one deferred line's fields (as [`LogWriter::push_deferred`]'s
/// `encode` wrote them) onto the end of the output.
pub type Format = fn(fields: &[u8], out: &mut Vec<u8>);

#[derive(Debug, Default)]
struct State {
    /// The lines, formatted or as their fields, one after the other.
    lines: Vec<u8>,
    /// Where each line ends in `lines`, and for a deferred one how to
    /// format it.
    entries: Vec<Entry>,
    /// The writer thread waits for a line (it found the buffer empty).
    idle: bool,
    /// The writer thread holds lines it has not finished writing.
    writing: bool,
    /// A flush is waiting: write without lingering.
    urgent: bool,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    end: usize,
    format: Option<Format>,
}

/// Sets the process's log buffer size; only before its first line.
pub fn set_capacity(bytes: usize) {
    CAPACITY.store(bytes, Ordering::Relaxed);
}

/// The process's log writer, writing to stderr.
pub fn writer() -> &'static LogWriter {
    WRITER.get_or_init(|| LogWriter::spawn(CAPACITY.load(Ordering::Relaxed), std::io::stderr()))
}

/// Log lines dropped so far because the buffer was full.
pub fn dropped_lines() -> u64 {
    WRITER
        .get()
        .map_or(0, |w| w.shared.dropped.load(Ordering::Relaxed))
}

/// Writes what the buffer holds and waits (at most `timeout`) until it has
/// been written.
pub fn flush(timeout: Duration) {
    if let Some(w) = WRITER.get() {
        w.flush(timeout);
    }
}

impl LogWriter {
    /// A writer with its own thread writing to `out`.
    pub fn spawn(capacity: usize, out: impl std::io::Write + Send + 'static) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            written: Condvar::new(),
            capacity,
            dropped: AtomicU64::new(0),
        });
        let thread_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("fairway-log".into())
            .spawn(move || write_loop(&thread_shared, out));
        if let Err(e) = spawned {
            // Without its thread nothing would ever be written: say so
            // where it can still be seen, and keep counting the losses.
            eprintln!("fairway: cannot start the log writer thread: {e}");
        }
        LogWriter { shared }
    }

    /// Adds one line (one formatted event), or drops it if the buffer has
    /// no room for it.
    pub fn push(&self, line: &[u8]) {
        self.add(None, line.len(), |lines| lines.extend_from_slice(line));
    }

    /// Adds one line as its fields: `encode` appends them to the buffer,
    /// and the writer thread calls `format` on them. The line is dropped if
    /// the buffer has no room for its fields.
    pub fn push_deferred(&self, format: Format, encode: impl FnOnce(&mut Vec<u8>)) {
        self.add(Some(format), 0, encode);
    }

    /// Appends a line of `len` bytes or more (checked before, so that an
    /// outsized line never grows the buffer) with `append`.
    fn add(&self, format: Option<Format>, len: usize, append: impl FnOnce(&mut Vec<u8>)) {
        let mut s = self.shared.state.lock();
        let start = s.lines.len();
        let fits = start + len <= self.shared.capacity && {
            append(&mut s.lines);
            s.lines.len() <= self.shared.capacity
        };
        if !fits {
            s.lines.truncate(start);
            drop(s);
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let end = s.lines.len();
        s.entries.push(Entry { end, format });
        if s.idle {
            s.idle = false;
            drop(s);
            self.shared.wake.notify_one();
        }
    }

    /// Lines dropped by this writer so far.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// See [`flush`]: `timeout` bounds each wait for the writer, so a
    /// stalled output cannot hold up the process's exit for longer.
    pub fn flush(&self, timeout: Duration) {
        let mut s = self.shared.state.lock();
        while !s.entries.is_empty() || s.writing {
            s.urgent = true;
            self.shared.wake.notify_one();
            if self.shared.written.wait_for(&mut s, timeout).timed_out() {
                return;
            }
        }
    }
}

fn write_loop(shared: &Shared, mut out: impl std::io::Write) {
    let mut batch = Vec::new();
    let mut entries = Vec::new();
    let mut text = Vec::new();
    loop {
        {
            let mut s = shared.state.lock();
            s.writing = false;
            shared.written.notify_all();
            while s.entries.is_empty() {
                s.idle = true;
                shared.wake.wait(&mut s);
            }
            if !s.urgent {
                // Gather for a while, then write it all at once: one wake-up
                // and one write per LINGER however many lines arrive.
                shared.wake.wait_for(&mut s, LINGER);
            }
            s.urgent = false;
            s.writing = true;
            batch.clear();
            entries.clear();
            std::mem::swap(&mut batch, &mut s.lines);
            std::mem::swap(&mut entries, &mut s.entries);
        }
        let lines = entries.len() as u64;
        let output = if entries.iter().all(|e| e.format.is_none()) {
            &batch
        } else {
            text.clear();
            let mut start = 0;
            for e in &entries {
                let fields = &batch[start..e.end];
                match e.format {
                    Some(format) => format(fields, &mut text),
                    None => text.extend_from_slice(fields),
                }
                start = e.end;
            }
            &text
        };
        // A failed write loses its lines, as a full buffer does: the log
        // has nowhere else to go.
        if out.write_all(output).and_then(|()| out.flush()).is_err() {
            shared.dropped.fetch_add(lines, Ordering::Relaxed);
        }
        // Keep the larger of the two buffers' allocations for reuse, but
        // not an outsized one from a burst.
        if batch.capacity() > shared.capacity {
            batch = Vec::new();
            entries = Vec::new();
        }
        if text.capacity() > 4 * shared.capacity {
            text = Vec::new();
        }
    }
}

/// One event's writer for the fmt layer: it writes each event with one
/// `write_all` of the whole formatted line.
#[derive(Debug)]
pub struct Line<'a>(&'a LogWriter);

impl std::io::Write for Line<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.push(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = Line<'a>;
    fn make_writer(&'a self) -> Self::Writer {
        Line(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that takes everything, or blocks until told to go on.
    #[derive(Clone, Default)]
    struct Sink {
        got: Arc<Mutex<Vec<u8>>>,
        gate: Arc<(Mutex<bool>, Condvar)>,
    }

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let (open, cv) = &*self.gate;
            let mut o = open.lock();
            while !*o {
                cv.wait(&mut o);
            }
            self.got.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn open(&self, open: bool) {
            *self.gate.0.lock() = open;
            self.gate.1.notify_all();
        }
    }

    #[test]
    fn lines_arrive_whole_and_in_order() {
        let sink = Sink::default();
        sink.open(true);
        let w = LogWriter::spawn(1 << 20, sink.clone());
        for i in 0..1000 {
            w.push(format!("line {i}\n").as_bytes());
        }
        w.flush(Duration::from_secs(5));
        let got = String::from_utf8(sink.got.lock().clone()).unwrap();
        let want: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(got, want);
        assert_eq!(w.dropped(), 0);
    }

    /// A deferred line's format: its fields are a number, written in words.
    fn spell(fields: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(format!("deferred {}\n", fields[0]).as_bytes());
    }

    #[test]
    fn deferred_lines_are_formatted_by_the_writer_in_their_place() {
        let sink = Sink::default();
        sink.open(true);
        let w = LogWriter::spawn(1 << 20, sink.clone());
        for i in 0..100u8 {
            if i % 3 == 0 {
                w.push_deferred(spell, |buf| buf.push(i));
            } else {
                w.push(format!("line {i}\n").as_bytes());
            }
        }
        w.flush(Duration::from_secs(5));
        let got = String::from_utf8(sink.got.lock().clone()).unwrap();
        let want: String = (0..100)
            .map(|i| {
                if i % 3 == 0 {
                    format!("deferred {i}\n")
                } else {
                    format!("line {i}\n")
                }
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_deferred_line_without_room_is_dropped_whole_and_counted() {
        let sink = Sink::default();
        let w = LogWriter::spawn(10, sink.clone());
        // The writer takes the first line and blocks writing it.
        w.push(b"first\n");
        std::thread::sleep(Duration::from_millis(50));
        w.push_deferred(spell, |buf| buf.extend_from_slice(&[7; 8]));
        // Eight bytes of fields are in; these six would make fourteen.
        w.push_deferred(spell, |buf| buf.extend_from_slice(&[9; 6]));
        assert_eq!(w.dropped(), 1);
        sink.open(true);
        w.flush(Duration::from_secs(5));
        assert_eq!(sink.got.lock().as_slice(), b"first\ndeferred 7\n");
    }

    #[test]
    fn an_outsized_line_is_dropped_without_growing_the_buffer() {
        let sink = Sink::default();
        let w = LogWriter::spawn(100, sink.clone());
        w.push(&vec![b'x'; 1 << 20]);
        assert_eq!(w.dropped(), 1);
        assert!(w.shared.state.lock().lines.capacity() <= 100);
    }

    #[test]
    fn a_stalled_output_drops_lines_and_counts_them_without_blocking() {
        let sink = Sink::default();
        let w = LogWriter::spawn(100, sink.clone());
        // The writer takes the first line and blocks writing it; the
        // buffer then holds 100 bytes, ten lines; the rest are dropped.
        w.push(b"012345678\n");
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..50 {
            w.push(b"abcdefghi\n");
        }
        assert_eq!(w.dropped(), 40);
        sink.open(true);
        w.flush(Duration::from_secs(5));
        assert_eq!(sink.got.lock().len(), 110);
    }
}
