//! Per-tenant usage windows: what the tenant usage API and page show, from
//! memory, over the last 5 minutes, hour and day.
//!
//! Each tenant has two rings of buckets: 60 one-minute buckets (the 5-minute
//! and 1-hour windows, and the per-minute series the page plots) and 25
//! one-hour buckets (the 24-hour window, its oldest hour counted whole).
//! A bucket counts outcomes
//! (each refusal reason its own), goodput, preemptions and GPU-seconds, and
//! keeps a TTFT and an e2e sketch (DDSketch: quantiles within 2 % of
//! the true ones, clamped to the samples' range, mergeable). Memory per
//! tenant is bounded whatever the traffic or the time it runs: the
//! counters are fixed, a sketch is made on a bucket's first sample and
//! holds at most [`MAX_BINS`] bins; a bucket whose minute has passed is
//! reused.
//!
//! Sans-IO: every call takes the wall-clock time in unix seconds.

use serde::{Deserialize, Serialize};
use sketches_ddsketch::{Config, DDSketch};

use crate::outcome::Outcome;

const MINUTE: u64 = 60;
const HOUR: u64 = 3600;
const MINUTES: usize = 60;
/// 24 hours and the one under way.
const HOURS: usize = 25;

/// The sketches' relative error: a quantile they report is within 2 %
/// of the sample at its rank (DDSketch's guarantee), and never outside
/// the smallest and largest samples seen.
pub const RELATIVE_ERROR: f64 = 0.02;
/// Bins a sketch may grow to (8 bytes each, made 128 at a time): 2 %
/// bins span a factor of 166 in 128 and of 800 million in 512; past
/// that the lowest collapse, so only values that much smaller than a
/// window's largest lose their precision.
const MAX_BINS: u32 = 512;
/// Samples below which a window's p99 is its largest few: the API says
/// so (`few_samples`), and the page marks it.
pub const FEW_FOR_P99: u64 = 100;

/// One finished request, as the windows count it.
#[derive(Clone, Copy, Debug)]
pub struct UsageRecord {
    pub outcome: Outcome,
    /// Served within the tenant's SLO.
    pub goodput: bool,
    pub ttft: Option<f64>,
    pub e2e: f64,
    pub queue_wait: Option<f64>,
    pub preempted: bool,
    pub gpu_seconds: f64,
}

/// A latency sketch (DDSketch, `sketches-ddsketch`), made on its first
/// sample: an idle bucket costs a pointer. Sketches merge, so windows
/// (and, across replicas, gateways) add up without losing accuracy.
#[derive(Clone, Default, Serialize, Deserialize)]
struct Sketch(Option<Box<DDSketch>>);

impl std::fmt::Debug for Sketch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sketch")
            .field("samples", &self.samples())
            .finish()
    }
}

fn sketch_config() -> Config {
    Config::new(RELATIVE_ERROR, MAX_BINS, 1e-6)
}

impl Sketch {
    fn add(&mut self, seconds: f64) {
        if seconds.is_finite() {
            self.0
                .get_or_insert_with(|| Box::new(DDSketch::new(sketch_config())))
                .add(seconds.max(0.0));
        }
    }

    fn merge(&mut self, other: &Sketch) {
        let Some(o) = &other.0 else { return };
        match &mut self.0 {
            // Same configuration on both sides: a merge cannot fail.
            Some(s) => {
                let _ = s.merge(o);
            }
            None => self.0 = Some(o.clone()),
        }
    }

    fn samples(&self) -> u64 {
        self.0.as_ref().map_or(0, |s| s.count() as u64)
    }

    /// The `q` quantile by nearest rank (the `ceil(q n)`-th smallest, as
    /// the replay's reports count it: with few samples a p99 is the
    /// largest, not the second largest), clamped to the samples' range.
    fn quantile(&self, q: f64) -> Option<f64> {
        let s = self.0.as_ref()?;
        let n = s.count();
        // The sketch reads rank `floor(q' (n - 1))`: aim at the middle of
        // the wanted rank so rounding cannot land on the one below.
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
        let q = if n > 1 {
            ((rank as f64 + 0.5) / (n - 1) as f64).min(1.0)
        } else {
            1.0
        };
        let v = s.quantile(q).ok().flatten()?;
        Some(v.clamp(s.min()?, s.max()?))
    }

    fn quantiles(&self) -> Quantiles {
        let samples = self.samples();
        Quantiles {
            p50: self.quantile(0.5),
            p99: self.quantile(0.99),
            samples,
            few_samples: samples > 0 && samples < FEW_FOR_P99,
        }
    }

    fn heap_bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |s| {
            std::mem::size_of::<DDSketch>() + s.length() * std::mem::size_of::<u64>()
        })
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Slot {
    /// Unix seconds of the bucket's start; 0 when never used.
    start: u64,
    outcomes: [u32; Outcome::COUNT],
    goodput: u32,
    preempted: u32,
    gpu_seconds: f64,
    queue_wait_sum: f64,
    queue_waits: u32,
    ttft: Sketch,
    e2e: Sketch,
}

impl Slot {
    fn add(&mut self, r: &UsageRecord) {
        self.outcomes[r.outcome.index()] += 1;
        self.goodput += u32::from(r.goodput);
        self.preempted += u32::from(r.preempted);
        self.gpu_seconds += r.gpu_seconds.max(0.0);
        if let Some(w) = r.queue_wait {
            self.queue_wait_sum += w;
            self.queue_waits += 1;
        }
        if r.outcome == Outcome::Served {
            if let Some(t) = r.ttft {
                self.ttft.add(t);
            }
            self.e2e.add(r.e2e);
        }
    }

    fn merge(&mut self, o: &Slot) {
        for (a, b) in self.outcomes.iter_mut().zip(o.outcomes.iter()) {
            *a += b;
        }
        self.goodput += o.goodput;
        self.preempted += o.preempted;
        self.gpu_seconds += o.gpu_seconds;
        self.queue_wait_sum += o.queue_wait_sum;
        self.queue_waits += o.queue_waits;
        self.ttft.merge(&o.ttft);
        self.e2e.merge(&o.e2e);
    }
}

/// A ring of up to `len` buckets of `width` seconds, spanning `len ×
/// width` seconds back from its newest. Only the buckets in use are kept
/// (oldest first): an idle tenant's ring holds nothing, one that sent a
/// request once holds one bucket.
#[derive(Clone, Debug)]
struct Ring {
    width: u64,
    len: usize,
    buckets: std::collections::VecDeque<Slot>,
}

impl Ring {
    fn new(width: u64, len: usize) -> Self {
        Ring {
            width,
            len,
            buckets: std::collections::VecDeque::new(),
        }
    }

    /// The bucket of `now` (made if it is not kept yet), after dropping
    /// those the ring no longer spans; `None` for a time older than the
    /// ring holds (a clock stepped back).
    fn slot(&mut self, now: u64) -> Option<&mut Slot> {
        let start = now - now % self.width;
        let span = self.width * self.len as u64;
        let newest = self.buckets.back().map_or(start, |b| b.start.max(start));
        if start + span <= newest {
            return None;
        }
        while self
            .buckets
            .front()
            .is_some_and(|b| b.start + span <= newest)
        {
            self.buckets.pop_front();
        }
        let at = match self.buckets.binary_search_by_key(&start, |b| b.start) {
            Ok(at) => at,
            Err(at) => {
                let fresh = Slot {
                    start,
                    ..Slot::default()
                };
                self.buckets.insert(at, fresh);
                if self.buckets.capacity() > 2 * self.buckets.len().max(4) {
                    self.buckets.shrink_to_fit();
                }
                at
            }
        };
        self.buckets.get_mut(at)
    }

    /// Buckets that started within the last `seconds` before `now`.
    fn within(&self, now: u64, seconds: u64) -> impl Iterator<Item = &Slot> {
        let from = now.saturating_sub(seconds);
        self.buckets
            .iter()
            .filter(move |b| b.start != 0 && b.start + self.width > from && b.start <= now)
    }
}

/// One tenant's windows.
#[derive(Clone, Debug)]
pub struct TenantWindows {
    minutes: Ring,
    hours: Ring,
    /// When each outcome last happened (unix seconds), for the page's
    /// sentences ("you hit your GPU-seconds budget at 14:02").
    last: [u64; Outcome::COUNT],
    /// Records counted so far: whether anything changed since a replica
    /// last published its windows.
    records: u64,
}

impl Default for TenantWindows {
    fn default() -> Self {
        TenantWindows {
            minutes: Ring::new(MINUTE, MINUTES),
            hours: Ring::new(HOUR, HOURS),
            last: [0; Outcome::COUNT],
            records: 0,
        }
    }
}

/// Which ring a published bucket belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bucket {
    Minute,
    Hour,
}

impl Bucket {
    /// The seconds its ring spans: a bucket reuses the slot of the one
    /// this long before it.
    pub fn ring_seconds(self) -> u64 {
        match self {
            Bucket::Minute => MINUTE * MINUTES as u64,
            Bucket::Hour => HOUR * HOURS as u64,
        }
    }
}

/// The encoding of a published bucket or `last`: a version byte, then
/// postcard. A replica of another version is skipped, not misread.
const PUBLISHED_VERSION: u8 = 1;

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = vec![PUBLISHED_VERSION];
    out.extend(postcard::to_allocvec(v).unwrap_or_default());
    out
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Option<T> {
    match bytes.split_first() {
        Some((&PUBLISHED_VERSION, rest)) => postcard::from_bytes(rest).ok(),
        _ => None,
    }
}

/// Latency quantiles, seconds: within [`RELATIVE_ERROR`] of the samples'
/// own, never above the largest.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Quantiles {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    /// Samples behind them.
    pub samples: u64,
    /// Fewer than [`FEW_FOR_P99`] samples: the p99 is the largest few,
    /// not a tail to judge by.
    pub few_samples: bool,
}

/// What a window holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WindowStats {
    /// Every request that ended in the window.
    pub requests: u64,
    pub served: u64,
    /// Served within the SLO.
    pub goodput: u64,
    /// `goodput / served`; `None` without a served request.
    pub slo_attainment: Option<f64>,
    pub ttft_seconds: Quantiles,
    pub e2e_seconds: Quantiles,
    /// Mean time queued at the gateway.
    pub queue_wait_mean_seconds: Option<f64>,
    /// By outcome: `served`, `refused`, `shed`, `failed_upstream`,
    /// `cancelled`, `error`.
    pub outcomes: std::collections::BTreeMap<&'static str, u64>,
    /// Refusals by reason (`rate`, `gpu_seconds`, `concurrency`, ...).
    pub refusals: std::collections::BTreeMap<&'static str, u64>,
    /// Requests of this tenant preempted for interactive work.
    pub preempted: u64,
    pub gpu_seconds: f64,
}

/// One minute of the per-minute series.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MinutePoint {
    pub start_unix: u64,
    pub requests: u64,
    pub served: u64,
    pub refused: u64,
    pub slo_attainment: Option<f64>,
    pub ttft_p99_seconds: Option<f64>,
    pub e2e_p99_seconds: Option<f64>,
    pub gpu_seconds: f64,
}

fn stats<'a>(buckets: impl Iterator<Item = &'a Slot>) -> WindowStats {
    let mut sum = Slot::default();
    for b in buckets {
        sum.merge(b);
    }
    let mut out = WindowStats::default();
    for o in Outcome::ALL {
        let n = u64::from(sum.outcomes[o.index()]);
        if n == 0 {
            continue;
        }
        out.requests += n;
        *out.outcomes.entry(o.as_str()).or_default() += n;
        if !o.reason().is_empty() {
            *out.refusals.entry(o.reason()).or_default() += n;
        }
    }
    out.served = u64::from(sum.outcomes[Outcome::Served.index()]);
    out.goodput = u64::from(sum.goodput);
    out.slo_attainment = (out.served > 0).then(|| out.goodput as f64 / out.served as f64);
    out.ttft_seconds = sum.ttft.quantiles();
    out.e2e_seconds = sum.e2e.quantiles();
    out.queue_wait_mean_seconds =
        (sum.queue_waits > 0).then(|| sum.queue_wait_sum / f64::from(sum.queue_waits));
    out.preempted = u64::from(sum.preempted);
    out.gpu_seconds = sum.gpu_seconds;
    out
}

/// A window's counts ([`TenantWindows::totals`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    pub requests: u64,
    pub served: u64,
    /// Served within the SLO.
    pub goodput: u64,
    /// Refused, for any reason.
    pub refused: u64,
    pub gpu_seconds: f64,
}

impl TenantWindows {
    /// Counts `r`, which ended at `now` (unix seconds).
    pub fn record(&mut self, now: f64, r: &UsageRecord) {
        let now = now.max(1.0) as u64;
        for ring in [&mut self.minutes, &mut self.hours] {
            if let Some(b) = ring.slot(now) {
                b.add(r);
            }
        }
        let last = &mut self.last[r.outcome.index()];
        *last = (*last).max(now);
        self.records += 1;
    }

    /// Records counted so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// What a replica publishes of these windows for the cluster's view
    /// (`gateway::usage_share`), encoded: the buckets that a record may
    /// have changed since a publication up to a minute ago (the current
    /// and the previous minute and hour), each with its ring and start.
    pub fn recent(&self, now: f64) -> Vec<(Bucket, u64, Vec<u8>)> {
        let now = now.max(1.0) as u64;
        let mut out = Vec::new();
        for (kind, ring) in [(Bucket::Minute, &self.minutes), (Bucket::Hour, &self.hours)] {
            for b in ring.within(now, ring.width) {
                out.push((kind, b.start, encode(b)));
            }
        }
        out
    }

    /// When each outcome last happened, encoded for publication.
    pub fn last_encoded(&self) -> Vec<u8> {
        encode(&self.last.to_vec())
    }

    /// Adds another replica's published bucket (from [`Self::recent`]);
    /// false when it cannot be read (another version) or is older than
    /// the ring holds.
    pub fn merge_bucket(&mut self, kind: Bucket, start: u64, bytes: &[u8]) -> bool {
        let Some(other) = decode::<Slot>(bytes).filter(|o| o.start == start) else {
            return false;
        };
        let ring = match kind {
            Bucket::Minute => &mut self.minutes,
            Bucket::Hour => &mut self.hours,
        };
        // A bucket of a period the ring has left is not read; one it has
        // not reached here yet moves the ring on.
        match ring.slot(start) {
            Some(slot) => {
                slot.merge(&other);
                true
            }
            None => false,
        }
    }

    /// Adds another replica's `last` (from [`Self::last_encoded`]).
    pub fn merge_last(&mut self, bytes: &[u8]) -> bool {
        let Some(other) = decode::<Vec<u64>>(bytes).filter(|o| o.len() == Outcome::COUNT) else {
            return false;
        };
        for (a, b) in self.last.iter_mut().zip(other) {
            *a = (*a).max(b);
        }
        true
    }

    /// The last `seconds` before `now`: from the minute buckets up to an
    /// hour, from the hour buckets beyond (to a day; the oldest
    /// hour counts whole).
    pub fn window(&self, now: f64, seconds: u64) -> WindowStats {
        let now = now.max(1.0) as u64;
        stats(self.ring_for(seconds).within(now, seconds))
    }

    /// The counts of the requests that ended in the last `seconds` before
    /// `now`: [`Self::window`]'s without its sketches' merging (what a
    /// replica publishes every sync, and what the operator's view sorts
    /// by).
    pub fn totals(&self, now: f64, seconds: u64) -> Totals {
        let now = now.max(1.0) as u64;
        let mut t = Totals::default();
        for b in self.ring_for(seconds).within(now, seconds) {
            for o in Outcome::ALL {
                let n = u64::from(b.outcomes[o.index()]);
                t.requests += n;
                if !o.reason().is_empty() {
                    t.refused += n;
                }
            }
            t.served += u64::from(b.outcomes[Outcome::Served.index()]);
            t.goodput += u64::from(b.goodput);
            t.gpu_seconds += b.gpu_seconds;
        }
        t
    }

    /// The ring a window of `seconds` is read from: the minutes up to an
    /// hour, the hours beyond.
    fn ring_for(&self, seconds: u64) -> &Ring {
        if seconds <= MINUTE * MINUTES as u64 {
            &self.minutes
        } else {
            &self.hours
        }
    }

    /// The last hour, minute by minute (minutes with no request left out).
    pub fn minutes(&self, now: f64) -> Vec<MinutePoint> {
        let now = now.max(1.0) as u64;
        let mut points: Vec<MinutePoint> = self
            .minutes
            .within(now, MINUTE * MINUTES as u64)
            .map(|b| {
                let s = stats(std::iter::once(b));
                MinutePoint {
                    start_unix: b.start,
                    requests: s.requests,
                    served: s.served,
                    refused: s.outcomes.get("refused").copied().unwrap_or(0),
                    slo_attainment: s.slo_attainment,
                    ttft_p99_seconds: s.ttft_seconds.p99,
                    e2e_p99_seconds: s.e2e_seconds.p99,
                    gpu_seconds: s.gpu_seconds,
                }
            })
            .filter(|p| p.requests > 0)
            .collect();
        points.sort_by_key(|p| p.start_unix);
        points
    }

    /// When a request last ended with `outcome` (unix seconds).
    pub fn last(&self, outcome: Outcome) -> Option<u64> {
        Some(self.last[outcome.index()]).filter(|&t| t > 0)
    }

    /// The bytes these windows hold: the buckets' counters, fixed, and
    /// their sketches, which grow with the spread of the latencies in a
    /// bucket (at most [`MAX_BINS`] bins each) and go when it is reused.
    pub fn heap_bytes(&self) -> usize {
        [&self.minutes, &self.hours]
            .iter()
            .map(|r| {
                r.buckets.capacity() * std::mem::size_of::<Slot>()
                    + r.buckets
                        .iter()
                        .map(|b| b.ttft.heap_bytes() + b.e2e.heap_bytes())
                        .sum::<usize>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::admission::LimitKind;
    use crate::outcome::RefusedBy;

    fn served(ttft: f64, good: bool) -> UsageRecord {
        UsageRecord {
            outcome: Outcome::Served,
            goodput: good,
            ttft: Some(ttft),
            e2e: ttft * 4.0,
            queue_wait: Some(0.01),
            preempted: false,
            gpu_seconds: 0.5,
        }
    }

    fn refused(kind: LimitKind) -> UsageRecord {
        UsageRecord {
            outcome: Outcome::Refused(RefusedBy::Limit(kind)),
            goodput: false,
            ttft: None,
            e2e: 0.001,
            queue_wait: None,
            preempted: false,
            gpu_seconds: 0.0,
        }
    }

    const T0: f64 = 1_800_000_000.0;

    #[test]
    fn windows_count_what_ended_in_them() {
        let mut w = TenantWindows::default();
        for i in 0..100 {
            // 99 fast, one slow; 90 within the SLO.
            let ttft = if i == 99 { 2.0 } else { 0.1 };
            w.record(T0 + f64::from(i), &served(ttft, i < 90));
        }
        w.record(T0 + 100.0, &refused(LimitKind::GpuSeconds));
        w.record(T0 - 2.0 * 3600.0, &served(0.1, true));
        let five = w.window(T0 + 120.0, 300);
        assert_eq!((five.requests, five.served, five.goodput), (101, 100, 90));
        assert_eq!(five.slo_attainment, Some(0.9));
        assert_eq!(five.refusals.get("gpu_seconds"), Some(&1));
        let p50 = five.ttft_seconds.p50.unwrap();
        assert!((0.08..0.13).contains(&p50), "{p50}");
        assert!(five.ttft_seconds.p99.unwrap() < 0.13);
        assert!((five.gpu_seconds - 50.0).abs() < 1e-9);
        // The request two hours back is in the day only.
        assert_eq!(w.window(T0 + 120.0, 3600).requests, 101);
        assert_eq!(w.window(T0 + 120.0, 86_400).requests, 102);
        // The counts alone, as a replica publishes them, agree.
        for (at, secs) in [(120.0, 300), (120.0, 3600), (120.0, 86_400), (720.0, 300)] {
            let full = w.window(T0 + at, secs);
            let t = w.totals(T0 + at, secs);
            assert_eq!(
                (t.requests, t.gpu_seconds),
                (full.requests, full.gpu_seconds)
            );
            assert_eq!((t.served, t.goodput), (full.served, full.goodput));
            assert_eq!(t.refused, full.refusals.values().sum::<u64>());
        }
        // Ten minutes on, the 5-minute window is empty; the hour is not.
        assert_eq!(w.window(T0 + 720.0, 300).requests, 0);
        assert_eq!(w.window(T0 + 720.0, 3600).requests, 101);
        assert_eq!(
            w.last(Outcome::Refused(RefusedBy::Limit(LimitKind::GpuSeconds))),
            Some(T0 as u64 + 100)
        );
        let series = w.minutes(T0 + 120.0);
        assert_eq!(series.iter().map(|p| p.requests).sum::<u64>(), 101);
    }

    /// The nearest-rank quantile of the sorted samples.
    fn exact(sorted: &[f64], q: f64) -> f64 {
        sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
    }

    #[test]
    fn quantiles_are_within_the_stated_error_and_never_past_the_largest() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        for (n, spread) in [(45, 0.3), (200, 1.0), (5000, 2.5), (3, 0.1)] {
            let mut s = Sketch::default();
            let mut xs: Vec<f64> = (0..n)
                .map(|_| 0.2 * (spread * (rng.random::<f64>() - 0.5) * 4.0).exp())
                .collect();
            for &x in &xs {
                s.add(x);
            }
            xs.sort_by(f64::total_cmp);
            let q = s.quantiles();
            assert_eq!(q.samples, n as u64);
            assert_eq!(q.few_samples, (n as u64) < FEW_FOR_P99);
            for (got, want) in [(q.p50, exact(&xs, 0.5)), (q.p99, exact(&xs, 0.99))] {
                let got = got.unwrap();
                assert!(
                    (got - want).abs() <= RELATIVE_ERROR * want + 1e-12,
                    "n {n}: {got} against {want}"
                );
                assert!(got <= xs[xs.len() - 1] && got >= xs[0]);
            }
        }
        // The usage page's false red: 45 responses, the slowest 408 ms,
        // against a 500 ms SLO: never reported above it.
        let mut s = Sketch::default();
        let mut worst: f64 = 0.0;
        for i in 0..45 {
            let x = if i == 44 {
                0.408
            } else {
                0.1 + 0.3 * f64::from(i) / 44.0
            };
            worst = worst.max(x);
            s.add(x);
        }
        let p99 = s.quantile(0.99).unwrap();
        assert!(
            p99 <= worst && p99 >= worst * (1.0 - RELATIVE_ERROR),
            "{p99}"
        );
        assert_eq!(Sketch::default().quantiles(), Quantiles::default());
    }

    #[test]
    fn sketches_merge_as_one() {
        let (mut a, mut b, mut both) = (Sketch::default(), Sketch::default(), Sketch::default());
        for i in 1..=1000 {
            let x = f64::from(i) / 1000.0;
            if i % 3 == 0 {
                a.add(x)
            } else {
                b.add(x)
            }
            both.add(x);
        }
        a.merge(&b);
        assert_eq!(a.quantiles(), both.quantiles());
        let mut empty = Sketch::default();
        empty.merge(&both);
        assert_eq!(empty.quantiles(), both.quantiles());
    }

    /// Many tenants over two simulated days, latencies spread from 1 ms
    /// to 100 s: each tenant's windows stay under their bound (every
    /// bucket's two sketches at their largest), and the oldest data
    /// leaves the day window.
    #[test]
    fn memory_per_tenant_stays_bounded() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let bound = (MINUTES + HOURS)
            * (std::mem::size_of::<Slot>()
                + 2 * (std::mem::size_of::<DDSketch>() + MAX_BINS as usize * 8));
        let mut tenants: Vec<TenantWindows> = (0..200).map(|_| TenantWindows::default()).collect();
        // An idle tenant keeps no bucket; one request keeps one of each
        // ring, with its two sketches.
        assert_eq!(tenants[0].heap_bytes(), 0, "an idle tenant's windows");
        let mut once = TenantWindows::default();
        once.record(T0, &served(0.2, true));
        let one = once.heap_bytes();
        assert!(one < 6 * 1024, "{one} bytes after one request");
        let mut now = T0;
        while now < T0 + 2.0 * 86_400.0 {
            for (i, t) in tenants.iter_mut().enumerate() {
                if i % 7 == (now as usize / 60) % 7 {
                    t.record(now, &served(10f64.powf(rng.random_range(-3.0..2.0)), true));
                }
            }
            now += 37.0;
        }
        let most = tenants
            .iter()
            .map(TenantWindows::heap_bytes)
            .max()
            .unwrap_or(0);
        // A busy tenant of ordinary latencies: a request a second, TTFT
        // around 200 ms (x/÷ 3), e2e four times that.
        let mut busy = TenantWindows::default();
        for i in 0..(2 * 86_400) {
            let ttft = 0.2 * 3f64.powf(rng.random_range(-1.0..1.0));
            busy.record(T0 + f64::from(i), &served(ttft, true));
        }
        eprintln!(
            "bytes per tenant: idle 0, one request {one}, busy {}, spread over five decades {most}, bound {bound}",
            busy.heap_bytes()
        );
        for t in &tenants {
            assert!(t.heap_bytes() <= bound, "{} > {bound}", t.heap_bytes());
            let day = t.window(now, 86_400);
            assert!(day.requests > 0 && day.requests < 2400, "{}", day.requests);
        }
    }
}
