//! `purlin-bench` on Purlin's host executor, end to end through the binary: what
//! `cargo xtask bench` runs on a machine without a GPU (`--host` forces it where GPUs are
//! visible, so this runs the same everywhere). Tiny sizes: every collective, every result
//! checked against the reference computed from the inputs alone, the files written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bench(args: &[&str], out: Option<&Path>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_purlin-bench"));
    c.env("NCCL_NVLS_ENABLE", "0").env_remove("RANK").env_remove("WORLD_SIZE").args(args);
    if let Some(dir) = out {
        c.arg("--out").arg(dir);
    }
    c.output().expect("run purlin-bench")
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("purlin-bench-{name}-{}", std::process::id()))
}

const COLLECTIVES: [&str; 7] =
    ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "all-gather-v", "reduce-scatter-v", "all-to-all-v"];

#[test]
fn host_executor_sweep_checks_every_collective_and_writes_the_files() {
    let dir = tmp("host-e2e");
    let out =
        bench(&["--host", "--max", "1K", "--factor", "8", "--blocks", "1", "--iters", "2", "--runs", "2"], Some(&dir));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");

    // Says why and what runs, on stderr and in the table's header.
    assert!(stderr.contains("Running Purlin's host executor"), "{stderr}");
    assert!(stderr.contains("NCCL columns are absent"), "{stderr}");
    assert!(stderr.contains("[7/7]") || stderr.contains("[21/21]"), "no progress lines: {stderr}");
    let first = stdout.lines().next().unwrap_or("");
    assert!(first.contains("[host executor (no GPU)]"), "{first}");
    assert!(stdout.contains("# purlin blocks per role: 1 (--blocks)"), "{stdout}");
    assert!(stdout.contains("NCCL columns are absent"), "{stdout}");
    assert!(!stdout.contains("| ----- nccl"), "an NCCL column: {stdout}");

    // Every collective at 8, 64 and 512 bytes (all-to-all needs world² elements: from 64),
    // eager only, measured and exact.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(json["meta"]["executor"], "host executor (no GPU)");
    assert_eq!(json["meta"]["world"], 2);
    assert_eq!(json["meta"]["purlin_blocks_per_role"], 1);
    let rows = json["rows"].as_array().unwrap();
    for c in COLLECTIVES {
        let n = rows.iter().filter(|r| r["collective"] == c).count();
        assert!(n >= 2, "{c}: {n} rows");
    }
    for r in rows {
        assert_eq!(r["executor"], "host executor (no GPU)", "{r}");
        assert_eq!(r["mode"], "eager", "{r}");
        let cells = r["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 1, "only purlin: {r}");
        let c = &cells[0];
        assert_eq!((c["backend"].as_str(), c["status"].as_str()), (Some("purlin"), Some("ok")), "{r}");
        assert_eq!(c["wrong"], 0, "{r}");
        assert!(c["time_us"].as_f64().is_some_and(|t| t > 0.0), "{r}");
        assert_eq!(c["runs"], 2, "{r}");
    }
    let data_lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("  ")).collect();
    assert_eq!(data_lines.len(), rows.len());
    assert!(data_lines.iter().all(|l| l.ends_with("| host executor (no GPU)")), "{stdout}");
    assert!(stdout.trim_end().ends_with(&format!("BENCH ok rows={} wrong=0", rows.len())), "{stdout}");

    // The files: CSV (a line per row, labelled, with the blocks), the table, a plot per collective.
    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + rows.len());
    assert!(
        csv.lines().skip(1).all(|l| l.contains(",purlin,ok,") && l.contains(",host executor (no GPU),1,")),
        "{csv}"
    );
    assert_eq!(std::fs::read_to_string(dir.join("table.txt")).unwrap(), stdout);
    for c in COLLECTIVES {
        let png = std::fs::read(dir.join(format!("plot-{c}-eager.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{c}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn host_executor_reports_what_it_cannot_reduce_and_graph_mode() {
    // f64 reductions: the host Atom does not reduce f64 (a typed refusal, the same on every
    // rank); gathers of f64 run. Graph mode needs a GPU.
    let out = bench(
        &[
            "--host",
            "--collective",
            "all-reduce,all-gather",
            "--dtype",
            "f64",
            "--min",
            "64",
            "--max",
            "64",
            "--mode",
            "both",
            "--world",
            "3",
        ],
        None,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("world 3"), "{stdout}");
    assert!(stdout.contains("#   purlin: all-reduce of F64: the Atom reduces"), "{stdout}");
    assert!(stdout.contains("#   purlin: graph mode needs a GPU"), "{stdout}");
    // The all-gather eager row is measured and exact.
    let ag_eager = stdout
        .lines()
        .skip_while(|l| !l.starts_with("# all-gather  f64  none  eager"))
        .find(|l| l.starts_with("  "))
        .unwrap_or("");
    let words: Vec<&str> = ag_eager.split_whitespace().collect();
    assert_eq!(words.get(9), Some(&"0"), "#wrong of {ag_eager:?}");
    assert!(stdout.trim_end().ends_with("wrong=0"), "{stdout}");
}

#[test]
fn without_purlin_there_is_nothing_to_measure_and_it_says_why() {
    let out = bench(&["--host", "--backends", "nccl,nccl-symm"], None);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("nothing to measure"), "{stderr}");
    assert!(stdout.contains("# nccl: unavailable (NCCL needs GPUs"), "{stdout}");
    assert!(stdout.trim_end().ends_with("BENCH ok rows=0 wrong=0"), "{stdout}");
}

/// Runs a small host sweep (8 B, 512 B and 32 KiB; 2 iterations, 2 runs) with `args` into
/// `dir`, checks it succeeded, and returns its stdout and the rows of `results.json`.
fn small_sweep(args: &[&str], dir: &std::path::Path) -> (String, Vec<serde_json::Value>) {
    let mut all = vec!["--host", "--max", "64K", "--factor", "64", "--iters", "2", "--runs", "2"];
    all.extend(args);
    let out = bench(&all, Some(dir));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let rows = json["rows"].as_array().unwrap().clone();
    (stdout.into_owned(), rows)
}

/// The rooted collectives, named (`all` leaves them out): Broadcast and Reduce from root 0,
/// out of place and in place, every result checked (a peer's Reduce output is not compared:
/// it receives nothing).
#[test]
fn host_executor_runs_broadcast_and_reduce_when_named() {
    for in_place in [false, true] {
        let dir = tmp(if in_place { "rooted-in-place" } else { "rooted" });
        let mut args = vec!["--world", "3", "--collective", "broadcast,reduce"];
        if in_place {
            args.push("--in-place");
        }
        let (stdout, rows) = small_sweep(&args, &dir);
        for c in ["broadcast", "reduce"] {
            assert_eq!(rows.iter().filter(|r| r["collective"] == c).count(), 3, "{c}: {stdout}");
        }
        for r in &rows {
            assert_eq!(r["cells"][0]["status"], "ok", "{r}");
            assert_eq!(r["cells"][0]["wrong"], 0, "{r}");
        }
        assert!(stdout.trim_end().ends_with("BENCH ok rows=6 wrong=0"), "{stdout}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// `--collective send-recv` (nccl-tests' `sendrecv_perf`) runs at world 2, on plain and
/// symmetric buffers, every row checked; at world 3 every row says unsupported, with why.
#[test]
fn host_executor_runs_send_recv_at_world_2_only() {
    for (world, symmetric) in [("2", false), ("2", true), ("3", false)] {
        let dir = tmp(&format!("send-recv-{world}-{symmetric}"));
        let mut args = vec!["--world", world, "--collective", "send-recv"];
        if symmetric {
            args.push("--symmetric");
        }
        let (stdout, rows) = small_sweep(&args, &dir);
        assert_eq!(rows.iter().filter(|r| r["collective"] == "send-recv").count(), 3, "{stdout}");
        let want = if world == "2" { "ok" } else { "unsupported" };
        for r in &rows {
            assert_eq!(r["cells"][0]["status"], want, "{r}");
            if want == "ok" {
                assert_eq!(r["cells"][0]["wrong"], 0, "{r}");
            }
        }
        if world == "3" {
            assert!(stdout.contains("all_to_all_v"), "the reason is shown: {stdout}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
