//! Plan derivation sits on the launch path unless cached: how long does it take?
use criterion::{Criterion, black_box, criterion_group, criterion_main};
use purlin_snac::*;

fn bench(c: &mut Criterion) {
    let cases = [
        (
            "all-reduce w8 throughput 64MiB",
            CollectiveSpec::all_reduce(8, DataType::Bf16, ReduceOp::Sum, 32 << 20),
            Regime::Throughput,
        ),
        (
            "all-reduce w8 latency 4KiB",
            CollectiveSpec::all_reduce(8, DataType::Bf16, ReduceOp::Sum, 2048),
            Regime::Latency,
        ),
        ("all-gather w2 throughput 1MiB", CollectiveSpec::all_gather(2, DataType::F32, 1 << 18), Regime::Throughput),
        (
            "all-to-all-v w16 throughput",
            CollectiveSpec::all_to_all_v(
                16,
                DataType::F16,
                (0..16).map(|s| (0..16).map(|d| (s * d * 997) % 50_000).collect()).collect(),
            ),
            Regime::Throughput,
        ),
    ];
    for (name, spec, regime) in cases {
        let cfg = PlanConfig { regime, ..PlanConfig::default() };
        c.bench_function(&format!("derive {name} (all ranks)"), |b| {
            b.iter(|| derive(black_box(&spec), black_box(&cfg)))
        });
        c.bench_function(&format!("derive {name} (rank 1)"), |b| {
            b.iter(|| derive_rank(black_box(&spec), black_box(&cfg), 1))
        });
    }
    let plan =
        derive_rank(&CollectiveSpec::all_reduce(8, DataType::Bf16, ReduceOp::Sum, 32 << 20), &PlanConfig::default(), 0)
            .unwrap();
    c.bench_function("params encode all-reduce w8", |b| b.iter(|| black_box(&plan).params()));
    c.bench_function("kernel key all-reduce w8", |b| b.iter(|| black_box(&plan).kernel_key()));
}

criterion_group!(benches, bench);
criterion_main!(benches);
