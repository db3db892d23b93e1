//! Element types and their little-endian codecs (`half` for f16/bf16, [`crate::fp8`] for fp8).

use std::fmt;

use crate::fp8::Format;

/// An element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// 64-bit float.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// fp8 e4m3 (NCCL's `ncclFloat8e4m3`).
    F8E4M3,
    /// fp8 e5m2 (NCCL's `ncclFloat8e5m2`).
    F8E5M2,
}

impl Dtype {
    /// Every element type.
    pub const ALL: [Dtype; 12] = [
        Dtype::F32,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::F64,
        Dtype::I8,
        Dtype::U8,
        Dtype::I32,
        Dtype::U32,
        Dtype::I64,
        Dtype::U64,
        Dtype::F8E4M3,
        Dtype::F8E5M2,
    ];

    /// The short name (`f32`, `bf16`, `u64`, `e4m3`, ...): `purlin-bench`'s command line and
    /// tables.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F64 => "f64",
            Dtype::I8 => "i8",
            Dtype::U8 => "u8",
            Dtype::I32 => "i32",
            Dtype::U32 => "u32",
            Dtype::I64 => "i64",
            Dtype::U64 => "u64",
            Dtype::F8E4M3 => "e4m3",
            Dtype::F8E5M2 => "e5m2",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::I8 | Dtype::U8 | Dtype::F8E4M3 | Dtype::F8E5M2 => 1,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 | Dtype::I32 | Dtype::U32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }

    /// Whether it is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F16 | Dtype::Bf16 | Dtype::F64 | Dtype::F8E4M3 | Dtype::F8E5M2)
    }

    /// Whether it is a signed integer type.
    pub fn is_signed_int(self) -> bool {
        matches!(self, Dtype::I8 | Dtype::I32 | Dtype::I64)
    }

    /// The fp8 format, for the fp8 types.
    pub fn fp8(self) -> Option<Format> {
        match self {
            Dtype::F8E4M3 => Some(Format::E4M3),
            Dtype::F8E5M2 => Some(Format::E5M2),
            _ => None,
        }
    }

    /// The largest integer up to which every integer is exactly representable (capped).
    pub fn max_exact(self) -> i64 {
        match self {
            Dtype::F16 => 2048,
            Dtype::Bf16 => 256,
            Dtype::F8E4M3 => 16,
            Dtype::F8E5M2 => 8,
            Dtype::F32 => 1 << 24,
            Dtype::I8 => 127,
            Dtype::U8 => 255,
            Dtype::F64 | Dtype::I32 | Dtype::U32 | Dtype::I64 | Dtype::U64 => 1 << 30,
        }
    }

    /// The largest `k` such that `2^k` is exact and in range.
    pub fn max_pow2_exp(self) -> u32 {
        match self {
            Dtype::F16 => 15,
            Dtype::I8 => 6,
            Dtype::U8 => 7,
            Dtype::I32 => 30,
            Dtype::U32 => 31,
            Dtype::I64 => 62,
            Dtype::U64 => 63,
            Dtype::F8E4M3 => 8,
            Dtype::F8E5M2 => 15,
            Dtype::Bf16 | Dtype::F32 => 127,
            Dtype::F64 => 1023,
        }
    }

    /// Encodes an integer as this type's bytes (integers: truncated to the width; floats: the
    /// nearest value, exact for small integers). `out` holds exactly one element.
    pub fn encode(self, v: i64, out: &mut [u8]) {
        match self {
            Dtype::I8 => out.copy_from_slice(&(v as i8).to_le_bytes()),
            Dtype::U8 => out.copy_from_slice(&(v as u8).to_le_bytes()),
            Dtype::I32 => out.copy_from_slice(&(v as i32).to_le_bytes()),
            Dtype::U32 => out.copy_from_slice(&(v as u32).to_le_bytes()),
            Dtype::I64 => out.copy_from_slice(&v.to_le_bytes()),
            Dtype::U64 => out.copy_from_slice(&(v as u64).to_le_bytes()),
            _ => self.encode_f64(v as f64, out),
        }
    }

    /// Encodes a float value rounded once to this type (integers: truncated toward zero).
    pub fn encode_f64(self, x: f64, out: &mut [u8]) {
        match self {
            Dtype::F32 => out.copy_from_slice(&(x as f32).to_le_bytes()),
            Dtype::F64 => out.copy_from_slice(&x.to_le_bytes()),
            Dtype::F16 => out.copy_from_slice(&half::f16::from_f64(x).to_le_bytes()),
            Dtype::Bf16 => out.copy_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
            Dtype::F8E4M3 | Dtype::F8E5M2 => out[0] = self.fp8().map_or(0, |f| f.encode(x)),
            _ => self.encode(x as i64, out),
        }
    }

    /// Encodes an f32 value rounded once from f32 to this type (Avg's last rounding).
    pub fn encode_f32(self, q: f32, out: &mut [u8]) {
        match self {
            Dtype::F16 => out.copy_from_slice(&half::f16::from_f32(q).to_le_bytes()),
            Dtype::Bf16 => out.copy_from_slice(&half::bf16::from_f32(q).to_le_bytes()),
            _ => self.encode_f64(q as f64, out),
        }
    }

    /// One element's bytes (`encode` into a fresh vector).
    pub fn bytes(self, v: i64) -> Vec<u8> {
        let mut b = vec![0u8; self.size()];
        self.encode(v, &mut b);
        b
    }

    /// Decodes one element to f64 (for value comparisons and messages; exact for every type
    /// except 64-bit integers beyond 2^53).
    pub fn decode(self, b: &[u8]) -> f64 {
        let n = |k: usize| -> [u8; 8] {
            let mut a = [0u8; 8];
            a[..k].copy_from_slice(&b[..k]);
            a
        };
        match self {
            Dtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            Dtype::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
            Dtype::Bf16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
            Dtype::F64 => f64::from_le_bytes(n(8)),
            Dtype::I8 => b[0] as i8 as f64,
            Dtype::U8 => b[0] as f64,
            Dtype::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            Dtype::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            Dtype::I64 => i64::from_le_bytes(n(8)) as f64,
            Dtype::U64 => u64::from_le_bytes(n(8)) as f64,
            Dtype::F8E4M3 | Dtype::F8E5M2 => self.fp8().map_or(f64::NAN, |f| f.value(b[0])),
        }
    }

    /// An integer type's element as its raw bits, zero-extended.
    pub fn bits(self, b: &[u8]) -> u64 {
        let mut a = [0u8; 8];
        a[..self.size()].copy_from_slice(&b[..self.size()]);
        u64::from_le_bytes(a)
    }
}

/// The [name](Dtype::name).
impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
