//! `[[pools]]` and `[[pools.backends]]`: models, routing, backend targets.
//!
//! Invariants checked here: one pool per model, at least one backend per
//! pool, backend names unique across the whole policy, every backend has
//! exactly one of `url` and `sim`.

use std::collections::HashMap;
use std::time::Duration;

use super::prefix::{check_kv_events, read_kv_events, read_prefix, read_tokenizer};
use super::reader::{Reader, Table, Value, Zero};
use super::sim::read_sim;
use super::url::{parse_http_url, split_http_url};
use crate::config::policy::{
    BackendPolicy, BackendTarget, HttpEndpoint, MetricsDialect, OutlierPolicy, PoolPolicy, Strategy,
};
use crate::core::spec::Api;

pub(super) const POOL_KEYS: &[&str] = &[
    "model",
    "routing",
    "timeout",
    "kv_high_watermark",
    "ttft_p99_threshold",
    "eject_after_failures",
    "ejection_time",
    "max_ejection_time",
    "max_ejected_share",
    "success_rate_gap",
    "success_rate_min_requests",
    "success_rate_interval",
    "adapters",
    "adapter_affinity",
    "prefix_block_tokens",
    "prefix_index_blocks",
    "prefix_ttl",
    "tokenizer",
    "tokenizer_config",
    "chat_template",
    "backends",
];
pub(super) const BACKEND_KEYS: &[&str] = &[
    "name",
    "url",
    "sim",
    "gpus",
    "max_inflight",
    "metrics",
    "metrics_url",
    "health_path",
    "kv_tokens",
    "protocol",
    "served_model",
    "kv_events",
];
const PROTOCOLS: &[(&str, Api)] = &[("openai", Api::OpenAi), ("triton", Api::Triton)];
const STRATEGIES: &[(&str, Strategy)] = &[
    ("least_outstanding", Strategy::LeastOutstanding),
    ("prefix_aware", Strategy::PrefixAware),
    ("p2c", Strategy::P2c),
    ("round_robin", Strategy::RoundRobin),
    ("random", Strategy::Random),
    ("pack", Strategy::Pack),
];
const DIALECTS: &[(&str, MetricsDialect)] = &[
    ("vllm", MetricsDialect::Vllm),
    ("triton", MetricsDialect::Triton),
    ("trtllm", MetricsDialect::Trtllm),
    ("sglang", MetricsDialect::Sglang),
    ("llamacpp", MetricsDialect::Llamacpp),
    ("agent", MetricsDialect::Agent),
    ("none", MetricsDialect::None),
];
/// KV capacity assumed for a remote backend until its reading says otherwise.
const DEFAULT_KV_TOKENS: u64 = 65_536;

/// Where names and models were first seen, for duplicate reports.
#[derive(Default)]
struct Seen {
    models: HashMap<String, String>,
    backend_names: HashMap<String, String>,
    /// Adapter names, with the value's span and path.
    adapters: Vec<(String, std::ops::Range<usize>, String)>,
}

/// Reads the required, non-empty `pools` array.
pub(super) fn read_pools(r: &mut Reader<'_>, root: &Table<'_, '_>) -> Vec<PoolPolicy> {
    let Some((value, path)) = root.get("pools") else {
        r.error(
            root.span.clone(),
            "pools",
            "missing [[pools]]: at least one pool (a model and its backends) is required",
        );
        return Vec::new();
    };
    let Some(tables) = r.tables(value, &path) else {
        return Vec::new();
    };
    if tables.is_empty() {
        r.error(value.span(), &path, "at least one pool is required");
    }
    let mut seen = Seen::default();
    let pools = tables
        .iter()
        .filter_map(|(_, t)| read_pool(r, t, &mut seen))
        .collect();
    // An adapter name resolves to one pool: it is no model and no other
    // pool's adapter.
    let mut adapters: HashMap<&str, &str> = HashMap::new();
    for (name, span, path) in &seen.adapters {
        if let Some(pool) = seen.models.get(name) {
            r.error(
                span.clone(),
                path,
                format!("\"{name}\" is a model with its own pool ({pool}), not an adapter"),
            );
        } else if let Some(first) = adapters.insert(name, path) {
            r.error(
                span.clone(),
                path,
                format!(
                    "adapter \"{name}\" is already listed ({first}); an adapter belongs to one pool"
                ),
            );
        }
    }
    pools
}

fn read_pool(r: &mut Reader<'_>, t: &Table<'_, '_>, seen: &mut Seen) -> Option<PoolPolicy> {
    r.check_keys(t, POOL_KEYS);
    let model = r.req(
        t,
        "model",
        "the model name clients request",
        Reader::non_empty,
    );
    if let (Some(model), Some((value, path))) = (&model, t.get("model")) {
        if let Some(first) = seen.models.get(model) {
            r.error(
                value.span(),
                &path,
                format!(
                    "model \"{model}\" already has a pool ({first}); put all its backends in one pool"
                ),
            );
        } else {
            seen.models.insert(model.clone(), t.path.clone());
        }
    }
    let routing = r.opt(t, "routing", |r, v, p| r.choice(v, p, STRATEGIES));
    let timeout = r
        .opt(t, "timeout", |r, v, p| r.duration(v, p, Zero::Refused))
        .unwrap_or(Duration::from_secs(60));
    let kv_high_watermark = r.opt(t, "kv_high_watermark", read_fraction).unwrap_or(0.8);
    let ttft_p99_threshold = r
        .opt(t, "ttft_p99_threshold", |r, v, p| {
            r.duration(v, p, Zero::Refused)
        })
        .unwrap_or(Duration::from_millis(150));
    let outlier = OutlierPolicy {
        eject_after_failures: r
            .opt(t, "eject_after_failures", Reader::non_negative_int)
            .unwrap_or(5),
        ejection_time: r
            .opt(t, "ejection_time", |r, v, p| {
                r.duration(v, p, Zero::Refused)
            })
            .unwrap_or(Duration::from_secs(10)),
        max_ejection_time: r
            .opt(t, "max_ejection_time", |r, v, p| {
                r.duration(v, p, Zero::Refused)
            })
            .unwrap_or(Duration::from_secs(300)),
        max_ejected_share: r.opt(t, "max_ejected_share", read_fraction).unwrap_or(0.5),
        success_rate_gap: r.opt(t, "success_rate_gap", read_fraction).unwrap_or(0.3),
        success_rate_min_requests: r
            .opt(t, "success_rate_min_requests", Reader::positive_int)
            .unwrap_or(20),
        success_rate_interval: r
            .opt(t, "success_rate_interval", |r, v, p| {
                r.duration(v, p, Zero::Refused)
            })
            .unwrap_or(Duration::from_secs(10)),
    };
    let adapters = r
        .opt(t, "adapters", |r, v, p| {
            r.array(v, p, |r, v, p| {
                let name = r.non_empty(v, p)?;
                seen.adapters.push((name.clone(), v.span(), p.to_owned()));
                Some(name)
            })
        })
        .unwrap_or_default();
    let adapter_affinity = r
        .opt(t, "adapter_affinity", Reader::boolean)
        .unwrap_or(true);
    let prefix = read_prefix(r, t);
    let tokenizer = read_tokenizer(r, t);
    let model_name = model.clone().unwrap_or_default();
    let backends = match t.get("backends") {
        None => {
            r.error(
                t.span.clone(),
                &t.child("backends"),
                "a pool needs at least one [[pools.backends]]",
            );
            Vec::new()
        }
        Some((value, path)) => {
            let tables = r.tables(value, &path).unwrap_or_default();
            if tables.is_empty() && matches!(value.get_ref(), toml::de::DeValue::Array(_)) {
                r.error(
                    value.span(),
                    &path,
                    "a pool needs at least one [[pools.backends]]",
                );
            }
            tables
                .iter()
                .filter_map(|(i, b)| read_backend(r, b, *i, &model_name, seen))
                .collect()
        }
    };
    // Prefix-aware by default where the backends speak OpenAI's protocol
    // (approximate mode without a tokenizer): it costs nothing on prompts
    // that share nothing (docs/benchmarks/2026-12-07-prefix.md); a
    // Triton pool routes on load.
    let routing = routing.unwrap_or(if backends.iter().all(|b| b.protocol == Api::OpenAi) {
        Strategy::PrefixAware
    } else {
        Strategy::LeastOutstanding
    });
    check_kv_events(r, t, routing, &backends);
    Some(PoolPolicy {
        model: model?,
        routing,
        timeout,
        kv_high_watermark,
        ttft_p99_threshold,
        outlier,
        adapters,
        adapter_affinity,
        prefix,
        tokenizer,
        backends,
    })
}

/// A number in (0, 1].
fn read_fraction(r: &mut Reader<'_>, v: &Value<'_>, path: &str) -> Option<f64> {
    let n = r.number(v, path)?;
    if n <= 0.0 || n > 1.0 {
        r.error(
            v.span(),
            path,
            format!("must be greater than 0 and at most 1 (a fraction of the KV cache), found {n}"),
        );
        return None;
    }
    Some(n)
}

fn read_backend(
    r: &mut Reader<'_>,
    t: &Table<'_, '_>,
    index: usize,
    model: &str,
    seen: &mut Seen,
) -> Option<BackendPolicy> {
    r.check_keys(t, BACKEND_KEYS);
    let target = match (t.get("url"), t.get("sim")) {
        (Some((url, url_path)), Some((sim, path))) => {
            r.error(
                sim.span(),
                &path,
                "a backend has either `url` (a remote engine) or `sim` (a simulated one), not both",
            );
            // Still check both, so their own mistakes are reported now too.
            read_url(r, url, &url_path);
            read_sim(r, sim, &path);
            None
        }
        (None, None) => {
            r.error(
                t.span.clone(),
                &t.path,
                "a backend needs `url = \"http://host:port\"` or `sim = { … }`",
            );
            None
        }
        (Some((url, path)), None) => {
            read_url(r, url, &path).map(|authority| BackendTarget::Url { authority })
        }
        (None, Some((sim, path))) => {
            read_sim(r, sim, &path).map(|params| BackendTarget::Sim { params })
        }
    };
    let explicit_name = r.opt(t, "name", Reader::non_empty);
    let gpus = r.opt(t, "gpus", Reader::positive_int).unwrap_or(1);
    let max_inflight = r.opt(t, "max_inflight", Reader::positive_int).unwrap_or(64);
    let protocol = r
        .opt(t, "protocol", |r, v, p| r.choice(v, p, PROTOCOLS))
        .unwrap_or(Api::OpenAi);
    let served_model = r.opt(t, "served_model", |r, v, p| {
        let name = r.non_empty(v, p)?;
        // It goes into the backend's URL path (`/v2/models/{name}/…`).
        if name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            Some(name)
        } else {
            r.error(
                v.span(),
                p,
                "a served model name is letters, digits, `-`, `_` and `.` (it goes into the backend's URL path)",
            );
            None
        }
    });
    let metrics = r
        .opt(t, "metrics", |r, v, p| r.choice(v, p, DIALECTS))
        .unwrap_or(match protocol {
            Api::Triton => MetricsDialect::Triton,
            Api::OpenAi => MetricsDialect::Vllm,
        });
    let metrics_url = r.opt(t, "metrics_url", read_endpoint);
    let health_path =
        r.opt(t, "health_path", read_path)
            .unwrap_or_else(|| match (protocol, metrics) {
                (Api::Triton, _) => "/v2/health/ready".to_owned(),
                // Triton's OpenAI-compatible frontend, which serves Triton's
                // metrics and its own readiness route.
                (Api::OpenAi, MetricsDialect::Triton) => "/health/ready".to_owned(),
                _ => "/health".to_owned(),
            });
    if metrics == MetricsDialect::Agent && metrics_url.is_none() && t.get("metrics_url").is_none() {
        r.error(
            t.span.clone(),
            &t.path,
            "`metrics = \"agent\"` needs `metrics_url`, the address of the `fairway agent` \
             beside the engine, e.g. \"http://10.0.0.5:9400/reading\"",
        );
    }
    let kv_tokens = r.opt(t, "kv_tokens", Reader::positive_int);
    let kv_events = r.opt(t, "kv_events", read_kv_events);
    let target = target?;
    if kv_events.as_ref().is_some_and(|k| k.endpoint.is_empty())
        && matches!(target, BackendTarget::Url { .. })
        && let Some((v, path)) = t.get("kv_events")
    {
        r.error(
            v.span(),
            &path,
            "`kv_events = true` is for a simulated backend (`sim = { … }`); a remote engine's \
             needs its publisher's address, e.g. \"tcp://10.0.0.5:5557\"",
        );
    }
    let name = explicit_name.clone().unwrap_or_else(|| match &target {
        BackendTarget::Url { authority } => authority.clone(),
        BackendTarget::Sim { .. } => format!("{model}-sim-{index}"),
    });
    check_unique_name(r, t, &name, explicit_name.is_some(), seen);
    let kv_tokens = kv_tokens.unwrap_or(match &target {
        BackendTarget::Sim { params } => params.kv_tokens,
        BackendTarget::Url { .. } => DEFAULT_KV_TOKENS,
    });
    Some(BackendPolicy {
        name,
        target,
        gpus,
        max_inflight,
        metrics,
        metrics_url,
        health_path,
        kv_tokens,
        protocol,
        served_model,
        kv_events,
    })
}

fn check_unique_name(
    r: &mut Reader<'_>,
    t: &Table<'_, '_>,
    name: &str,
    is_explicit: bool,
    seen: &mut Seen,
) {
    let Some(first) = seen.backend_names.get(name) else {
        seen.backend_names.insert(name.to_owned(), t.path.clone());
        return;
    };
    let at = if is_explicit { "name" } else { "url" };
    let (span, path) = match t.get(at).or_else(|| t.get("sim")) {
        Some((value, path)) => (value.span(), path),
        None => (t.span.clone(), t.path.clone()),
    };
    let message = if is_explicit {
        format!("backend name \"{name}\" is already used by {first}; names must be unique")
    } else {
        format!(
            "backend name \"{name}\" (the default, from its address) is already used by {first}; \
             set `name` to tell them apart"
        )
    };
    r.error(span, &path, message);
}

/// `http://host:port` with no path beyond `/`; returns `host:port`.
fn read_url(r: &mut Reader<'_>, v: &Value<'_>, path: &str) -> Option<String> {
    let url = r.string(v, path)?;
    match parse_http_url(url.trim()) {
        Ok(authority) => Some(authority),
        Err(why) => {
            r.error(
                v.span(),
                path,
                format!("invalid backend url \"{url}\": {why}"),
            );
            None
        }
    }
}

/// `http://host:port/path` for the scrape target.
fn read_endpoint(r: &mut Reader<'_>, v: &Value<'_>, path: &str) -> Option<HttpEndpoint> {
    let url = r.string(v, path)?;
    match split_http_url(url.trim()) {
        Ok((authority, tail)) if tail.starts_with('/') && tail.len() > 1 => Some(HttpEndpoint {
            authority,
            path: tail.to_owned(),
        }),
        Ok(_) => {
            r.error(
                v.span(),
                path,
                format!("invalid metrics url \"{url}\": it needs a path, e.g. \"http://10.0.0.5:8000/metrics\""),
            );
            None
        }
        Err(why) => {
            r.error(
                v.span(),
                path,
                format!("invalid metrics url \"{url}\": {why}"),
            );
            None
        }
    }
}

/// A request path: starts with `/`, printable ASCII without spaces.
fn read_path(r: &mut Reader<'_>, v: &Value<'_>, path: &str) -> Option<String> {
    let s = r.string(v, path)?;
    if s.starts_with('/') && s.chars().all(|c| c.is_ascii_graphic()) {
        Some(s)
    } else {
        r.error(
            v.span(),
            path,
            format!("invalid path \"{s}\": expected an absolute path such as \"/health\""),
        );
        None
    }
}
