//! Collective specifications: (consume op, input layout, output layout) plus sizes, their
//! validation, and their meaning ([`CollectiveSpec::segments`]).

use serde::{Deserialize, Serialize};

use crate::WORLD_RANGE;
use crate::types::{ConsumeOp, DataType, Layout, ReduceOp, ReductionMode};

/// The collectives SNAC plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    AllGatherV,
    ReduceScatterV,
    AllToAllV,
}

impl Collective {
    /// Every collective, in declaration order.
    pub const ALL: [Collective; 7] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::AllGatherV,
        Collective::ReduceScatterV,
        Collective::AllToAllV,
    ];

    /// What consumers do with their peers' data.
    pub fn consume_op(self) -> ConsumeOp {
        match self {
            Collective::AllReduce | Collective::ReduceScatter | Collective::ReduceScatterV => ConsumeOp::Reduce,
            _ => ConsumeOp::Gather,
        }
    }

    /// The input layout.
    pub fn input_layout(self) -> Layout {
        match self {
            Collective::AllGather => Layout::Packed,
            Collective::AllGatherV => Layout::PackedV,
            Collective::AllReduce | Collective::ReduceScatter | Collective::AllToAll => Layout::Scattered,
            Collective::ReduceScatterV | Collective::AllToAllV => Layout::ScatteredV,
        }
    }

    /// The output layout.
    pub fn output_layout(self) -> Layout {
        match self {
            Collective::AllGather | Collective::AllReduce => Layout::Scattered,
            Collective::AllGatherV => Layout::ScatteredV,
            Collective::ReduceScatter => Layout::Packed,
            Collective::ReduceScatterV => Layout::PackedV,
            Collective::AllToAll => Layout::Transposed,
            Collective::AllToAllV => Layout::TransposedV,
        }
    }

    /// Whether this is a variable-size collective.
    pub fn is_v(self) -> bool {
        self.input_layout().is_v() || self.output_layout().is_v()
    }

    /// The (head, tail) of a composition through a seam, if this collective is one:
    /// AllReduce = ReduceScatter then AllGather (world 2 may also reduce directly).
    pub fn composition(self) -> Option<(Collective, Collective)> {
        match self {
            Collective::AllReduce => Some((Collective::ReduceScatter, Collective::AllGather)),
            _ => None,
        }
    }

    /// Kebab-case name (`all-reduce`, `all-gather-v`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::AllGather => "all-gather",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::AllToAll => "all-to-all",
            Collective::AllGatherV => "all-gather-v",
            Collective::ReduceScatterV => "reduce-scatter-v",
            Collective::AllToAllV => "all-to-all-v",
        }
    }

    /// Parses a kebab-case name.
    pub fn from_name(name: &str) -> Option<Collective> {
        Collective::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// Element counts of a spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Counts {
    /// Non-V collectives: AllReduce — elements per rank; AllGather — elements each rank
    /// contributes; ReduceScatter — elements each rank receives; AllToAll — elements per pair.
    Uniform(u64),
    /// AllGatherV — `counts[p]` elements contributed by rank `p`; ReduceScatterV — `counts[p]`
    /// elements received by rank `p`. Length `world`.
    PerRank(Vec<u64>),
    /// AllToAllV — `counts[src][dst]` elements sent from `src` to `dst`. `world × world`.
    PerPair(Vec<Vec<u64>>),
}

/// A typed validation error of a spec or of buffers against a spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("world {world} outside the supported range 2..=16")]
    WorldOutOfRange { world: u32 },
    #[error("{collective:?} takes {expected} counts, got {got}")]
    CountsKind { collective: Collective, expected: &'static str, got: &'static str },
    #[error("V counts have length {got}, expected world = {expected}")]
    CountsLength { expected: usize, got: usize },
    #[error("{collective:?} needs a reduce op")]
    MissingReduceOp { collective: Collective },
    #[error("{collective:?} takes no reduce op")]
    UnexpectedReduceOp { collective: Collective },
    #[error("{bytes} bytes is not a multiple of the {dtype:?} element size {size}")]
    NotElementMultiple { bytes: u64, dtype: DataType, size: u64 },
    #[error("buffer sizes overflow 64 bits")]
    SizeOverflow,
    #[error("rank {rank} outside world {world}")]
    RankOutOfRange { rank: u32, world: u32 },
    #[error("{which} buffer of rank {rank} has {got} elements, the spec needs {expected}")]
    BufferLength { rank: u32, which: &'static str, expected: u64, got: u64 },
}

/// One collective call: what it computes, on how many ranks, on which element type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CollectiveSpec {
    pub collective: Collective,
    pub world: u32,
    pub dtype: DataType,
    /// `Some` exactly for the reducing collectives.
    pub op: Option<ReduceOp>,
    pub mode: ReductionMode,
    pub counts: Counts,
}

/// One piece of a rank's output and what it must receive: exactly one source for a gather,
/// every rank in rank order for a reduce. Offsets and lengths are in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub out_offset: u64,
    pub len: u64,
    /// `(source rank, byte offset in that rank's input)`, in rank order.
    pub sources: Vec<(u32, u64)>,
}

impl CollectiveSpec {
    fn new(collective: Collective, world: u32, dtype: DataType, op: Option<ReduceOp>, counts: Counts) -> Self {
        CollectiveSpec { collective, world, dtype, op, mode: ReductionMode::Deterministic, counts }
    }
    /// AllReduce of `count` elements per rank.
    pub fn all_reduce(world: u32, dtype: DataType, op: ReduceOp, count: u64) -> Self {
        Self::new(Collective::AllReduce, world, dtype, Some(op), Counts::Uniform(count))
    }
    /// AllGather: every rank contributes `count` elements.
    pub fn all_gather(world: u32, dtype: DataType, count: u64) -> Self {
        Self::new(Collective::AllGather, world, dtype, None, Counts::Uniform(count))
    }
    /// ReduceScatter: every rank receives `count` reduced elements.
    pub fn reduce_scatter(world: u32, dtype: DataType, op: ReduceOp, count: u64) -> Self {
        Self::new(Collective::ReduceScatter, world, dtype, Some(op), Counts::Uniform(count))
    }
    /// AllToAll: `count` elements per (source, destination) pair.
    pub fn all_to_all(world: u32, dtype: DataType, count: u64) -> Self {
        Self::new(Collective::AllToAll, world, dtype, None, Counts::Uniform(count))
    }
    /// AllGatherV: rank `p` contributes `counts[p]` elements.
    pub fn all_gather_v(world: u32, dtype: DataType, counts: Vec<u64>) -> Self {
        Self::new(Collective::AllGatherV, world, dtype, None, Counts::PerRank(counts))
    }
    /// ReduceScatterV: rank `p` receives `counts[p]` reduced elements.
    pub fn reduce_scatter_v(world: u32, dtype: DataType, op: ReduceOp, counts: Vec<u64>) -> Self {
        Self::new(Collective::ReduceScatterV, world, dtype, Some(op), Counts::PerRank(counts))
    }
    /// AllToAllV: `counts[src][dst]` elements from `src` to `dst`.
    pub fn all_to_all_v(world: u32, dtype: DataType, counts: Vec<Vec<u64>>) -> Self {
        Self::new(Collective::AllToAllV, world, dtype, None, Counts::PerPair(counts))
    }
    /// The same spec in another reduction mode.
    pub fn with_mode(mut self, mode: ReductionMode) -> Self {
        self.mode = mode;
        self
    }

    /// Converts a byte size to an element count, or says why it cannot.
    pub fn elements(dtype: DataType, bytes: u64) -> Result<u64, SpecError> {
        if bytes % dtype.size() != 0 {
            return Err(SpecError::NotElementMultiple { bytes, dtype, size: dtype.size() });
        }
        Ok(bytes / dtype.size())
    }

    /// Checks the spec: world range, counts of the right kind and length, the reduce op present
    /// exactly for reducing collectives, sizes that fit in 64 bits.
    pub fn validate(&self) -> Result<(), SpecError> {
        if !WORLD_RANGE.contains(&(self.world as usize)) {
            return Err(SpecError::WorldOutOfRange { world: self.world });
        }
        let w = self.world as usize;
        let kind = |c: &Counts| match c {
            Counts::Uniform(_) => "uniform",
            Counts::PerRank(_) => "per-rank",
            Counts::PerPair(_) => "per-pair",
        };
        let expected = match self.collective {
            Collective::AllGatherV | Collective::ReduceScatterV => "per-rank",
            Collective::AllToAllV => "per-pair",
            _ => "uniform",
        };
        if kind(&self.counts) != expected {
            return Err(SpecError::CountsKind { collective: self.collective, expected, got: kind(&self.counts) });
        }
        match &self.counts {
            Counts::Uniform(_) => {}
            Counts::PerRank(v) => {
                if v.len() != w {
                    return Err(SpecError::CountsLength { expected: w, got: v.len() });
                }
            }
            Counts::PerPair(m) => {
                if m.len() != w {
                    return Err(SpecError::CountsLength { expected: w, got: m.len() });
                }
                if let Some(row) = m.iter().find(|r| r.len() != w) {
                    return Err(SpecError::CountsLength { expected: w, got: row.len() });
                }
            }
        }
        match (self.collective.consume_op(), self.op) {
            (ConsumeOp::Reduce, None) => return Err(SpecError::MissingReduceOp { collective: self.collective }),
            (ConsumeOp::Gather, Some(_)) => {
                return Err(SpecError::UnexpectedReduceOp { collective: self.collective });
            }
            _ => {}
        }
        // Every byte size and offset below must fit in 64 bits (with headroom for chunk
        // arithmetic): the total element count of any buffer times the element size.
        let limit = u64::MAX / 4;
        let total: Option<u64> = match &self.counts {
            Counts::Uniform(n) => n.checked_mul(self.world as u64),
            Counts::PerRank(v) => v.iter().try_fold(0u64, |a, &x| a.checked_add(x)),
            Counts::PerPair(m) => m.iter().flatten().try_fold(0u64, |a, &x| a.checked_add(x)),
        };
        match total.and_then(|t| t.checked_mul(self.dtype.size())) {
            Some(b) if b <= limit => Ok(()),
            _ => Err(SpecError::SizeOverflow),
        }
    }

    fn es(&self) -> u64 {
        self.dtype.size()
    }

    /// Element count `n` of a uniform spec (0 for V specs).
    fn uniform(&self) -> u64 {
        match self.counts {
            Counts::Uniform(n) => n,
            _ => 0,
        }
    }

    fn per_rank(&self, p: u32) -> u64 {
        match &self.counts {
            Counts::PerRank(v) => v.get(p as usize).copied().unwrap_or(0),
            _ => 0,
        }
    }

    /// Bytes sent from `src` to `dst` by an AllToAll(V) (also meaningful as "pair size" for the
    /// others: what `src` contributes to `dst`'s output).
    pub fn pair_bytes(&self, src: u32, dst: u32) -> u64 {
        match (&self.counts, self.collective) {
            (Counts::PerPair(m), _) => {
                m.get(src as usize).and_then(|r| r.get(dst as usize)).copied().unwrap_or(0) * self.es()
            }
            (_, Collective::AllReduce) => self.uniform() * self.es(),
            (_, Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll) => self.uniform() * self.es(),
            (_, Collective::AllGatherV) => self.per_rank(src) * self.es(),
            (_, Collective::ReduceScatterV) => self.per_rank(dst) * self.es(),
            (_, Collective::AllToAllV) => 0,
        }
    }

    /// Input buffer size of `rank`, in bytes.
    pub fn input_bytes(&self, rank: u32) -> u64 {
        let w = self.world as u64;
        let n = self.uniform() * self.es();
        match self.collective {
            Collective::AllReduce | Collective::AllGather => n,
            Collective::ReduceScatter | Collective::AllToAll => n * w,
            Collective::AllGatherV => self.per_rank(rank) * self.es(),
            Collective::ReduceScatterV => (0..self.world).map(|p| self.per_rank(p)).sum::<u64>() * self.es(),
            Collective::AllToAllV => (0..self.world).map(|d| self.pair_bytes(rank, d)).sum(),
        }
    }

    /// Output buffer size of `rank`, in bytes.
    pub fn output_bytes(&self, rank: u32) -> u64 {
        let w = self.world as u64;
        let n = self.uniform() * self.es();
        match self.collective {
            Collective::AllReduce | Collective::ReduceScatter => n,
            Collective::AllGather | Collective::AllToAll => n * w,
            Collective::AllGatherV => (0..self.world).map(|p| self.per_rank(p)).sum::<u64>() * self.es(),
            Collective::ReduceScatterV => self.per_rank(rank) * self.es(),
            Collective::AllToAllV => (0..self.world).map(|s| self.pair_bytes(s, rank)).sum(),
        }
    }

    /// Byte offset of partition `p` in a scattered(-V) buffer of `rank`, or of source `p`'s
    /// block in a transposed(-V) one. For AllReduce, the offset of shard `p` (see
    /// [`CollectiveSpec::shard`]).
    pub fn partition_offset(&self, rank: u32, p: u32, in_input: bool) -> u64 {
        let es = self.es();
        match self.collective {
            Collective::AllReduce => self.shard(p).0,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => p as u64 * self.uniform() * es,
            Collective::AllGatherV | Collective::ReduceScatterV => (0..p).map(|i| self.per_rank(i)).sum::<u64>() * es,
            Collective::AllToAllV => {
                if in_input {
                    (0..p).map(|d| self.pair_bytes(rank, d)).sum()
                } else {
                    (0..p).map(|s| self.pair_bytes(s, rank)).sum()
                }
            }
        }
    }

    /// AllReduce's shard `k` as `(byte offset, byte length)`: shards are `ceil(n / world)`
    /// elements rounded up to 16 bytes, so every shard but the last ones is full and the last
    /// may be short or empty.
    pub fn shard(&self, k: u32) -> (u64, u64) {
        let total = self.uniform() * self.es();
        let s = shard_stride(total, self.world as u64, self.es());
        let start = (k as u64 * s).min(total);
        let end = ((k as u64 + 1) * s).min(total);
        (start, end - start)
    }

    /// What `rank`'s output must receive: the collective's definition.
    pub fn segments(&self, rank: u32) -> Vec<Segment> {
        let all = |off: u64| (0..self.world).map(|p| (p, off)).collect::<Vec<_>>();
        match self.collective {
            Collective::AllReduce => {
                let n = self.output_bytes(rank);
                if n == 0 { vec![] } else { vec![Segment { out_offset: 0, len: n, sources: all(0) }] }
            }
            Collective::ReduceScatter | Collective::ReduceScatterV => {
                let n = self.output_bytes(rank);
                let off = self.partition_offset(rank, rank, true);
                if n == 0 { vec![] } else { vec![Segment { out_offset: 0, len: n, sources: all(off) }] }
            }
            Collective::AllGather | Collective::AllGatherV => (0..self.world)
                .map(|p| Segment {
                    out_offset: self.partition_offset(rank, p, false),
                    len: self.pair_bytes(p, rank),
                    sources: vec![(p, 0)],
                })
                .filter(|s| s.len > 0)
                .collect(),
            Collective::AllToAll | Collective::AllToAllV => (0..self.world)
                .map(|p| Segment {
                    out_offset: self.partition_offset(rank, p, false),
                    len: self.pair_bytes(p, rank),
                    sources: vec![(p, self.partition_offset(p, rank, true))],
                })
                .filter(|s| s.len > 0)
                .collect(),
        }
    }

    /// Checks a rank's buffer lengths (in elements) against the spec: the "V list of the wrong
    /// sum" error surfaces here.
    pub fn check_buffers(&self, rank: u32, input_elems: u64, output_elems: u64) -> Result<(), SpecError> {
        self.validate()?;
        if rank >= self.world {
            return Err(SpecError::RankOutOfRange { rank, world: self.world });
        }
        let (ei, eo) = (self.input_bytes(rank) / self.es(), self.output_bytes(rank) / self.es());
        if input_elems != ei {
            return Err(SpecError::BufferLength { rank, which: "input", expected: ei, got: input_elems });
        }
        if output_elems != eo {
            return Err(SpecError::BufferLength { rank, which: "output", expected: eo, got: output_elems });
        }
        Ok(())
    }
}

/// Shard stride in bytes for AllReduce: `ceil(total / world)` rounded up to 16 bytes (and to
/// whole elements, which 16 is a multiple of).
pub fn shard_stride(total_bytes: u64, world: u64, es: u64) -> u64 {
    let elems = total_bytes / es;
    let per = elems.div_ceil(world) * es;
    per.div_ceil(16) * 16
}
