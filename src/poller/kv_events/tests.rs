use rmpv::Value;

use super::*;

fn pack(v: Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &v).unwrap();
    out
}

fn s(t: &str) -> Value {
    Value::from(t)
}

fn ints(xs: &[u64]) -> Value {
    Value::Array(xs.iter().map(|x| Value::from(*x)).collect())
}

#[test]
fn vllm_map_events_in_an_array_envelope() {
    // As vLLM 0.26 sends them (fields with defaults omitted, `extra_keys`
    // and unknown fields ignored).
    let stored = Value::Map(vec![
        (s("type"), s("BlockStored")),
        (s("block_hashes"), ints(&[u64::MAX - 1, 7])),
        (s("parent_block_hash"), Value::Nil),
        (s("token_ids"), ints(&[1, 2, 3, 4])),
        (s("block_size"), Value::from(2)),
        (s("lora_id"), Value::Nil),
        (s("medium"), s("GPU")),
        (s("lora_name"), Value::Nil),
        (s("extra_keys"), Value::Array(vec![Value::Nil])),
        (s("group_idx"), Value::from(0)),
        (s("kv_cache_spec_kind"), s("full_attention")),
    ]);
    let removed = Value::Map(vec![
        (s("type"), s("BlockRemoved")),
        (s("block_hashes"), ints(&[7])),
        (s("medium"), s("GPU")),
    ]);
    let payload = pack(Value::Array(vec![
        Value::from(1789095808.83),
        Value::Array(vec![
            stored,
            removed,
            Value::Map(vec![(s("type"), s("AllBlocksCleared"))]),
        ]),
        Value::from(0),
    ]));
    let b = decode_batch(&payload).unwrap();
    assert_eq!(b.data_parallel_rank, Some(0));
    assert_eq!(b.skipped, 0);
    assert_eq!(
        b.events,
        vec![
            KvEvent::BlockStored {
                block_hashes: vec![EngineHash::Int(u64::MAX - 1), EngineHash::Int(7)],
                parent: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
                lora_name: None,
                medium: Some("GPU".into()),
                group_idx: Some(0),
                salt: None,
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![EngineHash::Int(7)],
                medium: Some("GPU".into()),
                group_idx: None,
            },
            KvEvent::AllBlocksCleared,
        ]
    );
}

#[test]
fn the_salt_is_read_from_vllms_extra_keys_and_sglangs_metadata() {
    let salt_of = |event: Value| {
        let payload = pack(Value::Array(vec![
            Value::from(0.0),
            Value::Array(vec![event]),
        ]));
        match &decode_batch(&payload).unwrap().events[0] {
            KvEvent::BlockStored { salt, .. } => salt.clone(),
            e => panic!("{e:?}"),
        }
    };
    let vllm = |lora: Value, extra: Value| {
        Value::Map(vec![
            (s("type"), s("BlockStored")),
            (s("block_hashes"), ints(&[1, 2])),
            (s("parent_block_hash"), Value::Nil),
            (s("token_ids"), ints(&[1, 2, 3, 4])),
            (s("block_size"), Value::from(2)),
            (s("lora_id"), Value::Nil),
            (s("medium"), s("GPU")),
            (s("lora_name"), lora),
            (s("extra_keys"), extra),
        ])
    };
    // The LoRA name leads the first block's tuple; the salt ends it.
    let keys = Value::Array(vec![
        Value::Array(vec![s("sql-lora"), s("team-a")]),
        Value::Nil,
    ]);
    assert_eq!(
        salt_of(vllm(s("sql-lora"), keys)).as_deref(),
        Some("team-a")
    );
    let lora_only = Value::Array(vec![Value::Array(vec![s("sql-lora")]), Value::Nil]);
    assert_eq!(salt_of(vllm(s("sql-lora"), lora_only)), None);
    assert_eq!(
        salt_of(vllm(Value::Nil, Value::Array(vec![Value::Nil]))),
        None
    );
    // SGLang's BlockStoredWithMetadata, positional: metadata where vLLM
    // has lora_name.
    let sglang = Value::Array(vec![
        s("BlockStored"),
        ints(&[1]),
        Value::Nil,
        ints(&[1, 2]),
        Value::from(2),
        Value::Nil,
        Value::Nil,
        Value::Map(vec![(s("cache_salt"), s("team-b"))]),
    ]);
    assert_eq!(salt_of(sglang).as_deref(), Some("team-b"));
}

#[test]
fn positional_events_signed_and_byte_hashes_and_a_map_envelope() {
    // vLLM before its map encoding and SGLang: tagged arrays, trailing
    // defaults omitted; SGLang's hashes are signed; bytes when vLLM sends
    // the raw digest.
    let stored = Value::Array(vec![
        s("BlockStored"),
        Value::Array(vec![Value::from(-5i64), Value::Binary(vec![1, 2, 3])]),
        Value::from(-9i64),
        ints(&[10, 11]),
        Value::from(1),
        Value::Nil,
        s("GPU"),
        s("sql-lora"),
    ]);
    let removed = Value::Array(vec![
        s("BlockRemoved"),
        Value::Array(vec![Value::from(-5i64)]),
    ]);
    let payload = pack(Value::Map(vec![
        (s("ts"), Value::from(1.5)),
        (
            s("events"),
            Value::Array(vec![stored, removed, Value::Array(vec![s("FutureEvent")])]),
        ),
    ]));
    let b = decode_batch(&payload).unwrap();
    assert_eq!(b.ts, 1.5);
    assert_eq!(b.skipped, 1, "the unknown event is skipped, not an error");
    let KvEvent::BlockStored {
        block_hashes,
        parent,
        lora_name,
        ..
    } = &b.events[0]
    else {
        panic!("{:?}", b.events);
    };
    assert_eq!(
        block_hashes,
        &vec![
            EngineHash::Int(-5i64 as u64),
            EngineHash::Bytes(vec![1, 2, 3])
        ]
    );
    assert_eq!(parent, &Some(EngineHash::Int(-9i64 as u64)));
    assert_eq!(lora_name.as_deref(), Some("sql-lora"));
    assert_eq!(
        b.events[1],
        KvEvent::BlockRemoved {
            block_hashes: vec![EngineHash::Int(-5i64 as u64)],
            medium: None,
            group_idx: None,
        }
    );
}

#[test]
fn what_is_not_a_batch_is_a_clear_error() {
    // An array of two with nothing after its head.
    assert!(matches!(
        decode_batch(b"\x92"),
        Err(KvDecodeError::Msgpack(_))
    ));
    let mut two = pack(Value::Array(vec![Value::from(0), Value::Array(vec![])]));
    two.push(0);
    assert_eq!(decode_batch(&two), Err(KvDecodeError::Trailing));
    assert_eq!(
        decode_batch(&pack(Value::from(3))),
        Err(KvDecodeError::Envelope)
    );
    let no_tokens = pack(Value::Array(vec![
        Value::from(0),
        Value::Array(vec![Value::Map(vec![
            (s("type"), s("BlockStored")),
            (s("block_hashes"), ints(&[1])),
        ])]),
    ]));
    assert_eq!(
        decode_batch(&no_tokens),
        Err(KvDecodeError::Event {
            index: 0,
            reason: "BlockStored without token_ids"
        })
    );
    assert_eq!(decode_seq(&[0, 0, 0, 0, 0, 0, 1, 2]), Ok(258));
    assert_eq!(decode_seq(&[1]), Err(KvDecodeError::Seq(1)));
}

#[test]
fn what_the_simulated_engine_publishes_decodes_to_itself() {
    let batch = EventBatch {
        ts: 12.25,
        events: vec![
            KvEvent::BlockStored {
                block_hashes: vec![EngineHash::Int(3), EngineHash::Bytes(vec![9; 32])],
                parent: Some(EngineHash::Int(2)),
                token_ids: (0..32).collect(),
                block_size: 16,
                lora_name: Some("a".into()),
                medium: Some("GPU".into()),
                group_idx: None,
                salt: Some("tenant-7".into()),
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![EngineHash::Int(3)],
                medium: Some("GPU".into()),
                group_idx: Some(0),
            },
            KvEvent::AllBlocksCleared,
        ],
        data_parallel_rank: Some(1),
        skipped: 0,
    };
    assert_eq!(decode_batch(&encode_batch(&batch)), Ok(batch));
}

#[test]
fn the_fuzz_seeds_are_batches() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/kv_events");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let b = decode_batch(&std::fs::read(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!b.events.is_empty(), "{}", path.display());
        n += 1;
    }
    assert_eq!(n, 3);
}
