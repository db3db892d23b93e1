//! A buffer that starts inside a symmetric buffer (a raw pointer at an offset) is refused on
//! every rank with `InvalidArgument` before anything runs, its memory untouched, and the
//! communicator stays usable: the same call from the buffers' starts is then exact against
//! purlin-testkit. World 2 (one process, one thread).

use purlin_collectives::{Comm, Error, SymmetricBuffer};

mod gpu_calls;
use gpu_calls::{Coll, Dt, base_config, call, fresh_seed, raw, streams};
use purlin_collectives::ReduceOp;

const N: usize = 1 << 16;

fn upload(comm: &Comm, buf: &SymmetricBuffer<f32>, bytes: &[u8]) {
    let mut view = buf.view_as::<u8>(bytes.len()).expect("byte view");
    comm.stream().memcpy_htod(bytes, &mut view).expect("upload");
}

fn download(comm: &Comm, buf: &SymmetricBuffer<f32>, elems: usize) -> Vec<u8> {
    let view = buf.view_as::<u8>(elems * 4).expect("byte view");
    comm.stream().clone_dtoh(&view).expect("download")
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn a_buffer_inside_a_symmetric_buffer_is_refused_and_nothing_runs() {
    let comms = Comm::from_devices_with_config(streams(), base_config()).expect("set-up");
    let world = comms.len();
    // One element more than the call needs, so a view one element in still fits.
    let ins = Comm::alloc_symmetric_group::<f32>(&comms, N + 1).expect("symmetric inputs");
    let outs = Comm::alloc_symmetric_group::<f32>(&comms, world * N + 1).expect("symmetric outputs");
    let gather = call(Coll::AllGather, Dt::F32, ReduceOp::Sum, N);
    let mut rng = gpu_calls::Rng::new(fresh_seed());
    let x = gather.inputs(&mut rng);
    let poison = gather.poisoned(world * N + 1);
    for (c, (i, o)) in comms.iter().zip(ins.iter().zip(&outs)) {
        upload(c, i, &gather.encode(&x[c.rank()]));
        upload(c, o, &poison);
    }

    // Input and output each one element in: refused on every rank, before any launch.
    for (c, (i, o)) in comms.iter().zip(ins.iter().zip(&outs)) {
        let s = c.stream();
        let send = raw::<f32>(i.device_address() + 4, N, s.clone());
        let mut recv = raw::<f32>(o.device_address() + 4, world * N, s.clone());
        match c.all_gather(&send, &mut recv) {
            Err(Error::InvalidArgument(why)) => {
                assert!(why.contains("4 bytes into a symmetric buffer"), "rank {}: {why}", c.rank())
            }
            other => panic!("rank {}: a sub-slice of a symmetric buffer gave {other:?}", c.rank()),
        }
    }
    for (c, o) in comms.iter().zip(&outs) {
        assert_eq!(download(c, o, world * N + 1), poison, "rank {}: the output was written", c.rank());
        c.async_error().expect("no device error");
    }

    // The same call from the buffers' starts runs one-copy and is exact.
    let mut outs = outs;
    for (c, o) in comms.iter().zip(outs.iter_mut()) {
        o.set_len(world * N).expect("set_len");
        let i = ins[c.rank()].view_as::<f32>(N).expect("input view");
        c.all_gather(&i, o).unwrap_or_else(|e| panic!("rank {}: all_gather: {e}", c.rank()));
    }
    for (c, o) in comms.iter().zip(&outs) {
        gather.check_bytes(&x, c.rank(), &download(c, o, world * N)).unwrap_or_else(|e| panic!("{e}"));
    }
    println!("SYMMETRIC SLICES: an offset view refused on {world} ranks, nothing written; from the start exact");
}
