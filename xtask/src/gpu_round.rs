//! `cargo xtask gpu-round`: one folder that a GPU round carries to the GPU machine.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use xtask::workspace_root;

use crate::{cargo, ensure_nvrtc, kernels::compile_all, run};

/// Test executables a `--lean` round keeps: the collectives' core GPU tests (the others go in
/// rounds of their own, `--tests`: gpu_on_stream, gpu_flight_recorder, gpu_mixed_forms,
/// gpu_group_graph, gpu_symmetric_slices, gpu_copy_engine, gpu_copy_engine_plans, gpu_hier).
const LEAN_TESTS: [&str; 8] = [
    "gpu_comm",
    "gpu_collectives",
    "gpu_conformance",
    "gpu_faults",
    "gpu_sequences",
    "gpu_smoke",
    "gpu_nccl_drop_in",
    "gpu_fused",
];

/// Programs a `--lean` round keeps.
const LEAN_PROGRAMS: [&str; 7] = [
    "purlin-bench",
    "quickstart",
    "latency_floor",
    "gate_timeline",
    "smoke",
    "fused_bias_gelu",
    "fused_gather_consume",
];

/// Bytes the device tool carries: the tracked tree and the round together.
pub(crate) const CARRY_LIMIT: u64 = 64 << 20;

/// Builds ./gpu-round: stripped test executables, the prebuilt sm_90 kernel cache, the
/// calibration scripts and run.sh. On the GPU machine: `bash gpu-round/run.sh` (writes
/// `round.tar.gz` into $OUT, or the directory given as its argument).
///
/// `--lean` keeps only the collectives' GPU tests and programs ([`LEAN_TESTS`],
/// [`LEAN_PROGRAMS`]) and the runtime's kernels without the fp8 reductions (which compile on
/// the GPU machine at a communicator's first set-up if a run needs them), and leaves out the
/// calibration; a full round is over the device tool's 64 MiB.
pub(crate) fn gpu_round(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let mut out = root.join("gpu-round");
    let mut lean = false;
    // `--tests a,b`: these test executables only (a lean round of other tests; the 64 MiB
    // carry holds about eight).
    let mut only: Option<Vec<String>> = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--lean" => lean = true,
            "--out" => out = PathBuf::from(rest.next().context("--out needs a directory")?),
            "--tests" => {
                let list = rest.next().context("--tests needs a comma-separated list")?;
                only = Some(list.split(',').map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect());
                lean = true;
            }
            _ => bail!("usage: cargo xtask gpu-round [--lean] [--tests NAME,NAME] [--out DIR]"),
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
        let wanted = match &only {
            Some(list) => list.iter().any(|t| t == target),
            None => !lean || LEAN_TESTS.contains(&target),
        };
        if !wanted {
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
pub(crate) fn carried_bytes(out: &Path, root: &Path) -> Result<(u64, u64)> {
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
