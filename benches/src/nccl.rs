//! The NCCL baselines, through cudarc's `nccl::sys` on raw device pointers.
//!
//! - `nccl`: buffers from `cuMemAlloc`; AllReduce, AllGather and ReduceScatter are NCCL's own
//!   calls; AllToAll, AllGatherV and AllToAllV are grouped `ncclSend`/`ncclRecv` (one pair
//!   per peer, self included; `ncclAlltoAll` is not in every libnccl); ReduceScatterV is a
//!   group of `ncclReduce`, one per root (as torch does for uneven splits).
//! - `nccl-symm`: the same calls on buffers from `ncclMemAlloc`, registered on every rank with
//!   `ncclCommWindowRegister(.., NCCL_WIN_COLL_SYMMETRIC)`, which selects NCCL's symmetric
//!   low-latency kernels where it has them.
//!
//! Each backend has its own communicator. The unique id travels through the ranks' shared
//! block ([`Coord::broadcast_bytes`]).

use std::ffi::{CStr, c_void};

use anyhow::{Result, anyhow, bail};
use cudarc::nccl::sys::{self, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId, ncclWindow_t};

use crate::backend::{Backend, BackendKind, CallError};
use crate::case::Case;
use crate::coord::Coord;
use crate::gpu::{DeviceBuffer, Gpu};
use crate::spec::{Collective, Dtype, Op};

/// `NCCL_WIN_COLL_SYMMETRIC` of nccl.h.
const NCCL_WIN_COLL_SYMMETRIC: i32 = 1;

/// Whether libnccl can be loaded (cudarc panics on first use where it cannot).
pub fn present() -> bool {
    // SAFETY: only tries to dlopen libnccl and reports whether it could.
    unsafe { sys::is_culib_present() }
}

/// Whether the loaded libnccl exports `symbol`.
pub fn has_symbol(symbol: &str) -> bool {
    if !present() {
        return false;
    }
    // SAFETY: the library is present (checked above); looking a symbol up calls nothing.
    unsafe { sys::culib().get::<*const c_void>(symbol.as_bytes()).is_ok() }
}

/// The loaded libnccl's version, as "2.28.3".
pub fn version() -> Option<String> {
    if !present() {
        return None;
    }
    let mut v = 0;
    // SAFETY: ncclGetVersion writes one int; the library is present.
    let r = unsafe { sys::ncclGetVersion(&mut v) };
    if r != ncclResult_t::ncclSuccess {
        return None;
    }
    Some(if v >= 10000 {
        format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100)
    })
}

fn check(r: ncclResult_t, call: &str) -> Result<(), String> {
    if r == ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static C string for any result code.
    let msg = unsafe { CStr::from_ptr(sys::ncclGetErrorString(r)) }.to_string_lossy().into_owned();
    Err(format!("{call} failed: {r:?} ({msg})"))
}

fn dtype(d: Dtype) -> ncclDataType_t {
    match d {
        Dtype::F32 => ncclDataType_t::ncclFloat32,
        Dtype::F16 => ncclDataType_t::ncclFloat16,
        Dtype::Bf16 => ncclDataType_t::ncclBfloat16,
        Dtype::F64 => ncclDataType_t::ncclFloat64,
        Dtype::I8 => ncclDataType_t::ncclInt8,
        Dtype::U8 => ncclDataType_t::ncclUint8,
        Dtype::I32 => ncclDataType_t::ncclInt32,
        Dtype::U32 => ncclDataType_t::ncclUint32,
        Dtype::I64 => ncclDataType_t::ncclInt64,
        Dtype::U64 => ncclDataType_t::ncclUint64,
        Dtype::F8E4M3 => ncclDataType_t::ncclFloat8e4m3,
        Dtype::F8E5M2 => ncclDataType_t::ncclFloat8e5m2,
    }
}

fn op(o: Option<Op>) -> ncclRedOp_t {
    match o.unwrap_or(Op::Sum) {
        Op::Sum => ncclRedOp_t::ncclSum,
        Op::Prod => ncclRedOp_t::ncclProd,
        Op::Min => ncclRedOp_t::ncclMin,
        Op::Max => ncclRedOp_t::ncclMax,
        Op::Avg => ncclRedOp_t::ncclAvg,
    }
}

enum Buffer {
    Cu(DeviceBuffer),
    Nccl { ptr: *mut c_void },
}

impl Buffer {
    fn ptr(&self) -> u64 {
        match self {
            Buffer::Cu(b) => b.ptr,
            Buffer::Nccl { ptr } => *ptr as u64,
        }
    }
}

/// One rank's NCCL baseline (plain or symmetric).
pub struct Nccl {
    kind: BackendKind,
    comm: ncclComm_t,
    send: Option<Buffer>,
    recv: Option<Buffer>,
    windows: Vec<ncclWindow_t>,
    stream: sys::cudaStream_t,
    rank: usize,
    world: usize,
    broken: bool,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl").field("kind", &self.kind).field("rank", &self.rank).finish()
    }
}

impl Nccl {
    /// Sets up rank `coord.rank()`'s communicator and buffers. Every rank must call it (it
    /// meets the others); the outcome is agreed: if any rank fails, every rank gets an error.
    pub fn new(gpu: &Gpu, coord: &Coord, kind: BackendKind, send_bytes: usize, recv_bytes: usize) -> Result<Nccl> {
        let symm = kind == BackendKind::NcclSymm;
        // Rank 0 makes the id (an empty one says it could not).
        let mut id = ncclUniqueId { internal: [0; 128] };
        let mine: Vec<u8> = if coord.rank() == 0 {
            // SAFETY: writes one ncclUniqueId; the library is present (checked by the caller).
            match check(unsafe { sys::ncclGetUniqueId(&mut id) }, "ncclGetUniqueId") {
                Ok(()) => id.internal.iter().map(|c| *c as u8).collect(),
                Err(_) => Vec::new(),
            }
        } else {
            Vec::new()
        };
        let got = coord.broadcast_bytes(&mine)?;
        if got.len() != 128 {
            bail!("rank 0 could not make an NCCL unique id");
        }
        for (d, s) in id.internal.iter_mut().zip(&got) {
            *d = *s as _;
        }
        gpu.bind()?;
        let mut this = Nccl {
            kind,
            comm: std::ptr::null_mut(),
            send: None,
            recv: None,
            windows: Vec::new(),
            stream: gpu.cu_stream() as sys::cudaStream_t,
            rank: coord.rank(),
            world: coord.world(),
            broken: false,
        };
        // Every rank initializes (a collective call); failures are agreed on afterwards.
        let local = this.init(gpu, id, symm, send_bytes, recv_bytes);
        let failed = coord.exchange(&[local.is_err() as u64])?;
        match (local, failed.iter().position(|f| f.first() == Some(&1))) {
            (Err(e), _) => {
                this.broken = true;
                Err(e)
            }
            (Ok(()), Some(r)) => {
                this.broken = true;
                Err(anyhow!("rank {r} could not set up {}", kind.name()))
            }
            (Ok(()), None) => Ok(this),
        }
    }

    fn init(&mut self, gpu: &Gpu, id: ncclUniqueId, symm: bool, send_bytes: usize, recv_bytes: usize) -> Result<()> {
        let mut comm = std::ptr::null_mut();
        // SAFETY: comm is an out-pointer; the id came from rank 0's ncclGetUniqueId; every rank
        // calls this with the same world; the GPU's context is bound to this thread.
        check(unsafe { sys::ncclCommInitRank(&mut comm, self.world as i32, id, self.rank as i32) }, "ncclCommInitRank")
            .map_err(|e| anyhow!(e))?;
        self.comm = comm;
        if !symm {
            self.send = Some(Buffer::Cu(DeviceBuffer::new(gpu, send_bytes)?));
            self.recv = Some(Buffer::Cu(DeviceBuffer::new(gpu, recv_bytes)?));
            return Ok(());
        }
        for (slot, bytes) in [(0, send_bytes), (1, recv_bytes)] {
            let bytes = bytes.max(256);
            let mut ptr = std::ptr::null_mut();
            // SAFETY: out-pointer; freed with ncclMemFree in Drop.
            check(unsafe { sys::ncclMemAlloc(&mut ptr, bytes) }, "ncclMemAlloc").map_err(|e| anyhow!(e))?;
            let buf = Buffer::Nccl { ptr };
            if slot == 0 {
                self.send = Some(buf)
            } else {
                self.recv = Some(buf)
            }
            let mut win = std::ptr::null_mut();
            // SAFETY: ptr/bytes is the ncclMemAlloc allocation above; a collective call that
            // every rank makes in the same order; deregistered in Drop before the free.
            let res = unsafe { sys::ncclCommWindowRegister(self.comm, ptr, bytes, &mut win, NCCL_WIN_COLL_SYMMETRIC) };
            check(res, "ncclCommWindowRegister").map_err(|e| anyhow!(e))?;
            self.windows.push(win);
        }
        Ok(())
    }

    fn elem_ptr(&self, send: bool, offset: usize, case: &Case) -> *mut c_void {
        let b = if send { &self.send } else { &self.recv };
        (b.as_ref().map_or(0, Buffer::ptr) + (offset * case.dtype.size()) as u64) as *mut c_void
    }

    fn call(&mut self, case: &Case) -> Result<(), String> {
        let (dt, rop, comm, stream) = (dtype(case.dtype), op(case.op), self.comm, self.stream);
        let (r, n) = (self.rank, self.world);
        // In place (NCCL's convention): input and output both in the receive buffer, at
        // the layout's offsets.
        let layout = case.in_place_layout(r);
        let s = |off| match layout {
            Some(l) => self.elem_ptr(false, l.input_at + off, case) as *const c_void,
            None => self.elem_ptr(true, off, case) as *const c_void,
        };
        let d = |off| self.elem_ptr(false, layout.map_or(0, |l| l.output_at) + off, case);
        // The safety argument of every call below: the pointers lie inside this rank's
        // send/recv buffers, sized at set-up for the sweep's largest case (Config::buffer_bytes);
        // counts follow the case's layout, which every rank computes identically; comm and
        // stream are alive; the buffers are not freed before the stream is synchronized.
        match case.collective {
            Collective::AllReduce => {
                // SAFETY: see above; count elements in and out.
                let res = unsafe { sys::ncclAllReduce(s(0), d(0), case.count, dt, rop, comm, stream) };
                check(res, "ncclAllReduce")
            }
            Collective::AllGather => {
                // SAFETY: see above; parts[r] in, world × parts[r] out.
                let res = unsafe { sys::ncclAllGather(s(0), d(0), case.parts()[r], dt, comm, stream) };
                check(res, "ncclAllGather")
            }
            Collective::ReduceScatter => {
                // SAFETY: see above; world × parts[r] in, parts[r] out.
                let res = unsafe { sys::ncclReduceScatter(s(0), d(0), case.parts()[r], dt, rop, comm, stream) };
                check(res, "ncclReduceScatter")
            }
            Collective::AllToAll | Collective::AllToAllV | Collective::AllGatherV => group(|| {
                for p in 0..n {
                    let (soff, scount, roff, rcount) = if case.collective == Collective::AllGatherV {
                        (0, case.parts()[r], case.part_offset(p), case.parts()[p])
                    } else {
                        (case.send_offset(r, p), case.pair(r, p), case.recv_offset(r, p), case.pair(p, r))
                    };
                    // SAFETY: see above; [soff, soff + scount) lies in this rank's input.
                    let res = unsafe { sys::ncclSend(s(soff), scount, dt, p as i32, comm, stream) };
                    check(res, "ncclSend")?;
                    // SAFETY: see above; [roff, roff + rcount) lies in this rank's output.
                    let res = unsafe { sys::ncclRecv(d(roff), rcount, dt, p as i32, comm, stream) };
                    check(res, "ncclRecv")?;
                }
                Ok(())
            }),
            Collective::Broadcast => {
                // SAFETY: see above; count elements out, count in on the root (rank 0; a
                // peer's send pointer is not read).
                let res = unsafe { sys::ncclBroadcast(s(0), d(0), case.count, dt, 0, comm, stream) };
                check(res, "ncclBroadcast")
            }
            Collective::Reduce => {
                // SAFETY: see above; count elements in, count out on the root (rank 0; a
                // peer's receive pointer is not written).
                let res = unsafe { sys::ncclReduce(s(0), d(0), case.count, dt, rop, 0, comm, stream) };
                check(res, "ncclReduce")
            }
            Collective::SendRecv => group(|| {
                let (to, from) = ((r + 1) % n, (r + n - 1) % n);
                // SAFETY: see above; count elements out of the input, count into the output.
                let res = unsafe { sys::ncclSend(s(0), case.count, dt, to as i32, comm, stream) };
                check(res, "ncclSend")?;
                // SAFETY: as above.
                let res = unsafe { sys::ncclRecv(d(0), case.count, dt, from as i32, comm, stream) };
                check(res, "ncclRecv")
            }),
            Collective::ReduceScatterV => group(|| {
                for p in 0..n {
                    let (off, count) = (case.part_offset(p), case.parts()[p]);
                    // SAFETY: see above; partition p of the input, reduced into rank p's output
                    // (which holds parts[p] elements on rank p; others' recv is not written).
                    let res = unsafe { sys::ncclReduce(s(off), d(0), count, dt, rop, p as i32, comm, stream) };
                    check(res, "ncclReduce")?;
                }
                Ok(())
            }),
        }
    }
}

/// Runs `f` between ncclGroupStart and ncclGroupEnd (the end is called even if `f` fails).
fn group(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    // SAFETY: group calls only nest bookkeeping; paired with the ncclGroupEnd below.
    check(unsafe { sys::ncclGroupStart() }, "ncclGroupStart")?;
    let r = f();
    // SAFETY: closes the group opened above.
    let end = check(unsafe { sys::ncclGroupEnd() }, "ncclGroupEnd");
    r.and(end)
}

impl Backend for Nccl {
    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn send_ptr(&self) -> u64 {
        self.send.as_ref().map_or(0, Buffer::ptr)
    }

    fn recv_ptr(&self) -> u64 {
        self.recv.as_ref().map_or(0, Buffer::ptr)
    }

    fn supports(&self, _case: &Case) -> Result<(), CallError> {
        Ok(())
    }

    fn enqueue(&mut self, case: &Case) -> Result<(), CallError> {
        self.call(case).map_err(|e| {
            // NCCL checks its arguments on the host before it launches anything, the same way
            // on every rank: an argument NCCL refuses (an op it lacks for a type, say) is a
            // row NCCL does not support, not a broken communicator.
            if e.contains("ncclInvalidArgument") || e.contains("ncclInvalidUsage") {
                CallError::Unsupported(e)
            } else {
                self.broken = true;
                CallError::Failed(e)
            }
        })
    }

    fn async_error(&self) -> Option<String> {
        if self.comm.is_null() {
            return None;
        }
        let mut r = ncclResult_t::ncclSuccess;
        // SAFETY: comm is alive; writes one result.
        let q = unsafe { sys::ncclCommGetAsyncError(self.comm, &mut r) };
        if q != ncclResult_t::ncclSuccess {
            return Some(format!("ncclCommGetAsyncError failed: {q:?}"));
        }
        check(r, "NCCL (asynchronous error)").err()
    }

    fn abort(&mut self) {
        self.broken = true;
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        if self.broken {
            if !self.comm.is_null() {
                // SAFETY: aborts our own communicator (kills its in-flight kernels); no later use.
                let _ = unsafe { sys::ncclCommAbort(self.comm) };
            }
            // Buffers may still be in use by kernels that did not finish: leak them (the
            // process is about to exit).
            if let Some(Buffer::Cu(b)) = self.send.take() {
                std::mem::forget(b);
            }
            if let Some(Buffer::Cu(b)) = self.recv.take() {
                std::mem::forget(b);
            }
            return;
        }
        for w in self.windows.drain(..) {
            // SAFETY: registered on this comm in init; every rank deregisters in the same order
            // (backends are dropped in the same order on every rank).
            let _ = unsafe { sys::ncclCommWindowDeregister(self.comm, w) };
        }
        if !self.comm.is_null() {
            // SAFETY: our communicator; the stream was synchronized after its last call.
            let _ = unsafe { sys::ncclCommDestroy(self.comm) };
        }
        for b in [self.send.take(), self.recv.take()].into_iter().flatten() {
            if let Buffer::Nccl { ptr } = b {
                // SAFETY: from ncclMemAlloc; deregistered above; freed once.
                let _ = unsafe { sys::ncclMemFree(ptr) };
            }
        }
    }
}
