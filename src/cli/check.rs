//! `fairway check`: policy files validated without serving.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{load_policy, summary};

/// Validates each policy file in `paths`, printing its summary or its
/// errors; fails if any is invalid.
pub fn check(paths: &[PathBuf]) -> ExitCode {
    let mut ok = true;
    for p in paths {
        match load_policy(p) {
            Ok((policy, _)) => println!("{}: ok: {}", p.display(), summary(&policy)),
            Err(errors) => {
                ok = false;
                for e in errors {
                    eprintln!("{e}");
                }
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
