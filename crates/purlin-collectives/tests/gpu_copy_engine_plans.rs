//! Copy-engine plans on the GPU (docs/perf/copy-engines.md §3.5): with the datapath set to
//! the copy engines, every eligible collective on symmetric buffers (AllGather, AllToAll,
//! AllGatherV, AllToAllV with empty pairs and with every count zero, Broadcast from root 0
//! and from root 1, and the AllReduce, Sum and Max at sizes the world does not divide, whose
//! entry kernel reduces the shard on SM blocks before the copy engines push it) runs as entry
//! kernel, engine copies and notifies, exit kernel, and is exact against purlin-testkit:
//! eager, twice over, with SM ReduceScatters (one-copy, so on the same entry and done words)
//! between them, and captured into one CUDA graph per rank (the SM calls too) replayed three
//! times with fresh inputs. Each call is asserted to run on the copy engines (its plan, the
//! one the call launched, has an engine program) and each SM call not to. World 2 (one
//! process, one thread); two ranks on one GPU with `PURLIN_SHARED_GPU=1`.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, DeviceSlice};
use purlin_collectives::internal::tuning::Datapath;
use purlin_collectives::{Call as ApiCall, Comm, CommConfig, Error, ReduceOp, Status, SymmetricBuffer};
use purlin_snac::{DataType, Regime};
use purlin_testkit::{self as kit, Counts};

mod gpu_calls;
use gpu_calls::{Rng, WORLD, base_config, fresh_seed, streams};

const N: usize = 1 << 14;

fn ce_config() -> CommConfig {
    let mut c = base_config();
    c.tuning.datapath = Datapath::CopyEngine;
    // The copy engines carry one-copy gathers, which are throughput-regime plans; below
    // `latency_max_bytes` a call would take packets on SM blocks whatever the datapath.
    c.tuning.regime = Some(Regime::Throughput);
    c
}

/// One call of the test: what the user passes, purlin-testkit's statement of it (inputs and
/// reference), whether it must run on the copy engines, and its buffers on every rank
/// (symmetric, each shown at the rank's exact length).
struct CeCall {
    name: &'static str,
    call: ApiCall,
    kit: kit::Case,
    ce: bool,
    send: Vec<SymmetricBuffer<f32>>,
    recv: Vec<SymmetricBuffer<f32>>,
}

fn ce_call(comms: &[Comm], name: &'static str, call: ApiCall, kit: kit::Case, ce: bool) -> CeCall {
    let cap = (0..WORLD).map(|r| kit.in_count(r).max(kit.out_count(r))).max().unwrap_or(0).max(1);
    let mut send = Comm::alloc_symmetric_group::<f32>(comms, cap).expect("symmetric inputs");
    let mut recv = Comm::alloc_symmetric_group::<f32>(comms, cap).expect("symmetric outputs");
    for (c, (s, o)) in comms.iter().zip(send.iter_mut().zip(recv.iter_mut())) {
        s.set_len(kit.in_count(c.rank())).expect("input length");
        o.set_len(kit.out_count(c.rank())).expect("output length");
    }
    CeCall { name, call, kit, ce, send, recv }
}

/// Every call, in the order they run: the copy-engine collectives with SM ReduceScatters between.
fn sequence(comms: &[Comm]) -> Vec<CeCall> {
    let f32k = kit::Dtype::F32;
    let case = |c, op, counts| kit::Case::with_counts(c, f32k, op, WORLD, counts);
    let u = |v: &[usize]| v.iter().map(|&c| c as u64).collect::<Vec<u64>>();
    let a2a_v = vec![vec![N, N / 4], vec![0, N + 3]];
    let zeros = vec![vec![0; WORLD]; WORLD];
    let agv = vec![N + 5, N / 3];
    let agv_empty = vec![N / 2, 0];
    // The SM calls between: with the copy engines selected, a symmetric AllReduce takes them
    // too, and the one-copy ReduceScatter (SM blocks) shares their entry and done words.
    let sm_reduce_scatter = |comms: &[Comm], name| {
        let call = ApiCall::ReduceScatter { len: N, op: ReduceOp::Sum };
        let kit = case(kit::Collective::ReduceScatter, Some(kit::Op::Sum), Counts::Uniform(N));
        ce_call(comms, name, call, kit, false)
    };
    let all_reduce = |comms: &[Comm], name, len, op, kit_op| {
        let call = ApiCall::AllReduce { len, op };
        ce_call(comms, name, call, case(kit::Collective::AllReduce, Some(kit_op), Counts::Uniform(len)), true)
    };
    vec![
        ce_call(
            comms,
            "AllGather",
            ApiCall::AllGather { len: N },
            case(kit::Collective::AllGather, None, Counts::Uniform(N)),
            true,
        ),
        sm_reduce_scatter(comms, "SM ReduceScatter after the AllGather"),
        all_reduce(comms, "AllReduce Sum, odd length", N + 3, ReduceOp::Sum, kit::Op::Sum),
        ce_call(
            comms,
            "AllToAll",
            ApiCall::AllToAll { len: N * WORLD },
            case(kit::Collective::AllToAll, None, Counts::Uniform(N)),
            true,
        ),
        ce_call(
            comms,
            "AllGatherV",
            ApiCall::AllGatherV { counts: u(&agv) },
            case(kit::Collective::AllGatherV, None, Counts::PerRank(agv.clone())),
            true,
        ),
        ce_call(
            comms,
            "AllGatherV, rank 1 contributes nothing",
            ApiCall::AllGatherV { counts: u(&agv_empty) },
            case(kit::Collective::AllGatherV, None, Counts::PerRank(agv_empty.clone())),
            true,
        ),
        ce_call(
            comms,
            "AllToAllV, nothing from rank 1 to rank 0",
            ApiCall::AllToAllV { counts: a2a_v.iter().map(|r| u(r)).collect() },
            case(kit::Collective::AllToAllV, None, Counts::PerPair(a2a_v.clone())),
            true,
        ),
        sm_reduce_scatter(comms, "SM ReduceScatter after the AllToAllV"),
        all_reduce(comms, "AllReduce Max", N / 2 + 1, ReduceOp::Max, kit::Op::Max),
        ce_call(
            comms,
            "AllToAllV, every count zero",
            ApiCall::AllToAllV { counts: zeros.iter().map(|r| u(r)).collect() },
            case(kit::Collective::AllToAllV, None, Counts::PerPair(zeros.clone())),
            true,
        ),
        ce_call(
            comms,
            "Broadcast from root 0",
            ApiCall::Broadcast { len: N, root: 0 },
            case(kit::Collective::Broadcast, None, Counts::Uniform(N)),
            true,
        ),
        // Broadcast from root 1 is the AllGatherV with counts at rank 1 only (`Call::Broadcast`).
        ce_call(
            comms,
            "Broadcast from root 1",
            ApiCall::Broadcast { len: N + 7, root: 1 },
            case(kit::Collective::AllGatherV, None, Counts::PerRank(vec![0, N + 7])),
            true,
        ),
    ]
}

/// Issues `c` on `comm`'s rank with its buffers (eager or capturing).
fn issue(comm: &Comm, c: &mut CeCall) -> Result<Status, Error> {
    let r = comm.rank();
    let (send, recv) = (&c.send[r], &mut c.recv[r]);
    let usize_of = |v: &[u64]| v.iter().map(|&x| x as usize).collect::<Vec<usize>>();
    match &c.call {
        ApiCall::AllGather { .. } => comm.all_gather(send, recv),
        ApiCall::AllToAll { .. } => comm.all_to_all(send, recv),
        ApiCall::AllGatherV { counts } => comm.all_gather_v(send, recv, &usize_of(counts)),
        ApiCall::AllToAllV { counts } => {
            let m: Vec<Vec<usize>> = counts.iter().map(|row| usize_of(row)).collect();
            comm.all_to_all_v(send, recv, &m)
        }
        ApiCall::Broadcast { root, .. } => comm.broadcast((r == *root).then_some(send), recv, *root as i32),
        ApiCall::AllReduce { op, .. } => comm.all_reduce(send, recv, op),
        ApiCall::ReduceScatter { op, .. } => comm.reduce_scatter(send, recv, op),
        other => panic!("{other:?} is not in this test"),
    }
}

/// Whether `c` runs on the copy engines on `comm`'s rank: the plan of its buffers (the very
/// plan the call launches, cached under the same key) has an engine program.
fn on_copy_engines(comm: &Comm, c: &CeCall) -> bool {
    let r = comm.rank();
    let spec = c.call.clone().spec(WORLD, r, DataType::F32).expect("spec");
    // A Broadcast's non-root passes no input (address 0), as `Comm::broadcast` does.
    let input = match c.call {
        ApiCall::Broadcast { root, .. } if root != r => 0,
        _ => c.send[r].device_address(),
    };
    let plan = comm.plan_for_buffers(spec, false, input, c.recv[r].device_address()).expect("plan");
    plan.engine.is_some()
}

fn upload(comm: &Comm, buf: &SymmetricBuffer<f32>, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let mut view = buf.view_as::<u8>(bytes.len()).expect("byte view");
    comm.stream().memcpy_htod(bytes, &mut view).expect("upload");
}

fn download(comm: &Comm, buf: &SymmetricBuffer<f32>) -> Vec<u8> {
    if buf.len() == 0 {
        return vec![];
    }
    let view = buf.view_as::<u8>(buf.len() * 4).expect("byte view");
    comm.stream().clone_dtoh(&view).expect("download")
}

/// Fresh inputs (from `rng`) into every rank's input of `c`, its outputs poisoned; returns
/// the case the inputs came from.
fn fresh(comms: &[Comm], c: &CeCall, rng: &mut Rng) -> kit::Case {
    let case = c.kit.clone().seeded(rng.next());
    let inputs = case.inputs();
    for comm in comms {
        let r = comm.rank();
        upload(comm, &c.send[r], &inputs[r]);
        upload(comm, &c.recv[r], &kit::poisoned(kit::Dtype::F32, case.out_count(r)));
    }
    case
}

/// Every rank's output of `c` against purlin-testkit's reference (its comparison: exact).
fn check(comms: &[Comm], c: &CeCall, case: &kit::Case, what: &str) {
    for comm in comms {
        let r = comm.rank();
        let got = download(comm, &c.recv[r]);
        kit::check(kit::Dtype::F32, case.compare(), &got, &case.expected(r))
            .unwrap_or_else(|e| panic!("{what}: {} rank {r}: {e}", c.name));
        comm.async_error().unwrap_or_else(|e| panic!("{what}: {} rank {r}: device error {e}", c.name));
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn copy_engine_collectives_are_exact_eager_between_sm_calls_and_captured() {
    let comms = Comm::from_devices_with_config(streams(), ce_config()).expect("set-up");
    let mut calls = sequence(&comms);
    let mut rng = Rng::new(fresh_seed());

    // Eager, the whole sequence twice: every call exact, every rank on the datapath it must take.
    for round in 0..2 {
        for c in calls.iter_mut() {
            let case = fresh(&comms, c, &mut rng);
            for comm in &comms {
                issue(comm, c).unwrap_or_else(|e| panic!("eager round {round}: {} rank {}: {e}", c.name, comm.rank()));
            }
            check(&comms, c, &case, &format!("eager round {round}"));
            for comm in &comms {
                assert_eq!(
                    on_copy_engines(comm, c),
                    c.ce,
                    "{} rank {}: on the copy engines (no 64-bit stream memory operations?)",
                    c.name,
                    comm.rank()
                );
            }
        }
    }
    // A fused kernel runs SM blocks only: it refuses a call whose plan is on the copy engines.
    let ag = &mut calls[0];
    for comm in &comms {
        let r = comm.rank();
        let refused = comm.prepare(ApiCall::AllGather { len: N }, &ag.send[r], &mut ag.recv[r]);
        assert!(matches!(&refused, Err(Error::Unsupported(why)) if why.contains("copy engines")), "rank {r}");
    }

    // The whole sequence captured once per rank, replayed three times with fresh inputs.
    let graphs: Vec<CudaGraph> = comms
        .iter()
        .map(|comm| {
            let s = comm.stream();
            s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("begin capture");
            let issued: Vec<_> = calls.iter_mut().map(|c| issue(comm, c).map_err(|e| (c.name, e))).collect();
            // Always end the capture, so a failed call leaves the stream usable.
            let graph = s.end_capture(CUgraphInstantiate_flags(0));
            for r in issued {
                if let Err((name, e)) = r {
                    panic!("rank {}: capturing {name}: {e}", comm.rank());
                }
            }
            graph.expect("end capture").expect("a graph")
        })
        .collect();
    for replay in 0..3 {
        let cases: Vec<kit::Case> = calls.iter().map(|c| fresh(&comms, c, &mut rng)).collect();
        for g in &graphs {
            g.launch().expect("graph replay");
        }
        for (c, case) in calls.iter().zip(&cases) {
            check(&comms, c, case, &format!("replay {replay}"));
        }
    }
    let ce: Vec<&str> = calls.iter().filter(|c| c.ce).map(|c| c.name).collect();
    println!(
        "CE-PLANS: on the copy engines, exact eager (twice, between SM ReduceScatters) and in 3 graph replays: {}",
        ce.join("; ")
    );
}
