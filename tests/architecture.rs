//! The core depends on nothing (STYLE.md §1-3): no file under `src/core`
//! mentions an I/O crate (`tokio`, `hyper`, `tracing`), `serde` or any
//! other dependency but `rand` and `thiserror`, reads a clock (`::now(`),
//! or uses another Fairway module (a `crate::` path outside
//! `crate::core`, or a `super::` chain that climbs out of the core).
//! Comments, doc comments and string literals are not code and are skipped.
//!
//! A text scan, not the compiler: if it ever needs the compiler's help,
//! move `src/core` into its own crate unchanged.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// Crates the core may not mention at all, alone or as the first part of a
/// longer name (`tokio_util`, `serde_json`, `tracing_subscriber`).
const FORBIDDEN_WORDS: &[&str] = &["tokio", "hyper", "tracing", "serde"];
/// The dependencies the core may use, besides std.
const ALLOWED_DEPENDENCIES: &[&str] = &["rand", "thiserror"];
/// Fewer files than this means the walk went wrong, not that all is well.
const MIN_FILES: usize = 10;

#[test]
fn the_core_uses_only_std_thiserror_and_rand_and_reads_no_clock() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo_toml = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let rules = Rules::new(&cargo_toml);
    let core = root.join("src").join("core");
    let mut files = Vec::new();
    rust_files(&core, &mut files);
    assert!(
        files.len() > MIN_FILES,
        "scanned only {} files under {}",
        files.len(),
        core.display()
    );
    let mut problems = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&core).expect("under src/core");
        let source = std::fs::read_to_string(file).expect("readable source");
        for (line, why) in rules.check_file(&source, module_depth(rel)) {
            problems.push(format!(
                "src/core/{}:{line}: {why}",
                rel.display().to_string().replace('\\', "/")
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the core must depend on nothing but std, thiserror and rand \
         (STYLE.md §2-3):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_scanner_flags_forbidden_code_and_skips_comments_and_strings() {
    let rules = Rules::new("[dependencies]\nrand = \"1\"\nparking_lot = \"0.12\"\ntokio = \"1\"\n");
    let flagged = |src: &str, depth: usize| -> Vec<usize> {
        rules
            .check_file(src, depth)
            .into_iter()
            .map(|(l, _)| l)
            .collect()
    };
    let bad = [
        "use tokio::sync::Mutex;",
        "let t = std::time::Instant::now();",
        "use crate::config::Policy;",
        "let p = crate::proxy::x();",
        "#[derive(serde::Serialize)]",
        "tracing::info!(\"x\");",
        "use hyper_util::rt;",
        "let s: serde_json::Value;",
        "let m = parking_lot::Mutex::new(0);",
        "pub(in crate::config) fn f() {}",
        "use super::super::clock::Clock;",
        "x(); /* closed */ tokio::spawn(f);",
    ];
    for (i, line) in bad.iter().enumerate() {
        assert_eq!(flagged(line, 1), vec![1], "not flagged: {line:?} ({i})");
    }
    let good = [
        "use crate::core::ids::TenantId;",
        "use crate::core;",
        "// tokio::spawn in a comment",
        "/// reads `crate::clock` in a doc comment",
        "//! serde in a module doc",
        "let url = \"http://x\"; // tokio",
        "let s = \"crate::config and tokio in a string\";",
        "let c = '\"'; let d = 'x'; fn f<'a>(x: &'a str) {}",
        "use super::state::Phase;",
        "use rand::Rng;",
        "pub(crate) fn f() {}",
        "let bytes = 3; let hyperplane = 1; let now = t;",
        "/* a block comment with tokio",
        "   that spans lines, crate::proxy */ let x = 1;",
    ];
    let good_src = good.join("\n");
    assert_eq!(flagged(&good_src, 1), Vec::<usize>::new(), "{good_src}");
    // Two `super`s are fine two modules down, and climb out one module down.
    assert!(flagged("use super::super::ids::TenantId;", 2).is_empty());
    assert_eq!(flagged("use super::super::ids::TenantId;", 1), vec![1]);
    // Multi-line strings and raw strings are skipped; the line count holds.
    let src = "let s = \"one\ntokio two\";\nlet r = r#\"crate::proxy\"#;\nuse tokio::x;";
    assert_eq!(flagged(src, 1), vec![4]);
}

/// What the scan looks for.
struct Rules {
    /// Dependencies of the crate other than the allowed ones and those
    /// [`FORBIDDEN_WORDS`] covers, as paths (`parking_lot::`).
    other_dependencies: Vec<String>,
}

impl Rules {
    fn new(cargo_toml: &str) -> Self {
        let other_dependencies = dependencies(cargo_toml)
            .into_iter()
            .filter(|d| {
                !ALLOWED_DEPENDENCIES.contains(&d.as_str())
                    && !FORBIDDEN_WORDS.iter().any(|w| d.starts_with(w))
            })
            .map(|d| format!("{d}::"))
            .collect();
        Rules { other_dependencies }
    }

    /// Problems in `source`, a file `depth` modules below `core`, as
    /// (1-based line, reason).
    fn check_file(&self, source: &str, depth: usize) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for (i, code) in code_lines(source).iter().enumerate() {
            for why in self.check_code(code, depth) {
                out.push((i + 1, why));
            }
        }
        out
    }

    /// Problems in one line of code (comments and strings already blanked).
    fn check_code(&self, code: &str, depth: usize) -> Vec<String> {
        let mut why = Vec::new();
        for word in FORBIDDEN_WORDS {
            let mentioned = word_starts(code, word)
                .into_iter()
                .any(|at| !code[at + word.len()..].starts_with(char::is_alphanumeric));
            if mentioned {
                why.push(format!("mentions `{word}`"));
            }
        }
        for dep in &self.other_dependencies {
            if !word_starts(code, dep).is_empty() {
                why.push(format!("uses the dependency `{dep}`"));
            }
        }
        if code.contains("::now(") {
            why.push("reads a clock (`::now(`)".to_owned());
        }
        for at in word_starts(code, "crate::") {
            let rest = &code[at + "crate::".len()..];
            let is_core = rest
                .strip_prefix("core")
                .is_some_and(|r| !r.starts_with(is_ident));
            if !is_core {
                why.push("uses a Fairway module outside `crate::core`".to_owned());
            }
        }
        for at in word_starts(code, "super::") {
            let supers = code[at..]
                .split("::")
                .take_while(|s| s.trim() == "super")
                .count();
            if supers > depth {
                why.push(format!(
                    "`{}` climbs out of the core",
                    "super::".repeat(supers)
                ));
                break;
            }
        }
        why
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Byte offsets where `needle` occurs in `code` not preceded by an
/// identifier character (so `crate::` in `pub(crate)` and `hyper` in
/// `cyber` don't count, but `super::super::` counts twice).
fn word_starts(code: &str, needle: &str) -> Vec<usize> {
    code.match_indices(needle)
        .map(|(at, _)| at)
        .filter(|&at| !code[..at].ends_with(is_ident))
        .collect()
}

/// Each line of `source` with comments and the contents of string and
/// character literals replaced by spaces. Block comments and strings may
/// span lines.
fn code_lines(source: &str) -> Vec<String> {
    enum State {
        Code,
        Block(usize),
        Str,
        /// A raw string closed by `"` and this many `#`.
        Raw(usize),
    }
    let mut state = State::Code;
    let mut lines = Vec::new();
    for line in source.lines() {
        let chars: Vec<char> = line.chars().collect();
        let mut code = String::with_capacity(line.len());
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            match state {
                State::Block(depth) => {
                    if c == '*' && next == Some('/') {
                        state = if depth == 1 {
                            State::Code
                        } else {
                            State::Block(depth - 1)
                        };
                        i += 1;
                    } else if c == '/' && next == Some('*') {
                        state = State::Block(depth + 1);
                        i += 1;
                    }
                    code.push(' ');
                }
                State::Str => {
                    if c == '\\' {
                        i += 1;
                    } else if c == '"' {
                        state = State::Code;
                        code.push('"');
                        i += 1;
                        continue;
                    }
                    code.push(' ');
                }
                State::Raw(hashes) => {
                    if c == '"'
                        && chars[i + 1..].iter().take_while(|&&h| h == '#').count() >= hashes
                    {
                        state = State::Code;
                        code.push('"');
                        i += 1 + hashes;
                        continue;
                    }
                    code.push(' ');
                }
                State::Code => {
                    if c == '/' && next == Some('/') {
                        break;
                    } else if c == '/' && next == Some('*') {
                        state = State::Block(1);
                        i += 1;
                        code.push(' ');
                    } else if c == '"' {
                        state = State::Str;
                        code.push('"');
                    } else if c == 'r'
                        && !code.ends_with(is_ident)
                        && matches!(next, Some('"' | '#'))
                    {
                        let hashes = chars[i + 1..].iter().take_while(|&&h| h == '#').count();
                        if chars.get(i + 1 + hashes) == Some(&'"') {
                            state = State::Raw(hashes);
                            code.push('"');
                            i += 2 + hashes;
                            continue;
                        }
                        code.push(c);
                    } else if c == '\'' {
                        // A character literal ('x', '\n', '\''), else a lifetime.
                        let len = match (next, chars.get(i + 2)) {
                            (Some('\\'), _) => chars[i + 2..]
                                .iter()
                                .skip(1)
                                .position(|&q| q == '\'')
                                .map(|p| p + 4),
                            (Some(_), Some('\'')) => Some(3),
                            _ => None,
                        };
                        match len {
                            Some(len) => {
                                code.push_str(&" ".repeat(len));
                                i += len;
                                continue;
                            }
                            None => code.push(c),
                        }
                    } else {
                        code.push(c);
                    }
                }
            }
            i += 1;
        }
        lines.push(code);
    }
    lines
}

/// How many modules below `core` a file is: `mod.rs` is 0, `queue/mod.rs`
/// and `time.rs` 1, `scheduler/tests.rs` 2.
fn module_depth(rel: &Path) -> usize {
    let dirs = rel.components().count() - 1;
    if rel.file_name().is_some_and(|f| f == "mod.rs") {
        dirs
    } else {
        dirs + 1
    }
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("readable dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The crate names under `[dependencies]` in Cargo.toml (`-` as `_`).
fn dependencies(cargo_toml: &str) -> Vec<String> {
    let mut in_section = false;
    let mut names = Vec::new();
    for line in cargo_toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == "[dependencies]";
        } else if in_section && let Some((name, _)) = line.split_once('=') {
            let name = name.trim();
            if !name.is_empty() && !name.starts_with('#') {
                names.push(name.replace('-', "_"));
            }
        }
    }
    names
}
