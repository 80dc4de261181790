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
use crate::gateway::ticket::{BodyEnd, Ticket};
use crate::net::body::BodyError;
use crate::protocol::openai::find;

/// Largest non-streaming body kept for reading `usage` (the body is relayed
/// regardless; past this size usage is not extracted).
const MAX_SCAN: usize = 4 << 20;

/// A `usage` object in any of the shapes the routes give: OpenAI's
/// (`prompt_tokens`, `completion_tokens`), the Responses API's and
/// Anthropic's (`input_tokens`, `output_tokens`), or a pooling route's
/// `total_tokens` alone.
#[derive(Deserialize)]
struct UsageLite {
    #[serde(default)]
    prompt_tokens: Option<u32>,
    #[serde(default)]
    completion_tokens: Option<u32>,
    #[serde(default)]
    input_tokens: Option<u32>,
    #[serde(default)]
    output_tokens: Option<u32>,
    #[serde(default)]
    total_tokens: Option<u32>,
    /// An audio call's duration (vLLM's `{"type": "duration"}` usage).
    #[serde(default)]
    seconds: Option<f64>,
}

impl UsageLite {
    fn usage(&self) -> Usage {
        let prompt = self.prompt_tokens.or(self.input_tokens).unwrap_or(0);
        let completion = self.completion_tokens.or(self.output_tokens).unwrap_or(0);
        let prompt = match (self.total_tokens, self.seconds) {
            (Some(total), _) if prompt == 0 && completion == 0 => total,
            (_, Some(s)) if prompt == 0 => (s * crate::protocol::audio::TOKENS_PER_SECOND)
                .clamp(0.0, f64::from(u32::MAX)) as u32,
            _ => prompt,
        };
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
        }
    }
}

/// A usage object nested in an event: the Responses API's
/// `response.completed` (`response.usage`), Anthropic's `message_start`
/// (`message.usage`).
#[derive(Deserialize)]
struct NestedLite {
    #[serde(default)]
    usage: Option<UsageLite>,
}

#[derive(Deserialize)]
struct ChunkLite {
    #[serde(default)]
    choices: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    usage: Option<UsageLite>,
    #[serde(default)]
    response: Option<NestedLite>,
    #[serde(default)]
    message: Option<NestedLite>,
}

impl ChunkLite {
    /// The usage this document or event reports, wherever it has it.
    fn usage(&self) -> Option<Usage> {
        fn nested(n: &Option<NestedLite>) -> Option<&UsageLite> {
            n.as_ref().and_then(|n| n.usage.as_ref())
        }
        self.usage
            .as_ref()
            .or_else(|| nested(&self.response))
            .or_else(|| nested(&self.message))
            .map(UsageLite::usage)
    }
}

/// Adds a report to what was seen: a count that a later event gives
/// replaces the earlier one (Anthropic's `message_delta` carries the
/// output, its `message_start` the input; cumulative usage chunks grow).
fn merge_usage(seen: &mut Option<Usage>, u: Usage) {
    match seen {
        None => *seen = Some(u),
        Some(s) => {
            if u.prompt_tokens > 0 {
                s.prompt_tokens = u.prompt_tokens;
            }
            if u.completion_tokens > 0 {
                s.completion_tokens = u.completion_tokens;
            }
        }
    }
}

/// The id a Responses API answer gives its response: the document's `id`,
/// or an event's `response.id`.
#[derive(Deserialize)]
struct IdLite {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    response: Option<Box<IdLite>>,
}

fn response_id(json: &[u8]) -> Option<String> {
    let lite: IdLite = serde_json::from_slice(json).ok()?;
    match lite.response {
        Some(r) => r.id,
        None => lite.id,
    }
    .filter(|id| !id.is_empty())
}

/// What the relay read of a body so far.
#[derive(Debug, Default, PartialEq)]
pub struct Seen {
    pub usage: Option<Usage>,
    /// A Responses API answer's id, not yet handed to the ticket.
    pub response_id: Option<String>,
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
    /// Triton's generate response: the usage is its `num_output_tokens`
    /// (the vLLM backend's optional output) or the estimated tokens of its
    /// `text_output`.
    TritonJson,
    /// Triton's `generate_stream` events, passed through; the usage is the
    /// sum over events as for one response (at least one token each).
    TritonSse,
    /// A Responses API response: as `Json`, and its `id` is remembered.
    ResponsesJson,
    /// A Responses API stream: as `Sse`, and the `id` of its
    /// `response.created` event is remembered.
    ResponsesSse,
}

impl Mode {
    /// One document rather than an event stream.
    pub fn is_json(self) -> bool {
        matches!(self, Mode::Json | Mode::TritonJson | Mode::ResponsesJson)
    }

    fn is_triton(self) -> bool {
        matches!(self, Mode::TritonJson | Mode::TritonSse)
    }
}

#[derive(Deserialize)]
struct TritonLite {
    #[serde(default)]
    text_output: Option<serde_json::Value>,
    #[serde(default)]
    num_output_tokens: Option<serde_json::Value>,
}

/// The output tokens of one Triton response (or stream event): its
/// `num_output_tokens` where the model returns it, else the estimate of
/// its `text_output` (a string or a one-element array of one); `None` if
/// it is not a response (an error event).
fn triton_tokens(json: &[u8]) -> Option<u32> {
    let r: TritonLite = serde_json::from_slice(json).ok()?;
    let first = |v: &serde_json::Value| match v {
        serde_json::Value::Array(a) if a.len() == 1 => a[0].clone(),
        v => v.clone(),
    };
    if let Some(n) = r
        .num_output_tokens
        .as_ref()
        .map(first)
        .and_then(|v| v.as_u64())
    {
        return Some(u32::try_from(n).unwrap_or(u32::MAX));
    }
    match r.text_output.as_ref().map(first)? {
        serde_json::Value::String(t) => Some(crate::tokens::estimate(&t).max(1)),
        _ => None,
    }
}

/// Adds one stream event's output tokens to `usage`.
fn add_triton_event(event: &[u8], usage: &mut Option<Usage>) {
    for data in data_lines(event) {
        if let Some(n) = triton_tokens(data) {
            let u = usage.get_or_insert(Usage {
                prompt_tokens: 0,
                completion_tokens: 0,
            });
            u.completion_tokens = u.completion_tokens.saturating_add(n);
        }
    }
}

pin_project_lite::pin_project! {
    /// The relayed body. Holds the request's ticket until it ends.
    pub struct RelayBody {
        #[pin]
        inner: crate::gateway::pool::Body,
        mode: Mode,
        // JSON: the body so far (up to `MAX_SCAN`), for its usage. SSE: the
        // start of an event not yet complete, held back (up to `MAX_HOLD`)
        // so that a stream cut by the backend ends on an event boundary.
        carry: BytesMut,
        // Passing on the rest of an event too long to hold.
        passing: bool,
        seen: Seen,
        ticket: Option<Ticket>,
        // Ended early by an error event: nothing more to send.
        ended: bool,
    }
}

impl RelayBody {
    /// Wraps a backend body.
    pub fn new(inner: crate::gateway::pool::Body, mode: Mode, ticket: Ticket) -> Self {
        RelayBody {
            inner,
            mode,
            carry: BytesMut::new(),
            passing: false,
            seen: Seen::default(),
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

/// The `data:` lines of one SSE event.
fn data_lines(event: &[u8]) -> impl Iterator<Item = &[u8]> {
    event.split(|b| *b == b'\n').filter_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        line.strip_prefix(b"data:").map(<[u8]>::trim_ascii_start)
    })
}

/// Reads one SSE event: returns its usage and whether it is usage-only.
fn inspect_event(event: &[u8]) -> (Option<Usage>, bool) {
    if find(event, b"\"usage\"").is_none() {
        return (None, false);
    }
    let mut usage = None;
    let mut usage_only = false;
    for data in data_lines(event) {
        if let Ok(chunk) = serde_json::from_slice::<ChunkLite>(data)
            && let Some(u) = chunk.usage()
        {
            usage = Some(u);
            usage_only = chunk.choices.is_some_and(|c| c.is_empty());
        }
    }
    (usage, usage_only)
}

/// The event that ends a Triton stream the backend cut: Triton's own
/// in-stream error shape, `data: {"error": "..."}`.
pub fn triton_error_event(cause: &str) -> Bytes {
    let body = serde_json::json!({
        "error": format!("The backend's stream broke: {cause}")
    });
    Bytes::from(format!("data: {body}\n\n"))
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
                    let tail = end_ticket(*this.mode, this.carry, this.seen, this.ticket);
                    return Poll::Ready(tail.map(|t| Ok(Frame::data(t))));
                }
                Poll::Ready(Some(Err(e))) => {
                    if let Some(t) = this.ticket.take() {
                        t.end(BodyEnd::UpstreamError(e.to_string()));
                    }
                    if this.mode.is_json() {
                        // Nothing can be added to a JSON body: the client
                        // sees the connection cut.
                        return Poll::Ready(Some(Err(Box::new(e))));
                    }
                    // An SSE stream ends with an error event instead, after
                    // the last complete event (an incomplete one is dropped,
                    // as an SSE client would drop it at the end).
                    *this.ended = true;
                    this.carry.clear();
                    let event = if this.mode.is_triton() {
                        triton_error_event(&e.to_string())
                    } else {
                        error_event(&e.to_string())
                    };
                    return Poll::Ready(Some(Ok(Frame::data(event))));
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
            let out = scan(*this.mode, this.carry, this.passing, this.seen, data);
            if let Some(id) = this.seen.response_id.take()
                && let Some(t) = this.ticket.as_ref()
            {
                t.response_created(id);
            }
            // A body of known length may be dropped by hyper as soon as its
            // last byte is written, without another poll: end the ticket as
            // soon as the backend's body says it is complete.
            if this.inner.is_end_stream() {
                let tail = end_ticket(*this.mode, this.carry, this.seen, this.ticket);
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
        if self.mode.is_json() {
            self.inner.size_hint()
        } else {
            SizeHint::default()
        }
    }
}

/// Ends the ticket once: reads the usage of a JSON body, and returns what
/// an SSE relay still held (a stream that ended inside an event).
fn end_ticket(
    mode: Mode,
    carry: &mut BytesMut,
    seen: &mut Seen,
    ticket: &mut Option<Ticket>,
) -> Option<Bytes> {
    let t = ticket.take()?;
    let tail = tail(mode, carry, seen);
    if mode.is_triton()
        && let Some(u) = seen.usage.as_mut()
    {
        // Triton reports no prompt count: Fairway's estimate stands in.
        u.prompt_tokens = t.prompt_estimate();
    }
    if let Some(id) = seen.response_id.take() {
        t.response_created(id);
    }
    t.end(BodyEnd::Complete { usage: seen.usage });
    tail
}

/// At the end of a body: reads the usage (and a response's id) of a JSON
/// body, and returns what an SSE relay still held.
fn tail(mode: Mode, carry: &mut BytesMut, seen: &mut Seen) -> Option<Bytes> {
    match mode {
        Mode::Json | Mode::ResponsesJson => {
            if seen.usage.is_none()
                && let Ok(c) = serde_json::from_slice::<ChunkLite>(carry)
            {
                seen.usage = c.usage();
            }
            if mode == Mode::ResponsesJson {
                seen.response_id = response_id(carry);
            }
            None
        }
        Mode::TritonJson => {
            if let Some(n) = triton_tokens(carry) {
                seen.usage = Some(Usage {
                    prompt_tokens: 0,
                    completion_tokens: n,
                });
            }
            None
        }
        Mode::Sse | Mode::SseStripUsage | Mode::TritonSse | Mode::ResponsesSse => {
            (!carry.is_empty()).then(|| carry.split().freeze())
        }
    }
}

/// Relays a whole body given as `frames`, as [`RelayBody`] would: what the
/// client receives, and what was read of it. For the fuzz targets and tests.
pub fn relay_frames(mode: Mode, frames: &[Bytes]) -> (Vec<u8>, Seen) {
    let (mut carry, mut passing, mut seen) = (BytesMut::new(), false, Seen::default());
    let mut out = Vec::new();
    for f in frames.iter().filter(|f| !f.is_empty()) {
        if let Some(b) = scan(mode, &mut carry, &mut passing, &mut seen, f.clone()) {
            out.extend_from_slice(&b);
        }
    }
    if let Some(b) = tail(mode, &mut carry, &mut seen) {
        out.extend_from_slice(&b);
    }
    (out, seen)
}

/// Peeks at one data frame; returns the bytes to send on now. A JSON body
/// is sent on as it comes. An SSE body is sent on in complete events (less
/// the usage-only chunk when stripping); the start of the next event waits
/// in `carry`.
fn scan(
    mode: Mode,
    carry: &mut BytesMut,
    passing: &mut bool,
    seen: &mut Seen,
    data: Bytes,
) -> Option<Bytes> {
    if mode.is_json() {
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
        if mode == Mode::TritonSse {
            add_triton_event(event, &mut seen.usage);
            sent += end;
            continue;
        }
        if mode == Mode::ResponsesSse && find(event, b"\"response.created\"").is_some() {
            seen.response_id = data_lines(event).find_map(response_id);
        }
        let (u, usage_only) = inspect_event(event);
        if let Some(u) = u {
            merge_usage(&mut seen.usage, u);
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
    fn triton_streams_pass_untouched_and_count_their_tokens() {
        let ev = |t: &str| {
            format!(
                "data: {{\"model_name\":\"m\",\"model_version\":\"1\",\"text_output\":\"{t}\"}}\n\n"
            )
        };
        let whole = [ev(" tok"), ev(" tok"), ev(" tok")].concat();
        // Split anywhere: the same bytes out, three tokens counted.
        let frames: Vec<Bytes> = whole
            .as_bytes()
            .chunks(7)
            .map(Bytes::copy_from_slice)
            .collect();
        let (out, seen) = relay_frames(Mode::TritonSse, &frames);
        assert_eq!(out, whole.as_bytes());
        assert_eq!(seen.usage.map(|u| u.completion_tokens), Some(3));
        // An error event counts nothing.
        let (_, seen) = relay_frames(
            Mode::TritonSse,
            &[Bytes::from("data: {\"error\":\"x\"}\n\n")],
        );
        assert_eq!(seen.usage, None);
    }

    #[test]
    fn triton_responses_count_num_output_tokens_or_the_text() {
        let one = |body: &str| {
            relay_frames(Mode::TritonJson, &[Bytes::from(body.to_owned())])
                .1
                .usage
        };
        let text = one(r#"{"model_name":"m","model_version":"1","text_output":"a b c d e f g h"}"#);
        assert!(text.is_some_and(|u| u.completion_tokens >= 2));
        let counted = one(r#"{"text_output":["x"],"num_output_tokens":[42]}"#);
        assert_eq!(counted.map(|u| u.completion_tokens), Some(42));
        assert_eq!(one(r#"{"error":"bad"}"#), None);
    }

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
