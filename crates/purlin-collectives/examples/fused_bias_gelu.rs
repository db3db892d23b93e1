//! A fused kernel: bias + GeLU, then an AllReduce of the result, in one launch
//! (`examples/fused/bias_gelu_all_reduce.cu`), on two ranks.
//!
//! ```text
//! cargo run --release -p purlin-collectives --example fused_bias_gelu
//! ```
//!
//! Checked two ways on every rank: bit for bit against the unfused pair (a GeLU kernel, then
//! `Comm::all_reduce`) and against a host reference in f64. It prints both pairs' time per
//! iteration; with both ranks on one GPU that is a check that it runs, not a speed figure.

#[path = "fused/common.rs"]
mod common;

use std::process::ExitCode;

use anyhow::{Result, bail};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use purlin_collectives::{Call, FusedKernel, ReduceOp};

const SOURCE: &str = include_str!("fused/bias_gelu_all_reduce.cu");
const ROWS: usize = 256;
const COLS: usize = 1024;
const N: usize = ROWS * COLS;
const ITERS: u32 = 50;

fn x_of(rank: usize) -> Vec<f32> {
    (0..N).map(|i| ((i * 7 + rank * 13) % 97) as f32 / 48.5 - 1.0).collect()
}

fn bias() -> Vec<f32> {
    (0..COLS).map(|j| (j % 11) as f32 / 10.0 - 0.5).collect()
}

fn gelu(v: f64) -> f64 {
    0.5 * v * (1.0 + (0.7978845608028654 * (v + 0.044715 * v * v * v)).tanh())
}

/// One rank's buffers: the fused form's inputs and y (x, bias, y), its outputs (`outs`, borrowed
/// by the prepared calls), and the unfused pair's y and output.
struct Inputs {
    x: CudaSlice<f32>,
    bias: CudaSlice<f32>,
    y: CudaSlice<f32>,
}

struct Twin {
    y: CudaSlice<f32>,
    out: CudaSlice<f32>,
}

fn main() -> Result<ExitCode> {
    let comms = common::two_ranks()?;
    let world = comms.len();
    let ins = comms
        .iter()
        .map(|c| {
            let s = c.stream();
            Ok(Inputs { x: s.clone_htod(&x_of(c.rank()))?, bias: s.clone_htod(&bias())?, y: s.alloc_zeros(N)? })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut outs = comms.iter().map(|c| Ok(c.stream().alloc_zeros::<f32>(N)?)).collect::<Result<Vec<_>>>()?;
    let mut twins = comms
        .iter()
        .map(|c| Ok(Twin { y: c.stream().alloc_zeros(N)?, out: c.stream().alloc_zeros(N)? }))
        .collect::<Result<Vec<_>>>()?;
    let (n, cols) = (N as u64, COLS as u64);
    // Prepare and compile every rank's call before any launch: a module load may wait for the
    // GPU, which must not happen while one rank's kernel waits for the other's launch.
    let mut calls = vec![];
    let mut kernels = vec![];
    for ((comm, i), out) in comms.iter().zip(&ins).zip(outs.iter_mut()) {
        let call = comm.prepare(Call::AllReduce { len: N, op: ReduceOp::Sum }, &i.y, out)?;
        kernels.push(FusedKernel::compile(&call, SOURCE, "bias_gelu_all_reduce")?);
        calls.push(call);
    }
    let unfused: Vec<_> = kernels.iter().map(|k| k.sibling("bias_gelu_only")).collect::<Result<_, _>>()?;
    let grid = kernels[0].max_blocks(&calls[0], calls[0].smem_bytes())?.min(calls[0].blocks().max(16));
    println!(
        "fused call: {} contracted blocks of {} threads, {} bytes of shared memory; grid {grid}",
        calls[0].blocks(),
        calls[0].threads(),
        calls[0].smem_bytes()
    );
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (calls[0].threads(), 1, 1),
        shared_mem_bytes: calls[0].smem_bytes(),
    };
    let fused_step = |calls: &[purlin_collectives::FusedCall<'_>]| -> Result<()> {
        for ((call, kernel), i) in calls.iter().zip(&kernels).zip(&ins) {
            let args = call.launch_args()?;
            let mut launch = kernel.launch_builder(call, &args);
            launch.arg(&i.x).arg(&i.bias).arg(&i.y).arg(&n).arg(&cols);
            // SAFETY: the arguments match bias_gelu_all_reduce's parameters; the kernel keeps the
            // contract (every block computes y, a grid barrier, then blocks 0..call.blocks run
            // the collective once); x, bias and y live until the streams are synchronised.
            unsafe { launch.launch(cfg) }?;
        }
        Ok(())
    };
    fused_step(&calls)?;
    drop(calls);
    // The unfused pair: the same GeLU, then Comm::all_reduce.
    let unfused_step = |twins: &mut [Twin]| -> Result<()> {
        for (((comm, i), t), f) in comms.iter().zip(&ins).zip(twins.iter_mut()).zip(&unfused) {
            let stream = comm.stream();
            let mut l = stream.launch_builder(f);
            l.arg(&i.x).arg(&i.bias).arg(&mut t.y).arg(&n).arg(&cols);
            // SAFETY: bias_gelu_only(const float*, const float*, float*, u64, u64) over N elements.
            unsafe { l.launch(cfg_plain(grid, cfg.block_dim.0)) }?;
            comm.all_reduce(&t.y, &mut t.out, &ReduceOp::Sum)?;
        }
        Ok(())
    };
    unfused_step(&mut twins)?;
    let mut reference = vec![0f64; N];
    let b = bias();
    for rank in 0..world {
        for (i, (acc, x)) in reference.iter_mut().zip(x_of(rank)).enumerate() {
            *acc += gelu(f64::from(x) + f64::from(b[i % COLS]));
        }
    }
    let mut bad = 0;
    for ((comm, out), t) in comms.iter().zip(&outs).zip(&twins) {
        let s = comm.stream();
        let (out, out2) = (s.clone_dtoh(out)?, s.clone_dtoh(&t.out)?);
        comm.async_error()?;
        let (bits, off) = (common::bits_differ(&out, &out2), common::off_reference(&out, &reference));
        println!("rank {}: {bits} elements differ from the unfused pair, {off} from the f64 reference", comm.rank());
        bad += bits + off;
    }
    // Time per iteration of each form (every rank's launches per iteration).
    let mut calls = vec![];
    for ((comm, i), out) in comms.iter().zip(&ins).zip(outs.iter_mut()) {
        calls.push(comm.prepare(Call::AllReduce { len: N, op: ReduceOp::Sum }, &i.y, out)?);
    }
    let fused_us = common::time_us(&comms, ITERS, || fused_step(&calls))?;
    drop(calls);
    let unfused_us = common::time_us(&comms, ITERS, || unfused_step(&mut twins))?;
    println!("{N} f32, {ITERS} iterations: fused {fused_us:.1} us, unfused pair {unfused_us:.1} us per iteration");
    if bad > 0 {
        bail!("{bad} wrong elements");
    }
    println!("check: OK (every element of every rank)");
    Ok(ExitCode::SUCCESS)
}

fn cfg_plain(grid: u32, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}
