//! The sweep's machinery end to end without a GPU: two ranks on threads, host memory as the
//! device, and a simulated backend that really moves and reduces the data between the ranks
//! (so #wrong, the agreement on statuses, timing and the rows are all exercised). One
//! backend plants a wrong element and claims all-to-all is not implemented.

use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use purlin_benches::backend::{Backend, BackendKind, CallError, Status};
use purlin_benches::case::{Case, Segment};
use purlin_benches::cli;
use purlin_benches::coord::{Coord, Region};
use purlin_benches::gpu::HostDevice;
use purlin_benches::report;
use purlin_benches::run::{self, Outcome};
use purlin_benches::spec::{Collective, Op};

struct Shared {
    barrier: Barrier,
    sends: Mutex<Vec<u64>>,
}

struct Sim {
    kind: BackendKind,
    rank: usize,
    shared: Arc<Shared>,
    send: Vec<u8>,
    recv: Vec<u8>,
    plant_wrong: Option<Collective>,
    not_implemented: Option<Collective>,
}

impl Backend for Sim {
    fn kind(&self) -> BackendKind {
        self.kind
    }
    fn send_ptr(&self) -> u64 {
        self.send.as_ptr() as u64
    }
    fn recv_ptr(&self) -> u64 {
        self.recv.as_ptr() as u64
    }
    fn supports(&self, case: &Case) -> Result<(), CallError> {
        match self.not_implemented {
            Some(c) if c == case.collective => Err(CallError::NotImplemented(format!("no {c} yet"))),
            _ => Ok(()),
        }
    }
    fn enqueue(&mut self, case: &Case) -> Result<(), CallError> {
        self.shared.sends.lock().unwrap()[self.rank] = self.send.as_ptr() as u64;
        self.shared.barrier.wait();
        let sends = self.shared.sends.lock().unwrap().clone();
        let es = case.dtype.size();
        let peer = |p: usize, i: usize| {
            // SAFETY: every rank's send buffer stays alive and unchanged between the two
            // barriers of this call, and holds at least the case's input.
            unsafe { std::slice::from_raw_parts((sends[p] + (i * es) as u64) as *const u8, es) }
        };
        for seg in case.segments(self.rank) {
            match seg {
                Segment::Copy { out, from, input, len } => {
                    for i in 0..len {
                        self.recv[(out + i) * es..(out + i + 1) * es].copy_from_slice(peer(from, input + i));
                    }
                }
                Segment::Reduce { out, input, len } => {
                    for i in 0..len {
                        let vals = (0..case.world).map(|p| case.dtype.decode(peer(p, input + i)) as i64);
                        let v = match case.op.unwrap_or(Op::Sum) {
                            Op::Sum => vals.sum(),
                            Op::Prod => vals.product(),
                            Op::Min => vals.min().unwrap(),
                            Op::Max => vals.max().unwrap(),
                            Op::Avg => vals.sum::<i64>() / case.world as i64,
                        };
                        case.dtype.encode(v, &mut self.recv[(out + i) * es..(out + i + 1) * es]);
                    }
                }
            }
        }
        if self.plant_wrong == Some(case.collective) && self.rank == 0 {
            self.recv[0] ^= 0x40;
        }
        self.shared.barrier.wait();
        Ok(())
    }
}

fn sweep(argv: &str) -> (Vec<Outcome>, cli::Args) {
    let args = cli::parse(&argv.split_whitespace().map(String::from).collect::<Vec<_>>()).unwrap();
    let world = 2;
    let (send, recv) = args.config.buffer_bytes(world);
    let region = Region::local(world);
    let shared: Vec<Arc<Shared>> =
        (0..2).map(|_| Arc::new(Shared { barrier: Barrier::new(world), sends: Mutex::new(vec![0; world]) })).collect();
    let outs = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                let (region, shared, cfg) = (region.clone(), shared.clone(), &args.config);
                s.spawn(move || {
                    let coord = Coord::new(region, rank, world, Duration::from_secs(30));
                    let mk = |kind, i: usize, plant_wrong, not_implemented| {
                        Box::new(Sim {
                            kind,
                            rank,
                            shared: shared[i].clone(),
                            send: vec![0; send],
                            recv: vec![0; recv],
                            plant_wrong,
                            not_implemented,
                        }) as Box<dyn Backend>
                    };
                    let mut backends = vec![
                        mk(BackendKind::Purlin, 0, Some(Collective::AllReduce), Some(Collective::AllToAll)),
                        mk(BackendKind::Nccl, 1, None, None),
                    ];
                    run::run_backends(cfg, &HostDevice, &coord, &mut backends, &|_| {})
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (outs, args)
}

#[test]
fn host_sweep_checks_times_and_agrees() {
    let (outs, args) =
        sweep("--collective all --max 4K --factor 8 --iters 3 --runs 4 --min-runs 2 --warmup 1 --backends purlin,nccl");
    for o in &outs {
        assert_eq!(o.error, None);
    }
    let rows = &outs[0].rows;
    // Ranks agree on every row and status (the timings are max over ranks on both).
    assert_eq!(rows.len(), outs[1].rows.len());
    for (a, b) in rows.iter().zip(&outs[1].rows) {
        assert_eq!((a.collective, a.bytes, a.mode), (b.collective, b.bytes, b.mode));
        for (x, y) in a.cells.iter().zip(&b.cells) {
            assert_eq!((x.backend, &x.status, x.wrong, x.time_us), (y.backend, &y.status, y.wrong, y.time_us));
        }
    }
    // 7 collectives × sizes 8, 64, 512, 4K × 2 modes.
    assert_eq!(rows.len(), 7 * 4 * 2);
    for r in rows {
        let nccl = r.cell(BackendKind::Nccl).unwrap();
        let purlin = r.cell(BackendKind::Purlin).unwrap();
        match r.mode {
            purlin_benches::spec::Mode::Graph => {
                assert!(matches!(nccl.status, Status::Unsupported(_)), "{:?}", nccl.status);
            }
            purlin_benches::spec::Mode::Eager => {
                assert_eq!(nccl.status, Status::Ok);
                assert_eq!(nccl.wrong, Some(0), "{} {}", r.collective, r.bytes);
                assert!(nccl.time_us.unwrap() > 0.0 && nccl.runs >= 2 && nccl.runs <= 4);
                if r.collective == Collective::AllToAll {
                    assert!(matches!(purlin.status, Status::NotImplemented(_)));
                } else if r.collective == Collective::AllReduce {
                    // The planted element: wrong on rank 0 only, and no speedup for a wrong result.
                    assert_eq!(purlin.wrong, Some(1), "{} {}", r.collective, r.bytes);
                    assert_eq!(r.speedup(BackendKind::Nccl), None);
                } else {
                    assert_eq!(purlin.wrong, Some(0), "{} {}", r.collective, r.bytes);
                    assert!(r.speedup(BackendKind::Nccl).is_some());
                }
            }
        }
    }
    let meta = report_meta();
    let t = report::table(rows, &args.config.backends, &meta);
    print!("{t}");
    // The files, from real (host) measurements; kept where PURLIN_BENCH_PLOT_DIR says.
    let dir = std::env::var("PURLIN_BENCH_PLOT_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir().join(format!("purlin-bench-host-{}", std::process::id())));
    let files = report::write_all(&dir, rows, &args.config.backends, &meta).unwrap();
    assert!(files.iter().any(|f| f.ends_with("plot-all-gather-eager.png")), "{files:?}");
    // Graph mode measured nothing here: no plot for it.
    assert!(!files.iter().any(|f| f.ends_with("plot-all-gather-graph.png")), "{files:?}");
    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 56 * 2);
    if std::env::var("PURLIN_BENCH_PLOT_DIR").is_err() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(t.contains("not implemented yet"));
    assert!(t.contains("#   purlin: no all-to-all yet"), "{t}");
    assert!(t.contains("#   nccl: graph mode needs a GPU"), "{t}");
    assert!(t.trim_end().ends_with("BENCH FAILED rows=56 wrong=4"), "{t}");
}

fn report_meta() -> report::Meta {
    report::Meta {
        tool: "test".into(),
        command: "test".into(),
        date: report::utc_now(),
        commit: "test".into(),
        launcher: "none".into(),
        world: 2,
        gpus: vec![],
        driver: None,
        cuda_driver: None,
        nccl: None,
        nccl_nvls_enable: None,
        backends: vec![],
        error: None,
        notes: vec![],
        limits: vec![],
        config: None,
        topology: None,
        ..report::Meta::default()
    }
}
