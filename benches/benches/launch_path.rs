//! The host-side launch path, per call: what `purlin-bench` does around every call (argument
//! parsing once, the case layout per size, the host check per call), and on a GPU the
//! host-side cost of one `purlin_collectives::Comm::all_reduce` (argument validation and
//! enqueue; a one-rank communicator, so the call never waits for a peer).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use purlin_benches::cli;
use purlin_benches::spec::{Case, Collective, Dtype, Op};

fn argument_validation(c: &mut Criterion) {
    let argv: Vec<String> =
        "--collective all-reduce,all-to-all-v --dtype bf16 --op sum --min 8 --max 1G --mode both --iters 20 --skew 1.2"
            .split_whitespace()
            .map(String::from)
            .collect();
    c.bench_function("bench_args_parse_and_validate", |b| b.iter(|| cli::parse(black_box(&argv)).expect("valid")));
}

fn case_layout(c: &mut Criterion) {
    c.bench_function("case_layout_all_to_all_v_world8", |b| {
        b.iter(|| {
            let case =
                Case::new(Collective::AllToAllV, Dtype::F32, Op::Sum, 8, black_box(1 << 20), 1.0, 1).expect("case");
            (0..8).map(|r| case.segments(r).len() + case.out_count(r)).sum::<usize>()
        })
    });
}

fn host_check(c: &mut Criterion) {
    let case = Case::new(Collective::AllReduce, Dtype::Bf16, Op::Sum, 2, 1 << 20, 0.0, 1).expect("case");
    let expected = case.expected(0);
    let got = expected.clone();
    c.bench_function("check_1MiB_bf16", |b| b.iter(|| case.count_wrong(black_box(&got), &expected).count));
    c.bench_function("inputs_and_expected_1MiB_bf16", |b| b.iter(|| (case.input(0).len(), case.expected(0).len())));
}

fn purlin_call_host_cost(c: &mut Criterion) {
    if purlin_topo::device_count() == 0 {
        eprintln!("no GPU: skipping purlin_all_reduce_host_cost");
        return;
    }
    let ctx = match cudarc::driver::CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => return eprintln!("GPU 0: {e}; skipping"),
    };
    let stream = match ctx.new_stream() {
        Ok(s) => s,
        Err(e) => return eprintln!("stream: {e}; skipping"),
    };
    let comm = match purlin_collectives::Comm::from_devices(vec![stream.clone()]) {
        Ok(mut v) => v.remove(0),
        Err(e) => return eprintln!("purlin Comm::from_devices: {e}; skipping"),
    };
    let send = stream.alloc_zeros::<f32>(256).expect("alloc");
    let mut recv = stream.alloc_zeros::<f32>(256).expect("alloc");
    c.bench_function("purlin_all_reduce_1KiB_host_cost", |b| {
        b.iter(|| {
            let r = comm.all_reduce(&send, &mut recv, &purlin_collectives::ReduceOp::Sum);
            black_box(r.is_ok())
        })
    });
    let _ = stream.synchronize();
}

criterion_group!(benches, argument_validation, case_layout, host_check, purlin_call_host_cost);
criterion_main!(benches);
