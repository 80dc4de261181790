//! The scheduler behind its one lock, with the decision channel of every
//! waiting request. Every acquisition of the lock is in this file: the
//! request path, the ticket's settle, the poller, the cluster sync, reload
//! and the views call its methods, each one critical section, never held
//! across an `.await` (STYLE.md §4). Decisions made under the lock are
//! sent under it, so a request that registers its channel in the same
//! section as its arrival cannot miss one.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use crate::core::admission::{RateLimits, Refusal};
use crate::core::fairness::FairnessMeter;
use crate::core::ids::{BackendId, RequestId, TenantId, Usage};
use crate::core::reading::Reading;
use crate::core::scheduler::{Arrival, Decision, Ejection, Scheduler};
use crate::core::spec::SchedulerSpec;
use crate::core::time::Instant;

/// The scheduler and its waiting requests, behind one lock.
pub struct Scheduling {
    inner: Mutex<CoreState>,
}

/// What became of an arriving request.
#[derive(Debug)]
pub enum Arrived {
    /// Admitted: dispatched at once or queued.
    Admitted(Admitted),
    /// Every backend of its pool is ejected.
    PoolDown,
    /// Refused by admission.
    Refused { tenant: String, refusal: Refusal },
}

/// An admitted request's place in the scheduler.
#[derive(Debug)]
pub struct Admitted {
    pub id: RequestId,
    /// Its tenant's limits, for the `x-ratelimit-*` headers.
    pub limits: RateLimits,
    /// Whether the scheduler may preempt it (a batch tenant's).
    pub preemptible: bool,
    /// Its decisions: made already, or to come.
    pub pending: Pending,
}

/// How a request ends in the scheduler.
#[derive(Clone, Copy, Debug)]
pub struct Settle {
    pub id: RequestId,
    pub tenant: Option<TenantId>,
    /// The backend it was sent to last.
    pub backend: Option<BackendId>,
    /// Whether it was served (else it ends like a cancel).
    pub served: bool,
    pub usage: Option<Usage>,
    /// Dispatch to first byte of a streamed response, as the gateway saw
    /// it.
    pub ttft: Option<Duration>,
}

/// What settling a request gave.
#[derive(Clone, Copy, Debug, Default)]
pub struct Settled {
    /// GPU-seconds attributed to it, when it ended in the scheduler.
    pub gpu_seconds: Option<f64>,
    /// The ejection its success ended, if any.
    pub ejected: Option<Ejection>,
}

impl Scheduling {
    /// `sched`, with no waiting requests yet.
    pub fn new(sched: Scheduler, fairness: FairnessMeter) -> Self {
        Scheduling {
            inner: Mutex::new(CoreState {
                sched,
                waiters: HashMap::new(),
                service: Vec::new(),
                fairness,
            }),
        }
    }

    /// Runs `f` on the scheduler: for views and lookups, and for the
    /// cluster's leases. Decisions are not delivered from here; an event
    /// that makes them has a method of its own.
    pub fn with<R>(&self, f: impl FnOnce(&mut Scheduler) -> R) -> R {
        f(&mut self.inner.lock().sched)
    }

    /// Admission, then the fair queue and dispatch: the request either got
    /// its `Dispatch` at once or registers its channel for the decision
    /// that a later event makes. `adapter` is the LoRA adapter it names.
    pub fn arrive(&self, now: Instant, arrival: Arrival, adapter: Option<&str>) -> Arrived {
        let mut core = self.inner.lock();
        let arrival = Arrival {
            adapter: adapter.and_then(|a| core.sched.adapter(a)),
            ..arrival
        };
        if !core.sched.pool_is_ready(arrival.pool) {
            return Arrived::PoolDown;
        }
        let tenant = arrival.tenant;
        let lane = arrival.lane;
        match core.sched.on_arrival(now, arrival) {
            Err(refusal) => Arrived::Refused {
                tenant: core.sched.tenant_name(tenant).to_owned(),
                refusal,
            },
            Ok((id, decisions)) => {
                let limits = core.sched.rate_limits(tenant);
                let preemptible = core.sched.may_preempt_in(tenant, lane);
                let pending = core.deliver_and_register(decisions, id, preemptible);
                Arrived::Admitted(Admitted {
                    id,
                    limits,
                    preemptible,
                    pending,
                })
            }
        }
    }

    /// Whether a preemptible request whose response just started may keep
    /// it: not when a `Preempt` came first (it is then re-queued and waits
    /// for its next dispatch).
    pub fn response_started(&self, id: RequestId, pending: &mut Pending) -> bool {
        // Under the lock, which every decision is sent under.
        let mut core = self.inner.lock();
        !pending.preempted_already() && core.sched.on_response_started(id)
    }

    /// A connection to `backend` failed before the request was written:
    /// the first time, the request goes back to the head of its queue for
    /// another backend; the second time (`retried`), the backend is marked
    /// down and the request fails. `None` when it cannot go again.
    pub fn requeue(
        &self,
        now: Instant,
        id: RequestId,
        backend: BackendId,
        retried: bool,
        preemptible: bool,
    ) -> Option<Pending> {
        let mut core = self.inner.lock();
        if retried {
            core.sched.set_health(now, backend, false);
            return None;
        }
        let decisions = core.sched.redispatch(now, id)?;
        Some(core.deliver_and_register(decisions, id, preemptible))
    }

    /// Ends a request in the scheduler: a served one corrects its
    /// fair-queue charge with real usage and counts as a success for
    /// outlier detection; anything else ends like a cancel.
    pub fn settle(&self, now: Instant, s: Settle) -> Settled {
        let mut core = self.inner.lock();
        core.waiters.remove(&s.id);
        if let (Some(backend), Some(ttft)) = (s.backend, s.ttft) {
            core.sched.on_ttft(now, s.id, backend, ttft);
        }
        let mut ejected = None;
        if let (true, Some(backend)) = (s.served, s.backend) {
            // A success for outlier detection (failures are reported as
            // they happen, in the request path).
            ejected = core.sched.on_backend_result(now, backend, true);
        }
        let (ended, decisions) = match (s.served, s.usage) {
            (true, usage @ Some(_)) => match core.sched.on_completion(now, s.id, usage) {
                Some((e, d)) => (Some(e), d),
                // Not in flight: preempted at the instant its response
                // ended, and queued again. It is done: out of the queue,
                // or a later dispatch would hold a slot no task ends.
                None => core.sched.on_cancel(now, s.id),
            },
            _ => core.sched.on_cancel(now, s.id),
        };
        if let (true, Some(u), Some(t)) = (s.served, s.usage, s.tenant) {
            let i = t.0 as usize;
            if core.service.len() <= i {
                core.service.resize(i + 1, 0.0);
            }
            core.service[i] += f64::from(u.prompt_tokens) + f64::from(u.completion_tokens);
        }
        core.deliver(decisions, None);
        Settled {
            gpu_seconds: ended.map(|e| e.gpu_seconds),
            ejected,
        }
    }

    /// A failed (`ok == false`) or served request of `backend`, for
    /// outlier detection; the ejection it causes, if any.
    pub fn on_backend_result(
        &self,
        now: Instant,
        backend: BackendId,
        ok: bool,
    ) -> Option<Ejection> {
        self.inner.lock().sched.on_backend_result(now, backend, ok)
    }

    /// A poller's tick of backend `name`: its health, and its reading if
    /// one was decoded. Returns whether it was healthy before; `None` for a
    /// backend the scheduler does not know.
    pub fn on_poll(
        &self,
        now: Instant,
        name: &str,
        up: bool,
        reading: Option<Reading>,
    ) -> Option<bool> {
        let mut core = self.inner.lock();
        let id = core.sched.backend(name)?;
        let was_up = core.sched.is_healthy(id);
        let mut decisions = Vec::new();
        if was_up != up {
            decisions.extend(core.sched.set_health(now, id, up));
        }
        if let Some(reading) = reading {
            decisions.extend(core.sched.on_reading(now, id, reading));
        }
        core.deliver(decisions, None);
        Some(was_up)
    }

    /// Applies a new spec (a reload, or new cluster shares), and runs `f`
    /// on the scheduler in the same critical section (a reload derives its
    /// live view from the new ids there).
    pub fn apply_spec<R>(
        &self,
        now: Instant,
        spec: &SchedulerSpec,
        f: impl FnOnce(&Scheduler) -> R,
    ) -> R {
        let mut core = self.inner.lock();
        let decisions = core.sched.apply_policy(spec, now);
        let out = f(&core.sched);
        core.deliver(decisions, None);
        out
    }

    /// A resumable batch item's first token came: its prefill is done, and
    /// batch items held back by their backends' prefill limit may go.
    pub fn first_token(&self, now: Instant, id: RequestId) {
        let mut core = self.inner.lock();
        let decisions = core.sched.on_first_token(now, id);
        core.deliver(decisions, None);
    }

    /// When the deadline task must next run [`on_tick`](Self::on_tick).
    pub fn next_wakeup(&self) -> Option<Instant> {
        self.inner.lock().sched.next_wakeup()
    }

    /// Sheds requests past their deadlines and preempts where the policy
    /// says; returns the backends whose outlier ejection ended.
    pub fn on_tick(&self, now: Instant) -> Vec<String> {
        let mut core = self.inner.lock();
        let decisions = core.sched.on_tick(now);
        core.deliver(decisions, None);
        let ended: Vec<BackendId> = core.sched.take_ejections_ended();
        ended
            .into_iter()
            .map(|b| core.sched.backend_name(b).to_owned())
            .collect()
    }

    /// One sample of the fairness gauge: each tenant's served tokens over
    /// its `weight`, and whether it is backlogged.
    pub fn sample_fairness(&self, now: Instant, weight: impl Fn(TenantId) -> f64) {
        let mut core = self.inner.lock();
        let ids: Vec<_> = core.sched.tenants().collect();
        let mut service = Vec::with_capacity(ids.len());
        let mut backlogged = Vec::with_capacity(ids.len());
        for t in ids {
            let tokens = core.service.get(t.0 as usize).copied().unwrap_or(0.0);
            service.push(tokens / weight(t));
            backlogged.push(core.sched.tenant_view(now, t).queued > 0);
        }
        core.fairness.sample(now, &service, &backlogged);
    }

    /// Runs `f` on the scheduler and the fairness meter together (the
    /// metrics scrape's snapshot).
    pub fn with_fairness<R>(&self, f: impl FnOnce(&mut Scheduler, &FairnessMeter) -> R) -> R {
        let mut core = self.inner.lock();
        let core = &mut *core;
        f(&mut core.sched, &core.fairness)
    }
}

/// What the lock guards: the scheduler and the decision channel of every
/// waiting request, which must change together.
struct CoreState {
    sched: Scheduler,
    /// Where each request's next decisions go, removed when it ends.
    waiters: HashMap<RequestId, Waiter>,
    /// Tokens (prompt + completion) of served requests, by tenant id: the
    /// service that the fairness gauge compares.
    service: Vec<f64>,
    fairness: FairnessMeter,
}

/// A request's decision channel.
#[derive(Debug)]
enum Waiter {
    /// A queued request that cannot be preempted waits for one decision.
    Once(oneshot::Sender<Decision>),
    /// A preemptible (batch) request's channel lives as long as it does:
    /// dispatch, preemption, dispatch again, or shed.
    Many(mpsc::UnboundedSender<Decision>),
}

impl CoreState {
    /// Hands decisions to their requests; returns the one for `me`.
    fn deliver(&mut self, decisions: Vec<Decision>, me: Option<RequestId>) -> Option<Decision> {
        let mut mine = None;
        for d in decisions {
            let id = d.id();
            if Some(id) == me {
                mine = Some(d);
                continue;
            }
            // A closed channel means the client left; its ticket's drop
            // ends the request in the scheduler.
            match self.waiters.get(&id) {
                Some(Waiter::Many(tx)) => {
                    let last = matches!(d, Decision::Shed { .. });
                    let _ = tx.send(d);
                    if last {
                        self.waiters.remove(&id);
                    }
                }
                Some(Waiter::Once(_)) => {
                    if let Some(Waiter::Once(tx)) = self.waiters.remove(&id) {
                        let _ = tx.send(d);
                    }
                }
                None => {}
            }
        }
        mine
    }

    /// [`deliver`](Self::deliver), and registers `me`'s channel in the same
    /// critical section, so a decision made by another task in between
    /// cannot be lost. A request that cannot be preempted and was
    /// dispatched at once registers nothing.
    fn deliver_and_register(
        &mut self,
        decisions: Vec<Decision>,
        me: RequestId,
        preemptible: bool,
    ) -> Pending {
        let ready = self.deliver(decisions, Some(me));
        let rx = if preemptible {
            let (tx, rx) = mpsc::unbounded_channel();
            self.waiters.insert(me, Waiter::Many(tx));
            Rx::Many(rx)
        } else if ready.is_none() {
            let (tx, rx) = oneshot::channel();
            self.waiters.insert(me, Waiter::Once(tx));
            Rx::Once(rx)
        } else {
            Rx::Done
        };
        Pending { ready, rx }
    }
}

/// A request's decisions: one already made, then those still to come.
#[derive(Debug)]
pub struct Pending {
    pub ready: Option<Decision>,
    rx: Rx,
}

#[derive(Debug)]
enum Rx {
    Done,
    Once(oneshot::Receiver<Decision>),
    Many(mpsc::UnboundedReceiver<Decision>),
}

impl Pending {
    /// Whether a `Preempt` has been sent and not yet read. Decisions are
    /// sent under the core lock, so under it this sees every one so far. A
    /// dispatch that came after the preemption is kept for `next`.
    pub fn preempted_already(&mut self) -> bool {
        let mut preempted = false;
        if let Rx::Many(rx) = &mut self.rx {
            while let Ok(d) = rx.try_recv() {
                match d {
                    Decision::Preempt { .. } => preempted = true,
                    other => self.ready = Some(other),
                }
            }
        }
        preempted
    }

    /// The next decision for the request; `None` when none can come (the
    /// scheduler dropped it, which would be a bug, or it had its one).
    pub async fn next(&mut self) -> Option<Decision> {
        if let Some(d) = self.ready.take() {
            return Some(d);
        }
        match &mut self.rx {
            Rx::Done => None,
            Rx::Once(rx) => {
                let d = rx.await.ok();
                self.rx = Rx::Done;
                d
            }
            Rx::Many(rx) => rx.recv().await,
        }
    }

    /// Ready once a `Preempt` arrives (other decisions are dropped: none
    /// but a `Preempt` comes to a request in flight); never when its
    /// channel closed or cannot carry one.
    pub fn poll_preempted(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if matches!(self.ready.take(), Some(Decision::Preempt { .. })) {
            return std::task::Poll::Ready(());
        }
        let Rx::Many(rx) = &mut self.rx else {
            return std::task::Poll::Pending;
        };
        while let std::task::Poll::Ready(d) = rx.poll_recv(cx) {
            match d {
                Some(Decision::Preempt { .. }) => return std::task::Poll::Ready(()),
                Some(_) => {}
                None => {
                    self.rx = Rx::Done;
                    return std::task::Poll::Pending;
                }
            }
        }
        std::task::Poll::Pending
    }

    /// Whether `next` may still wait for a decision.
    pub fn is_waiting(&self) -> bool {
        self.ready.is_none() && !matches!(self.rx, Rx::Done)
    }
}
