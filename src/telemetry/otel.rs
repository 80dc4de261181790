//! Traces on the OpenTelemetry SDK, bridged from `tracing`.
//!
//! Off unless `[telemetry] otlp_endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT`
//! names a collector. Then a gateway builds an [`SdkTracerProvider`] (batch
//! export over OTLP/HTTP protobuf, `http://ENDPOINT/v1/traces`) and a
//! `tracing` dispatch of its own, a registry with the
//! `tracing-opentelemetry` layer, and creates each request's spans on it
//! with the `tracing` macros: a server span `fairway.request` (tenant,
//! model, backend, outcome, status, request id) with children
//! `fairway.admission`, `fairway.queue`, `fairway.upstream` (a client span,
//! whose context the backend receives in `traceparent`/`tracestate`) and
//! `fairway.stream`.
//!
//! - A request with a valid `traceparent` joins the caller's trace; the
//!   sampler is parent-based (the caller's sampled flag decides), with
//!   `[telemetry] sample_ratio` (default 1.0) for traces that start here.
//! - The SDK reads the standard variables: `OTEL_BSP_*` (batch size, queue
//!   bound, delay), `OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`,
//!   `OTEL_TRACES_SAMPLER` (when `sample_ratio` is not set).
//! - The batch queue is bounded (`OTEL_BSP_MAX_QUEUE_SIZE`, default
//!   2,048 spans): when a collector is slow, spans are dropped, never the
//!   request path slowed. Shutdown flushes what is queued.
//!
//! Why a dispatch per gateway rather than the process's global subscriber:
//! a test binary runs several gateways, each with its own collector, and a
//! `tracing` span carries the dispatch it was created on, so nothing else
//! needs to know. The dispatch also holds the process's log layer (same
//! format and `RUST_LOG` filter), and each client connection runs under
//! it, so one span tree feeds both: a log line inside a request carries
//! the request span's fields, and the access log its `trace_id` and
//! `request_id`.
//!
//! The exporter's HTTP client is the gateway's own hyper client
//! (`HyperClient`): the SDK's batch processor runs on its own thread and
//! blocks on each export, and the request is handed to the gateway's tokio
//! runtime, so neither reqwest nor a second runtime is built in.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TraceId, TracerProvider};
use opentelemetry_http::{HeaderExtractor, HeaderInjector, HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Dispatch;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

use crate::config::TelemetryPolicy;
use crate::telemetry::LogFormat;

/// A gateway's traces: the SDK provider and the dispatch its spans use.
pub struct Traces {
    provider: SdkTracerProvider,
    dispatch: Dispatch,
}

impl fmt::Debug for Traces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Traces").finish_non_exhaustive()
    }
}

/// Why traces could not start.
#[derive(Debug, thiserror::Error)]
#[error("OTLP trace exporter: {0}")]
pub struct TracesError(#[from] opentelemetry_otlp::ExporterBuildError);

impl Traces {
    /// Starts the exporter for `policy`, or `None` when traces are off.
    /// Must run inside the tokio runtime that will carry the exports.
    pub fn start(
        policy: &TelemetryPolicy,
        client: crate::net::client::Client,
        log: Option<LogFormat>,
    ) -> Result<Option<Traces>, TracesError> {
        let Some(endpoint) = &policy.otlp_endpoint else {
            return Ok(None);
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("http://{endpoint}/v1/traces"))
            .with_http_client(HyperClient {
                client,
                runtime: tokio::runtime::Handle::current(),
            })
            .build()?;
        let mut builder = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(policy.service_name.clone())
                    .build(),
            );
        if let Some(ratio) = policy.sample_ratio {
            builder = builder.with_sampler(Sampler::ParentBased(Box::new(
                Sampler::TraceIdRatioBased(ratio),
            )));
        }
        let provider = builder.build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("fairway"));
        let dispatch = Dispatch::new(
            tracing_subscriber::registry()
                .with(layer)
                .with(log.map(super::log_layer)),
        );
        tracing::info!(%endpoint, "exporting traces over OTLP/HTTP (protobuf)");
        Ok(Some(Traces { provider, dispatch }))
    }

    /// The dispatch this gateway's spans are created on.
    pub fn dispatch(&self) -> &Dispatch {
        &self.dispatch
    }

    /// Runs `f` (which creates or drops spans) with this gateway's dispatch
    /// as the default.
    pub fn in_scope<T>(&self, f: impl FnOnce() -> T) -> T {
        tracing::dispatcher::with_default(&self.dispatch, f)
    }

    /// Exports what is queued and stops the exporter. Blocks: call it from
    /// a blocking task, never on a runtime thread.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!(error = %e, "trace exporter did not flush cleanly");
        }
    }
}

/// The caller's trace context from `traceparent`/`tracestate`, set as the
/// parent of `span`.
pub fn join_caller(span: &tracing::Span, headers: &HeaderMap) {
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    let _ = span.set_parent(cx);
}

/// Writes `span`'s context into `headers` as `traceparent`/`tracestate`
/// (replacing the caller's: the backend's parent is our span).
pub fn inject(span: &tracing::Span, headers: &mut HeaderMap) {
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeaderInjector(headers));
}

/// `span`'s trace id (traces on), if it has one.
pub fn trace_id(span: &tracing::Span) -> Option<TraceId> {
    let id = span.context().span().span_context().trace_id();
    (id != TraceId::INVALID).then_some(id)
}

/// The trace id of the caller's `traceparent`, if it sent a valid one.
pub fn caller_trace_id(headers: &HeaderMap) -> Option<TraceId> {
    if !headers.contains_key(TRACEPARENT) {
        return None;
    }
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    let id = cx.span().span_context().trace_id();
    (id != TraceId::INVALID).then_some(id)
}

const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// The OTLP exporter's HTTP client: the gateway's hyper client, run on the
/// gateway's runtime (the SDK's export thread has none).
#[derive(Clone)]
struct HyperClient {
    client: crate::net::client::Client,
    runtime: tokio::runtime::Handle,
}

impl fmt::Debug for HyperClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HyperClient")
    }
}

/// Longest one export may take, connection to last byte.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest collector response body read (the OTLP partial-success message).
const MAX_RESPONSE_BYTES: usize = 1 << 20;

#[async_trait::async_trait]
impl HttpClient for HyperClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let send = async move {
            let resp = client
                .request(request.map(http_body_util::Full::new))
                .await?;
            let (parts, body) = resp.into_parts();
            let body = http_body_util::Limited::new(body, MAX_RESPONSE_BYTES)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        // Built inside the task: the timer belongs to the gateway's runtime.
        let bounded = async move { tokio::time::timeout(EXPORT_TIMEOUT, send).await };
        self.runtime.spawn(bounded).await??
    }
}
