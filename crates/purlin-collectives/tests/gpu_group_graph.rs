//! A group over symmetric buffers captured into a CUDA graph and replayed, checked against
//! purlin-testkit: `Group` takes any cudarc `DevicePtr` / `DevicePtrMut`, and symmetric
//! buffers record no cudarc event, so the capture works while the context keeps cudarc's
//! event tracking on (no raw-pointer wrapper needed). World 2 (one process, one thread).

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, DeviceSlice};
use purlin_collectives::{Comm, ReduceOp, SymmetricBuffer};

mod gpu_calls;
use gpu_calls::{Call, Coll, Dt, WORLD, base_config, call, fresh_seed, streams};

/// Elements per call: large enough for the throughput regime, whose AllReduce on symmetric
/// buffers takes the one-copy path.
const N: usize = 1 << 18;

/// Every rank's buffers: the AllReduce's input and output, the exchange's send and receive.
struct Buffers {
    ar_in: SymmetricBuffer<f32>,
    ar_out: SymmetricBuffer<f32>,
    send: SymmetricBuffer<f32>,
    recv: SymmetricBuffer<f32>,
}

/// Writes `values` (the kit's, encoded for the call) into `buf` through a byte view.
fn upload(comm: &Comm, c: &Call, buf: &SymmetricBuffer<f32>, bytes: &[u8]) {
    assert_eq!(bytes.len(), buf.len() * c.dt.size(), "{}: input length", c.name());
    let mut view = buf.view_as::<u8>(bytes.len()).expect("byte view");
    comm.stream().memcpy_htod(bytes, &mut view).expect("upload");
}

/// `buf`'s bytes (waits for the stream).
fn download(comm: &Comm, buf: &SymmetricBuffer<f32>) -> Vec<u8> {
    let view = buf.view_as::<u8>(buf.len() * 4).expect("byte view");
    comm.stream().clone_dtoh(&view).expect("download")
}

/// Captures rank `comm.rank()`'s group: an AllReduce on symmetric buffers (run as called)
/// and a send/recv pair with the other rank (run at the group's end).
fn capture(comm: &Comm, b: &mut Buffers) -> CudaGraph {
    let s = comm.stream();
    let peer = (1 - comm.rank()) as i32;
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("begin capture");
    let issued = (|| {
        let mut group = comm.group();
        group.all_reduce(&b.ar_in, &mut b.ar_out, &ReduceOp::Sum)?;
        group.send(&b.send, peer)?;
        group.recv(&mut b.recv, peer)?;
        group.end()
    })();
    // Always end the capture, so a failed call leaves the stream usable and reports itself.
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    issued.unwrap_or_else(|e| panic!("rank {}: capturing the group: {e}", comm.rank()));
    graph.unwrap_or_else(|e| panic!("rank {}: end capture: {e}", comm.rank())).expect("the capture made a graph")
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn a_group_on_symmetric_buffers_is_captured_and_replays_exactly() {
    let comms = Comm::from_devices_with_config(streams(), base_config()).expect("set-up");
    let alloc = || Comm::alloc_symmetric_group::<f32>(&comms, N).expect("symmetric buffers");
    let (ar_in, ar_out, send, recv) = (alloc(), alloc(), alloc(), alloc());
    let mut bufs: Vec<Buffers> = ar_in
        .into_iter()
        .zip(ar_out)
        .zip(send.into_iter().zip(recv))
        .map(|((ar_in, ar_out), (send, recv))| Buffers { ar_in, ar_out, send, recv })
        .collect();
    let graphs: Vec<CudaGraph> = comms.iter().zip(&mut bufs).map(|(c, b)| capture(c, b)).collect();

    let all_reduce = call(Coll::AllReduce, Dt::F32, ReduceOp::Sum, N);
    let exchange = call(Coll::SendRecv, Dt::F32, ReduceOp::Sum, N);
    let mut rng = gpu_calls::Rng::new(fresh_seed());
    for replay in 0..3 {
        let (ar_x, ex_x) = (all_reduce.inputs(&mut rng), exchange.inputs(&mut rng));
        let poison = all_reduce.poisoned(N);
        for (c, b) in comms.iter().zip(&bufs) {
            let r = c.rank();
            upload(c, &all_reduce, &b.ar_in, &all_reduce.encode(&ar_x[r]));
            upload(c, &all_reduce, &b.ar_out, &poison);
            upload(c, &exchange, &b.send, &exchange.encode(&ex_x[r]));
            upload(c, &exchange, &b.recv, &poison);
        }
        for g in &graphs {
            g.launch().expect("graph replay");
        }
        for (c, b) in comms.iter().zip(&bufs) {
            let r = c.rank();
            let what = format!("replay {replay}, rank {r} of {WORLD}");
            all_reduce.check_bytes(&ar_x, r, &download(c, &b.ar_out)).unwrap_or_else(|e| panic!("{what}: {e}"));
            exchange.check_bytes(&ex_x, r, &download(c, &b.recv)).unwrap_or_else(|e| panic!("{what}: {e}"));
            c.async_error().expect("no device error");
        }
    }
    println!("GROUP GRAPH: AllReduce + send/recv on symmetric buffers, captured once, 3 replays exact");
}
