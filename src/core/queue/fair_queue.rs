//! The per-pool fair queue: one FIFO per tenant and a virtual counter each (VTC), in the discipline's order.

use std::collections::{BTreeSet, VecDeque};

use crate::core::ids::{RequestId, TenantId};
use crate::core::spec::{Discipline, Priority};

/// The fairness bound, in units of [`FairQueue::bound`]: under `drf` and
/// `wfq`, two backlogged tenants' counters are never further apart than
/// this many. Serving the smallest counter keeps them within one; the
/// reserve of a pool's last slots may serve a tenant up to one above the
/// smallest ([`FairQueue::pop_allowed`]), which that dispatch can move one
/// further.
pub const FAIRNESS_BOUND: f64 = 2.0;

/// How many times a request at the head of its tenant's queue may be
/// passed over for one behind it (locality) before it is served first.
pub const MAX_HEAD_PASSES: u32 = 4;

/// Ordering key: class first (priority), then counter or arrival sequence.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Key(u8, f64);

impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0).then(self.1.total_cmp(&other.1))
    }
}

#[derive(Clone, Debug)]
struct TenantQueue {
    entries: VecDeque<(RequestId, u64)>,
    live: u32,
    counter: f64,
    /// Part of `counter` that is estimates of dispatched, unsettled work.
    pending: f64,
    /// Its key in `floors` while backlogged.
    floor_key: Option<Key>,
    weight: f64,
    class: u8,
    key: Option<Key>,
    /// Times a request behind its head was served first since the head
    /// last changed (locality).
    head_passes: u32,
}

impl TenantQueue {
    fn new(weight: f64, class: u8) -> Self {
        TenantQueue {
            entries: VecDeque::new(),
            live: 0,
            counter: 0.0,
            pending: 0.0,
            floor_key: None,
            weight,
            class,
            key: None,
            head_passes: 0,
        }
    }
}

/// The queue of one pool.
#[derive(Clone, Debug)]
pub struct FairQueue {
    discipline: Discipline,
    tenants: Vec<TenantQueue>,
    backlogged: BTreeSet<(Key, TenantId)>,
    /// Backlogged tenants by counter less the uncredited part of their
    /// estimates in flight: the VTC lift's floor.
    floors: BTreeSet<(Key, TenantId)>,
    /// The share of in-flight estimates the lift counts as received.
    in_flight_credit: f64,
    /// The largest counter dispatched from (less the uncredited part of
    /// its tenant's estimates in flight): the floor for tenants returning
    /// when none is backlogged.
    vtime: f64,
    /// The largest single charge (estimate or settled cost) over its
    /// tenant's weight so far: the unit of the fairness bound.
    largest: f64,
    next_seq: u64,
    len: usize,
}

fn class_of(p: Priority) -> u8 {
    match p {
        Priority::Interactive => 0,
        Priority::Batch => 1,
    }
}

impl FairQueue {
    /// An empty queue under `discipline`.
    pub fn new(discipline: Discipline) -> Self {
        FairQueue {
            discipline,
            tenants: Vec::new(),
            backlogged: BTreeSet::new(),
            floors: BTreeSet::new(),
            in_flight_credit: 0.0,
            vtime: 0.0,
            largest: 0.0,
            next_seq: 0,
            len: 0,
        }
    }

    /// The discipline in force.
    pub fn discipline(&self) -> Discipline {
        self.discipline
    }

    /// Switches discipline (a reload); queued requests keep their order
    /// within each tenant and are re-keyed across tenants.
    pub fn set_discipline(&mut self, discipline: Discipline, is_live: impl Fn(RequestId) -> bool) {
        if self.discipline != discipline {
            self.discipline = discipline;
            let ids: Vec<TenantId> = self.backlogged.iter().map(|(_, t)| *t).collect();
            for t in ids {
                self.rekey(t, &is_live);
            }
        }
    }

    /// Declares or updates a tenant's weight and class.
    pub fn set_tenant(&mut self, tenant: TenantId, weight: f64, priority: Priority) {
        let i = tenant.0 as usize;
        if self.tenants.len() <= i {
            self.tenants.resize_with(i + 1, || TenantQueue::new(1.0, 0));
        }
        let q = &mut self.tenants[i];
        q.weight = weight.max(f64::MIN_POSITIVE);
        q.class = class_of(priority);
        if q.key.is_some() {
            self.rekey(tenant, |_| true);
        }
    }

    /// Live queued requests, all tenants.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Live queued requests of one tenant.
    pub fn tenant_len(&self, tenant: TenantId) -> u32 {
        self.tenants.get(tenant.0 as usize).map_or(0, |q| q.live)
    }

    /// A tenant's virtual counter (service received, weighted).
    pub fn counter(&self, tenant: TenantId) -> f64 {
        self.tenants
            .get(tenant.0 as usize)
            .map_or(0.0, |q| q.counter)
    }

    /// The counter `tenant` has, or would be lifted to if a request of it
    /// were queued now.
    pub fn start_counter(&self, tenant: TenantId) -> f64 {
        let own = self.counter(tenant);
        if self.tenant_len(tenant) > 0 {
            return own;
        }
        let fair = matches!(self.discipline, Discipline::Drf | Discipline::Wfq);
        let floor = match self.floors.first() {
            Some((Key(_, floor), _)) if fair => *floor,
            _ => self.vtime,
        };
        own.max(floor)
    }

    fn key_for(&self, tenant: TenantId, is_live: impl Fn(RequestId) -> bool) -> Option<Key> {
        let q = &self.tenants[tenant.0 as usize];
        let head = q
            .entries
            .iter()
            .find(|(id, _)| is_live(*id))
            .map(|(_, s)| *s)?;
        Some(match self.discipline {
            Discipline::Drf | Discipline::Wfq => Key(0, q.counter),
            Discipline::Fifo => Key(0, head as f64),
            Discipline::Priority => Key(q.class, head as f64),
        })
    }

    fn rekey(&mut self, tenant: TenantId, is_live: impl Fn(RequestId) -> bool) {
        let i = tenant.0 as usize;
        if let Some(old) = self.tenants[i].key.take() {
            self.backlogged.remove(&(old, tenant));
        }
        if self.tenants[i].live > 0
            && let Some(k) = self.key_for(tenant, is_live)
        {
            self.tenants[i].key = Some(k);
            self.backlogged.insert((k, tenant));
        }
        self.resettle(tenant);
    }

    /// Re-files a tenant in `floors` after its counter, pending charge or
    /// backlog changed.
    fn resettle(&mut self, tenant: TenantId) {
        let q = &mut self.tenants[tenant.0 as usize];
        let new = q
            .key
            .map(|_| Key(0, q.counter - (1.0 - self.in_flight_credit) * q.pending));
        if new == q.floor_key {
            return;
        }
        if let Some(old) = q.floor_key.take() {
            self.floors.remove(&(old, tenant));
        }
        if let Some(k) = new {
            q.floor_key = Some(k);
            self.floors.insert((k, tenant));
        }
    }

    /// Appends a request to its tenant's FIFO.
    pub fn push(&mut self, tenant: TenantId, id: RequestId) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.insert(tenant, id, seq, false);
    }

    /// Puts a request back at the head of its tenant's FIFO: a dispatch that
    /// failed before reaching the backend keeps its turn. Under `fifo` and
    /// `priority` it sorts before everything queued after it.
    pub fn push_front(&mut self, tenant: TenantId, id: RequestId) {
        let seq = self
            .tenants
            .get(tenant.0 as usize)
            .and_then(|q| q.entries.front())
            .map_or(0, |(_, s)| s.saturating_sub(1));
        self.insert(tenant, id, seq, true);
    }

    fn insert(&mut self, tenant: TenantId, id: RequestId, seq: u64, front: bool) {
        let i = tenant.0 as usize;
        if self.tenants.len() <= i {
            self.set_tenant(tenant, 1.0, Priority::Interactive);
        }
        let becomes_backlogged = self.tenants[i].live == 0;
        if becomes_backlogged {
            // VTC lift: no credit for idle time.
            let start = self.start_counter(tenant);
            let q = &mut self.tenants[i];
            q.counter = start;
            q.entries.clear();
        }
        let q = &mut self.tenants[i];
        if front {
            q.entries.push_front((id, seq));
        } else {
            q.entries.push_back((id, seq));
        }
        q.live += 1;
        self.len += 1;
        if becomes_backlogged || front {
            self.rekey(tenant, |_| true);
        }
    }

    /// `tenant`'s first live request, without removing it.
    pub fn tenant_head(
        &self,
        tenant: TenantId,
        is_live: impl Fn(RequestId) -> bool,
    ) -> Option<RequestId> {
        let q = self.tenants.get(tenant.0 as usize)?;
        q.entries.iter().map(|(id, _)| *id).find(|id| is_live(*id))
    }

    /// The tenant that would be served next.
    pub fn peek_tenant(&self) -> Option<TenantId> {
        self.backlogged.first().map(|(_, t)| *t)
    }

    /// The request that would be served next, without removing it.
    pub fn peek(&self, is_live: impl Fn(RequestId) -> bool) -> Option<(TenantId, RequestId)> {
        let tenant = self.peek_tenant()?;
        self.tenant_head(tenant, is_live).map(|id| (tenant, id))
    }

    /// Removes and returns the next request in discipline order, skipping
    /// entries that are no longer live.
    pub fn pop(&mut self, is_live: impl Fn(RequestId) -> bool) -> Option<(TenantId, RequestId)> {
        let tenant = self.peek_tenant()?;
        self.pop_from(tenant, is_live).map(|id| (tenant, id))
    }

    /// Removes and returns the next request, in discipline order, of the
    /// first backlogged tenant that `allow` lets through, passing over
    /// others only within the fairness bound ([`FairQueue::bound`]): a
    /// tenant whose counter is further than that above the smallest is
    /// not served out of order.
    pub fn pop_allowed(
        &mut self,
        allow: impl Fn(TenantId) -> bool,
        is_live: impl Fn(RequestId) -> bool,
    ) -> Option<(TenantId, RequestId)> {
        let limit = self.backlogged.first()?.0.1 + self.bound();
        let tenant = self
            .backlogged
            .iter()
            .take_while(|(k, _)| k.1 <= limit)
            .map(|(_, t)| *t)
            .find(|t| allow(*t))?;
        self.pop_from(tenant, is_live).map(|id| (tenant, id))
    }

    /// Requests a dispatch may serve out of order (locality) without
    /// leaving the stated bound: of the backlogged tenants whose counter is
    /// at most `share` (0 to 1) of the fairness bound ([`FairQueue::bound`])
    /// above the smallest, in discipline order, at most `tenants`, each
    /// one's first `per_tenant` live requests in its order (only its head
    /// once the head has been passed over [`MAX_HEAD_PASSES`] times).
    pub fn candidates_within(
        &self,
        share: f64,
        tenants: usize,
        per_tenant: usize,
        is_live: impl Fn(RequestId) -> bool,
    ) -> Vec<(TenantId, RequestId)> {
        let Some(first) = self.backlogged.first() else {
            return Vec::new();
        };
        let limit = first.0.1 + share.clamp(0.0, 1.0) * self.bound();
        let mut out = Vec::new();
        for (_, t) in self
            .backlogged
            .iter()
            .take_while(|(k, _)| k.1 <= limit)
            .take(tenants)
        {
            let Some(q) = self.tenants.get(t.0 as usize) else {
                continue;
            };
            let n = if q.head_passes >= MAX_HEAD_PASSES {
                1
            } else {
                per_tenant
            };
            out.extend(
                q.entries
                    .iter()
                    .map(|(id, _)| *id)
                    .filter(|id| is_live(*id))
                    .take(n)
                    .map(|id| (*t, id)),
            );
        }
        out
    }

    /// Removes `tenant`'s queued request `id` (one of
    /// [`candidates_within`](Self::candidates_within)), counting a pass
    /// over its head when it is not the head.
    pub fn pop_request(
        &mut self,
        tenant: TenantId,
        id: RequestId,
        is_live: impl Fn(RequestId) -> bool,
    ) -> Option<RequestId> {
        let q = self.tenants.get_mut(tenant.0 as usize)?;
        while q.entries.front().is_some_and(|(head, _)| !is_live(*head)) {
            q.entries.pop_front();
        }
        let at = q.entries.iter().position(|(e, _)| *e == id)?;
        if at == 0 {
            return self.pop_from(tenant, is_live);
        }
        q.entries.remove(at);
        q.head_passes += 1;
        self.taken(tenant, is_live);
        Some(id)
    }

    /// Removes and returns `tenant`'s next request, whatever its place in
    /// discipline order (a preemption serves the head it was made for).
    pub fn pop_from(
        &mut self,
        tenant: TenantId,
        is_live: impl Fn(RequestId) -> bool,
    ) -> Option<RequestId> {
        let i = tenant.0 as usize;
        let q = self.tenants.get_mut(i)?;
        let mut found = None;
        while let Some((id, _)) = q.entries.pop_front() {
            if is_live(id) {
                found = Some(id);
                break;
            }
        }
        let id = found?;
        q.head_passes = 0;
        self.taken(tenant, is_live);
        Some(id)
    }

    /// The accounts of a request of `tenant` leaving the queue for a
    /// backend.
    fn taken(&mut self, tenant: TenantId, is_live: impl Fn(RequestId) -> bool) {
        let Some(q) = self.tenants.get_mut(tenant.0 as usize) else {
            return;
        };
        q.live = q.live.saturating_sub(1);
        self.len = self.len.saturating_sub(1);
        // The floor of a tenant returning to an empty queue: like the lift
        // of one returning beside backlogged tenants, it leaves out the
        // uncredited part of estimates still in flight (at a cold start
        // they are the light-load price, several times what settles).
        self.vtime = self
            .vtime
            .max(q.counter - (1.0 - self.in_flight_credit) * q.pending);
        self.rekey(tenant, is_live);
    }

    /// Records that a queued request of `tenant` left the queue without being
    /// dispatched (cancelled or shed). Call after marking it not live.
    pub fn forget(&mut self, tenant: TenantId, is_live: impl Fn(RequestId) -> bool) {
        let i = tenant.0 as usize;
        let Some(q) = self.tenants.get_mut(i) else {
            return;
        };
        q.live = q.live.saturating_sub(1);
        self.len = self.len.saturating_sub(1);
        if q.live == 0 {
            q.entries.clear();
        }
        self.rekey(tenant, is_live);
    }

    /// Charges a dispatch's estimated cost to a tenant's counter.
    pub fn charge_estimate(&mut self, tenant: TenantId, estimate: f64) {
        if let Some(q) = self.tenants.get_mut(tenant.0 as usize) {
            q.pending += estimate / q.weight;
            self.largest = self.largest.max(estimate / q.weight);
        }
        self.add_to_counter(tenant, estimate);
        if self.in_flight_credit > 0.0 && (tenant.0 as usize) < self.tenants.len() {
            // Without credit the lift's key is unchanged (counter and
            // pending grow alike): the hot path pays no index update then.
            self.resettle(tenant);
        }
    }

    /// Sets the share of backlogged tenants' in-flight estimates that a
    /// returning tenant's lift counts as service they received (0 to 1).
    pub fn set_in_flight_credit(&mut self, credit: f64) {
        let credit = credit.clamp(0.0, 1.0);
        if credit == self.in_flight_credit {
            return;
        }
        self.in_flight_credit = credit;
        for i in 0..self.tenants.len() {
            self.resettle(TenantId(i as u32));
        }
    }

    /// Settles a dispatch charged `estimate`: its real cost is `actual`
    /// (`None`: unknown, the estimate stands; `Some(0.0)`: refunded).
    pub fn settle(&mut self, tenant: TenantId, estimate: f64, actual: Option<f64>) {
        if let Some(q) = self.tenants.get_mut(tenant.0 as usize) {
            q.pending = (q.pending - estimate / q.weight).max(0.0);
            self.largest = self.largest.max(actual.unwrap_or(0.0) / q.weight);
        }
        if let Some(a) = actual {
            self.add_to_counter(tenant, a - estimate);
        }
        if (tenant.0 as usize) < self.tenants.len() {
            self.resettle(tenant);
        }
    }

    /// Adds `cost` (may be negative: a correction) to a tenant's counter.
    pub fn charge(&mut self, tenant: TenantId, cost: f64) {
        if let Some(q) = self.tenants.get(tenant.0 as usize) {
            self.largest = self.largest.max(cost.abs() / q.weight);
        }
        self.add_to_counter(tenant, cost);
        if (tenant.0 as usize) < self.tenants.len() {
            self.resettle(tenant);
        }
    }

    /// The fairness bound's terms (`drf` and `wfq`): the largest gap
    /// between two backlogged tenants' counters, and the largest single
    /// charge over its tenant's weight so far. Serving the smallest counter
    /// keeps the first within a small multiple of the second (see
    /// `docs/policy-evaluation.md`, "The fairness bound"); `None` with
    /// fewer than two tenants backlogged.
    pub fn spread(&self) -> Option<(f64, f64)> {
        if !matches!(self.discipline, Discipline::Drf | Discipline::Wfq)
            || self.backlogged.len() < 2
        {
            return None;
        }
        let lo = self.backlogged.first()?.0.1;
        let hi = self.backlogged.last()?.0.1;
        Some((hi - lo, self.bound()))
    }

    /// How far apart serving the smallest counter keeps backlogged
    /// tenants' counters: the largest single charge per weight, plus the
    /// most any tenant has in flight (estimates per weight), of which a
    /// returning tenant's lift leaves out all but the `in_flight_credit`.
    pub fn bound(&self) -> f64 {
        let pending = self.tenants.iter().map(|q| q.pending).fold(0.0, f64::max);
        self.largest + pending
    }

    /// The counter and the dispatch order; not `floors`.
    fn add_to_counter(&mut self, tenant: TenantId, cost: f64) {
        let Some(q) = self.tenants.get_mut(tenant.0 as usize) else {
            return;
        };
        q.counter = (q.counter + cost / q.weight).max(0.0);
        if let Some(old) = q.key
            && matches!(self.discipline, Discipline::Drf | Discipline::Wfq)
        {
            let new = Key(old.0, q.counter);
            q.key = Some(new);
            self.backlogged.remove(&(old, tenant));
            self.backlogged.insert((new, tenant));
        }
    }
}

#[cfg(test)]
mod tests;
