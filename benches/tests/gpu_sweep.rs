//! The benchmark on real GPUs (ignored elsewhere; the GPU round runs it with --ignored): a
//! short sweep of every collective, one process with a thread per GPU, every backend. NCCL's
//! results must be measured and correct; Purlin's cells must be measured or say "not
//! implemented yet", never fail. Prints the table and a ROUND line for the round's summary.

use purlin_benches::backend::{BackendKind, Status};
use purlin_benches::cli;
use purlin_benches::launch::{Launched, launch};
use purlin_benches::report;

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn short_sweep_on_every_gpu_is_correct() {
    assert_eq!(
        std::env::var("NCCL_NVLS_ENABLE").as_deref(),
        Ok("0"),
        "run with NCCL_NVLS_ENABLE=0 (the GPU round sets it)"
    );
    let out = std::env::temp_dir().join(format!("purlin-bench-gpu-test-{}", std::process::id()));
    let argv: Vec<String> =
        ["--quick", "--max", "1M", "--launcher", "none", "--timeout", "60", "--out", out.to_str().unwrap()]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let args = cli::parse(&argv).unwrap();
    let (meta, rows) = match launch(&args).unwrap() {
        Launched::Rank0 { meta, rows, .. } => (meta, rows),
        other => panic!("expected results, got {other:?}"),
    };
    print!("{}", report::table(&rows, &args.config.backends, &meta));
    report::write_all(&out, &rows, &args.config.backends, &meta).unwrap();
    assert_eq!(meta.error, None);
    assert!(!rows.is_empty());
    let mut summary = Vec::new();
    for r in &rows {
        for c in &r.cells {
            match (&c.status, c.backend) {
                (Status::Ok, _) => {
                    assert_eq!(c.wrong, Some(0), "{} {} {:?} {}", r.collective, r.bytes, r.mode, c.backend)
                }
                (Status::NotImplemented(_), BackendKind::Purlin) => {}
                (Status::Unavailable(_), BackendKind::NcclSymm | BackendKind::Purlin) => {}
                (s, b) => panic!("{} {} {:?} {b}: {s:?}", r.collective, r.bytes, r.mode),
            }
            let wanted =
                r.collective == purlin_benches::spec::Collective::AllReduce && (r.bytes == 8 || r.bytes == 1 << 19);
            if let Some(t) = c.time_us.filter(|_| wanted) {
                summary.push(format!("{} {} {} {t:.1}us", c.backend, r.bytes, r.mode));
            }
        }
        assert!(r.cell(BackendKind::Nccl).is_some_and(|c| c.status == Status::Ok), "nccl must run everywhere");
    }
    println!("ROUND purlin-bench world {} all-reduce f32: {}", meta.world, summary.join(", "));
    for l in &meta.limits {
        println!("ROUND purlin-bench limits: {l}");
    }
    let _ = std::fs::remove_dir_all(out);
}
