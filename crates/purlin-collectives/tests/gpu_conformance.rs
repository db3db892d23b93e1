//! Conformance of the device executor (docs/design.md §3.4, issue #8 item 3): the GPU runs the
//! plan it is handed, and nothing else.
//!
//! For each case, on 2 GPUs (one process) and on the host executor (CPU threads) alike:
//! 1. the plans the communicator derives run with the trace on: both executors' outputs
//!    match the independent reference, and the device trace — per rank, per block, the
//!    sequence of (step, loop-body step, chunk, epoch) — equals the host executor's;
//! 2. the same plans with one region shifted by one byte (as in
//!    `host_collectives_conformance.rs`) run on both: the output check FAILS on the GPU and
//!    on the host, and the traces still agree (same steps, chunks and epochs; the epochs
//!    continue from call 1 on both).
//!
//! The device trace comes from `Comm::launch_plan_for_conformance` (src/conformance.rs),
//! which maps the kernel's step-record word offsets back to the host's step identity.
//! Buffers have 4 KiB of slack on both sides (a shifted region may touch one byte past the
//! plan's sizes), filled alike on the GPU and the host.
//!
//! Run on the GPU machine: `gpu_conformance-test --ignored --test-threads=1 --nocapture`.

mod gpu_calls;
mod plan_on_host;

use std::collections::BTreeMap;
use std::time::Duration;

use cudarc::driver::CudaSlice;
use gpu_calls::{Call, Coll, Dt, Rng, WORLD, call, fresh_seed, streams};
use plan_on_host::{execute_on_host, shift_first};
use purlin_collectives::internal::host_executor::{HostMemoryConfig, HostWorld, TraceEntry};
use purlin_collectives::internal::tuning::Tuning;
use purlin_collectives::{Comm, CommConfig, ReduceOp};
use purlin_snac::{Plan, Regime, Space, StagingSide, Step};

/// Bytes of slack after every buffer.
const SLACK: usize = 4096;
use purlin_testkit::POISON;

struct Case {
    what: &'static str,
    tuning: Tuning,
    call: Call,
    /// The region to shift in rank 0's plan (None: derived plans only).
    shift: Option<fn(&Step) -> bool>,
    /// Whether the shifted plan's outputs are deterministic (no two writers of one byte), so
    /// the GPU's and the host's must be byte-identical.
    deterministic: bool,
}

fn cases() -> Vec<Case> {
    let staged = |side| Tuning {
        regime: Some(Regime::Throughput),
        staging_side: side,
        chunk_bytes: 64 << 10,
        blocks_per_role: 2,
        slots: 2,
        ..Tuning::default()
    };
    let latency = Tuning { regime: Some(Regime::Latency), blocks_per_role: 2, ..Tuning::default() };
    vec![
        Case {
            what: "throughput/push AllGather u8: a gather's output destination + 1",
            tuning: staged(StagingSide::Peer),
            call: call(Coll::AllGather, Dt::U8, ReduceOp::Sum, 1_000_003),
            shift: Some(
                |s| matches!(s, Step::Gather { dst, src, .. } if dst.space == Space::Output && matches!(src.space, Space::Staging(_))),
            ),
            deterministic: false,
        },
        Case {
            what: "throughput/pull AllGather u8: a stage's staging destination + 1",
            tuning: staged(StagingSide::Own),
            call: call(Coll::AllGather, Dt::U8, ReduceOp::Sum, 1_000_003),
            shift: Some(|s| matches!(s, Step::Stage { dst, .. } if matches!(dst.space, Space::Staging(_)))),
            deterministic: false,
        },
        Case {
            what: "latency AllGather u8: a put's input source + 1",
            tuning: latency,
            call: call(Coll::AllGather, Dt::U8, ReduceOp::Sum, 3000),
            shift: Some(|s| matches!(s, Step::PutPackets { .. })),
            deterministic: true,
        },
        Case {
            what: "throughput/push AllReduce i32 Sum (derived plans: trace and output)",
            tuning: staged(StagingSide::Peer),
            call: call(Coll::AllReduce, Dt::I32, ReduceOp::Sum, 300_001),
            shift: None,
            deterministic: true,
        },
        Case {
            what: "latency ReduceScatter f32 Max (derived plans: trace and output)",
            tuning: latency,
            call: call(Coll::ReduceScatter, Dt::F32, ReduceOp::Max, 5000),
            shift: None,
            deterministic: true,
        },
    ]
}

/// Every rank's input bytes followed by slack (zeros), and output bytes + slack (poison).
struct Io {
    inputs: Vec<Vec<u8>>,
    out_bytes: Vec<usize>,
}

impl Io {
    fn new(call: &Call, values: &[Vec<i64>]) -> Io {
        let inputs = values
            .iter()
            .map(|v| {
                let mut b = call.encode(v);
                b.resize(b.len() + SLACK, 0);
                b
            })
            .collect();
        let out_bytes = (0..WORLD).map(|r| call.lens(r).1 * call.dt.size()).collect();
        Io { inputs, out_bytes }
    }
}

/// Runs `plans` on the GPUs (one conformance launch per rank, then both collected): every
/// rank's whole output buffer (output + slack) and trace.
fn run_device(comms: &[Comm], plans: &[Plan], io: &Io) -> (Vec<Vec<u8>>, Vec<Vec<TraceEntry>>) {
    let mut sends: Vec<CudaSlice<u8>> = Vec::new();
    let mut recvs: Vec<CudaSlice<u8>> = Vec::new();
    for (r, c) in comms.iter().enumerate() {
        let s = c.stream();
        sends.push(s.clone_htod(&io.inputs[r]).expect("upload input"));
        recvs.push(s.clone_htod(&vec![POISON; io.out_bytes[r] + SLACK]).expect("poison output"));
    }
    let mut launches = Vec::new();
    for ((c, p), (s, d)) in comms.iter().zip(plans).zip(sends.iter().zip(recvs.iter_mut())) {
        launches
            .push(c.launch_plan_for_conformance(p, s, d).unwrap_or_else(|e| panic!("rank {}: launch: {e}", c.rank())));
    }
    let traces: Vec<Vec<TraceEntry>> = launches
        .into_iter()
        .enumerate()
        .map(|(r, l)| l.trace().unwrap_or_else(|e| panic!("rank {r}: the device run failed: {e}")))
        .collect();
    let outputs = comms.iter().zip(&recvs).map(|(c, d)| c.stream().clone_dtoh(d).expect("download")).collect();
    (outputs, traces)
}

/// Runs `plans` on `host` (one thread per rank, one per block): whole output buffers and
/// traces.
fn run_host(host: &HostWorld, plans: &[Plan], io: &Io) -> (Vec<Vec<u8>>, Vec<Vec<TraceEntry>>) {
    let mut outputs: Vec<Vec<u8>> = io.out_bytes.iter().map(|&n| vec![POISON; n + SLACK]).collect();
    let traces = execute_on_host(host, plans, &io.inputs, &mut outputs, true)
        .into_iter()
        .enumerate()
        .map(|(r, t)| t.unwrap_or_else(|e| panic!("host rank {r}: {e}")))
        .collect();
    (outputs, traces)
}

/// One traced step: (top-level step, loop-body step, chunk, epoch).
type Traced = (u32, Option<u32>, u64, u64);

/// A trace per block, in execution order.
fn by_block(trace: &[TraceEntry]) -> BTreeMap<u32, Vec<Traced>> {
    let mut m: BTreeMap<u32, Vec<_>> = BTreeMap::new();
    for e in trace {
        m.entry(e.block).or_default().push((e.step, e.body, e.chunk, e.epoch));
    }
    m
}

/// The device's and the host's traces of one rank, compared per block.
fn compare_traces(label: &str, r: usize, plan: &Plan, dev: &[TraceEntry], host: &[TraceEntry]) -> Result<(), String> {
    let (d, h) = (by_block(dev), by_block(host));
    let expect: Vec<u64> = purlin_collectives::internal::conformance::trace_entries_per_block(plan);
    if h.len() != plan.grid()
        || expect.iter().enumerate().any(|(b, &n)| h.get(&(b as u32)).map_or(0, Vec::len) as u64 != n)
    {
        return Err(format!("{label} rank {r}: the host trace does not cover every step of every block"));
    }
    for b in 0..plan.grid() as u32 {
        let (ds, hs) = (d.get(&b).map(Vec::as_slice).unwrap_or(&[]), &h[&b]);
        if ds != hs.as_slice() {
            let at = ds.iter().zip(hs).position(|(x, y)| x != y).unwrap_or(ds.len().min(hs.len()));
            return Err(format!(
                "{label} rank {r} block {b}: device trace ({} entries) differs from the host's ({}) at entry {at}: device {:?} host {:?}",
                ds.len(),
                hs.len(),
                ds.get(at),
                hs.get(at)
            ));
        }
    }
    Ok(())
}

/// One past the furthest staging byte any step of `plan` may touch (every slot, both halves).
fn staging_extent(plan: &Plan) -> u64 {
    fn walk(steps: &[Step], end: &mut u64) {
        for s in steps {
            let (regions, len): (Vec<&purlin_snac::Region>, u64) = match s {
                Step::ChunkLoop { body, .. } => {
                    walk(body, end);
                    continue;
                }
                Step::Stage { dst, src, len, .. } | Step::Gather { dst, src, len, .. } => (vec![dst, src], len.max),
                Step::Reduce { dst, srcs, len, .. } => (std::iter::once(dst).chain(srcs).collect(), len.max),
                _ => continue,
            };
            for r in regions.into_iter().filter(|r| matches!(r.space, Space::Staging(_))) {
                let o = r.offset;
                *end = (*end).max(o.base + o.chunk_modulus.saturating_sub(1) * o.chunk_stride + o.sense_stride + len);
            }
        }
    }
    let mut end = 0;
    for b in &plan.blocks {
        walk(&b.steps, &mut end);
    }
    end
}

fn host_memory(plans: &[Plan]) -> HostMemoryConfig {
    let max = |f: &dyn Fn(&Plan) -> u64| plans.iter().map(f).max().unwrap_or(0) as usize;
    HostMemoryConfig {
        staging_bytes: max(&|p| p.resources.staging_bytes) + SLACK,
        window_bytes: max(&|p| p.resources.window_bytes) + SLACK,
        flag_words: max(&|p| u64::from(p.resources.flag_words)).max(1),
        counter_words: max(&|p| u64::from(p.resources.counter_words)).max(1),
        epoch_words: max(&|p| u64::from(p.resources.epoch_words).max(p.grid() as u64)).max(1),
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn device_traces_equal_the_host_executors_and_a_shifted_region_fails_on_the_gpu() {
    let streams = streams();
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let mut failures: Vec<String> = Vec::new();
    let mut fail = |ok: bool, what: String| {
        println!("EXEC conformance: {} {what}", if ok { "ok  " } else { "FAIL" });
        if !ok {
            failures.push(what);
        }
    };
    for case in cases() {
        let cfg = CommConfig {
            timeout: Duration::from_secs(60),
            device_timeout: Duration::from_secs(10),
            tuning: case.tuning,
            ..gpu_calls::base_config()
        };
        let comms = Comm::from_devices_with_config(streams.clone(), cfg).expect("set-up");
        let plans: Vec<Plan> = comms.iter().map(|c| case.call.plan(c)).collect();
        let entries: Vec<u64> = plans
            .iter()
            .map(|p| purlin_collectives::internal::conformance::trace_entries_per_block(p).iter().sum())
            .collect();
        println!(
            "EXEC conformance: {}: {:?} grid {} (trace entries per rank {entries:?})",
            case.what,
            plans[0].regime,
            plans[0].grid()
        );
        for p in &plans {
            let end = staging_extent(p);
            assert!(
                end < comms[0].diag().workspace_layout().config.staging_bytes as u64,
                "a staging access shifted by one byte (plan's furthest staging byte: {end}) must stay inside the workspace's staging"
            );
        }
        let host = HostWorld::new(WORLD, host_memory(&plans), Duration::from_secs(30));

        // 1. The derived plans.
        let values = case.call.inputs(&mut rng);
        let io = Io::new(&case.call, &values);
        let (dev_out, dev_trace) = run_device(&comms, &plans, &io);
        let (host_out, host_trace) = run_host(&host, &plans, &io);
        for r in 0..WORLD {
            let n = io.out_bytes[r];
            let d = case.call.check_bytes(&values, r, &dev_out[r][..n]);
            fail(d.is_ok(), format!("{}: derived plan, GPU output rank {r} exact: {d:?}", case.what));
            let h = case.call.check_bytes(&values, r, &host_out[r][..n]);
            fail(h.is_ok(), format!("{}: derived plan, host output rank {r} exact: {h:?}", case.what));
            fail(
                dev_out[r][n..].iter().all(|&b| b == POISON),
                format!("{}: derived plan, GPU slack untouched rank {r}", case.what),
            );
            let t = compare_traces(case.what, r, &plans[r], &dev_trace[r], &host_trace[r]);
            fail(
                t.is_ok(),
                format!(
                    "{}: derived plan, rank {r} device trace == host trace ({} entries): {t:?}",
                    case.what,
                    host_trace[r].len()
                ),
            );
        }

        // 2. One region shifted by one byte in rank 0's plan.
        let Some(pick) = case.shift else { continue };
        let mut broken = plans.clone();
        assert!(shift_first(&mut broken[0], pick), "{}: no such region in rank 0's plan", case.what);
        assert_ne!(broken, plans);
        let values = case.call.inputs(&mut rng);
        let io = Io::new(&case.call, &values);
        let (dev_out, dev_trace) = run_device(&comms, &broken, &io);
        let (host_out, host_trace) = run_host(&host, &broken, &io);
        let verdict = |outs: &[Vec<u8>]| -> Result<(), String> {
            (0..WORLD).try_for_each(|r| case.call.check_bytes(&values, r, &outs[r][..io.out_bytes[r]]))
        };
        let (dv, hv) = (verdict(&dev_out), verdict(&host_out));
        fail(dv.is_err(), format!("{}: shifted plan, the GPU output check FAILS as it must: {dv:?}", case.what));
        fail(hv.is_err(), format!("{}: shifted plan, the host output check fails as it must: {hv:?}", case.what));
        for r in 0..WORLD {
            let t = compare_traces(case.what, r, &broken[r], &dev_trace[r], &host_trace[r]);
            fail(t.is_ok(), format!("{}: shifted plan, rank {r} device trace == host trace: {t:?}", case.what));
        }
        let same = dev_out == host_out;
        if case.deterministic {
            fail(same, format!("{}: shifted plan, GPU and host outputs byte-identical", case.what));
        } else {
            println!(
                "EXEC conformance: info {}: shifted plan, GPU and host outputs identical: {same} (racy byte, not required)",
                case.what
            );
        }
        for c in &comms {
            c.async_error().expect("no device error");
        }
    }
    println!("EXEC conformance: seed {seed}: {} failed properties", failures.len());
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A one-copy plan (symmetric outputs) runs through the conformance launch only on symmetric
/// buffers: there it gets every rank's output as a call does and gathers the right bytes,
/// with every block traced; on plain buffers it is refused before it is launched.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn one_copy_plans_run_traced_on_symmetric_buffers_and_are_refused_on_plain_ones() {
    let streams = streams();
    // Forced to the throughput regime: at this size the default would send packets.
    let tuning = Tuning { regime: Some(Regime::Throughput), ..Tuning::default() };
    let cfg = CommConfig { device_timeout: Duration::from_secs(10), tuning, ..gpu_calls::base_config() };
    let comms = Comm::from_devices_with_config(streams, cfg).expect("set-up");
    let per_rank = 3000usize; // 12 000 bytes of f32 per rank
    let inputs: Vec<Vec<f32>> =
        (0..WORLD).map(|r| (0..per_rank).map(|i| (i * 5 + r * 1001) as f32).collect()).collect();
    // The test kit's reference, and its poison in every output.
    let case = purlin_testkit::Case::with_counts(
        purlin_testkit::Collective::AllGather,
        purlin_testkit::Dtype::F32,
        None,
        WORLD,
        purlin_testkit::Counts::Uniform(per_rank),
    );
    let in_bytes: Vec<Vec<u8>> = inputs.iter().map(|x| x.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
    let expected = purlin_testkit::reference::expected(&case, &in_bytes, 0);
    let poison = vec![f32::from_le_bytes([POISON; 4]); per_rank * WORLD];
    let spec = purlin_snac::CollectiveSpec::all_gather(WORLD as u32, purlin_snac::DataType::F32, per_rank as u64);
    let mut ins = Comm::alloc_symmetric_group::<f32>(&comms, per_rank).expect("symmetric inputs");
    let mut outs = Comm::alloc_symmetric_group::<f32>(&comms, per_rank * WORLD).expect("symmetric outputs");
    let mut plans = Vec::new();
    for (r, c) in comms.iter().enumerate() {
        c.context().bind_to_thread().expect("bind");
        c.stream().memcpy_htod(&inputs[r], &mut ins[r]).expect("upload");
        c.stream().memcpy_htod(&poison, &mut outs[r]).expect("poison");
        let (i, _) = cudarc::driver::DevicePtr::device_ptr(&ins[r], &c.stream());
        let (o, _) = cudarc::driver::DevicePtr::device_ptr(&outs[r], &c.stream());
        let plan = c.plan_for_buffers(spec.clone(), false, i, o).expect("plan");
        assert_eq!(plan.peer_spaces(), (false, true), "rank {r}: symmetric outputs give a one-copy plan");
        plans.push(plan);
    }

    // Plain buffers: refused, nothing launched (so the peer is not left waiting).
    {
        let c = &comms[0];
        c.context().bind_to_thread().expect("bind");
        let plain_in: CudaSlice<f32> = c.stream().alloc_zeros(per_rank).expect("alloc");
        let mut plain_out: CudaSlice<f32> = c.stream().alloc_zeros(per_rank * WORLD).expect("alloc");
        let refused = c.launch_plan_for_conformance(&plans[0], &plain_in, &mut plain_out).map(|_| ());
        assert!(
            matches!(refused, Err(purlin_collectives::Error::InvalidArgument(_))),
            "a one-copy plan on plain buffers: {refused:?}"
        );
    }

    let mut launches = Vec::new();
    for ((c, plan), (i, o)) in comms.iter().zip(&plans).zip(ins.iter().zip(outs.iter_mut())) {
        c.context().bind_to_thread().expect("bind");
        launches.push(c.launch_plan_for_conformance(plan, i, o).expect("one-copy launch"));
    }
    let traces: Vec<_> = launches.into_iter().map(|l| l.timed_trace().expect("trace")).collect();
    for (r, (c, plan)) in comms.iter().zip(&plans).enumerate() {
        assert_eq!(traces[r].len(), plan.grid(), "rank {r}: a trace per block");
        assert!(traces[r].iter().all(|b| !b.steps.is_empty() && b.end_ns != 0), "rank {r}: every block ran to its end");
        c.context().bind_to_thread().expect("bind");
        let got = c.stream().clone_dtoh(&outs[r]).expect("download");
        let got: Vec<u8> = got.iter().flat_map(|v| v.to_le_bytes()).collect();
        purlin_testkit::check(purlin_testkit::Dtype::F32, purlin_testkit::Compare::Value, &got, &expected)
            .unwrap_or_else(|e| panic!("rank {r}: one-copy AllGather through the conformance launch: {e}"));
    }
    println!(
        "EXEC conformance: one-copy AllGather traced on symmetric buffers ({} blocks per rank), refused on plain ones",
        plans[0].grid()
    );
    Comm::free_symmetric_group(&comms, outs).expect("free outputs");
    Comm::free_symmetric_group(&comms, ins).expect("free inputs");
}
