//! Copy-engine plans (docs/perf/copy-engines.md §3): derived ones verify, also back to back
//! with SM calls on the same flag words; their structural checks; serialization; and every
//! copy-engine mutant is rejected, by the verifier and (where it decides) its reference.

use purlin_snac::verify::engine::engine_mutants;
use purlin_snac::verify::{Options, reference, verify};
use purlin_snac::*;

fn cfg(copy_engine: bool, in_place: bool) -> PlanConfig {
    PlanConfig {
        chunk_bytes: 32,
        blocks_per_role: 1,
        slots: 2,
        staging_bytes: 2048,
        window_bytes: 4096,
        max_coresident_blocks: 8,
        flag_words: 64,
        peer_outputs: true,
        peer_inputs: true,
        in_place,
        copy_engine,
        ..PlanConfig::default()
    }
}

fn ce(spec: &CollectiveSpec) -> Vec<Plan> {
    derive(spec, &cfg(true, false)).unwrap_or_else(|e| panic!("{spec:?}: {e}"))
}

/// The gathers the copy engines take, at worlds 2 and 3: uniform, V with empty partitions,
/// a Broadcast (the AllGatherV with counts at the root only).
fn gathers() -> Vec<CollectiveSpec> {
    let dt = DataType::U8;
    let mut out = vec![];
    for w in [2u32, 3] {
        out.push(CollectiveSpec::all_gather(w, dt, 40));
        out.push(CollectiveSpec::all_to_all(w, dt, 24));
        out.push(CollectiveSpec::all_gather_v(w, dt, (0..w as u64).map(|r| r * 17).collect()));
        let mut bcast = vec![0; w as usize];
        bcast[1] = 33;
        out.push(CollectiveSpec::all_gather_v(w, dt, bcast));
        out.push(CollectiveSpec::all_to_all_v(
            w,
            dt,
            (0..w as u64).map(|s| (0..w as u64).map(|d| (s * 7 + d * 3) % 5 * 8).collect()).collect(),
        ));
    }
    out
}

/// AllReduces whose gather half the copy engines take: worlds 2 and 3, sizes not divisible by
/// the world, one with empty shards (2 elements at world 3), Sum and Max, f32 and bf16.
fn all_reduces() -> Vec<CollectiveSpec> {
    vec![
        CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, 37),
        CollectiveSpec::all_reduce(2, DataType::Bf16, ReduceOp::Max, 21),
        CollectiveSpec::all_reduce(3, DataType::F32, ReduceOp::Max, 10),
        CollectiveSpec::all_reduce(3, DataType::Bf16, ReduceOp::Sum, 2),
    ]
}

#[test]
fn derived_copy_engine_all_reduces_reduce_on_sm_blocks_then_copy_the_shard() {
    for spec in all_reduces() {
        for blocks in [1u32, 2] {
            let plans = derive(&spec, &PlanConfig { blocks_per_role: blocks, ..cfg(true, false) }).unwrap();
            for p in plans {
                let roles: Vec<Role> = p.blocks.iter().map(|b| b.role).collect();
                let mut want = vec![Role::CeEntry; blocks as usize];
                want.push(Role::CeExit);
                assert_eq!(roles, want, "{spec:?}");
                let eng = p.engine.as_ref().expect("an engine program");
                assert_eq!(eng.after, Phase::Sequential);
                assert_eq!(eng.notifies().count() as u32, spec.world - 1);
                // The engine copies this rank's shard, from its output, into every peer's.
                let (off, len) = spec.shard(p.rank);
                let mut to = vec![];
                for s in &eng.steps {
                    if let EngineStep::Copy { dst, src, len: n, .. } = s {
                        assert_eq!(
                            (src.space, src.offset.base, dst.offset.base, n.at(0)),
                            (Space::Output, off, off, len)
                        );
                        match dst.space {
                            Space::PeerOutput(q) => to.push(q),
                            other => panic!("{spec:?}: a copy into {other:?}"),
                        }
                    }
                }
                to.sort();
                let peers: Vec<u32> = (0..spec.world).filter(|&q| q != p.rank).collect();
                assert_eq!(to, if len == 0 { vec![] } else { peers }, "{spec:?} rank {}", p.rank);
                // No SM block stores into a peer's output: the engine does.
                let text = format!("{:?}", p.blocks);
                assert!(!text.contains("PeerOutput"), "{spec:?}: an SM block writes a peer's output");
            }
        }
    }
}

#[test]
fn derived_copy_engine_plans_have_the_designed_shape() {
    for spec in gathers() {
        for p in ce(&spec) {
            let roles: Vec<Role> = p.blocks.iter().map(|b| b.role).collect();
            assert_eq!(roles, [Role::CeEntry, Role::CeExit], "{spec:?}");
            let eng = p.engine.as_ref().expect("an engine program");
            assert_eq!(eng.after, Phase::Sequential);
            assert_eq!(eng.notifies().count() as u32, spec.world - 1);
            assert_eq!(p.resources.ce_value_words, spec.world - 1);
            assert!(p.one_copy && p.peer_spaces().1 == (spec.world > 1 && p.resources.input_bytes > 0));
            // The bytes the engine copies are the rank's whole input, once per destination.
            let copied: u64 = eng
                .steps
                .iter()
                .map(|s| match s {
                    EngineStep::Copy { len, .. } => len.at(0),
                    EngineStep::Notify(_) => 0,
                })
                .sum();
            let sent: u64 = (0..spec.world).map(|q| spec.pair_bytes(p.rank, q)).sum();
            assert_eq!(copied, sent, "{spec:?} rank {}", p.rank);
        }
    }
    // ReduceScatter (no gather half) keeps SM blocks; staged gathers and AllReduces too.
    let rs = CollectiveSpec::reduce_scatter(2, DataType::F32, ReduceOp::Sum, 64);
    assert!(derive(&rs, &cfg(true, false)).unwrap().iter().all(|p| p.engine.is_none()));
    let ar = CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, 64);
    let staged = PlanConfig { peer_inputs: false, ..cfg(true, false) };
    assert!(derive(&ar, &staged).unwrap().iter().all(|p| p.engine.is_none()));
    let staged = PlanConfig { peer_outputs: false, ..cfg(true, false) };
    assert!(
        derive(&CollectiveSpec::all_gather(2, DataType::U8, 40), &staged).unwrap().iter().all(|p| p.engine.is_none())
    );
}

#[test]
fn derived_copy_engine_plans_verify_and_the_reference_agrees() {
    let mut specs: Vec<(CollectiveSpec, bool)> = gathers().into_iter().map(|s| (s, false)).collect();
    specs.push((CollectiveSpec::all_gather(2, DataType::U8, 40), true));
    specs.push((CollectiveSpec::all_gather(3, DataType::U8, 24), true));
    for spec in all_reduces() {
        specs.push((spec.clone(), false));
        specs.push((spec, true));
    }
    for (spec, in_place) in specs {
        let plans = derive(&spec, &cfg(true, in_place)).unwrap();
        let calls = vec![plans; 3];
        let r = verify(&calls, &Options::default());
        assert!(r.ok(), "{spec:?} in place {in_place}: {}", r.result.unwrap_err());
        // The unreduced reference is quick at world 2 only.
        if spec.world == 2 {
            let v = reference::check(&calls, 200_000);
            assert_eq!(v.accepted(), Some(true), "{spec:?}: reference {v:?}");
        }
    }
}

/// CE AllGather, SM AllReduce, CE AllToAllV, CE AllReduce, SM AllGather, CE AllGather: the
/// datapath changes
/// between calls on the same entry and done words, so their values must stay consistent.
#[test]
fn copy_engine_and_sm_calls_follow_each_other_on_the_same_flags() {
    for w in [2u32, 3] {
        let dt = DataType::U8;
        let ag = CollectiveSpec::all_gather(w, dt, 24);
        let ar = CollectiveSpec::all_reduce(w, DataType::F32, ReduceOp::Sum, 24);
        let a2av = CollectiveSpec::all_to_all_v(
            w,
            dt,
            (0..w as u64).map(|s| (0..w as u64).map(|d| (s + 2 * d) % 3 * 8).collect()).collect(),
        );
        let sm = |s: &CollectiveSpec| derive(s, &cfg(false, false)).unwrap();
        let calls = vec![ce(&ag), sm(&ar), ce(&a2av), ce(&ar), sm(&ag), ce(&ag)];
        assert!(calls[1].iter().all(|p| p.engine.is_none()) && calls[2].iter().all(|p| p.engine.is_some()));
        assert!(calls[3].iter().all(|p| p.engine.is_some()), "the AllReduce's gather half on the copy engines");
        let r = verify(&calls, &Options::default());
        assert!(r.ok(), "world {w}: {}", r.result.unwrap_err());
        if w == 2 {
            assert_eq!(reference::check(&calls, 400_000).accepted(), Some(true), "world {w}");
        }
    }
}

#[test]
fn every_copy_engine_mutant_is_rejected() {
    let mut total = 0;
    for spec in [
        CollectiveSpec::all_gather(2, DataType::U8, 40),
        CollectiveSpec::all_to_all(3, DataType::U8, 16),
        CollectiveSpec::all_gather_v(3, DataType::U8, vec![8, 0, 24]),
    ] {
        let plans = ce(&spec);
        let mutants = engine_mutants(&plans);
        let kinds = ["dropped", "moved before", "shifted", "wait", "forked before the entry"];
        for k in kinds {
            assert!(mutants.iter().any(|(d, _)| d.contains(k)), "{spec:?}: no mutant of kind {k}");
        }
        for (what, set) in mutants {
            let calls = vec![set; 2];
            let r = verify(&calls, &Options::default());
            assert!(!r.ok(), "{spec:?}: mutant '{what}' verified");
            if spec.world == 2 {
                let v = reference::check(&calls, 200_000);
                assert_eq!(v.accepted(), Some(false), "{spec:?}: mutant '{what}': reference {v:?}");
            }
            total += 1;
        }
    }
    assert!(total >= 20, "{total} mutants");
}

#[test]
fn the_structural_checks_refuse_malformed_engine_programs() {
    let base = ce(&CollectiveSpec::all_gather(2, DataType::U8, 40));
    let p = &base[0];
    p.check().unwrap();
    let refuse = |edit: &dyn Fn(&mut Plan), why: &str| {
        let mut q = p.clone();
        edit(&mut q);
        let e = q.check().expect_err(why).to_string();
        assert!(e.contains(why), "{why}: {e}");
    };
    refuse(&|q| q.one_copy = false, "only a one-copy plan");
    refuse(&|q| q.advance = Advance::Fixed(0), "fixed amount of at least 1");
    refuse(&|q| q.blocks.swap(0, 1), "entry kernel's");
    refuse(&|q| q.resources.ce_value_words = 0, "value words");
    refuse(&|q| q.engine = None, "no engine program");
    refuse(
        &|q| {
            let e = q.engine.as_mut().unwrap();
            let n = e.steps.pop().unwrap();
            e.steps.insert(0, n);
        },
        "before step",
    );
    refuse(
        &|q| {
            if let Some(EngineStep::Copy { src, .. }) = q.engine.as_mut().unwrap().steps.first_mut() {
                src.space = Space::PeerOutput(1);
            }
        },
        "reads this rank's input or output",
    );
    // The own part (the first copy) writes the output: a copy of the same batch may not read it.
    refuse(
        &|q| {
            if let Some(EngineStep::Copy { src, .. }) = q.engine.as_mut().unwrap().steps.get_mut(1) {
                src.space = Space::Output;
            }
        },
        "reads bytes another copy of it writes",
    );
    refuse(
        &|q| {
            let e = q.engine.as_mut().unwrap();
            let c = e.steps[0].clone();
            e.steps.insert(0, c);
        },
        "overlapping",
    );
    refuse(
        &|q| {
            if let Some(EngineStep::Copy { len, .. }) = q.engine.as_mut().unwrap().steps.first_mut() {
                *len = Len::fixed(1 << 20);
            }
        },
        "exceeds",
    );
    // A wait on a word that only an engine notifies is matched by the set check.
    check_set(&base).unwrap();
}

#[test]
fn engine_plans_round_trip_through_json_and_bincode() {
    let plans = ce(&CollectiveSpec::all_to_all(3, DataType::U8, 16));
    let json = serde_json::to_string(&plans).unwrap();
    assert_eq!(serde_json::from_str::<Vec<Plan>>(&json).unwrap(), plans);
    assert_eq!(decode_plans(&encode_plans(&plans).unwrap()).unwrap(), plans);
    // A plan written before engine programs existed reads as one without.
    let sm = derive(&CollectiveSpec::all_gather(2, DataType::U8, 40), &cfg(false, false)).unwrap();
    let mut v = serde_json::to_value(&sm[0]).unwrap();
    let obj = v.as_object_mut().unwrap();
    obj.remove("engine");
    obj["resources"].as_object_mut().unwrap().remove("ce_value_words");
    assert_eq!(serde_json::from_value::<Plan>(v).unwrap(), sm[0]);
    // The readable form names the engine's steps.
    let text = plans[0].to_string();
    assert!(text.contains("copy engine (Sequential") && text.contains("copy "), "{text}");
}

/// The AllReduce's copy-engine mutants: a dropped notify, a notify before its copy, a shifted
/// copy, a dropped entry wait of a reducing block, and the copies forked beside the reduce
/// (so they read the shard before it is reduced). Each is rejected by the verifier and, at
/// world 2, by its reference; the forked one by the model (the engine reads the output before
/// the reduce's write of it is ordered before the read), not by a structural check.
#[test]
fn every_copy_engine_all_reduce_mutant_is_rejected() {
    let mut total = 0;
    for (spec, blocks) in [
        (CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, 20), 1u32),
        (CollectiveSpec::all_reduce(3, DataType::F32, ReduceOp::Max, 30), 2),
    ] {
        let plans = derive(&spec, &PlanConfig { blocks_per_role: blocks, ..cfg(true, false) }).unwrap();
        let mutants = engine_mutants(&plans);
        for k in ["notify", "moved before", "shifted", "wait", "forked beside the reduce"] {
            assert!(mutants.iter().any(|(d, _)| d.contains(k)), "{spec:?}: no mutant of kind {k}");
        }
        for (what, set) in mutants {
            let calls = vec![set; 2];
            let r = verify(&calls, &Options::default());
            let why = r.result.as_ref().err().map(|e| e.to_string());
            assert!(!r.ok(), "{spec:?}: mutant '{what}' verified");
            if what.contains("forked beside the reduce") {
                // The engine reads the shard before the reduce's write is ordered before it.
                let why = why.unwrap_or_default();
                let model = why.contains("readiness") || why.contains("race");
                assert!(model && why.contains("output"), "{spec:?}: '{what}' rejected for another reason: {why}");
            }
            if spec.world == 2 {
                let v = reference::check(&calls, 400_000);
                assert_eq!(v.accepted(), Some(false), "{spec:?}: mutant '{what}': reference {v:?}");
            }
            total += 1;
        }
    }
    assert!(total >= 20, "{total} mutants");
}
