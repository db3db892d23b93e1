//! Shard-landed words (`PlanConfig::landed`, `plan::Landed`): derived ones verify on every
//! plan shape of the copy collectives (staged, packets, one-copy, in place, V forms with empty
//! parts), back to back; a landed signal moved before the last write of its shard, or made to
//! fire on the first of several arrivals, is rejected; reductions refuse them.

use purlin_snac::verify::{Options, reference, verify};
use purlin_snac::*;

fn cfg(regime: Regime, one_copy: bool, in_place: bool) -> PlanConfig {
    PlanConfig {
        regime,
        chunk_bytes: 32,
        blocks_per_role: 2,
        slots: 2,
        staging_bytes: 2048,
        window_bytes: 4096,
        max_coresident_blocks: 16,
        flag_words: 64,
        peer_outputs: one_copy,
        in_place,
        landed: true,
        ..PlanConfig::default()
    }
}

/// The copy collectives at worlds 2 and 3: uniform, V with an empty part, a Broadcast shape.
fn specs() -> Vec<CollectiveSpec> {
    let dt = DataType::U8;
    let mut out = vec![];
    for w in [2u32, 3] {
        out.push(CollectiveSpec::all_gather(w, dt, 72));
        out.push(CollectiveSpec::all_to_all(w, dt, 40));
        out.push(CollectiveSpec::all_gather_v(w, dt, (0..w as u64).map(|r| r * 24).collect()));
        out.push(CollectiveSpec::all_to_all_v(
            w,
            dt,
            (0..w as u64).map(|s| (0..w as u64).map(|d| (s * 7 + d * 3) % 5 * 16).collect()).collect(),
        ));
    }
    out
}

fn shapes(spec: &CollectiveSpec) -> Vec<PlanConfig> {
    let in_place = [false, true].into_iter().filter(|&p| !p || in_place_alias(spec, 0).is_some());
    let mut out = vec![];
    for p in in_place {
        out.push(cfg(Regime::Latency, false, p));
        out.push(cfg(Regime::Throughput, false, p));
        out.push(cfg(Regime::Throughput, true, p));
    }
    out
}

/// Every landed arrive of a plan: `(block, step index, shard)`.
fn landed_arrives(p: &Plan) -> Vec<(usize, usize, u32)> {
    let flags: Vec<Option<u32>> = p.landed.as_ref().unwrap().shards.iter().map(|s| s.flag).collect();
    let mut out = vec![];
    for (b, block) in p.blocks.iter().enumerate() {
        for (i, s) in block.steps.iter().enumerate() {
            if let Step::Arrive { then, .. } = s {
                if let [n] = then.as_slice() {
                    if let Some(q) = flags.iter().position(|f| *f == Some(n.flag.base)) {
                        if n.peer == p.rank {
                            out.push((b, i, q as u32));
                        }
                    }
                }
            }
        }
    }
    out
}

#[test]
fn derived_landed_plans_verify_back_to_back() {
    let mut checked = 0;
    for spec in specs() {
        for c in shapes(&spec) {
            let plans = derive(&spec, &c).unwrap_or_else(|e| panic!("{spec:?} {c:?}: {e}"));
            for p in &plans {
                let l = p.landed.as_ref().expect("landed words");
                assert_eq!(l.shards.len() as u32, spec.world);
                for (q, s) in l.shards.iter().enumerate() {
                    let q = q as u32;
                    assert_eq!(s.len, spec.pair_bytes(q, p.rank));
                    // A shard with bytes to receive has a flag, unless it is already in place.
                    let in_place_own = c.in_place && q == p.rank;
                    assert_eq!(
                        s.flag.is_some(),
                        s.len > 0 && !in_place_own,
                        "{spec:?} {c:?} rank {} shard {q}\n{p}",
                        p.rank
                    );
                }
                assert_eq!(p.resources.flag_words, c.flag_words + spec.world);
            }
            let calls = vec![plans; 2];
            let r = verify(&calls, &Options::default());
            assert!(r.ok(), "{spec:?} {:?} one-copy {}: {}", c.regime, c.peer_outputs, r.result.unwrap_err());
            checked += 1;
        }
    }
    assert!(checked >= 30, "{checked} shapes");
}

#[test]
fn a_landed_signal_before_its_shard_is_written_is_rejected() {
    let mut total = 0;
    for spec in specs().into_iter().filter(|s| s.world == 2) {
        for c in shapes(&spec) {
            let plans = derive(&spec, &c).unwrap();
            for (r, p) in plans.iter().enumerate() {
                for (b, i, q) in landed_arrives(p) {
                    // To the block's start: before every step of the block.
                    let mut early = plans.clone();
                    let step = early[r].blocks[b].steps.remove(i);
                    early[r].blocks[b].steps.insert(0, step);
                    // Every arrival of the shard's counter on this rank fires its flag, where
                    // several blocks complete the shard.
                    let mut eager = plans.clone();
                    let mut eager_changed = false;
                    for block in &mut eager[r].blocks {
                        for s in &mut block.steps {
                            if let Step::Arrive { arrivals, then, .. } = s {
                                if then.len() == 1
                                    && then[0].flag.base == p.landed.as_ref().unwrap().shards[q as usize].flag.unwrap()
                                    && *arrivals > 1
                                {
                                    *arrivals = 1;
                                    eager_changed = true;
                                }
                            }
                        }
                    }
                    let mut mutants = vec![("moved to the block's start", early)];
                    if eager_changed {
                        mutants.push(("on the first arrival", eager));
                    }
                    for (what, set) in mutants {
                        let calls = vec![set; 2];
                        let v = verify(&calls, &Options::default());
                        assert!(
                            !v.ok(),
                            "{spec:?} {:?} one-copy {} in place {}: rank {r} block {b} shard {q} {what}: accepted",
                            c.regime,
                            c.peer_outputs,
                            c.in_place
                        );
                        let why = v.result.unwrap_err().to_string();
                        assert!(why.contains("output"), "{what}: rejected for another reason: {why}");
                        total += 1;
                    }
                }
            }
        }
    }
    assert!(total >= 40, "{total} mutants");
}

#[test]
fn the_reference_agrees_on_landed_plans_and_a_mutant() {
    // One block per role and one chunk: the unreduced reference explores every interleaving.
    let spec = CollectiveSpec::all_gather(2, DataType::U8, 32);
    for c in shapes(&spec) {
        let plans = derive(&spec, &PlanConfig { blocks_per_role: 1, ..c }).unwrap();
        let calls = vec![plans.clone(); 2];
        assert_eq!(reference::check(&calls, 400_000).accepted(), Some(true), "{c:?}");
        let (b, i, _) = landed_arrives(&plans[0])[0];
        let mut early = plans;
        let step = early[0].blocks[b].steps.remove(i);
        early[0].blocks[b].steps.insert(0, step);
        assert_eq!(reference::check(&vec![early; 2], 400_000).accepted(), Some(false), "{c:?}");
    }
}

#[test]
fn reductions_and_copy_engine_plans_refuse_landed_words() {
    let dt = DataType::F32;
    for spec in
        [CollectiveSpec::all_reduce(2, dt, ReduceOp::Sum, 16), CollectiveSpec::reduce_scatter(2, dt, ReduceOp::Sum, 16)]
    {
        let e = derive(&spec, &cfg(Regime::Throughput, false, false)).unwrap_err();
        assert!(matches!(e, DeriveError::LandedUnsupported(_)), "{spec:?}: {e}");
    }
    let ce = PlanConfig { copy_engine: true, ..cfg(Regime::Throughput, true, false) };
    let e = derive(&CollectiveSpec::all_gather(2, DataType::U8, 64), &ce).unwrap_err();
    assert!(matches!(e, DeriveError::LandedUnsupported(_)), "{e}");
}

#[test]
fn a_landed_claim_that_is_not_the_specs_shard_is_ill_formed() {
    let spec = CollectiveSpec::all_gather(2, DataType::U8, 72);
    let mut plans = derive(&spec, &cfg(Regime::Throughput, false, false)).unwrap();
    plans[1].landed.as_mut().unwrap().shards[0].len -= 1;
    assert!(check_set(&plans).is_err());
    let mut plans = derive(&spec, &cfg(Regime::Throughput, false, false)).unwrap();
    plans[0].landed.as_mut().unwrap().shards[1].flag = None;
    assert!(check_set(&plans).is_err());
    // The readable form names each shard's flag.
    let shown = derive(&spec, &cfg(Regime::Latency, false, false)).unwrap()[0].to_string();
    assert!(shown.contains("landed:") && shown.contains(">= E+1"), "{shown}");
}

#[test]
fn a_landed_plan_meets_only_its_like_at_the_call_check() {
    let spec = CollectiveSpec::all_gather(2, DataType::U8, 72);
    let c = cfg(Regime::Throughput, false, false);
    let landed = derive(&spec, &c).unwrap();
    let plain = derive(&spec, &PlanConfig { landed: false, ..c }).unwrap();
    // Ranks compare digests at every call: a landed plan against a plain one is a mismatch.
    assert_ne!(landed[0].call_digest(), plain[1].call_digest());
    assert_eq!(landed[0].call_digest(), landed[1].call_digest());
    assert_eq!(plain[0].call_digest(), plain[1].call_digest());
}
