//! `cargo xtask ab-round [--out DIR] [--sweeps FILE] [--reps N] [--bench-only REF]... BASE CANDIDATE...`: builds an
//! A/B round of git refs (branches, commits) for the GPU machine, in one folder:
//!
//! - `purlin-bench-<variant>` per ref, built from its own checkout (a `git worktree` under
//!   `target/ab-src/`, one shared `target/ab-build/`, so dependencies build once);
//! - each candidate's `gpu_atom`, `gpu_collectives`, `gpu_conformance`, `gpu_sequences`
//!   and `gpu_faults` tests under
//!   `bin/<variant>/` (the baseline's are main's: the rounds that landed ran them; none for a
//!   `--bench-only` ref, a control that will not land, whose 11 MiB of tests would crowd the
//!   64 MiB the device tool carries);
//! - `kernels.tgz`: every ref's sm_90 kernels (of the fp8 reductions only sum's; the others
//!   compile on the GPU machine if a run needs them), compiled here by that ref's own `cargo xtask cubin`
//!   into `target/ab-kernel-cache/` (kept between rounds: its keys hash the sources);
//! - `variants.txt`, `sweeps.txt` (`xtask/ab-round/sweeps.txt` unless `--sweeps`), `run.sh`,
//!   `compare.py`, and `reps` with `--reps` (repeats of each sweep; run.sh's default is 2).
//!
//! On the GPU machine `bash DIR/run.sh "$OUT"` runs every sweep for every variant,
//! interleaved, then the candidates' tests, and prints each candidate's deltas against the
//! baseline last. A variant's name is its ref with every character other than a letter, a
//! digit or `.` turned into `-`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::gpu_round::{CARRY_LIMIT, carried_bytes};
use crate::{cargo_in, ensure_nvrtc, run, workspace_root};

const RUN_SH: &str = include_str!("../ab-round/run.sh");
const COMPARE_PY: &str = include_str!("../ab-round/compare.py");
const SWEEPS_TXT: &str = include_str!("../ab-round/sweeps.txt");

/// The GPU tests each candidate runs, as (package, test, the test's name in refs from before
/// the `gpu_*` names): the Atom against the host Atom, and every collective and dtype checked
/// exactly.
const CANDIDATE_TESTS: [(&str, &str, &str); 5] = [
    ("purlin-atom", "gpu_atom", "atom_gpu"),
    ("purlin-collectives", "gpu_collectives", "device_collectives"),
    ("purlin-collectives", "gpu_conformance", "device_conformance"),
    ("purlin-collectives", "gpu_sequences", "device_sequences"),
    ("purlin-collectives", "gpu_faults", "device_faults"),
];

const USAGE: &str =
    "usage: cargo xtask ab-round [--out DIR] [--sweeps FILE] [--reps N] [--bench-only REF]... BASE CANDIDATE...";

pub(crate) fn ab_round(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let mut out = root.join("target/ab-round");
    let mut sweeps = SWEEPS_TXT.to_string();
    let mut reps: Option<u32> = None;
    let mut refs = Vec::new();
    let mut bench_only = BTreeSet::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--out" => out = PathBuf::from(rest.next().context(USAGE)?),
            "--sweeps" => {
                let path = rest.next().context(USAGE)?;
                sweeps = std::fs::read_to_string(path).with_context(|| format!("read {path}"))?;
            }
            "--reps" => reps = Some(rest.next().context(USAGE)?.parse().context("--reps needs a count")?),
            "--bench-only" => {
                bench_only.insert(rest.next().context(USAGE)?.clone());
            }
            flag if flag.starts_with("--") => bail!("{USAGE}"),
            git_ref => refs.push(git_ref.to_string()),
        }
    }
    if refs.len() < 2 {
        bail!("{USAGE}: a baseline and at least one candidate");
    }
    if let Some(stray) = bench_only.iter().find(|r| !refs[1..].contains(r)) {
        bail!("--bench-only {stray}: not a candidate of this round ({USAGE})");
    }
    let names: Vec<String> = refs.iter().map(|r| variant_name(r)).collect();
    if names.iter().collect::<BTreeSet<_>>().len() != names.len() {
        bail!("two refs give the same variant name: {names:?}");
    }
    let nvrtc = ensure_nvrtc()?;
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clean {}", out.display()))?;
    }
    std::fs::create_dir_all(&out)?;
    let build_dir = root.join("target/ab-build");
    let cache_dir = root.join("target/ab-kernel-cache");
    let mut kernels = BTreeSet::new();
    let mut variants = String::from("# variant ref commit (the first is the baseline)\n");
    for (i, (git_ref, name)) in refs.iter().zip(&names).enumerate() {
        let commit = git(&root, &["rev-parse", "--verify", &format!("{git_ref}^{{commit}}")])?;
        eprintln!("== {name}: {git_ref} at {commit}");
        variants += &format!("{name} {git_ref} {commit}\n");
        let tree = root.join("target/ab-src").join(name);
        checkout(&root, &tree, &commit)?;

        let bench = build(&tree, &build_dir, &["build", "--release", "-p", "purlin-benches", "--bin", "purlin-bench"])?;
        let bench = bench.into_iter().find(|(target, _)| target == "purlin-bench").context("no purlin-bench built")?;
        copy_stripped(&bench.1, &out.join(format!("purlin-bench-{name}")))?;

        if i > 0 && !bench_only.contains(git_ref) {
            for (package, test, before) in CANDIDATE_TESTS {
                let renamed = tree.join("crates").join(package).join("tests").join(format!("{test}.rs")).exists();
                let target = if renamed { test } else { before };
                let tests =
                    build(&tree, &build_dir, &["test", "--release", "-p", package, "--no-run", "--test", target])?;
                let (_, exe) = tests
                    .iter()
                    .find(|(t, _)| t == target)
                    .with_context(|| format!("{git_ref} has no test {target}"))?;
                copy_stripped(exe, &out.join("bin").join(name).join(format!("{test}-test")))?;
            }
        }

        // That ref's kernels, by its own sources: its `cargo xtask cubin` prints each path.
        let listed = cargo_in(&tree)
            .args(["xtask", "cubin", "hopper"])
            .arg(&cache_dir)
            .env("CARGO_TARGET_DIR", &build_dir)
            .env(purlin_atom::nvrtc::NVRTC_DIR_ENV, &nvrtc)
            .stderr(std::process::Stdio::inherit())
            .output()
            .with_context(|| format!("{git_ref}: cargo xtask cubin"))?;
        if !listed.status.success() {
            bail!("{git_ref}: cargo xtask cubin failed");
        }
        kernels.extend(
            String::from_utf8_lossy(&listed.stdout)
                .lines()
                .filter(|l| {
                    l.ends_with(".cubin") && (l.contains("_sum_") || !(l.contains("e4m3") || l.contains("e5m2")))
                })
                .map(PathBuf::from),
        );
    }

    // Kernels are shared between refs where their sources agree (the same key).
    let mut list = String::new();
    for path in &kernels {
        list += &path.file_name().context("a kernel path without a file name")?.to_string_lossy();
        list.push('\n');
    }
    let list_path = root.join("target/ab-kernels.txt");
    std::fs::write(&list_path, list)?;
    run(Command::new("tar")
        .arg("czf")
        .arg(out.join("kernels.tgz"))
        .arg("-C")
        .arg(&cache_dir)
        .arg("-T")
        .arg(&list_path))?;
    if let Some(reps) = reps {
        std::fs::write(out.join("reps"), format!("{reps}\n"))?;
    }
    std::fs::write(out.join("sweeps.txt"), sweeps)?;
    std::fs::write(out.join("variants.txt"), variants)?;
    std::fs::write(out.join("run.sh"), RUN_SH)?;
    std::fs::write(out.join("compare.py"), COMPARE_PY)?;

    let (size, tracked) = carried_bytes(&out, &root)?;
    println!(
        "ab-round ready: {} ({} variants, {} kernels, {:.1} MiB; with the tracked tree {:.1} MiB). On the GPU machine: bash {}/run.sh \"$OUT\"",
        out.display(),
        names.len(),
        kernels.len(),
        size as f64 / 1048576.0,
        (size + tracked) as f64 / 1048576.0,
        out.strip_prefix(&root).unwrap_or(&out).display()
    );
    if size + tracked > CARRY_LIMIT {
        bail!(
            "the round ({size} bytes) and the tracked tree ({tracked} bytes) are over the {CARRY_LIMIT} bytes the device tool carries: fewer variants"
        );
    }
    Ok(())
}

/// A ref as a file-name-safe variant name: `exp/bf16-spills` → `exp-bf16-spills`.
fn variant_name(git_ref: &str) -> String {
    git_ref.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' }).collect()
}

fn git(root: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git").args(args).current_dir(root).output().context("run git")?;
    if !out.status.success() {
        bail!("git {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A detached worktree of `commit` at `tree`, replacing whatever was there.
fn checkout(root: &Path, tree: &Path, commit: &str) -> Result<()> {
    let tree_arg = tree.to_str().context("a worktree path that is not UTF-8")?;
    if tree.exists() {
        // Not registered (a copied target/) or stale: both ways out, then a fresh one.
        let _ = git(root, &["worktree", "remove", "--force", tree_arg]);
        if tree.exists() {
            std::fs::remove_dir_all(tree).with_context(|| format!("remove {}", tree.display()))?;
        }
    }
    git(root, &["worktree", "prune"])?;
    git(root, &["worktree", "add", "--detach", tree_arg, commit])?;
    Ok(())
}

/// Runs `cargo ARGS --message-format=json-render-diagnostics` in `tree` with the shared
/// target directory; returns each built executable as (target name, path).
fn build(tree: &Path, build_dir: &Path, args: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let json = cargo_in(tree)
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .env("CARGO_TARGET_DIR", build_dir)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cargo {args:?}"))?;
    if !json.status.success() {
        bail!("cargo {args:?} in {} failed", tree.display());
    }
    let mut built = Vec::new();
    for line in String::from_utf8_lossy(&json.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        if let (Some(exe), Some(target)) = (msg["executable"].as_str(), msg["target"]["name"].as_str()) {
            built.push((target.to_string(), PathBuf::from(exe)));
        }
    }
    Ok(built)
}

fn copy_stripped(from: &Path, to: &Path) -> Result<()> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::copy(from, to).with_context(|| format!("copy {}", from.display()))?;
    run(Command::new("strip").arg(to))
}

#[cfg(test)]
mod tests {
    use super::variant_name;

    #[test]
    fn variant_names_are_file_name_safe() {
        assert_eq!(variant_name("main"), "main");
        assert_eq!(variant_name("exp/bf16-spills"), "exp-bf16-spills");
        assert_eq!(variant_name("HEAD~2"), "HEAD-2");
        assert_eq!(variant_name("v1.2"), "v1.2");
    }
}
