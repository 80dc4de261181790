//! The `fairway` command line: serve, check, replay, workload, agent, sim-backend.
//! It parses the arguments, starts the log and the runtime, and hands each
//! subcommand to [`fairway::cli`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use fairway::agent::AgentConfig;
use fairway::cli::{
    EngineDialect, LoadArgs, ReplayArgs, agent, check, load, placement, replay, serve, sim_backend,
    write_workload,
};
use fairway::config::EngineParams;
use fairway::sim::backend::SimBackendConfig;
use fairway::telemetry::LogFormat;

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
        /// Publish KV-cache events as vLLM's `--kv-events-config` does: a
        /// ZMQ PUB socket at this address (e.g. 0.0.0.0:5557) ...
        #[arg(long, requires = "kv_events_replay")]
        kv_events: Option<std::net::SocketAddr>,
        /// ... and its replay (ROUTER) socket at this one.
        #[arg(long, requires = "kv_events")]
        kv_events_replay: Option<std::net::SocketAddr>,
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
            kv_events,
            kv_events_replay,
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
                        kv_events: kv_events.zip(kv_events_replay),
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
