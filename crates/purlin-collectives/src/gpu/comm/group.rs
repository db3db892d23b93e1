//! Groups of calls (`group_start`/`group_end` and cudarc's `nccl::Group`): collectives run as
//! they are called; a group holds its sends and receives until its end.

use cudarc::driver::{CudaView, CudaViewMut, SyncOnDrop};

use super::Comm;
use crate::call::types::{NcclType, ReduceOp, Status};
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
#[derive(Debug)]
pub struct Group<'a> {
    comm: &'a Comm,
    sends: Vec<HeldTransfer<'a>>,
    recvs: Vec<HeldTransfer<'a>>,
}

/// A send or receive held until its group ends: the peer, the bytes, the device pointer, and
/// cudarc's record of the buffer's use on the stream (kept until the launch is enqueued).
#[derive(Debug)]
struct HeldTransfer<'a> {
    transfer: Transfer,
    ptr: u64,
    _record: SyncOnDrop<'a>,
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
        let ptr = |h: &Option<HeldTransfer<'_>>| h.as_ref().map_or(0, |h| h.ptr);
        let transfer = |h: &Option<HeldTransfer<'_>>| h.as_ref().map(|h| h.transfer);
        for (send, recv) in paired(std::mem::take(&mut self.sends), std::mem::take(&mut self.recvs)) {
            let spec = point_to_point_spec(c.world, c.rank, transfer(&send), transfer(&recv))?;
            // `send` and `recv` (with their stream records) live until after the launch.
            c.point_to_point_at(spec, ptr(&send), ptr(&recv))?;
        }
        Ok(Status::Success)
    }

    /// Holds a send to `peer` until the group ends ([`Comm::send`]); the group's k-th send
    /// meets the peer's k-th receive from this rank.
    pub fn send<'s: 'g, T: NcclType>(&mut self, data: CudaView<'s, T>, peer: i32) -> Result<(), Error> {
        let transfer = Transfer { peer: rank_of(peer, self.comm.world, "send")?, bytes: byte_len::<T>(data.len()) };
        point_to_point_spec(self.comm.world, self.comm.rank, Some(transfer), None)?;
        self.comm.check_device(&data)?;
        let (ptr, record) = data.view_ptr(&self.comm.stream);
        self.sends.push(HeldTransfer { transfer, ptr, _record: record });
        Ok(())
    }

    /// Holds a receive from `peer` until the group ends ([`Comm::recv`]); the group's k-th
    /// receive meets the peer's k-th send to this rank.
    pub fn recv<'r: 'g, T: NcclType>(&mut self, buff: CudaViewMut<'r, T>, peer: i32) -> Result<Status, Error> {
        let transfer = Transfer { peer: rank_of(peer, self.comm.world, "recv")?, bytes: byte_len::<T>(buff.len()) };
        point_to_point_spec(self.comm.world, self.comm.rank, None, Some(transfer))?;
        self.comm.check_device(&buff)?;
        let (ptr, record) = buff.view_ptr_mut(&self.comm.stream);
        self.recvs.push(HeldTransfer { transfer, ptr, _record: record });
        Ok(Status::Success)
    }

    /// [`Comm::broadcast`].
    pub fn broadcast<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: Option<CudaView<'s, T>>,
        mut recvbuff: CudaViewMut<'r, T>,
        root: i32,
    ) -> Result<Status, Error> {
        self.comm.broadcast(sendbuff.as_ref(), &mut recvbuff, root)
    }

    /// [`Comm::broadcast_in_place`].
    pub fn broadcast_in_place<'r: 'g, T: NcclType>(
        &mut self,
        mut recvbuff: CudaViewMut<'r, T>,
        root: i32,
    ) -> Result<Status, Error> {
        self.comm.broadcast_in_place(&mut recvbuff, root)
    }

    /// [`Comm::all_gather`].
    pub fn all_gather<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: CudaView<'s, T>,
        mut recvbuff: CudaViewMut<'r, T>,
    ) -> Result<Status, Error> {
        self.comm.all_gather(&sendbuff, &mut recvbuff)
    }

    /// [`Comm::all_reduce`].
    pub fn all_reduce<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: CudaView<'s, T>,
        mut recvbuff: CudaViewMut<'r, T>,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.comm.all_reduce(&sendbuff, &mut recvbuff, reduce_op)
    }

    /// [`Comm::all_reduce_in_place`].
    pub fn all_reduce_in_place<'r: 'g, T: NcclType>(
        &mut self,
        mut buff: CudaViewMut<'r, T>,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.comm.all_reduce_in_place(&mut buff, reduce_op)
    }

    /// [`Comm::all_gather_in_place`].
    pub fn all_gather_in_place<'r: 'g, T: NcclType>(&mut self, mut buff: CudaViewMut<'r, T>) -> Result<Status, Error> {
        self.comm.all_gather_in_place(&mut buff)
    }

    /// [`Comm::reduce_scatter_in_place`].
    pub fn reduce_scatter_in_place<'r: 'g, T: NcclType>(
        &mut self,
        mut buff: CudaViewMut<'r, T>,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.comm.reduce_scatter_in_place(&mut buff, reduce_op)
    }

    /// [`Comm::reduce`].
    pub fn reduce<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: CudaView<'s, T>,
        recvbuff: Option<CudaViewMut<'r, T>>,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        let mut recvbuff = recvbuff;
        self.comm.reduce(&sendbuff, recvbuff.as_mut(), reduce_op, root)
    }

    /// [`Comm::reduce_in_place`].
    pub fn reduce_in_place<'s: 'g, T: NcclType>(
        &mut self,
        mut recvbuff: CudaViewMut<'s, T>,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        self.comm.reduce_in_place(&mut recvbuff, reduce_op, root)
    }

    /// [`Comm::reduce_scatter`].
    pub fn reduce_scatter<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: CudaView<'s, T>,
        mut recvbuff: CudaViewMut<'r, T>,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.comm.reduce_scatter(&sendbuff, &mut recvbuff, reduce_op)
    }
}
