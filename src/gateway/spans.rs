//! A request's trace spans: `fairway.request`, and the phase open now
//! (admission, queue, upstream, stream), on the gateway's own dispatch.

use http::{HeaderMap, HeaderValue};

use crate::gateway::state::Gateway;
use crate::telemetry::otel;

/// A request's spans: `fairway.request` and the phase open now.
///
/// They are created, replaced and dropped with the gateway's dispatch as
/// the default: when a child closes, the registry releases its parent
/// through the *default* dispatch, so a child closed under another one
/// would keep `fairway.request` open forever.
pub struct Spans {
    /// `fairway.admission`, then `fairway.queue`, `fairway.upstream`,
    /// `fairway.stream`: each closes as the next opens.
    pub phase: tracing::Span,
    pub request: tracing::Span,
    dispatch: Option<tracing::Dispatch>,
}

impl Drop for Spans {
    fn drop(&mut self) {
        if let Some(d) = &self.dispatch {
            let phase = std::mem::replace(&mut self.phase, tracing::Span::none());
            let request = std::mem::replace(&mut self.request, tracing::Span::none());
            tracing::dispatcher::with_default(d, || {
                drop(phase);
                drop(request);
            });
        }
    }
}

impl Spans {
    pub fn new(gw: &Gateway, headers: &HeaderMap, request_id: Option<&HeaderValue>) -> Spans {
        let Some(traces) = &gw.traces() else {
            return Spans {
                request: tracing::Span::none(),
                phase: tracing::Span::none(),
                dispatch: None,
            };
        };
        traces.in_scope(|| {
            let request = tracing::info_span!(
                target: "fairway::trace",
                "fairway.request",
                otel.kind = "server",
                otel.status_code = tracing::field::Empty,
                fairway.request_id = request_id.and_then(|v| v.to_str().ok()),
                fairway.tenant = tracing::field::Empty,
                fairway.model = tracing::field::Empty,
                fairway.backend = tracing::field::Empty,
                fairway.outcome = tracing::field::Empty,
                http.response.status_code = tracing::field::Empty,
            );
            otel::join_caller(&request, headers);
            let phase = tracing::info_span!(target: "fairway::trace", parent: &request, "fairway.admission");
            Spans {
                request,
                phase,
                dispatch: Some(traces.dispatch().clone()),
            }
        })
    }

    /// Closes the phase open now and opens `next` (a `Span::none()` when
    /// traces are off).
    pub fn next(&mut self, gw: &Gateway, next: SpanPhase) {
        let Some(traces) = &gw.traces() else { return };
        let parent = &self.request;
        let phase = &mut self.phase;
        traces.in_scope(|| {
            let old = std::mem::replace(phase, tracing::Span::none());
            drop(old);
            *phase = match next {
                SpanPhase::Queue => {
                    tracing::info_span!(target: "fairway::trace", parent: parent, "fairway.queue")
                }
                SpanPhase::Upstream { backend } => tracing::info_span!(
                    target: "fairway::trace",
                    parent: parent,
                    "fairway.upstream",
                    otel.kind = "client",
                    fairway.backend = backend,
                ),
                SpanPhase::Stream => tracing::info_span!(
                    target: "fairway::trace",
                    parent: parent,
                    "fairway.stream",
                    gen_ai.usage.input_tokens = tracing::field::Empty,
                    gen_ai.usage.output_tokens = tracing::field::Empty,
                ),
            };
        });
    }

    /// Writes the upstream span's context into the backend request's
    /// headers (traces on only: otherwise the caller's pass untouched).
    pub fn inject(&self, gw: &Gateway, headers: &mut HeaderMap) {
        if gw.traces().is_some() {
            otel::inject(&self.phase, headers);
        }
    }
}

/// The phases after admission, in order.
pub enum SpanPhase<'a> {
    Queue,
    Upstream { backend: &'a str },
    Stream,
}
