use proptest::prelude::*;

use super::*;

const B0: BackendId = BackendId(0);
const B1: BackendId = BackendId(1);
const B2: BackendId = BackendId(2);

fn at(secs: u64) -> Instant {
    Instant::from_nanos(secs * 1_000_000_000)
}

fn lengths(ix: &mut PrefixIndex, now: Instant, keys: &[u64], bs: &[BackendId]) -> Vec<u32> {
    let mut out = Vec::new();
    ix.matched(now, keys, bs, &mut out);
    out
}

#[test]
fn a_match_is_the_leading_run_each_backend_holds() {
    let mut ix = PrefixIndex::new(100, None);
    ix.stored(at(0), B0, &[1, 2, 3, 4]);
    ix.stored(at(0), B1, &[1, 2]);
    ix.stored(at(0), B2, &[2, 3]); // not from the start: no match
    assert_eq!(
        lengths(&mut ix, at(1), &[1, 2, 3, 9], &[B0, B1, B2]),
        vec![3, 2, 0]
    );
    assert_eq!(lengths(&mut ix, at(1), &[7, 2, 3], &[B0, B1]), vec![0, 0]);
    assert_eq!(lengths(&mut ix, at(1), &[], &[B0]), vec![0]);
}

#[test]
fn removed_and_cleared_forget_a_backend_only() {
    let mut ix = PrefixIndex::new(100, None);
    ix.stored(at(0), B0, &[1, 2, 3]);
    ix.stored(at(0), B1, &[1, 2, 3]);
    ix.removed(B0, &[2]);
    assert_eq!(lengths(&mut ix, at(0), &[1, 2, 3], &[B0, B1]), vec![1, 3]);
    ix.cleared(B1);
    assert_eq!(lengths(&mut ix, at(0), &[1, 2, 3], &[B0, B1]), vec![1, 0]);
    // Keys nobody holds are gone from the index: 2 (b0 had lost it).
    assert_eq!(ix.len(), 2);
    ix.removed(B0, &[1, 3]);
    assert!(ix.is_empty());
}

#[test]
fn approximate_holders_age_out() {
    let mut ix = PrefixIndex::new(100, Some(Duration::from_secs(10)));
    ix.stored(at(0), B0, &[1, 2]);
    ix.stored(at(8), B1, &[1, 2]);
    assert_eq!(lengths(&mut ix, at(10), &[1, 2], &[B0, B1]), vec![2, 2]);
    assert_eq!(lengths(&mut ix, at(11), &[1, 2], &[B0, B1]), vec![0, 2]);
    // Storing again refreshes.
    ix.stored(at(11), B0, &[1]);
    assert_eq!(lengths(&mut ix, at(20), &[1, 2], &[B0, B1]), vec![1, 0]);
}

#[test]
fn a_key_keeps_its_most_recent_holders() {
    let mut ix = PrefixIndex::new(100, None);
    for b in 0..=HOLDERS as u32 {
        ix.stored(at(u64::from(b)), BackendId(b), &[5]);
    }
    let all: Vec<BackendId> = (0..=HOLDERS as u32).map(BackendId).collect();
    let got = lengths(&mut ix, at(9), &[5], &all);
    // The first stored is the one forgotten.
    assert_eq!(got[0], 0);
    assert!(got[1..].iter().all(|&n| n == 1), "{got:?}");
}

#[test]
fn a_full_index_evicts_the_keys_not_used_since_the_hand_passed() {
    let mut ix = PrefixIndex::new(4, None);
    ix.stored(at(0), B0, &[1, 2, 3, 4]);
    // The hand clears every reference bit once, then evicts key 1.
    ix.stored(at(0), B0, &[5]);
    assert_eq!(ix.len(), 4);
    assert_eq!(ix.stats().evictions, 1);
    // Key 2 is used now; 3 is the next to go, not 2.
    assert_eq!(lengths(&mut ix, at(0), &[2], &[B0]), vec![1]);
    ix.stored(at(0), B0, &[6]);
    assert_eq!(lengths(&mut ix, at(0), &[2], &[B0]), vec![1]);
    assert_eq!(lengths(&mut ix, at(0), &[3], &[B0]), vec![0]);
}

#[test]
fn a_smaller_cap_on_reload_evicts_at_once() {
    let mut ix = PrefixIndex::new(10, None);
    ix.stored(at(0), B0, &(0..10).collect::<Vec<u64>>());
    ix.reconfigure(3, None);
    assert_eq!(ix.len(), 3);
    assert_eq!(ix.stats().cap, 3);
    ix.stored(at(0), B1, &[100, 101, 102, 103]);
    assert_eq!(ix.len(), 3);
}

#[test]
fn memory_per_block_is_as_documented() {
    let n = 1 << 16;
    let mut ix = PrefixIndex::new(n, None);
    let keys: Vec<u64> = (0..n as u64)
        .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    for chunk in keys.chunks(32) {
        ix.stored(at(0), B0, chunk);
    }
    assert_eq!(ix.len(), n);
    let per = ix.heap_bytes() / n;
    assert!(per <= ENTRY_BYTES, "{per} bytes per block");
    assert!(per >= std::mem::size_of::<Slot>(), "{per}");
}

proptest! {
    /// Whatever is stored, removed and cleared, the index never holds more
    /// than its cap, and a lookup agrees with a model of what each
    /// backend holds wherever the model says the key is still indexed.
    #[test]
    fn bounded_and_consistent(
        cap in 1usize..40,
        ops in proptest::collection::vec((0u8..4, 0u32..3, proptest::collection::vec(0u64..60, 0..12)), 0..200),
    ) {
        let mut ix = PrefixIndex::new(cap, None);
        for (op, b, keys) in &ops {
            let b = BackendId(*b);
            match op {
                0 | 1 => ix.stored(at(0), b, keys),
                2 => ix.removed(b, keys),
                _ => ix.cleared(b),
            }
            prop_assert!(ix.len() <= cap);
            prop_assert!(ix.slots.len() <= cap);
            prop_assert_eq!(ix.map.len() + ix.free.len(), ix.slots.len());
            for (k, &i) in &ix.map {
                prop_assert_eq!(ix.slots[i as usize].key, *k);
                prop_assert!(!ix.slots[i as usize].free);
            }
            // Each backend's count of blocks is what its holders say.
            for b in 0..3u32 {
                let holding = ix
                    .map
                    .values()
                    .filter(|&&i| ix.slots[i as usize].holders.iter().any(|h| h.backend == b))
                    .count();
                prop_assert_eq!(ix.held(BackendId(b)), holding);
            }
        }
    }
}
