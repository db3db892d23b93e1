//! What a call is, apart from any backend: a user's collective call → a validated
//! [`CollectiveSpec`]. `Comm`, `CpuComm` and the benchmark's host backend all map their calls
//! here, so the two backends cannot disagree on what a call means (wgpu-core's place: the
//! layer above the backends).
//!
//! - [`types`]: the call types (`ReduceOp`, `DataType`, `NcclType`, `Status`) and their SNAC
//!   and Atom names.
//! - [`tuning`]: which plan a call gets (the defaults, the limits a workspace sets).
//! - [`verified`]: the per-key cache of plans the verifier proved.
//!
//! Architecture invariant: nothing here names `gpu`, `cpu` or cudarc.

pub mod tuning;
pub mod types;
pub mod verified;

use purlin_snac::{CollectiveSpec, DataType};

use crate::error::Error;
use types::ReduceOp;

/// A user's call, in elements, as the methods of `cudarc::nccl::Comm` take it.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// AllReduce of `len` elements (in or out of place alike).
    AllReduce {
        /// Elements per rank.
        len: usize,
        /// The reduce operator.
        op: ReduceOp,
    },
    /// AllGather: every rank contributes `len` elements.
    AllGather {
        /// Elements each rank contributes.
        len: usize,
    },
    /// In-place AllGather over a buffer of `len` elements (`world` partitions).
    AllGatherInPlace {
        /// The whole buffer's elements.
        len: usize,
    },
    /// ReduceScatter: every rank receives `len` reduced elements.
    ReduceScatter {
        /// Elements each rank receives.
        len: usize,
        /// The reduce operator.
        op: ReduceOp,
    },
    /// In-place ReduceScatter over a buffer of `len` elements (`world` partitions).
    ReduceScatterInPlace {
        /// The whole buffer's elements.
        len: usize,
        /// The reduce operator.
        op: ReduceOp,
    },
    /// AllToAll: a send buffer of `len` elements, `world` equal partitions.
    AllToAll {
        /// The send buffer's elements.
        len: usize,
    },
    /// AllGatherV: rank `r` contributes `counts[r]` elements.
    AllGatherV {
        /// Elements per rank.
        counts: Vec<u64>,
    },
    /// ReduceScatterV: rank `r` receives `counts[r]` reduced elements.
    ReduceScatterV {
        /// Elements per rank.
        counts: Vec<u64>,
        /// The reduce operator.
        op: ReduceOp,
    },
    /// AllToAllV: `counts[s][d]` elements go from rank `s` to rank `d`.
    AllToAllV {
        /// The whole traffic matrix.
        counts: Vec<Vec<u64>>,
    },
    /// Broadcast of `len` elements from `root`: the AllGatherV in which only the root
    /// contributes.
    Broadcast {
        /// Elements.
        len: usize,
        /// The root rank.
        root: usize,
    },
    /// Reduce of `len` elements to `root`: the ReduceScatterV in which only the root receives.
    Reduce {
        /// Elements.
        len: usize,
        /// The reduce operator.
        op: ReduceOp,
        /// The root rank.
        root: usize,
    },
    /// A world-2 send and/or receive, in bytes: see `point_to_point_spec`.
    PointToPoint {
        /// What this rank sends, and to whom.
        send: Option<Transfer>,
        /// What this rank receives, and from whom.
        recv: Option<Transfer>,
    },
}

impl Call {
    /// The collective `rank` of a `world`-rank communicator runs for this call on elements of
    /// `dtype` (point-to-point calls move bytes whatever `dtype` is). The spec is not yet
    /// validated against the world's limits: the executors call `validate` on it.
    pub fn spec(self, world: usize, rank: usize, dtype: DataType) -> Result<CollectiveSpec, Error> {
        let w = world as u32;
        Ok(match self {
            Call::AllReduce { len, op } => CollectiveSpec::all_reduce(w, dtype, (&op).into(), len as u64),
            Call::AllGather { len } => CollectiveSpec::all_gather(w, dtype, len as u64),
            Call::AllGatherInPlace { len } => {
                CollectiveSpec::all_gather(w, dtype, whole_partitions(len, world, "all_gather_in_place")?)
            }
            Call::ReduceScatter { len, op } => CollectiveSpec::reduce_scatter(w, dtype, (&op).into(), len as u64),
            Call::ReduceScatterInPlace { len, op } => CollectiveSpec::reduce_scatter(
                w,
                dtype,
                (&op).into(),
                whole_partitions(len, world, "reduce_scatter_in_place")?,
            ),
            Call::AllToAll { len } => CollectiveSpec::all_to_all(w, dtype, whole_partitions(len, world, "all_to_all")?),
            Call::AllGatherV { counts } => CollectiveSpec::all_gather_v(w, dtype, counts),
            Call::ReduceScatterV { counts, op } => CollectiveSpec::reduce_scatter_v(w, dtype, (&op).into(), counts),
            Call::AllToAllV { counts } => CollectiveSpec::all_to_all_v(w, dtype, counts),
            Call::Broadcast { len, root } => CollectiveSpec::all_gather_v(
                w,
                dtype,
                root_counts(world, rank_in_world(root, world, "broadcast")?, len),
            ),
            Call::Reduce { len, op, root } => CollectiveSpec::reduce_scatter_v(
                w,
                dtype,
                (&op).into(),
                root_counts(world, rank_in_world(root, world, "reduce")?, len),
            ),
            Call::PointToPoint { send, recv } => point_to_point_spec(world, rank, send, recv)?,
        })
    }
}

/// A rank named by a caller (cudarc's `i32` peers and roots), checked against the world.
pub fn rank_of(rank: i32, world: usize, what: &str) -> Result<usize, Error> {
    usize::try_from(rank).map_err(|_| not_in_world(rank, world, what)).and_then(|r| rank_in_world(r, world, what))
}

fn rank_in_world(rank: usize, world: usize, what: &str) -> Result<usize, Error> {
    if rank < world { Ok(rank) } else { Err(not_in_world(rank, world, what)) }
}

fn not_in_world(rank: impl std::fmt::Display, world: usize, what: &str) -> Error {
    Error::InvalidArgument(format!("{what}: rank {rank} is not in a world of {world}"))
}

/// Elements per rank as a spec takes them.
pub fn counts_u64(counts: &[usize]) -> Vec<u64> {
    counts.iter().map(|&c| c as u64).collect()
}

/// The per-rank counts that make a Broadcast from (or a Reduce to) `root` of `len` elements
/// the AllGatherV (ReduceScatterV) in which only the root contributes (receives): `len` at
/// the root, 0 elsewhere. The root's part is then at offset 0 of every buffer, which is where
/// the in-place forms keep it.
fn root_counts(world: usize, root: usize, len: usize) -> Vec<u64> {
    (0..world).map(|q| if q == root { len as u64 } else { 0 }).collect()
}

/// One side of a point-to-point call: the peer and the bytes that move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// The peer rank.
    pub peer: usize,
    /// The bytes that move.
    pub bytes: u64,
}

/// Bytes of `len` elements of `T`.
pub fn byte_len<T>(len: usize) -> u64 {
    (len as u64).saturating_mul(std::mem::size_of::<T>() as u64)
}

/// The collective a world-2 send and/or receive of `rank` is: the AllToAllV of bytes whose
/// only nonzero counts are `send.bytes` from `rank` to its peer and `recv.bytes` back. Both
/// ranks derive the same matrix from their own calls when their sizes match (a send of `n`
/// bytes there is a receive of `n` here). Bytes, not elements, so a group may send one type
/// and receive another; a copy's plan does not depend on the element type.
pub fn point_to_point_spec(
    world: usize,
    rank: usize,
    send: Option<Transfer>,
    recv: Option<Transfer>,
) -> Result<CollectiveSpec, Error> {
    if world != 2 {
        return Err(Error::Unsupported(format!(
            "send/recv in a world of {world}: Purlin runs collectives of every rank, and only at world 2 is a pair \
             of ranks every rank (use all_to_all_v, whose count matrix every rank passes)"
        )));
    }
    let mut counts = vec![vec![0u64; world]; world];
    for (side, sends) in [(send, true), (recv, false)] {
        let Some(Transfer { peer, bytes }) = side else { continue };
        let what = if sends { "send to" } else { "receive from" };
        if peer == rank {
            return Err(Error::InvalidArgument(format!(
                "rank {rank}: a {what} itself (copy the buffer on the stream instead)"
            )));
        }
        if peer >= world {
            return Err(Error::InvalidArgument(format!("rank {peer} is not in a world of {world}")));
        }
        if sends { counts[rank][peer] = bytes } else { counts[peer][rank] = bytes }
    }
    Ok(CollectiveSpec::all_to_all_v(world as u32, purlin_snac::DataType::U8, counts))
}

/// Elements per partition of a `len`-element buffer split among `world` ranks, or an
/// `InvalidArgument` naming `what`.
fn whole_partitions(len: usize, world: usize, what: &str) -> Result<u64, Error> {
    if len % world != 0 {
        return Err(Error::InvalidArgument(format!("{what}: {len} elements do not split into {world} partitions")));
    }
    Ok((len / world) as u64)
}

/// Where rank `q`'s input and output lie in its in-place buffer (NCCL's offsets: the plan's
/// alias), and the bytes that buffer must hold: `(input offset, output offset, bytes)`. Peers
/// of a one-copy call address every rank's buffer with these (GPU and host alike).
pub fn in_place_layout(spec: &CollectiveSpec, q: u32) -> (u64, u64, u64) {
    let (i, o) = match purlin_snac::in_place_alias(spec, q) {
        Some(purlin_snac::Alias::InputInOutput(o)) => (o, 0),
        Some(purlin_snac::Alias::OutputInInput(o)) => (0, o),
        None => (0, 0),
    };
    (i, o, (i + spec.input_bytes(q)).max(o + spec.output_bytes(q)))
}

/// The calls a group's held sends and receives make at its end, in order: the k-th send with
/// the k-th receive, the longer list's rest alone (also `CpuGroup`'s).
pub fn paired<S, R>(sends: Vec<S>, recvs: Vec<R>) -> impl Iterator<Item = (Option<S>, Option<R>)> {
    let (mut sends, mut recvs) = (sends.into_iter(), recvs.into_iter());
    std::iter::from_fn(move || match (sends.next(), recvs.next()) {
        (None, None) => None,
        pair => Some(pair),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kth_send_runs_with_the_kth_receive_and_the_rest_alone() {
        let calls: Vec<_> = paired(vec!["s1", "s2", "s3"], vec!["r1"]).collect();
        assert_eq!(calls, [(Some("s1"), Some("r1")), (Some("s2"), None), (Some("s3"), None)]);
        let calls: Vec<_> = paired(Vec::<&str>::new(), vec!["r1", "r2"]).collect();
        assert_eq!(calls, [(None, Some("r1")), (None, Some("r2"))]);
        assert_eq!(paired(Vec::<u8>::new(), Vec::<u8>::new()).count(), 0);
    }

    #[test]
    fn a_pair_is_one_all_to_all_v_of_bytes_and_a_wider_world_is_refused() {
        let t = |peer, bytes| Some(Transfer { peer, bytes });
        let spec = point_to_point_spec(2, 0, t(1, 12), t(1, 5)).unwrap();
        let sender = point_to_point_spec(2, 1, t(0, 5), None).unwrap();
        let receiver = point_to_point_spec(2, 1, None, t(0, 12)).unwrap();
        // Rank 0's exchange: 12 bytes to rank 1, 5 back; each side of it seen from rank 1.
        assert_eq!(spec, CollectiveSpec::all_to_all_v(2, DataType::U8, vec![vec![0, 12], vec![5, 0]]));
        assert_eq!(sender, CollectiveSpec::all_to_all_v(2, DataType::U8, vec![vec![0, 0], vec![5, 0]]));
        assert_eq!(receiver, CollectiveSpec::all_to_all_v(2, DataType::U8, vec![vec![0, 12], vec![0, 0]]));
        assert!(matches!(point_to_point_spec(3, 0, t(1, 4), None), Err(Error::Unsupported(_))));
        assert!(matches!(point_to_point_spec(2, 1, t(1, 4), None), Err(Error::InvalidArgument(_))));
        assert!(matches!(point_to_point_spec(2, 0, None, t(2, 4)), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn broadcast_and_reduce_are_the_v_forms_of_the_root_alone() {
        let f = DataType::F32;
        let bcast = Call::Broadcast { len: 7, root: 1 }.spec(3, 0, f).unwrap();
        assert_eq!(bcast, CollectiveSpec::all_gather_v(3, f, vec![0, 7, 0]));
        let reduce = Call::Reduce { len: 7, op: ReduceOp::Max, root: 2 }.spec(3, 0, f).unwrap();
        assert_eq!(reduce, CollectiveSpec::reduce_scatter_v(3, f, purlin_snac::ReduceOp::Max, vec![0, 0, 7]));
        assert!(matches!(Call::Broadcast { len: 7, root: 3 }.spec(3, 0, f), Err(Error::InvalidArgument(_))));
        assert!(matches!(rank_of(-1, 2, "send"), Err(Error::InvalidArgument(m)) if m.contains("rank -1")));
        assert_eq!(rank_of(1, 2, "send").unwrap(), 1);
    }

    #[test]
    fn in_place_and_all_to_all_calls_need_whole_partitions() {
        let f = DataType::F32;
        assert_eq!(Call::AllToAll { len: 12 }.spec(3, 0, f).unwrap(), CollectiveSpec::all_to_all(3, f, 4));
        for call in [
            Call::AllToAll { len: 10 },
            Call::AllGatherInPlace { len: 10 },
            Call::ReduceScatterInPlace { len: 10, op: ReduceOp::Sum },
        ] {
            assert!(matches!(call.spec(3, 0, f), Err(Error::InvalidArgument(_))));
        }
    }
}
