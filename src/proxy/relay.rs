//! Relays a backend's response body to the client frame by frame, never
//! buffering a stream. It only peeks: the time of the first byte (TTFT) and
//! the final `usage`. When Fairway itself asked the backend for usage (the
//! client streamed without `include_usage`), the usage-only chunk is dropped
//! so the client's stream is byte-for-byte what the backend would have sent
//! it. When the body ends — completely, with an error, or because the client
//! went away and dropped it — the [`Ticket`] is ended exactly once.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::core::ids::Usage;
use crate::proxy::body::BodyError;
use crate::proxy::openai::find;
use crate::proxy::ticket::{BodyEnd, Ticket};

/// Largest non-streaming body kept for reading `usage` (the body is relayed
/// regardless; past this size usage is not extracted).
const MAX_SCAN: usize = 4 << 20;

#[derive(Deserialize)]
struct UsageLite {
    #[serde(default)]
    prompt_tokens: u32,
    #[serde(default)]
    completion_tokens: u32,
}

#[derive(Deserialize)]
struct ChunkLite {
    #[serde(default)]
    choices: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    usage: Option<UsageLite>,
}

/// How to read the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One JSON document.
    Json,
    /// Server-sent events, passed through.
    Sse,
    /// Server-sent events; drop the usage-only chunk Fairway asked for.
    SseStripUsage,
}

pin_project_lite::pin_project! {
    /// The relayed body. Holds the request's ticket until it ends.
    pub struct RelayBody {
        #[pin]
        inner: hyper::body::Incoming,
        mode: Mode,
        // JSON: the body so far (up to `MAX_SCAN`), for its usage. SSE: the
        // start of an event not yet complete, held back (up to `MAX_HOLD`)
        // so that a stream cut by the backend ends on an event boundary.
        carry: BytesMut,
        // Passing on the rest of an event too long to hold.
        passing: bool,
        usage: Option<Usage>,
        ticket: Option<Ticket>,
        // Ended early by an error event: nothing more to send.
        ended: bool,
    }
}

impl RelayBody {
    /// Wraps a backend body.
    pub fn new(inner: hyper::body::Incoming, mode: Mode, ticket: Ticket) -> Self {
        RelayBody {
            inner,
            mode,
            carry: BytesMut::new(),
            passing: false,
            usage: None,
            ticket: Some(ticket),
            ended: false,
        }
    }
}

/// Longest part of an SSE event held back while waiting for its end; past
/// it the event is passed on as it comes (no usage chunk is that long).
const MAX_HOLD: usize = 64 << 10;

/// End of the next SSE event in `buf` (just past its blank line).
fn event_end(buf: &[u8]) -> Option<usize> {
    let lf = find(buf, b"\n\n").map(|i| i + 2);
    let crlf = find(buf, b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Reads one SSE event: returns its usage and whether it is usage-only.
fn inspect_event(event: &[u8]) -> (Option<Usage>, bool) {
    if find(event, b"\"usage\"").is_none() {
        return (None, false);
    }
    let mut usage = None;
    let mut usage_only = false;
    for line in event.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            continue;
        };
        if let Ok(chunk) = serde_json::from_slice::<ChunkLite>(data.trim_ascii_start())
            && let Some(u) = chunk.usage
        {
            usage = Some(Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            });
            usage_only = chunk.choices.is_some_and(|c| c.is_empty());
        }
    }
    (usage, usage_only)
}

/// The SSE event that ends a stream the backend cut, in OpenAI's shape
/// (the `openai` SDKs raise an `APIError` with this message; vLLM reports
/// its own errors mid-stream the same way).
pub fn error_event(cause: &str) -> Bytes {
    let body = serde_json::json!({
        "error": {
            "message": format!("The backend's stream broke before it ended: {cause}"),
            "type": "upstream_error",
            "param": null,
            "code": "upstream_stream_broken",
        }
    });
    Bytes::from(format!("data: {body}\n\n"))
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let mut this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        loop {
            let frame = match this.inner.as_mut().poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    let tail = finish(*this.mode, this.carry, this.usage, this.ticket);
                    return Poll::Ready(tail.map(|t| Ok(Frame::data(t))));
                }
                Poll::Ready(Some(Err(e))) => {
                    if let Some(t) = this.ticket.take() {
                        t.end(BodyEnd::UpstreamError(e.to_string()));
                    }
                    if *this.mode == Mode::Json {
                        // Nothing can be added to a JSON body: the client
                        // sees the connection cut.
                        return Poll::Ready(Some(Err(Box::new(e))));
                    }
                    // An SSE stream ends with an error event instead, after
                    // the last complete event (an incomplete one is dropped,
                    // as an SSE client would drop it at the end).
                    *this.ended = true;
                    this.carry.clear();
                    return Poll::Ready(Some(Ok(Frame::data(error_event(&e.to_string())))));
                }
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            let data = match frame.into_data() {
                Ok(d) => d,
                Err(frame) => return Poll::Ready(Some(Ok(frame))), // trailers pass through
            };
            if data.is_empty() {
                continue;
            }
            if let Some(t) = this.ticket.as_mut() {
                t.first_byte();
            }
            let out = scan(*this.mode, this.carry, this.passing, this.usage, data);
            // A body of known length may be dropped by hyper as soon as its
            // last byte is written, without another poll: end the ticket as
            // soon as the backend's body says it is complete.
            if this.inner.is_end_stream() {
                let tail = finish(*this.mode, this.carry, this.usage, this.ticket);
                let out = match (out, tail) {
                    (Some(a), Some(b)) => Some(Bytes::from([a, b].concat())),
                    (a, b) => a.or(b),
                };
                return Poll::Ready(out.map(|d| Ok(Frame::data(d))));
            }
            if let Some(out) = out {
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (self.ticket.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match self.mode {
            Mode::Json => self.inner.size_hint(),
            Mode::Sse | Mode::SseStripUsage => SizeHint::default(),
        }
    }
}

/// Ends the ticket once: reads the usage of a JSON body, and returns what
/// an SSE relay still held (a stream that ended inside an event).
fn finish(
    mode: Mode,
    carry: &mut BytesMut,
    usage: &mut Option<Usage>,
    ticket: &mut Option<Ticket>,
) -> Option<Bytes> {
    let t = ticket.take()?;
    let tail = tail(mode, carry, usage);
    t.end(BodyEnd::Complete { usage: *usage });
    tail
}

/// At the end of a body: reads the usage of a JSON body, and returns what
/// an SSE relay still held.
fn tail(mode: Mode, carry: &mut BytesMut, usage: &mut Option<Usage>) -> Option<Bytes> {
    match mode {
        Mode::Json => {
            if usage.is_none()
                && let Ok(c) = serde_json::from_slice::<ChunkLite>(carry)
            {
                *usage = c.usage.map(|u| Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                });
            }
            None
        }
        Mode::Sse | Mode::SseStripUsage => (!carry.is_empty()).then(|| carry.split().freeze()),
    }
}

/// Relays a whole body given as `frames`, as [`RelayBody`] would: what the
/// client receives, and the usage read. For the fuzz targets and tests.
pub fn relay_frames(mode: Mode, frames: &[Bytes]) -> (Vec<u8>, Option<Usage>) {
    let (mut carry, mut passing, mut usage) = (BytesMut::new(), false, None);
    let mut out = Vec::new();
    for f in frames.iter().filter(|f| !f.is_empty()) {
        if let Some(b) = scan(mode, &mut carry, &mut passing, &mut usage, f.clone()) {
            out.extend_from_slice(&b);
        }
    }
    if let Some(b) = tail(mode, &mut carry, &mut usage) {
        out.extend_from_slice(&b);
    }
    (out, usage)
}

/// Peeks at one data frame; returns the bytes to send on now. A JSON body
/// is sent on as it comes. An SSE body is sent on in complete events (less
/// the usage-only chunk when stripping); the start of the next event waits
/// in `carry`.
fn scan(
    mode: Mode,
    carry: &mut BytesMut,
    passing: &mut bool,
    usage: &mut Option<Usage>,
    data: Bytes,
) -> Option<Bytes> {
    if mode == Mode::Json {
        if carry.len() + data.len() <= MAX_SCAN {
            carry.extend_from_slice(&data);
        }
        return Some(data);
    }
    // Without a partial event waiting, the frame is read where it lies and
    // its complete events are sent on without a copy.
    let mut buf = if carry.is_empty() {
        data
    } else {
        carry.extend_from_slice(&data);
        carry.split().freeze()
    };
    let mut out = BytesMut::new();
    let mut sent = 0; // `buf[..sent]` is decided
    let mut pass_whole = true; // every event so far is sent on
    if *passing {
        // The rest of an event too long to hold: pass it on unread.
        match event_end(&buf) {
            Some(end) => {
                sent = end;
                *passing = false;
            }
            None => return Some(buf),
        }
    }
    while let Some(end) = event_end(&buf[sent..]) {
        let event = &buf[sent..sent + end];
        let (u, usage_only) = inspect_event(event);
        if let Some(u) = u {
            *usage = Some(u);
        }
        if usage_only && mode == Mode::SseStripUsage {
            if pass_whole {
                out.extend_from_slice(&buf[..sent]);
                pass_whole = false;
            }
        } else if !pass_whole {
            out.extend_from_slice(event);
        }
        sent += end;
    }
    let rest = &buf[sent..];
    if rest.len() > MAX_HOLD {
        // Not an event we need to read: stop holding it back.
        *passing = true;
        if !pass_whole {
            out.extend_from_slice(rest);
        }
    } else {
        carry.extend_from_slice(rest);
        buf.truncate(sent);
    }
    let out = if pass_whole { buf } else { out.freeze() };
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_usage_only_chunk() {
        let ev = b"data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n";
        assert_eq!(
            inspect_event(ev),
            (
                Some(Usage {
                    prompt_tokens: 9,
                    completion_tokens: 2
                }),
                true
            )
        );
        let ev = b"data: {\"choices\":[{\"index\":0}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n";
        assert!(!inspect_event(ev).1);
        assert_eq!(inspect_event(b"data: [DONE]\n\n"), (None, false));
    }

    #[test]
    fn event_boundaries() {
        assert_eq!(event_end(b"data: a\n\ndata: b"), Some(9));
        assert_eq!(event_end(b"data: a\r\n\r\n"), Some(11));
        assert_eq!(event_end(b"data: a\n"), None);
    }
}
