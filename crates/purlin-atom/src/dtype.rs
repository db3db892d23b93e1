//! Element types and reduce operators of the Atom, shared by the host and device Atoms.

use std::fmt;

/// An element type the Atom reduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16 (accumulated in f32).
    F16,
    /// bfloat16 (accumulated in f32).
    BF16,
    /// fp8 e4m3, the "fn" variant: no infinities, saturates to ±448 (accumulated in f32).
    E4M3,
    /// fp8 e5m2: IEEE-like, overflows to ±Inf (accumulated in f32).
    E5M2,
    /// Two's-complement 32-bit integer; sum and prod wrap.
    I32,
    /// Unsigned 32-bit integer; sum and prod wrap.
    U32,
}

impl DType {
    /// Every element type.
    pub const ALL: [DType; 7] = [DType::F32, DType::F16, DType::BF16, DType::E4M3, DType::E5M2, DType::I32, DType::U32];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::E4M3 | DType::E5M2 => 1,
        }
    }

    /// The short name used in kernel names (`f32`, `bf16`, `e4m3`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::E4M3 => "e4m3",
            DType::E5M2 => "e5m2",
            DType::I32 => "i32",
            DType::U32 => "u32",
        }
    }

    /// The device type tag (`F32`, `BF16`, ...) in `kernels/atom/atom_common.cuh`.
    pub const fn cuda_tag(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::E4M3 => "E4M3",
            DType::E5M2 => "E5M2",
            DType::I32 => "I32",
            DType::U32 => "U32",
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        !matches!(self, DType::I32 | DType::U32)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How N sources combine. Always in rank order: `((s0 op s1) op s2) ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    /// Sum (integers wrap).
    Sum,
    /// Product (integers wrap).
    Prod,
    /// Minimum; a NaN operand gives NaN; ties keep the earlier rank.
    Min,
    /// Maximum; a NaN operand gives NaN; ties keep the earlier rank.
    Max,
    /// The mean of the n sources: summed as `Sum`, then divided by n once, in the
    /// accumulator (floats: in f32, so one rounding into the element type; integers: the
    /// wrapped sum, divided truncating toward zero).
    Mean,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Mean];

    /// The short name used in kernel names.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Mean => "mean",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// fp8 e4m3 ("fn": no infinities; NaN is `S.1111.111`), stored as its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

/// fp8 e5m2 (IEEE-like, with infinities), stored as its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct F8E5M2(pub u8);

impl F8E4M3 {
    /// Rounds to nearest even; saturates to ±448 (also ±Inf); NaN stays NaN.
    pub fn from_f32(x: f32) -> Self {
        Self(crate::host::f32_to_e4m3(x))
    }
    /// Exact.
    pub fn to_f32(self) -> f32 {
        crate::host::e4m3_to_f32(self.0)
    }
}

impl F8E5M2 {
    /// Rounds to nearest even; overflows to ±Inf; NaN stays NaN.
    pub fn from_f32(x: f32) -> Self {
        Self(crate::host::f32_to_e5m2(x))
    }
    /// Exact.
    pub fn to_f32(self) -> f32 {
        crate::host::e5m2_to_f32(self.0)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust element type the Atom can reduce: `f32`, `half::f16`, `half::bf16`, [`F8E4M3`],
/// [`F8E5M2`], `i32`, `u32`. Sealed: its layout must match the device's.
pub trait AtomElem: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
}

macro_rules! elem {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        impl AtomElem for $t {
            const DTYPE: DType = $d;
        }
    };
}
elem!(f32, DType::F32);
elem!(half::f16, DType::F16);
elem!(half::bf16, DType::BF16);
elem!(F8E4M3, DType::E4M3);
elem!(F8E5M2, DType::E5M2);
elem!(i32, DType::I32);
elem!(u32, DType::U32);

// SAFETY: both are `repr(transparent)` over `u8`, a plain byte the device reads as a code.
unsafe impl cudarc::driver::DeviceRepr for F8E4M3 {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for F8E5M2 {}
// SAFETY: the all-zero byte is the code of +0.0.
unsafe impl cudarc::driver::ValidAsZeroBits for F8E4M3 {}
// SAFETY: as above.
unsafe impl cudarc::driver::ValidAsZeroBits for F8E5M2 {}
