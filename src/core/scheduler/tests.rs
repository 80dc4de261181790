use super::*;
use crate::core::admission::LimitKind;
use crate::core::spec::{
    BackendSpec, Discipline, OutlierSpec, PoolPart, PoolSpec, PreemptionSpec, Priority, QueueSpec,
    SchedulerSpec, Strategy, TenantSpec,
};
use proptest::prelude::{Strategy as PropStrategy, *};

fn t(ms: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(ms)
}

fn tenant(name: &str, weight: f64) -> TenantSpec {
    TenantSpec {
        name: name.into(),
        weight,
        priority: Priority::Interactive,
        rate: None,
        burst: None,
        max_concurrency: None,
        gpu_seconds_per_hour: None,
        leased: false,
        ttft_slo: None,
        on_late: crate::core::spec::OnLate::Serve,
    }
}

fn spec(backends: u32, window: u32, tenants: Vec<TenantSpec>) -> SchedulerSpec {
    SchedulerSpec {
        queue: QueueSpec {
            discipline: Discipline::Drf,
            max_wait: Duration::from_secs(30),
            max_queued_per_tenant: 1000,
            output_token_weight: 1.0,
            in_flight_credit: 0.5,
            prefill_charge: crate::core::spec::PrefillCharge::Uncached,
            locality: 0.0,
            batch_reserve: 0.0,
            batch_prefill_ahead: 0,
            batch_latency_target: 0.0,
            batch_gpu_discount: 0.0,
        },
        preemption: PreemptionSpec {
            enabled: true,
            min_wait: Duration::ZERO,
            migration_threshold: Duration::from_secs(300),
        },
        // Three poll intervals of 250 ms.
        stale_after: Duration::from_millis(750),
        tenants,
        pools: vec![PoolSpec {
            model: "m".into(),
            api: crate::core::spec::Api::OpenAi,
            strategy: Strategy::LeastOutstanding,
            kv_high_watermark: 0.8,
            ttft_p99_threshold: Duration::from_millis(150),
            outlier: OutlierSpec {
                success_rate_gap: 0.3,
                success_rate_min_requests: 20,
                success_rate_interval: Duration::from_secs(10),
                consecutive_failures: 3,
                ejection_time: Duration::from_secs(10),
                max_ejection_time: Duration::from_secs(25),
                max_ejected_share: 0.5,
            },
            adapter_affinity: true,
            adapters: Vec::new(),
            prefix: Default::default(),
            backends: (0..backends)
                .map(|i| BackendSpec {
                    name: format!("b{i}"),
                    gpus: 1,
                    max_inflight: window,
                    window_share: 1.0,
                    kv_tokens: 65_536,
                })
                .collect(),
            slots: None,
            yield_above: None,
        }],
    }
}

fn arrival(s: &Scheduler, name: &str) -> Arrival {
    Arrival {
        tenant: s.tenant(name).unwrap(),
        pool: s.pool("m").unwrap(),
        prompt_tokens: 100,
        max_tokens: Some(100),
        choices: 1,
        deadline: None,
        adapter: None,
        prefix: Vec::new(),
        lane: super::Lane::Live,
    }
}

fn dispatched(ds: &[Decision]) -> Vec<(RequestId, BackendId)> {
    ds.iter()
        .filter_map(|d| match d {
            Decision::Dispatch { id, backend } => Some((*id, *backend)),
            _ => None,
        })
        .collect()
}

#[test]
fn each_choice_asked_for_is_charged() {
    // `n` (or `best_of`) completions of up to `max_tokens` each: the
    // estimate charged at dispatch grows with them.
    let mut s = Scheduler::new(
        &spec(2, 4, vec![tenant("a", 1.0), tenant("b", 1.0)]),
        t(0),
        1,
    );
    let one = arrival(&s, "a");
    let four = Arrival {
        choices: 4,
        ..arrival(&s, "b")
    };
    for a in [one, four] {
        let (_, ds) = s.on_arrival(t(0), a).unwrap();
        assert_eq!(dispatched(&ds).len(), 1);
    }
    let service = |s: &mut Scheduler, name: &str| {
        let id = s.tenant(name).unwrap();
        s.tenant_view(t(0), id).service
    };
    let (a, b) = (service(&mut s, "a"), service(&mut s, "b"));
    assert!(b > 2.0 * a, "four choices charged {b}, one {a}");
}

#[test]
fn windows_hold_requests_in_the_gateway_queue() {
    let mut s = Scheduler::new(&spec(2, 2, vec![tenant("a", 1.0)]), t(0), 1);
    let mut running = Vec::new();
    for _ in 0..6 {
        let (_, ds) = s.on_arrival(t(0), arrival(&s, "a")).unwrap();
        running.extend(dispatched(&ds));
    }
    assert_eq!(running.len(), 4, "two backends × window 2");
    assert_eq!(s.queue_len(s.pool("m").unwrap()), 2);
    let spread: std::collections::HashSet<_> = running.iter().map(|(_, b)| *b).collect();
    assert_eq!(spread.len(), 2, "least outstanding spreads the load");
    // A completion hands its slot to the next queued request.
    let (id, b) = running[0];
    let (ended, ds) = s.on_completion(t(1000), id, None).unwrap();
    assert_eq!(ended.backend, b);
    assert_eq!(dispatched(&ds).len(), 1);
    assert_eq!(dispatched(&ds)[0].1, b);
}

#[test]
fn weights_three_to_one_get_three_to_one_service() {
    let mut s = Scheduler::new(
        &spec(1, 4, vec![tenant("a", 3.0), tenant("b", 1.0)]),
        t(0),
        1,
    );
    let mut in_flight = std::collections::VecDeque::new();
    for _ in 0..200 {
        for name in ["a", "b"] {
            let (_, ds) = s.on_arrival(t(0), arrival(&s, name)).unwrap();
            in_flight.extend(dispatched(&ds));
        }
    }
    let (a, b) = (s.tenant("a").unwrap(), s.tenant("b").unwrap());
    let mut served = [0u32; 2];
    let mut now = 0;
    for _ in 0..200 {
        now += 10;
        let (id, _) = in_flight.pop_front().unwrap();
        let usage = Usage {
            prompt_tokens: 100,
            completion_tokens: 100,
            cached_tokens: None,
        };
        let (ended, ds) = s.on_completion(t(now), id, Some(usage)).unwrap();
        served[usize::from(ended.tenant == b)] += 1;
        in_flight.extend(dispatched(&ds));
    }
    let _ = a;
    let ratio = f64::from(served[0]) / f64::from(served[1]);
    assert!((ratio - 3.0).abs() < 0.3, "served {served:?}");
}

#[test]
fn rate_limit_refuses_with_retry_after_that_works() {
    let mut p = tenant("a", 1.0);
    p.rate = Some(2.0);
    p.burst = Some(2.0);
    let mut s = Scheduler::new(&spec(1, 100, vec![p]), t(0), 1);
    assert!(s.on_arrival(t(0), arrival(&s, "a")).is_ok());
    // An admission leaves the bucket's state for the answer's headers.
    let a = s.tenant("a").unwrap();
    let left = s.rate_limits(a).requests.unwrap();
    assert_eq!((left.limit, left.remaining), (2.0, 1.0));
    assert_eq!(left.reset, Duration::from_millis(500));
    assert_eq!(s.rate_limits(a).gpu_seconds, None, "no GPU budget");
    assert!(s.on_arrival(t(0), arrival(&s, "a")).is_ok());
    let refusal = s.on_arrival(t(0), arrival(&s, "a")).unwrap_err();
    assert_eq!(refusal.limit, LimitKind::Rate);
    assert_eq!(refusal.retry_after, Duration::from_millis(500));
    let left = refusal.limits.requests.unwrap();
    assert_eq!((left.limit, left.remaining), (2.0, 0.0));
    assert!(s.on_arrival(t(499), arrival(&s, "a")).is_err());
    assert!(s.on_arrival(t(500), arrival(&s, "a")).is_ok());
}

#[test]
fn a_batch_item_is_charged_its_gpu_seconds_less_the_discount() {
    let run = |discount: f64, lane| {
        let mut p = tenant("a", 1.0);
        p.gpu_seconds_per_hour = Some(36.0);
        let mut spec = spec(1, 100, vec![p]);
        spec.queue.batch_gpu_discount = discount;
        let mut s = Scheduler::new(&spec, t(0), 1);
        let a = Arrival {
            lane,
            deadline: Some(Duration::from_secs(3600)),
            ..arrival(&s, "a")
        };
        let (id, _) = s.on_arrival(t(0), a).unwrap();
        // Alone on one GPU for 10 s: 10 GPU-seconds.
        let (ended, _) = s.on_completion(t(10_000), id, None).unwrap();
        assert!((ended.gpu_seconds - 10.0).abs() < 1e-6);
        let level = s.tenant_view(t(10_000), s.tenant("a").unwrap());
        36.0 - level.gpu_seconds_level.unwrap()
    };
    let charged = |d, lane| (run(d, lane) * 1000.0).round() / 1000.0;
    // Less what the bucket refilled meanwhile.
    let full = charged(0.0, Lane::Batch);
    assert!((9.8..10.0).contains(&full), "{full}");
    assert_eq!(charged(0.75, Lane::Resumable), full * 0.25);
    assert_eq!(charged(0.75, Lane::Live), full, "live work pays in full");
}

#[test]
fn gpu_budget_in_debt_refuses_until_refilled() {
    let mut p = tenant("a", 1.0);
    p.gpu_seconds_per_hour = Some(3.6); // 1 ms of GPU per second
    let mut s = Scheduler::new(&spec(1, 100, vec![p]), t(0), 1);
    let (id, ds) = s.on_arrival(t(0), arrival(&s, "a")).unwrap();
    assert_eq!(dispatched(&ds).len(), 1);
    // Runs alone on one GPU for 10 s: 10 GPU-seconds, far over the 3.6 budget.
    let (ended, _) = s.on_completion(t(10_000), id, None).unwrap();
    assert!((ended.gpu_seconds - 10.0).abs() < 1e-6);
    let refusal = s.on_arrival(t(10_000), arrival(&s, "a")).unwrap_err();
    assert_eq!(refusal.limit, LimitKind::GpuSeconds);
    // The bucket is at 3.6 - 10 = -6.4 GPU-s and refills 0.001/s.
    assert!(
        refusal.retry_after > Duration::from_secs(6400),
        "{:?}",
        refusal.retry_after
    );
    let view = s.tenant_view(t(10_000), s.tenant("a").unwrap());
    assert!(view.gpu_seconds_level.unwrap() < 0.0);
    assert!((view.gpu_seconds_total - 10.0).abs() < 1e-6);
}

#[test]
fn concurrency_cap_counts_queued_and_in_flight() {
    let mut p = tenant("a", 1.0);
    p.max_concurrency = Some(3);
    let mut s = Scheduler::new(&spec(1, 1, vec![p]), t(0), 1);
    let (first, _) = s.on_arrival(t(0), arrival(&s, "a")).unwrap();
    s.on_arrival(t(0), arrival(&s, "a")).unwrap();
    s.on_arrival(t(0), arrival(&s, "a")).unwrap();
    assert_eq!(
        s.on_arrival(t(0), arrival(&s, "a")).unwrap_err().limit,
        LimitKind::Concurrency
    );
    s.on_completion(t(1), first, None).unwrap();
    assert!(s.on_arrival(t(1), arrival(&s, "a")).is_ok());
}

#[test]
fn queued_request_past_max_wait_is_shed_and_cancel_leaves_at_once() {
    let mut s = Scheduler::new(&spec(1, 1, vec![tenant("a", 1.0)]), t(0), 1);
    s.on_arrival(t(0), arrival(&s, "a")).unwrap();
    let (queued, ds) = s.on_arrival(t(0), arrival(&s, "a")).unwrap();
    assert!(ds.is_empty());
    let (cancelled, _) = s.on_arrival(t(0), arrival(&s, "a")).unwrap();
    assert_eq!(s.queue_len(PoolId(0)), 2);
    let (ended, ds) = s.on_cancel(t(5), cancelled);
    assert!(ended.is_none() && ds.is_empty());
    assert_eq!(
        s.queue_len(PoolId(0)),
        1,
        "cancelled request left the queue at once"
    );
    assert_eq!(s.next_wakeup(), Some(t(30_000)));
    assert!(s.on_tick(t(29_999)).is_empty());
    let ds = s.on_tick(t(30_000));
    assert_eq!(
        ds,
        vec![Decision::Shed {
            id: queued,
            retry_after: Duration::from_secs(1)
        }]
    );
    assert_eq!(s.queue_len(PoolId(0)), 0);
    assert_eq!(s.live_requests(), 1);
}

#[test]
fn full_kv_reading_stops_routing_until_it_drains() {
    let mut s = Scheduler::new(&spec(2, 8, vec![tenant("a", 1.0)]), t(0), 1);
    let b0 = s.backend("b0").unwrap();
    let b1 = s.backend("b1").unwrap();
    // One request on each, then b0 reports a full KV cache.
    let mut on = Vec::new();
    for _ in 0..2 {
        on.extend(dispatched(&s.on_arrival(t(0), arrival(&s, "a")).unwrap().1));
    }
    s.on_reading(
        t(1),
        b0,
        Reading {
            at: t(1),
            kv_usage: Some(0.95),
            ..Reading::default()
        },
    );
    for _ in 0..4 {
        let ds = s.on_arrival(t(2), arrival(&s, "a")).unwrap().1;
        assert!(dispatched(&ds).iter().all(|(_, b)| *b == b1));
    }
    // Stale after three intervals: routing falls back to local counts.
    let ds = s.on_arrival(t(1000), arrival(&s, "a")).unwrap().1;
    assert_eq!(dispatched(&ds)[0].1, b0);
}

#[test]
fn a_full_backend_gets_nothing_even_with_none_of_ours_on_it() {
    // Another gateway filled b0: a fresh reading says so, and nothing of
    // ours runs there. Requests go to b1; with both full they wait here.
    let mut s = Scheduler::new(&spec(2, 8, vec![tenant("a", 1.0)]), t(0), 1);
    let (b0, b1) = (s.backend("b0").unwrap(), s.backend("b1").unwrap());
    let full = Reading {
        at: t(1),
        kv_usage: Some(0.9),
        ..Reading::default()
    };
    s.on_reading(t(1), b0, full.clone());
    for _ in 0..3 {
        let ds = s.on_arrival(t(2), arrival(&s, "a")).unwrap().1;
        assert_eq!(dispatched(&ds)[0].1, b1);
    }
    s.on_reading(t(3), b1, full);
    let ds = s.on_arrival(t(4), arrival(&s, "a")).unwrap().1;
    assert!(dispatched(&ds).is_empty(), "no backend has headroom: wait");
    assert_eq!(s.queue_len(s.pool("m").unwrap()), 1);
    // b0 drains: the waiting request goes there.
    let ds = s.on_reading(
        t(5),
        b0,
        Reading {
            at: t(5),
            kv_usage: Some(0.1),
            ..Reading::default()
        },
    );
    assert_eq!(dispatched(&ds)[0].1, b0);
}

#[test]
fn without_fresh_readings_the_observed_ttft_steers_routing() {
    let mut s = Scheduler::new(&spec(2, 8, vec![tenant("a", 1.0)]), t(0), 1);
    let (b0, b1) = (s.backend("b0").unwrap(), s.backend("b1").unwrap());
    let first = dispatched(&s.on_arrival(t(0), arrival(&s, "a")).unwrap().1);
    let second = dispatched(&s.on_arrival(t(0), arrival(&s, "a")).unwrap().1);
    let slow = if first[0].1 == b0 {
        first[0].1
    } else {
        second[0].1
    };
    assert_ne!(first[0].1, second[0].1);
    // The gateway saw b0 take 400 ms to its first token (threshold 150 ms).
    s.observe_ttft(slow, Duration::from_millis(400));
    for _ in 0..4 {
        let ds = s.on_arrival(t(10), arrival(&s, "a")).unwrap().1;
        assert_eq!(dispatched(&ds)[0].1, b1, "b0 is slow and busy");
    }
    // With nothing of ours left on b0 it is tried again, and re-measured.
    let slow_id = if first[0].1 == b0 {
        first[0].0
    } else {
        second[0].0
    };
    s.on_completion(t(20), slow_id, None).unwrap();
    let ds = s.on_arrival(t(20), arrival(&s, "a")).unwrap().1;
    assert_eq!(dispatched(&ds)[0].1, b0);
    s.observe_ttft(b0, Duration::from_millis(20));
    s.observe_ttft(b0, Duration::from_millis(20));
    s.observe_ttft(b0, Duration::from_millis(20));
    s.observe_ttft(b0, Duration::from_millis(20));
    s.observe_ttft(b0, Duration::from_millis(20));
    s.observe_ttft(b0, Duration::from_millis(20));
    assert!(s.backend_view(t(20), b0).observed_ttft.unwrap() < Duration::from_millis(150));
    let ds = s.on_arrival(t(21), arrival(&s, "a")).unwrap().1;
    assert!(!dispatched(&ds).is_empty());
}

#[test]
fn a_failed_connection_ejects_and_redispatches_elsewhere() {
    let mut s = Scheduler::new(
        &spec(2, 1, vec![tenant("a", 1.0), tenant("b", 1.0)]),
        t(0),
        1,
    );
    let pool = s.pool("m").unwrap();
    let (id, dead) = dispatched(&s.on_arrival(t(0), arrival(&s, "a")).unwrap().1)[0];
    let alive = if dead == s.backend("b0").unwrap() {
        s.backend("b1").unwrap()
    } else {
        s.backend("b0").unwrap()
    };
    // The other backend is busy; b's request waits in the queue.
    let (other, _) = dispatched(&s.on_arrival(t(0), arrival(&s, "a")).unwrap().1)[0];
    let (queued, ds) = s.on_arrival(t(1), arrival(&s, "b")).unwrap();
    assert!(ds.is_empty());
    let ds = s.redispatch(t(2), id).unwrap();
    assert!(ds.is_empty(), "no room anywhere: the retried request waits");
    assert!(!s.is_healthy(dead));
    assert!(s.redispatch(t(2), id).is_none(), "not in flight any more");
    assert_eq!(s.queue_len(pool), 2);
    // When the live backend frees up, b (served nothing yet, while a had
    // half of its work in flight credited) goes first; then the retried
    // request, at the head of a's queue, and never to the ejected backend.
    let (_, ds) = s.on_completion(t(3), other, None).unwrap();
    assert_eq!(dispatched(&ds), vec![(queued, alive)]);
    let (_, ds) = s.on_completion(t(4), queued, None).unwrap();
    assert_eq!(dispatched(&ds), vec![(id, alive)]);
    assert_eq!(s.tenant_view(t(4), s.tenant("a").unwrap()).in_flight, 1);
    s.on_completion(t(4), id, None).unwrap();
    // The backend returns when healthy again.
    s.set_health(t(5), dead, true);
    assert!(s.is_healthy(dead));
}

#[test]
fn reload_keeps_state_of_unchanged_tenants() {
    let mut p = tenant("a", 1.0);
    p.rate = Some(1.0);
    p.burst = Some(1.0);
    let pol = spec(1, 4, vec![p.clone(), tenant("b", 1.0)]);
    let mut s = Scheduler::new(&pol, t(0), 1);
    s.on_arrival(t(0), arrival(&s, "a")).unwrap();
    let mut next = pol.clone();
    next.tenants.retain(|t| t.name == "a");
    next.tenants.push(tenant("c", 2.0));
    s.apply_policy(&next, t(1));
    assert!(s.tenant("b").is_none());
    assert!(s.tenant("c").is_some());
    assert_eq!(
        s.on_arrival(t(1), arrival(&s, "a")).unwrap_err().limit,
        LimitKind::Rate,
        "bucket survived"
    );
    assert_eq!(s.tenant_view(t(1), s.tenant("a").unwrap()).in_flight, 1);
}

#[derive(Clone, Debug)]
enum Op {
    Arrive(u8),
    Complete(usize),
    Cancel(usize),
    Tick(u64),
}

fn op() -> impl PropStrategy<Value = Op> {
    prop_oneof![
        (0u8..3).prop_map(Op::Arrive),
        (0usize..64).prop_map(Op::Complete),
        (0usize..64).prop_map(Op::Cancel),
        (0u64..20_000).prop_map(Op::Tick),
    ]
}

proptest! {
    /// Every admitted request ends exactly once, reservations are settled,
    /// and the scheduler forgets nothing and holds nothing extra.
    #[test]
    fn every_admitted_request_ends_in_exactly_one_outcome(ops in proptest::collection::vec(op(), 1..300)) {
        let mut ts = vec![tenant("a", 3.0), tenant("b", 1.0), tenant("c", 1.0)];
        ts[1].gpu_seconds_per_hour = Some(36.0);
        ts[2].rate = Some(5.0);
        ts[2].max_concurrency = Some(5);
        // Batch: "a" and "b" preempt its young work.
        ts[2].priority = Priority::Batch;
        let mut s = Scheduler::new(&spec(2, 2, ts), t(0), 7);
        let names = ["a", "b", "c"];
        let mut now = 0u64;
        let mut open: Vec<RequestId> = Vec::new(); // admitted, not ended
        let mut in_flight: Vec<RequestId> = Vec::new();
        let mut ended = std::collections::HashSet::new();
        let apply = |ds: Vec<Decision>, in_flight: &mut Vec<RequestId>, open: &mut Vec<RequestId>, ended: &mut std::collections::HashSet<RequestId>| {
            for d in ds {
                match d {
                    Decision::Dispatch { id, .. } => {
                        assert!(!in_flight.contains(&id), "dispatched twice");
                        in_flight.push(id);
                    }
                    Decision::Preempt { id, .. } => {
                        assert!(in_flight.contains(&id), "preempted while not in flight");
                        in_flight.retain(|r| *r != id);
                    }
                    Decision::Shed { id, .. } => {
                        assert!(ended.insert(id), "ended twice");
                        open.retain(|r| *r != id);
                    }
                }
            }
        };
        for o in ops {
            now += 1;
            match o {
                Op::Arrive(i) => {
                    if let Ok((id, ds)) = s.on_arrival(t(now), arrival(&s, names[i as usize])) {
                        open.push(id);
                        apply(ds, &mut in_flight, &mut open, &mut ended);
                    }
                }
                Op::Complete(i) if !in_flight.is_empty() => {
                    let id = in_flight.remove(i % in_flight.len());
                    let (_, ds) = s.on_completion(t(now), id, Some(Usage { prompt_tokens: 10, completion_tokens: 20, cached_tokens: None })).expect("in flight");
                    prop_assert!(ended.insert(id));
                    open.retain(|r| *r != id);
                    apply(ds, &mut in_flight, &mut open, &mut ended);
                }
                Op::Cancel(i) if !open.is_empty() => {
                    let id = open.remove(i % open.len());
                    in_flight.retain(|r| *r != id);
                    let (_, ds) = s.on_cancel(t(now), id);
                    prop_assert!(ended.insert(id));
                    apply(ds, &mut in_flight, &mut open, &mut ended);
                }
                Op::Tick(dt) => {
                    now += dt;
                    let ds = s.on_tick(t(now));
                    apply(ds, &mut in_flight, &mut open, &mut ended);
                }
                _ => {}
            }
            prop_assert_eq!(s.live_requests(), open.len());
            let ids: Vec<_> = s.tenants().collect();
            let total_flight: u32 = ids.into_iter().map(|id| s.tenant_view(t(now), id).in_flight).sum();
            prop_assert_eq!(total_flight as usize, in_flight.len());
        }
        // End everything: all reservations settle, buckets return within capacity.
        for id in open.clone() {
            s.on_cancel(t(now), id);
        }
        prop_assert_eq!(s.live_requests(), 0);
        for id in s.tenants().collect::<Vec<_>>() {
            // Long enough to repay everything actually used: with every
            // reservation settled, the bucket is then exactly full.
            let used = s.tenant_view(t(now), id).gpu_seconds_total;
            let v = s.tenant_view(t(now + 3_600_000 + (used * 100_000.0) as u64 + 1000), id);
            prop_assert_eq!(v.queued + v.in_flight, 0);
            if let Some(level) = v.gpu_seconds_level {
                prop_assert!((level - 36.0).abs() < 1e-6, "bucket refilled to capacity: {}", level);
            }
        }
    }
}

#[test]
fn the_window_halves_on_an_engine_backlog_not_on_a_step_boundary() {
    let mut s = Scheduler::new(&spec(1, 16, vec![tenant("a", 1.0)]), t(0), 1);
    let b0 = s.backend("b0").unwrap();
    let reading = |at, running, waiting| Reading {
        at: t(at),
        running: Some(running),
        waiting: Some(waiting),
        kv_usage: Some(0.1),
        ..Reading::default()
    };
    let window = |s: &mut Scheduler, at| s.backend_view(t(at), b0).window;
    // Two requests wait for the next step while five run: no backlog.
    s.on_reading(t(1), b0, reading(1, 5, 2));
    assert_eq!(window(&mut s, 1), 16);
    // The engine runs the whole window and still queues: halve.
    s.on_reading(t(2), b0, reading(2, 16, 3));
    assert_eq!(window(&mut s, 2), 8);
    s.on_reading(t(3), b0, reading(3, 8, 1));
    assert_eq!(window(&mut s, 3), 4);
    // KV at the watermark is pressure whatever runs.
    s.on_reading(
        t(4),
        b0,
        Reading {
            kv_usage: Some(0.85),
            ..reading(4, 1, 0)
        },
    );
    assert_eq!(window(&mut s, 4), 2);
    // Without a running count, any waiting is pressure.
    s.on_reading(
        t(5),
        b0,
        Reading {
            running: None,
            ..reading(5, 0, 1)
        },
    );
    assert_eq!(window(&mut s, 5), 1);
    // Headroom and a full window: grow by one a reading.
    for _ in 0..3 {
        let _ = s.on_arrival(t(6), arrival(&s, "a"));
    }
    s.on_reading(t(6), b0, reading(6, 1, 0));
    assert_eq!(window(&mut s, 6), 2);

    // A replica holding 3/4 of a cluster's window of 16 (12 here): the
    // engine running 14, some of them the other replica's, with one at the
    // step boundary, is no backlog; running all 16 and queueing is.
    let shared =
        spec(1, 16, vec![tenant("a", 1.0)]).shared_by(2, |_| 0.5, |_| PoolPart::share(0.75));
    let mut s = Scheduler::new(&shared, t(0), 1);
    assert_eq!(window(&mut s, 0), 12);
    s.on_reading(t(1), b0, reading(1, 14, 1));
    assert_eq!(window(&mut s, 1), 12);
    s.on_reading(t(2), b0, reading(2, 16, 2));
    assert_eq!(window(&mut s, 2), 6);
}

fn batch(name: &str) -> TenantSpec {
    TenantSpec {
        priority: Priority::Batch,
        ..tenant(name, 1.0)
    }
}

fn preempted(ds: &[Decision]) -> Vec<RequestId> {
    ds.iter()
        .filter_map(|d| match d {
            Decision::Preempt { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

/// One backend, window 2, full of `jobs` (batch) work dispatched at 0 and
/// 10 ms; returns the scheduler and the two ids, oldest first.
fn full_of_batch(edit: impl FnOnce(&mut SchedulerSpec)) -> (Scheduler, [RequestId; 2]) {
    let mut p = spec(1, 2, vec![batch("jobs"), tenant("app", 1.0)]);
    edit(&mut p);
    let mut s = Scheduler::new(&p, t(0), 1);
    let (old, ds) = s.on_arrival(t(0), arrival(&s, "jobs")).unwrap();
    assert_eq!(dispatched(&ds).len(), 1);
    let (young, ds) = s.on_arrival(t(10), arrival(&s, "jobs")).unwrap();
    assert_eq!(dispatched(&ds).len(), 1);
    (s, [old, young])
}

#[test]
fn interactive_work_preempts_the_youngest_batch_request_which_runs_again_later() {
    let (mut s, [old, young]) = full_of_batch(|_| {});
    let (app, ds) = s.on_arrival(t(20), arrival(&s, "app")).unwrap();
    assert_eq!(preempted(&ds), [young], "the youngest loses the least work");
    assert_eq!(
        dispatched(&ds).iter().map(|d| d.0).collect::<Vec<_>>(),
        [app]
    );
    let jobs = s.tenant("jobs").unwrap();
    assert_eq!(s.tenant_view(t(20), jobs).queued, 1);
    assert_eq!(s.tenant_view(t(20), jobs).preempted_total, 1);
    // Slots per weight are now even (1 and 1): a second app request waits.
    let (_, ds) = s.on_arrival(t(30), arrival(&s, "app")).unwrap();
    assert!(ds.is_empty(), "{ds:?}");
    // The preempted request keeps its turn within its tenant and is
    // dispatched again; a completion of it before then is not one.
    assert!(s.on_completion(t(35), young, None).is_none());
    let (_, ds) = s.on_completion(t(40), old, None).unwrap();
    let (_, ds2) = s.on_completion(t(50), app, None).unwrap();
    let next: Vec<_> = dispatched(&ds)
        .into_iter()
        .chain(dispatched(&ds2))
        .map(|d| d.0)
        .collect();
    assert!(next.contains(&young), "{next:?}");
}

#[test]
fn interactive_work_waiting_at_another_replica_takes_young_batch_slots_held_here() {
    // This replica holds 4 batch requests of a pool of 4 slots.
    let mut p = spec(1, 4, vec![batch("jobs"), tenant("app", 1.0)]);
    let mut s = Scheduler::new(&p, t(0), 1);
    let ids: Vec<RequestId> = (0..4)
        .map(|i| s.on_arrival(t(i * 10), arrival(&s, "jobs")).unwrap().0)
        .collect();
    // Fewer slots alone preempt nothing: the work ends in its time.
    p.pools[0].slots = Some(1);
    assert!(preempted(&s.apply_policy(&p, t(50))).is_empty());
    // Interactive work waits elsewhere: what is held above the share
    // kept goes, youngest first, and waits here for a slot.
    p.pools[0].yield_above = Some(1);
    let ds = s.apply_policy(&p, t(60));
    assert_eq!(preempted(&ds), [ids[3], ids[2], ids[1]]);
    assert!(dispatched(&ds).is_empty(), "{ds:?}");
    let jobs = s.tenant("jobs").unwrap();
    assert_eq!(s.tenant_view(t(60), jobs).queued, 3);
    assert_eq!(s.tenant_view(t(60), jobs).preempted_total, 3);
    // Work past the migration threshold is never yielded.
    p.pools[0].yield_above = None;
    p.pools[0].slots = Some(4);
    let ds = s.apply_policy(&p, t(70));
    assert_eq!(dispatched(&ds).len(), 3);
    p.preemption.migration_threshold = Duration::from_millis(5);
    p.pools[0].yield_above = Some(1);
    assert!(preempted(&s.apply_policy(&p, t(80))).is_empty());
}

#[test]
fn a_replica_asks_for_slots_for_interactive_work_that_waited_min_wait() {
    let mut p = spec(
        1,
        1,
        vec![tenant("x", 1.0), tenant("app", 1.0), batch("jobs")],
    );
    p.preemption.min_wait = Duration::from_millis(50);
    let mut s = Scheduler::new(&p, t(0), 1);
    let _ = s.on_arrival(t(0), arrival(&s, "x")).unwrap();
    for _ in 0..2 {
        let _ = s.on_arrival(t(10), arrival(&s, "app")).unwrap();
    }
    let _ = s.on_arrival(t(10), arrival(&s, "jobs")).unwrap();
    let wants = |s: &Scheduler, ms| -> Vec<(String, u32)> {
        s.preemption_wants(t(ms))
            .map(|(k, n)| (k.into_owned(), n))
            .collect()
    };
    assert!(wants(&s, 40).is_empty());
    // Both of app's queued requests; the batch tenant's never ask.
    assert_eq!(wants(&s, 60), [("m".to_owned(), 2)]);
    p.preemption.enabled = false;
    let _ = s.apply_policy(&p, t(70));
    assert!(wants(&s, 70).is_empty());
}

#[test]
fn batch_work_past_the_threshold_or_already_answering_is_never_preempted() {
    // Past the migration threshold.
    let (mut s, _) = full_of_batch(|p| p.preemption.migration_threshold = Duration::from_millis(5));
    let (_, ds) = s.on_arrival(t(20), arrival(&s, "app")).unwrap();
    assert!(ds.is_empty(), "{ds:?}");
    // Responses already started.
    let (mut s, ids) = full_of_batch(|_| {});
    for id in ids {
        assert!(s.on_response_started(id));
    }
    let (_, ds) = s.on_arrival(t(20), arrival(&s, "app")).unwrap();
    assert!(ds.is_empty(), "{ds:?}");
    // Preemption off.
    let (mut s, _) = full_of_batch(|p| p.preemption.enabled = false);
    let (_, ds) = s.on_arrival(t(20), arrival(&s, "app")).unwrap();
    assert!(ds.is_empty(), "{ds:?}");
    // A batch request never preempts.
    let (mut s, _) = full_of_batch(|_| {});
    let (_, ds) = s.on_arrival(t(20), arrival(&s, "jobs")).unwrap();
    assert!(ds.is_empty(), "{ds:?}");
}

#[test]
fn a_resumable_item_already_answering_is_preempted_and_leaves_the_scheduler() {
    let mut p = spec(1, 2, vec![tenant("owner", 1.0), tenant("app", 1.0)]);
    p.preemption.enabled = true;
    let mut s = Scheduler::new(&p, t(0), 1);
    let item = |s: &Scheduler, lane| Arrival {
        lane,
        deadline: Some(Duration::from_secs(3600)),
        ..arrival(s, "owner")
    };
    let (resumable, ds) = s.on_arrival(t(0), item(&s, Lane::Resumable)).unwrap();
    assert_eq!(dispatched(&ds).len(), 1);
    let (plain, ds) = s.on_arrival(t(10), item(&s, Lane::Batch)).unwrap();
    assert_eq!(dispatched(&ds).len(), 1);
    // Both stream: only the resumable one stays preemptible, though the
    // other is younger.
    assert!(s.on_response_started(plain));
    assert!(s.on_response_started(resumable));
    let (app, ds) = s.on_arrival(t(20), arrival(&s, "app")).unwrap();
    assert_eq!(preempted(&ds), [resumable]);
    assert_eq!(
        dispatched(&ds).iter().map(|d| d.0).collect::<Vec<_>>(),
        [app]
    );
    // It left: not queued again, its completion is not one, no slot held.
    let owner = s.tenant("owner").unwrap();
    assert_eq!(s.tenant_view(t(20), owner).queued, 0);
    assert_eq!(s.tenant_view(t(20), owner).preempted_total, 1);
    assert!(s.on_completion(t(30), resumable, None).is_none());
    assert!(s.on_completion(t(30), plain, None).is_some());
}

#[test]
fn a_promoted_item_waits_in_the_fair_queue_ahead_of_the_batch_lane() {
    let mut p = spec(1, 1, vec![tenant("owner", 1.0), tenant("app", 1.0)]);
    p.queue.max_wait = Duration::from_millis(100);
    let mut s = Scheduler::new(&p, t(0), 1);
    let item = |s: &Scheduler, lane| Arrival {
        lane,
        deadline: Some(Duration::from_secs(3600)),
        ..arrival(s, "owner")
    };
    let (app, ds) = s.on_arrival(t(0), arrival(&s, "app")).unwrap();
    assert_eq!(dispatched(&ds).len(), 1);
    let (_, ds) = s.on_arrival(t(1), item(&s, Lane::Batch)).unwrap();
    assert!(ds.is_empty());
    let (promoted, ds) = s.on_arrival(t(2), item(&s, Lane::Promoted)).unwrap();
    assert!(ds.is_empty());
    // It waits out its window, not `max_wait`.
    assert!(s.on_tick(t(500)).is_empty());
    let (_, ds) = s.on_completion(t(600), app, None).unwrap();
    assert_eq!(
        dispatched(&ds).iter().map(|d| d.0).collect::<Vec<_>>(),
        [promoted]
    );
}

#[test]
fn batch_items_leave_the_live_reserve_free() {
    let mut p = spec(1, 4, vec![tenant("owner", 1.0), tenant("app", 1.0)]);
    p.queue.batch_reserve = 0.5;
    p.preemption.enabled = false;
    let mut s = Scheduler::new(&p, t(0), 1);
    let item = |s: &Scheduler| Arrival {
        lane: Lane::Resumable,
        deadline: Some(Duration::from_secs(3600)),
        ..arrival(s, "owner")
    };
    let mut sent = 0;
    for i in 0..4 {
        let (_, ds) = s.on_arrival(t(i), item(&s)).unwrap();
        sent += dispatched(&ds).len();
    }
    assert_eq!(sent, 2, "half of the window is live work's");
    for i in 0..2 {
        let (_, ds) = s.on_arrival(t(10 + i), arrival(&s, "app")).unwrap();
        assert_eq!(dispatched(&ds).len(), 1, "live work takes the reserve");
    }
}

#[test]
fn a_preemption_waits_for_min_wait_and_the_tick_then_makes_it() {
    let (mut s, [_, young]) = full_of_batch(|p| p.preemption.min_wait = Duration::from_millis(100));
    let (app, ds) = s.on_arrival(t(20), arrival(&s, "app")).unwrap();
    assert!(ds.is_empty(), "a slot may free by itself first: {ds:?}");
    assert_eq!(s.next_wakeup(), Some(t(120)));
    assert!(s.on_tick(t(119)).is_empty());
    let ds = s.on_tick(t(120));
    assert_eq!(preempted(&ds), [young]);
    assert_eq!(
        dispatched(&ds).iter().map(|d| d.0).collect::<Vec<_>>(),
        [app]
    );
    // The preempted request's response has not started: it cannot start now.
    assert!(!s.on_response_started(young));
}

#[test]
fn a_reload_that_makes_the_tenant_interactive_or_removes_it_protects_its_work() {
    // `jobs` becomes interactive: its in-flight work is no longer batch.
    let (mut s, _) = full_of_batch(|_| {});
    let mut p = spec(1, 2, vec![tenant("jobs", 1.0), tenant("app", 1.0)]);
    s.apply_policy(&p, t(15));
    let (_, ds) = s.on_arrival(t(20), arrival(&s, "app")).unwrap();
    assert!(preempted(&ds).is_empty(), "{ds:?}");
    // `jobs` removed: its in-flight work ends normally, never requeued.
    let (mut s, _) = full_of_batch(|_| {});
    p.tenants.retain(|t| t.name == "app");
    s.apply_policy(&p, t(15));
    let (_, ds) = s.on_arrival(t(20), arrival(&s, "app")).unwrap();
    assert!(preempted(&ds).is_empty(), "{ds:?}");
}

#[test]
fn consecutive_failures_eject_a_backend_for_a_growing_time_within_the_cap() {
    let mut s = Scheduler::new(&spec(4, 8, vec![tenant("a", 1.0)]), t(0), 1);
    let b = |i: u32| BackendId(i);
    // Two failures, a success, two more: never three in a row.
    for ok in [false, false, true, false, false] {
        assert_eq!(s.on_backend_result(t(0), b(0), ok), None);
    }
    // The third in a row ejects it for 10 s.
    let e = s.on_backend_result(t(1), b(0), false).unwrap();
    assert_eq!((e.backend, e.until, e.count), (b(0), t(10_001), 1));
    assert!(s.is_ejected(t(5_000), b(0)));
    assert_eq!(s.next_wakeup(), Some(t(10_001)));
    // No request goes to it while ejected.
    for _ in 0..6 {
        let (_, d) = s.on_arrival(t(2), arrival(&s, "a")).unwrap();
        assert!(
            d.iter()
                .all(|d| !matches!(d, Decision::Dispatch { backend, .. } if *backend == b(0)))
        );
    }
    // Half of four may be ejected: a second, not a third.
    for _ in 0..3 {
        s.on_backend_result(t(3), b(1), false);
    }
    assert!(s.is_ejected(t(4), b(1)));
    for _ in 0..3 {
        assert_eq!(s.on_backend_result(t(3), b(2), false), None);
    }
    assert!(!s.is_ejected(t(4), b(2)));
    // It returns when the time is up; the next ejection lasts 20 s, then
    // the cap of 25 s.
    s.on_tick(t(10_001));
    assert!(!s.is_ejected(t(10_001), b(0)));
    // The caller learns of the return once, to log it.
    assert_eq!(s.take_ejections_ended(), vec![b(0)]);
    assert!(s.take_ejections_ended().is_empty());
    let e = (0..3)
        .find_map(|_| s.on_backend_result(t(20_000), b(0), false))
        .unwrap();
    assert_eq!((e.until, e.count), (t(40_000), 2));
    s.on_tick(t(40_000));
    let e = (0..3)
        .find_map(|_| s.on_backend_result(t(50_000), b(0), false))
        .unwrap();
    assert_eq!((e.until, e.count), (t(75_000), 3));
}

#[test]
fn the_last_available_backend_is_never_ejected() {
    let mut s = Scheduler::new(&spec(2, 8, vec![tenant("a", 1.0)]), t(0), 1);
    // One of two may be ejected (share 0.5)...
    assert!(
        (0..3)
            .find_map(|_| s.on_backend_result(t(0), BackendId(0), false))
            .is_some()
    );
    // ...but not the other, now the last one available.
    assert!((0..6).all(|_| s.on_backend_result(t(0), BackendId(1), false).is_none()));
    // With ejection off nothing is ejected.
    let mut off = spec(2, 8, vec![tenant("a", 1.0)]);
    off.pools[0].outlier.consecutive_failures = 0;
    let mut s = Scheduler::new(&off, t(0), 1);
    assert!((0..10).all(|_| s.on_backend_result(t(0), BackendId(0), false).is_none()));
}

#[test]
fn a_backend_failing_a_third_of_its_requests_is_ejected_on_success_rate() {
    let mut s = Scheduler::new(&spec(3, 8, vec![tenant("a", 1.0)]), t(0), 1);
    let b = |i: u32| BackendId(i);
    // Over one 10 s interval: backend 0 fails every third request (never
    // three in a row), 1 and 2 never fail.
    for i in 0..30u64 {
        assert_eq!(s.on_backend_result(t(i * 300), b(0), i % 3 != 2), None);
        assert_eq!(s.on_backend_result(t(i * 300), b(1), true), None);
        assert_eq!(s.on_backend_result(t(i * 300), b(2), true), None);
    }
    // The first result after the interval ends it: 0.67 against 1.0.
    let e = s.on_backend_result(t(10_000), b(1), true).unwrap();
    assert_eq!((e.backend, e.until, e.count), (b(0), t(20_000), 1));
    let EjectReason::SuccessRate { rate, rest } = e.reason else {
        panic!("{e:?}");
    };
    assert!(
        (rate - 2.0 / 3.0).abs() < 1e-9 && rest == 1.0,
        "{rate} {rest}"
    );
    // A pool that fails everywhere alike ejects nothing (the backends are
    // not outliers), nor does a backend with too few requests.
    let mut s = Scheduler::new(&spec(3, 8, vec![tenant("a", 1.0)]), t(0), 1);
    for i in 0..30u64 {
        for k in 0..3 {
            assert_eq!(s.on_backend_result(t(i * 300), b(k), i % 2 == 0), None);
        }
    }
    assert_eq!(s.on_backend_result(t(10_000), b(0), true), None);
    let mut s = Scheduler::new(&spec(3, 8, vec![tenant("a", 1.0)]), t(0), 1);
    for i in 0..19u64 {
        s.on_backend_result(t(i), b(0), i % 2 == 0);
    }
    for i in 0..40u64 {
        s.on_backend_result(t(i), b(1), true);
    }
    assert_eq!(s.on_backend_result(t(10_000), b(1), true), None);
    // Off with a gap of 0.
    let mut off = spec(3, 8, vec![tenant("a", 1.0)]);
    off.pools[0].outlier.success_rate_gap = 0.0;
    let mut s = Scheduler::new(&off, t(0), 1);
    for i in 0..30u64 {
        s.on_backend_result(t(i * 300), b(0), i % 3 != 2);
        s.on_backend_result(t(i * 300), b(1), true);
    }
    assert_eq!(s.on_backend_result(t(10_000), b(1), true), None);
}

/// Replicas leasing one tenant's limits from an in-memory store, in
/// simulated time.
struct Leased {
    replicas: Vec<Scheduler>,
    alive: Vec<bool>,
    store: HashMap<crate::core::admission::LeaseKind, crate::core::admission::SharedLimit>,
    /// Each replica's requests in flight, with when they end.
    running: Vec<Vec<(RequestId, u64)>>,
    admitted: u64,
}

impl Leased {
    fn new(n: usize, limits: TenantSpec, window: u32) -> Self {
        let spec =
            spec(1, window, vec![limits]).leased(n as u32, |_| PoolPart::share(1.0 / n as f64));
        let mut c = Leased {
            replicas: (0..n)
                .map(|r| Scheduler::new(&spec, t(0), r as u64))
                .collect(),
            alive: vec![true; n],
            store: HashMap::new(),
            running: vec![Vec::new(); n],
            admitted: 0,
        };
        for r in 0..n {
            c.sync(r, 0);
        }
        c
    }

    /// Replica `r`'s sync at `ms`; how many asks it sent.
    fn sync(&mut self, r: usize, ms: u64) -> usize {
        if !self.alive[r] {
            return 0;
        }
        let n = self.replicas.len() as u32;
        let asks = self.replicas[r].lease_asks(t(ms), Duration::from_millis(200), n);
        let answers: Vec<_> = asks
            .iter()
            .map(|a| {
                self.store
                    .entry(a.kind)
                    .or_default()
                    .sync(ms as f64 / 1000.0, &format!("r{r}"), a)
            })
            .collect();
        self.replicas[r].lease_granted(&asks, &answers);
        let short = self.store.iter().filter(|(_, l)| l.is_short());
        self.replicas[r].lease_short_elsewhere(short.map(|(k, _)| ("a", *k)));
        asks.len()
    }

    /// One arrival at replica `r`, held in flight for `hold` ms.
    fn arrive(&mut self, r: usize, ms: u64, hold: u64) -> Result<(), LimitKind> {
        let s = &mut self.replicas[r];
        let a = arrival(s, "a");
        let (id, _) = s.on_arrival(t(ms), a).map_err(|e| e.limit)?;
        self.running[r].push((id, ms + hold));
        self.admitted += 1;
        Ok(())
    }

    fn finish_until(&mut self, ms: u64) {
        for (r, s) in self.replicas.iter_mut().enumerate() {
            self.running[r].retain(|&(id, end)| {
                if end <= ms {
                    // Dispatched at once (the window is wide): it completes.
                    s.on_completion(t(end), id, None);
                    false
                } else {
                    true
                }
            });
        }
    }

    fn active(&self) -> usize {
        self.running.iter().map(Vec::len).sum()
    }
}

#[test]
fn leased_rate_and_concurrency_hold_for_the_cluster_under_moving_ingress() {
    let mut p = tenant("a", 1.0);
    p.rate = Some(20.0);
    p.burst = Some(10.0);
    p.max_concurrency = Some(6);
    let mut c = Leased::new(3, p, 1000);
    // 200 arrivals per second for 6 s, 40 ms each: first all at r0, then
    // spread, then all at r2. Each replica syncs every 100 ms, staggered.
    for ms in (0..6000u64).step_by(5) {
        c.finish_until(ms);
        if ms % 100 < 5 {
            for r in 0..3 {
                c.sync(r, ms + r as u64 * 30);
            }
        }
        let r = match ms {
            0..2000 => 0,
            2000..4000 => (ms / 5 % 3) as usize,
            _ => 2,
        };
        let _ = c.arrive(r, ms, 40);
        assert!(c.active() <= 6, "{} in flight at {ms} ms", c.active());
        let bound = 10.0 + 20.0 * ms as f64 / 1000.0;
        assert!(
            c.admitted as f64 <= bound + 1e-9,
            "{} > {bound}",
            c.admitted
        );
    }
    // Not starved either: within a few syncs' worth of the limit.
    assert!(c.admitted >= 100, "{}", c.admitted);
}

/// Issue 48: once the leases of an idle tenant have settled, a replica
/// asks for nothing until the keepalive; when a burst at one replica runs
/// short, the store's list of short limits makes the idle holders ask
/// again and give back their even floors, so the busy replica gets them
/// within a few syncs.
#[test]
fn idle_leases_go_unasked_until_a_replica_is_short_or_the_keepalive() {
    let mut p = tenant("a", 1.0);
    p.rate = Some(1.0);
    p.burst = Some(30.0);
    p.max_concurrency = Some(9);
    let mut c = Leased::new(3, p, 1000);
    for ms in (100..=2000).step_by(100) {
        for r in 0..3 {
            c.sync(r, ms);
        }
    }
    // Settled: every replica holds its even part and asks nothing.
    let asks: usize = (0..3).map(|r| c.sync(r, 2100)).sum();
    assert_eq!(asks, 0, "an idle tenant's leases were asked for");
    // A burst at r0: it spends its 10 and runs short; the others, told
    // by the store, give back their floors.
    let mut admitted = 0;
    for ms in (2200..4000).step_by(10) {
        if ms % 100 == 0 {
            for r in 0..3 {
                c.sync(r, ms);
            }
        }
        admitted += usize::from(c.arrive(0, ms, 0).is_ok());
        c.finish_until(ms);
    }
    assert!(
        admitted >= 25,
        "{admitted} of the burst's 30 admitted at r0"
    );
    // Idle again: the bucket refills at 1 a second into the replicas'
    // floors (asking meanwhile); once settled, quiet until the keepalive,
    // which asks.
    for ms in (4000..=60_000).step_by(100) {
        for r in 0..3 {
            c.sync(r, ms);
        }
    }
    let quiet: usize = (0..3).map(|r| c.sync(r, 60_100)).sum();
    assert_eq!(quiet, 0);
    let later = 60_100
        + crate::core::scheduler::LEASE_KEEPALIVE.as_millis() as u64
        + crate::core::scheduler::STAGGER_SECS * 1000;
    let kept: usize = (0..3).map(|r| c.sync(r, later)).sum();
    assert_eq!(kept, 6, "each replica's two leases at their keepalive");
}

#[test]
fn a_replica_that_stops_syncing_frees_its_leases_when_it_expires() {
    let mut p = tenant("a", 1.0);
    p.rate = Some(10.0);
    p.max_concurrency = Some(4);
    let mut c = Leased::new(2, p, 1000);
    // r1 takes slots and tokens, then dies holding them.
    for ms in [0, 1, 2] {
        let _ = c.arrive(1, ms, 60_000);
    }
    c.sync(1, 100);
    c.alive[1] = false;
    let slots = |c: &Leased| {
        c.replicas[0]
            .leases()
            .iter()
            .find(|l| l.1 == crate::core::admission::LeaseKind::Concurrency)
            .map(|l| l.2)
    };
    for ms in (200..1000).step_by(100) {
        c.sync(0, ms);
        let _ = c.arrive(0, ms, 60_000);
    }
    // r1 held its even part (2) and got no more (r0 held the rest); r0
    // gets the 2 r1 does not hold, not r1's.
    assert_eq!(slots(&c), Some(2.0), "r1's 2 slots are still held");
    // Its membership expires: the store drops what it held.
    for l in c.store.values_mut() {
        l.drop_replica("r1");
    }
    for ms in (1000..2000).step_by(100) {
        c.sync(0, ms);
        let _ = c.arrive(0, ms, 60_000);
    }
    assert_eq!(slots(&c), Some(4.0));
}

#[test]
fn a_leased_gpu_budget_charges_overruns_to_the_cluster() {
    let mut p = tenant("a", 1.0);
    p.gpu_seconds_per_hour = Some(36.0); // 0.01 GPU-s per second
    let mut c = Leased::new(2, p, 1000);
    // r0 runs one request for 20 s alone on the GPU: 20 GPU-s, far beyond
    // its estimate and the 36 GPU-s bucket's share it leased.
    c.arrive(0, 0, 20_000).unwrap();
    c.finish_until(20_000);
    c.sync(0, 20_000);
    // The debt is the store's now: what the cluster has left is the
    // budget less the 20 GPU-s, and r0 holds no debt.
    let store = &c.store[&crate::core::admission::LeaseKind::GpuSeconds];
    assert!(store.level() + store.held() <= 36.0 + 1e-9);
    assert!(
        store.level() < 36.0 - 20.0 + 1.0,
        "the overrun is charged: {}",
        store.level()
    );
    let r0 = c.replicas[0].leases();
    assert!(r0.iter().all(|l| l.2 >= 0.0), "{r0:?}");
    // What is left is still there for r1.
    c.sync(1, 20_100);
    assert!(c.arrive(1, 20_100, 10).is_ok());
}

proptest! {
    /// Any interleaving of arrivals, completions and syncs at three
    /// replicas: the requests admitted never pass one bucket's bound and
    /// the requests active never pass the concurrency cap.
    #[test]
    fn leased_limits_are_exact_for_any_interleaving(
        ops in proptest::collection::vec((0usize..3, 0u8..3, 0u64..80), 1..400),
    ) {
        let mut p = tenant("a", 1.0);
        p.rate = Some(5.0);
        p.burst = Some(8.0);
        p.max_concurrency = Some(5);
        let mut c = Leased::new(3, p, 1000);
        let mut ms = 0;
        for (r, op, dt) in ops {
            ms += dt;
            c.finish_until(ms);
            match op {
                0 => { c.sync(r, ms); }
                _ => { let _ = c.arrive(r, ms, dt * 7); }
            }
            prop_assert!(c.active() <= 5);
            prop_assert!(c.admitted as f64 <= 8.0 + 5.0 * ms as f64 / 1000.0 + 1e-9);
        }
    }
}

/// One backend of window 4 under `tenants`, 4 requests of `first` in flight
/// and `queued` more of it waiting; then one completion (without usage, so
/// costs stay put) every 100 ms for `warm_ms`: a queue that drains at 10
/// requests a second. Returns the scheduler, the in-flight ids, the time.
fn draining(
    tenants: Vec<TenantSpec>,
    first: &str,
    queued: u32,
    warm_ms: u64,
) -> (Scheduler, std::collections::VecDeque<RequestId>, u64) {
    let mut s = Scheduler::new(&spec(1, 4, tenants), t(0), 1);
    let mut flying = std::collections::VecDeque::new();
    for _ in 0..4 + queued {
        let (_, ds) = s.on_arrival(t(0), arrival(&s, first)).unwrap();
        flying.extend(dispatched(&ds).into_iter().map(|(id, _)| id));
    }
    let mut now = 0;
    while now < warm_ms {
        now += 100;
        let id = flying.pop_front().unwrap();
        let (_, ds) = s.on_completion(t(now), id, None).unwrap();
        flying.extend(dispatched(&ds).into_iter().map(|(id, _)| id));
    }
    (s, flying, now)
}

fn with_slo(spec: TenantSpec, ttft_ms: u64, on_late: OnLate) -> TenantSpec {
    TenantSpec {
        ttft_slo: Some(Duration::from_millis(ttft_ms)),
        on_late,
        ..spec
    }
}

#[test]
fn a_queue_that_drains_at_a_known_rate_predicts_the_dispatch_time_within_one_step() {
    let (mut s, mut flying, mut now) = draining(vec![tenant("a", 1.0)], "a", 100, 3000);
    let pool = s.pool("m").unwrap();
    let a = s.tenant("a").unwrap();
    // 100 queued, 30 drained: 70 ahead at 10 a second.
    let predicted = s.predicted_wait(pool, a).unwrap();
    assert!(
        (predicted.as_secs_f64() - 7.0).abs() < 0.1,
        "predicted {predicted:?}"
    );
    let (id, _) = s.on_arrival(t(now), arrival(&s, "a")).unwrap();
    let arrived = now;
    let waited = loop {
        now += 100;
        let done = flying.pop_front().unwrap();
        let (_, ds) = s.on_completion(t(now), done, None).unwrap();
        let ds = dispatched(&ds);
        if ds.iter().any(|(d, _)| *d == id) {
            break Duration::from_millis(now - arrived);
        }
        flying.extend(ds.into_iter().map(|(id, _)| id));
    };
    // Within one step (a completion, 100 ms) and the 2% the decaying
    // measure may be off by.
    let error = waited.as_secs_f64() - predicted.as_secs_f64();
    assert!(
        error.abs() <= 0.1 + 0.02 * waited.as_secs_f64(),
        "waited {waited:?}, predicted {predicted:?}"
    );
}

#[test]
fn a_flooding_tenant_is_refused_on_its_slo_while_one_inside_its_share_is_not() {
    let tenants = vec![
        with_slo(tenant("flood", 1.0), 1000, OnLate::Refuse),
        with_slo(tenant("api", 1.0), 1000, OnLate::Refuse),
    ];
    let (mut s, mut flying, mut now) = draining(tenants, "flood", 100, 3000);
    // The flood's next request would wait ~7 s for its own queue: refused
    // at once, with a retry-after of the wait beyond its budget.
    let refusal = s.on_arrival(t(now), arrival(&s, "flood")).unwrap_err();
    assert_eq!(refusal.limit, LimitKind::Slo);
    assert!(
        (5..=8).contains(&refusal.retry_after.as_secs()),
        "{refusal:?}"
    );
    // Two more at the same instant are told to come back one after the
    // other, a request's drain time apart (10 a second here), not all at
    // once to be refused again.
    for k in 1..=2 {
        let next = s.on_arrival(t(now), arrival(&s, "flood")).unwrap_err();
        let gap = next.retry_after.as_secs_f64() - refusal.retry_after.as_secs_f64();
        assert!((gap - 0.1 * f64::from(k)).abs() < 0.02, "{k}: {gap}");
    }
    // api sends one request: next in fair order, admitted and dispatched
    // at the next completion.
    let (id, ds) = s.on_arrival(t(now), arrival(&s, "api")).unwrap();
    assert!(ds.is_empty());
    now += 100;
    let done = flying.pop_front().unwrap();
    let (_, ds) = s.on_completion(t(now), done, None).unwrap();
    assert_eq!(dispatched(&ds)[0].0, id);
    // The flood's requests queued at 0 (admitted: nothing was known of
    // the drain rate then) passed their give-up time at 1 s: the next
    // tick sheds them all, long before max_wait (30 s).
    assert_eq!(s.next_wakeup(), Some(t(1000)));
    let shed = s.on_tick(t(now));
    assert_eq!(shed.len(), 70, "{shed:?}");
    assert!(shed.iter().all(|d| matches!(d, Decision::Shed { .. })));
}

#[test]
fn a_best_effort_request_past_its_slo_waits_behind_those_that_can_still_make_it() {
    let tenants = vec![
        with_slo(batch("evals"), 500, OnLate::BestEffort),
        with_slo(tenant("app", 1.0), 60_000, OnLate::Refuse),
    ];
    let mut s = Scheduler::new(&spec(1, 1, tenants), t(0), 1);
    let (running, _) = s.on_arrival(t(0), arrival(&s, "evals")).unwrap();
    // Queued at 0: its budget ends at 500 ms, then it is demoted.
    let (late, _) = s.on_arrival(t(0), arrival(&s, "evals")).unwrap();
    assert_eq!(s.next_wakeup(), Some(t(500)));
    assert!(s.on_tick(t(500)).is_empty(), "demoted, not shed");
    // app arrives after it; fair order alone would serve evals' queued
    // request first (its counter is the lower after the lift).
    let (app, _) = s.on_arrival(t(600), arrival(&s, "app")).unwrap();
    let (_, ds) = s.on_completion(t(700), running, None).unwrap();
    assert_eq!(dispatched(&ds)[0].0, app, "the late lane waits");
    let (_, ds) = s.on_completion(t(800), app, None).unwrap();
    assert_eq!(
        dispatched(&ds)[0].0,
        late,
        "and is served when nothing else waits"
    );
}

#[test]
fn an_adapter_goes_where_it_is_loaded_until_that_backend_is_full() {
    use crate::core::reading::LoraReading;
    let mut sp = spec(2, 3, vec![tenant("a", 1.0)]);
    sp.pools[0].adapters = vec!["sql".into()];
    let mut s = Scheduler::new(&sp, t(0), 1);
    let (b0, b1) = (s.backend("b0").unwrap(), s.backend("b1").unwrap());
    // b1's engine runs "sql" (vLLM's lora_requests_info), two slots.
    let lora = LoraReading {
        adapters: vec!["sql".into()],
        resident: false,
        max_loaded: Some(2),
    };
    s.on_reading(
        t(0),
        b1,
        Reading {
            at: t(0),
            lora: Some(lora),
            ..Reading::default()
        },
    );
    let sql = s.adapter("sql");
    let mut sent = Vec::new();
    for _ in 0..5 {
        let a = Arrival {
            adapter: sql,
            ..arrival(&s, "a")
        };
        let (_, ds) = s.on_arrival(t(1), a).unwrap();
        sent.extend(dispatched(&ds).into_iter().map(|(_, b)| b));
    }
    // Where it is loaded until that window is full, then the other.
    assert_eq!(sent, vec![b1, b1, b1, b0, b0]);
}

#[test]
fn adapters_without_readings_follow_what_was_sent_and_spread_by_free_slots() {
    let run = |affinity: bool| {
        let mut sp = spec(2, 4, vec![tenant("a", 1.0)]);
        sp.pools[0].adapter_affinity = affinity;
        let mut s = Scheduler::new(&sp, t(0), 3);
        let (x, y) = (s.adapter("x"), s.adapter("y"));
        let mut sent = Vec::new();
        for adapter in [x, x, y, x, y, y] {
            let a = Arrival {
                adapter,
                ..arrival(&s, "a")
            };
            let (_, ds) = s.on_arrival(t(1), a).unwrap();
            sent.extend(dispatched(&ds).into_iter().map(|(_, b)| (adapter, b)));
        }
        sent
    };
    // With affinity, each adapter stays on one backend (one slot each, as
    // vLLM's default, until a reading says more).
    let with = run(true);
    let home = |a| {
        let mut bs: Vec<_> = with
            .iter()
            .filter(|(ad, _)| *ad == a)
            .map(|(_, b)| *b)
            .collect();
        bs.dedup();
        bs
    };
    let (x, y) = (with[0].0, with[2].0);
    assert_eq!(home(x).len(), 1, "{with:?}");
    assert_eq!(home(y).len(), 1, "{with:?}");
    assert_ne!(home(x), home(y), "{with:?}");
    // Without, least outstanding alternates them over both backends.
    let without = run(false);
    let backends_of_x: std::collections::BTreeSet<_> = without
        .iter()
        .filter(|(ad, _)| *ad == x)
        .map(|(_, b)| *b)
        .collect();
    assert_eq!(backends_of_x.len(), 2, "{without:?}");
}

#[test]
fn an_adapter_loaded_nowhere_evicts_the_pools_coldest_slot() {
    // Three backends, one adapter slot each (vLLM's default), each given
    // an adapter; "q"'s backend is the busiest but its slot the coldest.
    let mut s = Scheduler::new(&spec(3, 4, vec![tenant("a", 1.0)]), t(0), 5);
    let mut send = |name: &str, at: u64| {
        let a = Arrival {
            adapter: s.adapter(name),
            ..arrival(&s, "a")
        };
        let (_, ds) = s.on_arrival(t(at), a).unwrap();
        dispatched(&ds)[0].1
    };
    let p = send("p", 10);
    let q = send("q", 15);
    assert_eq!(send("q", 20), q);
    let r = send("r", 30);
    assert_eq!(send("p", 40), p);
    assert!(p != q && q != r && p != r);
    // "z" is loaded nowhere and no slot is free: it evicts "q" (last sent
    // at 20), not "r" on the least busy backend (last sent at 30).
    assert_eq!(send("z", 50), q);
}

/// Two backends routing on prefixes, charging `charge`.
fn prefix_scheduler(charge: crate::core::spec::PrefillCharge) -> Scheduler {
    let mut sp = spec(2, 4, vec![tenant("a", 1.0)]);
    sp.queue.prefill_charge = charge;
    sp.pools[0].strategy = Strategy::PrefixAware;
    sp.pools[0].prefix.block_tokens = 10;
    Scheduler::new(&sp, t(0), 1)
}

#[test]
fn a_shared_prefix_goes_to_its_holder_and_is_charged_as_cached() {
    use crate::core::spec::PrefillCharge;
    // 100-token prompts, ten 10-token blocks; the second shares nine.
    let keys: Vec<u64> = (1..=10).collect();
    let mut other = keys.clone();
    other[9] = 99;
    let run = |charge| {
        let mut s = prefix_scheduler(charge);
        let base = arrival(&s, "a");
        let a = |prefix: &[u64]| Arrival {
            prefix: prefix.to_vec(),
            lane: super::Lane::Live,
            ..base.clone()
        };
        let (first, ds) = s.on_arrival(t(0), a(&keys)).unwrap();
        let holder = dispatched(&ds)[0].1;
        // Prefilled: its 100 tokens no longer wait at the holder (while
        // they did, the holder would cost 10 + 100 against the other's 100).
        assert!(s.on_response_started(first));
        let (_, ds) = s.on_arrival(t(1), a(&other)).unwrap();
        let (second, b) = dispatched(&ds)[0];
        assert_eq!(b, holder, "the holder has 90 of its 100 tokens");
        let v = s.backend_view(t(1), holder);
        assert_eq!(v.predicted_cached_tokens, 90);
        let usage = |cached| Usage {
            prompt_tokens: 100,
            completion_tokens: 100,
            cached_tokens: cached,
        };
        let (one, _) = s.on_completion(t(2), first, Some(usage(None))).unwrap();
        // The engine says it found 50 (it had evicted some).
        let (two, _) = s
            .on_completion(t(3), second, Some(usage(Some(50))))
            .unwrap();
        assert_eq!(s.backend_view(t(3), holder).reported_cached_tokens, 50);
        (one, two)
    };
    let (full1, full2) = run(PrefillCharge::Full);
    assert_eq!(full1.charged, full2.charged);
    let (unc1, unc2) = run(PrefillCharge::Uncached);
    assert_eq!(
        unc1.charged, full1.charged,
        "nothing was cached for the first"
    );
    assert!(unc2.charged < full2.charged, "{unc2:?} {full2:?}");
    // Settled on what the engine reported (50 cached): less than all of
    // it.
    let (s_full, s_unc) = (full2.settled.unwrap(), unc2.settled.unwrap());
    assert!(s_unc < s_full, "{s_unc} {s_full}");
}

#[test]
fn the_latency_gate_never_leaves_a_pool_with_room_idle() {
    use crate::core::reading::Reading;
    let mut s = Scheduler::new(&spec(2, 4, vec![tenant("a", 1.0)]), t(0), 1);
    // Both backends read a TTFT p99 above the 150 ms threshold.
    for b in [BackendId(0), BackendId(1)] {
        s.on_reading(
            t(0),
            b,
            Reading {
                at: t(0),
                ttft_p99: Some(Duration::from_millis(400)),
                ..Default::default()
            },
        );
    }
    let (_, ds) = s.on_arrival(t(1), arrival(&s, "a")).unwrap();
    assert_eq!(dispatched(&ds).len(), 1, "dispatched at once, by load");
    // One backend back under the threshold: it alone is a candidate.
    s.on_reading(
        t(2),
        BackendId(1),
        Reading {
            at: t(2),
            ttft_p99: Some(Duration::from_millis(100)),
            ..Default::default()
        },
    );
    for n in 0..3 {
        let (_, ds) = s.on_arrival(t(3 + n), arrival(&s, "a")).unwrap();
        assert_eq!(dispatched(&ds)[0].1, BackendId(1));
    }
}

#[test]
fn an_engines_events_hold_its_blocks_and_a_guess_lasts_only_until_confirmed() {
    use crate::core::scheduler::PrefixEvent;
    let keys: Vec<u64> = (1..=10).collect();
    let mut s = prefix_scheduler(crate::core::spec::PrefillCharge::Full);
    let view = |s: &Scheduler| s.prefix_view(PoolId(0)).unwrap().index.entries;
    let base = arrival(&s, "a");
    let a = |prefix: &[u64]| Arrival {
        prefix: prefix.to_vec(),
        lane: super::Lane::Live,
        ..base.clone()
    };
    // Backend 1 follows its events and reports holding the chain: the
    // prompt goes there, and it still does long past the index's TTL.
    s.set_prefix_events(BackendId(0), true);
    s.set_prefix_events(BackendId(1), true);
    s.on_prefix_event(t(0), BackendId(1), &PrefixEvent::Stored(keys.clone()));
    assert_eq!(view(&s), 10);
    let send = |s: &mut Scheduler, at: u64, prefix: &[u64]| {
        let (id, ds) = s.on_arrival(t(at * 1000), a(prefix)).unwrap();
        let b = dispatched(&ds)[0].1;
        assert!(s.on_response_started(id));
        s.on_completion(t(at * 1000), id, None).unwrap();
        b
    };
    assert_eq!(send(&mut s, 500, &keys), BackendId(1));
    // A new prompt sent to an event-fed backend is a guess: held for
    // PREFIX_GUESS, not the TTL.
    let fresh: Vec<u64> = (100..=105).collect();
    let (id, ds) = s.on_arrival(t(1000000), a(&fresh)).unwrap();
    let holder = dispatched(&ds)[0].1;
    assert!(s.on_response_started(id));
    s.on_completion(t(1000000), id, None).unwrap();
    // Still held a second later; gone after PREFIX_GUESS.
    assert_eq!(send(&mut s, 1001, &fresh), holder);
    let mut hits = Vec::new();
    let both = [BackendId(0), BackendId(1)];
    let ix = s.pools[0].prefix.as_mut().unwrap();
    ix.matched(t(1011000), &fresh, &both, &mut hits);
    assert_eq!(hits.iter().sum::<u32>(), 6, "{hits:?}");
    ix.matched(t(1012000), &fresh, &both, &mut hits);
    assert_eq!(hits, vec![0, 0], "the guess expired unconfirmed");
    // Removed and lost: the blocks go.
    s.on_prefix_event(
        t(1030000),
        BackendId(1),
        &PrefixEvent::Removed(keys[5..].to_vec()),
    );
    let ids = [BackendId(1)];
    s.pools[0]
        .prefix
        .as_mut()
        .unwrap()
        .matched(t(1030000), &keys, &ids, &mut hits);
    assert_eq!(hits, vec![5]);
    s.set_prefix_events(BackendId(1), false);
    s.pools[0]
        .prefix
        .as_mut()
        .unwrap()
        .matched(t(1030000), &keys, &ids, &mut hits);
    assert_eq!(hits, vec![0], "a lost subscription drops what it reported");
    // Not followed: its events are ignored.
    s.on_prefix_event(t(1031000), BackendId(1), &PrefixEvent::Stored(keys.clone()));
    s.pools[0]
        .prefix
        .as_mut()
        .unwrap()
        .matched(t(1031000), &keys, &ids, &mut hits);
    assert_eq!(hits, vec![0]);
}

#[test]
fn locality_serves_a_cached_prefix_first_within_the_fairness_bound() {
    use crate::core::spec::PrefillCharge;
    let keys: Vec<u64> = (1..=10).collect();
    // One backend, one slot at a time; b warmed the prefix, a did not.
    let run = |locality: f64| {
        let mut sp = spec(1, 1, vec![tenant("a", 1.0), tenant("b", 1.0)]);
        sp.queue.prefill_charge = PrefillCharge::Full;
        sp.queue.locality = locality;
        sp.pools[0].strategy = Strategy::PrefixAware;
        sp.pools[0].prefix.block_tokens = 10;
        let mut s = Scheduler::new(&sp, t(0), 1);
        let with = |s: &Scheduler, who: &str, prefix: &[u64]| Arrival {
            prefix: prefix.to_vec(),
            lane: super::Lane::Live,
            ..arrival(s, who)
        };
        let (warm, _) = s.on_arrival(t(0), with(&s, "b", &keys)).unwrap();
        assert!(s.on_response_started(warm));
        s.on_completion(t(1), warm, None).unwrap();
        // a holds the slot; then a and b queue, a first.
        let (busy, _) = s.on_arrival(t(2), with(&s, "a", &[])).unwrap();
        let (x, _) = s.on_arrival(t(3), with(&s, "a", &[900, 901])).unwrap();
        let (y, _) = s.on_arrival(t(4), with(&s, "b", &keys)).unwrap();
        assert!(s.on_response_started(busy));
        let (_, ds) = s.on_completion(t(5), busy, None).unwrap();
        let next = dispatched(&ds)[0].0;
        (next, x, y)
    };
    let (next, x, _) = run(0.0);
    assert_eq!(next, x, "in discipline order, a (below b) goes first");
    let (next, _, y) = run(1.0);
    assert_eq!(
        next, y,
        "b's request finds its 100 tokens cached: it goes first"
    );
}

#[test]
fn resumable_items_go_to_a_backend_no_faster_than_it_prefills_them() {
    let mut p = spec(1, 8, vec![tenant("owner", 1.0), tenant("app", 1.0)]);
    p.queue.batch_prefill_ahead = 250;
    let mut s = Scheduler::new(&p, t(0), 1);
    let item = |s: &Scheduler, lane| Arrival {
        lane,
        deadline: Some(Duration::from_secs(3600)),
        ..arrival(s, "owner")
    };
    // 100 prompt tokens each: two fit under 250, the third waits although
    // the window has room.
    let mut ids = Vec::new();
    let mut sent = 0;
    for i in 0..4 {
        let (id, ds) = s.on_arrival(t(i), item(&s, Lane::Resumable)).unwrap();
        ids.push(id);
        sent += dispatched(&ds).len();
    }
    assert_eq!(sent, 2);
    // Live work is not held back; nor are items that are not paced.
    let (_, ds) = s.on_arrival(t(5), arrival(&s, "app")).unwrap();
    assert_eq!(dispatched(&ds).len(), 1);
    let (_, ds) = s.on_arrival(t(6), item(&s, Lane::Promoted)).unwrap();
    assert_eq!(dispatched(&ds).len(), 1);
    // The headers of a streamed item come at once: not its prefill's end.
    assert!(s.on_response_started(ids[0]));
    assert!(s.on_first_token(t(7), ids[2]).is_empty(), "not in flight");
    // Its first token is: the next item goes.
    let ds = s.on_first_token(t(8), ids[0]);
    assert_eq!(
        dispatched(&ds).iter().map(|d| d.0).collect::<Vec<_>>(),
        [ids[2]]
    );
    assert!(s.on_first_token(t(9), ids[0]).is_empty(), "counted once");
    // A completion before any token frees its prefill too.
    let (_, ds) = s.on_completion(t(10), ids[1], None).unwrap();
    assert_eq!(
        dispatched(&ds).iter().map(|d| d.0).collect::<Vec<_>>(),
        [ids[3]]
    );
}

#[test]
fn a_request_at_home_homes_none_of_its_own_blocks() {
    // 100-token prompts, ten 10-token blocks: nine shared, the tenth each
    // request's own.
    let mut s = prefix_scheduler(crate::core::spec::PrefillCharge::Full);
    let base = arrival(&s, "a");
    let mut home = None;
    for n in 0..5u64 {
        let mut keys: Vec<u64> = (1..=9).collect();
        keys.push(100 + n);
        let a = Arrival {
            prefix: keys,
            lane: super::Lane::Live,
            ..base.clone()
        };
        let (id, ds) = s.on_arrival(t(n), a).unwrap();
        let b = dispatched(&ds)[0].1;
        assert_eq!(*home.get_or_insert(b), b, "request {n} went home");
        s.on_completion(t(n) + Duration::from_millis(500), id, None)
            .unwrap();
    }
    // The first request's ten blocks; the others refreshed nine of them.
    let homes = s.pools[0].homes.as_ref().unwrap();
    assert_eq!(homes.footprint(home.unwrap()), 10);
}

#[test]
fn past_its_kv_watermark_a_backend_takes_its_homes_and_nothing_new() {
    let mut s = prefix_scheduler(crate::core::spec::PrefillCharge::Full);
    let base = arrival(&s, "a");
    let a = |prefix: Vec<u64>| Arrival {
        prefix,
        lane: super::Lane::Live,
        ..base.clone()
    };
    let keys: Vec<u64> = (1..=10).collect();
    let (id, ds) = s.on_arrival(t(0), a(keys.clone())).unwrap();
    let home = dispatched(&ds)[0].1;
    s.on_completion(t(1), id, None).unwrap();
    // Other work fills its engine's KV cache past the watermark.
    let full = Reading {
        at: t(2),
        kv_usage: Some(0.95),
        ..Reading::default()
    };
    s.on_reading(t(2), home, full);
    // The prefix goes home: its blocks are cached there.
    let (_, ds) = s.on_arrival(t(3), a(keys)).unwrap();
    assert_eq!(dispatched(&ds)[0].1, home);
    // A new prefix, and a prompt without a full block, go elsewhere.
    for prefix in [(20..30).collect(), Vec::new()] {
        let (_, ds) = s.on_arrival(t(4), a(prefix)).unwrap();
        assert_ne!(dispatched(&ds)[0].1, home);
    }
}

#[test]
fn a_preempted_request_whose_response_ended_anyway_is_cancelled_not_run_again() {
    // The gateway's settle of a served request the scheduler had just
    // preempted: `on_completion` finds it queued, `on_cancel` takes it
    // out, and no later dispatch holds a slot for a task that has ended.
    let (mut s, [old, young]) = full_of_batch(|_| {});
    let (app, ds) = s.on_arrival(t(20), arrival(&s, "app")).unwrap();
    assert_eq!(preempted(&ds), [young]);
    assert!(s.on_completion(t(21), young, None).is_none());
    let (ended, ds) = s.on_cancel(t(21), young);
    assert!(ended.is_none() && ds.is_empty(), "{ds:?}");
    let jobs = s.tenant("jobs").unwrap();
    assert_eq!(s.tenant_view(t(21), jobs).queued, 0);
    let (_, ds) = s.on_completion(t(40), old, None).unwrap();
    let (_, ds2) = s.on_completion(t(50), app, None).unwrap();
    assert!(dispatched(&ds).is_empty() && dispatched(&ds2).is_empty());
}

#[test]
fn homes_shared_by_a_cluster_are_handed_out_taken_and_moved() {
    use crate::core::prefix::homes::HomeChange;
    let mut s = prefix_scheduler(crate::core::spec::PrefillCharge::Full);
    s.share_homes();
    let base = arrival(&s, "a");
    let mut at = 0;
    let mut send = |s: &mut Scheduler, keys: Vec<u64>| {
        let a = Arrival {
            prefix: keys,
            lane: super::Lane::Live,
            ..base.clone()
        };
        at += 1;
        let (id, ds) = s.on_arrival(t(at), a).unwrap();
        let b = dispatched(&ds)[0].1;
        s.on_completion(t(at) + Duration::from_millis(500), id, None)
            .unwrap();
        b
    };
    let chain = |first: u64, last: u64| -> Vec<u64> { (first..first + 9).chain([last]).collect() };
    let name = |s: &Scheduler, b: BackendId| s.backend_name(b).to_owned();
    // A new prefix is placed here and handed to the sync, once.
    let home = send(&mut s, chain(1, 100));
    let placed = s.placed_homes();
    assert_eq!(
        placed,
        vec![PlacedHome {
            backend: name(&s, home),
            keys: chain(1, 100)
        }]
    );
    assert!(s.placed_homes().is_empty());
    // Its next request goes home, and homes nothing new.
    assert_eq!(send(&mut s, chain(1, 101)), home);
    assert!(s.placed_homes().is_empty());
    // Another replica's home for it came first, on the other backend:
    // this replica's moves there, and so do its requests (what it sent
    // `home` is forgotten, or the prefix would be adopted there again).
    let other = BackendId(1 - home.0);
    s.homes_changed(
        t(10),
        &[HomeChange::Moved {
            from: name(&s, home),
            to: name(&s, other),
            keys: chain(1, 100),
        }],
    );
    assert_eq!(send(&mut s, chain(1, 102)), other);
    // Prefixes another replica placed first, all on one backend: their
    // first requests here go there, although new prefixes would have
    // been spread.
    for p in 0..4 {
        s.homes_changed(
            t(20),
            &[HomeChange::Placed {
                backend: name(&s, home),
                keys: chain(1000 * (p + 1), 200),
            }],
        );
    }
    for p in 0..4 {
        assert_eq!(
            send(&mut s, chain(1000 * (p + 1), 300 + p)),
            home,
            "prefix {p}"
        );
    }
    assert!(s.placed_homes().is_empty(), "none of them was new here");
    // Names it does not know change nothing.
    s.homes_changed(
        t(30),
        &[HomeChange::Placed {
            backend: "gone".into(),
            keys: chain(9000, 1),
        }],
    );
}
