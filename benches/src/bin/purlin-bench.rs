//! `purlin-bench`: Purlin's collectives beside NCCL (plain, and with symmetric windows),
//! nccl-tests style. `purlin-bench --help` lists the flags; the README's Benchmark section
//! says how to run and read it.
//!
//! Progress goes to stderr, the table to stdout, files to `--out DIR`. Every wait is bounded
//! (`--timeout`), so it finishes (or fails, saying why) when run unattended.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use purlin_benches::backend::{BackendKind, Status};
use purlin_benches::cli::{self, Args, Launcher};
use purlin_benches::coord::{Coord, Region, torchrun_key};
use purlin_benches::gpu::{self, Gpu};
use purlin_benches::report::{self, BackendStatus, Meta};
use purlin_benches::run::{self, Outcome, PurlinComm};
use purlin_benches::{COMMIT, nccl, purlin};

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match cli::parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("purlin-bench: {e:#}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    if args.help {
        print!("{}", cli::USAGE);
        return ExitCode::SUCCESS;
    }
    // Never NVLink multicast (NCCL's NVLS): set before any NCCL call, in every rank.
    match std::env::var("NCCL_NVLS_ENABLE") {
        Ok(v) if v.trim() == "0" => {}
        other => {
            if let Ok(v) = other {
                eprintln!("purlin-bench: NCCL_NVLS_ENABLE={v} overridden to 0 (NVLink multicast is never used here)");
            }
            // SAFETY: set before this process starts any thread or loads NCCL.
            unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
        }
    }
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("purlin-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn env_usize(var: &str) -> Result<Option<usize>> {
    match std::env::var(var) {
        Ok(v) => v.trim().parse().map(Some).with_context(|| format!("{var}={v:?} is not a number")),
        Err(_) => Ok(None),
    }
}

fn run(args: Args) -> Result<ExitCode> {
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
    let gpus = if gpu::driver_present() { gpu::device_count() } else { 0 };
    if gpus == 0 {
        return no_gpu(&args, meta);
    }
    if let Ok(t) = purlin_topo::Topology::probe() {
        meta.topology = serde_json::to_value(&t).ok();
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
            if !(1..=purlin_benches::coord::MAX_RANKS).contains(&world) || rank >= world {
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
            let region = Region::shared(&torchrun_key(), rank, world, timeout)?;
            let coord = Coord::new(Arc::new(region), rank, world, timeout);
            meta.world = world;
            meta.gpus = coord.all_strings(&gpu.name)?;
            let p = progress(rank == 0);
            p(&format!(
                "torchrun: rank {rank}/{world} on GPU {ordinal} ({}), nccl {}",
                gpu.name,
                meta.nccl.as_deref().unwrap_or("none")
            ));
            let out = run::run_rank(&args.config, &gpu, &coord, purlin_comm_process(&args), &p);
            if rank != 0 {
                if let Some(e) = &out.error {
                    eprintln!("purlin-bench rank {rank}: {e}");
                    return Ok(ExitCode::FAILURE);
                }
                return Ok(ExitCode::SUCCESS);
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
                match purlin::comms_for_threads(devs.iter().map(|g| g.stream.clone()).collect()) {
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
    finish(&args, &meta, &outcome.rows, start)
}

fn purlin_comm_process(args: &Args) -> PurlinComm {
    if args.config.backends.contains(&BackendKind::Purlin) { PurlinComm::PerProcess } else { PurlinComm::None }
}

fn finish(args: &Args, meta: &Meta, rows: &[run::Row], start: Instant) -> Result<ExitCode> {
    print!("{}", report::table(rows, &args.config.backends, meta));
    if let Some(dir) = &args.out {
        match report::write_all(dir, rows, &args.config.backends, meta) {
            Ok(files) => eprintln!("purlin-bench: wrote {}", files.join(", ")),
            Err(e) => eprintln!("purlin-bench: could not write results: {e:#}"),
        }
    }
    if let Some(e) = &meta.error {
        eprintln!("purlin-bench: stopped: {e}");
    }
    eprintln!("purlin-bench: done in {:.1} s", start.elapsed().as_secs_f64());
    let wrong: u64 = rows.iter().flat_map(|r| &r.cells).filter_map(|c| c.wrong).sum();
    Ok(if meta.error.is_some() || wrong > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Without a GPU: says so (the host executor will run here once it exists) and writes the
/// metadata, so a CI run shows what it would measure.
fn no_gpu(args: &Args, mut meta: Meta) -> Result<ExitCode> {
    let why = if gpu::driver_present() { "no CUDA device is visible" } else { "no CUDA driver (libcuda.so.1)" };
    let note = format!(
        "no GPU: {why}. Purlin's host executor (the path without GPUs) does not exist yet, and NCCL needs GPUs: \
         nothing to measure"
    );
    meta.notes.push(note.clone());
    meta.backends = args
        .config
        .backends
        .iter()
        .map(|b| BackendStatus { backend: *b, status: Status::Unavailable(why.into()) })
        .collect();
    eprintln!("purlin-bench: {note}");
    print!("{}", report::table(&[], &args.config.backends, &meta));
    if let Some(dir) = &args.out {
        match report::write_all(dir, &[], &args.config.backends, &meta) {
            Ok(files) => eprintln!("purlin-bench: wrote {}", files.join(", ")),
            Err(e) => eprintln!("purlin-bench: could not write results: {e:#}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
