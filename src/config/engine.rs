//! The parameters of a simulated engine, as a pool's `sim` backends give
//! them in the policy: what `fairway sim-backend`, the in-process
//! backends and the replay model run with.

use std::time::Duration;

use serde::Serialize;

/// Engine parameters, in simulated time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EngineParams {
    /// Most sequences in the running batch (vLLM `--max-num-seqs`).
    pub max_num_seqs: u32,
    /// KV cache capacity in tokens (rounded down to whole blocks).
    pub kv_tokens: u64,
    /// Tokens per KV block (vLLM's default is 16).
    pub block_size: u32,
    /// Longest prompt + output the engine accepts (vLLM `max_model_len`).
    pub max_model_len: u32,
    /// Most prompt tokens prefilled in one step (vLLM
    /// `--max-num-batched-tokens`): later arrivals wait for the next step,
    /// so one burst of long prompts cannot stall decoding for seconds. A
    /// prompt longer than this runs alone in its step.
    pub max_num_batched_tokens: u32,
    /// Prefill throughput: prompt tokens processed per simulated second.
    pub prefill_tokens_per_s: f64,
    /// Fixed time of a step that prefills, beyond its tokens' time (a
    /// forward pass's own cost: small on a GPU, tens of milliseconds on
    /// vLLM's CPU build, where a prompt whose prefix is cached still
    /// takes that long to its first token).
    #[serde(skip)]
    pub prefill_step_base: Duration,
    /// Decode step time with one sequence in the batch.
    #[serde(skip)]
    pub decode_step_base: Duration,
    /// Extra decode step time per additional sequence in the batch.
    #[serde(skip)]
    pub decode_step_per_seq: Duration,
    /// Simulated seconds per wall second (2.0 runs twice as fast as real).
    pub time_scale: f64,
    /// LoRA adapters on the GPU at once (vLLM `--max-loras`); 0: no LoRA.
    pub max_loras: u32,
    /// Time to load an adapter onto the GPU, added to the step that does.
    #[serde(skip)]
    pub lora_load_time: Duration,
}

impl Default for EngineParams {
    fn default() -> Self {
        EngineParams {
            max_num_seqs: 64,
            kv_tokens: 65_536,
            block_size: 16,
            max_model_len: 8192,
            max_num_batched_tokens: 8192,
            prefill_tokens_per_s: 20_000.0,
            prefill_step_base: Duration::ZERO,
            decode_step_base: Duration::from_millis(10),
            decode_step_per_seq: Duration::from_micros(200),
            time_scale: 1.0,
            max_loras: 4,
            lora_load_time: Duration::from_millis(50),
        }
    }
}
