//! `HierComm` on GPUs, "nodes" simulated on one host: one thread per rank, one GPU each
//! (NCCL refuses two ranks on one GPU, so `PURLIN_SHARED_GPU` cannot stand in: these need two
//! GPUs or more). Shapes by the GPUs there are: 2×1 (the rail alone), 1×2 (the node alone),
//! 2×2 on four, 4×2 and 2×4 on eight. Every collective, in place and not, is checked against
//! purlin-testkit's reference for the flat world, and AllReduce, ReduceScatter, AllGather,
//! Broadcast and Reduce also against NCCL's flat calls on the same inputs.
//!
//! Run with NCCL_NVLS_ENABLE=0 (never NVLink multicast); the inter-node link is NVLink here,
//! so these check correctness and layouts, not network speed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use purlin_collectives::{CommConfig, Error, HierComm, Id, ReduceOp, ReduceType};
use purlin_testkit::{self as kit, Collective, Compare, Counts, Dtype, Op, reference};

trait Elem:
    ReduceType + cudarc::nccl::NcclType + DeviceRepr + ValidAsZeroBits + Copy + Send + Sync + Unpin + 'static
{
    const KIT: Dtype;
    fn from_bytes(b: &[u8]) -> Vec<Self>;
    fn to_bytes(x: &[Self]) -> Vec<u8>;
}

macro_rules! elem {
    ($t:ty, $kit:ident, $n:literal, $from:expr, $to:expr) => {
        impl Elem for $t {
            const KIT: Dtype = Dtype::$kit;
            fn from_bytes(b: &[u8]) -> Vec<Self> {
                b.chunks_exact($n).map(|c| $from(c.try_into().expect("element bytes"))).collect()
            }
            fn to_bytes(x: &[Self]) -> Vec<u8> {
                x.iter().flat_map(|v| $to(*v)).collect()
            }
        }
    };
}
elem!(f32, F32, 4, f32::from_le_bytes, f32::to_le_bytes);
elem!(i32, I32, 4, i32::from_le_bytes, i32::to_le_bytes);
elem!(half::bf16, Bf16, 2, |b| half::bf16::from_bits(u16::from_le_bytes(b)), |v: half::bf16| v.to_bits().to_le_bytes());

fn reduce_op(op: Op) -> ReduceOp {
    match op {
        Op::Sum => ReduceOp::Sum,
        Op::Prod => ReduceOp::Prod,
        Op::Min => ReduceOp::Min,
        Op::Max => ReduceOp::Max,
        Op::Avg => ReduceOp::Avg,
    }
}

fn nccl_op(op: Op) -> cudarc::nccl::ReduceOp {
    match op {
        Op::Sum => cudarc::nccl::ReduceOp::Sum,
        Op::Prod => cudarc::nccl::ReduceOp::Prod,
        Op::Min => cudarc::nccl::ReduceOp::Min,
        Op::Max => cudarc::nccl::ReduceOp::Max,
        Op::Avg => cudarc::nccl::ReduceOp::Avg,
    }
}

/// The shapes this machine's GPUs hold, each needing `nodes × local` GPUs.
fn shapes() -> Vec<(usize, usize)> {
    assert!(purlin_topo::driver_present(), "needs a CUDA driver");
    let n = purlin_topo::device_count();
    assert!(n >= 2, "needs two GPUs or more (NCCL refuses two ranks on one GPU), found {n}");
    [(2, 1), (1, 2), (2, 2), (4, 2), (2, 4)].into_iter().filter(|(a, b)| a * b <= n).collect()
}

fn stream(ordinal: usize) -> Arc<CudaStream> {
    CudaContext::new(ordinal).expect("CUDA context").new_stream().expect("stream")
}

/// The cases of one world and element type.
fn cases(world: usize, dtype: Dtype) -> Vec<kit::Case> {
    let uneven: Vec<usize> = (0..world).map(|g| (g * 7 + 3) % 5).collect();
    let matrix: Vec<Vec<usize>> = (0..world).map(|p| (0..world).map(|q| (p * 3 + q * 5) % 4).collect()).collect();
    let mut out = vec![];
    for collective in Collective::EVERY {
        if collective == Collective::SendRecv {
            continue;
        }
        let ops: Vec<Option<Op>> =
            if collective.reduces() { [Op::Sum, Op::Max, Op::Avg].map(Some).to_vec() } else { vec![None] };
        let counts = match collective {
            Collective::AllReduce => vec![Counts::Uniform(world * 1024), Counts::Uniform(world * 3 + 1)],
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                vec![Counts::Uniform(3), Counts::Uniform(4096)]
            }
            Collective::AllGatherV | Collective::ReduceScatterV => vec![Counts::PerRank(uneven.clone())],
            Collective::AllToAllV => vec![Counts::PerPair(matrix.clone())],
            _ => vec![Counts::Uniform(1000)],
        };
        let places: &[bool] = match collective {
            Collective::AllReduce
            | Collective::AllGather
            | Collective::ReduceScatter
            | Collective::Broadcast
            | Collective::Reduce => &[false, true],
            _ => &[false],
        };
        for op in &ops {
            for n in &counts {
                for &in_place in places {
                    out.push(kit::Case::with_counts(collective, dtype, *op, world, n.clone()).in_place(in_place));
                }
            }
        }
    }
    out
}

/// `x` on the device, one element more where it is empty (no zero-byte allocation).
fn upload<T: Elem>(s: &Arc<CudaStream>, x: &[T], fill: &[u8]) -> CudaSlice<T> {
    if x.is_empty() {
        s.clone_htod(&T::from_bytes(fill)[..1]).expect("upload")
    } else {
        s.clone_htod(x).expect("upload")
    }
}

/// Rank `g`'s call of `case` through `HierComm`; its output (in place: its buffer).
fn hier_call<T: Elem>(c: &HierComm, case: &kit::Case, input: &[u8], g: usize) -> Result<Vec<u8>, Error> {
    let s = c.stream();
    let fill = kit::poisoned(case.dtype, 1);
    let (n_in, out_len) = (case.in_count(g), case.out_count(g));
    let x_buf = upload(&s, &T::from_bytes(input), &fill);
    let x = x_buf.slice(..n_in);
    let mut y_buf = upload(&s, &T::from_bytes(&kit::poisoned(case.dtype, out_len)), &fill);
    let op = reduce_op(case.op.unwrap_or(Op::Sum));
    let root = 0;
    let is_root = g == root as usize;
    if case.in_place {
        let layout = case.in_place_layout(g).expect("an in-place form");
        let mut host = T::from_bytes(&kit::poisoned(case.dtype, layout.len));
        host[layout.input_at..layout.input_at + n_in].copy_from_slice(&T::from_bytes(input));
        let mut buf = upload(&s, &host, &fill);
        let mut b = buf.slice_mut(..layout.len);
        match case.collective {
            Collective::AllReduce => c.all_reduce_in_place(&mut b, &op)?,
            Collective::ReduceScatter => c.reduce_scatter_in_place(&mut b, &op)?,
            Collective::AllGather => c.all_gather_in_place(&mut b)?,
            Collective::Broadcast => c.broadcast_in_place(&mut b, root)?,
            Collective::Reduce => c.reduce_in_place(&mut b, &op, root)?,
            other => panic!("{other:?} has no in-place form"),
        };
        c.synchronize()?;
        let host = s.clone_dtoh(&buf).expect("download");
        return Ok(T::to_bytes(&host[..layout.len]));
    }
    let mut y = y_buf.slice_mut(..out_len);
    match case.collective {
        Collective::AllReduce => c.all_reduce(&x, &mut y, &op)?,
        Collective::ReduceScatter => c.reduce_scatter(&x, &mut y, &op)?,
        Collective::AllGather => c.all_gather(&x, &mut y)?,
        Collective::AllToAll => c.all_to_all(&x, &mut y)?,
        Collective::AllGatherV => c.all_gather_v(&x, &mut y, case.parts())?,
        Collective::ReduceScatterV => c.reduce_scatter_v(&x, &mut y, case.parts(), &op)?,
        Collective::AllToAllV => c.all_to_all_v(&x, &mut y, &case.matrix)?,
        Collective::Broadcast => c.broadcast(is_root.then_some(&x), &mut y, root)?,
        Collective::Reduce => c.reduce(&x, is_root.then_some(&mut y), &op, root)?,
        other => panic!("{other:?} is not run here"),
    };
    c.synchronize()?;
    let host = s.clone_dtoh(&y_buf).expect("download");
    Ok(T::to_bytes(&host[..out_len]))
}

/// The same call through NCCL's flat communicator, where cudarc's `Comm` has it.
fn flat_call<T: Elem>(c: &cudarc::nccl::Comm, case: &kit::Case, input: &[u8], g: usize) -> Option<Vec<u8>> {
    if case.in_place
        || !matches!(
            case.collective,
            Collective::AllReduce
                | Collective::ReduceScatter
                | Collective::AllGather
                | Collective::Broadcast
                | Collective::Reduce
        )
    {
        return None;
    }
    let s = c.stream();
    let fill = kit::poisoned(case.dtype, 1);
    let (n_in, out_len) = (case.in_count(g), case.out_count(g));
    let x_buf = upload(&s, &T::from_bytes(input), &fill);
    let x = x_buf.slice(..n_in);
    let mut y_buf = upload(&s, &T::from_bytes(&kit::poisoned(case.dtype, out_len)), &fill);
    let mut y = y_buf.slice_mut(..out_len);
    let op = nccl_op(case.op.unwrap_or(Op::Sum));
    let root_send = if g == 0 { Some(&x) } else { None };
    match case.collective {
        Collective::AllReduce => c.all_reduce(&x, &mut y, &op).map(drop),
        Collective::ReduceScatter => c.reduce_scatter(&x, &mut y, &op).map(drop),
        Collective::AllGather => c.all_gather(&x, &mut y).map(drop),
        Collective::Broadcast => c.broadcast(root_send, &mut y, 0).map(drop),
        Collective::Reduce => c.reduce(&x, (g == 0).then_some(&mut y), &op, 0).map(drop),
        _ => return None,
    }
    .expect("flat NCCL call");
    s.synchronize().expect("flat NCCL call");
    let host = s.clone_dtoh(&y_buf).expect("download");
    Some(T::to_bytes(&host[..out_len]))
}

fn run_cases<T: Elem>(hier: &HierComm, flat: &cudarc::nccl::Comm, g: usize) {
    let shape = hier.shape();
    for case in cases(hier.world_size(), T::KIT) {
        let inputs = case.inputs();
        let got = hier_call::<T>(hier, &case, &inputs[g], g)
            .unwrap_or_else(|e| panic!("{} at {}×{}: rank {g}: {e}", case.name(), shape.nodes, shape.local));
        let want = if case.in_place {
            reference::expected_in_place(&case, &inputs, g)
        } else {
            reference::expected(&case, &inputs, g)
        };
        if let Err(e) = kit::check(case.dtype, case.compare(), &got, &want) {
            panic!("{} at {}×{}: rank {g}: {e}", case.name(), shape.nodes, shape.local);
        }
        // NCCL's flat call, same inputs: the same bytes (its Avg rounds differently: by value).
        if let Some(flat) = flat_call::<T>(flat, &case, &inputs[g], g) {
            let compare = if case.op == Some(Op::Avg) { case.compare() } else { Compare::Bitwise };
            if let Err(e) = kit::check(case.dtype, compare, &got, &flat) {
                panic!("{} at {}×{}: rank {g} differs from flat NCCL: {e}", case.name(), shape.nodes, shape.local);
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn every_collective_matches_the_flat_world() {
    for (nodes, local) in shapes() {
        let t0 = Instant::now();
        let world = nodes * local;
        let purlin_id = Id::new().expect("Purlin id");
        let nccl_id = cudarc::nccl::Id::new().expect("NCCL id");
        let flat_id = cudarc::nccl::Id::new().expect("NCCL id");
        std::thread::scope(|s| {
            let ranks: Vec<_> = (0..world)
                .map(|g| {
                    s.spawn(move || {
                        let hier = HierComm::from_rank(stream(g), g, nodes, local, purlin_id, nccl_id)
                            .unwrap_or_else(|e| panic!("rank {g}: set-up at {nodes}×{local}: {e}"));
                        let flat = cudarc::nccl::Comm::from_rank(stream(g), g, world, flat_id).expect("flat NCCL");
                        run_cases::<f32>(&hier, &flat, g);
                        run_cases::<half::bf16>(&hier, &flat, g);
                        run_cases::<i32>(&hier, &flat, g);
                        hier.async_error().expect("no failure");
                    })
                })
                .collect();
            for r in ranks {
                r.join().expect("a rank panicked");
            }
        });
        println!("{nodes}×{local}: every collective exact, {:.1?}", t0.elapsed());
    }
}

/// A world of one rank: NCCL alone (one communicator of one rank), every collective through
/// it — the non-blocking set-up, each call's settling, the grouped V forms and AllToAllV,
/// synchronize and teardown — against the reference and NCCL's flat calls. One GPU suffices.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn a_world_of_one_runs_every_collective_through_nccl() {
    assert!(purlin_topo::driver_present() && purlin_topo::device_count() >= 1, "needs a GPU");
    let hier = HierComm::from_rank(
        stream(0),
        0,
        1,
        1,
        Id::new().expect("Purlin id"),
        cudarc::nccl::Id::new().expect("NCCL id"),
    )
    .expect("set-up");
    let flat = cudarc::nccl::Comm::from_rank(stream(0), 0, 1, cudarc::nccl::Id::new().expect("NCCL id")).expect("flat");
    run_cases::<f32>(&hier, &flat, 0);
    run_cases::<half::bf16>(&hier, &flat, 0);
    run_cases::<i32>(&hier, &flat, 0);
    hier.async_error().expect("no failure");
    // Bad lengths are refused before anything runs, nothing poisoned.
    let s = hier.stream();
    let x = s.clone_htod(&[1f32; 4]).expect("upload");
    let mut y = s.alloc_zeros::<f32>(3).expect("alloc");
    assert!(matches!(hier.all_gather(&x, &mut y), Err(Error::InvalidArgument(_))));
    hier.async_error().expect("a refused call poisons nothing");
}

/// A rank that never makes its call: every other rank's wait ends within the device timeout
/// with a typed error, NCCL is aborted, and later calls are refused as poisoned.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn a_missing_rank_ends_in_typed_errors_not_a_hang() {
    let (nodes, local) = *shapes().last().expect("a shape");
    let world = nodes * local;
    let purlin_id = Id::new().expect("Purlin id");
    let nccl_id = cudarc::nccl::Id::new().expect("NCCL id");
    let timeout = Duration::from_secs(5);
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..world)
            .map(|g| {
                s.spawn(move || {
                    let config =
                        CommConfig { device_timeout: timeout, timeout, ..CommConfig::from_env().expect("config") };
                    let hier = HierComm::from_rank_with_config(stream(g), g, nodes, local, purlin_id, nccl_id, config)
                        .unwrap_or_else(|e| panic!("rank {g}: set-up: {e}"));
                    if g == world - 1 {
                        return;
                    }
                    let st = hier.stream();
                    let x = st.clone_htod(&vec![1f32; 1 << 16]).expect("upload");
                    let mut y = st.alloc_zeros::<f32>(1 << 16).expect("alloc");
                    let t0 = Instant::now();
                    let r = hier.all_reduce(&x, &mut y, &ReduceOp::Sum).and_then(|_| hier.synchronize());
                    let e = r.expect_err("a call without its last rank cannot complete");
                    assert!(t0.elapsed() < timeout * 4, "rank {g}: {e} after {:?}", t0.elapsed());
                    assert!(hier.async_error().is_err(), "rank {g} is poisoned");
                    assert!(matches!(hier.all_reduce(&x, &mut y, &ReduceOp::Sum), Err(Error::Poisoned(_))), "rank {g}");
                })
            })
            .collect();
        for r in ranks {
            r.join().expect("a rank panicked");
        }
    });
}
