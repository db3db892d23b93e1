//! The protocol's vocabulary: layouts, consume and reduce operations, element types.

use serde::{Deserialize, Serialize};

/// How a buffer is laid out across the ranks (docs/design.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Layout {
    /// One contiguous contribution per rank.
    Packed,
    /// The buffer is cut into `world` consecutive partitions; partition `p` is meant for
    /// (or owned by) rank `p`.
    Scattered,
    /// Partition `p` holds what rank `p` addressed to me, in source-rank order.
    Transposed,
    /// [`Layout::Packed`] whose size differs per rank, known at call time.
    PackedV,
    /// [`Layout::Scattered`] whose partition sizes differ, known at call time.
    ScatteredV,
    /// [`Layout::Transposed`] whose partition sizes differ per pair, known at call time.
    TransposedV,
}

impl Layout {
    /// Whether this is a variable-size (V) layout.
    pub fn is_v(self) -> bool {
        matches!(self, Layout::PackedV | Layout::ScatteredV | Layout::TransposedV)
    }
}

/// What a consumer does with its peers' data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConsumeOp {
    /// Copy the peers' data into place.
    Gather,
    /// Combine N sources into one with a [`ReduceOp`].
    Reduce,
}

/// The reduction applied by [`ConsumeOp::Reduce`]. `Avg` is the sum divided by `world`, rounded
/// once; an Avg reduce has all `world` ranks as its sources ([`Plan::check`](crate::Plan::check)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
}

/// Whether reductions must be bitwise reproducible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum ReductionMode {
    /// Sources are combined in rank order on every rank: bitwise-identical results across runs
    /// and ranks.
    #[default]
    Deterministic,
    /// Any combination order is allowed.
    Fast,
}

/// Element types: cudarc's NCCL set plus the two fp8 formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DataType {
    F32,
    F64,
    F16,
    Bf16,
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
    F8E4M3,
    F8E5M2,
}

impl DataType {
    /// Every element type, in declaration order.
    pub const ALL: [DataType; 12] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::Bf16,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F8E4M3,
        DataType::F8E5M2,
    ];

    /// Size of one element in bytes.
    pub fn size(self) -> u64 {
        match self {
            DataType::I8 | DataType::U8 | DataType::F8E4M3 | DataType::F8E5M2 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16 | DataType::F8E4M3 | DataType::F8E5M2
        )
    }
}

/// Which regime a plan runs in (docs/design.md §3.1, §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Regime {
    /// Packets straight into the peers' receive windows; flags travel with the data.
    Latency,
    /// Stage, signal, consume, chunk by chunk, pipelined.
    Throughput,
}

/// On whose side a throughput plan stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StagingSide {
    /// Producers stage into their own staging; consumers pull from there.
    Own,
    /// Producers push into the consumer's staging; consumers read locally.
    Peer,
}

/// Packet format of the latency regime (docs/design.md §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum PacketFormat {
    /// 4 bytes of data + 4 bytes of flag, one 8-byte store (NCCL's LL). Works everywhere.
    #[default]
    B8,
    /// 8 bytes of data + 8 bytes of flag, one 16-byte store (sm_90+, only if proven untorn).
    B16,
}

impl PacketFormat {
    /// Payload bytes carried by one packet.
    pub fn payload(self) -> u64 {
        match self {
            PacketFormat::B8 => 4,
            PacketFormat::B16 => 8,
        }
    }
}
