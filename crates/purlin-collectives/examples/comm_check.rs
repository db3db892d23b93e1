//! The communicator under torchrun: one process per GPU.
//!
//! ```text
//! python3 -m torch.distributed.run --no-python --nproc-per-node 2 ./comm_check [--cycles N]
//! ```
//!
//! Each rank: `Comm::from_env()`, a flag ping-pong with every peer through the CUDA-IPC
//! workspace, an AllReduce attempt (typed `Unsupported` until the kernels land), then N
//! set-up/teardown cycles checking device memory before and after. Prints
//! `COMM_CHECK rank R: PASS|FAIL ...` and exits non-zero on failure. Every wait is bounded
//! (host 60 s, device 2 s), so a dead or stuck peer ends in a typed error, not a hang.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaContext, CudaStream};
use purlin_collectives::internal::ipc::mem_info;
use purlin_collectives::{Comm, CommConfig, ReduceOp};
use purlin_collectives::{Error, TorchEnv};

const DEVICE_TIMEOUT: Duration = Duration::from_secs(2);
const LEAK_TOLERANCE: usize = 8 << 20;

fn config() -> Result<CommConfig> {
    let mut c = CommConfig::from_env()?;
    if std::env::var_os("PURLIN_TIMEOUT_S").is_none() {
        c.timeout = Duration::from_secs(60);
    }
    Ok(c)
}

fn stream(env: &TorchEnv) -> Result<Arc<CudaStream>> {
    if !purlin_collectives::driver_present() {
        bail!("no CUDA driver");
    }
    let ordinal = env.device_ordinal(purlin_collectives::device_count())?;
    let ctx = CudaContext::new(ordinal).with_context(|| format!("CUDA context on GPU {ordinal}"))?;
    Ok(ctx.new_stream()?)
}

/// Ping-pong with every peer, pairs in lexical order (deadlock-free).
fn ping_all(c: &Comm, rounds: u32) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    let w = c.world_size();
    for i in 0..w {
        for j in i + 1..w {
            if c.rank() != i && c.rank() != j {
                continue;
            }
            let peer = if c.rank() == i { j } else { i };
            let p = c
                .diag()
                .ping_pong(peer, rounds, DEVICE_TIMEOUT)
                .with_context(|| format!("ping-pong with rank {peer}"))?;
            if p.initiator {
                lines.push(format!("ping-pong {i}<->{j}: {} rounds, round trip {:.2} us", p.rounds, p.round_trip_us));
            }
        }
    }
    Ok(lines)
}

fn run(env: &TorchEnv, cycles: usize) -> Result<()> {
    let rank = env.rank;
    let stream = stream(env)?;
    let ctx = stream.context().clone();
    let t = Instant::now();
    let comm = Comm::from_env_with_stream(stream.clone(), config()?).context("Comm::from_env")?;
    println!(
        "COMM_CHECK rank {rank}: set-up {:?}, world {}, gpu{} {} ({}), co-residency bound (smoke kernel) {}",
        t.elapsed(),
        comm.world_size(),
        comm.ordinal(),
        comm.device().name,
        comm.device().compute_capability,
        comm.diag().coresidency().smoke_pingpong
    );
    if rank == 0 {
        println!("{}", comm.diag().workspace_layout().report());
    }
    for line in ping_all(&comm, 10_000)? {
        println!("COMM_CHECK rank {rank}: {line}");
    }
    // AllReduce: correct, or typed Unsupported until the kernels exist.
    let n = 4096;
    let send = stream.clone_htod(&vec![(rank + 1) as f32; n])?;
    let mut recv = stream.alloc_zeros::<f32>(n)?;
    match comm.all_reduce(&send, &mut recv, &ReduceOp::Sum) {
        Ok(_) => {
            let out = stream.clone_dtoh(&recv)?;
            let w = comm.world_size();
            let want = (w * (w + 1) / 2) as f32;
            if out.iter().any(|&x| x != want) {
                bail!("all_reduce gave a wrong result");
            }
            println!("COMM_CHECK rank {rank}: all_reduce correct");
        }
        Err(Error::Unsupported(why)) => println!("COMM_CHECK rank {rank}: all_reduce not yet implemented ({why})"),
        Err(e) => return Err(e).context("all_reduce"),
    }
    comm.async_error()?;
    let report = comm.close();
    if !report.met_peers || report.leaked_bytes > 0 {
        bail!("teardown: {report:?}");
    }
    if cycles > 0 {
        let before = mem_info(&ctx)?.0;
        let t = Instant::now();
        for n in 0..cycles {
            let c = Comm::from_env_with_stream(stream.clone(), config()?).with_context(|| format!("cycle {n}"))?;
            ping_all(&c, 10).with_context(|| format!("cycle {n}"))?;
            let r = c.close();
            if !r.met_peers || r.leaked_bytes > 0 {
                bail!("cycle {n} teardown: {r:?}");
            }
        }
        let after = mem_info(&ctx)?.0;
        println!(
            "COMM_CHECK rank {rank}: {cycles} set-up/ping-pong/teardown cycles in {:?}, free memory before {before} after {after}",
            t.elapsed()
        );
        if before > after + LEAK_TOLERANCE {
            bail!("device memory leak: {} bytes over {cycles} cycles", before - after);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    if let Err(e) = purlin_log::init() {
        eprintln!("comm_check: {e}");
        return ExitCode::from(2);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cycles = match args.as_slice() {
        [] => 20,
        [flag, n] if flag == "--cycles" => match n.parse() {
            Ok(n) => n,
            Err(_) => {
                eprintln!("--cycles N");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("usage: comm_check [--cycles N]   (under torchrun)");
            return ExitCode::from(2);
        }
    };
    let env = match TorchEnv::from_process() {
        Ok(e) => e,
        Err(e) => {
            println!("COMM_CHECK: FAIL: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&env, cycles) {
        Ok(()) => {
            println!("COMM_CHECK rank {}: PASS", env.rank);
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("COMM_CHECK rank {}: FAIL: {e:#}", env.rank);
            ExitCode::FAILURE
        }
    }
}
