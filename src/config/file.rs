//! The policy file as text: reading it, parsing it into a spanned TOML tree,
//! and turning byte offsets into the `file:line:column` of a [`ConfigError`].
//!
//! This module owns syntax and positions only; what the keys mean is
//! [`super::validate`]'s job. Invariant: every error carries a 1-based line
//! and a 1-based column counted in characters, never in bytes.

use std::fmt;
use std::ops::Range;

use toml::Spanned;
use toml::de::DeTable;

/// One problem in a policy file, located precisely enough for an editor to
/// jump to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file name as given by the caller (a path, or a label such as
    /// `"<embedded>"`).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, counted in characters.
    pub column: usize,
    /// Key path of the offending item, e.g. `tenants[1].weight`; empty for a
    /// TOML syntax error, which has no key.
    pub path: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl fmt::Display for ConfigError {
    /// `file:line:column: path: message` (the path is left out when empty).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Maps byte offsets in a source text to 1-based lines and character columns.
#[derive(Clone, Debug)]
pub struct SourceMap<'s> {
    source: &'s str,
    /// Byte offset of the start of each line.
    line_starts: Vec<usize>,
}

impl<'s> SourceMap<'s> {
    /// Indexes the line starts of `source`.
    pub fn new(source: &'s str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(source.match_indices('\n').map(|(i, _)| i + 1));
        SourceMap {
            source,
            line_starts,
        }
    }

    /// The 1-based `(line, column)` of byte `offset`; an offset past the end
    /// is clamped to the end, one inside a character to its start.
    pub fn position(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.source.len());
        while !self.source.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = self.line_starts.partition_point(|&start| start <= offset);
        let start = self.line_starts.get(line - 1).copied().unwrap_or(0);
        let column = self.source[start..offset].chars().count() + 1;
        (line, column)
    }

    /// A [`ConfigError`] at the start of `span`.
    pub fn error(
        &self,
        file: &str,
        span: Range<usize>,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        let (line, column) = self.position(span.start);
        ConfigError {
            file: file.to_owned(),
            line,
            column,
            path: path.into(),
            message: message.into(),
        }
    }
}

/// Parses `source` as TOML, keeping the byte span of every key and value.
///
/// A syntax error is reported at its own position, with an empty path.
pub fn parse_document<'s>(
    source: &'s str,
    file: &str,
) -> Result<Spanned<DeTable<'s>>, Vec<ConfigError>> {
    DeTable::parse(source).map_err(|err| {
        let span = err.span().unwrap_or(0..0);
        let message = format!("invalid TOML: {}", err.message().trim_end());
        vec![SourceMap::new(source).error(file, span, "", message)]
    })
}
