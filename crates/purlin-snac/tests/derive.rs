//! Derivation: unit tests and property tests (total, deterministic, well-formed).

mod common;

use common::*;
use proptest::prelude::*;
use purlin_snac::params::{self, header_fields};
use purlin_snac::*;

fn small_cfg(regime: Regime, side: StagingSide) -> PlanConfig {
    PlanConfig {
        regime,
        staging_side: side,
        chunk_bytes: 256,
        blocks_per_role: 2,
        slots: 2,
        staging_bytes: 64 << 10,
        window_bytes: 1 << 20,
        ..PlanConfig::default()
    }
}

fn every_config() -> Vec<PlanConfig> {
    let mut v = vec![];
    for regime in [Regime::Latency, Regime::Throughput] {
        for side in [StagingSide::Own, StagingSide::Peer] {
            for ar in [AllReduceAlgo::OneShot, AllReduceAlgo::TwoShot] {
                for in_place in [false, true] {
                    v.push(PlanConfig { allreduce: ar, in_place, ..small_cfg(regime, side) });
                }
            }
        }
    }
    v
}

#[test]
fn every_collective_derives_well_formed_plans() {
    let mut derived = 0;
    for world in [2, 3, 4, 8, 16] {
        for c in Collective::ALL {
            for n in [0u64, 1, 7, 100, 1000] {
                let v = vec![n, 0, 3 * n + 1, 1];
                let spec = spec_of(c, world, DataType::F32, n, v);
                for cfg in every_config() {
                    match derive(&spec, &cfg) {
                        Ok(plans) => {
                            check_set(&plans).unwrap_or_else(|e| panic!("{c:?} w{world} n{n} {cfg:?}: {e}"));
                            derived += 1;
                        }
                        Err(DeriveError::InPlaceUnsupported(_)) => assert!(cfg.in_place),
                        Err(e) => panic!("{c:?} w{world} n{n} {cfg:?}: {e}"),
                    }
                }
            }
        }
    }
    assert!(derived > 1000, "{derived}");
}

#[test]
fn plan_size_does_not_grow_with_the_payload() {
    for c in Collective::ALL {
        for regime in [Regime::Latency, Regime::Throughput] {
            // Both sizes cyclic (throughput) or both in the window (latency).
            let (x, y) = if regime == Regime::Latency { (1 << 8, 1 << 12) } else { (1 << 22, 1 << 26) };
            let cfg = PlanConfig { regime, ..PlanConfig::default() };
            let a = derive(&spec_of(c, 4, DataType::Bf16, x, vec![x]), &cfg).unwrap();
            let b = derive(&spec_of(c, 4, DataType::Bf16, y, vec![y]), &cfg).unwrap();
            let steps = |p: &[Plan]| p.iter().map(Plan::step_count).collect::<Vec<_>>();
            assert_eq!(steps(&a), steps(&b), "{c:?} {regime:?}");
            assert_eq!(a[1].kernel_key(), b[1].kernel_key(), "{c:?} {regime:?}");
        }
    }
    // A gigabyte payload: the same plan size, a longer loop.
    let cfg = PlanConfig::default();
    let big = derive(&CollectiveSpec::all_reduce(8, DataType::F32, ReduceOp::Sum, 1 << 28), &cfg).unwrap();
    let small = derive(&CollectiveSpec::all_reduce(8, DataType::F32, ReduceOp::Sum, 1 << 24), &cfg).unwrap();
    assert_eq!(big[0].step_count(), small[0].step_count());
    assert!(big[0].max_trips() > small[0].max_trips());
}

#[test]
fn epoch_rules() {
    let cfg = small_cfg(Regime::Throughput, StagingSide::Peer);
    // Chunked non-V calls advance by an odd number, at least the chunk count.
    let p = derive(&CollectiveSpec::all_gather(4, DataType::F32, 1000), &cfg).unwrap();
    let chunks = (1000u64 * 4).div_ceil(256);
    assert_eq!(p[0].advance, Advance::Fixed(chunks | 1));
    assert_eq!(p[0].resources.epoch_words, cfg.max_coresident_blocks);
    // V plans: parametric in the agreed maximum, with the handshake in every block.
    let v = derive(&CollectiveSpec::all_gather_v(3, DataType::F32, vec![0, 64, 0]), &cfg).unwrap();
    for plan in &v {
        assert!(matches!(plan.advance, Advance::AgreedMaxChunks { .. }));
        for block in &plan.blocks {
            let waits = block.steps.iter().filter(|s| matches!(s, Step::HandshakeWait { .. })).count();
            assert_eq!(waits, 2);
        }
        let sends = plan.blocks[0].steps.iter().filter(|s| matches!(s, Step::HandshakeSend { .. })).count();
        assert_eq!(sends, 2);
    }
    // Ranks 0 and 2 send nothing; rank 0's local bound is 1 (it reads rank 1's one chunk).
    assert_eq!(v[1].advance, Advance::AgreedMaxChunks { local: 1 });
    // An empty non-V call is an empty plan that advances nothing.
    let e = derive(&CollectiveSpec::all_reduce(4, DataType::F32, ReduceOp::Sum, 0), &cfg).unwrap();
    assert!(e.iter().all(|p| p.blocks.is_empty() && p.advance == Advance::Fixed(0)));
    // AllReduce with empty shards needs the handshake (data does not tie every pair).
    let s = derive(&CollectiveSpec::all_reduce(4, DataType::F32, ReduceOp::Sum, 1), &cfg).unwrap();
    assert!(s[3].blocks[0].steps.iter().any(|s| matches!(s, Step::HandshakeSend { .. })));
    // Latency plans advance by one.
    let l = derive(&CollectiveSpec::all_to_all(4, DataType::U8, 10), &small_cfg(Regime::Latency, StagingSide::Own));
    assert_eq!(l.unwrap()[0].advance, Advance::Fixed(1));
}

#[test]
fn cyclic_staging_has_drains_resident_has_none() {
    let cfg = small_cfg(Regime::Throughput, StagingSide::Own);
    let has_drain = |plans: &[Plan]| {
        let mut found = false;
        for p in plans {
            p.for_each_step(|_, s, _| {
                if let Step::Arrive { then, .. } = s {
                    found |= then.iter().any(|n| n.kind == NotifyKind::Drain);
                }
            });
        }
        found
    };
    // 2 slots of 256 bytes: 512 bytes per pair is resident, 2048 is cyclic.
    let resident = derive(&CollectiveSpec::all_to_all(2, DataType::U8, 512), &cfg).unwrap();
    let cyclic = derive(&CollectiveSpec::all_to_all(2, DataType::U8, 2048), &cfg).unwrap();
    assert!(!has_drain(&resident));
    assert!(has_drain(&cyclic));
}

#[test]
fn typed_errors() {
    let f = DataType::F32;
    assert_eq!(CollectiveSpec::all_gather(1, f, 4).validate(), Err(SpecError::WorldOutOfRange { world: 1 }));
    assert_eq!(CollectiveSpec::all_gather(17, f, 4).validate(), Err(SpecError::WorldOutOfRange { world: 17 }));
    assert_eq!(
        CollectiveSpec::all_gather_v(3, f, vec![1, 2]).validate(),
        Err(SpecError::CountsLength { expected: 3, got: 2 })
    );
    assert!(matches!(
        CollectiveSpec::all_to_all_v(2, f, vec![vec![1, 2], vec![1]]).validate(),
        Err(SpecError::CountsLength { .. })
    ));
    let mut s = CollectiveSpec::all_gather(2, f, 4);
    s.op = Some(ReduceOp::Sum);
    assert!(matches!(s.validate(), Err(SpecError::UnexpectedReduceOp { .. })));
    let mut s = CollectiveSpec::all_reduce(2, f, ReduceOp::Sum, 4);
    s.op = None;
    assert!(matches!(s.validate(), Err(SpecError::MissingReduceOp { .. })));
    assert!(matches!(CollectiveSpec::elements(f, 6), Err(SpecError::NotElementMultiple { .. })));
    assert_eq!(CollectiveSpec::all_to_all(2, DataType::U64, u64::MAX / 4).validate(), Err(SpecError::SizeOverflow));
    // The V list of the wrong sum surfaces against the buffers.
    let v = CollectiveSpec::all_gather_v(2, f, vec![3, 5]);
    assert!(v.check_buffers(0, 3, 8).is_ok());
    assert!(matches!(v.check_buffers(0, 3, 9), Err(SpecError::BufferLength { which: "output", .. })));
    // Configuration errors.
    let spec = CollectiveSpec::all_gather(2, f, 64);
    let bad = |cfg: PlanConfig| derive(&spec, &cfg).unwrap_err();
    assert!(matches!(bad(PlanConfig { chunk_bytes: 100, ..Default::default() }), DeriveError::Misaligned { .. }));
    assert!(matches!(
        bad(PlanConfig { blocks_per_role: 40, chunk_bytes: 16 * 40, ..Default::default() }),
        DeriveError::TooManyBlocks { .. }
    ));
    assert!(matches!(bad(PlanConfig { staging_bytes: 64, ..Default::default() }), DeriveError::StagingTooSmall { .. }));
    assert!(matches!(
        derive(
            &CollectiveSpec::all_gather(2, f, 1 << 20),
            &PlanConfig { regime: Regime::Latency, ..Default::default() }
        ),
        Err(DeriveError::WindowTooSmall { .. })
    ));
    assert!(matches!(
        derive(&CollectiveSpec::all_to_all(2, f, 4), &PlanConfig { in_place: true, ..Default::default() }),
        Err(DeriveError::InPlaceUnsupported(_))
    ));
}

#[test]
fn layouts_of_the_collectives() {
    use Layout::*;
    let l = |c: Collective| (c.consume_op(), c.input_layout(), c.output_layout());
    assert_eq!(l(Collective::AllGather), (ConsumeOp::Gather, Packed, Scattered));
    assert_eq!(l(Collective::ReduceScatter), (ConsumeOp::Reduce, Scattered, Packed));
    assert_eq!(l(Collective::AllToAll), (ConsumeOp::Gather, Scattered, Transposed));
    assert_eq!(l(Collective::AllReduce), (ConsumeOp::Reduce, Scattered, Scattered));
    assert_eq!(l(Collective::AllToAllV), (ConsumeOp::Gather, ScatteredV, TransposedV));
    assert_eq!(Collective::AllReduce.composition(), Some((Collective::ReduceScatter, Collective::AllGather)));
    for c in Collective::ALL {
        assert_eq!(Collective::from_name(c.name()), Some(c));
    }
    assert_eq!(DataType::ALL.iter().map(|d| d.size()).sum::<u64>(), 4 + 8 + 2 + 2 + 1 + 1 + 4 + 4 + 8 + 8 + 1 + 1);
}

#[test]
fn serde_and_params_round_trip() {
    let spec = CollectiveSpec::all_to_all_v(3, DataType::F16, vec![vec![0, 5, 900], vec![1, 0, 0], vec![7, 7, 7]]);
    for cfg in every_config() {
        let Ok(plans) = derive(&spec, &cfg) else { continue };
        let bytes = encode_plans(&plans).unwrap();
        assert_eq!(decode_plans(&bytes).unwrap(), plans);
        let json = serde_json::to_string(&plans).unwrap();
        assert_eq!(serde_json::from_str::<Vec<Plan>>(&json).unwrap(), plans);
        for p in &plans {
            let words = p.params();
            let (h, blocks) = params::decode(&words).unwrap();
            assert_eq!(blocks, p.blocks);
            assert_eq!(h.rank, p.rank as u64);
            assert_eq!(h.total_words as usize, words.len());
            assert_eq!(params::to_bytes(&words).len(), 8 * words.len());
            // The block table's high half names each block's shape in the kernel key.
            let table = h.block_table as usize;
            let ids: Vec<u32> = (0..blocks.len()).map(|b| (words[table + 3 * b] >> 32) as u32).collect();
            assert_eq!(ids, p.block_shape_ids());
            let shapes = p.kernel_key().shapes;
            for (b, &id) in ids.iter().enumerate() {
                assert_eq!(shapes[id as usize], p.block_shape(b));
            }
        }
    }
    assert!(decode_plans(&[1, 2, 3]).is_err());
    assert!(params::decode(&[0; 3]).is_err());
    // A word between two blocks' records, every offset after it moved to match, decodes
    // step by step, but the device executor copies a block's records by the range up to the
    // next block's first word: refused.
    let plans = derive(&spec, &PlanConfig::default()).unwrap();
    let mut words = plans[0].params();
    let (h, blocks) = params::decode(&words).unwrap();
    assert!(blocks.len() >= 2, "the test needs two blocks");
    let table = h.block_table as usize;
    words.insert(words[table + 3 + 1] as usize, 0);
    for b in 1..blocks.len() {
        words[table + 3 * b + 1] += 1;
    }
    let total = header_fields().iter().find(|(name, _)| *name == "total_words").unwrap().1 / 8;
    words[total] += 1;
    let err = params::decode(&words).expect_err("a gap after block 0");
    assert!(err.to_string().contains("do not end where"), "{err}");
}

#[test]
fn param_header_layout() {
    let fields = header_fields();
    assert_eq!(fields.len(), params::HEADER_WORDS);
    for (i, (_, off)) in fields.iter().enumerate() {
        assert_eq!(*off, 8 * i);
    }
    let c = params::c_header();
    assert!(c.contains("static_assert(offsetof(SnacParamHeader, grid) == 32, \"grid\");"), "{c}");
}

#[test]
fn hand_written_plans_through_the_public_api() {
    // World 2 AllGather of 64 bytes, one block per rank, staging pushed into the peer.
    let spec = CollectiveSpec::all_gather(2, DataType::U8, 64);
    let plans: Vec<Plan> = (0..2)
        .map(|r| {
            let peer = 1 - r;
            let steps = vec![
                Step::Stage {
                    dst: Region::staging(peer, Offset::fixed(0).sense(128)),
                    src: Region::input(Offset::fixed(0)),
                    len: Len::fixed(64),
                    guard: Guard::ALWAYS,
                    share: None,
                },
                Step::Signal {
                    notify: Notify { kind: NotifyKind::Ready, peer, flag: Index::fixed(0), value: EpochVal::at(1) },
                    guard: Guard::ALWAYS,
                },
                Step::Gather {
                    dst: Region::output(Offset::fixed(64 * r as u64)),
                    src: Region::input(Offset::fixed(0)),
                    len: Len::fixed(64),
                    expect: None,
                    guard: Guard::ALWAYS,
                },
                Step::Wait { flag: Index::fixed(0), value: EpochVal::at(1), guard: Guard::ALWAYS },
                Step::Gather {
                    dst: Region::output(Offset::fixed(64 * peer as u64)),
                    src: Region::staging(r, Offset::fixed(0).sense(128)),
                    len: Len::fixed(64),
                    expect: None,
                    guard: Guard::ALWAYS,
                },
            ];
            Plan {
                spec: spec.clone(),
                rank: r,
                regime: Regime::Throughput,
                staging_side: Some(StagingSide::Peer),
                packet: PacketFormat::B8,
                resources: Resources {
                    input_bytes: 64,
                    output_bytes: 128,
                    alias: None,
                    staging_bytes: 256,
                    window_bytes: 0,
                    flag_words: 1,
                    counter_words: 0,
                    epoch_words: 1,
                    ce_value_words: 0,
                },
                advance: Advance::Fixed(1),
                max_coresident_blocks: 1,
                one_copy: false,
                blocks: vec![BlockProgram { role: Role::Custom(0), steps }],
                engine: None,
                landed: None,
            }
        })
        .collect();
    check_set(&plans).unwrap();
    // A wait nobody signals is caught.
    let mut broken = plans.clone();
    if let Step::Wait { flag, .. } = &mut broken[0].blocks[0].steps[3] {
        *flag = Index::fixed(0);
    }
    if let Step::Signal { notify, .. } = &mut broken[1].blocks[0].steps[1] {
        notify.peer = 1;
    }
    assert!(check_set(&broken).is_err());
    // Out-of-bounds regions are caught.
    let mut oob = plans.clone();
    if let Step::Stage { len, .. } = &mut oob[0].blocks[0].steps[0] {
        *len = Len::fixed(200);
    }
    assert!(oob[0].check().is_err());
}

#[test]
fn derivation_is_deterministic_for_a_fixed_case() {
    let spec = CollectiveSpec::reduce_scatter_v(5, DataType::Bf16, ReduceOp::Avg, vec![0, 1, 4000, 3, 0]);
    let cfg = small_cfg(Regime::Throughput, StagingSide::Own);
    assert_eq!(derive(&spec, &cfg).unwrap(), derive(&spec, &cfg).unwrap());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Derivation is total (a plan or a typed error, never a panic or an ill-formed plan)
    /// and deterministic, and what it derives is well-formed.
    #[test]
    fn derivation_total_deterministic_well_formed(spec in spec(2..=16), cfg in config()) {
        let a = derive(&spec, &cfg);
        let b = derive(&spec, &cfg);
        prop_assert_eq!(&a, &b);
        match a {
            Ok(plans) => {
                prop_assert_eq!(plans.len(), spec.world as usize);
                if let Err(e) = check_set(&plans) {
                    return Err(TestCaseError::fail(format!("{e}")));
                }
                for p in &plans {
                    prop_assert!(p.grid() <= cfg.max_coresident_blocks as usize);
                    match p.advance {
                        Advance::Fixed(a) => prop_assert!(a % 2 == 1 || (a == 0 && p.blocks.is_empty())),
                        Advance::AgreedMaxChunks { local } => {
                            prop_assert!(spec.collective.is_v());
                            prop_assert!(local >= p.max_trips());
                        }
                    }
                    if let Advance::Fixed(a) = p.advance {
                        prop_assert!(a >= p.max_trips());
                    }
                }
            }
            Err(DeriveError::Internal(e)) => return Err(TestCaseError::fail(format!("ill-formed: {e}"))),
            Err(DeriveError::Spec(e)) => return Err(TestCaseError::fail(format!("generator made a bad spec: {e}"))),
            Err(_) => {}
        }
    }

    /// Plans derived for one rank alone equal that rank's plan of the whole set.
    #[test]
    fn per_rank_derivation_matches(spec in spec(2..=6), cfg in config(), r in 0u32..6) {
        if let Ok(plans) = derive(&spec, &cfg) {
            let r = r % spec.world;
            prop_assert_eq!(&derive_rank(&spec, &cfg, r).unwrap(), &plans[r as usize]);
        }
    }
}

/// The call digest: the same on every rank of a derived set (also a one-copy set where a rank
/// has nothing to send or receive), different for another spec or one-copy against staged.
#[test]
fn call_digests_agree_within_a_call_and_differ_between_calls() {
    let mut seen = std::collections::HashMap::new();
    let mut one_copy_sets = 0;
    for world in [2, 3, 4] {
        for c in Collective::ALL {
            for (n, v) in [(1u64, vec![1, 0, 3, 1]), (100, vec![0, 100, 0, 7]), (100, vec![0, 0, 0, 0])] {
                let spec = spec_of(c, world, DataType::F32, n, v);
                for one_copy in [false, true] {
                    let cfg = PlanConfig {
                        peer_outputs: one_copy,
                        peer_inputs: one_copy,
                        ..small_cfg(Regime::Throughput, StagingSide::Peer)
                    };
                    let plans = derive(&spec, &cfg).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
                    let digest = plans[0].call_digest();
                    assert!(plans.iter().all(|p| p.call_digest() == digest), "{spec:?} one-copy {one_copy}");
                    assert!(plans.iter().all(|p| p.one_copy == plans[0].one_copy), "{spec:?}");
                    assert!(one_copy || !plans[0].one_copy, "{spec:?}: one-copy without registered buffers");
                    one_copy_sets += usize::from(plans[0].one_copy);
                    // Distinct calls, distinct digests (32 bits: no collision among these).
                    let key = format!("{spec:?} {}", plans[0].one_copy);
                    if let Some(other) = seen.insert(digest, key.clone()) {
                        assert_eq!(other, key, "two calls share the digest {digest:#x}");
                    }
                    let words = params::encode(&plans[0]);
                    assert_eq!(params::decode(&words).expect("decode").0.call_digest, u64::from(digest));
                }
            }
        }
    }
    assert!(seen.len() > 100, "{}", seen.len());
    assert!(one_copy_sets > 20, "{one_copy_sets}");
}
