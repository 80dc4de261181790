//! The commands on a workload: `fairway replay` (simulated), `fairway load`
//! (played against a running gateway) and `fairway workload` (written).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::config::load_policy;

/// Where a workload comes from, and the policy it runs under.
#[derive(clap::Args)]
struct Source {
    /// The policy file (for `replay`, its pools' `sim` parameters model
    /// the backends; for `load`, the tenants and SLOs the gateway runs).
    #[arg(long, default_value = "config/reference.toml")]
    policy: PathBuf,
    /// A JSONL workload (docs/policy-evaluation.md has the format).
    #[arg(
        long,
        required_unless_present = "scenario",
        conflicts_with = "scenario"
    )]
    workload: Option<PathBuf>,
    /// `reference`, or a scenario file (TOML) to generate the workload from.
    #[arg(long)]
    scenario: Option<String>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    source: Source,
    /// Run the same workload under each discipline and/or strategy.
    #[arg(long, value_enum)]
    compare: Option<crate::replay::Compare>,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw per-tenant TTFT and queue depth over time, one SVG a run, here.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Gateway replicas sharing the policy, as with `[cluster]`: each a
    /// scheduler of its own, syncing demand and shares every
    /// `[cluster] sync_interval` (1 s without the section).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    replicas: u32,
    /// How requests are spread over the replicas.
    #[arg(long, value_enum, default_value_t = crate::replay::sim::Ingress::Even)]
    ingress: crate::replay::sim::Ingress,
    /// Instead of one run a variant, search each variant's capacity: the
    /// highest arrival rate (the workload's arrivals compressed) at which
    /// every tenant meets its SLO on at least this share of its requests
    /// (0.95: 95 %). Reports the runs at capacity.
    #[arg(long, value_parser = share)]
    capacity: Option<f64>,
}

/// A flag's value these commands cannot take: the operator's, refused
/// before anything runs.
#[derive(Debug, thiserror::Error)]
enum ArgError {
    #[error("expected a share in (0, 1], got \"{0}\"")]
    NotShare(String),
    #[error("expected TENANT=KEY, got \"{0}\"")]
    NotTenantKey(String),
}

fn share(s: &str) -> Result<f64, ArgError> {
    match s.parse::<f64>() {
        Ok(a) if a > 0.0 && a <= 1.0 => Ok(a),
        _ => Err(ArgError::NotShare(s.to_owned())),
    }
}

/// Loads a policy for offline use, with every error listed.
fn offline_policy(path: &std::path::Path) -> anyhow::Result<crate::config::Policy> {
    load_policy(path).map(|(p, _)| p).map_err(|errors| {
        let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("invalid policy:\n{}", lines.join("\n"))
    })
}

/// `reference` or a scenario file, generated against the policy's first pool.
fn scenario_workload(
    name: &str,
    policy: &crate::config::Policy,
    seed: u64,
) -> anyhow::Result<Vec<crate::replay::workload::WorkRequest>> {
    use crate::replay::scenario::{Scenario, reference};
    let scenario = if name == "reference" {
        reference()
    } else {
        let text = std::fs::read_to_string(name).with_context(|| format!("reading {name}"))?;
        Scenario::from_toml(&text).map_err(|e| anyhow::anyhow!("{name}: {e}"))?
    };
    let model = policy.pools.first().map_or("", |p| p.model.as_str());
    Ok(scenario.generate(model, seed))
}

/// The workload of `--workload FILE` or `--scenario NAME`.
fn load_workload(
    src: &Source,
) -> anyhow::Result<(
    crate::config::Policy,
    Vec<crate::replay::workload::WorkRequest>,
)> {
    let policy = offline_policy(&src.policy)?;
    let work = match (&src.workload, &src.scenario) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            crate::replay::workload::parse_jsonl(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        (None, Some(name)) => scenario_workload(name, &policy, src.seed)?,
        (None, None) => anyhow::bail!("give --workload FILE or --scenario NAME"),
    };
    Ok((policy, work))
}

fn parse_key(s: &str) -> Result<(String, String), ArgError> {
    match s.split_once('=') {
        Some((t, k)) if !t.is_empty() && !k.is_empty() => Ok((t.to_owned(), k.to_owned())),
        _ => Err(ArgError::NotTenantKey(s.to_owned())),
    }
}

#[derive(clap::Args)]
pub struct LoadArgs {
    #[command(flatten)]
    source: Source,
    /// The gateway's client listener, `host:port`.
    #[arg(long, default_value = "127.0.0.1:8080")]
    target: String,
    /// A tenant's API key, `TENANT=KEY`; repeat per tenant.
    #[arg(long = "key", value_parser = parse_key)]
    keys: Vec<(String, String)>,
    /// Longest one request may take; past it, it counts as failed.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// How the requests of `batch_api` tenants are played: `live` (each
    /// at its time, as a live request), `concurrency=N` (live, N at a time;
    /// those not started when the rest has ended are left unsent) or
    /// `lane` (one batch per tenant through the Batch API, polled until
    /// it ends; the gateway needs a `[batch]` section).
    #[arg(long, default_value = "live")]
    batch_as: crate::replay::handover::BatchAs,
}

/// Plays the workload against a running gateway and reports it.
pub async fn load(a: LoadArgs) -> anyhow::Result<()> {
    use crate::replay::{load, report};
    let (policy, work) = load_workload(&a.source)?;
    let target = load::Target {
        authority: a.target.clone(),
        keys: a.keys.into_iter().collect(),
        timeout: a.timeout,
        batch_as: a.batch_as,
    };
    eprintln!("playing {} requests against {}", work.len(), a.target);
    let trace = load::play(&policy, &work, &target).await;
    let run = report::summarise(crate::replay::Variant::of(&policy), &trace);
    print!("{}", report::table(std::slice::from_ref(&run)));
    if let Some(path) = &a.json {
        std::fs::write(path, report::json(std::slice::from_ref(&run)))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Replays the workload under each variant of the policy and reports the
/// runs.
pub fn replay(a: ReplayArgs) -> anyhow::Result<()> {
    use crate::replay::{capacity::capacity, report, run_variant, sim::RunOptions, variants};
    let (policy, work) = load_workload(&a.source)?;
    if let Some(dir) = &a.svg {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let clock = crate::clock::Clock::new();
    let mut runs = Vec::new();
    let mut found = Vec::new();
    for variant in variants(&policy, a.compare) {
        let slo = if variant.slo_admission { "+slo" } else { "" };
        let label = format!("{}{slo}/{}", variant.discipline, variant.routing());
        let opts = RunOptions {
            seed: a.source.seed,
            progress: Some(format!("replay {label}")),
            replicas: a.replicas,
            ingress: a.ingress,
        };
        if let Some(attainment) = a.capacity {
            let c = capacity(&policy, &work, variant, &opts, attainment);
            if let Some(c) = &c {
                runs.push(c.run.clone());
            }
            found.push((label, c));
            continue;
        }
        let (run, trace) = run_variant(&policy, &work, variant, &opts);
        if let Some(dir) = &a.svg {
            let file = dir.join(format!("{}.svg", label.replace('/', "-")));
            let title = format!("{label}: TTFT p99 per 5 s of arrival, and queue depth");
            std::fs::write(&file, report::svg(&title, &trace))
                .with_context(|| format!("writing {}", file.display()))?;
        }
        runs.push(run);
    }
    print!("{}", report::table(&runs));
    if let Some(attainment) = a.capacity {
        print!("{}", crate::replay::capacity::table(attainment, &found));
    }
    println!(
        "{} requests, {} run(s), seed {}, {:.2} s wall",
        work.len(),
        runs.len(),
        a.source.seed,
        clock.now().as_secs_f64()
    );
    if let Some(path) = &a.json {
        let doc = match a.capacity {
            Some(attainment) => crate::replay::capacity::json(attainment, &found),
            None => report::json(&runs),
        };
        std::fs::write(path, doc).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Writes a workload, from a scenario or from an access log, to `out` or
/// standard output.
pub fn write_workload(
    scenario: Option<String>,
    log: Option<PathBuf>,
    policy: &std::path::Path,
    seed: u64,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    use crate::replay::workload;
    let work = match (scenario, log) {
        (_, Some(log)) => {
            let text = std::fs::read_to_string(&log)
                .with_context(|| format!("reading {}", log.display()))?;
            let (w, skipped) = workload::from_access_log(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", log.display()))?;
            if skipped > 0 {
                eprintln!("skipped {skipped} access events without a tenant, model or timestamp");
            }
            w
        }
        (Some(name), None) => scenario_workload(&name, &offline_policy(policy)?, seed)?,
        (None, None) => anyhow::bail!("give --scenario NAME or --from-access-log FILE"),
    };
    let text = workload::to_jsonl(&work);
    match out {
        Some(path) => {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{text}"),
    }
    Ok(())
}
