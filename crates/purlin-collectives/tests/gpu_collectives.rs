//! Every collective through the public `Comm` API on GPUs (one process, all local GPUs),
//! against a reference computed here from the inputs: fresh random small integers (so any
//! summation order is exact), poisoned outputs, exact comparison. Both regimes and both
//! staging sides are forced through `CommConfig::tuning`.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use purlin_atom::{F8E4M3, F8E5M2};
use purlin_collectives::internal::tuning::Tuning;
use purlin_collectives::{Comm, CommConfig, ReduceOp, SymmetricBuffer};
use purlin_snac::{Regime, StagingSide};

mod gpu_calls;
use gpu_calls::{Coll, Rng};
use purlin_testkit as kit;

/// The reductions of the cases, through the typed API where the type is a `ReduceType`
/// (`None` where it is not: such a call does not compile).
trait ElemReduce: purlin_collectives::NcclType + Sized {
    fn reduce(
        c: &Comm,
        coll: Coll,
        op: &ReduceOp,
        s: &mut CudaSlice<Self>,
        d: &mut CudaSlice<Self>,
        per_rank: &[usize],
    ) -> Option<Result<purlin_collectives::Status, purlin_collectives::Error>>;
    fn reduce_scatter_in_place(
        c: &Comm,
        buf: &mut CudaSlice<Self>,
        op: &ReduceOp,
    ) -> Option<Result<purlin_collectives::Status, purlin_collectives::Error>>;
}

macro_rules! reduces {
    ($($t:ty),*) => {$(
        impl ElemReduce for $t {
            fn reduce(
                c: &Comm,
                coll: Coll,
                op: &ReduceOp,
                s: &mut CudaSlice<Self>,
                d: &mut CudaSlice<Self>,
                per_rank: &[usize],
            ) -> Option<Result<purlin_collectives::Status, purlin_collectives::Error>> {
                Some(match coll {
                    Coll::AllReduce => c.all_reduce(s, d, op),
                    Coll::AllReduceInPlace => c.all_reduce_in_place(s, op),
                    Coll::ReduceScatter => c.reduce_scatter(s, d, op),
                    Coll::ReduceScatterV => c.reduce_scatter_v(s, d, per_rank, op),
                    _ => return None,
                })
            }
            fn reduce_scatter_in_place(
                c: &Comm,
                buf: &mut CudaSlice<Self>,
                op: &ReduceOp,
            ) -> Option<Result<purlin_collectives::Status, purlin_collectives::Error>> {
                Some(c.reduce_scatter_in_place(buf, op))
            }
        }
    )*};
}
reduces!(f32, i32, half::bf16, half::f16, F8E4M3, F8E5M2);

impl ElemReduce for u8 {
    fn reduce(
        _: &Comm,
        _: Coll,
        _: &ReduceOp,
        _: &mut CudaSlice<Self>,
        _: &mut CudaSlice<Self>,
        _: &[usize],
    ) -> Option<Result<purlin_collectives::Status, purlin_collectives::Error>> {
        None
    }
    fn reduce_scatter_in_place(
        _: &Comm,
        _: &mut CudaSlice<Self>,
        _: &ReduceOp,
    ) -> Option<Result<purlin_collectives::Status, purlin_collectives::Error>> {
        None
    }
}

/// Element types the test drives, moved to and from the kit's bytes as they are.
trait Elem:
    ElemReduce + DeviceRepr + ValidAsZeroBits + Copy + PartialEq + std::fmt::Debug + Send + Sync + Unpin + 'static
{
    const DTYPE: kit::Dtype;
    const REDUCES: bool;
    fn from_le(b: &[u8]) -> Self;
    fn to_le(self) -> Vec<u8>;
    /// The poisoned element (`purlin_testkit::POISON` bytes).
    fn poison() -> Self {
        Self::from_le(&kit::poisoned(Self::DTYPE, 1))
    }
}

macro_rules! elem {
    ($t:ty, $dtype:expr, $reduces:expr, $from:expr, $to:expr) => {
        impl Elem for $t {
            const DTYPE: kit::Dtype = $dtype;
            const REDUCES: bool = $reduces;
            fn from_le(b: &[u8]) -> Self {
                ($from)(b)
            }
            fn to_le(self) -> Vec<u8> {
                ($to)(self)
            }
        }
    };
}
elem!(f32, kit::Dtype::F32, true, |b: &[u8]| f32::from_le_bytes(b.try_into().expect("4 bytes")), |x: f32| x
    .to_le_bytes()
    .to_vec());
elem!(i32, kit::Dtype::I32, true, |b: &[u8]| i32::from_le_bytes(b.try_into().expect("4 bytes")), |x: i32| x
    .to_le_bytes()
    .to_vec());
elem!(
    half::bf16,
    kit::Dtype::Bf16,
    true,
    |b: &[u8]| half::bf16::from_le_bytes(b.try_into().expect("2 bytes")),
    |x: half::bf16| x.to_le_bytes().to_vec()
);
elem!(
    half::f16,
    kit::Dtype::F16,
    true,
    |b: &[u8]| half::f16::from_le_bytes(b.try_into().expect("2 bytes")),
    |x: half::f16| x.to_le_bytes().to_vec()
);
elem!(u8, kit::Dtype::U8, false, |b: &[u8]| b[0], |x: u8| vec![x]);
// fp8: small integers up to 16 (e4m3) or 8 (e5m2) are exact; a product or mean the type cannot
// hold is rounded by the kit's own fp8 codec (nearest, ties to even).
elem!(F8E4M3, kit::Dtype::F8E4M3, true, |b: &[u8]| F8E4M3(b[0]), |x: F8E4M3| vec![x.0]);
elem!(F8E5M2, kit::Dtype::F8E5M2, true, |b: &[u8]| F8E5M2(b[0]), |x: F8E5M2| vec![x.0]);

struct Gpus {
    streams: Vec<Arc<CudaStream>>,
}

fn gpus() -> Option<Gpus> {
    let shared = gpu_calls::shared_gpu();
    let found = if purlin_topo::driver_present() { purlin_topo::device_count() } else { 0 };
    if found < if shared { 1 } else { 2 } {
        return None;
    }
    // Under PURLIN_SHARED_GPU=1 (a one-GPU machine) every rank drives GPU 0: two, or
    // PURLIN_TEST_WORLD (4 or 8 check the kernels of those worlds without the GPUs).
    let ordinals: Vec<usize> = if shared {
        let world = std::env::var("PURLIN_TEST_WORLD").map_or(2, |w| w.trim().parse().expect("PURLIN_TEST_WORLD"));
        assert!([2, 4, 8].contains(&world), "PURLIN_TEST_WORLD {world}: 2, 4 or 8 (averages stay exact)");
        vec![0; world]
    } else {
        (0..found.min(8)).collect()
    };
    let streams =
        ordinals.into_iter().map(|i| CudaContext::new(i).expect("context").new_stream().expect("stream")).collect();
    Some(Gpus { streams })
}

fn config(regime: Option<Regime>, side: StagingSide) -> CommConfig {
    let mut c = CommConfig::from_env().expect("config");
    c.device_timeout = Duration::from_secs(20);
    c.timeout = Duration::from_secs(60);
    c.tuning = Tuning { regime, staging_side: side, ..Tuning::default() };
    c
}

/// Per-pair counts for the V forms: skewed, with zeros (one-way traffic between 0 and 1).
fn v_counts(world: usize, n: usize) -> Vec<Vec<usize>> {
    (0..world)
        .map(|s| (0..world).map(|d| if s == 1 && d == 0 { 0 } else { (n * (1 + s + 3 * d)) % (n + 1) }).collect())
        .collect()
}

/// The case as the kit states it: `n` elements (per rank, partition or pair; the V forms'
/// counts from [`v_counts`]), inputs small nonzero integers drawn from `seed` (beyond two
/// ranks, ±1 and ±2 only: a product of 8 of them is a power of two up to 256, exact in bf16,
/// and sums stay small; u8, which only moves, 1..=8).
fn kit_case(coll: Coll, dtype: kit::Dtype, op: ReduceOp, world: usize, n: usize, seed: u64) -> kit::Case {
    let counts = v_counts(world, n);
    let c = coll.kit();
    let shape = match coll {
        Coll::AllGatherV | Coll::ReduceScatterV => kit::Counts::PerRank((0..world).map(|r| counts[r][r]).collect()),
        Coll::AllToAllV => kit::Counts::PerPair(counts),
        _ => kit::Counts::Uniform(n),
    };
    let signed = dtype != kit::Dtype::U8;
    let rule = kit::ValueRule::small(if world > 2 && signed { 2 } else { 4 }, signed);
    kit::Case::with_counts(c, dtype, Some(gpu_calls::kit_op(op)), world, shape)
        .with_values(kit::Values::Rule(rule))
        .seeded(seed)
        .in_place(coll == Coll::AllReduceInPlace)
}

/// Every rank's input lengths and output lengths (elements) of a case.
fn lengths(case: &kit::Case) -> (Vec<usize>, Vec<usize>) {
    (0..case.world).map(|r| (case.in_count(r), case.out_count(r))).unzip()
}

/// The case's inputs, as the kit's bytes and as elements.
fn case_inputs<T: Elem>(case: &kit::Case) -> (Vec<Vec<u8>>, Vec<Vec<T>>) {
    let bytes = case.inputs();
    let es = T::DTYPE.size();
    let typed = bytes.iter().map(|b| b.chunks_exact(es).map(T::from_le).collect()).collect();
    (bytes, typed)
}

/// Runs one case on every rank; returns the number of wrong elements.
fn run_case<T: Elem>(comms: &[Comm], coll: Coll, op: ReduceOp, n: usize, rng: &mut Rng) -> usize {
    let world = comms.len();
    let counts = v_counts(world, n);
    let per_rank: Vec<usize> = (0..world).map(|r| counts[r][r]).collect(); // AllGatherV / ReduceScatterV counts
    let case = kit_case(coll, T::DTYPE, op, world, n, rng.next());
    let (_, out_len) = lengths(&case);
    let (bytes, inputs) = case_inputs::<T>(&case);
    let mut sends: Vec<CudaSlice<T>> = Vec::new();
    let mut recvs: Vec<CudaSlice<T>> = Vec::new();
    for (r, c) in comms.iter().enumerate() {
        let s = c.stream();
        sends.push(s.clone_htod(&inputs[r]).expect("upload"));
        recvs.push(s.clone_htod(&vec![T::poison(); out_len[r]]).expect("poison"));
    }
    for (r, c) in comms.iter().enumerate() {
        let res = match coll {
            Coll::AllReduce | Coll::AllReduceInPlace | Coll::ReduceScatter | Coll::ReduceScatterV => {
                T::reduce(c, coll, &op, &mut sends[r], &mut recvs[r], &per_rank)
                    .unwrap_or_else(|| panic!("{coll:?} of {:?}: not a ReduceType", T::DTYPE))
            }
            Coll::AllGather => c.all_gather(&sends[r], &mut recvs[r]),
            Coll::AllToAll => c.all_to_all(&sends[r], &mut recvs[r]),
            Coll::AllGatherV => c.all_gather_v(&sends[r], &mut recvs[r], &per_rank),
            Coll::AllToAllV => c.all_to_all_v(&sends[r], &mut recvs[r], &counts),
            Coll::SendRecv => {
                let peer = (1 - r) as i32;
                c.send_recv(&sends[r], peer, &mut recvs[r], peer)
            }
        };
        res.unwrap_or_else(|e| panic!("{coll:?} {:?} n={n} rank {r}: {e}", T::DTYPE));
    }
    let mut wrong = 0;
    for (r, c) in comms.iter().enumerate() {
        let got: Vec<T> = c
            .stream()
            .clone_dtoh(if coll == Coll::AllReduceInPlace { &sends[r] } else { &recvs[r] })
            .expect("download");
        let expect = kit::reference::expected(&case, &bytes, r);
        wrong += count_wrong(&got, &expect, &format!("{coll:?} {:?} {op:?} n={n} rank {r}", T::DTYPE));
    }
    wrong
}

/// The elements of `got` that differ in value from `expect` (the kit's bytes), the first of
/// them printed after `what`.
fn count_wrong<T: Elem>(got: &[T], expect: &[u8], what: &str) -> usize {
    let got: Vec<u8> = got.iter().flat_map(|x| x.to_le()).collect();
    assert_eq!(got.len(), expect.len(), "{what}");
    let w = kit::count_wrong(T::DTYPE, kit::Compare::Value, &got, expect);
    if let Some((first, g, e)) = w.first {
        println!("EXEC WRONG {what}: {} wrong, first at {first}: got {g} want {e}", w.count);
    }
    w.count as usize
}

fn sweep<T: Elem>(comms: &[Comm], sizes: &[usize], rng: &mut Rng, cases: &mut usize, wrong: &mut usize) {
    let ops: &[ReduceOp] =
        if T::REDUCES { &[ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg] } else { &[] };
    for &n in sizes {
        for coll in [Coll::AllGather, Coll::AllToAll, Coll::AllGatherV, Coll::AllToAllV, Coll::SendRecv] {
            if coll == Coll::SendRecv && comms.len() != 2 {
                continue; // a pair is the world only at world 2
            }
            *wrong += run_case::<T>(comms, coll, ReduceOp::Sum, n, rng);
            *cases += 1;
        }
        for &op in ops {
            for coll in [Coll::AllReduce, Coll::AllReduceInPlace, Coll::ReduceScatter, Coll::ReduceScatterV] {
                *wrong += run_case::<T>(comms, coll, op, n, rng);
                *cases += 1;
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn every_collective_matches_the_reference_on_gpus() {
    let Some(g) = gpus() else { panic!("needs 2 GPUs") };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut total_cases = 0;
    let mut total_wrong = 0;
    for (label, regime, side, latency_blocks, max_blocks) in [
        ("auto/push", None, StagingSide::Peer, None, None),
        ("latency", Some(Regime::Latency), StagingSide::Peer, None, None),
        // One packet block: each thread moves many packets in turn (~98 at 100 003 f32, world 2),
        // the last round of the block's threads only partly filled.
        ("latency/1 block", Some(Regime::Latency), StagingSide::Peer, Some(1), None),
        ("throughput/push", Some(Regime::Throughput), StagingSide::Peer, None, None),
        ("throughput/pull", Some(Regime::Throughput), StagingSide::Own, None, None),
        // A block cap (NCCL's maxCTAs): writers and readers split 5 blocks unevenly, so lanes
        // and slices differ from every default plan.
        ("auto/5 blocks", None, StagingSide::Peer, None, Some(5)),
    ] {
        let mut cfg = config(regime, side);
        if latency_blocks.is_some() {
            cfg.tuning.latency_max_blocks = latency_blocks;
        }
        cfg.tuning.max_blocks = max_blocks;
        let comms = Comm::from_devices_with_config(g.streams.clone(), cfg).expect("set-up");
        let (mut cases, mut wrong) = (0, 0);
        // The one-block latency case's largest call fills most of the packet window at world 2
        // (each rank's data goes to every peer), so it shrinks as the world grows.
        let one_block_largest = 100_003 * 2 / comms.len();
        let sizes: &[usize] = match (regime, latency_blocks) {
            (Some(Regime::Latency), None) => &[1, 7, 1000, 4099],
            (Some(Regime::Latency), Some(_)) => &[7, 4099, one_block_largest],
            _ => &[1, 33, 4099, 300_001],
        };
        sweep::<f32>(&comms, sizes, &mut rng, &mut cases, &mut wrong);
        sweep::<half::bf16>(&comms, sizes, &mut rng, &mut cases, &mut wrong);
        sweep::<i32>(&comms, &sizes[..3], &mut rng, &mut cases, &mut wrong);
        sweep::<half::f16>(&comms, &sizes[..2], &mut rng, &mut cases, &mut wrong);
        sweep::<u8>(&comms, sizes, &mut rng, &mut cases, &mut wrong);
        sweep::<F8E4M3>(&comms, &sizes[..2], &mut rng, &mut cases, &mut wrong);
        sweep::<F8E5M2>(&comms, &sizes[..2], &mut rng, &mut cases, &mut wrong);
        // Avg is the Atom's Mean in every reduce path (vectors, tails, fp8's FMA division):
        // the 16- and 8-bit floats, which the sweeps above keep small, at a size whose shares
        // have whole vectors and an odd tail (the V form adds heads off the vector boundary).
        if !matches!(regime, Some(Regime::Latency)) {
            for coll in [Coll::AllReduce, Coll::ReduceScatter, Coll::ReduceScatterV] {
                wrong += run_case::<half::f16>(&comms, coll, ReduceOp::Avg, 300_001, &mut rng);
                wrong += run_case::<F8E4M3>(&comms, coll, ReduceOp::Avg, 300_001, &mut rng);
                wrong += run_case::<F8E5M2>(&comms, coll, ReduceOp::Avg, 300_001, &mut rng);
                cases += 3;
            }
        }
        for c in &comms {
            c.async_error().expect("no device error");
        }
        println!("EXEC {label}: {cases} cases on {} ranks, {wrong} wrong elements", comms.len());
        total_cases += cases;
        total_wrong += wrong;
    }
    println!("EXEC total: {total_cases} cases, {total_wrong} wrong elements");
    assert_eq!(total_wrong, 0);
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn large_calls_back_to_back_match_the_reference() {
    let Some(g) = gpus() else { panic!("needs 2 GPUs") };
    let comms = Comm::from_devices_with_config(g.streams.clone(), config(None, StagingSide::Peer)).expect("set-up");
    let mut rng = Rng(7);
    let mut wrong = 0;
    let mut cases = 0;
    // Mixed collectives and sizes back to back, no synchronisation between them but the
    // downloads of the checks (which wait for their own stream only).
    for n in [16 << 20, 3 << 20, 1 << 10, 8 << 20] {
        for coll in [Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::AllToAll] {
            wrong += run_case::<f32>(&comms, coll, ReduceOp::Sum, n / comms.len(), &mut rng);
            cases += 1;
        }
    }
    println!("EXEC large back-to-back: {cases} cases, {wrong} wrong elements");
    assert_eq!(wrong, 0);
}

/// One in-place AllGather or ReduceScatter on every rank (NCCL's convention: one buffer of
/// `world × n` elements, this rank's part at `rank × n`); returns the wrong elements of the
/// whole buffers (a ReduceScatter must leave the other partitions as they were).
fn run_in_place<T: Elem>(comms: &[Comm], gather: bool, op: ReduceOp, n: usize, rng: &mut Rng) -> usize {
    let world = comms.len();
    let coll = if gather { Coll::AllGather } else { Coll::ReduceScatter };
    let case = kit_case(coll, T::DTYPE, op, world, n, rng.next()).in_place(true);
    let (bytes, inputs) = case_inputs::<T>(&case);
    let mut bufs: Vec<CudaSlice<T>> = Vec::new();
    for (r, c) in comms.iter().enumerate() {
        let host: Vec<T> = if gather {
            // Poison everywhere but the rank's own part.
            (0..world * n).map(|i| if i / n == r { inputs[r][i % n] } else { T::poison() }).collect()
        } else {
            inputs[r].clone()
        };
        bufs.push(c.stream().clone_htod(&host).expect("upload"));
    }
    for (r, c) in comms.iter().enumerate() {
        let res = if gather {
            c.all_gather_in_place(&mut bufs[r])
        } else {
            T::reduce_scatter_in_place(c, &mut bufs[r], &op)
                .unwrap_or_else(|| panic!("ReduceScatter of {:?}: not a ReduceType", T::DTYPE))
        };
        res.unwrap_or_else(|e| panic!("in place gather={gather} {:?} n={n} rank {r}: {e}", T::DTYPE));
    }
    let mut wrong = 0;
    for (r, c) in comms.iter().enumerate() {
        let got: Vec<T> = c.stream().clone_dtoh(&bufs[r]).expect("download");
        let expect = kit::reference::expected_in_place(&case, &bytes, r);
        wrong += count_wrong(&got, &expect, &format!("in place gather={gather} {:?} {op:?} n={n} rank {r}", T::DTYPE));
    }
    wrong
}

/// `Comm::all_gather_in_place` and `Comm::reduce_scatter_in_place` in both regimes, under
/// the default tuning and under a 5-block cap, against the reference; a buffer that does
/// not split into `world` partitions is a typed error.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn in_place_gathers_and_scatters_match_the_reference() {
    let Some(g) = gpus() else { panic!("needs 2 GPUs") };
    let mut rng = Rng(0x5eed_1a9e);
    let (mut cases, mut wrong) = (0, 0);
    for max_blocks in [None, Some(5)] {
        let mut cfg = config(None, StagingSide::Peer);
        cfg.tuning.max_blocks = max_blocks;
        let comms = Comm::from_devices_with_config(g.streams.clone(), cfg).expect("set-up");
        for n in [1, 4099, 300_001, 3 << 20] {
            wrong += run_in_place::<f32>(&comms, true, ReduceOp::Sum, n, &mut rng);
            wrong += run_in_place::<half::bf16>(&comms, true, ReduceOp::Sum, n, &mut rng);
            wrong += run_in_place::<u8>(&comms, true, ReduceOp::Sum, n, &mut rng);
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                wrong += run_in_place::<f32>(&comms, false, op, n, &mut rng);
            }
            wrong += run_in_place::<half::bf16>(&comms, false, ReduceOp::Prod, n, &mut rng);
            cases += 7;
        }
        let mut odd: CudaSlice<f32> = comms[0].stream().alloc_zeros(comms.len() * 10 + 1).expect("alloc");
        let err = comms[0].all_gather_in_place(&mut odd).expect_err("a buffer of world x n + 1 elements");
        assert!(err.to_string().contains("partitions"), "{err}");
        for c in &comms {
            c.async_error().expect("no device error");
        }
    }
    println!("EXEC in place: {cases} cases on {} ranks, {wrong} wrong elements", g.streams.len());
    assert_eq!(wrong, 0);
}

/// One collective on symmetric buffers on every rank: the output in `outs` (in place: the
/// whole buffer), the input of a reduction in `ins` (a copy collective reads a plain
/// `CudaSlice`, so its input is not symmetric). Counts in `one_copy` the ranks whose plan
/// is one-copy, which every throughput call must be; returns the wrong elements.
fn run_symmetric(
    comms: &[Comm],
    ins: &mut [SymmetricBuffer<f32>],
    outs: &mut [SymmetricBuffer<f32>],
    (coll, in_place): (Coll, bool),
    n: usize,
    rng: &mut Rng,
    one_copy: &mut usize,
) -> usize {
    use cudarc::driver::DevicePtr;
    use purlin_snac::{CollectiveSpec, DataType, ReduceOp as Op, Regime, Role, Space, Step};
    let world = comms.len();
    let counts = v_counts(world, n);
    let per_rank: Vec<usize> = (0..world).map(|r| counts[r][r]).collect();
    let case = kit_case(coll, kit::Dtype::F32, ReduceOp::Sum, world, n, rng.next()).in_place(in_place);
    let (in_len, out_len) = lengths(&case);
    let (bytes, inputs) = case_inputs::<f32>(&case);
    let (w, u64s) = (world as u32, |v: &[usize]| v.iter().map(|&x| x as u64).collect::<Vec<_>>());
    let spec = match coll {
        Coll::AllGather => CollectiveSpec::all_gather(w, DataType::F32, n as u64),
        Coll::AllToAll => CollectiveSpec::all_to_all(w, DataType::F32, n as u64),
        Coll::AllGatherV => CollectiveSpec::all_gather_v(w, DataType::F32, u64s(&per_rank)),
        Coll::AllToAllV => CollectiveSpec::all_to_all_v(w, DataType::F32, counts.iter().map(|c| u64s(c)).collect()),
        Coll::AllReduce | Coll::AllReduceInPlace => CollectiveSpec::all_reduce(w, DataType::F32, Op::Sum, n as u64),
        Coll::ReduceScatter => CollectiveSpec::reduce_scatter(w, DataType::F32, Op::Sum, n as u64),
        Coll::ReduceScatterV => CollectiveSpec::reduce_scatter_v(w, DataType::F32, Op::Sum, u64s(&per_rank)),
        Coll::SendRecv => unreachable!("send/recv never takes the one-copy path"),
    };
    let reduces = matches!(coll, Coll::AllReduce | Coll::AllReduceInPlace | Coll::ReduceScatter | Coll::ReduceScatterV);
    // In place the buffer holds the rank's input at NCCL's offsets (all of it, but an
    // AllGather's: its part) and poison elsewhere; a ReduceScatter's is its whole input.
    let buf_len = |r: usize| if in_place { out_len[r].max(in_len[r]) } else { out_len[r] };
    let mut sends: Vec<CudaSlice<f32>> = Vec::new();
    let (mut latency_ranks, mut peer_accesses) = (0, 0);
    for (r, c) in comms.iter().enumerate() {
        let s = c.stream();
        outs[r].set_len(buf_len(r)).expect("fits the allocation");
        let mut host = vec![f32::poison(); buf_len(r)];
        if in_place && coll == Coll::AllGather {
            host[r * n..(r + 1) * n].copy_from_slice(&inputs[r]);
        } else if in_place {
            host.copy_from_slice(&inputs[r]);
        }
        s.memcpy_htod(&host, &mut outs[r]).expect("poison");
        ins[r].set_len(in_len[r]).expect("fits the allocation");
        s.memcpy_htod(&inputs[r], &mut ins[r]).expect("upload");
        sends.push(s.clone_htod(&inputs[r]).expect("upload"));
        let input = if reduces { ins[r].device_address() } else { sends[r].device_ptr(&s).0 };
        let plan = c.plan_for_buffers(spec.clone(), in_place, input, outs[r].device_address()).expect("plan");
        // One-copy plans have one role (staged ones always have readers); a rank whose V
        // partitions are all empty accesses no peer.
        let one_role = plan.blocks.iter().all(|b| b.role == Role::Producer);
        let peer = |x: &purlin_snac::Region| matches!(x.space, Space::PeerOutput(_) | Space::PeerInput(_));
        peer_accesses += plan.blocks.iter().flat_map(|b| &b.steps).any(|s| match s {
            Step::ChunkLoop { body, .. } => body.iter().any(|s| match s {
                Step::Gather { dst, .. } => peer(dst),
                Step::Reduce { srcs, .. } => srcs.iter().any(peer),
                _ => false,
            }),
            _ => false,
        }) as usize;
        if plan.regime == Regime::Throughput {
            assert!(one_role, "{coll:?} in place {in_place} n={n}: a staged plan on symmetric buffers");
            *one_copy += 1;
        } else {
            latency_ranks += 1;
        }
    }
    assert!(latency_ranks == world || peer_accesses > 0, "{coll:?} n={n}: one-copy plans that access no peer");
    for (r, c) in comms.iter().enumerate() {
        let sum = ReduceOp::Sum;
        let res = match (coll, in_place) {
            (Coll::AllGather, true) => c.all_gather_in_place(&mut outs[r]),
            (Coll::AllGather, false) => c.all_gather(&sends[r], &mut outs[r]),
            (Coll::AllToAll, _) => c.all_to_all(&sends[r], &mut outs[r]),
            (Coll::AllGatherV, _) => c.all_gather_v(&sends[r], &mut outs[r], &per_rank),
            (Coll::AllToAllV, _) => c.all_to_all_v(&sends[r], &mut outs[r], &counts),
            (Coll::AllReduceInPlace, _) | (Coll::AllReduce, true) => c.all_reduce_in_place(&mut outs[r], &sum),
            (Coll::AllReduce, false) => c.all_reduce(&ins[r], &mut outs[r], &sum),
            (Coll::ReduceScatter, true) => c.reduce_scatter_in_place(&mut outs[r], &sum),
            (Coll::ReduceScatter, false) => c.reduce_scatter(&ins[r], &mut outs[r], &sum),
            (Coll::ReduceScatterV, _) => c.reduce_scatter_v(&ins[r], &mut outs[r], &per_rank, &sum),
            (Coll::SendRecv, _) => unreachable!("send/recv never takes the one-copy path"),
        };
        res.unwrap_or_else(|e| panic!("symmetric {coll:?} in place {in_place} n={n} rank {r}: {e}"));
    }
    let mut wrong = 0;
    for (r, c) in comms.iter().enumerate() {
        let mut got = vec![0f32; buf_len(r)];
        c.stream().memcpy_dtoh(&outs[r], &mut got).expect("download");
        c.stream().synchronize().expect("sync");
        // In place, a ReduceScatter's partition reduced and the rest of its input untouched.
        let expect = if in_place && coll == Coll::ReduceScatter {
            kit::reference::expected_in_place(&case, &bytes, r)
        } else {
            kit::reference::expected(&case, &bytes, r)
        };
        wrong += count_wrong(&got, &expect, &format!("symmetric {coll:?} in place {in_place} n={n} rank {r}"));
    }
    wrong
}

/// [`Comm::free_symmetric_group`] gives the memory back on every rank: allocation, a
/// one-copy AllGather and AllReduce on the buffers, and their free, eight times over, leave
/// the GPUs' free memory where the first cycle left it (a leak would lose 64 MiB per rank
/// and cycle at world 2), and every cycle matches the reference on buffers that may reuse
/// freed addresses. A free
/// that a rank cannot do (another handle still shows its buffer; the ranks name different
/// allocations) is refused on every rank, frees nothing, and leaves the other handles working.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn symmetric_buffers_free_together_and_give_the_memory_back() {
    let Some(g) = gpus() else { panic!("needs 2 GPUs") };
    let mut rng = Rng(0xf7ee);
    let comms = Comm::from_devices_with_config(g.streams.clone(), config(None, StagingSide::Peer)).expect("set-up");
    let world = comms.len();
    let (n, mut wrong, mut one_copy) = (4 << 20, 0, 0);
    let free_memory = || -> usize {
        g.streams
            .iter()
            .map(|s| purlin_collectives::internal::ipc::mem_info(s.context()).expect("mem info").0)
            .min()
            .unwrap()
    };
    let mut baseline = 0;
    for cycle in 0..8 {
        let mut ins = Comm::alloc_symmetric_group::<f32>(&comms, world * n).expect("symmetric inputs");
        let mut outs = Comm::alloc_symmetric_group::<f32>(&comms, world * n).expect("symmetric outputs");
        wrong += run_symmetric(&comms, &mut ins, &mut outs, (Coll::AllGather, false), n, &mut rng, &mut one_copy);
        wrong += run_symmetric(&comms, &mut ins, &mut outs, (Coll::AllReduce, false), n, &mut rng, &mut one_copy);
        Comm::free_symmetric_group(&comms, ins).expect("free the inputs");
        Comm::free_symmetric_group(&comms, outs).expect("free the outputs");
        if cycle == 0 {
            baseline = free_memory();
        }
    }
    let after = free_memory();
    println!(
        "EXEC symmetric free: 8 cycles of 2 x {} MiB per rank; free memory after cycle 1 {baseline}, after 8 {after}",
        (world * n * 4) >> 20
    );
    assert!(after + (8 << 20) >= baseline, "lost {} bytes over 7 cycles", baseline - after);
    assert_eq!(one_copy, 2 * 8 * world);

    // Refused everywhere: rank 0 still holds a view of its buffer.
    let ins = Comm::alloc_symmetric_group::<f32>(&comms, world * n).expect("symmetric inputs");
    let mut outs = Comm::alloc_symmetric_group::<f32>(&comms, world * n).expect("symmetric outputs");
    let view = ins[0].view_as::<u32>(4).expect("view");
    let err = Comm::free_symmetric_group(&comms, ins).expect_err("a view is still alive on rank 0");
    assert!(err.to_string().contains("other handles"), "{err}");
    drop(view);
    // Refused everywhere: rank 0 frees its output, the others their input (the inputs are
    // gone: their memory stays with the communicators until teardown).
    let mut again = Comm::alloc_symmetric_group::<f32>(&comms, world * n).expect("symmetric inputs");
    let mut mixed = vec![outs.remove(0)];
    mixed.extend(again.split_off(1));
    let err = Comm::free_symmetric_group(&comms, mixed).expect_err("ranks name different allocations");
    assert!(err.to_string().contains("which symmetric buffer"), "{err}");
    // The refusals freed nothing: a fresh pair of buffers still runs one-copy and correct.
    let mut ins = Comm::alloc_symmetric_group::<f32>(&comms, world * n).expect("symmetric inputs");
    let mut outs = Comm::alloc_symmetric_group::<f32>(&comms, world * n).expect("symmetric outputs");
    wrong += run_symmetric(&comms, &mut ins, &mut outs, (Coll::ReduceScatter, false), n, &mut rng, &mut one_copy);
    for c in &comms {
        c.async_error().expect("no device error");
    }
    println!(
        "EXEC symmetric free: refusals (a live view, different allocations) on {world} ranks, {wrong} wrong elements"
    );
    assert_eq!(wrong, 0);
}

/// Collectives on symmetric buffers ([`Comm::alloc_symmetric_group`]): AllGather (also in
/// place), AllToAll and their V forms into symmetric outputs, ReduceScatter (also in place),
/// its V form and AllReduce (in and out of place) from symmetric inputs, take the one-copy
/// plan wherever they would be staged (the plan is checked) and match the reference, under
/// the default tuning and a 5-block cap; below that size the same buffers work as plain
/// memory; a buffer the peers' cannot match is a typed error.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn symmetric_buffers_take_one_copy_and_match_the_reference() {
    let Some(g) = gpus() else { panic!("needs 2 GPUs") };
    let mut rng = Rng(0x5eed_0c0e);
    let (mut cases, mut wrong, mut one_copy) = (0, 0, 0);
    let sizes = [1, 4099, 300_001, 3 << 20];
    let cases_per_size = [
        (Coll::AllGather, false),
        (Coll::AllGather, true),
        (Coll::AllToAll, false),
        (Coll::AllGatherV, false),
        (Coll::AllToAllV, false),
        (Coll::AllReduce, false),
        (Coll::AllReduce, true),
        (Coll::ReduceScatter, false),
        (Coll::ReduceScatter, true),
        (Coll::ReduceScatterV, false),
    ];
    for max_blocks in [None, Some(5)] {
        let mut cfg = config(None, StagingSide::Peer);
        cfg.tuning.max_blocks = max_blocks;
        let comms = Comm::from_devices_with_config(g.streams.clone(), cfg).expect("set-up");
        let world = comms.len();
        let capacity = world * (3 << 20);
        let mut ins = Comm::alloc_symmetric_group::<f32>(&comms, capacity).expect("symmetric inputs");
        let mut outs = Comm::alloc_symmetric_group::<f32>(&comms, capacity).expect("symmetric outputs");
        for n in sizes {
            for case in cases_per_size {
                wrong += run_symmetric(&comms, &mut ins, &mut outs, case, n, &mut rng, &mut one_copy);
                cases += 1;
            }
        }
        // A V output the peers' buffers cannot hold: rank 1 gathers more than they have.
        let spec = purlin_snac::CollectiveSpec::all_gather_v(2, purlin_snac::DataType::F32, vec![capacity as u64, 1]);
        if world == 2 {
            let (i, o) = (ins[0].device_address(), outs[0].device_address());
            let err = comms[0].plan_for_buffers(spec, false, i, o).expect_err("too large for the peers");
            assert!(err.to_string().contains("symmetric buffer"), "{err}");
        }
        for c in &comms {
            c.async_error().expect("no device error");
        }
    }
    println!(
        "EXEC symmetric: {cases} cases on {} ranks, {one_copy} one-copy plans, {wrong} wrong elements",
        g.streams.len()
    );
    assert!(one_copy >= 2 * cases_per_size.len() * g.streams.len(), "the throughput sizes ran one-copy");
    assert_eq!(wrong, 0);
}

/// Broadcast and Reduce (cudarc's `broadcast`, `broadcast_in_place`, `reduce`,
/// `reduce_in_place`; the V forms with one contributing / receiving rank) from every root,
/// in both regimes (sizes across the band), on plain and symmetric buffers: every rank gets
/// the root's input, the root gets the sum (small integers: exact), a peer's receive buffer
/// of a Reduce is not written and its in-place buffer stays as it was.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn broadcast_and_reduce_from_every_root() {
    let Some(g) = gpus() else { panic!("needs 2 GPUs") };
    let comms = Comm::from_devices_with_config(g.streams.clone(), config(None, StagingSide::Peer)).expect("set-up");
    let world = comms.len();
    let value = |r: usize, i: usize| ((i * 7 + r * 13) % 23) as f32;
    let (mut calls, mut wrong) = (0, 0);
    let mut check = |got: Vec<f32>, want: &dyn Fn(usize) -> f32, what: String| {
        let bad = got.iter().enumerate().filter(|&(i, &v)| v != want(i)).count();
        if bad > 0 {
            println!("{what}: {bad} wrong elements");
        }
        wrong += bad;
        calls += 1;
    };
    for n in [1, 4099, 300_001, 3 << 20] {
        let mut sym_send = Comm::alloc_symmetric_group::<f32>(&comms, n).expect("symmetric inputs");
        let mut sym_recv = Comm::alloc_symmetric_group::<f32>(&comms, n).expect("symmetric outputs");
        for root in 0..world {
            let (mut plain, mut reduced): (_, Vec<CudaSlice<f32>>) = (vec![], vec![]);
            for (r, c) in comms.iter().enumerate() {
                let s = c.stream();
                let x: Vec<f32> = (0..n).map(|i| value(r, i)).collect();
                let send = s.clone_htod(&x).expect("input");
                s.memcpy_htod(&x, &mut sym_send[r]).expect("upload");
                plain.push((send, s.clone_htod(&vec![-1f32; n]).expect("out"), s.clone_htod(&x).expect("in place")));
                reduced.push(s.clone_htod(&vec![-7f32; n]).expect("reduce out"));
            }
            // Enqueue every rank's calls (they run together), then read back. Nothing between
            // the launches may block the host on a stream: a rank's kernels wait for the next
            // rank's, which this thread has not launched yet (a pageable copy of megabytes
            // behind them would wait for its stream, and so until the device timeout).
            for (r, c) in comms.iter().enumerate() {
                let root32 = root as i32;
                let (send, out, inplace) = &mut plain[r];
                c.broadcast(Some(&*send), out, root32).expect("broadcast");
                c.broadcast(Some(&sym_send[r]), &mut sym_recv[r], root32).expect("symmetric broadcast");
                c.reduce(&*send, Some(&mut reduced[r]), &ReduceOp::Sum, root32).expect("reduce");
                c.reduce_in_place(inplace, &ReduceOp::Sum, root32).expect("reduce in place");
            }
            let root_input = |i: usize| value(root, i);
            let sum = |i: usize| (0..world).map(|q| value(q, i)).sum::<f32>();
            for (r, c) in comms.iter().enumerate() {
                let s = c.stream();
                let what = |k: &str| format!("n {n} root {root} rank {r} {k}");
                check(s.clone_dtoh(&plain[r].1).expect("read"), &root_input, what("broadcast"));
                check(s.clone_dtoh(&sym_recv[r]).expect("read"), &root_input, what("symmetric broadcast"));
                let own = |i: usize| value(r, i);
                let (want_reduce, want_in_place): (&dyn Fn(usize) -> f32, &dyn Fn(usize) -> f32) =
                    if r == root { (&sum, &sum) } else { (&|_| -7.0, &own) };
                check(s.clone_dtoh(&reduced[r]).expect("read"), want_reduce, what("reduce"));
                check(s.clone_dtoh(&plain[r].2).expect("read"), want_in_place, what("reduce in place"));
                c.async_error().expect("no device error");
            }
        }
        Comm::free_symmetric_group(&comms, sym_recv).expect("free");
        Comm::free_symmetric_group(&comms, sym_send).expect("free");
    }
    println!("EXEC broadcast/reduce: {calls} results on {world} ranks, {wrong} wrong elements");
    assert_eq!(wrong, 0);
}

/// Point-to-point at world 2: a send meets the peer's receive, a group's send and receive
/// run as one exchange at its end (both ranks sending and receiving, as pipeline stages
/// swap activations), a group of several sends and receives runs them as NCCL matches them,
/// and `send_recv` moves different lengths each way; every rank is checked
/// against the values its peer sent. Wider worlds (`PURLIN_TEST_WORLD`) answer Unsupported.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn send_recv_and_groups_exchange_at_world_2() {
    let Some(g) = gpus() else { panic!("needs 2 GPUs") };
    let comms = Comm::from_devices_with_config(g.streams.clone(), config(None, StagingSide::Peer)).expect("set-up");
    let world = comms.len();
    if world != 2 {
        let x = comms[0].stream().clone_htod(&[1f32; 4]).expect("input");
        assert!(matches!(comms[0].send(&x, 1), Err(purlin_collectives::Error::Unsupported(_))));
        println!("EXEC send/recv: world {world} answers Unsupported");
        return;
    }
    let value = |r: usize, call: usize, i: usize| ((i * 7 + r * 13 + call * 5) % 1021) as f32;
    let values = |r: usize, call: usize, n: usize| (0..n).map(|i| value(r, call, i)).collect::<Vec<f32>>();
    let (mut calls, mut wrong) = (0, 0);
    let mut check = |got: Vec<f32>, want: Vec<f32>, what: String| {
        let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count() + got.len().abs_diff(want.len());
        if bad > 0 {
            println!("{what}: {bad} wrong elements");
        }
        wrong += bad;
        calls += 1;
    };
    for n in [1, 4099, 300_001, 3 << 20] {
        let m = n / 2 + 3;
        let mut bufs = vec![];
        for (r, c) in comms.iter().enumerate() {
            let s = c.stream();
            let len = |k: usize| if k == r { n } else { m };
            bufs.push([
                s.clone_htod(&values(r, 0, n)).expect("send"),
                s.clone_htod(&vec![-1f32; n]).expect("recv"),
                s.clone_htod(&values(r, 1, n)).expect("group send"),
                s.clone_htod(&vec![-1f32; n]).expect("group recv"),
                s.clone_htod(&values(r, 2, len(0))).expect("send_recv send"),
                s.clone_htod(&vec![-1f32; len(1)]).expect("send_recv recv"),
            ]);
        }
        // Every rank's calls enqueued in one order (they run together), then read back.
        for (r, c) in comms.iter().enumerate() {
            let peer = (1 - r) as i32;
            let [send, recv, gsend, grecv, ssend, srecv] = &mut bufs[r];
            if r == 0 {
                c.send(&*send, peer).expect("send");
            } else {
                c.recv(recv, peer).expect("recv");
            }
            let mut group = c.group();
            group.recv(grecv.slice_mut(..), peer).expect("group recv");
            group.send(gsend.slice(..), peer).expect("group send");
            group.end().expect("group end");
            c.send_recv(&*ssend, peer, srecv, peer).expect("send_recv");
        }
        for (r, c) in comms.iter().enumerate() {
            let (s, peer) = (c.stream(), 1 - r);
            let what = |k: &str| format!("n {n} rank {r} {k}");
            let b = &bufs[r];
            let want_recv = if r == 1 { values(0, 0, n) } else { vec![-1.0; n] };
            check(s.clone_dtoh(&b[1]).expect("read"), want_recv, what("recv"));
            check(s.clone_dtoh(&b[3]).expect("read"), values(peer, 1, n), what("group exchange"));
            let peer_len = if peer == 0 { n } else { m };
            check(s.clone_dtoh(&b[5]).expect("read"), values(peer, 2, peer_len), what("send_recv"));
            c.async_error().expect("no device error");
        }
    }
    // A group dropped without `end` runs its held pair too.
    let n = 1000;
    let mut bufs: Vec<_> = comms
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let s = c.stream();
            (s.clone_htod(&values(r, 3, n)).expect("send"), s.clone_htod(&vec![-1f32; n]).expect("recv"))
        })
        .collect();
    for (r, c) in comms.iter().enumerate() {
        let (send, recv) = &mut bufs[r];
        let mut group = c.group();
        group.send(send.slice(..), (1 - r) as i32).expect("group send");
        group.recv(recv.slice_mut(..), (1 - r) as i32).expect("group recv");
    }
    for (r, c) in comms.iter().enumerate() {
        check(c.stream().clone_dtoh(&bufs[r].1).expect("read"), values(1 - r, 3, n), format!("rank {r} dropped group"));
        c.async_error().expect("no device error");
    }
    // A group of several sends and receives, as NCCL matches them: the k-th send to a peer
    // meets the peer's k-th receive, whatever the two lists' interleaving. Rank 0 sends two
    // buffers and receives one; rank 1 receives two and sends one.
    let lens = [5000, 1667, 777];
    let mut bufs: Vec<Vec<_>> = comms
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let s = c.stream();
            let buf = |k: usize| {
                let sends = if r == 0 { k < 2 } else { k == 2 };
                s.clone_htod(&if sends { values(r, 4 + k, lens[k]) } else { vec![-1f32; lens[k]] }).expect("buffer")
            };
            (0..3).map(buf).collect()
        })
        .collect();
    for (r, c) in comms.iter().enumerate() {
        let peer = (1 - r) as i32;
        let [b0, b1, b2] = &mut bufs[r][..] else { unreachable!() };
        let mut group = c.group();
        if r == 0 {
            group.send(b0.slice(..), peer).expect("send 1");
            group.recv(b2.slice_mut(..), peer).expect("recv 1");
            group.send(b1.slice(..), peer).expect("send 2");
        } else {
            group.recv(b0.slice_mut(..), peer).expect("recv 1");
            group.recv(b1.slice_mut(..), peer).expect("recv 2");
            group.send(b2.slice(..), peer).expect("send 1");
        }
        group.end().expect("group end");
    }
    for (r, c) in comms.iter().enumerate() {
        for k in 0..3 {
            let received = if r == 0 { k == 2 } else { k < 2 };
            if received {
                let got = c.stream().clone_dtoh(&bufs[r][k]).expect("read");
                check(got, values(1 - r, 4 + k, lens[k]), format!("rank {r} group of several, buffer {k}"));
            }
        }
        c.async_error().expect("no device error");
    }
    // Between the free group_start/group_end a lone send is refused before anything runs
    // (run one by one, an exchange's halves would meet the peer's in the wrong order).
    purlin_collectives::group_start().expect("group_start");
    let refused = comms[0].send(&bufs[0][0], 1);
    purlin_collectives::group_end().expect("group_end");
    assert!(matches!(refused, Err(purlin_collectives::Error::Unsupported(_))), "{refused:?}");
    comms[0].async_error().expect("nothing ran, nothing poisoned");
    println!("EXEC send/recv: {calls} results on {world} ranks, {wrong} wrong elements");
    assert_eq!(wrong, 0);
}

/// Ranks that make different calls (another size, in the latency and the staged regime,
/// another collective, one-copy buffers against plain ones) all get `Error::Mismatch` from
/// the call check (a mismatch, not an expired wait), and nothing runs afterwards.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn ranks_that_make_different_calls_get_a_mismatch_on_every_rank() {
    use purlin_collectives::Error;
    let Some(g) = gpus() else { panic!("needs 2 GPUs") };
    let world = g.streams.len();
    // (what differs, elements rank 0 / the others reduce or contribute, how).
    let cases: [(&str, usize, usize, &str); 5] = [
        ("count, packets", 1000, 2000, "all_reduce"),
        ("count, staged", 4 << 20, 5 << 20, "all_reduce"),
        ("count by one element", 4096, 4097, "all_reduce"),
        ("collective", 64, 64, "all_gather|all_to_all"),
        ("one-copy against plain", 1 << 20, 1 << 20, "symmetric|plain"),
    ];
    let mut checked = 0;
    for (what, n0, n1, how) in cases {
        let comms = Comm::from_devices_with_config(g.streams.clone(), config(None, StagingSide::Peer)).expect("set-up");
        let n_of = |r: usize| if r == 0 { n0 } else { n1 };
        let mut symmetric = if how == "symmetric|plain" {
            let ins = Comm::alloc_symmetric_group::<f32>(&comms, n0).expect("symmetric inputs");
            let outs = Comm::alloc_symmetric_group::<f32>(&comms, n0).expect("symmetric outputs");
            Some((ins, outs))
        } else {
            None
        };
        let mut bufs: Vec<(CudaSlice<f32>, CudaSlice<f32>)> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let s = c.stream();
                let n = n_of(r);
                (s.clone_htod(&vec![1f32; n * world]).expect("send"), s.alloc_zeros::<f32>(n * world).expect("recv"))
            })
            .collect();
        let start = std::time::Instant::now();
        // Every rank's call enqueued, then every stream drained: the check ends both kernels.
        for (r, c) in comms.iter().enumerate() {
            let (send, recv) = &mut bufs[r];
            let n = n_of(r);
            match (how, r) {
                ("all_reduce", _) => c.all_reduce(&send.slice(..n), &mut recv.slice_mut(..n), &ReduceOp::Sum),
                ("all_gather|all_to_all", 0) => c.all_gather(&send.slice(..n), &mut recv.slice_mut(..n * world)),
                ("all_gather|all_to_all", _) => {
                    c.all_to_all(&send.slice(..n * world), &mut recv.slice_mut(..n * world))
                }
                ("symmetric|plain", 0) => {
                    let (ins, outs) = symmetric.as_mut().expect("allocated");
                    let (i, o) = (&ins[0], &mut outs[0]);
                    c.all_reduce(i, o, &ReduceOp::Sum)
                }
                _ => c.all_reduce(&send.slice(..n), &mut recv.slice_mut(..n), &ReduceOp::Sum),
            }
            .unwrap_or_else(|e| panic!("{what}: rank {r}'s launch: {e}"));
        }
        for c in &comms {
            c.stream().synchronize().expect("the check ends the kernels");
        }
        let took = start.elapsed();
        for (r, c) in comms.iter().enumerate() {
            match c.async_error() {
                Err(Error::Mismatch { rank, peer, what: why }) => {
                    assert_eq!(rank, r);
                    assert!(peer != r && (r == 0 || peer == 0), "{what}: rank {r} names rank {peer}");
                    println!("EXEC mismatch ({what}) rank {r} after {took:?}: {why}");
                }
                other => panic!("{what}: rank {r}: expected a mismatch, got {other:?}"),
            }
            // Later calls fail at once, naming it.
            let (send, recv) = &mut bufs[r];
            match c.all_reduce(&send.slice(..8), &mut recv.slice_mut(..8), &ReduceOp::Sum) {
                Err(Error::Poisoned(why)) => assert!(why.contains("calls differ"), "{why}"),
                other => panic!("{what}: rank {r}'s next call: {other:?}"),
            }
        }
        checked += 1;
    }
    println!("EXEC call check: {checked} mismatches reported on all {world} ranks");
    assert_eq!(checked, cases.len());
}
