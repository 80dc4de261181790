//! The prefix-aware strategy: each prefix keeps a home, and goes back
//! there while the home's load is within [`SPILL_GAP`] of the least
//! loaded backend's.
//!
//! An engine's cache holds part of a pool's prefix set; what keeps hits
//! high when the set does not fit in one cache is a stable partition
//! (the peers' `cache_aware` keeps one in its trees). A score of cached
//! tokens, or of the prefill a cached prefix saves against the prefill
//! queued, keeps none: it copies a prefix to another engine as soon as
//! its holder has a miss queued or evicts it, and each copy evicts
//! another prefix there. So, for a request whose prompt has blocks:
//!
//! - **at home**: when a backend is the home of at least half its prompt
//!   (`Homes`: where earlier requests of that prefix went, whether or
//!   not the engine still holds them), it goes to the home within
//!   [`SPILL_GAP`] of the least loaded backend's load (outstanding
//!   requests over its whole window, [`Candidate::whole_load`]: in a
//!   cluster each replica holds a share of the window, and half of a
//!   third of a window is one request) that holds the most of it, then
//!   the least loaded; but when that home's engine reports it holds none
//!   of it and another backend holds at least half (another replica
//!   placed it there), that one is *adopted* as a home, so that replicas
//!   converge on one partition;
//! - **spill**: with no home within the bound, it goes to the least loaded
//!   backend, for this request only, as it does when its home cannot
//!   take a request now (a full window, a slow engine): a copy made for a
//!   peak does not become a home, so the partition does not drift (a
//!   prefix whose demand exceeds what one engine serves within the bound
//!   is served by both, its home first);
//! - **adopted**: with no home, a backend holding at least half its prompt
//!   now (its engine's events, or another replica's requests) becomes its
//!   home, if within the bound;
//! - **new**: else it gets a home where it fits: among the backends
//!   within the bound, one whose cache the prompt does not fit beside what
//!   is homed there (homed blocks over its cache) is passed over; of the
//!   rest the least loaded, so that new prefixes balance the pool as load
//!   alone would, then the one with the smallest share of the partition,
//!   then by rendezvous hashing of the prompt's family (its block halfway
//!   in, the same for every request sharing that half), so that replicas
//!   seeing the same loads and shares agree;
//!
//! ties at random. A prompt without a full block goes to the least loaded.
//!
//! A backend past its KV watermark ([`Candidate::kv_full`]) takes only
//! requests whose home it is: its engine keeps their blocks cached, so
//! they cost it little new memory, where sending them away copies the
//! prefix and evicts another there. On two real engines with caches
//! smaller than the prefix set, gating the homes on the watermark spilled
//! one request in ten and cut the hit rate from 0.67 to 0.53
//! (docs/benchmarks/2026-12-07-prefix.md).

use rand::Rng;

use super::Candidate;

/// Load gap (in windows) past which a request leaves its home for the
/// least loaded backend.
pub const SPILL_GAP: f64 = 0.5;

/// How a request's backend relates to its prefix's homes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Its home.
    Home,
    /// The least loaded, its home being too busy (past the bound): for
    /// this request only.
    Spill,
    /// The least loaded, its home not taking a request now (a full
    /// window, a slow engine, an ejection): for this request only.
    Lent,
    /// A backend holding its prompt, which had no home: its home now.
    Adopted,
    /// A new home.
    New,
    /// The least loaded: no full block to place.
    Unplaced,
}

impl Placement {
    /// Every placement, in the order of [`Self::index`].
    pub const ALL: [Placement; 6] = [
        Placement::Home,
        Placement::Spill,
        Placement::Lent,
        Placement::Adopted,
        Placement::New,
        Placement::Unplaced,
    ];

    /// Its position in [`Self::ALL`] (a counter's slot).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Home => "home",
            Placement::Spill => "spill",
            Placement::Lent => "lent",
            Placement::Adopted => "adopted",
            Placement::New => "new",
            Placement::Unplaced => "unplaced",
        }
    }
}

/// Picks the index of a candidate (`cands` is not empty) for a request of
/// `prompt` tokens whose family hashes to `family` (`None`: no full
/// block), `homed` of them homed on some backend of the pool (a candidate
/// or not), and how it relates to the request's homes.
pub fn prefix_aware(
    cands: &[Candidate],
    prompt: u32,
    family: Option<u64>,
    homed: u32,
    rng: &mut impl Rng,
) -> (usize, Placement) {
    // The bound in requests over the backends' whole windows: the same
    // for one replica as for several, each of whose windows is a share;
    // the least loaded of those that may take any request (not
    // `kv_full`, homes only: one at least).
    let least = cands
        .iter()
        .filter(|c| !c.kv_full)
        .map(Candidate::whole_load)
        .fold(f64::INFINITY, f64::min);
    let within = |c: &Candidate| c.whole_load() - least <= SPILL_GAP;
    let half = prompt / 2;
    let Some(family) = family else {
        let i = pick_by(cands, rng, |c| (!c.kv_full).then(|| (c.load(), 0.0))).unwrap_or(0);
        return (i, Placement::Unplaced);
    };
    let deepest = cands.iter().map(|c| c.home_tokens).max().unwrap_or(0);
    if homed > deepest && homed >= half {
        // Its home cannot take it now (a full window, no headroom).
        return (lent(cands, rng), Placement::Lent);
    }
    // A backend within the bound holding at least half the prompt now
    // (its engine's events, or this replica's own sends), the least
    // loaded of those holding the most.
    let holds = (cands.iter())
        .filter(|c| !c.kv_full)
        .map(|c| c.cached_tokens)
        .max()
        .unwrap_or(0);
    let holder = |rng: &mut _| {
        pick_by(cands, rng, |c| {
            (within(c) && !c.kv_full && c.cached_tokens == holds).then(|| (c.load(), 0.0))
        })
        .filter(|_| holds > 0 && holds >= half)
    };
    if deepest > 0 && deepest >= half {
        // The home of the deepest homed prefix within the bound holding
        // the most of it, then the least loaded.
        let home = pick_by(cands, rng, |c| {
            (c.home_tokens == deepest && within(c)).then(|| (-f64::from(c.cached_tokens), c.load()))
        });
        let Some(home) = home else {
            return (lent(cands, rng), Placement::Spill);
        };
        // Its home's engine says it holds none of it and another backend
        // does (another replica placed it there): that one becomes a
        // home, so that replicas converge on one partition; a home that
        // evicted it and has no rival holder keeps it. Without the
        // engine's word, the home keeps it: this replica's sends alone
        // do not say what other replicas sent there.
        if cands[home].cached_tokens == 0
            && cands[home].events
            && let Some(i) = holder(rng)
        {
            return (i, Placement::Adopted);
        }
        return (home, Placement::Home);
    }
    if let Some(i) = holder(rng) {
        return (i, Placement::Adopted);
    }
    (new_home(cands, family, &within), Placement::New)
}

/// Where a request goes for itself only, its home being too busy or
/// full: the least loaded, the one holding more of the prompt first.
fn lent(cands: &[Candidate], rng: &mut impl Rng) -> usize {
    pick_by(cands, rng, |c| {
        (!c.kv_full).then(|| (c.load(), -f64::from(c.cached_tokens)))
    })
    .unwrap_or(0)
}

/// Among the candidates `within` the load bound, those whose cache the
/// prompt fits beside what is homed there (else all): the least loaded
/// (new prefixes balance the pool as load alone would), then the one
/// with the smallest share of the partition, then by rendezvous hashing
/// of `family` (replicas seeing the same loads and shares agree).
fn new_home(cands: &[Candidate], family: u64, within: &impl Fn(&Candidate) -> bool) -> usize {
    let fits = |c: &Candidate| c.homed + c.need <= 1.0;
    let open = |c: &Candidate| within(c) && !c.kv_full;
    let any_fits = cands.iter().any(|c| open(c) && fits(c));
    cands
        .iter()
        .enumerate()
        .filter(|(_, c)| open(c) && (fits(c) || !any_fits))
        .min_by(|(_, a), (_, b)| {
            a.load()
                .total_cmp(&b.load())
                .then(a.homed.total_cmp(&b.homed))
                .then_with(|| rendezvous(family, b.id.0).cmp(&rendezvous(family, a.id.0)))
        })
        .map_or(0, |(i, _)| i)
}

/// The rendezvous (highest random weight) score of `backend` for `family`.
fn rendezvous(family: u64, backend: u32) -> u64 {
    // splitmix64's finalizer over the pair: uniform, and the same on
    // every replica.
    let mut z = family ^ (u64::from(backend).wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The candidate with the smallest `key` among those with one, ties at
/// random; `None` when none has one.
fn pick_by(
    cands: &[Candidate],
    rng: &mut impl Rng,
    key: impl Fn(&Candidate) -> Option<(f64, f64)>,
) -> Option<usize> {
    let mut best: Option<(usize, (f64, f64))> = None;
    let mut ties = 1u32;
    for (i, c) in cands.iter().enumerate() {
        let Some(k) = key(c) else {
            continue;
        };
        match best {
            Some((_, b)) if k > b => {}
            Some((_, b)) if k == b => {
                ties += 1;
                if rng.random_range(0..ties) == 0 {
                    best = Some((i, k));
                }
            }
            _ => {
                best = Some((i, k));
                ties = 1;
            }
        }
    }
    best.map(|(i, _)| i)
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

    fn cand(id: u32, in_flight: u32, cached: u32, home: u32) -> Candidate {
        Candidate {
            id: BackendId(id),
            in_flight,
            waiting: 0,
            window: 8,
            window_share: 1.0,
            kv_usage: None,
            cached_tokens: cached,
            events: true,
            home_tokens: home,
            homed: 0.0,
            need: 0.1,
            kv_full: false,
        }
    }

    const FAMILY: Option<u64> = Some(0xfeed);

    #[test]
    fn a_prefix_goes_home_after_its_engine_evicts_it() {
        let mut rng = SmallRng::seed_from_u64(1);
        // Home on 1, evicted there, held nowhere: still 1, busier by up
        // to the gap.
        let c = [cand(0, 1, 0, 0), cand(1, 5, 0, 900)];
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 0, &mut rng),
            (1, Placement::Home)
        );
        // Held by 0 (another replica placed it there): 0 is adopted.
        let c = [cand(0, 1, 900, 0), cand(1, 5, 0, 900)];
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 0, &mut rng),
            (0, Placement::Adopted)
        );
        // Held by both: its home.
        let c = [cand(0, 1, 900, 0), cand(1, 5, 900, 900)];
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 0, &mut rng),
            (1, Placement::Home)
        );
        // Only this replica's sends say 0 holds it (no events): its home
        // may hold it from another replica's, and keeps it.
        let mut c = [cand(0, 1, 900, 0), cand(1, 5, 0, 900)];
        c.iter_mut().for_each(|c| c.events = false);
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 0, &mut rng),
            (1, Placement::Home)
        );
    }

    #[test]
    fn a_busy_home_spills_to_the_least_loaded() {
        let mut rng = SmallRng::seed_from_u64(1);
        let c = [cand(0, 2, 0, 0), cand(1, 7, 1000, 1000)];
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 0, &mut rng),
            (0, Placement::Spill)
        );
        // Two homes within the bound: the one holding it, then the less
        // loaded.
        let c = [cand(0, 3, 0, 1000), cand(1, 5, 1000, 1000)];
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 0, &mut rng),
            (1, Placement::Home)
        );
        let c = [cand(0, 3, 1000, 1000), cand(1, 5, 1000, 1000)];
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 0, &mut rng),
            (0, Placement::Home)
        );
    }

    #[test]
    fn a_home_that_cannot_take_it_now_lends_the_request_out() {
        let mut rng = SmallRng::seed_from_u64(1);
        // Homed on a backend that is not a candidate (its window is full):
        // the least loaded, for this request only.
        let c = [cand(0, 3, 0, 0), cand(1, 1, 0, 0)];
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 900, &mut rng),
            (1, Placement::Lent)
        );
    }

    #[test]
    fn a_backend_past_its_kv_watermark_takes_only_its_homes() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut full = cand(0, 1, 900, 900);
        full.kv_full = true;
        // Its home, holding it: there, even as the least loaded is
        // another.
        let c = [full, cand(1, 0, 0, 0)];
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 900, &mut rng),
            (0, Placement::Home)
        );
        // Never a new home, an adopter or a request without a block,
        // even the least loaded.
        let mut idle = full;
        idle.in_flight = 0;
        idle.home_tokens = 0;
        let c = [idle, cand(1, 3, 0, 0)];
        for family in [FAMILY, None] {
            for _ in 0..50 {
                assert_eq!(prefix_aware(&c, 1000, family, 0, &mut rng).0, 1);
            }
        }
        // Past the bound of the others' least load, it lends the request
        // out like any home.
        let mut busy = full;
        busy.in_flight = 7;
        let c = [busy, cand(1, 1, 0, 0)];
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 900, &mut rng),
            (1, Placement::Spill)
        );
    }

    #[test]
    fn a_short_shared_head_is_no_home() {
        let mut rng = SmallRng::seed_from_u64(1);
        // Backend 1 is home to the first 128 tokens of a 1,000-token
        // prompt (a common template head): the prompt is new.
        let c = [cand(0, 1, 0, 0), cand(1, 1, 128, 128)];
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 0, &mut rng).1,
            Placement::New
        );
    }

    #[test]
    fn an_engine_holding_a_homeless_prompt_adopts_it() {
        let mut rng = SmallRng::seed_from_u64(1);
        let c = [cand(0, 1, 0, 0), cand(1, 3, 900, 0)];
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 0, &mut rng),
            (1, Placement::Adopted)
        );
        // Not past the bound.
        let c = [cand(0, 1, 0, 0), cand(1, 7, 900, 0)];
        assert_eq!(
            prefix_aware(&c, 1000, FAMILY, 0, &mut rng),
            (0, Placement::New)
        );
    }

    #[test]
    fn new_prefixes_go_to_the_least_loaded_where_they_fit() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut c = [cand(0, 1, 0, 0), cand(1, 1, 0, 0), cand(2, 1, 0, 0)];
        // Among equals, the same family, the same home, whatever the
        // order of the candidates.
        let first = c[prefix_aware(&c, 1000, FAMILY, 0, &mut rng).0].id;
        c.reverse();
        assert_eq!(c[prefix_aware(&c, 1000, FAMILY, 0, &mut rng).0].id, first);
        // Families spread over the pool.
        let mut seen = [0; 3];
        for f in 0..3000u64 {
            seen[prefix_aware(&c, 1000, Some(f), 0, &mut rng).0] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
        // One request busier: the others, as load alone would.
        let mut busy = c;
        for x in busy.iter_mut().filter(|x| x.id == first) {
            x.in_flight = 2;
        }
        assert_ne!(
            busy[prefix_aware(&busy, 1000, FAMILY, 0, &mut rng).0].id,
            first
        );
        // A backend the prompt does not fit beside its homes is passed
        // over, even the least loaded.
        for x in c.iter_mut() {
            x.homed = if x.id == first { 0.95 } else { 0.9 };
            x.need = if x.id == first { 0.1 } else { 0.01 };
            x.in_flight = if x.id == first { 0 } else { 1 };
        }
        for _ in 0..100 {
            assert_ne!(c[prefix_aware(&c, 1000, FAMILY, 0, &mut rng).0].id, first);
        }
        // Nowhere fits: the least loaded.
        for x in c.iter_mut() {
            x.homed = 1.5;
        }
        assert_eq!(c[prefix_aware(&c, 1000, FAMILY, 0, &mut rng).0].id, first);
    }

    #[test]
    fn without_a_full_block_the_least_loaded_at_random() {
        let mut rng = SmallRng::seed_from_u64(1);
        let c = [cand(0, 3, 0, 0), cand(1, 1, 0, 0), cand(2, 2, 0, 0)];
        assert_eq!(
            prefix_aware(&c, 100, None, 0, &mut rng),
            (1, Placement::Unplaced)
        );
        let c = [cand(0, 1, 0, 0), cand(1, 1, 0, 0), cand(2, 1, 0, 0)];
        let mut seen = [0; 3];
        for _ in 0..3000 {
            seen[prefix_aware(&c, 100, None, 0, &mut rng).0] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }

    #[test]
    fn the_oracle_sends_to_the_holder_while_it_has_room() {
        let mut rng = SmallRng::seed_from_u64(1);
        // The holder is busier: still it.
        let c = [cand(0, 1, 0, 0), cand(1, 7, 900, 0)];
        assert_eq!(prefix_greedy(&c, &mut rng), 1);
        // Full: the least loaded, whatever it holds.
        let c = [cand(0, 3, 0, 0), cand(1, 8, 900, 0), cand(2, 2, 100, 0)];
        assert_eq!(prefix_greedy(&c, &mut rng), 2);
        // Everyone full: the least loaded.
        let c = [cand(0, 9, 0, 0), cand(1, 8, 900, 0)];
        assert_eq!(prefix_greedy(&c, &mut rng), 1);
    }
}
