//! `cargo xtask <command>`: Purlin's workflows.
//!
//! - `nvrtc`      install the pinned NVRTC wheel under target/ (if no libnvrtc is found there)
//! - `test`       set NVRTC up, then `cargo test --workspace` (the README's test command);
//!   `test --full` also runs the host executor's full matrix (ignored by default: minutes)
//! - `verify`     the SNAC verifier's tests; `verify --full` adds the larger exhaustive set
//! - `gpu-round`  build everything a GPU round needs into ./gpu-round (see ARCHITECTURE.md);
//!   `gpu-round --lean` only what collective rounds use, to fit the device tool's 64 MiB
//! - `bench`      the collectives benchmark (`purlin-bench`), Purlin beside NCCL (without a GPU:
//!   Purlin's host executor alone, and it says so)
//! - `cubin`      compile the Hopper units whose name contains FILTER into DIR (for `nvdisasm`)
//! - `resources`  compile the Hopper units whose name contains FILTER afresh and print ptxas's
//!   registers, stack frame and spills per function (check a kernel change's spills before
//!   spending device time on it)
//! - `ab-round`   build an A/B round of git refs for the GPU machine: each ref's purlin-bench,
//!   the candidates' GPU tests, every ref's kernels, the sweeps and a comparison script

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use xtask::{NVRTC_WHEEL, nvrtc_install_dir, nvrtc_lib_dir, workspace_root};

mod ab_round;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = args.split_first().map(|(c, r)| (c.as_str(), r)).unwrap_or(("help", &[]));
    match cmd {
        "nvrtc" => ensure_nvrtc().map(|dir| println!("NVRTC: {}", dir.display())),
        "test" => test(rest),
        "verify" => verify(rest),
        "gpu-round" => gpu_round(rest),
        "bench" => bench(rest),
        "cubin" => cubin(rest),
        "resources" => resources(rest),
        "ab-round" => ab_round::ab_round(rest),
        _ => {
            eprintln!(
                "usage: cargo xtask <nvrtc | test [cargo test args] | verify [--full] | gpu-round [--lean] [--out DIR] | bench [bench args] | cubin FILTER [DIR] | resources [FILTER] | ab-round [--out DIR] [--sweeps FILE] [--reps N] BASE CANDIDATE...>"
            );
            if matches!(cmd, "help" | "--help" | "-h") { Ok(()) } else { bail!("unknown command {cmd:?}") }
        }
    }
}

fn cargo() -> Command {
    cargo_in(&workspace_root())
}

/// Cargo, run in `dir` (another checkout: `ab-round`'s worktrees).
fn cargo_in(dir: &Path) -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(dir);
    c
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd.status().with_context(|| format!("spawn {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Finds libnvrtc like the runtime does; where none is found, installs the pinned wheel
/// under target/ with pip. A failed install is an error (the compile checks must run).
fn ensure_nvrtc() -> Result<PathBuf> {
    let local = nvrtc_lib_dir();
    if local.join("libnvrtc.so.13").is_file() {
        return Ok(local);
    }
    if let Some(found) = purlin_atom::nvrtc::search_dirs().into_iter().find(|d| d.join("libnvrtc.so.13").is_file()) {
        return Ok(found);
    }
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success()))
        .context("no python3 to install the NVRTC wheel with")?;
    run(Command::new(python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--target"])
        .arg(nvrtc_install_dir())
        .arg(NVRTC_WHEEL))
    .context("installing the pinned NVRTC wheel")?;
    if !local.join("libnvrtc.so.13").is_file() {
        bail!("pip installed {NVRTC_WHEEL} but {} has no libnvrtc.so.13", local.display());
    }
    Ok(local)
}

fn test(args: &[String]) -> Result<()> {
    let nvrtc = ensure_nvrtc()?;
    let full = args.first().is_some_and(|a| a == "--full");
    let args = if full { &args[1..] } else { args };
    run(cargo().args(["test", "--workspace"]).args(args).env(purlin_atom::nvrtc::NVRTC_DIR_ENV, &nvrtc))?;
    if full {
        // The host executor's whole matrix (worlds 2..8 × every dtype, op, size and regime).
        run(cargo()
            .args(["test", "--release", "-p", "purlin-collectives", "--test", "host_collectives", "--", "--ignored"])
            .env(purlin_atom::nvrtc::NVRTC_DIR_ENV, &nvrtc))?;
    }
    Ok(())
}

/// The verifier's tests (in release: the model checker is ~15x faster); `--full` adds the
/// exhaustive sets beyond CI's budget.
fn verify(args: &[String]) -> Result<()> {
    let full = match args {
        [] => false,
        [f] if f == "--full" => true,
        _ => bail!("usage: cargo xtask verify [--full]"),
    };
    let mut cmd = cargo();
    cmd.args(["test", "--release", "-p", "purlin-snac", "--test", "verify"]);
    if full {
        cmd.args(["--", "--include-ignored"]);
    }
    run(&mut cmd)
}

/// Runs the collectives benchmark (release build) with NVRTC set up: `cargo xtask bench
/// --help` lists its flags. NVRTC that cannot be set up is a warning, not an error: without a
/// GPU `purlin-bench` runs Purlin's host executor, which compiles no kernel; on GPUs the
/// Purlin columns then say why they are empty and NCCL still runs.
fn bench(args: &[String]) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["run", "--quiet", "--release", "-p", "purlin-benches", "--bin", "purlin-bench", "--"]).args(args);
    match ensure_nvrtc() {
        Ok(dir) => {
            cmd.env(purlin_atom::nvrtc::NVRTC_DIR_ENV, dir);
        }
        Err(e) => eprintln!(
            "xtask bench: NVRTC is not set up ({e:#}); the host executor (no GPU) needs none, Purlin on GPUs does"
        ),
    }
    run(&mut cmd)
}

/// Test executables a `--lean` round keeps: the collectives' GPU tests.
const LEAN_TESTS: [&str; 7] =
    ["gpu_comm", "gpu_collectives", "gpu_conformance", "gpu_faults", "gpu_sequences", "gpu_smoke", "gpu_nccl_drop_in"];

/// Programs a `--lean` round keeps.
const LEAN_PROGRAMS: [&str; 5] = ["purlin-bench", "quickstart", "latency_floor", "gate_timeline", "smoke"];

/// Bytes the device tool carries: the tracked tree and the round together.
const CARRY_LIMIT: u64 = 64 << 20;

/// Builds ./gpu-round: stripped test executables, the prebuilt sm_90 kernel cache, the
/// calibration scripts and run.sh. On the GPU machine: `bash gpu-round/run.sh` (writes
/// `round.tar.gz` into $OUT, or the directory given as its argument).
///
/// `--lean` keeps only the collectives' GPU tests and programs ([`LEAN_TESTS`],
/// [`LEAN_PROGRAMS`]) and the runtime's kernels without the fp8 reductions (which compile on
/// the GPU machine at a communicator's first set-up if a run needs them), and leaves out the
/// calibration; a full round is over the device tool's 64 MiB.
fn gpu_round(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let mut out = root.join("gpu-round");
    let mut lean = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--lean" => lean = true,
            "--out" => out = PathBuf::from(rest.next().context("--out needs a directory")?),
            _ => bail!("usage: cargo xtask gpu-round [--lean] [--out DIR]"),
        }
    }
    let nvrtc = ensure_nvrtc()?;
    // Start clean, but keep the kernel cache: its keys hash the sources and options, so a
    // CUBIN that is still there is still right, and recompiling all of them takes minutes.
    if out.exists() {
        for entry in std::fs::read_dir(&out)? {
            let path = entry?.path();
            if path.file_name().is_some_and(|n| n == "kernel-cache") {
                continue;
            }
            if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) }
                .with_context(|| format!("clean {}", path.display()))?;
        }
    }
    let bin = out.join("bin");
    std::fs::create_dir_all(&bin)?;

    // Test executables: GPU tests are #[ignore]d and run there with --ignored.
    let json = cargo()
        .args(["test", "--release", "--workspace", "--no-run", "--message-format=json-render-diagnostics"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !json.status.success() {
        bail!("building the test executables failed");
    }
    let mut copied = 0;
    for line in String::from_utf8_lossy(&json.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else { continue };
        let package = msg["package_id"].as_str().unwrap_or_default();
        // Only the project's own crates carry GPU tests.
        if !package.contains("/crates/") && !package.contains("/benches") {
            continue;
        }
        // Only executables with #[ignore]d tests have anything to run there (the round must
        // stay under the device tool's 64 MiB).
        let listed = Command::new(exe).args(["--list", "--ignored"]).output().with_context(|| format!("list {exe}"))?;
        if !String::from_utf8_lossy(&listed.stdout).lines().any(|l| l.ends_with(": test")) {
            continue;
        }
        let target = msg["target"]["name"].as_str().unwrap_or("test");
        if lean && !LEAN_TESTS.contains(&target) {
            continue;
        }
        let kind = msg["target"]["kind"][0].as_str().unwrap_or("test");
        let dest = bin.join(format!("{target}-{kind}"));
        std::fs::copy(exe, &dest).with_context(|| format!("copy {exe}"))?;
        run(Command::new("strip").arg(&dest))?;
        copied += 1;
    }
    if copied == 0 {
        bail!("no test executables found");
    }

    // Example and binary programs (benchmarks, torchrun checks), run by commands.txt lines.
    let json = cargo()
        .args(["build", "--release", "--workspace", "--bins", "--examples", "--message-format=json-render-diagnostics"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cargo build --examples")?;
    if !json.status.success() {
        bail!("building the example and binary programs failed");
    }
    for line in String::from_utf8_lossy(&json.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(exe), Some(name)) = (msg["executable"].as_str(), msg["target"]["name"].as_str()) else { continue };
        if msg["reason"] != "compiler-artifact" || name == "xtask" || (lean && !LEAN_PROGRAMS.contains(&name)) {
            continue;
        }
        let dest = out.join(name);
        std::fs::copy(exe, &dest).with_context(|| format!("copy {exe}"))?;
        run(Command::new("strip").arg(&dest))?;
    }
    std::fs::write(out.join("commands.txt"), COMMANDS_TXT)?;

    // The sm_90 kernel cache, compiled here so the GPU machine loads CUBINs at once.
    let cache = purlin_atom::KernelCache::new(out.join("kernel-cache"));
    let mut jobs: Vec<_> = purlin_collectives::internal::kernels::all_units(purlin_atom::Generation::Hopper)
        .into_iter()
        .filter(|unit| !lean || !(unit.name.contains("e4m3") || unit.name.contains("e5m2")))
        .map(|unit| (unit, purlin_atom::Arch::SM90))
        .collect();
    if !lean {
        // The executor on the generic Atom too (PURLIN_ATOM_GENERATION=generic measures it).
        jobs.extend(
            purlin_collectives::internal::kernels::executor_keys(purlin_atom::AtomSpec::new(
                purlin_atom::Generation::Generic,
            ))
            .iter()
            .map(|k| (k.unit(), purlin_atom::Arch::SM90)),
        );
        // The Atom's standalone kernels of every generation selectable on Hopper (its GPU
        // tests and atom_bench run them all).
        for generation in purlin_atom::Generation::selectable_on(purlin_atom::Arch::SM90) {
            for unit in purlin_atom::sources::standalone_units(&purlin_atom::AtomSpec::new(generation)) {
                jobs.push((unit, purlin_atom::Arch::SM90));
            }
        }
    }
    let compiled = compile_all(&cache, &nvrtc, &jobs)?;
    // CUBINs of earlier sources stay valid under their keys but would only fill the round.
    let keep: std::collections::HashSet<String> = compiled.iter().map(|k| format!("{}.cubin", k.key)).collect();
    for entry in std::fs::read_dir(cache.dir())? {
        let path = entry?.path();
        if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| !keep.contains(n)) {
            std::fs::remove_file(&path).with_context(|| format!("prune {}", path.display()))?;
        }
    }
    eprintln!("kernel cache: {} sm_90 kernels in {}", compiled.len(), cache.dir().display());

    // The same-day calibration (link limits, NCCL through torch) that run.sh runs after the tests.
    if lean {
        eprintln!("--lean: no calibration in the round");
    } else {
        copy_dir(&root.join("xtask/gpu-round/calibration"), &out.join("calibration"))?;
    }
    std::fs::write(out.join("run.sh"), RUN_SH)?;
    std::fs::write(out.join("lane_sweep.sh"), LANE_SWEEP_SH)?;
    std::fs::write(out.join("one_gpu_check.sh"), ONE_GPU_CHECK_SH)?;
    let (size, tracked) = carried_bytes(&out, &root)?;
    println!(
        "gpu-round ready: {} ({copied} test executables, {:.1} MiB; with the tracked tree {:.1} MiB)",
        out.display(),
        size as f64 / 1048576.0,
        (size + tracked) as f64 / 1048576.0
    );
    if size + tracked > CARRY_LIMIT {
        bail!(
            "the round ({size} bytes) and the tracked tree ({tracked} bytes) are over the {CARRY_LIMIT} bytes the device tool carries{}",
            if lean { "" } else { ": try --lean" }
        );
    }
    Ok(())
}

/// Bytes of a round's folder `out` and of the files git tracks under `root`: the device tool
/// carries both, together at most [`CARRY_LIMIT`].
fn carried_bytes(out: &Path, root: &Path) -> Result<(u64, u64)> {
    let size: u64 = walk(out).iter().filter_map(|p| p.metadata().ok()).map(|m| archived_bytes(m.len())).sum();
    Ok((size, tracked_bytes(root)?))
}

/// A file's bytes as an archive holds them: a 512-byte header and the contents in 512-byte
/// blocks. The device tool counts more than the plain sizes: round 133's folder and tree,
/// 62.8 MiB of plain bytes (3 035 tracked files), were refused as over 64 MiB, and 59.9 MiB
/// counted this way went.
fn archived_bytes(len: u64) -> u64 {
    512 + len.div_ceil(512) * 512
}

/// Bytes of the files git tracks under `root` (they travel with every device call), counted
/// as [`archived_bytes`].
fn tracked_bytes(root: &Path) -> Result<u64> {
    let listed = Command::new("git").args(["ls-files", "-z"]).current_dir(root).output().context("git ls-files")?;
    if !listed.status.success() {
        bail!("git ls-files failed");
    }
    Ok(listed
        .stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .filter_map(|p| root.join(String::from_utf8_lossy(p).as_ref()).metadata().ok())
        .map(|m| archived_bytes(m.len()))
        .sum())
}

/// Compiles the runtime's sm_90 units whose names contain FILTER into DIR (default
/// `target/cubin`), to read their SASS (`nvdisasm DIR/*.cubin`) without a GPU.
fn cubin(args: &[String]) -> Result<()> {
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

fn resources(args: &[String]) -> Result<()> {
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
fn compile_all(
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

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() { files.extend(walk(&p)) } else { files.push(p) }
    }
    files
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        if e.path().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name()))?;
        }
    }
    Ok(())
}

const RUN_SH: &str = include_str!("../gpu-round/run.sh");
const COMMANDS_TXT: &str = include_str!("../gpu-round/commands.txt");
const LANE_SWEEP_SH: &str = include_str!("../gpu-round/lane_sweep.sh");
/// Broadcast/Reduce, symmetric and in-place checks on one GPU (two ranks sharing it).
const ONE_GPU_CHECK_SH: &str = include_str!("../gpu-round/one_gpu_check.sh");

#[cfg(test)]
mod tests {
    use super::archived_bytes;

    #[test]
    fn archived_bytes_are_a_header_and_whole_blocks() {
        assert_eq!(archived_bytes(0), 512);
        assert_eq!(archived_bytes(1), 1024);
        assert_eq!(archived_bytes(512), 1024);
        assert_eq!(archived_bytes(513), 1536);
    }
}
