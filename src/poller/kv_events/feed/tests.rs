use super::*;
use crate::tokens::request_keys;

fn stored(hashes: &[u64], parent: Option<u64>, ids: &[u32], size: u32) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: hashes.iter().map(|h| EngineHash::Int(*h)).collect(),
        parent: parent.map(EngineHash::Int),
        token_ids: ids.to_vec(),
        block_size: size,
        lora_name: None,
        medium: Some("GPU".into()),
        group_idx: None,
        salt: None,
    }
}

fn batch(events: Vec<KvEvent>) -> EventBatch {
    EventBatch {
        events,
        ..EventBatch::default()
    }
}

fn run(feed: &mut Feed, seq: u64, events: Vec<KvEvent>) -> Vec<PrefixEvent> {
    let mut out = Vec::new();
    feed.apply(seq, &batch(events), &mut out);
    out
}

fn stored_keys(out: &[PrefixEvent]) -> Vec<u64> {
    out.iter()
        .flat_map(|e| match e {
            PrefixEvent::Stored(k) => k.clone(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn keys_from_the_events_tokens_equal_the_gateways_whatever_the_engines_block() {
    let ids: Vec<u32> = (100..124).collect();
    let want = request_keys("m", None, &ids, 8);
    assert_eq!(want.len(), 3);
    // Engine blocks of 4, canonical 8: one chain of six, or two chains
    // (the second continuing the first's last block).
    let mut one = Feed::new("m", 8, 100);
    let out = run(
        &mut one,
        0,
        vec![stored(&[1, 2, 3, 4, 5, 6], None, &ids, 4)],
    );
    assert_eq!(stored_keys(&out), want);
    let mut two = Feed::new("m", 8, 100);
    let mut out = run(&mut two, 0, vec![stored(&[1, 2, 3], None, &ids[..12], 4)]);
    out.extend(run(
        &mut two,
        1,
        vec![stored(&[4, 5, 6], Some(3), &ids[12..], 4)],
    ));
    assert_eq!(stored_keys(&out), want);
    // Engine blocks of 8 and of 24 (canonical 8): the same keys.
    for size in [8u32, 24] {
        let mut f = Feed::new("m", 8, 100);
        let hashes: Vec<u64> = (1..=(24 / size as u64)).collect();
        let out = run(&mut f, 0, vec![stored(&hashes, None, &ids, size)]);
        assert_eq!(stored_keys(&out), want, "engine block {size}");
    }
}

#[test]
fn removing_an_engine_block_removes_the_keys_completed_in_it() {
    let ids: Vec<u32> = (0..32).collect();
    let want = request_keys("m", None, &ids, 8);
    // Engine 16, canonical 8: each engine block completes two keys.
    let mut f = Feed::new("m", 8, 100);
    run(&mut f, 0, vec![stored(&[10, 11], None, &ids, 16)]);
    let out = run(
        &mut f,
        1,
        vec![KvEvent::BlockRemoved {
            block_hashes: vec![EngineHash::Int(11), EngineHash::Int(99)],
            medium: None,
            group_idx: None,
        }],
    );
    assert_eq!(out, vec![PrefixEvent::Removed(want[2..].to_vec())]);
    assert_eq!(f.len(), 1);
    let out = run(&mut f, 2, vec![KvEvent::AllBlocksCleared]);
    assert_eq!(out, vec![PrefixEvent::Cleared]);
    assert!(f.is_empty());
}

#[test]
fn lora_and_salt_root_the_chain_as_the_gateway_does() {
    let ids: Vec<u32> = (0..16).collect();
    let mut f = Feed::new("m", 8, 100);
    let mut e = stored(&[1, 2], None, &ids, 8);
    if let KvEvent::BlockStored {
        lora_name, salt, ..
    } = &mut e
    {
        *lora_name = Some("m-lora".into());
        *salt = Some("team-a".into());
    }
    let out = run(&mut f, 0, vec![e]);
    assert_eq!(
        stored_keys(&out),
        request_keys("m-lora", Some("team-a"), &ids, 8)
    );
    assert_ne!(stored_keys(&out), request_keys("m", None, &ids, 8));
}

#[test]
fn unknown_parents_other_tiers_and_short_tokens_are_counted_not_keyed() {
    let ids: Vec<u32> = (0..8).collect();
    let mut f = Feed::new("m", 8, 100);
    let mut cpu = stored(&[1], None, &ids, 8);
    if let KvEvent::BlockStored { medium, .. } = &mut cpu {
        *medium = Some("CPU".into());
    }
    let out = run(
        &mut f,
        0,
        vec![
            stored(&[2], Some(77), &ids, 8),
            cpu,
            stored(&[3, 4], None, &ids, 8),
        ],
    );
    assert!(out.is_empty(), "{out:?}");
    assert_eq!((f.stats.unanchored, f.stats.ignored), (1, 2));
    assert_eq!(f.stats.events, 3);
}

#[test]
fn sequence_numbers_tell_next_gaps_repeats_and_restarts() {
    let mut f = Feed::new("m", 8, 100);
    assert_eq!(f.sequence(5), Sequence::First);
    run(&mut f, 5, Vec::new());
    assert_eq!(f.sequence(6), Sequence::Next);
    assert_eq!(f.sequence(9), Sequence::Gap { missing: 6 });
    assert_eq!(f.sequence(5), Sequence::Old);
    assert_eq!(f.sequence(0), Sequence::Restart);
    f.reset();
    assert_eq!(f.sequence(0), Sequence::First);
}

#[test]
fn the_feed_remembers_at_most_its_cap_of_engine_blocks() {
    let ids: Vec<u32> = (0..40).collect();
    let mut f = Feed::new("m", 8, 3);
    run(&mut f, 0, vec![stored(&[1, 2, 3, 4, 5], None, &ids, 8)]);
    assert_eq!(f.len(), 3);
    assert_eq!(f.stats.forgotten, 2);
    // A chain after a forgotten block cannot be keyed; after a kept one
    // it can.
    let more: Vec<u32> = (40..48).collect();
    assert!(run(&mut f, 1, vec![stored(&[6], Some(1), &more, 8)]).is_empty());
    assert_eq!(f.stats.unanchored, 1);
    assert_eq!(
        stored_keys(&run(&mut f, 2, vec![stored(&[7], Some(5), &more, 8)])).len(),
        1
    );
    // Removals and re-stores never let it pass the cap.
    for i in 0..50u64 {
        run(
            &mut f,
            3 + i,
            vec![stored(&[100 + i % 7], None, &ids[..8], 8)],
        );
        assert!(f.len() <= 3);
        assert!(f.order.len() <= 2 * 3 + 1);
    }
}

proptest::proptest! {
    /// Whatever events arrive, in whatever order: no panic, and never more
    /// than the cap of engine blocks remembered.
    #[test]
    fn any_events_keep_the_feed_bounded(
        ops in proptest::collection::vec(
            (0u8..4, proptest::collection::vec(0u64..40, 0..6), proptest::option::of(0u64..40), 1u32..5),
            0..200,
        ),
        cap in 1usize..20,
        block in 1u32..9,
    ) {
        let mut f = Feed::new("m", block, cap);
        let mut out = Vec::new();
        for (seq, (op, hashes, parent, size)) in ops.into_iter().enumerate() {
            let tokens: Vec<u32> = (0..hashes.len() as u32 * size).collect();
            let e = match op {
                0 | 1 => stored(&hashes, parent, &tokens, size),
                2 => KvEvent::BlockRemoved {
                    block_hashes: hashes.iter().map(|h| EngineHash::Int(*h)).collect(),
                    medium: None,
                    group_idx: None,
                },
                _ => KvEvent::AllBlocksCleared,
            };
            f.apply(seq as u64, &batch(vec![e]), &mut out);
            proptest::prop_assert!(f.len() <= cap);
            proptest::prop_assert!(f.order.len() <= 2 * cap + 1);
        }
    }
}
