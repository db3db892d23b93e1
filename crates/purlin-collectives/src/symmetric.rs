//! Symmetric memory: device buffers that every rank of a communicator allocates together, so
//! that every rank can address every peer's (NCCL's `ncclMemAlloc` + `ncclCommWindowRegister`
//! with symmetric windows, PyTorch's symmetric memory).
//!
//! A collective whose buffers *are* [`SymmetricBuffer`]s (start at their base address) may take
//! the one-copy path instead of staging every byte through the workspace:
//! - AllGather, AllToAll and their V forms with a symmetric output store straight into the
//!   peers' outputs (`purlin_snac` `PlanConfig::peer_outputs`);
//! - ReduceScatter and its V form with a symmetric input reduce their part straight from every
//!   rank's input (`PlanConfig::peer_inputs`);
//! - AllReduce with both symmetric (or in place on one) reduces its shard so and stores it into
//!   every peer's output (two-shot).
//!
//! In place, the one buffer is both. Every rank of such a call must pass symmetric buffers in
//! the same roles; a rank that passes other memory runs the staged plan, and the call ends in a
//! device timeout on every rank (the one-copy plan's flags never meet the staged plan's), not
//! in corrupted memory. Buffers elsewhere, including inside a symmetric buffer at another
//! offset, take the staged path as before.
//!
//! Purlin allocates the memory itself (`cuMemAlloc`, shared by CUDA IPC between processes, by
//! address within one): cudarc's allocations come from a stream-ordered pool that legacy IPC
//! cannot export. [`crate::Comm::free_symmetric`] frees a buffer on every rank at once (like
//! `ncclCommWindowDeregister` + `ncclMemFree`); the communicator's teardown frees the rest.
//! Both meet the peers first, and neither frees memory that another handle still shows: a
//! buffer still held at teardown keeps its memory (reported as leaked bytes), so a handle
//! never dangles.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop, sys};

use crate::Error;
use crate::comm::NcclType;

/// Where rank `q`'s input and output lie in its in-place buffer (NCCL's offsets: the plan's
/// alias), and the bytes that buffer must hold: `(input offset, output offset, bytes)`. Peers
/// of a one-copy call address every rank's buffer with these (GPU and host alike).
pub(crate) fn in_place_layout(spec: &purlin_snac::CollectiveSpec, q: u32) -> (u64, u64, u64) {
    let (i, o) = match purlin_snac::in_place_alias(spec, q) {
        Some(purlin_snac::Alias::InputInOutput(o)) => (o, 0),
        Some(purlin_snac::Alias::OutputInInput(o)) => (0, o),
        None => (0, 0),
    };
    (i, o, (i + spec.input_bytes(q)).max(o + spec.output_bytes(q)))
}

/// One symmetric allocation as this rank sees it (shared by its buffers and the communicator).
#[derive(Debug)]
pub(crate) struct SymmetricMem {
    /// Bytes per rank.
    pub(crate) bytes: usize,
    /// Every rank's base as mapped here (this rank's own at its index).
    pub(crate) addrs: Vec<u64>,
    pub(crate) rank: usize,
}

/// `len` elements of `T` on this rank's GPU, allocated by every rank of a communicator at
/// once ([`crate::Comm::alloc_symmetric`]) and addressable by every peer.
///
/// It implements cudarc's [`DevicePtr`] and [`DevicePtrMut`], so it goes wherever a
/// `CudaSlice` does (`memcpy_htod`, `memcpy_dtoh`, kernel arguments, collectives). cudarc's
/// event tracking does not cover it: order work on other streams than the communicator's
/// yourself, as with any raw device memory.
#[derive(Debug)]
pub struct SymmetricBuffer<T> {
    mem: Arc<SymmetricMem>,
    stream: Arc<CudaStream>,
    /// Elements the buffer shows (`DeviceSlice::len`).
    len: usize,
    /// Only a label: no `T` lives on the host, so the buffer is `Send` and `Sync` for any `T`.
    _elem: PhantomData<fn() -> T>,
}

impl<T: NcclType> SymmetricBuffer<T> {
    pub(crate) fn new(mem: Arc<SymmetricMem>, stream: Arc<CudaStream>, len: usize) -> Self {
        SymmetricBuffer { mem, stream, len, _elem: PhantomData }
    }

    /// The allocation this handle shares.
    pub(crate) fn mem(&self) -> &Arc<SymmetricMem> {
        &self.mem
    }

    /// Elements of `T` the allocation holds (on every rank alike).
    pub fn capacity(&self) -> usize {
        self.mem.bytes / std::mem::size_of::<T>()
    }

    /// Shows the first `len` elements only (at most [`Self::capacity`]): collectives check
    /// buffer lengths exactly, and an AllToAllV's output differs from rank to rank while
    /// every rank's allocation is the same size.
    pub fn set_len(&mut self, len: usize) -> Result<(), Error> {
        if len > self.capacity() {
            return Err(Error::InvalidArgument(format!("{len} elements in a symmetric buffer of {}", self.capacity())));
        }
        self.len = len;
        Ok(())
    }

    /// Another handle on the same memory as `len` elements of `U` from its start (like
    /// cudarc's `transmute`): the same bytes, so writes through either are seen by both.
    pub fn view_as<U: NcclType>(&self, len: usize) -> Result<SymmetricBuffer<U>, Error> {
        let mut v = SymmetricBuffer::new(self.mem.clone(), self.stream.clone(), 0);
        v.set_len(len)?;
        Ok(v)
    }

    /// This rank's device address of the buffer.
    pub fn device_address(&self) -> sys::CUdeviceptr {
        self.mem.addrs[self.mem.rank]
    }
}

impl<T> DeviceSlice<T> for SymmetricBuffer<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for SymmetricBuffer<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.mem.addrs[self.mem.rank], SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for SymmetricBuffer<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.mem.addrs[self.mem.rank], SyncOnDrop::Record(None))
    }
}
