//! The batch lane in `fairway top`: each tenant's items of unfinished
//! batches by state, the rates at which live work preempted them and they
//! resumed, and whether its batches will make their windows.
//!
//! From `fairway_batch_items{tenant,state}`,
//! `fairway_batch_items_{preempted,resumed}_total{tenant}`,
//! `fairway_batch_resume_tokens_saved_total{tenant}` and
//! `fairway_batch_deadline_slack_seconds{tenant,batch}`.

use std::collections::BTreeMap;

use super::format::{fmt_count, fmt_duration, fmt_rate};
use super::rates::series_increase;
use super::snapshot::BatchFigures;
use super::table::write_table;

/// The batch lane's table; nothing when no tenant has batch figures.
pub(super) fn render(
    prev: Option<&BTreeMap<String, BatchFigures>>,
    cur: &BTreeMap<String, BatchFigures>,
    dt: Option<f64>,
    out: &mut String,
    width: usize,
) {
    if cur.is_empty() {
        return;
    }
    let mut rows = Vec::new();
    for (name, b) in cur {
        let was = prev.and_then(|p| p.get(name));
        let rate = |cur: Option<f64>, prev: Option<f64>| match (cur, dt) {
            (Some(c), Some(d)) => fmt_rate(series_increase(prev, c) / d),
            _ => "-".to_owned(),
        };
        let state = |s: &str| fmt_count(b.items.get(s).copied());
        let late = b.slack.iter().filter(|s| **s < 0.0).count();
        let least = b.slack.iter().copied().reduce(f64::min);
        let slack = match least {
            Some(s) if s < 0.0 => format!("-{}", fmt_duration(-s)),
            Some(s) => fmt_duration(s),
            None => "-".to_owned(),
        };
        rows.push(vec![
            name.clone(),
            state("pending"),
            state("running"),
            state("completed"),
            state("failed"),
            rate(b.preempted, was.and_then(|w| w.preempted)),
            rate(b.resumed, was.and_then(|w| w.resumed)),
            rate(b.tokens_saved, was.and_then(|w| w.tokens_saved)),
            format!("{late} of {}", b.slack.len()),
            slack,
        ]);
    }
    write_table(
        out,
        &[
            "batch lane",
            "pending",
            "running",
            "done",
            "failed",
            "preempt/s",
            "resumed/s",
            "kept tok/s",
            "late",
            "least slack",
        ],
        &[
            true, false, false, false, false, false, false, false, false, false,
        ],
        &rows,
        width,
    );
    out.push('\n');
}
