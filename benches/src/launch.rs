//! Launching a sweep: one process with a thread per GPU, or this process's rank of a
//! torchrun launch. The `purlin-bench` binary is a thin shell around [`launch`]; the GPU
//! tests drive it directly.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::backend::{BackendKind, Status};
use crate::cli::{Args, Launcher};
use crate::coord::{Coord, Region, torchrun_key};
use crate::gpu::{self, Gpu};
use crate::report::{self, BackendStatus, Meta};
use crate::run::{self, Outcome, PurlinComm, Row};
use crate::{COMMIT, nccl, purlin};

/// What a launch brings back.
#[derive(Debug)]
pub enum Launched {
    /// No GPU here: nothing was measured (the metadata says why).
    NoGpu {
        /// The metadata.
        meta: Meta,
    },
    /// Rank 0 (or the single process): the results to report.
    Rank0 {
        /// The metadata.
        meta: Meta,
        /// The rows.
        rows: Vec<Row>,
        /// When the launch started.
        started: Instant,
    },
    /// Another rank of a torchrun launch: rank 0 reports.
    OtherRank {
        /// This rank.
        rank: usize,
        /// Its failure, if any.
        error: Option<String>,
    },
}

fn env_usize(var: &str) -> Result<Option<usize>> {
    match std::env::var(var) {
        Ok(v) => v.trim().parse().map(Some).with_context(|| format!("{var}={v:?} is not a number")),
        Err(_) => Ok(None),
    }
}

/// Runs the sweep as the command line says (one process, or this rank of a torchrun launch).
pub fn launch(args: &Args) -> Result<Launched> {
    let launcher = match args.launcher {
        Launcher::Auto if std::env::var_os("RANK").is_some() && std::env::var_os("WORLD_SIZE").is_some() => {
            Launcher::Torchrun
        }
        Launcher::Auto => Launcher::None,
        l => l,
    };
    let start = Instant::now();
    let mut meta = Meta {
        tool: format!("purlin-bench {}", env!("CARGO_PKG_VERSION")),
        command: report::command_line(),
        date: report::utc_now(),
        commit: COMMIT.to_string(),
        launcher: if launcher == Launcher::Torchrun { "torchrun".into() } else { "none".into() },
        world: 0,
        gpus: Vec::new(),
        driver: gpu::kernel_driver_version(),
        cuda_driver: gpu::cuda_driver_version(),
        nccl: nccl::version(),
        nccl_nvls_enable: std::env::var("NCCL_NVLS_ENABLE").ok(),
        backends: Vec::new(),
        error: None,
        notes: Vec::new(),
        limits: Vec::new(),
        config: Some(args.config.clone()),
        topology: None,
    };
    if args.config.backends.iter().any(|b| b.is_nccl()) && std::env::var("NCCL_NVLS_ENABLE").as_deref() != Ok("0") {
        bail!("NCCL_NVLS_ENABLE must be 0 before NCCL starts (NVLink multicast is never used here)");
    }
    let gpus = if gpu::driver_present() { gpu::device_count() } else { 0 };
    if gpus == 0 {
        return Ok(no_gpu(args, meta));
    }
    // The topology goes into rank 0's metadata (the other ranks of a torchrun launch skip
    // the probe, which touches every GPU).
    let rank0 = launcher != Launcher::Torchrun || std::env::var("RANK").is_ok_and(|r| r.trim() == "0");
    if rank0 {
        meta.topology = purlin_topo::Topology::probe().ok().and_then(|t| serde_json::to_value(&t).ok());
    }
    let progress = move |rank0: bool| {
        move |msg: &str| {
            if rank0 {
                eprintln!("[{:7.1}s] {msg}", start.elapsed().as_secs_f64());
            }
        }
    };
    let timeout = args.config.timeout();
    let outcome: Outcome = match launcher {
        Launcher::Torchrun => {
            let rank = env_usize("RANK")?.context("RANK is not set (torchrun sets it)")?;
            let world = env_usize("WORLD_SIZE")?.context("WORLD_SIZE is not set (torchrun sets it)")?;
            let local_rank = env_usize("LOCAL_RANK")?.unwrap_or(rank);
            let local_world = env_usize("LOCAL_WORLD_SIZE")?.unwrap_or(world);
            if local_world != world {
                bail!("WORLD_SIZE {world} spans several nodes (LOCAL_WORLD_SIZE {local_world}): Purlin is intra-node");
            }
            if !(1..=crate::coord::MAX_RANKS).contains(&world) || rank >= world {
                bail!("RANK {rank} / WORLD_SIZE {world} out of range");
            }
            match args.world {
                Some(w) if w != world => bail!("--world {w} disagrees with WORLD_SIZE {world}"),
                _ => {}
            }
            // One visible GPU per rank (CUDA_VISIBLE_DEVICES) or all of them.
            let ordinal = if gpus == 1 { 0 } else { local_rank };
            if ordinal >= gpus {
                bail!("LOCAL_RANK {local_rank}: only {gpus} GPUs are visible");
            }
            let gpu = Gpu::open(ordinal)?;
            // The calibration probe: rank 0, before the others meet it, when it sees GPU 1.
            if rank == 0 && args.probe && world >= 2 && ordinal == 0 && gpus >= 2 {
                match Gpu::open(1).and_then(|peer| gpu::probe_copy_engine(&gpu, &peer)) {
                    Ok(lines) => meta.limits = lines,
                    Err(e) => eprintln!("purlin-bench: calibration probe failed: {e:#}"),
                }
            }
            let region = Region::shared(&torchrun_key(), rank, world, timeout)?;
            let coord = Coord::new(Arc::new(region), rank, world, timeout);
            meta.world = world;
            meta.gpus = coord.all_strings(&gpu.name)?;
            let p = progress(rank == 0);
            for l in &meta.limits {
                p(&format!("limits: {l}"));
            }
            p(&format!(
                "torchrun: rank {rank}/{world} on GPU {ordinal} ({}), nccl {}",
                gpu.name,
                meta.nccl.as_deref().unwrap_or("none")
            ));
            let out = run::run_rank(&args.config, &gpu, &coord, purlin_comm_process(args), &p);
            if rank != 0 {
                return Ok(Launched::OtherRank { rank, error: out.error });
            }
            out
        }
        Launcher::None | Launcher::Auto => {
            let world = args.world.unwrap_or(gpus);
            if world > gpus {
                bail!("--world {world}: only {gpus} GPUs are visible");
            }
            let devs: Vec<Gpu> = (0..world).map(Gpu::open).collect::<Result<_>>()?;
            meta.world = world;
            meta.gpus = devs.iter().map(|g| g.name.clone()).collect();
            let p0 = progress(true);
            p0(&format!(
                "one process, {world} GPUs ({}), nccl {}",
                meta.gpus.join(", "),
                meta.nccl.as_deref().unwrap_or("none")
            ));
            let mut comms: Vec<PurlinComm> = if args.config.backends.contains(&BackendKind::Purlin) {
                let t0 = Instant::now();
                match purlin::comms_for_threads(devs.iter().map(|g| g.stream.clone()).collect(), timeout) {
                    Ok(v) => {
                        p0(&format!("purlin: communicators ready in {:.1} s", t0.elapsed().as_secs_f64()));
                        v.into_iter().map(|c| PurlinComm::Ready(Box::new(c))).collect()
                    }
                    Err(e) => (0..world).map(|_| PurlinComm::Failed(format!("{e:#}"))).collect(),
                }
            } else {
                (0..world).map(|_| PurlinComm::None).collect()
            };
            let region = Region::local(world);
            let config = Arc::new(args.config.clone());
            let handles: Vec<_> = devs
                .into_iter()
                .enumerate()
                .map(|(rank, gpu)| {
                    let comm = std::mem::replace(&mut comms[rank], PurlinComm::None);
                    let (region, config) = (region.clone(), config.clone());
                    std::thread::Builder::new()
                        .name(format!("rank-{rank}"))
                        .spawn(move || {
                            let coord = Coord::new(region, rank, world, timeout);
                            let p = progress(rank == 0);
                            let out = run::run_rank(&config, &gpu, &coord, comm, &p);
                            drop(gpu);
                            out
                        })
                        .context("spawn a rank thread")
                })
                .collect::<Result<_>>()?;
            let mut outs: Vec<Outcome> = handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| Outcome {
                        error: Some("a rank thread panicked".into()),
                        ..Outcome::default()
                    })
                })
                .collect();
            let mut out = outs.remove(0);
            if out.error.is_none() {
                out.error = outs.into_iter().find_map(|o| o.error);
            }
            out
        }
    };
    meta.backends = outcome.backends.iter().map(|(b, s)| BackendStatus { backend: *b, status: s.clone() }).collect();
    meta.error = outcome.error.clone();
    Ok(Launched::Rank0 { meta, rows: outcome.rows, started: start })
}

fn purlin_comm_process(args: &Args) -> PurlinComm {
    if args.config.backends.contains(&BackendKind::Purlin) { PurlinComm::PerProcess } else { PurlinComm::None }
}

/// Without a GPU: says so (Purlin will run here on its host executor once `Comm` can) and writes the
/// metadata, so a CI run shows what it would measure.
fn no_gpu(args: &Args, mut meta: Meta) -> Launched {
    let why = if gpu::driver_present() { "no CUDA device is visible" } else { "no CUDA driver (libcuda.so.1)" };
    let note = format!(
        "no GPU: {why}. purlin_collectives::Comm cannot run without a GPU yet (its host executor is not \
         reachable through Comm), and NCCL needs GPUs: nothing to measure"
    );
    meta.notes.push(note.clone());
    meta.backends = args
        .config
        .backends
        .iter()
        .map(|b| BackendStatus { backend: *b, status: Status::Unavailable(why.into()) })
        .collect();
    eprintln!("purlin-bench: {note}");
    Launched::NoGpu { meta }
}
