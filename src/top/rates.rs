//! Windowed figures between two scrapes: counter increases (a counter
//! that went down restarted from zero) and p99s over the histogram
//! observations made in the window.

use std::collections::BTreeMap;

use super::snapshot::ByModel;
use crate::poller::{HistogramBucket, quantile};

/// The quantile shown for latencies.
pub(super) const P99: f64 = 0.99;

/// Adds `add` into `acc` bound by bound.
pub(super) fn merge(acc: &mut Vec<HistogramBucket>, add: &[HistogramBucket]) {
    for b in add {
        match acc.iter_mut().find(|x| x.le == b.le) {
            Some(x) => x.count += b.count,
            None => acc.push(*b),
        }
    }
}

/// The observations between two scrapes of one histogram: `cur - prev`
/// bound by bound. When a count went down or the bounds changed (a restart
/// or a reconfiguration), `cur` itself: everything it holds is new.
pub(super) fn bucket_delta(
    prev: &[HistogramBucket],
    cur: &[HistogramBucket],
) -> Vec<HistogramBucket> {
    if prev.len() != cur.len() {
        return cur.to_vec();
    }
    let mut out = Vec::with_capacity(cur.len());
    for c in cur {
        match prev.iter().find(|p| p.le == c.le) {
            Some(p) if c.count >= p.count => out.push(HistogramBucket {
                le: c.le,
                count: c.count - p.count,
            }),
            _ => return cur.to_vec(),
        }
    }
    out
}

/// The p99 of the observations between `prev` and `cur`, or of all of
/// `cur` when there is no `prev` or nothing new was observed.
pub(super) fn p99_between(
    prev: Option<&[HistogramBucket]>,
    cur: &[HistogramBucket],
) -> Option<f64> {
    prev.and_then(|p| quantile(P99, &bucket_delta(p, cur)))
        .or_else(|| quantile(P99, cur))
}

/// Like [`p99_between`] for per-model histograms, summed over models: each
/// model's window is taken on its own (so one model's restart does not
/// hide another's observations), then the windows are added up.
pub(super) fn p99_by_model(prev: Option<&ByModel>, cur: &ByModel) -> Option<f64> {
    let windowed = prev.and_then(|p| {
        let mut delta = Vec::new();
        for (model, c) in cur {
            match p.get(model) {
                Some(pb) => merge(&mut delta, &bucket_delta(pb, c)),
                None => merge(&mut delta, c),
            }
        }
        quantile(P99, &delta)
    });
    windowed.or_else(|| {
        let mut all = Vec::new();
        for c in cur.values() {
            merge(&mut all, c);
        }
        quantile(P99, &all)
    })
}

/// How much one counter grew from `prev` (absent: 0) to `cur`. A counter
/// that went down restarted from zero, so it grew by `cur`. Never negative.
pub(super) fn series_increase(prev: Option<f64>, cur: f64) -> f64 {
    let p = prev.unwrap_or(0.0);
    let d = if cur >= p { cur - p } else { cur };
    if d.is_finite() { d.max(0.0) } else { 0.0 }
}

/// The summed increase of the series in `cur` that `keep` selects.
pub(super) fn increase<K: Ord>(
    prev: Option<&BTreeMap<K, f64>>,
    cur: &BTreeMap<K, f64>,
    keep: impl Fn(&K) -> bool,
) -> f64 {
    cur.iter()
        .filter(|&(k, _)| keep(k))
        .map(|(k, v)| series_increase(prev.and_then(|p| p.get(k)).copied(), *v))
        .sum()
}
