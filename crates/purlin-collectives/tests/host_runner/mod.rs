//! The host runner: cases of the host collectives (communicator setups, shapes, in place,
//! symmetric buffers), every rank's `CpuComm` driven from its own thread, every output byte
//! checked against `purlin_testkit`'s reference (stress inputs, bitwise).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use purlin_atom::{F8E4M3, F8E5M2};
use purlin_collectives::{CpuBuffer, CpuBufferMut, CpuComm, CpuConfig, CpuType};
use purlin_collectives::{Error, ReduceOp};
use purlin_snac::verify::Options;
use purlin_snac::{Collective, CollectiveSpec, DataType, PacketFormat, ReductionMode, Regime, StagingSide};
use purlin_testkit::{self as kit, Counts, Dtype, Op, POISON, Values, reference};

pub const DTYPES: [DataType; 12] = DataType::ALL;
pub const REDUCIBLE: [DataType; 7] =
    [DataType::F32, DataType::F16, DataType::Bf16, DataType::F8E4M3, DataType::F8E5M2, DataType::I32, DataType::U32];
pub const OPS: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];

pub fn reducible(d: DataType) -> bool {
    REDUCIBLE.contains(&d)
}

pub fn is_reduce(c: Collective) -> bool {
    matches!(c, Collective::AllReduce | Collective::ReduceScatter | Collective::ReduceScatterV)
}

/// How the communicator plans: its tuning (forced regime / staging side) and packet format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Setup {
    /// The host defaults (regime by size).
    Default,
    /// Latency regime, 8-byte packets.
    Latency,
    /// Latency regime, 16-byte packets.
    Latency16,
    /// Throughput, push staging, 512-byte chunks and 2 slots (so small calls reuse slots), one
    /// lane whose two writer blocks share its stage in 48-byte pieces (`purlin_snac::Share`).
    ThroughputPeer,
    /// Throughput, pull staging, likewise but each writer block staging its own slice.
    ThroughputOwn,
}

pub fn config(setup: Setup, mode: ReductionMode) -> CpuConfig {
    let mut c = CpuConfig {
        timeout: Duration::from_secs(30),
        mode,
        verify: Options { max_states: 500, schedules: 8, ..Options::default() },
        ..CpuConfig::default()
    };
    let small = |c: &mut CpuConfig, side| {
        c.tuning.regime = Some(Regime::Throughput);
        c.tuning.staging_side = side;
        c.tuning.chunk_bytes = 512;
        c.tuning.slots = 2;
        c.tuning.blocks_per_role = 2;
    };
    match setup {
        Setup::Default => {}
        Setup::Latency => c.tuning.regime = Some(Regime::Latency),
        Setup::Latency16 => {
            c.tuning.regime = Some(Regime::Latency);
            c.packet = PacketFormat::B16;
        }
        Setup::ThroughputPeer => {
            small(&mut c, StagingSide::Peer);
            c.tuning.lanes = Some(1);
            c.tuning.share_piece = 48;
            c.tuning.share_min_chunk = 0;
        }
        Setup::ThroughputOwn => {
            small(&mut c, StagingSide::Own);
            c.tuning.share_piece = 0;
        }
    }
    c
}

pub fn comms(world: usize, setup: Setup, mode: ReductionMode) -> Vec<CpuComm> {
    CpuComm::threads_with_config(world, config(setup, mode)).expect("host communicators")
}

/// Element counts of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    Uniform(u64),
    PerRank(Vec<u64>),
    PerPair(Vec<Vec<u64>>),
}

impl Shape {
    /// `n` for a non-V collective, `n` everywhere for a V one.
    pub fn uniform(c: Collective, n: u64) -> Shape {
        Shape::uniform_w(c, n, 3)
    }
    pub fn uniform_w(c: Collective, n: u64, w: u64) -> Shape {
        match c {
            Collective::AllGatherV | Collective::ReduceScatterV => Shape::PerRank(vec![n; w as usize]),
            Collective::AllToAllV => Shape::PerPair(vec![vec![n; w as usize]; w as usize]),
            _ => Shape::Uniform(n),
        }
    }
}

/// Only rank 0 sends (to everyone else, `n` each): one-way traffic.
pub fn one_way(w: u64, n: u64) -> Vec<Vec<u64>> {
    (0..w).map(|s| (0..w).map(|d| if s == 0 && d != 0 { n } else { 0 }).collect()).collect()
}

#[derive(Debug, Clone)]
pub struct Case {
    pub c: Collective,
    pub world: usize,
    pub dtype: DataType,
    pub op: Option<ReduceOp>,
    pub mode: ReductionMode,
    pub shape: Shape,
    pub setup: Setup,
    pub in_place: bool,
    /// Input and output are `CpuSymmetricBuffer`s (the one-copy plans in throughput).
    pub symmetric: bool,
}

impl Case {
    pub fn new(
        c: Collective,
        world: usize,
        dtype: DataType,
        op: Option<ReduceOp>,
        mode: ReductionMode,
        shape: Shape,
        setup: Setup,
    ) -> Case {
        let shape = match shape {
            Shape::PerRank(v) if v.len() != world => Shape::PerRank(vec![v.first().copied().unwrap_or(0); world]),
            Shape::PerPair(m) if m.len() != world => {
                let n = m.first().and_then(|r| r.first()).copied().unwrap_or(0);
                Shape::PerPair(vec![vec![n; world]; world])
            }
            s => s,
        };
        Case { c, world, dtype, op, mode, shape, setup, in_place: false, symmetric: false }
    }
    pub fn in_place(mut self) -> Case {
        self.in_place = true;
        self
    }
    pub fn symmetric(mut self) -> Case {
        self.symmetric = true;
        self
    }
    pub fn name(&self) -> String {
        format!(
            "{} w{} {:?} {:?} {:?} {:?} {:?}{}{}",
            self.c.name(),
            self.world,
            self.dtype,
            self.op,
            self.mode,
            self.shape,
            self.setup,
            if self.in_place { " in-place" } else { "" },
            if self.symmetric { " symmetric" } else { "" }
        )
    }
    fn uni(&self) -> u64 {
        match &self.shape {
            Shape::Uniform(n) => *n,
            _ => 0,
        }
    }
    fn per_rank(&self) -> Vec<u64> {
        match &self.shape {
            Shape::PerRank(v) => v.clone(),
            _ => vec![],
        }
    }
    fn per_pair(&self) -> Vec<Vec<u64>> {
        match &self.shape {
            Shape::PerPair(m) => m.clone(),
            _ => vec![],
        }
    }
    /// (input, output) element counts of rank `r`.
    pub fn lens(&self, r: usize) -> (usize, usize) {
        let w = self.world as u64;
        let n = self.uni();
        let (i, o) = match self.c {
            Collective::AllReduce => (n, n),
            Collective::AllGather => (n, w * n),
            Collective::ReduceScatter => (w * n, n),
            Collective::AllToAll => (w * n, w * n),
            Collective::AllGatherV => (self.per_rank()[r], self.per_rank().iter().sum()),
            Collective::ReduceScatterV => (self.per_rank().iter().sum(), self.per_rank()[r]),
            Collective::AllToAllV => {
                let m = self.per_pair();
                (m[r].iter().sum(), m.iter().map(|row| row[r]).sum())
            }
        };
        (i as usize, o as usize)
    }
}

// ------------------------------------------------------------------ the reference

/// The kit's element type for a library one.
pub fn kit_dtype(d: DataType) -> Dtype {
    match d {
        DataType::F32 => Dtype::F32,
        DataType::F64 => Dtype::F64,
        DataType::F16 => Dtype::F16,
        DataType::Bf16 => Dtype::Bf16,
        DataType::I8 => Dtype::I8,
        DataType::U8 => Dtype::U8,
        DataType::I32 => Dtype::I32,
        DataType::U32 => Dtype::U32,
        DataType::I64 => Dtype::I64,
        DataType::U64 => Dtype::U64,
        DataType::F8E4M3 => Dtype::F8E4M3,
        DataType::F8E5M2 => Dtype::F8E5M2,
    }
}

/// The kit's reduce op for a library one.
pub fn kit_op(op: ReduceOp) -> Op {
    match op {
        ReduceOp::Sum => Op::Sum,
        ReduceOp::Prod => Op::Prod,
        ReduceOp::Min => Op::Min,
        ReduceOp::Max => Op::Max,
        ReduceOp::Avg => Op::Avg,
    }
}

/// The kit's collective for a library one.
pub fn kit_collective(c: Collective) -> purlin_testkit::Collective {
    match c {
        Collective::AllReduce => purlin_testkit::Collective::AllReduce,
        Collective::AllGather => purlin_testkit::Collective::AllGather,
        Collective::ReduceScatter => purlin_testkit::Collective::ReduceScatter,
        Collective::AllToAll => purlin_testkit::Collective::AllToAll,
        Collective::AllGatherV => purlin_testkit::Collective::AllGatherV,
        Collective::ReduceScatterV => purlin_testkit::Collective::ReduceScatterV,
        Collective::AllToAllV => purlin_testkit::Collective::AllToAllV,
    }
}

impl Case {
    /// The case as the kit states it, with the kit's stress inputs (wrapping integer products,
    /// means that round, copies of arbitrary bytes).
    pub fn kit(&self) -> kit::Case {
        let usz = |v: &[u64]| v.iter().map(|&x| x as usize).collect::<Vec<usize>>();
        let counts = match &self.shape {
            Shape::Uniform(n) => Counts::Uniform(*n as usize),
            Shape::PerRank(v) => Counts::PerRank(usz(v)),
            Shape::PerPair(m) => Counts::PerPair(m.iter().map(|r| usz(r)).collect()),
        };
        let op = self.op.map(kit_op);
        kit::Case::with_counts(kit_collective(self.c), kit_dtype(self.dtype), op, self.world, counts)
            .with_values(Values::Stress)
            .in_place(self.in_place)
    }
}

/// What every rank's output (in place: its whole buffer) must be, from the kit's reference.
pub fn expected(case: &Case, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let kit = case.kit();
    (0..case.world)
        .map(|r| {
            if case.in_place {
                reference::expected_in_place(&kit, inputs, r)
            } else {
                reference::expected(&kit, inputs, r)
            }
        })
        .collect()
}

// ------------------------------------------------------------------ running

fn from_bytes<T: CpuType>(b: &[u8]) -> Vec<T> {
    let n = b.len() / std::mem::size_of::<T>();
    let mut v: Vec<T> = Vec::with_capacity(n);
    // SAFETY: `v` has capacity for n elements = b.len() bytes; every CpuType is valid for
    // any byte pattern (integers, IEEE floats, fp8 codes), so the n elements are initialized.
    unsafe {
        std::ptr::copy_nonoverlapping(b.as_ptr(), v.as_mut_ptr().cast::<u8>(), n * std::mem::size_of::<T>());
        v.set_len(n);
    }
    v
}

fn to_bytes<T: CpuType>(v: &[T]) -> Vec<u8> {
    // SAFETY: CpuTypes are plain data without padding: `size_of_val(v)` initialized bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)).to_vec() }
}

fn usz(v: &[u64]) -> Vec<usize> {
    v.iter().map(|&x| x as usize).collect()
}

/// Rank `r`'s in-place buffer before the call: the input, or for AllGather(V) the output
/// with this rank's contribution already in its partition.
fn in_place_buffer(case: &Case, r: usize, input: &[u8], out: &[u8]) -> Vec<u8> {
    match case.c {
        Collective::AllReduce | Collective::ReduceScatter | Collective::ReduceScatterV => input.to_vec(),
        _ => {
            let es = case.dtype.size() as usize;
            let mut b = out.to_vec();
            let off = match &case.shape {
                Shape::PerRank(c) => c[..r].iter().sum::<u64>() as usize,
                _ => r * (input.len() / es),
            };
            b[off * es..off * es + input.len()].copy_from_slice(input);
            b
        }
    }
}

/// The typed reductions where `T` is a [`ReduceType`] (`None` where it is not: such a call
/// does not compile).
trait MaybeReduce: CpuType {
    fn reduce_out<S, R>(comm: &CpuComm, case: &Case, x: &S, y: &mut R) -> Option<Result<(), Error>>
    where
        S: CpuBuffer<Self> + ?Sized,
        R: CpuBufferMut<Self> + ?Sized;
    fn reduce_in<B: CpuBufferMut<Self> + ?Sized>(comm: &CpuComm, case: &Case, buf: &mut B)
    -> Option<Result<(), Error>>;
}

macro_rules! reduces {
    ($($t:ty),*) => {$(
        impl MaybeReduce for $t {
            fn reduce_out<S, R>(comm: &CpuComm, case: &Case, x: &S, y: &mut R) -> Option<Result<(), Error>>
            where
                S: CpuBuffer<Self> + ?Sized,
                R: CpuBufferMut<Self> + ?Sized,
            {
                let op = case.op.unwrap_or(ReduceOp::Sum);
                Some(match case.c {
                    Collective::AllReduce => comm.all_reduce(x, y, &op),
                    Collective::ReduceScatter => comm.reduce_scatter(x, y, &op),
                    Collective::ReduceScatterV => comm.reduce_scatter_v(x, y, &usz(&case.per_rank()), &op),
                    _ => return None,
                }.map(drop))
            }
            fn reduce_in<B: CpuBufferMut<Self> + ?Sized>(comm: &CpuComm, case: &Case, buf: &mut B)
            -> Option<Result<(), Error>> {
                let op = case.op.unwrap_or(ReduceOp::Sum);
                Some(match case.c {
                    Collective::AllReduce => comm.all_reduce_in_place(buf, &op),
                    Collective::ReduceScatter => comm.reduce_scatter_in_place(buf, &op),
                    _ => return None,
                }.map(drop))
            }
        }
    )*};
}
reduces!(f32, half::f16, half::bf16, i32, u32, F8E4M3, F8E5M2);

macro_rules! never_reduces {
    ($($t:ty),*) => {$(
        impl MaybeReduce for $t {
            fn reduce_out<S, R>(_: &CpuComm, _: &Case, _: &S, _: &mut R) -> Option<Result<(), Error>>
            where
                S: CpuBuffer<Self> + ?Sized,
                R: CpuBufferMut<Self> + ?Sized,
            {
                None
            }
            fn reduce_in<B: CpuBufferMut<Self> + ?Sized>(_: &CpuComm, _: &Case, _: &mut B)
            -> Option<Result<(), Error>> {
                None
            }
        }
    )*};
}
never_reduces!(f64, i8, u8, i64, u64);

fn not_reducible<T>(case: &Case) -> Error {
    Error::Unsupported(format!("{:?} of {}: not a ReduceType", case.c, std::any::type_name::<T>()))
}

/// The out-of-place call of `case` through the typed API, on any kind of buffer.
fn call_out_of_place<S, R, T>(comm: &CpuComm, case: &Case, x: &S, y: &mut R) -> Result<(), Error>
where
    S: CpuBuffer<T> + ?Sized,
    R: CpuBufferMut<T> + ?Sized,
    T: MaybeReduce,
{
    match case.c {
        Collective::AllReduce | Collective::ReduceScatter | Collective::ReduceScatterV => {
            T::reduce_out(comm, case, x, y).unwrap_or_else(|| Err(not_reducible::<T>(case)))
        }
        Collective::AllGather => comm.all_gather(x, y).map(drop),
        Collective::AllToAll => comm.all_to_all(x, y).map(drop),
        Collective::AllGatherV => comm.all_gather_v(x, y, &usz(&case.per_rank())).map(drop),
        Collective::AllToAllV => {
            let m: Vec<Vec<usize>> = case.per_pair().iter().map(|r| usz(r)).collect();
            comm.all_to_all_v(x, y, &m).map(drop)
        }
    }
}

/// The in-place call of `case` through the typed API (`None` for the V forms, which go
/// through the byte API).
fn call_in_place<B, T>(comm: &CpuComm, case: &Case, buf: &mut B) -> Option<Result<(), Error>>
where
    B: CpuBufferMut<T> + ?Sized,
    T: MaybeReduce,
{
    match case.c {
        Collective::AllReduce | Collective::ReduceScatter => {
            Some(T::reduce_in(comm, case, buf).unwrap_or_else(|| Err(not_reducible::<T>(case))))
        }
        Collective::AllGather => Some(comm.all_gather_in_place(buf).map(drop)),
        _ => None,
    }
}

/// Rank `r`'s call through the typed API (V in-place calls through the byte API).
fn call_typed<T: MaybeReduce>(comm: &CpuComm, case: &Case, input: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
    if case.symmetric {
        return call_symmetric::<T>(comm, case, input, out);
    }
    if case.in_place {
        let mut buf: Vec<T> = from_bytes(&in_place_buffer(case, comm.rank(), input, out));
        match call_in_place(comm, case, &mut buf) {
            Some(r) => r?,
            None => {
                let mut b = to_bytes(&buf);
                comm.execute_bytes_in_place(&spec_of(case), &mut b)?;
                buf = from_bytes(&b);
            }
        }
        *out = to_bytes(&buf);
        return Ok(());
    }
    let x: Vec<T> = from_bytes(input);
    let mut y: Vec<T> = from_bytes(out);
    call_out_of_place(comm, case, &x, &mut y)?;
    *out = to_bytes(&y);
    Ok(())
}

/// [`call_typed`] with `CpuSymmetricBuffer`s (allocated per call: a collective call itself,
/// every rank the same size, the largest any rank needs, then cut to this rank's length as
/// `set_len` allows; the V in-place forms use a byte buffer, as the byte API takes).
fn call_symmetric<T: MaybeReduce>(comm: &CpuComm, case: &Case, input: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
    let es = std::mem::size_of::<T>();
    let lens: Vec<(usize, usize)> = (0..case.world).map(|q| case.lens(q)).collect();
    let (in_cap, out_cap) = lens.iter().fold((0, 0), |(a, b), &(i, o)| (a.max(i), b.max(o)));
    if case.in_place {
        let host = in_place_buffer(case, comm.rank(), input, out);
        let cap = in_cap.max(out_cap);
        let mut buf = comm.alloc_symmetric::<T>(cap)?;
        buf.set_len(host.len() / es)?;
        buf.copy_from_host(&from_bytes(&host))?;
        match call_in_place(comm, case, &mut buf) {
            Some(r) => r?,
            None => {
                let mut bytes = comm.alloc_symmetric::<u8>(cap * es)?;
                bytes.set_len(host.len())?;
                bytes.copy_from_host(&host)?;
                comm.execute_bytes_in_place(&spec_of(case), &mut bytes)?;
                *out = bytes.to_vec();
                return Ok(());
            }
        }
        *out = to_bytes(&buf.to_vec());
        return Ok(());
    }
    let mut x = comm.alloc_symmetric::<T>(in_cap)?;
    x.set_len(input.len() / es)?;
    x.copy_from_host(&from_bytes(input))?;
    let mut y = comm.alloc_symmetric::<T>(out_cap)?;
    y.set_len(out.len() / es)?;
    y.copy_from_host(&from_bytes(out))?;
    call_out_of_place(comm, case, &x, &mut y)?;
    *out = to_bytes(&y.to_vec());
    Ok(())
}

fn snac_op(op: ReduceOp) -> purlin_snac::ReduceOp {
    match op {
        ReduceOp::Sum => purlin_snac::ReduceOp::Sum,
        ReduceOp::Prod => purlin_snac::ReduceOp::Prod,
        ReduceOp::Min => purlin_snac::ReduceOp::Min,
        ReduceOp::Max => purlin_snac::ReduceOp::Max,
        ReduceOp::Avg => purlin_snac::ReduceOp::Avg,
    }
}

pub fn spec_of(case: &Case) -> CollectiveSpec {
    let (w, d) = (case.world as u32, case.dtype);
    let op = snac_op(case.op.unwrap_or(ReduceOp::Sum));
    let s = match case.c {
        Collective::AllReduce => CollectiveSpec::all_reduce(w, d, op, case.uni()),
        Collective::AllGather => CollectiveSpec::all_gather(w, d, case.uni()),
        Collective::ReduceScatter => CollectiveSpec::reduce_scatter(w, d, op, case.uni()),
        Collective::AllToAll => CollectiveSpec::all_to_all(w, d, case.uni()),
        Collective::AllGatherV => CollectiveSpec::all_gather_v(w, d, case.per_rank()),
        Collective::ReduceScatterV => CollectiveSpec::reduce_scatter_v(w, d, op, case.per_rank()),
        Collective::AllToAllV => CollectiveSpec::all_to_all_v(w, d, case.per_pair()),
    };
    s.with_mode(case.mode)
}

fn dispatch(comm: &CpuComm, case: &Case, input: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
    match case.dtype {
        DataType::F32 => call_typed::<f32>(comm, case, input, out),
        DataType::F64 => call_typed::<f64>(comm, case, input, out),
        DataType::F16 => call_typed::<half::f16>(comm, case, input, out),
        DataType::Bf16 => call_typed::<half::bf16>(comm, case, input, out),
        DataType::I8 => call_typed::<i8>(comm, case, input, out),
        DataType::U8 => call_typed::<u8>(comm, case, input, out),
        DataType::I32 => call_typed::<i32>(comm, case, input, out),
        DataType::U32 => call_typed::<u32>(comm, case, input, out),
        DataType::I64 => call_typed::<i64>(comm, case, input, out),
        DataType::U64 => call_typed::<u64>(comm, case, input, out),
        DataType::F8E4M3 => call_typed::<F8E4M3>(comm, case, input, out),
        DataType::F8E5M2 => call_typed::<F8E5M2>(comm, case, input, out),
    }
}

/// Runs `case` on every rank of `comms` concurrently and checks every output byte.
pub fn run_case_on(comms: &[CpuComm], case: &Case) -> Result<(), String> {
    assert_eq!(comms.len(), case.world);
    let inputs = case.kit().inputs();
    let want = expected(case, &inputs);
    let es = case.dtype.size() as usize;
    let results: Vec<Result<Vec<u8>, Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(&inputs)
            .map(|(comm, x)| {
                s.spawn(move || {
                    let mut out = vec![POISON; case.lens(comm.rank()).1 * es];
                    dispatch(comm, case, x, &mut out).map(|()| out)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    });
    let dtype = kit_dtype(case.dtype);
    for (r, (got, want)) in results.into_iter().zip(want).enumerate() {
        let got = got.map_err(|e| format!("rank {r}: {e}"))?;
        kit::check(dtype, kit::Compare::Bitwise, &got, &want).map_err(|e| format!("rank {r}: {e}"))?;
    }
    Ok(())
}

/// Runs every case, grouped by communicator (world, setup, mode) — so each group's cases are
/// back-to-back calls on one communicator. Panics listing every failure. Returns the count.
pub fn run_matrix(cases: &[Case]) -> usize {
    let mut groups: BTreeMap<(usize, Setup, bool), Vec<&Case>> = BTreeMap::new();
    for c in cases {
        groups.entry((c.world, c.setup, c.mode == ReductionMode::Fast)).or_default().push(c);
    }
    let mut failures = vec![];
    let mut refused = 0;
    for ((world, setup, fast), group) in groups {
        let mode = if fast { ReductionMode::Fast } else { ReductionMode::Deterministic };
        let comms = comms(world, setup, mode);
        let t0 = std::time::Instant::now();
        for case in group.iter() {
            let t = std::time::Instant::now();
            let r = run_case_on(&comms, case);
            if t.elapsed() > Duration::from_secs(2) {
                println!("  slow case ({:.1?}): {}", t.elapsed(), case.name());
            }
            let latency = matches!(setup, Setup::Latency | Setup::Latency16);
            // A forced latency regime does not fall back: a payload larger than the packet
            // window is a typed error on every rank (before anything ran), not a failure.
            if let Err(e) = &r {
                if latency && e.contains("window of") && e.contains("is too small") {
                    refused += 1;
                    continue;
                }
            }
            if let Err(e) = r {
                failures.push(format!("{}: {e}", case.name()));
                if comms[0].async_error().is_err() {
                    failures.push(format!("world {world} {setup:?} poisoned; skipping its remaining cases"));
                    break;
                }
            }
        }
        println!("world {world} {setup:?} {mode:?}: {} cases in {:.1?}", group.len(), t0.elapsed());
    }
    if refused > 0 {
        println!("{refused} forced-latency cases refused with WindowTooSmall (payload over the packet window)");
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
    cases.len()
}

// ------------------------------------------------------------------ matrices

/// V shapes for world `w` around size `n`: zeros, heavy skew, one-way, all empty.
pub fn v_shapes(c: Collective, w: u64, n: u64) -> Vec<Shape> {
    match c {
        Collective::AllGatherV | Collective::ReduceScatterV => vec![
            Shape::PerRank((0..w).map(|r| if r == 1 { 0 } else { n + r }).collect()),
            Shape::PerRank((0..w).map(|r| if r == 0 { 40 * n + 3 } else { 1 }).collect()),
            Shape::PerRank((0..w).map(|r| if r == w - 1 { n } else { 0 }).collect()),
            Shape::PerRank(vec![0; w as usize]),
        ],
        _ => vec![
            Shape::PerPair(
                (0..w).map(|s| (0..w).map(|d| if s == d || d == 1 { 0 } else { n + s + 2 * d }).collect()).collect(),
            ),
            Shape::PerPair(
                (0..w).map(|s| (0..w).map(|d| if (s, d) == (w - 1, 0) { 40 * n + 3 } else { 1 }).collect()).collect(),
            ),
            Shape::PerPair(one_way(w, n)),
            Shape::PerPair(vec![vec![0; w as usize]; w as usize]),
        ],
    }
}

/// Shapes of collective `c` for world `w`: one per size (non-V); for V collectives the
/// shapes of [`v_shapes`] picked by `v_pick` (indices), for each nonzero size in `v_sizes`.
fn shapes(c: Collective, w: u64, sizes: &[u64], v_sizes: &[u64], v_pick: &[usize]) -> Vec<Shape> {
    if c.is_v() {
        let mut v = vec![];
        for &n in v_sizes.iter().filter(|&&n| n > 0) {
            let all = v_shapes(c, w, n);
            v.extend(v_pick.iter().filter_map(|&i| all.get(i).cloned()));
        }
        v.dedup();
        v
    } else {
        sizes.iter().map(|&n| Shape::Uniform(n)).collect()
    }
}

/// One slice of the matrix: worlds × setups × shapes.
struct Slice<'a> {
    worlds: &'a [usize],
    setups: &'a [Setup],
    sizes: &'a [u64],
    v_sizes: &'a [u64],
    v_pick: &'a [usize],
}

/// Rotates element types, ops, modes and in-place over the cases of a slice, so each appears
/// throughout the matrix.
fn product(sl: Slice<'_>, cases: &mut Vec<Case>) {
    for &w in sl.worlds {
        for c in Collective::ALL {
            for &setup in sl.setups {
                for shape in shapes(c, w as u64, sl.sizes, sl.v_sizes, sl.v_pick) {
                    let k = cases.len();
                    let (dtype, op) = if is_reduce(c) {
                        (REDUCIBLE[k % REDUCIBLE.len()], Some(OPS[(k / REDUCIBLE.len()) % OPS.len()]))
                    } else {
                        (DTYPES[k % DTYPES.len()], None)
                    };
                    let mode = if (k / 3) % 2 == 0 { ReductionMode::Deterministic } else { ReductionMode::Fast };
                    let mut case = Case::new(c, w, dtype, op, mode, shape, setup);
                    let can = !matches!(c, Collective::AllToAll | Collective::AllToAllV);
                    if can && k % 4 == 1 {
                        case = case.in_place();
                    }
                    cases.push(case);
                }
            }
        }
    }
}

const ALL_V: [usize; 4] = [0, 1, 2, 3];

/// The CI matrix (about two minutes in debug on two shared cores): world 2 in every setup,
/// size and V shape; worlds 3–4 in the latency and both throughput setups, every size and V
/// shape; worlds 5–8 in two setups each, every collective — sampled to stay inside the CI
/// budget.
pub fn ci_cases() -> Vec<Case> {
    let mut cases = vec![];
    let all = [Setup::Default, Setup::Latency, Setup::Latency16, Setup::ThroughputPeer, Setup::ThroughputOwn];
    let three = [Setup::Latency, Setup::ThroughputPeer, Setup::ThroughputOwn];
    let s = |worlds, setups, sizes, v_sizes, v_pick| Slice { worlds, setups, sizes, v_sizes, v_pick };
    product(s(&[2], &all, &[0, 1, 3, 301], &[1, 301], &ALL_V), &mut cases);
    product(s(&[3], &three, &[0, 1, 3, 301], &[1, 301], &ALL_V), &mut cases);
    product(s(&[4], &three, &[0, 1, 37], &[37], &ALL_V), &mut cases);
    product(s(&[4], &[Setup::Latency16, Setup::Default], &[5], &[5], &[0]), &mut cases);
    product(s(&[5], &[Setup::Latency, Setup::ThroughputOwn], &[1, 3], &[3], &[0, 2]), &mut cases);
    product(s(&[6], &[Setup::ThroughputPeer, Setup::Latency16], &[1], &[3], &[1]), &mut cases);
    product(s(&[7], &[Setup::ThroughputOwn, Setup::Default], &[1], &[3], &[2]), &mut cases);
    product(s(&[8], &[Setup::Latency, Setup::ThroughputPeer], &[3], &[1], &[3, 2]), &mut cases);
    cases
}

/// The whole product (run with --ignored; `PURLIN_FULL_WORLDS=2,3` for some worlds only).
pub fn full_cases() -> Vec<Case> {
    let mut cases = vec![];
    let all = [Setup::Default, Setup::Latency, Setup::Latency16, Setup::ThroughputPeer, Setup::ThroughputOwn];
    let sizes = [0, 1, 3, 17, 301, 4099];
    // PURLIN_FULL_WORLDS=2,3 runs a part (default: 2..=8).
    let worlds: Vec<usize> = std::env::var("PURLIN_FULL_WORLDS")
        .ok()
        .map(|v| v.split(',').filter_map(|w| w.trim().parse().ok()).collect())
        .unwrap_or_else(|| (2..=8).collect());
    let sl = Slice { worlds: &worlds, setups: &all, sizes: &sizes, v_sizes: &sizes, v_pick: &ALL_V };
    product(sl, &mut cases);
    cases
}
