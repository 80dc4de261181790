//! The log's format and its tracing layer (text or JSON lines).

use std::sync::atomic::{AtomicU8, Ordering};

use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// How logs are written: text or JSON lines, on stderr (through
/// [`log_writer`], off the request path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The format of the process's log layer when it writes no colour codes;
/// 0 until [`log_layer`] makes one.
static PLAIN_FORMAT: AtomicU8 = AtomicU8::new(0);

/// The format in which the process's log layer writes, if it has made one
/// that writes no colour codes: code of our own may then write lines as it
/// would (`gateway::access`).
pub fn plain_log_format() -> Option<LogFormat> {
    match PLAIN_FORMAT.load(Ordering::Relaxed) {
        1 => Some(LogFormat::Text),
        2 => Some(LogFormat::Json),
        _ => None,
    }
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
    if !ansi {
        let code = match format {
            LogFormat::Text => 1,
            LogFormat::Json => 2,
        };
        PLAIN_FORMAT.store(code, Ordering::Relaxed);
    }
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(super::log_writer::writer().clone())
        .with_ansi(ansi);
    match format {
        LogFormat::Text => layer.with_filter(filter).boxed(),
        LogFormat::Json => layer.json().with_filter(filter).boxed(),
    }
}
