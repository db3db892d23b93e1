//! `HierComm` under torchrun across nodes: AllReduce, ReduceScatter, AllGather and AllToAll,
//! checked exactly and printed by every rank. Nodes can be simulated on one host, one torchrun
//! agent per "node", each with its own GPUs:
//!
//! ```text
//! # 2 nodes × 1 GPU (the rail alone); 2 × 2 on four GPUs: CUDA_VISIBLE_DEVICES=0,1 / 2,3 and
//! # --nproc-per-node 2.
//! export NCCL_NVLS_ENABLE=0 NCCL_COMM_ID=127.0.0.1:29611
//! for n in 0 1; do
//!   CUDA_VISIBLE_DEVICES=$n python3 -m torch.distributed.run --no-python --nnodes 2 --node-rank $n \
//!     --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29610 ./hier_check &
//! done; wait
//! ```
//!
//! Exit status 0 when every check held on this rank.

use std::process::ExitCode;

use anyhow::{Context, Result};
use purlin_collectives::{HierComm, ReduceOp};

/// Elements per rank's part.
const PART: usize = 1000;

fn run() -> Result<usize> {
    let comm = HierComm::from_env().context("HierComm::from_env")?;
    let (rank, world, shape) = (comm.rank(), comm.world_size(), comm.shape());
    let s = comm.stream();
    let n = world * PART;
    let value = |r: usize, i: usize| ((r * 7 + i) % 13) as f32;
    let send = s.clone_htod(&(0..n).map(|i| value(rank, i)).collect::<Vec<_>>())?;
    let mut sum = s.alloc_zeros::<f32>(n)?;
    let mut part = s.alloc_zeros::<f32>(PART)?;
    let mut all = s.alloc_zeros::<f32>(n)?;
    let mut swapped = s.alloc_zeros::<f32>(n)?;
    comm.all_reduce(&send, &mut sum, &ReduceOp::Sum)?;
    comm.reduce_scatter(&send, &mut part, &ReduceOp::Sum)?;
    comm.all_gather(&send.slice(..PART), &mut all)?;
    comm.all_to_all(&send, &mut swapped)?;
    comm.synchronize()?;
    let (sum, part, all, swapped) =
        (s.clone_dtoh(&sum)?, s.clone_dtoh(&part)?, s.clone_dtoh(&all)?, s.clone_dtoh(&swapped)?);
    let total = |i: usize| (0..world).map(|r| value(r, i)).sum::<f32>();
    let mut wrong = 0;
    wrong += (0..n).filter(|&i| sum[i] != total(i)).count();
    wrong += (0..PART).filter(|&j| part[j] != total(rank * PART + j)).count();
    wrong += (0..n).filter(|&i| all[i] != value(i / PART, i % PART)).count();
    wrong += (0..n).filter(|&i| swapped[i] != value(i / PART, rank * PART + i % PART)).count();
    println!(
        "rank {rank} of {world} ({} nodes × {}, node {} local rank {}): all_reduce, reduce_scatter, all_gather, \
         all_to_all of {PART} f32 per part: {wrong} wrong elements",
        shape.nodes, shape.local, shape.node, shape.local_rank
    );
    Ok(wrong)
}

fn main() -> ExitCode {
    match run() {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("hier_check: {e:#}");
            ExitCode::FAILURE
        }
    }
}
