//! The access log: one line per request, written off the request path.
//!
//! Each line is the `fairway::access` event the log layer writes, in the
//! text or JSON form it would give it, byte for byte (a test holds the two
//! side by side). But where the layer formats on the thread that logs, here
//! the request's end only copies the line's fields into the log's buffer
//! (about a hundred bytes, `postcard`'s compact form); the log's own thread
//! formats them ([`LogWriter::push_deferred`]). The tracing formatter's
//! field visitor was about a tenth of the gateway's CPU.
//!
//! The line goes through `tracing` as before when it must: while traces are
//! on (it belongs to the request's span, and the trace layer keeps it as a
//! span event), when the log writes colour codes for a terminal, or when the
//! process has no log layer of ours (a library user's subscriber).
//!
//! [`LogWriter::push_deferred`]: crate::telemetry::log_writer::LogWriter::push_deferred

use std::io::Write;

use opentelemetry::trace::TraceId;
use serde::{Deserialize, Serialize};

use crate::outcome::Outcome;
use crate::telemetry::{LogFormat, log_writer, plain_log_format};

/// One request's access line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccessLine<'a> {
    /// When the request ended, in microseconds since the Unix epoch.
    pub unix_micros: i64,
    pub request_id: Option<&'a str>,
    /// The trace id, when there is one: the request span's or the caller's.
    pub trace_id: Option<u128>,
    pub tenant: &'a str,
    pub model: &'a str,
    pub adapter: Option<&'a str>,
    pub backend: &'a str,
    #[serde(with = "outcome_index")]
    pub outcome: Outcome,
    pub status: u16,
    pub queue_wait_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub e2e_ms: f64,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub prompt_tokens_estimate: u32,
    pub max_tokens: Option<u32>,
    pub stream: bool,
    pub preempted: u32,
    pub gpu_seconds: f64,
}

/// Milliseconds to the microsecond, GPU-seconds to the microsecond: the
/// numbers a line prints, without float noise (`0.038545`, not
/// `0.038544999999999996`).
fn micros(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn gpu(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

impl AccessLine<'_> {
    /// Logs the line: into the log's buffer for its thread to format, or
    /// through `tracing` inside `span` (see the module's doc).
    pub fn log(&self, span: &tracing::Span) {
        if span.is_none()
            && let Some(format) = plain_log_format()
        {
            if tracing::enabled!(target: "fairway::access", tracing::Level::INFO) {
                let format: log_writer::Format = match format {
                    LogFormat::Text => format_text,
                    LogFormat::Json => format_json,
                };
                log_writer::writer().push_deferred(format, |buf| {
                    let start = buf.len();
                    // Serialising these fields cannot fail; were it to, the
                    // line would be lost (its formatter skips what does not
                    // decode), not the buffer's other lines.
                    if postcard::serialize_with_flavor(self, Append(buf)).is_err() {
                        buf.truncate(start);
                    }
                });
            }
            return;
        }
        self.event(span);
    }

    /// The line as a `tracing` event.
    fn event(&self, span: &tracing::Span) {
        tracing::info!(
            target: "fairway::access",
            parent: span,
            request_id = self.request_id,
            trace_id = self.trace_id.map(|t| tracing::field::display(TraceId::from(t))),
            tenant = self.tenant,
            model = self.model,
            adapter = self.adapter,
            backend = %self.backend,
            outcome = self.outcome.as_str(),
            reason = self.outcome.reason(),
            status = self.status,
            queue_wait_ms = self.queue_wait_ms.map(micros),
            ttft_ms = self.ttft_ms.map(micros),
            e2e_ms = micros(self.e2e_ms),
            prompt_tokens = self.prompt_tokens,
            completion_tokens = self.completion_tokens,
            prompt_tokens_estimate = self.prompt_tokens_estimate,
            max_tokens = self.max_tokens,
            stream = self.stream,
            preempted = self.preempted,
            gpu_seconds = gpu(self.gpu_seconds),
            "request"
        );
    }

    /// The line as the text log layer writes it (without colour codes).
    pub fn write_text(&self, out: &mut Vec<u8>) {
        // Writing into a Vec cannot fail.
        let _ = self.try_write_text(out);
    }

    fn try_write_text(&self, out: &mut Vec<u8>) -> std::io::Result<()> {
        write_timestamp(out, self.unix_micros);
        out.extend_from_slice(b"  INFO fairway::access: request");
        if let Some(id) = self.request_id {
            write!(out, " request_id={id:?}")?;
        }
        if let Some(t) = self.trace_id {
            write!(out, " trace_id={}", TraceId::from(t))?;
        }
        write!(out, " tenant={:?} model={:?}", self.tenant, self.model)?;
        if let Some(a) = self.adapter {
            write!(out, " adapter={a:?}")?;
        }
        write!(
            out,
            " backend={} outcome={:?} reason={:?} status={}",
            self.backend,
            self.outcome.as_str(),
            self.outcome.reason(),
            self.status
        )?;
        if let Some(ms) = self.queue_wait_ms {
            write!(out, " queue_wait_ms={:?}", micros(ms))?;
        }
        if let Some(ms) = self.ttft_ms {
            write!(out, " ttft_ms={:?}", micros(ms))?;
        }
        write!(
            out,
            " e2e_ms={:?} prompt_tokens={} completion_tokens={} prompt_tokens_estimate={}",
            micros(self.e2e_ms),
            self.prompt_tokens,
            self.completion_tokens,
            self.prompt_tokens_estimate
        )?;
        if let Some(n) = self.max_tokens {
            write!(out, " max_tokens={n}")?;
        }
        writeln!(
            out,
            " stream={} preempted={} gpu_seconds={:?}",
            self.stream,
            self.preempted,
            gpu(self.gpu_seconds)
        )
    }

    /// The line as the JSON log layer writes it.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let mut timestamp = Vec::with_capacity(32);
        write_timestamp(&mut timestamp, self.unix_micros);
        let line = JsonLine {
            timestamp: std::str::from_utf8(&timestamp).unwrap_or_default(),
            level: "INFO",
            fields: JsonFields {
                message: "request",
                request_id: self.request_id,
                trace_id: self.trace_id.map(|t| TraceId::from(t).to_string()),
                tenant: self.tenant,
                model: self.model,
                adapter: self.adapter,
                backend: self.backend,
                outcome: self.outcome.as_str(),
                reason: self.outcome.reason(),
                status: self.status,
                queue_wait_ms: self.queue_wait_ms.map(micros),
                ttft_ms: self.ttft_ms.map(micros),
                e2e_ms: micros(self.e2e_ms),
                prompt_tokens: self.prompt_tokens,
                completion_tokens: self.completion_tokens,
                prompt_tokens_estimate: self.prompt_tokens_estimate,
                max_tokens: self.max_tokens,
                stream: self.stream,
                preempted: self.preempted,
                gpu_seconds: gpu(self.gpu_seconds),
            },
            target: "fairway::access",
        };
        // Writing into a Vec cannot fail, nor can serialising these types.
        let _ = serde_json::to_writer(&mut *out, &line);
        out.push(b'\n');
    }
}

/// `postcard`'s output appended to the log's buffer.
struct Append<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for Append<'_> {
    type Output = ();
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// The JSON layer's shape of an event: the fields in the order they are
/// recorded, absent ones left out.
#[derive(Serialize)]
struct JsonLine<'a> {
    timestamp: &'a str,
    level: &'a str,
    fields: JsonFields<'a>,
    target: &'a str,
}

#[derive(Serialize)]
struct JsonFields<'a> {
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<String>,
    tenant: &'a str,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    adapter: Option<&'a str>,
    backend: &'a str,
    outcome: &'a str,
    reason: &'a str,
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_wait_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttft_ms: Option<f64>,
    e2e_ms: f64,
    prompt_tokens: u32,
    completion_tokens: u32,
    prompt_tokens_estimate: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    stream: bool,
    preempted: u32,
    gpu_seconds: f64,
}

/// The log thread's formatters of an encoded [`AccessLine`]. A payload that
/// does not decode (it always does: this module wrote it) is skipped.
fn format_text(fields: &[u8], out: &mut Vec<u8>) {
    if let Ok(line) = postcard::from_bytes::<AccessLine<'_>>(fields) {
        line.write_text(out);
    }
}

fn format_json(fields: &[u8], out: &mut Vec<u8>) {
    if let Ok(line) = postcard::from_bytes::<AccessLine<'_>>(fields) {
        line.write_json(out);
    }
}

/// Writes `unix_micros` as the log layer's timestamps read: RFC 3339 in UTC
/// with microseconds, `2026-12-05T03:51:27.123456Z`.
fn write_timestamp(out: &mut Vec<u8>, unix_micros: i64) {
    let secs = unix_micros.div_euclid(1_000_000);
    let micros = unix_micros.rem_euclid(1_000_000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    );
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// An [`Outcome`] as its index in [`Outcome::ALL`].
mod outcome_index {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::outcome::Outcome;

    pub fn serialize<S: Serializer>(o: &Outcome, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(o.index() as u8)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Outcome, D::Error> {
        let i = u8::deserialize(d)?;
        Outcome::ALL
            .get(usize::from(i))
            .copied()
            .ok_or_else(|| serde::de::Error::custom("no such outcome"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::admission::LimitKind;
    use crate::outcome::RefusedBy;

    fn lines() -> Vec<AccessLine<'static>> {
        let full = AccessLine {
            unix_micros: 1_796_442_687_123_456,
            request_id: Some("0193a1b2-c3d4"),
            trace_id: Some(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736),
            tenant: "acme \"corp\"",
            model: "llama-3.1-8b",
            adapter: Some("sql-lora"),
            backend: "http://10.0.0.7:8000",
            outcome: Outcome::Served,
            status: 200,
            queue_wait_ms: Some(0.25),
            ttft_ms: Some(12.5),
            e2e_ms: 123.456_789,
            prompt_tokens: 42,
            completion_tokens: 20,
            prompt_tokens_estimate: 40,
            max_tokens: Some(64),
            stream: true,
            preempted: 1,
            gpu_seconds: 0.000_012_3,
        };
        let refused = AccessLine {
            unix_micros: 0,
            request_id: None,
            trace_id: None,
            tenant: "unknown",
            model: "unknown",
            adapter: None,
            backend: "",
            outcome: Outcome::Refused(RefusedBy::Limit(LimitKind::Rate)),
            status: 429,
            queue_wait_ms: None,
            ttft_ms: None,
            e2e_ms: 0.0,
            prompt_tokens: 0,
            completion_tokens: 0,
            prompt_tokens_estimate: 0,
            max_tokens: None,
            stream: false,
            preempted: 0,
            gpu_seconds: 1e20,
        };
        let odd = AccessLine {
            unix_micros: 4_102_444_800_000_001,
            tenant: "t\u{1b}[31m\n\u{e9}",
            e2e_ms: f64::NAN,
            outcome: Outcome::Error,
            ..full.clone()
        };
        vec![full, refused, odd]
    }

    /// The log layer's own output for `line`'s event, with its timestamp.
    fn from_tracing(line: &AccessLine<'_>, format: LogFormat) -> String {
        use tracing_subscriber::fmt::format::Writer;
        use tracing_subscriber::fmt::time::FormatTime;
        use tracing_subscriber::layer::SubscriberExt;

        struct At(String);
        impl FormatTime for At {
            fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
                w.write_str(&self.0)
            }
        }
        let mut ts = Vec::new();
        write_timestamp(&mut ts, line.unix_micros);
        let timer = At(String::from_utf8(ts).unwrap());
        let out = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sink = out.clone();
        let make = move || SinkWriter(sink.clone());
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(make)
            .with_ansi(false)
            .with_timer(timer);
        let dispatch = match format {
            LogFormat::Text => tracing::Dispatch::new(tracing_subscriber::registry().with(layer)),
            LogFormat::Json => {
                tracing::Dispatch::new(tracing_subscriber::registry().with(layer.json()))
            }
        };
        tracing::dispatcher::with_default(&dispatch, || line.event(&tracing::Span::none()));
        String::from_utf8(out.lock().clone()).unwrap()
    }

    struct SinkWriter(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);
    impl std::io::Write for SinkWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_read_as_the_log_layer_writes_them() {
        for line in lines() {
            let mut text = Vec::new();
            line.write_text(&mut text);
            assert_eq!(
                String::from_utf8(text).unwrap(),
                from_tracing(&line, LogFormat::Text)
            );
            let mut json = Vec::new();
            line.write_json(&mut json);
            assert_eq!(
                String::from_utf8(json).unwrap(),
                from_tracing(&line, LogFormat::Json)
            );
        }
    }

    /// Numbers print to the microsecond, without float noise.
    #[test]
    fn numbers_print_without_float_noise() {
        let line = AccessLine {
            queue_wait_ms: Some(0.038544999999999996),
            ttft_ms: Some(12.345_678_9),
            e2e_ms: 100.000_000_1,
            gpu_seconds: 0.300_000_000_000_000_04,
            ..lines()[0].clone()
        };
        let mut text = Vec::new();
        line.write_text(&mut text);
        let text = String::from_utf8(text).unwrap();
        for want in [
            "queue_wait_ms=0.039",
            "ttft_ms=12.346",
            "e2e_ms=100.0",
            "gpu_seconds=0.3\n",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        let mut json = Vec::new();
        line.write_json(&mut json);
        let json = String::from_utf8(json).unwrap();
        assert!(json.contains("\"queue_wait_ms\":0.039,"), "{json}");
    }

    #[test]
    fn a_line_comes_back_from_its_encoding_whole() {
        for line in lines() {
            let bytes = postcard::to_allocvec(&line).unwrap();
            let back: AccessLine<'_> = postcard::from_bytes(&bytes).unwrap();
            // NaN is not equal to itself: compare the formatted forms.
            let (mut a, mut b) = (Vec::new(), Vec::new());
            line.write_json(&mut a);
            back.write_json(&mut b);
            assert_eq!(a, b);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            format_text(&bytes, &mut a);
            line.write_text(&mut b);
            assert_eq!(a, b);
        }
    }

    #[test]
    fn timestamps_are_utc_dates() {
        let at = |micros: i64| {
            let mut v = Vec::new();
            write_timestamp(&mut v, micros);
            String::from_utf8(v).unwrap()
        };
        assert_eq!(at(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400_000_000), "2000-02-29T00:00:00.000000Z");
        assert_eq!(at(1_796_442_687_123_456), "2026-12-05T03:51:27.123456Z");
        assert_eq!(at(4_107_542_399_999_999), "2100-02-28T23:59:59.999999Z");
        assert_eq!(at(-1), "1969-12-31T23:59:59.999999Z");
    }
}
