//! Symmetric memory: device buffers that every rank of a communicator allocates together, so
//! that every rank can address every peer's (NCCL's `ncclMemAlloc` + `ncclCommWindowRegister`
//! with symmetric windows, PyTorch's symmetric memory).
//!
//! A collective whose output *is* a [`SymmetricBuffer`] (its base address, as passed by
//! `&mut buffer`) may take the one-copy path: AllGather, AllToAll and their V forms store
//! straight into the peers' outputs instead of staging every byte through the workspace
//! (`purlin_snac` `PlanConfig::peer_outputs`). Every rank of such a call must pass a symmetric
//! buffer as its output; a rank that passes other memory runs the staged plan, and the call
//! ends in a device timeout on every rank (the one-copy plan's flags never meet the staged
//! plan's), not in corrupted memory. Outputs that are other memory, or lie inside a symmetric
//! buffer at another offset, take the staged path as before.
//!
//! Purlin allocates the memory itself (`cuMemAlloc`, shared by CUDA IPC between processes,
//! by address within one): cudarc's allocations come from a stream-ordered pool that legacy
//! IPC cannot export. The memory lives as long as the communicator (it is released by the
//! communicator's teardown, which meets the peers first), which the buffer's borrow of the
//! communicator enforces.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop, sys};

use crate::comm::{Comm, NcclType};

/// `len` elements of `T` on this rank's GPU, allocated by every rank of a communicator at
/// once ([`Comm::alloc_symmetric`]) and addressable by every peer.
///
/// It implements cudarc's [`DevicePtr`] and [`DevicePtrMut`], so it goes wherever a
/// `CudaSlice` does (`memcpy_htod`, `memcpy_dtoh`, kernel arguments, collectives). cudarc's
/// event tracking does not cover it: order work on other streams than the communicator's
/// yourself, as with any raw device memory.
#[derive(Debug)]
pub struct SymmetricBuffer<'c, T> {
    comm: &'c Comm,
    ptr: sys::CUdeviceptr,
    len: usize,
    /// Only a label: no `T` lives on the host, so the buffer is `Send` and `Sync` for any `T`.
    _elem: PhantomData<fn() -> T>,
}

impl<'c, T: NcclType> SymmetricBuffer<'c, T> {
    pub(crate) fn new(comm: &'c Comm, ptr: sys::CUdeviceptr, len: usize) -> Self {
        SymmetricBuffer { comm, ptr, len, _elem: PhantomData }
    }

    /// The communicator it belongs to.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    /// This rank's device address.
    pub fn device_address(&self) -> sys::CUdeviceptr {
        self.ptr
    }
}

impl<T> DeviceSlice<T> for SymmetricBuffer<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.comm.stream
    }
}

impl<T> DevicePtr<T> for SymmetricBuffer<'_, T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for SymmetricBuffer<'_, T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}
