//! [`Snapshot`]: one `/metrics` scrape read into per-tenant and
//! per-backend figures, kept to turn the next scrape into rates.

use std::collections::BTreeMap;

use crate::poller::expo::parse_float;
use crate::poller::{HistogramBucket, ParseError, Sample, parse};

/// A `fairway_requests_total` series of one tenant: (model, outcome, reason).
pub(super) type Series = (String, String, String);

/// Cumulative histogram buckets by model.
pub(super) type ByModel = BTreeMap<String, Vec<HistogramBucket>>;

/// One tenant's figures in one scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct TenantFigures {
    /// `fairway_requests_total` by (model, outcome, reason).
    pub(super) requests: BTreeMap<Series, f64>,
    /// `fairway_goodput_total` by model.
    pub(super) goodput: BTreeMap<String, f64>,
    /// `fairway_ttft_seconds` buckets by model.
    pub(super) ttft: ByModel,
    /// `fairway_e2e_seconds` buckets by model.
    pub(super) e2e: ByModel,
    /// `fairway_queue_depth`.
    pub(super) queued: Option<f64>,
    /// `fairway_tenant_in_flight`.
    pub(super) in_flight: Option<f64>,
    /// `fairway_preemptions_total`.
    pub(super) preempted: Option<f64>,
    /// `fairway_tenant_slo_ttft_seconds`.
    pub(super) slo_ttft: Option<f64>,
    /// `fairway_tenant_slo_e2e_seconds`.
    pub(super) slo_e2e: Option<f64>,
    /// `fairway_tenant_recent_{ttft,e2e}_p99_seconds`: the
    /// p99s of the last minute from the gateway's sketches, preferred to
    /// the buckets' interpolation.
    pub(super) recent_ttft_p99: Option<f64>,
    pub(super) recent_e2e_p99: Option<f64>,
}

/// One backend's gauges in one scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct BackendFigures {
    pub(super) healthy: Option<f64>,
    pub(super) in_flight: Option<f64>,
    pub(super) window: Option<f64>,
    pub(super) kv_usage: Option<f64>,
    pub(super) waiting: Option<f64>,
    pub(super) reading_age: Option<f64>,
    /// `fairway_backend_cached_prompt_tokens_total` and
    /// `fairway_backend_reported_prompt_tokens_total`: counters, for the
    /// prefix cache's hit rate between scrapes.
    pub(super) cached_tokens: Option<f64>,
    pub(super) prompt_tokens: Option<f64>,
}

/// Counters of one scrape, kept to turn the next scrape into rates.
///
/// Also holds the scrape's gauges (queues, in-flight counts, SLO targets,
/// backend state), which [`render`](super::render) shows as they are.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// When the body was read, in seconds on any clock the caller keeps
    /// steady between scrapes.
    pub(super) at_secs: f64,
    /// Per-tenant figures, by tenant name.
    pub(super) tenants: BTreeMap<String, TenantFigures>,
    /// Per-backend gauges, by (backend, model).
    pub(super) backends: BTreeMap<(String, String), BackendFigures>,
    /// `fairway_jain_fairness_index`, when exported.
    pub(super) jain: Option<f64>,
    /// `fairway_overhead_seconds` cumulative buckets.
    pub(super) overhead: Vec<HistogramBucket>,
    /// The replica's view of its `[cluster]`, when it has one.
    pub(super) cluster: Option<ClusterFigures>,
    /// The batch lane's figures, by tenant.
    pub(super) batches: BTreeMap<String, BatchFigures>,
}

/// `fairway_cluster_*`: this replica's view of its cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct ClusterFigures {
    pub(super) replica: String,
    pub(super) replicas: Option<f64>,
    pub(super) store_up: Option<f64>,
    pub(super) rtt_seconds: Option<f64>,
    /// Each tenant's share of its limits here.
    pub(super) shares: BTreeMap<String, f64>,
    /// 1 while the limits are leased from the store.
    pub(super) leasing: Option<f64>,
    /// What is held here of each leased limit, by (tenant, limit).
    pub(super) leases: BTreeMap<(String, String), f64>,
}

/// Why a `/metrics` body is not a Fairway gateway's: the address the
/// operator gave is some other server's.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a Prometheus exposition")]
    NotExposition(#[source] ParseError),
    /// A Prometheus exposition, but not Fairway's.
    #[error("no fairway_ metrics in the body; is this Fairway's admin /metrics endpoint?")]
    NotFairway,
}

impl Snapshot {
    /// Reads a `/metrics` body read at `at_secs` (seconds on a clock the
    /// caller keeps steady between scrapes; only differences are used).
    ///
    /// `Err` when the body is not a Prometheus
    /// exposition, or holds no `fairway_` metric at all (the address is
    /// some other server).
    pub fn from_text(text: &str, at_secs: f64) -> Result<Snapshot, SnapshotError> {
        let expo = parse(text).map_err(SnapshotError::NotExposition)?;
        if !expo.samples.iter().any(|s| s.name.starts_with("fairway_")) {
            return Err(SnapshotError::NotFairway);
        }
        let mut snap = Snapshot {
            at_secs,
            ..Snapshot::default()
        };
        for s in &expo.samples {
            snap.add(s);
        }
        Ok(snap)
    }

    fn cluster(&mut self, s: &Sample) -> &mut ClusterFigures {
        self.cluster.get_or_insert_with(|| ClusterFigures {
            replica: label(s, "replica"),
            ..ClusterFigures::default()
        })
    }

    /// When the body was read, as passed to [`Snapshot::from_text`].
    pub fn at_secs(&self) -> f64 {
        self.at_secs
    }

    /// Folds one sample in; samples of other families are ignored.
    fn add(&mut self, s: &Sample) {
        let v = s.value;
        match s.name.as_str() {
            "fairway_jain_fairness_index" => self.jain = Some(v),
            "fairway_cluster_replicas" => self.cluster(s).replicas = Some(v),
            "fairway_cluster_store_up" => self.cluster(s).store_up = Some(v),
            "fairway_cluster_store_rtt_seconds" => self.cluster(s).rtt_seconds = Some(v),
            "fairway_cluster_tenant_share" => {
                let tenant = label(s, "tenant");
                self.cluster(s).shares.insert(tenant, v);
            }
            "fairway_cluster_leasing" => self.cluster(s).leasing = Some(v),
            "fairway_cluster_lease" => {
                let key = (label(s, "tenant"), label(s, "limit"));
                self.cluster(s).leases.insert(key, v);
            }
            "fairway_overhead_seconds_bucket" => add_bucket(&mut self.overhead, s),
            "fairway_requests_total" => {
                if let Some(t) = self.tenant(s) {
                    let key = (label(s, "model"), label(s, "outcome"), label(s, "reason"));
                    *t.requests.entry(key).or_insert(0.0) += v;
                }
            }
            "fairway_goodput_total" => {
                if let Some(t) = self.tenant(s) {
                    *t.goodput.entry(label(s, "model")).or_insert(0.0) += v;
                }
            }
            "fairway_ttft_seconds_bucket" => {
                if let Some(t) = self.tenant(s) {
                    add_bucket(t.ttft.entry(label(s, "model")).or_default(), s);
                }
            }
            "fairway_e2e_seconds_bucket" => {
                if let Some(t) = self.tenant(s) {
                    add_bucket(t.e2e.entry(label(s, "model")).or_default(), s);
                }
            }
            "fairway_queue_depth" => {
                if let Some(t) = self.tenant(s) {
                    t.queued = Some(v);
                }
            }
            "fairway_tenant_in_flight" => {
                if let Some(t) = self.tenant(s) {
                    t.in_flight = Some(v);
                }
            }
            "fairway_preemptions_total" => {
                if let Some(t) = self.tenant(s) {
                    t.preempted = Some(v);
                }
            }
            "fairway_tenant_slo_ttft_seconds" => {
                if let Some(t) = self.tenant(s) {
                    t.slo_ttft = Some(v);
                }
            }
            "fairway_tenant_slo_e2e_seconds" => {
                if let Some(t) = self.tenant(s) {
                    t.slo_e2e = Some(v);
                }
            }
            "fairway_tenant_recent_ttft_p99_seconds" => {
                if let Some(t) = self.tenant(s) {
                    t.recent_ttft_p99 = Some(v);
                }
            }
            "fairway_tenant_recent_e2e_p99_seconds" => {
                if let Some(t) = self.tenant(s) {
                    t.recent_e2e_p99 = Some(v);
                }
            }
            name => {
                if let Some(field) = name.strip_prefix("fairway_backend_") {
                    self.add_backend(field, s);
                } else if name.starts_with("fairway_batch")
                    && let Some(tenant) = s.label("tenant")
                {
                    add_batch(&mut self.batches, tenant, s);
                }
            }
        }
    }

    /// The figures of the sample's tenant, created on first sight; `None`
    /// when the sample has no `tenant` label.
    fn tenant(&mut self, s: &Sample) -> Option<&mut TenantFigures> {
        let name = s.label("tenant")?;
        Some(self.tenants.entry(name.to_owned()).or_default())
    }

    /// Folds in a `fairway_backend_<field>` sample. Any such family makes
    /// the backend known; only the fields the view shows are kept.
    fn add_backend(&mut self, field: &str, s: &Sample) {
        let Some(backend) = s.label("backend") else {
            return;
        };
        let b = self
            .backends
            .entry((backend.to_owned(), label(s, "model")))
            .or_default();
        let slot = match field {
            "healthy" => &mut b.healthy,
            "in_flight" => &mut b.in_flight,
            "window" => &mut b.window,
            "kv_usage_ratio" => &mut b.kv_usage,
            "waiting" => &mut b.waiting,
            "reading_age_seconds" => &mut b.reading_age,
            "cached_prompt_tokens_total" => &mut b.cached_tokens,
            "reported_prompt_tokens_total" => &mut b.prompt_tokens,
            _ => return,
        };
        *slot = Some(s.value);
    }
}

/// A label's value, or "" when absent.
/// One tenant's batch figures in one scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct BatchFigures {
    /// Items of unfinished batches by state.
    pub(super) items: BTreeMap<String, f64>,
    pub(super) preempted: Option<f64>,
    pub(super) resumed: Option<f64>,
    pub(super) tokens_saved: Option<f64>,
    /// Each running batch's slack (expiry less projected completion).
    pub(super) slack: Vec<f64>,
}

/// Folds in a `fairway_batch*` sample of `tenant`; other families are
/// ignored.
fn add_batch(all: &mut BTreeMap<String, BatchFigures>, tenant: &str, s: &Sample) {
    let v = s.value;
    match s.name.as_str() {
        "fairway_batch_items" => {
            let state = s.label("state").unwrap_or("").to_owned();
            let t = all.entry(tenant.to_owned()).or_default();
            *t.items.entry(state).or_insert(0.0) += v;
        }
        "fairway_batch_items_preempted_total" => {
            all.entry(tenant.to_owned()).or_default().preempted = Some(v);
        }
        "fairway_batch_items_resumed_total" => {
            all.entry(tenant.to_owned()).or_default().resumed = Some(v);
        }
        "fairway_batch_resume_tokens_saved_total" => {
            all.entry(tenant.to_owned()).or_default().tokens_saved = Some(v);
        }
        "fairway_batch_deadline_slack_seconds" if v.is_finite() => {
            all.entry(tenant.to_owned()).or_default().slack.push(v);
        }
        _ => {}
    }
}

fn label(s: &Sample, name: &str) -> String {
    s.label(name).unwrap_or("").to_owned()
}

/// Adds a `_bucket` sample to `buckets`, summing samples of the same bound.
/// Samples with no or a `NaN` `le`, or a non-finite or negative count, are
/// skipped.
fn add_bucket(buckets: &mut Vec<HistogramBucket>, s: &Sample) {
    if !s.value.is_finite() || s.value < 0.0 {
        return;
    }
    let Some(le) = s.label("le").and_then(parse_float) else {
        return;
    };
    if le.is_nan() {
        return;
    }
    match buckets.iter_mut().find(|b| b.le == le) {
        Some(b) => b.count += s.value,
        None => buckets.push(HistogramBucket { le, count: s.value }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{alpha_before, body};
    use super::*;

    #[test]
    fn parses_a_realistic_multi_tenant_exposition() {
        let snap = Snapshot::from_text(&body(&alpha_before()), 10.0).unwrap();
        assert_eq!(snap.at_secs(), 10.0);
        let names: Vec<&str> = snap.tenants.keys().map(String::as_str).collect();
        assert_eq!(names, ["alpha", "beta", "gamma"]);
        assert_eq!(snap.jain, Some(0.93));
        assert_eq!(snap.overhead.len(), 4);

        let alpha = &snap.tenants["alpha"];
        assert_eq!(alpha.requests.len(), 1);
        assert_eq!(alpha.goodput["llama"], 95.0);
        assert_eq!(alpha.ttft["llama"].len(), 6);
        assert_eq!(alpha.slo_ttft, Some(0.5));
        assert_eq!(alpha.slo_e2e, Some(5.0));
        assert_eq!(alpha.queued, Some(3.0));
        assert_eq!(alpha.in_flight, Some(5.0));

        let beta = &snap.tenants["beta"];
        assert_eq!(beta.ttft.len(), 2, "one histogram per model");
        assert_eq!(beta.slo_ttft, None);
        let gamma = &snap.tenants["gamma"];
        assert!(gamma.requests.is_empty());
        assert_eq!(gamma.queued, Some(7.0));

        assert_eq!(snap.backends.len(), 2);
        let a = &snap.backends[&("gpu-a".to_owned(), "llama".to_owned())];
        assert_eq!(a.healthy, Some(1.0));
        assert_eq!(a.kv_usage, Some(0.42));
        let b = &snap.backends[&("gpu-b".to_owned(), "mistral".to_owned())];
        assert_eq!(b.healthy, Some(0.0));
        assert_eq!(b.kv_usage, None);
        assert_eq!(b.reading_age, Some(12.5));
    }

    #[test]
    fn garbage_input_is_an_error_not_a_panic() {
        for text in [
            "",
            "<html><body>502 Bad Gateway</body></html>",
            "{\"error\": \"not found\"}",
            "fairway_requests_total{tenant=\"a",
            "\u{0}\u{1}\u{fffd}\u{fffd}",
            "up 1\nprocess_cpu_seconds_total 2.5\n",
        ] {
            assert!(Snapshot::from_text(text, 0.0).is_err(), "{text:?}");
        }
        // A body that is only partly odd still reads.
        let mixed = "fairway_queue_depth{tenant=\"a\"} 2\nthis is not a sample\n";
        assert!(Snapshot::from_text(mixed, 0.0).is_ok());
    }
}
