//! The `purlin-bench` binary as a user meets it: bad arguments exit 2 with the usage; a tiny
//! sweep exits cleanly and writes valid results (with GPUs it measures a few all-reduce
//! sizes; without one, Purlin's host executor, and says so).

use std::process::Command;

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_purlin-bench"));
    c.env("NCCL_NVLS_ENABLE", "0");
    c
}

#[test]
fn bad_arguments_exit_2_with_usage() {
    let out = bench().args(["--collective", "gather"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown collective \"gather\""), "{err}");
    assert!(err.contains("usage: purlin-bench"), "{err}");
}

#[test]
fn help_lists_every_flag() {
    let out = bench().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--collective",
        "--dtype",
        "--op",
        "--min",
        "--max",
        "--mode",
        "--launcher",
        "--world",
        "--warmup",
        "--iters",
        "--blocks",
        "--skew",
        "--out",
        "--quick",
        "--backends",
        "--host",
        "--symmetric",
        "--in-place",
    ] {
        assert!(text.contains(flag), "{flag} missing from --help");
    }
}

#[test]
fn a_tiny_sweep_writes_valid_results() {
    let dir = std::env::temp_dir().join(format!("purlin-bench-cli-{}", std::process::id()));
    let out = bench()
        .args(["--quick", "--max", "64", "--collective", "all-reduce", "--launcher", "none", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.lines().last().unwrap_or("").starts_with("BENCH ok"), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert!(json["meta"]["command"].as_str().unwrap().contains("--collective all-reduce"));
    assert!(json["meta"]["commit"].as_str().unwrap().len() >= 7);
    // With GPUs it measures them; without one, Purlin's host executor, saying so.
    assert!(!json["rows"].as_array().unwrap().is_empty(), "{stdout}");
    if json["meta"]["executor"] != "gpu" {
        assert_eq!(json["meta"]["executor"], "host executor (no GPU)");
        assert!(stderr.contains("no GPU"), "{stderr}");
        assert!(json["meta"]["notes"][0].as_str().unwrap().contains("no GPU"));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `--symmetric` on the host executor: Purlin's buffers are host symmetric memory
/// (`CpuComm::alloc_symmetric`), so 1 MiB calls take the one-copy plans; every row is checked
/// against the reference (a wrong result fails the run) and says symmetric.
#[test]
fn symmetric_on_the_host_executor_runs_symmetric_buffers() {
    let dir = std::env::temp_dir().join(format!("purlin-bench-cli-symmetric-{}", std::process::id()));
    let out = bench()
        .args(["--host", "--symmetric", "--quick", "--min", "1M", "--max", "1M", "--launcher", "none"])
        .args(["--collective", "all-gather,reduce-scatter,all-reduce,all-to-all"])
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.lines().last().unwrap_or("").starts_with("BENCH ok"), "{stdout}");
    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let placement = csv.lines().next().unwrap().split(',').position(|c| c == "placement").unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 4, "{csv}");
    for row in rows {
        assert_eq!(row.split(',').nth(placement), Some("out-of-place symmetric"), "{row}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
