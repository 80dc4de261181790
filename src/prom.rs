//! The one Prometheus text format (0.0.4) writer: a metric family's
//! `# HELP` and `# TYPE` lines, and label values escaped as the format
//! asks (`\\`, `\"`, `\n`). The gateway's `/metrics`, the simulated
//! engines' (vLLM's and Triton's names) and placement's write through it;
//! each keeps its own number formatting (the simulated vLLM prints values
//! as Python's client does).

use std::borrow::Cow;
use std::fmt::Write;

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

/// Writes a family's `# HELP` and `# TYPE` lines.
pub fn family(out: &mut String, name: &str, kind: Kind, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {}", kind.as_str());
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
}
