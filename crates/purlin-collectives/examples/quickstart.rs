//! Purlin in one page: an AllReduce and an AllGather on 4 ranks, each rank on its own thread,
//! with a printed check.
//!
//! ```text
//! cargo run --release -p purlin-collectives --example quickstart
//! ```
//!
//! Without a GPU it runs on the host executor (the same verified SNAC plans the GPUs run, on
//! CPU threads) and says so.

use purlin_collectives::{CpuComm, CpuConfig, ReduceOp};

const WORLD: usize = 4;
const N: usize = 4096;

fn main() -> anyhow::Result<()> {
    if purlin_topo::device_count() > 0 {
        println!("GPUs found: the GPU path is `Comm::from_devices(streams)`; this example runs the host executor.");
    } else {
        println!("no GPU here: running on the host executor ({WORLD} ranks on CPU threads)");
    }

    let comms = CpuComm::threads_with_config(WORLD, CpuConfig::from_env()?)?;
    let results = std::thread::scope(|s| {
        let ranks: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
                    let r = comm.rank() as f32;
                    // AllReduce: every rank contributes i + rank at element i.
                    let send: Vec<f32> = (0..N).map(|i| i as f32 + r).collect();
                    let mut sum = vec![0f32; N];
                    comm.all_reduce(&send, &mut sum, &ReduceOp::Sum)?;
                    // AllGather: every rank contributes 8 copies of its rank.
                    let mine = vec![r; 8];
                    let mut all = vec![0f32; 8 * comm.world_size()];
                    comm.all_gather(&mine, &mut all)?;
                    Ok((sum, all))
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().expect("rank thread panicked")).collect::<Result<Vec<_>, _>>()
    })?;

    // Check: sum over ranks of (i + r) = WORLD * i + 0 + 1 + ... + (WORLD - 1).
    let ranks_sum = (WORLD * (WORLD - 1) / 2) as f32;
    let mut wrong = 0;
    for (sum, all) in &results {
        wrong += sum.iter().enumerate().filter(|&(i, &v)| v != (WORLD * i) as f32 + ranks_sum).count();
        wrong += all.iter().enumerate().filter(|&(j, &v)| v != (j / 8) as f32).count();
    }
    let info =
        comms[0].last_call().map(|c| format!("{:?}, {} threads per rank, plan {}", c.regime, c.grid, c.verified));
    println!(
        "all_reduce of {N} f32 on {WORLD} ranks: element 3 = {} (expected {})",
        results[0].0[3],
        3.0 * WORLD as f32 + ranks_sum
    );
    println!("all_gather of 8 f32 per rank: {:?}", results[0].1.iter().step_by(8).collect::<Vec<_>>());
    println!("last call: {}", info.unwrap_or_default());
    if wrong == 0 {
        println!("check: OK (every element of every rank)");
        Ok(())
    } else {
        anyhow::bail!("check FAILED: {wrong} wrong elements")
    }
}
