//! `cargo xtask cubin` and `cargo xtask resources`: the Hopper units compiled here, to read
//! their SASS and ptxas's resource report without a GPU.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::ensure_nvrtc;

/// Compiles the runtime's sm_90 units whose names contain FILTER into DIR (default
/// `target/cubin`), to read their SASS (`nvdisasm DIR/*.cubin`) without a GPU.
pub(crate) fn cubin(args: &[String]) -> Result<()> {
    let filter = args.first().context("usage: cargo xtask cubin FILTER [DIR]")?;
    let dir = args.get(1).map_or_else(|| PathBuf::from("target/cubin"), PathBuf::from);
    let jobs = hopper_units(filter)?;
    for key in compile_all(&purlin_atom::KernelCache::new(&dir), &ensure_nvrtc()?, &jobs)? {
        println!("{}", dir.join(format!("{}.cubin", key.key)).display());
    }
    Ok(())
}

/// The runtime's Hopper units whose name contains `filter`, for sm_90.
fn hopper_units(filter: &str) -> Result<Vec<(purlin_atom::TranslationUnit, purlin_atom::Arch)>> {
    let jobs: Vec<_> = purlin_collectives::internal::kernels::all_units(purlin_atom::Generation::Hopper)
        .into_iter()
        .filter(|unit| unit.name.contains(filter))
        .map(|unit| (unit, purlin_atom::Arch::SM90))
        .collect();
    if jobs.is_empty() {
        bail!("no runtime unit's name contains {filter:?}");
    }
    Ok(jobs)
}

pub(crate) fn resources(args: &[String]) -> Result<()> {
    let jobs = hopper_units(args.first().map_or("", String::as_str))?;
    // A fresh cache directory: the report exists only for CUBINs compiled now.
    let dir = std::env::temp_dir().join(format!("purlin-resources-{}", std::process::id()));
    let compiled = compile_all(&purlin_atom::KernelCache::new(&dir), &ensure_nvrtc()?, &jobs);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{:<34} {:<5} {:>5} {:>6} {:>8} {:>8} {:>7}  function",
        "unit", "kind", "regs", "stack", "spill-st", "spill-ld", "instrs"
    );
    for (kernel, (unit, _)) in compiled?.iter().zip(&jobs) {
        // Code size from the CUBIN's ELF sections (ptxas's report has none).
        let code = purlin_atom::cubin::function_code(&kernel.cubin).with_context(|| format!("{}: CUBIN", unit.name))?;
        for f in kernel.resources.iter().flatten() {
            let regs = f.registers.map_or_else(|| "-".to_string(), |r| r.to_string());
            let instrs = code
                .iter()
                .find(|c| c.function == f.function)
                .map_or_else(|| "-".to_string(), |c| c.instructions().to_string());
            println!(
                "{:<34} {:<5} {:>5} {:>6} {:>8} {:>8} {:>7}  {}",
                unit.name,
                if f.entry { "entry" } else { "func" },
                regs,
                f.stack_frame_bytes,
                f.spill_store_bytes,
                f.spill_load_bytes,
                instrs,
                f.function
            );
        }
    }
    Ok(())
}

/// Compiles `jobs` into `cache` with the NVRTC in `nvrtc`, one job per core.
pub(crate) fn compile_all(
    cache: &purlin_atom::KernelCache,
    nvrtc: &Path,
    jobs: &[(purlin_atom::TranslationUnit, purlin_atom::Arch)],
) -> Result<Vec<purlin_atom::CompiledKernel>> {
    // SAFETY: set_var before any thread of this process reads the environment (xtask runs
    // cargo as child processes; the compile threads start below).
    unsafe { std::env::set_var(purlin_atom::nvrtc::NVRTC_DIR_ENV, nvrtc) };
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    Ok(cache.get_or_compile_all(jobs, threads)?)
}
