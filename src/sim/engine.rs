//! A vLLM-like engine model as a sans-IO step function over simulated time.
//!
//! Owns one model replica's scheduler state: the FIFO waiting queue, the
//! running batch, the KV block pool and the step clock. It does not own any
//! I/O, clock, task or channel: every method takes the caller's `now`, and
//! what happened comes back as [`EngineEvent`]s, so the HTTP backend
//! (`sim::backend`) and the offline replay drive the same model.
//!
//! Model (after vLLM V1's scheduler with recompute preemption):
//! - Continuous batching: a step starts when the engine is idle and has work,
//!   or right when the previous step ends. At step start the head of the
//!   waiting queue is admitted while the batch has room and the KV pool has
//!   blocks for its tokens plus one; nobody skips the head.
//! - Step time = prefill tokens this step / `prefill_tokens_per_s`, plus
//!   `prefill_step_base` when it prefills any, plus one decode step
//!   (`decode_step_base + decode_step_per_seq × (batch − 1)`) when any
//!   sequence in the batch is decoding.
//! - At step end every sequence in the batch emits one token (a newly
//!   prefilled one its first). A sequence that needs a new block when none is
//!   free preempts the most recently admitted running sequence, which goes
//!   back to the head of the queue and re-prefills prompt + generated tokens.
//!
//! - LoRA (vLLM's `--max-loras`): at most `max_loras` adapters are on the
//!   GPU at once. A waiting sequence whose adapter is not loaded gets a
//!   free slot, or the least recently used adapter that no running
//!   sequence uses; loading it adds `lora_load_time` to the step. When
//!   every slot is held by running sequences it is skipped for this step
//!   (as vLLM's scheduler does) and those behind it may go first.
//!
//! - Prefix caching (vLLM's automatic prefix caching, `cache.rs`): a
//!   sequence brings its prompt's block keys; at admission its leading
//!   cached blocks are taken instead of prefilled (at most the prompt
//!   less one token, as vLLM always computes the last), its other full
//!   prompt blocks are cached once prefilled, and blocks stay cached after
//!   their sequences end until evicted, least recently used first, when
//!   an empty block is needed. `cached_tokens` is reported per sequence,
//!   and the hit rate as vLLM's `prefix_cache_queries`/`_hits` counters.
//!
//! Invariant: each running sequence holds `ceil(tokens_in_kv / block_size)`
//! blocks, of which its first `shared` prompt blocks may be shared with
//! other sequences through the cache; `kv_blocks_used` counts each block
//! once; the free blocks include the idle cached ones. Work per step is
//! O(batch); no allocation per token.

use std::collections::VecDeque;
use std::time::Duration;

use crate::config::EngineParams;
use crate::core::time::Instant;

mod cache;
mod changes;

use cache::PrefixCache;
pub use changes::{CacheChange, StoredPrompt, kv_events};

/// One generation request as the engine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqRequest {
    /// Caller-chosen id, unique among the engine's live sequences.
    pub id: u64,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Tokens to generate before the sequence finishes (at least 1).
    pub output_tokens: u32,
    /// The LoRA adapter it runs with (caller-chosen ids), if any.
    pub adapter: Option<u32>,
    /// The keys of its prompt's full blocks at the engine's block size
    /// (`crate::tokens::request_keys`); empty: nothing of it is cached or
    /// cacheable.
    pub prefix: Vec<u64>,
}

/// Why [`Engine::submit`] refused a sequence.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// Prompt plus output exceed the model's context length.
    #[error(
        "requested {requested} tokens ({prompt} prompt + {output} output), max_model_len is {max_model_len}"
    )]
    ContextTooLong {
        /// Prompt plus output tokens.
        requested: u64,
        /// Prompt tokens.
        prompt: u32,
        /// Output tokens.
        output: u32,
        /// The engine's limit.
        max_model_len: u32,
    },
    /// The sequence could never fit in the KV cache, even alone.
    #[error("sequence needs {needed_blocks} KV blocks, the cache has {total_blocks}")]
    ExceedsKvCache {
        /// Blocks for prompt plus output.
        needed_blocks: u64,
        /// Blocks in the whole cache.
        total_blocks: u64,
    },
    /// `output_tokens` was zero.
    #[error("output_tokens must be at least 1")]
    NoOutput,
    /// The sequence names an adapter and the engine has no LoRA slots.
    #[error("LoRA is not enabled on this engine (max_loras is 0)")]
    LoraDisabled,
}

/// Something that happened inside the engine, at simulated time `at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineEvent {
    /// The sequence entered the running batch (again, after a preemption).
    Admitted {
        /// Sequence id.
        id: u64,
        /// Step start.
        at: Instant,
        /// Prompt tokens found in the prefix cache at its first admission.
        cached_tokens: u32,
    },
    /// The sequence produced its `index`-th token (1-based).
    Token {
        /// Sequence id.
        id: u64,
        /// 1-based token index.
        index: u32,
        /// Step end.
        at: Instant,
    },
    /// The sequence lost its KV blocks and went back to the queue head.
    Preempted {
        /// Sequence id.
        id: u64,
        /// Step end.
        at: Instant,
    },
    /// The sequence produced its last token and freed its blocks.
    Finished {
        /// Sequence id.
        id: u64,
        /// Step end.
        at: Instant,
        /// Prompt tokens.
        prompt_tokens: u32,
        /// Generated tokens.
        completion_tokens: u32,
        /// Prompt tokens found in the prefix cache at its first admission.
        cached_tokens: u32,
    },
}

/// A snapshot of the engine's state and counters, as vLLM exports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Sequences in the running batch.
    pub running: u32,
    /// Sequences waiting (new or preempted).
    pub waiting: u32,
    /// KV blocks held by running sequences.
    pub kv_blocks_used: u64,
    /// KV blocks in the cache.
    pub kv_blocks_total: u64,
    /// Tokens per block.
    pub block_size: u32,
    /// Recompute preemptions so far.
    pub preemptions_total: u64,
    /// Requests the engine took (each submission, preempted or not).
    pub submitted_total: u64,
    /// Prompt tokens of admitted requests, counted once per request.
    pub prompt_tokens_total: u64,
    /// Tokens generated so far.
    pub generation_tokens_total: u64,
    /// Sequences that produced all their tokens.
    pub finished_total: u64,
    /// LoRA adapters loaded onto the GPU (each load counted).
    pub lora_loads_total: u64,
    /// Prompt tokens looked up in the prefix cache (vLLM's
    /// `prefix_cache_queries`), and those found (`prefix_cache_hits`).
    pub prefix_cache_queries_total: u64,
    pub prefix_cache_hits_total: u64,
    /// Prompt tokens prefilled (computed, not taken from the cache).
    pub prefill_tokens_total: u64,
}

/// A sequence's state, waiting or running.
#[derive(Clone, Debug)]
struct Seq {
    id: u64,
    prompt_tokens: u32,
    output_tokens: u32,
    generated: u32,
    /// KV blocks held (0 while waiting), `shared` of them through the cache.
    blocks: u64,
    /// Its prompt's block keys.
    prefix: Box<[u64]>,
    /// Leading prompt blocks it holds through the cache (a reference on
    /// each of `prefix[..shared]`).
    shared: usize,
    /// Prompt tokens found cached at its first admission.
    cached_tokens: u32,
    /// Admitted at this step's start: its prompt (+ generated) is prefilled.
    is_prefilling: bool,
    /// Prompt tokens were already counted in `prompt_tokens_total`.
    has_counted_prompt: bool,
    adapter: Option<u32>,
}

impl Seq {
    /// Tokens whose KV the next step needs: the prompt and every generated
    /// token but the newest (whose KV the next step writes).
    fn tokens_in_kv(&self) -> u64 {
        u64::from(self.prompt_tokens) + u64::from(self.generated)
    }
}

/// Where the step clock is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StepClock {
    /// No step and no work.
    Idle,
    /// A step starts at this time (work arrived while idle).
    StartAt(Instant),
    /// A step is running and ends at this time.
    Stepping { end: Instant },
}

/// The engine: one model replica's batch scheduler in simulated time.
#[derive(Debug)]
pub struct Engine {
    params: EngineParams,
    block_size: u64,
    blocks_total: u64,
    blocks_free: u64,
    /// Simulated nanoseconds per prefill token.
    prefill_ns_per_token: f64,
    waiting: VecDeque<Seq>,
    /// Oldest admission first; the youngest is the last.
    running: Vec<Seq>,
    phase: StepClock,
    stats: EngineStats,
    /// Adapters on the GPU, least recently used first.
    loras: Vec<u32>,
    cache: PrefixCache,
    /// Keys evicted from the cache (scratch).
    evicted: Vec<u64>,
    /// The cache's changes since last taken, when recorded (for KV events).
    changes: Option<Vec<CacheChange>>,
}

impl Engine {
    /// An idle engine with an empty KV cache of `kv_tokens / block_size` blocks.
    pub fn new(params: EngineParams) -> Self {
        let block_size = u64::from(params.block_size.max(1));
        let blocks_total = params.kv_tokens / block_size;
        let prefill_ns_per_token =
            if params.prefill_tokens_per_s.is_finite() && params.prefill_tokens_per_s > 0.0 {
                1e9 / params.prefill_tokens_per_s
            } else {
                0.0
            };
        Engine {
            block_size,
            blocks_total,
            blocks_free: blocks_total,
            prefill_ns_per_token,
            waiting: VecDeque::new(),
            running: Vec::with_capacity(params.max_num_seqs as usize),
            phase: StepClock::Idle,
            loras: Vec::new(),
            cache: PrefixCache::default(),
            evicted: Vec::new(),
            changes: None,
            stats: EngineStats {
                kv_blocks_total: blocks_total,
                block_size: params.block_size.max(1),
                ..EngineStats::default()
            },
            params,
        }
    }

    /// The parameters the engine was built with.
    pub fn params(&self) -> &EngineParams {
        &self.params
    }

    /// Queues `req` at the tail of the waiting queue, or refuses it.
    ///
    /// Call [`advance`](Self::advance) up to `now` first; an idle engine
    /// starts its next step at `now` (reported by the next `advance`).
    pub fn submit(&mut self, now: Instant, req: SeqRequest) -> Result<(), EngineError> {
        if req.output_tokens == 0 {
            return Err(EngineError::NoOutput);
        }
        if req.adapter.is_some() && self.params.max_loras == 0 {
            return Err(EngineError::LoraDisabled);
        }
        let requested = u64::from(req.prompt_tokens) + u64::from(req.output_tokens);
        if requested > u64::from(self.params.max_model_len) {
            return Err(EngineError::ContextTooLong {
                requested,
                prompt: req.prompt_tokens,
                output: req.output_tokens,
                max_model_len: self.params.max_model_len,
            });
        }
        // Checked against prompt + output, not the prompt alone: a sequence
        // that outgrows the whole cache preempts itself forever.
        let needed_blocks = self.blocks_for(requested);
        if needed_blocks > self.blocks_total {
            return Err(EngineError::ExceedsKvCache {
                needed_blocks,
                total_blocks: self.blocks_total,
            });
        }
        self.stats.submitted_total += 1;
        self.waiting.push_back(Seq {
            id: req.id,
            prompt_tokens: req.prompt_tokens,
            output_tokens: req.output_tokens,
            generated: 0,
            blocks: 0,
            prefix: req.prefix.into_boxed_slice(),
            shared: 0,
            cached_tokens: 0,
            is_prefilling: false,
            has_counted_prompt: false,
            adapter: req.adapter,
        });
        if self.phase == StepClock::Idle {
            self.phase = StepClock::StartAt(now);
        }
        Ok(())
    }

    /// Removes sequence `id` wherever it is and frees its blocks; returns
    /// whether it was there. The running step keeps its end time.
    pub fn cancel(&mut self, id: u64) -> bool {
        if let Some(pos) = self.running.iter().position(|s| s.id == id) {
            let mut seq = self.running.remove(pos);
            self.release(&mut seq);
            return true;
        }
        if let Some(pos) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(pos);
            return true;
        }
        false
    }

    /// When the engine next needs [`advance`](Self::advance): the current
    /// step's end, or a pending step start; `None` when idle.
    pub fn next_event_at(&self) -> Option<Instant> {
        match self.phase {
            StepClock::Idle => None,
            StepClock::StartAt(t) => Some(t),
            StepClock::Stepping { end } => Some(end),
        }
    }

    /// Runs every step start and end at or before `now`, in order, pushing
    /// what happened onto `out`. Each step starts at the previous step's end.
    pub fn advance(&mut self, now: Instant, out: &mut Vec<EngineEvent>) {
        loop {
            match self.phase {
                StepClock::StartAt(t) if t <= now => self.start_step(t, out),
                StepClock::Stepping { end } if end <= now => {
                    self.end_step(end, out);
                    self.phase = if self.has_work() {
                        StepClock::StartAt(end)
                    } else {
                        StepClock::Idle
                    };
                }
                StepClock::Idle | StepClock::StartAt(_) | StepClock::Stepping { .. } => return,
            }
        }
    }

    /// Counters and gauges, as vLLM exports them.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            running: u32::try_from(self.running.len()).unwrap_or(u32::MAX),
            waiting: u32::try_from(self.waiting.len()).unwrap_or(u32::MAX),
            kv_blocks_used: self.blocks_total - self.blocks_free,
            ..self.stats
        }
    }

    /// The adapters on the GPU, least recently used first.
    pub fn loaded_adapters(&self) -> &[u32] {
        &self.loras
    }

    /// The adapters of running and waiting sequences, each once.
    pub fn active_adapters(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .running
            .iter()
            .chain(self.waiting.iter())
            .filter_map(|s| s.adapter)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Makes `adapter` resident for a sequence about to run: `Some(true)`
    /// when it had to be loaded, `None` when every slot is held by a
    /// running sequence's adapter.
    fn make_resident(&mut self, adapter: u32) -> Option<bool> {
        if let Some(i) = self.loras.iter().position(|&a| a == adapter) {
            let a = self.loras.remove(i);
            self.loras.push(a);
            return Some(false);
        }
        if self.loras.len() >= self.params.max_loras as usize {
            let running = &self.running;
            let idle = self
                .loras
                .iter()
                .position(|&a| !running.iter().any(|s| s.adapter == Some(a)))?;
            self.loras.remove(idle);
        }
        self.loras.push(adapter);
        self.stats.lora_loads_total += 1;
        Some(true)
    }

    /// Fraction of KV blocks in use, 0..=1 (vLLM `kv_cache_usage_perc`).
    pub fn kv_usage(&self) -> f64 {
        if self.blocks_total == 0 {
            return 0.0;
        }
        (self.blocks_total - self.blocks_free) as f64 / self.blocks_total as f64
    }

    fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(self.block_size)
    }

    /// Frees `seq`'s blocks: its own at once, its shared ones to the cache
    /// (free but kept, once no other sequence uses them).
    fn release(&mut self, seq: &mut Seq) {
        let own = seq.blocks - seq.shared as u64;
        let idle = self.cache.release(&seq.prefix[..seq.shared]);
        self.blocks_free += own + idle;
        seq.blocks = 0;
        seq.shared = 0;
    }

    /// Makes `n` free blocks empty, evicting idle cached ones as needed.
    fn make_empty(&mut self, n: u64) {
        let empty = self.blocks_free - self.cache.idle();
        if n > empty {
            self.cache.evict(n - empty, &mut self.evicted);
            self.note_evicted();
        }
    }

    /// Records the cache's changes from now on, for
    /// [`take_cache_changes`](Self::take_cache_changes).
    pub fn record_cache_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
    }

    /// The cache's changes since the last call (none unless recorded).
    pub fn take_cache_changes(&mut self) -> Vec<CacheChange> {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn note_evicted(&mut self) {
        if let Some(c) = self.changes.as_mut()
            && !self.evicted.is_empty()
        {
            c.push(CacheChange::Removed(self.evicted.clone()));
        }
        self.evicted.clear();
    }

    /// The prompt blocks of `seq` the cache may serve: whole blocks, and
    /// never its last token (an engine computes at least one).
    fn cacheable(&self, seq: &Seq) -> usize {
        let most = u64::from(seq.prompt_tokens.saturating_sub(1)) / self.block_size;
        seq.prefix.len().min(most as usize)
    }

    /// Resets the prefix cache: drops every idle cached block (blocks in
    /// use stay until their sequences end). Returns how many.
    pub fn reset_prefix_cache(&mut self) -> u64 {
        let n = self.cache.clear_idle(&mut self.evicted);
        self.note_evicted();
        n
    }

    /// Admits from the queue head and fixes the step's end time.
    fn start_step(&mut self, at: Instant, out: &mut Vec<EngineEvent>) {
        let max_seqs = self.params.max_num_seqs.max(1) as usize;
        let mut prefill_tokens: u64 = 0;
        let mut loads = 0u32;
        // Sequences skipped for want of a LoRA slot stay in place.
        let mut next = 0;
        while self.running.len() < max_seqs {
            let Some(head) = self.waiting.get(next) else {
                break;
            };
            let tokens = head.tokens_in_kv();
            let (hit, hit_idle) = self.cache.hit(&head.prefix[..self.cacheable(head)]);
            let computed = tokens - hit as u64 * self.block_size;
            if prefill_tokens > 0
                && prefill_tokens + computed > u64::from(self.params.max_num_batched_tokens)
            {
                break;
            }
            // The +1 leaves room for the first decoded token, like vLLM's
            // watermark, so a just-admitted sequence is not preempted at once.
            // Cached blocks it takes need no new block, but idle ones leave
            // the free blocks.
            if self.blocks_for(tokens + 1) - hit as u64 + hit_idle > self.blocks_free {
                break;
            }
            if let Some(a) = head.adapter {
                match self.make_resident(a) {
                    None => {
                        next += 1;
                        continue;
                    }
                    Some(loaded) => loads += u32::from(loaded),
                }
            }
            let Some(mut seq) = self.waiting.remove(next) else {
                break;
            };
            self.cache.acquire(&seq.prefix[..hit]);
            self.blocks_free -= hit_idle;
            let new = self.blocks_for(tokens) - hit as u64;
            self.make_empty(new);
            self.blocks_free -= new;
            seq.blocks = self.blocks_for(tokens);
            // Its other full prompt blocks are cached once prefilled.
            let full = (u64::from(seq.prompt_tokens) / self.block_size) as usize;
            let end = seq.prefix.len().min(full).max(hit);
            let added = self.cache.insert(&seq.prefix[hit..end]);
            seq.shared = hit + added;
            if let Some(c) = self.changes.as_mut()
                && added > 0
            {
                c.push(CacheChange::Stored {
                    id: seq.id,
                    parent: hit.checked_sub(1).map(|i| seq.prefix[i]),
                    first: hit,
                    keys: seq.prefix[hit..hit + added].to_vec(),
                });
            }
            seq.is_prefilling = true;
            let cached = hit as u64 * self.block_size;
            if !seq.has_counted_prompt {
                seq.has_counted_prompt = true;
                seq.cached_tokens = u32::try_from(cached).unwrap_or(u32::MAX);
                self.stats.prompt_tokens_total += u64::from(seq.prompt_tokens);
                self.stats.prefix_cache_queries_total += u64::from(seq.prompt_tokens);
                self.stats.prefix_cache_hits_total += cached;
            }
            self.stats.prefill_tokens_total += computed;
            prefill_tokens += computed;
            out.push(EngineEvent::Admitted {
                id: seq.id,
                at,
                cached_tokens: seq.cached_tokens,
            });
            self.running.push(seq);
        }
        if self.running.is_empty() {
            // Nothing fits (cannot happen with the submit checks) or all
            // cancelled: stay idle rather than spin.
            self.phase = if self.waiting.is_empty() {
                StepClock::Idle
            } else {
                StepClock::Stepping {
                    end: at + Duration::from_millis(1),
                }
            };
            return;
        }
        let is_decoding = self.running.iter().any(|s| !s.is_prefilling);
        let mut nanos = prefill_tokens as f64 * self.prefill_ns_per_token
            + (self.params.lora_load_time * loads).as_nanos() as f64;
        if prefill_tokens > 0 {
            nanos += self.params.prefill_step_base.as_nanos() as f64;
        }
        if is_decoding {
            let extra = (self.running.len() - 1) as u32;
            let decode = self.params.decode_step_base + self.params.decode_step_per_seq * extra;
            nanos += decode.as_nanos() as f64;
        }
        let step = Duration::from_nanos(nanos.round() as u64);
        self.phase = StepClock::Stepping { end: at + step };
    }

    /// Emits a token for every sequence in the batch, finishes the done
    /// ones, then grows the KV of the rest, preempting the youngest when
    /// blocks run out.
    fn end_step(&mut self, at: Instant, out: &mut Vec<EngineEvent>) {
        let mut finished = 0u64;
        let mut i = 0;
        while i < self.running.len() {
            let seq = &mut self.running[i];
            seq.is_prefilling = false;
            seq.generated += 1;
            out.push(EngineEvent::Token {
                id: seq.id,
                index: seq.generated,
                at,
            });
            if seq.generated < seq.output_tokens {
                i += 1;
                continue;
            }
            out.push(EngineEvent::Finished {
                id: seq.id,
                at,
                prompt_tokens: seq.prompt_tokens,
                completion_tokens: seq.generated,
                cached_tokens: seq.cached_tokens,
            });
            finished += 1;
            let mut seq = self.running.remove(i);
            self.release(&mut seq);
        }
        self.stats.generation_tokens_total += self.running.len() as u64 + finished;
        self.stats.finished_total += finished;

        // Oldest first, so the youngest is preempted for the elders (vLLM).
        let mut i = 0;
        while i < self.running.len() {
            let needed = self.blocks_for(self.running[i].tokens_in_kv());
            let mut is_self_preempted = false;
            while needed > self.running[i].blocks + self.blocks_free {
                let Some(mut victim) = self.running.pop() else {
                    break;
                };
                self.release(&mut victim);
                self.stats.preemptions_total += 1;
                out.push(EngineEvent::Preempted { id: victim.id, at });
                self.waiting.push_front(victim);
                if self.running.len() == i {
                    is_self_preempted = true;
                    break;
                }
            }
            if is_self_preempted {
                break;
            }
            let grow = needed.saturating_sub(self.running[i].blocks);
            if grow > 0 {
                self.make_empty(grow);
                self.blocks_free -= grow;
                self.running[i].blocks = needed;
            }
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests;
