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

// ---------------------------------------------------------------------------
// The module map: layers and file cycles for every module.
// ---------------------------------------------------------------------------

/// The layers of the crate, bottom first (docs/architecture.md, "Module
/// map"). A module may use the modules of lower layers; it may not use a
/// module of its own layer or of a higher one. `lib.rs` (the map) and
/// `main.rs` (the binary, a crate of its own) are outside the layers.
const LAYERS: &[&[&str]] = &[
    &["core"],
    &["clock", "fault", "hex", "outcome", "prom", "tokens", "net"],
    &["config"],
    &["protocol"],
    &["cluster", "poller"],
    &["sim"],
    &["telemetry"],
    &["agent", "replay"],
    &["placement"],
    &["gateway"],
    &["batch"],
    &["edge"],
    &["fuzz", "top", "cli"],
];

/// Imports that go against the map today, each as `from -> to`; the
/// test fails when one of them is fixed and not removed from here, so the
/// list only shrinks. Empty when the house is in order.
const KNOWN: &[&str] = &[];

#[test]
fn every_module_imports_only_lower_layers_and_no_files_form_a_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let crate_map = CrateMap::read(&root);
    assert!(
        crate_map.files.len() > 5 * MIN_FILES,
        "scanned only {} files under {}",
        crate_map.files.len(),
        root.display()
    );
    let problems = map_problems(&crate_map.uses(), LAYERS, KNOWN);
    assert!(
        problems.is_empty(),
        "the module map (docs/architecture.md) is broken:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_module_scan_resolves_paths_reexports_and_inline_modules() {
    let sources = [
        (
            "lib.rs",
            "pub mod a;\npub mod b;\npub use a::thing::Thing;\n",
        ),
        (
            "a/mod.rs",
            "pub mod thing;\npub mod other;\npub use thing::Thing;\npub use other::*;\n",
        ),
        (
            "a/thing.rs",
            "pub struct Thing;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::b::x;\n}\n",
        ),
        ("a/other.rs", "pub fn helper() {}\n"),
        ("b/mod.rs", "pub mod x;\n"),
        (
            "b/x.rs",
            "use crate::a::{Thing,\n    helper};\n// crate::b in a comment\n\
             fn f() { let s = \"crate::a::other\"; super::super::a::thing::Thing; }\n",
        ),
    ];
    let map = CrateMap::from_sources(
        sources
            .iter()
            .map(|(p, s)| ((*p).to_owned(), (*s).to_owned()))
            .collect(),
    );
    let uses = map.uses();
    let mut seen: Vec<String> = uses
        .iter()
        .map(|u| format!("{}:{} -> {}", u.from, u.line, u.to))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            "a/thing.rs:5 -> b/x.rs",
            "b/x.rs:1 -> a/other.rs",
            "b/x.rs:1 -> a/thing.rs",
            "b/x.rs:4 -> a/thing.rs",
        ]
    );
    // `a` below `b`: the test module's use of `b` goes up, and closes a
    // cycle with `b`'s use of `a`.
    let problems = map_problems(&uses, &[&["a"], &["b"]], &[]);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems[0].starts_with("src/a/thing.rs:5: `a` (layer 0) uses src/b/x.rs of `b` (layer 1)")
    );
    assert!(problems[1].contains("src/a/thing.rs:5 uses src/b/x.rs"));
    assert!(problems[1].contains("src/b/x.rs:1 uses src/a/thing.rs"));
    // A known exception is let through while it happens, and must go when
    // it no longer does.
    assert!(map_problems(&uses, &[&["a"], &["b"]], &["a/thing.rs -> b/x.rs"]).is_empty());
    let stale = map_problems(
        &uses,
        &[&["a"], &["b"]],
        &["a/thing.rs -> b/x.rs", "b/x.rs -> a/mod.rs"],
    );
    assert_eq!(stale.len(), 1, "{stale:#?}");
    assert!(stale[0].contains("`b/x.rs -> a/mod.rs`") && stale[0].contains("no longer happens"));
    // A module in no layer is named.
    let unplaced = map_problems(&uses, &[&["a"]], &[]);
    assert!(
        unplaced.iter().any(|p| p.contains("in no layer")),
        "{unplaced:#?}"
    );
}

/// What breaks the map: uses against the layer order, modules in no
/// layer, and cycles between files; `known` pairs are let through
/// while they happen and reported when they no longer do.
fn map_problems(uses: &[Use], layers: &[&[&str]], known: &[&str]) -> Vec<String> {
    let layer_of = |m: &str| layers.iter().position(|l| l.contains(&m));
    let is_known = |u: &Use| known.contains(&format!("{} -> {}", u.from, u.to).as_str());
    let mut problems = Vec::new();
    let mut seen_known = std::collections::BTreeSet::new();
    for u in uses {
        let (from, to) = (top_module(&u.from), top_module(&u.to));
        if from == to || from.is_empty() || to.is_empty() {
            continue;
        }
        let (Some(lf), Some(lt)) = (layer_of(from), layer_of(to)) else {
            problems.push(format!(
                "src/{}:{}: uses src/{}, and `{from}` or `{to}` is in no layer of the map",
                u.from, u.line, u.to
            ));
            continue;
        };
        if lt >= lf {
            if is_known(u) {
                seen_known.insert(format!("{} -> {}", u.from, u.to));
                continue;
            }
            problems.push(format!(
                "src/{}:{}: `{from}` (layer {lf}) uses src/{} of `{to}` (layer {lt}): \
                 against the module map",
                u.from, u.line, u.to
            ));
        }
    }
    for cycle in file_cycles(uses) {
        let mut known_here = false;
        let mut lines = Vec::new();
        for u in &cycle {
            if is_known(u) {
                known_here = true;
                seen_known.insert(format!("{} -> {}", u.from, u.to));
            }
            lines.push(format!("  src/{}:{} uses src/{}", u.from, u.line, u.to));
        }
        if !known_here {
            problems.push(format!("a cycle between files:\n{}", lines.join("\n")));
        }
    }
    for k in known {
        if !seen_known.contains(*k) {
            problems.push(format!(
                "`{k}` is listed as known but no longer happens: remove it"
            ));
        }
    }
    problems
}

/// The top-level module a file belongs to (`proxy` for `proxy/relay.rs`,
/// `clock` for `clock.rs`; empty for `lib.rs`).
fn top_module(file: &str) -> &str {
    let first = file.split('/').next().unwrap_or(file);
    let m = first.strip_suffix(".rs").unwrap_or(first);
    if m == "lib" { "" } else { m }
}

/// One use of a file by another, through a path in code or a `use`.
#[derive(Clone, Debug)]
struct Use {
    from: String,
    line: usize,
    to: String,
}

/// Every cycle of the file graph, one per strongly connected component of
/// more than one file, as the uses that join its files (each pair once,
/// its first line).
fn file_cycles(uses: &[Use]) -> Vec<Vec<Use>> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut first: BTreeMap<(&str, &str), &Use> = BTreeMap::new();
    for u in uses {
        first.entry((&u.from, &u.to)).or_insert(u);
    }
    // A submodule is part of its parent: it may use its ancestors' files
    // (the parent's type, with `impl` blocks split across its children),
    // and those uses close no cycle. Every other use must be acyclic.
    first.retain(|(a, b), _| !is_ancestor(b, a));
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for &(a, b) in first.keys() {
        graph.entry(a).or_default().insert(b);
        graph.entry(b).or_default();
    }
    // Tarjan's strongly connected components, iteratively.
    let nodes: Vec<&str> = graph.keys().copied().collect();
    let idx: BTreeMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let adj: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| graph[n].iter().map(|m| idx[m]).collect())
        .collect();
    let n = nodes.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut comps, mut next) = (Vec::new(), Vec::new(), 0);
    for s in 0..n {
        if index[s] != usize::MAX {
            continue;
        }
        let mut work = vec![(s, 0usize)];
        while let Some((v, i)) = work.pop() {
            if i == 0 {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if let Some(&w) = adj[v].get(i) {
                work.push((v, i + 1));
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = BTreeSet::new();
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    comp.insert(w);
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comps.push(comp);
                }
            }
        }
    }
    comps
        .into_iter()
        .map(|comp| {
            first
                .iter()
                .filter(|((a, b), _)| comp.contains(&idx[a]) && comp.contains(&idx[b]))
                .map(|(_, u)| (*u).clone())
                .collect()
        })
        .collect()
}

/// Whether file `a` holds a module that encloses file `b`'s (`lib.rs`
/// encloses every file, `proxy/mod.rs` every file under `proxy/`, and
/// `core/scheduler.rs` every file under `core/scheduler/`).
fn is_ancestor(a: &str, b: &str) -> bool {
    let (ma, mb) = (file_module(a), file_module(b));
    ma.len() < mb.len() && mb.starts_with(&ma)
}

/// The crate's files and modules as a text scan sees them.
struct CrateMap {
    /// Path under `src/` → its code (comments and strings blanked).
    files: std::collections::BTreeMap<String, Vec<String>>,
    /// Module path (`["proxy", "relay"]`) → the file that holds it; inline
    /// modules (`mod tests { … }`) map to their file.
    modules: std::collections::BTreeMap<Vec<String>, String>,
    /// Module path → the names it re-exports (`pub use …`) → the full path.
    reexports:
        std::collections::BTreeMap<Vec<String>, std::collections::BTreeMap<String, Vec<String>>>,
    /// Module path → the modules it re-exports whole (`pub use x::*`).
    globs: std::collections::BTreeMap<Vec<String>, Vec<Vec<String>>>,
    /// Module path → the items it defines (`fn`, `struct`, …).
    items: std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<String>>,
    /// Every path a file mentions.
    mentions: Vec<Mention>,
}

/// A path as a file writes it.
struct Mention {
    file: String,
    /// The module the mention is in (an inline module's, inside one).
    module: Vec<String>,
    line: usize,
    path: Vec<String>,
    /// Whether it is a `pub use`.
    public: bool,
}

impl CrateMap {
    fn read(root: &Path) -> Self {
        let mut paths = Vec::new();
        rust_files(root, &mut paths);
        let sources = paths
            .iter()
            .map(|path| {
                let rel = path
                    .strip_prefix(root)
                    .expect("under src")
                    .to_string_lossy()
                    .replace('\\', "/");
                (rel, std::fs::read_to_string(path).expect("readable source"))
            })
            .collect();
        Self::from_sources(sources)
    }

    /// The map of files given as (path under `src/`, source).
    fn from_sources(sources: Vec<(String, String)>) -> Self {
        let mut map = CrateMap {
            files: Default::default(),
            modules: Default::default(),
            reexports: Default::default(),
            globs: Default::default(),
            items: Default::default(),
            mentions: Vec::new(),
        };
        for (rel, source) in sources {
            if rel != "main.rs" {
                map.files.insert(rel, code_lines(&source));
            }
        }
        let files: Vec<(String, Vec<String>)> = map
            .files
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (rel, _) in &files {
            map.modules.insert(file_module(rel), rel.clone());
        }
        for (rel, code) in &files {
            map.scan(rel, code);
        }
        map
    }

    /// Reads one file: its inline modules, items, re-exports and mentions.
    fn scan(&mut self, rel: &str, code: &[String]) {
        let base = file_module(rel);
        let text = code.join("\n");
        let chars: Vec<char> = text.chars().collect();
        let mut lines_before = Vec::with_capacity(chars.len() + 1);
        let mut n = 1;
        for &c in &chars {
            lines_before.push(n);
            if c == '\n' {
                n += 1;
            }
        }
        lines_before.push(n);
        let line_at = |pos: usize| lines_before[pos];
        // Inline modules open at a brace depth; they close with it.
        let mut stack: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        let mut i = 0;
        let module_here = |stack: &[(String, usize)]| -> Vec<String> {
            let mut m = base.clone();
            m.extend(stack.iter().map(|(n, _)| n.clone()));
            m
        };
        while i < chars.len() {
            let c = chars[i];
            if c == '{' {
                depth += 1;
                i += 1;
                continue;
            }
            if c == '}' {
                depth = depth.saturating_sub(1);
                if stack.last().is_some_and(|(_, d)| *d == depth) {
                    stack.pop();
                }
                i += 1;
                continue;
            }
            let starts_word = (c.is_alphabetic() || c == '_')
                && (i == 0
                    || !(is_ident(chars[i - 1]) || chars[i - 1] == '$' || chars[i - 1] == ':'));
            if !starts_word {
                i += 1;
                continue;
            }
            let word: String = chars[i..].iter().take_while(|&&c| is_ident(c)).collect();
            let after = i + word.chars().count();
            let here = module_here(&stack);
            match word.as_str() {
                "mod" => {
                    let (name, tail) = next_ident(&chars, after);
                    if !name.is_empty() && tail.starts_with('{') {
                        let mut m = here.clone();
                        m.push(name.clone());
                        self.modules.insert(m, rel.to_owned());
                        stack.push((name, depth));
                    }
                    i = after;
                }
                "fn" | "struct" | "enum" | "type" | "trait" | "const" | "static" | "union" => {
                    let (name, _) = next_ident(&chars, after);
                    if !name.is_empty() {
                        self.items.entry(here).or_default().insert(name);
                    }
                    i = after;
                }
                "use" => {
                    let end = chars[after..]
                        .iter()
                        .position(|&c| c == ';')
                        .map_or(chars.len(), |p| after + p);
                    let tree: String = chars[after..end].iter().collect();
                    let before: String = chars[..i]
                        .iter()
                        .rev()
                        .take_while(|&&c| c != '\n' && c != ';' && c != '}' && c != '{')
                        .collect::<String>()
                        .chars()
                        .rev()
                        .collect();
                    let public = before.trim_start().starts_with("pub");
                    let line = line_at(i);
                    for (path, alias) in use_tree(&tree) {
                        if public && let Some(abs) = self.absolute(&here, &path) {
                            if alias == "*" {
                                self.globs.entry(here.clone()).or_default().push(abs);
                            } else if alias != "self" {
                                self.reexports
                                    .entry(here.clone())
                                    .or_default()
                                    .insert(alias.clone(), abs);
                            }
                        }
                        self.mention(rel, &here, line, path, public);
                    }
                    i = end;
                }
                "crate" | "super" | "self" if chars[after..].starts_with(&[':', ':']) => {
                    let (path, j) = read_path(&chars, after, vec![word.clone()]);
                    self.mention(rel, &here, line_at(i), path, false);
                    i = j;
                }
                _ => {
                    // A path through a child module in scope: `relay::Mode`.
                    if chars[after..].starts_with(&[':', ':']) {
                        let mut child = here.clone();
                        child.push(word.clone());
                        if self.modules.contains_key(&child) || is_file_module(&self.files, &child)
                        {
                            let start = vec!["self".to_owned(), word.clone()];
                            let (path, j) = read_path(&chars, after, start);
                            self.mention(rel, &here, line_at(i), path, false);
                            i = j;
                            continue;
                        }
                    }
                    i = after;
                }
            }
        }
    }

    fn mention(
        &mut self,
        file: &str,
        module: &[String],
        line: usize,
        path: Vec<String>,
        public: bool,
    ) {
        self.mentions.push(Mention {
            file: file.to_owned(),
            module: module.to_vec(),
            line,
            path,
            public,
        });
    }

    /// `path` as written in module `here`, made absolute (without
    /// `crate`); `None` for another crate's path.
    fn absolute(&self, here: &[String], path: &[String]) -> Option<Vec<String>> {
        let first = path.first()?;
        match first.as_str() {
            "crate" => Some(path[1..].to_vec()),
            "self" => Some(here.iter().chain(&path[1..]).cloned().collect()),
            "super" => {
                let mut m = here.to_vec();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    m.pop()?;
                    rest = &rest[1..];
                }
                m.extend(rest.iter().cloned());
                Some(m)
            }
            _ => {
                let mut child = here.to_vec();
                child.push(first.clone());
                if self.modules.contains_key(&child) || is_file_module(&self.files, &child) {
                    Some(here.iter().chain(path).cloned().collect())
                } else if here.is_empty() && self.modules.contains_key(&vec![first.clone()]) {
                    Some(path.to_vec())
                } else {
                    None
                }
            }
        }
    }

    /// The file that defines what an absolute path names, following
    /// re-exports.
    fn resolve(&self, abs: &[String], hops: usize) -> Option<String> {
        let mut module: Vec<String> = Vec::new();
        let mut i = 0;
        while i < abs.len() {
            let mut next = module.clone();
            next.push(abs[i].clone());
            if self.modules.contains_key(&next) {
                module = next;
                i += 1;
            } else {
                break;
            }
        }
        if let Some(name) = abs.get(i)
            && hops < 8
            && !self.items.get(&module).is_some_and(|s| s.contains(name))
        {
            if let Some(target) = self.reexports.get(&module).and_then(|r| r.get(name)) {
                let mut t = target.clone();
                t.extend(abs[i + 1..].iter().cloned());
                if t != abs {
                    return self.resolve(&t, hops + 1);
                }
            }
            for glob in self.globs.get(&module).into_iter().flatten() {
                let mut t = glob.clone();
                t.extend(abs[i..].iter().cloned());
                if let Some(f) = self.resolve(&t, hops + 1)
                    && Some(&f) != self.modules.get(&module)
                {
                    return Some(f);
                }
            }
        }
        self.modules.get(&module).cloned()
    }

    /// Every use of one file by another. A file's re-exports of its own
    /// submodules (`pub use self::x::Y` in a `mod.rs`) are its map, not a
    /// use.
    fn uses(&self) -> Vec<Use> {
        let mut out = Vec::new();
        for m in &self.mentions {
            let Some(abs) = self.absolute(&m.module, &m.path) else {
                continue;
            };
            if m.public && abs.starts_with(&file_module(&m.file)) {
                continue;
            }
            let Some(to) = self.resolve(&abs, 0) else {
                continue;
            };
            if to != m.file {
                out.push(Use {
                    from: m.file.clone(),
                    line: m.line,
                    to,
                });
            }
        }
        out
    }
}

/// The identifier after `at` in `chars` (past whitespace; empty if none)
/// and the text that follows it, trimmed (at most 200 characters read).
fn next_ident(chars: &[char], at: usize) -> (String, String) {
    let rest: String = chars[at..].iter().take(200).collect();
    let rest = rest.trim_start();
    let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
    let tail = rest[name.len()..].trim_start().to_owned();
    (name, tail)
}

/// The `::`-separated segments after `at` in `chars`, appended to
/// `path`, and where they end.
fn read_path(chars: &[char], at: usize, mut path: Vec<String>) -> (Vec<String>, usize) {
    let mut j = at;
    while chars[j..].starts_with(&[':', ':']) {
        let seg: String = chars[j + 2..]
            .iter()
            .take_while(|&&c| is_ident(c))
            .collect();
        if seg.is_empty() {
            break;
        }
        j += 2 + seg.chars().count();
        path.push(seg);
    }
    (path, j)
}

/// Whether `module` is a file of its own (before inline modules are known).
fn is_file_module(
    files: &std::collections::BTreeMap<String, Vec<String>>,
    module: &[String],
) -> bool {
    let p = module.join("/");
    files.contains_key(&format!("{p}.rs")) || files.contains_key(&format!("{p}/mod.rs"))
}

/// The module a file holds: `proxy/relay.rs` and `proxy/relay/mod.rs` are
/// `["proxy", "relay"]`, `lib.rs` is the root.
fn file_module(rel: &str) -> Vec<String> {
    let stem = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut parts: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The paths of a `use` tree (the text between `use` and `;`), each with
/// the name it brings in (`*` for a glob, `self` for `x::{self}`'s module
/// itself).
fn use_tree(tree: &str) -> Vec<(Vec<String>, String)> {
    fn walk(prefix: &[String], t: &str, out: &mut Vec<(Vec<String>, String)>) {
        let mut items = Vec::new();
        let (mut depth, mut start) = (0, 0);
        for (i, c) in t.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&t[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        items.push(&t[start..]);
        for item in items {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            if let Some(open) = item.find('{') {
                let head = item[..open].trim().trim_end_matches("::");
                let inner = item[open + 1..item.rfind('}').unwrap_or(item.len())].to_owned();
                let mut p = prefix.to_vec();
                p.extend(
                    head.split("::")
                        .filter(|s| !s.is_empty())
                        .map(|s| s.trim().to_owned()),
                );
                walk(&p, &inner, out);
                continue;
            }
            let (path, alias) = match item.split_once(" as ") {
                Some((p, a)) => (p.trim(), Some(a.trim())),
                None => (item, None),
            };
            let mut p = prefix.to_vec();
            p.extend(path.split("::").map(|s| s.trim().to_owned()));
            let last = p.last().cloned().unwrap_or_default();
            let name = alias.map_or(last.clone(), str::to_owned);
            if last == "*" || last == "self" {
                p.pop();
            }
            out.push((p, name));
        }
    }
    let flat: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    walk(
        &[],
        &flat.replace(":: ", "::").replace(" ::", "::"),
        &mut out,
    );
    out
}

// ---------------------------------------------------------------------------
// Files that read as one thing.
// ---------------------------------------------------------------------------

/// Lines of logic a file may hold (code outside comments and test
/// modules) before it is split.
const MAX_LOGIC_LINES: usize = 500;

/// Files over [`MAX_LOGIC_LINES`] today, with their size: each may shrink,
/// not grow, and leaves the list once it is under the limit; no other file
/// may pass it.
const OVERSIZED: &[(&str, usize)] = &[];

#[test]
fn mod_rs_files_are_maps() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut problems = Vec::new();
    for file in files.iter().filter(|f| {
        f.file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs")
    }) {
        let rel = file
            .strip_prefix(&root)
            .expect("under src")
            .display()
            .to_string();
        let source = std::fs::read_to_string(file).expect("readable source");
        for (line, why) in map_problems_in(&source) {
            problems.push(format!("src/{rel}:{line}: {why}"));
        }
    }
    assert!(
        problems.is_empty(),
        "a mod.rs (or lib.rs) holds its module's doc, its submodules and \
         re-exports, nothing else (STYLE.md §2):\n{}",
        problems.join("\n")
    );
}

#[test]
fn no_file_grows_past_the_limit_of_logic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut problems = Vec::new();
    let mut sizes = Vec::new();
    for file in &files {
        let rel = file
            .strip_prefix(&root)
            .expect("under src")
            .display()
            .to_string()
            .replace('\\', "/");
        if rel.ends_with("tests.rs") {
            continue;
        }
        let n = logic_lines(&std::fs::read_to_string(file).expect("readable source"));
        let listed = OVERSIZED.iter().find(|(f, _)| *f == rel).map(|(_, n)| *n);
        match listed {
            Some(was) if n > was => problems.push(format!(
                "src/{rel}: {n} lines of logic, up from {was}: split it rather than grow it"
            )),
            Some(_) if n <= MAX_LOGIC_LINES => problems.push(format!(
                "src/{rel}: {n} lines of logic, under the limit: remove it from OVERSIZED"
            )),
            Some(_) => {}
            None if n > MAX_LOGIC_LINES => problems.push(format!(
                "src/{rel}: {n} lines of logic, over the limit of {MAX_LOGIC_LINES}"
            )),
            None => {}
        }
        sizes.push((n, rel));
    }
    for (f, _) in OVERSIZED {
        if !sizes.iter().any(|(_, rel)| rel == f) {
            problems.push(format!("src/{f} is gone: remove it from OVERSIZED"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn logic_is_counted_outside_comments_and_test_modules() {
    let src = "//! doc\nuse x;\n\n/// item doc\nfn f() {\n    // note\n    g();\n}\n\
               #[cfg(test)]\nmod tests {\n    fn t() {}\n}\n";
    assert_eq!(logic_lines(src), 4);
    let map =
        "//! doc\n\npub mod a;\n#[cfg(test)]\nmod tests;\n\npub use a::{\n    B,\n    C,\n};\n";
    assert!(
        map_problems_in(map).is_empty(),
        "{:?}",
        map_problems_in(map)
    );
    let logic = "pub mod a;\nuse std::fmt;\nfn f() {}\n";
    let lines: Vec<usize> = map_problems_in(logic).iter().map(|(l, _)| *l).collect();
    assert_eq!(lines, [2, 3]);
}

/// Non-blank lines of code outside comments and `#[cfg(test)]` inline
/// modules.
fn logic_lines(source: &str) -> usize {
    let code = code_lines(source);
    let mut count = 0;
    let mut i = 0;
    while i < code.len() {
        let line = code[i].trim();
        let next = code.get(i + 1).map(|l| l.trim());
        if line == "#[cfg(test)]" && next.is_some_and(|n| n.starts_with("mod ") && n.ends_with('{'))
        {
            let mut depth = 0i32;
            let mut j = i + 1;
            while j < code.len() {
                depth += code[j].matches('{').count() as i32;
                depth -= code[j].matches('}').count() as i32;
                j += 1;
                if depth <= 0 {
                    break;
                }
            }
            i = j;
            continue;
        }
        if !line.is_empty() {
            count += 1;
        }
        i += 1;
    }
    count
}

/// The code lines of a `mod.rs` that are not its map: anything but module
/// declarations, attributes and `pub use` re-exports.
fn map_problems_in(source: &str) -> Vec<(usize, String)> {
    let code = code_lines(source);
    let mut out = Vec::new();
    let mut in_use = false;
    for (i, line) in code.iter().enumerate() {
        let l = line.trim();
        if l.is_empty() {
            continue;
        }
        if in_use {
            in_use = !l.ends_with(';');
            continue;
        }
        let is_mod = (l.starts_with("mod ") || l.starts_with("pub mod ")) && l.ends_with(';');
        let is_attr = l.starts_with("#[") || l.starts_with("#![");
        if l.starts_with("pub use ") {
            in_use = !l.ends_with(';');
            continue;
        }
        if !is_mod && !is_attr {
            out.push((i + 1, format!("not a map line: `{l}`")));
        }
    }
    out
}
