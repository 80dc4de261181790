//! What the core is configured with: the closed sets of policies
//! ([`Discipline`], [`Strategy`], [`Priority`]) and [`SchedulerSpec`], the
//! part of the validated policy that [`Scheduler::new`] and
//! [`Scheduler::apply_policy`] read. The config layer builds a spec from
//! its `Policy` (and re-exports the enums); the core never sees the policy
//! file, so it depends on no other Fairway module.
//!
//! [`Scheduler::new`]: crate::core::scheduler::Scheduler::new
//! [`Scheduler::apply_policy`]: crate::core::scheduler::Scheduler::apply_policy

use std::fmt;
use std::time::Duration;

/// The fair-queue order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discipline {
    /// Arrival order across all tenants (baseline).
    Fifo,
    /// Strict priority by tenant class, FIFO within (baseline; starves).
    Priority,
    /// Virtual-time fair queueing, cost in tokens.
    Wfq,
    /// Virtual-time fair queueing, cost in dominant share (default).
    Drf,
}

impl Discipline {
    /// The policy-file spelling (`"drf"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Discipline::Fifo => "fifo",
            Discipline::Priority => "priority",
            Discipline::Wfq => "wfq",
            Discipline::Drf => "drf",
        }
    }
}

/// How a backend is picked within a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    LeastOutstanding,
    /// By cached prefix and load (`routing::prefix_aware`).
    PrefixAware,
    /// The replay's oracle, never read from a policy file: every request
    /// to the backend with the most of its prompt cached among those with
    /// room, else the least loaded (`routing::prefix_greedy`). With the
    /// engines' own events as the index, as the replay delivers them, it
    /// is "every request to a holder with room": the hit rate
    /// `PrefixAware` is measured against.
    PrefixGreedy,
    P2c,
    RoundRobin,
    Random,
    Pack,
}

impl Strategy {
    /// Whether the pool keeps a prefix index and routes on it.
    pub fn routes_on_prefixes(self) -> bool {
        matches!(self, Strategy::PrefixAware | Strategy::PrefixGreedy)
    }

    /// The policy-file spelling (`"least_outstanding"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::LeastOutstanding => "least_outstanding",
            Strategy::PrefixAware => "prefix_aware",
            Strategy::PrefixGreedy => "prefix_greedy",
            Strategy::P2c => "p2c",
            Strategy::RoundRobin => "round_robin",
            Strategy::Random => "random",
            Strategy::Pack => "pack",
        }
    }
}

/// What a request's prompt counts for in its tenant's fair-queue charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillCharge {
    /// Only the prompt tokens the engine computes: those it found cached
    /// are free (predicted at dispatch, settled with the engine's
    /// `cached_tokens` where it reports them).
    Uncached,
    /// Every prompt token, cached or not.
    Full,
}

impl PrefillCharge {
    /// The policy-file spelling (`"uncached"`).
    pub fn as_str(self) -> &'static str {
        match self {
            PrefillCharge::Uncached => "uncached",
            PrefillCharge::Full => "full",
        }
    }
}

impl fmt::Display for PrefillCharge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Tenant class for the `priority` discipline and for preemption.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    Interactive,
    Batch,
}

impl Priority {
    /// The policy-file spelling (`"interactive"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Batch => "batch",
        }
    }
}

/// What becomes of a request predicted to miss its tenant's TTFT SLO (see
/// the scheduler's `slo` module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLate {
    /// Refused on arrival (429, reason `slo`, `retry-after` from the
    /// predicted wait); a queued request that can no longer make it is shed.
    Refuse,
    /// Admitted; shed once it can no longer make it.
    Shed,
    /// Admitted; once predicted late, it waits behind every request that
    /// can still make its SLO, until `max_wait`.
    BestEffort,
    /// No SLO-aware admission: served in fair order, however late.
    Serve,
}

impl OnLate {
    /// The policy-file spelling (`"best_effort"`).
    pub fn as_str(self) -> &'static str {
        match self {
            OnLate::Refuse => "refuse",
            OnLate::Shed => "shed",
            OnLate::BestEffort => "best_effort",
            OnLate::Serve => "serve",
        }
    }

    /// The default of a tenant class: interactive requests that cannot
    /// make it are refused at once, batch work is kept as best effort.
    pub fn default_for(p: Priority) -> Self {
        match p {
            Priority::Interactive => OnLate::Refuse,
            Priority::Batch => OnLate::BestEffort,
        }
    }
}

impl fmt::Display for OnLate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Discipline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything the scheduler is configured with.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerSpec {
    pub queue: QueueSpec,
    pub preemption: PreemptionSpec,
    /// A reading older than this is stale: routing ignores it.
    pub stale_after: Duration,
    /// Empty: auth is off and every request is tenant `default`.
    pub tenants: Vec<TenantSpec>,
    pub pools: Vec<PoolSpec>,
}

impl SchedulerSpec {
    /// This replica's share of a cluster of `replicas` gateways, enforced
    /// locally (while the cluster store is unreachable): each tenant's
    /// request rate, burst, GPU-seconds budget and concurrency cap divided
    /// by its own share on this replica (`share(name)`, in (0, 1]; the
    /// shares of one tenant over all replicas add up to 1), so a replica
    /// that receives most of a tenant's requests holds most of its limits.
    /// Each backend's window is multiplied by its pool's share here
    /// (`pool_share(key)`, by [`pool_key`]), rounded up.
    ///
    /// Rounding keeps at least what one request needs: a burst of at least
    /// 1, a concurrency cap and a window rounded up. With even shares, over
    /// all replicas that admits at most `max(burst, replicas)` at once
    /// (then `rate` per second), `max_concurrency + replicas - 1` requests
    /// and `max_inflight + replicas - 1` at a backend.
    #[must_use]
    pub fn shared_by(
        mut self,
        replicas: u32,
        share: impl Fn(&str) -> f64,
        pool_share: impl Fn(&str) -> PoolPart,
    ) -> Self {
        if replicas <= 1 {
            return self;
        }
        for t in &mut self.tenants {
            let s = fraction(share(&t.name));
            let rate = t.rate.map(|r| r * s);
            t.burst = t.rate.map(|r| (t.burst.unwrap_or(r) * s).max(1.0));
            t.rate = rate;
            t.gpu_seconds_per_hour = t.gpu_seconds_per_hour.map(|g| g * s);
            t.max_concurrency = t
                .max_concurrency
                .map(|c| ((f64::from(c) * s - 1e-9).ceil() as u32).max(1));
        }
        self.share_windows(pool_share)
    }

    /// This replica's part of a cluster whose tenants' limits are leased
    /// from a shared store: every tenant's limits stay whole but are
    /// `leased` (the replica admits from what the store grants it, see
    /// [`crate::core::admission::shared_limit`]); each backend's window is
    /// multiplied by its pool's share here, as in [`Self::shared_by`].
    #[must_use]
    pub fn leased(mut self, replicas: u32, pool_share: impl Fn(&str) -> PoolPart) -> Self {
        for t in &mut self.tenants {
            t.leased = true;
        }
        if replicas <= 1 {
            return self;
        }
        self.share_windows(pool_share)
    }

    fn share_windows(mut self, pool_share: impl Fn(&str) -> PoolPart) -> Self {
        for p in &mut self.pools {
            let part = pool_share(&pool_key(&p.model, p.api));
            let s = fraction(part.share);
            p.slots = part.slots;
            p.yield_above = part.yield_above;
            for b in &mut p.backends {
                b.max_inflight = ((f64::from(b.max_inflight) * s - 1e-9).ceil() as u32).max(1);
                b.window_share = s;
            }
        }
        self
    }
}

/// A replica's part of a scheduler pool in a cluster: its share of each
/// backend's window (in (0, 1]), and the whole slots it may hold over all
/// of the pool's backends at once, when the cluster apportions them
/// (`cluster::shares`: each replica holds the floor or the ceiling of its
/// share of the pool's slots in turn, so that fractional shares are
/// honoured over time and the whole slots add up to the pool's).
///
/// Preemption across replicas: while interactive work that may preempt
/// waits for a slot at another replica, `yield_above` is the slots this
/// replica keeps (its exact share of the pool's slots, rounded up), and
/// young preemptible work it holds above them is preempted, as the
/// waiting work's own replica would have preempted it had it been
/// admitted there.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolPart {
    pub share: f64,
    pub slots: Option<u32>,
    pub yield_above: Option<u32>,
}

impl PoolPart {
    /// A share of every window, with no apportioned slots.
    pub fn share(share: f64) -> PoolPart {
        PoolPart {
            share,
            ..PoolPart::default()
        }
    }
}

/// A share as a usable fraction: in (0, 1], 1 when not finite.
fn fraction(s: f64) -> f64 {
    if s.is_finite() {
        s.clamp(1e-6, 1.0)
    } else {
        1.0
    }
}

/// The fair queue.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSpec {
    pub discipline: Discipline,
    /// A request not dispatched within this time is shed.
    pub max_wait: Duration,
    /// Queued requests per tenant and pool beyond which arrivals are refused.
    pub max_queued_per_tenant: u32,
    /// Weight of one output token relative to one prompt token in `wfq` cost.
    pub output_token_weight: f64,
    /// The share of backlogged tenants' in-flight estimates that a
    /// returning tenant's lift counts as received
    /// ([`crate::core::queue::FairQueue::set_in_flight_credit`]).
    pub in_flight_credit: f64,
    pub prefill_charge: PrefillCharge,
    /// In a pool routing on prefixes, how far (a share of the fairness
    /// bound, 0 to 1) the queue may pass over the next tenant for one whose
    /// next request has more of its prompt cached on a backend with room.
    pub locality: f64,
    /// The share of each pool's slots (its windows) that batch items leave
    /// to live work (`[batch] live_reserve`, 0 to 1): an item is dispatched
    /// only while more than this share is free.
    pub batch_reserve: f64,
    /// Prompt tokens of resumable batch items a backend may have waiting
    /// for their first token (`[batch] prefill_ahead`; 0: no limit): an
    /// item goes to a backend only while that leaves room, so that a live
    /// request never queues in the engine behind a wave of batch prefills.
    pub batch_prefill_ahead: u64,
    /// Live requests' TTFT beside batch work, over their TTFT without it,
    /// that each backend's batch lane keeps to (`[batch]
    /// live_latency_target`; 0: no loop): a feedback loop halves the batch
    /// items a backend may run past it and lets them grow back within it
    /// (`scheduler::lane_limit`).
    pub batch_latency_target: f64,
    /// The share of a batch item's GPU-seconds its owner's budget is not
    /// charged (`[batch] gpu_seconds_discount`, 0 to 1).
    pub batch_gpu_discount: f64,
}

/// When queued interactive work may take the slot of in-flight batch work.
#[derive(Clone, Debug, PartialEq)]
pub struct PreemptionSpec {
    pub enabled: bool,
    /// A queued request preempts only once it has waited this long.
    pub min_wait: Duration,
    /// Work that has run this long is never preempted.
    pub migration_threshold: Duration,
}

/// One tenant: its share, class and admission limits.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantSpec {
    pub name: String,
    pub weight: f64,
    pub priority: Priority,
    /// Requests per second (refill of the request bucket); `None` = unlimited.
    pub rate: Option<f64>,
    /// Request bucket capacity (default: `rate`, at least 1).
    pub burst: Option<f64>,
    /// Requests in flight plus queued; `None` = unlimited.
    pub max_concurrency: Option<u32>,
    /// GPU-seconds budget per hour; `None` = unlimited.
    pub gpu_seconds_per_hour: Option<f64>,
    /// The limits are held for a whole cluster in a shared store: this
    /// replica admits only from the leases the store grants it.
    pub leased: bool,
    /// The time to first token the tenant's requests must meet, if any.
    pub ttft_slo: Option<Duration>,
    /// What becomes of a request predicted to miss `ttft_slo`.
    pub on_late: OnLate,
}

/// The protocol a pool's backends speak, and so the requests they take.
/// A model served by backends of both kinds is two pools, one per
/// protocol, each with its own fair queue and windows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Api {
    /// OpenAI-compatible (`/v1/*`): vLLM, SGLang, Triton's OpenAI frontend…
    #[default]
    OpenAi,
    /// Triton's KServe v2 HTTP API and its generate extension (`/v2/*`).
    Triton,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::OpenAi => "openai",
            Api::Triton => "triton",
        }
    }
}

/// The name a cluster knows a scheduler pool by: its model, and for the
/// Triton pool of a model `triton:` and the model, so that a model served
/// over both protocols has two.
pub fn pool_key(model: &str, api: Api) -> std::borrow::Cow<'_, str> {
    match api {
        Api::OpenAi => std::borrow::Cow::Borrowed(model),
        Api::Triton => std::borrow::Cow::Owned(format!("triton:{model}")),
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One pool: the backends serving one model over one protocol, and how
/// they are picked.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolSpec {
    pub model: String,
    pub api: Api,
    pub strategy: Strategy,
    /// Skip a backend whose KV usage is at or above this.
    pub kv_high_watermark: f64,
    /// Skip a backend whose TTFT p99 is above this.
    pub ttft_p99_threshold: Duration,
    /// Passive ejection of backends that fail what the proxy sends them.
    pub outlier: OutlierSpec,
    /// A request naming a LoRA adapter prefers backends that have it
    /// loaded (see `scheduler::adapters`).
    pub adapter_affinity: bool,
    /// The LoRA adapters the policy lists for the pool (others are learnt
    /// from the requests that name them).
    pub adapters: Vec<String>,
    /// The prefix index (used by `Strategy::PrefixAware`).
    pub prefix: PrefixSpec,
    pub backends: Vec<BackendSpec>,
    /// In a cluster, the whole slots this replica may hold over all the
    /// pool's backends at once ([`PoolPart`]); `None`: the windows'.
    pub slots: Option<u32>,
    /// In a cluster, while interactive work waits for a slot at another
    /// replica: the slots this replica keeps ([`PoolPart::yield_above`]).
    pub yield_above: Option<u32>,
}

/// A pool's prefix index: its canonical block, its cap, and how long a
/// backend is believed to hold what Fairway sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixSpec {
    pub block_tokens: u32,
    pub index_blocks: usize,
    pub ttl: Duration,
}

impl Default for PrefixSpec {
    fn default() -> Self {
        PrefixSpec {
            block_tokens: 64,
            index_blocks: 262_144,
            ttl: Duration::from_secs(120),
        }
    }
}

/// Outlier ejection: a backend whose requests fail `consecutive_failures`
/// times in a row (5xx answers, connection errors, header timeouts) gets
/// no new requests for `ejection_time` × the number of times it has been
/// ejected (capped at `max_ejection_time`), whatever its health probe says.
/// A backend is ejected the same way when, over a `success_rate_interval`
/// in which it and the rest of its pool each had at least
/// `success_rate_min_requests` requests, its success rate is more than
/// `success_rate_gap` below the rest's (a backend failing one request in
/// three never fails five in a row). At most `max_ejected_share` of a
/// pool's backends are ejected at once, and never its last available one.
#[derive(Clone, Debug, PartialEq)]
pub struct OutlierSpec {
    /// 0 turns ejection on consecutive failures off.
    pub consecutive_failures: u32,
    pub ejection_time: Duration,
    pub max_ejection_time: Duration,
    pub max_ejected_share: f64,
    /// 0 turns ejection on success rate off.
    pub success_rate_gap: f64,
    pub success_rate_min_requests: u32,
    pub success_rate_interval: Duration,
}

/// One backend of a pool.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendSpec {
    /// Stable name; state is matched by it across reloads.
    pub name: String,
    /// GPUs behind it, for GPU-seconds accounting.
    pub gpus: u32,
    /// The dispatch window's ceiling.
    pub max_inflight: u32,
    /// This gateway's part of the engine's whole window: 1 alone, its
    /// share in a cluster (the other replicas send the rest).
    pub window_share: f64,
    /// KV capacity in tokens, for DRF cost, until a reading reports it.
    pub kv_tokens: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SchedulerSpec {
        SchedulerSpec {
            queue: QueueSpec {
                discipline: Discipline::Drf,
                max_wait: Duration::from_secs(30),
                max_queued_per_tenant: 100,
                output_token_weight: 1.0,
                in_flight_credit: 0.5,
                prefill_charge: PrefillCharge::Uncached,
                locality: 0.0,
                batch_reserve: 0.0,
                batch_prefill_ahead: 0,
                batch_latency_target: 0.0,
                batch_gpu_discount: 0.0,
            },
            preemption: PreemptionSpec {
                enabled: false,
                min_wait: Duration::from_secs(1),
                migration_threshold: Duration::from_secs(300),
            },
            stale_after: Duration::from_secs(1),
            tenants: vec![TenantSpec {
                name: "a".into(),
                weight: 1.0,
                priority: Priority::Interactive,
                rate: Some(10.0),
                burst: None,
                max_concurrency: Some(4),
                gpu_seconds_per_hour: Some(360.0),
                leased: false,
                ttft_slo: None,
                on_late: OnLate::Serve,
            }],
            pools: vec![PoolSpec {
                model: "m".into(),
                api: Api::OpenAi,
                strategy: Strategy::LeastOutstanding,
                kv_high_watermark: 0.8,
                ttft_p99_threshold: Duration::from_millis(150),
                outlier: OutlierSpec {
                    consecutive_failures: 5,
                    ejection_time: Duration::from_secs(10),
                    max_ejection_time: Duration::from_secs(300),
                    max_ejected_share: 0.5,
                    success_rate_gap: 0.3,
                    success_rate_min_requests: 20,
                    success_rate_interval: Duration::from_secs(10),
                },
                adapter_affinity: true,
                adapters: Vec::new(),
                prefix: Default::default(),
                backends: vec![BackendSpec {
                    name: "b".into(),
                    gpus: 1,
                    max_inflight: 7,
                    window_share: 1.0,
                    kv_tokens: 1000,
                }],
                slots: None,
                yield_above: None,
            }],
        }
    }

    /// `spec()` for one of `n` replicas with even shares.
    fn even(n: u32) -> SchedulerSpec {
        let share = 1.0 / f64::from(n);
        spec().shared_by(n, |_| share, |_| PoolPart::share(share))
    }

    #[test]
    fn a_replica_gets_its_share_of_every_limit_rounded_to_what_one_request_needs() {
        assert_eq!(even(1), spec());
        let s = even(3);
        let t = &s.tenants[0];
        assert!((t.rate.unwrap() - 10.0 / 3.0).abs() < 1e-9);
        // The burst was the rate (10): a third of it.
        assert!((t.burst.unwrap() - 10.0 / 3.0).abs() < 1e-9);
        assert!((t.gpu_seconds_per_hour.unwrap() - 120.0).abs() < 1e-9);
        assert_eq!(t.max_concurrency, Some(2)); // ceil(4/3): 6 over 3, within 4 + 3 - 1
        assert_eq!(s.pools[0].backends[0].max_inflight, 3); // ceil(7/3)
        // Never below one request's worth.
        let s = even(20);
        assert_eq!(s.tenants[0].burst, Some(1.0));
        assert_eq!(s.tenants[0].max_concurrency, Some(1));
        assert_eq!(s.pools[0].backends[0].max_inflight, 1);
    }
}
