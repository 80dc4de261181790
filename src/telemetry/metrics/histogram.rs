//! The histograms of the exposition: buckets counted with atomics on the
//! request path, read at scrape, written cumulatively; the latency ladder
//! and the bracket each tenant's SLO targets add to it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{TM, tm};
use crate::prom::{self, Kind};

pub(super) const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
pub(super) const OVERHEAD_BUCKETS: &[f64] = &[
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05,
];
pub(super) const TPOT_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0];
/// Around an SLO target: its own bucket, and four beside it, so that
/// `histogram_quantile` near the target (and `fairway top`'s fallback)
/// interpolates within 10-25 % of it rather than across a factor of two,
/// and the share within the target is exact.
const SLO_BRACKET: &[f64] = &[0.8, 0.9, 1.0, 1.1, 1.25];

/// The latency buckets with the SLO target's bracket added (to 0.1 ms).
pub(super) fn latency_buckets(slo: Option<f64>) -> Vec<f64> {
    let mut b = LATENCY_BUCKETS.to_vec();
    if let Some(s) = slo.filter(|s| s.is_finite() && *s > 0.0) {
        b.extend(SLO_BRACKET.iter().map(|f| (s * f * 1e4).round() / 1e4));
    }
    b.retain(|x| *x > 0.0);
    b.sort_by(f64::total_cmp);
    b.dedup_by(|a, b| (*a - *b).abs() < 1e-9);
    b
}

/// A histogram's values at one scrape (per bucket, not cumulative).
#[derive(Clone, Debug)]
pub(super) struct Histogram {
    bounds: Arc<[f64]>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// A histogram recorded with atomics: one counter per bucket (the last for
/// values past every bound) and the sum as `f64` bits.
#[derive(Debug)]
pub(super) struct AtomicHistogram {
    bounds: Arc<[f64]>,
    counts: Box<[AtomicU64]>,
    sum: AtomicF64,
}

impl AtomicHistogram {
    pub(super) fn new(bounds: impl Into<Arc<[f64]>>) -> Self {
        let bounds = bounds.into();
        AtomicHistogram {
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            bounds,
            sum: AtomicF64::default(),
        }
    }

    pub(super) fn observe(&self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum.add(v);
    }

    /// What it holds now, if it has seen a value; the count is the sum of
    /// the buckets, so the exposition stays consistent while it moves.
    pub(super) fn read(&self) -> Option<Histogram> {
        let all: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let count = all.iter().sum();
        (count > 0).then(|| Histogram {
            bounds: self.bounds.clone(),
            counts: all[..self.bounds.len()].to_vec(),
            sum: self.sum.get(),
            count,
        })
    }
}

/// An `f64` counter on an `AtomicU64`.
#[derive(Debug, Default)]
pub(super) struct AtomicF64(AtomicU64);

impl AtomicF64 {
    pub(super) fn add(&self, v: f64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some((f64::from_bits(b) + v).to_bits())
            });
    }
    pub(super) fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

impl Histogram {
    /// Writes it under `f` with `labels`.
    pub(super) fn write(&self, f: &mut prom::Family, labels: &prom::Labels) {
        f.histogram(labels, &self.bounds, &self.counts, self.sum, self.count);
    }
}

/// A histogram family by (tenant, model) key.
pub(super) fn hist_tm(w: &mut String, name: &str, help: &str, m: &BTreeMap<TM, Histogram>) {
    let mut f = prom::family(w, name, Kind::Histogram, help);
    for (k, h) in m {
        h.write(&mut f, &tm(k));
    }
}
