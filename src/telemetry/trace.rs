//! OpenTelemetry traces over OTLP/HTTP (JSON encoding), and W3C trace
//! context.
//!
//! Off unless `[telemetry] otlp_endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT`
//! names a collector; then each request yields one trace: a server span
//! `fairway.request` (tenant, model, backend, outcome, status) with
//! children `fairway.admission`, `fairway.queue`, `fairway.upstream` (a
//! client span whose id the backend receives as its parent in
//! `traceparent`) and `fairway.stream`. A request that arrives with a valid
//! `traceparent` joins the caller's trace.
//!
//! Spans go through a bounded channel to one exporter task that posts a
//! batch to `http://ENDPOINT/v1/traces` every second (or at 512 spans). A
//! full channel drops spans (counted) rather than slow the request path;
//! a collector that is down costs one failed POST a second. When tracing
//! is off none of this exists: the request path checks one `Option`.
//!
//! The exporter is written here rather than taken from the
//! `opentelemetry-otlp` crate: a JSON POST is all the gateway needs, and
//! the crate's SDK, gRPC stack and runtime glue would roughly double the
//! build on a two-core machine.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;

/// A trace id and the span that is the parent of ours, from `traceparent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub parent: Option<[u8; 8]>,
}

impl TraceContext {
    /// The caller's context from a `traceparent` header, or a new trace.
    pub fn from_header(value: Option<&str>) -> Self {
        value
            .and_then(parse_traceparent)
            .unwrap_or_else(|| TraceContext {
                trace_id: rand::random(),
                parent: None,
            })
    }
}

/// Parses a W3C `traceparent` (version 00): `00-<32 hex>-<16 hex>-<2 hex>`.
/// All-zero ids are invalid.
pub fn parse_traceparent(s: &str) -> Option<TraceContext> {
    let mut parts = s.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || parts.next().is_some() || flags.len() != 2 {
        return None;
    }
    let trace_id: [u8; 16] = hex(trace)?;
    let span_id: [u8; 8] = hex(span)?;
    u8::from_str_radix(flags, 16).ok()?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(TraceContext {
        trace_id,
        parent: Some(span_id),
    })
}

fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N
        || !s
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The `traceparent` that makes `span` the parent of the receiver's spans.
pub fn traceparent(trace_id: &[u8; 16], span: &[u8; 8]) -> String {
    format!("00-{}-{}-01", to_hex(trace_id), to_hex(span))
}

/// A new random span id.
pub fn span_id() -> [u8; 8] {
    rand::random()
}

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Float(f64),
}

/// Span kinds, as OTLP numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// One finished span.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub name: &'static str,
    pub kind: Kind,
    /// Unix nanoseconds.
    pub start: u64,
    pub end: u64,
    pub attributes: Vec<(&'static str, Value)>,
    /// Set on failed requests (OTLP status code 2).
    pub error: bool,
}

/// OTLP/HTTP JSON for `spans` of one service.
pub fn encode(service: &str, spans: &[Span]) -> String {
    let attr = |k: &str, v: &Value| {
        let v = match v {
            Value::Str(s) => serde_json::json!({ "stringValue": s }),
            // OTLP JSON carries 64-bit integers as strings.
            Value::Int(i) => serde_json::json!({ "intValue": i.to_string() }),
            Value::Float(f) => serde_json::json!({ "doubleValue": f }),
        };
        serde_json::json!({ "key": k, "value": v })
    };
    let spans: Vec<_> = spans
        .iter()
        .map(|s| {
            let mut j = serde_json::json!({
                "traceId": to_hex(&s.trace_id),
                "spanId": to_hex(&s.span_id),
                "name": s.name,
                "kind": s.kind as u8,
                "startTimeUnixNano": s.start.to_string(),
                "endTimeUnixNano": s.end.max(s.start).to_string(),
                "attributes": s.attributes.iter().map(|(k, v)| attr(k, v)).collect::<Vec<_>>(),
                "status": { "code": if s.error { 2 } else { 0 } },
            });
            if let Some(p) = s.parent {
                j["parentSpanId"] = serde_json::Value::String(to_hex(&p));
            }
            j
        })
        .collect();
    serde_json::json!({
        "resourceSpans": [{
            "resource": { "attributes": [attr("service.name", &Value::Str(service.to_owned()))] },
            "scopeSpans": [{
                "scope": { "name": "fairway", "version": env!("CARGO_PKG_VERSION") },
                "spans": spans,
            }],
        }],
    })
    .to_string()
}

const QUEUE: usize = 8192;
const BATCH: usize = 512;

/// The handle the request path sends finished spans to.
#[derive(Clone, Debug)]
pub struct Exporter {
    tx: mpsc::Sender<Vec<Span>>,
    dropped: Arc<AtomicU64>,
}

impl Exporter {
    /// Starts the exporter task posting to `http://{authority}/v1/traces`.
    pub fn start(authority: &str, service: String) -> Exporter {
        let (tx, rx) = mpsc::channel(QUEUE);
        let url = format!("http://{authority}/v1/traces");
        tokio::spawn(run(rx, url, service));
        Exporter {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Queues one request's spans; drops them if the queue is full.
    pub fn export(&self, spans: Vec<Span>) {
        if self.tx.try_send(spans).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Requests whose spans were dropped.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

async fn run(mut rx: mpsc::Receiver<Vec<Span>>, url: String, service: String) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut batch: Vec<Span> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut failing = false;
    loop {
        let closed = tokio::select! {
            got = rx.recv() => match got {
                Some(spans) => {
                    batch.extend(spans);
                    if batch.len() < BATCH {
                        continue;
                    }
                    false
                }
                None => true,
            },
            _ = tick.tick() => false,
        };
        if !batch.is_empty() {
            let body = encode(&service, &batch);
            batch.clear();
            let req = Request::post(&url)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body)));
            let ok = match req {
                Ok(req) => {
                    match tokio::time::timeout(Duration::from_secs(5), client.request(req)).await {
                        Ok(Ok(resp)) => {
                            let ok = resp.status().is_success();
                            let _ = resp.into_body().collect().await;
                            ok
                        }
                        _ => false,
                    }
                }
                Err(_) => false,
            };
            // Log a change of state, not every failed batch.
            if ok == failing {
                failing = !ok;
                if failing {
                    tracing::warn!(%url, "OTLP export failing; spans are being dropped");
                } else {
                    tracing::info!(%url, "OTLP export working");
                }
            }
        }
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_rejects_bad_headers() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = parse_traceparent(good).unwrap();
        assert_eq!(
            c.parent,
            Some([0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7])
        );
        assert_eq!(traceparent(&c.trace_id, &c.parent.unwrap()), good);
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
        let fresh = TraceContext::from_header(Some("garbage"));
        assert_eq!(fresh.parent, None);
        assert_ne!(fresh.trace_id, [0; 16]);
    }

    #[test]
    fn otlp_json_has_ids_times_attributes_and_parent() {
        let s = Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent: Some([3; 8]),
            name: "fairway.request",
            kind: Kind::Server,
            start: 10,
            end: 20,
            attributes: vec![
                ("fairway.tenant", Value::Str("api".into())),
                ("http.response.status_code", Value::Int(200)),
            ],
            error: false,
        };
        let v: serde_json::Value = serde_json::from_str(&encode("fw", &[s])).unwrap();
        let rs = &v["resourceSpans"][0];
        assert_eq!(
            rs["resource"]["attributes"][0]["value"]["stringValue"],
            "fw"
        );
        let span = &rs["scopeSpans"][0]["spans"][0];
        assert_eq!(span["traceId"], "01".repeat(16));
        assert_eq!(span["parentSpanId"], "03".repeat(8));
        assert_eq!(span["kind"], 2);
        assert_eq!(span["startTimeUnixNano"], "10");
        assert_eq!(span["attributes"][0]["value"]["stringValue"], "api");
        assert_eq!(span["attributes"][1]["value"]["intValue"], "200");
    }
}
