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
        "--quiet",
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

/// The progress lines end in the sweep's ETA (`done` on the last); `--quiet` drops them and
/// nothing else (the table and the final line stay).
#[test]
fn progress_lines_carry_an_eta_and_quiet_silences_them() {
    let run = |quiet: bool| {
        let mut c = bench();
        c.args(["--quick", "--max", "64", "--collective", "all-reduce", "--launcher", "none", "--host"]);
        if quiet {
            c.arg("--quiet");
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (stdout, stderr) = run(false);
    let cases: Vec<&str> = stderr.lines().filter(|l| l.contains("] all-reduce")).collect();
    assert!(cases.len() >= 2, "{stderr}");
    assert!(cases[..cases.len() - 1].iter().all(|l| l.contains("  ETA ")), "{stderr}");
    assert!(cases.last().is_some_and(|l| l.ends_with("  done")), "{stderr}");
    let (quiet_stdout, quiet_stderr) = run(true);
    assert!(!quiet_stderr.contains("] all-reduce") && !quiet_stderr.contains("ETA"), "{quiet_stderr}");
    assert!(quiet_stderr.contains("done in"), "{quiet_stderr}");
    assert_eq!(stdout.lines().last(), quiet_stdout.lines().last());
}

#[test]
fn the_eta_is_the_mean_case_time_times_the_cases_left() {
    use purlin_benches::run::eta;
    use std::time::Duration;
    assert_eq!(eta(Duration::from_secs(10), 2, 10), "  ETA 40s");
    assert_eq!(eta(Duration::from_secs(65), 1, 2), "  ETA 1m05s");
    assert_eq!(eta(Duration::from_secs(3600), 1, 3), "  ETA 2h00m");
    assert_eq!(eta(Duration::from_secs(3), 4, 4), "  done");
    assert_eq!(eta(Duration::ZERO, 0, 4), "");
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
