//! Engine behaviour in simulated time: batching, step cost, KV accounting,
//! preemption, rejection and determinism.

use std::time::Duration;

use super::*;

const MS: u64 = 1_000_000;

fn params() -> EngineParams {
    EngineParams {
        max_num_seqs: 4,
        kv_tokens: 16 * 1024,
        block_size: 16,
        max_model_len: 4096,
        max_num_batched_tokens: 16 * 1024,
        prefill_tokens_per_s: 10_000.0,
        prefill_step_base: Duration::ZERO,
        decode_step_base: Duration::from_millis(10),
        decode_step_per_seq: Duration::from_millis(1),
        time_scale: 1.0,
        max_loras: 2,
        lora_load_time: Duration::from_millis(20),
    }
}

fn req(id: u64, prompt_tokens: u32, output_tokens: u32) -> SeqRequest {
    SeqRequest {
        id,
        prompt_tokens,
        output_tokens,
        adapter: None,
        prefix: Vec::new(),
    }
}

/// A request whose prompt's blocks are keyed `keys` (16-token blocks).
fn keyed(id: u64, prompt_tokens: u32, output_tokens: u32, keys: &[u64]) -> SeqRequest {
    SeqRequest {
        prefix: keys.to_vec(),
        ..req(id, prompt_tokens, output_tokens)
    }
}

/// Advances step by step until idle (or `limit` steps), collecting events.
fn run_to_idle(engine: &mut Engine, out: &mut Vec<EngineEvent>) -> Instant {
    let mut last = Instant::ZERO;
    for _ in 0..1_000_000 {
        let Some(t) = engine.next_event_at() else {
            return last;
        };
        last = t;
        engine.advance(t, out);
    }
    panic!("engine did not go idle");
}

fn admitted(out: &[EngineEvent]) -> Vec<u64> {
    out.iter()
        .filter_map(|e| match e {
            EngineEvent::Admitted { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

fn finish_time(out: &[EngineEvent], want: u64) -> Instant {
    out.iter()
        .find_map(|e| match e {
            EngineEvent::Finished { id, at, .. } if *id == want => Some(*at),
            _ => None,
        })
        .expect("finished")
}

#[test]
fn batch_fills_to_max_num_seqs_and_the_rest_wait_fifo() {
    let mut e = Engine::new(params());
    for id in 0..7 {
        e.submit(Instant::ZERO, req(id, 10, 3)).unwrap();
    }
    assert_eq!(e.next_event_at(), Some(Instant::ZERO));
    let mut out = Vec::new();
    e.advance(Instant::ZERO, &mut out);
    assert_eq!(admitted(&out), vec![0, 1, 2, 3]);
    assert_eq!(e.stats().running, 4);
    assert_eq!(e.stats().waiting, 3);
    run_to_idle(&mut e, &mut out);
    assert_eq!(admitted(&out), vec![0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(e.stats().finished_total, 7);
    assert_eq!(e.stats().generation_tokens_total, 21);
    assert_eq!(e.stats().prompt_tokens_total, 70);
    assert_eq!(e.stats().running, 0);
    assert_eq!(e.next_event_at(), None);
}

#[test]
fn head_of_queue_is_not_skipped_when_it_does_not_fit() {
    // 8 blocks: a 100-token prompt (7 blocks) runs, the next needs 7 and
    // blocks a small one behind it.
    let mut e = Engine::new(EngineParams {
        kv_tokens: 8 * 16,
        ..params()
    });
    e.submit(Instant::ZERO, req(1, 100, 2)).unwrap();
    e.submit(Instant::ZERO, req(2, 100, 2)).unwrap();
    e.submit(Instant::ZERO, req(3, 1, 2)).unwrap();
    let mut out = Vec::new();
    e.advance(Instant::ZERO, &mut out);
    assert_eq!(admitted(&out), vec![1]);
    assert_eq!(e.stats().waiting, 2);
    run_to_idle(&mut e, &mut out);
    assert_eq!(admitted(&out), vec![1, 2, 3]);
}

#[test]
fn decode_step_time_grows_with_batch_size() {
    let step_after_prefill = |n: u64| {
        let mut e = Engine::new(params());
        for id in 0..n {
            e.submit(Instant::ZERO, req(id, 10, 5)).unwrap();
        }
        let mut out = Vec::new();
        e.advance(Instant::ZERO, &mut out);
        let prefill_end = e.next_event_at().unwrap();
        e.advance(prefill_end, &mut out);
        e.next_event_at().unwrap() - prefill_end
    };
    assert_eq!(step_after_prefill(1), Duration::from_millis(10));
    assert_eq!(step_after_prefill(2), Duration::from_millis(11));
    assert_eq!(step_after_prefill(4), Duration::from_millis(13));
}

#[test]
fn prefill_cost_is_proportional_to_prompt_tokens() {
    let prefill = |prompt: u32| {
        let mut e = Engine::new(params());
        e.submit(Instant::ZERO, req(1, prompt, 2)).unwrap();
        e.advance(Instant::ZERO, &mut Vec::new());
        e.next_event_at().unwrap() - Instant::ZERO
    };
    // 10k tokens/s: 0.1 ms per token; a fresh batch has no decode term.
    assert_eq!(prefill(100), Duration::from_millis(10));
    assert_eq!(prefill(1000), Duration::from_millis(100));
}

#[test]
fn first_token_arrives_at_the_end_of_the_prefill_step() {
    let mut e = Engine::new(params());
    e.submit(Instant::ZERO, req(1, 100, 3)).unwrap();
    let mut out = Vec::new();
    run_to_idle(&mut e, &mut out);
    let tokens: Vec<_> = out
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Token { index, at, .. } => Some((*index, at.as_nanos())),
            _ => None,
        })
        .collect();
    assert_eq!(tokens, vec![(1, 10 * MS), (2, 20 * MS), (3, 30 * MS)]);
    assert_eq!(
        out.last(),
        Some(&EngineEvent::Finished {
            id: 1,
            at: Instant::from_nanos(30 * MS),
            prompt_tokens: 100,
            completion_tokens: 3,
            cached_tokens: 0,
        })
    );
}

#[test]
fn a_submit_during_a_step_joins_at_the_next_step_start() {
    let mut e = Engine::new(params());
    e.submit(Instant::ZERO, req(1, 100, 5)).unwrap();
    let mut out = Vec::new();
    e.advance(Instant::ZERO, &mut out);
    e.advance(Instant::from_nanos(3 * MS), &mut out);
    e.submit(Instant::from_nanos(3 * MS), req(2, 100, 1))
        .unwrap();
    assert_eq!(e.next_event_at(), Some(Instant::from_nanos(10 * MS)));
    out.clear();
    e.advance(Instant::from_nanos(10 * MS), &mut out);
    assert_eq!(
        out[1],
        EngineEvent::Admitted {
            id: 2,
            at: Instant::from_nanos(10 * MS),
            cached_tokens: 0,
        }
    );
    // Mixed step: 10 ms prefill + decode of a 2-batch (11 ms).
    assert_eq!(e.next_event_at(), Some(Instant::from_nanos(31 * MS)));
}

#[test]
fn advance_processes_several_steps_back_to_back() {
    let mut e = Engine::new(params());
    e.submit(Instant::ZERO, req(1, 100, 4)).unwrap();
    let mut out = Vec::new();
    e.advance(Instant::from_nanos(25 * MS), &mut out);
    let n_tokens = out
        .iter()
        .filter(|e| matches!(e, EngineEvent::Token { .. }))
        .count();
    assert_eq!(n_tokens, 2);
    // Step 3 started at 20 ms (the previous end), not at 25 ms.
    assert_eq!(e.next_event_at(), Some(Instant::from_nanos(30 * MS)));
}

#[test]
fn kv_blocks_track_tokens_and_are_freed_at_the_end() {
    let mut e = Engine::new(params());
    e.submit(Instant::ZERO, req(1, 33, 20)).unwrap();
    e.submit(Instant::ZERO, req(2, 16, 20)).unwrap();
    let mut out = Vec::new();
    e.advance(Instant::ZERO, &mut out);
    // ceil(33/16) + ceil(16/16)
    assert_eq!(e.stats().kv_blocks_used, 3 + 1);
    assert_eq!(e.stats().kv_blocks_total, 1024);
    let end = e.next_event_at().unwrap();
    e.advance(end, &mut out);
    // After one token: 34 and 17 tokens in KV.
    assert_eq!(e.stats().kv_blocks_used, 3 + 2);
    assert!((e.kv_usage() - 5.0 / 1024.0).abs() < 1e-12);
    run_to_idle(&mut e, &mut out);
    assert_eq!(e.stats().kv_blocks_used, 0);
    assert_eq!(e.kv_usage(), 0.0);
}

#[test]
fn cancel_frees_blocks_and_removes_from_either_queue() {
    let mut e = Engine::new(EngineParams {
        max_num_seqs: 1,
        ..params()
    });
    e.submit(Instant::ZERO, req(1, 64, 100)).unwrap();
    e.submit(Instant::ZERO, req(2, 64, 100)).unwrap();
    e.advance(Instant::ZERO, &mut Vec::new());
    assert_eq!(e.stats().kv_blocks_used, 4);
    assert!(e.cancel(2));
    assert_eq!(e.stats().waiting, 0);
    assert!(e.cancel(1));
    assert_eq!(e.stats().running, 0);
    assert_eq!(e.stats().kv_blocks_used, 0);
    assert!(!e.cancel(1));
    let mut out = Vec::new();
    run_to_idle(&mut e, &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(e.next_event_at(), None);
}

#[test]
fn kv_exhaustion_preempts_the_youngest_which_later_completes() {
    // 6 blocks of 16; two sequences of 32 prompt tokens (2 blocks each,
    // 3 needed to admit) grow until the cache is full.
    let mut e = Engine::new(EngineParams {
        kv_tokens: 6 * 16,
        ..params()
    });
    e.submit(Instant::ZERO, req(1, 32, 40)).unwrap();
    e.submit(Instant::ZERO, req(2, 32, 40)).unwrap();
    let mut out = Vec::new();
    e.advance(Instant::ZERO, &mut out);
    assert_eq!(admitted(&out), vec![1, 2]);
    run_to_idle(&mut e, &mut out);
    let preempted: Vec<u64> = out
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Preempted { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    assert!(!preempted.is_empty());
    assert!(preempted.iter().all(|id| *id == 2), "{preempted:?}");
    assert_eq!(e.stats().preemptions_total, preempted.len() as u64);
    assert_eq!(e.stats().finished_total, 2);
    assert!(finish_time(&out, 1) < finish_time(&out, 2));
    // Each token index is produced exactly once despite the re-prefill.
    for id in [1, 2] {
        let idx: Vec<u32> = out
            .iter()
            .filter_map(|e| match e {
                EngineEvent::Token { id: i, index, .. } if *i == id => Some(*index),
                _ => None,
            })
            .collect();
        assert_eq!(idx, (1..=40).collect::<Vec<_>>());
    }
    assert_eq!(e.stats().kv_blocks_used, 0);
    // Prompt tokens are counted once per request, not per re-prefill.
    assert_eq!(e.stats().prompt_tokens_total, 64);
}

#[test]
fn re_admission_prefills_prompt_plus_generated_tokens() {
    let mut e = Engine::new(EngineParams {
        kv_tokens: 6 * 16,
        ..params()
    });
    e.submit(Instant::ZERO, req(1, 32, 40)).unwrap();
    e.submit(Instant::ZERO, req(2, 32, 40)).unwrap();
    let mut out = Vec::new();
    let mut generated = 0u32;
    let mut is_preempted = false;
    while let Some(t) = e.next_event_at() {
        out.clear();
        e.advance(t, &mut out);
        for ev in &out {
            match *ev {
                EngineEvent::Token { id: 2, index, .. } => generated = index,
                EngineEvent::Preempted { id: 2, .. } => is_preempted = true,
                EngineEvent::Admitted { id: 2, at, .. } if is_preempted => {
                    let tokens = 32 + u64::from(generated);
                    assert!(generated > 0);
                    // Prefill of prompt + generated at 0.1 ms a token, plus a
                    // decode step if sequence 1 is still running.
                    let prefill = Duration::from_micros(100 * tokens);
                    let decode = if e.stats().running == 2 {
                        Duration::from_millis(11)
                    } else {
                        Duration::ZERO
                    };
                    assert_eq!(e.next_event_at().unwrap() - at, prefill + decode);
                    return;
                }
                _ => {}
            }
        }
    }
    panic!("no re-admission");
}

#[test]
fn submit_rejects_impossible_requests() {
    let mut e = Engine::new(EngineParams {
        kv_tokens: 64,
        ..params()
    });
    assert_eq!(
        e.submit(Instant::ZERO, req(1, 10, 0)),
        Err(EngineError::NoOutput)
    );
    assert!(matches!(
        e.submit(Instant::ZERO, req(2, 4000, 97)),
        Err(EngineError::ContextTooLong {
            requested: 4097,
            max_model_len: 4096,
            ..
        })
    ));
    assert_eq!(
        e.submit(Instant::ZERO, req(3, 65, 1)),
        Err(EngineError::ExceedsKvCache {
            needed_blocks: 5,
            total_blocks: 4
        })
    );
    assert_eq!(e.stats().waiting, 0);
    assert_eq!(e.next_event_at(), None);
}

#[test]
fn same_inputs_give_the_same_event_trace() {
    let trace = || {
        let mut e = Engine::new(EngineParams {
            kv_tokens: 40 * 16,
            ..params()
        });
        let mut out = Vec::new();
        let mut t = Instant::ZERO;
        for id in 0..50u64 {
            e.advance(t, &mut out);
            e.submit(
                t,
                req(id, (id as u32 * 37) % 200 + 1, (id as u32 * 13) % 50 + 1),
            )
            .unwrap();
            t = t + Duration::from_millis(3);
        }
        run_to_idle(&mut e, &mut out);
        (out, e.stats())
    };
    let (a, sa) = trace();
    let (b, sb) = trace();
    assert_eq!(a, b);
    assert_eq!(sa, sb);
    assert_eq!(sa.finished_total, 50);
    assert!(sa.preemptions_total > 0);
}

#[test]
fn a_hundred_thousand_requests_replay_quickly() {
    // Replay-scale smoke test: O(batch) per step, all sequences finish.
    let mut e = Engine::new(EngineParams {
        max_num_seqs: 64,
        kv_tokens: 65_536,
        ..params()
    });
    let mut out = Vec::with_capacity(1024);
    let mut t = Instant::ZERO;
    let n = 100_000u64;
    let mut tokens = 0u64;
    for id in 0..n {
        e.advance(t, &mut out);
        out.clear();
        let output = (id * 7919 % 64) as u32 + 1;
        tokens += u64::from(output);
        e.submit(t, req(id, (id * 104_729 % 512) as u32 + 1, output))
            .unwrap();
        t = t + Duration::from_micros(500);
    }
    while let Some(at) = e.next_event_at() {
        e.advance(at, &mut out);
        out.clear();
    }
    let s = e.stats();
    assert_eq!(s.finished_total, n);
    assert_eq!(s.generation_tokens_total, tokens);
    assert_eq!(s.kv_blocks_used, 0);
}

#[test]
fn a_step_prefills_at_most_the_token_budget() {
    let mut e = Engine::new(EngineParams {
        max_num_batched_tokens: 1000,
        ..params()
    });
    for id in 0..3 {
        e.submit(Instant::ZERO, req(id, 600, 2)).unwrap();
    }
    let mut out = Vec::new();
    e.advance(Instant::ZERO, &mut out);
    // 600 + 600 > 1000: one prompt in the first step, the next waits.
    assert_eq!(e.stats().running, 1);
    assert_eq!(e.stats().waiting, 2);
    // A prompt longer than the budget still runs, alone.
    let mut big = Engine::new(EngineParams {
        max_num_batched_tokens: 100,
        ..params()
    });
    big.submit(Instant::ZERO, req(9, 600, 1)).unwrap();
    big.advance(Instant::ZERO, &mut out);
    assert_eq!(big.stats().running, 1);
}

#[test]
fn lora_slots_load_lru_and_skip_a_sequence_that_finds_none() {
    // Two slots; three adapters and a base-model sequence behind them.
    let mut e = Engine::new(params());
    let with = |id, adapter, out| SeqRequest {
        adapter,
        ..req(id, 10, out)
    };
    e.submit(Instant::ZERO, with(0, Some(0), 2)).unwrap();
    e.submit(Instant::ZERO, with(1, Some(1), 5)).unwrap();
    e.submit(Instant::ZERO, with(2, Some(2), 2)).unwrap();
    e.submit(Instant::ZERO, with(3, None, 2)).unwrap();
    let mut out = Vec::new();
    e.advance(Instant::ZERO, &mut out);
    // Adapter 2 finds both slots held by running sequences: skipped, and
    // the base-model sequence behind it runs.
    assert_eq!(admitted(&out), vec![0, 1, 3]);
    assert_eq!(e.stats().lora_loads_total, 2);
    assert_eq!(e.loaded_adapters(), &[0, 1]);
    assert_eq!(e.active_adapters(), vec![0, 1, 2]);
    // Two loads make the first step 40 ms longer.
    let first_end = e.next_event_at().unwrap();
    assert_eq!(
        first_end,
        Instant::ZERO + Duration::from_nanos(3_000_000 + 40 * MS)
    );
    run_to_idle(&mut e, &mut out);
    // Once 0 finished, 2 took its slot (the least recently used idle one).
    assert_eq!(admitted(&out), vec![0, 1, 3, 2]);
    assert_eq!(e.stats().lora_loads_total, 3);
    assert_eq!(e.loaded_adapters(), &[1, 2]);
    // No slots at all: refused at submit.
    let mut off = Engine::new(EngineParams {
        max_loras: 0,
        ..params()
    });
    assert_eq!(
        off.submit(Instant::ZERO, with(9, Some(0), 1)),
        Err(EngineError::LoraDisabled)
    );
}

fn cached_of(out: &[EngineEvent], want: u64) -> u32 {
    out.iter()
        .find_map(|e| match e {
            EngineEvent::Finished {
                id, cached_tokens, ..
            } if *id == want => Some(*cached_tokens),
            _ => None,
        })
        .unwrap()
}

#[test]
fn a_cached_prefix_is_not_prefilled_again() {
    let mut e = Engine::new(params());
    // 100 tokens: six full 16-token blocks.
    let keys = [1, 2, 3, 4, 5, 6];
    e.submit(Instant::ZERO, keyed(1, 100, 1, &keys)).unwrap();
    let mut out = Vec::new();
    let t = run_to_idle(&mut e, &mut out);
    assert_eq!(cached_of(&out, 1), 0);
    // Its blocks stay cached after it ends, but count as free.
    assert_eq!(e.stats().kv_blocks_used, 0);
    // Same first four blocks: 64 tokens cached, 36 prefilled (3.6 ms).
    e.submit(t, keyed(2, 100, 1, &[1, 2, 3, 4, 9, 9])).unwrap();
    e.advance(t, &mut out);
    assert_eq!(e.next_event_at().unwrap() - t, Duration::from_micros(3_600));
    run_to_idle(&mut e, &mut out);
    assert_eq!(cached_of(&out, 2), 64);
    let s = e.stats();
    assert_eq!(s.prefix_cache_queries_total, 200);
    assert_eq!(s.prefix_cache_hits_total, 64);
    assert_eq!(s.prefill_tokens_total, 136);
}

#[test]
fn a_whole_prompt_cached_still_computes_its_last_block() {
    let mut e = Engine::new(params());
    let keys = [1, 2, 3, 4];
    e.submit(Instant::ZERO, keyed(1, 64, 1, &keys)).unwrap();
    let mut out = Vec::new();
    let t = run_to_idle(&mut e, &mut out);
    e.submit(t, keyed(2, 64, 1, &keys)).unwrap();
    run_to_idle(&mut e, &mut out);
    // At most prompt − 1 tokens, in whole blocks: three.
    assert_eq!(cached_of(&out, 2), 48);
}

#[test]
fn running_sequences_share_their_cached_blocks() {
    let mut e = Engine::new(params());
    e.submit(Instant::ZERO, keyed(1, 64, 50, &[1, 2, 3, 4]))
        .unwrap();
    let mut out = Vec::new();
    e.advance(Instant::ZERO, &mut out);
    let t = e.next_event_at().unwrap();
    e.advance(t, &mut out);
    // Submitted during 1's second step: admitted when it ends.
    e.submit(t, keyed(2, 64, 50, &[1, 2, 3, 4])).unwrap();
    let t = e.next_event_at().unwrap();
    e.advance(t, &mut out);
    // 1: 66 tokens, 5 blocks; 2: 64 tokens, three of its four blocks
    // shared with 1 (its last is its own: a prompt's last token is
    // always computed).
    assert_eq!(e.stats().kv_blocks_used, 5 + 1);
    run_to_idle(&mut e, &mut out);
    assert_eq!(cached_of(&out, 2), 48);
    assert_eq!(e.stats().kv_blocks_used, 0);
}

#[test]
fn a_full_cache_evicts_the_least_recently_used_prefix() {
    // Room for 8 blocks of 16 tokens.
    let mut e = Engine::new(EngineParams {
        kv_tokens: 8 * 16,
        ..params()
    });
    let mut out = Vec::new();
    let mut t = Instant::ZERO;
    // Prefix A (3 blocks), then B (3 blocks): both fit idle.
    for (id, k) in [(1, 10), (2, 20)] {
        e.submit(t, keyed(id, 49, 1, &[k, k + 1, k + 2])).unwrap();
        t = run_to_idle(&mut e, &mut out);
    }
    // A again (a hit, which makes B the least recently used), then C needs
    // two empty blocks: B's deepest two go (a prompt's blocks are freed
    // last first), A's stay.
    e.submit(t, keyed(3, 49, 1, &[10, 11, 12])).unwrap();
    t = run_to_idle(&mut e, &mut out);
    e.submit(t, keyed(4, 49, 1, &[30, 31, 32])).unwrap();
    t = run_to_idle(&mut e, &mut out);
    e.submit(t, keyed(5, 49, 1, &[10, 11, 12])).unwrap();
    t = run_to_idle(&mut e, &mut out);
    e.submit(t, keyed(6, 49, 1, &[20, 21, 22])).unwrap();
    run_to_idle(&mut e, &mut out);
    assert_eq!(cached_of(&out, 3), 48);
    assert_eq!(cached_of(&out, 5), 48);
    assert_eq!(cached_of(&out, 6), 16);
    assert_eq!(e.stats().kv_blocks_used, 0);
}

#[test]
fn reset_drops_the_idle_cache() {
    let mut e = Engine::new(params());
    let mut out = Vec::new();
    e.submit(Instant::ZERO, keyed(1, 64, 1, &[1, 2, 3, 4]))
        .unwrap();
    let t = run_to_idle(&mut e, &mut out);
    assert_eq!(e.reset_prefix_cache(), 4);
    e.submit(t, keyed(2, 64, 1, &[1, 2, 3, 4])).unwrap();
    run_to_idle(&mut e, &mut out);
    assert_eq!(cached_of(&out, 2), 0);
}

#[test]
fn a_prefilling_step_costs_its_base_and_its_tokens() {
    // 1,000 prompt tokens at 10,000/s: 100 ms; with a base of 15 ms, 115
    // ms to the first token; the decode steps after it pay no base.
    let run = |base: Duration| {
        let mut e = Engine::new(EngineParams {
            prefill_step_base: base,
            ..params()
        });
        e.submit(Instant::ZERO, req(1, 1000, 2)).unwrap();
        let mut out = Vec::new();
        run_to_idle(&mut e, &mut out);
        finish_time(&out, 1).as_nanos() / MS
    };
    assert_eq!(run(Duration::ZERO), 100 + 10);
    assert_eq!(run(Duration::from_millis(15)), 115 + 10);
}
