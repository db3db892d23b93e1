//! The command line of `purlin-bench`.

use std::path::PathBuf;

use anyhow::{Result, bail};

use crate::backend::BackendKind;
use crate::run::Config;
use crate::spec::{self, Collective, Dtype, Mode, Op, parse_size};

/// How the ranks are launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// torchrun's variables (`RANK`, `WORLD_SIZE`) decide.
    Auto,
    /// One process, one thread per GPU.
    None,
    /// One process per GPU, started by torchrun.
    Torchrun,
}

/// The parsed command line.
#[derive(Clone, Debug)]
pub struct Args {
    /// The sweep.
    pub config: Config,
    /// The launcher.
    pub launcher: Launcher,
    /// Ranks (one process: GPUs 0..world; default all visible GPUs).
    pub world: Option<usize>,
    /// Where CSV, JSON and PNG go.
    pub out: Option<PathBuf>,
    /// `--quick` was given.
    pub quick: bool,
    /// `--help` was given.
    pub help: bool,
    /// `--quiet` was given: no progress lines on stderr.
    pub quiet: bool,
    /// Run the calibration probe (one process, at least 2 GPUs) before the sweep.
    pub probe: bool,
    /// `--host` was given: run Purlin's host executor even where GPUs are visible.
    pub host: bool,
    /// The flags given on the command line (`--max`, `--mode`, ...), so the host path's
    /// defaults apply only to what the user left unset.
    pub given: Vec<String>,
}

impl Args {
    /// Whether `flag` (e.g. `"--max"`) was on the command line.
    pub fn gave(&self, flag: &str) -> bool {
        self.given.iter().any(|f| f == flag)
    }
}

/// `--help`.
pub const USAGE: &str = "\
purlin-bench: Purlin's collectives beside NCCL (plain and symmetric windows), nccl-tests style.

usage: purlin-bench [options]          one process, one thread per GPU
       python3 -m torch.distributed.run --no-python --nproc-per-node N purlin-bench [options]

  --collective LIST  all | all-reduce,all-gather,reduce-scatter,all-to-all,
                     all-gather-v,reduce-scatter-v,all-to-all-v        [all]
                     and, named only, broadcast,reduce (root 0) and
                     send-recv (to rank + 1, from rank − 1; Purlin: world 2)
  --dtype T          f32 f16 bf16 f64 i8 u8 i32 u32 i64 u64 e4m3 e5m2  [f32]
  --op OP            sum prod min max avg (reducing collectives)       [sum]
  --min SIZE         smallest size, bytes (8, 1K, 64M, 1G)             [8]
  --max SIZE         largest size                                      [1G]
  --factor N         size step                                         [2]
  --mode M           eager | graph | both                              [both]
  --launcher L       none | torchrun (default: torchrun if RANK is set)
  --world N          ranks (one process: GPUs 0..N-1)                  [all GPUs]
  --warmup N         warm-up calls                                     [5]
  --iters N          back-to-back calls per timed run                  [20]
  --runs N           most timed runs per size (median, p99 over runs)  [30]
  --min-runs N       fewest timed runs                                 [5]
  --budget SECS      timed seconds aimed at per size/backend/mode      [0.5]
  --blocks N         Purlin's blocks per role (tuning's blocks_per_role; NCCL keeps
                     its own tuning)        [GPU: 16 or PURLIN_BLOCKS_PER_ROLE; host: 2]
  --skew S           Zipf exponent of the V forms' partition sizes     [1.0]
  --in-place         every call in place, NCCL's convention (nccl-tests' in-place
                     columns): AllReduce on one buffer, AllGather with the rank's
                     part already in the output, ReduceScatter into the rank's part
                     of the input, Broadcast and Reduce on the root's buffer;
                     AllToAll and the V forms: unsupported
  --symmetric        Purlin's send and receive buffers are symmetric memory
                     (Comm::alloc_symmetric): calls that would be staged take the
                     one-copy path (stores into the peers' outputs, reductions
                     from their inputs), as NCCL's symmetric baseline uses
                     registered windows
  --backends LIST    purlin,nccl,nccl-symm | all                       [all]
  --timeout SECS     bound on every wait (a stuck peer stops the run)  [120]
  --seed N           input seed                                        [1]
  --out DIR          write results.csv, results.json, table.txt, plot-*.png
  --no-probe         skip the calibration probe (one process: copy-engine GPU0<->GPU1)
  --quick            8 B..32 MiB x4 steps, warmup 2, iters 10, runs <= 10, budget 0.1 s
                     (flags after --quick override it)
  --host             run Purlin's host executor (CpuComm) even where GPUs are visible
  --quiet, -q        no progress lines (each case's line with the sweep's ETA) on stderr

Without a GPU (no CUDA driver or no device) purlin-bench runs Purlin's host executor
(purlin_collectives::CpuComm: one thread per rank, --world ranks [2]) and says so; there
are no NCCL columns. Its defaults, where the flag is not given: --max 4M, --mode eager,
--warmup 2, --iters 10, --runs 10, --min-runs 3, --budget 0.05.

size = nccl-tests' size: all-reduce the buffer, all-gather(-v) the whole output,
reduce-scatter(-v) and all-to-all(-v) the whole input of one rank.
busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for the others.
";

fn default_config() -> Config {
    Config {
        collectives: Collective::ALL.to_vec(),
        dtype: Dtype::F32,
        op: Op::Sum,
        min_bytes: 8,
        max_bytes: 1 << 30,
        factor: 2,
        modes: vec![Mode::Eager, Mode::Graph],
        warmup: 5,
        iters: 20,
        max_runs: 30,
        min_runs: 5,
        budget_s: 0.5,
        blocks: None,
        skew: 1.0,
        in_place: false,
        symmetric: false,
        backends: BackendKind::ALL.to_vec(),
        timeout_s: 120.0,
        seed: 1,
        executor: crate::run::Executor::Gpu,
    }
}

fn apply_quick(c: &mut Config) {
    c.max_bytes = 64 << 20;
    c.factor = 4;
    c.warmup = 2;
    c.iters = 10;
    c.max_runs = 10;
    c.min_runs = 3;
    c.budget_s = 0.1;
}

/// The host executor's defaults (`--max` 4 MiB, eager only, short runs), applied to every
/// flag the command line did not give: without a GPU the sweep runs on CPU threads, and
/// `cargo xtask bench` should still finish within a minute on a two-core machine.
pub fn host_config(args: &Args) -> Config {
    let mut c = args.config.clone();
    let unset = |f: &str| !args.gave(f);
    if unset("--max") {
        c.max_bytes = c.max_bytes.min(HOST_MAX_BYTES);
        c.min_bytes = c.min_bytes.min(c.max_bytes);
    }
    if unset("--mode") {
        c.modes = vec![Mode::Eager];
    }
    if unset("--warmup") {
        c.warmup = 2;
    }
    if unset("--iters") {
        c.iters = 10;
    }
    if unset("--runs") {
        c.max_runs = 10;
    }
    if unset("--min-runs") {
        c.min_runs = 3.min(c.max_runs);
    }
    if unset("--budget") {
        c.budget_s = 0.05;
    }
    c.backends.retain(|b| *b == BackendKind::Purlin);
    c.executor = crate::run::Executor::Host;
    c
}

/// The host executor's largest size unless `--max` is given.
pub const HOST_MAX_BYTES: usize = 4 << 20;

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T> {
    match v.trim().parse() {
        Ok(x) => Ok(x),
        Err(_) => bail!("{flag}: bad number {v:?}"),
    }
}

/// Parses the arguments (without the program name).
pub fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        config: default_config(),
        launcher: Launcher::Auto,
        world: None,
        out: None,
        quick: false,
        help: false,
        quiet: false,
        probe: true,
        host: false,
        given: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (flag.clone(), None),
        };
        if flag.starts_with("--") {
            a.given.push(flag.clone());
        }
        if flag == "--host" {
            a.host = true;
            continue;
        }
        if flag == "--quick" {
            a.quick = true;
            apply_quick(&mut a.config);
            continue;
        }
        if flag == "--no-probe" {
            a.probe = false;
            continue;
        }
        if flag == "--in-place" {
            a.config.in_place = true;
            continue;
        }
        if flag == "--symmetric" {
            a.config.symmetric = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            a.help = true;
            continue;
        }
        if flag == "--quiet" || flag == "-q" {
            a.quiet = true;
            continue;
        }
        let mut value = || -> Result<String> {
            match inline.clone().or_else(|| it.next().cloned()) {
                Some(v) => Ok(v),
                None => bail!("{flag} needs a value"),
            }
        };
        let c = &mut a.config;
        match flag.as_str() {
            "--collective" | "--collectives" => c.collectives = spec::parse_collectives(&value()?)?,
            "--dtype" => c.dtype = spec::parse_dtype(&value()?)?,
            "--op" => c.op = spec::parse_op(&value()?)?,
            "--min" => c.min_bytes = parse_size(&value()?)?,
            "--max" => c.max_bytes = parse_size(&value()?)?,
            "--factor" => c.factor = num(&flag, &value()?)?,
            "--mode" => c.modes = Mode::parse_list(&value()?)?,
            "--launcher" => {
                a.launcher = match value()?.as_str() {
                    "none" => Launcher::None,
                    "torchrun" => Launcher::Torchrun,
                    other => bail!("--launcher: expected none or torchrun, got {other:?}"),
                }
            }
            "--world" => a.world = Some(num(&flag, &value()?)?),
            "--warmup" => c.warmup = num(&flag, &value()?)?,
            "--iters" => c.iters = num(&flag, &value()?)?,
            "--runs" => c.max_runs = num(&flag, &value()?)?,
            "--min-runs" => c.min_runs = num(&flag, &value()?)?,
            "--budget" => c.budget_s = num(&flag, &value()?)?,
            "--blocks" => c.blocks = Some(num(&flag, &value()?)?),
            "--skew" => c.skew = num(&flag, &value()?)?,
            "--backends" | "--backend" => c.backends = BackendKind::parse_list(&value()?)?,
            "--timeout" => c.timeout_s = num(&flag, &value()?)?,
            "--seed" => c.seed = num(&flag, &value()?)?,
            "--out" => a.out = Some(PathBuf::from(value()?)),
            other => bail!("unknown argument {other:?} (see --help)"),
        }
    }
    // `--runs N` alone lowers the fewest runs with it.
    if !a.gave("--min-runs") {
        a.config.min_runs = a.config.min_runs.min(a.config.max_runs);
    }
    validate(&a)?;
    Ok(a)
}

/// The largest `--blocks` (the plans clamp further to the co-residency bound).
pub const MAX_BLOCKS: usize = 1024;

/// Checks the combination of arguments.
pub fn validate(a: &Args) -> Result<()> {
    let c = &a.config;
    if c.min_bytes > c.max_bytes {
        bail!("--min {} is larger than --max {}", c.min_bytes, c.max_bytes);
    }
    if c.factor < 2 {
        bail!("--factor must be at least 2");
    }
    if c.iters == 0 || c.max_runs == 0 {
        bail!("--iters and --runs must be at least 1");
    }
    if c.min_runs > c.max_runs {
        bail!("--min-runs {} is larger than --runs {}", c.min_runs, c.max_runs);
    }
    if !(c.timeout_s > 0.0 && c.timeout_s < 1e6) {
        bail!("--timeout must be a positive number of seconds");
    }
    if !(c.budget_s >= 0.0 && c.budget_s < 1e5) {
        bail!("--budget must be a non-negative number of seconds");
    }
    if !(c.skew >= 0.0 && c.skew < 100.0) {
        bail!("--skew must be between 0 and 100");
    }
    match c.blocks {
        Some(b) if !(1..=MAX_BLOCKS).contains(&b) => bail!("--blocks {b}: must be 1..={MAX_BLOCKS}"),
        _ => {}
    }
    match a.world {
        Some(w) if !(1..=crate::coord::MAX_RANKS).contains(&w) => {
            bail!("--world {w}: must be 1..={}", crate::coord::MAX_RANKS)
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn defaults_and_flags() {
        let a = p("").unwrap();
        assert_eq!(a.config.sizes().len(), 28);
        assert_eq!(a.config.collectives.len(), 7);
        let a =
            p("--collective all-reduce --dtype bf16 --op max --min 1K --max=1M --mode graph --iters 7 --out /tmp/x")
                .unwrap();
        assert_eq!(a.config.collectives, vec![Collective::AllReduce]);
        assert_eq!((a.config.dtype, a.config.op, a.config.iters), (Dtype::Bf16, Op::Max, 7));
        assert_eq!(
            a.config.sizes(),
            vec![1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576]
        );
        assert_eq!(a.config.modes, vec![Mode::Graph]);
        assert_eq!(a.out, Some(PathBuf::from("/tmp/x")));
        let a = p("--quick --iters 3").unwrap();
        assert!(a.quick);
        assert_eq!((a.config.max_bytes, a.config.iters), (64 << 20, 3));
        assert_eq!(
            p("--backends nccl-symm,purlin").unwrap().config.backends,
            vec![BackendKind::Purlin, BackendKind::NcclSymm]
        );
    }

    #[test]
    fn host_defaults_fill_only_what_was_not_given() {
        let a = p("--blocks 4").unwrap();
        assert_eq!(a.config.blocks, Some(4));
        let h = host_config(&a);
        assert_eq!((h.max_bytes, h.modes.clone(), h.iters, h.blocks), (HOST_MAX_BYTES, vec![Mode::Eager], 10, Some(4)));
        assert_eq!(h.backends, vec![BackendKind::Purlin]);
        let a = p("--host --max 64M --mode both --iters 3 --quick").unwrap();
        assert!(a.host && a.gave("--max") && !a.gave("--budget"));
        // --quick after --max resets it to quick's 64M; it was given, so no cap.
        let h = host_config(&a);
        assert_eq!((h.max_bytes, h.modes.len(), h.budget_s), (64 << 20, 2, 0.05));
        let a = p("--runs 2").unwrap();
        assert_eq!((a.config.min_runs, a.config.max_runs), (2, 2));
        assert!(p("--runs 2 --min-runs 3").is_err());
        let h = host_config(&p("--max 2K --min 1K").unwrap());
        assert_eq!(h.sizes(), vec![1024, 2048]);
        let h = host_config(&p("--min 16M").unwrap());
        assert_eq!(h.sizes(), vec![HOST_MAX_BYTES]);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for bad in [
            "--min 2G --max 1G",
            "--iters 0",
            "--world 17",
            "--dtype f128",
            "--op mean",
            "--collective gather",
            "--mode sometimes",
            "--launcher slurm",
            "--iters",
            "--timeout -1",
            "--skew nan",
            "--factor 1",
            "--frobnicate",
            "--max 0",
            "--blocks 0",
            "--blocks 5000",
            "--blocks many",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
    }
}
