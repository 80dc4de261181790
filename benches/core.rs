//! Criterion benches for the scheduling core: one full request cycle
//! (admit → enqueue → dispatch → complete) with many backlogged tenants,
//! the same cycle from several threads behind one lock (`contended`), and
//! the routing pick.

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use fairway::config::{Strategy, parse_policy};
use fairway::core::ids::{BackendId, RequestId, Usage};
use fairway::core::routing::{Candidate, pick};
use fairway::core::scheduler::{Arrival, Decision, Scheduler};
use fairway::core::time::Instant;
use rand::SeedableRng;
use rand::rngs::SmallRng;

fn policy_text(tenants: usize, backends: usize) -> String {
    let mut s = String::from(
        "[queue]\nmax_queued_per_tenant = 1000000\nmax_wait = \"1000000s\"\n[[pools]]\nmodel = \"m\"\n",
    );
    for b in 0..backends {
        s += &format!(
            "[[pools.backends]]\nurl = \"http://10.0.{}.{}:8000\"\nmax_inflight = 4\n",
            b / 250,
            b % 250 + 1
        );
    }
    for t in 0..tenants {
        s += &format!(
            "[[tenants]]\nname = \"t{t}\"\napi_keys = [\"k{t}\"]\nweight = {}\nrate = 1000000\ngpu_seconds_per_hour = 1000000000\n",
            t % 4 + 1
        );
    }
    s
}

/// A scheduler whose windows are full and whose every tenant is
/// backlogged, and the requests it has in flight.
struct Load {
    s: Scheduler,
    pool: fairway::core::ids::PoolId,
    tenants: Vec<fairway::core::ids::TenantId>,
    in_flight: VecDeque<RequestId>,
    next_tenant: usize,
    now: u64,
}

impl Load {
    fn saturated(tenants: usize, backends: usize) -> Load {
        let policy = parse_policy(&policy_text(tenants, backends), "bench.toml")
            .unwrap_or_else(|_| panic!("bench policy"));
        let s = Scheduler::new(&policy.scheduler_spec(), Instant::ZERO, 1);
        let pool = s.pool("m").unwrap_or_else(|| panic!("pool"));
        let ids: Vec<_> = (0..tenants)
            .map(|t| {
                s.tenant(&format!("t{t}"))
                    .unwrap_or_else(|| panic!("tenant"))
            })
            .collect();
        let mut load = Load {
            s,
            pool,
            tenants: ids,
            in_flight: VecDeque::new(),
            next_tenant: 0,
            now: 1,
        };
        // Enough arrivals that every window is full and every tenant still queues.
        for _ in 0..backends * 4 / tenants + 2 {
            for _ in 0..tenants {
                black_box(load.arrive());
                load.now += 1;
            }
        }
        load
    }

    /// The next tenant's request arrives; whether it was admitted (then
    /// queued or dispatched).
    fn arrive(&mut self) -> bool {
        let a = Arrival {
            tenant: self.tenants[self.next_tenant % self.tenants.len()],
            pool: self.pool,
            prompt_tokens: 200,
            max_tokens: Some(100),
            choices: 1,
            deadline: None,
            adapter: None,
            prefix: Vec::new(),
            lane: fairway::core::scheduler::Lane::Live,
        };
        self.next_tenant += 1;
        match self.s.on_arrival(Instant::from_nanos(self.now), a) {
            Ok((_, ds)) => {
                self.track(ds);
                true
            }
            Err(_) => false,
        }
    }

    /// The requests `ds` dispatches are in flight.
    fn track(&mut self, ds: Vec<Decision>) {
        for d in ds {
            if let Decision::Dispatch { id, .. } = d {
                self.in_flight.push_back(id);
            }
        }
    }

    /// One request cycle, 1 µs later: a response ends (its slot goes to
    /// the next request in fair order), and a new request arrives;
    /// whether it was admitted.
    fn cycle(&mut self) -> bool {
        self.now += 1_000;
        let t = Instant::from_nanos(self.now);
        let id = self
            .in_flight
            .pop_front()
            .unwrap_or_else(|| panic!("in flight"));
        let usage = Usage {
            prompt_tokens: 200,
            completion_tokens: 80,
            cached_tokens: None,
        };
        if let Some((_, ds)) = self.s.on_completion(t, id, Some(usage)) {
            self.track(ds);
        }
        self.arrive()
    }
}

fn cycle(c: &mut Criterion) {
    let mut g = c.benchmark_group("cycle");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for &(tenants, backends) in &[(10, 8), (1_000, 8), (10_000, 8), (10, 128), (10_000, 128)] {
        let mut load = Load::saturated(tenants, backends);
        g.bench_with_input(
            BenchmarkId::new(format!("{backends}_backends"), tenants),
            &tenants,
            |b, _| b.iter(|| black_box(load.cycle())),
        );
    }
    g.finish();
}

fn routing(c: &mut Criterion) {
    let mut g = c.benchmark_group("pick");
    g.measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    for &n in &[8u32, 128] {
        let cands: Vec<Candidate> = (0..n)
            .map(|i| Candidate {
                id: BackendId(i),
                in_flight: i % 7,
                waiting: i % 3,
                window: 16,
                window_share: 1.0,
                kv_usage: Some(f64::from(i % 10) / 10.0),
                cached_tokens: (i % 4) * 256,
                events: true,
                home_tokens: (i % 5) * 256,
                homed: f64::from(i % 3) / 10.0,
                need: 0.05,
                kv_full: false,
            })
            .collect();
        for strategy in [
            Strategy::LeastOutstanding,
            Strategy::PrefixAware,
            Strategy::P2c,
            Strategy::RoundRobin,
        ] {
            let mut rng = SmallRng::seed_from_u64(1);
            let mut cursor = 0;
            g.bench_with_input(BenchmarkId::new(format!("{strategy:?}"), n), &n, |b, _| {
                b.iter(|| {
                    black_box(pick(
                        strategy,
                        black_box(&cands),
                        1000,
                        &mut rng,
                        &mut cursor,
                    ))
                })
            });
        }
    }
    g.finish();
}

/// The cycle of [`cycle`] from several threads at once, on one scheduler
/// behind one lock, as the gateway's workers share it (`CoreState` under
/// a `parking_lot::Mutex`): the time per cycle, all threads together, is
/// what the lock lets through. Flat from one thread to more: the lock
/// serialises the core, and a cycle's time is the most cycles per second
/// the gateway can schedule, whatever its core count; rising: the lock's
/// cache line and the scheduler's data move between cores. Threads beyond
/// the machine's cores are not measured (a preempted holder would stall
/// the others).
fn contended(c: &mut Criterion) {
    let mut g = c.benchmark_group("contended");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    for threads in [1usize, 2, 4, 8, 16, 32, 64]
        .into_iter()
        .filter(|&t| t <= cores)
    {
        let shared = parking_lot::Mutex::new(Load::saturated(10, 8));
        g.bench_with_input(BenchmarkId::new("threads", threads), &threads, |b, &n| {
            b.iter_custom(|iters| {
                let per_thread = iters.div_ceil(n as u64);
                let clock = fairway::clock::Clock::new();
                let start = clock.now();
                std::thread::scope(|scope| {
                    for _ in 0..n {
                        scope.spawn(|| {
                            for _ in 0..per_thread {
                                black_box(shared.lock().cycle());
                            }
                        });
                    }
                });
                clock.now() - start
            })
        });
    }
    g.finish();
}

criterion_group!(benches, cycle, contended, routing);
criterion_main!(benches);
