//! Sequences of collectives on 2 ranks (2 GPUs, or one under `PURLIN_SHARED_GPU=1`; one
//! process, `Comm::from_devices`), every output
//! checked against an independent host reference (purlin_testkit: fresh random small integers,
//! poisoned outputs, exact comparison):
//!
//! - a CUDA graph of mixed collectives (every collective, a V form, an in-place call,
//!   latency- and throughput-size calls) captured once, in contexts that keep cudarc's
//!   default event tracking, and replayed 120 times with fresh inputs written between
//!   replays (docs/design.md §5 "CUDA graphs", issue #8);
//! - back-to-back eager calls of different collectives, sizes and grid widths, in two
//!   tunings (docs/design.md §3.5 scenarios: resident staging and packets need 3 calls to expose
//!   a lap);
//! - one rank delayed before every launch (host spin and a device sleep kernel), 60 calls
//!   per delayed rank.
//!
//! Run on the GPU machine: `gpu_sequences-test --ignored --test-threads=1 --nocapture`.

mod gpu_calls;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cudarc::driver::CudaGraph;
use gpu_calls::{
    Bufs, Call, Coll, Dt, Rng, call, capture, device_sleep, fresh_seed, replay_with_fresh_inputs, sleep_request, spin,
    streams,
};
use purlin_collectives::internal::tuning::Tuning;
use purlin_collectives::{Comm, CommConfig, ReduceOp};
use purlin_snac::Regime;

const REPLAYS: usize = 120;
const DELAY: Duration = Duration::from_micros(100);

fn config(tuning: Tuning) -> CommConfig {
    CommConfig {
        timeout: Duration::from_secs(60),
        device_timeout: Duration::from_secs(20),
        tuning,
        ..gpu_calls::base_config()
    }
}

/// Mixed calls: latency sizes first, then throughput sizes (over the 1 MiB latency band).
fn mixed_calls() -> Vec<Call> {
    use Coll::*;
    use ReduceOp::*;
    vec![
        call(AllReduce, Dt::F32, Sum, 1),
        call(AllGather, Dt::Bf16, Sum, 1000),
        call(ReduceScatter, Dt::I32, Max, 4099),
        call(AllToAll, Dt::U8, Sum, 7),
        call(AllGatherV, Dt::F32, Sum, 1000),
        call(AllReduceInPlace, Dt::Bf16, Sum, 5000),
        call(AllToAllV, Dt::U8, Sum, 333),
        call(ReduceScatterV, Dt::F32, Prod, 2000),
        call(AllReduce, Dt::F32, Sum, 600_000),
        call(AllGather, Dt::F32, Sum, 400_000),
        call(ReduceScatter, Dt::Bf16, Min, 700_000),
        call(AllToAll, Dt::F32, Sum, 300_000),
        call(SendRecv, Dt::Bf16, Sum, 3000),
        call(SendRecv, Dt::F32, Sum, 500_000),
    ]
}

fn describe_plans(comms: &[Comm], calls: &[Call]) -> (Vec<Regime>, BTreeSet<usize>) {
    let mut regimes = Vec::new();
    let mut grids = BTreeSet::new();
    for c in calls {
        let plans: Vec<_> = comms.iter().map(|m| c.plan(m)).collect();
        for p in &plans {
            if !regimes.contains(&p.regime) {
                regimes.push(p.regime);
            }
            grids.insert(p.grid());
        }
        println!(
            "EXEC   plan {:<40} {:?} grid {:?}",
            c.name(),
            plans[0].regime,
            plans.iter().map(|p| p.grid()).collect::<Vec<_>>()
        );
    }
    (regimes, grids)
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn graph_of_mixed_collectives_replays_with_fresh_inputs() {
    let streams = streams();
    for s in &streams {
        // The contexts are cudarc's defaults: tracking on and active (multi-stream mode).
        assert!(s.context().is_event_tracking() && s.context().is_managing_stream_synchronization());
    }
    let comms = Comm::from_devices_with_config(streams, config(Tuning::default())).expect("set-up");
    let calls = mixed_calls();
    let (regimes, grids) = describe_plans(&comms, &calls);
    assert!(
        regimes.contains(&Regime::Latency) && regimes.contains(&Regime::Throughput),
        "the graph must hold latency- and throughput-regime calls: {regimes:?}"
    );
    let mut bufs: Vec<Bufs> = calls.iter().map(|&c| Bufs::new(&comms, c)).collect();

    let t = Instant::now();
    let graphs: Vec<CudaGraph> = comms.iter().map(|c| capture(c, &bufs)).collect();
    for c in &comms {
        c.context().check_err().expect("no cudarc error recorded while capturing");
        c.async_error().expect("no error after capture");
    }
    println!("EXEC graph: {} calls captured per rank (grids {grids:?}) in {:?}", calls.len(), t.elapsed());

    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let mut failures = Vec::new();
    let t = Instant::now();
    for replay in 0..REPLAYS {
        for e in replay_with_fresh_inputs(&comms, &graphs, &calls, &mut bufs, &mut rng) {
            if failures.len() < 20 {
                println!("EXEC WRONG graph replay {replay}: {e}");
            }
            failures.push(e);
        }
    }
    for c in &comms {
        c.context().check_err().expect("no cudarc error recorded during replays");
        c.async_error().expect("no device error after the replays");
    }
    println!(
        "EXEC graph: {REPLAYS} replays of {} calls on {} ranks in {:?} (seed {seed}): {} wrong outputs",
        calls.len(),
        comms.len(),
        t.elapsed(),
        failures.len()
    );
    assert!(failures.is_empty(), "{} wrong outputs, first: {}", failures.len(), failures[0]);

    // The communicator still serves eager calls after the graphs (epochs advanced on the
    // device by the replays and here alike).
    let inputs: Vec<Vec<Vec<i64>>> = calls.iter().map(|c| c.inputs(&mut rng)).collect();
    for (b, x) in bufs.iter_mut().zip(&inputs) {
        for c in &comms {
            b.upload(c, c.rank(), x);
        }
        for c in &comms {
            b.issue(c, c.rank()).unwrap_or_else(|e| panic!("eager {} after the graphs: {e}", b.call.name()));
        }
        for c in &comms {
            b.check(c, c.rank(), x).unwrap_or_else(|e| panic!("eager after the graphs: {e}"));
        }
    }
    drop(graphs);
}

/// Calls whose plans differ in grid width (latency and throughput regimes, one chunk and
/// many, AllReduce's two phases and single-phase collectives).
fn back_to_back_calls() -> Vec<Call> {
    use Coll::*;
    use ReduceOp::*;
    vec![
        call(AllReduce, Dt::F32, Sum, 8),
        call(AllGather, Dt::F32, Sum, 3 << 20),
        call(ReduceScatter, Dt::Bf16, Max, 1 << 10),
        call(AllReduce, Dt::F32, Sum, 4 << 20),
        call(AllToAll, Dt::U8, Sum, 5 << 20),
        call(AllGatherV, Dt::I32, Sum, 70_000),
        call(AllReduce, Dt::I32, Min, 600_000),
        call(AllToAllV, Dt::F32, Sum, 777),
        call(ReduceScatter, Dt::F32, Sum, 2 << 20),
        call(SendRecv, Dt::U8, Sum, 5 << 20),
    ]
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn back_to_back_calls_of_different_grids_are_exact() {
    let streams = streams();
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let small = Tuning { blocks_per_role: 3, chunk_bytes: 256 << 10, ..Tuning::default() };
    for (label, tuning) in [("default tuning", Tuning::default()), ("3 blocks per role, 256 KiB chunks", small)] {
        let comms = Comm::from_devices_with_config(streams.clone(), config(tuning)).expect("set-up");
        let calls = back_to_back_calls();
        let (_, grids) = describe_plans(&comms, &calls);
        // The communicator's tuning gives one grid width per regime (blocks per role, twice that
        // staged); `back_to_back_plans_of_several_grid_widths_on_one_communicator` covers more.
        assert!(grids.len() >= 2, "{label}: the sequence must use 2+ grid widths, its plans use {grids:?}");
        let mut bufs: Vec<Bufs> = calls.iter().map(|&c| Bufs::new(&comms, c)).collect();
        let mut failures = Vec::new();
        // Three laps of the whole sequence, each call issued right after the previous one
        // (no synchronisation between calls; the uploads come before the first).
        for lap in 0..3 {
            let inputs: Vec<Vec<Vec<i64>>> = calls.iter().map(|c| c.inputs(&mut rng)).collect();
            for (b, x) in bufs.iter_mut().zip(&inputs) {
                for c in &comms {
                    b.upload(c, c.rank(), x);
                }
            }
            for b in &bufs {
                for c in &comms {
                    b.issue(c, c.rank())
                        .unwrap_or_else(|e| panic!("{label}: {} rank {}: {e}", b.call.name(), c.rank()));
                }
            }
            for (b, x) in bufs.iter().zip(&inputs) {
                for c in &comms {
                    if let Err(e) = b.check(c, c.rank(), x) {
                        println!("EXEC WRONG back-to-back ({label}) lap {lap}: {e}");
                        failures.push(e);
                    }
                }
            }
        }
        for c in &comms {
            c.async_error().expect("no device error");
        }
        println!(
            "EXEC back-to-back ({label}): 3 laps of {} calls, grids {grids:?} (seed {seed}): {} wrong outputs",
            calls.len(),
            failures.len()
        );
        assert!(failures.is_empty(), "{label}: {} wrong outputs, first: {}", failures.len(), failures[0]);
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn a_delayed_rank_still_gets_exact_results() {
    let streams = streams();
    let mut cfg = config(Tuning::default());
    cfg.kernels = vec![sleep_request()];
    let comms = Comm::from_devices_with_config(streams, cfg).expect("set-up with the sleep kernel");
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let kinds = mixed_calls();
    let calls: Vec<Call> = (0..60).map(|i| kinds[(i * 7) % kinds.len()]).collect();
    let mut failures = Vec::new();
    for delayed in [1usize, 0] {
        let mut bufs: Vec<Bufs> = calls.iter().map(|&c| Bufs::new(&comms, c)).collect();
        let inputs: Vec<Vec<Vec<i64>>> = calls.iter().map(|c| c.inputs(&mut rng)).collect();
        for (b, x) in bufs.iter_mut().zip(&inputs) {
            for c in &comms {
                b.upload(c, c.rank(), x);
            }
        }
        for c in &comms {
            c.stream().synchronize().expect("uploads done");
        }
        let t = Instant::now();
        for b in &bufs {
            // The punctual rank first; the delayed one after a host spin, behind a device
            // sleep on its own stream (so it also starts late on the GPU).
            for c in comms.iter().filter(|c| c.rank() != delayed) {
                b.issue(c, c.rank()).unwrap_or_else(|e| panic!("{} rank {}: {e}", b.call.name(), c.rank()));
            }
            let late = &comms[delayed];
            spin(DELAY);
            device_sleep(late, DELAY);
            b.issue(late, delayed).unwrap_or_else(|e| panic!("{} rank {delayed}: {e}", b.call.name()));
        }
        for (b, x) in bufs.iter().zip(&inputs) {
            for c in &comms {
                if let Err(e) = b.check(c, c.rank(), x) {
                    println!("EXEC WRONG delayed rank {delayed}: {e}");
                    failures.push(e);
                }
            }
        }
        println!(
            "EXEC delayed rank {delayed} ({DELAY:?} host spin + {DELAY:?} device sleep before each launch): {} calls in {:?}",
            calls.len(),
            t.elapsed()
        );
    }
    for c in &comms {
        c.async_error().expect("no device error");
    }
    println!("EXEC delayed rank: {} calls, seed {seed}: {} wrong outputs", 2 * calls.len(), failures.len());
    assert!(failures.is_empty(), "{} wrong outputs, first: {}", failures.len(), failures[0]);
}

/// The sleep kernel compiles (NVRTC, no GPU; fails, never skips, without NVRTC: `cargo xtask
/// test` installs it): the delayed-rank test loads it at set-up on the GPU machine, where a
/// compile error would cost a round.
#[test]
fn the_sleep_kernel_compiles() {
    purlin_atom::nvrtc::load().expect("libnvrtc is required (run `cargo xtask test`)");
    for arch in [purlin_atom::Arch::SM80, purlin_atom::Arch::SM90] {
        let cubin = purlin_atom::nvrtc::compile_cubin(&gpu_calls::sleep_unit(), arch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "a CUBIN for {arch}");
    }
}

/// One communicator, calls of several grid widths back to back: plans derived here with
/// different blocks per role (the communicator's own tuning gives one width per regime), run
/// through the conformance launch (src/conformance.rs; the same kernel and workspace as a
/// call), three laps without synchronisation between calls, every output exact. Arrival
/// counters and epochs are shared by calls of different grids (ARCHITECTURE.md, round 5).
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn back_to_back_plans_of_several_grid_widths_on_one_communicator() {
    use Coll::*;
    use ReduceOp::*;
    let comms = Comm::from_devices_with_config(streams(), config(Tuning::default())).expect("set-up");
    let template = call(AllGather, Dt::U8, Sum, 4096).plan(&comms[0]);
    let ws = comms[0].diag().workspace_layout().config;
    let steps: Vec<(Call, Regime, u32)> = vec![
        (call(AllGather, Dt::U8, Sum, 1_000_003), Regime::Throughput, 1),
        (call(AllReduce, Dt::F32, Sum, 300_001), Regime::Throughput, 5),
        (call(ReduceScatter, Dt::Bf16, Max, 4099), Regime::Latency, 3),
        (call(AllToAll, Dt::U8, Sum, 200_000), Regime::Throughput, 2),
        (call(AllReduce, Dt::I32, Sum, 1000), Regime::Latency, 16),
        (call(AllGather, Dt::F32, Sum, 100_000), Regime::Throughput, 8),
    ];
    let plans: Vec<Vec<purlin_snac::Plan>> = steps
        .iter()
        .map(|(c, regime, blocks)| {
            let cfg = purlin_snac::PlanConfig {
                regime: *regime,
                staging_side: purlin_snac::StagingSide::Peer,
                chunk_bytes: 16 * 1024 * u64::from(*blocks),
                blocks_per_role: *blocks,
                slots: 2,
                staging_bytes: ws.staging_bytes as u64,
                window_bytes: ws.window_bytes as u64,
                max_coresident_blocks: template.max_coresident_blocks,
                packet: template.packet,
                in_place: false,
                ..purlin_snac::PlanConfig::default()
            };
            (0..comms.len() as u32)
                .map(|r| purlin_snac::derive_rank(&c.spec(), &cfg, r).unwrap_or_else(|e| panic!("{}: {e}", c.name())))
                .collect()
        })
        .collect();
    let grids: BTreeSet<usize> = plans.iter().flatten().map(|p| p.grid()).collect();
    for ((c, regime, blocks), p) in steps.iter().zip(&plans) {
        println!("EXEC   plan {:<40} {regime:?} {blocks} blocks per role: grid {}", c.name(), p[0].grid());
    }
    assert!(grids.len() >= 3, "the sequence must use 3+ grid widths: {grids:?}");
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let mut bufs: Vec<Bufs> = steps.iter().map(|(c, _, _)| Bufs::new(&comms, *c)).collect();
    let mut failures = Vec::new();
    for lap in 0..3 {
        let inputs: Vec<Vec<Vec<i64>>> = steps.iter().map(|(c, _, _)| c.inputs(&mut rng)).collect();
        for (b, x) in bufs.iter_mut().zip(&inputs) {
            for c in &comms {
                b.upload(c, c.rank(), x);
            }
        }
        let mut launches = Vec::new();
        for (b, p) in bufs.iter_mut().zip(&plans) {
            for c in &comms {
                let r = c.rank();
                let (send, recv) = (&b.send[r], &mut b.recv[r]);
                let l = c.launch_plan_for_conformance(&p[r], send, recv);
                launches.push(l.unwrap_or_else(|e| panic!("{} rank {r}: {e}", b.call.name())));
            }
        }
        for l in launches {
            l.trace().unwrap_or_else(|e| panic!("lap {lap}: {e}"));
        }
        for (b, x) in bufs.iter().zip(&inputs) {
            for c in &comms {
                if let Err(e) = b.check(c, c.rank(), x) {
                    println!("EXEC WRONG grid widths lap {lap}: {e}");
                    failures.push(e);
                }
            }
        }
    }
    println!(
        "EXEC back-to-back grid widths {grids:?} on one communicator: 3 laps of {} calls (seed {seed}): {} wrong outputs",
        steps.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{} wrong outputs, first: {}", failures.len(), failures[0]);
}
