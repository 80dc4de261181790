//! Workload generators: the reference scenario and scenario files.
//!
//! A scenario is a list of tenants, each with an arrival pattern and token
//! sizes; [`Scenario::generate`] turns it into a workload, deterministically
//! for a seed. The built-in `reference` scenario is DESIGN.md's reference
//! workload; `config/scenarios/reference.toml` is the same thing as a file
//! (a test keeps them equal), a starting point for an operator's own.
//!
//! ```toml
//! duration = "300s"          # arrivals stop here; the replay runs until drained
//! model = "llama-3.1-8b-sim" # optional: default is the policy's first pool
//!
//! [[tenants]]
//! name = "api"
//! arrivals = { poisson = { rate = 6.0 } }                 # requests/s
//! prompt_tokens = [200, 600]                              # uniform, inclusive
//! output_tokens = [80, 200]
//! max_tokens = 256                                        # optional
//! stream = true
//! model = "sql-lora"                                      # optional: this tenant's model or adapter
//!
//! [[tenants]]
//! name = "chat"
//! arrivals = { bursts = { every = "30s", size = 120, spread = "3s", start = "5s" } }
//!
//! [[tenants]]
//! name = "evals"
//! arrivals = { batch = { at = "30s", count = 4000 } }
//! # or a closed loop: 4 clients, each sending its next request when its
//! # previous one ends, 240 in all
//! # arrivals = { closed = { clients = 4, requests = 240 } }
//! prefix = { groups = 3, tokens = 1500 }    # optional: each prompt starts with one of 3 shared 1,500-token headers
//!
//! [[tenants]]
//! name = "assistant"
//! arrivals = { poisson = { rate = 0.5 } }   # conversations started per second
//! conversation = { turns = 6, gap = "20s" } # optional: 6 turns 20 s apart, each resending the conversation so far
//! ```
//!
//! With `prefix`, a prompt is the group's shared tokens followed by
//! `prompt_tokens` of its own (inference-perf's `shared_prefix` data:
//! system prompt, then question). With `conversation`, each arrival starts
//! a conversation; turn k's prompt is the whole conversation so far (every
//! earlier question and answer) followed by its own `prompt_tokens`, as a
//! chat client resends it.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

use crate::replay::workload::{Segment, WorkRequest};

/// A shared token stream's id: the tenant's, of this kind and number.
fn stream_id(tenant: &str, kind: &str, n: u64) -> u64 {
    let name = format!("{tenant}/{kind}");
    xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), n)
}

/// A generated workload's recipe.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(with = "dur")]
    pub duration: Duration,
    #[serde(default)]
    pub model: Option<String>,
    pub tenants: Vec<TenantLoad>,
}

/// One tenant's traffic.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLoad {
    pub name: String,
    pub arrivals: Arrivals,
    /// Inclusive uniform range.
    pub prompt_tokens: [u32; 2],
    /// Inclusive uniform range (the engine generates exactly this many).
    pub output_tokens: [u32; 2],
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    /// The model (or LoRA adapter) it calls; default: the scenario's.
    #[serde(default)]
    pub model: Option<String>,
    /// Shared prompt prefixes (see the module docs).
    #[serde(default)]
    pub prefix: Option<PrefixGroups>,
    /// Multi-turn conversations (see the module docs).
    #[serde(default)]
    pub conversation: Option<Conversation>,
    /// `true`: the tenant hands its requests over as a batch (the Batch
    /// API) rather than sending them live: they wait in the pools' batch
    /// lane.
    #[serde(default)]
    pub batch_api: bool,
}

/// `groups` shared prefixes of `tokens` tokens each, one per request,
/// chosen uniformly.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixGroups {
    pub groups: u32,
    pub tokens: u32,
}

/// `turns` requests per conversation, `gap` apart.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conversation {
    pub turns: u32,
    #[serde(with = "dur")]
    pub gap: Duration,
}

/// When a tenant's requests arrive.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Arrivals {
    /// Steady Poisson arrivals at `rate` requests per second.
    Poisson { rate: f64 },
    /// `size` requests spread uniformly over `spread`, every `every` from `start`.
    Bursts {
        #[serde(with = "dur")]
        every: Duration,
        size: u32,
        #[serde(with = "dur")]
        spread: Duration,
        #[serde(default, with = "dur")]
        start: Duration,
    },
    /// `count` requests at one instant.
    Batch {
        #[serde(with = "dur")]
        at: Duration,
        count: u32,
    },
    /// A closed loop: `clients` clients from the start, each sending its
    /// next request as soon as its previous one ends, `requests` in all
    /// (the duration does not stop them).
    Closed { clients: u32, requests: u32 },
}

/// The reference workload (DESIGN.md): `api` steady Poisson with a tight
/// SLO, `chat` bursty, `evals` thousands at once. Sized for
/// `config/reference.toml`'s four backends: api and chat alone use about a
/// third of the cluster; the evals dump saturates it for minutes.
pub fn reference() -> Scenario {
    Scenario {
        duration: Duration::from_secs(300),
        model: None,
        tenants: vec![
            TenantLoad {
                name: "api".into(),
                arrivals: Arrivals::Poisson { rate: 6.0 },
                prompt_tokens: [200, 600],
                output_tokens: [80, 200],
                max_tokens: Some(256),
                stream: true,
                model: None,
                prefix: None,
                conversation: None,
                batch_api: false,
            },
            TenantLoad {
                name: "chat".into(),
                arrivals: Arrivals::Bursts {
                    every: Duration::from_secs(30),
                    size: 120,
                    spread: Duration::from_secs(3),
                    start: Duration::from_secs(5),
                },
                prompt_tokens: [300, 1200],
                output_tokens: [100, 400],
                max_tokens: Some(512),
                stream: true,
                model: None,
                prefix: None,
                conversation: None,
                batch_api: false,
            },
            TenantLoad {
                name: "evals".into(),
                arrivals: Arrivals::Batch {
                    at: Duration::from_secs(30),
                    count: 4000,
                },
                prompt_tokens: [500, 1500],
                output_tokens: [100, 300],
                max_tokens: Some(300),
                stream: false,
                model: None,
                prefix: None,
                conversation: None,
                batch_api: false,
            },
        ],
    }
}

/// Why a scenario file cannot be played: the operator's file, refused
/// before anything runs.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Not TOML of a scenario's shape.
    #[error(transparent)]
    Toml(toml::de::Error),
    /// A tenant's settings cannot make a workload; `rule` says which.
    #[error("tenant {tenant}: {rule}")]
    Tenant { tenant: String, rule: &'static str },
}

impl Scenario {
    /// Reads a scenario file (TOML).
    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        let s: Scenario = toml::from_str(text).map_err(ScenarioError::Toml)?;
        s.check()?;
        Ok(s)
    }

    fn check(&self) -> Result<(), ScenarioError> {
        for t in &self.tenants {
            let broken = |rule| ScenarioError::Tenant {
                tenant: t.name.clone(),
                rule,
            };
            let bad_range = |r: [u32; 2]| r[0] > r[1];
            if bad_range(t.prompt_tokens) || bad_range(t.output_tokens) || t.output_tokens[0] == 0 {
                return Err(broken(
                    "token ranges are [low, high] with low ≤ high and output ≥ 1",
                ));
            }
            match &t.arrivals {
                Arrivals::Poisson { rate } if !(rate.is_finite() && *rate > 0.0) => {
                    return Err(broken("poisson rate must be > 0"));
                }
                Arrivals::Bursts { every, .. } if every.is_zero() => {
                    return Err(broken("bursts need every > 0"));
                }
                Arrivals::Closed { clients: 0, .. } => {
                    return Err(broken("a closed loop needs clients ≥ 1"));
                }
                _ => {}
            }
            if t.prefix.as_ref().is_some_and(|p| p.groups == 0) {
                return Err(broken("prefix needs groups ≥ 1"));
            }
            if t.conversation.as_ref().is_some_and(|c| c.turns == 0) {
                return Err(broken("conversation needs turns ≥ 1"));
            }
        }
        Ok(())
    }

    /// The workload, sorted by arrival. Each tenant draws from its own RNG
    /// stream (seed and tenant index), so adding a tenant leaves the others'
    /// requests unchanged.
    pub fn generate(&self, default_model: &str, seed: u64) -> Vec<WorkRequest> {
        let model = self.model.as_deref().unwrap_or(default_model);
        let end = self.duration.as_secs_f64();
        let mut out = Vec::new();
        for (i, t) in self.tenants.iter().enumerate() {
            let mut rng = SmallRng::seed_from_u64(
                seed ^ (0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(i as u64 + 1)),
            );
            let mut times = Vec::new();
            match &t.arrivals {
                Arrivals::Poisson { rate } => {
                    let mut at = 0.0;
                    loop {
                        // Exponential gaps; 1 - U is in (0, 1].
                        at += -(1.0 - rng.random::<f64>()).ln() / rate;
                        if at >= end {
                            break;
                        }
                        times.push(at);
                    }
                }
                Arrivals::Bursts {
                    every,
                    size,
                    spread,
                    start,
                } => {
                    let mut b = start.as_secs_f64();
                    while b < end {
                        for _ in 0..*size {
                            times.push(b + rng.random::<f64>() * spread.as_secs_f64());
                        }
                        b += every.as_secs_f64();
                    }
                }
                Arrivals::Batch { at, count } => {
                    if at.as_secs_f64() < end {
                        times.extend(std::iter::repeat_n(at.as_secs_f64(), *count as usize));
                    }
                }
                Arrivals::Closed { requests, .. } => {
                    // Order only: each waits for its client's previous
                    // request (a conversation's turns one after another).
                    let turns = t.conversation.as_ref().map_or(1, |c| c.turns);
                    times.extend((0..*requests).map(|n| f64::from(n * turns) * 1e-9));
                }
            }
            // Request n of a closed loop is client n mod clients's.
            let client = |n: usize| match t.arrivals {
                Arrivals::Closed { clients, .. } => Some(stream_id(
                    &t.name,
                    "client",
                    (n % clients.max(1) as usize) as u64,
                )),
                _ => None,
            };
            let model = t.model.as_deref().unwrap_or(model);
            for (n, at) in times.into_iter().enumerate() {
                if t.prefix.is_none() && t.conversation.is_none() {
                    out.push(WorkRequest {
                        t: at,
                        tenant: t.name.clone(),
                        model: model.to_owned(),
                        prompt_tokens: rng.random_range(t.prompt_tokens[0]..=t.prompt_tokens[1]),
                        max_tokens: t.max_tokens,
                        output_tokens: rng.random_range(t.output_tokens[0]..=t.output_tokens[1]),
                        stream: t.stream,
                        prefix: Vec::new(),
                        batch: t.batch_api,
                        client: client(n),
                    });
                    continue;
                }
                let mut prefix = Vec::new();
                if let Some(p) = &t.prefix {
                    let g = rng.random_range(0..p.groups);
                    prefix.push(Segment {
                        stream: stream_id(&t.name, "group", u64::from(g)),
                        tokens: p.tokens,
                    });
                }
                let (turns, gap) = t
                    .conversation
                    .as_ref()
                    .map_or((1, 0.0), |c| (c.turns, c.gap.as_secs_f64()));
                let conversation = stream_id(&t.name, "conversation", seed ^ n as u64);
                let mut history = 0u32;
                let closed = matches!(t.arrivals, Arrivals::Closed { .. });
                for k in 0..turns {
                    let at = if closed {
                        at + f64::from(k) * 1e-9
                    } else {
                        at + f64::from(k) * gap
                    };
                    let question = rng.random_range(t.prompt_tokens[0]..=t.prompt_tokens[1]);
                    let output = rng.random_range(t.output_tokens[0]..=t.output_tokens[1]);
                    if at >= end {
                        break;
                    }
                    let mut prefix = prefix.clone();
                    if t.conversation.is_some() {
                        prefix.push(Segment {
                            stream: conversation,
                            tokens: history + question,
                        });
                    }
                    let shared: u32 = prefix.iter().map(|s| s.tokens).sum();
                    out.push(WorkRequest {
                        t: at,
                        tenant: t.name.clone(),
                        model: model.to_owned(),
                        prompt_tokens: if t.conversation.is_some() {
                            shared
                        } else {
                            shared + question
                        },
                        max_tokens: t.max_tokens,
                        output_tokens: output,
                        stream: t.stream,
                        prefix,
                        batch: t.batch_api,
                        client: client(n),
                    });
                    history += question + output;
                }
            }
        }
        out.sort_by(|a, b| a.t.total_cmp(&b.t));
        out
    }
}

/// Durations as humantime strings ("30s", "250ms").
mod dur {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_file_is_the_built_in_reference() {
        let text = include_str!("../../config/scenarios/reference.toml");
        assert_eq!(Scenario::from_toml(text).unwrap(), reference());
    }

    #[test]
    fn generation_is_deterministic_and_shaped() {
        let s = reference();
        let a = s.generate("m", 7);
        assert_eq!(a, s.generate("m", 7));
        assert_ne!(a, s.generate("m", 8));
        let count = |n: &str| a.iter().filter(|r| r.tenant == n).count();
        // api: Poisson at 6/s over 300 s.
        assert!((1600..2000).contains(&count("api")), "{}", count("api"));
        assert_eq!(count("chat"), 10 * 120);
        assert_eq!(count("evals"), 4000);
        assert!(a.windows(2).all(|w| w[0].t <= w[1].t));
        assert!(a.iter().all(|r| r.output_tokens >= 80 && r.model == "m"));
    }

    #[test]
    fn bad_scenarios_are_refused() {
        assert!(Scenario::from_toml("duration = \"1s\"\ntenants = []\ncolour = 1\n").is_err());
        let bad = r#"duration = "10s"
[[tenants]]
name = "a"
arrivals = { poisson = { rate = 0.0 } }
prompt_tokens = [1, 2]
output_tokens = [1, 2]
"#;
        assert!(
            Scenario::from_toml(bad)
                .unwrap_err()
                .to_string()
                .contains("rate")
        );
    }
}
