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
use super::table::write_table;
use crate::poller::Sample;

/// One tenant's batch figures in one scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct BatchFigures {
    /// Items of unfinished batches by state.
    items: BTreeMap<String, f64>,
    preempted: Option<f64>,
    resumed: Option<f64>,
    tokens_saved: Option<f64>,
    /// Each running batch's slack (expiry less projected completion).
    slack: Vec<f64>,
}

/// Folds in a `fairway_batch*` sample of `tenant`; other families are
/// ignored.
pub(super) fn add(all: &mut BTreeMap<String, BatchFigures>, tenant: &str, s: &Sample) {
    let f = || BatchFigures::default();
    let v = s.value;
    match s.name.as_str() {
        "fairway_batch_items" => {
            let state = s.label("state").unwrap_or("").to_owned();
            let t = all.entry(tenant.to_owned()).or_insert_with(f);
            *t.items.entry(state).or_insert(0.0) += v;
        }
        "fairway_batch_items_preempted_total" => {
            all.entry(tenant.to_owned()).or_insert_with(f).preempted = Some(v);
        }
        "fairway_batch_items_resumed_total" => {
            all.entry(tenant.to_owned()).or_insert_with(f).resumed = Some(v);
        }
        "fairway_batch_resume_tokens_saved_total" => {
            all.entry(tenant.to_owned()).or_insert_with(f).tokens_saved = Some(v);
        }
        "fairway_batch_deadline_slack_seconds" if v.is_finite() => {
            all.entry(tenant.to_owned()).or_insert_with(f).slack.push(v);
        }
        _ => {}
    }
}

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

#[cfg(test)]
mod tests {
    use super::super::Snapshot;
    use super::super::render;

    const BODY: &str = "\
fairway_batch_items{tenant=\"evals\",state=\"pending\"} 80
fairway_batch_items{tenant=\"evals\",state=\"running\"} 8
fairway_batch_items{tenant=\"evals\",state=\"completed\"} 12
fairway_batch_items{tenant=\"evals\",state=\"failed\"} 0
fairway_batch_items_preempted_total{tenant=\"evals\"} PRE
fairway_batch_items_resumed_total{tenant=\"evals\"} PRE
fairway_batch_resume_tokens_saved_total{tenant=\"evals\"} TOK
fairway_batch_deadline_slack_seconds{tenant=\"evals\",batch=\"batch_a\"} 3600
fairway_batch_deadline_slack_seconds{tenant=\"evals\",batch=\"batch_b\"} -90
";

    fn row(text: &str) -> Vec<String> {
        let line = text.lines().find(|l| l.starts_with("evals ")).unwrap();
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn the_batch_lane_shows_items_resume_rates_and_late_batches() {
        let at = |t: f64, pre: &str, tok: &str| {
            let body = BODY.replace("PRE", pre).replace("TOK", tok);
            Snapshot::from_text(&body, t).unwrap()
        };
        let (a, b) = (at(0.0, "10", "1000"), at(10.0, "30", "5000"));
        let text = render(Some(&a), &b, 200);
        assert!(text.contains("batch lane"), "{text}");
        assert_eq!(
            row(&text),
            [
                "evals", "80", "8", "12", "0", "2.0", "2.0", "400", "1", "of", "2", "-90.00s"
            ],
            "{text}"
        );
        // Without batch figures there is no such table.
        let plain = Snapshot::from_text("fairway_jain_fairness_index 1\n", 0.0).unwrap();
        assert!(!render(None, &plain, 200).contains("batch lane"));
    }
}
