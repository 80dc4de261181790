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

use crate::core::ids::Usage;
use crate::gateway::scheduling::Pending;
use crate::gateway::ticket::{BodyEnd, Ticket};
use crate::net::body::BodyError;
use crate::protocol::openai::{error_event, find, preempted_event};
use crate::protocol::responses::response_id;
use crate::protocol::sse::{data_lines, event_end};
use crate::protocol::triton::{self, Answer, add_triton_event, triton_error_event};
use crate::protocol::upstream::UpstreamError;
use crate::protocol::usage::{ChunkLite, merge_usage};

/// Largest non-streaming body kept for reading `usage` (the body is relayed
/// regardless; past this size usage is not extracted).
const MAX_SCAN: usize = 4 << 20;

/// What the relay read of a body so far.
#[derive(Debug, Default, PartialEq)]
pub struct Seen {
    pub usage: Option<Usage>,
    /// A Responses API answer's id, not yet handed to the ticket.
    pub response_id: Option<String>,
    /// The error Triton sent under a 200 (the body, or a stream's first
    /// error event): the request failed.
    pub error: Option<String>,
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
    /// Triton's `infer` response (a classic tensor model): no output; the
    /// usage is the request's estimate, its size.
    TritonInfer,
    /// A Responses API response: as `Json`, and its `id` is remembered.
    ResponsesJson,
    /// A Responses API stream: as `Sse`, and the `id` of its
    /// `response.created` event is remembered.
    ResponsesSse,
}

impl Mode {
    /// One document rather than an event stream.
    pub fn is_json(self) -> bool {
        matches!(
            self,
            Mode::Json | Mode::TritonJson | Mode::TritonInfer | Mode::ResponsesJson
        )
    }

    fn is_triton(self) -> bool {
        matches!(self, Mode::TritonJson | Mode::TritonSse | Mode::TritonInfer)
    }
}

pin_project_lite::pin_project! {
    /// The relayed body. Holds the request's ticket until it ends.
    pub struct RelayBody {
        #[pin]
        inner: crate::gateway::connections::Body,
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
        // A resumable batch item's decisions: a `Preempt` cuts the stream.
        preempt: Option<Pending>,
    }
}

impl RelayBody {
    /// Wraps a backend body.
    pub fn new(inner: crate::gateway::connections::Body, mode: Mode, ticket: Ticket) -> Self {
        RelayBody {
            inner,
            mode,
            carry: BytesMut::new(),
            passing: false,
            seen: Seen::default(),
            ticket: Some(ticket),
            ended: false,
            preempt: None,
        }
    }

    /// A stream the scheduler may still preempt (a resumable batch item,
    /// `core::scheduler::Lane::Resumable`): on its `Preempt` the backend's
    /// body is dropped (which aborts the request in the engine) and the
    /// stream ends with a `preempted` error event after the last whole
    /// event, from which the batch runner resumes it.
    pub fn preemptible(mut self, pending: Pending) -> Self {
        self.preempt = Some(pending);
        self
    }
}

/// Longest part of an SSE event held back while waiting for its end; past
/// it the event is passed on as it comes (no usage chunk is that long).
const MAX_HOLD: usize = 64 << 10;

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
        if let Some(p) = this.preempt.as_mut()
            && p.poll_preempted(cx).is_ready()
        {
            *this.ended = true;
            *this.preempt = None;
            this.carry.clear();
            if let Some(t) = this.ticket.take() {
                t.end(BodyEnd::Preempted);
            }
            return Poll::Ready(Some(Ok(Frame::data(preempted_event()))));
        }
        loop {
            let frame = match this.inner.as_mut().poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    let tail = end_ticket(*this.mode, this.carry, this.seen, this.ticket);
                    return Poll::Ready(tail.map(|t| Ok(Frame::data(t))));
                }
                Poll::Ready(Some(Err(e))) => {
                    let e = UpstreamError::from(e);
                    if let Some(t) = this.ticket.take() {
                        t.end(BodyEnd::UpstreamError(&e));
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
                t.first_byte(this.preempt.is_some());
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
    t.end(match seen.error.take() {
        None => BodyEnd::Complete { usage: seen.usage },
        Some(message) => BodyEnd::ErrorBody(message),
    });
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
            match triton::answer(carry) {
                Answer::Tokens(n) => {
                    seen.usage = Some(Usage {
                        completion_tokens: n,
                        ..Usage::default()
                    });
                }
                Answer::Error(e) => seen.error = Some(e),
                Answer::Other => {}
            }
            None
        }
        Mode::TritonInfer => {
            // Charged by its size (the prompt estimate, set at the end).
            seen.usage = Some(Usage::default());
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
            add_triton_event(event, &mut seen.usage, &mut seen.error);
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
        // An error event counts nothing, and is the request's failure.
        let (_, seen) = relay_frames(
            Mode::TritonSse,
            &[Bytes::from(format!(
                "{}data: {{\"error\":\"x\"}}\n\n",
                ev(" a")
            ))],
        );
        assert_eq!(seen.usage.map(|u| u.completion_tokens), Some(1));
        assert_eq!(seen.error.as_deref(), Some("x"));
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
        // Triton's 200 for a decoupled model's several responses.
        let (out, seen) = relay_frames(
            Mode::TritonJson,
            &[Bytes::from_static(br#"{"error":"generate expects model to produce exactly 1 response, use generate stream"}"#)],
        );
        assert!(out.starts_with(b"{\"error\""));
        assert!(
            seen.error
                .is_some_and(|e| e.starts_with("generate expects"))
        );
        // An infer answer: no output, charged by the request's size.
        let infer = relay_frames(
            Mode::TritonInfer,
            &[Bytes::from_static(
                br#"{"outputs":[{"name":"y","datatype":"FP32","shape":[1],"data":[0.5]}]}"#,
            )],
        );
        assert_eq!(infer.1.usage, Some(Usage::default()));
    }

    #[test]
    fn finds_usage_only_chunk() {
        let ev = b"data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n";
        assert_eq!(
            inspect_event(ev),
            (
                Some(Usage {
                    prompt_tokens: 9,
                    completion_tokens: 2,
                    cached_tokens: None,
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
