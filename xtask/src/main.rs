//! `cargo xtask <command>`: Purlin's workflows.
//!
//! - `nvrtc`      install the pinned NVRTC wheel under target/ (if no libnvrtc is found there)
//! - `test`       set NVRTC up, then `cargo test --workspace` (the README's test command);
//!   `test --full` also runs the host executor's full matrix (ignored by default: minutes)
//! - `verify`     the SNAC verifier's tests; `verify --full` adds the larger exhaustive set;
//!   `verify --fuzz N [--seed S] [--save DIR]` the verifier against the reference checker on
//!   N randomly edited plan sets
//! - `gpu-round`  build everything a GPU round needs into ./gpu-round (docs/dev/gpu-rounds.md);
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
mod gpu_round;
mod kernels;
mod verify;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = args.split_first().map(|(c, r)| (c.as_str(), r)).unwrap_or(("help", &[]));
    match cmd {
        "nvrtc" => ensure_nvrtc().map(|dir| println!("NVRTC: {}", dir.display())),
        "test" => test(rest),
        "verify" => verify(rest),
        "gpu-round" => gpu_round::gpu_round(rest),
        "bench" => bench(rest),
        "cubin" => kernels::cubin(rest),
        "resources" => kernels::resources(rest),
        "ab-round" => ab_round::ab_round(rest),
        _ => {
            eprintln!(
                "usage: cargo xtask <nvrtc | test [cargo test args] | verify [--full | --fuzz N] | gpu-round [--lean] [--out DIR] | bench [bench args] | cubin FILTER [DIR] | resources [FILTER] | ab-round [--out DIR] [--sweeps FILE] [--reps N] BASE CANDIDATE...>"
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
    if verify::fuzz(args)? {
        return Ok(());
    }
    let full = match args {
        [] => false,
        [f] if f == "--full" => true,
        _ => bail!("usage: cargo xtask verify [--full | --fuzz N [--seed S] [--save DIR]]"),
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
