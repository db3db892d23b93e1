//! `purlin-candle-tp [cpu|gpu] [world]`: the tensor-parallel block on Purlin, checked on every
//! rank against the one-rank references (see the crate docs). `cpu` (the default): `world`
//! host threads, 2 by default. `gpu` (the `cuda` feature): `world` ranks on the local GPUs,
//! or all on GPU 0 with `PURLIN_SHARED_GPU=1`.

use anyhow::{Context, Result, bail};
use purlin_candle_tp::{Dims, Report, UNSHARDED_REL_BOUND};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("cpu", String::as_str);
    let world: usize = args.get(1).map_or(Ok(2), |w| w.parse()).context("world: a number of ranks")?;
    let (d, seed) = (Dims::small(), 0x5EED);
    let reports = match mode {
        "cpu" => purlin_candle_tp::run_cpu(d, seed, world)?,
        "gpu" => gpu(d, seed, world)?,
        other => bail!("{other}: cpu or gpu"),
    };
    let mut ok = true;
    for r in &reports {
        let fine = r.exact && r.unsharded_rel <= UNSHARDED_REL_BOUND;
        ok &= fine;
        println!(
            "CANDLE_TP {mode} rank {}/{world}: rank-order reference {}, unsharded block max rel diff {:.2e} (bound {:.0e}) {}",
            r.rank,
            if r.exact { "bit-exact" } else { "DIFFERS" },
            r.unsharded_rel,
            UNSHARDED_REL_BOUND,
            if fine { "ok" } else { "FAIL" }
        );
    }
    if !ok {
        bail!("the tensor-parallel block differs from its references");
    }
    println!("CANDLE_TP {mode}: {world} ranks, attention + MLP + gathered head, all exact");
    Ok(())
}

#[cfg(feature = "cuda")]
fn gpu(d: Dims, seed: u64, world: usize) -> Result<Vec<Report>> {
    let shared = purlin_collectives::CommConfig::shared_gpu_from_env()?;
    let gpus = purlin_collectives::device_count();
    if gpus == 0 || (!shared && gpus < world) {
        bail!("{world} ranks need {world} GPUs (found {gpus}); PURLIN_SHARED_GPU=1 puts them all on GPU 0");
    }
    let devices = (0..world)
        .map(|r| candle_core::Device::new_cuda_with_stream(if shared { 0 } else { r }))
        .collect::<candle_core::Result<Vec<_>>>()?;
    purlin_candle_tp::run_gpu(d, seed, devices)
}

#[cfg(not(feature = "cuda"))]
fn gpu(_: Dims, _: u64, _: usize) -> Result<Vec<Report>> {
    bail!("built without the `cuda` feature (cargo build --features cuda)")
}
