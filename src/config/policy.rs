//! The validated policy: what the rest of Fairway reads. Built only by
//! [`crate::config::validate`]; every reference is resolved and every value
//! is in range, so no consumer re-checks anything.
//!
//! The closed sets of policies ([`Discipline`], [`Strategy`], [`Priority`])
//! belong to the core and are re-exported here; [`Policy::scheduler_spec`]
//! is the part of the policy the core's scheduler reads.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::config::EngineParams;
pub use crate::core::placement::OnStale;
use crate::core::placement::PlacementSpec;
use crate::core::spec::{
    Api, BackendSpec, OutlierSpec, PoolSpec, PreemptionSpec, QueueSpec, SchedulerSpec, TenantSpec,
};
pub use crate::core::spec::{Discipline, OnLate, PrefillCharge, PrefixSpec, Priority, Strategy};

/// Readings older than this many poll intervals are stale.
const STALE_AFTER_INTERVALS: u32 = 3;

/// The whole validated policy file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Policy {
    pub server: ServerPolicy,
    pub poller: PollerPolicy,
    pub queue: QueuePolicy,
    pub preemption: PreemptionPolicy,
    pub pools: Vec<PoolPolicy>,
    pub tenants: Vec<TenantPolicy>,
    pub telemetry: TelemetryPolicy,
    /// `[cluster]`: the shared store of several replicas; `None`: this
    /// gateway is alone. Restart-only.
    pub cluster: Option<ClusterPolicy>,
    /// `[batch]`, when the Files and Batch APIs are on.
    pub batch: Option<BatchPolicy>,
    /// `[placement]`: the rules for placing model server pods on GPU
    /// nodes (`core::placement`).
    pub placement: PlacementPolicy,
}

/// `[placement]`: where a model server pod may go
/// ([`crate::core::placement`]; the defaults are the field guide's).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlacementPolicy {
    /// A model may need at most this share of a GPU's free memory (0.8).
    pub max_free_fraction: f64,
    /// A GPU whose engines' TTFT p99 is above this takes no more (150 ms).
    #[serde(with = "humantime_serde_compat")]
    pub ttft_p99_threshold: Duration,
    /// Most model engines on one GPU (2).
    pub max_models_per_gpu: u32,
    /// Two models share a GPU only while together under this share of its
    /// memory (0.7).
    pub shared_memory_fraction: f64,
    /// A node's reading older than this is stale (30 s).
    #[serde(with = "humantime_serde_compat")]
    pub stale_after: Duration,
    /// A pod for a node with a stale or missing reading: `allow`
    /// (unchecked, the default) or `refuse`.
    #[serde(serialize_with = "as_display")]
    pub on_stale: OnStale,
    /// Where `fairway placement` listens (`0.0.0.0:9443`). Restart-only.
    pub listen: std::net::SocketAddr,
    /// Its certificate and key; `fairway placement` refuses to start
    /// without them (Kubernetes calls webhooks over HTTPS only). Read again
    /// at reload.
    pub tls: Option<TlsPolicy>,
    /// Agents to read, as `http://host:port` URLs.
    pub agents: Vec<String>,
    /// Names whose every address is an agent, as `host:port` (a headless
    /// Service); resolved at each poll.
    pub agents_dns: Vec<String>,
    /// How often every agent is read (2 s).
    #[serde(with = "humantime_serde_compat")]
    pub poll_interval: Duration,
    /// How long an allowed binding holds its model's memory on its GPU
    /// when the readings do not show the engine yet (10 min).
    #[serde(with = "humantime_serde_compat")]
    pub reservation_ttl: Duration,
}

impl Default for PlacementPolicy {
    fn default() -> Self {
        PlacementPolicy::from_spec(&PlacementSpec::default())
    }
}

impl PlacementPolicy {
    fn from_spec(s: &PlacementSpec) -> Self {
        PlacementPolicy {
            max_free_fraction: s.max_free_fraction,
            ttft_p99_threshold: s.ttft_p99_threshold,
            max_models_per_gpu: s.max_models_per_gpu,
            shared_memory_fraction: s.shared_memory_fraction,
            stale_after: s.stale_after,
            on_stale: s.on_stale,
            listen: std::net::SocketAddr::from(([0, 0, 0, 0], 9443)),
            tls: None,
            agents: Vec::new(),
            agents_dns: Vec::new(),
            poll_interval: Duration::from_secs(2),
            reservation_ttl: Duration::from_secs(600),
        }
    }

    /// The rules' input.
    pub fn spec(&self) -> PlacementSpec {
        PlacementSpec {
            max_free_fraction: self.max_free_fraction,
            ttft_p99_threshold: self.ttft_p99_threshold,
            max_models_per_gpu: self.max_models_per_gpu,
            shared_memory_fraction: self.shared_memory_fraction,
            stale_after: self.stale_after,
            on_stale: self.on_stale,
        }
    }
}

/// `[batch]`: the OpenAI Files and Batch APIs, their store and limits
/// (docs/batch.md). Without the section the routes answer 404.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BatchPolicy {
    /// Where files, batches and every item's state are kept (an embedded
    /// database and the files beside it); relative to the policy file.
    pub data_dir: std::path::PathBuf,
    /// The largest file an upload may send.
    pub max_file_bytes: u64,
    /// The most requests an input file may hold.
    pub max_lines: usize,
    /// Files a tenant may keep (uploads and batch outputs).
    pub max_files_per_tenant: usize,
    /// Bytes of files a tenant may keep.
    pub max_bytes_per_tenant: u64,
    /// Items that can resume are streamed and continued from their tokens
    /// when preempted mid-answer (`protocol::resume`); off, every item is
    /// sent as asked and a preemption restarts it.
    pub resume: bool,
    /// Generated tokens after which a resumable item's progress is kept in
    /// the store again as it answers (0: only when it is preempted), so
    /// that a gateway killed mid-item, or another replica, continues it
    /// from what it had.
    pub checkpoint_tokens: u64,
    /// The share of each pool's slots batch items leave to live work.
    pub live_reserve: f64,
    /// Live TTFT beside batch work over live TTFT without it, which each
    /// backend's share of batch items follows (0: no loop).
    pub live_latency_target: f64,
    /// vLLM's `priority` set on every batch item's chat and completions
    /// call (0: none sent), for engines started with
    /// `--scheduling-policy priority`: their waiting queue serves lower
    /// values first, and live requests go at 0.
    pub engine_priority: u64,
    /// Prompt tokens of resumable items a backend may have waiting for
    /// their first token (0: no limit): items are fed to each engine no
    /// faster than it prefills them, so live prefills never queue behind
    /// a wave of them.
    pub prefill_ahead: u64,
    /// How long after its creation a batch expires (whole seconds; the
    /// API's `completion_window` names OpenAI's 24 h).
    pub window: std::time::Duration,
    /// The share of a batch item's GPU-seconds its owner's budget is not
    /// charged: batch work on spare capacity may cost less.
    pub gpu_seconds_discount: f64,
    /// How long an ended batch, its items' results and its output and
    /// error files are kept (whole seconds).
    pub retention: std::time::Duration,
    /// `s3://bucket[/prefix]`: the shared store (docs/batch.md, "Several
    /// replicas"): files' bytes in this S3-compatible object store,
    /// batches and items' results in `[cluster]`'s store, so that any
    /// replica can take over another's batch. `None`: the embedded store.
    pub object_store: Option<String>,
    /// The object store's endpoint, when it is not AWS's (`http://` is
    /// allowed); credentials and region come from the `AWS_*` variables.
    pub object_store_endpoint: Option<String>,
}

impl BatchPolicy {
    /// `prefill_ahead` by default (and in a replay without the section):
    /// one engine step's worth at vLLM's default chunked-prefill budget
    /// (`max_num_batched_tokens`).
    pub const PREFILL_AHEAD: u64 = 2048;
    /// `checkpoint_tokens` by default: a few writes to the store a second
    /// per item at an engine's decode rate, at most 256 tokens a kill
    /// makes an item generate again.
    pub const CHECKPOINT_TOKENS: u64 = 256;
}

/// `[cluster]`: several gateway replicas sharing one policy through a
/// Redis store.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClusterPolicy {
    /// `redis://host:port[/db]` or `rediss://…` (TLS).
    pub store: String,
    /// From the variable `password_env` names; never shown.
    #[serde(skip)]
    pub password: Option<Secret>,
    /// This replica's name; `None`: hostname-pid, chosen at start.
    pub replica: Option<String>,
    /// Prefix of every key in the store, so clusters can share one.
    pub key_prefix: String,
    /// How often the replica renews its membership and reads the cluster.
    #[serde(with = "humantime_serde_compat")]
    pub sync_interval: Duration,
    /// A replica not heard from for this long is no longer counted.
    #[serde(with = "humantime_serde_compat")]
    pub replica_ttl: Duration,
    /// A replica leases what its demand would use in this long (plus one
    /// request's worth), at most the whole limit.
    #[serde(with = "humantime_serde_compat")]
    pub lease_ahead: Duration,
    pub on_store_failure: StoreFailure,
}

impl ClusterPolicy {
    /// The store's sentinels, when `store` names the primary that Redis
    /// Sentinel knows ([`SentinelStore::parse`]).
    pub fn sentinel(&self) -> Option<SentinelStore> {
        SentinelStore::parse(&self.store)
    }
}

/// A store reached through Redis Sentinel:
/// `redis+sentinel://host:port,host:port/name` (or `rediss+sentinel://`
/// for TLS to the sentinels and the primary).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelStore {
    pub tls: bool,
    /// The sentinels' `host:port`.
    pub hosts: Vec<String>,
    /// The name the sentinels know the primary by.
    pub name: String,
}

impl SentinelStore {
    /// `None` when `url` is not a well-formed Sentinel URL.
    pub fn parse(url: &str) -> Option<SentinelStore> {
        let (scheme, rest) = url.split_once("://")?;
        let tls = match scheme {
            "redis+sentinel" => false,
            "rediss+sentinel" => true,
            _ => return None,
        };
        let (hosts, name) = rest.split_once('/')?;
        let name = name.trim_end_matches('/');
        let hosts: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_owned)
            .collect();
        (!hosts.is_empty() && !name.is_empty() && !name.contains('/')).then(|| SentinelStore {
            tls,
            hosts,
            name: name.to_owned(),
        })
    }
}

/// What a replica does while the store is unreachable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreFailure {
    /// Keep serving, enforcing its share of the limits for the last known
    /// number of replicas.
    Local,
    /// Refuse the requests of tenants with limits (503, reason
    /// `store_unavailable`); tenants without limits are served.
    Closed,
}

/// A secret from the environment: compared, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `[telemetry]`: OpenTelemetry traces. Restart-only.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TelemetryPolicy {
    /// `host:port` of an OTLP/HTTP collector (from `http://host:port`, or
    /// from `OTEL_EXPORTER_OTLP_ENDPOINT` when the key is absent); `None`:
    /// traces off.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute (default `fairway`).
    pub service_name: String,
    /// Window of the `fairway_jain_fairness_index` gauge (default 10 s,
    /// at least 1 s), sampled ten times per window.
    #[serde(with = "humantime_serde_compat")]
    pub fairness_window: Duration,
    /// Share of traces that start at the gateway which are kept (0 to 1);
    /// a caller's `traceparent` decides for its own. `None`: the SDK's
    /// default, `OTEL_TRACES_SAMPLER` or parent-based always-on.
    pub sample_ratio: Option<f64>,
    /// Latency histograms (TTFT, e2e, queue wait, time per output token)
    /// by tenant and model, or by model only (counters stay per tenant
    /// either way): 4 histograms of up to 20 lines each per tenant and
    /// model, against per model. Restart-only for the tenants already
    /// seen.
    pub per_tenant_histograms: TenantHistograms,
}

/// `[telemetry] per_tenant_histograms`: `"auto"` (the default), `true`
/// or `false`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TenantHistograms {
    /// By tenant up to [`TenantHistograms::AUTO_TENANTS`] tenants, by
    /// model beyond; past that number the per-tenant gauges also list
    /// only the tenants with work queued or in flight.
    Auto,
    ByTenant,
    ByModel,
}

impl TenantHistograms {
    /// The most tenants a policy may declare for `Auto` to keep the
    /// histograms and every gauge per tenant.
    pub const AUTO_TENANTS: usize = 100;

    /// Whether a policy of `tenants` tenants keeps its histograms per
    /// tenant.
    pub fn by_tenant(self, tenants: usize) -> bool {
        match self {
            TenantHistograms::Auto => tenants <= Self::AUTO_TENANTS,
            TenantHistograms::ByTenant => true,
            TenantHistograms::ByModel => false,
        }
    }
}

/// `[server]`: listeners and request limits.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServerPolicy {
    /// Client listener (HTTP/1.1 and h2c on one port). Restart-only.
    pub listen: SocketAddr,
    /// Admin listener: health, readiness, metrics, admin views. Restart-only.
    pub admin_listen: SocketAddr,
    /// Largest request body accepted, in bytes (default 10 MiB).
    pub max_body_bytes: usize,
    /// Largest body on the audio upload routes, which are streamed to the
    /// backend rather than read whole (default 25 MiB).
    pub max_upload_bytes: usize,
    /// How long in-flight responses may run after shutdown starts.
    #[serde(with = "humantime_serde_compat")]
    pub drain_timeout: Duration,
    /// Header naming the tenant, trusted only when the operator sets it.
    pub trust_tenant_header: Option<String>,
    /// Proxies in front of Fairway whose `X-Forwarded-For` entries are
    /// passed on to the backends (default 0: the client's header is
    /// replaced with its connection's address). Reloadable.
    pub trusted_hops: u32,
    /// TLS on the client listener (rustls). Restart-only.
    pub tls: Option<TlsPolicy>,
    /// Most client connections open at once; a connection beyond it is
    /// closed as soon as it is accepted (default 4096). Restart-only.
    pub max_connections: usize,
    /// Most client connections open at once from one IP address; `None`:
    /// no per-address cap (the default: behind a load balancer every
    /// client has its address). Restart-only.
    pub max_connections_per_client: Option<usize>,
    /// Most client requests in flight at once, on all connections (a
    /// streamed response counts until its last byte); beyond it, 503
    /// (default 4096). Restart-only.
    pub max_requests: usize,
    /// Time a client has to send a request's headers (HTTP/1.1; default
    /// 10 s). Restart-only.
    #[serde(with = "humantime_serde_compat")]
    pub header_read_timeout: Duration,
    /// Threads serving client connections, each with a runtime of its own
    /// (default: one per core). Restart-only.
    pub workers: usize,
    /// A client connection with no request in flight for this long is
    /// closed (HTTP/2: GOAWAY; default 60 s). Restart-only.
    #[serde(with = "humantime_serde_compat")]
    pub idle_timeout: Duration,
    /// Time a client has to send a request's whole body, from its headers
    /// (default 30 s); then 408. Reloadable.
    #[serde(with = "humantime_serde_compat")]
    pub body_read_timeout: Duration,
    /// SHA-256 of the bearer token `/admin/*` requires (from the variable
    /// `admin_token_env` names); `None`: the admin endpoints are open to
    /// whoever reaches the admin listener. Reloadable (rotates the token).
    #[serde(skip)]
    pub admin_token: Option<[u8; 32]>,
    /// SHA-256 of a secret the tenants' `cache_salt`s are derived from
    /// too (the variable `cache_salt_secret_env` names); `None`: from the
    /// namespace and the client's salt alone.
    #[serde(skip)]
    pub cache_salt_secret: Option<[u8; 32]>,
    /// `/metrics` requires the admin token too (default `false`).
    pub admin_token_for_metrics: bool,
}

/// `[server] tls`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TlsPolicy {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `[poller]`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PollerPolicy {
    /// Scrape period per backend (default 250 ms).
    #[serde(with = "humantime_serde_compat")]
    pub interval: Duration,
    /// Time allowed for one scrape or health probe (default: `interval`,
    /// at least one second).
    #[serde(with = "humantime_serde_compat")]
    pub timeout: Duration,
}

/// `[queue]`: the fair queue.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueuePolicy {
    #[serde(serialize_with = "as_display")]
    pub discipline: Discipline,
    /// A request not dispatched within this time is shed with 503.
    #[serde(with = "humantime_serde_compat")]
    pub max_wait: Duration,
    /// Queued requests per tenant beyond which arrivals are refused (429).
    pub max_queued_per_tenant: u32,
    /// Weight of one output token relative to one prompt token in `wfq` cost.
    pub output_token_weight: f64,
    /// The share of backlogged tenants' in-flight estimates that a
    /// returning tenant's lift counts as received (0 to 1).
    pub in_flight_credit: f64,
    /// Whether cached prompt tokens count in the charge (default `full`:
    /// they do).
    #[serde(serialize_with = "as_display")]
    pub prefill_charge: PrefillCharge,
    /// How far, as a share of the fairness bound (0 to 1), a pool routing
    /// on prefixes may serve a tenant out of order for a request whose
    /// prompt is cached on a backend with room (0: never).
    pub locality: f64,
}

/// `[preemption]`: when queued interactive work may take the slot of
/// in-flight batch work.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PreemptionPolicy {
    /// Default `true`.
    pub enabled: bool,
    /// A queued request preempts only once it has waited this long
    /// (default 250 ms): a slot that frees by itself is cheaper.
    #[serde(with = "humantime_serde_compat")]
    pub min_wait: Duration,
    /// Work that has run this long is never preempted (default 5 min).
    #[serde(with = "humantime_serde_compat")]
    pub migration_threshold: Duration,
}

/// `[[pools]]`: the backends serving one model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolPolicy {
    pub model: String,
    #[serde(serialize_with = "as_display")]
    pub routing: Strategy,
    /// Time allowed for a backend's response headers (default 60 s).
    #[serde(with = "humantime_serde_compat")]
    pub timeout: Duration,
    /// Skip a backend whose KV usage is at or above this (default 0.8).
    pub kv_high_watermark: f64,
    /// Skip a backend whose TTFT p99 is above this (default 150 ms).
    #[serde(with = "humantime_serde_compat")]
    pub ttft_p99_threshold: Duration,
    /// Outlier ejection (`eject_after_failures`, `ejection_time`,
    /// `max_ejection_time`, `max_ejected_share`).
    pub outlier: OutlierPolicy,
    /// LoRA adapters its backends serve on top of `model`, by the names
    /// clients request (more are found in the backends' `/v1/models`).
    pub adapters: Vec<String>,
    /// A request for an adapter prefers backends that have it loaded.
    pub adapter_affinity: bool,
    /// `prefix_block_tokens`, `prefix_index_blocks`, `prefix_ttl`.
    #[serde(serialize_with = "prefix_keys")]
    pub prefix: PrefixSpec,
    /// The model's tokenizer and chat template, loaded (`tokenizer`,
    /// `tokenizer_config`, `chat_template`); `None`: prompts are measured
    /// and keyed by their bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<PoolTokenizer>,
    pub backends: Vec<BackendPolicy>,
}

/// Outlier ejection of a pool's backends; see [`crate::core::spec::OutlierSpec`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutlierPolicy {
    /// Failed requests in a row that eject a backend (default 5; 0 = off).
    pub eject_after_failures: u32,
    /// First ejection's length; each later one lasts this much longer
    /// (default 10 s).
    #[serde(with = "humantime_serde_compat")]
    pub ejection_time: Duration,
    /// Longest ejection (default 5 min).
    #[serde(with = "humantime_serde_compat")]
    pub max_ejection_time: Duration,
    /// Largest share of the pool's backends ejected at once (default 0.5;
    /// one backend always may be, but never the last available one).
    pub max_ejected_share: f64,
    /// Eject a backend whose success rate over `success_rate_interval` is
    /// this far below the rest of its pool's (default 0.3; 0 = off).
    pub success_rate_gap: f64,
    /// Requests a backend (and the rest of its pool) must have had in the
    /// interval for its success rate to count (default 20).
    pub success_rate_min_requests: u32,
    /// The window success rates are measured over (default 10 s).
    #[serde(with = "humantime_serde_compat")]
    pub success_rate_interval: Duration,
}

/// `[[pools.backends]]`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackendPolicy {
    /// Stable name used in metrics and logs (default: `host:port`).
    pub name: String,
    pub target: BackendTarget,
    /// GPUs behind this backend, for GPU-seconds accounting.
    pub gpus: u32,
    /// Most requests Fairway sends at once (the dispatch window's ceiling).
    pub max_inflight: u32,
    pub metrics: MetricsDialect,
    /// The protocol it speaks: OpenAI-compatible, or Triton's `/v2` API.
    #[serde(serialize_with = "as_display")]
    pub protocol: Api,
    /// The model's name on the backend, when it is not the pool's (a
    /// Triton model such as `ensemble` or `tensorrt_llm_bls`).
    pub served_model: Option<String>,
    /// Where the poller scrapes: `host:port` and path (default: the
    /// backend's own `host:port` and `/metrics`).
    pub metrics_url: Option<HttpEndpoint>,
    /// Path of the health probe on the backend (default `/health`, or
    /// `/v2/health/ready` for Triton).
    pub health_path: String,
    /// KV capacity in tokens, for DRF cost (default: from the backend's
    /// reading, or 65 536 until one arrives).
    pub kv_tokens: u64,
    /// Where its engine publishes its KV-cache events (precise prefix
    /// routing); `None`: the prefix index learns from Fairway's own sends.
    pub kv_events: Option<KvEventsSource>,
}

/// A pool's tokenizer files, and the tokenizer loaded from them when the
/// policy was read (equal when the paths are).
#[derive(Clone, Debug, Serialize)]
pub struct PoolTokenizer {
    pub tokenizer: PathBuf,
    pub config: Option<PathBuf>,
    pub template: Option<PathBuf>,
    #[serde(skip)]
    pub loaded: std::sync::Arc<crate::tokens::ChatTokenizer>,
}

impl PartialEq for PoolTokenizer {
    fn eq(&self, other: &Self) -> bool {
        (&self.tokenizer, &self.config, &self.template)
            == (&other.tokenizer, &other.config, &other.template)
    }
}

/// A backend's KV-event publisher (vLLM's `--kv-events-config`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KvEventsSource {
    /// `tcp://host:port` of its PUB socket; empty for an in-process
    /// simulated backend's (`kv_events = true`: it binds its own).
    pub endpoint: String,
    /// `tcp://host:port` of its replay (ROUTER) socket, if it has one.
    pub replay: Option<String>,
    /// The topic it publishes under (`""`: all).
    pub topic: String,
}

/// An `http://host:port/path` URL, split.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HttpEndpoint {
    pub authority: String,
    /// Starts with `/`.
    pub path: String,
}

/// Where a backend is.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendTarget {
    /// A remote engine at `http://host:port`.
    Url { authority: String },
    /// A simulated engine that `fairway serve` starts in-process.
    Sim { params: EngineParams },
}

/// The metrics dialect a backend speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricsDialect {
    Vllm,
    Triton,
    /// `trtllm-serve`, TensorRT-LLM's own OpenAI server (`trtllm_*` names).
    Trtllm,
    Sglang,
    Llamacpp,
    Agent,
    None,
}

/// `[[tenants]]`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TenantPolicy {
    pub name: String,
    /// SHA-256 digests of the tenant's API keys; keys themselves are not kept.
    #[serde(skip)]
    pub key_digests: Vec<[u8; 32]>,
    pub weight: f64,
    #[serde(serialize_with = "as_display")]
    pub priority: Priority,
    /// Requests per second (refill of the request bucket); `None` = unlimited.
    pub rate: Option<f64>,
    /// Request bucket capacity (default: `rate`, at least 1).
    pub burst: Option<f64>,
    /// Requests in flight plus queued; `None` = unlimited.
    pub max_concurrency: Option<u32>,
    /// GPU-seconds budget per hour; `None` = unlimited.
    pub gpu_seconds_per_hour: Option<f64>,
    pub slo: Slo,
    /// What becomes of a request predicted to miss `slo.ttft` (default by
    /// `priority`: [`OnLate::default_for`]).
    #[serde(serialize_with = "as_display")]
    pub on_late: OnLate,
    /// The LoRA adapters it may call; `None`: every adapter.
    pub adapters: Option<Vec<String>>,
    /// The prefix-cache namespace its requests are salted into
    /// (`prefix_cache`): its own (`"tenant:<name>"`, the default), a group
    /// it shares with other tenants (`"group:<name>"`), or `None`: no
    /// salt set, the engines' caches shared with every such tenant.
    pub cache_namespace: Option<String>,
}

impl TenantPolicy {
    /// Whether it may call adapter `name`.
    pub fn may_use_adapter(&self, name: &str) -> bool {
        self.adapters
            .as_ref()
            .is_none_or(|list| list.iter().any(|a| a == name))
    }
}

/// A tenant's latency objective; a served request meets it when both hold.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Slo {
    #[serde(with = "humantime_serde_compat")]
    pub ttft: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub e2e: Duration,
}

impl Policy {
    /// Whether the latency histograms are kept per tenant (and every
    /// tenant's gauges listed), as `[telemetry] per_tenant_histograms`
    /// says for this policy's number of tenants.
    pub fn histograms_by_tenant(&self) -> bool {
        self.telemetry
            .per_tenant_histograms
            .by_tenant(self.tenants.len())
    }

    /// What the core's scheduler is configured with. A reading goes stale
    /// after three poll intervals.
    pub fn scheduler_spec(&self) -> SchedulerSpec {
        SchedulerSpec {
            queue: QueueSpec {
                discipline: self.queue.discipline,
                max_wait: self.queue.max_wait,
                max_queued_per_tenant: self.queue.max_queued_per_tenant,
                output_token_weight: self.queue.output_token_weight,
                in_flight_credit: self.queue.in_flight_credit,
                prefill_charge: self.queue.prefill_charge,
                locality: self.queue.locality,
                batch_reserve: self.batch.as_ref().map_or(0.0, |b| b.live_reserve),
                batch_prefill_ahead: self
                    .batch
                    .as_ref()
                    .map_or(BatchPolicy::PREFILL_AHEAD, |b| b.prefill_ahead),
                batch_latency_target: self.batch.as_ref().map_or(0.0, |b| b.live_latency_target),
                batch_gpu_discount: self.batch.as_ref().map_or(0.0, |b| b.gpu_seconds_discount),
            },
            preemption: PreemptionSpec {
                enabled: self.preemption.enabled,
                min_wait: self.preemption.min_wait,
                migration_threshold: self.preemption.migration_threshold,
            },
            stale_after: self.poller.interval * STALE_AFTER_INTERVALS,
            tenants: self
                .tenants
                .iter()
                .map(|t| TenantSpec {
                    name: t.name.clone(),
                    weight: t.weight,
                    priority: t.priority,
                    rate: t.rate,
                    burst: t.burst,
                    max_concurrency: t.max_concurrency,
                    gpu_seconds_per_hour: t.gpu_seconds_per_hour,
                    leased: false,
                    ttft_slo: Some(t.slo.ttft),
                    on_late: t.on_late,
                })
                .collect(),
            pools: self
                .pools
                .iter()
                .flat_map(|p| {
                    // One scheduler pool per protocol the model's backends
                    // speak (a pool without backends keeps its OpenAI one).
                    let has = |api| p.backends.iter().any(|b| b.protocol == api);
                    [Api::OpenAi, Api::Triton]
                        .into_iter()
                        .filter(move |&api| has(api) || (api == Api::OpenAi && !has(Api::Triton)))
                        .map(move |api| p.scheduler_pool(api))
                })
                .collect(),
        }
    }
}

impl PoolPolicy {
    /// The scheduler's pool of this model's backends that speak `api`.
    fn scheduler_pool(&self, api: Api) -> PoolSpec {
        PoolSpec {
            model: self.model.clone(),
            api,
            strategy: self.routing,
            kv_high_watermark: self.kv_high_watermark,
            ttft_p99_threshold: self.ttft_p99_threshold,
            outlier: OutlierSpec {
                consecutive_failures: self.outlier.eject_after_failures,
                ejection_time: self.outlier.ejection_time,
                max_ejection_time: self.outlier.max_ejection_time,
                max_ejected_share: self.outlier.max_ejected_share,
                success_rate_gap: self.outlier.success_rate_gap,
                success_rate_min_requests: self.outlier.success_rate_min_requests,
                success_rate_interval: self.outlier.success_rate_interval,
            },
            adapter_affinity: self.adapter_affinity,
            adapters: self.adapters.clone(),
            prefix: self.prefix,
            backends: self
                .backends
                .iter()
                .filter(|b| b.protocol == api)
                .map(|b| BackendSpec {
                    name: b.name.clone(),
                    gpus: b.gpus,
                    max_inflight: b.max_inflight,
                    window_share: 1.0,
                    kv_tokens: b.kv_tokens,
                })
                .collect(),
            slots: None,
            yield_above: None,
        }
    }
}

/// Serialises a core enum as its policy-file spelling (`"drf"`), as
/// `/admin/policy` and the replay report show it.
pub(crate) fn as_display<T: std::fmt::Display, S: serde::Serializer>(
    v: &T,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Serialises a pool's prefix index settings by their policy-file keys.
fn prefix_keys<S: serde::Serializer>(p: &PrefixSpec, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(3))?;
    m.serialize_entry("prefix_block_tokens", &p.block_tokens)?;
    m.serialize_entry("prefix_index_blocks", &p.index_blocks)?;
    m.serialize_entry("prefix_ttl", &humantime::format_duration(p.ttl).to_string())?;
    m.end()
}

/// Serialises durations as humantime strings ("250ms") for `/admin/policy`.
mod humantime_serde_compat {
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }
}
