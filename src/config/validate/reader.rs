//! Typed reads from the spanned TOML tree that record a [`ConfigError`] for
//! every problem instead of stopping at the first.
//!
//! Each read returns `None` when the value is absent or wrong (the error is
//! already recorded); callers substitute the default and carry on, so one
//! pass finds every problem. This module knows TOML types and value syntax
//! (durations, addresses, positive numbers), not the policy schema.

use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::config::file::{ConfigError, SourceMap};

/// A TOML value with its byte span.
pub(super) type Value<'i> = Spanned<DeValue<'i>>;

/// One TOML table together with where it is and its key path.
#[derive(Clone)]
pub(super) struct Table<'a, 'i> {
    pub table: &'a DeTable<'i>,
    /// The table's header, inline braces, or dotted key; `0..0` for the root.
    pub span: Range<usize>,
    /// Key path, e.g. `pools[0].backends[1]`; empty for the root.
    pub path: String,
}

impl<'a, 'i> Table<'a, 'i> {
    /// Looks `key` up, returning the value and its key path.
    pub fn get(&self, key: &str) -> Option<(&'a Value<'i>, String)> {
        self.table.get(key).map(|v| (v, self.child(key)))
    }

    /// Whether `key` is present.
    pub fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    /// The key path of `key` inside this table.
    pub fn child(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }
}

/// Whether zero is an acceptable duration.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Zero {
    Allowed,
    Refused,
}

/// Collects errors while reading one document.
pub(super) struct Reader<'s> {
    map: SourceMap<'s>,
    file: &'s str,
    errors: Vec<ConfigError>,
}

impl<'s> Reader<'s> {
    /// The policy file's name, as given.
    pub fn file(&self) -> &'s str {
        self.file
    }

    /// A reader for `source`, naming `file` in its errors.
    pub fn new(source: &'s str, file: &'s str) -> Self {
        Reader {
            map: SourceMap::new(source),
            file,
            errors: Vec::new(),
        }
    }

    /// Records an error at the start of `span`.
    pub fn error(&mut self, span: Range<usize>, path: &str, message: impl Into<String>) {
        let err = self.map.error(self.file, span, path, message);
        self.errors.push(err);
    }

    /// Whether any error has been recorded so far.
    pub fn has_errors(&self) -> bool {
        !self.errors.is_empty()
    }

    /// The errors recorded, in file order.
    pub fn into_errors(mut self) -> Vec<ConfigError> {
        self.errors.sort_by_key(|e| (e.line, e.column));
        self.errors
    }

    /// Reports every key of `table` that is not in `known`, at the key, with
    /// a suggestion when one of `known` is close.
    pub fn check_keys(&mut self, table: &Table<'_, '_>, known: &[&str]) {
        for (key, _) in table.table.iter() {
            let name: &str = key.get_ref();
            if known.contains(&name) {
                continue;
            }
            let message = match suggest(name, known) {
                Some(close) => format!("unknown key `{name}`; did you mean `{close}`?"),
                None => format!(
                    "unknown key `{name}`; expected one of: {}",
                    known.join(", ")
                ),
            };
            self.error(key.span(), &table.child(name), message);
        }
    }

    /// Reads optional `key` of `table` with `read`.
    pub fn opt<'a, 'i, T>(
        &mut self,
        table: &Table<'a, 'i>,
        key: &str,
        read: impl FnOnce(&mut Self, &'a Value<'i>, &str) -> Option<T>,
    ) -> Option<T> {
        let (value, path) = table.get(key)?;
        read(self, value, &path)
    }

    /// Reads required `key` of `table` with `read`; a missing key is
    /// reported at the table's header.
    pub fn req<'a, 'i, T>(
        &mut self,
        table: &Table<'a, 'i>,
        key: &str,
        what: &str,
        read: impl FnOnce(&mut Self, &'a Value<'i>, &str) -> Option<T>,
    ) -> Option<T> {
        if !table.has(key) {
            let message = format!("missing required key `{key}` ({what})");
            self.error(table.span.clone(), &table.child(key), message);
            return None;
        }
        self.opt(table, key, read)
    }

    fn wrong_type(&mut self, value: &Value<'_>, path: &str, expected: &str) {
        let found = type_name(value.get_ref());
        self.error(
            value.span(),
            path,
            format!("expected {expected}, found {found}"),
        );
    }

    /// A table (`[x]`, `x = { … }` or dotted keys).
    pub fn table<'a, 'i>(&mut self, value: &'a Value<'i>, path: &str) -> Option<Table<'a, 'i>> {
        match value.get_ref() {
            DeValue::Table(table) => Some(Table {
                table,
                span: value.span(),
                path: path.to_owned(),
            }),
            _ => {
                self.wrong_type(value, path, "a table");
                None
            }
        }
    }

    /// An array of tables (`[[x]]` or `x = [{ … }, …]`); elements that are
    /// not tables are reported and skipped.
    pub fn tables<'a, 'i>(
        &mut self,
        value: &'a Value<'i>,
        path: &str,
    ) -> Option<Vec<(usize, Table<'a, 'i>)>> {
        let DeValue::Array(items) = value.get_ref() else {
            // `pools[0].backends` is written `[[pools.backends]]`.
            let mut header = String::with_capacity(path.len());
            let mut in_index = false;
            for c in path.chars() {
                match c {
                    '[' => in_index = true,
                    ']' => in_index = false,
                    c if !in_index => header.push(c),
                    _ => {}
                }
            }
            self.wrong_type(value, path, &format!("an array of tables (`[[{header}]]`)"));
            return None;
        };
        let mut tables = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if let Some(table) = self.table(item, &format!("{path}[{i}]")) {
                tables.push((i, table));
            }
        }
        Some(tables)
    }

    /// An array; each element is read with `read` (failures are skipped).
    pub fn array<'a, 'i, T>(
        &mut self,
        value: &'a Value<'i>,
        path: &str,
        mut read: impl FnMut(&mut Self, &'a Value<'i>, &str) -> Option<T>,
    ) -> Option<Vec<T>> {
        let DeValue::Array(items) = value.get_ref() else {
            self.wrong_type(value, path, "an array");
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if let Some(v) = read(self, item, &format!("{path}[{i}]")) {
                out.push(v);
            }
        }
        Some(out)
    }

    /// A string.
    pub fn string(&mut self, value: &Value<'_>, path: &str) -> Option<String> {
        match value.get_ref() {
            DeValue::String(s) => Some(s.to_string()),
            _ => {
                self.wrong_type(value, path, "a string");
                None
            }
        }
    }

    /// A boolean.
    pub fn boolean(&mut self, value: &Value<'_>, path: &str) -> Option<bool> {
        match value.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            _ => {
                self.wrong_type(value, path, "a boolean");
                None
            }
        }
    }

    /// A boolean, or the string `word` (`Some(None)`).
    pub fn boolean_or(
        &mut self,
        value: &Value<'_>,
        path: &str,
        word: &str,
    ) -> Option<Option<bool>> {
        match value.get_ref() {
            DeValue::Boolean(b) => Some(Some(*b)),
            DeValue::String(s) if s == word => Some(None),
            _ => {
                self.wrong_type(value, path, &format!("true, false or \"{word}\""));
                None
            }
        }
    }

    /// A non-empty string.
    pub fn non_empty(&mut self, value: &Value<'_>, path: &str) -> Option<String> {
        let s = self.string(value, path)?;
        if s.trim().is_empty() {
            self.error(value.span(), path, "must not be empty");
            return None;
        }
        Some(s)
    }

    /// A duration written as a string with units: `"250ms"`, `"30s"`,
    /// `"1m 30s"` (humantime syntax).
    pub fn duration(&mut self, value: &Value<'_>, path: &str, zero: Zero) -> Option<Duration> {
        const EXPECTED: &str = "a duration such as \"250ms\", \"30s\" or \"5m\"";
        let DeValue::String(s) = value.get_ref() else {
            let hint = match value.get_ref() {
                DeValue::Integer(_) | DeValue::Float(_) => " (a duration needs a unit)",
                _ => "",
            };
            let found = type_name(value.get_ref());
            self.error(
                value.span(),
                path,
                format!("expected {EXPECTED}, found {found}{hint}"),
            );
            return None;
        };
        match humantime::parse_duration(s.trim()) {
            Ok(d) if d.is_zero() && zero == Zero::Refused => {
                self.error(value.span(), path, "must be longer than zero");
                None
            }
            Ok(d) => Some(d),
            Err(err) => {
                self.error(
                    value.span(),
                    path,
                    format!("invalid duration \"{s}\" ({err}); expected {EXPECTED}"),
                );
                None
            }
        }
    }

    /// A positive integer that fits `T`.
    pub fn positive_int<T: TryFrom<u64>>(&mut self, value: &Value<'_>, path: &str) -> Option<T> {
        self.int_at_least(value, path, 1)
    }

    /// An integer of at least 0 that fits `T`.
    pub fn non_negative_int<T: TryFrom<u64>>(
        &mut self,
        value: &Value<'_>,
        path: &str,
    ) -> Option<T> {
        self.int_at_least(value, path, 0)
    }

    fn int_at_least<T: TryFrom<u64>>(
        &mut self,
        value: &Value<'_>,
        path: &str,
        min: i128,
    ) -> Option<T> {
        let expected = if min > 0 {
            "a positive integer"
        } else {
            "an integer, 0 or more"
        };
        let DeValue::Integer(int) = value.get_ref() else {
            self.wrong_type(value, path, expected);
            return None;
        };
        match i128::from_str_radix(int.as_str(), int.radix()) {
            Ok(n) if n < min => {
                self.error(value.span(), path, format!("must be {expected}, found {n}"));
                None
            }
            Ok(n) => match u64::try_from(n).ok().and_then(|n| T::try_from(n).ok()) {
                Some(v) => Some(v),
                None => {
                    self.error(value.span(), path, format!("{n} is too large"));
                    None
                }
            },
            Err(_) => {
                self.error(value.span(), path, "integer is too large");
                None
            }
        }
    }

    /// A finite number (integers are accepted where floats are).
    pub fn number(&mut self, value: &Value<'_>, path: &str) -> Option<f64> {
        let n = match value.get_ref() {
            DeValue::Integer(int) => i128::from_str_radix(int.as_str(), int.radix())
                .ok()
                .map(|n| n as f64),
            DeValue::Float(float) => float.as_str().parse::<f64>().ok(),
            _ => {
                self.wrong_type(value, path, "a number");
                return None;
            }
        };
        match n {
            Some(n) if n.is_finite() => Some(n),
            _ => {
                self.error(value.span(), path, "expected a finite number");
                None
            }
        }
    }

    /// A number greater than zero.
    pub fn positive(&mut self, value: &Value<'_>, path: &str) -> Option<f64> {
        let n = self.number(value, path)?;
        if n <= 0.0 {
            self.error(
                value.span(),
                path,
                format!("must be greater than zero, found {n}"),
            );
            return None;
        }
        Some(n)
    }

    /// A number from 0 to 1.
    pub fn share(&mut self, value: &Value<'_>, path: &str) -> Option<f64> {
        let n = self.number(value, path)?;
        if !(0.0..=1.0).contains(&n) {
            self.error(
                value.span(),
                path,
                format!("must be from 0 to 1, found {n}"),
            );
            return None;
        }
        Some(n)
    }

    /// One of a closed set of names.
    pub fn choice<T: Copy>(
        &mut self,
        value: &Value<'_>,
        path: &str,
        choices: &[(&str, T)],
    ) -> Option<T> {
        let s = self.string(value, path)?;
        if let Some((_, v)) = choices.iter().find(|(name, _)| *name == s) {
            return Some(*v);
        }
        let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
        let message = match suggest(&s, &names) {
            Some(close) => format!("unknown value \"{s}\"; did you mean \"{close}\"?"),
            None => format!(
                "unknown value \"{s}\"; expected one of: {}",
                names.join(", ")
            ),
        };
        self.error(value.span(), path, message);
        None
    }

    /// An IP socket address such as `"127.0.0.1:8080"`.
    pub fn socket_addr(&mut self, value: &Value<'_>, path: &str) -> Option<SocketAddr> {
        let s = self.string(value, path)?;
        match s.trim().parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(_) => {
                self.error(
                    value.span(),
                    path,
                    format!(
                        "invalid listen address \"{s}\"; expected an IP address and port \
                         such as \"127.0.0.1:8080\" or \"[::]:8080\""
                    ),
                );
                None
            }
        }
    }
}

/// How TOML types are named in messages.
fn type_name(value: &DeValue<'_>) -> &'static str {
    match value {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// The candidate closest to `name`, if it is close enough to be a typo
/// (or the same words in camelCase, as in the admission CRD).
pub(super) fn suggest<'c>(name: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let snake = to_snake_case(name);
    let unprefixed = snake.strip_prefix("per_tenant_").unwrap_or(&snake);
    if let Some(hit) = candidates
        .iter()
        .find(|c| **c == snake || **c == unprefixed)
    {
        return Some(hit);
    }
    let limit = match name.chars().count() {
        0..=3 => 1,
        4..=7 => 2,
        _ => 3,
    };
    candidates
        .iter()
        .map(|c| (edit_distance(&snake, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// `gpuSecondsPerHour` → `gpu_seconds_per_hour`; `-` becomes `_`.
fn to_snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for ch in name.chars() {
        if ch.is_ascii_uppercase() {
            if !out.is_empty() && !out.ends_with('_') {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else if ch == '-' {
            out.push('_');
        } else {
            out.push(ch);
        }
    }
    out
}

/// Optimal-string-alignment distance: insertions, deletions, substitutions
/// and adjacent transpositions each cost one.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let width = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * width];
    for i in 0..=a.len() {
        d[i * width] = i;
    }
    for (j, cell) in d.iter_mut().take(width).enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[(i - 1) * width + j] + 1)
                .min(d[i * width + j - 1] + 1)
                .min(d[(i - 1) * width + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[(i - 2) * width + j - 2] + 1);
            }
            d[i * width + j] = best;
        }
    }
    d[a.len() * width + b.len()]
}
