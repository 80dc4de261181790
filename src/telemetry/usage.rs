//! Per-tenant usage windows: what the tenant usage API and page show, from
//! memory, over the last 5 minutes, hour and day.
//!
//! Each tenant has two rings of buckets: 60 one-minute buckets (the 5-minute
//! and 1-hour windows, and the per-minute series the page plots) and 96
//! fifteen-minute buckets (the 24-hour window). A bucket counts outcomes
//! (each refusal reason its own), goodput, preemptions and GPU-seconds, and
//! keeps TTFT and e2e histograms of 48 bins each (a factor of 2^(1/3),
//! 26 %, from 1 ms to about 65 s; quantiles interpolate within a bin).
//! Memory per tenant is fixed at the rings' size whatever the traffic or
//! the time it runs; a bucket whose minute has passed is reused.
//!
//! Sans-IO: every call takes the wall-clock time in unix seconds.

use serde::Serialize;

use crate::outcome::Outcome;

/// Histogram bins: bin `i` holds latencies up to `2^((i+1)/3)` ms.
pub const BINS: usize = 48;
const MINUTE: u64 = 60;
const QUARTER: u64 = 900;
const MINUTES: usize = 60;
const QUARTERS: usize = 96;

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

#[derive(Clone, Copy, Debug)]
struct Hist([u32; BINS]);

impl Default for Hist {
    fn default() -> Self {
        Hist([0; BINS])
    }
}

/// Upper bound of bin `i`, seconds.
fn bin_upper(i: usize) -> f64 {
    2f64.powf((i + 1) as f64 / 3.0) / 1000.0
}

impl Hist {
    fn add(&mut self, seconds: f64) {
        let ms = (seconds * 1000.0).max(1e-3);
        let i = (ms.log2() * 3.0).ceil().max(1.0) as usize - 1;
        self.0[i.min(BINS - 1)] += 1;
    }

    fn merge(&mut self, other: &Hist) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a += b;
        }
    }

    /// The `q` quantile, interpolated geometrically within its bin.
    fn quantile(&self, q: f64) -> Option<f64> {
        let total: u64 = self.0.iter().map(|&n| u64::from(n)).sum();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil().max(1.0);
        let mut seen = 0.0;
        for (i, &n) in self.0.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if seen + f64::from(n) >= rank {
                let lower = if i == 0 { 0.0005 } else { bin_upper(i - 1) };
                let upper = bin_upper(i);
                let within = (rank - seen) / f64::from(n);
                return Some(lower * (upper / lower).powf(within));
            }
            seen += f64::from(n);
        }
        Some(bin_upper(BINS - 1))
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// Unix seconds of the bucket's start; 0 when never used.
    start: u64,
    outcomes: [u32; Outcome::COUNT],
    goodput: u32,
    preempted: u32,
    gpu_seconds: f64,
    queue_wait_sum: f64,
    queue_waits: u32,
    ttft: Hist,
    e2e: Hist,
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

/// A ring of `len` buckets of `width` seconds.
#[derive(Clone, Debug)]
struct Ring {
    width: u64,
    buckets: Vec<Slot>,
}

impl Ring {
    fn new(width: u64, len: usize) -> Self {
        Ring {
            width,
            buckets: vec![Slot::default(); len],
        }
    }

    /// The bucket of `now`, emptied first if it held an older period;
    /// `None` for a time older than the ring holds (a clock stepped back).
    fn slot(&mut self, now: u64) -> Option<&mut Slot> {
        let start = now - now % self.width;
        let len = self.buckets.len() as u64;
        let b = &mut self.buckets[((now / self.width) % len) as usize];
        if b.start > start {
            return None;
        }
        if b.start != start {
            *b = Slot {
                start,
                ..Slot::default()
            };
        }
        Some(b)
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
    quarters: Ring,
    /// When each outcome last happened (unix seconds), for the page's
    /// sentences ("you hit your GPU-seconds budget at 14:02").
    last: [u64; Outcome::COUNT],
}

impl Default for TenantWindows {
    fn default() -> Self {
        TenantWindows {
            minutes: Ring::new(MINUTE, MINUTES),
            quarters: Ring::new(QUARTER, QUARTERS),
            last: [0; Outcome::COUNT],
        }
    }
}

/// Latency quantiles, seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Quantiles {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
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
    out.ttft_seconds = Quantiles {
        p50: sum.ttft.quantile(0.5),
        p99: sum.ttft.quantile(0.99),
    };
    out.e2e_seconds = Quantiles {
        p50: sum.e2e.quantile(0.5),
        p99: sum.e2e.quantile(0.99),
    };
    out.queue_wait_mean_seconds =
        (sum.queue_waits > 0).then(|| sum.queue_wait_sum / f64::from(sum.queue_waits));
    out.preempted = u64::from(sum.preempted);
    out.gpu_seconds = sum.gpu_seconds;
    out
}

impl TenantWindows {
    /// Counts `r`, which ended at `now` (unix seconds).
    pub fn record(&mut self, now: f64, r: &UsageRecord) {
        let now = now.max(1.0) as u64;
        for ring in [&mut self.minutes, &mut self.quarters] {
            if let Some(b) = ring.slot(now) {
                b.add(r);
            }
        }
        let last = &mut self.last[r.outcome.index()];
        *last = (*last).max(now);
    }

    /// The last `seconds` before `now`: from the minute buckets up to an
    /// hour, from the quarter-hour buckets beyond (to a day).
    pub fn window(&self, now: f64, seconds: u64) -> WindowStats {
        let now = now.max(1.0) as u64;
        if seconds <= MINUTE * MINUTES as u64 {
            stats(self.minutes.within(now, seconds))
        } else {
            stats(self.quarters.within(now, seconds))
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

    /// The bytes these windows hold: the same from the first record on.
    pub fn heap_bytes(&self) -> usize {
        (self.minutes.buckets.capacity() + self.quarters.buckets.capacity())
            * std::mem::size_of::<Slot>()
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

    #[test]
    fn quantiles_are_within_a_bin() {
        let mut h = Hist::default();
        for ms in 1..=1000 {
            h.add(f64::from(ms) / 1000.0);
        }
        let p50 = h.quantile(0.5).unwrap();
        let p99 = h.quantile(0.99).unwrap();
        assert!((0.4..0.63).contains(&p50), "{p50}");
        assert!((0.8..1.26).contains(&p99), "{p99}");
        h.add(1e6);
        assert!(h.quantile(1.0).unwrap() <= bin_upper(BINS - 1));
    }

    /// Many tenants over two simulated days: each tenant's windows hold the
    /// same bytes from the first request to the last, and the oldest data
    /// leaves the day window.
    #[test]
    fn memory_per_tenant_stays_bounded() {
        let mut tenants: Vec<TenantWindows> = (0..500).map(|_| TenantWindows::default()).collect();
        let size = tenants[0].heap_bytes();
        assert!(size < 100 * 1024, "{size} bytes per tenant");
        let mut now = T0;
        while now < T0 + 2.0 * 86_400.0 {
            for (i, t) in tenants.iter_mut().enumerate() {
                if i % 7 == (now as usize / 60) % 7 {
                    t.record(now, &served(0.2, true));
                }
            }
            now += 37.0;
        }
        for t in &tenants {
            assert_eq!(t.heap_bytes(), size);
            let day = t.window(now, 86_400);
            assert!(day.requests > 0 && day.requests < 2400, "{}", day.requests);
        }
    }
}
