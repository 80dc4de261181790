//! The policy in force and what is derived from it (key table, pool map,
//! backend addresses, metric series), swapped whole on reload and loaded
//! once per request.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::config::{BackendTarget, Policy};
use crate::core::ids::{BackendId, PoolId, TenantId};
use crate::core::scheduler::Scheduler;
use crate::core::spec::Api;
use crate::protocol::error::ApiError;
use crate::telemetry::metrics::{Metrics, Series, SloTargets};

/// The policy in force plus what is derived from it, swapped as one value.
#[derive(Debug)]
pub struct Live {
    pub policy: Arc<Policy>,
    /// SHA-256 of each API key → its tenant.
    pub keys: HashMap<[u8; 32], TenantId>,
    /// Tenant names → ids (for the trusted tenant header).
    pub tenant_names: HashMap<String, TenantId>,
    /// Per tenant id: index into `policy.tenants` (None for "default").
    pub tenant_policy: HashMap<TenantId, usize>,
    /// Model → its scheduler pools and index into `policy.pools`.
    pub pools: HashMap<String, ModelPools>,
    /// LoRA adapter → its base model, as the policy lists them.
    pub adapters: HashMap<String, String>,
    /// Backend id → `host:port` to connect to.
    pub addresses: HashMap<BackendId, crate::gateway::upstream::Address>,
    /// Backend id → its name (the access log's and spans' `backend`).
    pub backend_names: HashMap<BackendId, Arc<str>>,
    /// Backend id → the model's name on it, where it is not the pool's.
    pub served_models: HashMap<BackendId, String>,
    /// The tenant of every request when no tenants are declared.
    pub default_tenant: Option<TenantId>,
    /// Metric series by `[tenant][pool]`: `policy.tenants` by index, then
    /// "default" (undeclared tenants); `policy.pools` by index.
    pub series: Vec<Vec<Arc<Series>>>,
    /// By `policy.tenants` index: the `cache_salt` of its requests that
    /// bring none (`gateway::salt`, computed once per policy: the one a
    /// request usually gets); `None` where the tenant shares the caches.
    pub salts: Vec<Option<Arc<str>>>,
    /// Usage windows by tenant, indexed as `series`.
    pub usage: Vec<Arc<parking_lot::Mutex<crate::telemetry::usage::TenantWindows>>>,
    /// Hex SHA-256 of the policy file text, and when it was loaded (unix seconds).
    pub source_hash: String,
    pub loaded_at_unix: u64,
}

/// A model's scheduler pools, one per protocol its backends speak.
#[derive(Clone, Copy, Debug)]
pub struct ModelPools {
    /// Index into `policy.pools`.
    pub index: usize,
    pub openai: Option<PoolId>,
    pub triton: Option<PoolId>,
}

impl Live {
    /// The scheduler pool of `model`'s backends that speak `api`, and the
    /// model's index in `policy.pools`: 404 for a model the policy does
    /// not have, or does not serve over `api`.
    pub fn pool(&self, model: &str, api: Api) -> Result<(PoolId, usize), ApiError> {
        let models = self
            .pools
            .get(model)
            .ok_or_else(|| ApiError::UnknownModel(model.to_owned()))?;
        let pool = models
            .get(api)
            .ok_or_else(|| ApiError::NotServedOver(model.to_owned(), api))?;
        Ok((pool, models.index))
    }
}

impl ModelPools {
    /// The pool of the backends that speak `api`.
    pub fn get(&self, api: Api) -> Option<PoolId> {
        match api {
            Api::OpenAi => self.openai,
            Api::Triton => self.triton,
        }
    }
}

/// Builds the derived view of a policy against the scheduler's ids.
pub fn derive_live(
    policy: Arc<Policy>,
    sched: &Scheduler,
    metrics: &Metrics,
    sim: &HashMap<String, String>,
    source: &str,
    loaded_at_unix: u64,
) -> Live {
    let mut keys = HashMap::new();
    let mut tenant_names = HashMap::new();
    let mut tenant_policy = HashMap::new();
    for (i, t) in policy.tenants.iter().enumerate() {
        if let Some(id) = sched.tenant(&t.name) {
            tenant_names.insert(t.name.clone(), id);
            tenant_policy.insert(id, i);
            for d in &t.key_digests {
                keys.insert(*d, id);
            }
        }
    }
    let mut pools = HashMap::new();
    let mut adapters = HashMap::new();
    let mut addresses = HashMap::new();
    let mut served_models = HashMap::new();
    let mut backend_names = HashMap::new();
    for (i, p) in policy.pools.iter().enumerate() {
        pools.insert(
            p.model.clone(),
            ModelPools {
                index: i,
                openai: sched.pool_for(&p.model, Api::OpenAi),
                triton: sched.pool_for(&p.model, Api::Triton),
            },
        );
        for a in &p.adapters {
            adapters.insert(a.clone(), p.model.clone());
        }
        for b in &p.backends {
            let Some(bid) = sched.backend(&b.name) else {
                continue;
            };
            backend_names.insert(bid, Arc::from(sched.backend_name(bid)));
            let authority = match &b.target {
                BackendTarget::Url { authority } => Some(authority.clone()),
                BackendTarget::Sim { .. } => sim.get(&b.name).cloned(),
            };
            // (A URL's authority was checked when the policy was read.)
            if let Some(a) = authority.and_then(|a| crate::gateway::upstream::Address::parse(&a)) {
                addresses.insert(bid, a);
            }
            if let Some(m) = &b.served_model {
                served_models.insert(bid, m.clone());
            }
        }
    }
    let default_tenant = if policy.tenants.is_empty() {
        sched.tenant("default")
    } else {
        None
    };
    let by_tenant = policy.histograms_by_tenant();
    let series = policy
        .tenants
        .iter()
        .map(|t| {
            let slo = SloTargets {
                ttft: Some(t.slo.ttft.as_secs_f64()),
                e2e: Some(t.slo.e2e.as_secs_f64()),
            };
            (t.name.as_str(), slo)
        })
        .chain([("default", SloTargets::default())])
        .map(|(t, slo)| {
            let pools = policy.pools.iter();
            pools
                .map(|p| metrics.series(t, &p.model, slo, by_tenant))
                .collect()
        })
        .collect();
    let usage = policy
        .tenants
        .iter()
        .map(|t| t.name.as_str())
        .chain(["default"])
        .map(|t| metrics.usage(t))
        .collect();
    let salts = policy
        .tenants
        .iter()
        .map(|t| {
            let namespace = t.cache_namespace.as_deref()?;
            let secret = policy.server.cache_salt_secret.as_ref();
            Some(super::salt::salt(secret, namespace, None).into())
        })
        .collect();
    Live {
        policy,
        keys,
        series,
        salts,
        usage,
        tenant_names,
        tenant_policy,
        pools,
        adapters,
        addresses,
        backend_names,
        served_models,
        default_tenant,
        source_hash: crate::hex::hex(&Sha256::digest(source.as_bytes())),
        loaded_at_unix,
    }
}
