//! `GET /node`: what `fairway placement` reads from each agent.
//!
//! A node agent (a DaemonSet, no engine) reports the node's GPUs; an agent
//! beside an engine also reports the engine's model, the GPUs it runs on
//! and its TTFT p99. Placement merges every agent of a node by its name.
//! Unknown fields are ignored on reading, so newer agents stay readable.

use serde::{Deserialize, Serialize};

use crate::poller::dialect::AgentGpu;

/// The document `GET /node` serves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeReading {
    /// The Kubernetes node name.
    pub node: String,
    /// The GPUs this agent can read (NVML, or simulated); empty for an
    /// agent that sees none, such as a sidecar without GPU access.
    #[serde(default)]
    pub gpus: Vec<AgentGpu>,
    /// The engine beside this agent; `None` for a node agent.
    #[serde(default)]
    pub engine: Option<EngineOnNode>,
}

/// One engine on the node, as placement counts it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineOnNode {
    /// The served model: `--model`, else the one the engine's metrics
    /// name; `None` when neither says.
    pub model: Option<String>,
    /// The node's indices of the GPUs it runs on (`--engine-gpus`);
    /// empty: not known.
    #[serde(default)]
    pub gpus: Vec<u32>,
    /// TTFT p99 since the previous `/node` request, seconds.
    pub ttft_p99_seconds: Option<f64>,
    /// KV-cache usage, 0..1.
    pub kv_usage: Option<f64>,
    /// Why the engine could not be read this time; the latency and KV
    /// fields are then empty.
    pub error: Option<String>,
}

/// This host's name, the default node name outside Kubernetes (where
/// `NODE_NAME` comes from the downward API).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Why `--simulate-gpus` does not read: the operator's flag, refused
/// before the agent starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimulatedGpusError {
    /// A GPU that is not `TOTAL_GB:USED_GB`.
    #[error("`{0}`: expected TOTAL_GB:USED_GB")]
    NotAPair(String),
    /// A size that is not a finite, non-negative number.
    #[error("`{0}` is not a number of GB")]
    NotGb(String),
    /// A total of zero, or below the used memory.
    #[error("`{0}`: the total must be above zero and at least the used memory")]
    Sizes(String),
}

/// Reads `--simulate-gpus`: one `TOTAL:USED` pair per GPU in decimal GB,
/// comma-separated, e.g. `80:20,80:0`. Index is the position.
pub fn parse_simulated_gpus(text: &str) -> Result<Vec<AgentGpu>, SimulatedGpusError> {
    text.split(',')
        .enumerate()
        .map(|(index, one)| {
            let (total, used) = one
                .trim()
                .split_once(':')
                .ok_or_else(|| SimulatedGpusError::NotAPair(one.to_owned()))?;
            let gb = |s: &str| -> Result<u64, SimulatedGpusError> {
                match s.trim().parse::<f64>() {
                    Ok(v) if v.is_finite() && v >= 0.0 => Ok((v * 1e9) as u64),
                    _ => Err(SimulatedGpusError::NotGb(s.to_owned())),
                }
            };
            let (total, used) = (gb(total)?, gb(used)?);
            if total == 0 || used > total {
                return Err(SimulatedGpusError::Sizes(one.to_owned()));
            }
            Ok(AgentGpu {
                index: index as u32,
                name: "simulated GPU".to_owned(),
                memory_used_bytes: used,
                memory_total_bytes: total,
                utilization: 0.0,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_gpus_parse_and_refuse_nonsense() {
        let gpus = parse_simulated_gpus("80:20, 141:0").unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(
            (
                gpus[1].index,
                gpus[1].memory_total_bytes,
                gpus[0].memory_used_bytes
            ),
            (1, 141_000_000_000, 20_000_000_000)
        );
        for bad in ["", "80", "80:90", "0:0", "x:1", "80:-1", "80:20,"] {
            assert!(parse_simulated_gpus(bad).is_err(), "{bad}");
        }
    }
}
