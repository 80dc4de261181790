//! The prefix-aware strategy: the backend where the request would wait and
//! prefill least, weighing the prefill its cached prefix saves against the
//! prefill already queued there (Dynamo's cost, not a raw match ratio).
//!
//! cost(b) = prompt tokens b has not cached + uncached prompt tokens
//! Fairway has sent b that have not started answering.
//!
//! With the guards the peers added after users hit them:
//! - **spill**: when the cheapest backend's load (outstanding requests
//!   over its window) exceeds the least loaded one's by more than
//!   [`SPILL_GAP`], the request goes to the least loaded instead, which
//!   then holds the prefix too: a hot prefix replicates rather than
//!   queueing behind one engine;
//! - **ties** go to the lower load, then to the backend holding the fewest
//!   indexed blocks (a prefix no one holds spreads over the pool rather
//!   than piling onto one engine, as llm-d's no-hit LRU scorer does), then
//!   at random: a burst of cold requests does not herd;
//! - in-flight work counts **at dispatch** (the caller adds each request's
//!   uncached prompt to its backend's pending prefill as it sends it), not
//!   at the next poll.

use rand::Rng;

use super::Candidate;

/// Load gap (in windows) past which the cheapest backend spills to the
/// least loaded one.
pub const SPILL_GAP: f64 = 0.5;

/// The candidate's cost in prefill tokens.
fn cost(c: &Candidate, prompt: u32) -> u64 {
    u64::from(prompt.saturating_sub(c.cached_tokens)) + c.pending_prefill
}

/// Picks the index of a candidate (`cands` is not empty). Returns it and
/// whether the spill guard chose it.
pub fn prefix_aware(cands: &[Candidate], prompt: u32, rng: &mut impl Rng) -> (usize, bool) {
    let key = |c: &Candidate| (cost(c, prompt), c.load(), c.held_blocks);
    let mut best = 0;
    let mut ties = 1u32;
    for (i, c) in cands.iter().enumerate().skip(1) {
        let (k, b) = (key(c), key(&cands[best]));
        let better = k.0 < b.0 || (k.0 == b.0 && (k.1 < b.1 || (k.1 == b.1 && k.2 < b.2)));
        if better {
            best = i;
            ties = 1;
        } else if k == b {
            ties += 1;
            if rng.random_range(0..ties) == 0 {
                best = i;
            }
        }
    }
    let least = cands
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.load().total_cmp(&b.1.load()))
        .map_or(best, |(i, _)| i);
    if cands[best].load() - cands[least].load() > SPILL_GAP {
        (least, true)
    } else {
        (best, false)
    }
}

/// The replay's oracle (`Strategy::PrefixGreedy`): the candidate with
/// the most of the prompt cached among those with room (load below 1),
/// else the least loaded; ties go to the lower load, then at random.
/// No spill, no weighing of queued prefill: the most hits the index
/// allows while an engine has a free slot.
pub fn prefix_greedy(cands: &[Candidate], rng: &mut impl Rng) -> usize {
    let roomy = cands.iter().any(|c| c.load() < 1.0);
    // Larger is better: room (when anyone has it), cached tokens, then
    // lower load.
    let key = |c: &Candidate| {
        let cached = if roomy && c.load() < 1.0 {
            c.cached_tokens
        } else {
            0
        };
        (cached, -c.load())
    };
    let mut best = 0;
    let mut ties = 1u32;
    for (i, c) in cands.iter().enumerate().skip(1) {
        let (k, b) = (key(c), key(&cands[best]));
        if k.0 > b.0 || (k.0 == b.0 && k.1 > b.1) {
            best = i;
            ties = 1;
        } else if k == b {
            ties += 1;
            if rng.random_range(0..ties) == 0 {
                best = i;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;
    use crate::core::ids::BackendId;

    fn cand(id: u32, in_flight: u32, cached: u32, pending: u64) -> Candidate {
        Candidate {
            id: BackendId(id),
            in_flight,
            waiting: 0,
            window: 8,
            kv_usage: None,
            cached_tokens: cached,
            pending_prefill: pending,
            held_blocks: 0,
        }
    }

    #[test]
    fn the_holder_wins_while_the_prefill_it_saves_outweighs_its_queue() {
        let mut rng = SmallRng::seed_from_u64(1);
        // 1,000-token prompt, 900 cached on backend 1.
        let c = [cand(0, 1, 0, 0), cand(1, 2, 900, 500)];
        assert_eq!(prefix_aware(&c, 1000, &mut rng), (1, false));
        // Its queued prefill now costs more than the saving.
        let c = [cand(0, 1, 0, 0), cand(1, 2, 900, 1000)];
        assert_eq!(prefix_aware(&c, 1000, &mut rng), (0, false));
    }

    #[test]
    fn a_loaded_holder_spills_to_the_least_loaded() {
        let mut rng = SmallRng::seed_from_u64(1);
        // Backend 1 holds everything but has 7 of 8 slots busy; 0 has 2.
        let c = [cand(0, 2, 0, 0), cand(1, 7, 1000, 0)];
        assert_eq!(prefix_aware(&c, 1000, &mut rng), (0, true));
        let c = [cand(0, 4, 0, 0), cand(1, 7, 1000, 0)];
        assert_eq!(prefix_aware(&c, 1000, &mut rng), (1, false));
    }

    #[test]
    fn a_cold_prefix_goes_where_fewest_blocks_are_held() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut c = [cand(0, 1, 0, 0), cand(1, 1, 0, 0), cand(2, 1, 0, 0)];
        c[0].held_blocks = 40;
        c[1].held_blocks = 7;
        c[2].held_blocks = 12;
        for _ in 0..100 {
            assert_eq!(prefix_aware(&c, 100, &mut rng).0, 1);
        }
    }

    #[test]
    fn cold_requests_spread_by_load_then_at_random() {
        let mut rng = SmallRng::seed_from_u64(1);
        let c = [cand(0, 3, 0, 0), cand(1, 1, 0, 0), cand(2, 2, 0, 0)];
        assert_eq!(prefix_aware(&c, 100, &mut rng).0, 1);
        let c = [cand(0, 1, 0, 0), cand(1, 1, 0, 0), cand(2, 1, 0, 0)];
        let mut seen = [0; 3];
        for _ in 0..3000 {
            seen[prefix_aware(&c, 100, &mut rng).0] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }

    #[test]
    fn the_oracle_sends_to_the_holder_while_it_has_room() {
        let mut rng = SmallRng::seed_from_u64(1);
        // The holder is busier and has a long queue of prefill: still it.
        let c = [cand(0, 1, 0, 0), cand(1, 7, 900, 5000)];
        assert_eq!(prefix_greedy(&c, &mut rng), 1);
        // Full: the least loaded, whatever it holds.
        let c = [cand(0, 3, 0, 0), cand(1, 8, 900, 0), cand(2, 2, 100, 0)];
        assert_eq!(prefix_greedy(&c, &mut rng), 2);
        // Everyone full: the least loaded.
        let c = [cand(0, 9, 0, 0), cand(1, 8, 900, 0)];
        assert_eq!(prefix_greedy(&c, &mut rng), 1);
    }
}
