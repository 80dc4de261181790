//! Telemetry: Prometheus metrics (`metrics`), traces (`otel`) and the log
//! layer that the process and a traced gateway's dispatch share.

use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

pub mod log_writer;
pub mod metrics;
pub mod otel;
pub mod usage;

/// How logs are written: text or JSON lines, on stderr (through
/// [`log_writer`], off the request path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The log layer: `RUST_LOG` (default `info`) as its own filter, so that
/// it never hides spans from a trace layer beside it.
///
/// The `h2` crate's warnings are left out unless `RUST_LOG` names `h2`:
/// it writes one per misbehaving client connection (an HTTP/2 flood would
/// flood the log too); the gateway counts those connections and logs them
/// at most once a minute instead.
pub fn log_layer<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let spec = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned());
    let spec = if spec.contains("h2") {
        spec
    } else {
        format!("{spec},h2=error")
    };
    let filter = tracing_subscriber::EnvFilter::new(spec);
    // Colour codes only for a person at a terminal: in a file or a log
    // pipeline they are noise, and formatting them costs every request.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(log_writer::writer())
        .with_ansi(ansi);
    match format {
        LogFormat::Text => layer.with_filter(filter).boxed(),
        LogFormat::Json => layer.json().with_filter(filter).boxed(),
    }
}
