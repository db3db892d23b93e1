//! Every rank's plan set is consistent: ranks that choose forms of one call independently
//! (NCCL lets each rank call in place or not), under any tuning and block cap, run plans that
//! meet; the verdict cache answers by the call, not by the order calls arrive in; an empty
//! call meets the call check like any other. Each output byte is checked against
//! `purlin_testkit`'s reference.

use std::time::{Duration, Instant};

use purlin_collectives::{CpuComm, CpuConfig, Error, ReduceOp};
use purlin_snac::verify::Options;
use purlin_snac::{CollectiveSpec, DataType, ReduceOp as SnacOp, ReductionMode, Regime, StagingSide};
use purlin_testkit::{self as kit, Collective as K, Dtype, Op, POISON, Rng, Values, reference};

/// The library's element type for the kit's.
fn dtype_of(d: Dtype) -> DataType {
    match d {
        Dtype::F32 => DataType::F32,
        Dtype::F64 => DataType::F64,
        Dtype::F16 => DataType::F16,
        Dtype::Bf16 => DataType::Bf16,
        Dtype::I8 => DataType::I8,
        Dtype::U8 => DataType::U8,
        Dtype::I32 => DataType::I32,
        Dtype::U32 => DataType::U32,
        Dtype::I64 => DataType::I64,
        Dtype::U64 => DataType::U64,
        Dtype::F8E4M3 => DataType::F8E4M3,
        Dtype::F8E5M2 => DataType::F8E5M2,
    }
}

fn op_of(op: Op) -> SnacOp {
    match op {
        Op::Sum => SnacOp::Sum,
        Op::Prod => SnacOp::Prod,
        Op::Min => SnacOp::Min,
        Op::Max => SnacOp::Max,
        Op::Avg => SnacOp::Avg,
    }
}

/// The spec every rank of `case` calls (Broadcast and Reduce as the V forms rooted at rank 0,
/// as `CpuComm::broadcast`/`reduce` make them).
fn spec_of(case: &kit::Case) -> CollectiveSpec {
    let (w, d) = (case.world as u32, dtype_of(case.dtype));
    let op = op_of(case.op.unwrap_or(Op::Sum));
    let part = |p: usize| case.matrix[0][p] as u64;
    let parts = || (0..case.world).map(part).collect::<Vec<u64>>();
    let s = match case.collective {
        K::AllReduce => CollectiveSpec::all_reduce(w, d, op, case.count as u64),
        K::AllGather => CollectiveSpec::all_gather(w, d, part(0)),
        K::ReduceScatter => CollectiveSpec::reduce_scatter(w, d, op, part(0)),
        K::AllToAll => CollectiveSpec::all_to_all(w, d, part(0)),
        K::AllGatherV | K::Broadcast => CollectiveSpec::all_gather_v(w, d, parts()),
        K::ReduceScatterV | K::Reduce => CollectiveSpec::reduce_scatter_v(w, d, op, parts()),
        K::AllToAllV => CollectiveSpec::all_to_all_v(
            w,
            d,
            case.matrix.iter().map(|r| r.iter().map(|&x| x as u64).collect()).collect(),
        ),
        K::SendRecv => unreachable!("not drawn"),
    };
    s.with_mode(ReductionMode::Deterministic)
}

/// Rank `r`'s one buffer before an in-place call: the input, or for the gathering forms the
/// output with this rank's contribution in its partition.
fn in_place_buffer(case: &kit::Case, r: usize, input: &[u8]) -> Vec<u8> {
    match case.collective {
        K::AllGather | K::AllGatherV | K::Broadcast => {
            let es = case.dtype.size();
            let mut b = vec![POISON; case.out_count(r) * es];
            let at = case.part_offset(r) * es;
            b[at..at + input.len()].copy_from_slice(input);
            b
        }
        _ => input.to_vec(),
    }
}

fn has_in_place_form(c: K) -> bool {
    !matches!(c, K::AllToAll | K::AllToAllV)
}

/// Runs `case` on `comms` with rank `r` in place where `in_place[r]`; returns each rank's
/// result (out of place: its output; in place: its whole buffer).
fn run(comms: &[CpuComm], case: &kit::Case, in_place: &[bool]) -> Vec<Result<Vec<u8>, Error>> {
    let spec = spec_of(case);
    let inputs = case.inputs();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(&inputs)
            .map(|(comm, x)| {
                let spec = &spec;
                let here = in_place[comm.rank()];
                s.spawn(move || {
                    let r = comm.rank();
                    if here {
                        let mut b = in_place_buffer(case, r, x);
                        comm.execute_bytes_in_place(spec, &mut b).map(|_| b)
                    } else {
                        let mut out = vec![POISON; case.out_count(r) * case.dtype.size()];
                        comm.execute_bytes(spec, x.as_slice(), &mut out).map(|_| out)
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

/// Checks every rank's result against the kit: bitwise (the kit's stress inputs; the
/// deterministic mode's reductions are the kit's).
fn check(case: &kit::Case, in_place: &[bool], results: Vec<Result<Vec<u8>, Error>>) -> Result<(), String> {
    let inputs = case.inputs();
    for (r, got) in results.into_iter().enumerate() {
        let got = got.map_err(|e| format!("rank {r}: {e}"))?;
        let want = if in_place[r] {
            reference::expected_in_place(&case.clone().in_place(true), &inputs, r)
        } else {
            reference::expected(case, &inputs, r)
        };
        kit::check(case.dtype, kit::Compare::Bitwise, &got, &want).map_err(|e| format!("rank {r}: {e}"))?;
    }
    Ok(())
}

/// A host configuration: the host defaults but `tune`'s changes, a short timeout (a bug shows
/// as a wait that expires, not a hang) and a small verification budget.
fn config(tune: impl FnOnce(&mut CpuConfig)) -> CpuConfig {
    let mut c = CpuConfig {
        timeout: Duration::from_secs(20),
        verify: Options { max_states: 300, schedules: 4, ..Options::default() },
        ..CpuConfig::default()
    };
    tune(&mut c);
    c
}

/// The block cap: 8 writers asked for, 12 blocks at most, staged.
fn capped(c: &mut CpuConfig) {
    c.tuning.regime = Some(Regime::Throughput);
    c.tuning.blocks_per_role = 8;
    c.tuning.max_blocks = Some(12);
    c.tuning.chunk_bytes = 4096;
}

/// A gathering call where one rank calls in place and the others out of place, under a block
/// cap: the writer/reader split was the rank's own choice (its in-place traffic), so ranks ran
/// plans of different block counts whose flags never met (wrong data at world 2, a timeout at
/// world 3).
#[test]
fn mixed_in_place_forms_under_a_block_cap_give_the_reference() {
    for world in [2usize, 3] {
        let comms = CpuComm::threads_with_config(world, config(capped)).expect("communicators");
        for collective in [K::AllGather, K::Broadcast, K::AllReduce, K::ReduceScatter, K::Reduce] {
            for first_in_place in [true, false] {
                let n = 3000 * world;
                let case = kit::Case::new(collective, Dtype::F32, Op::Sum, world, n * 4, 0.0, 7)
                    .expect("case")
                    .with_values(Values::Stress);
                let forms: Vec<bool> = (0..world).map(|r| (r == 0) == first_in_place).collect();
                check(&case, &forms, run(&comms, &case, &forms))
                    .unwrap_or_else(|e| panic!("world {world} {collective:?} in place {forms:?}: {e}"));
            }
        }
    }
}

/// The verdict cache is keyed on the chunk-capped twin; two calls of one twin (a small call
/// that is its own twin, then a larger one) both run, in either order.
#[test]
fn calls_sharing_a_verification_twin_run_in_either_order() {
    let cases = [
        (K::ReduceScatter, vec![49152usize, 65536]),
        (K::Broadcast, vec![49152, 98304]),
        (K::AllGather, vec![24576, 40960]),
    ];
    for (collective, sizes) in cases {
        for order in [sizes.clone(), sizes.iter().rev().copied().collect()] {
            // The host defaults; a fresh process-wide key per order (the cache is keyed on
            // the verifier's budget too).
            let seed = u64::from(order[0] < order[1]);
            let comms =
                CpuComm::threads_with_config(2, config(|c| c.verify.seed = 1000 + seed)).expect("communicators");
            for &n in &order {
                let elems = if collective == K::ReduceScatter { n * 2 } else { n };
                let case = kit::Case::new(collective, Dtype::F32, Op::Sum, 2, elems * 4, 0.0, 3)
                    .expect("case")
                    .with_values(Values::Stress);
                check(&case, &[false, false], run(&comms, &case, &[false, false]))
                    .unwrap_or_else(|e| panic!("{collective:?} {n} elements in order {order:?}: {e}"));
            }
        }
    }
}

/// A send of 196608 bytes then one of 393216 (the twin the first call verified covers the
/// second).
#[test]
fn sends_sharing_a_verification_twin_run_in_either_order() {
    for order in [[196608usize, 393216], [393216, 196608]] {
        let seed = u64::from(order[0] < order[1]);
        let comms = CpuComm::threads_with_config(2, config(|c| c.verify.seed = 2000 + seed)).expect("communicators");
        for n in order {
            let sent: Vec<u8> = (0..n).map(|i| (i * 7 + 1) as u8).collect();
            let got = std::thread::scope(|s| {
                let (a, b) = (&comms[0], &comms[1]);
                let sent = &sent;
                let h = s.spawn(move || a.send(sent.as_slice(), 1));
                let mut recv = vec![0u8; n];
                let r = b.recv(&mut recv, 0).map(|_| recv);
                h.join().expect("sender").expect("send");
                r.expect("recv")
            });
            assert!(got == sent, "{n} bytes after order {order:?}: wrong bytes");
        }
    }
}

/// Rank 0 calls with no elements, the others with 10: every rank gets `Mismatch` (naming a
/// peer), none returns `Ok` and none waits out its timeout.
#[test]
fn an_empty_call_on_one_rank_is_a_mismatch_on_every_rank() {
    for world in [2usize, 3] {
        let comms = CpuComm::threads_with_config(world, config(|_| {})).expect("communicators");
        let t0 = Instant::now();
        let results: Vec<Result<(), Error>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let n = if c.rank() == 0 { 0 } else { 10 };
                        let x = vec![1f32; n];
                        let mut y = vec![0f32; n];
                        c.all_reduce(&x, &mut y, &ReduceOp::Sum).map(drop)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        for (r, res) in results.iter().enumerate() {
            match res {
                Err(Error::Mismatch { rank, peer, .. }) => {
                    assert_eq!(*rank, r, "world {world}: the error names this rank");
                    assert!(*peer < world && *peer != r, "world {world} rank {r}: peer {peer}");
                    // Rank 0 differs from every peer; a peer differs from rank 0 (or, having
                    // seen the world poisoned, from whichever rank it compared first).
                    if r != 0 && world == 2 {
                        assert_eq!(*peer, 0);
                    }
                }
                // At world 3 a rank that agrees with the third may come after rank 0 and the
                // third found their mismatch: the poisoned world quotes it (as any mismatch).
                Err(Error::Poisoned(why)) if world > 2 && r > 0 => {
                    assert!(why.contains("calls differ"), "{why}");
                }
                other => panic!("world {world} rank {r}: {other:?}, not Mismatch"),
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "world {world}: a rank waited out its timeout");
        // Empty calls on every rank stay fine on a fresh world.
        let comms = CpuComm::threads_with_config(world, config(|_| {})).expect("communicators");
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let (x, mut y) = (Vec::<f32>::new(), Vec::<f32>::new());
                    c.all_reduce(&x, &mut y, &ReduceOp::Sum).expect("empty on every rank");
                    let x = vec![c.rank() as f32 + 1.0; 4];
                    let mut y = vec![0f32; 4];
                    c.all_reduce(&x, &mut y, &ReduceOp::Sum).expect("then a call");
                    let want = (world * (world + 1) / 2) as f32;
                    assert_eq!(y, vec![want; 4]);
                });
            }
        });
    }
}

/// The configurations the random calls are drawn over: the host defaults, both staging sides
/// with small chunks, the latency regime, block caps (the and tighter), shared stages.
fn configs() -> Vec<(&'static str, CpuConfig)> {
    let staged = |side: StagingSide, chunk: u64| {
        move |c: &mut CpuConfig| {
            c.tuning.regime = Some(Regime::Throughput);
            c.tuning.staging_side = side;
            c.tuning.chunk_bytes = chunk;
            c.tuning.slots = 2;
        }
    };
    vec![
        ("host defaults", config(|_| {})),
        ("latency", config(|c| c.tuning.regime = Some(Regime::Latency))),
        ("push 512 B chunks", config(staged(StagingSide::Peer, 512))),
        ("pull 512 B chunks", config(staged(StagingSide::Own, 512))),
        ("cap 8/12", config(capped)),
        (
            "cap 5, 3 + 4 blocks",
            config(|c| {
                staged(StagingSide::Peer, 1024)(c);
                c.tuning.blocks_per_role = 3;
                c.tuning.consumer_blocks_per_role = Some(4);
                c.tuning.max_blocks = Some(5);
            }),
        ),
        (
            "shared stages",
            config(|c| {
                staged(StagingSide::Peer, 768)(c);
                c.tuning.lanes = Some(1);
                c.tuning.share_piece = 48;
                c.tuning.share_min_chunk = 0;
            }),
        ),
        (
            "small latency band",
            config(|c| {
                c.tuning.latency_max_bytes = 2048;
                c.tuning.latency_max_bytes_allreduce = 1024;
                c.tuning.chunk_bytes = 2048;
                c.tuning.max_blocks = Some(4);
            }),
        ),
    ]
}

const COLLECTIVES: [K; 9] = [
    K::AllReduce,
    K::AllGather,
    K::ReduceScatter,
    K::AllToAll,
    K::AllGatherV,
    K::ReduceScatterV,
    K::AllToAllV,
    K::Broadcast,
    K::Reduce,
];

const REDUCIBLE: [Dtype; 7] =
    [Dtype::F32, Dtype::F16, Dtype::Bf16, Dtype::F8E4M3, Dtype::F8E5M2, Dtype::I32, Dtype::U32];
const ALL_DTYPES: [Dtype; 12] = [
    Dtype::F32,
    Dtype::F64,
    Dtype::F16,
    Dtype::Bf16,
    Dtype::I8,
    Dtype::U8,
    Dtype::I32,
    Dtype::U32,
    Dtype::I64,
    Dtype::U64,
    Dtype::F8E4M3,
    Dtype::F8E5M2,
];
const OPS: [Op; 5] = [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::Avg];

/// 1 200 random calls, back to back on communicators of worlds 2 and 3 under every
/// configuration of [`configs`]: collective, element type, op, size (packets to many chunks),
/// V-form skew, and each rank's form (in place or not) drawn independently. Every rank's
/// output is checked exactly. `PURLIN_TEST_SEED` reproduces a run.
#[test]
fn random_mixed_calls_give_the_reference() {
    let seed = kit::fresh_seed();
    println!("PURLIN_TEST_SEED={seed}");
    let mut rng = Rng::new(seed);
    let configs = configs();
    let worlds = [2usize, 3];
    let comms: Vec<Vec<Vec<CpuComm>>> = worlds
        .iter()
        .map(|&w| configs.iter().map(|(_, c)| CpuComm::threads_with_config(w, *c).expect("comms")).collect())
        .collect();
    let t0 = Instant::now();
    let (mut calls, mut mixed) = (0, 0);
    while calls < 1200 {
        let wi = rng.below(worlds.len() as u64) as usize;
        let world = worlds[wi];
        let ci = rng.below(configs.len() as u64) as usize;
        let collective = COLLECTIVES[rng.below(COLLECTIVES.len() as u64) as usize];
        let dtype = if collective.reduces() {
            REDUCIBLE[rng.below(REDUCIBLE.len() as u64) as usize]
        } else {
            ALL_DTYPES[rng.below(ALL_DTYPES.len() as u64) as usize]
        };
        let op = OPS[rng.below(OPS.len() as u64) as usize];
        // Mostly small, some across many chunks; byte sizes round down to whole elements.
        let bytes = match rng.below(4) {
            0 => 1 + rng.below(64),
            1 => 64 + rng.below(2048),
            2 => 2048 + rng.below(16 << 10),
            _ => (16 << 10) + rng.below(48 << 10),
        } as usize;
        let skew = [0.0, 0.5, 1.5][rng.below(3) as usize];
        let Some(case) = kit::Case::new(collective, dtype, op, world, bytes, skew, rng.next()) else { continue };
        let case = case.with_values(Values::Stress);
        let forms: Vec<bool> = (0..world).map(|_| has_in_place_form(collective) && rng.below(2) == 0).collect();
        if forms.iter().any(|&f| f) && forms.iter().any(|&f| !f) {
            mixed += 1;
        }
        let results = run(&comms[wi][ci], &case, &forms);
        check(&case, &forms, results).unwrap_or_else(|e| {
            panic!("call {calls} (seed {seed}): {} world {world} {}, forms {forms:?}: {e}", case.name(), configs[ci].0)
        });
        calls += 1;
    }
    println!("{calls} random calls ({mixed} of mixed forms), {:.1?}", t0.elapsed());
    assert!(mixed > 100, "the mixed forms were drawn ({mixed})");
}
