//! Validation: walks the spanned TOML tree of a policy file and builds a
//! [`Policy`], reporting every problem at once with file, line, column and
//! key path.
//!
//! We walk the tree by hand rather than derive `Deserialize` because serde
//! stops at the first error; an operator fixing a file wants the whole list.
//! Invariant: a `Policy` comes out only when no error was recorded, and it
//! never holds a clear-text API key (only SHA-256 digests).

mod batch;
mod cluster;
mod pools;
mod prefix;
mod reader;
mod server;
mod sim;
mod tenants;
#[cfg(test)]
mod tests;
mod url;

use std::time::Duration;

use toml::de::DeTable;

use self::reader::{Reader, Table, Value, Zero};
use self::server::{read_server, read_tls};
use super::file::{ConfigError, parse_document};
use super::policy::{
    Discipline, OnStale, PlacementPolicy, Policy, PollerPolicy, PreemptionPolicy, PrefillCharge,
    QueuePolicy, TelemetryPolicy, TenantHistograms,
};

/// Looks an environment variable up; `None` when unset or not UTF-8.
pub type EnvLookup<'e> = &'e dyn Fn(&str) -> Option<String>;

/// Parses and validates a policy file's text; `file_name` labels the errors.
///
/// `api_key_env` references are read from the process environment.
pub fn parse_policy(source: &str, file_name: &str) -> Result<Policy, Vec<ConfigError>> {
    parse_policy_with_env(source, file_name, &|name| std::env::var(name).ok())
}

/// [`parse_policy`] with the environment supplied by the caller (tests, and
/// reload paths that want a snapshot of the environment).
pub fn parse_policy_with_env(
    source: &str,
    file_name: &str,
    env: EnvLookup<'_>,
) -> Result<Policy, Vec<ConfigError>> {
    let doc = parse_document(source, file_name)?;
    let mut r = Reader::new(source, file_name);
    let root = Table {
        table: doc.get_ref(),
        span: doc.span(),
        path: String::new(),
    };
    let policy = read_policy(&mut r, &root, env);
    if r.has_errors() {
        Err(r.into_errors())
    } else {
        Ok(policy)
    }
}

/// One line describing `policy`, as printed by `fairway check`.
pub fn summary(policy: &Policy) -> String {
    let backends: usize = policy.pools.iter().map(|p| p.backends.len()).sum();
    let simulated = policy
        .pools
        .iter()
        .flat_map(|p| &p.backends)
        .filter(|b| matches!(b.target, super::policy::BackendTarget::Sim { .. }))
        .count();
    let models: Vec<&str> = policy.pools.iter().map(|p| p.model.as_str()).collect();
    let tenants: Vec<&str> = policy.tenants.iter().map(|t| t.name.as_str()).collect();
    let models = listed(&models);
    let tenants = if tenants.is_empty() {
        "no tenants (auth off, every request is tenant \"default\")".to_owned()
    } else {
        format!(
            "{} {} ({})",
            tenants.len(),
            plural(tenants.len(), "tenant"),
            listed(&tenants)
        )
    };
    let simulated = if simulated > 0 {
        format!(", {simulated} simulated")
    } else {
        String::new()
    };
    format!(
        "{} {} ({}), {} {}{}, {}, discipline {}",
        policy.pools.len(),
        plural(policy.pools.len(), "pool"),
        models,
        backends,
        plural(backends, "backend"),
        simulated,
        tenants,
        policy.queue.discipline,
    )
}

/// Names shown in a summary: all of them up to [`NAMES_SHOWN`], else the
/// first ones and how many more (a policy of 10,000 tenants is one line
/// an operator can read).
fn listed(names: &[&str]) -> String {
    if names.len() <= NAMES_SHOWN {
        return names.join(", ");
    }
    format!(
        "{}, and {} more",
        names[..NAMES_SHOWN].join(", "),
        names.len() - NAMES_SHOWN
    )
}

/// Most names a summary lists.
const NAMES_SHOWN: usize = 10;

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        word.to_owned()
    } else {
        format!("{word}s")
    }
}

const ROOT_KEYS: &[&str] = &[
    "server",
    "poller",
    "queue",
    "preemption",
    "pools",
    "tenants",
    "telemetry",
    "cluster",
    "placement",
    "tenant_resources",
    "batch",
];
const PLACEMENT_KEYS: &[&str] = &[
    "max_free_fraction",
    "ttft_p99_threshold",
    "max_models_per_gpu",
    "shared_memory_fraction",
    "stale_after",
    "on_stale",
    "listen",
    "tls",
    "agents",
    "agents_dns",
    "poll_interval",
    "reservation_ttl",
];
const PREEMPTION_KEYS: &[&str] = &["enabled", "min_wait", "migration_threshold"];
const TELEMETRY_KEYS: &[&str] = &[
    "otlp_endpoint",
    "service_name",
    "fairness_window",
    "sample_ratio",
    "per_tenant_histograms",
];
/// `[queue] prefill_charge` spellings.
const PREFILL_CHARGES: &[(&str, PrefillCharge)] = &[
    ("uncached", PrefillCharge::Uncached),
    ("full", PrefillCharge::Full),
];

/// Default `[queue] in_flight_credit` (docs/policy.md says why).
pub const DEFAULT_IN_FLIGHT_CREDIT: f64 = 0.5;
/// Default `[queue] locality` (docs/policy.md says why).
pub const DEFAULT_LOCALITY: f64 = 1.0;
const POLLER_KEYS: &[&str] = &["interval", "timeout"];
const QUEUE_KEYS: &[&str] = &[
    "discipline",
    "max_wait",
    "max_queued_per_tenant",
    "output_token_weight",
    "in_flight_credit",
    "prefill_charge",
    "locality",
];
const DISCIPLINES: &[(&str, Discipline)] = &[
    ("fifo", Discipline::Fifo),
    ("priority", Discipline::Priority),
    ("wfq", Discipline::Wfq),
    ("drf", Discipline::Drf),
];

fn read_policy(r: &mut Reader<'_>, root: &Table<'_, '_>, env: EnvLookup<'_>) -> Policy {
    r.check_keys(root, ROOT_KEYS);
    let empty = DeTable::new();
    let server = section(r, root, "server", &empty);
    let poller = section(r, root, "poller", &empty);
    let queue = section(r, root, "queue", &empty);
    let telemetry = section(r, root, "telemetry", &empty);
    let preemption = section(r, root, "preemption", &empty);
    let placement = section(r, root, "placement", &empty);
    // Read by `load_policy`, which appends the resources as `[[tenants]]`.
    r.opt(root, "tenant_resources", |r, v, p| {
        r.array(v, p, Reader::non_empty)
    });
    let server = read_server(r, &server, env);
    let trusts_header = server.trust_tenant_header.is_some();
    Policy {
        poller: read_poller(r, &poller),
        queue: read_queue(r, &queue),
        preemption: read_preemption(r, &preemption),
        pools: pools::read_pools(r, root),
        tenants: tenants::read_tenants(r, root, trusts_header, env),
        telemetry: read_telemetry(r, &telemetry, env),
        cluster: cluster::read_cluster(r, root, env),
        batch: batch::read_batch(r, root),
        placement: read_placement(r, &placement),
        server,
    }
}

fn read_placement(r: &mut Reader<'_>, t: &Table<'_, '_>) -> PlacementPolicy {
    r.check_keys(t, PLACEMENT_KEYS);
    let d = PlacementPolicy::default();
    let fraction = |r: &mut Reader<'_>, v: &Value<'_>, p: &str| {
        let n = r.share(v, p)?;
        if n == 0.0 {
            r.error(v.span(), p, "must be greater than 0 and at most 1");
            return None;
        }
        Some(n)
    };
    PlacementPolicy {
        max_free_fraction: r
            .opt(t, "max_free_fraction", fraction)
            .unwrap_or(d.max_free_fraction),
        ttft_p99_threshold: r
            .opt(t, "ttft_p99_threshold", |r, v, p| {
                r.duration(v, p, Zero::Refused)
            })
            .unwrap_or(d.ttft_p99_threshold),
        max_models_per_gpu: r
            .opt(t, "max_models_per_gpu", Reader::positive_int)
            .unwrap_or(d.max_models_per_gpu),
        shared_memory_fraction: r
            .opt(t, "shared_memory_fraction", fraction)
            .unwrap_or(d.shared_memory_fraction),
        stale_after: r
            .opt(t, "stale_after", |r, v, p| r.duration(v, p, Zero::Refused))
            .unwrap_or(d.stale_after),
        on_stale: r
            .opt(t, "on_stale", |r, v, p| {
                r.choice(
                    v,
                    p,
                    &[("allow", OnStale::Allow), ("refuse", OnStale::Refuse)],
                )
            })
            .unwrap_or(d.on_stale),
        listen: r.opt(t, "listen", Reader::socket_addr).unwrap_or(d.listen),
        tls: r.opt(t, "tls", read_tls),
        agents: r
            .opt(t, "agents", |r, v, p| r.array(v, p, read_agent_url))
            .unwrap_or_default(),
        agents_dns: r
            .opt(t, "agents_dns", |r, v, p| r.array(v, p, read_host_port))
            .unwrap_or_default(),
        poll_interval: r
            .opt(t, "poll_interval", |r, v, p| {
                r.duration(v, p, Zero::Refused)
            })
            .unwrap_or(d.poll_interval),
        reservation_ttl: r
            .opt(t, "reservation_ttl", |r, v, p| {
                r.duration(v, p, Zero::Allowed)
            })
            .unwrap_or(d.reservation_ttl),
    }
}

/// An agent's base URL: `http://host:port`, nothing after.
fn read_agent_url(r: &mut Reader<'_>, v: &Value<'_>, path: &str) -> Option<String> {
    let s = r.non_empty(v, path)?;
    let ok = s
        .strip_prefix("http://")
        .map(|rest| rest.trim_end_matches('/'))
        .is_some_and(valid_host_port);
    if !ok {
        r.error(
            v.span(),
            path,
            format!("\"{s}\" is not an agent URL; expected http://host:port"),
        );
        return None;
    }
    Some(s.trim_end_matches('/').to_owned())
}

/// A `host:port` to resolve.
fn read_host_port(r: &mut Reader<'_>, v: &Value<'_>, path: &str) -> Option<String> {
    let s = r.non_empty(v, path)?;
    if !valid_host_port(&s) {
        r.error(
            v.span(),
            path,
            format!(
                "\"{s}\" is not host:port, e.g. \"fairway-agent.fairway.svc.cluster.local:9400\""
            ),
        );
        return None;
    }
    Some(s)
}

fn valid_host_port(s: &str) -> bool {
    s.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.contains(['/', '@', ' '])
            && port.parse::<u16>().is_ok_and(|p| p != 0)
    })
}

/// The OpenTelemetry variable naming a collector when the policy does not:
/// the one variable the policy reads that it does not name itself.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

fn read_telemetry(r: &mut Reader<'_>, t: &Table<'_, '_>, env: EnvLookup<'_>) -> TelemetryPolicy {
    r.check_keys(t, TELEMETRY_KEYS);
    let endpoint = |url: &str| {
        url::parse_http_url(url.trim()).map_err(|why| {
            format!(
                "invalid OTLP endpoint \"{url}\": {why} (the collector's OTLP/HTTP port, usually 4318)"
            )
        })
    };
    let otlp_endpoint = match r.opt(t, "otlp_endpoint", |r, v, p| {
        let url = r.string(v, p)?;
        endpoint(&url).map_err(|e| r.error(v.span(), p, e)).ok()
    }) {
        Some(e) => Some(e),
        // Checked like the key, so a bad variable stops the start with the
        // same message instead of failing every export.
        None if t.get("otlp_endpoint").is_none() => env(OTLP_ENDPOINT_ENV)
            .filter(|url| !url.trim().is_empty())
            .and_then(|url| {
                endpoint(&url)
                    .map_err(|e| {
                        r.error(t.span.clone(), &t.path, format!("{OTLP_ENDPOINT_ENV}: {e}"))
                    })
                    .ok()
            }),
        None => None,
    };
    TelemetryPolicy {
        otlp_endpoint,
        service_name: r
            .opt(t, "service_name", Reader::string)
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "fairway".to_owned()),
        fairness_window: r
            .opt(t, "fairness_window", |r, v, p| {
                let d = r.duration(v, p, Zero::Refused)?;
                if d < Duration::from_secs(1) {
                    r.error(v.span(), p, "must be at least 1s (it is sampled ten times)");
                    return None;
                }
                Some(d)
            })
            .unwrap_or(Duration::from_secs(10)),
        sample_ratio: r.opt(t, "sample_ratio", |r, v, p| {
            let x = r.number(v, p)?;
            if !(0.0..=1.0).contains(&x) {
                r.error(
                    v.span(),
                    p,
                    "must be between 0 and 1 (the share of new traces kept)",
                );
                return None;
            }
            Some(x)
        }),
        per_tenant_histograms: r
            .opt(t, "per_tenant_histograms", |r, v, path| {
                r.boolean_or(v, path, "auto")
            })
            .map_or(TenantHistograms::Auto, |set| match set {
                Some(true) => TenantHistograms::ByTenant,
                Some(false) => TenantHistograms::ByModel,
                None => TenantHistograms::Auto,
            }),
    }
}

/// The optional table `key` of the root, or an empty one (so defaults come
/// from the same code as explicit values).
fn section<'a, 'i>(
    r: &mut Reader<'_>,
    root: &Table<'a, 'i>,
    key: &str,
    empty: &'a DeTable<'i>,
) -> Table<'a, 'i> {
    r.opt(root, key, Reader::table).unwrap_or_else(|| Table {
        table: empty,
        span: root.span.clone(),
        path: key.to_owned(),
    })
}

fn read_poller(r: &mut Reader<'_>, t: &Table<'_, '_>) -> PollerPolicy {
    r.check_keys(t, POLLER_KEYS);
    let interval = r
        .opt(t, "interval", |r, v, p| r.duration(v, p, Zero::Refused))
        .unwrap_or(Duration::from_millis(250));
    PollerPolicy {
        interval,
        // One interval, but never under a second: a short interval is for
        // fresh readings, and a probe that misses a 25 ms deadline on a
        // busy node must not eject a healthy backend. A dead backend
        // (refused connection) is ejected at once whatever the timeout.
        timeout: r
            .opt(t, "timeout", |r, v, p| r.duration(v, p, Zero::Refused))
            .unwrap_or(interval.max(Duration::from_secs(1))),
    }
}

fn read_preemption(r: &mut Reader<'_>, t: &Table<'_, '_>) -> PreemptionPolicy {
    r.check_keys(t, PREEMPTION_KEYS);
    PreemptionPolicy {
        enabled: r.opt(t, "enabled", Reader::boolean).unwrap_or(true),
        min_wait: r
            .opt(t, "min_wait", |r, v, p| r.duration(v, p, Zero::Allowed))
            .unwrap_or(Duration::from_millis(250)),
        migration_threshold: r
            .opt(t, "migration_threshold", |r, v, p| {
                r.duration(v, p, Zero::Refused)
            })
            .unwrap_or(Duration::from_secs(300)),
    }
}

fn read_queue(r: &mut Reader<'_>, t: &Table<'_, '_>) -> QueuePolicy {
    r.check_keys(t, QUEUE_KEYS);
    QueuePolicy {
        discipline: r
            .opt(t, "discipline", |r, v, p| r.choice(v, p, DISCIPLINES))
            .unwrap_or(Discipline::Drf),
        max_wait: r
            .opt(t, "max_wait", |r, v, p| r.duration(v, p, Zero::Refused))
            .unwrap_or(Duration::from_secs(30)),
        max_queued_per_tenant: r
            .opt(t, "max_queued_per_tenant", Reader::positive_int)
            .unwrap_or(10_000),
        output_token_weight: r
            .opt(t, "output_token_weight", Reader::positive)
            .unwrap_or(1.0),
        in_flight_credit: r
            .opt(t, "in_flight_credit", Reader::share)
            .unwrap_or(DEFAULT_IN_FLIGHT_CREDIT),
        prefill_charge: r
            .opt(t, "prefill_charge", |r, v, p| {
                r.choice(v, p, PREFILL_CHARGES)
            })
            .unwrap_or(PrefillCharge::Full),
        locality: r
            .opt(t, "locality", |r, v, p| {
                let n = r.number(v, p)?;
                if (0.0..=1.0).contains(&n) {
                    Some(n)
                } else {
                    r.error(
                        v.span(),
                        p,
                        format!("must be from 0 to 1 (a share of the fairness bound), found {n}"),
                    );
                    None
                }
            })
            .unwrap_or(DEFAULT_LOCALITY),
    }
}
