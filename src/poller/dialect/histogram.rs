//! Histograms in a scrape: cumulative buckets summed across series, their
//! quantile as Prometheus computes it, and the window that turns two
//! consecutive scrapes into the p99 of what was observed in between.

use crate::poller::expo::{Sample, parse_float};

/// The quantile every window reports.
const P99: f64 = 0.99;

/// One cumulative histogram bucket: observations at or below `le`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HistogramBucket {
    /// Upper bound; `f64::INFINITY` for the `+Inf` bucket.
    pub le: f64,
    /// Cumulative count.
    pub count: f64,
}

/// Collects histogram family `family`'s buckets from `samples`, summed by
/// `le` across series and sorted by bound. Reads `family_bucket{le=...}`
/// lines, and bare `family{le=...}` lines when `bare` is set (Triton's
/// documentation shows that form). Buckets with a `NaN` bound or a
/// non-finite or negative count are skipped.
pub fn collect_buckets<'a, I>(samples: I, family: &str, bare: bool) -> Vec<HistogramBucket>
where
    I: IntoIterator<Item = &'a Sample>,
{
    let mut out: Vec<HistogramBucket> = Vec::new();
    for s in samples {
        let is_bucket = s
            .name
            .strip_prefix(family)
            .is_some_and(|rest| rest == "_bucket" || (bare && rest.is_empty()));
        if !is_bucket || !s.value.is_finite() || s.value < 0.0 {
            continue;
        }
        let Some(le) = s.label("le").and_then(parse_float) else {
            continue;
        };
        if le.is_nan() {
            continue;
        }
        match out.iter_mut().find(|b| b.le == le) {
            Some(b) => b.count += s.value,
            None => out.push(HistogramBucket { le, count: s.value }),
        }
    }
    out.sort_by(|a, b| a.le.total_cmp(&b.le));
    out
}

/// The `q` quantile of cumulative `buckets`, as Prometheus'
/// `histogram_quantile` computes it: find the bucket holding rank
/// `q × total`, then interpolate linearly between its lower and upper bound
/// (the lowest bucket's lower bound is 0). A rank in the `+Inf` bucket gives
/// the largest finite bound.
///
/// `None` when `q` is outside 0..=1, there is no `+Inf` bucket, no finite
/// bucket, or no observation. Buckets need not be sorted; counts that go
/// down with a rising bound are raised to keep the series monotonic.
pub fn quantile(q: f64, buckets: &[HistogramBucket]) -> Option<f64> {
    if !(0.0..=1.0).contains(&q) || buckets.len() < 2 {
        return None;
    }
    let mut b: Vec<HistogramBucket> = buckets.to_vec();
    b.sort_by(|x, y| x.le.total_cmp(&y.le));
    let last = b.len() - 1;
    if b[last].le != f64::INFINITY {
        return None;
    }
    let mut max = 0.0_f64;
    for bucket in &mut b {
        max = max.max(bucket.count);
        bucket.count = max;
    }
    let total = b[last].count;
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let i = b.iter().position(|x| x.count >= rank).unwrap_or(last);
    if i == last {
        return Some(b[last - 1].le);
    }
    if i == 0 && b[0].le <= 0.0 {
        return Some(b[0].le);
    }
    let (start, below) = if i == 0 {
        (0.0, 0.0)
    } else {
        (b[i - 1].le, b[i - 1].count)
    };
    let end = b[i].le;
    let in_bucket = b[i].count - below;
    if in_bucket.is_nan() || in_bucket <= 0.0 {
        return Some(end);
    }
    Some(start + (end - start) * ((rank - below) / in_bucket))
}

/// The previous scrape's cumulative buckets of one histogram, so that each
/// new scrape yields the quantile of the observations since the last one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramWindow {
    prev: Option<Vec<HistogramBucket>>,
}

impl HistogramWindow {
    pub fn new() -> Self {
        HistogramWindow::default()
    }

    /// Forgets the baseline; the next scrape becomes the new one.
    pub fn reset(&mut self) {
        self.prev = None;
    }

    /// Takes the new scrape's cumulative buckets (as from
    /// [`collect_buckets`]) and returns the p99 of the delta since the
    /// previous scrape. See [`Self::observe_quantile`].
    pub fn observe(&mut self, buckets: &[HistogramBucket]) -> Option<f64> {
        self.observe_quantile(P99, buckets)
    }

    /// Like [`Self::observe`] for any quantile `q`. Returns `None`:
    /// - on the first scrape (there is no baseline yet);
    /// - when nothing was observed since the previous scrape;
    /// - when any bucket count went down, or the set of bounds changed
    ///   (the backend restarted or was reconfigured): the new scrape becomes
    ///   the baseline;
    /// - when `buckets` is empty (the histogram vanished): the baseline is
    ///   dropped.
    pub fn observe_quantile(&mut self, q: f64, buckets: &[HistogramBucket]) -> Option<f64> {
        if buckets.is_empty() {
            self.prev = None;
            return None;
        }
        let prev = self.prev.replace(buckets.to_vec())?;
        if prev.len() != buckets.len() {
            return None;
        }
        let mut delta = Vec::with_capacity(buckets.len());
        for (old, new) in prev.iter().zip(buckets) {
            if old.le != new.le {
                return None;
            }
            let d = new.count - old.count;
            if d.is_nan() || d < 0.0 {
                return None;
            }
            delta.push(HistogramBucket {
                le: new.le,
                count: d,
            });
        }
        quantile(q, &delta)
    }
}
