// A program written against `cudarc::nccl` (set-up + AllReduce). `tests/gpu_nccl_drop_in.rs`
// compiles it twice: after `use cudarc::nccl::{...}` and after
// `use purlin_collectives::nccl::{...}` — the only line that differs.
//
// Errors are turned into anyhow errors with `{:?}`, as cudarc programs must do, since
// `NcclError` is not a `std::error::Error`.

/// Per rank of a world: a send buffer of `n` elements holding `rank + 1` and a zeroed receive
/// buffer.
type RankBuffers = Vec<(cudarc::driver::CudaSlice<f32>, cudarc::driver::CudaSlice<f32>)>;

/// One process, the first `devices` GPUs: `from_devices`, and each rank's buffers.
fn comms_and_buffers(devices: usize, n: usize) -> anyhow::Result<(Vec<Comm>, RankBuffers)> {
    let streams = (0..devices)
        .map(|i| cudarc::driver::CudaContext::new(i).map(|ctx| ctx.default_stream()))
        .collect::<Result<Vec<_>, _>>()?;
    let comms = Comm::from_devices(streams).map_err(|e| anyhow::anyhow!("from_devices: {e:?}"))?;
    let mut buffers = Vec::new();
    for comm in &comms {
        let stream = comm.stream();
        let send = stream.clone_htod(&vec![(comm.rank() + 1) as f32; n])?;
        buffers.push((send, stream.alloc_zeros::<f32>(n)?));
    }
    Ok((comms, buffers))
}

/// Every rank's receive buffer, read back (waits for each stream).
fn received(comms: &[Comm], buffers: &RankBuffers) -> anyhow::Result<Vec<Vec<f32>>> {
    let mut out = Vec::new();
    for (comm, (_, recv)) in comms.iter().zip(buffers) {
        out.push(comm.stream().clone_dtoh(recv)?);
    }
    Ok(out)
}

/// One process, every GPU: `from_devices`, then an AllReduce per rank inside a group.
pub fn all_reduce_from_devices(n: usize) -> anyhow::Result<Vec<Vec<f32>>> {
    let n_devices = cudarc::driver::CudaContext::device_count()? as usize;
    let (comms, mut buffers) = comms_and_buffers(n_devices, n)?;
    group_start().map_err(|e| anyhow::anyhow!("group_start: {e:?}"))?;
    for (comm, (send, recv)) in comms.iter().zip(buffers.iter_mut()) {
        comm.all_reduce(send, recv, &ReduceOp::Sum).map_err(|e| anyhow::anyhow!("all_reduce: {e:?}"))?;
    }
    group_end().map_err(|e| anyhow::anyhow!("group_end: {e:?}"))?;
    received(&comms, &buffers)
}

/// One rank per thread: rank 0 makes the Id, the others rebuild it from its bytes.
pub fn all_reduce_from_rank(world: usize, n: usize) -> anyhow::Result<Vec<Vec<f32>>> {
    let id = Id::new().map_err(|e| anyhow::anyhow!("Id::new: {e:?}"))?;
    let bytes = *id.internal(); // what would travel through a file
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                s.spawn(move || -> anyhow::Result<Vec<f32>> {
                    let id = Id::uninit(bytes);
                    let stream = cudarc::driver::CudaContext::new(rank)?.default_stream();
                    let comm = Comm::from_rank(stream.clone(), rank, world, id)
                        .map_err(|e| anyhow::anyhow!("from_rank: {e:?}"))?;
                    assert_eq!((comm.rank(), comm.world_size()), (rank, world));
                    let mut buf = stream.clone_htod(&vec![(rank + 1) as f32; n])?;
                    comm.all_reduce_in_place(&mut buf, &ReduceOp::Sum)
                        .map_err(|e| anyhow::anyhow!("all_reduce_in_place: {e:?}"))?;
                    Ok(stream.clone_dtoh(&buf)?)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("rank panicked"))?).collect()
    })
}

/// The group API with views made before the group, as cudarc requires.
pub fn all_reduce_grouped(
    comm: &Comm,
    send: &cudarc::driver::CudaSlice<f32>,
    recv: &mut cudarc::driver::CudaSlice<f32>,
) -> anyhow::Result<()> {
    let send_view = send.as_view();
    let recv_view = recv.as_view_mut();
    let mut group = comm.group();
    group.all_reduce(send_view, recv_view, &ReduceOp::Sum).map_err(|e| anyhow::anyhow!("grouped all_reduce: {e:?}"))?;
    drop(group);
    Ok(())
}

/// One process, the first two GPUs: each rank sends its buffer to the other and receives the
/// other's, with the group API (one group per rank, all open while the calls are made, as
/// one thread driving both ranks needs with NCCL).
pub fn exchange_grouped(n: usize) -> anyhow::Result<Vec<Vec<f32>>> {
    let (comms, mut buffers) = comms_and_buffers(2, n)?;
    {
        let mut groups: Vec<_> = comms.iter().map(|c| c.group()).collect();
        for ((group, comm), (send, recv)) in groups.iter_mut().zip(&comms).zip(buffers.iter_mut()) {
            let peer = (1 - comm.rank()) as i32;
            group.send(send.as_view(), peer).map_err(|e| anyhow::anyhow!("grouped send: {e:?}"))?;
            group.recv(recv.as_view_mut(), peer).map_err(|e| anyhow::anyhow!("grouped recv: {e:?}"))?;
        }
    }
    received(&comms, &buffers)
}
