//! What a sweep prints and writes: the nccl-tests-like table (stdout), `results.csv`,
//! `results.json` (with the run's metadata) and the plots.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::backend::{BackendKind, Status};
use crate::run::{Cell, Config, Executor, Row};
use crate::spec::{Collective, Mode, format_size};

/// Where and when a sweep ran.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Meta {
    /// The tool.
    pub tool: String,
    /// The command line, as typed.
    pub command: String,
    /// UTC date and time, ISO 8601.
    pub date: String,
    /// The git commit the binary was built from ("unknown" outside a checkout).
    pub commit: String,
    /// `none` (one process, a thread per GPU) or `torchrun` (a process per GPU).
    pub launcher: String,
    /// Ranks.
    pub world: usize,
    /// GPU names, by rank (or the machine's GPUs; the one GPU that `PURLIN_SHARED_GPU=1` ranks share).
    pub gpus: Vec<String>,
    /// Kernel driver version (e.g. 580.159.04).
    pub driver: Option<String>,
    /// CUDA driver API version (e.g. 13.0).
    pub cuda_driver: Option<String>,
    /// The loaded libnccl's version.
    pub nccl: Option<String>,
    /// `NCCL_NVLS_ENABLE` as the run saw it.
    pub nccl_nvls_enable: Option<String>,
    /// Each backend's set-up status.
    pub backends: Vec<BackendStatus>,
    /// The failure that stopped the sweep, if any.
    pub error: Option<String>,
    /// Notes (e.g. "no GPU").
    pub notes: Vec<String>,
    /// The calibration probe's limits, measured in the same run.
    pub limits: Vec<String>,
    /// The configuration.
    pub config: Option<Config>,
    /// The topology as purlin-topo probed it (JSON), where it could.
    pub topology: Option<serde_json::Value>,
    /// What ran Purlin's calls: the GPUs or, without one, the host executor.
    pub executor: Executor,
    /// Purlin's blocks per role (`Tuning::blocks_per_role`: `--blocks`, else the
    /// communicator's default or `PURLIN_BLOCKS_PER_ROLE`); plans may use fewer where the
    /// co-residency bound or the parameter block requires.
    pub purlin_blocks_per_role: Option<u32>,
    /// Purlin's cap on one call's blocks (`Tuning::max_blocks`, `PURLIN_MAX_BLOCKS`), if set.
    pub purlin_max_blocks: Option<u32>,
}

impl Meta {
    /// The blocks-per-role line of the header (and where it came from).
    pub fn blocks_line(&self) -> Option<String> {
        let b = self.purlin_blocks_per_role?;
        let given = self.config.as_ref().is_some_and(|c| c.blocks.is_some());
        let from = if given {
            "--blocks"
        } else if std::env::var_os("PURLIN_BLOCKS_PER_ROLE").is_some() {
            "PURLIN_BLOCKS_PER_ROLE"
        } else if self.executor == Executor::Host {
            "the host executor's default"
        } else {
            "the GPU default"
        };
        let cap = match self.purlin_max_blocks {
            Some(cap) => format!("; at most {cap} blocks per call (PURLIN_MAX_BLOCKS)"),
            None => String::new(),
        };
        Some(format!("purlin blocks per role: {b} ({from}){cap}"))
    }
}

/// One backend's set-up status.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BackendStatus {
    /// Which backend.
    pub backend: BackendKind,
    /// Ready, or why not.
    #[serde(flatten)]
    pub status: Status,
}

/// The command line as one string (arguments with spaces quoted).
pub fn command_line() -> String {
    std::env::args()
        .map(|a| if a.contains(' ') || a.is_empty() { format!("'{a}'") } else { a })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Now, UTC, as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format_utc(secs)
}

/// Formats seconds since the epoch as an ISO 8601 UTC date-time.
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The (collective, mode) blocks of rows, in sweep order.
pub fn blocks(rows: &[Row]) -> Vec<(Collective, Mode, Vec<&Row>)> {
    let mut out: Vec<(Collective, Mode, Vec<&Row>)> = Vec::new();
    for r in rows {
        match out.iter_mut().find(|(c, m, _)| *c == r.collective && *m == r.mode) {
            Some((_, _, v)) => v.push(r),
            None => out.push((r.collective, r.mode, vec![r])),
        }
    }
    out
}

const CELL_W: usize = 45;

fn fmt_cell(c: Option<&Cell>) -> String {
    let Some(c) = c else { return format!("{:>CELL_W$}", "-") };
    match (&c.status, c.time_us, c.p99_us, c.algbw_gbps, c.busbw_gbps) {
        (Status::Ok, Some(t), Some(p), Some(a), Some(b)) => {
            format!("{t:>9.2} {p:>9.2} {a:>7.2} {b:>7.2} {:>8}", c.wrong.unwrap_or(0))
        }
        (s, ..) => format!("{:>CELL_W$}", s.label()),
    }
}

/// The nccl-tests-like table: one block per (collective, mode).
pub fn table(rows: &[Row], backends: &[BackendKind], meta: &Meta) -> String {
    let mut s = String::new();
    let host = meta.executor == Executor::Host;
    let _ = writeln!(
        s,
        "# purlin-bench  {}  world {} ({})  commit {}  nccl {}{}",
        meta.date,
        meta.world,
        meta.launcher,
        meta.commit,
        meta.nccl.as_deref().unwrap_or("none"),
        if host { format!("  [{}]", Executor::Host.label()) } else { String::new() }
    );
    for n in &meta.notes {
        let _ = writeln!(s, "# {n}");
    }
    if let Some(b) = meta.blocks_line() {
        let _ = writeln!(s, "# {b}");
    }
    if let Some(g) = meta.gpus.first() {
        let _ = writeln!(s, "# GPUs: {} x {g}  driver {}", meta.gpus.len(), meta.driver.as_deref().unwrap_or("?"));
    }
    for l in &meta.limits {
        let _ = writeln!(s, "# limits: {l}");
    }
    for b in &meta.backends {
        if let Some(why) = b.status.reason() {
            let _ = writeln!(s, "# {}: {} ({why})", b.backend, b.status.label());
        }
    }
    let _ = writeln!(
        s,
        "# time: median over runs of (wall-clock of N back-to-back calls / N), max over ranks; p99 over runs"
    );
    let _ = writeln!(
        s,
        "# busbw = algbw x 2(n-1)/n (all-reduce), x 1 (broadcast, reduce, send-recv) or (n-1)/n (others), as nccl-tests"
    );
    let with_speedup = backends.contains(&BackendKind::Purlin) && backends.iter().any(|b| b.is_nccl());
    let baselines: Vec<BackendKind> = backends.iter().copied().filter(|b| b.is_nccl()).collect();
    for (collective, mode, block) in blocks(rows) {
        let first = block[0];
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "# {collective}  {}  {}  {mode}{}  (size = {}){}",
            first.dtype,
            first.op.map_or("none", |o| o.name()),
            if first.in_place || first.symmetric { format!("  {}", first.placement()) } else { String::new() },
            crate::spec::bytes_meaning(collective),
            if first.executor == Executor::Host { format!("  [{}]", Executor::Host.label()) } else { String::new() }
        );
        let mut h1 = format!("# {:>10} {:>12} {:>5} {:>6} ", "", "", "", "");
        let mut h2 = format!("# {:>10} {:>12} {:>5} {:>6} ", "size", "count", "type", "redop");
        for b in backends {
            let name = format!(" {b} ");
            let _ = write!(h1, "| {name:-^CELL_W$} ");
            let _ = write!(h2, "| {:>9} {:>9} {:>7} {:>7} {:>8} ", "time(us)", "p99(us)", "algbw", "busbw", "#wrong");
        }
        if with_speedup {
            let _ = write!(h1, "| {:^18}", "speedup");
            for b in &baselines {
                let label = if *b == BackendKind::NcclSymm { "vs symm" } else { "vs nccl" };
                let _ = write!(h2, "| {label:>8} ");
            }
        }
        let _ = writeln!(s, "{}", h1.trim_end());
        let _ = writeln!(s, "{}", h2.trim_end());
        for r in &block {
            let mut line = format!(
                "  {:>10} {:>12} {:>5} {:>6} ",
                format_size(r.bytes),
                r.count,
                r.dtype.name(),
                r.op.map_or("none", |o| o.name())
            );
            for b in backends {
                let _ = write!(line, "| {} ", fmt_cell(r.cell(*b)));
            }
            if with_speedup {
                for b in &baselines {
                    let _ = write!(line, "| {:>8} ", r.speedup(*b).map_or("-".into(), |x| format!("{x:.2}x")));
                }
            }
            if r.executor == Executor::Host {
                let _ = write!(line, "| {}", Executor::Host.label());
            }
            let _ = writeln!(s, "{}", line.trim_end());
        }
        // Why cells are empty, once per backend and reason.
        let mut reasons: Vec<(BackendKind, &str)> = Vec::new();
        for c in block.iter().flat_map(|r| &r.cells) {
            match c.status.reason() {
                Some(why) if !reasons.contains(&(c.backend, why)) => reasons.push((c.backend, why)),
                _ => {}
            }
        }
        for (b, why) in reasons {
            let _ = writeln!(s, "#   {b}: {why}");
        }
    }
    let wrong: u64 = rows.iter().flat_map(|r| &r.cells).filter_map(|c| c.wrong).sum();
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "BENCH {} rows={} wrong={wrong}{}",
        if wrong == 0 && meta.error.is_none() { "ok" } else { "FAILED" },
        rows.len(),
        meta.error.as_ref().map_or(String::new(), |e| format!(" error={e:?}"))
    );
    s
}

/// The CSV: one line per (row, backend). `executor` is `gpu` or `host executor (no GPU)`;
/// `blocks_per_role` is Purlin's (empty on NCCL's lines).
pub fn csv(rows: &[Row], meta: &Meta) -> String {
    let mut s = String::from(
        "collective,dtype,op,mode,world,bytes,count,backend,status,time_us,p99_us,algbw_gbps,busbw_gbps,wrong,runs,iters,speedup_vs_nccl,speedup_vs_nccl_symm,executor,blocks_per_role,placement,reason\n",
    );
    let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.4}"));
    for r in rows {
        for c in &r.cells {
            let (sn, ss) = if c.backend == BackendKind::Purlin {
                (opt(r.speedup(BackendKind::Nccl)), opt(r.speedup(BackendKind::NcclSymm)))
            } else {
                (String::new(), String::new())
            };
            let reason = c.status.reason().unwrap_or("").replace('"', "'");
            let blocks = match (c.backend, meta.purlin_blocks_per_role) {
                (BackendKind::Purlin, Some(b)) => b.to_string(),
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},\"{}\"",
                r.collective,
                r.dtype,
                r.op.map_or("none", |o| o.name()),
                r.mode,
                r.world,
                r.bytes,
                r.count,
                c.backend,
                c.status.label(),
                opt(c.time_us),
                opt(c.p99_us),
                opt(c.algbw_gbps),
                opt(c.busbw_gbps),
                c.wrong.map_or(String::new(), |w| w.to_string()),
                c.runs,
                c.iters,
                sn,
                ss,
                r.executor.label(),
                blocks,
                r.placement(),
                reason
            );
        }
    }
    s
}

/// The JSON document: `{ "meta": ..., "rows": [...] }`.
pub fn json(rows: &[Row], meta: &Meta) -> Result<String> {
    #[derive(Serialize)]
    struct Doc<'a> {
        meta: &'a Meta,
        rows: &'a [Row],
    }
    serde_json::to_string_pretty(&Doc { meta, rows }).context("serialize results")
}

/// Writes results.csv, results.json and the plots into `dir`; returns the files written.
pub fn write_all(dir: &Path, rows: &[Row], backends: &[BackendKind], meta: &Meta) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut written = Vec::new();
    let p = dir.join("results.csv");
    std::fs::write(&p, csv(rows, meta)).with_context(|| format!("write {}", p.display()))?;
    written.push(p.display().to_string());
    let p = dir.join("results.json");
    std::fs::write(&p, json(rows, meta)?).with_context(|| format!("write {}", p.display()))?;
    written.push(p.display().to_string());
    let p = dir.join("table.txt");
    std::fs::write(&p, table(rows, backends, meta)).with_context(|| format!("write {}", p.display()))?;
    written.push(p.display().to_string());
    for (collective, mode, block) in blocks(rows) {
        let series = crate::plot::series_of(&block, backends);
        if series.iter().all(|s| s.points.is_empty()) {
            continue;
        }
        let first = block[0];
        let mut title = format!("{collective} {}", first.dtype);
        if let Some(op) = first.op {
            title.push_str(&format!(" {op}"));
        }
        title.push_str(&format!(
            ", {mode}, world {} ({})",
            first.world,
            if meta.launcher == "torchrun" { "torchrun, a process per GPU" } else { "one process" }
        ));
        if first.executor == Executor::Host {
            title.push_str(&format!(", {}", Executor::Host.label()));
        } else if let Some(g) = meta.gpus.first() {
            title.push_str(&format!(", {g}"));
        }
        if meta.date.len() >= 10 {
            title.push_str(&format!(", {}", &meta.date[..10]));
        }
        let png = crate::plot::render_png(&title, &series, 1400, 560)?;
        let p = dir.join(format!("plot-{collective}-{mode}.png"));
        std::fs::write(&p, png).with_context(|| format!("write {}", p.display()))?;
        written.push(p.display().to_string());
    }
    Ok(written)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::spec::{Dtype, Op};

    pub(crate) fn sample_rows() -> Vec<Row> {
        let mut rows = Vec::new();
        for (i, bytes) in [8usize, 1024, 1 << 20, 1 << 30].into_iter().enumerate() {
            let t_nccl = 10.0 + bytes as f64 / 300e3;
            let t_symm = 6.0 + bytes as f64 / 320e3;
            let t_purlin = 4.0 + bytes as f64 / 340e3;
            let cell = |backend, t: f64, wrong| Cell {
                backend,
                status: Status::Ok,
                time_us: Some(t),
                p99_us: Some(t * 1.1),
                algbw_gbps: Some(bytes as f64 / t / 1e3),
                busbw_gbps: Some(bytes as f64 / t / 1e3),
                wrong: Some(wrong),
                runs: 10,
                iters: 20,
            };
            rows.push(Row {
                collective: Collective::AllReduce,
                dtype: Dtype::F32,
                op: Some(Op::Sum),
                mode: Mode::Eager,
                bytes,
                count: bytes / 4,
                world: 2,
                executor: Executor::Gpu,
                in_place: false,
                symmetric: false,
                cells: vec![
                    cell(BackendKind::Purlin, t_purlin, if i == 2 { 3 } else { 0 }),
                    cell(BackendKind::Nccl, t_nccl, 0),
                    cell(BackendKind::NcclSymm, t_symm, 0),
                ],
            });
        }
        rows.push(Row {
            collective: Collective::AllToAllV,
            dtype: Dtype::F32,
            op: None,
            mode: Mode::Graph,
            bytes: 64,
            count: 16,
            world: 2,
            executor: Executor::Gpu,
            in_place: true,
            symmetric: false,
            cells: vec![
                Cell::status(BackendKind::Purlin, Status::NotImplemented("no all_to_all yet".into())),
                Cell { time_us: Some(20.0), ..Cell::status(BackendKind::Nccl, Status::Ok) },
                Cell::status(BackendKind::NcclSymm, Status::Unavailable("no \"windows\"".into())),
            ],
        });
        rows
    }

    pub(crate) fn sample_meta() -> Meta {
        Meta {
            tool: "purlin-bench".into(),
            command: "purlin-bench --quick".into(),
            date: format_utc(0),
            commit: "abc".into(),
            launcher: "none".into(),
            world: 2,
            gpus: vec!["NVIDIA H200".into(); 2],
            driver: Some("580.159.04".into()),
            cuda_driver: Some("13.0".into()),
            nccl: Some("2.28.3".into()),
            nccl_nvls_enable: Some("0".into()),
            backends: vec![BackendStatus {
                backend: BackendKind::Purlin,
                status: Status::NotImplemented("later".into()),
            }],
            error: None,
            notes: vec![],
            limits: vec!["copy engine: 390 GB/s".into()],
            config: None,
            topology: None,
            executor: Executor::Gpu,
            purlin_blocks_per_role: Some(16),
            purlin_max_blocks: None,
        }
    }

    #[test]
    fn utc_dates() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_795_996_800 + 3661), "2026-11-30T01:01:01Z");
    }

    #[test]
    fn speedups() {
        let rows = sample_rows();
        let s = rows[0].speedup(BackendKind::Nccl).unwrap();
        assert!((s - rows[0].cells[1].time_us.unwrap() / rows[0].cells[0].time_us.unwrap()).abs() < 1e-12);
        assert_eq!(rows[4].speedup(BackendKind::Nccl), None);
    }

    #[test]
    fn table_has_a_block_per_collective_and_mode_and_a_summary() {
        let rows = sample_rows();
        let t = table(&rows, &BackendKind::ALL, &sample_meta());
        assert!(t.contains("# all-reduce  f32  sum  eager"), "{t}");
        assert!(t.contains("# all-to-all-v  f32  none  graph"), "{t}");
        assert!(t.contains("not implemented yet"));
        assert!(t.contains("unavailable"));
        assert!(t.contains("# purlin: not implemented yet (later)"));
        // Rows line up: every data line of the all-reduce block has the same length.
        let lines: Vec<&str> = t.lines().filter(|l| l.starts_with("  ") && l.contains(" f32 ")).collect();
        assert_eq!(lines.len(), 5);
        let len = lines[0].len();
        assert!(lines[..4].iter().all(|l| l.len() == len), "{t}");
        // The 1G row: size, count and the speedup columns.
        let g = lines[3];
        let words: Vec<&str> = g.split_whitespace().collect();
        assert_eq!(&words[..4], ["1G", "268435456", "f32", "sum"], "{g}");
        assert!(g.ends_with('x'), "{g}");
        // The planted wrong elements make the summary FAILED.
        assert!(t.trim_end().ends_with("BENCH FAILED rows=5 wrong=3"), "{t}");
    }

    #[test]
    fn csv_and_json_round_trip() {
        let rows = sample_rows();
        let c = csv(&rows, &sample_meta());
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 1 + 5 * 3);
        let header: Vec<&str> = lines[0].split(',').collect();
        assert_eq!(header.len(), 22);
        for l in &lines[1..] {
            // The reason is the last, quoted field; the others have no commas.
            let (head, _) = l.split_once(",\"").unwrap();
            assert_eq!(head.split(',').count(), 21, "{l}");
        }
        assert!(lines[1].starts_with("all-reduce,f32,sum,eager,2,8,2,purlin,ok,"));
        // Purlin's lines carry its blocks per role, NCCL's do not.
        assert!(lines[1].ends_with(",gpu,16,out-of-place,\"\""), "{}", lines[1]);
        assert!(lines[2].ends_with(",gpu,,out-of-place,\"\""), "{}", lines[2]);
        assert!(lines[13].contains(",in-place,"), "{}", lines[13]);
        let j: serde_json::Value = serde_json::from_str(&json(&rows, &sample_meta()).unwrap()).unwrap();
        assert_eq!(j["meta"]["nccl"], "2.28.3");
        assert_eq!(j["rows"].as_array().unwrap().len(), 5);
        assert_eq!(j["rows"][4]["cells"][0]["status"], "not-implemented");
        assert_eq!(j["rows"][4]["collective"], "all-to-all-v");
        assert_eq!(j["rows"][2]["cells"][0]["wrong"], 3);
    }

    #[test]
    fn host_rows_and_header_are_labelled() {
        let mut rows = sample_rows();
        for r in &mut rows {
            r.executor = Executor::Host;
            r.cells.retain(|c| c.backend == BackendKind::Purlin);
        }
        let meta = Meta {
            executor: Executor::Host,
            notes: vec!["no GPU: no CUDA driver. NCCL columns are absent".into()],
            purlin_blocks_per_role: Some(2),
            purlin_max_blocks: Some(16),
            ..sample_meta()
        };
        let t = table(&rows, &[BackendKind::Purlin], &meta);
        let first = t.lines().next().unwrap();
        assert!(first.ends_with("[host executor (no GPU)]"), "{first}");
        assert!(t.contains("# no GPU: no CUDA driver. NCCL columns are absent"), "{t}");
        assert!(t.contains("# purlin blocks per role: 2 ("), "{t}");
        assert!(t.contains("at most 16 blocks per call (PURLIN_MAX_BLOCKS)"), "{t}");
        let data: Vec<&str> = t.lines().filter(|l| l.starts_with("  ")).collect();
        assert_eq!(data.len(), 5);
        assert!(data.iter().all(|l| l.ends_with("| host executor (no GPU)")), "{t}");
        assert!(!t.contains("speedup"), "{t}");
        let c = csv(&rows, &meta);
        assert!(c.lines().skip(1).all(|l| l.contains(",host executor (no GPU),2,")), "{c}");
        let j: serde_json::Value = serde_json::from_str(&json(&rows, &meta).unwrap()).unwrap();
        assert_eq!(j["meta"]["executor"], "host executor (no GPU)");
        assert_eq!(j["rows"][0]["executor"], "host executor (no GPU)");
    }

    #[test]
    fn writes_every_file() {
        let dir = std::env::temp_dir().join(format!("purlin-bench-report-{}", std::process::id()));
        let files = write_all(&dir, &sample_rows(), &BackendKind::ALL, &sample_meta()).unwrap();
        assert!(files.iter().any(|f| f.ends_with("results.csv")));
        assert!(files.iter().any(|f| f.ends_with("results.json")));
        assert!(files.iter().any(|f| f.ends_with("plot-all-reduce-eager.png")));
        let png = std::fs::read(dir.join("plot-all-reduce-eager.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let _ = std::fs::remove_dir_all(dir);
    }
}
