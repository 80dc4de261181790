//! `[[tenants]]`: names, API keys (hashed on the spot), weights, admission
//! limits and SLOs.
//!
//! Invariants checked here: names unique and label-safe, every API key
//! (clear, digest or from the environment) belongs to exactly one tenant,
//! and no clear-text key survives past this module.

use std::collections::HashMap;
use std::time::Duration;

use sha2::{Digest, Sha256};
use toml::de::DeValue;

use super::EnvLookup;
use super::reader::{Reader, Table, Value, Zero};
use crate::config::policy::{OnLate, Priority, Slo, TenantPolicy};

pub(super) const TENANT_KEYS: &[&str] = &[
    "name",
    "api_keys",
    "api_key_sha256",
    "api_key_env",
    "weight",
    "priority",
    "rate",
    "burst",
    "max_concurrency",
    "gpu_seconds_per_hour",
    "slo",
    "on_late",
    "adapters",
    "prefix_cache",
];
const SLO_KEYS: &[&str] = &["ttft", "e2e"];
const PRIORITIES: &[(&str, Priority)] = &[
    ("interactive", Priority::Interactive),
    ("batch", Priority::Batch),
];
const ON_LATE: &[(&str, OnLate)] = &[
    ("refuse", OnLate::Refuse),
    ("shed", OnLate::Shed),
    ("best_effort", OnLate::BestEffort),
    ("serve", OnLate::Serve),
];

/// Where each tenant name and key digest was first seen.
#[derive(Default)]
struct Seen {
    names: HashMap<String, String>,
    /// Digest → (tenant name, tenant path, key path).
    keys: HashMap<[u8; 32], (String, String, String)>,
}

/// Reads the optional `tenants` array.
pub(super) fn read_tenants(
    r: &mut Reader<'_>,
    root: &Table<'_, '_>,
    trusts_header: bool,
    env: EnvLookup<'_>,
) -> Vec<TenantPolicy> {
    let Some(tables) = r.opt(root, "tenants", Reader::tables) else {
        return Vec::new();
    };
    let mut seen = Seen::default();
    tables
        .iter()
        .filter_map(|(_, t)| read_tenant(r, t, trusts_header, env, &mut seen))
        .collect()
}

fn read_tenant(
    r: &mut Reader<'_>,
    t: &Table<'_, '_>,
    trusts_header: bool,
    env: EnvLookup<'_>,
    seen: &mut Seen,
) -> Option<TenantPolicy> {
    r.check_keys(t, TENANT_KEYS);
    let name = r.req(t, "name", "a unique [a-z0-9_-]+ name", read_tenant_name);
    if let (Some(name), Some((value, path))) = (&name, t.get("name")) {
        if let Some(first) = seen.names.get(name) {
            r.error(
                value.span(),
                &path,
                format!("tenant \"{name}\" is already defined ({first}); names must be unique"),
            );
        } else {
            seen.names.insert(name.clone(), t.path.clone());
        }
    }
    let key_digests = read_keys(r, t, name.as_deref().unwrap_or("?"), env, seen);
    let has_key_settings = ["api_keys", "api_key_sha256", "api_key_env"]
        .iter()
        .any(|k| t.has(k));
    if !has_key_settings && !trusts_header {
        r.error(
            t.span.clone(),
            &t.path,
            "tenant has no API key: set `api_keys`, `api_key_sha256` or `api_key_env` \
             (or `server.trust_tenant_header` to name tenants by header)",
        );
    }
    let weight = r.opt(t, "weight", Reader::positive).unwrap_or(1.0);
    let priority = r
        .opt(t, "priority", |r, v, p| r.choice(v, p, PRIORITIES))
        .unwrap_or(Priority::Interactive);
    let rate = r.opt(t, "rate", Reader::positive);
    let burst = r.opt(t, "burst", read_burst);
    let burst = match (rate, burst, t.get("burst")) {
        (None, Some(_), Some((value, path))) if !t.has("rate") => {
            r.error(
                value.span(),
                &path,
                "`burst` is the capacity of the request-rate bucket; it needs `rate` too",
            );
            None
        }
        (Some(rate), None, _) => Some(rate.max(1.0)),
        (_, burst, _) => burst,
    };
    let max_concurrency = r.opt(t, "max_concurrency", Reader::positive_int);
    let gpu_seconds_per_hour = r.opt(t, "gpu_seconds_per_hour", Reader::positive);
    let slo = r.opt(t, "slo", read_slo).unwrap_or(Slo {
        ttft: DEFAULT_TTFT,
        e2e: DEFAULT_E2E,
    });
    let on_late = r
        .opt(t, "on_late", |r, v, p| r.choice(v, p, ON_LATE))
        .unwrap_or(OnLate::default_for(priority));
    let adapters = r.opt(t, "adapters", |r, v, p| r.array(v, p, Reader::non_empty));
    let cache_namespace = match r.opt(t, "prefix_cache", read_prefix_cache) {
        Some(ns) => ns,
        None => name.as_ref().map(|n| format!("tenant:{n}")),
    };
    Some(TenantPolicy {
        name: name?,
        key_digests,
        weight,
        priority,
        rate,
        burst,
        max_concurrency,
        gpu_seconds_per_hour,
        slo,
        on_late,
        adapters,
        cache_namespace,
    })
}

/// `prefix_cache`: `"private"` (the tenant's own namespace; `None` here,
/// filled by the caller), `"shared"` (`Some(None)`: no namespace) or
/// `"group:<name>"`.
fn read_prefix_cache(r: &mut Reader<'_>, v: &Value<'_>, path: &str) -> Option<Option<String>> {
    let s = r.string(v, path)?;
    match s.as_str() {
        "private" => None,
        "shared" => Some(None),
        _ if s.strip_prefix("group:").is_some_and(|g| !g.is_empty()) => Some(Some(s)),
        _ => {
            r.error(
                v.span(),
                path,
                format!(
                    "\"{s}\" is not a prefix-cache namespace: \"private\" (the tenant's own), \"shared\" (no salt: every shared tenant's prompts share the engines' caches) or \"group:<name>\""
                ),
            );
            None
        }
    }
}

const DEFAULT_TTFT: Duration = Duration::from_secs(1);
const DEFAULT_E2E: Duration = Duration::from_secs(30);

/// `[a-z0-9_-]+`: the name becomes a metric label value.
fn read_tenant_name(r: &mut Reader<'_>, v: &Value<'_>, path: &str) -> Option<String> {
    let name = r.string(v, path)?;
    let is_ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-';
    if name.is_empty() || !name.chars().all(is_ok) {
        r.error(
            v.span(),
            path,
            format!(
                "invalid tenant name \"{name}\"; expected lowercase letters, digits, `_` and `-` \
                 (it becomes a metric label)"
            ),
        );
        return None;
    }
    Some(name)
}

/// A positive bucket capacity of at least one request.
fn read_burst(r: &mut Reader<'_>, v: &Value<'_>, path: &str) -> Option<f64> {
    let n = r.positive(v, path)?;
    if n < 1.0 {
        r.error(
            v.span(),
            path,
            format!(
                "must be at least 1 (a bucket that cannot hold one request refuses all), found {n}"
            ),
        );
        return None;
    }
    Some(n)
}

fn read_slo(r: &mut Reader<'_>, v: &Value<'_>, path: &str) -> Option<Slo> {
    let t = r.table(v, path)?;
    r.check_keys(&t, SLO_KEYS);
    let ttft = r.opt(&t, "ttft", |r, v, p| r.duration(v, p, Zero::Refused));
    let e2e = r.opt(&t, "e2e", |r, v, p| r.duration(v, p, Zero::Refused));
    let slo = Slo {
        ttft: ttft.unwrap_or(DEFAULT_TTFT),
        e2e: e2e.unwrap_or(DEFAULT_E2E),
    };
    if slo.ttft > slo.e2e {
        let (span, at) = match t.get("ttft").or_else(|| t.get("e2e")) {
            Some((value, at)) => (value.span(), at),
            None => (t.span.clone(), t.path.clone()),
        };
        r.error(
            span,
            &at,
            format!(
                "slo.ttft ({}) is longer than slo.e2e ({}); the first token cannot come after the last",
                humantime::format_duration(slo.ttft),
                humantime::format_duration(slo.e2e)
            ),
        );
    }
    Some(slo)
}

/// Collects the digests of `api_keys`, `api_key_sha256` and `api_key_env`,
/// reporting any key already used (by this tenant or another).
fn read_keys(
    r: &mut Reader<'_>,
    t: &Table<'_, '_>,
    tenant: &str,
    env: EnvLookup<'_>,
    seen: &mut Seen,
) -> Vec<[u8; 32]> {
    // (digest, span, path) in key-path order.
    let mut found: Vec<([u8; 32], std::ops::Range<usize>, String)> = Vec::new();
    if let Some((value, path)) = t.get("api_keys") {
        r.array(value, &path, |r, v, p| {
            let key = r.string(v, p)?;
            if key.is_empty() {
                r.error(v.span(), p, "an API key must not be empty");
                return None;
            }
            found.push((sha256(&key), v.span(), p.to_owned()));
            Some(())
        });
    }
    for_one_or_many(r, t, "api_key_sha256", |r, v, p| {
        let Some(hex) = r.string(v, p) else {
            return;
        };
        match parse_hex_digest(hex.trim()) {
            Some(digest) => found.push((digest, v.span(), p.to_owned())),
            None => r.error(
                v.span(),
                p,
                "expected a SHA-256 digest: 64 hex characters \
                 (e.g. from `printf %s \"$KEY\" | sha256sum`)",
            ),
        }
    });
    for_one_or_many(r, t, "api_key_env", |r, v, p| {
        let Some(var) = r.non_empty(v, p) else {
            return;
        };
        match env(&var).map(|key| key.trim().to_owned()) {
            Some(key) if !key.is_empty() => found.push((sha256(&key), v.span(), p.to_owned())),
            Some(_) => r.error(
                v.span(),
                p,
                format!("environment variable `{var}` is empty"),
            ),
            None => r.error(
                v.span(),
                p,
                format!("environment variable `{var}` is not set (or not valid UTF-8)"),
            ),
        }
    });
    let mut digests = Vec::with_capacity(found.len());
    for (digest, span, path) in found {
        if let Some((owner, owner_path, first)) = seen.keys.get(&digest) {
            // Never echo the key: the message names only where it was seen.
            let whose = if *owner_path == t.path {
                "this tenant".to_owned()
            } else {
                format!("tenant \"{owner}\"")
            };
            r.error(
                span,
                &path,
                format!(
                    "this API key is already used by {whose} ({first}); each key names one tenant"
                ),
            );
        } else {
            seen.keys
                .insert(digest, (tenant.to_owned(), t.path.clone(), path));
            digests.push(digest);
        }
    }
    digests
}

/// Reads `key` as one string or an array of strings, calling `each` on every
/// element with its path.
fn for_one_or_many<'a, 'i>(
    r: &mut Reader<'_>,
    t: &Table<'a, 'i>,
    key: &str,
    mut each: impl FnMut(&mut Reader<'_>, &'a Value<'i>, &str),
) {
    let Some((value, path)) = t.get(key) else {
        return;
    };
    match value.get_ref() {
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                each(r, item, &format!("{path}[{i}]"));
            }
        }
        _ => each(r, value, &path),
    }
}

/// SHA-256 of a clear-text key, the only form Fairway keeps.
pub(crate) fn sha256(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// 64 hex characters (either case) into 32 bytes.
fn parse_hex_digest(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(out)
}
