//! The element types, reduce operators and status of calls, named as in `cudarc::nccl`, and
//! their SNAC names.

/// Reduction operators, as in `cudarc::nccl::ReduceOp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Average (sum, then divide by the world size).
    Avg,
}

/// Element types of collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `f32`.
    F32,
    /// `f64` (accepted by the API, no Atom implements it yet).
    F64,
    /// `i8`.
    I8,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u8` (and `char`, as in cudarc).
    U8,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// `half::f16`.
    F16,
    /// `half::bf16`.
    Bf16,
    /// fp8 e4m3 ([`purlin_atom::F8E4M3`]; NCCL's `ncclFloat8e4m3`).
    F8E4M3,
    /// fp8 e5m2 ([`purlin_atom::F8E5M2`]; NCCL's `ncclFloat8e5m2`).
    F8E5M2,
}

/// The element types collectives accept (cudarc's trait, same name and implementors, plus
/// the Atom's fp8 types [`purlin_atom::F8E4M3`] and [`purlin_atom::F8E5M2`]).
pub trait NcclType {
    /// The element's data type.
    fn data_type() -> DataType;
}

macro_rules! nccl_type {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl NcclType for $t {
            fn data_type() -> DataType {
                DataType::$d
            }
        })*
    };
}
nccl_type!(f32 => F32, f64 => F64, i8 => I8, i32 => I32, i64 => I64, u8 => U8, u32 => U32, u64 => U64,
    char => U8, half::f16 => F16, half::bf16 => Bf16, purlin_atom::F8E4M3 => F8E4M3, purlin_atom::F8E5M2 => F8E5M2);

/// The status of an enqueued call (cudarc's `NcclStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Enqueued on the stream.
    Success,
    /// Still in progress (non-blocking communicators).
    InProgress,
}

/// SNAC's name of a cudarc element type.
pub fn snac_dtype<T: NcclType>() -> purlin_snac::DataType {
    use purlin_snac::DataType as S;
    match T::data_type() {
        DataType::F32 => S::F32,
        DataType::F64 => S::F64,
        DataType::I8 => S::I8,
        DataType::I32 => S::I32,
        DataType::I64 => S::I64,
        DataType::U8 => S::U8,
        DataType::U32 => S::U32,
        DataType::U64 => S::U64,
        DataType::F16 => S::F16,
        DataType::Bf16 => S::Bf16,
        DataType::F8E4M3 => S::F8E4M3,
        DataType::F8E5M2 => S::F8E5M2,
    }
}

impl From<&ReduceOp> for purlin_snac::ReduceOp {
    /// SNAC's name of a reduce operator.
    fn from(op: &ReduceOp) -> Self {
        match op {
            ReduceOp::Sum => purlin_snac::ReduceOp::Sum,
            ReduceOp::Prod => purlin_snac::ReduceOp::Prod,
            ReduceOp::Max => purlin_snac::ReduceOp::Max,
            ReduceOp::Min => purlin_snac::ReduceOp::Min,
            ReduceOp::Avg => purlin_snac::ReduceOp::Avg,
        }
    }
}

/// The Atom's element type for a SNAC data type, where the Atom reduces it.
pub fn atom_dtype(t: purlin_snac::DataType) -> Option<purlin_atom::DType> {
    use purlin_atom::DType;
    use purlin_snac::DataType as S;
    Some(match t {
        S::F32 => DType::F32,
        S::F16 => DType::F16,
        S::Bf16 => DType::BF16,
        S::F8E4M3 => DType::E4M3,
        S::F8E5M2 => DType::E5M2,
        S::I32 => DType::I32,
        S::U32 => DType::U32,
        _ => return None,
    })
}
