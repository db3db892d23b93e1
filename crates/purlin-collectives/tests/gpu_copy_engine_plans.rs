//! Copy-engine plans on the GPU (docs/perf/copy-engines.md §3.5): with the datapath set to
//! the copy engines, an AllGather and an AllToAll on symmetric buffers run as entry kernel,
//! engine copies and notifies, exit kernel, and are exact against purlin-testkit: eager,
//! between SM calls (an AllReduce) on the same flags, and captured into a CUDA graph and
//! replayed. World 2 (one process, one thread); two ranks on one GPU with
//! `PURLIN_SHARED_GPU=1`.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, DeviceSlice};
use purlin_collectives::internal::tuning::Datapath;
use purlin_collectives::{Call as ApiCall, Comm, CommConfig, Error, ReduceOp, SymmetricBuffer};

mod gpu_calls;
use gpu_calls::{Call, Coll, Dt, WORLD, base_config, call, fresh_seed, streams};

const N: usize = 1 << 16;

fn ce_config() -> CommConfig {
    let mut c = base_config();
    c.tuning.datapath = Datapath::CopyEngine;
    c
}

fn upload(comm: &Comm, buf: &SymmetricBuffer<f32>, bytes: &[u8]) {
    let mut view = buf.view_as::<u8>(bytes.len()).expect("byte view");
    comm.stream().memcpy_htod(bytes, &mut view).expect("upload");
}

fn download(comm: &Comm, buf: &SymmetricBuffer<f32>) -> Vec<u8> {
    let view = buf.view_as::<u8>(buf.len() * 4).expect("byte view");
    comm.stream().clone_dtoh(&view).expect("download")
}

/// Whether `comm` plans an AllGather of these buffers for the copy engines: a fused kernel
/// refuses exactly those plans.
fn runs_on_copy_engines(comm: &Comm, send: &SymmetricBuffer<f32>, recv: &mut SymmetricBuffer<f32>) -> bool {
    match comm.prepare(ApiCall::AllGather { len: send.len() }, send, recv) {
        Err(Error::Unsupported(why)) => why.contains("copy engines"),
        _ => false,
    }
}

/// Runs `c` (`AllGather` or `AllToAll`) eagerly on every rank and checks every output.
fn eager(comms: &[Comm], c: &Call, ins: &[SymmetricBuffer<f32>], outs: &mut [SymmetricBuffer<f32>], what: &str) {
    let mut rng = gpu_calls::Rng::new(fresh_seed());
    let x = c.inputs(&mut rng);
    for (comm, (i, o)) in comms.iter().zip(ins.iter().zip(outs.iter())) {
        upload(comm, i, &c.encode(&x[comm.rank()]));
        upload(comm, o, &c.poisoned(o.len()));
    }
    for (comm, (i, o)) in comms.iter().zip(ins.iter().zip(outs.iter_mut())) {
        let r = match c.coll {
            Coll::AllGather => comm.all_gather(i, o),
            Coll::AllToAll => comm.all_to_all(i, o),
            other => panic!("{other:?} is not a gather"),
        };
        r.unwrap_or_else(|e| panic!("{what}: rank {}: {e}", comm.rank()));
    }
    for (comm, o) in comms.iter().zip(outs.iter()) {
        c.check_bytes(&x, comm.rank(), &download(comm, o)).unwrap_or_else(|e| panic!("{what}: {e}"));
        comm.async_error().expect("no device error");
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn copy_engine_gathers_are_exact_eager_between_sm_calls_and_captured() {
    let comms = Comm::from_devices_with_config(streams(), ce_config()).expect("set-up");
    let world = comms.len();
    let ins = Comm::alloc_symmetric_group::<f32>(&comms, N).expect("symmetric inputs");
    let mut outs = Comm::alloc_symmetric_group::<f32>(&comms, world * N).expect("symmetric outputs");
    let ce: Vec<bool> =
        comms.iter().zip(ins.iter().zip(outs.iter_mut())).map(|(c, (i, o))| runs_on_copy_engines(c, i, o)).collect();
    assert!(ce.iter().all(|&x| x), "copy-engine plans per rank: {ce:?} (no 64-bit stream memory operations?)");

    let gather = call(Coll::AllGather, Dt::F32, ReduceOp::Sum, N);
    let alltoall = call(Coll::AllToAll, Dt::F32, ReduceOp::Sum, N / world);
    let mut a2a_in = Comm::alloc_symmetric_group::<f32>(&comms, N).expect("symmetric inputs");
    let mut a2a_out = Comm::alloc_symmetric_group::<f32>(&comms, N).expect("symmetric outputs");
    // Eager, three times, then an SM AllReduce on the same flag words, then again.
    for k in 0..3 {
        eager(&comms, &gather, &ins, &mut outs, &format!("eager AllGather {k}"));
    }
    let ar = call(Coll::AllReduce, Dt::F32, ReduceOp::Sum, N);
    let mut rng = gpu_calls::Rng::new(fresh_seed());
    let x = ar.inputs(&mut rng);
    for (c, i) in comms.iter().zip(a2a_in.iter_mut()) {
        upload(c, i, &ar.encode(&x[c.rank()]));
    }
    for (c, (i, o)) in comms.iter().zip(a2a_in.iter().zip(a2a_out.iter_mut())) {
        c.all_reduce(i, o, &ReduceOp::Sum).unwrap_or_else(|e| panic!("rank {}: all_reduce: {e}", c.rank()));
    }
    for (c, o) in comms.iter().zip(&a2a_out) {
        ar.check_bytes(&x, c.rank(), &download(c, o)).unwrap_or_else(|e| panic!("SM AllReduce: {e}"));
    }
    eager(&comms, &alltoall, &a2a_in, &mut a2a_out, "eager AllToAll after the AllReduce");
    eager(&comms, &gather, &ins, &mut outs, "eager AllGather after the AllToAll");

    // Captured once per rank, replayed three times with fresh inputs.
    let graphs: Vec<CudaGraph> = comms
        .iter()
        .zip(ins.iter().zip(outs.iter_mut()))
        .map(|(c, (i, o))| {
            let s = c.stream();
            s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("begin capture");
            let issued = c.all_gather(i, o);
            let graph = s.end_capture(CUgraphInstantiate_flags(0));
            issued.unwrap_or_else(|e| panic!("rank {}: capturing: {e}", c.rank()));
            graph.expect("end capture").expect("a graph")
        })
        .collect();
    for replay in 0..3 {
        let x = gather.inputs(&mut rng);
        for (c, (i, o)) in comms.iter().zip(ins.iter().zip(outs.iter())) {
            upload(c, i, &gather.encode(&x[c.rank()]));
            upload(c, o, &gather.poisoned(o.len()));
        }
        for g in &graphs {
            g.launch().expect("graph replay");
        }
        for (c, o) in comms.iter().zip(outs.iter()) {
            let what = format!("replay {replay}, rank {} of {WORLD}", c.rank());
            gather.check_bytes(&x, c.rank(), &download(c, o)).unwrap_or_else(|e| panic!("{what}: {e}"));
            c.async_error().expect("no device error");
        }
    }
    println!(
        "CE-PLANS: AllGather and AllToAll on the copy engines exact eager (between SM calls) and in 3 graph replays"
    );
}
