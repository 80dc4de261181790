//! The sync: joining the cluster, and every `sync_interval` publishing
//! this replica's demand, settling its leases and handing its scheduler
//! new shares, through the [`Replica`] it drives.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::ClusterPolicy;
use crate::core::admission::{LeaseAnswer, LeaseAsk, LeaseKind};
use crate::core::prefix::homes::HomeChange;
use crate::core::scheduler::{Demand, PlacedHome};

use super::connection::ConnectError;
use super::homes::Ledger;
use super::member::{Member, default_replica_name};
use super::shares::{DemandMeter, Shape, shares};
use super::store::{Answer, Store};

/// Connects (lazily) and makes the first contact, so that the replica
/// starts with the cluster's count and the demand it has seen. A store
/// that does not answer within one sync interval leaves the count at 1
/// (the sync task keeps trying).
pub async fn join(policy: &ClusterPolicy) -> Result<(Syncer, Member), ConnectError> {
    let replica = policy.replica.clone().unwrap_or_else(default_replica_name);
    let store = Store::connect(policy, &replica)?;
    let member = Member::new(replica);
    let mut syncer = Syncer {
        store,
        interval: policy.sync_interval,
        lease_ahead: policy.lease_ahead,
        meter: DemandMeter::new(policy.sync_interval),
        short: Vec::new(),
        ask_all: false,
        ledger: Ledger::default(),
    };
    syncer.exchange(&member, &[], &[], &Shape::default()).await;
    Ok((syncer, member))
}

/// What the sync drives: this replica's gateway, whose scheduler it hands
/// leases and shares.
pub trait Replica: Send + Sync {
    /// The demand to publish, with the replica's now; and when `replicas`
    /// is `Some` (the store is up), the leases to ask for `ahead` of
    /// their need.
    fn demand(
        &self,
        ahead: Duration,
        replicas: Option<u32>,
    ) -> (crate::core::time::Instant, Demand, Vec<LeaseAsk>);
    /// The store's answers to `asks`, the limits some replica is short
    /// of, and whether every lease must be asked for again.
    fn leases_answered(
        &self,
        asks: &[LeaseAsk],
        answers: &[LeaseAnswer],
        short: &[(String, LeaseKind)],
        ask_all: bool,
    );
    /// The policy in force.
    fn policy(&self) -> Arc<crate::config::Policy>;
    /// New leases came: requests queued for want of one may go now.
    fn leases_changed(&self);
    /// The membership or the demand moved: hands the scheduler this
    /// replica's new shares of the policy.
    fn apply_share(&self);
    /// The homes this replica's prefix strategy gave new prefixes since
    /// the last call.
    fn placed_homes(&self) -> Vec<PlacedHome>;
    /// What the cluster decided of the prefixes' homes ([`super::homes`]).
    fn homes_changed(&self, changes: &[HomeChange]);
}

/// A replica's link to the store: its connection and what it measures
/// between syncs.
#[derive(Debug)]
pub struct Syncer {
    store: Store,
    interval: Duration,
    lease_ahead: Duration,
    meter: DemandMeter,
    /// From the last answer: the limits some replica is short of, and
    /// whether every lease must be asked for again (the store restarted
    /// empty, or came back after this replica lost it).
    short: Vec<(String, LeaseKind)>,
    ask_all: bool,
    /// The first home of each prefix, as published ([`super::homes`]).
    ledger: Ledger,
}

impl Syncer {
    /// One sync of the gateway with the store: publishes its demand,
    /// settles its leases, and hands the scheduler new shares (or, when
    /// the store came or went, the other way of enforcing the limits).
    pub async fn sync(&mut self, member: &Member, replica: &dyn Replica) {
        let up = member.store_up().then(|| member.replicas());
        let (now, demand, asks) = replica.demand(self.lease_ahead, up);
        let demand = self.meter.fields(now, demand);
        let shape = Shape::of(&replica.policy());
        let replicas = member.replicas();
        let (answers, changed) = self.exchange(member, &demand, &asks, &shape).await;
        let (short, ask_all) = (
            std::mem::take(&mut self.short),
            std::mem::take(&mut self.ask_all),
        );
        if !answers.is_empty() || !short.is_empty() || ask_all {
            replica.leases_answered(&asks, &answers, &short, ask_all);
        }
        if !answers.is_empty() {
            replica.leases_changed();
        }
        if changed {
            let n = member.replicas();
            if n != replicas {
                tracing::info!(replica = %member.replica, replicas = n, "cluster membership changed");
            }
            replica.apply_share();
        }
        self.share_homes(member, replica).await;
    }

    /// Publishes the homes this replica gave new prefixes and takes what
    /// the cluster decided of every replica's ([`super::homes`]), when a
    /// pool routes on prefixes. While the store is down the placements
    /// are dropped: they are hints, and each replica keeps its own homes.
    async fn share_homes(&mut self, member: &Member, replica: &dyn Replica) {
        let routed = replica
            .policy()
            .pools
            .iter()
            .any(|p| p.routing == crate::core::spec::Strategy::PrefixAware);
        let placed = replica.placed_homes();
        if !routed || !member.store_up() {
            return;
        }
        let exchanged = tokio::time::timeout(self.interval, self.store.exchange_homes(&placed));
        let entries = match exchanged.await {
            Ok(Ok(entries)) => entries,
            Ok(Err(e)) => {
                tracing::debug!(replica = %member.replica, cause = %e, "prefix homes not shared");
                return;
            }
            Err(_) => return,
        };
        member
            .homes_published
            .fetch_add(placed.len() as u64, Ordering::Relaxed);
        let changes = self.ledger.read(&member.replica, entries);
        if changes.is_empty() {
            return;
        }
        for c in &changes {
            let counter = match c {
                HomeChange::Placed { .. } => &member.homes_learned,
                HomeChange::Moved { .. } => &member.homes_moved,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        replica.homes_changed(&changes);
    }

    /// One round trip, publishing `demand` and settling `asks`; updates
    /// `member`. Returns the store's answer to each ask (none if it did not
    /// answer) and whether the replica must apply new shares: the count or
    /// a share moved, or the store came or went.
    async fn exchange(
        &mut self,
        member: &Member,
        demand: &[(String, f64)],
        asks: &[LeaseAsk],
        shape: &Shape,
    ) -> (Vec<LeaseAnswer>, bool) {
        let timeout = self.interval;
        let start = tokio::time::Instant::now();
        let result = tokio::time::timeout(timeout, self.store.sync(demand, asks)).await;
        let was_up = member.store_up.load(Ordering::Relaxed);
        match result {
            Ok(Ok(Answer {
                fresh,
                leases: answers,
                short,
                demands,
                now_ms,
            })) => {
                let rtt = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
                member.rtt_micros.store(rtt, Ordering::Relaxed);
                member.syncs.fetch_add(1, Ordering::Relaxed);
                member.store_up.store(true, Ordering::Relaxed);
                let n = u32::try_from(demands.len()).unwrap_or(u32::MAX).max(1);
                if !was_up {
                    tracing::info!(
                        replica = %member.replica, replicas = n,
                        "cluster store reachable: limits leased from the store"
                    );
                }
                let old_n = member.replicas.swap(n, Ordering::Relaxed);
                let round = now_ms / u64::try_from(self.interval.as_millis()).unwrap_or(1).max(1);
                let new = shares(&member.replica, &demands, shape, round);
                let moved = |old: f64, new: f64| (old - new).abs() > 0.01 * old.max(new);
                let mut tenants = member.tenants.lock();
                let mut pools = member.pools.lock();
                let changed = new.tenants.len() != tenants.len()
                    || new.pools.len() != pools.len()
                    || new
                        .tenants
                        .iter()
                        .any(|(t, s)| tenants.get(t).is_none_or(|old| moved(old.share, s.share)))
                    || new.pools.iter().any(|(m, s)| {
                        pools.get(m).is_none_or(|old| {
                            moved(old.share, s.share)
                                || old.slots != s.slots
                                || old.yield_above != s.yield_above
                        })
                    });
                *tenants = new.tenants;
                *pools = new.pools;
                let answers = if answers.len() == asks.len() {
                    answers
                } else {
                    Vec::new()
                };
                self.short = short;
                self.ask_all = fresh || !was_up;
                (answers, !was_up || old_n != n || changed)
            }
            failed => {
                member.store_errors.fetch_add(1, Ordering::Relaxed);
                member.store_up.store(false, Ordering::Relaxed);
                if was_up || member.store_errors.load(Ordering::Relaxed) == 1 {
                    let cause = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {}", humantime::format_duration(timeout)),
                    };
                    tracing::warn!(
                        replica = %member.replica,
                        replicas = member.replicas(),
                        %cause,
                        "cluster store unreachable: enforcing this replica's last shares"
                    );
                }
                (Vec::new(), was_up)
            }
        }
    }

    /// Syncs every `sync_interval`, and sooner (at most every eighth of
    /// it) when a request was refused for want of a lease; leaves the
    /// cluster on shutdown.
    pub async fn run(
        mut self,
        member: Arc<Member>,
        replica: Arc<dyn Replica>,
        stop: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.reset(); // the server synced before it started serving
        let min_gap = self.interval / 8;
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
                () = member.starved.notified() => {
                    tokio::time::sleep_until(last + min_gap).await;
                }
            }
            last = tokio::time::Instant::now();
            self.sync(&member, &*replica).await;
        }
        // A clean leave frees this replica's share at once for the others
        // (otherwise it expires after `replica_ttl`).
        let _ = tokio::time::timeout(self.interval, self.store.leave()).await;
    }
}
