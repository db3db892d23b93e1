//! Groups of calls (`group_start`/`group_end` and cudarc's `nccl::Group`): collectives run as
//! they are called; a group holds its sends and receives until its end.

use std::marker::PhantomData;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use super::Comm;
use crate::call::types::{NcclType, ReduceOp, ReduceType, Status};
use crate::call::{Transfer, byte_len, paired, point_to_point_spec, rank_of};
use crate::error::Error;

thread_local! {
    /// How deep this thread is inside `group_start`/`group_end` (NCCL's group state is per
    /// thread too).
    static GROUP_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Starts a group of calls on this thread (NCCL's `ncclGroupStart`; groups nest). Purlin
/// launches each collective as one kernel without blocking the host, so collectives need no
/// group to avoid deadlock and run as they are called. [`Comm::send`] and [`Comm::recv`] are
/// refused inside one: NCCL would hold them until `group_end`, which a call that borrows its
/// buffer only while it runs cannot do (use [`Comm::group`] or [`Comm::send_recv`]).
pub fn group_start() -> Result<Status, Error> {
    GROUP_DEPTH.with(|d| d.set(d.get().saturating_add(1)));
    Ok(Status::Success)
}

/// Ends a group of calls (see [`group_start`]); without one open on this thread,
/// [`Error::InvalidArgument`] (NCCL's `ncclInvalidUsage`).
pub fn group_end() -> Result<Status, Error> {
    GROUP_DEPTH.with(|d| match d.get() {
        0 => Err(Error::InvalidArgument("group_end without a group_start on this thread".into())),
        n => {
            d.set(n - 1);
            Ok(Status::Success)
        }
    })
}

/// A lone send or receive inside `group_start`/`group_end`: refused, with what to use instead.
/// Run one by one, the two halves of an exchange would meet the peer's calls in the wrong
/// order (a send there meeting a send here); held until `group_end`, they would outlive the
/// borrow of their buffer.
pub(super) fn refuse_in_open_group(what: &str) -> Result<(), Error> {
    if GROUP_DEPTH.with(std::cell::Cell::get) == 0 {
        return Ok(());
    }
    Err(Error::Unsupported(format!(
        "{what} between group_start and group_end: Purlin cannot hold it until group_end without its \
         buffer; use comm.group() (Group::send/recv, run together when the group ends) or Comm::send_recv"
    )))
}

/// A group of calls (cudarc's `nccl::Group`), made by [`Comm::group`]. NCCL runs a group's
/// calls together, so two ranks may each send to and receive from the other in one group.
/// Purlin launches collectives as they are called (each is one kernel that blocks no host
/// thread, so no order deadlocks) and holds the group's sends and receives until its end.
/// There, as NCCL matches the k-th send to a peer with that peer's k-th receive from this
/// rank, the k-th send and the k-th receive run together as one call (a world-2 exchange),
/// for k = 1, 2, …; where one list is longer, its rest runs alone. The peer's group, or its
/// calls in that order, must mirror them.
///
/// Its calls take any cudarc [`DevicePtr`] / [`DevicePtrMut`] by value, as [`Comm`]'s take
/// them by reference: cudarc's `CudaView` / `CudaViewMut` (what `cudarc::nccl::Group`
/// takes), `&SymmetricBuffer` / `&mut SymmetricBuffer` (the one-copy path, and no cudarc
/// event, so a grouped call can be captured into a CUDA graph while the context tracks
/// events), or a raw device pointer wrapped in a type of your own that implements them.
#[derive(Debug)]
pub struct Group<'a> {
    comm: &'a Comm,
    sends: Vec<HeldTransfer<'a>>,
    recvs: Vec<HeldTransfer<'a>>,
}

/// A buffer a group holds until its end, where its device pointer is taken (with cudarc's
/// record of the buffer's use on the stream, kept until the launch is enqueued).
trait HeldBuffer: Send {
    fn device_ptr_on<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>);
}

/// A held send's buffer (read by the call).
struct Read<S, T>(S, PhantomData<fn() -> T>);

impl<S: DevicePtr<T> + Send, T> HeldBuffer for Read<S, T> {
    fn device_ptr_on<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.0.device_ptr(stream)
    }
}

/// A held receive's buffer (written by the call).
struct Written<R, T>(R, PhantomData<fn() -> T>);

impl<R: DevicePtrMut<T> + Send, T> HeldBuffer for Written<R, T> {
    fn device_ptr_on<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.0.device_ptr_mut(stream)
    }
}

/// A send or receive held until its group ends: the peer, the bytes, and the buffer.
struct HeldTransfer<'a> {
    transfer: Transfer,
    buffer: Box<dyn HeldBuffer + 'a>,
}

impl std::fmt::Debug for HeldTransfer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldTransfer").field("transfer", &self.transfer).finish_non_exhaustive()
    }
}

impl Drop for Group<'_> {
    /// Ends the group (cudarc calls `ncclGroupEnd` here), running the held sends and
    /// receives. A failure there cannot be returned from `drop`, and the peer's half of the
    /// call then waits for this one in vain, so it poisons the communicator:
    /// [`Comm::async_error`] and every later call report it. [`Group::end`] returns it instead.
    fn drop(&mut self) {
        let peer = self.sends.first().or(self.recvs.first()).map(|h| h.transfer.peer);
        if let (Some(peer), Err(e)) = (peer, self.run_held()) {
            self.comm.poison_with(peer, format!("rank {}: the send/recv at a group's end failed: {e}", self.comm.rank));
        }
    }
}

impl<'g> Group<'g> {
    pub(super) fn new(comm: &'g Comm) -> Self {
        Group { comm, sends: Vec::new(), recvs: Vec::new() }
    }

    /// The communicator.
    pub fn comm(&self) -> &'g Comm {
        self.comm
    }

    /// Ends the group now, returning what the held sends and receives gave (dropping the
    /// group runs them too, but can only report a failure by poisoning the communicator).
    /// After a failed call the rest do not run.
    pub fn end(mut self) -> Result<Status, Error> {
        self.run_held()
    }

    fn run_held(&mut self) -> Result<Status, Error> {
        let c = self.comm;
        let transfer = |h: &Option<HeldTransfer<'_>>| h.as_ref().map(|h| h.transfer);
        for (mut send, mut recv) in paired(std::mem::take(&mut self.sends), std::mem::take(&mut self.recvs)) {
            let spec = point_to_point_spec(c.world, c.rank, transfer(&send), transfer(&recv))?;
            // The stream records live until after the launch is enqueued.
            let (send_ptr, _send_record) = held_ptr(&mut send, &c.stream);
            let (recv_ptr, _recv_record) = held_ptr(&mut recv, &c.stream);
            c.point_to_point_at(spec, send_ptr, recv_ptr)?;
        }
        Ok(Status::Success)
    }

    /// Holds a send to `peer` until the group ends ([`Comm::send`]); the group's k-th send
    /// meets the peer's k-th receive from this rank.
    pub fn send<S: DevicePtr<T> + Send + 'g, T: NcclType + 'static>(
        &mut self,
        data: S,
        peer: i32,
    ) -> Result<(), Error> {
        let transfer = Transfer { peer: rank_of(peer, self.comm.world, "send")?, bytes: byte_len::<T>(data.len()) };
        point_to_point_spec(self.comm.world, self.comm.rank, Some(transfer), None)?;
        self.comm.check_device(&data)?;
        self.sends.push(HeldTransfer { transfer, buffer: Box::new(Read(data, PhantomData)) });
        Ok(())
    }

    /// Holds a receive from `peer` until the group ends ([`Comm::recv`]); the group's k-th
    /// receive meets the peer's k-th send to this rank.
    pub fn recv<R: DevicePtrMut<T> + Send + 'g, T: NcclType + 'static>(
        &mut self,
        buff: R,
        peer: i32,
    ) -> Result<Status, Error> {
        let transfer = Transfer { peer: rank_of(peer, self.comm.world, "recv")?, bytes: byte_len::<T>(buff.len()) };
        point_to_point_spec(self.comm.world, self.comm.rank, None, Some(transfer))?;
        self.comm.check_device(&buff)?;
        self.recvs.push(HeldTransfer { transfer, buffer: Box::new(Written(buff, PhantomData)) });
        Ok(Status::Success)
    }

    /// [`Comm::broadcast`].
    pub fn broadcast<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &mut self,
        sendbuff: Option<S>,
        mut recvbuff: R,
        root: i32,
    ) -> Result<Status, Error> {
        self.comm.broadcast(sendbuff.as_ref(), &mut recvbuff, root)
    }

    /// [`Comm::broadcast_in_place`].
    pub fn broadcast_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &mut self,
        mut recvbuff: R,
        root: i32,
    ) -> Result<Status, Error> {
        self.comm.broadcast_in_place(&mut recvbuff, root)
    }

    /// [`Comm::all_gather`].
    pub fn all_gather<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &mut self,
        sendbuff: S,
        mut recvbuff: R,
    ) -> Result<Status, Error> {
        self.comm.all_gather(&sendbuff, &mut recvbuff)
    }

    /// [`Comm::all_reduce`].
    pub fn all_reduce<S: DevicePtr<T>, R: DevicePtrMut<T>, T: ReduceType>(
        &mut self,
        sendbuff: S,
        mut recvbuff: R,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.comm.all_reduce(&sendbuff, &mut recvbuff, reduce_op)
    }

    /// [`Comm::all_reduce_in_place`].
    pub fn all_reduce_in_place<R: DevicePtrMut<T>, T: ReduceType>(
        &mut self,
        mut buff: R,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.comm.all_reduce_in_place(&mut buff, reduce_op)
    }

    /// [`Comm::all_gather_in_place`].
    pub fn all_gather_in_place<R: DevicePtrMut<T>, T: NcclType>(&mut self, mut buff: R) -> Result<Status, Error> {
        self.comm.all_gather_in_place(&mut buff)
    }

    /// [`Comm::reduce_scatter_in_place`].
    pub fn reduce_scatter_in_place<R: DevicePtrMut<T>, T: ReduceType>(
        &mut self,
        mut buff: R,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.comm.reduce_scatter_in_place(&mut buff, reduce_op)
    }

    /// [`Comm::reduce`].
    pub fn reduce<S: DevicePtr<T>, R: DevicePtrMut<T>, T: ReduceType>(
        &mut self,
        sendbuff: S,
        recvbuff: Option<R>,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        let mut recvbuff = recvbuff;
        self.comm.reduce(&sendbuff, recvbuff.as_mut(), reduce_op, root)
    }

    /// [`Comm::reduce_in_place`].
    pub fn reduce_in_place<R: DevicePtrMut<T>, T: ReduceType>(
        &mut self,
        mut recvbuff: R,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        self.comm.reduce_in_place(&mut recvbuff, reduce_op, root)
    }

    /// [`Comm::reduce_scatter`].
    pub fn reduce_scatter<S: DevicePtr<T>, R: DevicePtrMut<T>, T: ReduceType>(
        &mut self,
        sendbuff: S,
        mut recvbuff: R,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.comm.reduce_scatter(&sendbuff, &mut recvbuff, reduce_op)
    }
}

/// A held transfer's device pointer and stream record; 0 and none for a side that is absent.
fn held_ptr<'a>(held: &'a mut Option<HeldTransfer<'_>>, stream: &'a CudaStream) -> (u64, Option<SyncOnDrop<'a>>) {
    match held {
        Some(h) => {
            let (ptr, record) = h.buffer.device_ptr_on(stream);
            (ptr, Some(record))
        }
        None => (0, None),
    }
}
