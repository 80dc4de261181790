//! Placement: may a model server pod go on a GPU node, and on which GPU?
//!
//! Kubernetes counts whole GPUs; these rules (the field guide's, with its
//! numbers as the defaults) look at what the node's GPUs have left, from
//! the readings the agents on the nodes serve. Sans-IO: the caller gives
//! the node's state, the pod and `now`; the Kubernetes-facing shell (the
//! scheduler extender and the admission webhook) turns the answer into
//! their wire formats.
//!
//! A GPU takes the pod when all of these hold:
//! 1. **memory**: the model needs at most `max_free_fraction` (0.8) of the
//!    GPU's free memory (the guide's "KV cache free": vLLM takes its KV
//!    cache out of what the GPU has left when it starts);
//! 2. **latency**: no engine on it has a TTFT p99 above
//!    `ttft_p99_threshold` (150 ms): it has no headroom for more load;
//! 3. **spreading**: fewer than `max_models_per_gpu` (2) engines run on
//!    it, and with one there, both together stay under
//!    `shared_memory_fraction` (0.7) of its memory.
//!
//! A node whose reading is older than `stale_after`, or missing, gets
//! `on_stale`: refused, or allowed unchecked (so a gateway that cannot see
//! a node never blocks a rollout unless the operator asks it to).
//!
//! Among the GPUs that take it, an empty GPU scores above a shared one
//! (spreading), then the more memory left after placing the better: a
//! score of 0 to 10, as kube-scheduler's extenders give.

use std::fmt;
use std::time::Duration;

use crate::core::time::Instant;

/// What the rules allow (`[placement]` in the policy).
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementSpec {
    pub max_free_fraction: f64,
    pub ttft_p99_threshold: Duration,
    pub max_models_per_gpu: u32,
    pub shared_memory_fraction: f64,
    pub stale_after: Duration,
    pub on_stale: OnStale,
}

impl Default for PlacementSpec {
    fn default() -> Self {
        PlacementSpec {
            max_free_fraction: 0.8,
            ttft_p99_threshold: Duration::from_millis(150),
            max_models_per_gpu: 2,
            shared_memory_fraction: 0.7,
            stale_after: Duration::from_secs(30),
            on_stale: OnStale::Allow,
        }
    }
}

/// What becomes of a pod when a node's reading is stale or missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnStale {
    Allow,
    Refuse,
}

impl fmt::Display for OnStale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnStale::Allow => "allow",
            OnStale::Refuse => "refuse",
        })
    }
}

/// One GPU of a node, as its agent last read it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuState {
    /// Device index on the node (NVML order).
    pub index: u32,
    pub memory_total: u64,
    pub memory_used: u64,
    /// The models of the engines running on it.
    pub models: Vec<String>,
    /// The worst TTFT p99 of those engines, when read.
    pub ttft_p99: Option<Duration>,
}

/// A node's GPUs and when they were read.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeState {
    pub name: String,
    pub gpus: Vec<GpuState>,
    /// `None`: never read.
    pub read_at: Option<Instant>,
}

/// The pod asking for a place: its model and the memory it needs.
#[derive(Clone, Debug, PartialEq)]
pub struct PodRequest {
    pub model: String,
    pub memory: u64,
}

/// Which rule refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    Memory,
    Latency,
    ModelsPerGpu,
    SharedMemory,
    Stale,
    NoGpu,
}

impl Rule {
    /// The rule's name in messages and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Memory => "memory",
            Rule::Latency => "latency",
            Rule::ModelsPerGpu => "models_per_gpu",
            Rule::SharedMemory => "shared_memory",
            Rule::Stale => "stale_reading",
            Rule::NoGpu => "no_gpu",
        }
    }
}

/// Why a node (or one of its GPUs) cannot take the pod, with the numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct Misfit {
    pub node: String,
    pub gpu: Option<u32>,
    pub rule: Rule,
    pub message: String,
}

impl fmt::Display for Misfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Where on the node the pod fits, and how well (0 to 10).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// `None`: allowed unchecked (a stale reading under `OnStale::Allow`).
    pub gpu: Option<u32>,
    pub score: u8,
}

/// Memory in messages: decimal GB, as the `model-size-gb` annotation.
fn gb(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

/// The best GPU of `node` for `pod` at `now`, or why none fits (one
/// refusal per GPU, the first rule each failed).
pub fn assess(
    spec: &PlacementSpec,
    now: Instant,
    node: &NodeState,
    pod: &PodRequest,
) -> Result<Fit, Vec<Misfit>> {
    let fresh = node
        .read_at
        .is_some_and(|at| now.saturating_since(at) <= spec.stale_after);
    if !fresh {
        let age = node.read_at.map_or_else(
            || "no reading".to_owned(),
            |at| {
                format!(
                    "a reading {:.0} s old",
                    now.saturating_since(at).as_secs_f64()
                )
            },
        );
        return match spec.on_stale {
            OnStale::Allow => Ok(Fit {
                gpu: None,
                score: 0,
            }),
            OnStale::Refuse => Err(vec![Misfit {
                node: node.name.clone(),
                gpu: None,
                rule: Rule::Stale,
                message: format!(
                    "node {}: {age} (older than {} s), and placement.on_stale is \"refuse\"",
                    node.name,
                    spec.stale_after.as_secs()
                ),
            }]),
        };
    }
    if node.gpus.is_empty() {
        return Err(vec![Misfit {
            node: node.name.clone(),
            gpu: None,
            rule: Rule::NoGpu,
            message: format!("node {}: its agent reports no GPU", node.name),
        }]);
    }
    let mut refusals = Vec::new();
    let mut best: Option<Fit> = None;
    for gpu in &node.gpus {
        match gpu_fit(spec, &node.name, gpu, pod) {
            Ok(score) => {
                if best.is_none_or(|b| score > b.score) {
                    best = Some(Fit {
                        gpu: Some(gpu.index),
                        score,
                    });
                }
            }
            Err(r) => refusals.push(r),
        }
    }
    best.ok_or(refusals)
}

fn gpu_fit(
    spec: &PlacementSpec,
    node: &str,
    gpu: &GpuState,
    pod: &PodRequest,
) -> Result<u8, Misfit> {
    let refuse = |rule: Rule, message: String| Misfit {
        node: node.to_owned(),
        gpu: Some(gpu.index),
        rule,
        message: format!("node {node} GPU {}: {message}", gpu.index),
    };
    let free = gpu.memory_total.saturating_sub(gpu.memory_used);
    let allowed = (free as f64 * spec.max_free_fraction) as u64;
    if pod.memory > allowed {
        return Err(refuse(
            Rule::Memory,
            format!(
                "model {} needs {}, over {:.0} % of the {} free ({})",
                pod.model,
                gb(pod.memory),
                spec.max_free_fraction * 100.0,
                gb(free),
                gb(allowed)
            ),
        ));
    }
    if let Some(p99) = gpu.ttft_p99.filter(|p| *p > spec.ttft_p99_threshold) {
        return Err(refuse(
            Rule::Latency,
            format!(
                "its engines' TTFT p99 is {} ms, over the {} ms threshold: no headroom for more load",
                p99.as_millis(),
                spec.ttft_p99_threshold.as_millis()
            ),
        ));
    }
    let running = gpu.models.len();
    if running >= spec.max_models_per_gpu as usize {
        return Err(refuse(
            Rule::ModelsPerGpu,
            format!(
                "{running} models already run there ({}), the most is {}",
                gpu.models.join(", "),
                spec.max_models_per_gpu
            ),
        ));
    }
    let shared_limit = (gpu.memory_total as f64 * spec.shared_memory_fraction) as u64;
    let together = gpu.memory_used.saturating_add(pod.memory);
    if running > 0 && together > shared_limit {
        return Err(refuse(
            Rule::SharedMemory,
            format!(
                "shared with {}, together they would use {}, over {:.0} % of its {} ({})",
                gpu.models.join(", "),
                gb(together),
                spec.shared_memory_fraction * 100.0,
                gb(gpu.memory_total),
                gb(shared_limit)
            ),
        ));
    }
    // Spreading first: an empty GPU scores 5 to 10, a shared one 0 to 5,
    // each by the share of memory left after placing.
    let left = free.saturating_sub(pod.memory) as f64 / gpu.memory_total.max(1) as f64;
    let base = if running == 0 { 5.0 } else { 0.0 };
    Ok((base + 5.0 * left).round().clamp(0.0, 10.0) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1_000_000_000;

    fn t(s: u64) -> Instant {
        Instant::ZERO + Duration::from_secs(s)
    }

    fn gpu(index: u32, used_gib: u64, models: &[&str], p99_ms: Option<u64>) -> GpuState {
        GpuState {
            index,
            memory_total: 80 * G,
            memory_used: used_gib * G,
            models: models.iter().map(|m| m.to_string()).collect(),
            ttft_p99: p99_ms.map(Duration::from_millis),
        }
    }

    fn node(gpus: Vec<GpuState>) -> NodeState {
        NodeState {
            name: "gpu-node-1".into(),
            gpus,
            read_at: Some(t(100)),
        }
    }

    fn pod(gib: u64) -> PodRequest {
        PodRequest {
            model: "llama-3.1-8b".into(),
            memory: gib * G,
        }
    }

    fn refused(r: Result<Fit, Vec<Misfit>>) -> Vec<(Rule, String)> {
        r.unwrap_err()
            .into_iter()
            .map(|r| (r.rule, r.message))
            .collect()
    }

    #[test]
    fn an_empty_gpu_is_preferred_to_a_shared_one() {
        let spec = PlacementSpec::default();
        let n = node(vec![gpu(0, 10, &["small"], Some(40)), gpu(1, 0, &[], None)]);
        let fit = assess(&spec, t(110), &n, &pod(16)).unwrap();
        assert_eq!(fit.gpu, Some(1));
        assert_eq!(fit.score, 9);
        // Alone, the shared GPU is taken, with a lower score.
        let n = node(vec![gpu(0, 10, &["small"], Some(40))]);
        let fit = assess(&spec, t(110), &n, &pod(16)).unwrap();
        assert_eq!((fit.gpu, fit.score), (Some(0), 3));
    }

    #[test]
    fn each_rule_refuses_with_its_numbers() {
        let spec = PlacementSpec::default();
        // 80 GB GPU, 60 used: 20 free, 16 allowed; the model needs 17.
        let r = refused(assess(
            &spec,
            t(110),
            &node(vec![gpu(0, 60, &[], None)]),
            &pod(17),
        ));
        assert_eq!(r[0].0, Rule::Memory);
        assert!(
            r[0].1.contains("17.0 GB") && r[0].1.contains("20.0 GB free (16.0 GB)"),
            "{}",
            r[0].1
        );
        let r = refused(assess(
            &spec,
            t(110),
            &node(vec![gpu(0, 10, &["a"], Some(210))]),
            &pod(8),
        ));
        assert_eq!(r[0].0, Rule::Latency);
        assert!(
            r[0].1.contains("210 ms") && r[0].1.contains("150 ms"),
            "{}",
            r[0].1
        );
        let r = refused(assess(
            &spec,
            t(110),
            &node(vec![gpu(0, 10, &["a", "b"], Some(50))]),
            &pod(8),
        ));
        assert_eq!(r[0].0, Rule::ModelsPerGpu);
        assert!(r[0].1.contains("a, b"), "{}", r[0].1);
        // One model using 40 of 80 GB: with 20 more, 60 > 56 (70 %).
        let r = refused(assess(
            &spec,
            t(110),
            &node(vec![gpu(0, 40, &["a"], Some(50))]),
            &pod(20),
        ));
        assert_eq!(r[0].0, Rule::SharedMemory);
        assert!(
            r[0].1.contains("60.0 GB") && r[0].1.contains("56.0 GB"),
            "{}",
            r[0].1
        );
        // Every message names the node and the GPU.
        assert!(r[0].1.starts_with("node gpu-node-1 GPU 0: "));
    }

    #[test]
    fn every_gpu_refusing_gives_one_refusal_each() {
        let spec = PlacementSpec::default();
        let n = node(vec![gpu(0, 75, &[], None), gpu(1, 10, &["a", "b"], None)]);
        let r = refused(assess(&spec, t(110), &n, &pod(8)));
        assert_eq!(
            r.iter().map(|(rule, _)| *rule).collect::<Vec<_>>(),
            [Rule::Memory, Rule::ModelsPerGpu]
        );
        let empty = NodeState {
            gpus: Vec::new(),
            ..node(Vec::new())
        };
        assert_eq!(
            refused(assess(&spec, t(110), &empty, &pod(1)))[0].0,
            Rule::NoGpu
        );
    }

    #[test]
    fn a_stale_or_missing_reading_follows_on_stale() {
        let n = node(vec![gpu(0, 75, &[], None)]);
        let allow = PlacementSpec::default();
        // 31 s old: allowed unchecked, whatever the GPU says.
        assert_eq!(
            assess(&allow, t(131), &n, &pod(40)),
            Ok(Fit {
                gpu: None,
                score: 0
            })
        );
        let refuse = PlacementSpec {
            on_stale: OnStale::Refuse,
            ..PlacementSpec::default()
        };
        let r = refused(assess(&refuse, t(131), &n, &pod(1)));
        assert_eq!(r[0].0, Rule::Stale);
        assert!(r[0].1.contains("31 s old"), "{}", r[0].1);
        let never = NodeState {
            read_at: None,
            ..n.clone()
        };
        assert!(
            refused(assess(&refuse, t(131), &never, &pod(1)))[0]
                .1
                .contains("no reading")
        );
        // Within `stale_after` the rules apply.
        assert_eq!(
            refused(assess(&refuse, t(130), &n, &pod(40)))[0].0,
            Rule::Memory
        );
    }
}
