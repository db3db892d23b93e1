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
    /// `f64` (moved by every call; reduced by none: not a [`ReduceType`]).
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

mod sealed {
    pub trait Sealed {}
}

/// The element types Purlin reduces: `f32`, `half::f16`, `half::bf16`, the fp8 formats
/// [`purlin_atom::F8E4M3`] and [`purlin_atom::F8E5M2`], `i32` and `u32`. The reducing calls
/// (AllReduce, Reduce, ReduceScatter, their in-place and V forms, on `Comm`, `Group` and
/// `CpuComm`) take only these, so a reduction the Atom cannot do does not compile:
///
/// | type | gathers, broadcast, send/recv | reductions |
/// |---|---|---|
/// | `f32`, `f16`, `bf16`, `F8E4M3`, `F8E5M2`, `i32`, `u32` | yes | yes |
/// | `f64`, `i64`, `u64`, `i8`, `u8`, `char` | yes | no: no Atom reduces them |
///
/// (cudarc's NCCL wrapper accepts those reductions; a program moved to Purlin that makes one
/// fails to build instead of failing at run time.) Sealed.
///
/// ```compile_fail
/// # fn f(comm: &purlin_collectives::CpuComm) {
/// let mut out = [0f64; 4];
/// comm.all_reduce(&[1f64; 4], &mut out, &purlin_collectives::ReduceOp::Sum); // f64: no
/// # }
/// ```
/// ```compile_fail
/// # fn f(comm: &purlin_collectives::Comm, x: &cudarc::driver::CudaSlice<u8>, y: &mut cudarc::driver::CudaSlice<u8>) {
/// comm.reduce_scatter(x, y, &purlin_collectives::ReduceOp::Max); // u8: no
/// # }
/// ```
/// ```
/// # fn f(comm: &purlin_collectives::CpuComm) {
/// let mut out = [0u8; 8];
/// comm.all_gather(&[1u8; 4], &mut out); // gathers move any type
/// let mut sum = [0i32; 4];
/// comm.all_reduce(&[1i32; 4], &mut sum, &purlin_collectives::ReduceOp::Sum);
/// # }
/// ```
pub trait ReduceType: NcclType + sealed::Sealed {}

macro_rules! reduce_type {
    ($($t:ty),* $(,)?) => {
        $(impl sealed::Sealed for $t {}
        impl ReduceType for $t {})*
    };
}
reduce_type!(f32, half::f16, half::bf16, purlin_atom::F8E4M3, purlin_atom::F8E5M2, i32, u32);

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
