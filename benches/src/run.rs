//! The sweep one rank runs: set up the backends, then for every collective and size check one
//! call and time many, agreeing with the other ranks at every step.
//!
//! Timing, per (case, backend, mode):
//! - **eager**: a run is `iters` back-to-back calls from the host; its time is the run's
//!   wall-clock / `iters` (nccl-tests style). **graph**: the `iters` calls are captured once
//!   into a CUDA graph; a run is one replay; its time is the replay's wall-clock / `iters`.
//! - Every run starts at a spin barrier of all ranks and ends when the rank's stream is idle.
//!   A run's time is the maximum over ranks; the row reports the median and the p99
//!   (nearest rank) over runs.
//! - Before timing, a checked call (a replay for graph mode) on poisoned outputs counts the
//!   wrong elements, summed over ranks (#wrong).

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use serde::Serialize;

use crate::backend::{Backend, BackendKind, CallError, Status};
use crate::case::{Case, POISON};
use crate::coord::Coord;
use crate::gpu::{Device, Gpu, Replay};
use crate::nccl;
use crate::spec::{self, Collective, Dtype, Mode, Op, sweep_sizes};

/// What runs Purlin's calls: the GPUs, or the host executor on CPU threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Executor {
    /// GPUs (`purlin_collectives::Comm`, NCCL beside it).
    #[default]
    #[serde(rename = "gpu")]
    Gpu,
    /// No GPU: `purlin_collectives::CpuComm`, a thread per rank (and per block) in this
    /// process; no NCCL.
    #[serde(rename = "host executor (no GPU)")]
    Host,
}

impl Executor {
    /// The label rows, headers and files carry.
    pub fn label(self) -> &'static str {
        match self {
            Executor::Gpu => "gpu",
            Executor::Host => "host executor (no GPU)",
        }
    }
}

/// Everything a sweep is told on the command line.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// Collectives, in order.
    #[serde(serialize_with = "spec::json::collectives")]
    pub collectives: Vec<Collective>,
    /// Element type.
    #[serde(serialize_with = "spec::json::dtype")]
    pub dtype: Dtype,
    /// Reduce op (for the reducing collectives).
    #[serde(serialize_with = "spec::json::op")]
    pub op: Op,
    /// Smallest size (bytes).
    pub min_bytes: usize,
    /// Largest size (bytes).
    pub max_bytes: usize,
    /// Size step factor (2: doubling).
    pub factor: usize,
    /// Modes.
    pub modes: Vec<Mode>,
    /// Calls before timing (eager); graph mode replays ⌈warmup / iters⌉ times, at least once.
    pub warmup: usize,
    /// Calls per timed run.
    pub iters: usize,
    /// Most timed runs per (case, backend, mode).
    pub max_runs: usize,
    /// Fewest timed runs.
    pub min_runs: usize,
    /// Seconds of timed runs aimed at per (case, backend, mode) (bounds the large sizes).
    pub budget_s: f64,
    /// Purlin's blocks per role (`Tuning::blocks_per_role`), if given; NCCL keeps its own
    /// tuning.
    pub blocks: Option<usize>,
    /// Zipf exponent of the V forms' partition sizes.
    pub skew: f64,
    /// Every call in place (NCCL's convention; AllToAll and the V forms have no in-place
    /// form and are reported unsupported).
    pub in_place: bool,
    /// Purlin's send and receive buffers are symmetric memory (`Comm::alloc_symmetric`), so
    /// calls that would be staged take the one-copy path.
    pub symmetric: bool,
    /// Backends, in column order.
    pub backends: Vec<BackendKind>,
    /// Bound on every wait (stream, barrier), seconds.
    pub timeout_s: f64,
    /// Seed of the inputs.
    pub seed: u64,
    /// What runs the calls (set by the launcher, not a flag).
    pub executor: Executor,
}

impl Config {
    /// The sizes swept.
    pub fn sizes(&self) -> Vec<usize> {
        sweep_sizes(self.min_bytes, self.max_bytes, self.factor)
    }

    /// The bound on every wait.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_s)
    }

    /// The case of `collective` at `bytes`, or None where the size is too small.
    pub fn case(&self, collective: Collective, bytes: usize, world: usize) -> Option<Case> {
        let ci = Collective::EVERY.iter().position(|c| *c == collective).unwrap_or(0) as u64;
        let seed = self.seed ^ (ci << 56) ^ (bytes as u64).wrapping_mul(0x2545_F491_4F6C_DD1D);
        let mut case = Case::new(collective, self.dtype, self.op, world, bytes, self.skew, seed)?;
        case.in_place = self.in_place;
        Some(case)
    }

    /// The largest send and receive buffers any rank needs over the whole sweep.
    pub fn buffer_bytes(&self, world: usize) -> (usize, usize) {
        let (mut s, mut r) = (0, 0);
        for c in &self.collectives {
            for b in self.sizes() {
                if let Some(case) = self.case(*c, b, world) {
                    for rank in 0..world {
                        s = s.max(case.in_count(rank) * self.dtype.size());
                        r = r.max(case.out_count(rank) * self.dtype.size());
                        // In place, the receive buffer holds the input too.
                        if let Some(l) = case.in_place_layout(rank) {
                            r = r.max(l.len * self.dtype.size());
                        }
                    }
                }
            }
        }
        (s, r)
    }
}

/// One backend's result in one row.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Cell {
    /// Which backend.
    pub backend: BackendKind,
    /// Measured, or why not.
    #[serde(flatten)]
    pub status: Status,
    /// Median time per call over runs (max over ranks), µs.
    pub time_us: Option<f64>,
    /// p99 over runs, µs.
    pub p99_us: Option<f64>,
    /// bytes / time, GB/s.
    pub algbw_gbps: Option<f64>,
    /// algbw × the nccl-tests factor, GB/s.
    pub busbw_gbps: Option<f64>,
    /// Wrong elements, summed over ranks.
    pub wrong: Option<u64>,
    /// Timed runs.
    pub runs: usize,
    /// Calls per run.
    pub iters: usize,
}

impl Cell {
    /// A cell with no measurement.
    pub fn status(backend: BackendKind, status: Status) -> Cell {
        Cell {
            backend,
            status,
            time_us: None,
            p99_us: None,
            algbw_gbps: None,
            busbw_gbps: None,
            wrong: None,
            runs: 0,
            iters: 0,
        }
    }
}

/// One (case, mode): a line of the table.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Row {
    /// The collective.
    #[serde(serialize_with = "spec::json::collective")]
    pub collective: Collective,
    /// Element type.
    #[serde(serialize_with = "spec::json::dtype")]
    pub dtype: Dtype,
    /// Reduce op, for reducing collectives.
    #[serde(serialize_with = "spec::json::op_option")]
    pub op: Option<Op>,
    /// Mode.
    pub mode: Mode,
    /// Size in bytes (nccl-tests' definition per collective).
    pub bytes: usize,
    /// Elements in `bytes`.
    pub count: usize,
    /// Ranks.
    pub world: usize,
    /// What ran Purlin's calls.
    pub executor: Executor,
    /// In place (NCCL's convention), or out of place.
    pub in_place: bool,
    /// Purlin's buffers were symmetric memory (`--symmetric`).
    pub symmetric: bool,
    /// One cell per backend, in column order.
    pub cells: Vec<Cell>,
}

impl Row {
    /// How Purlin's buffers were placed: the CSV's `placement` column and the table title.
    pub fn placement(&self) -> &'static str {
        match (self.in_place, self.symmetric) {
            (true, true) => "in-place symmetric",
            (true, false) => "in-place",
            (false, true) => "out-of-place symmetric",
            (false, false) => "out-of-place",
        }
    }

    /// The cell of `backend`.
    pub fn cell(&self, backend: BackendKind) -> Option<&Cell> {
        self.cells.iter().find(|c| c.backend == backend)
    }

    /// NCCL time / Purlin time against `baseline`, where both were measured and correct.
    pub fn speedup(&self, baseline: BackendKind) -> Option<f64> {
        let (p, b) = (self.cell(BackendKind::Purlin)?, self.cell(baseline)?);
        if p.wrong != Some(0) || b.wrong != Some(0) {
            return None;
        }
        let (p, b) = (p.time_us?, b.time_us?);
        (p > 0.0).then(|| b / p)
    }
}

/// What one rank brings back.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The rows (complete, or up to a failure).
    pub rows: Vec<Row>,
    /// Each requested backend's set-up status.
    pub backends: Vec<(BackendKind, Status)>,
    /// The failure that stopped the sweep, if any.
    pub error: Option<String>,
}

/// Purlin's communicator for this rank, as the launcher made it (or why it could not).
pub enum PurlinComm {
    /// Not requested.
    None,
    /// Made before the rank threads started (one process).
    Ready(Box<purlin_collectives::Comm>),
    /// Could not be made (one process): the reason.
    Failed(String),
    /// Make it in the rank (one process per GPU).
    PerProcess,
}

impl std::fmt::Debug for PurlinComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PurlinComm::None => "None",
            PurlinComm::Ready(_) => "Ready",
            PurlinComm::Failed(_) => "Failed",
            PurlinComm::PerProcess => "PerProcess",
        })
    }
}

/// Progress lines (stderr, rank 0 only).
pub type Progress<'a> = &'a dyn Fn(&str);

/// Runs the sweep on one rank. Every rank must call it with the same configuration.
pub fn run_rank(cfg: &Config, gpu: &Gpu, coord: &Coord, purlin: PurlinComm, progress: Progress<'_>) -> Outcome {
    let mut statuses = Vec::new();
    let mut backends: Vec<Box<dyn Backend>> = Vec::new();
    let opened =
        gpu.bind().and_then(|()| open_backends(cfg, gpu, coord, purlin, &mut statuses, &mut backends, progress));
    let mut out = match opened {
        Ok(()) => run_backends(cfg, gpu, coord, &mut backends, progress),
        Err(e) => {
            let msg = format!("rank {}: {e:#}", coord.rank());
            coord.abort(&msg);
            Outcome { error: Some(msg), ..Outcome::default() }
        }
    };
    // Backends that could not be set up still get their cells, saying why.
    for row in &mut out.rows {
        let mut cells = Vec::with_capacity(cfg.backends.len());
        for &kind in &cfg.backends {
            match row.cells.iter().position(|c| c.backend == kind) {
                Some(i) => cells.push(row.cells.swap_remove(i)),
                None => {
                    let status = statuses
                        .iter()
                        .find(|(b, _)| *b == kind)
                        .map_or(Status::Unavailable("not set up".into()), |(_, s)| s.clone());
                    cells.push(Cell::status(kind, status));
                }
            }
        }
        row.cells = cells;
    }
    out.backends = statuses;
    drop(backends);
    out
}

/// Runs the sweep on one rank with backends already set up (every rank: the same kinds, in
/// the same order).
pub fn run_backends(
    cfg: &Config,
    dev: &dyn Device,
    coord: &Coord,
    backends: &mut [Box<dyn Backend>],
    progress: Progress<'_>,
) -> Outcome {
    let mut out = Outcome::default();
    if let Err(e) = sweep(cfg, dev, coord, backends, &mut out.rows, progress) {
        let msg = format!("rank {}: {e:#}", coord.rank());
        coord.abort(&msg);
        for b in backends.iter_mut() {
            b.abort();
        }
        out.error = Some(match coord.aborted() {
            Some((r, why)) if r != coord.rank() => {
                format!("rank {r}: {}", why.trim_start_matches(&format!("rank {r}: ")))
            }
            _ => msg,
        });
    } else {
        // Tear down in the same order on every rank (NCCL window deregistration is collective).
        let _ = coord.barrier();
    }
    out
}

/// Agrees on a set-up outcome: Ok only if every rank succeeded.
fn agree<T>(coord: &Coord, local: Result<T>) -> Result<Result<T, String>> {
    let msg = match &local {
        Ok(_) => String::new(),
        Err(e) => format!("{e:#}"),
    };
    let all = coord.all_strings(&msg)?;
    Ok(match (local, all.iter().enumerate().find(|(_, m)| !m.is_empty())) {
        (Ok(v), None) => Ok(v),
        (Err(e), _) => Err(format!("{e:#}")),
        (Ok(_), Some((r, m))) => Err(format!("rank {r}: {m}")),
    })
}

fn open_backends(
    cfg: &Config,
    gpu: &Gpu,
    coord: &Coord,
    purlin: PurlinComm,
    statuses: &mut Vec<(BackendKind, Status)>,
    backends: &mut Vec<Box<dyn Backend>>,
    progress: Progress<'_>,
) -> Result<()> {
    let (send_bytes, recv_bytes) = cfg.buffer_bytes(coord.world());
    let mut purlin = Some(purlin);
    for &kind in &cfg.backends {
        let t0 = Instant::now();
        let opened: Result<Box<dyn Backend>, Status> = match kind {
            BackendKind::Purlin => {
                let comm = match purlin.take().unwrap_or(PurlinComm::None) {
                    PurlinComm::Ready(c) => Ok(*c),
                    PurlinComm::Failed(why) => Err(anyhow!(why)),
                    PurlinComm::PerProcess => crate::purlin::comm_for_process(gpu, coord, cfg),
                    PurlinComm::None => Err(anyhow!("no communicator was made")),
                };
                let b = comm.and_then(|c| crate::purlin::Purlin::new(gpu, c, send_bytes, recv_bytes, cfg.symmetric));
                agree(coord, b)?.map(|b| Box::new(b) as Box<dyn Backend>).map_err(Status::Unavailable)
            }
            BackendKind::Nccl | BackendKind::NcclSymm => {
                if !nccl::present() {
                    Err(Status::Unavailable("no libnccl: no NCCL columns".into()))
                } else if kind == BackendKind::NcclSymm
                    && !(nccl::has_symbol("ncclCommWindowRegister") && nccl::has_symbol("ncclMemAlloc"))
                {
                    Err(Status::Unavailable(format!(
                        "libnccl {} has no symmetric windows (ncclCommWindowRegister needs NCCL >= 2.27)",
                        nccl::version().unwrap_or_default()
                    )))
                } else {
                    let b = nccl::Nccl::new(gpu, coord, kind, send_bytes, recv_bytes);
                    agree(coord, b)?.map(|b| Box::new(b) as Box<dyn Backend>).map_err(Status::Unavailable)
                }
            }
        };
        match opened {
            Ok(b) => {
                progress(&format!("{kind}: ready in {:.1} s", t0.elapsed().as_secs_f64()));
                statuses.push((kind, Status::Ok));
                backends.push(b);
            }
            Err(s) => {
                progress(&format!("{kind}: {}", s.reason().unwrap_or("unavailable")));
                statuses.push((kind, s));
            }
        }
    }
    Ok(())
}

/// The progress line's tail: the time left if the remaining cases take as long as the done
/// ones did on average (`  ETA 1m05s`), or `  done` after the last.
pub fn eta(elapsed: Duration, done: usize, total: usize) -> String {
    if done >= total {
        return "  done".into();
    }
    if done == 0 {
        return String::new();
    }
    let left = elapsed.as_secs_f64() / done as f64 * (total - done) as f64;
    let secs = left.round() as u64;
    match secs {
        0..60 => format!("  ETA {secs}s"),
        60..3600 => format!("  ETA {}m{:02}s", secs / 60, secs % 60),
        _ => format!("  ETA {}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

fn sweep(
    cfg: &Config,
    gpu: &dyn Device,
    coord: &Coord,
    backends: &mut [Box<dyn Backend>],
    rows: &mut Vec<Row>,
    progress: Progress<'_>,
) -> Result<()> {
    let (rank, world) = (coord.rank(), coord.world());
    let sizes = cfg.sizes();
    let total = cfg.collectives.len() * sizes.len();
    let mut done = 0;
    let started = Instant::now();
    let mut host_out = Vec::new();
    for &collective in &cfg.collectives {
        for &bytes in &sizes {
            done += 1;
            let Some(case) = cfg.case(collective, bytes, world) else {
                progress(&format!("[{done}/{total}] {collective} {bytes} B: too small for world {world}, skipped"));
                continue;
            };
            let input = case.input(rank);
            let expected = case.expected(rank);
            let mut mode_rows: Vec<Row> = cfg
                .modes
                .iter()
                .map(|&mode| Row {
                    collective,
                    dtype: case.dtype,
                    op: case.op,
                    mode,
                    bytes: case.bytes(),
                    count: case.count,
                    world,
                    executor: cfg.executor,
                    in_place: case.in_place,
                    symmetric: cfg.symmetric,
                    cells: Vec::new(),
                })
                .collect();
            let mut line = format!("[{done}/{total}] {collective} {}", crate::spec::format_size(case.bytes()));
            for be in backends.iter_mut() {
                let kind = be.kind();
                let support = if case.in_place && case.in_place_layout(rank).is_none() {
                    Err(CallError::Unsupported(format!("{collective} has no in-place form")))
                } else {
                    be.supports(&case)
                };
                let agreed = agree_call(coord, support)?;
                if let Err(status) = agreed {
                    for row in &mut mode_rows {
                        row.cells.push(Cell::status(kind, status.clone()));
                    }
                    line.push_str(&format!("  {kind}: {}", status.label()));
                    continue;
                }
                if !case.in_place {
                    gpu.upload(be.send_ptr(), &input)?;
                }
                for row in &mut mode_rows {
                    let cell =
                        measure(cfg, gpu, coord, be.as_mut(), &case, row.mode, &input, &expected, &mut host_out)?;
                    line.push_str(&format!("  {kind}/{}: {}", row.mode, cell_brief(&cell)));
                    row.cells.push(cell);
                }
            }
            line.push_str(&eta(started.elapsed(), done, total));
            progress(&line);
            rows.extend(mode_rows);
        }
    }
    Ok(())
}

fn cell_brief(c: &Cell) -> String {
    match (&c.status, c.time_us) {
        (Status::Ok, Some(t)) => {
            format!(
                "{t:.2} us{}",
                if c.wrong.unwrap_or(0) > 0 { format!(" ({} WRONG)", c.wrong.unwrap_or(0)) } else { String::new() }
            )
        }
        (s, _) => s.label().to_string(),
    }
}

/// Agrees on a call's outcome across ranks (without waiting on the GPU): Ok if every rank
/// succeeded; the common non-fatal status if every rank got the same one; else an error.
fn agree_call(coord: &Coord, local: Result<(), CallError>) -> Result<Result<(), Status>> {
    let status: Status = match local {
        Ok(()) => Status::Ok,
        Err(e) => e.into(),
    };
    let all = coord.all_strings(&format!("{}:{}", status.code(), status.reason().unwrap_or("")))?;
    let codes: Vec<&str> = all.iter().map(|s| s.split(':').next().unwrap_or("")).collect();
    if codes.iter().all(|c| *c == "0") {
        return Ok(Ok(()));
    }
    if codes.iter().all(|c| *c == codes[0]) && (codes[0] == "1" || codes[0] == "2") {
        return Ok(Err(status));
    }
    let detail: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.starts_with("0:"))
        .map(|(r, s)| format!("rank {r}: {}", s.split_once(':').map_or("", |x| x.1)))
        .collect();
    bail!("call failed: {}", detail.join("; "))
}

/// Checks one call (or replay) and times `runs` runs. Errors are fatal (the sweep stops).
#[allow(clippy::too_many_arguments)]
fn measure(
    cfg: &Config,
    gpu: &dyn Device,
    coord: &Coord,
    be: &mut dyn Backend,
    case: &Case,
    mode: Mode,
    input: &[u8],
    expected: &[u8],
    host_out: &mut Vec<u8>,
) -> Result<Cell> {
    let kind = be.kind();
    let iters = cfg.iters.max(1);
    let timeout = cfg.timeout();
    let (rank, es) = (coord.rank(), case.dtype.size());
    let out_bytes = case.out_count(rank) * es;
    let recv = be.recv_ptr();
    // Before a checked call: the output poisoned; in place, the whole buffer poisoned and
    // the input put back where NCCL's convention has it (timed calls overwrite it).
    let layout = case.in_place_layout(rank);
    let prepare = || -> Result<()> {
        match layout {
            Some(l) => {
                gpu.fill(recv, POISON, l.len * es)?;
                gpu.upload(recv + (l.input_at * es) as u64, input)
            }
            None => gpu.fill(recv, POISON, out_bytes),
        }
    };
    let output = recv + layout.map_or(0, |l| l.output_at * es) as u64;

    // The checked call (eager) or the capture (graph).
    let mut graph: Option<Box<dyn Replay>> = None;
    let mut check_graph: Option<Box<dyn Replay>> = None;
    let issued = match mode {
        Mode::Eager => {
            prepare()?;
            be.enqueue(case)
        }
        Mode::Graph => {
            // One eager call first: NCCL connects its peers lazily, on a communicator's first
            // collective, and that first call failing inside a capture is an internal error.
            let warm = be.enqueue(case);
            if let Err(status) = agree_call(coord, warm)? {
                return Ok(Cell::status(kind, status));
            }
            gpu.sync(coord, timeout, &|| be_async_error(be))?;
            let mut capture = |calls: usize| -> Result<Box<dyn Replay>, CallError> {
                let mut issue = || -> Result<(), CallError> {
                    for _ in 0..calls {
                        be.enqueue(case)?;
                    }
                    Ok(())
                };
                gpu.capture(&mut issue)?.ok_or_else(|| CallError::Unsupported("graph mode needs a GPU".into()))
            };
            // In place, calls compound (an AllReduce sums its own result again), so the
            // check replays a graph of one call and the timed runs another of `iters`.
            let captured = capture(iters).and_then(|timed| {
                let check = if case.in_place { Some(capture(1)?) } else { None };
                Ok((timed, check))
            });
            captured.map(|(timed, check)| {
                graph = Some(timed);
                check_graph = check;
            })
        }
    };
    if let Err(status) = agree_call(coord, issued)? {
        return Ok(Cell::status(kind, status));
    }
    let async_err = || be_async_error(be);
    if let Some(g) = check_graph.as_ref().or(graph.as_ref()) {
        prepare()?;
        g.launch()?;
    }
    gpu.sync(coord, timeout, &async_err)?;
    host_out.resize(out_bytes, 0);
    gpu.download(host_out, output)?;
    let wrong = case.count_wrong(host_out, expected);
    if let Some((i, got, want)) = wrong.first {
        eprintln!(
            "rank {}: {kind} {} {} {mode}: {} wrong elements, first at {i}: {got} (expected {want})",
            coord.rank(),
            case.collective,
            case.bytes(),
            wrong.count
        );
    }
    let wrong_total = coord.sum_u64(wrong.count)?;

    let one_run = |be: &mut dyn Backend| -> Result<f64> {
        let t0 = Instant::now();
        match &graph {
            Some(g) => g.launch()?,
            None => {
                for _ in 0..iters {
                    be.enqueue(case).map_err(|e| anyhow!("{kind}: {:?}", Status::from(e)))?;
                }
            }
        }
        gpu.sync(coord, timeout, &|| be_async_error(be))?;
        Ok(t0.elapsed().as_secs_f64() / iters as f64)
    };

    // Warm-up.
    let warm_runs = if graph.is_some() { cfg.warmup.div_ceil(iters).max(1) } else { 1 };
    for _ in 0..warm_runs {
        if graph.is_some() {
            one_run(be)?;
        } else {
            for _ in 0..cfg.warmup {
                be.enqueue(case).map_err(|e| anyhow!("{kind}: {:?}", Status::from(e)))?;
            }
            gpu.sync(coord, timeout, &|| be_async_error(be))?;
        }
    }
    // Estimate a run, agree on the number of runs.
    coord.barrier()?;
    let est = coord.max_f64(&[one_run(be)?])?[0];
    let runs =
        ((cfg.budget_s / (est * iters as f64).max(1e-9)) as usize).clamp(cfg.min_runs.max(1), cfg.max_runs.max(1));
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        coord.barrier()?;
        samples.push(one_run(be)?);
    }
    let samples = coord.max_f64(&samples)?;
    let (median, p99) = median_p99(&samples);
    let secs = median;
    let algbw = case.bytes() as f64 / secs / 1e9;
    Ok(Cell {
        backend: kind,
        status: Status::Ok,
        time_us: Some(median * 1e6),
        p99_us: Some(p99 * 1e6),
        algbw_gbps: Some(algbw),
        busbw_gbps: Some(algbw * spec::busbw_factor(case.collective, case.world)),
        wrong: Some(wrong_total),
        runs,
        iters,
    })
}

fn be_async_error(be: &dyn Backend) -> Option<String> {
    be.async_error()
}

/// Median and p99 (nearest rank) of samples.
pub fn median_p99(samples: &[f64]) -> (f64, f64) {
    if samples.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
    let idx = ((0.99 * n as f64).ceil() as usize).clamp(1, n) - 1;
    (median, s[idx])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_p99() {
        assert_eq!(median_p99(&[3.0, 1.0, 2.0]), (2.0, 3.0));
        assert_eq!(median_p99(&[4.0, 1.0, 2.0, 3.0]), (2.5, 4.0));
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(median_p99(&v), (100.5, 198.0));
    }
}
