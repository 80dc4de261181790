//! What placement knows of each node: the agents' latest readings, merged
//! by node name, plus the memory reserved by bindings it allowed.
//!
//! Merging, for each node, the readings no older than `stale_after`:
//! - GPUs by index, the newest reading of each;
//! - each engine counts its model on the GPUs it names, and its TTFT p99
//!   on those GPUs (the worst one counts). An engine whose GPUs are not
//!   known counts its p99 on every GPU of the node, and its model on none
//!   (the GPU's used memory, read by NVML, still holds it);
//! - each reservation adds its model and memory to its GPU, until the
//!   node's readings show an engine of that model on that GPU, or it
//!   expires.
//!
//! A node with no fresh reading is stale, with the time of its last one;
//! a node never read is missing: `core::placement` applies `on_stale`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::agent::NodeReading;
use crate::core::placement::{GpuState, NodeState, PodRequest};
use crate::core::time::Instant;

/// One agent's last good reading.
#[derive(Clone, Debug)]
pub struct AgentEntry {
    pub reading: NodeReading,
    pub at: Instant,
}

/// Memory an allowed binding holds on a GPU until its engine shows.
#[derive(Clone, Debug, PartialEq)]
pub struct Reservation {
    pub pod: String,
    pub node: String,
    pub gpu: u32,
    pub request: PodRequest,
    pub until: Instant,
}

/// Every agent's reading, by agent URL, and the reservations.
#[derive(Debug, Default)]
pub struct Nodes {
    pub agents: HashMap<String, AgentEntry>,
    pub reservations: Vec<Reservation>,
}

impl Nodes {
    /// The node names any agent has reported.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .agents
            .values()
            .map(|a| a.reading.node.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Drops expired reservations and those whose engine now shows in a
    /// fresh reading; returns them.
    pub fn settle(&mut self, now: Instant, stale_after: Duration) -> Vec<Reservation> {
        let agents = &self.agents;
        let (keep, ended) = std::mem::take(&mut self.reservations)
            .into_iter()
            .partition(|r| {
                let shown = agents.values().any(|a| {
                    now.saturating_since(a.at) <= stale_after
                        && a.reading.node == r.node
                        && a.reading.engine.as_ref().is_some_and(|e| {
                            e.model.as_deref() == Some(r.request.model.as_str())
                                && e.gpus.contains(&r.gpu)
                        })
                });
                r.until > now && !shown
            });
        self.reservations = keep;
        ended
    }

    /// `node` as the rules see it at `now`.
    pub fn state(&self, node: &str, now: Instant, stale_after: Duration) -> NodeState {
        let mine = || self.agents.values().filter(|a| a.reading.node == node);
        let last = mine().map(|a| a.at).max();
        let fresh: Vec<&AgentEntry> = mine()
            .filter(|a| now.saturating_since(a.at) <= stale_after)
            .collect();
        // Newest reading of each GPU index.
        let mut gpus: BTreeMap<u32, (Instant, GpuState)> = BTreeMap::new();
        for a in &fresh {
            for g in &a.reading.gpus {
                if gpus.get(&g.index).is_none_or(|(at, _)| *at < a.at) {
                    let state = GpuState {
                        index: g.index,
                        memory_total: g.memory_total_bytes,
                        memory_used: g.memory_used_bytes.min(g.memory_total_bytes),
                        models: Vec::new(),
                        ttft_p99: None,
                    };
                    gpus.insert(g.index, (a.at, state));
                }
            }
        }
        let mut gpus: Vec<GpuState> = gpus.into_values().map(|(_, g)| g).collect();
        for engine in fresh.iter().filter_map(|a| a.reading.engine.as_ref()) {
            let p99 = engine
                .ttft_p99_seconds
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64);
            for gpu in gpus.iter_mut() {
                let on_it = engine.gpus.contains(&gpu.index);
                if on_it || engine.gpus.is_empty() {
                    gpu.ttft_p99 = gpu.ttft_p99.max(p99);
                }
                if on_it {
                    let model = engine.model.clone().unwrap_or_else(|| "an engine".into());
                    gpu.models.push(model);
                }
            }
        }
        for r in self.reservations.iter().filter(|r| r.node == node) {
            if let Some(gpu) = gpus.iter_mut().find(|g| g.index == r.gpu) {
                gpu.memory_used = gpu.memory_used.saturating_add(r.request.memory);
                gpu.models
                    .push(format!("{} (reserved for {})", r.request.model, r.pod));
            }
        }
        // A node whose readings are all stale has no GPUs here and keeps
        // the time of its last reading, for the message.
        NodeState {
            name: node.to_owned(),
            gpus,
            read_at: last,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::EngineOnNode;
    use crate::poller::dialect::AgentGpu;

    const G: u64 = 1_000_000_000;
    const STALE: Duration = Duration::from_secs(30);

    fn t(s: u64) -> Instant {
        Instant::ZERO + Duration::from_secs(s)
    }

    fn gpu(index: u32, used: u64) -> AgentGpu {
        AgentGpu {
            index,
            name: "g".into(),
            memory_used_bytes: used * G,
            memory_total_bytes: 80 * G,
            utilization: 0.0,
        }
    }

    fn engine(model: &str, gpus: &[u32], p99_ms: Option<u64>) -> EngineOnNode {
        EngineOnNode {
            model: Some(model.into()),
            gpus: gpus.to_vec(),
            ttft_p99_seconds: p99_ms.map(|ms| ms as f64 / 1000.0),
            ..EngineOnNode::default()
        }
    }

    fn agent(nodes: &mut Nodes, url: &str, at: u64, gpus: Vec<AgentGpu>, e: Option<EngineOnNode>) {
        nodes.agents.insert(
            url.into(),
            AgentEntry {
                reading: NodeReading {
                    node: "n1".into(),
                    gpus,
                    engine: e,
                },
                at: t(at),
            },
        );
    }

    #[test]
    fn agents_of_a_node_merge_by_gpu_and_engine() {
        let mut n = Nodes::default();
        agent(&mut n, "node", 100, vec![gpu(0, 10), gpu(1, 0)], None);
        agent(
            &mut n,
            "e1",
            100,
            vec![],
            Some(engine("llama", &[0], Some(40))),
        );
        agent(
            &mut n,
            "e2",
            100,
            vec![],
            Some(engine("qwen", &[], Some(90))),
        );
        let s = n.state("n1", t(110), STALE);
        assert_eq!(s.read_at, Some(t(100)));
        assert_eq!(s.gpus.len(), 2);
        assert_eq!(s.gpus[0].models, ["llama"]);
        assert!(s.gpus[1].models.is_empty());
        // The engine with unknown GPUs weighs on both.
        assert_eq!(s.gpus[0].ttft_p99, Some(Duration::from_millis(90)));
        assert_eq!(s.gpus[1].ttft_p99, Some(Duration::from_millis(90)));
        assert_eq!(s.gpus[0].memory_used, 10 * G);
    }

    #[test]
    fn stale_readings_leave_a_stale_node_and_unknown_nodes_are_missing() {
        let mut n = Nodes::default();
        agent(&mut n, "node", 100, vec![gpu(0, 10)], None);
        let s = n.state("n1", t(200), STALE);
        assert_eq!((s.read_at, s.gpus.len()), (Some(t(100)), 0));
        assert_eq!(n.state("other", t(200), STALE).read_at, None);
    }

    #[test]
    fn a_reservation_holds_until_its_engine_shows_or_it_expires() {
        let mut n = Nodes::default();
        agent(&mut n, "node", 100, vec![gpu(0, 10)], None);
        n.reservations.push(Reservation {
            pod: "models/p".into(),
            node: "n1".into(),
            gpu: 0,
            request: PodRequest {
                model: "llama".into(),
                memory: 20 * G,
            },
            until: t(700),
        });
        n.settle(t(101), STALE);
        let s = n.state("n1", t(101), STALE);
        assert_eq!(s.gpus[0].memory_used, 30 * G);
        assert_eq!(s.gpus[0].models, ["llama (reserved for models/p)"]);
        // The engine shows: the reading holds it from now on.
        agent(&mut n, "e1", 120, vec![], Some(engine("llama", &[0], None)));
        n.settle(t(121), STALE);
        assert!(n.reservations.is_empty());
        // Expiry.
        n.reservations.push(Reservation {
            pod: "models/q".into(),
            node: "n1".into(),
            gpu: 0,
            request: PodRequest {
                model: "other".into(),
                memory: G,
            },
            until: t(130),
        });
        n.settle(t(130), STALE);
        assert!(n.reservations.is_empty());
    }
}
