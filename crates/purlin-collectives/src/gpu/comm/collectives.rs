//! The collectives of [`Comm`], shaped like `cudarc::nccl::Comm`'s: each maps its call to a
//! spec ([`crate::call::Call`]), checks the buffers, then enqueues one kernel.

use cudarc::driver::{DevicePtr, DevicePtrMut};
use purlin_snac::CollectiveSpec;

use super::{Comm, PeerBuffers, refuse_in_open_group};
use crate::call::types::{NcclType, ReduceOp, ReduceType, Status, snac_dtype};
use crate::call::{self, Call, Transfer, byte_len};
use crate::error::Error;

impl Comm {
    /// Sends `data` to `peer` (cudarc's `send`); the peer's matching [`Comm::recv`] receives
    /// it. At world 2 the pair is the whole world, so a send and its receive are one
    /// collective: the AllToAllV of bytes with one nonzero count (`point_to_point_spec`), one
    /// kernel on each side. Both ranks must make their point-to-point calls in the same order
    /// (a send here meets a receive there); a send and a receive in one [`Group`](crate::Group) are one call.
    /// Between the free [`group_start`](crate::group_start) and [`group_end`](crate::group_end) it is refused (see there).
    /// Wider worlds answer [`Error::Unsupported`]: a pair of them is not every rank, which is
    /// what a SNAC plan is made for (use [`Comm::all_to_all_v`]).
    pub fn send<S: DevicePtr<T>, T: NcclType>(&self, data: &S, peer: i32) -> Result<(), Error> {
        refuse_in_open_group("send")?;
        let send = Transfer { peer: call::rank_of(peer, self.world, "send")?, bytes: byte_len::<T>(data.len()) };
        let spec = self.spec::<u8>(Call::PointToPoint { send: Some(send), recv: None })?;
        self.check_device(data)?;
        let (input, _record_in) = data.device_ptr(&self.stream);
        self.point_to_point_at(spec, input, 0).map(drop)
    }

    /// Receives `buff.len()` elements from `peer` (cudarc's `recv`): the peer's matching
    /// [`Comm::send`] must send as many bytes. See [`Comm::send`].
    pub fn recv<R: DevicePtrMut<T>, T: NcclType>(&self, buff: &mut R, peer: i32) -> Result<Status, Error> {
        refuse_in_open_group("recv")?;
        let recv = Transfer { peer: call::rank_of(peer, self.world, "recv")?, bytes: byte_len::<T>(buff.len()) };
        let spec = self.spec::<u8>(Call::PointToPoint { send: None, recv: Some(recv) })?;
        self.check_device(buff)?;
        let (output, _record_out) = buff.device_ptr_mut(&self.stream);
        self.point_to_point_at(spec, 0, output)
    }

    /// Sends `sendbuff` to `send_peer` and receives `recvbuff` from `recv_peer` in one call
    /// (MPI's `Sendrecv`; what a [`Group`](crate::Group) runs at its end for its k-th send and k-th receive).
    /// The peers' calls must mirror it: a [`Comm::send_recv`] or a group there, or a lone
    /// receive (send) where this rank only sends (receives), that is a zero-length side.
    pub fn send_recv<S: DevicePtr<T>, R: DevicePtrMut<U>, T: NcclType, U: NcclType>(
        &self,
        sendbuff: &S,
        send_peer: i32,
        recvbuff: &mut R,
        recv_peer: i32,
    ) -> Result<Status, Error> {
        let send =
            Transfer { peer: call::rank_of(send_peer, self.world, "send")?, bytes: byte_len::<T>(sendbuff.len()) };
        let recv =
            Transfer { peer: call::rank_of(recv_peer, self.world, "recv")?, bytes: byte_len::<U>(recvbuff.len()) };
        let spec = self.spec::<u8>(Call::PointToPoint { send: Some(send), recv: Some(recv) })?;
        self.check_device(sendbuff)?;
        self.check_device(recvbuff)?;
        let (input, _record_in) = sendbuff.device_ptr(&self.stream);
        let (output, _record_out) = recvbuff.device_ptr_mut(&self.stream);
        self.point_to_point_at(spec, input, output)
    }

    /// A point-to-point call on device pointers the caller checked and keeps alive (0 for a
    /// side of no bytes). Always the plain (staged or packet) plan: a sender has no output
    /// buffer, so it cannot know whether the receiver's is symmetric, and both ranks must
    /// run plans of one configuration.
    pub(super) fn point_to_point_at(&self, spec: CollectiveSpec, input: u64, output: u64) -> Result<Status, Error> {
        spec.validate()?;
        let plain = PeerBuffers::default();
        let prepared = self.prepared(spec, false, plain.flags())?;
        self.launch_prepared(&prepared, input, output, &plain)
    }

    /// The spec of `call` on elements of `T` at this rank.
    fn spec<T: NcclType>(&self, call: Call) -> Result<CollectiveSpec, Error> {
        call.spec(self.world, self.rank, snac_dtype::<T>())
    }

    /// Broadcast from `root` (cudarc's `broadcast`): every rank's `recvbuff` receives the
    /// root's `sendbuff` (the same length). `sendbuff` is read on the root only, as NCCL's.
    /// It runs as the AllGatherV in which only the root contributes (counts 0 elsewhere):
    /// one kernel, every peer's bytes straight from the root (into symmetric outputs with
    /// one copy); at world 2 that is all a broadcast moves, while wider worlds load the
    /// root's links with `world - 1` copies where a ring would forward.
    pub fn broadcast<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: Option<&S>,
        recvbuff: &mut R,
        root: i32,
    ) -> Result<Status, Error> {
        let root = call::rank_of(root, self.world, "broadcast")?;
        let spec = self.spec::<T>(Call::Broadcast { len: recvbuff.len(), root })?;
        match sendbuff {
            Some(send) if root == self.rank => self.collective(spec, send, recvbuff),
            None if root == self.rank => {
                Err(Error::InvalidArgument("broadcast: the root must pass a send buffer".into()))
            }
            // A peer contributes nothing: an empty input, never read.
            _ => {
                spec.validate()?;
                spec.check_buffers(self.rank as u32, 0, recvbuff.len() as u64)?;
                self.check_device(recvbuff)?;
                let (output, _record_out) = recvbuff.device_ptr_mut(&self.stream);
                self.collective_at(spec, 0, output)
            }
        }
    }

    /// In-place broadcast from `root`: the root's `recvbuff` is sent, every other rank's
    /// overwritten (the in-place AllGatherV of [`Comm::broadcast`]: the root's contribution
    /// already at offset 0 of its buffer).
    pub fn broadcast_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        recvbuff: &mut R,
        root: i32,
    ) -> Result<Status, Error> {
        let root = call::rank_of(root, self.world, "broadcast_in_place")?;
        let spec = self.spec::<T>(Call::Broadcast { len: recvbuff.len(), root })?;
        self.collective_in_place(spec, recvbuff)
    }

    /// AllGather: `recvbuff` holds `world` × `sendbuff.len()` elements, rank `r`'s
    /// contribution at `r × sendbuff.len()`.
    pub fn all_gather<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
    ) -> Result<Status, Error> {
        let spec = self.spec::<T>(Call::AllGather { len: sendbuff.len() })?;
        self.collective(spec, sendbuff, recvbuff)
    }

    /// AllReduce: `recvbuff` (same length as `sendbuff`) receives the reduction over ranks.
    pub fn all_reduce<S: DevicePtr<T>, R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        let spec = self.spec::<T>(Call::AllReduce { len: sendbuff.len(), op: *reduce_op })?;
        self.collective(spec, sendbuff, recvbuff)
    }

    /// In-place AllReduce.
    pub fn all_reduce_in_place<R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        buff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        let spec = self.spec::<T>(Call::AllReduce { len: buff.len(), op: *reduce_op })?;
        self.collective_in_place(spec, buff)
    }

    /// In-place AllGather (NCCL's convention, `sendbuff == recvbuff + rank * count`): `buff`
    /// holds `world` partitions of `buff.len() / world` elements, this rank's contribution
    /// already in partition `rank`; the call fills the others.
    pub fn all_gather_in_place<R: DevicePtrMut<T>, T: NcclType>(&self, buff: &mut R) -> Result<Status, Error> {
        let spec = self.spec::<T>(Call::AllGatherInPlace { len: buff.len() })?;
        self.collective_in_place(spec, buff)
    }

    /// In-place ReduceScatter (NCCL's convention, `recvbuff == sendbuff + rank * count`):
    /// `buff` holds `world` partitions of `buff.len() / world` elements; partition `rank`
    /// receives the reduction over ranks of their partition `rank`, and the other partitions
    /// are left as they were.
    pub fn reduce_scatter_in_place<R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        buff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        let spec = self.spec::<T>(Call::ReduceScatterInPlace { len: buff.len(), op: *reduce_op })?;
        self.collective_in_place(spec, buff)
    }

    /// AllToAll: `sendbuff` holds `world` partitions of `sendbuff.len() / world` elements,
    /// partition `p` for rank `p`; `recvbuff` receives, at partition `p`, what rank `p` sent
    /// to this rank.
    pub fn all_to_all<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
    ) -> Result<Status, Error> {
        let spec = self.spec::<T>(Call::AllToAll { len: sendbuff.len() })?;
        self.collective(spec, sendbuff, recvbuff)
    }

    /// AllGatherV: rank `r` contributes `counts[r]` elements; `recvbuff` holds their
    /// concatenation in rank order.
    pub fn all_gather_v<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        counts: &[usize],
    ) -> Result<Status, Error> {
        let counts = call::counts_u64(counts);
        let spec = self.spec::<T>(Call::AllGatherV { counts })?;
        self.collective(spec, sendbuff, recvbuff)
    }

    /// ReduceScatterV: `sendbuff` is cut into partitions of `counts[p]` elements; rank `r`
    /// receives the reduction of partition `r` over ranks.
    pub fn reduce_scatter_v<S: DevicePtr<T>, R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        counts: &[usize],
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        let counts = call::counts_u64(counts);
        let spec = self.spec::<T>(Call::ReduceScatterV { counts, op: *reduce_op })?;
        self.collective(spec, sendbuff, recvbuff)
    }

    /// AllToAllV: `counts[s][d]` elements go from rank `s` to rank `d` (every rank passes the
    /// whole matrix); send partitions in destination order, receive partitions in source order.
    pub fn all_to_all_v<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        counts: &[Vec<usize>],
    ) -> Result<Status, Error> {
        let counts = counts.iter().map(|row| call::counts_u64(row)).collect();
        let spec = self.spec::<T>(Call::AllToAllV { counts })?;
        self.collective(spec, sendbuff, recvbuff)
    }

    /// Reduce to `root` (cudarc's `reduce`): the root's `recvbuff` receives the reduction
    /// over ranks of `sendbuff` (the same length); `recvbuff` is written on the root only, as
    /// NCCL's. It runs as the ReduceScatterV in which only the root receives (counts 0
    /// elsewhere): one kernel (from symmetric inputs with one copy), every
    /// rank's input into the root's links, as [`Comm::broadcast`] out of them.
    pub fn reduce<S: DevicePtr<T>, R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        sendbuff: &S,
        recvbuff: Option<&mut R>,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        let root = call::rank_of(root, self.world, "reduce")?;
        let spec = self.spec::<T>(Call::Reduce { len: sendbuff.len(), op: *reduce_op, root })?;
        match recvbuff {
            Some(recv) if root == self.rank => self.collective(spec, sendbuff, recv),
            None if root == self.rank => {
                Err(Error::InvalidArgument("reduce: the root must pass a receive buffer".into()))
            }
            // A peer receives nothing: an empty output, never written.
            _ => {
                spec.validate()?;
                spec.check_buffers(self.rank as u32, sendbuff.len() as u64, 0)?;
                self.check_device(sendbuff)?;
                let (input, _record_in) = sendbuff.device_ptr(&self.stream);
                self.collective_at(spec, input, 0)
            }
        }
    }

    /// In-place Reduce to `root`: the result lands in the root's `recvbuff`; the other ranks'
    /// are read and left as they were (the in-place ReduceScatterV of [`Comm::reduce`]).
    pub fn reduce_in_place<R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        recvbuff: &mut R,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        let root = call::rank_of(root, self.world, "reduce_in_place")?;
        let spec = self.spec::<T>(Call::Reduce { len: recvbuff.len(), op: *reduce_op, root })?;
        self.collective_in_place(spec, recvbuff)
    }

    /// ReduceScatter: `sendbuff` holds `world` × `recvbuff.len()` elements.
    pub fn reduce_scatter<S: DevicePtr<T>, R: DevicePtrMut<T>, T: ReduceType>(
        &self,
        sendbuff: &S,
        recvbuff: &mut R,
        reduce_op: &ReduceOp,
    ) -> Result<Status, Error> {
        let spec = self.spec::<T>(Call::ReduceScatter { len: recvbuff.len(), op: *reduce_op })?;
        self.collective(spec, sendbuff, recvbuff)
    }

    /// A call described at run time ([`Call`]) on elements of any [`NcclType`], for the layers
    /// that pick the collective and the type at run time (the hierarchy, `gpu/hier.rs`): a
    /// reduction of a type the Atom cannot reduce is [`Error::Unsupported`] here, where the
    /// typed methods refuse it at compile time ([`ReduceType`]).
    #[cfg(feature = "nccl")]
    pub(crate) fn call_any<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        call: Call,
        sendbuff: &S,
        recvbuff: &mut R,
    ) -> Result<Status, Error> {
        let spec = self.spec::<T>(call)?;
        self.collective(spec, sendbuff, recvbuff)
    }

    /// [`Comm::call_any`] in place.
    #[cfg(feature = "nccl")]
    pub(crate) fn call_any_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        call: Call,
        buff: &mut R,
    ) -> Result<Status, Error> {
        let spec = self.spec::<T>(call)?;
        self.collective_in_place(spec, buff)
    }

    /// Checks a buffer lives on this communicator's GPU.
    pub(crate) fn check_device<B: cudarc::driver::DeviceSlice<T>, T>(&self, b: &B) -> Result<(), Error> {
        let ordinal = b.stream().context().ordinal();
        if ordinal != self.ordinal() {
            return Err(Error::InvalidArgument(format!(
                "a buffer on GPU {ordinal} passed to rank {} on GPU {}",
                self.rank,
                self.ordinal()
            )));
        }
        Ok(())
    }

    /// An out-of-place collective: checks, then one kernel on this rank's stream.
    fn collective<S: DevicePtr<T>, R: DevicePtrMut<T>, T: NcclType>(
        &self,
        spec: CollectiveSpec,
        sendbuff: &S,
        recvbuff: &mut R,
    ) -> Result<Status, Error> {
        spec.validate()?;
        spec.check_buffers(self.rank as u32, sendbuff.len() as u64, recvbuff.len() as u64)?;
        self.check_device(sendbuff)?;
        self.check_device(recvbuff)?;
        let (input, _record_in) = sendbuff.device_ptr(&self.stream);
        let (output, _record_out) = recvbuff.device_ptr_mut(&self.stream);
        self.collective_at(spec, input, output)
    }

    /// An out-of-place call on device pointers the caller checked against `spec` (0 for a
    /// side of no bytes, which no plan touches and no symmetric buffer matches) and keeps
    /// alive and ordered on this stream until the launch is enqueued.
    fn collective_at(&self, spec: CollectiveSpec, input: u64, output: u64) -> Result<Status, Error> {
        let peers = self.peer_buffers(&spec, false, input, output)?;
        let prepared = self.prepared(spec, false, peers.flags())?;
        self.launch_prepared(&prepared, input, output, &peers)
    }

    /// An in-place call on one buffer: the plan's alias says where in it the input or the
    /// output lies (AllReduce: both the whole buffer; AllGather: the input is this rank's
    /// partition; ReduceScatter: the output is).
    fn collective_in_place<R: DevicePtrMut<T>, T: NcclType>(
        &self,
        spec: CollectiveSpec,
        buff: &mut R,
    ) -> Result<Status, Error> {
        spec.validate()?;
        self.check_device(buff)?;
        let bytes = (buff.len() * std::mem::size_of::<T>()) as u64;
        let (ptr, _record) = buff.device_ptr_mut(&self.stream);
        let peers = self.peer_buffers(&spec, true, ptr, ptr)?;
        let prepared = self.prepared(spec, true, peers.flags())?;
        let (input_at, output_at) = in_place_offsets(&prepared.plan, bytes)?;
        self.launch_prepared(&prepared, ptr + input_at, ptr + output_at, &peers)
    }
}

/// Where a plan's input and output lie in the one buffer of an in-place call of `bytes`
/// bytes (its alias: AllReduce both at 0; AllGather the input at this rank's partition;
/// ReduceScatter the output), checked to fit.
pub(super) fn in_place_offsets(plan: &purlin_snac::Plan, bytes: u64) -> Result<(u64, u64), Error> {
    let res = plan.resources;
    let (input_at, output_at) = match res.alias {
        Some(purlin_snac::Alias::InputInOutput(o)) => (o, 0),
        Some(purlin_snac::Alias::OutputInInput(o)) => (0, o),
        None => (0, 0),
    };
    if input_at + res.input_bytes > bytes || output_at + res.output_bytes > bytes {
        return Err(Error::InvalidArgument(format!(
            "{:?} in place: a {bytes}-byte buffer does not hold the call's input ({} bytes at {input_at}) \
             and output ({} bytes at {output_at})",
            plan.spec.collective, res.input_bytes, res.output_bytes
        )));
    }
    Ok((input_at, output_at))
}
