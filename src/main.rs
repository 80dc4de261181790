//! The `fairway` command line: serve, check, replay, workload, agent, sim-backend.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use fairway::agent::{AgentConfig, serve as serve_agent};
use fairway::config::EngineParams;
use fairway::config::policy::MetricsDialect;
use fairway::config::{load_policy, summary};
use fairway::sim::backend::{SimBackendConfig, serve as serve_sim};
use fairway::telemetry::LogFormat;
use fairway::{Listeners, PolicySource, ServeOptions};

#[derive(Parser)]
#[command(
    name = "fairway",
    version,
    about = "An inline L7 inference gateway with per-tenant admission and fair queueing"
)]
struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(long, global = true, env = "FAIRWAY_LOG_JSON")]
    log_json: bool,
    /// Bytes of log lines held in memory while the log's output catches
    /// up; lines beyond it are dropped and counted
    /// (`fairway_log_lines_dropped_total`) rather than slowing requests.
    #[arg(long, global = true, env = "FAIRWAY_LOG_BUFFER", default_value_t = fairway::telemetry::log_writer::DEFAULT_CAPACITY)]
    log_buffer: usize,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// The policy file.
        #[arg(long, short, default_value = "config/fairway.toml")]
        config: PathBuf,
        /// How often to check the policy file for changes (0 disables).
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        watch_interval: Duration,
    },
    /// Run the placement service: a kube-scheduler extender and a
    /// validating admission webhook over HTTPS, judging GPU nodes by what
    /// their agents read ([placement] in the policy).
    Placement {
        /// The policy file (its [placement] section).
        #[arg(long, short, default_value = "config/fairway.toml")]
        config: PathBuf,
    },
    /// Validate policy files without serving.
    Check {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Simulate a policy on a workload: the live scheduler against simulated
    /// engines on a simulated clock, deterministic for a seed.
    Replay(ReplayArgs),
    /// Play a workload against a running gateway, each request at its time,
    /// and report it as `replay` does (compare the two).
    Load(LoadArgs),
    /// A terminal view of a running gateway: per-tenant rates, p99 against
    /// the SLO, queue and refusals; per-backend health, KV and in flight.
    /// Follows the terminal's size; `q`, Esc or Ctrl-C quits.
    Top {
        /// The gateway's admin listener.
        #[arg(long, default_value = "127.0.0.1:9090")]
        admin: String,
        /// Refresh period.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// Print one frame (rates over one interval) and exit.
        #[arg(long)]
        once: bool,
    },
    /// Write a workload file (JSONL): generated from a scenario, or from
    /// Fairway's own JSON access log.
    Workload {
        /// `reference`, or a scenario file (TOML).
        #[arg(
            long,
            required_unless_present = "from_access_log",
            conflicts_with = "from_access_log"
        )]
        scenario: Option<String>,
        /// A `serve --log-json` log to turn into a workload.
        #[arg(long)]
        from_access_log: Option<PathBuf>,
        /// The policy whose first pool names the model (scenarios without `model`).
        #[arg(long, default_value = "config/reference.toml")]
        policy: PathBuf,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where to write (default: standard output).
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
    /// Run the GPU-node agent: beside an engine, serves its metrics and
    /// NVML's GPU readings as one JSON reading (`metrics = "agent"`);
    /// without --engine-metrics, the node's GPUs only (for placement).
    Agent {
        #[arg(long, default_value = "127.0.0.1:9400")]
        listen: SocketAddr,
        /// The engine's metrics URL, e.g. http://127.0.0.1:8000/metrics;
        /// without it the agent serves the node's GPUs only.
        #[arg(long)]
        engine_metrics: Option<String>,
        /// The Kubernetes node name (default: this host's name).
        #[arg(long, env = "NODE_NAME")]
        node_name: Option<String>,
        /// The model the engine serves, as placement counts it (default:
        /// the one its metrics name in a `model_name` or `model` label).
        #[arg(long, env = "FAIRWAY_MODEL")]
        model: Option<String>,
        /// The node's indices of the GPUs the engine runs on, e.g. 0,1
        /// (default: not known; placement then holds the engine's latency
        /// against every GPU of the node).
        #[arg(long, value_delimiter = ',')]
        engine_gpus: Option<Vec<u32>>,
        /// Report these GPUs instead of NVML's, TOTAL_GB:USED_GB each,
        /// comma-separated (tests and demos without a GPU).
        #[arg(long)]
        simulate_gpus: Option<String>,
        /// How the engine names its metrics.
        #[arg(long, value_enum, default_value_t = EngineDialect::Vllm)]
        dialect: EngineDialect,
        /// The most one engine scrape may take.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        timeout: Duration,
        /// The NVML library to load instead of libnvidia-ml.so.1.
        #[arg(long)]
        nvml_lib: Option<PathBuf>,
    },
    /// Run a simulated vLLM-like backend.
    SimBackend {
        #[arg(long, default_value = "127.0.0.1:8000")]
        listen: SocketAddr,
        #[arg(long, default_value = "sim-model")]
        model: String,
        #[arg(long, default_value_t = EngineParams::default().max_num_seqs)]
        max_num_seqs: u32,
        #[arg(long, default_value_t = EngineParams::default().kv_tokens)]
        kv_tokens: u64,
        #[arg(long, default_value_t = EngineParams::default().max_model_len)]
        max_model_len: u32,
        /// Most prompt tokens prefilled in one engine step.
        #[arg(long, default_value_t = EngineParams::default().max_num_batched_tokens)]
        max_num_batched_tokens: u32,
        #[arg(long, default_value_t = EngineParams::default().prefill_tokens_per_s)]
        prefill_tokens_per_s: f64,
        /// Decode step time with one sequence in the batch.
        #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
        decode_step_base: Duration,
        /// Extra decode step time per additional sequence.
        #[arg(long, default_value = "200us", value_parser = humantime::parse_duration)]
        decode_step_per_seq: Duration,
        /// Simulated seconds per wall second.
        #[arg(long, default_value_t = 1.0)]
        time_scale: f64,
        /// Start in a failure mode (switch at run time with
        /// `POST /admin/fault {"mode": "none"}`).
        #[arg(long, value_enum, default_value = "none")]
        fault: fairway::sim::backend::Fault,
        /// The server it imitates: vLLM's OpenAI server (`/v1/*`, `vllm:*`
        /// metrics) or Triton (`/v2/*` generate routes and Triton's
        /// metrics) running the model on TensorRT-LLM or on its vLLM backend.
        #[arg(long, value_enum, default_value = "vllm")]
        flavour: fairway::sim::backend::Flavour,
        /// LoRA adapters it serves on top of `--model`, comma-separated
        /// (vLLM's `--lora-modules`).
        #[arg(long, value_delimiter = ',')]
        lora_modules: Vec<String>,
        /// Adapters on the GPU at once (vLLM's `--max-loras`).
        #[arg(long, default_value_t = EngineParams::default().max_loras)]
        max_loras: u32,
        /// Time to load an adapter onto the GPU (simulated).
        #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
        lora_load_time: Duration,
        /// Also export the LoRA residency series proposed for vLLM
        /// (`vllm:lora_adapter_loaded` and friends), not only
        /// `vllm:lora_requests_info`.
        #[arg(long)]
        lora_residency_metrics: bool,
    },
}

fn log_format(json: bool) -> LogFormat {
    if json {
        LogFormat::Json
    } else {
        LogFormat::Text
    }
}

fn init_logging(json: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::registry()
        .with(fairway::telemetry::log_layer(log_format(json)))
        .init();
}

/// jemalloc, not the system's allocator: about a tenth less CPU per request
/// through the gateway, and memory that returns to the same level after a
/// burst of streams (measured in docs/benchmarks/2026-12-05.md; its
/// settings are in .cargo/config.toml).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    fairway::telemetry::log_writer::set_capacity(cli.log_buffer);
    init_logging(cli.log_json);
    let code = run(cli);
    // The log's last lines are still in its buffer.
    fairway::telemetry::log_writer::flush(Duration::from_secs(2));
    code
}

fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Check { paths } => check(&paths),
        Command::Replay(args) => report(replay(args)),
        Command::Load(args) => report(runtime().and_then(|rt| rt.block_on(load(args)))),
        Command::Top {
            admin,
            interval,
            once,
        } => report(
            runtime().and_then(|rt| Ok(rt.block_on(fairway::top::run(&admin, interval, once))?)),
        ),
        Command::Workload {
            scenario,
            from_access_log,
            policy,
            seed,
            out,
        } => report(write_workload(
            scenario,
            from_access_log,
            &policy,
            seed,
            out,
        )),
        Command::Agent {
            listen,
            engine_metrics,
            node_name,
            model,
            engine_gpus,
            simulate_gpus,
            dialect,
            timeout,
            nvml_lib,
        } => {
            let simulated_gpus = match simulate_gpus.as_deref() {
                Some(text) => match fairway::agent::parse_simulated_gpus(text) {
                    Ok(gpus) => Some(gpus),
                    Err(e) => {
                        eprintln!("fairway: --simulate-gpus: {e}");
                        return ExitCode::from(2);
                    }
                },
                None => None,
            };
            let cfg = AgentConfig {
                engine_metrics,
                dialect: dialect.into(),
                timeout,
                nvml_lib,
                node: node_name.unwrap_or_else(fairway::agent::node::host_name),
                model,
                engine_gpus,
                simulated_gpus,
            };
            report(runtime().and_then(|rt| rt.block_on(agent(listen, cfg))))
        }
        Command::Placement { config } => {
            report(runtime().and_then(|rt| rt.block_on(placement(config))))
        }
        Command::Serve {
            config,
            watch_interval,
        } => {
            report(runtime().and_then(|rt| {
                rt.block_on(serve(config, watch_interval, log_format(cli.log_json)))
            }))
        }
        Command::SimBackend {
            listen,
            model,
            max_num_seqs,
            kv_tokens,
            max_model_len,
            max_num_batched_tokens,
            prefill_tokens_per_s,
            decode_step_base,
            decode_step_per_seq,
            time_scale,
            fault,
            flavour,
            lora_modules,
            max_loras,
            lora_load_time,
            lora_residency_metrics,
        } => {
            let engine = EngineParams {
                max_loras,
                lora_load_time,
                max_num_seqs,
                kv_tokens,
                max_model_len,
                max_num_batched_tokens,
                prefill_tokens_per_s,
                decode_step_base,
                decode_step_per_seq,
                time_scale,
                ..EngineParams::default()
            };
            report(runtime().and_then(|rt| {
                rt.block_on(sim_backend(
                    listen,
                    SimBackendConfig {
                        model,
                        engine,
                        fault,
                        flavour,
                        adapters: lora_modules,
                        residency_metrics: lora_residency_metrics,
                    },
                ))
            }))
        }
    }
}

fn report(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fairway: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

fn check(paths: &[PathBuf]) -> ExitCode {
    let mut ok = true;
    for p in paths {
        match load_policy(p) {
            Ok((policy, _)) => println!("{}: ok: {}", p.display(), summary(&policy)),
            Err(errors) => {
                ok = false;
                for e in errors {
                    eprintln!("{e}");
                }
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn serve(config: PathBuf, watch_interval: Duration, log: LogFormat) -> anyhow::Result<()> {
    let (policy, text) = load_policy(&config).map_err(|errors| {
        let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("invalid policy file:\n{}", lines.join("\n"))
    })?;
    let example_key = policy.tenants.first().and_then(|_| demo_key(&text));
    let model = policy
        .pools
        .first()
        .map(|p| p.model.clone())
        .unwrap_or_default();
    let listeners = Listeners::bind(&policy)
        .await
        .with_context(|| format!("binding the listeners of {}", config.display()))?;
    // Install the handlers before announcing the address: a SIGHUP that
    // arrives after the listen line must reload, never kill the process.
    let signals = Signals::install().context("installing signal handlers")?;
    let addr = listeners.api.local_addr()?;
    println!(
        "fairway listening on http://{addr} (admin on http://{})",
        listeners.admin.local_addr()?
    );
    // (Double quotes, so that a `$API_KEY` placeholder expands.)
    let auth = example_key
        .map(|k| format!(" -H \"Authorization: Bearer {k}\""))
        .unwrap_or_default();
    println!(
        "try: curl -s http://{addr}/v1/chat/completions{auth} -H 'Content-Type: application/json' -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}],\"max_tokens\":16}}'"
    );
    println!("each tenant's own usage page: http://{addr}/fairway/ (sign in with its API key)");
    let options = ServeOptions {
        source: PolicySource {
            path: Some(config.clone()),
            text,
        },
        watch: (!watch_interval.is_zero()).then_some(watch_interval),
        reload_signal: Some(signals.hup),
        log: Some(log),
    };
    let stop = async move {
        let (mut term, mut int) = (signals.term, signals.int);
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutdown signal received");
    };
    fairway::serve(listeners, policy, options, stop)
        .await
        .with_context(|| format!("serving {}", config.display()))?;
    tracing::info!("fairway stopped");
    Ok(())
}

/// The key for the start-up curl example: the file's first clear-text key
/// if it is one of the public demo keys (`sk-demo-…`), else a `$API_KEY`
/// placeholder. Any other key is a secret and never printed.
fn demo_key(text: &str) -> Option<String> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("api_keys"))?;
    let start = line.find('"')? + 1;
    let len = line[start..].find('"')?;
    let key = &line[start..start + len];
    Some(if key.starts_with(DEMO_KEY_PREFIX) {
        key.to_owned()
    } else {
        "$API_KEY".to_owned()
    })
}

/// Keys that are public by design: those of the demo policy.
const DEMO_KEY_PREFIX: &str = "sk-demo-";

#[cfg(test)]
mod tests {
    use super::demo_key;

    #[test]
    fn the_banner_prints_only_demo_keys() {
        let demo = "[[tenants]]\nname = \"a\"\napi_keys = [\"sk-demo-api\"]\n";
        assert_eq!(demo_key(demo).as_deref(), Some("sk-demo-api"));
        let real = "[[tenants]]\nname = \"a\"\napi_keys = [\"sk-live-9f8e7d\"]\n";
        assert_eq!(demo_key(real).as_deref(), Some("$API_KEY"));
        assert_eq!(demo_key("[[tenants]]\nname = \"a\"\n"), None);
    }
}

/// SIGTERM and Ctrl-C drain; SIGHUP reloads the policy.
struct Signals {
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            int: signal(SignalKind::interrupt())?,
        })
    }
}

async fn sim_backend(listen: SocketAddr, cfg: SimBackendConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    println!(
        "fairway sim-backend for model {} listening on http://{}",
        cfg.model,
        listener.local_addr()?
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    serve_sim(listener, cfg, shutdown).await?;
    Ok(())
}

/// The metrics dialects an engine speaks (`agent` and `none` are not).
#[derive(Clone, Copy, Debug, ValueEnum)]
enum EngineDialect {
    Vllm,
    Triton,
    Trtllm,
    Sglang,
    Llamacpp,
}

impl From<EngineDialect> for MetricsDialect {
    fn from(d: EngineDialect) -> Self {
        match d {
            EngineDialect::Vllm => MetricsDialect::Vllm,
            EngineDialect::Triton => MetricsDialect::Triton,
            EngineDialect::Trtllm => MetricsDialect::Trtllm,
            EngineDialect::Sglang => MetricsDialect::Sglang,
            EngineDialect::Llamacpp => MetricsDialect::Llamacpp,
        }
    }
}

/// Runs the placement service until SIGTERM or Ctrl-C.
async fn placement(config: PathBuf) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let policy = fairway::placement::load(&config)?;
    let listener = tokio::net::TcpListener::bind(policy.listen)
        .await
        .with_context(|| format!("binding {}", policy.listen))?;
    let mut term = signal(SignalKind::terminate()).context("installing signal handlers")?;
    let mut int = signal(SignalKind::interrupt()).context("installing signal handlers")?;
    println!(
        "fairway placement listening on https://{} ({} agents, {} agent names)",
        listener.local_addr()?,
        policy.agents.len(),
        policy.agents_dns.len()
    );
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutdown signal received");
    };
    fairway::placement::serve(listener, config, shutdown).await?;
    tracing::info!("fairway placement stopped");
    Ok(())
}

/// Runs the agent until SIGTERM or Ctrl-C.
async fn agent(listen: SocketAddr, cfg: AgentConfig) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    cfg.validate()?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    // Installed before the listen line, so a signal after it always drains.
    let mut term = signal(SignalKind::terminate()).context("installing signal handlers")?;
    let mut int = signal(SignalKind::interrupt()).context("installing signal handlers")?;
    println!(
        "fairway agent listening on http://{} (node {}, {})",
        listener.local_addr()?,
        cfg.node,
        cfg.engine_metrics.as_deref().unwrap_or("no engine")
    );
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutdown signal received");
    };
    serve_agent(listener, cfg, shutdown).await?;
    tracing::info!("fairway agent stopped");
    Ok(())
}

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
struct ReplayArgs {
    #[command(flatten)]
    source: Source,
    /// Run the same workload under each discipline and/or strategy.
    #[arg(long, value_enum)]
    compare: Option<fairway::replay::Compare>,
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
    #[arg(long, value_enum, default_value_t = fairway::replay::sim::Ingress::Even)]
    ingress: fairway::replay::sim::Ingress,
}

/// Loads a policy for offline use, with every error listed.
fn offline_policy(path: &std::path::Path) -> anyhow::Result<fairway::config::Policy> {
    load_policy(path).map(|(p, _)| p).map_err(|errors| {
        let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("invalid policy:\n{}", lines.join("\n"))
    })
}

/// `reference` or a scenario file, generated against the policy's first pool.
fn scenario_workload(
    name: &str,
    policy: &fairway::config::Policy,
    seed: u64,
) -> anyhow::Result<Vec<fairway::replay::workload::WorkRequest>> {
    use fairway::replay::scenario::{Scenario, reference};
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
    fairway::config::Policy,
    Vec<fairway::replay::workload::WorkRequest>,
)> {
    let policy = offline_policy(&src.policy)?;
    let work = match (&src.workload, &src.scenario) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            fairway::replay::workload::parse_jsonl(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        (None, Some(name)) => scenario_workload(name, &policy, src.seed)?,
        (None, None) => anyhow::bail!("give --workload FILE or --scenario NAME"),
    };
    Ok((policy, work))
}

fn parse_key(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((t, k)) if !t.is_empty() && !k.is_empty() => Ok((t.to_owned(), k.to_owned())),
        _ => Err(format!("expected TENANT=KEY, got \"{s}\"")),
    }
}

#[derive(clap::Args)]
struct LoadArgs {
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
}

async fn load(a: LoadArgs) -> anyhow::Result<()> {
    use fairway::replay::{live, report};
    let (policy, work) = load_workload(&a.source)?;
    let target = live::Target {
        authority: a.target.clone(),
        keys: a.keys.into_iter().collect(),
        timeout: a.timeout,
    };
    eprintln!("playing {} requests against {}", work.len(), a.target);
    let trace = live::play(&policy, &work, &target).await;
    let run = report::summarise(fairway::replay::Variant::of(&policy), &trace);
    print!("{}", report::table(std::slice::from_ref(&run)));
    if let Some(path) = &a.json {
        std::fs::write(path, report::json(std::slice::from_ref(&run)))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn replay(a: ReplayArgs) -> anyhow::Result<()> {
    use fairway::replay::{report, run_variant, sim::RunOptions, variants};
    let (policy, work) = load_workload(&a.source)?;
    if let Some(dir) = &a.svg {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let clock = fairway::clock::Clock::new();
    let mut runs = Vec::new();
    for variant in variants(&policy, a.compare) {
        let slo = if variant.slo_admission { "+slo" } else { "" };
        let label = format!("{}{slo}/{}", variant.discipline, variant.strategy);
        let opts = RunOptions {
            seed: a.source.seed,
            progress: Some(format!("replay {label}")),
            replicas: a.replicas,
            ingress: a.ingress,
        };
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
    println!(
        "{} requests, {} run(s), seed {}, {:.2} s wall",
        work.len(),
        runs.len(),
        a.source.seed,
        clock.now().as_secs_f64()
    );
    if let Some(path) = &a.json {
        std::fs::write(path, report::json(&runs))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn write_workload(
    scenario: Option<String>,
    log: Option<PathBuf>,
    policy: &std::path::Path,
    seed: u64,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    use fairway::replay::workload;
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
