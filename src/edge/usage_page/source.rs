//! What a usage report is made of: every tenant's live numbers (read at
//! most once a second for any number of views), the reported tenants'
//! windows, and the shares computed from them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::gateway::live_policy::Live;
use crate::gateway::state::Gateway;
use crate::gateway::usage_share::{Everyone, LiveNumbers, UsageSource};
use crate::telemetry::usage::TenantWindows;

use super::Subject;

/// The windows and live numbers a report is made of: this replica's, or
/// the cluster's (every replica's published, added).
pub(super) struct Source {
    /// By usage index, for the tenants reported.
    pub(super) windows: HashMap<usize, (TenantWindows, usize)>,
    /// Every tenant's live numbers (read at most once a second for any
    /// number of views).
    pub(super) everyone: Arc<Everyone>,
    /// By usage index, the reported tenants' own numbers here, as of now.
    pub(super) own: HashMap<usize, LiveNumbers>,
    /// By usage index, reported tenants: what the cluster's store holds of
    /// the tenant's request and GPU-seconds buckets beside the replicas.
    pub(super) store: HashMap<usize, (Option<f64>, Option<f64>)>,
    /// `cluster` or `replica`.
    pub(super) scope: &'static str,
    /// Why the cluster's numbers could not be read, if they could not.
    pub(super) error: Option<String>,
}

/// Every tenant's live numbers: the cluster's (each replica's as
/// published) or this replica's alone. This replica's are read on the
/// blocking pool: ten thousand tenants' take the scheduler's lock ten
/// thousand times, briefly, and none of the request path's threads.
pub(super) async fn read_everyone(
    gw: &Arc<Gateway>,
    live: &Arc<Live>,
    cluster: bool,
    now: f64,
) -> Everyone {
    let (g, l) = (gw.clone(), live.clone());
    let own: Vec<LiveNumbers> = tokio::task::spawn_blocking(move || {
        (0..l.usage.len())
            .map(|i| UsageSource::numbers(&*g, &l, i, now))
            .collect()
    })
    .await
    .unwrap_or_default();
    let mut error = None;
    if let Some(shared) = gw.shared_usage().filter(|_| cluster) {
        match tokio::time::timeout(READ_TIMEOUT, shared.read_numbers(live, now, own.clone())).await
        {
            Ok(Ok(numbers)) => {
                return Everyone {
                    numbers,
                    scope: "cluster",
                    fresh: shared.fresh(),
                    error: None,
                };
            }
            Ok(Err(e)) => error = Some(format!("cluster store: {e}")),
            Err(_) => error = Some("cluster store: no answer in time".to_owned()),
        }
    }
    Everyone {
        numbers: own.into_iter().map(|n| vec![n]).collect(),
        scope: "replica",
        fresh: f64::INFINITY,
        error,
    }
}

impl Source {
    pub(super) async fn read(
        gw: &Gateway,
        live: &Live,
        reported: &[usize],
        everyone: Arc<Everyone>,
        now: f64,
    ) -> Source {
        let own = reported
            .iter()
            .map(|&i| (i, UsageSource::numbers(gw, live, i, now)))
            .collect();
        let mut error = everyone.error.clone();
        if let Some(shared) = gw.shared_usage().filter(|_| everyone.scope == "cluster") {
            let read = tokio::time::timeout(READ_TIMEOUT, shared.read_windows(live, reported));
            match read.await {
                Ok(Ok(windows)) => {
                    return Source {
                        store: reported
                            .iter()
                            .zip(&windows)
                            .map(|(i, w)| (*i, (w.store_rate, w.store_gpu_seconds)))
                            .collect(),
                        windows: reported
                            .iter()
                            .zip(windows)
                            .map(|(i, w)| (*i, (w.windows, w.replicas)))
                            .collect(),
                        everyone,
                        own,
                        scope: "cluster",
                        error: None,
                    };
                }
                Ok(Err(e)) => error = Some(format!("cluster store: {e}")),
                Err(_) => error = Some("cluster store: no answer in time".to_owned()),
            }
        }
        Source {
            windows: reported
                .iter()
                .map(|&i| (i, (live.usage[i].lock().clone(), 1)))
                .collect(),
            everyone,
            own,
            store: HashMap::new(),
            scope: "replica",
            error,
        }
    }

    /// Tenant `index`'s live numbers: its own here (as of now when it is
    /// reported), then, in the cluster's scope, the other replicas'.
    pub(super) fn numbers(&self, index: usize) -> impl Iterator<Item = &LiveNumbers> {
        let all = self
            .everyone
            .numbers
            .get(index)
            .map_or(&[][..], Vec::as_slice);
        let (first, others) = all
            .split_first()
            .map_or((None, &[][..]), |(f, o)| (Some(f), o));
        let others = if self.scope == "cluster" {
            others
        } else {
            &[][..]
        };
        self.own.get(&index).or(first).into_iter().chain(others)
    }

    /// How old live numbers may be to count as current (seconds).
    pub(super) fn fresh(&self) -> f64 {
        if self.scope == "cluster" {
            self.everyone.fresh
        } else {
            f64::INFINITY
        }
    }
}

/// How long a report waits for the cluster's numbers before it answers
/// with this replica's.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Each tenant's weight and GPU-seconds over the last hour, for shares.
pub(super) struct Shares {
    /// (weight, GPU-seconds in the hour, had a request in the hour).
    by_index: Vec<(f64, f64, bool)>,
    /// The weights and GPU-seconds of the tenants active in the hour.
    active: (f64, f64),
}

impl Shares {
    /// From every replica's last hour of each tenant (as published; this
    /// replica's own now).
    pub(super) fn of(live: &Live, everyone: &[Subject], source: &Source) -> Self {
        let mut by_index = vec![(0.0, 0.0, false); live.usage.len()];
        let mut active = (0.0, 0.0);
        for s in everyone {
            let (mut gpu, mut requests) = (0.0, 0);
            for n in source.numbers(s.index) {
                gpu += n.gpu_seconds_1h;
                requests += n.requests_1h;
            }
            let weight = live.policy.tenants.get(s.index).map_or(1.0, |t| t.weight);
            by_index[s.index] = (weight, gpu, requests > 0);
            if requests > 0 {
                active.0 += weight;
                active.1 += gpu;
            }
        }
        Shares { by_index, active }
    }

    /// `index`'s share of the weights of the tenants active in the hour
    /// (itself counted), and of the GPU-seconds they were served.
    pub(super) fn of_tenant(&self, index: usize) -> (Option<f64>, Option<f64>) {
        let (weight, gpu, was_active) = self.by_index.get(index).copied().unwrap_or_default();
        let (mut weights, mut gpus) = self.active;
        if !was_active {
            weights += weight;
            gpus += gpu;
        }
        (
            (weights > 0.0).then(|| weight / weights),
            (gpus > 0.0).then(|| gpu / gpus),
        )
    }
}
