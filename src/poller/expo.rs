//! A hand-written parser for the Prometheus text exposition format 0.0.4,
//! which also accepts the parts of OpenMetrics 1.0 that a scraper meets.
//!
//! What it reads:
//! - sample lines `name{label="value",...} value [timestamp]`, where the name
//!   may contain `:` (vLLM, SGLang and llama.cpp all use `prefix:name`), the
//!   label set may end with a comma, label values may hold the escapes `\\`,
//!   `\"` and `\n`, and the value may be any float including `NaN`, `+Inf`
//!   and `-Inf`;
//! - Prometheus 3 quoted names: `{"my.metric", "a.label"="v"} 1`;
//! - `# HELP`, `# TYPE` and `# UNIT` lines (TYPE is kept, the others are only
//!   checked for a name), other `#` lines as comments, and `# EOF`, after
//!   which the rest of the body is ignored;
//! - exemplars after a value or timestamp (`... 8 # {trace_id="a"} 0.43`),
//!   which are skipped without being checked;
//! - blank lines, leading spaces or tabs, and CRLF line ends.
//!
//! The timestamp is kept as written: milliseconds in the Prometheus format,
//! seconds in OpenMetrics. The parser does not check family rules (TYPE
//! before samples, contiguous families, one HELP per name); a scraper gains
//! nothing from refusing a body for breaking them.
//!
//! Error policy: [`parse`] is lenient. A malformed line is skipped and
//! counted in [`Exposition::malformed`], with the first such error kept in
//! [`Exposition::first_error`], so one odd series cannot blind the gateway
//! to the rest of a scrape. `parse` returns `Err` only when the body had
//! malformed lines and not a single good sample (an HTML error page, JSON, a
//! truncated binary), which is what "this is not an exposition" looks like.
//! [`parse_strict`] instead fails on the first malformed line.
//!
//! The parser is total: every input gives `Ok` or `Err`, never a panic. It
//! only slices the text at ASCII bytes, which are always `char` boundaries.

use std::fmt;

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The full sample name, suffix included (`x_bucket`, `x_total`, `x_created`).
    pub name: String,
    /// Labels in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    pub value: f64,
    /// The timestamp as written (Prometheus: milliseconds; OpenMetrics: seconds).
    pub timestamp: Option<f64>,
}

impl Sample {
    /// The value of the first label called `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A family type from a `# TYPE` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    /// `untyped` (Prometheus) or `unknown` (OpenMetrics).
    Untyped,
    StateSet,
    Info,
    GaugeHistogram,
}

impl MetricType {
    fn from_word(word: &str) -> Option<Self> {
        Some(match word {
            "counter" => MetricType::Counter,
            "gauge" => MetricType::Gauge,
            "histogram" => MetricType::Histogram,
            "summary" => MetricType::Summary,
            "untyped" | "unknown" => MetricType::Untyped,
            "stateset" => MetricType::StateSet,
            "info" => MetricType::Info,
            "gaugehistogram" => MetricType::GaugeHistogram,
            _ => return None,
        })
    }
}

/// What a body parsed to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Exposition {
    /// Good samples, in body order.
    pub samples: Vec<Sample>,
    /// `# TYPE` declarations, in body order: (family name, type).
    pub types: Vec<(String, MetricType)>,
    /// Malformed lines skipped.
    pub malformed: usize,
    /// The first malformed line's error, when there was one.
    pub first_error: Option<ParseError>,
    /// Whether the body ended with an OpenMetrics `# EOF` line.
    pub eof: bool,
}

impl Exposition {
    /// The declared type of family `name`, if a `# TYPE` line gave one.
    pub fn metric_type(&self, name: &str) -> Option<MetricType> {
        self.types.iter().find(|(n, _)| n == name).map(|(_, t)| *t)
    }
}

/// A malformed line: where and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {kind}")]
pub struct ParseError {
    /// 1-based line number in the body.
    pub line: usize,
    pub kind: ErrorKind,
}

/// Why a line is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ErrorKind {
    #[error("no metric name")]
    MissingName,
    #[error("bad label set")]
    BadLabels,
    #[error("unterminated quoted string")]
    Unterminated,
    #[error("invalid escape sequence")]
    BadEscape,
    #[error("no value")]
    MissingValue,
    #[error("value is not a number")]
    BadValue,
    #[error("timestamp is not a finite number")]
    BadTimestamp,
    #[error("unexpected text after the sample")]
    TrailingText,
    #[error("bad # TYPE line")]
    BadType,
    #[error("bad # HELP or # UNIT line")]
    BadHelp,
}

/// Parses a body leniently: malformed lines are skipped and counted.
///
/// Returns `Err` (the first malformed line) only when there were malformed
/// lines and no good sample at all. An empty body is `Ok` with no samples.
pub fn parse(text: &str) -> Result<Exposition, ParseError> {
    let expo = parse_inner(text, false)?;
    match expo.first_error {
        Some(e) if expo.samples.is_empty() => Err(e),
        _ => Ok(expo),
    }
}

/// Parses a body strictly: the first malformed line is an error.
pub fn parse_strict(text: &str) -> Result<Exposition, ParseError> {
    parse_inner(text, true)
}

fn parse_inner(text: &str, strict: bool) -> Result<Exposition, ParseError> {
    let mut expo = Exposition::default();
    for (index, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let line = line.trim_start_matches([' ', '\t']);
        let outcome = match parse_line(line) {
            Ok(Line::Blank) => Ok(()),
            Ok(Line::Eof) => {
                expo.eof = true;
                break;
            }
            Ok(Line::Type(name, ty)) => {
                expo.types.push((name, ty));
                Ok(())
            }
            Ok(Line::Sample(s)) => {
                expo.samples.push(s);
                Ok(())
            }
            Err(kind) => Err(ParseError {
                line: index + 1,
                kind,
            }),
        };
        if let Err(e) = outcome {
            if strict {
                return Err(e);
            }
            expo.malformed += 1;
            expo.first_error.get_or_insert(e);
        }
    }
    Ok(expo)
}

/// One classified line.
enum Line {
    /// Blank, a comment, `# HELP` or `# UNIT`.
    Blank,
    Eof,
    Type(String, MetricType),
    Sample(Sample),
}

fn parse_line(line: &str) -> Result<Line, ErrorKind> {
    if line.is_empty() {
        return Ok(Line::Blank);
    }
    if let Some(rest) = line.strip_prefix('#') {
        return parse_hash_line(rest);
    }
    parse_sample(line).map(Line::Sample)
}

/// A line that began with `#`; `rest` follows the `#`.
fn parse_hash_line(rest: &str) -> Result<Line, ErrorKind> {
    let mut c = Cursor::new(rest);
    c.skip_blanks();
    let keyword = c.token();
    match keyword {
        "EOF" => {
            c.skip_blanks();
            if c.at_end() {
                Ok(Line::Eof)
            } else {
                Ok(Line::Blank)
            }
        }
        "TYPE" => {
            if !c.skip_blanks() {
                return Err(ErrorKind::BadType);
            }
            let name = c.family_name().map_err(|_| ErrorKind::BadType)?;
            if !c.skip_blanks() {
                return Err(ErrorKind::BadType);
            }
            let ty = MetricType::from_word(c.token()).ok_or(ErrorKind::BadType)?;
            c.skip_blanks();
            if !c.at_end() {
                return Err(ErrorKind::BadType);
            }
            Ok(Line::Type(name, ty))
        }
        "HELP" | "UNIT" => {
            if !c.skip_blanks() {
                return Err(ErrorKind::BadHelp);
            }
            c.family_name().map_err(|_| ErrorKind::BadHelp)?;
            Ok(Line::Blank)
        }
        _ => Ok(Line::Blank),
    }
}

fn parse_sample(line: &str) -> Result<Sample, ErrorKind> {
    let mut c = Cursor::new(line);
    let mut name = None;
    if c.peek().is_some_and(is_name_start) {
        name = Some(c.legacy_name(true).to_owned());
    }
    let mut labels = Vec::new();
    // Blanks may separate the name from its label set.
    let mut blank = c.skip_blanks();
    if c.eat(b'{') {
        parse_labels(&mut c, &mut name, &mut labels)?;
        blank = c.skip_blanks();
    }
    let name = name.ok_or(ErrorKind::MissingName)?;
    if !blank {
        return Err(if c.at_end() {
            ErrorKind::MissingValue
        } else {
            ErrorKind::BadLabels
        });
    }
    let value = parse_float(c.token()).ok_or(ErrorKind::BadValue)?;
    let mut timestamp = None;
    c.skip_blanks();
    if !c.at_end() && c.peek() != Some(b'#') {
        let ts = parse_float(c.token()).filter(|t| t.is_finite());
        timestamp = Some(ts.ok_or(ErrorKind::BadTimestamp)?);
        c.skip_blanks();
    }
    // Anything left must be an exemplar, which we skip unchecked.
    if !c.at_end() && c.peek() != Some(b'#') {
        return Err(ErrorKind::TrailingText);
    }
    Ok(Sample {
        name,
        labels,
        value,
        timestamp,
    })
}

/// Parses the inside of `{...}`, the `{` already consumed.
fn parse_labels(
    c: &mut Cursor<'_>,
    name: &mut Option<String>,
    labels: &mut Vec<(String, String)>,
) -> Result<(), ErrorKind> {
    let mut first = true;
    loop {
        c.skip_blanks();
        if c.eat(b'}') {
            return Ok(());
        }
        let key = match c.peek() {
            Some(b'"') => c.quoted()?,
            Some(b) if is_label_start(b) => c.legacy_name(false).to_owned(),
            _ => return Err(ErrorKind::BadLabels),
        };
        c.skip_blanks();
        if c.eat(b'=') {
            c.skip_blanks();
            if c.peek() != Some(b'"') {
                return Err(ErrorKind::BadLabels);
            }
            let value = c.quoted()?;
            if key.is_empty() {
                return Err(ErrorKind::BadLabels);
            }
            labels.push((key, value));
        } else if first && name.is_none() && c.quoted_last && !key.is_empty() {
            // A Prometheus 3 quoted metric name, first in the braces.
            *name = Some(key);
        } else {
            return Err(ErrorKind::BadLabels);
        }
        first = false;
        c.skip_blanks();
        if c.eat(b',') {
            continue;
        }
        if c.eat(b'}') {
            return Ok(());
        }
        return Err(ErrorKind::BadLabels);
    }
}

/// Parses a Go-style float: decimal, `NaN`, `+Inf`, `-Inf` (any case).
pub fn parse_float(token: &str) -> Option<f64> {
    if token.is_empty() {
        return None;
    }
    token.parse::<f64>().ok()
}

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

fn is_label_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

/// A position in one line. Only ever advanced past ASCII bytes or to
/// positions found by searching for ASCII bytes, so slices stay on `char`
/// boundaries.
struct Cursor<'a> {
    s: &'a str,
    i: usize,
    /// Whether the last name read was a quoted string.
    quoted_last: bool,
}

impl<'a> Cursor<'a> {
    fn new(s: &'a str) -> Self {
        Cursor {
            s,
            i: 0,
            quoted_last: false,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.i).copied()
    }

    fn at_end(&self) -> bool {
        self.i >= self.s.len()
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// Skips spaces and tabs; whether any were skipped.
    fn skip_blanks(&mut self) -> bool {
        let start = self.i;
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
        self.i > start
    }

    /// The text up to the next space, tab or end.
    fn token(&mut self) -> &'a str {
        let rest = self.s.get(self.i..).unwrap_or("");
        let len = rest.find([' ', '\t']).unwrap_or(rest.len());
        self.i += len;
        rest.get(..len).unwrap_or("")
    }

    /// `[a-zA-Z_:][a-zA-Z0-9_:]*` (colons only when `colons`); the first
    /// byte has been checked by the caller.
    fn legacy_name(&mut self, colons: bool) -> &'a str {
        self.quoted_last = false;
        let start = self.i;
        while let Some(b) = self.peek() {
            if b.is_ascii_alphanumeric() || b == b'_' || (colons && b == b':') {
                self.i += 1;
            } else {
                break;
            }
        }
        self.s.get(start..self.i).unwrap_or("")
    }

    /// A metric family name on a `# TYPE`/`# HELP` line: legacy or quoted.
    fn family_name(&mut self) -> Result<String, ErrorKind> {
        match self.peek() {
            Some(b'"') => {
                let name = self.quoted()?;
                if name.is_empty() {
                    Err(ErrorKind::MissingName)
                } else {
                    Ok(name)
                }
            }
            Some(b) if is_name_start(b) => Ok(self.legacy_name(true).to_owned()),
            _ => Err(ErrorKind::MissingName),
        }
    }

    /// A double-quoted string with `\\`, `\"` and `\n` escapes; the cursor
    /// is on the opening quote.
    fn quoted(&mut self) -> Result<String, ErrorKind> {
        self.quoted_last = true;
        self.i += 1;
        let mut out = String::new();
        loop {
            let rest = self.s.get(self.i..).unwrap_or("");
            let Some(p) = rest.find(['"', '\\']) else {
                return Err(ErrorKind::Unterminated);
            };
            out.push_str(rest.get(..p).unwrap_or(""));
            self.i += p;
            if self.eat(b'"') {
                return Ok(out);
            }
            // A backslash.
            self.i += 1;
            match self.peek() {
                Some(b'\\') => out.push('\\'),
                Some(b'"') => out.push('"'),
                Some(b'n') => out.push('\n'),
                Some(_) => return Err(ErrorKind::BadEscape),
                None => return Err(ErrorKind::Unterminated),
            }
            self.i += 1;
        }
    }
}

impl fmt::Display for MetricType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
            MetricType::Summary => "summary",
            MetricType::Untyped => "untyped",
            MetricType::StateSet => "stateset",
            MetricType::Info => "info",
            MetricType::GaugeHistogram => "gaugehistogram",
        })
    }
}

#[cfg(test)]
mod tests;
