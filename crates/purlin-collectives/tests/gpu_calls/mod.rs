//! GPU calls described as data, shared by the GPU sequence, fault and conformance tests: any
//! collective, dtype and size, issued on `Comm`s with raw pointers (so they can be captured into
//! CUDA graphs), their buffers, the streams, the sleep kernel, graph capture and replay.
//!
//! Inputs, poison and the reference are `purlin_testkit`'s: small nonzero integers (|x| <= 4,
//! u8 in 1..=8), so every summation order is exact in every dtype and a Sum always changes every
//! element; outputs are poisoned with `purlin_testkit::POISON`; comparisons are exact in value.
//! World 2 only (products of two small integers stay exact in bf16).
//!
//! Buffers are `CudaSlice<u8>` on the rank's stream (the context keeps cudarc's default
//! event tracking); calls take them as [`RawBuf`]s, views that carry a raw device pointer
//! and record no cudarc event, so the same calls can be captured into CUDA graphs.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaGraph, CudaSlice, CudaStream, DevicePtr};
use purlin_collectives::{Comm, CommConfig, Error, ReduceOp};
use purlin_collectives::{NcclType, ReduceType, Status};
use purlin_snac::CollectiveSpec;
use purlin_testkit::{self as kit};
#[allow(unused_imports)]
pub use purlin_testkit::{Rng, fresh_seed};

/// The world these tests run at.
pub const WORLD: usize = 2;

/// `PURLIN_SHARED_GPU=1`: every rank drives GPU 0 ([`CommConfig::shared_gpu`]), so these
/// tests check correctness on a machine with one GPU (their timings mean nothing there).
pub fn shared_gpu() -> bool {
    CommConfig::shared_gpu_from_env().expect("PURLIN_SHARED_GPU")
}

/// The GPU rank `rank` drives: its own, or GPU 0 for every rank under [`shared_gpu`].
pub fn rank_ordinal(rank: usize) -> usize {
    if shared_gpu() { 0 } else { rank }
}

/// Fails (never skips) where the machine lacks the GPUs: these tests run on the GPU round.
pub fn need_two_gpus() {
    assert!(purlin_topo::driver_present(), "needs a CUDA driver");
    let n = purlin_topo::device_count();
    let needed = if shared_gpu() { 1 } else { WORLD };
    assert!(n >= needed, "needs {needed} GPUs, found {n}");
}

/// A stream on GPU `ordinal`, in a context made the ordinary way: cudarc's default event
/// tracking stays on (and `new_stream` puts the context in multi-stream mode, so tracking
/// is active).
pub fn stream(ordinal: usize) -> Arc<CudaStream> {
    let ctx = CudaContext::new(ordinal).expect("CUDA context");
    ctx.new_stream().expect("stream")
}

/// One stream per rank of the test's world.
pub fn streams() -> Vec<Arc<CudaStream>> {
    need_two_gpus();
    (0..WORLD).map(|rank| stream(rank_ordinal(rank))).collect()
}

/// Element types the tests drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dt {
    F32,
    Bf16,
    I32,
    U8,
}

impl Dt {
    pub fn size(self) -> usize {
        match self {
            Dt::F32 | Dt::I32 => 4,
            Dt::Bf16 => 2,
            Dt::U8 => 1,
        }
    }
    pub fn snac(self) -> purlin_snac::DataType {
        match self {
            Dt::F32 => purlin_snac::DataType::F32,
            Dt::Bf16 => purlin_snac::DataType::Bf16,
            Dt::I32 => purlin_snac::DataType::I32,
            Dt::U8 => purlin_snac::DataType::U8,
        }
    }
    pub fn unsigned(self) -> bool {
        self == Dt::U8
    }
    /// The kit's element type.
    pub fn kit(self) -> kit::Dtype {
        match self {
            Dt::F32 => kit::Dtype::F32,
            Dt::Bf16 => kit::Dtype::Bf16,
            Dt::I32 => kit::Dtype::I32,
            Dt::U8 => kit::Dtype::U8,
        }
    }
}

/// The collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    /// AllReduce in place (always Sum: every element changes, so a stale buffer shows).
    AllReduceInPlace,
    AllGather,
    ReduceScatter,
    AllToAll,
    AllGatherV,
    ReduceScatterV,
    AllToAllV,
    /// World-2 `Comm::send_recv`: each rank sends `n` elements to the other and receives its `n`.
    SendRecv,
}

impl Coll {
    /// The kit's name of the collective (in place or not is the case's layout).
    pub fn kit(self) -> kit::Collective {
        match self {
            Coll::AllReduce | Coll::AllReduceInPlace => kit::Collective::AllReduce,
            Coll::AllGather => kit::Collective::AllGather,
            Coll::ReduceScatter => kit::Collective::ReduceScatter,
            Coll::AllToAll => kit::Collective::AllToAll,
            Coll::AllGatherV => kit::Collective::AllGatherV,
            Coll::ReduceScatterV => kit::Collective::ReduceScatterV,
            Coll::AllToAllV => kit::Collective::AllToAllV,
            Coll::SendRecv => kit::Collective::SendRecv,
        }
    }

    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::AllReduceInPlace | Coll::ReduceScatter | Coll::ReduceScatterV)
    }
}

/// One call: collective, element type, reduce operator (reductions), size parameter `n`
/// (elements per rank for AllReduce/AllGather/ReduceScatter outputs, per pair for AllToAll;
/// the V forms' counts are derived from it, skewed, with zeros).
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub coll: Coll,
    pub dt: Dt,
    pub op: ReduceOp,
    pub n: usize,
}

/// A call (shorthand).
pub fn call(coll: Coll, dt: Dt, op: ReduceOp, n: usize) -> Call {
    let op = if coll == Coll::AllReduceInPlace { ReduceOp::Sum } else { op };
    assert!(!(coll.reduces() && dt == Dt::U8), "the Atom does not reduce u8");
    Call { coll, dt, op, n }
}

/// The kit's reduce op.
pub fn kit_op(op: ReduceOp) -> kit::Op {
    match op {
        ReduceOp::Sum => kit::Op::Sum,
        ReduceOp::Prod => kit::Op::Prod,
        ReduceOp::Min => kit::Op::Min,
        ReduceOp::Max => kit::Op::Max,
        ReduceOp::Avg => kit::Op::Avg,
    }
}

impl Call {
    /// Per-pair counts of the V forms: skewed, with zeros (nothing from rank 1 to rank 0:
    /// one-way traffic between them).
    pub fn v_counts(&self) -> Vec<Vec<usize>> {
        let n = self.n;
        (0..WORLD)
            .map(|s| (0..WORLD).map(|d| if s == 1 && d == 0 { 0 } else { (n * (1 + s + 3 * d)) % (n + 1) }).collect())
            .collect()
    }

    /// The AllGatherV / ReduceScatterV partition sizes.
    pub fn per_rank(&self) -> Vec<usize> {
        let c = self.v_counts();
        (0..WORLD).map(|r| c[r][r]).collect()
    }

    /// (input, output) elements of rank `r`.
    pub fn lens(&self, r: usize) -> (usize, usize) {
        let (n, w) = (self.n, WORLD);
        let counts = self.v_counts();
        let per_rank = self.per_rank();
        match self.coll {
            Coll::AllReduce | Coll::AllReduceInPlace => (n, n),
            Coll::AllGather => (n, n * w),
            Coll::ReduceScatter => (n * w, n),
            Coll::AllToAll => (n * w, n * w),
            Coll::AllGatherV => (per_rank[r], per_rank.iter().sum()),
            Coll::ReduceScatterV => (per_rank.iter().sum(), per_rank[r]),
            Coll::AllToAllV => (counts[r].iter().sum(), (0..w).map(|s| counts[s][r]).sum()),
            Coll::SendRecv => (n, n),
        }
    }

    /// The spec the communicator builds for this call (for its plan).
    pub fn spec(&self) -> CollectiveSpec {
        let w = WORLD as u32;
        let t = self.dt.snac();
        let op = purlin_snac::ReduceOp::from(&self.op);
        let u = |v: &[usize]| v.iter().map(|&c| c as u64).collect::<Vec<u64>>();
        match self.coll {
            Coll::AllReduce | Coll::AllReduceInPlace => CollectiveSpec::all_reduce(w, t, op, self.n as u64),
            Coll::AllGather => CollectiveSpec::all_gather(w, t, self.n as u64),
            Coll::ReduceScatter => CollectiveSpec::reduce_scatter(w, t, op, self.n as u64),
            Coll::AllToAll => CollectiveSpec::all_to_all(w, t, self.n as u64),
            Coll::AllGatherV => CollectiveSpec::all_gather_v(w, t, u(&self.per_rank())),
            Coll::ReduceScatterV => CollectiveSpec::reduce_scatter_v(w, t, op, u(&self.per_rank())),
            Coll::AllToAllV => CollectiveSpec::all_to_all_v(w, t, self.v_counts().iter().map(|r| u(r)).collect()),
            // What `send_recv` runs: the AllToAllV of bytes with the two off-diagonal counts.
            Coll::SendRecv => {
                let bytes = (self.n * self.dt.size()) as u64;
                let m = (0..w).map(|p| (0..w).map(|q| if p == q { 0 } else { bytes }).collect()).collect();
                CollectiveSpec::all_to_all_v(w, purlin_snac::DataType::U8, m)
            }
        }
    }

    pub fn in_place(&self) -> bool {
        self.coll == Coll::AllReduceInPlace
    }

    /// This rank's plan for the call, as the communicator derives it.
    pub fn plan(&self, comm: &Comm) -> purlin_snac::Plan {
        comm.plan_for_conformance(self.spec(), self.in_place())
            .unwrap_or_else(|e| panic!("{self:?}: no plan on rank {}: {e}", comm.rank()))
    }

    /// The call as the kit states it (inputs: small nonzero integers, signed but for u8).
    pub fn case(&self) -> kit::Case {
        let c = self.coll.kit();
        let counts = match self.coll {
            Coll::AllGatherV | Coll::ReduceScatterV => kit::Counts::PerRank(self.per_rank()),
            Coll::AllToAllV => kit::Counts::PerPair(self.v_counts()),
            _ => kit::Counts::Uniform(self.n),
        };
        let rule = kit::ValueRule::small(4, !self.dt.unsigned());
        kit::Case::with_counts(c, self.dt.kit(), Some(kit_op(self.op)), WORLD, counts)
            .with_values(kit::Values::Rule(rule))
            .in_place(self.in_place())
    }

    /// Fresh inputs of every rank.
    pub fn inputs(&self, rng: &mut Rng) -> Vec<Vec<i64>> {
        self.values(rng.next())
    }

    /// Rank `r`'s inputs when every process draws them alike: from `(seed, call index,
    /// rank)`, so a process can compute its peers' inputs for the reference.
    pub fn inputs_seeded(&self, seed: u64, index: usize) -> Vec<Vec<i64>> {
        self.values(seed ^ ((index as u64) << 20))
    }

    fn values(&self, seed: u64) -> Vec<Vec<i64>> {
        let case = self.case().seeded(seed);
        (0..WORLD).map(|r| case.input_values(r).expect("rule inputs")).collect()
    }

    /// The expected output bytes of rank `r` (the kit's reference, independent of any plan).
    pub fn expected(&self, inputs: &[Vec<i64>], r: usize) -> Vec<u8> {
        let bytes: Vec<Vec<u8>> = inputs.iter().map(|x| self.encode(x)).collect();
        kit::reference::expected(&self.case(), &bytes, r)
    }

    pub fn encode(&self, values: &[i64]) -> Vec<u8> {
        values.iter().flat_map(|&v| self.dt.kit().bytes(v)).collect()
    }

    pub fn poisoned(&self, elems: usize) -> Vec<u8> {
        kit::poisoned(self.dt.kit(), elems)
    }

    /// Issues the call on `comm` with raw pointers (`send`, `recv`: device addresses of
    /// buffers on the comm's GPU holding the call's lengths; `recv` unused in place).
    pub fn issue(&self, comm: &Comm, send: u64, recv: u64) -> Result<Status, Error> {
        // Reductions take only `ReduceType`s (u8 never reduces: `call` refuses it).
        match (self.coll.reduces(), self.dt) {
            (true, Dt::F32) => self.reduce_typed::<f32>(comm, send, recv),
            (true, Dt::Bf16) => self.reduce_typed::<half::bf16>(comm, send, recv),
            (true, Dt::I32) => self.reduce_typed::<i32>(comm, send, recv),
            (true, Dt::U8) => unreachable!("the Atom does not reduce u8"),
            (false, Dt::F32) => self.move_typed::<f32>(comm, send, recv),
            (false, Dt::Bf16) => self.move_typed::<half::bf16>(comm, send, recv),
            (false, Dt::I32) => self.move_typed::<i32>(comm, send, recv),
            (false, Dt::U8) => self.move_typed::<u8>(comm, send, recv),
        }
    }

    fn reduce_typed<T: ReduceType>(&self, comm: &Comm, send: u64, recv: u64) -> Result<Status, Error> {
        let (ni, no) = self.lens(comm.rank());
        let stream = comm.stream();
        let s = raw::<T>(send, ni, stream.clone());
        let mut d = raw::<T>(recv, no, stream.clone());
        let op = &self.op;
        match self.coll {
            Coll::AllReduce => comm.all_reduce(&s, &mut d, op),
            Coll::AllReduceInPlace => comm.all_reduce_in_place(&mut raw::<T>(send, ni, stream), op),
            Coll::ReduceScatter => comm.reduce_scatter(&s, &mut d, op),
            Coll::ReduceScatterV => comm.reduce_scatter_v(&s, &mut d, &self.per_rank(), op),
            _ => self.move_typed::<T>(comm, send, recv),
        }
    }

    fn move_typed<T: NcclType>(&self, comm: &Comm, send: u64, recv: u64) -> Result<Status, Error> {
        let (ni, no) = self.lens(comm.rank());
        let stream = comm.stream();
        let s = raw::<T>(send, ni, stream.clone());
        let mut d = raw::<T>(recv, no, stream.clone());
        match self.coll {
            Coll::AllGather => comm.all_gather(&s, &mut d),
            Coll::AllToAll => comm.all_to_all(&s, &mut d),
            Coll::AllGatherV => comm.all_gather_v(&s, &mut d, &self.per_rank()),
            Coll::AllToAllV => comm.all_to_all_v(&s, &mut d, &self.v_counts()),
            Coll::SendRecv => {
                let peer = (1 - comm.rank()) as i32;
                comm.send_recv(&s, peer, &mut d, peer)
            }
            Coll::AllReduce | Coll::AllReduceInPlace | Coll::ReduceScatter | Coll::ReduceScatterV => {
                unreachable!("{}: a reduction (Call::issue dispatches it)", self.name())
            }
        }
    }

    /// A short name for messages.
    pub fn name(&self) -> String {
        let op = if self.coll.reduces() { format!(" {:?}", self.op) } else { String::new() };
        format!("{:?} {:?}{op} n={}", self.coll, self.dt, self.n)
    }
}

/// A device buffer seen through its raw address: the library's `RawBuffer`, which records no
/// event, so a call taking it can be captured while the context keeps event tracking on.
pub type RawBuf<T> = purlin_collectives::RawBuffer<T>;

/// The raw buffer of `len` elements at `ptr`, used on `stream`.
pub fn raw<T>(ptr: u64, len: usize, stream: Arc<CudaStream>) -> RawBuf<T> {
    // SAFETY: the tests' buffers are live allocations of this GPU holding `len` elements, kept
    // until every stream that uses them is synchronised; every use is on the one stream that
    // owns the `CudaSlice` they point into.
    unsafe { RawBuf::from_raw(ptr, len, stream) }
}

/// The raw address of a buffer (read outside any capture).
pub fn addr(s: &CudaSlice<u8>) -> u64 {
    let stream = s.stream().clone();
    let (p, _record) = s.device_ptr(&stream);
    p
}

/// One call's buffers on every rank.
#[derive(Debug)]
pub struct Bufs {
    pub call: Call,
    pub send: Vec<CudaSlice<u8>>,
    pub recv: Vec<CudaSlice<u8>>,
    pub send_ptr: Vec<u64>,
    pub recv_ptr: Vec<u64>,
}

impl Bufs {
    /// Allocates the call's buffers on every rank's stream (at least 16 bytes each).
    pub fn new(comms: &[Comm], call: Call) -> Bufs {
        let mut b = Bufs { call, send: vec![], recv: vec![], send_ptr: vec![], recv_ptr: vec![] };
        for c in comms {
            b.push_rank(c);
        }
        b
    }

    /// Allocates only rank `comm.rank()`'s buffers (one process per GPU): index 0 holds them.
    pub fn for_rank(comm: &Comm, call: Call) -> Bufs {
        let mut b = Bufs { call, send: vec![], recv: vec![], send_ptr: vec![], recv_ptr: vec![] };
        b.push_rank(comm);
        b
    }

    fn push_rank(&mut self, c: &Comm) {
        let (ni, no) = self.call.lens(c.rank());
        let s = c.stream();
        let size = self.call.dt.size();
        let send = s.alloc_zeros::<u8>((ni * size).max(16)).expect("alloc send");
        let recv = s.alloc_zeros::<u8>((no * size).max(16)).expect("alloc recv");
        self.send_ptr.push(addr(&send));
        self.recv_ptr.push(addr(&recv));
        self.send.push(send);
        self.recv.push(recv);
    }

    /// Writes `inputs[rank]` into slot `slot`'s send buffer and poisons its receive buffer
    /// (host→device copies on the rank's stream).
    pub fn upload(&mut self, comm: &Comm, slot: usize, inputs: &[Vec<i64>]) {
        let r = comm.rank();
        let s = comm.stream();
        let (_, no) = self.call.lens(r);
        let bytes = self.call.encode(&inputs[r]);
        if !bytes.is_empty() {
            s.memcpy_htod(&bytes, &mut self.send[slot].slice_mut(..bytes.len())).expect("upload input");
        }
        if !self.call.in_place() {
            let p = self.call.poisoned(no.max(1));
            let p = &p[..(no * self.call.dt.size()).max(1).min(p.len())];
            s.memcpy_htod(p, &mut self.recv[slot].slice_mut(..p.len())).expect("poison output");
        }
    }

    /// Issues the call on `comm` with slot `slot`'s buffers.
    pub fn issue(&self, comm: &Comm, slot: usize) -> Result<Status, Error> {
        self.call.issue(comm, self.send_ptr[slot], self.recv_ptr[slot])
    }

    /// Rank `comm.rank()`'s output bytes (waits for the stream).
    pub fn output(&self, comm: &Comm, slot: usize) -> Vec<u8> {
        let (_, no) = self.call.lens(comm.rank());
        let b = if self.call.in_place() { &self.send[slot] } else { &self.recv[slot] };
        let mut all = comm.stream().clone_dtoh(b).expect("download output");
        all.truncate(no * self.call.dt.size());
        all
    }

    /// Compares slot `slot`'s output on `comm`'s rank with the reference; `Err` names the
    /// call, the rank, the number of wrong elements and the first one.
    pub fn check(&self, comm: &Comm, slot: usize, inputs: &[Vec<i64>]) -> Result<(), String> {
        self.call.check_bytes(inputs, comm.rank(), &self.output(comm, slot))
    }
}

impl Call {
    /// Compares rank `r`'s output bytes (exactly the output's length) with the reference,
    /// value by value.
    pub fn check_bytes(&self, inputs: &[Vec<i64>], r: usize, got: &[u8]) -> Result<(), String> {
        let want = self.expected(inputs, r);
        kit::check(self.dt.kit(), kit::Compare::Value, got, &want).map_err(|e| format!("{} rank {r}: {e}", self.name()))
    }
}

/// Spins the calling thread for `d` (a host-side delay without a sleep's granularity).
pub fn spin(d: Duration) {
    let t = std::time::Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// The sleep kernel's source: one thread waits `ns` nanoseconds of the global timer,
/// napping between looks. Self-contained (NVRTC here has no CUDA headers).
pub const SLEEP_CU: &str = r#"
extern "C" __global__ void purlin_test_sleep(unsigned long long ns) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(2000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}
"#;

/// The sleep kernel as a translation unit.
pub fn sleep_unit() -> purlin_atom::TranslationUnit {
    purlin_atom::TranslationUnit {
        name: "purlin_test_sleep".into(),
        source: SLEEP_CU.into(),
        headers: vec![],
        options: vec![],
    }
}

/// The sleep kernel, compiled and loaded by the communicator at set-up.
pub fn sleep_request() -> purlin_collectives::internal::KernelRequest {
    purlin_collectives::internal::KernelRequest {
        unit: sleep_unit(),
        function: "purlin_test_sleep".into(),
        block_size: 32,
        dynamic_smem: 0,
    }
}

/// Enqueues the sleep kernel (loaded at set-up through `CommConfig::kernels`) on `comm`'s
/// stream: the GPU idles `d` before the stream's next work.
pub fn device_sleep(comm: &Comm, d: Duration) {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    let k = comm.diag().kernel("purlin_test_sleep").expect("the sleep kernel was requested at set-up");
    let ns = d.as_nanos() as u64;
    let stream = comm.stream();
    let mut launch = stream.launch_builder(&k.function);
    launch.arg(&ns);
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the kernel's signature is (unsigned long long); it touches no memory and ends
    // after `ns` nanoseconds of the global timer.
    unsafe { launch.launch(one) }.expect("launch the sleep kernel");
}

/// Whether `e` names rank `peer` as the one that failed: a typed peer error naming it, or a
/// poisoned communicator whose reason names it.
pub fn names_peer(e: &Error, peer: usize) -> bool {
    match e {
        // The cause, not the flight recorder's report after it (which names every rank).
        Error::Poisoned(why) => {
            why.split("; flight recorder:").next().is_some_and(|w| w.contains(&format!("rank {peer}")))
        }
        other => other.peer() == Some(peer),
    }
}

/// Whether `e` is one of the typed errors a failed peer may produce.
pub fn is_fault_error(e: &Error) -> bool {
    matches!(e, Error::Poisoned(_) | Error::DeviceTimeout { .. } | Error::Timeout { .. } | Error::PeerLost { .. })
}

/// One replay of every rank's graph with fresh inputs: draws each call's inputs, uploads them
/// (outputs poisoned) outside the graph, launches every graph, and checks every rank's
/// outputs; the check failures, in order.
pub fn replay_with_fresh_inputs(
    comms: &[Comm],
    graphs: &[CudaGraph],
    calls: &[Call],
    bufs: &mut [Bufs],
    rng: &mut Rng,
) -> Vec<String> {
    let inputs: Vec<Vec<Vec<i64>>> = calls.iter().map(|c| c.inputs(rng)).collect();
    for (b, x) in bufs.iter_mut().zip(&inputs) {
        for c in comms {
            b.upload(c, c.rank(), x);
        }
    }
    for g in graphs {
        g.launch().expect("graph replay");
    }
    let mut failures = Vec::new();
    for (b, x) in bufs.iter().zip(&inputs) {
        for c in comms {
            if let Err(e) = b.check(c, c.rank(), x) {
                failures.push(e);
            }
        }
    }
    failures
}

/// Captures every call of `bufs` on `comm`'s stream (raw pointers, nothing tracked).
pub fn capture(comm: &Comm, bufs: &[Bufs]) -> CudaGraph {
    let s = comm.stream();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).expect("begin capture");
    let issued: Vec<_> = bufs.iter().map(|b| b.issue(comm, comm.rank()).map_err(|e| (b.call.name(), e))).collect();
    // Always end the capture, so a failed call leaves the stream usable and reports itself.
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    for r in issued {
        if let Err((name, e)) = r {
            panic!("rank {}: capturing {name}: {e}", comm.rank());
        }
    }
    graph.unwrap_or_else(|e| panic!("rank {}: end capture: {e}", comm.rank())).expect("the capture made a graph")
}

/// The settings every test's communicator starts from: defaults, with [`shared_gpu`].
pub fn base_config() -> CommConfig {
    CommConfig { shared_gpu: shared_gpu(), ..CommConfig::default() }
}
