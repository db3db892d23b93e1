//! What both fused-kernel examples share: two ranks (two GPUs, or one GPU shared), timing
//! with CUDA events, and the checks.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaContext, CudaStream};
use purlin_collectives::{Comm, CommConfig};

/// Two ranks in this process: on two GPUs where there are two, else both on GPU 0
/// (`CommConfig::shared_gpu`: a check of correctness; its timings show no NVLink).
pub fn two_ranks() -> Result<Vec<Comm>> {
    let gpus = if purlin_collectives::driver_present() { purlin_collectives::device_count() } else { 0 };
    let mut config = CommConfig::from_env()?;
    let streams: Vec<Arc<CudaStream>> = match gpus {
        0 => bail!("no GPU here: fused kernels run on GPUs (the host executor runs their plans in CI)"),
        1 => {
            config.shared_gpu = true;
            let ctx = CudaContext::new(0)?;
            vec![ctx.new_stream()?, ctx.new_stream()?]
        }
        _ => vec![CudaContext::new(0)?.new_stream()?, CudaContext::new(1)?.new_stream()?],
    };
    let shared = if gpus == 1 { "one GPU shared by both ranks" } else { "GPUs 0 and 1" };
    println!("2 ranks on {shared}");
    Comm::from_devices_with_config(streams, config).context("Comm::from_devices_with_config")
}

/// Microseconds per iteration of `iters` runs of `step` (every rank's launches), timed by
/// events on rank 0's stream after every rank's stream has caught up.
pub fn time_us(comms: &[Comm], iters: u32, mut step: impl FnMut() -> Result<()>) -> Result<f64> {
    let stream = comms[0].stream();
    for c in comms {
        c.stream().synchronize()?;
    }
    let start = stream.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
    for _ in 0..iters {
        step()?;
    }
    for c in &comms[1..] {
        stream.join(&c.stream())?;
    }
    let end = stream.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
    end.synchronize()?;
    Ok(f64::from(start.elapsed_ms(&end)?) * 1e3 / f64::from(iters))
}

/// Elements of `got` that differ from `reference` by more than a relative 1e-5 (or 1e-5
/// absolute near zero).
pub fn off_reference(got: &[f32], reference: &[f64]) -> usize {
    got.iter().zip(reference).filter(|&(&g, &r)| (f64::from(g) - r).abs() > 1e-5 * r.abs().max(1.0)).count()
        + got.len().abs_diff(reference.len())
}

/// Elements whose bits differ.
pub fn bits_differ(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count() + a.len().abs_diff(b.len())
}
