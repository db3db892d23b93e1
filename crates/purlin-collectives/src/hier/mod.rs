//! Beyond one node: the hierarchical algorithm, backend-neutral (docs/multi-node.md).
//!
//! A world of `nodes × local` ranks, global rank `node × local + local_rank` (torchrun's
//! numbering), talks on two levels: the **node** (the `local` ranks of one node, Purlin's
//! single-kernel collectives) and the **rail** (the `nodes` ranks with the same local rank,
//! one per node: the network engine's communicator). The collectives that reduce or gather
//! compose the two, in the order whose every step works on contiguous regions:
//!
//! - AllReduce: node ReduceScatter → rail AllReduce of this rank's `1/local` shard → node
//!   AllGather (the V forms and a scratch shard where `local` does not divide the count);
//! - ReduceScatter: rail ReduceScatter of this node's block (`local × count`, into scratch)
//!   → node ReduceScatter of it;
//! - AllGather: node AllGather into this node's block of the output → rail AllGather in place;
//! - the V forms the same way, with per-node totals on the rail.
//!
//! Results are laid out exactly as the flat calls over the whole world lay them out. A world
//! of one node uses the node level alone (today's path); one rank per node, the rail alone.
//! Everything else (AllToAll and its V form, Broadcast, Reduce, send/receive) is delegated
//! whole to a world communicator by the backends.
//!
//! A call is a [`Plan`]: steps, each one collective of one level on [`Region`]s of the call's
//! buffers. Backends implement [`LevelComm`] for each level (the host twin: `CpuComm` worlds
//! for both, [`host`]; the GPU: Purlin's `Comm` for the node, NCCL for the rail), and
//! [`HierState::execute`] runs a plan: errors come back with global ranks, and a failure
//! once a step may have moved data poisons the communicator.

pub mod host;

use std::sync::Mutex;

use crate::call::types::ReduceOp;
use crate::error::Error;

/// Where a rank sits in a world of `nodes` nodes of `local` ranks each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HierShape {
    /// Nodes.
    pub nodes: usize,
    /// Ranks per node.
    pub local: usize,
    /// This rank's node.
    pub node: usize,
    /// This rank within its node (`LOCAL_RANK`).
    pub local_rank: usize,
}

impl HierShape {
    /// Global rank `rank` of a world of `nodes × local` ranks.
    pub fn new(nodes: usize, local: usize, rank: usize) -> Result<HierShape, Error> {
        if nodes == 0 || local == 0 {
            return Err(Error::InvalidArgument(format!("a world of {nodes} nodes of {local} ranks")));
        }
        let world = nodes
            .checked_mul(local)
            .ok_or_else(|| Error::InvalidArgument(format!("{nodes} nodes of {local} ranks overflow")))?;
        if rank >= world {
            return Err(Error::InvalidArgument(format!("rank {rank} of a world of {nodes} × {local} = {world}")));
        }
        Ok(HierShape { nodes, local, node: rank / local, local_rank: rank % local })
    }

    /// Ranks in the world.
    pub fn world(&self) -> usize {
        self.nodes * self.local
    }

    /// This rank's global rank.
    pub fn rank(&self) -> usize {
        self.node * self.local + self.local_rank
    }

    /// The global rank of rank `peer` of `level` (as this rank's communicator of that level
    /// numbers it).
    pub fn global(&self, level: Level, peer: usize) -> usize {
        match level {
            Level::Node => self.node * self.local + peer,
            Level::Rail => peer * self.local + self.local_rank,
        }
    }
}

/// A level of the hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// The ranks of this node (Purlin).
    Node,
    /// The ranks with this local rank, one per node.
    Rail,
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Level::Node => "node",
            Level::Rail => "rail",
        })
    }
}

/// Which of a call's buffers a region lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    /// The user's send buffer.
    Send,
    /// The user's receive buffer (the one buffer of an in-place call).
    Recv,
    /// The call's scratch ([`Plan::scratch`] elements).
    Scratch,
}

/// `len` elements at element `offset` of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// The buffer.
    pub buf: Buf,
    /// First element.
    pub offset: usize,
    /// Elements.
    pub len: usize,
}

impl Region {
    fn new(buf: Buf, offset: usize, len: usize) -> Region {
        Region { buf, offset, len }
    }

    /// One past the last element.
    pub fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// A step's input and output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Io {
    /// Input and output in different buffers.
    Separate {
        /// The input.
        send: Region,
        /// The output.
        recv: Region,
    },
    /// One region, NCCL's in-place convention: AllReduce on the whole; AllGather with this
    /// rank's part already at its place; ReduceScatter with the result at this rank's part.
    InPlace(Region),
}

/// A collective one level runs (counts are the level's, in its rank order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coll {
    /// AllReduce.
    AllReduce(ReduceOp),
    /// ReduceScatter of equal parts.
    ReduceScatter(ReduceOp),
    /// ReduceScatterV: part `p` has `counts[p]` elements.
    ReduceScatterV(Vec<usize>, ReduceOp),
    /// AllGather of equal parts.
    AllGather,
    /// AllGatherV: rank `p` contributes `counts[p]` elements.
    AllGatherV(Vec<usize>),
}

/// One collective of one level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The level that runs it.
    pub level: Level,
    /// The collective.
    pub coll: Coll,
    /// Its regions.
    pub io: Io,
}

/// A hierarchical call: its steps, in order, and the scratch they need (elements).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The steps.
    pub steps: Vec<Step>,
    /// Scratch elements ([`Buf::Scratch`]).
    pub scratch: usize,
}

/// A collective of the whole world that the hierarchy composes, as the user called it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HierCall {
    /// AllReduce.
    AllReduce(ReduceOp),
    /// ReduceScatter: every rank receives an equal part.
    ReduceScatter(ReduceOp),
    /// ReduceScatterV: global rank `g` receives `counts[g]` elements.
    ReduceScatterV(Vec<usize>, ReduceOp),
    /// AllGather: every rank contributes an equal part.
    AllGather,
    /// AllGatherV: global rank `g` contributes `counts[g]` elements.
    AllGatherV(Vec<usize>),
}

impl HierCall {
    fn name(&self) -> &'static str {
        match self {
            HierCall::AllReduce(_) => "all_reduce",
            HierCall::ReduceScatter(_) => "reduce_scatter",
            HierCall::ReduceScatterV(..) => "reduce_scatter_v",
            HierCall::AllGather => "all_gather",
            HierCall::AllGatherV(_) => "all_gather_v",
        }
    }
}

fn bad(call: &HierCall, what: String) -> Error {
    Error::InvalidArgument(format!("{}: {what}", call.name()))
}

/// Offsets of consecutive parts of these sizes (one more than parts: the total last).
pub fn offsets(counts: &[usize]) -> Vec<usize> {
    let mut at = Vec::with_capacity(counts.len() + 1);
    let mut sum = 0usize;
    at.push(0);
    for &c in counts {
        sum += c;
        at.push(sum);
    }
    at
}

/// The plan of `call` at this rank. `send_len` is the send buffer's length, `None` in place;
/// `recv_len` the receive (or only) buffer's. Lengths are checked here, before anything
/// moves: a mismatch is [`Error::InvalidArgument`].
pub fn plan(shape: &HierShape, call: &HierCall, send_len: Option<usize>, recv_len: usize) -> Result<Plan, Error> {
    let (n, l, w, g) = (shape.nodes, shape.local, shape.world(), shape.rank());
    let node_counts =
        |counts: &[usize]| -> Vec<usize> { (0..n).map(|m| counts[m * l..(m + 1) * l].iter().sum::<usize>()).collect() };
    // Checks the lengths and says what each level sees.
    let check_counts = |counts: &Vec<usize>| -> Result<(), Error> {
        if counts.len() != w {
            return Err(bad(call, format!("{} counts for a world of {w}", counts.len())));
        }
        counts
            .iter()
            .try_fold(0usize, |a, &c| a.checked_add(c))
            .map(drop)
            .ok_or_else(|| bad(call, "counts overflow".into()))
    };
    let (send_len_expected, recv_len_expected) = match call {
        HierCall::AllReduce(_) => (recv_len, recv_len),
        HierCall::ReduceScatter(_) => match send_len {
            Some(s) => (recv_len.checked_mul(w).ok_or_else(|| bad(call, "length overflows".into()))?, s / w.max(1)),
            None => (recv_len, recv_len),
        },
        HierCall::AllGather => match send_len {
            Some(s) => (s, s.checked_mul(w).ok_or_else(|| bad(call, "length overflows".into()))?),
            None => (recv_len, recv_len),
        },
        HierCall::ReduceScatterV(counts, _) => {
            check_counts(counts)?;
            (counts.iter().sum(), counts[g])
        }
        HierCall::AllGatherV(counts) => {
            check_counts(counts)?;
            (counts[g], counts.iter().sum())
        }
    };
    match (call, send_len) {
        (HierCall::ReduceScatterV(..) | HierCall::AllGatherV(_), None) => {
            return Err(bad(call, "the V forms have no in-place form".into()));
        }
        (HierCall::ReduceScatter(_) | HierCall::AllGather, None) if recv_len % w != 0 => {
            return Err(bad(call, format!("in place, the buffer's {recv_len} elements are not {w} equal parts")));
        }
        (_, Some(s)) if s != send_len_expected || recv_len != recv_len_expected => {
            return Err(bad(
                call,
                format!(
                    "send {s} and receive {recv_len} elements; a world of {w} needs send {send_len_expected}, \
                     receive {recv_len_expected}"
                ),
            ));
        }
        _ => {}
    }
    let send = |offset, len| Region::new(if send_len.is_some() { Buf::Send } else { Buf::Recv }, offset, len);
    let recv = |offset, len| Region::new(Buf::Recv, offset, len);
    let scratch = |offset, len| Region::new(Buf::Scratch, offset, len);
    let user_io = |send_total: usize| match send_len {
        Some(_) => Io::Separate { send: send(0, send_total), recv: recv(0, recv_len) },
        None => Io::InPlace(recv(0, recv_len)),
    };
    let step = |level, coll, io| Step { level, coll, io };
    let total_in = send_len.unwrap_or(recv_len);

    // One level: the call as it is.
    if n == 1 || l == 1 {
        let level = if n == 1 { Level::Node } else { Level::Rail };
        let coll = match call.clone() {
            HierCall::AllReduce(op) => Coll::AllReduce(op),
            HierCall::ReduceScatter(op) => Coll::ReduceScatter(op),
            HierCall::ReduceScatterV(c, op) => Coll::ReduceScatterV(c, op),
            HierCall::AllGather => Coll::AllGather,
            HierCall::AllGatherV(c) => Coll::AllGatherV(c),
        };
        return Ok(Plan { steps: vec![step(level, coll, user_io(total_in))], scratch: 0 });
    }

    let mut steps = Vec::with_capacity(3);
    let mut scratch_len = 0;
    match call {
        HierCall::AllReduce(op) => {
            let len = recv_len;
            if len == 0 {
                return Ok(Plan::default());
            }
            if len % l == 0 {
                // Each rank's shard of the node's sum lands at its place in the output.
                let s = len / l;
                let shard = recv(shape.local_rank * s, s);
                let first = match send_len {
                    Some(_) => Io::Separate { send: send(0, len), recv: shard },
                    None => Io::InPlace(recv(0, len)),
                };
                steps.push(step(Level::Node, Coll::ReduceScatter(*op), first));
                steps.push(step(Level::Rail, Coll::AllReduce(*op), Io::InPlace(shard)));
                steps.push(step(Level::Node, Coll::AllGather, Io::InPlace(recv(0, len))));
            } else {
                // Uneven shards: the V forms, through a scratch shard.
                let counts: Vec<usize> = (0..l).map(|p| len / l + usize::from(p < len % l)).collect();
                let mine = counts[shape.local_rank];
                scratch_len = counts[0];
                steps.push(step(
                    Level::Node,
                    Coll::ReduceScatterV(counts.clone(), *op),
                    Io::Separate { send: send(0, len), recv: scratch(0, mine) },
                ));
                if mine > 0 {
                    steps.push(step(Level::Rail, Coll::AllReduce(*op), Io::InPlace(scratch(0, mine))));
                }
                steps.push(step(
                    Level::Node,
                    Coll::AllGatherV(counts),
                    Io::Separate { send: scratch(0, mine), recv: recv(0, len) },
                ));
            }
        }
        HierCall::ReduceScatter(op) => {
            // Inter, then intra: the rail reduces this node's block (its ranks' parts, contiguous).
            let c = if send_len.is_some() { recv_len } else { recv_len / w };
            if c == 0 {
                return Ok(Plan::default());
            }
            let block = l * c;
            scratch_len = block;
            steps.push(step(
                Level::Rail,
                Coll::ReduceScatter(*op),
                Io::Separate { send: send(0, w * c), recv: scratch(0, block) },
            ));
            let out = if send_len.is_some() { recv(0, c) } else { recv(g * c, c) };
            steps.push(step(
                Level::Node,
                Coll::ReduceScatter(*op),
                Io::Separate { send: scratch(0, block), recv: out },
            ));
        }
        HierCall::AllGather => {
            // Intra, then inter: the node's block is gathered at its place, then the rail
            // gathers the blocks in place.
            let c = send_len.unwrap_or(recv_len / w);
            if c == 0 {
                return Ok(Plan::default());
            }
            let block = recv(shape.node * l * c, l * c);
            let first = match send_len {
                Some(_) => Io::Separate { send: send(0, c), recv: block },
                None => Io::InPlace(block),
            };
            steps.push(step(Level::Node, Coll::AllGather, first));
            steps.push(step(Level::Rail, Coll::AllGather, Io::InPlace(recv(0, w * c))));
        }
        HierCall::ReduceScatterV(counts, op) => {
            let per_node = node_counts(counts);
            let at = offsets(counts);
            let total = at[w];
            let mine = per_node[shape.node];
            scratch_len = mine;
            if total > 0 {
                steps.push(step(
                    Level::Rail,
                    Coll::ReduceScatterV(per_node.clone(), *op),
                    Io::Separate { send: send(0, total), recv: scratch(0, mine) },
                ));
            }
            if mine > 0 {
                let ours = counts[shape.node * l..(shape.node + 1) * l].to_vec();
                steps.push(step(
                    Level::Node,
                    Coll::ReduceScatterV(ours, *op),
                    Io::Separate { send: scratch(0, mine), recv: recv(0, counts[g]) },
                ));
            }
        }
        HierCall::AllGatherV(counts) => {
            let per_node = node_counts(counts);
            let at = offsets(counts);
            let total = at[w];
            let mine = per_node[shape.node];
            if mine > 0 {
                let ours = counts[shape.node * l..(shape.node + 1) * l].to_vec();
                steps.push(step(
                    Level::Node,
                    Coll::AllGatherV(ours),
                    Io::Separate { send: send(0, counts[g]), recv: recv(at[shape.node * l], mine) },
                ));
            }
            if total > 0 {
                steps.push(step(Level::Rail, Coll::AllGatherV(per_node), Io::InPlace(recv(0, total))));
            }
        }
    }
    Ok(Plan { steps, scratch: scratch_len })
}

/// One level's communicator as the hierarchical algorithm drives it, on the memory `M` of one
/// call (which maps [`Region`]s to the call's buffers). The node's and the rail's
/// communicators both implement it.
pub trait LevelComm<M: ?Sized> {
    /// This rank within the level.
    fn rank(&self) -> usize;
    /// The level's ranks.
    fn size(&self) -> usize;
    /// Runs one collective of this level on regions of the call's memory. Its errors name
    /// ranks as this level numbers them ([`HierState::execute`] makes them global).
    fn run(&self, mem: &mut M, coll: &Coll, io: &Io) -> Result<(), Error>;
}

/// What every backend's hierarchical communicator shares: its shape and its poison.
#[derive(Debug)]
pub struct HierState {
    shape: HierShape,
    poison: Mutex<Option<String>>,
}

impl HierState {
    /// A fresh state.
    pub fn new(shape: HierShape) -> HierState {
        HierState { shape, poison: Mutex::new(None) }
    }

    /// The shape.
    pub fn shape(&self) -> &HierShape {
        &self.shape
    }

    /// `Err(Error::Poisoned)` once a call failed after a step had begun.
    pub fn check(&self) -> Result<(), Error> {
        match self.poison.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            Some(why) => Err(Error::Poisoned(why)),
            None => Ok(()),
        }
    }

    /// Poisons the communicator (the first reason stays).
    pub fn poison(&self, why: String) {
        self.poison.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(why);
    }

    /// Runs `plan` on the levels (`None` for a level of one rank, which a plan never uses).
    /// The first failure ends the call: its error names global ranks; unless it is the first
    /// step's refusal of its arguments (every rank refuses alike, nothing moved), it poisons
    /// this communicator, since peers may be inside a later step.
    pub fn execute<M: ?Sized>(
        &self,
        plan: &Plan,
        node: Option<&dyn LevelComm<M>>,
        rail: Option<&dyn LevelComm<M>>,
        mem: &mut M,
    ) -> Result<(), Error> {
        self.check()?;
        for (i, step) in plan.steps.iter().enumerate() {
            let comm = match step.level {
                Level::Node => node,
                Level::Rail => rail,
            };
            let Some(comm) = comm else {
                return Err(Error::InvalidArgument(format!("no {} communicator for a step of this plan", step.level)));
            };
            let (want_size, want_rank) = match step.level {
                Level::Node => (self.shape.local, self.shape.local_rank),
                Level::Rail => (self.shape.nodes, self.shape.node),
            };
            if (comm.size(), comm.rank()) != (want_size, want_rank) {
                return Err(Error::InvalidArgument(format!(
                    "the {} communicator is rank {} of {}; this rank's place is {want_rank} of {want_size}",
                    step.level,
                    comm.rank(),
                    comm.size()
                )));
            }
            if let Err(e) = comm.run(mem, &step.coll, &step.io) {
                let refused = i == 0
                    && matches!(e, Error::InvalidArgument(_) | Error::Spec(_) | Error::Unsupported(_) | Error::Plan(_));
                let e = self.globalize(step.level, e);
                if !refused {
                    self.poison(format!(
                        "rank {}: the {} step of a hierarchical call failed: {e}",
                        self.shape.rank(),
                        step.level
                    ));
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// `e`, from a communicator of `level`, with global ranks.
    pub fn globalize(&self, level: Level, e: Error) -> Error {
        let me = self.shape.rank();
        let g = |p: usize| self.shape.global(level, p);
        let on = |during: String| format!("{during}; {level} level, ranks global");
        match e {
            Error::Timeout { peer, waited, during, .. } => {
                Error::Timeout { rank: me, peer: g(peer), waited, during: on(during) }
            }
            Error::PeerLost { peer, during, .. } => Error::PeerLost { rank: me, peer: g(peer), during: on(during) },
            Error::DeviceTimeout { peer, waited, during, .. } => {
                Error::DeviceTimeout { rank: me, peer: g(peer), waited, during: on(during) }
            }
            Error::Mismatch { peer, what, .. } => Error::Mismatch { rank: me, peer: g(peer), what: on(what) },
            Error::PeerFailed { peer, during, error, .. } => {
                Error::PeerFailed { rank: me, peer: g(peer), during: on(during), error }
            }
            Error::Protocol { peer, what } => Error::Protocol { peer: peer.map(g), what: on(what) },
            Error::Poisoned(why) => Error::Poisoned(format!("{level} level (ranks numbered within it): {why}")),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes() -> Vec<(usize, usize)> {
        vec![(2, 2), (2, 4), (4, 2), (3, 3), (1, 4), (4, 1)]
    }

    /// Simulates a plan on every rank with plain vectors standing in for both levels, and
    /// checks each collective against its definition on the flat world: the layouts, not the
    /// libraries.
    fn simulate(
        nodes: usize,
        local: usize,
        call: &HierCall,
        inputs: &[Vec<i64>],
        in_place: bool,
        out_len: usize,
    ) -> Vec<Vec<i64>> {
        let w = nodes * local;
        let shapes: Vec<HierShape> = (0..w).map(|r| HierShape::new(nodes, local, r).unwrap()).collect();
        let plans: Vec<Plan> = shapes
            .iter()
            .map(|s| {
                let send_len = (!in_place).then(|| inputs[s.rank()].len());
                let recv_len = if in_place { inputs[s.rank()].len() } else { out_len_of(call, s, out_len) };
                plan(s, call, send_len, recv_len).unwrap()
            })
            .collect();
        let mut mem: Vec<[Vec<i64>; 3]> = (0..w)
            .map(|r| {
                let recv = if in_place { inputs[r].clone() } else { vec![-1; out_len_of(call, &shapes[r], out_len)] };
                [inputs[r].clone(), recv, vec![-7; plans[r].scratch]]
            })
            .collect();
        // Each rank runs its steps in order; a level's group runs a step when every member's
        // next step is of that level (a rail whose shard is empty skips its step entirely).
        let groups = |level| -> Vec<Vec<usize>> {
            match level {
                Level::Node => (0..nodes).map(|m| (0..local).map(|p| m * local + p).collect()).collect(),
                Level::Rail => (0..local).map(|p| (0..nodes).map(|m| m * local + p).collect()).collect(),
            }
        };
        let mut pc = vec![0usize; w];
        while (0..w).any(|r| pc[r] < plans[r].steps.len()) {
            let mut progressed = false;
            for level in [Level::Node, Level::Rail] {
                for group in groups(level) {
                    if !group.iter().all(|&r| plans[r].steps.get(pc[r]).is_some_and(|s| s.level == level)) {
                        continue;
                    }
                    progressed = true;
                    let ins: Vec<Vec<i64>> = group
                        .iter()
                        .map(|&r| {
                            let (s, _) = regions(&plans[r].steps[pc[r]].io);
                            mem[r][idx(s.buf)][s.offset..s.end()].to_vec()
                        })
                        .collect();
                    let first = plans[group[0]].steps[pc[group[0]]].coll.clone();
                    for (k, &r) in group.iter().enumerate() {
                        let step = &plans[r].steps[pc[r]];
                        assert_eq!(step.coll, first, "a group runs one collective");
                        let in_place = matches!(step.io, Io::InPlace(_));
                        let result = flat(&step.coll, &ins, k, group.len(), in_place);
                        let (dst, at) = match step.io {
                            Io::InPlace(reg) => match step.coll {
                                Coll::ReduceScatter(_) => (reg, k * (reg.len / group.len())),
                                _ => (reg, 0),
                            },
                            Io::Separate { recv, .. } => (recv, 0),
                        };
                        assert!(at + result.len() <= dst.len, "{step:?}");
                        mem[r][idx(dst.buf)][dst.offset + at..dst.offset + at + result.len()].copy_from_slice(&result);
                        pc[r] += 1;
                    }
                }
            }
            assert!(progressed, "the ranks' plans deadlock: {pc:?}");
        }
        mem.into_iter().map(|[_, r, _]| r).collect()
    }

    fn out_len_of(call: &HierCall, s: &HierShape, out_len: usize) -> usize {
        match call {
            HierCall::ReduceScatterV(c, _) => c[s.rank()],
            _ => out_len,
        }
    }

    fn idx(b: Buf) -> usize {
        match b {
            Buf::Send => 0,
            Buf::Recv => 1,
            Buf::Scratch => 2,
        }
    }

    fn regions(io: &Io) -> (Region, Region) {
        match *io {
            Io::Separate { send, recv } => (send, recv),
            Io::InPlace(r) => (r, r),
        }
    }

    /// One level's collective by definition (sum only), rank `k` of `n`, on every rank's input
    /// region (in place: every rank's whole buffer).
    fn flat(coll: &Coll, ins: &[Vec<i64>], k: usize, n: usize, in_place: bool) -> Vec<i64> {
        let sum = |lo: usize, hi: usize| -> Vec<i64> { (lo..hi).map(|i| ins.iter().map(|x| x[i]).sum()).collect() };
        match coll {
            Coll::AllReduce(_) => sum(0, ins[k].len()),
            Coll::ReduceScatter(_) => {
                let c = ins[k].len() / n;
                sum(k * c, (k + 1) * c)
            }
            Coll::ReduceScatterV(counts, _) => {
                let at = offsets(counts);
                sum(at[k], at[k + 1])
            }
            Coll::AllGather if in_place => {
                let c = ins[k].len() / n;
                (0..n).flat_map(|p| ins[p][p * c..(p + 1) * c].to_vec()).collect()
            }
            Coll::AllGather | Coll::AllGatherV(_) if !in_place => ins.concat(),
            Coll::AllGatherV(counts) => {
                let at = offsets(counts);
                (0..n).flat_map(|p| ins[p][at[p]..at[p + 1]].to_vec()).collect()
            }
            Coll::AllGather => unreachable!(),
        }
    }

    fn input(rank: usize, len: usize) -> Vec<i64> {
        (0..len).map(|i| (rank * 1000 + i) as i64).collect()
    }

    #[test]
    fn every_composed_collective_lays_out_its_result_as_the_flat_call() {
        for (nodes, local) in shapes() {
            let w = nodes * local;
            for in_place in [false, true] {
                for len in [w * 3, w * 3 + 1, local * 2 + 1, 1] {
                    // AllReduce.
                    let ins: Vec<Vec<i64>> = (0..w).map(|r| input(r, len)).collect();
                    let out = simulate(nodes, local, &HierCall::AllReduce(ReduceOp::Sum), &ins, in_place, len);
                    let want: Vec<i64> = (0..len).map(|i| ins.iter().map(|x| x[i]).sum()).collect();
                    for (r, o) in out.iter().enumerate() {
                        assert_eq!(o, &want, "all_reduce {nodes}×{local} len {len} in place {in_place}, rank {r}");
                    }
                }
                for c in [1, 3] {
                    // ReduceScatter.
                    let ins: Vec<Vec<i64>> = (0..w).map(|r| input(r, w * c)).collect();
                    let out = simulate(nodes, local, &HierCall::ReduceScatter(ReduceOp::Sum), &ins, in_place, c);
                    for (r, o) in out.iter().enumerate() {
                        let part: Vec<i64> = (r * c..(r + 1) * c).map(|i| ins.iter().map(|x| x[i]).sum()).collect();
                        let got = if in_place { &o[r * c..(r + 1) * c] } else { &o[..] };
                        assert_eq!(
                            got,
                            &part[..],
                            "reduce_scatter {nodes}×{local} c {c} in place {in_place}, rank {r}"
                        );
                        if in_place {
                            assert_eq!(&o[..r * c], &ins[r][..r * c], "the rest of the buffer is left as it was");
                        }
                    }
                    // AllGather.
                    let ins: Vec<Vec<i64>> = if in_place {
                        (0..w)
                            .map(|r| {
                                let mut b = vec![-3; w * c];
                                b[r * c..(r + 1) * c].copy_from_slice(&input(r, c));
                                b
                            })
                            .collect()
                    } else {
                        (0..w).map(|r| input(r, c)).collect()
                    };
                    let out = simulate(nodes, local, &HierCall::AllGather, &ins, in_place, w * c);
                    let want: Vec<i64> = (0..w).flat_map(|r| input(r, c)).collect();
                    for (r, o) in out.iter().enumerate() {
                        assert_eq!(o, &want, "all_gather {nodes}×{local} c {c} in place {in_place}, rank {r}");
                    }
                }
            }
            // The V forms, with zero counts among them.
            let counts: Vec<usize> = (0..w).map(|r| (r * 7 + 3) % 5).collect();
            let total: usize = counts.iter().sum();
            let at = offsets(&counts);
            let ins: Vec<Vec<i64>> = (0..w).map(|r| input(r, total)).collect();
            let out = simulate(nodes, local, &HierCall::ReduceScatterV(counts.clone(), ReduceOp::Sum), &ins, false, 0);
            for (r, o) in out.iter().enumerate() {
                let want: Vec<i64> = (at[r]..at[r + 1]).map(|i| ins.iter().map(|x| x[i]).sum()).collect();
                assert_eq!(o, &want, "reduce_scatter_v {nodes}×{local}, rank {r}");
            }
            let ins: Vec<Vec<i64>> = (0..w).map(|r| input(r, counts[r])).collect();
            let out = simulate(nodes, local, &HierCall::AllGatherV(counts.clone()), &ins, false, total);
            let want: Vec<i64> = ins.concat();
            for (r, o) in out.iter().enumerate() {
                assert_eq!(o, &want, "all_gather_v {nodes}×{local}, rank {r}");
            }
        }
    }

    #[test]
    fn the_composition_is_the_documented_order_and_one_level_is_the_call_itself() {
        let s = HierShape::new(2, 4, 5).unwrap();
        assert_eq!((s.node, s.local_rank, s.global(Level::Node, 3), s.global(Level::Rail, 0)), (1, 1, 7, 1));
        let levels = |p: &Plan| p.steps.iter().map(|s| s.level).collect::<Vec<_>>();
        let ar = plan(&s, &HierCall::AllReduce(ReduceOp::Sum), Some(16), 16).unwrap();
        assert_eq!(levels(&ar), [Level::Node, Level::Rail, Level::Node]);
        assert_eq!(ar.scratch, 0, "an even AllReduce needs no scratch");
        assert_eq!(ar.steps[1].io, Io::InPlace(Region::new(Buf::Recv, 4, 4)), "the rail reduces a quarter");
        let rs = plan(&s, &HierCall::ReduceScatter(ReduceOp::Sum), Some(16), 2).unwrap();
        assert_eq!(levels(&rs), [Level::Rail, Level::Node]);
        let ag = plan(&s, &HierCall::AllGather, Some(2), 16).unwrap();
        assert_eq!(levels(&ag), [Level::Node, Level::Rail]);
        let one_node = HierShape::new(1, 4, 2).unwrap();
        let p = plan(&one_node, &HierCall::AllGather, Some(2), 8).unwrap();
        assert_eq!(p.steps.len(), 1);
        assert_eq!(p.steps[0].level, Level::Node);
        assert_eq!(p.steps[0].coll, Coll::AllGather);
    }

    #[test]
    fn lengths_that_do_not_fit_the_world_are_refused_before_anything_moves() {
        let s = HierShape::new(2, 2, 0).unwrap();
        for (call, send, recv) in [
            (HierCall::AllReduce(ReduceOp::Sum), Some(4), 5),
            (HierCall::ReduceScatter(ReduceOp::Sum), Some(7), 2),
            (HierCall::ReduceScatter(ReduceOp::Sum), None, 7),
            (HierCall::AllGather, Some(2), 7),
            (HierCall::AllGather, None, 6),
            (HierCall::AllGatherV(vec![1, 2, 3]), Some(1), 6),
            (HierCall::AllGatherV(vec![1, 2, 3, 4]), None, 10),
            (HierCall::ReduceScatterV(vec![1, 2, 3, 4], ReduceOp::Sum), Some(10), 2),
        ] {
            let e = plan(&s, &call, send, recv).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{call:?}: {e}");
        }
        assert!(HierShape::new(2, 2, 4).is_err());
        assert!(HierShape::new(0, 2, 0).is_err());
    }

    /// A level that succeeds, or fails as a wait for its rank 0 that expired (`timeout`) or a
    /// refusal of the arguments.
    struct Double {
        rank: usize,
        size: usize,
        fail: Option<bool>,
    }
    impl LevelComm<()> for Double {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn run(&self, _: &mut (), _: &Coll, _: &Io) -> Result<(), Error> {
            match self.fail {
                None => Ok(()),
                Some(true) => Err(Error::Timeout {
                    rank: self.rank,
                    peer: 0,
                    waited: std::time::Duration::from_secs(1),
                    during: "a wait".into(),
                }),
                Some(false) => Err(Error::InvalidArgument("refused".into())),
            }
        }
    }

    #[test]
    fn a_failed_step_names_global_ranks_and_poisons_unless_the_first_step_refused() {
        // Global rank 5 of 3 nodes × 2: node 2, local rank 1.
        let shape = HierShape::new(3, 2, 5).unwrap();
        let p = plan(&shape, &HierCall::AllGather, Some(2), 12).unwrap();
        let node = |fail| Double { rank: 1, size: 2, fail };
        let rail = |fail| Double { rank: 2, size: 3, fail };
        // The rail step (second) times out waiting for rail rank 0: global rank 1.
        let state = HierState::new(shape);
        let e = state.execute(&p, Some(&node(None)), Some(&rail(Some(true))), &mut ()).unwrap_err();
        assert!(matches!(e, Error::Timeout { rank: 5, peer: 1, .. }), "{e}");
        assert!(matches!(state.check(), Err(Error::Poisoned(_))));
        assert!(matches!(state.execute(&p, Some(&node(None)), Some(&rail(None)), &mut ()), Err(Error::Poisoned(_))));
        // The node step (first) refuses its arguments on every rank: nothing moved.
        let state = HierState::new(shape);
        let e = state.execute(&p, Some(&node(Some(false))), Some(&rail(None)), &mut ()).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        state.check().unwrap();
        // A level communicator at the wrong place is refused.
        let wrong = Double { rank: 0, size: 3, fail: None };
        assert!(matches!(state.execute(&p, Some(&node(None)), Some(&wrong), &mut ()), Err(Error::InvalidArgument(_))));
        state.execute(&p, Some(&node(None)), Some(&rail(None)), &mut ()).unwrap();
        // A node-level peer is numbered within the node: node rank 0 of node 2 is global 4.
        let e = state.globalize(Level::Node, Error::PeerLost { rank: 1, peer: 0, during: String::new() });
        assert!(matches!(e, Error::PeerLost { rank: 5, peer: 4, .. }), "{e}");
    }
}
