//! `purlin-bench`: Purlin's collectives beside NCCL (plain, and with symmetric windows),
//! nccl-tests style. `purlin-bench --help` lists the flags; the README's Benchmark section
//! says how to run and read it.
//!
//! Without a GPU it runs Purlin's host executor (`CpuComm`, a thread per rank) and says so.
//! Progress goes to stderr, the table to stdout, files to `--out DIR`. Every wait is bounded
//! (`--timeout`), so it finishes (or fails, saying why) when run unattended.

use anyhow::Result;
use purlin_benches::backend::BackendKind;
use purlin_benches::cli::{self, Args};
use purlin_benches::launch::{Launched, launch};
use purlin_benches::report::{self, Meta};
use purlin_benches::run::Row;
use std::process::ExitCode;

fn main() -> ExitCode {
    if let Err(e) = purlin_log::init() {
        eprintln!("purlin-bench: {e}");
        return ExitCode::from(2);
    }
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match cli::parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("purlin-bench: {e:#}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    if args.help {
        print!("{}", cli::USAGE);
        return ExitCode::SUCCESS;
    }
    // Never NVLink multicast (NCCL's NVLS): set before any NCCL call, in every rank.
    match std::env::var("NCCL_NVLS_ENABLE") {
        Ok(v) if v.trim() == "0" => {}
        other => {
            if let Ok(v) = other {
                eprintln!("purlin-bench: NCCL_NVLS_ENABLE={v} overridden to 0 (NVLink multicast is never used here)");
            }
            // SAFETY: set before this process starts any thread or loads NCCL.
            unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
        }
    }
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("purlin-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The table's columns: the sweep as run (without a GPU: Purlin's host executor only).
fn columns(args: &Args, meta: &Meta) -> Vec<BackendKind> {
    meta.config.as_ref().map_or_else(|| args.config.backends.clone(), |c| c.backends.clone())
}

fn run(args: Args) -> Result<ExitCode> {
    match launch(&args)? {
        Launched::NoGpu { meta } => {
            print!("{}", report::table(&[], &columns(&args, &meta), &meta));
            write_files(&args, &meta, &[]);
            Ok(ExitCode::SUCCESS)
        }
        Launched::OtherRank { rank, error } => match error {
            Some(e) => {
                eprintln!("purlin-bench rank {rank}: {e}");
                Ok(ExitCode::FAILURE)
            }
            None => Ok(ExitCode::SUCCESS),
        },
        Launched::Rank0 { meta, rows, started } => {
            print!("{}", report::table(&rows, &columns(&args, &meta), &meta));
            write_files(&args, &meta, &rows);
            if let Some(e) = &meta.error {
                eprintln!("purlin-bench: stopped: {e}");
            }
            eprintln!("purlin-bench: done in {:.1} s", started.elapsed().as_secs_f64());
            let wrong: u64 = rows.iter().flat_map(|r| &r.cells).filter_map(|c| c.wrong).sum();
            Ok(if meta.error.is_some() || wrong > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
        }
    }
}

fn write_files(args: &Args, meta: &Meta, rows: &[Row]) {
    if let Some(dir) = &args.out {
        match report::write_all(dir, rows, &columns(args, meta), meta) {
            Ok(files) => eprintln!("purlin-bench: wrote {}", files.join(", ")),
            Err(e) => eprintln!("purlin-bench: could not write results: {e:#}"),
        }
    }
}
