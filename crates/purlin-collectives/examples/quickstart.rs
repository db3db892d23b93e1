//! Purlin in one page: an AllReduce and an AllGather, checked and printed, wherever it runs.
//!
//! ```text
//! cargo run --release -p purlin-collectives --example quickstart          # all local GPUs
//! python3 -m torch.distributed.run --no-python --nproc-per-node 2 ./quickstart  # one process per GPU
//! ```
//!
//! - Under torchrun (`RANK` and `WORLD_SIZE` set): `Comm::from_env()`, one process per GPU.
//! - Otherwise, with 2 or more GPUs: `Comm::from_devices(streams)`, every local GPU driven
//!   from this one process.
//! - With one GPU and `PURLIN_SHARED_GPU=1`: two ranks share it (`Comm::from_devices` on two
//!   streams of GPU 0), a correctness check, not a speed one.
//! - Without GPUs (or with one, unshared): the host executor, `CpuComm` (the same verified
//!   SNAC plans the GPUs run, on CPU threads), and it says so.
//!
//! Every rank contributes `i + rank` at element `i` of the AllReduce and 8 copies of its rank
//! to the AllGather; the sums are small integers, so the check is exact.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaContext, CudaSlice};
use purlin_collectives::{Comm, CommConfig, CpuComm, CpuConfig, ReduceOp};

/// AllReduce elements.
const N: usize = 4096;
/// AllGather elements per rank.
const PER_RANK: usize = 8;
/// Ranks of the host executor.
const HOST_WORLD: usize = 4;

/// This rank's AllReduce input and AllGather contribution.
fn inputs(rank: usize) -> (Vec<f32>, Vec<f32>) {
    ((0..N).map(|i| (i + rank) as f32).collect(), vec![rank as f32; PER_RANK])
}

/// Wrong elements of one rank's results in a world of `world`.
fn wrong(world: usize, sum: &[f32], all: &[f32]) -> usize {
    let ranks_sum = (world * (world - 1) / 2) as f32;
    let bad_sum = sum.iter().enumerate().filter(|&(i, &v)| v != (world * i) as f32 + ranks_sum).count();
    let bad_all = all.iter().enumerate().filter(|&(j, &v)| v != (j / PER_RANK) as f32).count();
    bad_sum + bad_all + (N - sum.len().min(N)) + (world * PER_RANK - all.len().min(world * PER_RANK))
}

fn report(world: usize, rank: Option<usize>, sum: &[f32], all: &[f32]) {
    let who = rank.map_or(String::new(), |r| format!("rank {r}: "));
    let ranks_sum = (world * (world - 1) / 2) as f32;
    println!(
        "{who}all_reduce of {N} f32 on {world} ranks: element 3 = {} (expected {})",
        sum.get(3).copied().unwrap_or(f32::NAN),
        3.0 * world as f32 + ranks_sum
    );
    println!("{who}all_gather of {PER_RANK} f32 per rank: {:?}", all.iter().step_by(PER_RANK).collect::<Vec<_>>());
}

/// One rank's AllReduce and AllGather, enqueued on its stream: (send, sum, contribution,
/// gathered). The inputs are returned too, so they live until the calls have run.
type Calls = (CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>);

fn enqueue(comm: &Comm, world: usize) -> Result<Calls> {
    let stream = comm.stream();
    let (send, mine) = inputs(comm.rank());
    let send = stream.clone_htod(&send)?;
    let mut sum = stream.alloc_zeros::<f32>(N)?;
    comm.all_reduce(&send, &mut sum, &ReduceOp::Sum)?;
    let mine = stream.clone_htod(&mine)?;
    let mut all = stream.alloc_zeros::<f32>(PER_RANK * world)?;
    comm.all_gather(&mine, &mut all)?;
    Ok((send, sum, mine, all))
}

fn verdict(wrong: usize) -> ExitCode {
    if wrong == 0 {
        println!("check: OK (every element of every rank)");
        ExitCode::SUCCESS
    } else {
        println!("check: FAILED ({wrong} wrong elements)");
        ExitCode::FAILURE
    }
}

/// One process per GPU, under torchrun.
fn torchrun() -> Result<ExitCode> {
    let comm = Comm::from_env().context("Comm::from_env (one process per GPU, torchrun's variables)")?;
    let (rank, world) = (comm.rank(), comm.world_size());
    println!("torchrun: rank {rank} of {world} on GPU {} ({})", comm.ordinal(), comm.device().name);
    let stream = comm.stream();
    let (_send, sum, _mine, all) = enqueue(&comm, world)?;
    let (sum, all) = (stream.clone_dtoh(&sum)?, stream.clone_dtoh(&all)?);
    comm.async_error()?;
    report(world, Some(rank), &sum, &all);
    let bad = wrong(world, &sum, &all);
    let teardown = comm.close();
    if !teardown.met_peers {
        bail!("rank {rank}: teardown did not meet the peers: {teardown:?}");
    }
    Ok(verdict(bad))
}

/// One rank per entry of `ordinals` (a GPU each, or GPU 0 twice when shared), all driven from
/// this process.
fn local_gpus(ordinals: &[usize]) -> Result<ExitCode> {
    let streams = ordinals
        .iter()
        .map(|&i| Ok(CudaContext::new(i).with_context(|| format!("CUDA context on GPU {i}"))?.new_stream()?))
        .collect::<Result<Vec<_>>>()?;
    let comms = Comm::from_devices(streams).context("Comm::from_devices")?;
    let world = comms.len();
    // Enqueue every rank's calls first (they run together), then read the results back.
    let buffers = comms.iter().map(|comm| enqueue(comm, world)).collect::<Result<Vec<_>>>()?;
    let mut bad = 0;
    for (comm, (_, sum, _, all)) in comms.iter().zip(&buffers) {
        let stream = comm.stream();
        let (sum, all) = (stream.clone_dtoh(sum)?, stream.clone_dtoh(all)?);
        comm.async_error()?;
        if comm.rank() == 0 {
            report(world, None, &sum, &all);
        }
        bad += wrong(world, &sum, &all);
    }
    drop(buffers);
    drop(comms);
    Ok(verdict(bad))
}

/// The host executor on CPU threads.
fn host_executor(why: &str) -> Result<ExitCode> {
    println!("{why}: running on the host executor ({HOST_WORLD} ranks on CPU threads, the same verified plans)");
    let comms = CpuComm::threads_with_config(HOST_WORLD, CpuConfig::from_env()?)?;
    let results = std::thread::scope(|s| {
        let ranks: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || -> Result<(Vec<f32>, Vec<f32>)> {
                    let (send, mine) = inputs(comm.rank());
                    let mut sum = vec![0f32; N];
                    comm.all_reduce(&send, &mut sum, &ReduceOp::Sum)?;
                    let mut all = vec![0f32; PER_RANK * comm.world_size()];
                    comm.all_gather(&mine, &mut all)?;
                    Ok((sum, all))
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a rank thread panicked"))))
            .collect::<Result<Vec<_>>>()
    })?;
    let bad: usize = results.iter().map(|(sum, all)| wrong(HOST_WORLD, sum, all)).sum();
    report(HOST_WORLD, None, &results[0].0, &results[0].1);
    if let Some(c) = comms[0].last_call() {
        println!("last call: {:?}, {} threads per rank, plan {}", c.regime, c.grid, c.verified);
    }
    Ok(verdict(bad))
}

fn main() -> Result<ExitCode> {
    // PURLIN_LOG=purlin=debug shows every call; PURLIN_LOG_FILE=quickstart.%h.%p.log keeps it.
    purlin_log::init()?;
    let under_torchrun = std::env::var_os("RANK").is_some() && std::env::var_os("WORLD_SIZE").is_some();
    if under_torchrun {
        return torchrun();
    }
    let gpus = if purlin_collectives::driver_present() { purlin_collectives::device_count() } else { 0 };
    match gpus {
        0 => host_executor("no GPU here"),
        1 if CommConfig::shared_gpu_from_env()? => {
            println!(
                "one GPU, PURLIN_SHARED_GPU=1: Comm::from_devices, 2 ranks sharing GPU 0, driven from this process"
            );
            local_gpus(&[0, 0])
        }
        1 => host_executor("one GPU here (collectives need two GPUs, or PURLIN_SHARED_GPU=1 for 2 ranks on it)"),
        n => {
            let n = n.min(purlin_collectives::MAX_WORLD);
            println!("{n} GPUs found: Comm::from_devices, one rank per GPU, all driven from this process");
            local_gpus(&(0..n).collect::<Vec<_>>())
        }
    }
}
