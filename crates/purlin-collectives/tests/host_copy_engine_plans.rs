//! Copy-engine plans on the host executor (docs/perf/copy-engines.md §3.5): with
//! `Tuning::datapath` set to the copy engines, every one-copy gather (AllGather, AllToAll,
//! their V forms with empty partitions, Broadcast) and the gather half of the one-copy
//! AllReduce run their engine programs on a `HostCopyEngine` per rank, and their outputs match
//! purlin-testkit's reference bit for bit;
//! copy-engine and SM calls follow each other on the same flag words; the `Auto` policy picks
//! the copy engines exactly where it is documented to.

mod host_runner;
#[allow(dead_code)]
mod plan_on_host;

use std::time::Duration;

use host_runner::*;
use plan_on_host::execute_on_host;
use purlin_collectives::internal::host_executor::{HostMemoryConfig, HostWorld};
use purlin_collectives::internal::tuning::{Datapath, Tuning};
use purlin_collectives::{CpuComm, CpuConfig, Error, ReduceOp};
use purlin_snac::{Collective, CollectiveSpec, DataType, EngineStep, PlanConfig, ReductionMode, Space, derive};
use purlin_testkit::{self as kit, Counts};

fn ce_config(datapath: Datapath) -> CpuConfig {
    let mut c = config(Setup::ThroughputOwn, ReductionMode::Deterministic);
    c.tuning.datapath = datapath;
    c
}

/// Runs `case` and returns, per rank, whether its call ran on the copy engines.
fn run(comms: &[CpuComm], case: &Case) -> Vec<bool> {
    if let Err(e) = run_case_on(comms, case) {
        panic!("{}: {e}", case.name());
    }
    comms.iter().map(|c| c.last_call().expect("a call ran").copy_engine).collect()
}

#[test]
fn every_gather_runs_on_the_copy_engines_and_matches_the_reference() {
    let mut ran = 0;
    for (world, n) in [(2usize, 300u64), (3, 1001), (4, 77)] {
        let comms = CpuComm::threads_with_config(world, ce_config(Datapath::CopyEngine)).expect("communicators");
        for c in [Collective::AllGather, Collective::AllToAll, Collective::AllGatherV, Collective::AllToAllV] {
            for dtype in [DataType::F32, DataType::U8] {
                let mut shapes = vec![Shape::uniform_w(c, n, world as u64)];
                if c.is_v() {
                    // Skewed, with empty ranks and pairs.
                    shapes.extend(v_shapes(c, world as u64, n).into_iter().take(3));
                }
                for shape in shapes {
                    let case =
                        Case::new(c, world, dtype, None, ReductionMode::Deterministic, shape, Setup::ThroughputOwn)
                            .symmetric();
                    let mut forms = vec![case.clone()];
                    if c == Collective::AllGather {
                        forms.push(case.in_place());
                    }
                    for case in forms {
                        let ce = run(&comms, &case);
                        assert!(ce.iter().all(|&x| x), "{}: copy engine per rank {ce:?}", case.name());
                        ran += 1;
                    }
                }
            }
        }
    }
    println!("{ran} copy-engine cases matched the reference");
}

/// The AllReduce on symmetric buffers with its gather half on the copy engines: SM blocks
/// reduce each rank's shard, the engine pushes it to every peer. Sum and Max, f32 and bf16,
/// worlds 2 to 4, sizes no world divides (3 elements at world 4: a rank with an empty shard),
/// out of place and in place: every output bit for bit purlin-testkit's.
#[test]
fn all_reduce_runs_its_gather_half_on_the_copy_engines_and_matches_the_reference() {
    let mut ran = 0;
    for (world, sizes) in [(2usize, vec![301u64, 7]), (3, vec![1001, 10]), (4, vec![77, 3])] {
        let comms = CpuComm::threads_with_config(world, ce_config(Datapath::CopyEngine)).expect("communicators");
        for n in sizes {
            assert!(n % world as u64 != 0);
            for op in [ReduceOp::Sum, ReduceOp::Max] {
                for dtype in [DataType::F32, DataType::Bf16] {
                    let case = Case::new(
                        Collective::AllReduce,
                        world,
                        dtype,
                        Some(op),
                        ReductionMode::Deterministic,
                        Shape::Uniform(n),
                        Setup::ThroughputOwn,
                    )
                    .symmetric();
                    for case in [case.clone(), case.in_place()] {
                        let ce = run(&comms, &case);
                        assert!(ce.iter().all(|&x| x), "{}: copy engine per rank {ce:?}", case.name());
                        ran += 1;
                    }
                }
            }
        }
    }
    assert_eq!(ran, 48);
}

/// With the copy engines selected, copy-engine AllReduces and gathers follow SM calls on one
/// communicator: the one-copy ReduceScatter (SM blocks, the same entry and done words) and
/// staged calls on plain buffers, twice over, every output exact.
#[test]
fn copy_engine_all_reduces_follow_sm_calls_on_the_same_flags() {
    let world = 3;
    let comms = CpuComm::threads_with_config(world, ce_config(Datapath::CopyEngine)).expect("communicators");
    let mk = |c, dtype, op, n| {
        Case::new(c, world, dtype, op, ReductionMode::Deterministic, Shape::uniform_w(c, n, 3), Setup::ThroughputOwn)
    };
    let (sum, max) = (Some(ReduceOp::Sum), Some(ReduceOp::Max));
    let sequence = [
        (mk(Collective::AllReduce, DataType::F32, sum, 1000).symmetric(), true),
        (mk(Collective::ReduceScatter, DataType::F32, sum, 200).symmetric(), false),
        (mk(Collective::AllGather, DataType::U8, None, 500).symmetric(), true),
        (mk(Collective::AllReduce, DataType::Bf16, max, 700).symmetric().in_place(), true),
        (mk(Collective::AllReduce, DataType::F32, sum, 400), false),
        (mk(Collective::AllToAll, DataType::U8, None, 90).symmetric(), true),
        (mk(Collective::ReduceScatter, DataType::Bf16, max, 100).symmetric().in_place(), false),
        (mk(Collective::AllReduce, DataType::Bf16, sum, 2).symmetric(), true),
    ];
    for round in 0..2 {
        for (case, want) in &sequence {
            let ce = run(&comms, case);
            assert!(ce.iter().all(|x| x == want), "round {round} {}: copy engine per rank {ce:?}", case.name());
        }
    }
}

/// Broadcast is the AllGatherV with counts at the root only: the root's engine copies, the
/// others' copy nothing and only notify.
#[test]
fn broadcast_runs_on_the_copy_engines_and_matches_the_reference() {
    for world in [2usize, 3] {
        let comms = CpuComm::threads_with_config(world, ce_config(Datapath::CopyEngine)).expect("communicators");
        let case =
            kit::Case::with_counts(kit::Collective::Broadcast, kit::Dtype::F32, None, world, Counts::Uniform(37))
                .seeded(5);
        let inputs = case.inputs();
        let outs: Vec<Result<Vec<u8>, Error>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .enumerate()
                .map(|(r, c)| {
                    let input = &inputs[r];
                    s.spawn(move || -> Result<Vec<u8>, Error> {
                        let x: Vec<f32> =
                            input.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                        let mut y = c.alloc_symmetric::<f32>(37)?;
                        c.broadcast((r == 0).then_some(&x[..]), &mut y, 0)?;
                        assert!(c.last_call().expect("a call").copy_engine, "rank {r} ran on SM blocks");
                        Ok(y.to_vec().iter().flat_map(|v| v.to_le_bytes()).collect())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
        });
        for (r, got) in outs.into_iter().enumerate() {
            let got = got.unwrap_or_else(|e| panic!("world {world} rank {r}: {e}"));
            kit::check(kit::Dtype::F32, kit::Compare::Bitwise, &got, &case.expected(r))
                .unwrap_or_else(|e| panic!("world {world} rank {r}: {e}"));
        }
    }
}

/// `Auto` with a block cap and a 1 KiB threshold: large gathers on the copy engines, small
/// ones and reductions on SM blocks, back to back on one communicator (the same entry and
/// done words), every output exact.
#[test]
fn copy_engine_and_sm_calls_follow_each_other_on_the_same_flags() {
    let mut config = ce_config(Datapath::Auto);
    config.tuning.max_blocks = Some(4);
    config.tuning.ce_min_bytes = 1024;
    let world = 3;
    let comms = CpuComm::threads_with_config(world, config).expect("communicators");
    let mk = |c, dtype, op, shape| {
        Case::new(c, world, dtype, op, ReductionMode::Deterministic, shape, Setup::ThroughputOwn).symmetric()
    };
    let big = |c| Shape::uniform_w(c, 3 * 1024, world as u64);
    let sequence = [
        (mk(Collective::AllGather, DataType::F32, None, big(Collective::AllGather)), true),
        (mk(Collective::AllReduce, DataType::F32, Some(ReduceOp::Sum), big(Collective::AllReduce)), false),
        (mk(Collective::AllToAll, DataType::U8, None, big(Collective::AllToAll)), true),
        (mk(Collective::AllGather, DataType::F32, None, Shape::uniform_w(Collective::AllGather, 30, 3)), false),
        (mk(Collective::AllGatherV, DataType::U8, None, Shape::PerRank(vec![2048, 4096, 1500])), true),
        (mk(Collective::AllToAll, DataType::U8, None, Shape::uniform_w(Collective::AllToAll, 60, 3)), false),
        (mk(Collective::AllGather, DataType::F32, None, big(Collective::AllGather)).in_place(), true),
    ];
    for round in 0..2 {
        for (case, want) in &sequence {
            let ce = run(&comms, case);
            assert!(ce.iter().all(|x| x == want), "round {round} {}: copy engine per rank {ce:?}", case.name());
        }
    }
}

#[test]
fn the_auto_policy_takes_the_copy_engines_only_for_capped_large_pieces() {
    let spec = |n| CollectiveSpec::all_gather(2, DataType::U8, n);
    let t = |max_blocks, ce_min_bytes| Tuning { max_blocks, ce_min_bytes, ..Tuning::default() };
    assert!(Datapath::copy_engine(&spec(8 << 20), &t(Some(16), 8 << 20)));
    assert!(!Datapath::copy_engine(&spec(8 << 20), &t(None, 8 << 20)), "no cap: SM blocks");
    assert!(!Datapath::copy_engine(&spec((8 << 20) - 1), &t(Some(16), 8 << 20)), "a piece below the threshold");
    // The smallest piece decides; empty pairs do not count.
    let v = CollectiveSpec::all_to_all_v(2, DataType::U8, vec![vec![0, 16 << 20], vec![1 << 20, 0]]);
    assert!(!Datapath::copy_engine(&v, &t(Some(16), 8 << 20)));
    let v = CollectiveSpec::all_to_all_v(2, DataType::U8, vec![vec![5, 16 << 20], vec![9 << 20, 5]]);
    assert!(Datapath::copy_engine(&v, &t(Some(16), 8 << 20)));
    assert!(Datapath::copy_engine(&spec(1), &Tuning { datapath: Datapath::CopyEngine, ..t(None, 8 << 20) }));
    // The AllReduce's gather half: only where the copy engines are asked for.
    let ar = CollectiveSpec::all_reduce(2, DataType::F32, purlin_snac::ReduceOp::Sum, 64 << 20);
    assert!(!Datapath::copy_engine(&ar, &t(Some(16), 8 << 20)), "auto: an AllReduce stays on SM blocks");
    assert!(Datapath::copy_engine(&ar, &Tuning { datapath: Datapath::CopyEngine, ..t(None, 8 << 20) }));
    assert!(!Datapath::copy_engine(&spec(1 << 30), &Tuning { datapath: Datapath::Sm, ..t(Some(1), 0) }));
    assert_eq!(Tuning::default().datapath, Datapath::Auto);
}

#[test]
fn the_datapath_setting_parses_and_refuses_what_it_does_not_know() {
    assert_eq!(Datapath::parse("sm").ok(), Some(Datapath::Sm));
    assert_eq!(Datapath::parse(" ce ").ok(), Some(Datapath::CopyEngine));
    assert_eq!(Datapath::parse("copy-engine").ok(), Some(Datapath::CopyEngine));
    assert_eq!(Datapath::parse("auto").ok(), Some(Datapath::Auto));
    match Datapath::parse("gpu") {
        Err(Error::Env { var: "PURLIN_DATAPATH", problem }) => assert!(problem.contains("sm|ce|auto"), "{problem}"),
        other => panic!("expected Error::Env, got {other:?}"),
    }
}

/// The host executor runs the engine program it is given: the derived one passes the output
/// check, the same plans with one engine copy's destination shifted by one byte run to
/// completion and fail it.
#[test]
fn a_shifted_engine_region_fails_the_output_check() {
    let (world, n) = (3usize, 3000usize);
    let spec = CollectiveSpec::all_gather(world as u32, DataType::U8, n as u64);
    let cfg = PlanConfig { peer_outputs: true, copy_engine: true, staging_bytes: 1 << 16, ..PlanConfig::default() };
    let plans = derive(&spec, &cfg).expect("derive");
    assert!(plans.iter().all(|p| p.engine.is_some()));
    let x: Vec<Vec<u8>> = (0..world).map(|r| (0..n).map(|i| ((r * 64 + i) % 251) as u8).collect()).collect();
    let want = x.concat();
    let run = |plans: &[purlin_snac::Plan]| {
        let mem = HostMemoryConfig { staging_bytes: 1 << 16, ..HostMemoryConfig::default() };
        let host = HostWorld::new(world, mem, Duration::from_secs(10));
        let mut outputs = vec![vec![0xA5u8; n * world]; world];
        for (r, res) in execute_on_host(&host, plans, &x, &mut outputs, false).into_iter().enumerate() {
            res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        }
        outputs
    };
    assert!(run(&plans).iter().all(|o| *o == want), "the derived plans");
    let mut shifted = plans.clone();
    let eng = shifted[1].engine.as_mut().expect("an engine program");
    let copy = eng.steps.iter_mut().find_map(|s| match s {
        EngineStep::Copy { dst, .. } if dst.space == Space::PeerOutput(2) => Some(dst),
        _ => None,
    });
    copy.expect("rank 1 copies into rank 2's output").offset.base += 1;
    let outputs = run(&shifted);
    assert!(outputs[0] == want && outputs[1] == want, "only rank 2's output is written off by one");
    assert_ne!(outputs[2], want, "a shifted engine region passed the output check");
}

/// `PURLIN_DATAPATH` and `PURLIN_CE_MIN_BYTES` reach `CpuConfig::from_env` (and a value it does
/// not know is `Error::Env`), in children of this test so the environment stays this
/// process's own.
#[test]
fn the_datapath_variables_are_read_from_the_environment() {
    const CHILD: &str = "PURLIN_TEST_DATAPATH_CHILD";
    const NAME: &str = "the_datapath_variables_are_read_from_the_environment";
    if let Ok(role) = std::env::var(CHILD) {
        let got = CpuConfig::from_env();
        match role.as_str() {
            "bad" => assert!(matches!(got, Err(Error::Env { var: "PURLIN_DATAPATH", .. })), "{got:?}"),
            _ => {
                let c = got.expect("a configuration");
                assert_eq!((c.tuning.datapath, c.tuning.ce_min_bytes), (Datapath::CopyEngine, 4096));
            }
        }
        return;
    }
    for (value, role) in [("gpu", "bad"), ("ce", "good")] {
        let exe = std::env::current_exe().expect("this test's executable");
        let out = std::process::Command::new(exe)
            .args(["--exact", NAME, "--test-threads=1"])
            .env(CHILD, role)
            .env("PURLIN_DATAPATH", value)
            .env("PURLIN_CE_MIN_BYTES", "4096")
            .output()
            .expect("run the child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && stdout.contains("1 passed"), "PURLIN_DATAPATH={value}: {stdout}");
    }
}

/// An engine copy the host engine refuses (here: rank 2 sees rank 0's registered output a
/// byte short) fails that rank with `InvalidArgument` and poisons the world, so the peers
/// waiting for its notify fail with `Poisoned` instead of waiting out the timeout.
#[test]
fn a_refused_engine_copy_poisons_the_world() {
    use purlin_collectives::internal::host_executor::CallBuffers;
    let (world, n) = (3usize, 300usize);
    let spec = CollectiveSpec::all_gather(world as u32, DataType::U8, n as u64);
    let cfg = PlanConfig { peer_outputs: true, copy_engine: true, staging_bytes: 1 << 16, ..PlanConfig::default() };
    let plans = derive(&spec, &cfg).expect("derive");
    let mem = HostMemoryConfig { staging_bytes: 1 << 16, ..HostMemoryConfig::default() };
    let host = HostWorld::new(world, mem, Duration::from_secs(60));
    let inputs: Vec<Vec<u8>> = (0..world).map(|r| vec![r as u8 + 1; n]).collect();
    let mut outputs = vec![vec![0u8; n * world]; world];
    let mut peers = [(std::ptr::null_mut(), 0); purlin_collectives::MAX_WORLD];
    for (slot, o) in peers.iter_mut().zip(outputs.iter_mut()) {
        *slot = (o.as_mut_ptr(), o.len());
    }
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = plans
            .iter()
            .zip(&inputs)
            .enumerate()
            .map(|(r, (p, i))| {
                let mut view = peers;
                if r == 2 {
                    view[0].1 -= 1;
                }
                let b = CallBuffers { peer_outputs: view, ..CallBuffers::new(i.as_ptr(), n, peers[r].0, peers[r].1) };
                let host = &host;
                s.spawn(move || host.execute(p, b, false))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    match &results[2] {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("copy engine"), "{why}"),
        other => panic!("rank 2: expected the engine's refusal, got {other:?}"),
    }
    for r in [0, 1] {
        assert!(matches!(results[r], Err(Error::Poisoned(_))), "rank {r}: {:?}", results[r]);
    }
    assert!(host.is_poisoned());
}
