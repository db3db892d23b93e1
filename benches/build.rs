//! Embeds the git commit the benchmark is built from ("unknown" outside a checkout).

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PURLIN_BENCH_COMMIT={commit}");
    // Rebuild when HEAD moves (a commit, a checkout). Where git could not answer, watch the
    // workspace's .git anyway: a script that failed once (no repository yet) would otherwise
    // keep "unknown" until build.rs itself changed.
    let dir = Command::new("git")
        .args(["rev-parse", "--git-dir"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "../.git".into());
    println!("cargo:rerun-if-changed={dir}/HEAD");
    println!("cargo:rerun-if-changed={dir}/refs/heads");
    println!("cargo:rerun-if-changed=build.rs");
}
