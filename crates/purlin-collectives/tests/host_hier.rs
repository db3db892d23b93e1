//! The hierarchical communicator's composition on the host (`CpuHierComm`: simulated nodes of
//! `CpuComm` threads, `CpuComm` rails standing in for the network engine): every collective,
//! in place and not, at 2×2, 2×4 and 4×2 "nodes × ranks", checked bitwise against
//! purlin-testkit's reference for the flat world of `nodes × ranks` ranks (global rank
//! `node × ranks + local rank`).

use std::time::{Duration, Instant};

use purlin_collectives::{CpuConfig, CpuHierComm, CpuType, Error, ReduceOp, ReduceType, Status};
use purlin_testkit::{self as kit, Collective, Compare, Counts, Dtype, Op, reference};

/// The element types these tests run, as bytes both ways.
trait Elem: CpuType {
    const KIT: Dtype;
    fn from_bytes(b: &[u8]) -> Vec<Self>;
    fn to_bytes(x: &[Self]) -> Vec<u8>;
    /// A reducing call of rank `g` (only types that reduce: [`ReduceType`]).
    fn reducing(c: &CpuHierComm, case: &kit::Case, x: &[Self], y: &mut [Self], g: usize) -> Result<Status, Error>;
}

/// Rank `g`'s reducing call of `case` on `x` into `y` (in place: on `y`, which holds `x`).
fn reducing<T: CpuType + ReduceType>(
    c: &CpuHierComm,
    case: &kit::Case,
    x: &[T],
    y: &mut [T],
    g: usize,
) -> Result<Status, Error> {
    let op = reduce_op(case.op.unwrap_or(Op::Sum));
    let root = 0;
    match (case.collective, case.in_place) {
        (Collective::AllReduce, false) => c.all_reduce(x, y, &op),
        (Collective::ReduceScatter, false) => c.reduce_scatter(x, y, &op),
        (Collective::ReduceScatterV, false) => c.reduce_scatter_v(x, y, case.parts(), &op),
        (Collective::Reduce, false) => c.reduce(x, (g == root).then_some(y), &op, root as i32),
        (Collective::AllReduce, true) => c.all_reduce_in_place(y, &op),
        (Collective::ReduceScatter, true) => c.reduce_scatter_in_place(y, &op),
        (Collective::Reduce, true) => c.reduce_in_place(y, &op, root as i32),
        (other, _) => panic!("{other:?} does not reduce"),
    }
}

macro_rules! elem {
    ($t:ty, $kit:ident, $n:literal, $from:expr, $to:expr, $reduces:tt) => {
        impl Elem for $t {
            const KIT: Dtype = Dtype::$kit;
            fn from_bytes(b: &[u8]) -> Vec<Self> {
                b.chunks_exact($n).map(|c| $from(c.try_into().expect("element bytes"))).collect()
            }
            fn to_bytes(x: &[Self]) -> Vec<u8> {
                x.iter().flat_map(|v| $to(*v)).collect()
            }
            fn reducing(
                c: &CpuHierComm,
                case: &kit::Case,
                x: &[Self],
                y: &mut [Self],
                g: usize,
            ) -> Result<Status, Error> {
                elem!(@reduce $reduces, c, case, x, y, g)
            }
        }
    };
    (@reduce true, $c:ident, $case:ident, $x:ident, $y:ident, $g:ident) => {
        reducing($c, $case, $x, $y, $g)
    };
    (@reduce false, $c:ident, $case:ident, $x:ident, $y:ident, $g:ident) => {{
        let _ = ($c, $x, $y, $g);
        panic!("{} reduces no {:?} (not a ReduceType)", $case.name(), $case.dtype)
    }};
}
elem!(f32, F32, 4, f32::from_le_bytes, f32::to_le_bytes, true);
elem!(i32, I32, 4, i32::from_le_bytes, i32::to_le_bytes, true);
elem!(u8, U8, 1, u8::from_le_bytes, u8::to_le_bytes, false);
elem!(
    half::bf16,
    Bf16,
    2,
    |b| half::bf16::from_bits(u16::from_le_bytes(b)),
    |v: half::bf16| v.to_bits().to_le_bytes(),
    true
);

fn reduce_op(op: Op) -> ReduceOp {
    match op {
        Op::Sum => ReduceOp::Sum,
        Op::Prod => ReduceOp::Prod,
        Op::Min => ReduceOp::Min,
        Op::Max => ReduceOp::Max,
        Op::Avg => ReduceOp::Avg,
    }
}

/// Rank `g`'s call of `case` on its communicator; its output (in place: its one buffer) as bytes.
fn call<T: Elem>(c: &CpuHierComm, case: &kit::Case, input: &[u8], g: usize) -> Result<Vec<u8>, Error> {
    let x = T::from_bytes(input);
    let poisoned = |n: usize| T::from_bytes(&kit::poisoned(case.dtype, n));
    let mut y = poisoned(case.out_count(g));
    let root = 0;
    match (case.collective, case.in_place) {
        (coll, false) if coll.reduces() => T::reducing(c, case, &x, &mut y, g)?,
        (Collective::AllGather, false) => c.all_gather(&x, &mut y)?,
        (Collective::AllToAll, false) => c.all_to_all(&x, &mut y)?,
        (Collective::AllGatherV, false) => c.all_gather_v(&x, &mut y, case.parts())?,
        (Collective::AllToAllV, false) => c.all_to_all_v(&x, &mut y, &case.matrix)?,
        (Collective::Broadcast, false) => c.broadcast((g == root).then_some(&x[..]), &mut y, root as i32)?,
        (coll, true) => {
            let layout = case.in_place_layout(g).expect("an in-place form");
            let mut buf = poisoned(layout.len);
            buf[layout.input_at..layout.input_at + x.len()].copy_from_slice(&x);
            match coll {
                coll if coll.reduces() => T::reducing(c, case, &x, &mut buf, g)?,
                Collective::AllGather => c.all_gather_in_place(&mut buf)?,
                Collective::Broadcast => c.broadcast_in_place(&mut buf, root as i32)?,
                other => panic!("{other:?} has no in-place form"),
            };
            y = buf;
            purlin_collectives::Status::Success
        }
        (other, _) => panic!("{other:?} is not run here"),
    };
    Ok(T::to_bytes(&y))
}

/// Runs `case` on every rank and checks each rank's output bitwise against the reference.
fn check<T: Elem>(comms: &[CpuHierComm], case: &kit::Case) {
    assert_eq!(T::KIT, case.dtype, "{}: the element type", case.name());
    let inputs = case.inputs();
    let outs: Vec<Result<Vec<u8>, Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(g, c)| {
                let input = &inputs[g];
                s.spawn(move || call::<T>(c, case, input, g))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    });
    let shape = comms[0].shape();
    for (g, out) in outs.into_iter().enumerate() {
        let got = out.unwrap_or_else(|e| panic!("{} at {}×{}: rank {g}: {e}", case.name(), shape.nodes, shape.local));
        let want = if case.in_place {
            reference::expected_in_place(case, &inputs, g)
        } else {
            reference::expected(case, &inputs, g)
        };
        if let Err(e) = kit::check(case.dtype, Compare::Bitwise, &got, &want) {
            panic!("{} at {}×{}: rank {g}: {e}", case.name(), shape.nodes, shape.local);
        }
    }
}

/// Every case of one shape and element type.
fn cases(world: usize, dtype: Dtype, reduces: bool) -> Vec<kit::Case> {
    let mut out = vec![];
    let uneven: Vec<usize> = (0..world).map(|g| (g * 7 + 3) % 5).collect();
    let matrix: Vec<Vec<usize>> = (0..world).map(|p| (0..world).map(|q| (p * 3 + q * 5) % 4).collect()).collect();
    for collective in Collective::EVERY {
        if collective == Collective::SendRecv || collective.reduces() != reduces {
            continue;
        }
        let ops: Vec<Option<Op>> = if reduces { Op::ALL.map(Some).to_vec() } else { vec![None] };
        let counts: Vec<Counts> = match collective {
            // Shards that `ranks per node` divides, and ones it does not.
            Collective::AllReduce => {
                vec![Counts::Uniform(world * 3), Counts::Uniform(world * 3 + 1), Counts::Uniform(1)]
            }
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                vec![Counts::Uniform(1), Counts::Uniform(3)]
            }
            Collective::AllGatherV | Collective::ReduceScatterV => {
                vec![Counts::PerRank(uneven.clone()), Counts::Uniform(2)]
            }
            Collective::AllToAllV => vec![Counts::PerPair(matrix.clone())],
            Collective::Broadcast | Collective::Reduce => vec![Counts::Uniform(5)],
            Collective::SendRecv => vec![],
        };
        let in_place_forms: &[bool] = match collective {
            Collective::AllReduce
            | Collective::AllGather
            | Collective::ReduceScatter
            | Collective::Broadcast
            | Collective::Reduce => &[false, true],
            _ => &[false],
        };
        for op in &ops {
            for n in &counts {
                for &in_place in in_place_forms {
                    let case = kit::Case::with_counts(collective, dtype, *op, world, n.clone()).seeded(world as u64);
                    out.push(case.in_place(in_place));
                }
            }
        }
    }
    out
}

fn run_shape(nodes: usize, local: usize) {
    let t0 = Instant::now();
    let comms = CpuHierComm::threads(nodes, local).expect("communicators");
    let w = nodes * local;
    let mut n = 0;
    for case in cases(w, Dtype::F32, true).iter().chain(&cases(w, Dtype::F32, false)) {
        check::<f32>(&comms, case);
        n += 1;
    }
    for case in &cases(w, Dtype::Bf16, true) {
        check::<half::bf16>(&comms, case);
        n += 1;
    }
    for case in &cases(w, Dtype::I32, true) {
        check::<i32>(&comms, case);
        n += 1;
    }
    for case in &cases(w, Dtype::U8, false) {
        check::<u8>(&comms, case);
        n += 1;
    }
    for c in &comms {
        c.async_error().expect("no call failed");
    }
    println!("{nodes}×{local}: {n} cases, {:.1?}", t0.elapsed());
}

#[test]
fn every_collective_at_two_nodes_of_two() {
    run_shape(2, 2);
}

#[test]
fn every_collective_at_two_nodes_of_four() {
    run_shape(2, 4);
}

#[test]
fn every_collective_at_four_nodes_of_two() {
    run_shape(4, 2);
}

/// One node is today's path (the node's `CpuComm` alone); one rank per node is the rail alone.
#[test]
fn a_world_of_one_level_is_that_level_alone() {
    for (nodes, local) in [(1, 3), (3, 1)] {
        let comms = CpuHierComm::threads(nodes, local).expect("communicators");
        let w = nodes * local;
        for collective in
            [Collective::AllReduce, Collective::AllGatherV, Collective::ReduceScatter, Collective::AllToAll]
        {
            let counts =
                if collective == Collective::AllGatherV { Counts::PerRank(vec![2, 0, 3]) } else { Counts::Uniform(3) };
            check::<f32>(&comms, &kit::Case::with_counts(collective, Dtype::F32, Some(Op::Sum), w, counts));
        }
    }
}

/// Send/receive goes to the world communicator (the host executor's: a world of two).
#[test]
fn send_and_recv_are_delegated_to_the_world() {
    let comms = CpuHierComm::threads(2, 1).expect("communicators");
    let case = kit::Case::with_counts(
        Collective::SendRecv,
        Dtype::F32,
        None,
        2,
        Counts::PerPair(vec![vec![0, 6], vec![0, 0]]),
    );
    let inputs = case.inputs();
    let got = std::thread::scope(|s| {
        let (a, b) = (&comms[0], &comms[1]);
        let x = f32::from_bytes(&inputs[0]);
        let sender = s.spawn(move || a.send(&x, 1));
        let receiver = s.spawn(move || {
            let mut y = vec![0f32; 6];
            b.recv(&mut y, 0).map(|_| y)
        });
        sender.join().expect("sender").expect("send");
        receiver.join().expect("receiver").expect("recv")
    });
    kit::check(Dtype::F32, Compare::Bitwise, &f32::to_bytes(&got), &reference::expected(&case, &inputs, 1)).unwrap();
}

/// A rank that never makes its call: every rank's error names the rank it waited for — its
/// node's missing rank, or the rail peer stuck behind it — in global numbers, and the
/// communicators are poisoned.
#[test]
fn a_missing_rank_is_named_by_global_rank_and_poisons_the_world() {
    let config = CpuConfig { timeout: Duration::from_millis(500), ..CpuConfig::default() };
    let comms = CpuHierComm::threads_with_config(2, 2, config).expect("communicators");
    let errors: Vec<Option<Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    if c.rank() == 3 {
                        return None;
                    }
                    let x = vec![1f32; 4];
                    let mut y = vec![0f32; 16];
                    c.all_gather(&x, &mut y).err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    });
    // Rank 2 waits for rank 3 in their node's step; rank 1 for rank 3 on their rail; rank 0
    // for rank 2 (stuck in its node's step) on theirs.
    for (g, want) in [(0, 2), (1, 3), (2, 3)] {
        match &errors[g] {
            Some(e @ Error::Timeout { rank, peer, .. }) => {
                assert_eq!((*rank, *peer), (g, want), "rank {g}: {e}");
            }
            other => panic!("rank {g}: expected a timeout naming rank {want}, got {other:?}"),
        }
        assert!(comms[g].async_error().is_err(), "rank {g} is poisoned");
        let mut y = vec![0f32; 16];
        assert!(matches!(comms[g].all_gather(&[1f32; 4], &mut y), Err(Error::Poisoned(_))), "rank {g}");
    }
}

/// Lengths that do not fit the world are refused on the spot, nothing poisoned.
#[test]
fn bad_lengths_are_refused_before_anything_moves() {
    let comms = CpuHierComm::threads(2, 2).expect("communicators");
    let c = &comms[1];
    let mut y = vec![0f32; 7];
    assert!(matches!(c.all_gather(&[1f32; 2], &mut y), Err(Error::InvalidArgument(_))));
    assert!(matches!(c.reduce_scatter_in_place(&mut y, &ReduceOp::Sum), Err(Error::InvalidArgument(_))));
    assert!(matches!(c.all_gather_v(&[1f32; 2], &mut y, &[1, 2, 3]), Err(Error::InvalidArgument(_))));
    c.async_error().unwrap();
}

/// Ranks of one node that make different calls: the node's call check names the other rank
/// (globally numbered) on both, and the other node's ranks, waiting on their rails for the
/// failed ones, name those.
#[test]
fn ranks_that_call_differently_are_named_by_global_rank() {
    let config = CpuConfig { timeout: Duration::from_millis(500), ..CpuConfig::default() };
    let comms = CpuHierComm::threads_with_config(2, 2, config).expect("communicators");
    let errors: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    // Rank 3 reduces 12 elements, everyone else 8.
                    let n = if c.rank() == 3 { 12 } else { 8 };
                    let x = vec![1f32; n];
                    let mut y = vec![0f32; n];
                    c.all_reduce(&x, &mut y, &ReduceOp::Sum).expect_err("mismatched calls cannot complete")
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    });
    for (g, e) in errors.iter().enumerate() {
        let want = [2, 3, 3, 2][g];
        assert_eq!((e.peer(), g), (Some(want), g), "rank {g}: {e}");
        assert!(comms[g].async_error().is_err(), "rank {g} is poisoned");
    }
}

#[test]
fn worlds_beyond_the_host_executors_are_refused() {
    assert!(matches!(CpuHierComm::threads(4, 5), Err(Error::Spec(_))));
    assert!(matches!(CpuHierComm::threads(0, 2), Err(Error::InvalidArgument(_))));
}
