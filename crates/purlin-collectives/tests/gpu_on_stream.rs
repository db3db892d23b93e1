//! Per-call streams on the GPU (`Comm::on_stream` over `RawBuffer`s): a sequence of calls that
//! moves between streams on every call stays ordered on each communicator and exact, checked
//! against purlin-testkit's reference. Two ranks (`PURLIN_SHARED_GPU=1`: both on GPU 0).

mod gpu_calls;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use gpu_calls::{base_config, fresh_seed, streams};
use purlin_collectives::{Comm, RawBuffer, ReduceOp};
use purlin_testkit::{Case, Collective, Dtype, Op};

/// Calls in the sequence; call `k` of a rank runs on its stream `k % 3` (two extra streams and
/// the communicator's own).
const CALLS: usize = 6;
/// Elements per call: the throughput regime, so an unordered pair of calls would overlap.
const ELEMS: usize = 1 << 20;

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_calls_that_change_streams_stay_ordered_and_exact() {
    let comms = Comm::from_devices_with_config(streams(), base_config()).expect("from_devices");
    let seed = fresh_seed();
    let cases: Vec<Case> = (0..CALLS)
        .map(|k| {
            Case::new(Collective::AllReduce, Dtype::F32, Op::Sum, comms.len(), ELEMS * 4, 0.0, seed + k as u64)
                .expect("case")
        })
        .collect();
    // Every rank's inputs and outputs, uploaded on the communicator's stream and synchronised
    // before any call (raw buffers carry no events).
    let bufs: Vec<Vec<(CudaSlice<u8>, CudaSlice<u8>)>> = comms
        .iter()
        .map(|c| {
            let s = c.stream();
            let b = cases
                .iter()
                .map(|case| (s.clone_htod(&case.input(c.rank())).unwrap(), s.alloc_zeros::<u8>(ELEMS * 4).unwrap()))
                .collect();
            s.synchronize().unwrap();
            b
        })
        .collect();
    let extra: Vec<[Arc<CudaStream>; 2]> =
        comms.iter().map(|c| [c.context().new_stream().unwrap(), c.context().new_stream().unwrap()]).collect();
    for (k, _case) in cases.iter().enumerate() {
        for (r, c) in comms.iter().enumerate() {
            let stream = match k % 3 {
                2 => c.stream(),
                i => extra[r][i].clone(),
            };
            let (send, recv) = &bufs[r][k];
            let s = c.stream();
            // SAFETY: both are live allocations of ELEMS f32 on this GPU, kept until the end of
            // the test, after every stream is synchronised; nothing else touches them meanwhile.
            let (send, mut recv) = unsafe {
                (
                    RawBuffer::<f32>::from_raw(send.device_ptr(&s).0, ELEMS, stream.clone()),
                    RawBuffer::<f32>::from_raw(recv.device_ptr(&s).0, ELEMS, stream.clone()),
                )
            };
            c.on_stream(&stream)
                .expect("on_stream")
                .all_reduce(&send, &mut recv, &ReduceOp::Sum)
                .expect("all_reduce on a stream");
        }
    }
    for (r, c) in comms.iter().enumerate() {
        for s in extra[r].iter().chain(std::iter::once(&c.stream())) {
            s.synchronize().expect("synchronize");
        }
        c.async_error().unwrap_or_else(|e| panic!("rank {r}: {e}"));
        for (k, case) in cases.iter().enumerate() {
            let got = c.stream().clone_dtoh(&bufs[r][k].1).unwrap();
            let wrong = case.count_wrong(&got, &case.expected(r));
            assert_eq!(wrong.count, 0, "rank {r}, call {k} (stream {}): {wrong:?}", k % 3);
        }
    }
}
