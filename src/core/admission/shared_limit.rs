//! Leases: a tenant's limits held once for a cluster of gateway replicas.
//!
//! The cluster-wide bucket of each limit lives in a shared store; each
//! replica admits from what it has been granted (its lease) and, at every
//! sync, tells the store what it holds, gives back what it will not need
//! and asks for what it will. The store's side is [`SharedLimit`] (the
//! cluster store runs the same steps in a script; the replay and the tests
//! run this one); the replica's side is in the scheduler
//! (`Scheduler::lease_asks` and `Scheduler::lease_granted`).
//!
//! The invariant the store keeps, for the request and GPU-seconds buckets:
//! its own level plus everything the replicas hold (their leases and, for
//! GPU-seconds, their open reservations, as last reported) never exceeds
//! the bucket's capacity; refill only fills the room left. A replica's
//! holding only shrinks between syncs (admissions take from it), except
//! when a finished request's reservation is settled below its estimate,
//! and that refund was already counted in the open reservations it
//! reported. So at any moment the tokens that can be spent anywhere in the
//! cluster are at most the capacity, and over any interval the cluster
//! admits at most `capacity + rate × interval`: the single-gateway bound.
//! A request that costs more GPU-seconds than its estimate leaves its
//! replica in debt, which moves to the store at that replica's next sync;
//! until then, the others may still draw on the store, so the GPU-seconds
//! charged can pass the single-gateway bound by the overruns of requests
//! that ended within the last sync interval.
//!
//! The concurrency cap is a pool of slots: the store hands them out so
//! that the slots held by all replicas never exceed `max_concurrency`, and
//! a replica admits while its requests (queued and in flight) are fewer
//! than the slots it holds. It gives back, before it reports, the slots it
//! holds beyond its need, so the sum is exact.
//!
//! A replica that stops syncing is dropped from the store after its
//! membership expires, with everything it held, so its leases, slots and
//! open reservations return to the others.

use std::collections::HashMap;

/// What is float dust, not an amount, of a limit of `capacity`: a
/// millionth of it. A replica short by less is not short, and returns
/// nothing smaller (three even parts of 10 add up to 10.000000000000002;
/// the store's script uses the same bound).
pub fn dust(capacity: f64) -> f64 {
    1e-6 * capacity.max(1.0)
}

/// Which limit a lease is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseKind {
    /// Requests (the `rate` / `burst` bucket).
    Requests,
    /// GPU-seconds (the `gpu_seconds_per_hour` bucket).
    GpuSeconds,
    /// Slots of `max_concurrency`.
    Concurrency,
}

impl LeaseKind {
    pub const ALL: [LeaseKind; 3] = [
        LeaseKind::Requests,
        LeaseKind::GpuSeconds,
        LeaseKind::Concurrency,
    ];

    /// Position in [`LeaseKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Stable label value (the same as the refusal's `limit`).
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseKind::Requests => "rate",
            LeaseKind::GpuSeconds => "gpu_seconds",
            LeaseKind::Concurrency => "concurrency",
        }
    }
}

/// What a replica tells the store of one tenant's limit at a sync. The
/// replica has already taken `returned` out of its lease.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseAsk {
    pub tenant: String,
    pub kind: LeaseKind,
    /// The policy's limit: the bucket's capacity (`burst`, the hourly
    /// budget) or `max_concurrency`.
    pub capacity: f64,
    /// Refill per second (0 for concurrency).
    pub rate: f64,
    /// What the replica holds now, after giving back `returned`: its
    /// bucket's level (negative while in debt) or its slots.
    pub level: f64,
    /// GPU-seconds reserved by its admitted requests that have not ended.
    pub open: f64,
    /// Given back to the store.
    pub returned: f64,
    /// What it would like to hold.
    pub want: f64,
}

/// The store's answer to one [`LeaseAsk`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LeaseAnswer {
    /// What to add to the lease (its debt, now the store's, included).
    pub give: f64,
    /// What the other replicas asked for and did not get, as they last
    /// reported: while it is above zero, this replica keeps no more than
    /// its demand needs (no spare request's worth).
    pub short: f64,
}

impl LeaseAsk {
    /// What the store records this replica as holding before a grant.
    fn held(&self) -> f64 {
        self.level.max(0.0) + self.open
    }
}

/// The store's side of one tenant's limit: the cluster's bucket (or slot
/// pool) and what each replica holds. Times are the store's clock, in
/// seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SharedLimit {
    level: f64,
    updated: f64,
    /// By replica: what it holds, and what it asked for beyond that and
    /// did not get.
    held: HashMap<String, (f64, f64)>,
    started: bool,
}

impl SharedLimit {
    /// One replica's sync at `now`: refill into the room the holdings
    /// leave, take back what it returns and any debt it carries, grant what
    /// it asks for as far as the store has it.
    pub fn sync(&mut self, now: f64, replica: &str, ask: &LeaseAsk) -> LeaseAnswer {
        let (others, short) = self
            .held
            .iter()
            .filter(|(r, _)| r.as_str() != replica)
            .fold((0.0, 0.0), |(h, u), (_, (held, unmet))| {
                (h + held, u + unmet)
            });
        let room = |held: f64| (ask.capacity - others - held).max(0.0);
        let mut give = 0.0;
        let held = if ask.kind == LeaseKind::Concurrency {
            // Slots: what nobody holds is free.
            let held = ask.level.max(0.0);
            let grant = (ask.want - held).clamp(0.0, room(held)).floor();
            give = grant;
            held + grant
        } else {
            // Refill fills the room left beside what the replicas hold now
            // (this one's returns included, which come back below). Each
            // step adds at most `rate` per second elapsed, whichever room
            // it fills, so the bound over any span holds.
            // The room is taken afresh at every sync, so holdings the store
            // never granted (a store restarted under running replicas) are
            // counted too.
            let kept = ask.held() + ask.returned;
            if !self.started {
                self.started = true;
                self.level = room(kept);
            } else if now > self.updated {
                self.level += (now - self.updated) * ask.rate;
            }
            self.level = self.level.min(room(kept));
            self.updated = self.updated.max(now);
            self.level += ask.returned;
            if ask.level < 0.0 {
                // The replica's debt becomes the store's.
                self.level += ask.level;
                give -= ask.level;
            }
            let grant = (ask.want - ask.held()).clamp(0.0, self.level.max(0.0));
            self.level -= grant;
            give += grant;
            let held = ask.held() + grant;
            self.level = self.level.min(room(held));
            held
        };
        let unmet = Some(ask.want - held)
            .filter(|u| *u > dust(ask.capacity))
            .unwrap_or(0.0);
        self.held.insert(replica.to_owned(), (held, unmet));
        LeaseAnswer { give, short }
    }

    /// A replica left or expired: what it held is free again.
    pub fn drop_replica(&mut self, replica: &str) {
        self.held.remove(replica);
    }

    /// The store's level (what no replica holds), as of the last sync.
    pub fn level(&self) -> f64 {
        self.level
    }

    /// Whether a replica asked for more than it got at its last sync (the
    /// store lists the limit as short, so that idle holders ask again).
    pub fn is_short(&self) -> bool {
        self.held.values().any(|(_, unmet)| *unmet > 0.0)
    }

    /// Everything the replicas hold, as last reported.
    pub fn held(&self) -> f64 {
        self.held.values().map(|(h, _)| h).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    impl SharedLimit {
        fn sync_give(&mut self, now: f64, replica: &str, ask: &LeaseAsk) -> f64 {
            self.sync(now, replica, ask).give
        }
    }

    fn ask(kind: LeaseKind, level: f64, returned: f64, want: f64) -> LeaseAsk {
        LeaseAsk {
            tenant: "a".into(),
            kind,
            capacity: 10.0,
            rate: 5.0,
            level,
            open: 0.0,
            returned,
            want,
        }
    }

    #[test]
    fn grants_up_to_what_the_store_has_and_refills_into_the_room_left() {
        let mut s = SharedLimit::default();
        assert_eq!(
            s.sync_give(0.0, "r1", &ask(LeaseKind::Requests, 0.0, 0.0, 6.0)),
            6.0
        );
        assert_eq!(
            s.sync_give(0.0, "r2", &ask(LeaseKind::Requests, 0.0, 0.0, 6.0)),
            4.0
        );
        assert_eq!(s.level(), 0.0);
        // r1 spent its 6; one second refills 5, all of it free room.
        assert_eq!(
            s.sync_give(1.0, "r1", &ask(LeaseKind::Requests, 0.0, 0.0, 6.0)),
            5.0
        );
        // Ten idle seconds: the store fills only the room the holdings leave.
        assert_eq!(
            s.sync_give(11.0, "r2", &ask(LeaseKind::Requests, 4.0, 0.0, 4.0)),
            0.0
        );
        assert_eq!(s.level() + s.held(), 10.0);
    }

    #[test]
    fn returned_and_dropped_holdings_are_free_again() {
        let mut s = SharedLimit::default();
        s.sync_give(0.0, "r1", &ask(LeaseKind::Requests, 0.0, 0.0, 10.0));
        assert_eq!(
            s.sync_give(0.0, "r2", &ask(LeaseKind::Requests, 0.0, 0.0, 5.0)),
            0.0
        );
        // r1 gives 7 back: r2 gets 5 of them.
        s.sync_give(0.0, "r1", &ask(LeaseKind::Requests, 3.0, 7.0, 3.0));
        assert_eq!(
            s.sync_give(0.0, "r2", &ask(LeaseKind::Requests, 0.0, 0.0, 5.0)),
            5.0
        );
        // r1 dies holding 3: the room comes back as the store refills.
        s.drop_replica("r1");
        assert_eq!(
            s.sync_give(1.0, "r2", &ask(LeaseKind::Requests, 5.0, 0.0, 10.0)),
            5.0
        );
    }

    #[test]
    fn a_replicas_debt_moves_to_the_store() {
        let mut s = SharedLimit::default();
        s.sync_give(0.0, "r1", &ask(LeaseKind::GpuSeconds, 0.0, 0.0, 10.0));
        // r1 ran 4 GPU-seconds over: it holds -4; the store, empty, takes the
        // debt and r2 gets nothing until 6 s of refill have repaid it.
        let give = s.sync_give(0.0, "r1", &ask(LeaseKind::GpuSeconds, -4.0, 0.0, 1.0));
        assert_eq!(give, 4.0);
        assert_eq!(s.level(), -4.0);
        assert_eq!(
            s.sync_give(0.5, "r2", &ask(LeaseKind::GpuSeconds, 0.0, 0.0, 1.0)),
            0.0
        );
        assert_eq!(
            s.sync_give(1.0, "r2", &ask(LeaseKind::GpuSeconds, 0.0, 0.0, 1.0)),
            1.0
        );
    }

    #[test]
    fn slots_never_exceed_the_cap() {
        let mut s = SharedLimit::default();
        let slots = |level, want| ask(LeaseKind::Concurrency, level, 0.0, want);
        assert_eq!(s.sync_give(0.0, "r1", &slots(0.0, 7.0)), 7.0);
        assert_eq!(s.sync_give(0.0, "r2", &slots(0.0, 7.0)), 3.0);
        // r1 gives 5 back (it reports 2): r2 may take them.
        assert_eq!(s.sync_give(1.0, "r1", &slots(2.0, 2.0)), 0.0);
        assert_eq!(s.sync_give(1.0, "r2", &slots(3.0, 9.0)), 5.0);
        assert_eq!(s.held(), 10.0);
        // r2 is one short: r1 hears of it at its next sync.
        assert_eq!(s.sync(2.0, "r1", &slots(2.0, 2.0)).short, 1.0);
    }

    proptest! {
        /// Whatever the replicas do, the tokens spendable in the cluster
        /// (the store's level and every holding) never exceed the capacity,
        /// so admissions over any span are at most capacity + rate × span.
        #[test]
        fn requests_admitted_stay_within_the_single_bucket_bound(
            ops in proptest::collection::vec((0usize..3, 0u32..500, 0u32..12, 0u32..8), 1..300),
        ) {
            let mut s = SharedLimit::default();
            let mut lease = [0.0f64; 3];
            let mut admitted = 0.0;
            let mut now_ms = 0u64;
            for (r, dt, want, spend) in ops {
                now_ms += u64::from(dt);
                let now = now_ms as f64 / 1000.0;
                // Spend what the lease allows, then sync.
                let spent = f64::from(spend).min(lease[r].floor());
                lease[r] -= spent;
                admitted += spent;
                let want = f64::from(want);
                let returned = (lease[r] - want).max(0.0);
                lease[r] -= returned;
                let a = ask(LeaseKind::Requests, lease[r], returned, want);
                lease[r] += s.sync_give(now, &format!("r{r}"), &a);
                let held: f64 = lease.iter().sum();
                prop_assert!(s.level() + held <= 10.0 + 1e-9, "{} + {held}", s.level());
                prop_assert!(admitted <= 10.0 + 5.0 * now + 1e-9);
            }
        }
    }
}
