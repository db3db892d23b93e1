//! A fused kernel: an AllGather of row shards with its consumer, `out[r] = dot(row r, w)` for
//! every row of the gathered matrix, in one launch (`examples/fused/gather_consume.cu`): the
//! blocks beyond the contracted ones consume this rank's own rows while the gather runs, then
//! every block consumes each peer's rows as soon as that peer's shard has landed
//! (`purlin::wait_shard`).
//!
//! ```text
//! cargo run --release -p purlin-collectives --example fused_gather_consume
//! ```
//!
//! Checked bit for bit against the unfused pair (`Comm::all_gather`, then a consumer kernel)
//! and against a host reference in f64, on every rank; both pairs' time per iteration is
//! printed (with both ranks on one GPU: a check that it runs, not a speed figure).

#[path = "fused/common.rs"]
mod common;

use std::process::ExitCode;

use anyhow::{Result, bail};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use purlin_collectives::{Call, Comm, FusedCall, FusedKernel};

const SOURCE: &str = include_str!("fused/gather_consume.cu");
const ROWS_PER_RANK: usize = 64;
const COLS: usize = 2048;
const SHARD: usize = ROWS_PER_RANK * COLS;
const ITERS: u32 = 50;

fn shard_of(rank: usize) -> Vec<f32> {
    (0..SHARD).map(|i| ((i * 5 + rank * 31) % 89) as f32 / 44.5 - 1.0).collect()
}

fn weights() -> Vec<f32> {
    (0..COLS).map(|j| ((j * 3) % 17) as f32 / 8.0 - 1.0).collect()
}

/// One rank's buffers: its shard, the weights, the consumer's output (both forms), and the
/// unfused pair's gathered matrix.
struct Inputs {
    shard: CudaSlice<f32>,
    w: CudaSlice<f32>,
    out: CudaSlice<f32>,
    twin_gathered: CudaSlice<f32>,
    twin_out: CudaSlice<f32>,
}

fn main() -> Result<ExitCode> {
    let comms = common::two_ranks()?;
    let world = comms.len();
    let rows = world * ROWS_PER_RANK;
    let mut ins = comms
        .iter()
        .map(|c| {
            let s = c.stream();
            Ok(Inputs {
                shard: s.clone_htod(&shard_of(c.rank()))?,
                w: s.clone_htod(&weights())?,
                out: s.alloc_zeros(rows)?,
                twin_gathered: s.alloc_zeros(world * SHARD)?,
                twin_out: s.alloc_zeros(rows)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut gathered =
        comms.iter().map(|c| Ok(c.stream().alloc_zeros::<f32>(world * SHARD)?)).collect::<Result<Vec<_>>>()?;
    // Prepare and compile every rank's call before any launch (a module load may wait for the
    // GPU, which must not happen while one rank's kernel waits for the other's launch).
    let calls = prepare(&comms, &mut gathered, &ins)?;
    let kernels =
        calls.iter().map(|c| FusedKernel::compile(c, SOURCE, "gather_consume")).collect::<Result<Vec<_>, _>>()?;
    let consumers = kernels.iter().map(|k| k.sibling("consume_all")).collect::<Result<Vec<_>, _>>()?;
    let blocks = calls[0].blocks();
    let grid = kernels[0].max_blocks(&calls[0], calls[0].smem_bytes())?.min(blocks + 8);
    println!(
        "fused call: {blocks} contracted blocks of {} threads; grid {grid} ({} consume this rank's rows during the gather)",
        calls[0].threads(),
        grid - blocks
    );
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (calls[0].threads(), 1, 1),
        shared_mem_bytes: calls[0].smem_bytes(),
    };
    let (rpr, cols, w32) = (ROWS_PER_RANK as u32, COLS as u32, world as u32);
    let fused_step = |calls: &[FusedCall<'_>], ins: &[Inputs]| -> Result<()> {
        for (((comm, call), kernel), i) in comms.iter().zip(calls).zip(&kernels).zip(ins) {
            let args = call.launch_args()?;
            let gathered_at = call.output_address();
            let rank = comm.rank() as u32;
            let mut launch = kernel.launch_builder(call, &args);
            launch.arg(&i.shard).arg(&gathered_at).arg(&i.w).arg(&i.out).arg(&rpr).arg(&cols).arg(&rank).arg(&w32);
            // SAFETY: the arguments match gather_consume's parameters; the kernel keeps the
            // contract (blocks 0..call.blocks run the gather once, the others read only the
            // input; a peer's gathered rows are read after wait_shard); the buffers live until
            // the streams are synchronised.
            unsafe { launch.launch(cfg) }?;
        }
        Ok(())
    };
    fused_step(&calls, &ins)?;
    drop(calls);
    let rows32 = rows as u32;
    let unfused_step = |ins: &mut [Inputs]| -> Result<()> {
        for ((comm, i), f) in comms.iter().zip(ins.iter_mut()).zip(&consumers) {
            comm.all_gather(&i.shard, &mut i.twin_gathered)?;
            let stream = comm.stream();
            let mut l = stream.launch_builder(f);
            l.arg(&i.twin_gathered).arg(&i.w).arg(&mut i.twin_out).arg(&rows32).arg(&cols);
            // SAFETY: consume_all(const float*, const float*, float*, u32, u32) over `rows` rows
            // of COLS, with the fused kernel's block size (so its sums round alike).
            unsafe { l.launch(cfg_plain(grid, cfg.block_dim.0)) }?;
        }
        Ok(())
    };
    unfused_step(&mut ins)?;
    let w = weights();
    let reference: Vec<f64> = (0..world)
        .flat_map(|q| {
            let shard = shard_of(q);
            let w = &w;
            (0..ROWS_PER_RANK).map(move |r| {
                shard[r * COLS..(r + 1) * COLS].iter().zip(w).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum()
            })
        })
        .collect();
    let mut bad = 0;
    for ((comm, i), g) in comms.iter().zip(&ins).zip(&gathered) {
        let s = comm.stream();
        let (out, twin) = (s.clone_dtoh(&i.out)?, s.clone_dtoh(&i.twin_out)?);
        let (g, twin_g) = (s.clone_dtoh(g)?, s.clone_dtoh(&i.twin_gathered)?);
        comm.async_error()?;
        let expected_g: Vec<f64> = (0..world).flat_map(shard_of).map(f64::from).collect();
        let (bits, off) = (common::bits_differ(&out, &twin), common::off_reference(&out, &reference));
        let gather_off = common::off_reference(&g, &expected_g) + common::bits_differ(&g, &twin_g);
        println!(
            "rank {}: gathered matrix {gather_off} wrong; consumer output {bits} differ from the unfused pair, {off} from the f64 reference",
            comm.rank()
        );
        bad += bits + off + gather_off;
    }
    let calls = prepare(&comms, &mut gathered, &ins)?;
    let fused_us = common::time_us(&comms, ITERS, || fused_step(&calls, &ins))?;
    drop(calls);
    let unfused_us = common::time_us(&comms, ITERS, || unfused_step(&mut ins))?;
    println!(
        "{world} x {SHARD} f32 gathered, {rows} rows consumed, {ITERS} iterations: fused {fused_us:.1} us, unfused pair {unfused_us:.1} us per iteration"
    );
    if bad > 0 {
        bail!("{bad} wrong elements");
    }
    println!("check: OK (every element of every rank)");
    Ok(ExitCode::SUCCESS)
}

/// Every rank's AllGather of its shard into its `gathered`, prepared for the fused kernel.
fn prepare<'b>(comms: &'b [Comm], gathered: &'b mut [CudaSlice<f32>], ins: &'b [Inputs]) -> Result<Vec<FusedCall<'b>>> {
    let mut calls = vec![];
    for ((comm, i), g) in comms.iter().zip(ins).zip(gathered.iter_mut()) {
        calls.push(comm.prepare(Call::AllGather { len: SHARD }, &i.shard, g)?);
    }
    Ok(calls)
}

fn cfg_plain(grid: u32, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}
