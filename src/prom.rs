//! The one Prometheus text format (0.0.4) writer: a metric family's
//! `# HELP` and `# TYPE` lines, then its samples and histograms
//! ([`Family`]), label values escaped as the format asks (`\\`, `\"`,
//! `\n`). The gateway's `/metrics`, the simulated engines' (vLLM's and
//! Triton's names) and placement's write through it; each keeps its own
//! number formatting (a value is written as its `Display` gives it: the
//! simulated vLLM prints values as Python's client does).

use std::borrow::Cow;
use std::fmt::{Display, Write};

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// Its `# TYPE` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Writes a family's `# HELP` and `# TYPE` lines, and returns the family
/// to write its samples under them.
pub fn family<'a>(out: &'a mut String, name: &'a str, kind: Kind, help: &str) -> Family<'a> {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {}", kind.as_str());
    Family { out, name }
}

/// A sample's labels: (name, value) pairs in the order written; values
/// are escaped, names are not.
pub type Labels<'l> = [(&'l str, &'l str)];

/// A family whose header is written: its samples go under it.
pub struct Family<'a> {
    out: &'a mut String,
    name: &'a str,
}

impl Family<'_> {
    /// Writes one sample, `name{labels} value` (`name value` without
    /// labels).
    pub fn sample(&mut self, labels: &Labels, value: impl Display) -> &mut Self {
        self.line("", labels, None, value);
        self
    }

    /// Writes one histogram's series: a cumulative `_bucket` per bound
    /// (`counts` holds each bucket's own count, one per bound), `+Inf`
    /// with `count` (every value, those past the last bound included),
    /// then `_sum` and `_count`.
    pub fn histogram(
        &mut self,
        labels: &Labels,
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
        count: u64,
    ) -> &mut Self {
        let mut cum = 0;
        for (b, c) in bounds.iter().zip(counts) {
            cum += c;
            self.line("_bucket", labels, Some(b), cum);
        }
        self.line("_bucket", labels, Some(&"+Inf"), count);
        self.line("_sum", labels, None, sum);
        self.line("_count", labels, None, count);
        self
    }

    /// `name` `suffix`, the labels and `le` (a bucket's bound) in braces
    /// when there are any, then the value.
    fn line(
        &mut self,
        suffix: &str,
        labels: &Labels,
        le: Option<&dyn Display>,
        value: impl Display,
    ) {
        let out = &mut *self.out;
        let _ = write!(out, "{}{suffix}", self.name);
        if !labels.is_empty() || le.is_some() {
            out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                let sep = if i == 0 { "" } else { "," };
                let _ = write!(out, "{sep}{k}=\"{}\"", escape(v));
            }
            if let Some(le) = le {
                let sep = if labels.is_empty() { "" } else { "," };
                let _ = write!(out, "{sep}le=\"{le}\"");
            }
            out.push('}');
        }
        let _ = writeln!(out, " {value}");
    }
}

/// A label value escaped for the text format; borrowed when nothing
/// needs escaping (nearly always).
pub fn escape(v: &str) -> Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return Cow::Borrowed(v);
    }
    Cow::Owned(
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_help_then_type_and_values_are_escaped() {
        let mut out = String::new();
        family(&mut out, "x_total", Kind::Counter, "Things.");
        assert_eq!(out, "# HELP x_total Things.\n# TYPE x_total counter\n");
        assert!(matches!(escape("plain"), Cow::Borrowed("plain")));
        assert_eq!(escape("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    }

    #[test]
    fn samples_and_histograms_are_written_under_their_family() {
        let mut out = String::new();
        family(&mut out, "x", Kind::Gauge, "X.")
            .sample(&[], 1.5)
            .sample(&[("a", "q\""), ("b", "2")], 3);
        family(&mut out, "h", Kind::Histogram, "H.")
            .histogram(&[], &[0.5, 1.0], &[1, 2], 2.25, 4)
            .histogram(&[("m", "n")], &[0.5], &[0], 1.0, 1);
        assert_eq!(
            out,
            "# HELP x X.\n# TYPE x gauge\nx 1.5\nx{a=\"q\\\"\",b=\"2\"} 3\n\
             # HELP h H.\n# TYPE h histogram\n\
             h_bucket{le=\"0.5\"} 1\nh_bucket{le=\"1\"} 3\nh_bucket{le=\"+Inf\"} 4\n\
             h_sum 2.25\nh_count 4\n\
             h_bucket{m=\"n\",le=\"0.5\"} 0\nh_bucket{m=\"n\",le=\"+Inf\"} 1\n\
             h_sum{m=\"n\"} 1\nh_count{m=\"n\"} 1\n"
        );
    }
}
