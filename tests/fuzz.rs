//! The fuzz targets of `fairway::fuzz` in every test run: each target gets
//! its seeds (`fuzz/seeds/<target>/`), every input a fuzzer ever found
//! (`fuzz/regressions/<target>/`, kept forever), then a short seeded
//! mutation run over the seeds and the target's dictionary
//! (`FAIRWAY_FUZZ_ITERS` inputs per target, default 3,000; the long,
//! coverage-guided runs are `fuzz/run.sh`'s).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect();
    out.sort();
    out
}

/// libFuzzer dictionary entries: `"..."` with `\xNN` and `\\`/`\"` escapes.
fn dictionary(path: &Path) -> Vec<Vec<u8>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| l.trim().strip_prefix('"')?.strip_suffix('"'))
        .map(|s| {
            let (mut out, b) = (Vec::new(), s.as_bytes());
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') && i + 3 < b.len() {
                    let hex = std::str::from_utf8(&b[i + 2..i + 4]).unwrap();
                    out.push(u8::from_str_radix(hex, 16).unwrap());
                    i += 4;
                } else if b[i] == b'\\' && i + 1 < b.len() {
                    out.push(b[i + 1]);
                    i += 2;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            out
        })
        .collect()
}

/// One random change: flip, set, insert or delete bytes, duplicate a run,
/// insert a dictionary word, or splice in part of another seed.
fn mutate(rng: &mut SmallRng, input: &mut Vec<u8>, dict: &[Vec<u8>], seeds: &[Vec<u8>]) {
    let len = input.len();
    let at = |rng: &mut SmallRng| {
        if len == 0 {
            0
        } else {
            rng.random_range(0..=len)
        }
    };
    match rng.random_range(0..7) {
        0 if len > 0 => {
            let i = rng.random_range(0..len);
            input[i] ^= 1 << rng.random_range(0..8);
        }
        1 if len > 0 => {
            let i = rng.random_range(0..len);
            input[i] = rng.random();
        }
        2 => {
            let i = at(rng);
            input.insert(i, rng.random());
        }
        3 if len > 0 => {
            let i = rng.random_range(0..len);
            let n = rng.random_range(1..=(len - i).min(16));
            input.drain(i..i + n);
        }
        4 if len > 0 => {
            let i = rng.random_range(0..len);
            let n = rng.random_range(1..=(len - i).min(32));
            let run = input[i..i + n].to_vec();
            let j = at(rng);
            input.splice(j..j, run);
        }
        5 if !dict.is_empty() => {
            let word = &dict[rng.random_range(0..dict.len())];
            let j = at(rng);
            input.splice(j..j, word.iter().copied());
        }
        _ if !seeds.is_empty() => {
            let other = &seeds[rng.random_range(0..seeds.len())];
            if !other.is_empty() {
                let i = rng.random_range(0..other.len());
                let n = rng.random_range(1..=(other.len() - i).min(64));
                let j = at(rng);
                input.splice(j..j, other[i..i + n].iter().copied());
            }
        }
        _ => input.push(rng.random()),
    }
}

/// Runs `target` on `input`; on a panic, writes the input where it can be
/// kept as a regression and fails with its path.
fn run_one(name: &str, target: fn(&[u8]), input: &[u8]) {
    if std::panic::catch_unwind(|| target(input)).is_err() {
        let dir = std::env::temp_dir().join(format!("fairway-fuzz-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("crash-{:016x}", fxhash(input)));
        std::fs::write(&path, input).unwrap();
        panic!(
            "fuzz target {name} failed on {} (copy it to fuzz/regressions/{name}/ once fixed)",
            path.display()
        );
    }
}

fn fxhash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn fuzz_targets_hold_their_properties_on_seeds_regressions_and_mutations() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let iters: usize = std::env::var("FAIRWAY_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000);
    for &(name, target) in fairway::fuzz::TARGETS {
        let seeds: Vec<Vec<u8>> = files(&root.join("seeds").join(name))
            .into_iter()
            .map(|(_, b)| b)
            .collect();
        assert!(!seeds.is_empty(), "no seeds for {name}");
        for (path, input) in files(&root.join("regressions").join(name)) {
            eprintln!("{name}: regression {}", path.display());
            run_one(name, target, &input);
        }
        for s in &seeds {
            run_one(name, target, s);
        }
        let dict = dictionary(&root.join("dict").join(format!("{name}.dict")));
        let mut rng = SmallRng::seed_from_u64(fxhash(name.as_bytes()));
        for _ in 0..iters {
            let mut input = seeds[rng.random_range(0..seeds.len())].clone();
            for _ in 0..rng.random_range(1..=8) {
                mutate(&mut rng, &mut input, &dict, &seeds);
            }
            run_one(name, target, &input);
        }
    }
}

#[test]
fn every_fuzz_target_has_a_cargo_fuzz_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    for &(name, _) in fairway::fuzz::TARGETS {
        let src = std::fs::read_to_string(root.join("fuzz_targets").join(format!("{name}.rs")))
            .unwrap_or_else(|e| panic!("fuzz/fuzz_targets/{name}.rs: {e}"));
        assert!(src.contains(&format!("fairway::fuzz::{name}(")), "{name}");
        assert!(manifest.contains(&format!("name = \"{name}\"")), "{name}");
    }
}
