//! Picking a backend among the candidates: the strategy's choice, ties broken by KV usage, then at random.

use rand::Rng;

use super::Candidate;
use crate::core::spec::Strategy;

/// Picks the index of a candidate under `strategy` for a request of
/// `prompt_tokens`; `None` only when empty. `cursor` is the pool's
/// round-robin position, advanced here.
pub fn pick(
    strategy: Strategy,
    cands: &[Candidate],
    prompt_tokens: u32,
    rng: &mut impl Rng,
    cursor: &mut usize,
) -> Option<usize> {
    if cands.is_empty() {
        return None;
    }
    Some(match strategy {
        Strategy::LeastOutstanding => least_outstanding(cands, rng),
        // Without the request's prefix (the scheduler routes prefixes
        // itself): where a prompt with no full block goes.
        Strategy::PrefixAware => super::prefix_aware(cands, prompt_tokens, None, 0, rng).0,
        Strategy::PrefixGreedy => super::prefix_greedy(cands, rng),
        Strategy::P2c => {
            // Power of two choices (Mitzenmacher, 2001): two at random, the less loaded.
            let a = rng.random_range(0..cands.len());
            let b = rng.random_range(0..cands.len());
            if better(&cands[b], &cands[a]) { b } else { a }
        }
        Strategy::RoundRobin => {
            // The cursor walks backend ids, so skipping a full backend does
            // not shift everyone else's turn.
            let i = cands
                .iter()
                .position(|c| c.id.0 as usize >= *cursor)
                .unwrap_or(0);
            *cursor = cands[i].id.0 as usize + 1;
            i
        }
        Strategy::Random => rng.random_range(0..cands.len()),
        Strategy::Pack => 0,
    })
}

fn better(a: &Candidate, b: &Candidate) -> bool {
    let (la, lb) = (a.load(), b.load());
    la < lb || (la == lb && a.kv_usage.unwrap_or(0.0) < b.kv_usage.unwrap_or(0.0))
}

/// Smallest load, ties by lower KV usage, remaining ties at random
/// (reservoir sampling over the tied set, one pass, no allocation).
fn least_outstanding(cands: &[Candidate], rng: &mut impl Rng) -> usize {
    let mut best = 0;
    let mut ties = 1u32;
    for (i, c) in cands.iter().enumerate().skip(1) {
        if better(c, &cands[best]) {
            best = i;
            ties = 1;
        } else if !better(&cands[best], c) {
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
    use super::*;
    use crate::core::ids::BackendId;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn cand(id: u32, in_flight: u32, waiting: u32, window: u32, kv: f64) -> Candidate {
        Candidate {
            id: BackendId(id),
            in_flight,
            waiting,
            window,
            window_share: 1.0,
            kv_usage: Some(kv),
            cached_tokens: 0,
            events: false,
            home_tokens: 0,
            homed: 0.0,
            need: 0.0,
            kv_full: false,
        }
    }

    #[test]
    fn least_outstanding_counts_polled_waiting_and_window() {
        let mut rng = SmallRng::seed_from_u64(1);
        let c = [
            cand(0, 2, 3, 8, 0.1),
            cand(1, 4, 0, 8, 0.1),
            cand(2, 4, 0, 16, 0.5),
        ];
        assert_eq!(
            pick(Strategy::LeastOutstanding, &c, 0, &mut rng, &mut 0),
            Some(2)
        );
    }

    #[test]
    fn least_outstanding_breaks_ties_by_kv_then_at_random() {
        let mut rng = SmallRng::seed_from_u64(1);
        let c = [cand(0, 1, 0, 4, 0.5), cand(1, 1, 0, 4, 0.2)];
        assert_eq!(
            pick(Strategy::LeastOutstanding, &c, 0, &mut rng, &mut 0),
            Some(1)
        );
        let c = [
            cand(0, 1, 0, 4, 0.2),
            cand(1, 1, 0, 4, 0.2),
            cand(2, 1, 0, 4, 0.2),
        ];
        let mut seen = [0; 3];
        for _ in 0..3000 {
            seen[pick(Strategy::LeastOutstanding, &c, 0, &mut rng, &mut 0).unwrap()] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }

    #[test]
    fn round_robin_cycles_by_backend_id() {
        let mut rng = SmallRng::seed_from_u64(1);
        let c = [
            cand(0, 0, 0, 4, 0.0),
            cand(1, 9, 0, 10, 0.0),
            cand(2, 0, 0, 4, 0.0),
        ];
        let mut cur = 0;
        let order: Vec<_> = (0..4)
            .map(|_| pick(Strategy::RoundRobin, &c, 0, &mut rng, &mut cur).unwrap())
            .collect();
        assert_eq!(order, vec![0, 1, 2, 0]);
    }

    #[test]
    fn pack_fills_the_first_open_backend() {
        let mut rng = SmallRng::seed_from_u64(1);
        let c = [cand(3, 5, 0, 8, 0.0), cand(4, 0, 0, 8, 0.0)];
        assert_eq!(pick(Strategy::Pack, &c, 0, &mut rng, &mut 0), Some(0));
    }

    #[test]
    fn p2c_prefers_the_less_loaded_of_two() {
        let mut rng = SmallRng::seed_from_u64(7);
        let c = [cand(0, 7, 0, 8, 0.0), cand(1, 0, 0, 8, 0.0)];
        let picks_idle = (0..1000)
            .filter(|_| pick(Strategy::P2c, &c, 0, &mut rng, &mut 0) == Some(1))
            .count();
        assert!(picks_idle > 700, "{picks_idle}");
    }

    #[test]
    fn random_spreads_evenly_whatever_the_load() {
        let mut rng = SmallRng::seed_from_u64(3);
        let c = [cand(0, 7, 3, 8, 0.9), cand(1, 0, 0, 8, 0.0)];
        let busy = (0..2000)
            .filter(|_| pick(Strategy::Random, &c, 0, &mut rng, &mut 0) == Some(0))
            .count();
        assert!((850..1150).contains(&busy), "{busy}");
    }

    #[test]
    fn empty_pool_picks_nothing() {
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(pick(Strategy::Random, &[], 0, &mut rng, &mut 0), None);
    }
}
