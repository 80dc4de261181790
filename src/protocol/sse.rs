//! Server-sent events as the relay reads them: where an event ends, and
//! its `data:` lines.

use super::openai::find;

/// End of the next SSE event in `buf` (just past its blank line).
pub fn event_end(buf: &[u8]) -> Option<usize> {
    let lf = find(buf, b"\n\n").map(|i| i + 2);
    let crlf = find(buf, b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The `data:` lines of one SSE event.
pub fn data_lines(event: &[u8]) -> impl Iterator<Item = &[u8]> {
    event.split(|b| *b == b'\n').filter_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        line.strip_prefix(b"data:").map(<[u8]>::trim_ascii_start)
    })
}
