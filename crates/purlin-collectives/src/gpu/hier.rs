//! [`HierComm`]: a world that spans nodes — Purlin's [`Comm`] inside each node, NCCL between
//! them (docs/multi-node.md). The algorithm is `crate::hier`'s; this file is its GPU adapter.
//!
//! Each rank holds up to three communicators, all on the caller's one stream:
//! - the **node**: a Purlin [`Comm`] over the `local` ranks of its node (`LOCAL_RANK` of
//!   `LOCAL_WORLD_SIZE`);
//! - the **rail**: an NCCL communicator over the ranks with the same local rank, one per node
//!   (`ncclCommSplit` of the world by local rank, keyed by node);
//! - the **world**: an NCCL communicator over every rank, for what the hierarchy does not
//!   compose: AllToAll(V), Broadcast, Reduce and send/recv go there whole.
//!
//! NCCL runs non-blocking (`ncclConfig_t::blocking = 0`): every NCCL call is followed by
//! polling `ncclCommGetAsyncError` until it settles, within the communicator's timeout (the
//! bound of Purlin's device waits, [`CommConfig::device_timeout`]). A failure, or no settling
//! in time, aborts both NCCL communicators (`ncclCommAbort`, which also ends their kernels)
//! and poisons the hierarchical communicator: later calls return [`Error::Poisoned`].
//! [`HierComm::synchronize`] waits for the stream under the same bound, polling NCCL's and
//! Purlin's asynchronous errors, so a peer lost mid-call ends in an error, not a hang.
//!
//! A world of one node is the node's `Comm` alone, NCCL untouched (today's path); a world of
//! one rank is NCCL's alone.

use std::ffi::{CStr, c_void};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop, sys as cu};
use cudarc::nccl::sys::{self, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};

use super::comm::{Comm, CommConfig};
use crate::bootstrap::{Id, TorchEnv};
use crate::call::Call;
use crate::call::types::{DataType, NcclType, ReduceOp, ReduceType, Status};
use crate::error::{Error, driver};
use crate::hier::{Buf, Coll, HierCall, HierShape, HierState, Io, LevelComm, Region, offsets, plan};

/// `NCCL_CONFIG_UNDEF_INT` of nccl.h: "let NCCL decide".
const UNDEF_INT: i32 = i32::MIN;
/// `ncclConfig_t::magic` of nccl.h.
const CONFIG_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_VERSION(2, 30, 0)`: the nccl.h cudarc's `ncclConfig_t` follows.
const BINDINGS_VERSION: u32 = 2 * 10000 + 30 * 100;

/// How many hierarchical communicators this process has made from the torchrun environment:
/// the n-th one of every rank meets on the n-th name.
static ENV_HIER_COMMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Keeps the node ids of `HierComm::from_env` apart from `Comm::from_env`'s.
const ENV_HIER_SALT: u64 = 0x4849_4552_0000_0000;

/// Fails, rather than letting cudarc panic, where libnccl cannot be loaded.
fn nccl_present(rank: usize) -> Result<(), Error> {
    // SAFETY: only tries to load libnccl and reports whether it could.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::Nccl { rank, call: "dlopen", error: "libnccl could not be loaded".into() })
    }
}

/// NCCL's text for a result.
fn nccl_text(r: ncclResult_t) -> String {
    // SAFETY: ncclGetErrorString returns a static C string for any result code.
    let msg = unsafe { CStr::from_ptr(sys::ncclGetErrorString(r)) }.to_string_lossy().into_owned();
    format!("{r:?} ({msg})")
}

fn nccl_dtype(d: DataType) -> ncclDataType_t {
    match d {
        DataType::F32 => ncclDataType_t::ncclFloat32,
        DataType::F64 => ncclDataType_t::ncclFloat64,
        DataType::I8 => ncclDataType_t::ncclInt8,
        DataType::I32 => ncclDataType_t::ncclInt32,
        DataType::I64 => ncclDataType_t::ncclInt64,
        DataType::U8 => ncclDataType_t::ncclUint8,
        DataType::U32 => ncclDataType_t::ncclUint32,
        DataType::U64 => ncclDataType_t::ncclUint64,
        DataType::F16 => ncclDataType_t::ncclFloat16,
        DataType::Bf16 => ncclDataType_t::ncclBfloat16,
        DataType::F8E4M3 => ncclDataType_t::ncclFloat8e4m3,
        DataType::F8E5M2 => ncclDataType_t::ncclFloat8e5m2,
    }
}

fn nccl_op(op: &ReduceOp) -> ncclRedOp_t {
    match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Prod => ncclRedOp_t::ncclProd,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
        ReduceOp::Min => ncclRedOp_t::ncclMin,
        ReduceOp::Avg => ncclRedOp_t::ncclAvg,
    }
}

/// The non-blocking configuration: every field left to NCCL but `blocking`.
fn nonblocking_config() -> sys::ncclConfig_t {
    sys::ncclConfig_t {
        size: size_of::<sys::ncclConfig_t>(),
        magic: CONFIG_MAGIC,
        // The bindings' version, as NCCL_CONFIG_INITIALIZER sets it: an older library copies
        // the prefix it knows (at most its own struct's size) and ignores the rest.
        version: BINDINGS_VERSION,
        blocking: 0,
        cgaClusterSize: UNDEF_INT,
        minCTAs: UNDEF_INT,
        maxCTAs: UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: UNDEF_INT,
        trafficClass: UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: UNDEF_INT,
        CTAPolicy: UNDEF_INT,
        shrinkShare: UNDEF_INT,
        nvlsCTAs: UNDEF_INT,
        nChannelsPerNetPeer: UNDEF_INT,
        nvlinkCentricSched: UNDEF_INT,
        graphUsageMode: UNDEF_INT,
        numRmaCtx: UNDEF_INT,
        maxP2pPeers: UNDEF_INT,
    }
}

/// One non-blocking NCCL communicator, aborted on failure and on drop.
#[derive(Debug)]
struct NcclComm {
    /// Null once aborted. NCCL forbids concurrent calls on a communicator: the lock serialises them.
    comm: Mutex<ncclComm_t>,
    rank: usize,
    size: usize,
    /// This rank's global rank, for errors.
    global: usize,
    timeout: Duration,
    stream: Arc<CudaStream>,
}

// SAFETY: an `ncclComm_t` is a heap object any host thread may use; every use goes through
// the mutex, so no two threads call NCCL on it at once.
unsafe impl Send for NcclComm {}
// SAFETY: as for `Send`: shared use is serialised by the mutex.
unsafe impl Sync for NcclComm {}

impl NcclComm {
    fn fail(&self, call: &'static str, error: String) -> Error {
        Error::Nccl { rank: self.global, call, error }
    }

    /// Polls until NCCL's state on `comm` is no longer `ncclInProgress`, within the timeout.
    fn settle(comm: ncclComm_t, global: usize, timeout: Duration, call: &'static str) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            let mut state = ncclResult_t::ncclSuccess;
            // SAFETY: `comm` is a live communicator (not aborted: callers hold its lock and
            // checked it is not null); writes one result.
            let q = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
            if q != ncclResult_t::ncclSuccess {
                return Err(Error::Nccl { rank: global, call: "ncclCommGetAsyncError", error: nccl_text(q) });
            }
            match state {
                ncclResult_t::ncclSuccess => return Ok(()),
                ncclResult_t::ncclInProgress if start.elapsed() < timeout => std::thread::yield_now(),
                ncclResult_t::ncclInProgress => {
                    return Err(Error::Nccl {
                        rank: global,
                        call,
                        error: format!("still in progress after {timeout:?}"),
                    });
                }
                e => return Err(Error::Nccl { rank: global, call, error: nccl_text(e) }),
            }
        }
    }

    /// Rank `rank` of `size`, from `id`, non-blocking, on `stream`'s GPU.
    fn init(
        stream: &Arc<CudaStream>,
        rank: usize,
        size: usize,
        id: sys::ncclUniqueId,
        global: usize,
        timeout: Duration,
    ) -> Result<NcclComm, Error> {
        stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let mut config = nonblocking_config();
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` and `config` are valid for the call; NCCL copies the config.
        let r = unsafe { sys::ncclCommInitRankConfig(&mut comm, size as i32, id, rank as i32, &mut config) };
        let made = NcclComm { comm: Mutex::new(comm), rank, size, global, timeout, stream: stream.clone() };
        if r != ncclResult_t::ncclSuccess && r != ncclResult_t::ncclInProgress {
            return Err(made.fail("ncclCommInitRankConfig", nccl_text(r)));
        }
        if comm.is_null() {
            return Err(made.fail("ncclCommInitRankConfig", "no communicator was made".into()));
        }
        Self::settle(comm, global, timeout, "ncclCommInitRankConfig")?;
        Ok(made)
    }

    /// `ncclCommSplit`: the ranks of `color`, ordered by `key`.
    fn split(&self, color: usize, key: usize, size: usize) -> Result<NcclComm, Error> {
        let parent = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        if parent.is_null() {
            return Err(self.fail("ncclCommSplit", "the parent communicator was aborted".into()));
        }
        let mut config = nonblocking_config();
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: the parent is live (locked, not null); `comm` and `config` valid for the call.
        let r = unsafe { sys::ncclCommSplit(*parent, color as i32, key as i32, &mut comm, &mut config) };
        // Owned (aborted on drop) before anything can fail.
        let made = NcclComm {
            comm: Mutex::new(comm),
            rank: key,
            size,
            global: self.global,
            timeout: self.timeout,
            stream: self.stream.clone(),
        };
        if r != ncclResult_t::ncclSuccess && r != ncclResult_t::ncclInProgress {
            return Err(self.fail("ncclCommSplit", nccl_text(r)));
        }
        Self::settle(*parent, self.global, self.timeout, "ncclCommSplit")?;
        if comm.is_null() {
            return Err(self.fail("ncclCommSplit", "no communicator was made".into()));
        }
        Self::settle(comm, self.global, self.timeout, "ncclCommSplit")?;
        Ok(made)
    }

    /// Enqueues NCCL calls on this communicator (grouped when more than one) and waits for
    /// them to settle. `calls` gets the live communicator and the stream.
    fn enqueue(
        &self,
        call: &'static str,
        grouped: bool,
        calls: impl FnOnce(ncclComm_t, sys::cudaStream_t) -> ncclResult_t,
    ) -> Result<(), Error> {
        let comm = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        if comm.is_null() {
            return Err(Error::Poisoned(format!("rank {}: its NCCL communicator was aborted", self.global)));
        }
        self.stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let stream = self.stream.cu_stream() as sys::cudaStream_t;
        if grouped {
            // SAFETY: opens a group on this thread; closed below on every path.
            let r = unsafe { sys::ncclGroupStart() };
            if r != ncclResult_t::ncclSuccess {
                return Err(self.fail("ncclGroupStart", nccl_text(r)));
            }
        }
        let r = calls(*comm, stream);
        let end = if grouped {
            // SAFETY: closes the group opened above.
            unsafe { sys::ncclGroupEnd() }
        } else {
            ncclResult_t::ncclSuccess
        };
        for (res, name) in [(r, call), (end, "ncclGroupEnd")] {
            if res != ncclResult_t::ncclSuccess && res != ncclResult_t::ncclInProgress {
                return Err(self.fail(name, nccl_text(res)));
            }
        }
        Self::settle(*comm, self.global, self.timeout, call)
    }

    /// NCCL's asynchronous error, without waiting (`ncclInProgress` is no error).
    fn async_error(&self) -> Result<(), Error> {
        let comm = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        if comm.is_null() {
            return Err(Error::Poisoned(format!("rank {}: its NCCL communicator was aborted", self.global)));
        }
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: live communicator (locked, not null); writes one result.
        let q = unsafe { sys::ncclCommGetAsyncError(*comm, &mut state) };
        match (q, state) {
            (ncclResult_t::ncclSuccess, ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress) => Ok(()),
            (ncclResult_t::ncclSuccess, e) => Err(self.fail("(asynchronous error)", nccl_text(e))),
            (q, _) => Err(self.fail("ncclCommGetAsyncError", nccl_text(q))),
        }
    }

    /// Aborts the communicator (ends its kernels); later uses fail.
    fn abort(&self) {
        let mut comm = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        if !comm.is_null() {
            // SAFETY: our own live communicator, never used again (nulled below).
            let _ = unsafe { sys::ncclCommAbort(*comm) };
            *comm = std::ptr::null_mut();
        }
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // Abort frees the communicator whatever state it is in (destroy could wait forever on
        // a lost peer); the owner waited for the stream, within its timeout, before.
        self.abort();
    }
}

/// A device region as cudarc's buffer traits see it: a raw pointer into memory the call
/// borrows (the user's buffers, held for the call, or the scratch).
struct RawView<'a, T> {
    ptr: cu::CUdeviceptr,
    len: usize,
    stream: &'a Arc<CudaStream>,
    _t: PhantomData<T>,
}

impl<T> DeviceSlice<T> for RawView<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl<T> DevicePtr<T> for RawView<'_, T> {
    fn device_ptr<'b>(&'b self, _stream: &'b CudaStream) -> (cu::CUdeviceptr, SyncOnDrop<'b>) {
        // Everything runs on the one stream the call's buffers were recorded on.
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for RawView<'_, T> {
    fn device_ptr_mut<'b>(&'b mut self, _stream: &'b CudaStream) -> (cu::CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

/// A call's device buffers: base pointers and lengths (elements of `T`).
struct DevMem<'a, T> {
    send: Option<(cu::CUdeviceptr, usize)>,
    recv: (cu::CUdeviceptr, usize),
    scratch: (cu::CUdeviceptr, usize),
    stream: &'a Arc<CudaStream>,
    _t: PhantomData<T>,
}

impl<'a, T> DevMem<'a, T> {
    fn ptr(&self, r: Region) -> Result<cu::CUdeviceptr, Error> {
        let (base, len) = match r.buf {
            Buf::Send => {
                self.send.ok_or_else(|| Error::InvalidArgument("an in-place call's plan reads a send buffer".into()))?
            }
            Buf::Recv => self.recv,
            Buf::Scratch => self.scratch,
        };
        if r.end() > len {
            return Err(Error::InvalidArgument(format!(
                "a step's region {r:?} lies outside its buffer of {len} elements"
            )));
        }
        Ok(base + (r.offset * size_of::<T>()) as u64)
    }

    fn view(&self, r: Region) -> Result<RawView<'a, T>, Error> {
        Ok(RawView { ptr: self.ptr(r)?, len: r.len, stream: self.stream, _t: PhantomData })
    }
}

impl<T: NcclType> LevelComm<DevMem<'_, T>> for Comm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.world
    }

    fn run(&self, mem: &mut DevMem<'_, T>, coll: &Coll, io: &Io) -> Result<(), Error> {
        match *io {
            Io::Separate { send, recv } => {
                let (s, mut r) = (mem.view(send)?, mem.view(recv)?);
                match coll {
                    // Reductions pick their type at run time here (`call_any`: Unsupported
                    // where the Atom cannot reduce it).
                    Coll::AllReduce(op) => self.call_any(Call::AllReduce { len: s.len(), op: *op }, &s, &mut r),
                    Coll::ReduceScatter(op) => self.call_any(Call::ReduceScatter { len: r.len(), op: *op }, &s, &mut r),
                    Coll::ReduceScatterV(counts, op) => {
                        let counts = crate::call::counts_u64(counts);
                        self.call_any(Call::ReduceScatterV { counts, op: *op }, &s, &mut r)
                    }
                    Coll::AllGather => self.all_gather(&s, &mut r),
                    Coll::AllGatherV(counts) => self.all_gather_v(&s, &mut r, counts),
                }
            }
            Io::InPlace(region) => {
                let mut b = mem.view(region)?;
                match coll {
                    Coll::AllReduce(op) => self.call_any_in_place(Call::AllReduce { len: b.len(), op: *op }, &mut b),
                    Coll::ReduceScatter(op) => {
                        self.call_any_in_place(Call::ReduceScatterInPlace { len: b.len(), op: *op }, &mut b)
                    }
                    Coll::AllGather => self.all_gather_in_place(&mut b),
                    Coll::AllGatherV(_) | Coll::ReduceScatterV(..) => {
                        Err(Error::Unsupported("an in-place V step on the node level".into()))
                    }
                }
            }
        }
        .map(drop)
    }
}

impl<T: NcclType> LevelComm<DevMem<'_, T>> for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn run(&self, mem: &mut DevMem<'_, T>, coll: &Coll, io: &Io) -> Result<(), Error> {
        let dt = nccl_dtype(T::data_type());
        let es = size_of::<T>() as u64;
        let (src, dst, len) = match *io {
            Io::Separate { send, recv } => (mem.ptr(send)?, mem.ptr(recv)?, send.len),
            Io::InPlace(r) => (mem.ptr(r)?, mem.ptr(r)?, r.len),
        };
        let (me, n) = (self.rank, self.size);
        let p = |x: u64| x as *mut c_void;
        // Every pointer below lies within the call's buffers, which the call holds until it
        // returns; counts are the plan's, checked against the buffers' lengths by `DevMem::ptr`.
        match coll {
            Coll::AllReduce(op) => self.enqueue("ncclAllReduce", false, |c, s| {
                // SAFETY: within the call's buffers (checked by `DevMem::ptr`), held for the call.
                unsafe { sys::ncclAllReduce(p(src), p(dst), len, dt, nccl_op(op), c, s) }
            }),
            Coll::ReduceScatter(op) => {
                // In place: the result at this rank's part (NCCL's convention).
                let (out, count) = match io {
                    Io::InPlace(_) => (dst + (me * (len / n)) as u64 * es, len / n),
                    Io::Separate { recv, .. } => (dst, recv.len),
                };
                self.enqueue("ncclReduceScatter", false, |c, s| {
                    // SAFETY: within the call's buffers (checked by `DevMem::ptr`), held for the call.
                    unsafe { sys::ncclReduceScatter(p(src), p(out), count, dt, nccl_op(op), c, s) }
                })
            }
            Coll::AllGather => {
                let (input, count) = match io {
                    Io::InPlace(_) => (src + (me * (len / n)) as u64 * es, len / n),
                    Io::Separate { .. } => (src, len),
                };
                self.enqueue("ncclAllGather", false, |c, s| {
                    // SAFETY: within the call's buffers (checked by `DevMem::ptr`), held for the call.
                    unsafe { sys::ncclAllGather(p(input), p(dst), count, dt, c, s) }
                })
            }
            Coll::AllGatherV(counts) => {
                // Each part broadcast from its owner, in place at its offset (torch's uneven
                // all_gather); out of place, this rank's part is the send region.
                let at = offsets(counts);
                let separate = matches!(io, Io::Separate { .. });
                self.enqueue("ncclBroadcast (AllGatherV)", true, |c, s| {
                    for (root, &count) in counts.iter().enumerate().filter(|(_, c)| **c > 0) {
                        let to = dst + at[root] as u64 * es;
                        let from = if separate && root == me { src } else { to };
                        // SAFETY: within the call's buffers (checked by `DevMem::ptr`), held for the call.
                        let r = unsafe { sys::ncclBroadcast(p(from), p(to), count, dt, root as i32, c, s) };
                        if r != ncclResult_t::ncclSuccess && r != ncclResult_t::ncclInProgress {
                            return r;
                        }
                    }
                    ncclResult_t::ncclSuccess
                })
            }
            Coll::ReduceScatterV(counts, op) => {
                // One Reduce per part, to its owner (as torch does for uneven splits).
                let Io::Separate { .. } = io else {
                    return Err(Error::Unsupported("an in-place ReduceScatterV step on the rail".into()));
                };
                let at = offsets(counts);
                self.enqueue("ncclReduce (ReduceScatterV)", true, |c, s| {
                    for (root, &count) in counts.iter().enumerate().filter(|(_, c)| **c > 0) {
                        let from = src + at[root] as u64 * es;
                        let to = if root == me { dst } else { from };
                        // SAFETY: within the call's buffers (checked by `DevMem::ptr`), held for the call.
                        let r = unsafe { sys::ncclReduce(p(from), p(to), count, dt, nccl_op(op), root as i32, c, s) };
                        if r != ncclResult_t::ncclSuccess && r != ncclResult_t::ncclInProgress {
                            return r;
                        }
                    }
                    ncclResult_t::ncclSuccess
                })
            }
        }
    }
}

/// One rank of a world that spans nodes: Purlin inside the node, NCCL between nodes (see the
/// module docs and docs/multi-node.md).
///
/// AllReduce, ReduceScatter, AllGather and their V forms are hierarchical; AllToAll(V),
/// Broadcast, Reduce and send/recv are delegated whole to NCCL on the world communicator
/// (on one node: to the node's `Comm`). Every call enqueues on [`HierComm::stream`] and
/// returns; [`HierComm::synchronize`] waits with a bound.
#[derive(Debug)]
pub struct HierComm {
    state: HierState,
    stream: Arc<CudaStream>,
    node: Option<Comm>,
    rail: Option<NcclComm>,
    world: Option<NcclComm>,
    timeout: Duration,
    /// Grown as calls need; reused in stream order.
    scratch: Mutex<Option<CudaSlice<u8>>>,
}

impl HierComm {
    /// Global rank `rank` of `nodes × local` ranks (`rank = node × local + local_rank`), on
    /// `stream`. Every rank passes the Purlin [`Id`] that global rank 0 made with [`Id::new`]
    /// (each node meets on its own id derived from it) and the NCCL unique id global rank 0
    /// made with `cudarc::nccl::Id::new()`, both passed out of band. Returns once every level
    /// is set up.
    pub fn from_rank(
        stream: Arc<CudaStream>,
        rank: usize,
        nodes: usize,
        local: usize,
        purlin_id: Id,
        nccl_id: cudarc::nccl::Id,
    ) -> Result<HierComm, Error> {
        Self::from_rank_with_config(stream, rank, nodes, local, purlin_id, nccl_id, CommConfig::from_env()?)
    }

    /// [`HierComm::from_rank`] with explicit settings for the node's `Comm` (its
    /// `device_timeout` also bounds every NCCL wait).
    pub fn from_rank_with_config(
        stream: Arc<CudaStream>,
        rank: usize,
        nodes: usize,
        local: usize,
        purlin_id: Id,
        nccl_id: cudarc::nccl::Id,
        config: CommConfig,
    ) -> Result<HierComm, Error> {
        purlin_id.check()?;
        let shape = HierShape::new(nodes, local, rank)?;
        let id = sys::ncclUniqueId { internal: *nccl_id.internal() };
        Self::assemble(stream, shape, Some(purlin_id.derive(shape.node as u64)), Some(id), config)
    }

    /// Under torchrun, across nodes: rank `RANK` of `WORLD_SIZE`, `LOCAL_WORLD_SIZE` ranks per
    /// node, on GPU `LOCAL_RANK`, on a new stream. Each node's ranks meet as
    /// [`Comm::from_env`]'s do (a name derived from the torchrun variables and the node); the
    /// NCCL communicators meet at `NCCL_COMM_ID` (`host:port` that global rank 0's host can
    /// listen on, the same on every rank: NCCL's own variable; Purlin never binds
    /// `MASTER_PORT`). A world of one node needs no `NCCL_COMM_ID`: it is [`Comm::from_env`].
    pub fn from_env() -> Result<HierComm, Error> {
        Self::from_env_with_stream(super::comm::torchrun_stream()?, CommConfig::from_env()?)
    }

    /// [`HierComm::from_env`] on a given stream and with explicit settings.
    pub fn from_env_with_stream(stream: Arc<CudaStream>, config: CommConfig) -> Result<HierComm, Error> {
        let env = TorchEnv::from_process()?;
        let shape = torchrun_shape(&env)?;
        if shape.nodes == 1 && shape.local > 1 {
            let node = Comm::from_env_with_stream(stream.clone(), config.clone())?;
            return Self::finish(stream, shape, Some(node), None, config.device_timeout);
        }
        // A world of one rank makes its NCCL id itself; a wider one meets at NCCL_COMM_ID.
        if shape.world() > 1 {
            let problem = match std::env::var("NCCL_COMM_ID") {
                Ok(v) if !v.trim().is_empty() => None,
                Ok(_) => Some("empty".to_string()),
                Err(_) => Some(
                    "not set: across nodes, NCCL's communicators meet at NCCL_COMM_ID=<host of global rank 0>:<free \
                     port>, the same on every rank (or use HierComm::from_rank with ids passed out of band)"
                        .into(),
                ),
            };
            if let Some(problem) = problem {
                return Err(Error::Env { var: "NCCL_COMM_ID", problem });
            }
        }
        // With NCCL_COMM_ID set, every rank's unique id is the same address and global rank 0
        // creates the bootstrap root there.
        nccl_present(shape.rank())?;
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        // SAFETY: writes one ncclUniqueId.
        let r = unsafe { sys::ncclGetUniqueId(&mut id) };
        if r != ncclResult_t::ncclSuccess {
            return Err(Error::Nccl { rank: shape.rank(), call: "ncclGetUniqueId", error: nccl_text(r) });
        }
        let seq = ENV_HIER_COMMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let purlin_id = env.id(seq).derive(ENV_HIER_SALT + shape.node as u64);
        Self::assemble(stream, shape, Some(purlin_id), Some(id), config)
    }

    /// Sets up every level: the node's `Comm` (more than one rank per node), then the NCCL
    /// world and its rail split (more than one node).
    fn assemble(
        stream: Arc<CudaStream>,
        shape: HierShape,
        node_id: Option<Id>,
        nccl_id: Option<sys::ncclUniqueId>,
        config: CommConfig,
    ) -> Result<HierComm, Error> {
        let timeout = config.device_timeout;
        let node = match (shape.local > 1, node_id) {
            (true, Some(id)) => {
                Some(Comm::from_rank_with_config(stream.clone(), shape.local_rank, shape.local, id, config.clone())?)
            }
            _ => None,
        };
        // NCCL wherever the node level does not span the world: across nodes, and for a world
        // of one rank (every call a copy, through NCCL).
        let (rail, world) = match (shape.nodes > 1 || shape.local == 1, nccl_id) {
            (true, Some(id)) => {
                nccl_present(shape.rank())?;
                let world = NcclComm::init(&stream, shape.rank(), shape.world(), id, shape.rank(), timeout)?;
                let rail =
                    if shape.local > 1 { Some(world.split(shape.local_rank, shape.node, shape.nodes)?) } else { None };
                (rail, Some(world))
            }
            _ => (None, None),
        };
        let mut made = Self::finish(stream, shape, node, world, timeout)?;
        made.rail = rail;
        Ok(made)
    }

    fn finish(
        stream: Arc<CudaStream>,
        shape: HierShape,
        node: Option<Comm>,
        world: Option<NcclComm>,
        timeout: Duration,
    ) -> Result<HierComm, Error> {
        Ok(HierComm {
            state: HierState::new(shape),
            stream,
            node,
            rail: None,
            world,
            timeout,
            scratch: Mutex::new(None),
        })
    }

    /// The stream every level's calls run on.
    pub fn stream(&self) -> Arc<CudaStream> {
        self.stream.clone()
    }

    /// This rank (global).
    pub fn rank(&self) -> usize {
        self.state.shape().rank()
    }

    /// Ranks in the world.
    pub fn world_size(&self) -> usize {
        self.state.shape().world()
    }

    /// Where this rank sits: nodes, ranks per node, its node and local rank.
    pub fn shape(&self) -> HierShape {
        *self.state.shape()
    }

    /// The node's Purlin communicator (`None` with one rank per node).
    pub fn node(&self) -> Option<&Comm> {
        self.node.as_ref()
    }

    /// Aborts the NCCL communicators and poisons this one, keeping the first reason.
    fn fail(&self, e: &Error) {
        self.state.poison(format!("rank {}: {e}", self.rank()));
        for c in [&self.rail, &self.world].into_iter().flatten() {
            c.abort();
        }
    }

    /// A failure of any level, without waiting: this communicator's poison, the node's
    /// [`Comm::async_error`], NCCL's asynchronous errors. An NCCL error aborts NCCL and
    /// poisons this communicator.
    pub fn async_error(&self) -> Result<(), Error> {
        self.state.check()?;
        let result = (|| {
            if let Some(node) = &self.node {
                node.async_error().map_err(|e| self.state.globalize(crate::hier::Level::Node, e))?;
            }
            for c in [&self.rail, &self.world].into_iter().flatten() {
                c.async_error()?;
            }
            Ok(())
        })();
        if let Err(e) = &result {
            self.fail(e);
        }
        result
    }

    /// Waits for every call enqueued so far, at most the communicator's timeout
    /// ([`CommConfig::device_timeout`]), polling every level's asynchronous error meanwhile.
    /// A failure or the timeout aborts NCCL and poisons this communicator.
    pub fn synchronize(&self) -> Result<(), Error> {
        let start = Instant::now();
        self.stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        loop {
            self.async_error()?;
            // SAFETY: queries our own live stream.
            match unsafe { cu::cuStreamQuery(self.stream.cu_stream()) } {
                cu::CUresult::CUDA_SUCCESS => return self.async_error(),
                cu::CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < self.timeout => {
                    std::thread::sleep(Duration::from_micros(50));
                }
                cu::CUresult::CUDA_ERROR_NOT_READY => {
                    let e = Error::Nccl {
                        rank: self.rank(),
                        call: "synchronize",
                        error: format!("the stream did not finish within {:?}; NCCL aborted", self.timeout),
                    };
                    self.fail(&e);
                    return Err(e);
                }
                other => {
                    let e = Error::Driver { call: "cuStreamQuery", error: cudarc::driver::DriverError(other) };
                    self.fail(&e);
                    return Err(e);
                }
            }
        }
    }

    /// Runs the hierarchical call on raw buffers.
    fn hier<T: NcclType>(
        &self,
        call: HierCall,
        send: Option<(cu::CUdeviceptr, usize)>,
        recv: (cu::CUdeviceptr, usize),
    ) -> Result<Status, Error> {
        self.state.check()?;
        let plan = plan(self.state.shape(), &call, send.map(|s| s.1), recv.1)?;
        let scratch_bytes = plan.scratch * size_of::<T>();
        let mut held = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if scratch_bytes > 0 && held.as_ref().is_none_or(|s| s.len() < scratch_bytes) {
            *held = Some(self.stream.alloc_zeros::<u8>(scratch_bytes).map_err(driver("cuMemAllocAsync"))?);
        }
        let scratch = match held.as_ref() {
            Some(s) if scratch_bytes > 0 => {
                let (ptr, _record) = s.device_ptr(&self.stream);
                (ptr, plan.scratch)
            }
            _ => (0, 0),
        };
        let mut mem = DevMem::<T> { send, recv, scratch, stream: &self.stream, _t: PhantomData };
        let node = self.node.as_ref().map(|c| c as &dyn LevelComm<DevMem<'_, T>>);
        let rail = self.rail_or_world().map(|c| c as &dyn LevelComm<DevMem<'_, T>>);
        let result = self.state.execute(&plan, node, rail, &mut mem);
        if let Err(e) = &result {
            if self.state.check().is_err() {
                self.fail(e);
            }
        }
        result.map(|()| Status::Success)
    }

    /// The rail: its own split, or the world itself with one rank per node.
    fn rail_or_world(&self) -> Option<&NcclComm> {
        self.rail.as_ref().or(if self.state.shape().local == 1 { self.world.as_ref() } else { None })
    }

    /// A call delegated whole: to NCCL's world communicator, or on one node to the node's `Comm`.
    fn delegate(
        &self,
        on_node: impl FnOnce(&Comm) -> Result<Status, Error>,
        on_world: impl FnOnce(&NcclComm) -> Result<(), Error>,
    ) -> Result<Status, Error> {
        self.state.check()?;
        let result = match (&self.world, &self.node) {
            (Some(w), _) => on_world(w).map(|()| Status::Success),
            (None, Some(n)) => on_node(n),
            (None, None) => Err(Error::InvalidArgument("a world of one rank".into())),
        };
        if let Err(e) = &result {
            if matches!(e, Error::Nccl { .. } | Error::Poisoned(_) | Error::Mismatch { .. }) || e.is_peer_failure() {
                self.fail(e);
            }
        }
        result
    }

    /// A call on `send` and `recv` (device pointers of this GPU, ordered on this stream).
    fn separate<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        call: HierCall,
        send: &S,
        recv: &mut R,
    ) -> Result<Status, Error> {
        let (s, _rs) = send.device_ptr(&self.stream);
        let n = recv.len();
        let (r, _rr) = recv.device_ptr_mut(&self.stream);
        self.hier::<T>(call, Some((s, send.len())), (r, n))
    }

    /// A call in place on `buf`.
    fn in_place<R: DevicePtrMut<T>, T: NcclType>(&self, call: HierCall, buf: &mut R) -> Result<Status, Error> {
        let n = buf.len();
        let (b, _rb) = buf.device_ptr_mut(&self.stream);
        self.hier::<T>(call, None, (b, n))
    }

    /// AllReduce over the world: node ReduceScatter → rail AllReduce of the `1/local` shard →
    /// node AllGather (the V forms through a scratch shard where `local` does not divide the
    /// count). Results as NCCL's flat `ncclAllReduce`.
    pub fn all_reduce<S: DevicePtr<T>, R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        send: &S,
        recv: &mut R,
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.separate(HierCall::AllReduce(*op), send, recv)
    }

    /// In-place AllReduce.
    pub fn all_reduce_in_place<R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        buf: &mut R,
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.in_place(HierCall::AllReduce(*op), buf)
    }

    /// ReduceScatter over the world: rail ReduceScatter of this node's block, then node
    /// ReduceScatter; `send` holds `world × recv.len()` elements, rank `g` gets part `g`.
    pub fn reduce_scatter<S: DevicePtr<T>, R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        send: &S,
        recv: &mut R,
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.separate(HierCall::ReduceScatter(*op), send, recv)
    }

    /// In-place ReduceScatter (NCCL's convention: the result at part `rank`).
    pub fn reduce_scatter_in_place<R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        buf: &mut R,
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.in_place(HierCall::ReduceScatter(*op), buf)
    }

    /// AllGather over the world: node AllGather into this node's block, then rail AllGather
    /// in place; rank `g`'s `send` lands at `g × send.len()`.
    pub fn all_gather<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<Status, Error> {
        self.separate(HierCall::AllGather, send, recv)
    }

    /// In-place AllGather (this rank's part already at part `rank`).
    pub fn all_gather_in_place<R: DevicePtrMut<T>, T: NcclType>(&self, buf: &mut R) -> Result<Status, Error> {
        self.in_place(HierCall::AllGather, buf)
    }

    /// AllGatherV: global rank `g` contributes `counts[g]` elements, concatenated in rank order.
    pub fn all_gather_v<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[usize],
    ) -> Result<Status, Error> {
        self.separate(HierCall::AllGatherV(counts.to_vec()), send, recv)
    }

    /// ReduceScatterV: global rank `g` receives `counts[g]` reduced elements.
    pub fn reduce_scatter_v<S: DevicePtr<T>, R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[usize],
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.separate(HierCall::ReduceScatterV(counts.to_vec(), *op), send, recv)
    }

    /// AllToAll, delegated whole to NCCL's world communicator (grouped send/recv, one pair per
    /// peer): `send` and `recv` hold `world` equal parts.
    pub fn all_to_all<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<Status, Error> {
        let w = self.world_size();
        if send.len() != recv.len() || send.len() % w != 0 {
            return Err(Error::InvalidArgument(format!(
                "all_to_all: send {} and receive {} elements are not {w} equal parts each",
                send.len(),
                recv.len()
            )));
        }
        let c = send.len() / w;
        let counts: Vec<Vec<usize>> = vec![vec![c; w]; w];
        self.all_to_all_v(send, recv, &counts)
    }

    /// AllToAllV with the whole matrix (`counts[src][dst]`, as [`Comm::all_to_all_v`]),
    /// delegated whole to NCCL's world communicator.
    pub fn all_to_all_v<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[Vec<usize>],
    ) -> Result<Status, Error> {
        let (w, me) = (self.world_size(), self.rank());
        if counts.len() != w || counts.iter().any(|row| row.len() != w) {
            return Err(Error::InvalidArgument(format!("all_to_all_v: the count matrix is not {w} × {w}")));
        }
        let sends: usize = counts[me].iter().sum();
        let recvs: usize = counts.iter().map(|row| row[me]).sum();
        if send.len() != sends || recv.len() != recvs {
            return Err(Error::InvalidArgument(format!(
                "all_to_all_v: send {} and receive {} elements; the matrix says {sends} and {recvs}",
                send.len(),
                recv.len()
            )));
        }
        let (s, _rs) = send.device_ptr(&self.stream);
        let (r, _rr) = recv.device_ptr_mut(&self.stream);
        let es = size_of::<T>() as u64;
        let dt = nccl_dtype(T::data_type());
        let p = |x: u64| x as *mut c_void;
        self.delegate(
            |node| {
                let sv = RawView::<T> { ptr: s, len: sends, stream: &self.stream, _t: PhantomData };
                let mut rv = RawView::<T> { ptr: r, len: recvs, stream: &self.stream, _t: PhantomData };
                node.all_to_all_v(&sv, &mut rv, counts)
            },
            |world| {
                world.enqueue("ncclSend/ncclRecv (AllToAllV)", true, |c, st| {
                    let (mut so, mut ro) = (0u64, 0u64);
                    for (peer, row) in counts.iter().enumerate() {
                        let (sc, rc) = (counts[me][peer], row[me]);
                        let rs = if sc > 0 {
                            // SAFETY: within this call's send buffer (its length checked above
                            // against the matrix), held for the call.
                            unsafe { sys::ncclSend(p(s + so * es), sc, dt, peer as i32, c, st) }
                        } else {
                            ncclResult_t::ncclSuccess
                        };
                        let rr = if rc > 0 {
                            // SAFETY: within this call's receive buffer, as above.
                            unsafe { sys::ncclRecv(p(r + ro * es), rc, dt, peer as i32, c, st) }
                        } else {
                            ncclResult_t::ncclSuccess
                        };
                        for x in [rs, rr] {
                            if x != ncclResult_t::ncclSuccess && x != ncclResult_t::ncclInProgress {
                                return x;
                            }
                        }
                        so += sc as u64;
                        ro += rc as u64;
                    }
                    ncclResult_t::ncclSuccess
                })
            },
        )
    }

    /// Broadcast from global rank `root` (its `send`; `None` elsewhere), delegated whole to
    /// NCCL's world communicator.
    pub fn broadcast<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        root: i32,
    ) -> Result<Status, Error> {
        let root_rank = crate::call::rank_of(root, self.world_size(), "broadcast")?;
        let n = recv.len();
        let s_ptr = match send {
            Some(s) if s.len() != n => {
                return Err(Error::InvalidArgument(format!("broadcast: send {} and receive {n} elements", s.len())));
            }
            Some(s) => Some(s.device_ptr(&self.stream)),
            None if root_rank == self.rank() => {
                return Err(Error::InvalidArgument("broadcast: the root passes its send buffer".into()));
            }
            None => None,
        };
        let (r, _rr) = recv.device_ptr_mut(&self.stream);
        let s = s_ptr.as_ref().map_or(r, |(p, _)| *p);
        self.delegate(
            |node| {
                let sv = RawView::<T> { ptr: s, len: n, stream: &self.stream, _t: PhantomData };
                let mut rv = RawView::<T> { ptr: r, len: n, stream: &self.stream, _t: PhantomData };
                node.broadcast(s_ptr.as_ref().map(|_| &sv), &mut rv, root)
            },
            |world| {
                let dt = nccl_dtype(T::data_type());
                world.enqueue("ncclBroadcast", false, |c, st| {
                    // SAFETY: both buffers hold `n` elements and are held for the call.
                    unsafe { sys::ncclBroadcast(s as *const c_void, r as *mut c_void, n, dt, root, c, st) }
                })
            },
        )
    }

    /// In-place Broadcast, delegated whole to NCCL's world communicator.
    pub fn broadcast_in_place<R: DevicePtrMut<T>, T: NcclType>(&self, buf: &mut R, root: i32) -> Result<Status, Error> {
        crate::call::rank_of(root, self.world_size(), "broadcast_in_place")?;
        let n = buf.len();
        let (b, _rb) = buf.device_ptr_mut(&self.stream);
        self.delegate(
            |node| {
                node.broadcast_in_place(
                    &mut RawView::<T> { ptr: b, len: n, stream: &self.stream, _t: PhantomData },
                    root,
                )
            },
            |world| {
                let dt = nccl_dtype(T::data_type());
                world.enqueue("ncclBroadcast", false, |c, st| {
                    // SAFETY: in place on a buffer of `n` elements, held for the call.
                    unsafe { sys::ncclBroadcast(b as *const c_void, b as *mut c_void, n, dt, root, c, st) }
                })
            },
        )
    }

    /// Reduce to global rank `root` (its `recv`; `None` elsewhere), delegated whole to NCCL's
    /// world communicator.
    pub fn reduce<S: DevicePtr<T>, R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        send: &S,
        recv: Option<&mut R>,
        op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        let root_rank = crate::call::rank_of(root, self.world_size(), "reduce")?;
        let n = send.len();
        let (s, _rs) = send.device_ptr(&self.stream);
        let r_ptr = match recv {
            Some(r) if r.len() != n => {
                return Err(Error::InvalidArgument(format!("reduce: send {n} and receive {} elements", r.len())));
            }
            Some(r) => Some(r.device_ptr_mut(&self.stream)),
            None if root_rank == self.rank() => {
                return Err(Error::InvalidArgument("reduce: the root passes its receive buffer".into()));
            }
            None => None,
        };
        let r = r_ptr.as_ref().map_or(s, |(p, _)| *p);
        let has_recv = r_ptr.is_some();
        self.delegate(
            |node| {
                let sv = RawView::<T> { ptr: s, len: n, stream: &self.stream, _t: PhantomData };
                let mut rv = RawView::<T> { ptr: r, len: n, stream: &self.stream, _t: PhantomData };
                node.reduce(&sv, has_recv.then_some(&mut rv), op, root)
            },
            |world| {
                let dt = nccl_dtype(T::data_type());
                world.enqueue("ncclReduce", false, |c, st| {
                    // SAFETY: `n` elements each, held for the call; `r` is read only on the root.
                    unsafe { sys::ncclReduce(s as *const c_void, r as *mut c_void, n, dt, nccl_op(op), root, c, st) }
                })
            },
        )
    }

    /// In-place Reduce, delegated whole to NCCL's world communicator.
    pub fn reduce_in_place<R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        buf: &mut R,
        op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        crate::call::rank_of(root, self.world_size(), "reduce_in_place")?;
        let n = buf.len();
        let (b, _rb) = buf.device_ptr_mut(&self.stream);
        self.delegate(
            |node| {
                node.reduce_in_place(
                    &mut RawView::<T> { ptr: b, len: n, stream: &self.stream, _t: PhantomData },
                    op,
                    root,
                )
            },
            |world| {
                let dt = nccl_dtype(T::data_type());
                world.enqueue("ncclReduce", false, |c, st| {
                    // SAFETY: in place on `n` elements, held for the call.
                    unsafe { sys::ncclReduce(b as *const c_void, b as *mut c_void, n, dt, nccl_op(op), root, c, st) }
                })
            },
        )
    }

    /// Sends to global rank `peer`, delegated to NCCL's world communicator (on one node: the
    /// node's `Comm`, world 2 only).
    pub fn send<S: DevicePtr<T>, T: NcclType>(&self, send: &S, peer: i32) -> Result<(), Error> {
        crate::call::rank_of(peer, self.world_size(), "send")?;
        let n = send.len();
        let (s, _rs) = send.device_ptr(&self.stream);
        self.delegate(
            |node| {
                node.send(&RawView::<T> { ptr: s, len: n, stream: &self.stream, _t: PhantomData }, peer)
                    .map(|()| Status::Success)
            },
            |world| {
                let dt = nccl_dtype(T::data_type());
                world.enqueue("ncclSend", false, |c, st| {
                    // SAFETY: `n` elements, held for the call.
                    unsafe { sys::ncclSend(s as *const c_void, n, dt, peer, c, st) }
                })
            },
        )
        .map(drop)
    }

    /// Receives from global rank `peer`, delegated as [`HierComm::send`].
    pub fn recv<R: DevicePtrMut<T>, T: NcclType>(&self, recv: &mut R, peer: i32) -> Result<Status, Error> {
        crate::call::rank_of(peer, self.world_size(), "recv")?;
        let n = recv.len();
        let (r, _rr) = recv.device_ptr_mut(&self.stream);
        self.delegate(
            |node| node.recv(&mut RawView::<T> { ptr: r, len: n, stream: &self.stream, _t: PhantomData }, peer),
            |world| {
                let dt = nccl_dtype(T::data_type());
                world.enqueue("ncclRecv", false, |c, st| {
                    // SAFETY: `n` elements, held for the call.
                    unsafe { sys::ncclRecv(r as *mut c_void, n, dt, peer, c, st) }
                })
            },
        )
    }
}

impl Drop for HierComm {
    fn drop(&mut self) {
        // Let enqueued work finish (bounded) before NCCL is aborted under it; a failure has
        // already aborted it.
        if self.state.check().is_ok() && (self.rail.is_some() || self.world.is_some()) {
            let _ = self.synchronize();
        }
    }
}

/// The hierarchy torchrun describes: `LOCAL_WORLD_SIZE` ranks on each of
/// `WORLD_SIZE / LOCAL_WORLD_SIZE` nodes, `RANK = node × LOCAL_WORLD_SIZE + LOCAL_RANK`.
pub(crate) fn torchrun_shape(env: &TorchEnv) -> Result<HierShape, Error> {
    let local = env.local_world_size;
    if local == 0 || env.world_size % local != 0 {
        return Err(Error::Env {
            var: "LOCAL_WORLD_SIZE",
            problem: format!(
                "{local} does not divide WORLD_SIZE {} (every node must run as many ranks)",
                env.world_size
            ),
        });
    }
    if env.local_rank >= local || env.rank % local != env.local_rank {
        return Err(Error::Env {
            var: "LOCAL_RANK",
            problem: format!(
                "{} on RANK {} with LOCAL_WORLD_SIZE {local}: the hierarchy needs RANK = node × LOCAL_WORLD_SIZE + \
                 LOCAL_RANK (torchrun's numbering)",
                env.local_rank, env.rank
            ),
        });
    }
    HierShape::new(env.world_size / local, local, env.rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(rank: usize, world: usize, local_rank: usize, local_world: usize) -> TorchEnv {
        TorchEnv {
            rank,
            world_size: world,
            local_rank,
            local_world_size: local_world,
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            run_id: None,
            restart_count: None,
        }
    }

    #[test]
    fn torchrun_worlds_map_to_nodes_and_odd_ones_get_typed_errors() {
        let s = torchrun_shape(&env(5, 8, 1, 4)).unwrap();
        assert_eq!((s.nodes, s.local, s.node, s.local_rank), (2, 4, 1, 1));
        let one = torchrun_shape(&env(2, 4, 2, 4)).unwrap();
        assert_eq!((one.nodes, one.node), (1, 0));
        assert!(matches!(torchrun_shape(&env(1, 6, 1, 4)), Err(Error::Env { var: "LOCAL_WORLD_SIZE", .. })));
        assert!(matches!(torchrun_shape(&env(5, 8, 0, 4)), Err(Error::Env { var: "LOCAL_RANK", .. })));
    }

    #[test]
    fn the_nonblocking_config_leaves_everything_to_nccl_but_blocking() {
        let c = nonblocking_config();
        assert_eq!((c.size, c.magic, c.blocking), (size_of::<sys::ncclConfig_t>(), CONFIG_MAGIC, 0));
        assert_eq!((c.cgaClusterSize, c.splitShare, c.maxP2pPeers), (UNDEF_INT, UNDEF_INT, UNDEF_INT));
        assert!(c.netName.is_null() && c.commName.is_null());
    }
}
