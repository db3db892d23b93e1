//! Ranks that mix in-place and out-of-place forms of one collective, under a block cap, on the
//! GPU (issue 49: the block split once depended on the rank's form, so ranks derived different
//! plan sets and got silent wrong data); and an empty call on one rank against a non-empty one
//! on the other, which every rank must see as `Error::Mismatch`. Checked against
//! purlin-testkit's reference. Two ranks (`PURLIN_SHARED_GPU=1`: both on GPU 0).

mod gpu_calls;

use cudarc::driver::CudaSlice;
use gpu_calls::{base_config, fresh_seed, streams};
use purlin_collectives::{Comm, CommConfig, Error, ReduceOp};
use purlin_testkit::{Case, Collective, Dtype, Op, poisoned, reference};

/// A block cap as `PURLIN_BLOCKS_PER_ROLE=8 PURLIN_MAX_BLOCKS=12` sets it.
fn capped() -> CommConfig {
    let mut config = base_config();
    config.tuning.blocks_per_role = 8;
    config.tuning.max_blocks = Some(12);
    config
}

/// One rank's buffers for `case`, in place (one buffer, NCCL's layout) or not.
fn buffers(c: &Comm, case: &Case, in_place: bool) -> (CudaSlice<f32>, CudaSlice<f32>) {
    let s = c.stream();
    let input: Vec<f32> =
        case.input(c.rank()).chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let fill: Vec<f32> = poisoned(Dtype::F32, case.out_count(c.rank()))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    if in_place {
        let layout = case.clone().in_place(true).in_place_layout(c.rank()).expect("an in-place form");
        let mut buf = fill;
        buf[layout.input_at..layout.input_at + input.len()].copy_from_slice(&input);
        (s.alloc_zeros(1).unwrap(), s.clone_htod(&buf).unwrap())
    } else {
        (s.clone_htod(&input).unwrap(), s.clone_htod(&fill).unwrap())
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_mixed_in_place_forms_under_a_block_cap_match_the_reference() {
    let comms = Comm::from_devices_with_config(streams(), capped()).expect("from_devices");
    let world = comms.len();
    for collective in [Collective::AllGather, Collective::Broadcast, Collective::AllReduce] {
        for first_in_place in [true, false] {
            let per_rank = 100_000;
            let bytes = if collective == Collective::AllGather { per_rank * world * 4 } else { per_rank * 4 };
            let case = Case::new(collective, Dtype::F32, Op::Sum, world, bytes, 0.0, fresh_seed()).expect("case");
            let forms: Vec<bool> = (0..world).map(|r| (r == 0) == first_in_place).collect();
            let mut bufs: Vec<_> = comms.iter().map(|c| buffers(c, &case, forms[c.rank()])).collect();
            for (c, (send, recv)) in comms.iter().zip(bufs.iter_mut()) {
                let r = c.rank();
                match (collective, forms[r]) {
                    (Collective::AllGather, true) => c.all_gather_in_place(recv),
                    (Collective::AllGather, false) => c.all_gather(send, recv),
                    (Collective::Broadcast, true) => c.broadcast_in_place(recv, 0),
                    (Collective::Broadcast, false) => c.broadcast(Some(&*send), recv, 0),
                    (Collective::AllReduce, true) => c.all_reduce_in_place(recv, &ReduceOp::Sum),
                    (Collective::AllReduce, false) => c.all_reduce(send, recv, &ReduceOp::Sum),
                    _ => unreachable!(),
                }
                .unwrap_or_else(|e| panic!("{} rank {r}: {e}", case.name()));
            }
            let inputs = case.inputs();
            for (c, (_, recv)) in comms.iter().zip(&bufs) {
                let r = c.rank();
                let got: Vec<u8> = c.stream().clone_dtoh(recv).unwrap().iter().flat_map(|v| v.to_le_bytes()).collect();
                c.async_error().unwrap_or_else(|e| panic!("{} rank {r}: {e}", case.name()));
                let want = if forms[r] {
                    reference::expected_in_place(&case.clone().in_place(true), &inputs, r)
                } else {
                    reference::expected(&case, &inputs, r)
                };
                let wrong = case.count_wrong(&got, &want);
                assert_eq!(wrong.count, 0, "{} rank {r} (in place: {}): {wrong:?}", case.name(), forms[r]);
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn gpu_an_empty_call_against_a_real_one_is_a_mismatch_on_every_rank() {
    let comms = Comm::from_devices_with_config(streams(), base_config()).expect("from_devices");
    let mut bufs: Vec<_> = comms
        .iter()
        .map(|c| (c.stream().alloc_zeros::<f32>(10).unwrap(), c.stream().alloc_zeros::<f32>(10).unwrap()))
        .collect();
    // Rank 0 reduces nothing, rank 1 ten elements: both launches are enqueued before any wait.
    for (c, (send, recv)) in comms.iter().zip(bufs.iter_mut()) {
        let n = if c.rank() == 0 { 0 } else { 10 };
        c.all_reduce(&send.slice(..n), &mut recv.slice_mut(..n), &ReduceOp::Sum)
            .unwrap_or_else(|e| panic!("rank {}'s launch: {e}", c.rank()));
    }
    for c in &comms {
        c.stream().synchronize().expect("the call check ends the kernels");
    }
    for (r, c) in comms.iter().enumerate() {
        match c.async_error() {
            Err(Error::Mismatch { rank, peer, .. }) => assert_eq!((rank, peer), (r, 1 - r)),
            other => panic!("rank {r}: expected a mismatch, got {other:?}"),
        }
    }
}
