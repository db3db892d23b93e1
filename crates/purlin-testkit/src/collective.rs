//! The collectives and reduce operators the reference knows, with their names.

use std::fmt;

/// A collective, by its definition (the layouts are [`crate::Case`]'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collective {
    /// Reduce everything, everyone gets the result.
    AllReduce,
    /// Everyone's contribution, concatenated in rank order, to everyone.
    AllGather,
    /// Reduce, rank `r` keeps partition `r`.
    ReduceScatter,
    /// Partition `p` of rank `r` goes to partition `r` of rank `p`.
    AllToAll,
    /// AllGather with per-rank contribution sizes.
    AllGatherV,
    /// ReduceScatter with per-rank partition sizes.
    ReduceScatterV,
    /// AllToAll with per-pair sizes.
    AllToAllV,
    /// Rank 0's buffer to every rank (the AllGatherV whose only contribution is the root's).
    Broadcast,
    /// Reduce everything, rank 0 gets the result (the ReduceScatterV whose only partition is
    /// the root's).
    Reduce,
    /// Each rank sends its buffer to rank + 1 and receives rank − 1's (at world 2: the pair
    /// swaps buffers).
    SendRecv,
}

impl Collective {
    /// The seven collectives of the core API.
    pub const ALL: [Collective; 7] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::AllGatherV,
        Collective::ReduceScatterV,
        Collective::AllToAllV,
    ];

    /// Every collective: [`Collective::ALL`], then Broadcast, Reduce and SendRecv.
    pub const EVERY: [Collective; 10] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::AllGatherV,
        Collective::ReduceScatterV,
        Collective::AllToAllV,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::SendRecv,
    ];

    /// Whether the collective reduces (takes a reduce op).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Reduce
        )
    }

    /// Whether partition sizes vary per rank.
    pub fn is_v(self) -> bool {
        matches!(self, Collective::AllGatherV | Collective::ReduceScatterV | Collective::AllToAllV)
    }

    /// The kebab-case name (`all-reduce`, `all-gather-v`, `send-recv`, ...): `purlin-bench`'s
    /// command line, tables and files.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::AllGather => "all-gather",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::AllToAll => "all-to-all",
            Collective::AllGatherV => "all-gather-v",
            Collective::ReduceScatterV => "reduce-scatter-v",
            Collective::AllToAllV => "all-to-all-v",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::SendRecv => "send-recv",
        }
    }
}

/// The [name](Collective::name).
impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduce operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Mean over ranks: integers divide the wrapped sum, truncating toward zero; floats divide
    /// the sum in f32 and round once to the type.
    Avg,
}

impl Op {
    /// Every op.
    pub const ALL: [Op; 5] = [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::Avg];

    /// The lowercase name (`sum`, `prod`, `min`, `max`, `avg`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Min => "min",
            Op::Max => "max",
            Op::Avg => "avg",
        }
    }
}

/// The [name](Op::name).
impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
