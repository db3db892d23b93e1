//! Launching a sweep: one process with a thread per GPU, or this process's rank of a
//! torchrun launch. The `purlin-bench` binary is a thin shell around [`launch`]; the GPU
//! tests drive it directly.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::backend::{BackendKind, Status};
use crate::cli::{self, Args, Launcher};
use crate::coord::{Coord, Region, torchrun_key};
use crate::gpu::{self, Gpu};
use crate::report::{self, BackendStatus, Meta};
use crate::run::{self, Executor, Outcome, PurlinComm, Row};
use crate::{COMMIT, nccl, purlin};

/// What a launch brings back.
#[derive(Debug)]
pub enum Launched {
    /// No GPU here and Purlin not among `--backends`: nothing was measured (the metadata
    /// says why). (Without a GPU, Purlin runs on its host executor: [`Launched::Rank0`].)
    NoGpu {
        /// The metadata.
        meta: Meta,
    },
    /// Rank 0 (or the single process): the results to report. `meta.executor` says what
    /// ran Purlin (GPUs, or the host executor), `meta.config` the sweep as run (its
    /// `backends` are the table's columns).
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
        executor: Executor::Gpu,
        purlin_blocks_per_role: None,
        purlin_max_blocks: None,
    };
    if args.config.backends.iter().any(|b| b.is_nccl()) && std::env::var("NCCL_NVLS_ENABLE").as_deref() != Ok("0") {
        bail!("NCCL_NVLS_ENABLE must be 0 before NCCL starts (NVLink multicast is never used here)");
    }
    let gpus = if gpu::driver_present() { gpu::device_count() } else { 0 };
    if gpus == 0 || args.host {
        return host(args, meta, gpus, start);
    }
    if args.config.backends.contains(&BackendKind::Purlin) {
        let tuning = purlin::config(&args.config).ok().map(|c| c.tuning);
        meta.purlin_blocks_per_role = tuning.map(|t| t.blocks_per_role);
        meta.purlin_max_blocks = tuning.and_then(|t| t.max_blocks);
    }
    // The topology goes into rank 0's metadata (the other ranks of a torchrun launch skip
    // the probe, which touches every GPU).
    let rank0 = launcher != Launcher::Torchrun || std::env::var("RANK").is_ok_and(|r| r.trim() == "0");
    if rank0 {
        meta.topology = purlin_topo::Topology::probe().ok().and_then(|t| serde_json::to_value(&t).ok());
    }
    let quiet = args.quiet;
    let progress = move |rank0: bool| {
        move |msg: &str| {
            if rank0 && !quiet {
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
            // PURLIN_SHARED_GPU=1: every rank on GPU 0 (CommConfig::shared_gpu), to check a
            // build on a one-GPU machine; NCCL refuses ranks that share a GPU.
            let shared = world > gpus && purlin_collectives::CommConfig::shared_gpu_from_env()?;
            if world > gpus && !shared {
                bail!("--world {world}: only {gpus} GPUs are visible (PURLIN_SHARED_GPU=1 puts every rank on GPU 0)");
            }
            if shared && args.config.backends.iter().any(|b| b.is_nccl()) {
                bail!("PURLIN_SHARED_GPU=1: NCCL refuses ranks that share a GPU; pass --backends purlin");
            }
            if shared {
                meta.notes.push(format!(
                    "PURLIN_SHARED_GPU=1: all {world} ranks on GPU 0, sharing its SMs and memory; no NVLink figure"
                ));
            }
            let ordinal = |rank: usize| if shared { 0 } else { rank };
            let devs: Vec<Gpu> = (0..world).map(|rank| Gpu::open(ordinal(rank))).collect::<Result<_>>()?;
            meta.world = world;
            // The GPUs the ranks run on: one, when they share it (the table's `# GPUs:` line).
            meta.gpus = devs.iter().take(if shared { 1 } else { world }).map(|g| g.name.clone()).collect();
            let p0 = progress(true);
            // The calibration probe between GPUs 0 and 1, before any communicator exists.
            if args.probe && world >= 2 && !shared {
                match gpu::probe_copy_engine(&devs[0], &devs[1]) {
                    Ok(lines) => meta.limits = lines,
                    Err(e) => eprintln!("purlin-bench: calibration probe failed: {e:#}"),
                }
            }
            for l in &meta.limits {
                p0(&format!("limits: {l}"));
            }
            p0(&format!(
                "one process, {world} ranks on {} GPU(s) ({}), nccl {}",
                meta.gpus.len(),
                meta.gpus.join(", "),
                meta.nccl.as_deref().unwrap_or("none")
            ));
            let mut comms: Vec<PurlinComm> = if args.config.backends.contains(&BackendKind::Purlin) {
                let t0 = Instant::now();
                match purlin::comms_for_threads(devs.iter().map(|g| g.stream.clone()).collect(), &args.config) {
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

/// Without a GPU (or with `--host`): Purlin's host executor (`CpuComm`, a thread per rank)
/// runs the sweep with the host defaults ([`cli::host_config`]); NCCL, which needs GPUs, has
/// no columns. Says so on stderr, in the table's header and in the files.
fn host(args: &Args, mut meta: Meta, gpus: usize, start: Instant) -> Result<Launched> {
    let why = if gpus > 0 {
        format!("--host given ({gpus} GPUs visible, not used)")
    } else if gpu::driver_present() {
        "no GPU found: no CUDA device is visible".to_string()
    } else {
        "no GPU found: no CUDA driver (libcuda.so.1)".to_string()
    };
    if matches!(args.launcher, Launcher::Torchrun)
        || (args.launcher == Launcher::Auto && std::env::var_os("RANK").is_some())
    {
        bail!("{why}; the host executor runs every rank as a thread of one process: run purlin-bench without torchrun");
    }
    let cfg = cli::host_config(args);
    let world = args.world.unwrap_or(crate::host::DEFAULT_WORLD);
    meta.executor = Executor::Host;
    meta.launcher = "none".into();
    meta.config = Some(cfg.clone());
    meta.backends = args
        .config
        .backends
        .iter()
        .filter(|b| b.is_nccl())
        .map(|b| BackendStatus {
            backend: *b,
            status: Status::Unavailable("NCCL needs GPUs: no NCCL columns without one".into()),
        })
        .collect();
    if !cfg.backends.contains(&BackendKind::Purlin) {
        let note = format!("{why}. --backends has no purlin, and NCCL needs GPUs: nothing to measure");
        eprintln!("purlin-bench: {note}");
        meta.notes.push(note);
        return Ok(Launched::NoGpu { meta });
    }
    let note = format!(
        "{why}. Running Purlin's host executor (purlin_collectives::CpuComm: {world} ranks as threads of this \
         process, verified plans only); NCCL columns are absent (NCCL needs GPUs). Host figures are CPU \
         timings, not comparable with GPU ones."
    );
    eprintln!("purlin-bench: {note}");
    meta.notes.push(note);
    let sizes = cfg.sizes();
    eprintln!(
        "purlin-bench: host sweep: {} collectives x {} sizes ({}..{}), {} {}",
        cfg.collectives.len(),
        sizes.len(),
        crate::spec::format_size(sizes.first().copied().unwrap_or(0)),
        crate::spec::format_size(sizes.last().copied().unwrap_or(0)),
        cfg.dtype,
        cfg.modes.iter().map(|m| m.name()).collect::<Vec<_>>().join("+")
    );
    let quiet = args.quiet;
    let progress = move |msg: &str| {
        if !quiet {
            eprintln!("[{:7.1}s] {msg}", start.elapsed().as_secs_f64())
        }
    };
    let run = crate::host::run_host(&cfg, world, &progress)?;
    meta.world = run.world;
    meta.purlin_blocks_per_role = Some(run.blocks_per_role);
    meta.purlin_max_blocks = run.max_blocks;
    meta.backends.insert(0, BackendStatus { backend: BackendKind::Purlin, status: Status::Ok });
    meta.error = run.outcome.error.clone();
    Ok(Launched::Rank0 { meta, rows: run.outcome.rows, started: start })
}
