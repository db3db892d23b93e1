//! The host-side launch path, per call.
//!
//! - **Plan derivation**: `tuning::plan_for`, what `CpuComm` runs on every call and `Comm`
//!   on the first call of each spec (then cached), at the GPU workspace's and the host's
//!   limits, latency and throughput regimes.
//! - **Plan lookup**: `cpu::verified` on a warm key, the verdict cache every `CpuComm` call
//!   consults (only verified plans run).
//! - **Argument validation**: the spec's checks (`validate`, `check_buffers`) and a
//!   `CpuComm` call refused for a wrong buffer length (a typed error before any side effect).
//! - **One call**: a whole `CpuComm` all-reduce (world 2, threads), and on GPUs the host-side
//!   cost of one `Comm::all_reduce` (validation, plan lookup, parameter block, launch; the
//!   kernels run asynchronously and are waited for outside the timing). Skipped, saying so,
//!   without two GPUs.
//! - What `purlin-bench` itself does around every call: argument parsing once, the case
//!   layout per size, the host check per call.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use purlin_benches::cli;
use purlin_benches::spec::{Case, Collective, Dtype, Op};
use purlin_collectives::internal::tuning::{PlanLimits, Tuning, plan_config, plan_for};
use purlin_collectives::snac::{CollectiveSpec, DataType, PacketFormat, ReduceOp as SnacOp};
use purlin_collectives::{CpuComm, CpuConfig, ReduceOp};

/// The GPU communicator's limits with the default workspace (16 MiB staging, 4 MiB window)
/// on an H200 (132 SMs, 2 executor blocks per SM co-resident) with 16-byte packets.
fn gpu_limits() -> PlanLimits {
    PlanLimits {
        staging_bytes: 16 << 20,
        window_bytes: 4 << 20,
        max_coresident_blocks: 264,
        packet: PacketFormat::B16,
        flag_words: 4096,
        peer_outputs: false,
        peer_inputs: false,
        copy_engine: false,
        landed: false,
    }
}

fn specs() -> Vec<(&'static str, CollectiveSpec)> {
    let a2av: Vec<Vec<u64>> = (0..8u64).map(|p| (0..8u64).map(|q| 1024 + 512 * ((p + q) % 4)).collect()).collect();
    vec![
        ("all_reduce_8B_w2", CollectiveSpec::all_reduce(2, DataType::F32, SnacOp::Sum, 2)),
        ("all_reduce_64MiB_w2", CollectiveSpec::all_reduce(2, DataType::F32, SnacOp::Sum, 16 << 20)),
        ("all_gather_1MiB_w8", CollectiveSpec::all_gather(8, DataType::Bf16, 64 << 10)),
        ("all_to_all_v_w8", CollectiveSpec::all_to_all_v(8, DataType::F32, a2av)),
    ]
}

fn plan_derivation(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan_derivation_per_call");
    let host = CpuConfig::default();
    for (name, spec) in specs() {
        let (t, l) = (Tuning::default(), gpu_limits());
        if plan_for(&spec, 0, false, &t, &l).is_ok() {
            g.bench_function(format!("gpu_limits/{name}"), |b| {
                b.iter(|| plan_for(black_box(&spec), 0, false, &t, &l).map(|p| p.grid()))
            });
        } else {
            eprintln!("plan_derivation: {name} has no plan at the GPU limits; skipped");
        }
        let (t, l) = (host.tuning, host.limits());
        if plan_for(&spec, 0, false, &t, &l).is_ok() {
            g.bench_function(format!("host_limits/{name}"), |b| {
                b.iter(|| plan_for(black_box(&spec), 0, false, &t, &l).map(|p| p.grid()))
            });
        } else {
            eprintln!("plan_derivation: {name} has no plan at the host limits; skipped");
        }
    }
    g.finish();
}

fn plan_lookup(c: &mut Criterion) {
    let host = CpuConfig::default();
    let mut g = c.benchmark_group("plan_lookup_per_call");
    for (name, spec) in specs().into_iter().take(2) {
        let cfg = plan_config(&spec, false, &host.tuning, &host.limits());
        // The first lookup verifies the plan set (once per key per process); later ones hit
        // the cache, as every call after a communicator's first of that shape does.
        if let Err(e) = purlin_collectives::internal::verified::verified(&spec, &cfg, &host.verify) {
            eprintln!("plan_lookup: {name}: {e}; skipped");
            continue;
        }
        g.bench_function(format!("cpu_verified_warm/{name}"), |b| {
            b.iter(|| {
                purlin_collectives::internal::verified::verified(black_box(&spec), &cfg, &host.verify)
                    .map(|v| v.plans.len())
            })
        });
    }
    g.finish();
}

fn argument_validation(c: &mut Criterion) {
    let mut g = c.benchmark_group("argument_validation_per_call");
    for (name, spec) in specs() {
        let es = spec.dtype.size();
        let (i, o) = (spec.input_bytes(0) / es, spec.output_bytes(0) / es);
        // The accepted path: what every valid call pays.
        assert!(spec.validate().and_then(|()| spec.check_buffers(0, i, o)).is_ok(), "{name} must be valid");
        g.bench_function(format!("spec_validate_and_check_buffers/{name}"), |b| {
            b.iter(|| black_box(&spec).validate().and_then(|()| spec.check_buffers(0, black_box(i), o)).is_ok())
        });
    }
    // A call the communicator refuses (output one element short): the whole path up to the
    // typed error, which comes before any side effect and any peer is involved.
    match CpuComm::threads(2) {
        Ok(comms) => {
            let send = vec![1.0f32; 1024];
            let mut recv = vec![0.0f32; 1023];
            assert!(comms[0].all_reduce(&send, &mut recv, &ReduceOp::Sum).is_err(), "a short output must be refused");
            g.bench_function("cpu_comm_refuses_a_short_output", |b| {
                b.iter(|| comms[0].all_reduce(black_box(&send), &mut recv, &ReduceOp::Sum).is_err())
            });
        }
        Err(e) => eprintln!("CpuComm::threads(2): {e}; skipping cpu_comm_refuses_a_short_output"),
    }
    g.finish();
    let argv: Vec<String> =
        "--collective all-reduce,all-to-all-v --dtype bf16 --op sum --min 8 --max 1G --mode both --iters 20 --skew 1.2"
            .split_whitespace()
            .map(String::from)
            .collect();
    c.bench_function("bench_args_parse_and_validate", |b| b.iter(|| cli::parse(black_box(&argv)).is_ok()));
}

/// `iters` all-reduces on both ranks of a world-2 host communicator; returns rank 0's time.
fn host_calls(comms: &[CpuComm], elems: usize, iters: u64) -> Duration {
    let send = vec![1.0f32; elems];
    std::thread::scope(|s| {
        let peer = s.spawn(|| {
            let mut recv = vec![0.0f32; elems];
            for _ in 0..iters {
                if let Err(e) = comms[1].all_reduce(&send, &mut recv, &ReduceOp::Sum) {
                    panic!("rank 1: {e}");
                }
            }
        });
        let mut recv = vec![0.0f32; elems];
        let t0 = Instant::now();
        for _ in 0..iters {
            if let Err(e) = comms[0].all_reduce(&send, &mut recv, &ReduceOp::Sum) {
                panic!("rank 0: {e}");
            }
        }
        let t = t0.elapsed();
        if peer.join().is_err() {
            panic!("rank 1 failed");
        }
        assert!(recv.iter().all(|&x| x == 2.0), "wrong all-reduce result");
        t
    })
}

fn host_executor_call(c: &mut Criterion) {
    let comms = match CpuComm::threads(2) {
        Ok(c) => c,
        Err(e) => return eprintln!("CpuComm::threads(2): {e}; skipping host_executor_call"),
    };
    let mut g = c.benchmark_group("host_executor_call");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    for (name, elems) in [("all_reduce_8B_w2", 2usize), ("all_reduce_64KiB_w2", 16 << 10)] {
        host_calls(&comms, elems, 1); // plans verified, outside the timing
        g.bench_function(name, |b| b.iter_custom(|iters| host_calls(&comms, elems, iters)));
    }
    g.finish();
}

fn case_layout(c: &mut Criterion) {
    c.bench_function("case_layout_all_to_all_v_world8", |b| {
        b.iter(|| {
            let case =
                Case::new(Collective::AllToAllV, Dtype::F32, Op::Sum, 8, black_box(1 << 20), 1.0, 1).expect("case");
            (0..8).map(|r| case.segments(r).len() + case.out_count(r)).sum::<usize>()
        })
    });
}

fn host_check(c: &mut Criterion) {
    let case = Case::new(Collective::AllReduce, Dtype::Bf16, Op::Sum, 2, 1 << 20, 0.0, 1).expect("case");
    let expected = case.expected(0);
    let got = expected.clone();
    c.bench_function("check_1MiB_bf16", |b| b.iter(|| case.count_wrong(black_box(&got), &expected).count));
    c.bench_function("inputs_and_expected_1MiB_bf16", |b| b.iter(|| (case.input(0).len(), case.expected(0).len())));
}

/// The host-side cost of one `Comm::all_reduce` per rank (1 KiB f32, every visible GPU up to
/// 8, one process): each iteration enqueues one call on every rank; batches of 32 are then
/// waited for, outside the timing, so the launch queue never fills.
fn purlin_call_host_cost(c: &mut Criterion) {
    let n = if purlin_topo::driver_present() { purlin_topo::device_count().min(8) } else { 0 };
    if n < 2 {
        eprintln!("purlin_all_reduce_host_cost: needs 2 GPUs, found {n}; skipped");
        return;
    }
    let setup = || -> Result<_, String> {
        let mut streams = Vec::with_capacity(n);
        for i in 0..n {
            let ctx = cudarc::driver::CudaContext::new(i).map_err(|e| format!("GPU {i}: {e}"))?;
            streams.push(ctx.new_stream().map_err(|e| format!("GPU {i} stream: {e}"))?);
        }
        let comms =
            purlin_collectives::Comm::from_devices(streams.clone()).map_err(|e| format!("Comm::from_devices: {e}"))?;
        let mut bufs = Vec::with_capacity(n);
        for s in &streams {
            let send = s.alloc_zeros::<f32>(256).map_err(|e| format!("alloc: {e}"))?;
            let recv = s.alloc_zeros::<f32>(256).map_err(|e| format!("alloc: {e}"))?;
            bufs.push((send, recv));
        }
        Ok((streams, comms, bufs))
    };
    let (streams, comms, mut bufs) = match setup() {
        Ok(x) => x,
        Err(e) => return eprintln!("purlin_all_reduce_host_cost: {e}; skipped"),
    };
    let sync = |streams: &[std::sync::Arc<cudarc::driver::CudaStream>]| {
        for s in streams {
            if let Err(e) = s.synchronize() {
                panic!("synchronize: {e}");
            }
        }
    };
    // One call on every rank first: it derives and caches the plan, and must succeed.
    for (comm, (send, recv)) in comms.iter().zip(bufs.iter_mut()) {
        if let Err(e) = comm.all_reduce(send, recv, &ReduceOp::Sum) {
            return eprintln!("purlin_all_reduce_host_cost: the first call failed: {e}; skipped");
        }
    }
    sync(&streams);
    c.bench_function(&format!("purlin_all_reduce_1KiB_host_cost_per_rank_w{n}"), |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let k = left.min(32);
                let t0 = Instant::now();
                for _ in 0..k {
                    for (comm, (send, recv)) in comms.iter().zip(bufs.iter_mut()) {
                        if let Err(e) = comm.all_reduce(send, recv, &ReduceOp::Sum) {
                            panic!("all_reduce: {e}");
                        }
                    }
                }
                timed += t0.elapsed();
                sync(&streams);
                left -= k;
            }
            timed / n as u32
        })
    });
}

criterion_group!(
    benches,
    plan_derivation,
    plan_lookup,
    argument_validation,
    host_executor_call,
    case_layout,
    host_check,
    purlin_call_host_cost
);
criterion_main!(benches);
