//! The extender's and the webhook's decisions: `/filter`, `/prioritize`
//! and `/validate` (pod creation, bindings), each judged by
//! `core::placement`'s rules against the nodes as the agents read them,
//! recorded, counted, and for an allowed binding reserved (in the
//! cluster's store too, with `[cluster]`: see `shared`).

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;

use super::k8s::{
    AdmissionRequest, AdmissionReview, Binding, ExtenderArgs, ExtenderFilterResult, HostPriority,
    Pod, Verdict,
};
use super::nodes::Reservation;
use super::shared::POD_TTL;
use crate::clock::unix_seconds;
use crate::core::placement::{Fit, Misfit, PodRequest, assess};

use super::service::*;

impl Placement {
    /// `node` judged for `pod` now.
    fn assess(&self, node: &str, pod: &PodRequest) -> Result<Fit, Vec<Misfit>> {
        let policy = self.policy.load();
        let now = self.clock.now();
        let state = self.nodes.lock().state(node, now, policy.stale_after);
        assess(&policy.spec(), now, &state, pod)
    }

    fn record(
        &self,
        what: &'static str,
        pod: String,
        node: Option<String>,
        allowed: bool,
        message: String,
    ) {
        let mut d = self.decisions.lock();
        if d.len() == DECISIONS_KEPT {
            d.pop_front();
        }
        d.push_back(Decision {
            unix_time: unix_seconds(),
            what,
            pod,
            node,
            allowed,
            message,
        });
    }

    /// Counts one decision of `kind` and the rules that refused it.
    fn count(&self, kind: &'static str, allowed: bool, refusals: &[Misfit]) {
        let mut c = self.counters.lock();
        *c.decisions.entry((kind, allowed)).or_default() += 1;
        for r in refusals {
            *c.refusals.entry(r.rule.as_str()).or_default() += 1;
        }
    }

    pub(super) fn filter(&self, body: &[u8]) -> Response<Full<Bytes>> {
        let args: ExtenderArgs = match serde_json::from_slice(body) {
            Ok(a) => a,
            Err(e) => return bad_request(&format!("not an ExtenderArgs body: {e}")),
        };
        let mut result = ExtenderFilterResult::default();
        let names = candidate_names(&args);
        let pod = match args.pod.request() {
            Ok(Some(pod)) => pod,
            Ok(None) => {
                result.nodes = args.nodes;
                result.node_names = args.nodenames;
                return json(StatusCode::OK, &result);
            }
            Err(e) => {
                result.error = e.to_string();
                return json(StatusCode::OK, &result);
            }
        };
        let mut passed = Vec::new();
        for name in names {
            match self.assess(&name, &pod) {
                Ok(_) => {
                    self.count("filter", true, &[]);
                    passed.push(name);
                }
                Err(refusals) => {
                    self.count("filter", false, &refusals);
                    let message = joined(&refusals);
                    self.record(
                        "filter",
                        args.pod.key(),
                        Some(name.clone()),
                        false,
                        message.clone(),
                    );
                    result.failed_nodes.insert(name, message);
                }
            }
        }
        if let Some(mut list) = args.nodes {
            list.items.retain(|n| {
                super::k8s::node_name(n).is_some_and(|n| passed.iter().any(|p| p == n))
            });
            result.nodes = Some(list);
        }
        if args.nodenames.is_some() {
            result.node_names = Some(passed);
        }
        json(StatusCode::OK, &result)
    }

    pub(super) fn prioritize(&self, body: &[u8]) -> Response<Full<Bytes>> {
        let args: ExtenderArgs = match serde_json::from_slice(body) {
            Ok(a) => a,
            Err(e) => return bad_request(&format!("not an ExtenderArgs body: {e}")),
        };
        let pod = args.pod.request().ok().flatten();
        let scores: Vec<HostPriority> = candidate_names(&args)
            .into_iter()
            .map(|host| {
                let score = pod
                    .as_ref()
                    .and_then(|pod| self.assess(&host, pod).ok())
                    .map_or(0, |fit| i64::from(fit.score));
                HostPriority { host, score }
            })
            .collect();
        json(StatusCode::OK, &scores)
    }

    pub(super) async fn validate(&self, body: &[u8]) -> Response<Full<Bytes>> {
        let review: AdmissionReview = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return bad_request(&format!("not an AdmissionReview body: {e}")),
        };
        if review.api_version != "admission.k8s.io/v1" || review.kind != "AdmissionReview" {
            return bad_request(&format!(
                "expected apiVersion admission.k8s.io/v1, kind AdmissionReview; got {}, {}",
                review.api_version, review.kind
            ));
        }
        let Some(req) = review.request else {
            return bad_request("the AdmissionReview has no request");
        };
        let verdict = self.admit(&req).await;
        json(StatusCode::OK, &verdict.review(&req.uid))
    }

    /// The webhook's decision on one request.
    async fn admit(&self, req: &AdmissionRequest) -> Verdict {
        if req.operation != "CREATE" || req.resource.resource != "pods" {
            return Verdict::allow();
        }
        let Some(object) = &req.object else {
            return Verdict::deny(400, "the request has no object".into());
        };
        match req.sub_resource.as_str() {
            "" => match serde_json::from_value::<Pod>(object.clone()) {
                Ok(pod) => self.admit_pod(req, &pod).await,
                Err(e) => Verdict::deny(400, format!("the object is not a Pod: {e}")),
            },
            "binding" => match serde_json::from_value::<Binding>(object.clone()) {
                Ok(binding) => self.admit_binding(req, &binding).await,
                Err(e) => Verdict::deny(400, format!("the object is not a Binding: {e}")),
            },
            _ => Verdict::allow(),
        }
    }

    async fn admit_pod(&self, req: &AdmissionRequest, pod: &Pod) -> Verdict {
        let request = match pod.request() {
            Ok(Some(r)) => r,
            Ok(None) => return Verdict::allow(),
            Err(e) => return Verdict::deny(400, e.to_string()),
        };
        let mut pod = pod.clone();
        if pod.metadata.namespace.is_empty() {
            pod.metadata.namespace.clone_from(&req.namespace);
        }
        let key = pod.key();
        if !pod.spec.node_name.is_empty() {
            // Created already bound: this is the only check it gets.
            return self.bind(req, key, &pod.spec.node_name, request).await;
        }
        if !req.dry_run {
            self.remember(&key, request.clone()).await;
        }
        let names = self.nodes.lock().names();
        if names.is_empty() {
            return match self.policy.load().on_stale {
                crate::core::placement::OnStale::Allow => Verdict::allow_with(
                    "fairway placement has no agent readings yet; pod not checked".into(),
                ),
                crate::core::placement::OnStale::Refuse => {
                    let message = format!(
                        "no GPU node has reported to fairway placement, and placement.on_stale is \"refuse\" (pod {key})"
                    );
                    self.count("pod", false, &[]);
                    self.record("pod", key, None, false, message.clone());
                    Verdict::deny(403, message)
                }
            };
        }
        let mut refusals = Vec::new();
        for name in &names {
            match self.assess(name, &request) {
                Ok(_) => {
                    self.count("pod", true, &[]);
                    return Verdict::allow();
                }
                Err(mut r) => refusals.append(&mut r),
            }
        }
        let message = format!(
            "no GPU node can take model {} ({:.1} GB) for pod {key}: {}",
            request.model,
            request.memory as f64 / 1e9,
            joined(&refusals)
        );
        self.count("pod", false, &refusals);
        self.record("pod", key, None, false, message.clone());
        Verdict::deny(403, message)
    }

    async fn admit_binding(&self, req: &AdmissionRequest, binding: &Binding) -> Verdict {
        let name = if req.name.is_empty() {
            &binding.metadata.name
        } else {
            &req.name
        };
        let namespace = if req.namespace.is_empty() {
            &binding.metadata.namespace
        } else {
            &req.namespace
        };
        let key = format!("{namespace}/{name}");
        let request = {
            let now = self.clock.now();
            let pods = self.pods.lock();
            pods.get(&key)
                .filter(|(_, seen)| now.saturating_since(*seen) <= POD_TTL)
                .map(|(r, _)| r.clone())
        };
        // Created at another replica: in the store.
        let request = match (request, &self.shared) {
            (None, Some(shared)) => shared.pod(&key).await.unwrap_or_else(|e| {
                self.store_failed(&e);
                None
            }),
            (request, _) => request,
        };
        let Some(request) = request else {
            // Not a model pod, or one created before placement started.
            return Verdict::allow();
        };
        self.bind(req, key, &binding.target.name, request).await
    }

    /// Judges `node` for the pod `key`; an allowed, non-dry-run placement
    /// reserves the model's memory on the chosen GPU. With a store, the
    /// node is judged with every replica's reservations, and the
    /// reservation is added only if none came in between; if one did, the
    /// binding is judged again with it.
    async fn bind(
        &self,
        req: &AdmissionRequest,
        key: String,
        node: &str,
        request: PodRequest,
    ) -> Verdict {
        let (what, kind) = if req.dry_run {
            ("binding (dry run)", "binding_dry_run")
        } else {
            ("binding", "binding")
        };
        for _ in 0..BIND_TRIES {
            let version = self.refresh_node(node).await;
            let fit = match self.assess(node, &request) {
                Ok(fit) => fit,
                Err(refusals) => {
                    let message =
                        format!("pod {key} cannot go on node {node}: {}", joined(&refusals));
                    self.count(kind, false, &refusals);
                    self.record(what, key, Some(node.to_owned()), false, message.clone());
                    return Verdict::deny(403, message);
                }
            };
            let message = match fit.gpu {
                Some(gpu) => format!("GPU {gpu}, score {}", fit.score),
                None => "no fresh reading; allowed unchecked (placement.on_stale)".to_owned(),
            };
            if let (Some(gpu), false) = (fit.gpu, req.dry_run) {
                let now = self.clock.now();
                let r = Reservation {
                    pod: key.clone(),
                    node: node.to_owned(),
                    gpu,
                    request: request.clone(),
                    until: now + self.policy.load().reservation_ttl,
                };
                if let (Some(shared), Some(version)) = (&self.shared, version) {
                    match shared.reserve(&r, version, now).await {
                        Ok(true) => {}
                        Ok(false) => {
                            // Another replica reserved on this node first.
                            self.counters.lock().conflicts += 1;
                            continue;
                        }
                        Err(e) => self.store_failed(&e),
                    }
                }
                self.nodes.lock().reservations.push(r);
                self.pods.lock().remove(&key);
            }
            self.count(kind, true, &[]);
            self.record(what, key, Some(node.to_owned()), true, message);
            return Verdict::allow();
        }
        let message = format!(
            "pod {key}: node {node}'s reservations changed {BIND_TRIES} times while it was judged (bindings at other placement replicas); try again"
        );
        self.count(kind, false, &[]);
        self.record(what, key, Some(node.to_owned()), false, message.clone());
        Verdict::deny(409, message)
    }

    /// With a store: replaces this replica's reservations on `node` with
    /// the store's (those whose engine shows dropped, there too) and
    /// returns the node's version. `None` without a store, or when it did
    /// not answer: the node is judged with this replica's own.
    async fn refresh_node(&self, node: &str) -> Option<u64> {
        let shared = self.shared.as_ref()?;
        let now = self.clock.now();
        match shared.node(node, now).await {
            Ok(read) => {
                self.store_answered();
                {
                    let mut nodes = self.nodes.lock();
                    nodes.reservations.retain(|r| r.node != node);
                    nodes.reservations.extend(read.reservations);
                }
                self.settle(now, self.policy.load().stale_after).await;
                Some(read.version)
            }
            Err(e) => {
                self.store_failed(&e);
                None
            }
        }
    }

    /// A store call failed: counted, and logged when the store was up.
    pub(super) fn store_failed(&self, e: &redis::RedisError) {
        self.counters.lock().store_errors += 1;
        if self
            .store_up
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(error = %e, "placement store unreachable: judging with this replica's reservations only");
        }
    }

    /// A store call succeeded.
    pub(super) fn store_answered(&self) {
        if !self
            .store_up
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!("placement store reachable: reservations shared again");
        }
    }

    /// Keeps pod `key`'s request for its binding, here and in the store.
    async fn remember(&self, key: &str, request: PodRequest) {
        if let Some(shared) = &self.shared {
            match shared.remember(key, &request).await {
                Ok(()) => self.store_answered(),
                Err(e) => self.store_failed(&e),
            }
        }
        let now = self.clock.now();
        let mut pods = self.pods.lock();
        if pods.len() >= PODS_KEPT {
            pods.retain(|_, (_, seen)| now.saturating_since(*seen) <= POD_TTL);
            if pods.len() >= PODS_KEPT
                && let Some(oldest) = pods
                    .iter()
                    .min_by_key(|(_, (_, seen))| *seen)
                    .map(|(k, _)| k.clone())
            {
                pods.remove(&oldest);
            }
        }
        pods.insert(key.to_owned(), (request, now));
    }
}

/// Judgements of one binding at most, while other replicas keep changing
/// its node's reservations.
const BIND_TRIES: usize = 3;

/// The node names an extender call asks about.
fn candidate_names(args: &ExtenderArgs) -> Vec<String> {
    match (&args.nodenames, &args.nodes) {
        (Some(names), _) => names.clone(),
        (None, Some(list)) => list
            .items
            .iter()
            .filter_map(|n| super::k8s::node_name(n).map(str::to_owned))
            .collect(),
        (None, None) => Vec::new(),
    }
}

/// Misfits as one message.
fn joined(refusals: &[Misfit]) -> String {
    refusals
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
