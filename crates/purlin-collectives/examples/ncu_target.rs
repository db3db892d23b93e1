//! Calls for Nsight Compute to profile while their peer runs: per-instruction profiles of
//! the executor (issue 11), which a benchmark under `ncu` cannot give.
//!
//! ```text
//! ncu --profile-from-start off -k regex:purlin_snac ... ./ncu_target \
//!     [--collective all-reduce|all-gather|reduce-scatter|all-to-all] [--bytes 65536] \
//!     [--symmetric] [--warm 20] [--profiled 3] [--stagger-ms 50]
//! ```
//!
//! Why: `ncu` holds back every other launch while it profiles one kernel, so a collective
//! kernel whose peer launches after it waits out the device timeout, and its profile shows a
//! spin loop (round 116: of three kernels profiled in a benchmark run, two waited 20 s).
//! Here both ranks run in one process from one host thread (two GPUs, or
//! `PURLIN_SHARED_GPU=1` and one). For each profiled call rank 1 launches first; after
//! `--stagger-ms` of host time, its kernel resident and waiting, the profiler starts
//! (`cuProfilerStart`), rank 0 launches, rank 0's stream is synchronized and the profiler
//! stops. So only rank 0's kernels are profiled, each beside a peer already running. `--warm`
//! calls through the same API run first, unprofiled. Every call's output is checked against
//! a host reduction. `PURLIN_DEVICE_PARAMS_MAX_BYTES=0` makes these eager calls take the
//! by-value entry point that CUDA graphs use. The last line starts with `NCU_TARGET`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use purlin_collectives::ReduceOp;
use purlin_collectives::{Comm, CommConfig};

const WORLD: usize = 2;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

struct Rank<B> {
    comm: Comm,
    stream: Arc<CudaStream>,
    input: B,
    output: B,
    expected: Vec<f32>,
}

/// One call of `collective` on rank `r` (launched, not waited for).
fn launch<B: DevicePtr<f32> + DevicePtrMut<f32>>(collective: &str, r: &mut Rank<B>) -> Result<()> {
    r.comm.context().bind_to_thread()?;
    match collective {
        "all-reduce" => r.comm.all_reduce(&r.input, &mut r.output, &ReduceOp::Sum)?,
        "all-gather" => r.comm.all_gather(&r.input, &mut r.output)?,
        "reduce-scatter" => r.comm.reduce_scatter(&r.input, &mut r.output, &ReduceOp::Sum)?,
        _ => r.comm.all_to_all(&r.input, &mut r.output)?,
    };
    Ok(())
}

/// Checks every rank's output, then zeroes it for the next call.
fn check<B: DevicePtr<f32> + DevicePtrMut<f32>>(ranks: &mut [Rank<B>], call: usize) -> Result<()> {
    for r in ranks.iter_mut() {
        r.comm.context().bind_to_thread()?;
        let got = r.stream.clone_dtoh(&r.output)?;
        let wrong = got.iter().zip(&r.expected).filter(|(a, b)| a != b).count();
        if wrong > 0 {
            bail!("rank {}: {wrong} wrong elements after call {call}", r.comm.rank());
        }
        r.stream.memset_zeros(&mut r.output)?;
    }
    Ok(())
}

struct Run {
    collective: String,
    warm: usize,
    profiled: usize,
    stagger: Duration,
}

fn run<B: DevicePtr<f32> + DevicePtrMut<f32>>(ranks: &mut [Rank<B>], run: &Run) -> Result<()> {
    let c = run.collective.as_str();
    for call in 0..run.warm {
        for r in ranks.iter_mut() {
            launch(c, r)?;
        }
        check(ranks, call)?;
    }
    for call in run.warm..run.warm + run.profiled {
        let (first, rest) = ranks.split_first_mut().context("no ranks")?;
        for r in rest.iter_mut() {
            launch(c, r)?;
        }
        std::thread::sleep(run.stagger);
        first.comm.context().bind_to_thread()?;
        cudarc::driver::profiler_start()?;
        launch(c, first)?;
        first.stream.synchronize()?;
        cudarc::driver::profiler_stop()?;
        check(ranks, call)?;
    }
    Ok(())
}

fn main() -> Result<()> {
    purlin_log::init()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let collective = arg(&args, "--collective").unwrap_or_else(|| "all-reduce".into());
    let bytes: u64 = arg(&args, "--bytes").map_or(Ok(65536), |s| s.parse()).context("--bytes")?;
    let warm = arg(&args, "--warm").map_or(Ok(20), |s| s.parse()).context("--warm")?;
    let profiled = arg(&args, "--profiled").map_or(Ok(3), |s| s.parse()).context("--profiled")?;
    let stagger_ms: u64 = arg(&args, "--stagger-ms").map_or(Ok(50), |s| s.parse()).context("--stagger-ms")?;
    let symmetric = args.iter().any(|a| a == "--symmetric");
    let config = CommConfig::from_env()?;
    let ordinals = if config.shared_gpu { [0, 0] } else { [0, 1] };
    let gpus = if purlin_collectives::driver_present() { purlin_collectives::device_count() } else { 0 };
    if gpus <= ordinals[1] {
        bail!("ncu_target needs 2 GPUs (or PURLIN_SHARED_GPU=1 and one)");
    }
    // Sizes as purlin-bench counts them: `bytes` is the larger buffer; f32 elements.
    let big = (bytes / 4) as usize;
    let (in_count, out_count) = match collective.as_str() {
        "all-reduce" | "all-to-all" => (big, big),
        "all-gather" => (big / WORLD, big),
        "reduce-scatter" => (big, big / WORLD),
        other => bail!("--collective {other}: all-reduce, all-gather, reduce-scatter or all-to-all"),
    };
    if in_count == 0 || out_count == 0 || big % WORLD != 0 {
        bail!("--bytes {bytes}: needs a multiple of {} bytes", 4 * WORLD);
    }
    // Small integers: every sum is exact whatever the order.
    let inputs: Vec<Vec<f32>> =
        (0..WORLD).map(|r| (0..in_count).map(|i| ((i * 7 + r * 3) % 64) as f32).collect()).collect();
    let expected = |rank: usize| -> Vec<f32> {
        let shard = big / WORLD;
        match collective.as_str() {
            "all-reduce" => (0..big).map(|i| inputs[0][i] + inputs[1][i]).collect(),
            "all-gather" => inputs.concat(),
            "reduce-scatter" => (rank * shard..(rank + 1) * shard).map(|i| inputs[0][i] + inputs[1][i]).collect(),
            // Block p of rank r's output is block r of rank p's input.
            _ => (0..WORLD).flat_map(|p| inputs[p][rank * shard..(rank + 1) * shard].iter().copied()).collect(),
        }
    };
    let streams = ordinals.iter().map(|&d| Ok(CudaContext::new(d)?.new_stream()?)).collect::<Result<Vec<_>>>()?;
    let comms = Comm::from_devices_with_config(streams, config)?;
    let setup = Run { collective: collective.clone(), warm, profiled, stagger: Duration::from_millis(stagger_ms) };
    if symmetric {
        // One-copy plans: input and output are symmetric buffers.
        let ins = Comm::alloc_symmetric_group::<f32>(&comms, in_count)?;
        let outs = Comm::alloc_symmetric_group::<f32>(&comms, out_count)?;
        let mut ranks = Vec::new();
        for (rank, ((comm, mut input), output)) in comms.into_iter().zip(ins).zip(outs).enumerate() {
            let stream = comm.stream();
            comm.context().bind_to_thread()?;
            stream.memcpy_htod(&inputs[rank], &mut input)?;
            ranks.push(Rank { comm, stream, input, output, expected: expected(rank) });
        }
        let result = run(&mut ranks, &setup);
        // Freed together before the communicators close.
        let (mut comms, mut ins, mut outs) = (Vec::new(), Vec::new(), Vec::new());
        for r in ranks {
            comms.push(r.comm);
            ins.push(r.input);
            outs.push(r.output);
        }
        Comm::free_symmetric_group(&comms, outs)?;
        Comm::free_symmetric_group(&comms, ins)?;
        result?;
    } else {
        let mut ranks = Vec::new();
        for (rank, comm) in comms.into_iter().enumerate() {
            let stream = comm.stream();
            comm.context().bind_to_thread()?;
            let input = stream.clone_htod(&inputs[rank])?;
            let output = stream.alloc_zeros::<f32>(out_count)?;
            ranks.push(Rank { comm, stream, input, output, expected: expected(rank) });
        }
        run(&mut ranks, &setup)?;
    }
    println!(
        "NCU_TARGET ok: {collective} {bytes} bytes{}, {warm} warm + {profiled} profiled calls (rank 0's kernels, peer launched {stagger_ms} ms earlier), every output checked",
        if symmetric { " symmetric" } else { "" }
    );
    Ok(())
}
