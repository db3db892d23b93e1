//! [`RawBuffer`]: device memory that Rust does not own, seen through its address.
//!
//! Callers outside Rust's ownership — a PyTorch tensor's `data_ptr()`, a buffer inside a CUDA
//! graph being captured, memory from another allocator — pass their device pointers to the
//! collectives through it. It implements cudarc's `DeviceSlice`/`DevicePtr`/`DevicePtrMut` with
//! no event tracking: taking its pointer records and waits on nothing (its `SyncOnDrop`
//! records nothing), so a call on it can be captured into a CUDA graph while the context keeps
//! cudarc's event tracking on, and orders only by the stream it is launched on.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop, sys};

/// `len` elements of `T` at a raw device address, tied to a stream of the GPU that holds
/// them. It owns nothing and frees nothing.
///
/// The stream names the buffer's GPU (a collective checks it against the communicator's) and
/// is what [`DeviceSlice::stream`] returns; it does not order anything by itself: the caller
/// orders the memory's other uses against the collective's launch stream (e.g. by launching
/// on the stream that wrote the data, as PyTorch's current stream does).
///
/// ```no_run
/// use purlin_collectives::{Comm, RawBuffer, ReduceOp};
///
/// let comm = Comm::from_env()?;
/// let stream = comm.stream();
/// let owned = stream.alloc_zeros::<f32>(1024)?;
/// let (ptr, _record) = cudarc::driver::DevicePtr::device_ptr(&owned, &stream);
/// // SAFETY: `owned` holds 1024 f32 on this GPU and outlives the call's kernel (the
/// // synchronize below), which runs on the stream that allocated it.
/// let mut buf = unsafe { RawBuffer::<f32>::from_raw(ptr, 1024, stream.clone()) };
/// comm.all_reduce_in_place(&mut buf, &ReduceOp::Sum)?;
/// stream.synchronize()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RawBuffer<T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _elem: PhantomData<*const T>,
}

// SAFETY: a `RawBuffer` is an address, a length and a stream handle (itself Send + Sync); it
// dereferences nothing on the host, and the safety contract of `from_raw` covers the memory.
unsafe impl<T> Send for RawBuffer<T> {}
// SAFETY: as for Send; `&RawBuffer` only hands out the address for reading.
unsafe impl<T> Sync for RawBuffer<T> {}

impl<T> RawBuffer<T> {
    /// Views `len` elements of `T` at device address `ptr`.
    ///
    /// # Safety
    ///
    /// For as long as any call that received this buffer may still run on the device (until
    /// its stream passes the call's kernel, or, for a captured call, for every replay of the
    /// graph):
    /// - `ptr` is the address of at least `len * size_of::<T>()` bytes of device memory that
    ///   the GPU of `stream`'s context can read and (for a buffer passed as `&mut`) write,
    ///   aligned for `T`, or `len` is 0;
    /// - the memory stays allocated (the caller owns it, e.g. by holding the tensor);
    /// - nothing else writes it while a call reads it, or touches it while a call writes it,
    ///   unless ordered on the device before or after the call (same stream, or events);
    /// - a buffer passed as a call's output does not overlap that call's input, except as the
    ///   in-place calls define.
    pub unsafe fn from_raw(ptr: sys::CUdeviceptr, len: usize, stream: Arc<CudaStream>) -> Self {
        RawBuffer { ptr, len, stream, _elem: PhantomData }
    }

    /// The device address.
    pub fn device_address(&self) -> sys::CUdeviceptr {
        self.ptr
    }
}

impl<T> DeviceSlice<T> for RawBuffer<T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for RawBuffer<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for RawBuffer<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}
