//! The README to the letter: every `sh` block in it is marked with what
//! it needs (`<!-- readme-test: … -->` on the line before), and every
//! block that can run offline runs here as written, with the binary
//! `cargo test` built (the commands' `fairway` and `cargo run --release
//! --`): the first command serves the embedded default, the "Try it" block
//! runs against it, the other commands run on their own. Only the test
//! command itself is left out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::BufRead;
use std::net::TcpListener;
use std::process::{Command, Stdio};

/// A fenced `sh` block and the marker before it.
struct Block {
    marker: Option<String>,
    body: String,
    line: usize,
}

fn blocks(readme: &str) -> Vec<Block> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() == "```sh" {
            let marker = i
                .checked_sub(1)
                .and_then(|p| lines[p].strip_prefix("<!-- readme-test: "))
                .and_then(|m| m.strip_suffix(" -->"))
                .map(str::to_owned);
            let start = i + 1;
            let mut end = start;
            while end < lines.len() && lines[end].trim_end() != "```" {
                end += 1;
            }
            out.push(Block {
                marker,
                body: lines[start..end].join("\n"),
                line: i + 1,
            });
            i = end;
        }
        i += 1;
    }
    out
}

/// The commands' `fairway` (and `cargo run --release --`): the binary
/// `cargo test` built.
fn script(body: &str) -> String {
    let bin = env!("CARGO_BIN_EXE_fairway");
    format!(
        "set -euo pipefail\nfairway() {{ \"{bin}\" \"$@\"; }}\n\
         curl() {{ command curl --fail --show-error --max-time 30 \"$@\"; }}\n{}\n",
        body.replace("cargo run --release --", "fairway")
    )
}

fn run(label: &str, body: &str, dir: &std::path::Path) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(script(body))
        .current_dir(dir)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{label} failed ({}):\n{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        body,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn every_command_block_of_the_readme_runs_as_written() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks = blocks(&readme);
    let kind = |k: &str| -> Vec<&Block> {
        blocks
            .iter()
            .filter(|b| b.marker.as_deref().is_some_and(|m| m.starts_with(k)))
            .collect()
    };
    for b in &blocks {
        let m = b.marker.as_deref().unwrap_or_else(|| {
            panic!(
                "README.md:{}: an sh block without a readme-test marker",
                b.line
            )
        });
        assert!(
            ["serve", "against the gateway", "offline", "skip, "]
                .iter()
                .any(|k| m.starts_with(k)),
            "README.md:{}: unknown marker {m:?}",
            b.line
        );
    }
    let [serve] = kind("serve")[..] else {
        panic!("one serve block")
    };
    assert!(!kind("against the gateway").is_empty() && !kind("offline").is_empty());

    // The first command, in a folder of its own whose config/fairway.toml
    // is the shipped one on free ports (the commands' 8080 and 9090 follow).
    let dir = std::env::temp_dir().join(format!("fairway-readme-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("config")).unwrap();
    let (port, admin) = (free_port(), free_port());
    let policy = std::fs::read_to_string(root.join("config/fairway.toml"))
        .unwrap()
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"))
        .replace("127.0.0.1:9090", &format!("127.0.0.1:{admin}"));
    std::fs::write(dir.join("config/fairway.toml"), policy).unwrap();
    let args: Vec<&str> = serve
        .body
        .trim()
        .strip_prefix("cargo run --release --")
        .expect("the serve block is `cargo run --release -- …`")
        .split_whitespace()
        .collect();
    let mut gw = Command::new(env!("CARGO_BIN_EXE_fairway"))
        .args(&args)
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut out = std::io::BufReader::new(gw.stdout.take().unwrap());
    out.read_line(&mut first).unwrap();
    // The rest of its stdout is read to the end: a pipe closed early would
    // fail its next line (a write to a closed pipe), and it would stop.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    assert!(first.contains(&format!("127.0.0.1:{port}")), "{first}");
    let ready = format!("curl -s http://127.0.0.1:{admin}/readyz");
    for _ in 0..100 {
        if Command::new("bash")
            .arg("-c")
            .arg(&ready)
            .output()
            .unwrap()
            .status
            .success()
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for b in kind("against the gateway") {
        let body = b
            .body
            .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"))
            .replace("127.0.0.1:9090", &format!("127.0.0.1:{admin}"));
        let out = run(&format!("README.md:{}", b.line), &body, &dir);
        assert!(out.contains("llama-3.1-8b-sim"), "{out}");
    }
    let _ = gw.kill();
    let _ = gw.wait();

    for b in kind("offline") {
        run(&format!("README.md:{}", b.line), &b.body, root);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
