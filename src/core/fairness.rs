//! Jain's fairness index over backlogged tenants' weighted service, per
//! window.
//!
//! The caller samples, at any cadence, each tenant's cumulative weighted
//! service (service divided by the tenant's weight, in whatever unit it
//! measures: tokens in the replay, tokens of finished requests live) and
//! whether it is backlogged (has requests queued). When a window closes,
//! the tenants backlogged at every sample of it are compared: Jain's index
//! `(Σx)² / (n·Σx²)` of their service in the window is 1 when they got
//! equal weighted service and 1/n when one got everything. A window with
//! fewer than two such tenants has no index: fairness only means something
//! among tenants that all wanted more.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::core::time::Instant;

/// Jain's index of `xs`; `None` when empty or all zero.
pub fn jain(xs: &[f64]) -> Option<f64> {
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    (!xs.is_empty() && sq > 0.0).then(|| sum * sum / (xs.len() as f64 * sq))
}

/// Windowed Jain's index over backlogged tenants.
#[derive(Clone, Debug)]
pub struct FairnessMeter {
    window: Duration,
    start: Option<Instant>,
    /// Cumulative service at the window's start.
    base: Vec<f64>,
    /// Backlogged at every sample so far in this window.
    always: Vec<bool>,
    last: Option<f64>,
    /// Sum and count of closed windows' indices.
    total: f64,
    windows: u32,
}

impl FairnessMeter {
    pub fn new(window: Duration) -> Self {
        FairnessMeter {
            window,
            start: None,
            base: Vec::new(),
            always: Vec::new(),
            last: None,
            total: 0.0,
            windows: 0,
        }
    }

    /// Records a sample; `service[i]` and `backlogged[i]` are tenant `i`'s.
    /// Returns the index of a window this sample closed, if it had one.
    pub fn sample(&mut self, now: Instant, service: &[f64], backlogged: &[bool]) -> Option<f64> {
        let n = service.len().min(backlogged.len());
        let Some(start) = self.start else {
            self.open(now, service, backlogged);
            return None;
        };
        if self.always.len() < n {
            // A tenant added since the window opened: not in this window.
            self.always.resize(n, false);
            self.base.resize(n, 0.0);
        }
        for (a, b) in self.always.iter_mut().zip(backlogged) {
            *a &= *b;
        }
        if now.saturating_since(start) < self.window {
            return None;
        }
        let got: Vec<f64> = (0..n)
            .filter(|&i| self.always[i])
            .map(|i| (service[i] - self.base[i]).max(0.0))
            .collect();
        let index = if got.len() >= 2 { jain(&got) } else { None };
        if let Some(j) = index {
            self.last = Some(j);
            self.total += j;
            self.windows += 1;
        }
        self.open(now, service, backlogged);
        index
    }

    fn open(&mut self, now: Instant, service: &[f64], backlogged: &[bool]) {
        self.start = Some(now);
        self.base.clear();
        self.base.extend_from_slice(service);
        self.always.clear();
        self.always.extend_from_slice(backlogged);
    }

    /// The latest closed window's index.
    pub fn last(&self) -> Option<f64> {
        self.last
    }

    /// Mean over every closed window that had an index.
    pub fn mean(&self) -> Option<f64> {
        (self.windows > 0).then(|| self.total / f64::from(self.windows))
    }
}

/// Jain's index over whole backlogged periods: every sample interval in
/// which the same set of two or more tenants was backlogged adds their
/// weighted service to that set's totals, wherever in the run it falls.
/// The caller samples whenever the backlogged set changes (and at any
/// other time), so a sample's set holds until the next one: a tenant
/// queued for a few milliseconds counts for those milliseconds. The index
/// is each set's Jain's index of its totals, averaged
/// over sets by the time spent in each. Unlike fixed windows, it does not
/// depend on where window edges fall, and a short backlog (a burst the
/// scheduler serves in two seconds) counts as much as its duration.
#[derive(Clone, Debug, Default)]
pub struct BackloggedService {
    prev: Option<(Instant, Vec<f64>, Vec<bool>)>,
    /// Backlogged set (tenant indices) → (time in it, service per member).
    sets: BTreeMap<Vec<usize>, (Duration, Vec<f64>)>,
}

impl BackloggedService {
    /// Records a sample; `service[i]` and `backlogged[i]` are tenant `i`'s,
    /// `backlogged` from `now` until the next sample.
    pub fn sample(&mut self, now: Instant, service: &[f64], backlogged: &[bool]) {
        if let Some((then, before, was)) = &self.prev {
            let set: Vec<usize> = (0..service.len().min(was.len()))
                .filter(|&i| was[i])
                .collect();
            if set.len() >= 2 {
                let (time, got) = self
                    .sets
                    .entry(set.clone())
                    .or_insert_with(|| (Duration::ZERO, vec![0.0; set.len()]));
                *time += now.saturating_since(*then);
                for (g, &i) in got.iter_mut().zip(&set) {
                    *g += (service[i] - before.get(i).copied().unwrap_or(0.0)).max(0.0);
                }
            }
        }
        self.prev = Some((now, service.to_vec(), backlogged.to_vec()));
    }

    /// The time-weighted mean of each backlogged set's index; `None` when
    /// no two tenants were ever backlogged together.
    pub fn index(&self) -> Option<f64> {
        let (mut sum, mut time) = (0.0, 0.0);
        for (t, got) in self.sets.values() {
            if let Some(j) = jain(got) {
                sum += j * t.as_secs_f64();
                time += t.as_secs_f64();
            }
        }
        (time > 0.0).then(|| sum / time)
    }

    /// By tenant index: the service each tenant got while backlogged with
    /// others, over its weighted fair share of what that set got (`w[i]`
    /// over the set's weights, of the set's service): 1 is exactly its
    /// share, below 1 less. `None` for a tenant never backlogged with
    /// another.
    pub fn shares(&self, weights: &[f64]) -> Vec<Option<f64>> {
        let w = |i: usize| weights.get(i).copied().unwrap_or(1.0);
        let mut got = vec![0.0; weights.len()];
        let mut fair = vec![0.0; weights.len()];
        for (set, (_, service)) in &self.sets {
            // `service` is weighted (service over weight): back to service.
            let total: f64 = set.iter().zip(service).map(|(&i, x)| x * w(i)).sum();
            let weight: f64 = set.iter().map(|&i| w(i)).sum();
            for (&i, x) in set.iter().zip(service) {
                if i < got.len() {
                    got[i] += x * w(i);
                    fair[i] += total * w(i) / weight;
                }
            }
        }
        got.iter()
            .zip(&fair)
            .map(|(g, f)| (*f > 0.0).then(|| g / f))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: u64) -> Instant {
        Instant::from_nanos(s * 1_000_000_000)
    }

    #[test]
    fn jain_bounds() {
        assert_eq!(jain(&[]), None);
        assert_eq!(jain(&[0.0, 0.0]), None);
        assert_eq!(jain(&[3.0, 3.0, 3.0]), Some(1.0));
        assert_eq!(jain(&[5.0, 0.0]), Some(0.5));
    }

    #[test]
    fn only_tenants_backlogged_all_window_count() {
        let mut m = FairnessMeter::new(Duration::from_secs(10));
        assert_eq!(m.sample(t(0), &[0.0, 0.0, 0.0], &[true, true, true]), None);
        // Tenant 2 drains mid-window: it is left out.
        m.sample(t(5), &[5.0, 0.0, 1.0], &[true, true, false]);
        let j = m.sample(t(10), &[10.0, 0.0, 1.0], &[true, true, true]);
        assert_eq!(j, Some(0.5), "tenant 1 starved while backlogged");
        // Next window: equal service.
        let j = m.sample(t(20), &[20.0, 10.0, 11.0], &[true, true, true]);
        assert_eq!(j, Some(1.0));
        assert_eq!(m.mean(), Some(0.75));
        // A window with one backlogged tenant has no index.
        let j = m.sample(t(30), &[30.0, 10.0, 11.0], &[true, false, false]);
        assert_eq!(j, None);
        assert_eq!(m.last(), Some(1.0));
    }

    #[test]
    fn backlogged_periods_add_up_wherever_they_fall() {
        let mut m = BackloggedService::default();
        assert_eq!(m.index(), None);
        // 0–1 s: tenants 0 and 1 backlogged; 1 gets twice 0's service.
        m.sample(t(0), &[0.0, 0.0, 0.0], &[true, true, false]);
        // 1–4 s: tenant 1 is not backlogged: no pair, whatever it is served.
        m.sample(t(1), &[1.0, 2.0, 0.0], &[true, false, false]);
        m.sample(t(4), &[4.0, 4.0, 0.0], &[true, true, false]);
        // 4–6 s: 0 and 1 again, 0 gets twice 1's: the set's totals over
        // its 3 s are [1 + 2, 2 + 1], even.
        m.sample(t(6), &[6.0, 5.0, 0.0], &[true, true, true]);
        assert_eq!(m.index(), Some(1.0));
        // 6–8 s: all three backlogged, 2 gets everything: 1/3 for 2 s.
        m.sample(t(8), &[6.0, 5.0, 3.0], &[true, true, true]);
        let want = (3.0 * 1.0 + 2.0 / 3.0) / 5.0;
        assert!((m.index().unwrap() - want).abs() < 1e-12, "{:?}", m.index());
        // Shares at weights 1: tenants 0 and 1 got 3 each of the pair's 6
        // (their share), then nothing of the trio's 3 (1 each was theirs);
        // tenant 2 got all 3 of it.
        let shares = m.shares(&[1.0, 1.0, 1.0]);
        assert_eq!(shares, vec![Some(3.0 / 4.0), Some(3.0 / 4.0), Some(3.0)]);
        // Tenant 1 at weight 2: its weighted service 3 is 6 of service; in
        // the pair (6 of 9) its share was 2/3 of 9, exactly; in the trio
        // its share was half of 3.
        let shares = m.shares(&[1.0, 2.0, 1.0]);
        assert_eq!(shares[1], Some(6.0 / 7.5));
    }
}
