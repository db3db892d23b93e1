//! The device smoke test as a program: an NVRTC-compiled kernel on every GPU, peer access
//! both ways, and a flag ping-pong round trip. Without a GPU it compiles the kernels for
//! sm_90 with NVRTC only, and says so.
//!
//! `smoke --sanitizer-control` is the negative control of a compute-sanitizer run
//! (`PURLIN_SANITIZE` in the GPU round's run.sh): it loads the smoke kernel the way the
//! runtime loads every kernel (NVRTC, the kernel cache, a CUBIN module) and launches it on an
//! address no allocation covers, so memcheck must report an invalid global write; without
//! the sanitizer the launch fails with an illegal-address error. A sanitizer that reports
//! nothing here would not see the executor's kernels either.

use anyhow::{Context, bail};
use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use purlin_atom::{Arch, KernelCache};

/// Launches the fill kernel on a pointer into the unmapped first page; returns the error.
fn sanitizer_control(cache: &KernelCache) -> anyhow::Result<()> {
    let ctx = CudaContext::new(0).context("CUDA context on GPU 0")?;
    let (major, minor) = ctx.compute_capability()?;
    let compiled = cache.get_or_compile(
        &purlin_collectives::internal::kernels::smoke_unit(),
        Arch { major: major as u32, minor: minor as u32 },
    )?;
    let module = ctx.load_module(Ptx::from_binary(compiled.cubin))?;
    let fill = module.load_function("purlin_smoke_fill")?;
    let stream = ctx.default_stream();
    let (bogus, n, seed) = (0x1000u64, 256u32, 1u32);
    let mut launch = stream.launch_builder(&fill);
    launch.arg(&bogus).arg(&n).arg(&seed);
    // SAFETY: the arguments match the kernel's (u32*, u32, u32). Its writes are meant to
    // fault: no allocation covers device address 0x1000 (the unmapped first pages), so the GPU
    // reports an illegal address instead of touching memory, and this process uses the
    // context for nothing else.
    let launched = unsafe { launch.launch(LaunchConfig::for_num_elems(n)) };
    let synced = launched.map_err(anyhow::Error::from).and_then(|_| stream.synchronize().map_err(Into::into));
    match synced {
        Err(e) => {
            println!("SANITIZER-CONTROL: the out-of-bounds fill failed as it must: {e}");
            Ok(())
        }
        Ok(()) => bail!("the fill at an unmapped address completed: the control proves nothing here"),
    }
}

fn main() -> anyhow::Result<()> {
    purlin_log::init()?;
    let cache = KernelCache::default_location();
    if std::env::args().any(|a| a == "--sanitizer-control") {
        return sanitizer_control(&cache);
    }
    if purlin_topo::device_count() == 0 {
        println!("no CUDA GPU here: compiling the executor kernels for sm_90 with NVRTC only");
        let jobs: Vec<_> = purlin_collectives::internal::kernels::all_units(purlin_atom::Generation::Hopper)
            .into_iter()
            .map(|unit| (unit, Arch::SM90))
            .collect();
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        for k in cache.get_or_compile_all(&jobs, threads)? {
            println!("  {} ({} bytes of CUBIN)", k.key, k.cubin.len());
        }
        println!("cached in {}", cache.dir().display());
        return Ok(());
    }
    let report = purlin_collectives::internal::smoke::run(&cache)?;
    for d in &report.devices {
        println!("gpu{} {} {}: kernel ran, {} elements checked", d.ordinal, d.name, d.arch, d.elements_checked);
    }
    for (i, j, ok) in &report.peer_access {
        println!("peer access gpu{i} -> gpu{j}: {}", if *ok { "enabled" } else { "not available" });
    }
    if let Some((rounds, us)) = report.ping_pong {
        println!("flag ping-pong gpu0 <-> gpu1: {rounds} rounds, {us:.2} us round trip");
    }
    Ok(())
}
