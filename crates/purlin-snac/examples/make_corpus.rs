//! Writes the verifier's corpora, `tests/plans/{accept,reject}/*.json`: hand-edited plans that
//! differ from derived ones. Each edit is spelled out below; re-run after a plan format change:
//! `cargo run -p purlin-snac --example make_corpus`.
use purlin_snac::verify::Corpus;
use purlin_snac::*;

fn cfg(regime: Regime, side: StagingSide) -> PlanConfig {
    PlanConfig {
        regime,
        staging_side: side,
        chunk_bytes: 32,
        blocks_per_role: 1,
        slots: 2,
        staging_bytes: 1024,
        window_bytes: 4096,
        max_coresident_blocks: 8,
        ..PlanConfig::default()
    }
}

fn body(p: &mut Plan, b: usize) -> &mut Vec<Step> {
    match p.blocks[b].steps.iter_mut().find(|s| matches!(s, Step::ChunkLoop { .. })) {
        Some(Step::ChunkLoop { body, .. }) => body,
        _ => panic!("block {b} has no loop"),
    }
}

fn write(dir: &str, name: &str, description: &str, expect: Option<&str>, call: Vec<Plan>, calls: usize) {
    let c = Corpus { description: description.into(), expect: expect.map(Into::into), calls: vec![call; calls] };
    let path = format!("{}/tests/plans/{dir}/{name}.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::write(&path, serde_json::to_string(&c).unwrap() + "\n").unwrap();
    println!("wrote {path}");
}

fn main() {
    let tp = |side| cfg(Regime::Throughput, side);
    let lat = cfg(Regime::Latency, StagingSide::Own);

    // ---- accept ----
    // Independent steps reordered: world-3 AllToAll producers stage for rank q2 before q1.
    let mut p = derive(&CollectiveSpec::all_to_all(3, DataType::U8, 80), &tp(StagingSide::Peer)).unwrap();
    for plan in &mut p {
        // Two streams of equal-length step groups (drain wait, stage, arrive): swap them.
        let b = body(plan, 0);
        let half = b.len() / 2;
        b.rotate_left(half);
    }
    write(
        "accept",
        "reordered-independent-steps",
        "AllToAll w3: producer streams staged in the other order",
        None,
        p,
        3,
    );

    // A block's work split: latency AllGather w3, each rank's single block split in two.
    let mut p = derive(&CollectiveSpec::all_gather(3, DataType::U8, 48), &lat).unwrap();
    for plan in &mut p {
        let steps = std::mem::take(&mut plan.blocks[0].steps);
        let (mut a, mut b) = (vec![], vec![]);
        for (i, s) in steps.into_iter().enumerate() {
            if i % 2 == 0 { a.push(s) } else { b.push(s) }
        }
        plan.blocks[0].steps = a;
        plan.blocks.push(BlockProgram { role: Role::Custom(1), steps: b });
    }
    write("accept", "split-block-work", "latency AllGather w3: every rank's block split into two blocks", None, p, 3);

    // A redundant wait: every throughput consumer waits twice on each ready flag.
    let mut p =
        derive(&CollectiveSpec::reduce_scatter(2, DataType::F32, ReduceOp::Sum, 40), &tp(StagingSide::Own)).unwrap();
    for plan in &mut p {
        let b = body(plan, 1);
        let w = b.iter().find(|s| matches!(s, Step::Wait { .. })).cloned().unwrap();
        b.insert(0, w);
    }
    write("accept", "redundant-wait", "ReduceScatter w2 pull: a duplicated wait in every consumer", None, p, 3);

    // In-place aliasing by hand: one-shot latency AllReduce with input = output.
    let mut p = derive(
        &CollectiveSpec::all_reduce(3, DataType::F32, ReduceOp::Sum, 20),
        &PlanConfig { allreduce: AllReduceAlgo::OneShot, ..lat },
    )
    .unwrap();
    for plan in &mut p {
        plan.resources.alias = Some(Alias::InputInOutput(0));
    }
    write("accept", "in-place-aliasing", "one-shot AllReduce w3 made in-place by hand (input = output)", None, p, 3);

    // ---- reject ----
    // Signal before the stage ends: the producer arrives (and signals) before staging.
    let mut p = derive(&CollectiveSpec::all_gather(2, DataType::U8, 80), &tp(StagingSide::Peer)).unwrap();
    for plan in &mut p {
        let b = body(plan, 0);
        let i = b.iter().position(|s| matches!(s, Step::Stage { .. })).unwrap();
        b.swap(i, i + 1);
    }
    write(
        "reject",
        "signal-before-stage-ends",
        "AllGather w2 push: arrive/signal before the stage",
        Some("readiness"),
        p,
        3,
    );

    // Wrong sense half: consumers always read half 0 of the staging.
    let mut p = derive(&CollectiveSpec::all_to_all(2, DataType::U8, 64), &tp(StagingSide::Own)).unwrap();
    for plan in &mut p {
        for s in body(plan, 1) {
            if let Step::Gather { src, .. } = s {
                if matches!(src.space, Space::Staging(_)) {
                    src.offset.sense_stride = 0;
                }
            }
        }
    }
    write("reject", "wrong-sense-half", "AllToAll w2 pull: consumers ignore the sense", Some("readiness"), p, 3);

    // Even epoch advance on a chunked call.
    let mut p = derive(&CollectiveSpec::all_gather(2, DataType::U8, 64), &tp(StagingSide::Peer)).unwrap();
    for plan in &mut p {
        if let Advance::Fixed(a) = &mut plan.advance {
            *a += 1;
        }
    }
    write(
        "reject",
        "even-epoch-advance",
        "AllGather w2, 2 chunks, advance 4 instead of 3",
        Some("epoch-advance"),
        p,
        3,
    );

    // Grid over the co-residency bound.
    let mut p =
        derive(&CollectiveSpec::all_reduce(2, DataType::F32, ReduceOp::Sum, 64), &tp(StagingSide::Peer)).unwrap();
    for plan in &mut p {
        plan.max_coresident_blocks = 1;
    }
    write(
        "reject",
        "grid-over-bound",
        "AllReduce w2: 2 blocks under a co-residency bound of 1",
        Some("co-residency"),
        p,
        1,
    );

    // V ranks disagreeing on the advance: rank 0 announces a larger local maximum (5 chunks;
    // the agreement takes the maximum, so that alone is harmless), but rank 1's consumer block
    // skips the handshake waits, so it advances by its own 3 while everyone else advances by 5.
    let mut p = derive(&CollectiveSpec::all_gather_v(3, DataType::U8, vec![80, 0, 17]), &tp(StagingSide::Own)).unwrap();
    p[0].advance = Advance::AgreedMaxChunks { local: 5 };
    p[1].blocks[1].steps.retain(|s| !matches!(s, Step::HandshakeWait { .. }));
    write(
        "reject",
        "v-ranks-disagree-on-advance",
        "AllGatherV w3: rank 1 skips the agreement",
        Some("uniform-advance"),
        p,
        3,
    );

    // Drain before the last read: cyclic consumers drain the slot before gathering from it.
    let mut p = derive(&CollectiveSpec::all_gather(2, DataType::U8, 160), &tp(StagingSide::Own)).unwrap();
    for plan in &mut p {
        let b = body(plan, 1);
        let g = b
            .iter()
            .position(|s| matches!(s, Step::Gather { src: Region { space: Space::Staging(_), .. }, .. }))
            .unwrap();
        let a = b.iter().position(|s| matches!(s, Step::Arrive { .. })).unwrap();
        let arrive = b.remove(a);
        b.insert(g, arrive);
    }
    write(
        "reject",
        "drain-before-last-read",
        "AllGather w2 pull, 5 chunks in 2 slots: drain before the gather",
        Some("reuse"),
        p,
        3,
    );

    // ---- issue 49: what the verifier once accepted (each with its good twin) ----
    // Class 3, the zeroed workspace: one chunk, the consumer waits for `E + 0` instead of
    // `E + 1`. On a rank's first call the zero flag satisfies it at once, before anything is
    // staged; the model once blocked on the never-written flag and waited for the signal.
    let one_chunk = PlanConfig { chunk_bytes: 32, ..tp(StagingSide::Peer) };
    let good = derive(&CollectiveSpec::all_gather(2, DataType::U8, 16), &one_chunk).unwrap();
    write(
        "accept",
        "first-call-waits-for-its-signal",
        "AllGather w2, one chunk: the derived plans",
        None,
        good.clone(),
        1,
    );
    let mut p = good;
    for plan in &mut p {
        for s in body(plan, 1) {
            if let Step::Wait { value, .. } = s {
                value.add = 0;
            }
        }
    }
    write(
        "reject",
        "zero-flag-satisfies-a-wait-for-e",
        "AllGather w2, one chunk, first call: the consumer waits for E + 0, which the zeroed flag holds",
        Some("readiness"),
        p,
        1,
    );

    // Class 4, resources against the spec: rank 1 declares half its output; the bytes past
    // the declaration were never checked.
    let good = derive(&CollectiveSpec::all_gather(2, DataType::U8, 48), &lat).unwrap();
    write("accept", "declared-sizes-are-the-specs", "latency AllGather w2: the derived plans", None, good.clone(), 2);
    let mut p = good;
    p[1].resources.output_bytes /= 2;
    for b in &mut p[1].blocks {
        b.steps.retain(|s| match s {
            Step::Gather { dst, len, .. } => dst.offset.base + len.max <= 48,
            _ => true,
        });
    }
    write(
        "reject",
        "output-declared-smaller-than-the-spec",
        "latency AllGather w2: rank 1 declares 48 of its 96 output bytes and gathers only those",
        Some("resources"),
        p,
        2,
    );

    // Class 5, the input is read-only out of place: each rank's own-part copy moves into the
    // packet block (its twin, accepted), and after every read of the input that block copies
    // the input's last bytes over its first (the API took the input by `&`).
    let mut p = derive(&CollectiveSpec::all_gather(2, DataType::U8, 48), &lat).unwrap();
    for plan in &mut p {
        let own = plan.blocks.remove(1).steps;
        plan.blocks[0].steps.extend(own);
    }
    write(
        "accept",
        "own-part-copied-by-the-packet-block",
        "latency AllGather w2: one block per rank",
        None,
        p.clone(),
        2,
    );
    for plan in &mut p {
        plan.blocks[0].steps.push(Step::Gather {
            dst: Region::input(Offset::fixed(0)),
            src: Region::input(Offset::fixed(32)),
            len: Len::fixed(16),
            expect: None,
            guard: Guard::ALWAYS,
        });
    }
    write(
        "reject",
        "out-of-place-input-written",
        "latency AllGather w2: a block writes its rank's input after reading it",
        Some("read-only-input"),
        p,
        1,
    );

    // Class 2, the agreed advance of V plans: AllToAllV w2 whose rank 0 sends rank 1 20
    // chunks, both ranks announcing a local maximum of 5 instead of 20 (odd, so the agreed
    // advance is 5). The next call's waits for `E' + c + 1 = E + c + 6` are then met by this
    // call's signals of chunks `c + 5`. The twin explores 5 chunks of that loop, whose epoch
    // offsets the understated advance covers; the whole loop's reach `E + 20`.
    let v = CollectiveSpec::all_to_all_v(2, DataType::U8, vec![vec![8, 640], vec![8, 8]]);
    let good = derive(&v, &tp(StagingSide::Own)).unwrap();
    write(
        "accept",
        "agreed-advance-covers-every-chunk",
        "AllToAllV w2, rank 0 sends rank 1 20 chunks: the derived plans (agreed advance 21)",
        None,
        good.clone(),
        2,
    );
    let mut p = good;
    for plan in &mut p {
        plan.advance = Advance::AgreedMaxChunks { local: 5 };
    }
    write(
        "reject",
        "agreed-advance-below-the-whole-loop",
        "AllToAllV w2: both ranks announce 5 chunks of the 20 rank 0 sends (agreed advance 5, offsets to E+20)",
        Some("epoch-advance"),
        p,
        2,
    );

    // Class 1, bytes of the chunks the cut does not explore: AllToAllV w2 whose rank 0 copies
    // its own 180-byte partition in 6 chunks, the last one 8 bytes too long (its length's
    // total 188): it overwrites the first bytes of rank 1's partition in rank 0's output after
    // rank 1's data landed there. The twin's last chunk of that copy runs at chunk 4's bytes,
    // inside the partition, and the overwritten bytes were never compared.
    let v = CollectiveSpec::all_to_all_v(2, DataType::U8, vec![vec![180, 8], vec![8, 8]]);
    let good = derive(&v, &tp(StagingSide::Own)).unwrap();
    write(
        "accept",
        "partition-tail-ends-at-its-partition",
        "AllToAllV w2, rank 0's own partition of 180 bytes in 6 chunks: the derived plans",
        None,
        good.clone(),
        1,
    );
    let mut p = good;
    let mut edited = 0;
    for b in &mut p[0].blocks {
        for s in b.steps.iter_mut() {
            if let Step::ChunkLoop { body, .. } = s {
                for t in body {
                    if let Step::Gather { src, len, .. } = t {
                        if src.space == Space::Input && len.total == 180 {
                            len.total += 8;
                            edited += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(edited, 1, "the own-partition copy");
    write(
        "reject",
        "partition-tail-overruns-the-next",
        "AllToAllV w2: rank 0's own-partition copy 8 bytes too long in its last chunk",
        Some("semantics"),
        p,
        1,
    );
}
