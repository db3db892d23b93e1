//! Per-call streams: [`Comm::on_stream`] runs a call on a stream the caller names for that
//! call, such as PyTorch's current stream, which can change from one call to the next.
//!
//! **The decision.** A handle, `comm.on_stream(&stream)` → [`OnStream`], with the
//! collectives' names and arguments, rather than a second communicator bound to a borrowed
//! stream: the communicator (its workspace, epochs, plans, symmetric buffers) stays one object
//! whatever stream a call uses, and the handle costs nothing to make per call. Its buffers are
//! [`Untracked`] ([`RawBuffer`], [`SymmetricBuffer`]): cudarc's event tracking would order a
//! `CudaSlice` against the communicator's own stream, not the call's, so those keep to the
//! plain methods on [`Comm::stream`].
//!
//! **Ordering.** The calls of one communicator run in the order they were made, whatever their
//! streams, as NCCL orders work on one communicator: every launch is tied to the previous one
//! because each rank's kernels advance the workspace's epochs in call order. When a call's
//! stream differs from the previous launch's, an event recorded on the previous stream is
//! waited on by the new one (nothing is added while the stream stays the same). Under CUDA
//! graph capture a wait joins only streams of the same capture (the graph orders its own
//! launches); between a capture and ordinary work there is no event to wait on, and ordering
//! is the caller's, as with NCCL (PyTorch synchronises before a capture begins). Teardown and
//! [`Comm::free_symmetric`] first order the communicator's stream after the last launch, so
//! their synchronisation covers calls made on other streams.
//!
//! The stream is a scoped setting of the calling thread while an [`OnStream`] method runs;
//! another thread's calls on the same communicator keep theirs.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, sys};

use super::{Comm, RawBuffer, SymmetricBuffer};
use crate::call::types::{NcclType, ReduceOp, ReduceType, Status};
use crate::error::{Error, driver};

mod sealed {
    pub trait Sealed {}
}

/// Buffers that carry no cudarc event tracking, so that the stream a call runs on is the only
/// thing that orders them: [`RawBuffer`] and [`SymmetricBuffer`].
pub trait Untracked: sealed::Sealed {}
impl<T> sealed::Sealed for RawBuffer<T> {}
impl<T> Untracked for RawBuffer<T> {}
impl<T> sealed::Sealed for SymmetricBuffer<T> {}
impl<T> Untracked for SymmetricBuffer<T> {}

/// The stream of a communicator's last launch, so the next launch on another stream can be
/// ordered after it.
#[derive(Debug, Default)]
pub(crate) struct LaunchOrder {
    last: Mutex<Option<Arc<CudaStream>>>,
}

/// Held while a launch is enqueued: the next launch orders after it.
pub(super) type LastLaunch<'a> = MutexGuard<'a, Option<Arc<CudaStream>>>;

thread_local! {
    /// The stream the calling thread's calls on one communicator (by address) launch on.
    static LAUNCH_ON: RefCell<Option<(usize, Arc<CudaStream>)>> = const { RefCell::new(None) };
}

/// Restores the thread's previous launch stream when an [`OnStream`] call returns.
struct Scoped(Option<(usize, Arc<CudaStream>)>);

impl Drop for Scoped {
    fn drop(&mut self) {
        let previous = self.0.take();
        LAUNCH_ON.with(|cell| *cell.borrow_mut() = previous);
    }
}

/// A stream's capture: `None` when not capturing, else its capture id.
fn capture_of(stream: &CudaStream) -> Result<Option<u64>, Error> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    // SAFETY: a live stream of a live context; the status and id out-pointers are valid, the
    // optional graph, dependency and edge outputs are null (not requested).
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream.cu_stream(),
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(driver("cuStreamGetCaptureInfo"))?;
    Ok((status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE).then_some(id))
}

/// Makes `next` wait for the work enqueued so far on `prev` where an event can join them:
/// both outside any capture, or both in the same one.
fn order_after(prev: &CudaStream, next: &CudaStream) -> Result<(), Error> {
    if prev == next {
        return Ok(());
    }
    if capture_of(prev)? != capture_of(next)? {
        return Ok(());
    }
    let event = prev.record_event(None).map_err(driver("cuEventRecord"))?;
    next.wait(&event).map_err(driver("cuStreamWaitEvent"))
}

impl Comm {
    /// A handle whose calls run on `stream` (a stream of this communicator's GPU, e.g. one
    /// from `CudaContext::wrap_borrowed_stream` over PyTorch's current stream), ordered after
    /// this communicator's earlier calls on any stream (see the module docs). The communicator
    /// keeps the stream of its last launch to order the next one: a borrowed stream must stay
    /// alive until a call on another stream, or teardown, follows its last call.
    pub fn on_stream<'a>(&'a self, stream: &'a Arc<CudaStream>) -> Result<OnStream<'a>, Error> {
        if stream.context().ordinal() != self.ordinal() {
            return Err(Error::InvalidArgument(format!(
                "a stream of GPU {} passed to rank {} on GPU {}",
                stream.context().ordinal(),
                self.rank,
                self.ordinal()
            )));
        }
        Ok(OnStream { comm: self, stream })
    }

    /// The stream the call being made launches on (the calling thread's [`OnStream`] stream
    /// for this communicator, else [`Comm::stream`]), ordered after the previous launch; the
    /// guard keeps other threads' launches out until this one is enqueued, so "previous" is
    /// exact.
    pub(super) fn launch_stream(&self) -> Result<(Arc<CudaStream>, LastLaunch<'_>), Error> {
        let me = self as *const Comm as usize;
        let scoped = LAUNCH_ON.with(|cell| cell.borrow().as_ref().filter(|(c, _)| *c == me).map(|(_, s)| s.clone()));
        let next = scoped.unwrap_or_else(|| self.stream.clone());
        let mut last = self.launches.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(prev) = last.as_ref() {
            order_after(prev, &next)?;
        }
        *last = Some(next.clone());
        Ok((next, last))
    }

    /// Orders [`Comm::stream`] after the last launch, so that synchronising it waits for
    /// every call made so far (teardown, freeing a symmetric buffer).
    pub(super) fn join_launches(&self) -> Result<(), Error> {
        let mut last = self.launches.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(prev) = last.as_ref() {
            order_after(prev, &self.stream)?;
        }
        *last = Some(self.stream.clone());
        Ok(())
    }
}

/// [`Comm`]'s collectives on one stream ([`Comm::on_stream`]); same names, arguments and
/// meaning as [`Comm`]'s, on [`Untracked`] buffers.
#[derive(Debug, Clone, Copy)]
pub struct OnStream<'a> {
    comm: &'a Comm,
    stream: &'a Arc<CudaStream>,
}

impl<'a> OnStream<'a> {
    /// The communicator.
    pub fn comm(&self) -> &'a Comm {
        self.comm
    }

    /// The stream its calls run on.
    pub fn stream(&self) -> &'a Arc<CudaStream> {
        self.stream
    }

    fn run<R>(&self, call: impl FnOnce(&Comm) -> Result<R, Error>) -> Result<R, Error> {
        let me = (self.comm as *const Comm as usize, self.stream.clone());
        let _restore = Scoped(LAUNCH_ON.with(|cell| cell.borrow_mut().replace(me)));
        call(self.comm)
    }

    /// [`Comm::all_reduce`].
    pub fn all_reduce<S, R, T>(&self, sendbuff: &S, recvbuff: &mut R, op: &ReduceOp) -> Result<Status, Error>
    where
        S: DevicePtr<T> + Untracked,
        R: DevicePtrMut<T> + Untracked,
        T: ReduceType,
    {
        self.run(|c| c.all_reduce(sendbuff, recvbuff, op))
    }

    /// [`Comm::all_reduce_in_place`].
    pub fn all_reduce_in_place<R: DevicePtrMut<T> + Untracked, T: ReduceType>(
        &self,
        buff: &mut R,
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.run(|c| c.all_reduce_in_place(buff, op))
    }

    /// [`Comm::all_gather`].
    pub fn all_gather<S, R, T>(&self, sendbuff: &S, recvbuff: &mut R) -> Result<Status, Error>
    where
        S: DevicePtr<T> + Untracked,
        R: DevicePtrMut<T> + Untracked,
        T: NcclType,
    {
        self.run(|c| c.all_gather(sendbuff, recvbuff))
    }

    /// [`Comm::all_gather_in_place`].
    pub fn all_gather_in_place<R: DevicePtrMut<T> + Untracked, T: NcclType>(
        &self,
        buff: &mut R,
    ) -> Result<Status, Error> {
        self.run(|c| c.all_gather_in_place(buff))
    }

    /// [`Comm::reduce_scatter`].
    pub fn reduce_scatter<S, R, T>(&self, sendbuff: &S, recvbuff: &mut R, op: &ReduceOp) -> Result<Status, Error>
    where
        S: DevicePtr<T> + Untracked,
        R: DevicePtrMut<T> + Untracked,
        T: ReduceType,
    {
        self.run(|c| c.reduce_scatter(sendbuff, recvbuff, op))
    }

    /// [`Comm::reduce_scatter_in_place`].
    pub fn reduce_scatter_in_place<R: DevicePtrMut<T> + Untracked, T: ReduceType>(
        &self,
        buff: &mut R,
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.run(|c| c.reduce_scatter_in_place(buff, op))
    }

    /// [`Comm::all_to_all`].
    pub fn all_to_all<S, R, T>(&self, sendbuff: &S, recvbuff: &mut R) -> Result<Status, Error>
    where
        S: DevicePtr<T> + Untracked,
        R: DevicePtrMut<T> + Untracked,
        T: NcclType,
    {
        self.run(|c| c.all_to_all(sendbuff, recvbuff))
    }

    /// [`Comm::all_gather_v`].
    pub fn all_gather_v<S, R, T>(&self, sendbuff: &S, recvbuff: &mut R, counts: &[usize]) -> Result<Status, Error>
    where
        S: DevicePtr<T> + Untracked,
        R: DevicePtrMut<T> + Untracked,
        T: NcclType,
    {
        self.run(|c| c.all_gather_v(sendbuff, recvbuff, counts))
    }

    /// [`Comm::reduce_scatter_v`].
    pub fn reduce_scatter_v<S, R, T>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        counts: &[usize],
        op: &ReduceOp,
    ) -> Result<Status, Error>
    where
        S: DevicePtr<T> + Untracked,
        R: DevicePtrMut<T> + Untracked,
        T: ReduceType,
    {
        self.run(|c| c.reduce_scatter_v(sendbuff, recvbuff, counts, op))
    }

    /// [`Comm::all_to_all_v`].
    pub fn all_to_all_v<S, R, T>(&self, sendbuff: &S, recvbuff: &mut R, counts: &[Vec<usize>]) -> Result<Status, Error>
    where
        S: DevicePtr<T> + Untracked,
        R: DevicePtrMut<T> + Untracked,
        T: NcclType,
    {
        self.run(|c| c.all_to_all_v(sendbuff, recvbuff, counts))
    }

    /// [`Comm::broadcast`].
    pub fn broadcast<S, R, T>(&self, sendbuff: Option<&S>, recvbuff: &mut R, root: i32) -> Result<Status, Error>
    where
        S: DevicePtr<T> + Untracked,
        R: DevicePtrMut<T> + Untracked,
        T: NcclType,
    {
        self.run(|c| c.broadcast(sendbuff, recvbuff, root))
    }

    /// [`Comm::broadcast_in_place`].
    pub fn broadcast_in_place<R: DevicePtrMut<T> + Untracked, T: NcclType>(
        &self,
        buff: &mut R,
        root: i32,
    ) -> Result<Status, Error> {
        self.run(|c| c.broadcast_in_place(buff, root))
    }

    /// [`Comm::reduce`].
    pub fn reduce<S, R, T>(
        &self,
        sendbuff: &S,
        recvbuff: Option<&mut R>,
        op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error>
    where
        S: DevicePtr<T> + Untracked,
        R: DevicePtrMut<T> + Untracked,
        T: ReduceType,
    {
        self.run(|c| c.reduce(sendbuff, recvbuff, op, root))
    }

    /// [`Comm::reduce_in_place`].
    pub fn reduce_in_place<R: DevicePtrMut<T> + Untracked, T: ReduceType>(
        &self,
        buff: &mut R,
        op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        self.run(|c| c.reduce_in_place(buff, op, root))
    }

    /// [`Comm::send`].
    pub fn send<S: DevicePtr<T> + Untracked, T: NcclType>(&self, data: &S, peer: i32) -> Result<(), Error> {
        self.run(|c| c.send(data, peer))
    }

    /// [`Comm::recv`].
    pub fn recv<R: DevicePtrMut<T> + Untracked, T: NcclType>(&self, buff: &mut R, peer: i32) -> Result<Status, Error> {
        self.run(|c| c.recv(buff, peer))
    }

    /// [`Comm::send_recv`].
    pub fn send_recv<S, R, T, U>(
        &self,
        sendbuff: &S,
        send_peer: i32,
        recvbuff: &mut R,
        recv_peer: i32,
    ) -> Result<Status, Error>
    where
        S: DevicePtr<T> + Untracked,
        R: DevicePtrMut<U> + Untracked,
        T: NcclType,
        U: NcclType,
    {
        self.run(|c| c.send_recv(sendbuff, send_peer, recvbuff, recv_peer))
    }
}
