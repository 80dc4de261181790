//! `[batch]`: the Files and Batch APIs' store and limits.

use std::time::Duration;

use super::reader::{Reader, Table, Zero};
use crate::config::policy::BatchPolicy;

pub(super) const BATCH_KEYS: &[&str] = &[
    "data_dir",
    "max_file_bytes",
    "max_lines",
    "max_files_per_tenant",
    "max_bytes_per_tenant",
    "resume",
    "checkpoint_tokens",
    "live_reserve",
    "live_latency_target",
    "engine_priority",
    "prefill_ahead",
    "window",
    "gpu_seconds_discount",
    "retention",
    "object_store",
    "object_store_endpoint",
];

/// OpenAI's limits: 200 MB and 50,000 requests an input file.
const MAX_FILE_BYTES: u64 = 200_000_000;
const MAX_LINES: usize = 50_000;
const MAX_FILES_PER_TENANT: usize = 1_000;
const MAX_BYTES_PER_TENANT: u64 = 10_000_000_000;
/// The completion window: OpenAI's 24 h, the one `completion_window`
/// names (`protocol::batch::WINDOW_SECONDS`).
const WINDOW: Duration = Duration::from_secs(24 * 3600);
/// How long an ended batch, its results and its output files are kept.
const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// Slots of each pool batch items leave to live work.
const LIVE_RESERVE: f64 = 0.0;

/// Reads `[batch]`; `None` when the section is absent.
pub(super) fn read_batch(r: &mut Reader<'_>, root: &Table<'_, '_>) -> Option<BatchPolicy> {
    let t = r.opt(root, "batch", Reader::table)?;
    r.check_keys(&t, BATCH_KEYS);
    let dir = r
        .opt(&t, "data_dir", Reader::non_empty)
        .unwrap_or_else(|| "fairway-data".to_owned());
    let dir = std::path::Path::new(&dir);
    let data_dir = match std::path::Path::new(r.file()).parent() {
        Some(base) if dir.is_relative() => base.join(dir),
        _ => dir.to_path_buf(),
    };
    let object_store = r.opt(&t, "object_store", |r, v, p| {
        let s = r.non_empty(v, p)?;
        let bucket = s
            .strip_prefix("s3://")
            .map(|b| b.split('/').next().unwrap_or(""));
        if bucket.is_none_or(str::is_empty) {
            r.error(
                v.span(),
                p,
                format!("\"{s}\" is not an object store; expected s3://bucket[/prefix]"),
            );
            return None;
        }
        if !root.has("cluster") {
            r.error(
                v.span(),
                p,
                "the shared batch store keeps batches in [cluster]'s store: add a [cluster] \
                 section, or remove object_store to keep batches in data_dir",
            );
            return None;
        }
        Some(s)
    });
    let object_store_endpoint = r.opt(&t, "object_store_endpoint", |r, v, p| {
        let s = r.non_empty(v, p)?;
        if !(s.starts_with("http://") || s.starts_with("https://")) {
            r.error(
                v.span(),
                p,
                format!("\"{s}\" is not an http:// or https:// URL"),
            );
            return None;
        }
        Some(s)
    });
    Some(BatchPolicy {
        object_store,
        object_store_endpoint,
        data_dir,
        max_file_bytes: r
            .opt(&t, "max_file_bytes", Reader::positive_int)
            .unwrap_or(MAX_FILE_BYTES),
        max_lines: r
            .opt(&t, "max_lines", Reader::positive_int)
            .unwrap_or(MAX_LINES),
        max_files_per_tenant: r
            .opt(&t, "max_files_per_tenant", Reader::positive_int)
            .unwrap_or(MAX_FILES_PER_TENANT),
        max_bytes_per_tenant: r
            .opt(&t, "max_bytes_per_tenant", Reader::positive_int)
            .unwrap_or(MAX_BYTES_PER_TENANT),
        resume: r.opt(&t, "resume", Reader::boolean).unwrap_or(true),
        checkpoint_tokens: r
            .opt(&t, "checkpoint_tokens", Reader::non_negative_int)
            .unwrap_or(BatchPolicy::CHECKPOINT_TOKENS),
        live_reserve: r
            .opt(&t, "live_reserve", Reader::share)
            .unwrap_or(LIVE_RESERVE),
        live_latency_target: r
            .opt(&t, "live_latency_target", Reader::number)
            .map_or(0.0, |v: f64| if v > 0.0 { v.max(1.0) } else { 0.0 }),
        engine_priority: r
            .opt(&t, "engine_priority", Reader::non_negative_int)
            .unwrap_or(0),
        prefill_ahead: r
            .opt(&t, "prefill_ahead", Reader::non_negative_int)
            .unwrap_or(BatchPolicy::PREFILL_AHEAD),
        window: r
            .opt(&t, "window", |r, v, p| r.duration(v, p, Zero::Refused))
            .map_or(WINDOW, |d| d.max(Duration::from_secs(1))),
        gpu_seconds_discount: r
            .opt(&t, "gpu_seconds_discount", Reader::share)
            .unwrap_or(0.0),
        retention: r
            .opt(&t, "retention", |r, v, p| r.duration(v, p, Zero::Refused))
            .map_or(RETENTION, |d| d.max(Duration::from_secs(1))),
    })
}
