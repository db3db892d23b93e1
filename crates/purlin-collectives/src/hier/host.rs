//! [`CpuHierComm`]: the host twin of the hierarchical communicator, simulated nodes as threads
//! of one process. Inside each "node" a [`CpuComm`] world runs Purlin's verified plans; between
//! nodes the rail is another `CpuComm` world per local rank — a test double for the network
//! engine (the GPU communicator's rail is NCCL). AllToAll(V), Broadcast, Reduce and
//! send/receive go whole to a `CpuComm` over the world, as the GPU communicator sends them to
//! NCCL's world communicator (send/receive: the host executor's, at world 2 only).
//!
//! What it is for: checking the composition and the layouts ([`super::plan`]) exactly, with
//! the same step sequence the GPU communicator runs.

use super::{Buf, Coll, HierCall, HierShape, HierState, Io, LevelComm, Region, offsets, plan};
use crate::call::types::{ReduceOp, ReduceType, Status};
use crate::call::{Call, counts_u64};
use crate::cpu::{CpuComm, CpuConfig, CpuType};
use crate::error::Error;

/// One rank of a hierarchical world of threads: `nodes` simulated nodes of `local` ranks.
#[derive(Debug)]
pub struct CpuHierComm {
    state: HierState,
    /// The node's ranks (`None` with one rank per node).
    node: Option<CpuComm>,
    /// The ranks of this local rank on every node (`None` on one node).
    rail: Option<CpuComm>,
    /// The whole world, for the delegated calls (`None` where one level spans it).
    world: Option<CpuComm>,
}

/// A call's buffers, as regions of a plan address them.
struct HostMem<'a, T> {
    send: Option<&'a [T]>,
    recv: &'a mut [T],
    scratch: Vec<T>,
}

fn out_of_bounds(r: Region, len: usize) -> Error {
    Error::InvalidArgument(format!("a step's region {r:?} lies outside its buffer of {len} elements"))
}

impl<T: CpuType> HostMem<'_, T> {
    /// The input and output of a step whose regions lie in different buffers.
    fn pair(&mut self, s: Region, r: Region) -> Result<(&[T], &mut [T]), Error> {
        let HostMem { send, recv, scratch } = self;
        let no_send = || Error::InvalidArgument("an in-place call's plan reads a send buffer".into());
        let (src, dst): (&[T], &mut [T]) = match (s.buf, r.buf) {
            (Buf::Send, Buf::Recv) => (send.ok_or_else(no_send)?, &mut **recv),
            (Buf::Send, Buf::Scratch) => (send.ok_or_else(no_send)?, scratch.as_mut_slice()),
            (Buf::Recv, Buf::Scratch) => (&**recv, scratch.as_mut_slice()),
            (Buf::Scratch, Buf::Recv) => (scratch.as_slice(), &mut **recv),
            _ => return Err(Error::InvalidArgument(format!("a step reads and writes one buffer: {s:?}, {r:?}"))),
        };
        let (slen, dlen) = (src.len(), dst.len());
        let src = src.get(s.offset..s.end()).ok_or_else(|| out_of_bounds(s, slen))?;
        let dst = dst.get_mut(r.offset..r.end()).ok_or_else(|| out_of_bounds(r, dlen))?;
        Ok((src, dst))
    }

    /// The one region of an in-place step.
    fn one(&mut self, r: Region) -> Result<&mut [T], Error> {
        let buf: &mut [T] = match r.buf {
            Buf::Recv => self.recv,
            Buf::Scratch => &mut self.scratch,
            Buf::Send => return Err(Error::InvalidArgument("an in-place step on the send buffer".into())),
        };
        let len = buf.len();
        buf.get_mut(r.offset..r.end()).ok_or_else(|| out_of_bounds(r, len))
    }
}

impl<T: CpuType> LevelComm<HostMem<'_, T>> for CpuComm {
    fn rank(&self) -> usize {
        CpuComm::rank(self)
    }

    fn size(&self) -> usize {
        self.world_size()
    }

    fn run(&self, mem: &mut HostMem<'_, T>, coll: &Coll, io: &Io) -> Result<(), Error> {
        match *io {
            Io::Separate { send, recv } => {
                let (s, r) = mem.pair(send, recv)?;
                match coll {
                    // Reductions pick their type at run time here (`call_any`).
                    Coll::AllReduce(op) => self.call_any(Call::AllReduce { len: s.len(), op: *op }, s, r),
                    Coll::ReduceScatter(op) => self.call_any(Call::ReduceScatter { len: r.len(), op: *op }, s, r),
                    Coll::ReduceScatterV(counts, op) => {
                        self.call_any(Call::ReduceScatterV { counts: counts_u64(counts), op: *op }, s, r)
                    }
                    Coll::AllGather => self.all_gather(s, r),
                    Coll::AllGatherV(counts) => self.all_gather_v(s, r, counts),
                }
            }
            Io::InPlace(region) => {
                let b = mem.one(region)?;
                match coll {
                    Coll::AllReduce(op) => self.call_any_in_place(Call::AllReduce { len: b.len(), op: *op }, b),
                    Coll::ReduceScatter(op) => {
                        self.call_any_in_place(Call::ReduceScatterInPlace { len: b.len(), op: *op }, b)
                    }
                    Coll::AllGather => self.all_gather_in_place(b),
                    Coll::AllGatherV(counts) => {
                        // This rank's part is at its place; the host executor gathers out of place.
                        let me = CpuComm::rank(self);
                        let at = offsets(counts);
                        let mine = b.get(at[me]..at[me + 1]).ok_or_else(|| out_of_bounds(region, b.len()))?.to_vec();
                        self.all_gather_v(&mine[..], b, counts)
                    }
                    Coll::ReduceScatterV(..) => Err(Error::Unsupported("an in-place ReduceScatterV step".into())),
                }
            }
        }
        .map(drop)
    }
}

impl CpuHierComm {
    /// One communicator per rank of `nodes` simulated nodes of `local` ranks, in global rank
    /// order (`node × local + local_rank`), with the default host configuration. Give rank
    /// `g`'s to thread `g`.
    ///
    /// ```
    /// use purlin_collectives::{CpuHierComm, ReduceOp};
    ///
    /// // Two "nodes" of two ranks: global ranks 0, 1 on node 0 and 2, 3 on node 1.
    /// let comms = CpuHierComm::threads(2, 2)?;
    /// std::thread::scope(|s| {
    ///     for comm in &comms {
    ///         s.spawn(move || {
    ///             let send = vec![comm.rank() as f32; 4];
    ///             let mut recv = vec![0.0f32; 4];
    ///             comm.all_reduce(&send, &mut recv, &ReduceOp::Sum).expect("all_reduce");
    ///             assert_eq!(recv, [6.0; 4]);
    ///         });
    ///     }
    /// });
    /// # Ok::<(), purlin_collectives::Error>(())
    /// ```
    pub fn threads(nodes: usize, local: usize) -> Result<Vec<CpuHierComm>, Error> {
        Self::threads_with_config(nodes, local, CpuConfig::default())
    }

    /// [`CpuHierComm::threads`] with a configuration (for every level's `CpuComm`).
    pub fn threads_with_config(nodes: usize, local: usize, config: CpuConfig) -> Result<Vec<CpuHierComm>, Error> {
        HierShape::new(nodes, local, 0)?;
        let world = nodes * local;
        if !purlin_snac::WORLD_RANGE.contains(&world) {
            return Err(purlin_snac::SpecError::WorldOutOfRange { world: world.min(u32::MAX as usize) as u32 }.into());
        }
        let level = |size: usize| -> Result<Vec<Option<CpuComm>>, Error> {
            Ok(if size > 1 {
                CpuComm::threads_with_config(size, config)?.into_iter().map(Some).collect()
            } else {
                (0..size).map(|_| None).collect()
            })
        };
        let mut nodes_comms: Vec<Vec<Option<CpuComm>>> = (0..nodes).map(|_| level(local)).collect::<Result<_, _>>()?;
        let mut rails: Vec<Vec<Option<CpuComm>>> = (0..local).map(|_| level(nodes)).collect::<Result<_, _>>()?;
        let mut whole: Vec<Option<CpuComm>> =
            if nodes > 1 && local > 1 { level(world)? } else { (0..world).map(|_| None).collect() };
        let mut comms = Vec::with_capacity(world);
        for (g, whole) in whole.iter_mut().enumerate() {
            let shape = HierShape::new(nodes, local, g)?;
            comms.push(CpuHierComm {
                state: HierState::new(shape),
                node: nodes_comms[shape.node][shape.local_rank].take(),
                rail: rails[shape.local_rank][shape.node].take(),
                world: whole.take(),
            });
        }
        Ok(comms)
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

    /// `Err(Error::Poisoned)` once a call failed after it had begun moving data, or a level's
    /// world is poisoned.
    pub fn async_error(&self) -> Result<(), Error> {
        self.state.check()?;
        for c in [&self.node, &self.rail, &self.world].into_iter().flatten() {
            c.async_error()?;
        }
        Ok(())
    }

    /// The communicator spanning the whole world.
    fn whole(&self) -> Result<&CpuComm, Error> {
        let s = self.state.shape();
        let c = if s.nodes == 1 {
            &self.node
        } else if s.local == 1 {
            &self.rail
        } else {
            &self.world
        };
        c.as_ref().ok_or_else(|| Error::InvalidArgument("a world of one rank".into()))
    }

    /// A call delegated to the world communicator: its errors already name global ranks.
    fn delegate(&self, f: impl FnOnce(&CpuComm) -> Result<Status, Error>) -> Result<Status, Error> {
        self.state.check()?;
        let r = f(self.whole()?);
        if let Err(e) = &r {
            if e.is_peer_failure() || matches!(e, Error::Poisoned(_) | Error::Mismatch { .. }) {
                self.state.poison(format!("rank {}: a delegated call failed: {e}", self.rank()));
            }
        }
        r
    }

    fn hier<T: CpuType>(&self, call: HierCall, send: Option<&[T]>, recv: &mut [T]) -> Result<Status, Error> {
        self.state.check()?;
        let plan = plan(self.state.shape(), &call, send.map(<[T]>::len), recv.len())?;
        // The scratch is written before it is read; any element fills it.
        let fill = send.and_then(|s| s.first()).or(recv.first()).copied();
        let scratch = match fill {
            Some(x) => vec![x; plan.scratch],
            None => Vec::new(),
        };
        let mut mem = HostMem { send, recv, scratch };
        let node = self.node.as_ref().map(|c| c as &dyn LevelComm<HostMem<'_, T>>);
        let rail = self.rail.as_ref().map(|c| c as &dyn LevelComm<HostMem<'_, T>>);
        self.state.execute(&plan, node, rail, &mut mem)?;
        Ok(Status::Success)
    }

    /// AllReduce over the world: node ReduceScatter, rail AllReduce of the shard, node AllGather.
    pub fn all_reduce<T: CpuType + ReduceType>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.hier(HierCall::AllReduce(*op), Some(send), recv)
    }

    /// In-place AllReduce.
    pub fn all_reduce_in_place<T: CpuType + ReduceType>(&self, buf: &mut [T], op: &ReduceOp) -> Result<Status, Error> {
        self.hier(HierCall::AllReduce(*op), None, buf)
    }

    /// ReduceScatter over the world (rail, then node): `send` holds `world × recv.len()`.
    pub fn reduce_scatter<T: CpuType + ReduceType>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.hier(HierCall::ReduceScatter(*op), Some(send), recv)
    }

    /// In-place ReduceScatter (NCCL's convention: the result at partition `rank`).
    pub fn reduce_scatter_in_place<T: CpuType + ReduceType>(
        &self,
        buf: &mut [T],
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.hier(HierCall::ReduceScatter(*op), None, buf)
    }

    /// AllGather over the world (node, then rail).
    pub fn all_gather<T: CpuType>(&self, send: &[T], recv: &mut [T]) -> Result<Status, Error> {
        self.hier(HierCall::AllGather, Some(send), recv)
    }

    /// In-place AllGather (this rank's part already at partition `rank`).
    pub fn all_gather_in_place<T: CpuType>(&self, buf: &mut [T]) -> Result<Status, Error> {
        self.hier(HierCall::AllGather, None, buf)
    }

    /// AllGatherV: global rank `g` contributes `counts[g]` elements.
    pub fn all_gather_v<T: CpuType>(&self, send: &[T], recv: &mut [T], counts: &[usize]) -> Result<Status, Error> {
        self.hier(HierCall::AllGatherV(counts.to_vec()), Some(send), recv)
    }

    /// ReduceScatterV: global rank `g` receives `counts[g]` elements.
    pub fn reduce_scatter_v<T: CpuType + ReduceType>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: &ReduceOp,
    ) -> Result<Status, Error> {
        self.hier(HierCall::ReduceScatterV(counts.to_vec(), *op), Some(send), recv)
    }

    /// AllToAll, delegated to the world communicator.
    pub fn all_to_all<T: CpuType>(&self, send: &[T], recv: &mut [T]) -> Result<Status, Error> {
        self.delegate(|w| w.all_to_all(send, recv))
    }

    /// AllToAllV (`counts[src][dst]`, the whole matrix), delegated to the world communicator.
    pub fn all_to_all_v<T: CpuType, C: AsRef<[usize]>>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[C],
    ) -> Result<Status, Error> {
        self.delegate(|w| w.all_to_all_v(send, recv, counts))
    }

    /// Broadcast from global rank `root`, delegated to the world communicator.
    pub fn broadcast<T: CpuType>(&self, send: Option<&[T]>, recv: &mut [T], root: i32) -> Result<Status, Error> {
        self.delegate(|w| w.broadcast(send, recv, root))
    }

    /// In-place Broadcast, delegated to the world communicator.
    pub fn broadcast_in_place<T: CpuType>(&self, buf: &mut [T], root: i32) -> Result<Status, Error> {
        self.delegate(|w| w.broadcast_in_place(buf, root))
    }

    /// Reduce to global rank `root`, delegated to the world communicator.
    pub fn reduce<T: CpuType + ReduceType>(
        &self,
        send: &[T],
        recv: Option<&mut [T]>,
        op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        self.delegate(|w| w.reduce(send, recv, op, root))
    }

    /// In-place Reduce, delegated to the world communicator.
    pub fn reduce_in_place<T: CpuType + ReduceType>(
        &self,
        buf: &mut [T],
        op: &ReduceOp,
        root: i32,
    ) -> Result<Status, Error> {
        self.delegate(|w| w.reduce_in_place(buf, op, root))
    }

    /// Send to global rank `peer`, delegated to the world communicator (the host executor's
    /// send/receive: a world of two only).
    pub fn send<T: CpuType>(&self, send: &[T], peer: i32) -> Result<(), Error> {
        self.delegate(|w| w.send(send, peer).map(|()| Status::Success)).map(drop)
    }

    /// Receive from global rank `peer`, delegated as [`CpuHierComm::send`].
    pub fn recv<T: CpuType>(&self, recv: &mut [T], peer: i32) -> Result<Status, Error> {
        self.delegate(|w| w.recv(recv, peer))
    }
}
