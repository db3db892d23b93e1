//! Symmetric buffers on the host executor (`CpuComm::alloc_symmetric`): every collective takes
//! the one-copy plan where its buffers are symmetric on every rank, and its outputs match the
//! independent reference of `purlin_testkit` (through `host_runner`); the rendezvous, ownership and length
//! checks are typed errors that touch nothing.

mod host_runner;

use std::time::Duration;

use host_runner::*;
use purlin_collectives::{CpuBuffer, CpuBufferMut, CpuComm, CpuConfig, CpuSymmetricBuffer};
use purlin_collectives::{Error, ReduceOp};
use purlin_snac::{Collective, DataType, ReductionMode};

/// Runs `case` and returns, per rank, whether its call ran a one-copy plan.
fn run_and_report(comms: &[CpuComm], case: &Case) -> Vec<bool> {
    if let Err(e) = run_case_on(comms, case) {
        panic!("{}: {e}", case.name());
    }
    comms.iter().map(|c| c.last_call().expect("a call ran").one_copy).collect()
}

fn cases(world: usize, setup: Setup, n: u64) -> Vec<Case> {
    let mut out = vec![];
    for c in Collective::ALL {
        let typed: &[(DataType, Option<ReduceOp>)] = if is_reduce(c) {
            &[
                (DataType::F32, Some(ReduceOp::Sum)),
                (DataType::Bf16, Some(ReduceOp::Avg)),
                (DataType::I32, Some(ReduceOp::Max)),
            ]
        } else {
            &[(DataType::F32, None), (DataType::U8, None)]
        };
        for &(dtype, op) in typed {
            let mut shapes = vec![Shape::uniform_w(c, n, world as u64)];
            if c.is_v() {
                // Skewed, with empty ranks and pairs (every rank's buffers are as large as the
                // largest rank's, shown at its own length).
                shapes.extend(v_shapes(c, world as u64, n).into_iter().take(3));
            }
            for shape in shapes {
                let case = Case::new(c, world, dtype, op, ReductionMode::Deterministic, shape, setup).symmetric();
                if !matches!(c, Collective::AllToAll | Collective::AllToAllV) {
                    out.push(case.clone().in_place());
                }
                out.push(case);
            }
        }
    }
    out
}

#[test]
fn every_collective_runs_one_copy_on_symmetric_buffers() {
    let mut ran = 0;
    for (world, setup, n) in
        [(2, Setup::ThroughputOwn, 300), (3, Setup::ThroughputPeer, 1001), (4, Setup::ThroughputOwn, 77)]
    {
        let comms = comms(world, setup, ReductionMode::Deterministic);
        for case in cases(world, setup, n) {
            let one_copy = run_and_report(&comms, &case);
            assert!(one_copy.iter().all(|&x| x), "{}: one-copy per rank {one_copy:?}", case.name());
            ran += 1;
        }
    }
    println!("{ran} one-copy cases matched the reference");
}

#[test]
fn symmetric_buffers_in_the_latency_regime_run_the_packet_plans() {
    let comms = comms(3, Setup::Latency, ReductionMode::Deterministic);
    for case in cases(3, Setup::Latency, 5) {
        let one_copy = run_and_report(&comms, &case);
        assert!(one_copy.iter().all(|&x| !x), "{}: one-copy per rank {one_copy:?}", case.name());
    }
}

/// Runs `f(rank, comm)` on a thread per rank and returns the results in rank order.
fn on_every_rank<R: Send>(comms: &[CpuComm], f: impl Fn(usize, &CpuComm) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(r, c))).collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

/// Communicators whose waits expire soon enough for the tests that wait one out, yet not on a
/// loaded 2-core CI machine.
fn short_timeout(world: usize) -> Vec<CpuComm> {
    let config =
        CpuConfig { timeout: Duration::from_secs(2), ..config(Setup::ThroughputOwn, ReductionMode::Deterministic) };
    CpuComm::threads_with_config(world, config).expect("host communicators")
}

#[test]
fn ranks_that_ask_for_different_sizes_all_get_a_mismatch_and_stay_in_step() {
    let comms = short_timeout(3);
    let first = on_every_rank(&comms, |r, c| c.alloc_symmetric::<f32>(if r == 2 { 9 } else { 8 }).map(|b| b.len()));
    for (r, got) in first.iter().enumerate() {
        match got {
            Err(Error::Mismatch { rank, peer, what }) => {
                assert_eq!(*rank, r);
                assert!(what.contains("36 bytes") || what.contains("32 bytes"), "{what}");
                assert_ne!(*peer, r);
            }
            other => panic!("rank {r}: expected a size mismatch, got {other:?}"),
        }
    }
    // The next allocation of every rank meets the others' next one.
    let second = on_every_rank(&comms, |_, c| c.alloc_symmetric::<f32>(5).map(|b| b.len()));
    assert!(second.iter().all(|x| matches!(x, Ok(5))), "{second:?}");
}

#[test]
fn a_rank_that_never_allocates_is_a_timeout_and_the_late_one_hears_of_it() {
    let comms = short_timeout(2);
    match comms[0].alloc_symmetric::<u32>(4) {
        Err(Error::Timeout { rank: 0, peer: 1, .. }) => {}
        other => panic!("expected a timeout naming rank 1, got {other:?}"),
    }
    match comms[1].alloc_symmetric::<u32>(4) {
        Err(Error::PeerFailed { rank: 1, peer: 0, .. }) => {}
        other => panic!("expected rank 0's failure, got {other:?}"),
    }
}

#[test]
fn copies_check_lengths_and_round_trip() {
    let comms = short_timeout(2);
    let mut bufs = on_every_rank(&comms, |_, c| c.alloc_symmetric::<i32>(6).expect("allocation"));
    let b: &mut CpuSymmetricBuffer<i32> = &mut bufs[1];
    assert_eq!(b.to_vec(), vec![0; 6], "symmetric memory starts zeroed");
    assert!(matches!(b.copy_from_host(&[1, 2, 3]), Err(Error::InvalidArgument(_))));
    assert!(matches!(b.copy_to_host(&mut [0; 7]), Err(Error::InvalidArgument(_))));
    assert_eq!(b.to_vec(), vec![0; 6], "a refused copy wrote nothing");
    b.copy_from_host(&[1, -2, 3, -4, 5, -6]).expect("copy in");
    let mut back = [0; 6];
    b.copy_to_host(&mut back).expect("copy out");
    assert_eq!(back, [1, -2, 3, -4, 5, -6]);
    assert_eq!(bufs[0].to_vec(), vec![0; 6], "rank 0's memory is its own");
}

#[test]
fn another_ranks_or_worlds_handle_is_refused_before_anything_runs() {
    let comms = short_timeout(2);
    let other = short_timeout(2);
    let mut mine = on_every_rank(&comms, |_, c| c.alloc_symmetric::<f32>(8).expect("allocation"));
    let mut foreign = on_every_rank(&other, |_, c| c.alloc_symmetric::<f32>(8).expect("allocation"));
    let send = vec![1.0f32; 8];
    let (rank0, rank1) = mine.split_at_mut(1);
    match comms[0].all_reduce(&send, &mut rank1[0], &ReduceOp::Sum) {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("rank 1's handle"), "{why}"),
        other => panic!("expected rank 1's handle to be refused on rank 0, got {other:?}"),
    }
    match comms[0].all_reduce(&send, &mut foreign[0], &ReduceOp::Sum) {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("another communicator"), "{why}"),
        other => panic!("expected another world's buffer to be refused, got {other:?}"),
    }
    assert_eq!(rank0[0].to_vec(), vec![0.0; 8]);
    assert_eq!(foreign[0].to_vec(), vec![0.0; 8], "a refused call wrote nothing");
    // Nothing was signalled: a proper call on both ranks still works.
    let results = on_every_rank(&comms, |r, c| {
        let mut out = vec![0.0f32; 8];
        c.all_reduce(&vec![r as f32 + 1.0; 8], &mut out, &ReduceOp::Sum).map(|_| out)
    });
    for got in results {
        assert_eq!(got.expect("call after the refusals"), vec![3.0; 8]);
    }
}

#[test]
fn one_rank_with_plain_buffers_ends_in_a_timeout_not_in_corrupted_memory() {
    let comms = short_timeout(2);
    let n = 4096;
    let mut outs = on_every_rank(&comms, |_, c| c.alloc_symmetric::<f32>(2 * n).expect("allocation"));
    let (out0, out1) = outs.split_at_mut(1);
    let out0 = std::sync::Mutex::new(&mut out0[0]);
    // Rank 0 passes its symmetric output (the one-copy plan), rank 1 a plain one (staged).
    let results = on_every_rank(&comms, |r, c| {
        let input = vec![r as f32 + 1.0; n];
        if r == 0 {
            let mut guard = out0.lock().expect("rank 0's buffer");
            c.all_gather(&input, &mut **guard)
        } else {
            c.all_gather(&input, &mut vec![0.0f32; 2 * n])
        }
    });
    for (r, got) in results.iter().enumerate() {
        assert!(
            matches!(got, Err(Error::Timeout { .. } | Error::Poisoned(_))),
            "rank {r}: expected a timeout, got {got:?}"
        );
    }
    assert!(comms[1].async_error().is_err(), "the world is poisoned after the expired waits");
    assert_eq!(out1[0].to_vec(), vec![0.0; 2 * n], "rank 1's symmetric memory was not written");
}

#[test]
fn ranks_on_different_allocations_or_calls_all_get_a_mismatch_and_nothing_runs() {
    let comms = short_timeout(2);
    let n = 256;
    let mut xs = on_every_rank(&comms, |_, c| c.alloc_symmetric::<f32>(2 * n).expect("allocation"));
    let mut ys = on_every_rank(&comms, |_, c| c.alloc_symmetric::<f32>(2 * n).expect("allocation"));
    let slots: Vec<_> = xs.iter_mut().zip(ys.iter_mut()).map(std::sync::Mutex::new).collect();
    let expect_mismatch = |results: Vec<Result<(), Error>>| {
        for (r, got) in results.iter().enumerate() {
            match got {
                Err(Error::Mismatch { rank, peer, what }) => {
                    assert_eq!((*rank, *peer), (r, 1 - r));
                    assert!(what.contains("symmetric"), "{what}");
                }
                other => panic!("rank {r}: expected a mismatch, got {other:?}"),
            }
        }
    };
    // The same AllGather, rank 0 into X and rank 1 into Y.
    expect_mismatch(on_every_rank(&comms, |r, c| {
        let mut pair = slots[r].lock().expect("buffers");
        let (x, y) = &mut *pair;
        let out = if r == 0 { &mut **x } else { &mut **y };
        c.all_gather(&vec![1.0f32; n], out).map(drop)
    }));
    // Both into X, but different calls.
    expect_mismatch(on_every_rank(&comms, |r, c| {
        let mut pair = slots[r].lock().expect("buffers");
        let x = &mut *pair.0;
        if r == 0 { c.all_gather(&vec![1.0f32; n], x) } else { c.all_reduce_in_place(x, &ReduceOp::Sum) }.map(drop)
    }));
    drop(slots);
    for b in xs.iter().chain(&ys) {
        assert_eq!(b.to_vec(), vec![0.0; 2 * n], "rank {}: nothing ran", b.rank());
    }
    // Not poisoned, and the ranks' meetings are still in step: the same call now runs.
    assert!(comms[0].async_error().is_ok());
    let results = on_every_rank(&comms, |r, c| {
        let mut out = c.alloc_symmetric::<f32>(2 * n)?;
        c.all_gather(&vec![r as f32 + 1.0; n], &mut out)?;
        Ok::<_, Error>(out.to_vec())
    });
    let want: Vec<f32> = [vec![1.0; n], vec![2.0; n]].concat();
    for got in results {
        assert_eq!(got.expect("the matched call"), want);
    }
}

#[test]
fn calls_whose_plans_share_nothing_mix_symmetric_and_plain_buffers() {
    let config = CpuConfig { timeout: Duration::from_secs(10), ..config(Setup::Latency, ReductionMode::Deterministic) };
    let comms = CpuComm::threads_with_config(2, config).expect("host communicators");
    let n = 16;
    let mut outs = on_every_rank(&comms, |_, c| c.alloc_symmetric::<i32>(2 * n).expect("allocation"));
    let out0 = std::sync::Mutex::new(&mut outs[0]);
    // Rank 0 gathers into its symmetric buffer, rank 1 into a Vec: the packet plan shares
    // neither, so the ranks need not agree on them.
    let results = on_every_rank(&comms, |r, c| {
        let input = vec![r as i32 + 7; n];
        if r == 0 {
            let mut out = out0.lock().expect("rank 0's buffer");
            c.all_gather(&input, &mut **out).map(|_| out.to_vec())
        } else {
            let mut out = vec![0i32; 2 * n];
            c.all_gather(&input, &mut out).map(|_| out)
        }
    });
    let want: Vec<i32> = [vec![7; n], vec![8; n]].concat();
    for (r, got) in results.into_iter().enumerate() {
        assert_eq!(got.unwrap_or_else(|e| panic!("rank {r}: {e}")), want, "rank {r}");
        assert!(!comms[r].last_call().expect("a call ran").one_copy);
    }
}

/// The reduction `name` of `x` into `y` on any kind of buffer.
fn reduce<S, R>(c: &CpuComm, name: &str, x: &S, y: &mut R, counts: &[usize]) -> Result<(), Error>
where
    S: CpuBuffer<f32> + ?Sized,
    R: CpuBufferMut<f32> + ?Sized,
{
    match name {
        "all-reduce" => c.all_reduce(x, y, &ReduceOp::Sum),
        "reduce-scatter" => c.reduce_scatter(x, y, &ReduceOp::Sum),
        _ => c.reduce_scatter_v(x, y, counts, &ReduceOp::Sum),
    }
    .map(drop)
}

/// Deterministic mode reduces in rank order whatever the path: an AllReduce, a ReduceScatter
/// and a ReduceScatterV of values that round give the same bits on symmetric buffers (the
/// one-copy plans) as on plain ones (staged), in both staging sides, on every rank.
#[test]
fn deterministic_one_copy_reductions_are_bitwise_the_staged_ones() {
    for (world, setup) in [(3, Setup::ThroughputPeer), (4, Setup::ThroughputOwn)] {
        let comms = comms(world, setup, ReductionMode::Deterministic);
        let n = 1001usize;
        let value = |r: usize, i: usize| ((i * 31 + r * 17) as f32).sin() * 1e3 + 1e-3 * r as f32;
        let counts: Vec<usize> = (0..world).map(|r| 3 * n / world + r * 7).collect();
        let sum: usize = counts.iter().sum();
        // (collective, input length, every rank's output length)
        let calls = [
            ("all-reduce", n, vec![n; world]),
            ("reduce-scatter", world * n, vec![n; world]),
            ("reduce-scatter-v", sum, counts.clone()),
        ];
        for (name, in_len, out_lens) in &calls {
            let run = |symmetric: bool| -> Vec<Vec<u32>> {
                on_every_rank(&comms, |r, c| {
                    let x: Vec<f32> = (0..*in_len).map(|i| value(r, i)).collect();
                    let y = if symmetric {
                        let mut xs = c.alloc_symmetric::<f32>(*in_len).expect("allocation");
                        xs.copy_from_host(&x).expect("copy in");
                        let mut ys =
                            c.alloc_symmetric::<f32>(*out_lens.iter().max().unwrap_or(&0)).expect("allocation");
                        ys.set_len(out_lens[r]).expect("length");
                        reduce(c, name, &xs, &mut ys, &counts).unwrap_or_else(|e| panic!("{name}: {e}"));
                        ys.to_vec()
                    } else {
                        let mut y = vec![0f32; out_lens[r]];
                        reduce(c, name, &x, &mut y, &counts).unwrap_or_else(|e| panic!("{name}: {e}"));
                        y
                    };
                    assert_eq!(c.last_call().expect("a call").one_copy, symmetric, "{name}: the path taken");
                    y.iter().map(|v| v.to_bits()).collect()
                })
            };
            let (staged, one_copy) = (run(false), run(true));
            for r in 0..world {
                assert!(staged[r].iter().any(|&b| b != 0), "{name}: rank {r} got a result");
                assert_eq!(staged[r], one_copy[r], "world {world} {setup:?} {name}: rank {r} differs");
            }
        }
    }
}

/// Broadcast into symmetric outputs and Reduce from symmetric inputs take the one-copy plans
/// (the root stores straight into every peer's output; the root reduces straight from every
/// peer's input); the root may pass a symmetric or a plain send buffer (a broadcast shares
/// only the outputs).
#[test]
fn broadcast_and_reduce_on_symmetric_buffers_take_one_copy() {
    let comms = comms(3, Setup::ThroughputOwn, ReductionMode::Deterministic);
    let n = 2000;
    let value = |r: usize, i: usize| (i % 97) as f32 + r as f32;
    for root in 0..3 {
        // Per rank: what the broadcast gave, what the reduce gave, and whether each was one-copy.
        type Got = (Vec<f32>, Vec<f32>, [bool; 2]);
        let results = on_every_rank(&comms, |r, c| -> Result<Got, Error> {
            let x: Vec<f32> = (0..n).map(|i| value(r, i)).collect();
            let mut send = c.alloc_symmetric::<f32>(n)?;
            send.copy_from_host(&x)?;
            let mut recv = c.alloc_symmetric::<f32>(n)?;
            if r == root && root == 1 {
                c.broadcast(Some(&x), &mut recv, root as i32)?; // plain send on the root
            } else {
                c.broadcast(Some(&send), &mut recv, root as i32)?;
            }
            let one_copy_broadcast = c.last_call().expect("a call").one_copy;
            let got = recv.to_vec();
            let mut reduced = vec![0f32; n];
            c.reduce(&send, Some(&mut reduced), &ReduceOp::Sum, root as i32)?;
            Ok((got, reduced, [one_copy_broadcast, c.last_call().expect("a call").one_copy]))
        });
        for (r, got) in results.into_iter().enumerate() {
            let (bcast, reduced, one_copy) = got.unwrap_or_else(|e| panic!("root {root} rank {r}: {e}"));
            assert_eq!(one_copy, [true, true], "root {root} rank {r}");
            assert_eq!(bcast, (0..n).map(|i| value(root, i)).collect::<Vec<_>>(), "root {root} rank {r}: broadcast");
            let want: Vec<f32> =
                if r == root { (0..n).map(|i| (0..3).map(|q| value(q, i)).sum()).collect() } else { vec![0.0; n] };
            assert_eq!(reduced, want, "root {root} rank {r}: reduce");
        }
    }
}
